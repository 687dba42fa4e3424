//! An embedding host's policy on the runtime's real path (docs/DESIGN.md §9): hooks registered in
//! code run in process in keel's own agent loop (the scripted model, real tools, a real redb file),
//! a `PreToolUse` hook's denial keeps a command from running, a `PostToolUse` hook redacts what the
//! model sees, and every decision is a durable audit row.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::runtime::{HarnessSet, PolicyHost, Runtime, RuntimeConfig, scripted};
use keel_actors::{RunMode, Synthesis};
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_harness::{HarnessKind, ToolOutput};
use keel_policy::{
    CodeHook, HookEvent, HookResult, HookSpec, Policy, PostHookResult, ToolCall, ToolMatcher,
};
use keel_store::{HookDecision, RunStatus, Sharing, Store, StoreConfig};
use std::sync::Arc;
use std::time::Duration;

/// Runs a two-step plan (`first`, then `second`, each a shell command of the scripted model) on a
/// runtime whose sessions get `policy` in process, to its end: the runtime (to shut down), the run
/// and its outcome.
async fn two_part_run(
    store: &Arc<Store>,
    work: &std::path::Path,
    policy: Policy,
    brief: &str,
    first: &str,
    second: &str,
) -> (Runtime, keel_store::RunId, keel_actors::RunOutcome) {
    let host = PolicyHost::new(policy);
    let harnesses = HarnessSet::new()
        .with(
            HarnessKind::Scripted,
            Arc::new(ScriptedHarness::new(Script::rules())),
        )
        .with_service(host.service());
    let mut config = RuntimeConfig::default();
    config.supervisor.agents = vec![scripted::scripted_agent()];
    config.coordinator.attempts_per_step_max = 1;
    config.specialist.working_dir = work.to_path_buf();
    config.stop_grace_ms = 1_000;
    let (rt, _events) = Runtime::start(store.clone(), harnesses, config)
        .await
        .unwrap();
    host.attach(&rt);
    let commands = [first.to_string(), second.to_string()];
    let plan = scripted::fan_out_plan(2, |i| commands[i].clone()).unwrap();
    let handle = rt
        .submit(brief.into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap();
    let run = handle.id();
    let outcome = tokio::time::timeout(Duration::from_secs(120), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    (rt, run, outcome)
}

/// Denies any command that mentions `forbidden`.
struct Guard;

impl CodeHook for Guard {
    fn before_tool(&self, call: &ToolCall) -> HookResult {
        match call.subject() {
            Some(s) if s.contains("forbidden") => HookResult::Deny {
                reason: "the embedder forbids it".into(),
            },
            _ => HookResult::NoOpinion,
        }
    }
}

/// Redacts the word `hunter2` from every result.
struct Redact;

impl CodeHook for Redact {
    fn after_tool(&self, _call: &ToolCall, output: &ToolOutput) -> PostHookResult {
        if output.text.contains("hunter2") {
            PostHookResult::Rewrite {
                text: output.text.replace("hunter2", "REDACTED"),
            }
        } else {
            PostHookResult::Keep
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_registered_in_code_decide_and_redact_in_keels_own_loop() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = Arc::new(
        Store::open_with(
            dir.path().join("keel.redb"),
            StoreConfig {
                sharing: Sharing::WithReaders,
                ..StoreConfig::default()
            },
        )
        .unwrap(),
    );
    let mut policy = Policy::default();
    policy
        .register_hook(HookSpec::code(
            "guard",
            HookEvent::PreToolUse,
            ToolMatcher::Any,
            Arc::new(Guard),
        ))
        .unwrap();
    policy
        .register_hook(HookSpec::code(
            "redact",
            HookEvent::PostToolUse,
            ToolMatcher::Tools(vec!["bash".into()]),
            Arc::new(Redact),
        ))
        .unwrap();
    let (rt, run, outcome) = two_part_run(
        &store,
        &work,
        policy,
        "policy",
        "echo forbidden > made.txt; echo made",
        "echo pw-hunter2",
    )
    .await;
    assert!(!work.join("made.txt").exists(), "the denied command ran");
    assert_ne!(outcome.status, RunStatus::Running);
    // The redacted part reported what the model saw.
    if let Ok(synthesis) = serde_json::from_str::<Synthesis>(&outcome.outcome) {
        let claims: Vec<&str> = synthesis
            .findings
            .iter()
            .map(|f| f.finding.claim.as_str())
            .collect();
        assert!(claims.iter().all(|c| !c.contains("hunter2")), "{claims:?}");
        assert!(claims.contains(&"pw-REDACTED"), "{claims:?}");
    } else {
        panic!("no synthesis: {}", outcome.outcome);
    }
    let rows = store.run(run).audit(0, 1000).unwrap().items;
    let who = |hook: &str, decision: HookDecision| {
        rows.iter()
            .filter(|r| r.value.hook == hook && r.value.decision == decision)
            .count()
    };
    assert!(who("hook:guard", HookDecision::Deny) >= 1, "{rows:#?}");
    assert!(
        rows.iter()
            .any(|r| r.value.hook == "hook:redact" && r.value.rewritten),
        "{rows:#?}"
    );
    rt.shutdown().await;
}

/// The scope of a session of the first attempt of `task` (run `run`) as the scripted agent, for
/// asking the host directly as a harness's session would.
fn first_attempt_scope(
    run: keel_store::RunId,
    task: keel_store::TaskId,
) -> keel_actors::runtime::ToolScope {
    keel_actors::runtime::ToolScope {
        attempt: keel_actors::AttemptId {
            run,
            task,
            attempt: 1,
        },
        mode: keel_harness::PermissionMode::AcceptEdits,
        tools: Vec::new(),
        agent: "scripted".into(),
    }
}

/// The tool call every case below makes: a payment the ask rule and the counting gate both cover.
fn pay() -> ToolCall {
    ToolCall::new(
        "Bash",
        serde_json::json!({"command": "pay bob", "amount": 1}),
    )
}

/// Issue 13: a call a human approved still passes every gate. A counting gate allows one payment
/// per run and an ask rule asks about each: the first approved payment runs; a second payment asked
/// while the first waited is approved too but refused by the gate; a third is refused by the gate
/// without anyone being asked; a refused ask writes no mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_ask_still_passes_every_gate() {
    use keel_policy::{Decision, Gate, GateCheck, GateScope};

    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = Arc::new(Store::open(dir.path().join("keel.redb")).unwrap());
    let rule = |t: &str| -> keel_policy::Rule { t.parse().unwrap() };
    let policy = Policy {
        ask: vec![rule("Bash(pay*)")],
        ask_timeout_ms: 60_000,
        gates: vec![Gate {
            name: "once".into(),
            rule: rule("Bash(pay*)"),
            per: GateScope::Run,
            check: GateCheck::Count { max_calls: 1 },
        }],
        ..Policy::default()
    };
    let host = PolicyHost::new(policy);
    let harnesses = HarnessSet::new().with(
        HarnessKind::Scripted,
        Arc::new(ScriptedHarness::new(Script::rules())),
    );
    let mut config = RuntimeConfig::default();
    config.specialist.working_dir = work.clone();
    config.stop_grace_ms = 1_000;
    let (rt, _events) = Runtime::start(store.clone(), harnesses, config)
        .await
        .unwrap();
    host.attach(&rt);
    // A run for the rows to belong to.
    let plan = scripted::fan_out_plan(1, |_| "echo ready".into()).unwrap();
    let handle = rt
        .submit("pay".into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap();
    let run = handle.id();
    tokio::time::timeout(Duration::from_secs(120), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    let task = store.run(run).tasks(None, 10).unwrap().items[0].id;
    let scope = first_attempt_scope(run, task);
    let payload = || serde_json::json!({"hook_event_name": "PreToolUse"});

    // Two payments wait for a human at once: both pass the gate before anyone is asked.
    let ask = || {
        let (host, scope) = (host.clone(), scope.clone());
        // A test stands in for the harness sessions that wait on their calls concurrently.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move { host.before_tool(&scope, &pay(), payload()).await })
    };
    let mut waiting = vec![ask(), ask()];
    let open = |n: usize| {
        let store = store.clone();
        async move {
            for _ in 0..400 {
                let raised = store.run(run).escalations(0, 100).unwrap().items;
                if raised.len() == n {
                    return raised.into_iter().map(|e| e.value.id).collect::<Vec<_>>();
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            panic!("{n} escalations were not raised");
        }
    };
    let ids = open(2).await;
    // The first approval lets its call through and takes the gate's one place.
    rt.answer_escalation(ids[0], "allow").await.unwrap();
    let mut done = None;
    for _ in 0..400 {
        if let Some(i) = waiting
            .iter()
            .position(tokio::task::JoinHandle::is_finished)
        {
            done = Some(waiting.remove(i));
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let first = done.expect("the approved call is decided").await.unwrap();
    assert_eq!(first.decision, Decision::Allow, "{first:?}");
    assert_eq!(first.decided_by, "approval");
    // The second is approved too, and still refused: the gate is full.
    rt.answer_escalation(ids[1], "allow").await.unwrap();
    let second = waiting.remove(0).await.unwrap();
    assert_eq!(second.decision, Decision::Deny, "{second:?}");
    assert_eq!(second.decided_by, "gate:once");
    // A third is refused by the gate before anyone is asked.
    let third = ask().await.unwrap();
    assert_eq!(third.decided_by, "gate:once");
    assert_eq!(
        open(2).await.len(),
        2,
        "nobody is asked about a refused call"
    );
    let marks = store.run(run).gate_marks(0, 100).unwrap().items;
    assert_eq!(marks.len(), 1, "{marks:?}");
    let rows: Vec<(String, HookDecision)> = store
        .run(run)
        .audit(0, 1000)
        .unwrap()
        .items
        .into_iter()
        .map(|r| (r.value.hook, r.value.decision))
        .collect();
    let row = |h: &str, d| (h.to_string(), d);
    assert_eq!(
        rows,
        [
            row("ask-rule", HookDecision::Ask),
            row("ask-rule", HookDecision::Ask),
            row("approval", HookDecision::Allow),
            row("gate:once", HookDecision::Allow),
            row("approval", HookDecision::Allow),
            row("gate:once", HookDecision::Deny),
            row("ask-rule", HookDecision::Ask),
            row("gate:once", HookDecision::Deny),
        ]
    );
    rt.shutdown().await;
}

/// A SubagentStart hook in code: vetoes a specialist whose brief mentions `forbidden`, annotates
/// every other; a SubagentStop hook annotates every report.
struct Subagents;

impl CodeHook for Subagents {
    fn on_event(&self, event: HookEvent, payload: &serde_json::Value) -> keel_policy::EventResult {
        let brief = payload["brief"].as_str().unwrap_or_default();
        match event {
            HookEvent::SubagentStart if brief.contains("forbidden") => {
                keel_policy::EventResult::Veto {
                    reason: "no forbidden work".into(),
                }
            }
            HookEvent::SubagentStart => keel_policy::EventResult::Annotate {
                context: "stay in the work folder".into(),
            },
            _ => keel_policy::EventResult::Annotate {
                context: "checked by the embedder".into(),
            },
        }
    }
}

/// Issue 13: SubagentStart and SubagentStop hooks on keel's real path. A vetoed start never runs
/// its command and its step fails with the hook's reason; an allowed start gets the note in its
/// brief; its report reaches the lead with the SubagentStop note; every decision is an audit row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagent_hooks_veto_a_start_and_annotate_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = Arc::new(Store::open(dir.path().join("keel.redb")).unwrap());
    let mut policy = Policy::default();
    for (name, event) in [
        ("starts", HookEvent::SubagentStart),
        ("reports", HookEvent::SubagentStop),
    ] {
        policy
            .register_hook(HookSpec::code(
                name,
                event,
                ToolMatcher::Any,
                Arc::new(Subagents),
            ))
            .unwrap();
    }
    let (rt, run, outcome) = two_part_run(
        &store,
        &work,
        policy,
        "subagents",
        "echo forbidden > vetoed.txt; echo vetoed",
        "echo allowed",
    )
    .await;
    assert!(!work.join("vetoed.txt").exists(), "the vetoed start ran");
    let tasks = store.run(run).tasks(None, 100).unwrap().items;
    let vetoed = tasks
        .iter()
        .find(|t| t.brief.contains("forbidden"))
        .expect("the vetoed step");
    let vetoed_outcome = vetoed.outcome.clone().unwrap_or_default();
    assert!(vetoed_outcome.contains("no forbidden work"), "{vetoed:#?}");
    let allowed = tasks
        .iter()
        .find(|t| t.brief.contains("echo allowed"))
        .expect("the allowed step");
    let allowed_outcome = allowed.outcome.clone().unwrap_or_default();
    assert!(
        allowed_outcome.contains("checked by the embedder"),
        "{allowed:#?} / {}",
        outcome.outcome
    );
    let rows = store.run(run).audit(0, 1000).unwrap().items;
    let count = |hook: &str, tool: &str, decision: HookDecision| {
        rows.iter()
            .filter(|r| {
                r.value.hook == hook && r.value.tool == tool && r.value.decision == decision
            })
            .count()
    };
    assert_eq!(
        count("hook:starts", "SubagentStart", HookDecision::Deny),
        1,
        "{rows:#?}"
    );
    assert!(
        count("hook:starts", "SubagentStart", HookDecision::Allow) >= 1,
        "{rows:#?}"
    );
    assert!(
        count("hook:reports", "SubagentStop", HookDecision::Allow) >= 1,
        "{rows:#?}"
    );
    rt.shutdown().await;
}

/// Review finding: a CLI's result reaches the node through a hook command holding the session's
/// token, which the session's own tools can read. Only the result of a call the policy allowed
/// earns gate marks, once: a made-up result for a call never asked about, or one posted twice,
/// meets no prerequisite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_call_the_policy_allowed_earns_gate_marks_and_only_once() {
    use keel_policy::{Decision, Gate, GateCheck, GateScope};

    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = Arc::new(Store::open(dir.path().join("keel.redb")).unwrap());
    let rule = |t: &str| -> keel_policy::Rule { t.parse().unwrap() };
    let policy = Policy {
        gates: vec![Gate {
            name: "tested".into(),
            rule: rule("Bash(deploy*)"),
            per: GateScope::Task,
            check: GateCheck::Prerequisite {
                after: rule("Bash(make test*)"),
            },
        }],
        ..Policy::default()
    };
    let host = PolicyHost::new(policy);
    let (rt, run, _) = two_part_run(
        &store,
        &work,
        Policy::default(),
        "gates",
        "echo one",
        "echo two",
    )
    .await;
    host.attach(&rt);
    let task = store.run(run).tasks(None, 10).unwrap().items[0].id;
    let scope = first_attempt_scope(run, task);
    let call = |command: &str| ToolCall::new("Bash", serde_json::json!({ "command": command }));
    let payload =
        |event: &str, id: &str| serde_json::json!({"hook_event_name": event, "tool_use_id": id});
    let ok = || ToolOutput {
        is_error: false,
        text: "passed".into(),
    };
    let deploy = || async {
        host.before_tool(&scope, &call("deploy now"), payload("PreToolUse", "d"))
            .await
            .decision
    };
    assert_eq!(deploy().await, Decision::Deny, "no test has run");
    // A made-up success of a call never asked about earns nothing.
    host.after_tool(
        &scope,
        &call("make test"),
        payload("PostToolUse", "forged"),
        ok(),
    )
    .await;
    assert_eq!(
        deploy().await,
        Decision::Deny,
        "a made-up result met the gate"
    );
    // An allowed call that failed (Claude Code's PostToolUseFailure reaches `after_tool` as an
    // error) earns nothing, and a success posted for it afterwards earns nothing either.
    let asked = host
        .before_tool(&scope, &call("make test"), payload("PreToolUse", "t0"))
        .await;
    assert_eq!(asked.decision, Decision::Allow);
    let failed = ToolOutput {
        is_error: true,
        text: "Exit code 2".into(),
    };
    for output in [failed, ok()] {
        host.after_tool(
            &scope,
            &call("make test"),
            payload("PostToolUse", "t0"),
            output,
        )
        .await;
        assert_eq!(deploy().await, Decision::Deny, "a failed call met the gate");
    }
    // The real call: allowed, then its success meets the prerequisite.
    let asked = host
        .before_tool(&scope, &call("make test"), payload("PreToolUse", "t1"))
        .await;
    assert_eq!(asked.decision, Decision::Allow);
    host.after_tool(
        &scope,
        &call("make test"),
        payload("PostToolUse", "t1"),
        ok(),
    )
    .await;
    assert_eq!(deploy().await, Decision::Allow);
    let marks = store.run(run).gate_marks(0, 100).unwrap().items.len();
    // The same result posted again earns nothing more.
    host.after_tool(
        &scope,
        &call("make test"),
        payload("PostToolUse", "t1"),
        ok(),
    )
    .await;
    assert_eq!(
        store.run(run).gate_marks(0, 100).unwrap().items.len(),
        marks
    );
    rt.shutdown().await;
}
