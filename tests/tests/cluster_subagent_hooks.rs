//! The policy's SubagentStart and SubagentStop hooks on a cluster (docs/DESIGN.md §9): with the
//! specialists on a worker, the hooks still run, on the coordinator node that holds the policy and
//! the store (a worker has neither), before the attempt leaves for the worker and when its report
//! comes back. Real `keel node` processes on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_store::TaskStatus;
use keel_tests::cluster::{ClusterHome, NODE_LOG, free_port, wait_joined};
use keel_tests::fan_out::{reader, subtasks};
use keel_tests::serve::worker_command;
use keel_tests::{Reaped, audit_rows_by, keel, keel_json_list};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

/// A SubagentStart hook that vetoes a brief mentioning `forbidden`, and a SubagentStop hook that
/// annotates every report.
const HOOKS: &str = r#"
[[hooks]]
name = "starts"
event = "SubagentStart"
command = ["/bin/sh", "-c", "grep -q forbidden && { echo 'no forbidden work' >&2; exit 2; }; exit 0"]

[[hooks]]
name = "reports"
event = "SubagentStop"
command = ["/bin/sh", "-c", "cat >/dev/null; printf '{\"hookSpecificOutput\":{\"additionalContext\":\"checked on the coordinator\"}}'"]
"#;

#[test]
fn subagent_hooks_run_on_the_coordinator_for_specialists_on_a_worker() {
    let models = tempfile::tempdir().unwrap();
    let record = models.path().join("requests");
    let (_server, url) = keel_tests::model_server(models.path(), &record).unwrap();
    let home = ClusterHome::new(HOOKS, 2, |i| {
        if i == 0 {
            "echo forbidden > vetoed.txt; echo vetoed".into()
        } else {
            "echo allowed".into()
        }
    });
    // The worker's own home holds no policy: what is decided here is the coordinator's.
    let worker_home = ClusterHome::new("", 1, |_| "true".into());
    let listen = format!("127.0.0.1:{}", free_port());
    let mut cmd = keel(&home.work).unwrap();
    cmd.env("KEEL_LOG", NODE_LOG)
        .args(["node", "--role", "coordinator", "--listen", &listen])
        .args(["--model-server", &url, "--cookie-file"])
        .arg(&home.cookie)
        .args([
            "--run",
            "fan out",
            "--plan",
            "plan.json",
            "--wait-workers",
            "1",
        ]);
    let mut coordinator = Reaped::spawn(cmd).unwrap();
    coordinator.line_containing("listening on", WAIT).unwrap();
    let mut worker = worker_command(&worker_home.work, &listen, "w1", &worker_home.cookie);
    worker
        .env("KEEL_LOG", NODE_LOG)
        .args(["--model-server", &url]);
    let _worker = Reaped::spawn(worker).unwrap();
    wait_joined(&coordinator, 1, WAIT);
    let (_status, out, err) = coordinator.wait_output(WAIT).unwrap();

    // Both attempts went to the worker (the coordinator hosts no sessions).
    assert!(
        !home.work.join("vetoed.txt").exists() && !worker_home.work.join("vetoed.txt").exists(),
        "the vetoed start ran\n{out}\n{err}"
    );
    let store = reader(&home.work);
    let run = store.catalog().runs(1).unwrap().items[0].id;
    let tasks = subtasks(&store, run);
    let vetoed = tasks
        .iter()
        .find(|t| t.brief.contains("forbidden"))
        .expect("the vetoed step");
    assert_ne!(vetoed.status, TaskStatus::Complete, "{vetoed:#?}");
    assert!(
        vetoed
            .outcome
            .as_deref()
            .unwrap_or_default()
            .contains("no forbidden work"),
        "{vetoed:#?}"
    );
    let allowed = tasks
        .iter()
        .find(|t| t.brief.contains("echo allowed"))
        .expect("the allowed step");
    assert_eq!(allowed.status, TaskStatus::Complete, "{allowed:#?}\n{err}");
    assert!(
        allowed
            .outcome
            .as_deref()
            .unwrap_or_default()
            .contains("checked on the coordinator"),
        "{allowed:#?}"
    );
    drop(store);
    let rows = keel_json_list(&home.work, &["audit", &run.to_string()], "rows", WAIT).unwrap();
    assert_eq!(
        audit_rows_by(&rows, "hook:starts", "deny").len(),
        1,
        "{rows:#?}"
    );
    assert!(
        !audit_rows_by(&rows, "hook:starts", "defer").is_empty(),
        "{rows:#?}"
    );
    assert!(
        !audit_rows_by(&rows, "hook:reports", "allow").is_empty(),
        "{rows:#?}"
    );
    assert!(err.contains("placed on a worker"), "{err}");
}
