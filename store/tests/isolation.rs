//! Run isolation at the storage layer (docs/DESIGN.md §12, invariant 9): through run A's scope, nothing of
//! run B can be read or written, whatever the interleaving of writes.

mod common;

use common::*;
use keel_store::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// One write, to run 1 or run 2.
#[derive(Clone, Debug)]
enum Step {
    Task {
        run: u128,
        parent_pick: Option<u8>,
    },
    Log {
        run: u128,
        task_pick: u8,
    },
    Manifest {
        run: u128,
    },
    Idempotency {
        run: u128,
        key: u8,
    },
    Audit {
        run: u128,
    },
    /// A record naming the other run, staged through this run's scope: must be refused.
    Smuggle {
        run: u128,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let run = 1u128..=2;
    prop_oneof![
        (run.clone(), proptest::option::of(any::<u8>()))
            .prop_map(|(run, parent_pick)| Step::Task { run, parent_pick }),
        (run.clone(), any::<u8>()).prop_map(|(run, task_pick)| Step::Log { run, task_pick }),
        run.clone().prop_map(|run| Step::Manifest { run }),
        (run.clone(), 0u8..4).prop_map(|(run, key)| Step::Idempotency { run, key }),
        run.clone().prop_map(|run| Step::Audit { run }),
        run.prop_map(|run| Step::Smuggle { run }),
    ]
}

/// What each run should hold, tracked independently of the store.
#[derive(Default)]
struct Model {
    tasks: BTreeMap<u128, Vec<u128>>,
    logs: BTreeMap<u128, Vec<u64>>,
    manifest: BTreeMap<u128, Vec<String>>,
    idem: BTreeMap<u128, Vec<String>>,
    audits: BTreeMap<u128, usize>,
}

fn other(run: u128) -> u128 {
    3 - run
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn interleaved_writes_to_two_runs_never_cross(steps in proptest::collection::vec(step(), 1..60)) {
        let store = Store::open_backend(SimDisk::new(), StoreConfig::default()).unwrap();
        create_run(&store, 1);
        create_run(&store, 2);
        let mut model = Model::default();
        let mut next_task = 1_000u128;
        let mut next_mark = 0u64;
        let mut batch = WriteBatch::new();
        for (i, s) in steps.into_iter().enumerate() {
            match s {
                Step::Task { run, parent_pick } => {
                    let mine = model.tasks.entry(run).or_default();
                    let parent = match (parent_pick, mine.is_empty()) {
                        (Some(p), false) => Some(mine[usize::from(p) % mine.len()]),
                        _ => None,
                    };
                    next_task += 1;
                    // Commit pending writes first so the parent exists when this task is created.
                    batch.push(store.run(RunId(run)).stage_create_task(task(run, next_task, parent)).unwrap());
                    mine.push(next_task);
                }
                Step::Log { run, task_pick } => {
                    let Some(mine) = model.tasks.get(&run).filter(|t| !t.is_empty()) else { continue };
                    let t = mine[usize::from(task_pick) % mine.len()];
                    next_mark += 1;
                    batch.push(store.run(RunId(run)).stage_append_log(TaskId(t), log_row(next_mark)).unwrap());
                    model.logs.entry(t).or_default().push(next_mark);
                }
                Step::Manifest { run } => {
                    let item = format!("run {run} item {i}");
                    batch.push(store.run(RunId(run)).stage_append_manifest(manifest(&item)).unwrap());
                    model.manifest.entry(run).or_default().push(item);
                }
                Step::Idempotency { run, key } => {
                    let key = format!("k{key}");
                    batch.push(store.run(RunId(run)).stage_record_idempotency(idem(&key, &format!("run {run}"))).unwrap());
                    let keys = model.idem.entry(run).or_default();
                    if !keys.contains(&key) { keys.push(key); }
                }
                Step::Audit { run } => {
                    batch.push(store.run(RunId(run)).stage_append_audit(AuditEntry {
                        ts_ms: 0, task_id: None, hook: format!("run {run}"), tool: "Bash".into(),
                        decision: HookDecision::Allow, reason: String::new(), input_digest: String::new(),
                        rewritten: false,
                    }).unwrap());
                    *model.audits.entry(run).or_default() += 1;
                }
                Step::Smuggle { run } => {
                    let scope = store.run(RunId(run));
                    let foreign = other(run);
                    let refused = scope.stage_create_task(task(foreign, 1, None));
                    prop_assert!(matches!(refused, Err(StageError::RunMismatch { .. })), "task of another run was staged");
                    let refused = scope.stage_update_run(common::run(foreign));
                    prop_assert!(matches!(refused, Err(StageError::RunMismatch { .. })), "run row of another run was staged");
                    let refused = scope.stage_put_checkpoint(Checkpoint {
                        run_id: RunId(foreign), last_completed_step: None, verified_outputs: vec![],
                        pending_work: vec![], correlation_id: String::new(), state: String::new(), written_ms: 0,
                    });
                    prop_assert!(matches!(refused, Err(StageError::RunMismatch { .. })), "checkpoint of another run was staged");
                    // A log row for the other run's task, through this scope: the task is not found.
                    if let Some(t) = model.tasks.get(&foreign).and_then(|t| t.first()) {
                        let attempt = store.commit_one(scope.stage_append_log(TaskId(*t), log_row(0)).unwrap(), Durability::None);
                        let is_task_not_found = matches!(attempt, Err(CommitError::Item { error: ItemError::TaskNotFound { .. }, .. }));
                        prop_assert!(is_task_not_found, "a log row reached another run's task");
                    }
                }
            }
            // Commit at random-ish points so batches mix both runs.
            if i % 3 == 2 {
                store.commit_group(std::mem::take(&mut batch), Durability::None).unwrap();
            }
        }
        store.commit_group(batch, Durability::Immediate).unwrap();

        for run in 1..=2u128 {
            let scope = store.run(RunId(run));
            let mine = model.tasks.get(&run).cloned().unwrap_or_default();
            let theirs = model.tasks.get(&other(run)).cloned().unwrap_or_default();
            let listed: Vec<u128> = scope.tasks(None, 10_000).unwrap().items.iter().map(|t| t.id.0).collect();
            prop_assert_eq!(&listed, &mine);
            for t in &mine {
                prop_assert_eq!(scope.task(TaskId(*t)).unwrap().run_id, RunId(run));
                let rows: Vec<u64> = scope.last_log_rows(TaskId(*t), 10_000).unwrap().iter().map(|r| r.value.ts_ms - 10_000).collect();
                prop_assert_eq!(rows, model.logs.get(t).cloned().unwrap_or_default());
                for c in scope.children(TaskId(*t), 10_000).unwrap().items {
                    prop_assert_eq!(c.run_id, RunId(run));
                }
            }
            for t in &theirs {
                // Every read of another run's task through this scope is NotFound.
                let not_found = matches!(scope.task(TaskId(*t)), Err(ReadError::NotFound { .. }));
                prop_assert!(not_found, "another run's task was visible");
                let not_found = matches!(scope.last_log_rows(TaskId(*t), 10), Err(ReadError::NotFound { .. }));
                prop_assert!(not_found, "another run's task was visible");
                let not_found = matches!(scope.children(TaskId(*t), 10), Err(ReadError::NotFound { .. }));
                prop_assert!(not_found, "another run's task was visible");
                let not_found = matches!(scope.ancestors(TaskId(*t), 5), Err(ReadError::NotFound { .. }));
                prop_assert!(not_found, "another run's task was visible");
                // The operator view does find it, in its own run.
                prop_assert_eq!(store.catalog().locate_task(TaskId(*t)).unwrap(), RunId(other(run)));
            }
            let items: Vec<String> = scope.manifest(0, 10_000).unwrap().items.into_iter().map(|e| e.value.item).collect();
            prop_assert_eq!(items, model.manifest.get(&run).cloned().unwrap_or_default());
            let mut own_keys = model.idem.get(&run).cloned().unwrap_or_default();
            own_keys.sort();
            let listed_keys: Vec<String> = scope.idempotency_records(None, 10_000).unwrap().items.into_iter().map(|r| r.key).collect();
            prop_assert_eq!(listed_keys, own_keys);
            for k in model.idem.get(&run).cloned().unwrap_or_default() {
                prop_assert_eq!(scope.idempotency(&k).unwrap().unwrap().effect, format!("run {run}"));
            }
            let audits = scope.audit(0, 10_000).unwrap().items;
            prop_assert_eq!(audits.len(), model.audits.get(&run).copied().unwrap_or(0));
            let own = format!("run {run}");
            prop_assert!(audits.iter().all(|a| a.value.hook == own), "audit rows crossed runs");
        }
    }
}
