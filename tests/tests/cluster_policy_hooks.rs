//! The coordinator's policy hooks on sessions that `keel node` workers host (docs/DESIGN.md §9,
//! docs/HARNESSES.md): a CLI about to compact its context asks the coordinator's `PreCompact` hooks
//! (the question crosses the cluster; the veto and its audit row are the coordinator's), and a
//! result a `PostToolUse` hook of the coordinator redacted is what the session log holds, not the
//! original the CLI's own stream printed on the worker.
//!
//! Real processes on 127.0.0.1: `keel model-server` (recording every request), a `keel node --role
//! coordinator --run` with the policy, one `keel node --role worker` in another folder whose own
//! keel.toml has no policy, and the real CLI on the worker (skipped only with
//! `KEEL_SKIP_REAL_CLIS=1` when it is not installed).
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_harness::HarnessKind;
use keel_tests::policy::{
    PolicyHome, assert_redacted_everywhere, compact_claude_code_early, compaction_prompt,
    compaction_script, redact_hunter2_policy, shell_step,
};
use keel_tests::{audit_rows_by, cli_installed, init_home_with, recorded_bodies};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(240);

/// What a run on the cluster left: the coordinator's home, the coordinator's
/// audit rows, the model requests, and the context a failed assertion prints.
struct Ran {
    home: PolicyHome,
    rows: Vec<Value>,
    bodies: Vec<String>,
    context: String,
}

/// `home`'s plan run by a coordinator node with `home`'s policy, its one step placed on a worker
/// whose folder `prepare` fills first, on `harness`.
fn run_on_a_worker(home: PolicyHome, harness: HarnessKind, prepare: impl Fn(&Path)) -> Ran {
    let worker_dir = tempfile::tempdir().unwrap();
    init_home_with(worker_dir.path(), "", WAIT).unwrap();
    prepare(worker_dir.path());
    let (coordinator, worker) = home
        .start_cluster(Some(harness), worker_dir.path())
        .unwrap();
    let (_status, out, err) = coordinator.wait_output(WAIT).unwrap();
    let worker_log = worker.stderr_so_far();
    drop(worker);
    let rows = home.audit().unwrap();
    let bodies = recorded_bodies(&home.record_dir())
        .iter()
        .map(Value::to_string)
        .collect();
    let context = format!("{harness}\n{out}\n{err}\nworker:\n{worker_log}\n{rows:#?}");
    assert!(
        err.contains("specialist placed on a worker"),
        "the step did not run on the worker: {context}"
    );
    Ran {
        home,
        rows,
        bodies,
        context,
    }
}

/// A mandatory `PreCompact` hook of the coordinator that refuses: the CLI on the worker asks before
/// compacting, the veto is an audit row of the coordinator's store, and no compaction request ever
/// reaches the model. The compaction is forced as in `policy_precompact.rs`: the scripted model
/// reports a nearly full context after a few shell calls (Claude Code with the project setting
/// `autoCompactWindow` in the worker's folder, where the session works).
fn a_coordinator_veto_blocks_a_workers_compaction(harness: HarnessKind) {
    let policy = "\n[[hooks]]\nname = \"whole-context\"\nevent = \"PreCompact\"\ncommand = [\"/bin/sh\", \"-c\", \"echo 'the context stays whole' >&2; exit 2\"]\n";
    let home = PolicyHome::with_script(policy, Some(&compaction_script(harness))).unwrap();
    home.write_plan(vec![shell_step("hello", "Say hello.", "echo hello", &[])])
        .unwrap();
    let ran = run_on_a_worker(home, harness, |dir| {
        compact_claude_code_early(dir).unwrap();
    });
    let vetoes = audit_rows_by(&ran.rows, "hook:whole-context", "deny");
    assert!(
        !vetoes.is_empty(),
        "no veto in the coordinator's audit: {}",
        ran.context
    );
    assert!(
        vetoes.iter().all(|r| r["tool"] == "PreCompact"
            && r["reason"]
                .as_str()
                .unwrap()
                .contains("the context stays whole")),
        "{}",
        ran.context
    );
    let prompt = compaction_prompt(harness);
    assert!(
        ran.bodies.iter().all(|b| !b.contains(prompt)),
        "the CLI on the worker compacted although the coordinator vetoed it: {}",
        ran.context
    );
}

#[test]
fn claude_code_on_a_worker_asks_the_coordinators_pre_compact_hooks() {
    if cli_installed(HarnessKind::ClaudeCode) {
        a_coordinator_veto_blocks_a_workers_compaction(HarnessKind::ClaudeCode);
    }
}

#[test]
fn codex_on_a_worker_asks_the_coordinators_pre_compact_hooks() {
    if cli_installed(HarnessKind::Codex) {
        a_coordinator_veto_blocks_a_workers_compaction(HarnessKind::Codex);
    }
}

/// A `PostToolUse` hook of the coordinator redacts a secret a Codex command printed on the worker:
/// no model request holds it, and neither does the session log the worker sent the coordinator
/// (`keel logs`) nor the resume preamble of a later attempt (`keel context --resume`), although
/// Codex's own stream printed the original.
#[test]
fn a_redacted_result_is_what_a_workers_codex_session_logs() {
    if !cli_installed(HarnessKind::Codex) {
        return;
    }
    let home = PolicyHome::new(&redact_hunter2_policy()).unwrap();
    home.write_plan(vec![shell_step(
        "read",
        "Read the file.",
        "cat secret.txt",
        &[],
    )])
    .unwrap();
    let ran = run_on_a_worker(home, HarnessKind::Codex, |dir| {
        std::fs::write(dir.join("secret.txt"), "pw-hunter2\n").unwrap();
    });
    let kept = ran.home.logs_and_preambles().unwrap();
    assert_redacted_everywhere(&ran.bodies, &kept, &ran.context);
}
