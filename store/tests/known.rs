//! What the writer remembers from one commit for the next (which tasks exist, where their logs
//! end, where a run's manifest ends): numbering continues across commits and reopens exactly as a
//! fresh read of the tables would number it, and nothing a commit that failed taught is kept.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use keel_store::*;

fn seqs(applied: &[Applied]) -> Vec<u64> {
    applied
        .iter()
        .filter_map(|a| match a {
            Applied::LogAppended { seq } | Applied::ManifestAppended { seq } => Some(*seq),
            _ => None,
        })
        .collect()
}

fn log_seqs(store: &Store, run: u128, task: u128) -> Vec<(u64, u64)> {
    store
        .run(RunId(run))
        .last_log_rows(TaskId(task), 100)
        .unwrap()
        .iter()
        .map(|r| (r.seq, r.value.ts_ms))
        .collect()
}

/// Run 1 with task 10 holding one log row (seq 1), each in its own commit.
fn logged_task(store: &Store) -> RunScope<'_> {
    create_run(store, 1);
    create_task(store, 1, 10, None);
    let scope = store.run(RunId(1));
    store
        .commit_one(
            scope.stage_append_log(TaskId(10), log_row(1)).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    scope
}

/// A task created in the commit that writes its first rows (as a dispatch stages an admission
/// with its rows), then more rows in later commits, then after a reopen: one gapless sequence.
#[test]
fn log_and_manifest_numbers_continue_across_commits_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    {
        let store = Store::open(&path).unwrap();
        let scope = store.run(RunId(1));
        let mut batch = WriteBatch::new();
        batch.push(scope.stage_create_run(run(1)).unwrap());
        batch.push(scope.stage_create_task(task(1, 10, None)).unwrap());
        batch.push(scope.stage_append_log(TaskId(10), log_row(1)).unwrap());
        batch.push(scope.stage_append_manifest(manifest("a")).unwrap());
        batch.push(scope.stage_append_log(TaskId(10), log_row(2)).unwrap());
        let applied = store.commit_group(batch, Durability::Immediate).unwrap();
        assert_eq!(seqs(&applied), vec![1, 1, 2]);

        for round in 0..3u64 {
            let mut batch = WriteBatch::new();
            batch.push(
                scope
                    .stage_append_log(TaskId(10), log_row(3 + round))
                    .unwrap(),
            );
            batch.push(scope.stage_append_manifest(manifest("b")).unwrap());
            let applied = store.commit_group(batch, Durability::Immediate).unwrap();
            assert_eq!(seqs(&applied), vec![3 + round, 2 + round]);
        }
    }
    let store = Store::open(&path).unwrap();
    let scope = store.run(RunId(1));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_log(TaskId(10), log_row(6)).unwrap());
    batch.push(scope.stage_append_manifest(manifest("c")).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(seqs(&applied), vec![6, 5]);
    assert_eq!(
        log_seqs(&store, 1, 10),
        (1..=6).map(|n| (n, 10_000 + n)).collect::<Vec<_>>()
    );
    assert_eq!(scope.manifest(0, 10).unwrap().items.len(), 5);
}

/// A task created in a batch that fails does not exist afterwards: a later row for it is refused
/// (it is not remembered from the failed commit), and a stored task's numbering goes on from what
/// was committed, not from what the failed batch counted.
#[test]
fn a_failed_commit_teaches_the_next_nothing() {
    let (_dir, store) = open_temp();
    let scope = logged_task(&store);

    let mut failing = WriteBatch::new();
    failing.push(scope.stage_create_task(task(1, 30, Some(10))).unwrap());
    failing.push(scope.stage_append_log(TaskId(30), log_row(2)).unwrap());
    failing.push(scope.stage_append_log(TaskId(10), log_row(3)).unwrap());
    failing.push(scope.stage_append_manifest(manifest("lost")).unwrap());
    failing.push(scope.stage_append_log(TaskId(99), log_row(4)).unwrap()); // no such task
    assert!(matches!(
        store.commit_group(failing, Durability::Immediate),
        Err(CommitError::Item { index: 4, .. })
    ));

    let err = store
        .commit_one(
            scope.stage_append_log(TaskId(30), log_row(5)).unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        CommitError::Item {
            index: 0,
            error: ItemError::TaskNotFound { .. }
        }
    ));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_log(TaskId(10), log_row(6)).unwrap());
    batch.push(scope.stage_append_manifest(manifest("kept")).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(seqs(&applied), vec![2, 1]);
    assert_eq!(log_seqs(&store, 1, 10), vec![(1, 10_001), (2, 10_006)]);
    assert!(scope.task(TaskId(30)).is_err());
}

/// A commit that fails at the disk (its sync) leaves no trace in the numbering either: redb refuses
/// the handle from then on (so the cache of that handle is never consulted again), and the store
/// reopened on what the disk kept numbers on from the last durable row. The cache's own clearing on
/// a failed `commit()` is not what this shows (a reopen starts empty either way).
#[test]
fn a_commit_lost_at_the_disk_is_not_remembered() {
    let disk = SimDisk::new();
    let store = Store::open_backend(disk.clone(), StoreConfig::default()).unwrap();
    let scope = logged_task(&store);
    disk.fail_next_syncs(1);
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_create_task(task(1, 30, Some(10))).unwrap());
    batch.push(scope.stage_append_log(TaskId(10), log_row(2)).unwrap());
    assert!(store.commit_group(batch, Durability::Immediate).is_err());
    assert!(matches!(
        store.commit_one(
            scope.stage_append_log(TaskId(10), log_row(5)).unwrap(),
            Durability::Immediate,
        ),
        Err(CommitError::NeedsReopen)
    ));
    drop(store);

    let store = Store::open_backend(disk.crash(), StoreConfig::default()).unwrap();
    let scope = store.run(RunId(1));
    assert_eq!(
        store
            .commit_one(
                scope.stage_append_log(TaskId(10), log_row(3)).unwrap(),
                Durability::Immediate,
            )
            .unwrap(),
        Applied::LogAppended { seq: 2 }
    );
    assert!(matches!(
        store.commit_one(
            scope.stage_append_log(TaskId(30), log_row(4)).unwrap(),
            Durability::Immediate,
        ),
        Err(CommitError::Item {
            error: ItemError::TaskNotFound { .. },
            ..
        })
    ));
}

/// Rows written to a run after it was written terminal (a follow-up) are numbered on from where it
/// ended. (The cache forgets the run at that commit; that it does is the unit test
/// `forgetting_a_run_keeps_the_others` in `known.rs`: numbering alone would be right either way.)
#[test]
fn a_finished_run_numbers_on_from_its_rows() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    let scope = store.run(RunId(1));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_log(TaskId(10), log_row(1)).unwrap());
    batch.push(scope.stage_append_manifest(manifest("a")).unwrap());
    batch.push(
        scope
            .stage_update_run(Run {
                status: RunStatus::Completed,
                ..run(1)
            })
            .unwrap(),
    );
    batch.push(scope.stage_append_log(TaskId(10), log_row(2)).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(seqs(&applied), vec![1, 1, 2]);

    let mut batch = WriteBatch::new();
    batch.push(
        scope
            .stage_update_run(Run {
                status: RunStatus::Running,
                ..run(1)
            })
            .unwrap(),
    );
    batch.push(scope.stage_append_log(TaskId(10), log_row(3)).unwrap());
    batch.push(scope.stage_append_manifest(manifest("b")).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(seqs(&applied), vec![3, 2]);
    assert_eq!(
        log_seqs(&store, 1, 10),
        vec![(1, 10_001), (2, 10_002), (3, 10_003)]
    );
}

/// A task id taken by another run is refused when the index row is written (not read first), and
/// the refusal aborts the commit: the index still names the owner, and the store goes on.
#[test]
fn a_taken_task_id_leaves_its_owner_indexed() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_run(&store, 2);
    create_task(&store, 1, 10, None);
    let mut batch = WriteBatch::new();
    batch.push(
        store
            .run(RunId(2))
            .stage_create_task(task(2, 11, None))
            .unwrap(),
    );
    batch.push(
        store
            .run(RunId(2))
            .stage_create_task(task(2, 10, None))
            .unwrap(),
    );
    assert!(matches!(
        store.commit_group(batch, Durability::Immediate),
        Err(CommitError::Item {
            index: 1,
            error: ItemError::TaskIdTaken(TaskId(10))
        })
    ));
    assert_eq!(store.catalog().locate_task(TaskId(10)).unwrap(), RunId(1));
    assert!(store.catalog().locate_task(TaskId(11)).is_err());
    assert_eq!(store.catalog().task(TaskId(10)).unwrap().run_id, RunId(1));
    create_task(&store, 2, 11, None);
    assert_eq!(store.catalog().locate_task(TaskId(11)).unwrap(), RunId(2));
}

/// Rows stored as segments of different lengths (store format 4: a task's rows of one commit under
/// one key) read back through every reader exactly as rows: every `after` and every `limit` of
/// `log_rows_after`, every `n` of the last rows, the catalog's log.
#[test]
fn segments_read_back_as_rows_from_every_position() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    let scope = store.run(RunId(1));
    let mut n = 0u64;
    for len in [1u64, 4, 2, 1, 3, 70, 1] {
        let mut batch = WriteBatch::new();
        for _ in 0..len {
            n += 1;
            batch.push(scope.stage_append_log(TaskId(10), log_row(n)).unwrap());
        }
        store.commit_group(batch, Durability::Immediate).unwrap();
    }
    let want: Vec<(u64, u64)> = (1..=n).map(|s| (s, 10_000 + s)).collect();
    let pairs = |rows: &[Sequenced<SessionLogRow>]| {
        rows.iter()
            .map(|r| (r.seq, r.value.ts_ms))
            .collect::<Vec<_>>()
    };
    for after in 0..=n + 1 {
        for limit in [0u64, 1, 2, 3, 5, 64, 200] {
            let got = scope
                .log_rows_after(TaskId(10), after, u32::try_from(limit).unwrap())
                .unwrap();
            let rest: Vec<_> = want.iter().copied().filter(|(s, _)| *s > after).collect();
            let cut = usize::try_from(limit).unwrap().min(rest.len());
            assert_eq!(
                pairs(&got.items),
                rest[..cut],
                "after {after} limit {limit}"
            );
            assert_eq!(got.more, rest.len() > cut, "after {after} limit {limit}");
        }
    }
    for last in 0..=n + 1 {
        let got = scope
            .last_log_rows(TaskId(10), u32::try_from(last).unwrap())
            .unwrap();
        let from = want.len().saturating_sub(usize::try_from(last).unwrap());
        assert_eq!(pairs(&got), want[from..], "last {last}");
    }
    assert_eq!(
        pairs(&store.catalog().session_log(TaskId(10), 5).unwrap()),
        want[want.len() - 5..]
    );
}

/// After a reopen (an empty cache) the end of a task's log is read from the table, where its last
/// entry is a segment of several rows, interleaved in its commit with another task's rows: the
/// next row of each takes the number after its segment's last, and the log reads back gapless.
#[test]
fn a_cold_writer_numbers_on_after_a_segment_of_several_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    {
        let store = Store::open(&path).unwrap();
        create_run(&store, 1);
        create_task(&store, 1, 10, None);
        create_task(&store, 1, 20, None);
        let scope = store.run(RunId(1));
        let mut batch = WriteBatch::new();
        for n in 1..=3 {
            batch.push(scope.stage_append_log(TaskId(10), log_row(n)).unwrap());
            batch.push(scope.stage_append_log(TaskId(20), log_row(10 + n)).unwrap());
        }
        let applied = store.commit_group(batch, Durability::Immediate).unwrap();
        assert_eq!(seqs(&applied), vec![1, 1, 2, 2, 3, 3]);
    }
    let store = Store::open(&path).unwrap();
    let scope = store.run(RunId(1));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_log(TaskId(20), log_row(14)).unwrap());
    batch.push(scope.stage_append_log(TaskId(10), log_row(4)).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(seqs(&applied), vec![4, 4]);
    assert_eq!(
        log_seqs(&store, 1, 10),
        vec![(1, 10_001), (2, 10_002), (3, 10_003), (4, 10_004)]
    );
    assert_eq!(
        log_seqs(&store, 1, 20),
        vec![(1, 10_011), (2, 10_012), (3, 10_013), (4, 10_014)]
    );
}
