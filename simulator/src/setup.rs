//! What a simulated run is asked to do: the agent profiles the supervisor assigns, and the runs (brief
//! and plan) the world submits. Random setups come from the seed's stream; the canonical ones are fixed
//! so scenarios can compare runs.

use keel_actors::{Plan, PlanStep, RunMode, RunSpec};
use keel_store::{AgentLimits, AgentProfile, RunId};

use crate::rng::SimRng;

/// Most plan steps of a random run.
pub const RANDOM_STEPS_MAX: u64 = 8;
/// Chance (parts per million) that a random run is led by an agent rather than a fixed plan.
pub const LEAD_RUN_PPM: u32 = 250_000;
/// Most runs one seed submits.
pub const RANDOM_RUNS_MAX: u64 = 3;

/// The agents every world knows, as (name, harness, model, account): one per harness kind with a
/// distinct model each. [`agents`] makes their profiles; [`model_of`] reads a model here, without
/// building every profile for one lookup (it runs at every spawn the checker sees).
const AGENTS: [(&str, &str, &str, &str); 4] = [
    (
        "claude-a",
        "claude-code",
        "claude-sonnet-4-5",
        "acct-anthropic",
    ),
    ("codex-a", "codex", "gpt-5-codex", "acct-openai"),
    ("opencode-a", "opencode", "glm-4.6", "acct-zai"),
    ("pi-a", "pi", "gemini-2.5-pro", "acct-google"),
];

/// The agent profiles every world knows: one per harness kind with a distinct model each, so a
/// harness switch is visible in the model a session gets (docs/DESIGN.md §12, invariant 6).
pub fn agents() -> Vec<AgentProfile> {
    let agent = |name: &str, harness: &str, model: &str, account: &str| AgentProfile {
        name: name.into(),
        description: format!("{name}: a simulated agent on {harness}"),
        harness: harness.into(),
        model: model.into(),
        account: account.into(),
        tools: vec!["Bash".into(), "Read".into()],
        system_prompt: "You are a careful specialist.".into(),
        limits: AgentLimits {
            turns_max: 50,
            tokens_max: 1_000_000,
            timeout_ms: 600_000,
            spend_micros_max: None,
        },
    };
    AGENTS
        .iter()
        .map(|(name, harness, model, account)| agent(name, harness, model, account))
        .collect()
}

/// The harnesses worker `node` (1-based) has installed, which it advertises in its heartbeats:
/// worker 1 has the four CLIs of [`agents`], every later worker lacks one of them in turn (worker 2
/// no Claude Code, worker 3 no Codex, ...), so placement by capability matters and, with three
/// workers or more, every harness is on two of them.
pub fn worker_harnesses(node: u8) -> Vec<keel_harness::HarnessKind> {
    use keel_harness::HarnessKind;
    const CLIS: [HarnessKind; 4] = [
        HarnessKind::ClaudeCode,
        HarnessKind::Codex,
        HarnessKind::Opencode,
        HarnessKind::Pi,
    ];
    let lacks = usize::from(node)
        .checked_sub(2)
        .map(|i| CLIS[i % CLIS.len()]);
    CLIS.into_iter().filter(|h| Some(*h) != lacks).collect()
}

/// The model an agent's profile names (what every session of that agent must use).
pub fn model_of(agent: &str) -> Option<&'static str> {
    AGENTS
        .iter()
        .find(|(name, ..)| *name == agent)
        .map(|(_, _, model, _)| *model)
}

/// One plan step with a brief that says what it is, for tests and random plans alike.
pub fn step(
    key: &str,
    depends_on: &[&str],
    assignee: Option<&str>,
    estimate_micros: u64,
) -> PlanStep {
    PlanStep {
        key: key.into(),
        brief: format!("Investigate {key} and report what holds, with sources."),
        goal: format!("A sourced account of {key}"),
        quality_criteria: vec!["every claim has a source".into()],
        output_schema: None,
        assignee: assignee.map(Into::into),
        depends_on: depends_on.iter().map(|d| (*d).to_string()).collect(),
        estimate_micros,
    }
}

/// A run of `plan` under `run`, with an optional budget.
pub fn run_spec(run: RunId, brief: &str, plan: Plan, budget_limit_micros: Option<u64>) -> RunSpec {
    RunSpec {
        run,
        brief: brief.into(),
        mode: RunMode::Plan(plan),
        budget_limit_micros,
        config_snapshot: "keel-sim".into(),
    }
}

/// A run led by an agent (`agent`, or the supervisor's pick): its steps are the lead's delegations.
pub fn lead_run_spec(
    run: RunId,
    brief: &str,
    agent: Option<String>,
    budget_limit_micros: Option<u64>,
) -> RunSpec {
    RunSpec {
        run,
        brief: brief.into(),
        mode: RunMode::Lead {
            agent,
            constraints: vec!["cite sources".into()],
        },
        budget_limit_micros,
        config_snapshot: "keel-sim".into(),
    }
}

/// A random run: a lead run with probability [`LEAD_RUN_PPM`], else a plan of 1 to 8 steps, each depending on up to two earlier ones, some briefs opening with a
/// slash skill, a budget that is usually ample and sometimes tight.
pub fn random_run(rng: &mut SimRng, index: u64) -> RunSpec {
    let names = agents();
    if rng.chance(LEAD_RUN_PPM) {
        // A lead run: the lead's session decides the steps (its delegation turns).
        let agent = if rng.chance(500_000) {
            Some(names[rng.index(names.len())].name.clone())
        } else {
            None
        };
        let budget = if rng.chance(250_000) {
            Some(10_000_000)
        } else {
            None
        };
        let run = RunId(u128::from(rng.next_u64()) << 64 | u128::from(index));
        return lead_run_spec(run, &format!("Random lead run {index}"), agent, budget);
    }
    let steps_count = rng.range(1, RANDOM_STEPS_MAX);
    let mut steps: Vec<PlanStep> = Vec::new();
    for i in 0..steps_count {
        let key = format!("r{index}s{i}");
        let mut deps: Vec<String> = Vec::new();
        if i > 0 {
            for _ in 0..rng.range(0, 2) {
                let d = format!("r{index}s{}", rng.range(0, i - 1));
                if !deps.contains(&d) {
                    deps.push(d);
                }
            }
        }
        let assignee = if rng.chance(500_000) {
            Some(names[rng.index(names.len())].name.clone())
        } else {
            None
        };
        let mut s = step(&key, &[], assignee.as_deref(), rng.range(1_000, 20_000));
        s.depends_on = deps;
        if rng.chance(250_000) {
            s.brief = format!("/review {key}\n{}", s.brief);
        }
        steps.push(s);
    }
    let budget = match rng.range(0, 9) {
        0 => Some(rng.range(5_000, 60_000)),
        1..=3 => Some(10_000_000),
        _ => None,
    };
    let run = RunId(u128::from(rng.next_u64()) << 64 | u128::from(index));
    run_spec(
        run,
        &format!("Random run {index}"),
        Plan {
            steps,
            constraints: vec!["cite sources".into()],
        },
        budget,
    )
}

/// The canonical run of scenario 3: sixteen independent-then-dependent steps (twelve in the first
/// batch, four that each depend on three of them), no budget limit.
pub fn canonical_run(run: RunId, steps_count: usize) -> RunSpec {
    let first = steps_count.saturating_sub(steps_count / 4);
    let mut steps: Vec<PlanStep> = (0..first)
        .map(|i| step(&format!("s{i:02}"), &[], None, 10_000))
        .collect();
    for j in first..steps_count {
        let deps: Vec<String> = (0..3)
            .map(|k| format!("s{:02}", (j * 3 + k) % first.max(1)))
            .collect();
        let dep_refs: Vec<&str> = deps.iter().map(String::as_str).collect();
        steps.push(step(&format!("s{j:02}"), &dep_refs, None, 10_000));
    }
    run_spec(
        run,
        "The canonical run",
        Plan {
            steps,
            constraints: vec!["cite sources".into()],
        },
        None,
    )
}
