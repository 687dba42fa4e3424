//! The policy of sessions hosted on `keel node` workers (docs/DESIGN.md §9, §10): the coordinator
//! node's keel.toml is authoritative. A worker's session asks the coordinator before each tool call
//! (keel's own loop in process, a CLI through `keel hook` on the worker's bridge); the coordinator
//! decides with its policy, makes the audit rows durable in its store, raises an approval for an
//! `ask` (answered with `keel answer` on the coordinator's home) and answers.
//!
//! Real processes on 127.0.0.1: `keel model-server`, a `keel node --role coordinator --run` whose
//! keel.toml denies one shell command, asks about another and allows a third, and one `keel node
//! --role worker` in another folder whose own keel.toml denies the allowed command (it must not
//! count). The denied command's file never appears, the asked one's appears once approved, the
//! allowed one's appears; every decision is an audit row of the coordinator's store (`keel audit`),
//! the results crossed back to its `PostToolUse` hook and its `SubagentStop` hook annotated the
//! reports. On keel's own loop and on each real CLI (skipped only with `KEEL_SKIP_REAL_CLIS=1` when
//! it is not installed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_harness::HarnessKind;
use keel_store::RunId;
use keel_tests::cluster::{COOKIE, NODE_LOG, write_cookie};
use keel_tests::fan_out::{reader, subtasks};
use keel_tests::policy::{PolicyHome, harness_args, shell_step};
use keel_tests::serve::{Server, worker_command};
use keel_tests::{
    Reaped, audit_rows_by, cli_installed, init_home_with, keel, keel_json_list, run_to_end,
    wait_for,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(240);
const JOIN_WAIT: Duration = Duration::from_secs(60);
/// The command the coordinator's policy denies; its file must never appear.
const FORBIDDEN: &str = "echo should-not-run > blocked.txt";
/// The command the coordinator's policy asks about; its file appears once a human approves it.
const ASKED: &str = "echo needs-approval > approved.txt";
/// The command the coordinator's policy allows (and the worker's own keel.toml denies).
const ALLOWED: &str = "echo allowed-run > allowed.txt";
/// What the coordinator's `SubagentStop` hook adds to every report.
const NOTE: &str = "checked on the coordinator";
/// The coordinator's policy: the rules, a `PostToolUse` hook with no opinion (every result crosses
/// back to the coordinator) and a `SubagentStop` hook that annotates every report.
const COORDINATOR_POLICY: &str = concat!(
    "\n[permissions]\ndeny = [\"*(*should-not-run*)\"]\nask = [\"*(*needs-approval*)\"]\n",
    "allow = [\"*(*allowed-run*)\"]\nask_timeout_s = 180\n",
    "\n[[hooks]]\nname = \"seen\"\nevent = \"PostToolUse\"\ncommand = [\"true\"]\n",
    "\n[[hooks]]\nname = \"noted\"\nevent = \"SubagentStop\"\ncommand = [\"/bin/sh\", \"-c\", ",
    "\"printf '{\\\"hookSpecificOutput\\\":{\\\"additionalContext\\\":\\\"checked on the coordinator\\\"}}'\"]\n",
);
/// The worker's own policy: not used, the coordinator's decides.
const WORKER_POLICY: &str = "\n[permissions]\ndeny = [\"*(*allowed-run*)\"]\n";

/// `keel --json escalations` of the coordinator's home.
fn escalations(dir: &Path, all: bool) -> Vec<Value> {
    let args: &[&str] = if all {
        &["escalations", "--all"]
    } else {
        &["escalations"]
    };
    keel_json_list(dir, args, "escalations", WAIT).unwrap()
}

/// A coordinator with a deny, an ask and an allow rule, one worker: a run of three shell steps on
/// `harness` (keel's own loop when `None`), all placed on the worker.
fn case(harness: Option<HarnessKind>) {
    let home = PolicyHome::new(COORDINATOR_POLICY).unwrap();
    home.write_plan(vec![
        shell_step("forbidden", "Create the marker file.", FORBIDDEN, &[]),
        shell_step("asked", "Create the approved file.", ASKED, &[]),
        shell_step("allowed", "Create the allowed file.", ALLOWED, &[]),
    ])
    .unwrap();
    let worker_dir = tempfile::tempdir().unwrap();
    init_home_with(worker_dir.path(), WORKER_POLICY, WAIT).unwrap();
    let (coordinator, worker) = home.start_cluster(harness, worker_dir.path()).unwrap();

    // The asked call waits for a human on the coordinator: an approval escalation of its run.
    let open = wait_for(WAIT, "an approval escalation", || {
        let list = escalations(home.path(), false);
        (!list.is_empty()).then_some(list)
    })
    .unwrap();
    assert_eq!(open.len(), 1, "{open:#?}");
    assert_eq!(open[0]["trigger"], "policy_gap", "{:#}", open[0]);
    let id = open[0]["id"].as_str().unwrap().to_string();
    assert!(
        !worker_dir.path().join("approved.txt").exists(),
        "{harness:?}: the asked call ran before its approval"
    );
    let (code, out, err) = run_to_end(
        keel(home.path()).unwrap().args(["answer", &id, "allow"]),
        WAIT,
    )
    .unwrap();
    assert_eq!(code, 0, "{out}{err}");

    let (_status, out, err) = coordinator.wait_output(WAIT).unwrap();
    let worker_log = worker.stderr_so_far();
    drop(worker);
    let context = format!("{harness:?}\n{out}\n{err}\nworker:\n{worker_log}");
    // Every step ran on the worker, in its folder.
    assert_eq!(
        err.matches("specialist placed on a worker").count(),
        3,
        "{context}"
    );
    for dir in [worker_dir.path(), home.path()] {
        assert!(
            !dir.join("blocked.txt").exists(),
            "the denied command ran: {context}"
        );
    }
    assert!(
        worker_dir.path().join("approved.txt").exists(),
        "the approved call did not run: {context}"
    );
    assert!(
        worker_dir.path().join("allowed.txt").exists(),
        "the allowed call did not run (the worker's own policy decided?): {context}"
    );
    assert!(!worker_log.contains("not ready to record"), "{context}");

    // Every decision is durable in the coordinator's store.
    let rows = home.audit().unwrap();
    let denied = audit_rows_by(&rows, "deny-rule", "deny");
    assert!(
        !denied.is_empty(),
        "no denial audited: {rows:#?}\n{context}"
    );
    assert!(
        denied
            .iter()
            .all(|r| r["reason"] == "denied by rule *(*should-not-run*)" && r["task"].is_string()),
        "{rows:#?}"
    );
    assert!(
        !audit_rows_by(&rows, "allow-rule", "allow").is_empty(),
        "the allowed call was not audited: {rows:#?}\n{context}"
    );
    assert!(
        !audit_rows_by(&rows, "ask-rule", "ask").is_empty(),
        "{rows:#?}"
    );
    let approved = audit_rows_by(&rows, "approval", "allow");
    assert_eq!(approved.len(), 1, "{rows:#?}");
    assert!(
        approved[0]["reason"].as_str().unwrap().contains(&id),
        "{rows:#?}"
    );
    let all = escalations(home.path(), true);
    assert_eq!(all[0]["status"], "answered", "{all:#?}");
    // The results crossed back to the coordinator's PostToolUse hook, and its SubagentStop hook
    // annotated the reports the worker's sessions sent: rows of its store, the note in the outcome.
    assert!(
        rows.iter().any(|r| r["who"] == "hook:seen"),
        "no PostToolUse row: {rows:#?}\n{context}"
    );
    assert!(
        rows.iter()
            .any(|r| r["who"] == "hook:noted" && r["tool"] == "SubagentStop"),
        "no SubagentStop row: {rows:#?}\n{context}"
    );
    let run: RunId = out
        .lines()
        .find(|l| l.contains("started on the cluster"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("no run id: {context}"));
    let store = reader(home.path());
    let allowed = subtasks(&store, run)
        .into_iter()
        .find(|t| t.brief.contains("allowed-run"))
        .unwrap();
    assert!(
        allowed
            .outcome
            .as_deref()
            .unwrap_or_default()
            .contains(NOTE),
        "{allowed:#?}\n{context}"
    );
}

#[test]
fn keels_own_loop_on_a_worker_is_gated_by_the_coordinators_policy() {
    case(None);
}

#[test]
fn claude_code_on_a_worker_is_gated_by_the_coordinators_policy() {
    if cli_installed(HarnessKind::ClaudeCode) {
        case(Some(HarnessKind::ClaudeCode));
    }
}

#[test]
fn codex_on_a_worker_is_gated_by_the_coordinators_policy() {
    if cli_installed(HarnessKind::Codex) {
        case(Some(HarnessKind::Codex));
    }
}

#[test]
fn opencode_on_a_worker_is_gated_by_the_coordinators_policy() {
    if cli_installed(HarnessKind::Opencode) {
        case(Some(HarnessKind::Opencode));
    }
}

#[test]
fn pi_on_a_worker_is_gated_by_the_coordinators_policy() {
    if cli_installed(HarnessKind::Pi) {
        case(Some(HarnessKind::Pi));
    }
}

/// An `ask` of a session on a worker, answered through the coordinator daemon's HTTP API (`POST
/// /v1/escalations/{id}/answer`) rather than `keel answer` on its home: the answer is durable on the
/// coordinator, delivered to the call that waits (`delivered: tool_call`), and the worker's call runs.
/// The run is submitted by a local `keel run` on the home, which goes to the daemon (`server.json`).
#[test]
fn an_ask_on_a_worker_is_answered_through_the_coordinators_http_api() {
    let home = PolicyHome::new(COORDINATOR_POLICY).unwrap();
    home.write_plan(vec![
        shell_step("asked", "Create the approved file.", ASKED, &[]),
        shell_step("forbidden", "Create the marker file.", FORBIDDEN, &[]),
    ])
    .unwrap();
    let worker_dir = tempfile::tempdir().unwrap();
    init_home_with(worker_dir.path(), WORKER_POLICY, WAIT).unwrap();
    let cookie = home.path().join("cookie");
    write_cookie(&cookie, COOKIE, 0o600);
    let (mut server, cluster) = Server::start_coordinator_with(
        home.path(),
        &cookie,
        &["--lease-ms", "1500", "--model-server", &home.url],
        &[],
    );
    let mut cmd = worker_command(worker_dir.path(), &cluster, "w1", &cookie);
    cmd.env("KEEL_LOG", NODE_LOG)
        .args(["--capacity", "4", "--lease-ms", "1500"]);
    harness_args(&mut cmd, None, &home.url);
    let worker = Reaped::spawn(cmd).unwrap();
    server
        .process
        .stderr_line_containing("worker joined", JOIN_WAIT)
        .unwrap();

    // A local run on the home the daemon holds goes to the daemon.
    let mut cmd = keel(home.path()).unwrap();
    cmd.args(["run", "policy", "--quiet", "--plan", ".keel/plan.json"]);
    let run = Reaped::spawn(cmd).unwrap();
    let token = server.token();
    let id = wait_for(JOIN_WAIT, "an approval escalation over HTTP", || {
        let (status, body) = server.request("GET", "/v1/escalations", Some(&token), None);
        assert_eq!(status, 200, "{body}");
        let list: Value = serde_json::from_str(&body).unwrap();
        let open = list["escalations"].as_array().cloned().unwrap_or_default();
        open.first()
            .and_then(|e| e["id"].as_str())
            .map(str::to_string)
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}\nrun:\n{}\ncoordinator:\n{}\nworker:\n{}",
            run.stderr_so_far(),
            server.process.stderr_so_far(),
            worker.stderr_so_far()
        )
    });
    assert!(
        !worker_dir.path().join("approved.txt").exists(),
        "the asked call ran before its approval"
    );
    let (status, body) = server.request(
        "POST",
        &format!("/v1/escalations/{id}/answer"),
        Some(&token),
        Some(br#"{"answer":"allow"}"#),
    );
    assert_eq!(status, 200, "{body}");
    let answered: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answered["delivered"], "tool_call", "{answered:#}");

    let (code, out, err) = run.wait_output(WAIT).unwrap();
    let context = format!(
        "{out}\n{err}\ncoordinator:\n{}\nworker:\n{}",
        server.process.stderr_so_far(),
        worker.stderr_so_far()
    );
    assert!(code.success(), "{context}");
    assert!(
        worker_dir.path().join("approved.txt").exists(),
        "the call approved over HTTP did not run: {context}"
    );
    assert!(
        !worker_dir.path().join("blocked.txt").exists(),
        "the denied command ran: {context}"
    );
    let rows = home.audit().unwrap();
    let approved = audit_rows_by(&rows, "approval", "allow");
    assert_eq!(approved.len(), 1, "{rows:#?}\n{context}");
    assert!(
        approved[0]["reason"].as_str().unwrap().contains(&id),
        "{rows:#?}"
    );
    assert!(
        !audit_rows_by(&rows, "deny-rule", "deny").is_empty(),
        "{rows:#?}\n{context}"
    );
}
