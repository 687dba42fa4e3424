//! Invariant 12 on the real `keel` path (docs/DESIGN.md §9, §12): a policy in keel.toml turns the
//! pre-tool gate on for every session; each harness asks the node through `keel hook` before a tool
//! call runs; a denied call never runs (the file it would create never appears); every decision is an
//! audit row that `keel audit` shows; a mandatory hook that hangs denies after its timeout.
//!
//! Real processes: `keel model-server` (the scripted model on 127.0.0.1), `keel run` on a plan whose
//! steps tell the model to run a shell command, keel's own agent loop, and the four real CLIs
//! (skipped only with `KEEL_SKIP_REAL_CLIS=1` when they are not installed). For each harness: a deny
//! rule and an answered `ask` in one run, and a hung mandatory hook in another.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_actors::runtime::scripted;
use keel_harness::HarnessKind;
use keel_store::{HookDecision, RunId, Store, StoreConfig};
use keel_tests::policy::{PolicyHome, shell_step};
use keel_tests::{
    Reaped, audit_rows_by, cli_installed, keel, keel_json_list, run_to_end, wait_for,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(240);
/// The command the denied step asks for; its file must never appear.
const FORBIDDEN: &str = "echo should-not-run > blocked.txt";
/// The command the asked step asks for; its file appears once a human approves it.
const ASKED: &str = "echo needs-approval > approved.txt";
/// The policy of the deny-and-ask run: one command denied, one asked.
const DENY_AND_ASK: &str = "\n[permissions]\ndeny = [\"*(*should-not-run*)\"]\nask = [\"*(*needs-approval*)\"]\nask_timeout_s = 180\n";

struct Fixture(PolicyHome);

impl Fixture {
    /// A folder with a keel home whose keel.toml holds `policy`, a plan of three steps in parallel
    /// (one runs [`FORBIDDEN`], one [`ASKED`], one a harmless command), and a scripted model server.
    fn new(policy: &str) -> Fixture {
        let home = PolicyHome::new(policy).unwrap();
        home.write_plan(vec![
            shell_step("forbidden", "Create the marker file.", FORBIDDEN, &[]),
            shell_step("asked", "Create the approved file.", ASKED, &[]),
            shell_step("harmless", "Say hello.", "echo hello", &[]),
        ])
        .unwrap();
        Fixture(home)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// `keel run` of the plan on keel's own loop (`None`) or a real CLI; returns its exit code and
    /// output (the run may fail: the forbidden step never gets its report).
    fn run(&self, harness: Option<HarnessKind>) -> (i32, String, String) {
        run_to_end(&mut self.run_command(harness), WAIT).unwrap()
    }

    /// The `keel run` command of [`Fixture::run`], not started.
    fn run_command(&self, harness: Option<HarnessKind>) -> std::process::Command {
        self.0.run_command(harness).unwrap()
    }

    /// `keel --json audit` of the latest run: its rows.
    fn audit(&self) -> Vec<Value> {
        self.0.audit().unwrap()
    }
}

#[test]
fn keels_own_loop_denies_by_rule_and_runs_an_asked_call_once_approved() {
    deny_and_ask_case(None);
}

#[test]
fn claude_code_denies_by_rule_and_runs_an_asked_call_once_approved() {
    if cli_installed(HarnessKind::ClaudeCode) {
        deny_and_ask_case(Some(HarnessKind::ClaudeCode));
    }
}

#[test]
fn codex_denies_by_rule_and_runs_an_asked_call_once_approved() {
    if cli_installed(HarnessKind::Codex) {
        deny_and_ask_case(Some(HarnessKind::Codex));
    }
}

#[test]
fn opencode_denies_by_rule_and_runs_an_asked_call_once_approved() {
    if cli_installed(HarnessKind::Opencode) {
        deny_and_ask_case(Some(HarnessKind::Opencode));
    }
}

#[test]
fn pi_denies_by_rule_and_runs_an_asked_call_once_approved() {
    if cli_installed(HarnessKind::Pi) {
        deny_and_ask_case(Some(HarnessKind::Pi));
    }
}

/// `keel --json escalations` in `dir` (`--all` too when asked): the listed escalations.
fn escalations(dir: &Path, all: bool) -> Vec<Value> {
    let args: &[&str] = if all {
        &["escalations", "--all"]
    } else {
        &["escalations"]
    };
    keel_json_list(dir, args, "escalations", WAIT).unwrap()
}

/// A deny rule and an `ask` rule on one harness, in one run: the denied command's file never
/// appears and its denial is audited with its rule; the asked call waits for a human, and `keel
/// answer ID allow` from another process lets it run (its file appears), the ask and the approval
/// being audit rows; the harmless call was audited as allowed (every call asked the node).
fn deny_and_ask_case(harness: Option<HarnessKind>) {
    let fx = Fixture::new(DENY_AND_ASK);
    let run = Reaped::spawn(fx.run_command(harness)).unwrap();
    let open = wait_for(WAIT, "an approval escalation", || {
        let list = escalations(fx.path(), false);
        (!list.is_empty()).then_some(list)
    })
    .unwrap();
    assert_eq!(open.len(), 1, "{open:#?}");
    let e = &open[0];
    assert_eq!(e["trigger"], "policy_gap", "{e:#}");
    assert_eq!(e["waiting"]["kind"], "tool_call", "{e:#}");
    assert_eq!(e["options"], serde_json::json!(["allow", "deny"]));
    let id = e["id"].as_str().unwrap();
    assert!(
        e["recommended_action"]
            .as_str()
            .unwrap()
            .contains(&format!("keel answer {id} allow")),
        "{e:#}"
    );
    assert!(
        !fx.path().join("approved.txt").exists(),
        "{harness:?}: the call ran before its approval"
    );
    let (code, out, err) =
        run_to_end(keel(fx.path()).unwrap().args(["answer", id, "allow"]), WAIT).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("the waiting tool call is decided"), "{out}");
    let (_status, out, err) = run.wait_output(WAIT).unwrap();
    assert!(
        !fx.path().join("blocked.txt").exists(),
        "{harness:?}: the denied command ran\n{out}\n{err}"
    );
    assert!(
        fx.path().join("approved.txt").exists(),
        "{harness:?}: the approved call did not run\n{out}\n{err}"
    );
    let rows = fx.audit();
    let denied = audit_rows_by(&rows, "deny-rule", "deny");
    assert!(
        !denied.is_empty(),
        "{harness:?}: no denial audited: {rows:#?}\n{out}\n{err}"
    );
    assert!(
        denied
            .iter()
            .all(|r| r["reason"] == "denied by rule *(*should-not-run*)" && r["task"].is_string()),
        "{rows:#?}"
    );
    assert!(
        !audit_rows_by(&rows, "unmatched", "allow").is_empty(),
        "{harness:?}: the harmless call was not audited: {rows:#?}"
    );
    assert!(
        rows.iter().all(|r| {
            let digest = r["input_digest"].as_str().unwrap();
            !digest.contains("should-not-run") && !digest.contains("needs-approval")
        }),
        "an audit row holds the raw input"
    );
    assert!(
        !audit_rows_by(&rows, "ask-rule", "ask").is_empty(),
        "{rows:#?}"
    );
    let approved = audit_rows_by(&rows, "approval", "allow");
    assert_eq!(approved.len(), 1, "{rows:#?}");
    assert!(
        approved[0]["reason"].as_str().unwrap().contains(id),
        "{rows:#?}"
    );
    let all = escalations(fx.path(), true);
    assert_eq!(all[0]["status"], "answered", "{all:#?}");
}

/// An `ask` nobody answers: the call is denied once its timeout passes, the denial is audited and
/// the escalation is recorded as expired.
fn ask_unanswered_case(harness: Option<HarnessKind>) {
    let fx = Fixture::new("\n[permissions]\nask = [\"*(*needs-approval*)\"]\nask_timeout_s = 2\n");
    let (_code, out, err) = fx.run(harness);
    assert!(
        !fx.path().join("approved.txt").exists(),
        "{harness:?}: an unanswered ask ran\n{out}\n{err}"
    );
    let rows = fx.audit();
    assert!(
        !audit_rows_by(&rows, "ask-rule", "ask").is_empty(),
        "{rows:#?}"
    );
    let denied = audit_rows_by(&rows, "approval", "deny");
    assert!(!denied.is_empty(), "{harness:?}: {rows:#?}\n{out}\n{err}");
    assert!(
        denied
            .iter()
            .all(|r| r["reason"].as_str().unwrap().contains("timed out")),
        "{rows:#?}"
    );
    assert!(
        audit_rows_by(&rows, "approval", "allow").is_empty(),
        "{rows:#?}"
    );
    // Should a retry of the step ask again, the run may end while its last ask still waits (a
    // session ended by the run's end records no expiry), so the first one is checked.
    let all = escalations(fx.path(), true);
    assert_eq!(all[0]["status"], "expired", "{all:#?}");
    assert!(all.iter().all(|e| e["status"] != "answered"), "{all:#?}");
}

#[test]
fn keels_own_loop_denies_an_asked_call_nobody_answers_after_its_timeout() {
    ask_unanswered_case(None);
}

#[test]
fn claude_code_denies_an_asked_call_nobody_answers_after_its_timeout() {
    if cli_installed(HarnessKind::ClaudeCode) {
        ask_unanswered_case(Some(HarnessKind::ClaudeCode));
    }
}

#[test]
fn a_mandatory_hook_that_hangs_denies_after_its_timeout() {
    hung_hook_case(None);
}

#[test]
fn claude_code_a_mandatory_hook_that_hangs_denies_after_its_timeout() {
    if cli_installed(HarnessKind::ClaudeCode) {
        hung_hook_case(Some(HarnessKind::ClaudeCode));
    }
}

#[test]
fn codex_a_mandatory_hook_that_hangs_denies_after_its_timeout() {
    if cli_installed(HarnessKind::Codex) {
        hung_hook_case(Some(HarnessKind::Codex));
    }
}

#[test]
fn opencode_a_mandatory_hook_that_hangs_denies_after_its_timeout() {
    if cli_installed(HarnessKind::Opencode) {
        hung_hook_case(Some(HarnessKind::Opencode));
    }
}

#[test]
fn pi_a_mandatory_hook_that_hangs_denies_after_its_timeout() {
    if cli_installed(HarnessKind::Pi) {
        hung_hook_case(Some(HarnessKind::Pi));
    }
}

fn hung_hook_case(harness: Option<HarnessKind>) {
    let fx = Fixture::new(
        "\n[[hooks]]\nname = \"hangs\"\nevent = \"PreToolUse\"\ncommand = [\"sleep\", \"30\"]\ntimeout_ms = 300\n",
    );
    let (_code, out, err) = fx.run(harness);
    assert!(
        !fx.path().join("blocked.txt").exists(),
        "the call ran past a hung mandatory hook\n{out}\n{err}"
    );
    let rows = fx.audit();
    let errors = audit_rows_by(&rows, "hook:hangs", "error");
    assert!(!errors.is_empty(), "{rows:#?}\n{out}\n{err}");
    assert!(
        errors.iter().all(|r| r["reason"]
            .as_str()
            .unwrap()
            .contains("failed closed: timed out after 300 ms")),
        "{rows:#?}"
    );
    assert!(
        rows.iter().all(|r| r["decision"] != "allow"),
        "a call was allowed past the hung hook: {rows:#?}"
    );
}

/// A counting gate counts from the store: calls let through before a SIGKILL of the node still
/// count after `keel resume`, so the run never gets more than `max_calls` of them.
#[test]
fn a_counting_gate_survives_a_sigkill_of_the_node() {
    let fx = Fixture::new(
        "\n[[gates]]\nname = \"count\"\nkind = \"count\"\nrule = \"*(*counted*)\"\nmax_calls = 2\nper = \"run\"\n",
    );
    // Four steps in a chain, each one counted call.
    let steps: Vec<_> = (0..4)
        .map(|i| {
            let deps: Vec<String> = if i == 0 {
                Vec::new()
            } else {
                vec![format!("s{}", i - 1)]
            };
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            scripted::step(
                &format!("s{i}"),
                "Echo the counted word.",
                &format!("echo counted-{i}"),
                "shell",
                &deps,
            )
            .unwrap()
        })
        .collect();
    fx.0.write_plan(steps).unwrap();
    let mut cmd = keel(fx.path()).unwrap();
    cmd.args([
        "run",
        "count",
        "--plan",
        ".keel/plan.json",
        "--model-server",
        &fx.0.url,
    ]);
    let mut node = Reaped::spawn(cmd).unwrap();
    let line = node
        .line_containing("started in", Duration::from_secs(60))
        .unwrap();
    let run: RunId = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let store = Store::open_read_only(
        fx.path().join(".keel").join("keel.redb"),
        StoreConfig::default(),
    )
    .unwrap();
    let gate_rows = |decision: HookDecision| {
        store
            .run(run)
            .audit(0, 1000)
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.value.hook == "gate:count" && r.value.decision == decision)
            .count()
    };
    wait_for(WAIT, "a counted call before the kill", || {
        (gate_rows(HookDecision::Allow) >= 1).then_some(())
    })
    .unwrap();
    node.kill();
    let (code, out, err) = run_to_end(
        keel(fx.path())
            .unwrap()
            .args(["resume", &run.to_string(), "--model-server", &fx.0.url]),
        WAIT,
    )
    .unwrap();
    assert!(code == 0 || code == 5, "resume: {code}\n{out}\n{err}");
    let rows = fx.audit();
    let allowed = audit_rows_by(&rows, "gate:count", "allow");
    let denied = audit_rows_by(&rows, "gate:count", "deny");
    assert_eq!(
        allowed.len(),
        2,
        "the gate let more than its count through across the kill: {rows:#?}"
    );
    assert!(
        !denied.is_empty(),
        "the third counted call was not denied: {rows:#?}"
    );
    assert!(
        denied.iter().all(|r| r["reason"]
            .as_str()
            .unwrap()
            .contains("at most 2 calls matching *(*counted*) per run; 2 already ran")),
        "{rows:#?}"
    );
}
