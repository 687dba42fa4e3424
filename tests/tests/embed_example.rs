//! `examples/embed.rs` runs as a host program would: it embeds the runtime, submits two briefs, reads
//! typed events, and both runs complete on its store.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_store::{RunStatus, Store, StoreConfig};
use keel_tests::{Reaped, example_binary};
use std::process::Command;
use std::time::Duration;

#[test]
fn the_embedding_example_runs_two_briefs_to_completion() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(example_binary("embed").unwrap());
    cmd.arg(dir.path());
    let (status, out, err) = Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert_eq!(out.matches("task started:").count(), 7, "{out}");
    assert_eq!(out.matches("report:").count(), 7, "{out}");
    assert!(
        out.contains("report: step part-001: view 1: 1 lines"),
        "{out}"
    );
    assert_eq!(out.matches("Completed").count(), 2, "{out}");
    assert!(out.contains("both runs completed"), "{out}");
    // The runs are in the host's store, durably.
    let store =
        Store::open_read_only(dir.path().join("embed.redb"), StoreConfig::default()).unwrap();
    let runs = store.catalog().runs(10).unwrap().items;
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r.status == RunStatus::Completed));
}
