//! The open-runs index, the plans table and the listing of runs newest first (store format 2): the
//! index always agrees with the run rows (after a torn crash too), a format-1 store is upgraded on
//! its first writable open and read as it is by a read-only one, a plan is written once.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use keel_store::*;
use proptest::prelude::*;

const TERMINAL: [RunStatus; 4] = [
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Cancelled,
    RunStatus::BudgetExceeded,
];

fn status_of(n: u8) -> RunStatus {
    match n % 7 {
        0 => RunStatus::Pending,
        1 => RunStatus::Running,
        2 => RunStatus::Paused,
        k => TERMINAL[usize::from(k - 3)],
    }
}

/// The open runs as the index lists them, and as the rows say (every row read).
fn open_both_ways(store: &Store) -> (Vec<RunId>, Vec<RunId>) {
    let catalog = store.catalog();
    let indexed = catalog
        .open_runs(10_000)
        .unwrap()
        .items
        .into_iter()
        .map(|r| r.id)
        .collect();
    let scanned = catalog
        .runs(10_000)
        .unwrap()
        .items
        .into_iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| r.id)
        .collect();
    (indexed, scanned)
}

fn with_plan(id: u128, plan: &str) -> Run {
    Run {
        plan: Some(plan.into()),
        ..run(id)
    }
}

#[test]
fn the_index_follows_every_status_change_in_the_same_commit() {
    let (_dir, store) = open_temp();
    for id in 1..=6 {
        create_run(&store, id);
    }
    let mut batch = WriteBatch::new();
    for (id, status) in [(2, RunStatus::Completed), (4, RunStatus::Failed)] {
        let row = Run { status, ..run(id) };
        batch.push(store.run(RunId(id)).stage_update_run(row).unwrap());
    }
    store.commit_group(batch, Durability::Immediate).unwrap();
    let (indexed, scanned) = open_both_ways(&store);
    assert_eq!(indexed, vec![RunId(1), RunId(3), RunId(5), RunId(6)]);
    assert_eq!(indexed, scanned);
    // A finished run reopened (a follow-up) is open again.
    store
        .commit_one(
            store.run(RunId(2)).stage_update_run(run(2)).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(open_both_ways(&store).0.len(), 5);
    assert_eq!(
        store.catalog().open_runs(2).unwrap(),
        Listing {
            items: vec![run(1), run(2)],
            more: true
        }
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Runs created and moved between open and terminal states in commits of any durability, then a
    /// torn crash at a random operation or sync: the reopened store's index lists exactly the runs
    /// whose surviving rows are open.
    #[test]
    fn the_index_agrees_with_the_rows_after_a_torn_crash(
        commits in proptest::collection::vec(
            (any::<bool>(), proptest::collection::vec((1u128..12, any::<u8>()), 1..5)),
            1..14,
        ),
        loss in prop_oneof![(0u64..150).prop_map(|n| (false, n)), (0u64..10).prop_map(|n| (true, n))],
        survivors in proptest::collection::vec(proptest::bool::weighted(0.8), 64),
    ) {
        let disk = SimDisk::new();
        let store = Store::open_backend(disk.clone(), StoreConfig::default()).unwrap();
        match loss {
            (false, ops) => disk.schedule_power_loss(Some(ops)),
            (true, syncs) => disk.schedule_power_loss_at_sync(Some(syncs)),
        }
        let mut created = std::collections::BTreeSet::new();
        for (immediate, changes) in &commits {
            let mut batch = WriteBatch::new();
            let mut in_batch = std::collections::BTreeSet::new();
            for (id, status) in changes {
                let row = Run { status: status_of(*status), ..run(*id) };
                let scope = store.run(RunId(*id));
                if created.contains(id) || !in_batch.insert(*id) {
                    batch.push(scope.stage_update_run(row).unwrap());
                } else {
                    batch.push(scope.stage_create_run(row).unwrap());
                }
            }
            let durability = if *immediate { Durability::Immediate } else { Durability::None };
            // After the loss the disk drops what is written; the commit itself still returns.
            if store.commit_group(batch, durability).is_ok() {
                created.extend(in_batch);
            }
        }
        let crashed = disk.crash_torn(|i| survivors[i % survivors.len()]).unwrap();
        drop(store);
        let store = Store::open_backend(crashed, StoreConfig::default()).unwrap();
        let (indexed, scanned) = open_both_ways(&store);
        prop_assert_eq!(indexed, scanned);
    }
}

/// Writes a format-1 store with redb directly: run rows holding their plans, no index, no plans
/// table, as keel wrote them before format 2.
fn format_1_store(path: &std::path::Path, runs: &[Run]) {
    let db = redb::Database::create(path).unwrap();
    let meta: redb::TableDefinition<'_, &str, u64> = redb::TableDefinition::new("meta");
    let rows: redb::TableDefinition<'_, u128, &[u8]> = redb::TableDefinition::new("runs");
    let txn = db.begin_write().unwrap();
    txn.open_table(meta)
        .unwrap()
        .insert("store_format", 1)
        .unwrap();
    {
        let mut table = txn.open_table(rows).unwrap();
        for r in runs {
            let bytes = codec::encode("runs", r).unwrap();
            table.insert(r.id.0, bytes.as_slice()).unwrap();
        }
    }
    txn.commit().unwrap();
}

fn format_1_runs() -> Vec<Run> {
    vec![
        Run {
            status: RunStatus::Completed,
            ..with_plan(1, "plan one")
        },
        with_plan(2, "plan two"),
        Run {
            status: RunStatus::Paused,
            ..run(3)
        },
        Run {
            status: RunStatus::Failed,
            ..run(4)
        },
    ]
}

#[test]
fn a_format_1_store_is_read_as_it_is_by_a_read_only_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    format_1_store(&path, &format_1_runs());
    let store = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    let open: Vec<RunId> = store
        .catalog()
        .open_runs(10)
        .unwrap()
        .items
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(open, vec![RunId(2), RunId(3)]);
    assert_eq!(
        store.run(RunId(2)).get().unwrap().plan.as_deref(),
        Some("plan two")
    );
}

/// A backup before the upgrade (the moment one is wanted): a read-only open of a format-1 store
/// backs it up as it is, and the copy upgrades on its own first writable open.
#[test]
fn a_format_1_store_backs_up_before_its_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let runs = format_1_runs();
    format_1_store(&path, &runs);
    let store = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    let copy = dir.path().join("backup.redb");
    let backup = store.backup_to(&copy).unwrap();
    assert!(backup.rows > 0, "{backup:?}");
    drop(store);
    let restored = Store::open(&copy).unwrap();
    assert_eq!(restored.catalog().runs(10).unwrap().items, runs);
    let (indexed, _) = open_both_ways(&restored);
    assert_eq!(indexed, vec![RunId(2), RunId(3)]);
}

#[test]
fn a_format_1_store_is_indexed_and_its_plans_moved_on_its_first_writable_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let runs = format_1_runs();
    format_1_store(&path, &runs);
    let store = Store::open(&path).unwrap();
    let (indexed, scanned) = open_both_ways(&store);
    assert_eq!(indexed, vec![RunId(2), RunId(3)]);
    assert_eq!(indexed, scanned);
    // Every run reads back as it was written, plans included.
    assert_eq!(store.catalog().runs(10).unwrap().items, runs);
    // The plan is out of the row: an update without it keeps it.
    let row = Run {
        plan: None,
        status: RunStatus::Completed,
        ..runs[1].clone()
    };
    store
        .commit_one(
            store.run(RunId(2)).stage_update_run(row).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(
        store.run(RunId(2)).get().unwrap().plan.as_deref(),
        Some("plan two")
    );
    assert_eq!(open_both_ways(&store).0, vec![RunId(3)]);
    drop(store);
    // The upgrade is recorded: the next open finds format 2 and the same rows.
    let store = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    assert_eq!(open_both_ways(&store).0, vec![RunId(3)]);
}

#[test]
fn a_plan_is_written_once_and_cannot_change() {
    let (_dir, store) = open_temp();
    let scope = store.run(RunId(1));
    store
        .commit_one(
            scope.stage_create_run(with_plan(1, "the plan")).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    // The same plan, or none, is an update that keeps it.
    for plan in [Some("the plan"), None] {
        let row = Run {
            plan: plan.map(String::from),
            updated_ms: 2_000,
            ..run(1)
        };
        store
            .commit_one(scope.stage_update_run(row).unwrap(), Durability::Immediate)
            .unwrap();
        assert_eq!(scope.get().unwrap().plan.as_deref(), Some("the plan"));
    }
    let changed = scope
        .stage_update_run(with_plan(1, "another plan"))
        .unwrap();
    assert!(matches!(
        store.commit_one(changed, Durability::Immediate),
        Err(CommitError::Item {
            error: ItemError::PlanChanged { run: RunId(1) },
            ..
        })
    ));
    // A run without a plan cannot be given one later.
    create_run(&store, 2);
    let given = store
        .run(RunId(2))
        .stage_update_run(with_plan(2, "late"))
        .unwrap();
    assert!(store.commit_one(given, Durability::Immediate).is_err());
}

#[test]
fn a_plan_over_its_limit_is_refused_and_one_over_the_text_limit_is_not() {
    let (_dir, store) = open_temp();
    let limits = Limits::default();
    let big = "x".repeat(usize::try_from(limits.text_bytes_max).unwrap() * 4);
    let scope = store.run(RunId(1));
    store
        .commit_one(
            scope.stage_create_run(with_plan(1, &big)).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(scope.get().unwrap().plan.unwrap().len(), big.len());
    let huge = "x".repeat(usize::try_from(limits.plan_bytes_max).unwrap() + 1);
    assert!(matches!(
        store.run(RunId(2)).stage_create_run(with_plan(2, &huge)),
        Err(StageError::Limit(LimitError {
            field: "run.plan",
            ..
        }))
    ));
}

#[test]
fn runs_newest_first_counts_the_older_runs_of_every_page() {
    let (_dir, store) = open_temp();
    for id in 1..=25 {
        create_run(&store, id);
    }
    let catalog = store.catalog();
    let ids = |page: &RunPage| page.items.iter().map(|r| r.id.0).collect::<Vec<_>>();
    let first = catalog.runs_newest_first(None, 10).unwrap();
    assert_eq!(ids(&first), (16..=25).rev().collect::<Vec<_>>());
    assert_eq!(first.older, 15);
    let second = catalog.runs_newest_first(Some(RunId(16)), 10).unwrap();
    assert_eq!(ids(&second), (6..=15).rev().collect::<Vec<_>>());
    assert_eq!(second.older, 5);
    let last = catalog.runs_newest_first(Some(RunId(6)), 10).unwrap();
    assert_eq!(ids(&last), (1..=5).rev().collect::<Vec<_>>());
    assert_eq!(last.older, 0);
    let exact = catalog.runs_newest_first(Some(RunId(11)), 10).unwrap();
    assert_eq!(exact.older, 0);
    assert!(
        catalog
            .runs_newest_first(Some(RunId(1)), 10)
            .unwrap()
            .items
            .is_empty()
    );
}
