//! The store file as the `keel` binary handles it, run as a real process: a damaged store is a
//! clear error naming the file at every command (never a panic, never "another keel process"), and
//! `keel store check | backup PATH | compact` work, backup beside a process that holds the store.

// Test helpers panic on purpose: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use keel_store::{
    Budget, Durability, LogKind, Run, RunId, RunStatus, SessionLogRow, Sharing, Store, StoreConfig,
    Task, TaskId, TaskKind, TaskStatus, WriteBatch,
};

/// redb's page size, the unit the damage below overwrites.
const PAGE_BYTES: u64 = 4096;

fn keel(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("KEEL_HOME")
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("keel runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A home whose store holds three runs of 60 tasks with a log row each.
fn home_with_runs(dir: &Path) -> std::path::PathBuf {
    let home = dir.join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    let store = Store::open(home.join("keel.redb")).unwrap();
    for r in 1..=3u128 {
        let run = RunId(r);
        let scope = store.run(run);
        let mut batch = WriteBatch::new();
        batch.push(
            scope
                .stage_create_run(Run {
                    id: run,
                    brief: format!("run {r}"),
                    plan: None,
                    status: RunStatus::Completed,
                    budget: Budget::default(),
                    created_ms: 1,
                    updated_ms: 1,
                    config_snapshot: String::new(),
                    outcome: None,
                })
                .unwrap(),
        );
        for t in 0..60u128 {
            let id = TaskId(r * 1000 + t);
            batch.push(
                scope
                    .stage_create_task(Task {
                        id,
                        run_id: run,
                        parent: None,
                        depth: 0,
                        kind: TaskKind::Root,
                        brief: format!("task {t} of run {r}"),
                        goal: String::new(),
                        quality_criteria: vec![],
                        output_schema: None,
                        assignee: None,
                        model: None,
                        observed: None,
                        status: TaskStatus::Complete,
                        attempt: 1,
                        idempotency_key: None,
                        outcome: Some("done".into()),
                        attachments: vec![],
                        progress_notes: vec![],
                        created_ms: 1,
                        updated_ms: 1,
                    })
                    .unwrap(),
            );
            batch.push(
                scope
                    .stage_append_log(
                        id,
                        SessionLogRow {
                            ts_ms: 1,
                            kind: LogKind::Text,
                            summary: "a line".into(),
                            detail: String::new(),
                            redactions: Vec::new(),
                        },
                    )
                    .unwrap(),
            );
        }
        store.commit_group(batch, Durability::Immediate).unwrap();
    }
    home
}

/// Overwrites four pages from page `first` on with a fixed garbage pattern.
fn damage(path: &Path, first: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(first * PAGE_BYTES)).unwrap();
    let garbage: Vec<u8> = (0..4 * PAGE_BYTES)
        .map(|i| u8::try_from((i * 131 + 7) % 251).unwrap())
        .collect();
    file.write_all(&garbage).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn a_damaged_store_is_an_error_naming_the_file_at_every_command_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let clean = home_with_runs(dir.path());
    let pages = std::fs::metadata(clean.join("keel.redb")).unwrap().len() / PAGE_BYTES;
    let mut corrupt_reported = 0;
    let mut run_checked = false;
    for first in (2..pages - 4).step_by(4) {
        let home = dir.path().join(format!("damaged-{first}"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::copy(clean.join("keel.toml"), home.join("keel.toml")).unwrap();
        std::fs::copy(clean.join("keel.redb"), home.join("keel.redb")).unwrap();
        damage(&home.join("keel.redb"), first);
        let file = home.join("keel.redb").display().to_string();
        for args in [
            vec!["tasks"],
            vec!["runs"],
            vec!["status"],
            vec!["tree", "--json"],
            vec!["show", "00000000000000000000000Z8G"],
        ] {
            let out = keel(&home, &args);
            let err = text(&out.stderr);
            assert!(
                !err.contains("panicked at") && out.status.code() != Some(101),
                "keel {args:?} on pages {first}..: {err}"
            );
            if err.contains("corrupt") {
                corrupt_reported += 1;
                assert_eq!(out.status.code(), Some(1), "keel {args:?}: {err}");
                assert!(err.contains(&file), "keel {args:?} names the file: {err}");
                // The cause is said once, whatever the path to it wrapped it in.
                assert_eq!(
                    err.matches("is corrupt").count(),
                    1,
                    "keel {args:?} says the cause once: {err}"
                );
            }
        }
        // `keel run` on the first store the read commands found damaged: a typed error, not
        // "another keel process".
        if corrupt_reported > 0 && !run_checked {
            run_checked = true;
            let out = keel(&home, &["run", "--quiet", "count the files"]);
            let err = text(&out.stderr);
            assert!(!err.contains("another keel process"), "{err}");
            assert!(!err.contains("panicked at"), "{err}");
            if out.status.code() != Some(0) {
                assert!(err.contains("corrupt"), "{err}");
            }
        }
    }
    assert!(
        corrupt_reported > 0,
        "no command reported damage over {pages} pages"
    );
}

#[test]
fn store_check_passes_a_clean_store_and_refuses_while_another_process_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_runs(dir.path());
    let out = keel(&home, &["store", "check", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["integrity"], "intact");

    let writer = Store::open_with(
        home.join("keel.redb"),
        StoreConfig {
            sharing: Sharing::WithReaders,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    for action in ["check", "compact"] {
        let held = keel(&home, &["store", action]);
        assert_eq!(held.status.code(), Some(1), "keel store {action}");
        let err = text(&held.stderr);
        assert!(err.contains("another keel process"), "{err}");
    }
    drop(writer);

    damage(&home.join("keel.redb"), 8);
    let damaged = keel(&home, &["store", "check"]);
    let out = text(&damaged.stdout);
    assert!(
        !out.contains("intact"),
        "a damaged store checked intact: {out}"
    );
}

#[test]
fn store_backup_copies_a_consistent_store_while_another_process_holds_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_runs(dir.path());
    let writer = Store::open_with(
        home.join("keel.redb"),
        StoreConfig {
            sharing: Sharing::WithReaders,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let target = dir.path().join("backup.redb");
    let out = keel(
        &home,
        &["store", "backup", target.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // meta 1, runs 3, tasks 180, task_run 180, session logs 180.
    assert_eq!(v["rows"], 1 + 3 + 180 + 180 + 180, "{v}");
    let copy = Store::open_read_only(&target, StoreConfig::default()).unwrap();
    assert_eq!(
        copy.catalog().tasks(None, 500).unwrap().items,
        writer.catalog().tasks(None, 500).unwrap().items
    );
    // An existing file is never overwritten.
    let again = keel(&home, &["store", "backup", target.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    assert!(text(&again.stderr).contains("exists already"));
}

#[test]
fn store_compact_keeps_every_row() {
    let dir = tempfile::tempdir().unwrap();
    let home = home_with_runs(dir.path());
    let before = keel(&home, &["tasks", "--json", "--limit", "500"]).stdout;
    let out = keel(&home, &["store", "compact", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["bytes_after"].as_u64().unwrap() <= v["bytes_before"].as_u64().unwrap(),
        "{v}"
    );
    assert_eq!(
        keel(&home, &["tasks", "--json", "--limit", "500"]).stdout,
        before
    );
}
