//! The gates' state lives in the store (docs/DESIGN.md §9): a cap gate's sum and a prerequisite
//! met before a SIGKILL of the node still hold after `keel resume`; keel's own loop reaches the
//! policy in process, `PostToolUse` included (a hook rewrites a result before the model sees it);
//! an agent's own rules apply to its sessions and not to another agent's.
//!
//! Real processes: `keel model-server` (the scripted model on 127.0.0.1, recording every request),
//! `keel run --model-server` (keel's own agent loop, the messages-api harness), SIGKILL, `keel
//! resume`, and a read-only open of the store for the gate ledger.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_actors::runtime::scripted;
use keel_actors::{Plan, PlanStep};
use keel_store::{GateEvent, RunId, Store, StoreConfig};
use keel_tests::{
    Reaped, audit_rows_by, init_home_with, keel, keel_json_list, model_server, recorded_bodies,
    run_to_end, wait_for,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(240);

/// A keel home whose keel.toml ends with `policy`, and a recording model server.
struct Home {
    dir: tempfile::TempDir,
    url: String,
    _server: Reaped,
}

impl Home {
    fn new(policy: &str) -> Home {
        let dir = tempfile::tempdir().unwrap();
        init_home_with(dir.path(), policy, WAIT).unwrap();
        let (server, url) = model_server(dir.path(), &dir.path().join("record")).unwrap();
        Home {
            dir,
            url,
            _server: server,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn write_plan(&self, steps: Vec<PlanStep>) {
        let plan = Plan {
            steps,
            constraints: Vec::new(),
        };
        std::fs::write(
            self.path().join(".keel").join("plan.json"),
            serde_json::to_string(&plan).unwrap(),
        )
        .unwrap();
    }

    fn run_command(&self) -> std::process::Command {
        let mut cmd = keel(self.path()).unwrap();
        cmd.args([
            "run",
            "gated",
            "--plan",
            ".keel/plan.json",
            "--model-server",
            &self.url,
        ]);
        cmd
    }

    /// Starts `keel run` and returns the process and its run id.
    fn start_run(&self) -> (Reaped, RunId) {
        let mut node = Reaped::spawn(self.run_command()).unwrap();
        let line = node
            .line_containing("started in", Duration::from_secs(60))
            .unwrap();
        let run = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        (node, run)
    }

    /// Waits for a gate mark satisfying `want` in `run`'s ledger (read-only, beside the node).
    fn wait_for_mark(&self, run: RunId, what: &str, want: impl Fn(&GateEvent) -> bool) {
        let store = Store::open_read_only(
            self.path().join(".keel").join("keel.redb"),
            StoreConfig::default(),
        )
        .unwrap();
        wait_for(WAIT, what, || {
            let marks = store.run(run).gate_marks(0, 1000).ok()?;
            marks
                .items
                .iter()
                .any(|m| want(&m.value.event))
                .then_some(())
        })
        .unwrap();
    }

    fn resume(&self, run: RunId) {
        let (code, out, err) = run_to_end(
            keel(self.path()).unwrap().args([
                "resume",
                &run.to_string(),
                "--model-server",
                &self.url,
            ]),
            WAIT,
        )
        .unwrap();
        assert!(code == 0 || code == 5, "resume: {code}\n{out}\n{err}");
    }

    /// `keel --json audit` of the latest run: its rows.
    fn audit(&self) -> Vec<Value> {
        keel_json_list(self.path(), &["audit"], "rows", WAIT).unwrap()
    }
}

/// A chain of steps `s0..sN`, each running `command(i)`, each after the previous.
fn chain(n: usize, command: impl Fn(usize) -> String, extra: Option<Value>) -> Vec<PlanStep> {
    (0..n)
        .map(|i| {
            let deps: Vec<String> = (i > 0).then(|| format!("s{}", i - 1)).into_iter().collect();
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            let mut step = scripted::step(
                &format!("s{i}"),
                "Run the command.",
                &command(i),
                "shell",
                &deps,
            )
            .unwrap();
            if let Some(extra) = &extra {
                step.brief = with_input_fields(&step.brief, extra);
            }
            step
        })
        .collect()
}

/// A scripted brief whose shell call also carries `extra`'s fields (`CALL_TOOL: bash {...}`
/// instead of `RUN_TOOL: ... ;;`): the scripted model calls keel's `bash` with them, which ignores
/// what it does not know.
fn with_input_fields(brief: &str, extra: &Value) -> String {
    let (what, run) = brief.split_once("RUN_TOOL: ").unwrap();
    let command = run.trim_end().strip_suffix(";;").unwrap().trim_end();
    let mut input = extra.clone();
    input["command"] = json!(command);
    format!("{what}CALL_TOOL: bash {input}")
}

/// A cap gate sums its field from the store: the amounts let through before a SIGKILL of the node
/// still count after `keel resume`, so the run never passes the cap.
#[test]
fn a_cap_gate_survives_a_sigkill_of_the_node() {
    let home = Home::new(
        "\n[[gates]]\nname = \"spend\"\nkind = \"cap\"\nrule = \"bash(*pay*)\"\nfield = \"amount\"\nmax_total = 5\n",
    );
    // Four payments of 2 in a chain: two fit under the cap of 5.
    home.write_plan(chain(
        4,
        |i| format!("echo pay-{i}"),
        Some(json!({"amount": 2})),
    ));
    let (node, run) = home.start_run();
    home.wait_for_mark(run, "an amount added before the kill", |e| {
        matches!(e, GateEvent::Added { micros: 2_000_000 })
    });
    node.kill();
    home.resume(run);
    let rows = home.audit();
    let allowed = audit_rows_by(&rows, "gate:spend", "allow");
    let denied = audit_rows_by(&rows, "gate:spend", "deny");
    assert_eq!(allowed.len(), 2, "the cap let more through: {rows:#?}");
    assert!(
        !denied.is_empty(),
        "the third payment was not denied: {rows:#?}"
    );
    assert!(
        denied.iter().all(|r| r["reason"]
            .as_str()
            .unwrap()
            .contains("amount 2 would bring this run's total to 6, past the cap of 5")),
        "{rows:#?}"
    );
}

/// A prerequisite met before a SIGKILL of the node holds after `keel resume`; in a run where it
/// was never met, the same call is denied with what to do.
#[test]
fn a_prerequisite_met_before_a_sigkill_holds_after_resume() {
    let gate = "\n[[gates]]\nname = \"built\"\nkind = \"prerequisite\"\nrule = \"bash(*deploy*)\"\nafter = \"bash(*build-ok*)\"\nper = \"run\"\n";
    let home = Home::new(gate);
    // Without the build, the deploy is denied.
    home.write_plan(chain(1, |_| "echo deploy-now".into(), None));
    let (code, out, err) = run_to_end(&mut home.run_command(), WAIT).unwrap();
    let rows = home.audit();
    assert!(
        audit_rows_by(&rows, "gate:built", "deny").iter().any(|r| r["reason"]
            .as_str()
            .unwrap()
            .contains("a call matching bash(*build-ok*) must succeed in this run before bash; run it first")),
        "{code}\n{out}\n{err}\n{rows:#?}"
    );
    // Build, kill once the build's success is durable, resume: the deploy runs.
    home.write_plan(chain(
        2,
        |i| {
            if i == 0 {
                "echo build-ok".into()
            } else {
                "echo deploy-now".into()
            }
        },
        None,
    ));
    let (node, run) = home.start_run();
    home.wait_for_mark(run, "the build's success recorded", |e| {
        *e == GateEvent::Met
    });
    node.kill();
    home.resume(run);
    let rows = home.audit();
    assert!(
        audit_rows_by(&rows, "gate:built", "deny").is_empty(),
        "the deploy was denied after the build: {rows:#?}"
    );
    assert!(
        !audit_rows_by(&rows, "gate:built", "allow").is_empty(),
        "the deploy never ran: {rows:#?}"
    );
}

/// keel's own loop runs `PostToolUse` hooks in process: the model sees the rewritten result, and the
/// rewrite is an audit row marked rewritten.
#[test]
fn a_post_tool_use_hook_rewrites_the_result_keels_loop_hands_the_model() {
    // The hook copies the (JSON-escaped) output out of its payload, replaces the secret word and
    // hands it back as keel's `updatedToolOutput`.
    let script = r#"out=$(sed -E 's/.*"output":"(([^"\\]|\\.)*)".*/\1/' | sed 's/hunter2/REDACTED/g'); printf '{"hookSpecificOutput":{"updatedToolOutput":"%s"}}' "$out""#;
    let policy = format!(
        "\n[[hooks]]\nname = \"redact\"\nevent = \"PostToolUse\"\nmatcher = \"bash\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n",
        toml_string(script)
    );
    let home = Home::new(&policy);
    home.write_plan(chain(1, |_| "echo pw-hunter2".into(), None));
    let (code, out, err) = run_to_end(&mut home.run_command(), WAIT).unwrap();
    assert_eq!(code, 0, "{out}\n{err}");
    let results: Vec<String> = recorded_bodies(&home.path().join("record"))
        .iter()
        .flat_map(|b| b["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "tool_result")
        .map(|c| c["content"].to_string())
        .collect();
    assert!(!results.is_empty(), "no tool result reached the model");
    assert!(
        results
            .iter()
            .all(|r| !r.contains("hunter2") && r.contains("pw-REDACTED")),
        "{results:#?}"
    );
    let rows = home.audit();
    let rewritten = audit_rows_by(&rows, "hook:redact", "allow");
    assert!(
        rewritten.iter().any(|r| r["rewritten"] == true),
        "{rows:#?}"
    );
}

/// An agent's deny rule applies to its own sessions: the same command is denied for the careful
/// agent (by its rule) and runs for the other agent. (The tool list is checked by the chain's
/// unit tests.)
#[test]
fn an_agents_rules_apply_to_its_sessions_only() {
    let agents = "\n[[agents]]\nname = \"careful\"\nharness = \"messages-api\"\nmodel = \"keel-scripted-1\"\ntools = [\"bash\", \"read\"]\nrules = { deny = [\"bash(*careful-denied*)\"] }\n\n[[agents]]\nname = \"free\"\nharness = \"messages-api\"\nmodel = \"keel-scripted-1\"\n";
    let home = Home::new(agents);
    let mut steps = Vec::new();
    for (key, agent, command) in [
        (
            "careful",
            "careful",
            "echo careful-denied > careful.txt; echo made",
        ),
        ("free", "free", "echo careful-denied > free.txt; echo made"),
    ] {
        let mut step = scripted::step(key, "Run the command.", command, "shell", &[]).unwrap();
        step.assignee = Some(agent.into());
        steps.push(step);
    }
    home.write_plan(steps);
    let mut cmd = keel(home.path()).unwrap();
    cmd.args(["run", "agents", "--plan", ".keel/plan.json"])
        .env("ANTHROPIC_BASE_URL", &home.url)
        .env("ANTHROPIC_API_KEY", "sk-agents-test");
    let (code, out, err) = run_to_end(&mut cmd, WAIT).unwrap();
    assert!(!home.path().join("careful.txt").exists(), "{out}\n{err}");
    assert!(
        home.path().join("free.txt").exists(),
        "the free agent's call did not run ({code})\n{out}\n{err}"
    );
    let rows = home.audit();
    // Each attempt of the careful step is denied (its retries included), the free one never.
    let denied = audit_rows_by(&rows, "agent-deny-rule", "deny");
    assert!(!denied.is_empty(), "{rows:#?}");
    assert!(
        denied.iter().all(|r| r["reason"]
            == "denied by agent careful's rule bash(*careful-denied*)"
            && r["task"] == denied[0]["task"]),
        "{rows:#?}"
    );
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}
