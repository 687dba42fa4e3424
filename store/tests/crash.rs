//! Crash consistency on the simulated disk: what was committed `Immediate` survives a power loss, what
//! was not leaves no trace, and the store reopens without error. Faults (full disk, failed sync) fail
//! the commit with a typed error and lose nothing committed before.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use keel_store::*;
use proptest::prelude::*;

fn open(disk: &SimDisk) -> Store {
    Store::open_backend(disk.clone(), StoreConfig::default()).unwrap()
}

fn manifest_items(store: &Store, run: u128) -> Vec<String> {
    store
        .run(RunId(run))
        .manifest(0, 10_000)
        .unwrap()
        .items
        .into_iter()
        .map(|e| e.value.item)
        .collect()
}

fn append(store: &Store, run: u128, item: &str, durability: Durability) {
    store
        .commit_one(
            store
                .run(RunId(run))
                .stage_append_manifest(manifest(item))
                .unwrap(),
            durability,
        )
        .unwrap();
}

#[test]
fn an_immediate_commit_survives_a_crash() {
    let disk = SimDisk::new();
    let store = open(&disk);
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    append(&store, 1, "a", Durability::Immediate);
    // Power is lost while the store is still open.
    let crashed = disk.crash();
    drop(store);
    let store = open(&crashed);
    assert_eq!(store.run(RunId(1)).get().unwrap(), run(1));
    assert_eq!(
        store.run(RunId(1)).task(TaskId(10)).unwrap(),
        task(1, 10, None)
    );
    assert_eq!(manifest_items(&store, 1), vec!["a"]);
}

#[test]
fn a_none_commit_without_a_later_immediate_leaves_no_trace() {
    let disk = SimDisk::new();
    let store = open(&disk);
    create_run(&store, 1);
    append(&store, 1, "durable", Durability::Immediate);
    append(&store, 1, "volatile", Durability::None);
    create_task(&store, 1, 10, None); // Immediate: makes "volatile" durable too
    append(&store, 1, "lost-1", Durability::None);
    append(&store, 1, "lost-2", Durability::None);
    // Visible before the crash.
    assert_eq!(
        manifest_items(&store, 1),
        vec!["durable", "volatile", "lost-1", "lost-2"]
    );
    let crashed = disk.crash();
    drop(store);
    let store = open(&crashed);
    assert_eq!(manifest_items(&store, 1), vec!["durable", "volatile"]);
    // The store keeps working after recovery, with sequence numbers continuing from what survived.
    let applied = store
        .commit_one(
            store
                .run(RunId(1))
                .stage_append_manifest(manifest("after"))
                .unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(applied, Applied::ManifestAppended { seq: 3 });
}

#[test]
fn an_aborted_group_leaves_no_trace_after_a_crash() {
    let disk = SimDisk::new();
    let store = open(&disk);
    create_run(&store, 1);
    let scope = store.run(RunId(1));
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_manifest(manifest("never")).unwrap());
    batch.push(scope.stage_append_log(TaskId(404), log_row(1)).unwrap());
    assert!(store.commit_group(batch, Durability::Immediate).is_err());
    let crashed = disk.crash();
    drop(store);
    let store = open(&crashed);
    assert!(manifest_items(&store, 1).is_empty());
    assert_eq!(store.run(RunId(1)).get().unwrap(), run(1));
}

#[test]
fn a_failed_sync_fails_the_commit_and_the_crash_image_holds_only_earlier_commits() {
    let disk = SimDisk::new();
    let store = open(&disk);
    create_run(&store, 1);
    append(&store, 1, "kept", Durability::Immediate);
    disk.fail_next_syncs(1);
    let err = store
        .commit_one(
            store
                .run(RunId(1))
                .stage_append_manifest(manifest("unsynced"))
                .unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(
        matches!(err, CommitError::Storage(_) | CommitError::Commit(_)),
        "a failed sync is a storage error: {err:?}"
    );
    // redb latches the failure: further use asks for a reopen rather than guessing.
    let next = store.commit_one(
        store
            .run(RunId(1))
            .stage_append_manifest(manifest("x"))
            .unwrap(),
        Durability::Immediate,
    );
    assert!(matches!(next, Err(CommitError::NeedsReopen)));
    let crashed = disk.crash();
    drop(store);
    let store = open(&crashed);
    assert_eq!(manifest_items(&store, 1), vec!["kept"]);
    append(&store, 1, "again", Durability::Immediate);
    assert_eq!(manifest_items(&store, 1), vec!["kept", "again"]);
}

#[test]
fn a_full_disk_fails_the_commit_with_disk_full_and_loses_nothing_before() {
    let disk = SimDisk::new();
    let store = open(&disk);
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    append(&store, 1, "before", Durability::Immediate);
    // The disk fills up: a big batch needs more room than is left.
    disk.set_capacity(Some(disk.len_bytes()));
    let scope = store.run(RunId(1));
    let mut batch = WriteBatch::new();
    for i in 0..2_000u64 {
        let mut row = log_row(i);
        row.detail = "d".repeat(4_000);
        batch.push(scope.stage_append_log(TaskId(10), row).unwrap());
    }
    let err = store
        .commit_group(batch, Durability::Immediate)
        .unwrap_err();
    assert!(
        matches!(err, CommitError::DiskFull(_)),
        "expected DiskFull, got {err:?}"
    );
    drop(store);
    // Space is freed; the same disk (no crash) reopens with everything committed before intact.
    disk.set_capacity(None);
    let store = open(&disk);
    assert_eq!(manifest_items(&store, 1), vec!["before"]);
    assert!(
        store
            .run(RunId(1))
            .last_log_rows(TaskId(10), 10)
            .unwrap()
            .is_empty()
    );
    append(&store, 1, "after", Durability::Immediate);
    assert_eq!(manifest_items(&store, 1), vec!["before", "after"]);
    // And after a crash too.
    let crashed = disk.crash();
    drop(store);
    assert_eq!(manifest_items(&open(&crashed), 1), vec!["before", "after"]);
}

#[test]
fn a_write_budget_runs_out_mid_commit_and_the_crash_image_is_consistent() {
    let disk = SimDisk::new();
    let store = open(&disk);
    create_run(&store, 1);
    append(&store, 1, "before", Durability::Immediate);
    disk.set_write_budget(Some(10_000));
    let scope = store.run(RunId(1));
    let batch: WriteBatch<'_> = (0..500)
        .map(|i| {
            let mut m = manifest(&format!("big {i}"));
            m.item.push_str(&"x".repeat(200));
            scope.stage_append_manifest(m).unwrap()
        })
        .collect();
    let err = store
        .commit_group(batch, Durability::Immediate)
        .unwrap_err();
    assert!(
        matches!(err, CommitError::DiskFull(_)),
        "expected DiskFull, got {err:?}"
    );
    let crashed = disk.crash();
    drop(store);
    let store = open(&crashed);
    assert_eq!(manifest_items(&store, 1), vec!["before"]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A random sequence of commits with random durability, a power loss at a random point, a reopen:
    /// exactly the commits up to the last `Immediate` one before the crash are visible.
    #[test]
    fn exactly_the_immediate_prefix_survives(
        commits in proptest::collection::vec((any::<bool>(), 1usize..4), 1..25),
        crash_at in any::<prop::sample::Index>(),
    ) {
        let disk = SimDisk::new();
        let store = open(&disk);
        create_run(&store, 1);
        create_task(&store, 1, 10, None);
        let crash_at = crash_at.index(commits.len() + 1);
        let mut crashed = None;
        let mut durable_prefix = 0usize;
        for (i, (immediate, rows)) in commits.iter().enumerate() {
            if i == crash_at {
                crashed = Some(disk.crash());
            }
            let scope = store.run(RunId(1));
            let mut batch = WriteBatch::new();
            batch.push(scope.stage_append_manifest(manifest(&format!("c{i}"))).unwrap());
            for r in 0..*rows {
                batch.push(scope.stage_append_log(TaskId(10), log_row((i * 10 + r) as u64)).unwrap());
            }
            let durability = if *immediate { Durability::Immediate } else { Durability::None };
            store.commit_group(batch, durability).unwrap();
            if *immediate && crashed.is_none() {
                durable_prefix = i + 1;
            }
        }
        let crashed = crashed.unwrap_or_else(|| disk.crash());
        drop(store);
        let store = open(&crashed);
        let want: Vec<String> = (0..durable_prefix).map(|i| format!("c{i}")).collect();
        prop_assert_eq!(manifest_items(&store, 1), want);
        let logs = store.run(RunId(1)).last_log_rows(TaskId(10), 10_000).unwrap();
        let want_logs: usize = commits[..durable_prefix].iter().map(|(_, r)| r).sum();
        prop_assert_eq!(logs.len(), want_logs);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Power is lost at a random backend operation, possibly in the middle of a commit. After the
    /// crash every commit made durable before the loss is there, the commit in flight is there
    /// entirely or not at all, and nothing later is.
    #[test]
    fn a_power_loss_mid_commit_keeps_commits_atomic(
        commits in proptest::collection::vec((any::<bool>(), 1usize..6), 1..16),
        loss_after in 0u64..120,
    ) {
        let disk = SimDisk::new();
        let store = open(&disk);
        create_run(&store, 1);
        create_task(&store, 1, 10, None);
        disk.schedule_power_loss(Some(loss_after));
        // Commits durable before the loss, and the Immediate commit during which power was lost.
        let mut durable_prefix = 0usize;
        let mut in_flight = None;
        for (i, (immediate, rows)) in commits.iter().enumerate() {
            let lost_before = disk.power_lost();
            let scope = store.run(RunId(1));
            let mut batch = WriteBatch::new();
            batch.push(scope.stage_append_manifest(manifest(&format!("c{i}"))).unwrap());
            for r in 0..*rows {
                batch.push(scope.stage_append_log(TaskId(10), log_row((i * 10 + r) as u64)).unwrap());
            }
            let durability = if *immediate { Durability::Immediate } else { Durability::None };
            store.commit_group(batch, durability).unwrap();
            if *immediate && !lost_before {
                if disk.power_lost() {
                    in_flight = Some(i + 1);
                } else {
                    durable_prefix = i + 1;
                }
            }
        }
        let crashed = disk.crash();
        drop(store);
        let store = open(&crashed);
        let seen = manifest_items(&store, 1);
        let prefix = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>();
        let ok = seen == prefix(durable_prefix) || in_flight.is_some_and(|n| seen == prefix(n));
        prop_assert!(ok, "saw {:?}, durable prefix {}, in flight {:?}", seen, durable_prefix, in_flight);
        // The log rows match the manifest exactly: a commit is never half there.
        let logs = store.run(RunId(1)).last_log_rows(TaskId(10), 10_000).unwrap();
        let want_logs: usize = commits[..seen.len()].iter().map(|(_, r)| r).sum();
        prop_assert_eq!(logs.len(), want_logs);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The harshest crash the disk models: power is lost at a random backend operation or at the
    /// sync of a random commit, and any subset of the writes since the last sync reached the disk
    /// (pages of a commit in any order, the header without the data). The store must reopen, with
    /// every commit made durable before the loss, the commit in flight entirely or not at all, and
    /// nothing later.
    #[test]
    fn a_torn_crash_keeps_commits_atomic(
        commits in proptest::collection::vec((any::<bool>(), 1usize..6), 1..12),
        loss in prop_oneof![(0u64..100).prop_map(|n| (false, n)), (0u64..8).prop_map(|n| (true, n))],
        survivors in proptest::collection::vec(proptest::bool::weighted(0.8), 64),
    ) {
        let disk = SimDisk::new();
        let store = open(&disk);
        create_run(&store, 1);
        create_task(&store, 1, 10, None);
        match loss {
            (false, ops) => disk.schedule_power_loss(Some(ops)),
            (true, syncs) => disk.schedule_power_loss_at_sync(Some(syncs)),
        }
        let mut durable_prefix = 0usize;
        let mut in_flight = None;
        for (i, (immediate, rows)) in commits.iter().enumerate() {
            let lost_before = disk.power_lost();
            let scope = store.run(RunId(1));
            let mut batch = WriteBatch::new();
            batch.push(scope.stage_append_manifest(manifest(&format!("c{i}"))).unwrap());
            for r in 0..*rows {
                batch.push(scope.stage_append_log(TaskId(10), log_row((i * 10 + r) as u64)).unwrap());
            }
            let durability = if *immediate { Durability::Immediate } else { Durability::None };
            store.commit_group(batch, durability).unwrap();
            if *immediate && !lost_before {
                if disk.power_lost() {
                    in_flight = Some(i + 1);
                } else {
                    durable_prefix = i + 1;
                }
            }
        }
        let crashed = disk.crash_torn(|i| survivors[i % survivors.len()]).unwrap();
        drop(store);
        let store = Store::open_backend(crashed, StoreConfig::default());
        prop_assert!(store.is_ok(), "a torn crash image did not reopen: {:?}", store.err());
        let store = store.unwrap();
        let seen = manifest_items(&store, 1);
        let prefix = |n: usize| (0..n).map(|i| format!("c{i}")).collect::<Vec<_>>();
        let ok = seen == prefix(durable_prefix) || in_flight.is_some_and(|n| seen == prefix(n));
        prop_assert!(ok, "saw {:?}, durable prefix {}, in flight {:?}", seen, durable_prefix, in_flight);
        let logs = store.run(RunId(1)).last_log_rows(TaskId(10), 10_000).unwrap();
        let want_logs: usize = commits[..seen.len()].iter().map(|(_, r)| r).sum();
        prop_assert_eq!(logs.len(), want_logs);
    }
}
