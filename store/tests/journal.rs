//! The store's journal (store opened with `journal`): a commit is durable once its record is
//! synced, whatever redb's file holds; a crash loses nothing acknowledged and replays nothing
//! twice; a read-only open refuses a store whose journal holds commits the file does not.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use keel_store::*;

const RUN: u128 = 1 << 90;
const ROOT: u128 = RUN + 1;

fn journaled() -> StoreConfig {
    StoreConfig {
        journal: true,
        ..StoreConfig::default()
    }
}

/// The store as `keel serve` opens one, on `disk` and `journal` as they are.
fn open(disk: &SimDisk, journal: &SimDisk) -> Store {
    Store::open_backend_journaled(disk.clone(), journal.clone(), journaled()).unwrap()
}

/// A store on two fresh simulated disks: its file's and its journal's.
fn fresh() -> (SimDisk, SimDisk, Store) {
    let (disk, journal) = (SimDisk::new(), SimDisk::new());
    let store = open(&disk, &journal);
    (disk, journal, store)
}

/// The power goes: the store opened again on what both disks had synced.
fn crash(disk: &SimDisk, journal: &SimDisk) -> (SimDisk, SimDisk, Store) {
    let (disk, journal) = (disk.crash(), journal.crash());
    let store = open(&disk, &journal);
    (disk, journal, store)
}

/// Commits log row `n` of the root task alone, durably, and answers what the commit did.
fn try_log(store: &Store, n: u64) -> Result<Applied, CommitError> {
    let scope = store.run(RunId(RUN));
    store.commit_one(
        scope.stage_append_log(TaskId(ROOT), log_row(n)).unwrap(),
        Durability::Immediate,
    )
}

/// Creates the run and its root task, durably.
fn create(store: &Store) {
    let scope = store.run(RunId(RUN));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_create_run(run(RUN)).unwrap());
    batch.push(scope.stage_create_task(task(RUN, ROOT, None)).unwrap());
    store.commit_group(batch, Durability::Immediate).unwrap();
}

/// A group that fails partway: log row `n` applies, then creating the root task again fails its
/// checks (the task exists), so the group fails whole with its first write already applied.
fn fail_partway(store: &Store, n: u64) -> Result<Vec<Applied>, CommitError> {
    let scope = store.run(RunId(RUN));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_log(TaskId(ROOT), log_row(n)).unwrap());
    batch.push(scope.stage_create_task(task(RUN, ROOT, None)).unwrap());
    store.commit_group(batch, Durability::Immediate)
}

/// Commits log row `n` of the root task alone, durably (as a group commit of one).
fn log(store: &Store, n: u64) -> Applied {
    try_log(store, n).unwrap()
}

/// The root task's log as sequence numbers and the row numbers they hold.
fn logged(store: &Store) -> Vec<(u64, String)> {
    store
        .run(RunId(RUN))
        .log_rows_after(TaskId(ROOT), 0, 10_000)
        .unwrap()
        .items
        .into_iter()
        .map(|r| (r.seq, r.value.summary))
        .collect()
}

fn expected(rows: u64) -> Vec<(u64, String)> {
    (1..=rows).map(|n| (n, log_row(n).summary)).collect()
}

#[test]
fn acknowledged_commits_survive_a_crash_the_store_file_never_saw() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=10 {
        log(&store, n);
    }
    assert!(journal.syncs() >= 11, "each commit synced its record");
    // The power goes while the store is open (a close would make its commits durable in the
    // file): only what was synced is there. The store file alone does not hold the ten rows (their
    // pages never reached it durably)...
    let (crashed, crashed_journal) = (disk.crash(), journal.crash());
    let alone = Store::open_backend_journaled(disk.crash(), SimDisk::new(), journaled()).unwrap();
    let rows_alone = alone
        .run(RunId(RUN))
        .log_rows_after(TaskId(ROOT), 0, 100)
        .map_or(0, |rows| rows.items.len());
    assert!(rows_alone < 10, "the file alone holds {rows_alone} rows");
    drop(store);
    // ...the file with its journal does.
    let (disk, journal) = (crashed, crashed_journal);
    let store = open(&disk, &journal);
    assert_eq!(logged(&store), expected(10));
    // And the sequence goes on where it ended.
    assert_eq!(log(&store, 11), Applied::LogAppended { seq: 11 });
}

#[test]
fn a_crash_after_the_durable_commit_replays_only_the_records_after_it() {
    let (disk, journal, store) = fresh();
    create(&store);
    let file_syncs = disk.syncs();
    // Past the count that makes one commit a durable commit of the store file, and then some.
    for n in 1..=150 {
        log(&store, n);
    }
    assert!(
        disk.syncs() > file_syncs,
        "the store file got its durable commits"
    );
    let (disk, journal, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(150));
    // Crash again at once: the replay was made durable; nothing is applied twice.
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(150));
}

#[test]
fn a_closed_store_reopens_without_replaying_what_its_close_made_durable() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=5 {
        log(&store, n);
    }
    // A clean close: redb makes the pending commits durable in the file; the journal still holds
    // their records, which the file now says it holds.
    drop(store);
    let store = open(&disk, &journal);
    assert_eq!(logged(&store), expected(5));
    drop(store);
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(5));
}

#[test]
fn a_commit_whose_record_never_synced_fails_and_is_not_there_after_a_crash() {
    let (disk, journal, store) = fresh();
    create(&store);
    log(&store, 1);
    journal.fail_next_syncs(1);
    let failed = try_log(&store, 2);
    assert!(failed.is_err(), "{failed:?}");
    // Nothing of it is visible.
    assert_eq!(logged(&store), expected(1));
    // The node opens a store again after a failed commit (without a crash): the failed commit's
    // record, perhaps on the disk after all, is not replayed...
    drop(store);
    let store = open(&disk, &journal);
    assert_eq!(logged(&store), expected(1));
    // ...so its retry is applied once.
    assert_eq!(log(&store, 2), Applied::LogAppended { seq: 2 });
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(2));
}

#[test]
fn a_power_loss_during_a_record_keeps_every_commit_before_it() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=3 {
        log(&store, n);
    }
    // The power goes during the next record's write: its sync returns, nothing more is durable.
    journal.schedule_power_loss(Some(0));
    log(&store, 4);
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(3));
}

#[test]
fn a_read_only_open_refuses_a_store_whose_journal_holds_commits_and_a_writer_replays_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let store = Store::open_with(&path, journaled()).unwrap();
    create(&store);
    for n in 1..=7 {
        log(&store, n);
    }
    // The files as a crash would leave them: the store file without the seven commits (they are
    // in redb's memory), the journal with them.
    let copy = dir.path().join("copy.redb");
    std::fs::copy(&path, &copy).unwrap();
    std::fs::copy(
        dir.path().join("keel.redb.journal"),
        dir.path().join("copy.redb.journal"),
    )
    .unwrap();
    drop(store);
    let refused = Store::open_read_only(&copy, StoreConfig::default());
    assert!(
        matches!(refused, Err(OpenError::NeedsRecovery)),
        "{refused:?}"
    );
    // A writable open, even one without a journal of its own, replays it.
    let store = Store::open_with(&copy, StoreConfig::default()).unwrap();
    assert_eq!(logged(&store), expected(7));
    drop(store);
    let reader = Store::open_read_only(&copy, StoreConfig::default()).unwrap();
    assert_eq!(logged(&reader), expected(7));
}

#[test]
fn maintenance_works_on_a_file_that_holds_every_commit_the_journal_held() {
    let (disk, _journal, mut store) = fresh();
    create(&store);
    for n in 1..=5 {
        log(&store, n);
    }
    store.check_integrity().unwrap();
    // The store file alone (an empty journal beside it) holds all five.
    let store = Store::open_backend_journaled(disk.crash(), SimDisk::new(), journaled()).unwrap();
    assert_eq!(logged(&store), expected(5));
}

#[test]
fn the_due_durable_commit_is_durable_even_when_it_asked_for_none() {
    let (disk, journal, store) = fresh();
    create(&store);
    let scope = store.run(RunId(RUN));
    // Past the count that makes a commit the durable one, every commit asking for `None`.
    for n in 1..=70 {
        store
            .commit_one(
                scope.stage_append_log(TaskId(ROOT), log_row(n)).unwrap(),
                Durability::None,
            )
            .unwrap();
    }
    log(&store, 71);
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(71));
}

/// A group whose first write applies and whose second fails its checks, after journaled commits
/// the open transaction holds: the group fails whole, and neither its first write nor any earlier
/// commit is lost (the transaction they shared is rebuilt from the journal).
#[test]
fn a_group_that_fails_partway_loses_only_itself_in_the_open_transaction() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=5 {
        log(&store, n);
    }
    let failed = fail_partway(&store, 6);
    assert!(
        matches!(failed, Err(CommitError::Item { index: 1, .. })),
        "{failed:?}"
    );
    // Commits after the failure go on from the last acknowledged one, with every earlier one.
    assert_eq!(log(&store, 6), Applied::LogAppended { seq: 6 });
    log(&store, 7);
    assert_eq!(logged(&store), expected(7));
    // And so does a crash: the journal replays exactly the acknowledged commits.
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(7));
}

/// A failed record sync after journaled commits: the failed commit is reported and never
/// visible, the commits before it are (in this process, and after a crash), and the store takes
/// commits again.
#[test]
fn a_failed_append_loses_only_its_own_commit_in_the_open_transaction() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=3 {
        log(&store, n);
    }
    journal.fail_next_syncs(1);
    let failed = try_log(&store, 4);
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(logged(&store), expected(3));
    assert_eq!(log(&store, 4), Applied::LogAppended { seq: 4 });
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(4));
}

/// A read in between journaled commits sees every acknowledged commit (it reads the open
/// transaction), and commits after the read go on in the same one.
#[test]
fn reads_between_journaled_commits_see_every_acknowledged_commit() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=40 {
        log(&store, n);
        if n % 7 == 0 {
            assert_eq!(logged(&store), expected(n));
        }
    }
    assert_eq!(logged(&store), expected(40));
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(40));
}

/// A read right after a group that failed partway (which dropped the open transaction) rebuilds
/// the transaction from the journal to read it: it sees every acknowledged commit and not the
/// failed group's first write, and later commits and a crash keep exactly the acknowledged ones.
#[test]
fn a_read_after_a_failed_group_rebuilds_the_open_transaction_without_it() {
    let (disk, journal, store) = fresh();
    create(&store);
    for n in 1..=5 {
        log(&store, n);
    }
    assert!(fail_partway(&store, 6).is_err());
    for _ in 0..2 {
        assert_eq!(logged(&store), expected(5));
    }
    log(&store, 6);
    assert_eq!(logged(&store), expected(6));
    let (_, _, store) = crash(&disk, &journal);
    assert_eq!(logged(&store), expected(6));
}

/// What a store's reads show of run `RUN` and its tasks: the rows a crash must not change.
fn snapshot(store: &Store) -> String {
    let scope = store.run(RunId(RUN));
    let catalog = store.catalog();
    format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?}",
        scope.get(),
        catalog.open_runs(10),
        scope.tasks(None, 10),
        scope.children(TaskId(ROOT), 10),
        scope.children(TaskId(ROOT + 1), 10),
        scope.manifest(0, 10),
        scope.log_rows_after(TaskId(ROOT + 1), 0, 10),
        catalog.locate_task(TaskId(ROOT + 2)),
    )
}

/// Every kind of row a commit writes, removals included, comes back from the journal's records of
/// rows after a crash the store file never saw: a task's state row written and then removed by an
/// update of its once-written fields, the open-runs index row removed when the run ends, the
/// children index of a deeper task, a manifest segment and a log segment.
#[test]
fn every_kind_of_row_a_commit_writes_replays_from_the_journal() {
    let (disk, journal, store) = fresh();
    create(&store);
    let scope = store.run(RunId(RUN));
    let child = task(RUN, ROOT + 1, Some(ROOT));
    let mut grandchild = task(RUN, ROOT + 2, Some(ROOT + 1));
    grandchild.depth = 2;
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_create_task(child.clone()).unwrap());
    batch.push(scope.stage_create_task(grandchild).unwrap());
    batch.push(
        scope
            .stage_append_log(TaskId(ROOT + 1), log_row(1))
            .unwrap(),
    );
    batch.push(
        scope
            .stage_append_log(TaskId(ROOT + 1), log_row(2))
            .unwrap(),
    );
    batch.push(scope.stage_append_manifest(manifest("a")).unwrap());
    batch.push(scope.stage_append_manifest(manifest("b")).unwrap());
    store.commit_group(batch, Durability::Immediate).unwrap();
    // A state row, then the whole row again (a changed brief), which removes the state row.
    let mut done = child.clone();
    done.status = TaskStatus::Complete;
    done.outcome = Some("found".into());
    store
        .commit_one(
            scope.stage_update_task(done.clone()).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    done.brief.push_str(", revised");
    store
        .commit_one(
            scope.stage_update_task(done).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    // The run ends: its open-runs row goes.
    let mut ended = run(RUN);
    ended.status = RunStatus::Completed;
    store
        .commit_one(
            scope.stage_update_run(ended).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    let before = snapshot(&store);
    assert!(
        before.contains(", revised") && before.contains("found"),
        "{before}"
    );
    assert!(store.catalog().open_runs(10).unwrap().items.is_empty());
    let (disk, journal) = (disk.crash(), journal.crash());
    drop(store);
    // The store file alone does not hold these commits: the journal's records bring them back.
    let alone = Store::open_backend_journaled(disk.crash(), SimDisk::new(), journaled()).unwrap();
    assert_ne!(snapshot(&alone), before);
    drop(alone);
    let store = open(&disk, &journal);
    assert_eq!(snapshot(&store), before);
    // And the sequences go on where they ended.
    let scope = store.run(RunId(RUN));
    assert_eq!(
        store
            .commit_one(
                scope.stage_append_manifest(manifest("c")).unwrap(),
                Durability::Immediate
            )
            .unwrap(),
        Applied::ManifestAppended { seq: 3 }
    );
}
