//! The HTTP API on a cluster's coordinator node, on real processes over 127.0.0.1: a `keel node`
//! coordinator daemon and one worker; `keel run --server URL` and a local `keel run` on the
//! coordinator's home print what a local run prints, while every specialist ran on the worker;
//! reads answer through the API (the daemon holds the store file alone); `/metrics` counts the
//! remote dispatches.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use keel_tests::serve::{Server, quiet_survey, survey_files, worker_command};
use keel_tests::{Reaped, keel};

/// How long a worker may take to join (a cold binary on a loaded machine).
const JOIN_WAIT: Duration = Duration::from_secs(120);

#[test]
fn keel_run_against_a_coordinator_node_prints_what_a_local_run_prints() {
    let local = tempfile::tempdir().unwrap();
    survey_files(local.path());
    let expected = quiet_survey(keel(local.path()).unwrap(), local.path());
    assert!(expected.contains("failures: none"), "{expected}");

    let remote = tempfile::tempdir().unwrap();
    survey_files(remote.path());
    let secrets = tempfile::tempdir().unwrap();
    let cookie = secrets.path().join("cookie");
    std::fs::write(&cookie, "keel-test-cookie-0123456789abcdef").unwrap();
    std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (mut server, cluster) = Server::start_coordinator(remote.path(), &cookie);
    // The worker works in the same folder, so the survey finds the same files.
    let worker = Reaped::spawn(worker_command(remote.path(), &cluster, "w1", &cookie)).unwrap();
    server
        .process
        .stderr_line_containing("worker joined", JOIN_WAIT)
        .unwrap();

    let client = tempfile::tempdir().unwrap();
    let got = quiet_survey(server.keel(client.path()), remote.path());
    assert_eq!(got, expected);
    // A local `keel run` on the home the coordinator holds goes to its API (`server.json`).
    let got = quiet_survey(keel(remote.path()).unwrap(), remote.path());
    assert_eq!(got, expected);

    // Every specialist ran on the worker: the coordinator node hosts none itself.
    let log = server.process.stderr_so_far();
    let placed = log
        .lines()
        .filter(|l| l.contains("specialist placed on a worker") && l.contains("worker=w1"))
        .count();
    assert!(placed >= 2, "{log}");
    let (status, metrics) = server.request("GET", "/metrics", Some(&server.token()), None);
    assert_eq!(status, 200, "{metrics}");
    let dispatched: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("keel_remote_dispatch_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert_eq!(dispatched, placed as u64, "{metrics}");
    assert!(
        metrics.contains("keel_runs{state=\"completed\"} 2"),
        "{metrics}"
    );

    // Reads through the API print what the same reads of the store print.
    server.assert_reads_match(
        remote.path(),
        client.path(),
        &[vec!["tree"], vec!["--json", "runs"]],
    );
    // The daemon holds its store alone (one fsync a commit): no other process opens the file,
    // which is why the reads above went through its API.
    let held = keel_store::Store::open_read_only(
        remote.path().join(".keel/keel.redb"),
        keel_store::StoreConfig::default(),
    );
    assert!(
        held.is_err(),
        "the store file opened beside a coordinator daemon"
    );
    worker.kill();
    server.process.kill();
}
