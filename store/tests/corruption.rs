//! A store file with damaged pages, and the file's upkeep: every entry point answers a typed error
//! naming the file (never a panic out of redb), and check, compact and backup do what they say.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};

use common::*;
use keel_store::*;

/// redb's page size, the unit the corruption below overwrites.
const PAGE_BYTES: u64 = 4096;

/// A store with three runs of 60 tasks and a session log each: enough B-tree pages that
/// overwriting some of them hits interior and leaf pages of several tables.
fn populated(path: &Path) {
    let store = Store::open(path).unwrap();
    for run in 1..=3u128 {
        create_run(&store, run);
        let mut batch = WriteBatch::new();
        for t in 0..60u128 {
            let id = run * 1000 + t;
            batch.push(
                store
                    .run(RunId(run))
                    .stage_create_task(task(run, id, None))
                    .unwrap(),
            );
            batch.push(
                store
                    .run(RunId(run))
                    .stage_append_log(TaskId(id), log_row(u64::try_from(t).unwrap()))
                    .unwrap(),
            );
        }
        store.commit_group(batch, Durability::Immediate).unwrap();
    }
}

/// Overwrites `pages` pages from page `first` on with a fixed garbage pattern.
fn damage(path: &Path, first: u64, pages: u64) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(first * PAGE_BYTES)).unwrap();
    let garbage: Vec<u8> = (0..pages * PAGE_BYTES)
        .map(|i| u8::try_from((i * 131 + 7) % 251).unwrap())
        .collect();
    file.write_all(&garbage).unwrap();
    file.sync_all().unwrap();
}

/// What one entry point answered on a damaged file.
enum Answer {
    Fine,
    Corrupt(Corruption),
    Other,
}

fn answer<T, E>(r: Result<T, E>, corrupt: impl Fn(&E) -> Option<Corruption>) -> Answer {
    match r {
        Ok(_) => Answer::Fine,
        Err(e) => match corrupt(&e) {
            Some(c) => Answer::Corrupt(c),
            None => Answer::Other,
        },
    }
}

fn read_corrupt(e: &ReadError) -> Option<Corruption> {
    match e {
        ReadError::Corrupt(c) => Some(c.clone()),
        _ => None,
    }
}

/// Every read and write entry point on `store`; a panic out of any of them fails the test.
fn exercise(store: &Store) -> Vec<Answer> {
    let catalog = store.catalog();
    let scope = store.run(RunId(2));
    let mut answers = vec![
        answer(catalog.runs(100), read_corrupt),
        answer(catalog.tasks(None, 500), read_corrupt),
        answer(catalog.tasks(Some(RunId(3)), 500), read_corrupt),
        answer(catalog.tree(RunId(1), 500), read_corrupt),
        answer(catalog.task(TaskId(3059)), read_corrupt),
        answer(catalog.latest_run(), read_corrupt),
        answer(catalog.session_log(TaskId(2030), 10), read_corrupt),
        answer(scope.get(), read_corrupt),
        answer(scope.tasks(None, 100), read_corrupt),
        answer(scope.last_log_rows(TaskId(2001), 10), read_corrupt),
        answer(scope.checkpoint(), read_corrupt),
        answer(scope.idempotency_records(None, 100), read_corrupt),
    ];
    let staged = scope.stage_create_task(task(2, 2999, None)).unwrap();
    answers.push(answer(
        store.commit_one(staged, Durability::Immediate),
        |e| match e {
            CommitError::Corrupt(c) => Some(c.clone()),
            _ => None,
        },
    ));
    answers
}

fn open_corrupt(e: &OpenError) -> Option<Corruption> {
    match e {
        OpenError::Corrupt(c) => Some(c.clone()),
        _ => None,
    }
}

#[test]
fn a_store_with_damaged_pages_answers_typed_errors_naming_the_file_at_every_entry_point() {
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean.redb");
    populated(&clean);
    let pages = std::fs::metadata(&clean).unwrap().len() / PAGE_BYTES;
    assert!(
        pages > 16,
        "the store is too small to damage usefully: {pages} pages"
    );
    let mut corrupt_seen = 0;
    let mut damaged_files = 0;
    // Damage four pages at a time, at every fourth page past the header: a deterministic sweep
    // over the tables' interior and leaf pages.
    for first in (2..pages - 4).step_by(4) {
        let path: PathBuf = dir.path().join(format!("damaged-{first}.redb"));
        std::fs::copy(&clean, &path).unwrap();
        damage(&path, first, 4);
        damaged_files += 1;
        let mut answers = Vec::new();
        for opened in [
            Store::open_read_only(&path, StoreConfig::default()),
            Store::open(&path),
        ] {
            match opened {
                Ok(store) => answers.extend(exercise(&store)),
                Err(e) => answers.push(answer(Err::<(), _>(e), open_corrupt)),
            }
        }
        for a in answers {
            match a {
                Answer::Fine | Answer::Other => {}
                Answer::Corrupt(c) => {
                    corrupt_seen += 1;
                    assert_eq!(c.file.as_deref(), Some(path.as_path()), "{c}");
                    assert!(c.to_string().contains(&*path.to_string_lossy()), "{c}");
                }
            }
        }
    }
    assert!(damaged_files > 3);
    assert!(
        corrupt_seen > 0,
        "no entry point reported the damage as corruption over {damaged_files} damaged files"
    );
}

#[test]
fn the_integrity_check_passes_a_clean_store_and_refuses_a_damaged_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    populated(&path);
    let mut store = Store::open(&path).unwrap();
    assert_eq!(store.check_integrity().unwrap(), Integrity::Intact);
    drop(store);
    // A read-only handle cannot run the check.
    let mut reader = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    assert!(matches!(
        reader.check_integrity(),
        Err(MaintenanceError::ReadOnly)
    ));
    drop(reader);
    let pages = std::fs::metadata(&path).unwrap().len() / PAGE_BYTES;
    damage(&path, pages / 2, 4);
    let checked = Store::open(&path)
        .map_err(|e| e.to_string())
        .and_then(|mut s| s.check_integrity().map_err(|e| e.to_string()));
    assert!(
        !matches!(checked, Ok(Integrity::Intact)),
        "a damaged store passed the check: {checked:?}"
    );
}

#[test]
fn a_backup_is_a_consistent_store_taken_beside_a_running_writer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    populated(&path);
    // The writer (a node) keeps the file open, sharing it with readers.
    let writer = Store::open_with(
        &path,
        StoreConfig {
            sharing: Sharing::WithReaders,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let reader = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    let target = dir.path().join("backup.redb");
    let backup = reader.backup_to(&target).unwrap();
    assert_eq!(backup.file, target);
    // meta 1, runs 3 (all open: 3 in the open-runs index), tasks 180, task_run 180, session logs 180.
    assert_eq!(backup.rows, 1 + 3 + 3 + 180 + 180 + 180, "{backup:?}");
    // The writer goes on; the backup is the store as of the read transaction.
    create_run(&writer, 4);
    let copy = Store::open_read_only(&target, StoreConfig::default()).unwrap();
    assert_eq!(copy.catalog().runs(10).unwrap().items.len(), 3);
    assert_eq!(
        copy.catalog().tasks(Some(RunId(2)), 100).unwrap().items,
        writer.catalog().tasks(Some(RunId(2)), 100).unwrap().items
    );
    // A backup never overwrites a file.
    assert!(matches!(
        reader.backup_to(&target),
        Err(MaintenanceError::BackupExists(p)) if p == target
    ));
}

#[test]
fn compaction_keeps_every_row_and_does_not_grow_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    populated(&path);
    let before = {
        let store = Store::open(&path).unwrap();
        store.catalog().tasks(None, 500).unwrap().items
    };
    let mut store = Store::open(&path).unwrap();
    let compaction = store.compact().unwrap();
    assert!(compaction.passes <= COMPACTION_PASSES_MAX);
    let (Some(b), Some(a)) = (compaction.bytes_before, compaction.bytes_after) else {
        panic!("a file store reports its sizes: {compaction:?}");
    };
    assert!(a <= b, "{compaction:?}");
    assert_eq!(store.catalog().tasks(None, 500).unwrap().items, before);
}
