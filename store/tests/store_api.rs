//! The store's typed API: tasks and their tree, group commit, session logs, the manifest, idempotency,
//! limits and blobs, and typed errors that lose nothing.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use keel_store::*;
use proptest::prelude::*;

#[test]
fn the_store_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    assert_send_sync::<StagedWrite<'static>>();
    assert_send_sync::<WriteBatch<'static>>();
    assert_send_sync::<SimDisk>();
    // Concurrent committers queue on redb's single writer; every write lands exactly once.
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    std::thread::scope(|s| {
        for t in 0..4 {
            let store = &store;
            s.spawn(move || {
                for i in 0..10 {
                    append_manifest(store, &format!("t{t} i{i}"));
                }
            });
        }
    });
    let seqs: Vec<u64> = store
        .run(RunId(1))
        .manifest(0, 100)
        .unwrap()
        .items
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (1..=40).collect::<Vec<_>>());
}

fn append_manifest(store: &Store, item: &str) {
    store
        .commit_one(
            store
                .run(RunId(1))
                .stage_append_manifest(manifest(item))
                .unwrap(),
            Durability::None,
        )
        .unwrap();
}

#[test]
fn open_creates_file_and_tables_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    {
        let store = Store::open(&path).unwrap();
        assert!(store.catalog().runs(10).unwrap().items.is_empty());
        assert!(store.catalog().tasks(None, 10).unwrap().items.is_empty());
        create_run(&store, 1);
    }
    assert!(path.exists());
    let store = Store::open(&path).unwrap();
    assert_eq!(store.catalog().runs(10).unwrap().items, vec![run(1)]);
}

#[test]
fn a_read_only_handle_shares_the_file_with_the_writer_and_follows_its_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    assert!(matches!(
        Store::open_read_only(&path, StoreConfig::default()),
        Err(OpenError::NotFound(_))
    ));
    let writer = Store::open_with(
        &path,
        StoreConfig {
            sharing: Sharing::WithReaders,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    create_run(&writer, 1);
    let reader = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    assert_eq!(reader.catalog().runs(10).unwrap().items, vec![run(1)]);
    create_task(&writer, 1, 10, None);
    assert_eq!(
        reader.catalog().task(TaskId(10)).unwrap(),
        task(1, 10, None)
    );
    let refused = reader.commit_one(
        reader
            .run(RunId(1))
            .stage_append_manifest(manifest("x"))
            .unwrap(),
        Durability::Immediate,
    );
    assert!(matches!(refused, Err(CommitError::ReadOnly)));
    // A second writer is refused while the first holds the file.
    assert!(matches!(Store::open(&path), Err(OpenError::Locked)));
}

#[test]
fn tasks_children_tree_and_ancestors() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    // root 10 -> {11 -> {13}, 12}
    create_task(&store, 1, 10, None);
    create_task(&store, 1, 11, Some(10));
    create_task(&store, 1, 12, Some(10));
    create_task(&store, 1, 13, Some(11));
    let scope = store.run(RunId(1));

    assert_eq!(scope.task(TaskId(13)).unwrap(), task(1, 13, Some(11)));
    let kids: Vec<_> = scope
        .children(TaskId(10), 10)
        .unwrap()
        .items
        .into_iter()
        .map(|t| t.id.0)
        .collect();
    assert_eq!(kids, vec![11, 12]);

    let chain: Vec<_> = scope
        .ancestors(TaskId(13), 5)
        .unwrap()
        .into_iter()
        .map(|t| t.id.0)
        .collect();
    assert_eq!(chain, vec![11, 10]);
    assert_eq!(scope.ancestors(TaskId(13), 1).unwrap().len(), 1);

    let tree: Vec<_> = store
        .catalog()
        .tree(RunId(1), 100)
        .unwrap()
        .items
        .into_iter()
        .map(|n| (n.level, n.task.id.0))
        .collect();
    assert_eq!(tree, vec![(0, 10), (1, 11), (2, 13), (1, 12)]);

    let listing = store.catalog().tasks(Some(RunId(1)), 2).unwrap();
    assert_eq!(listing.items.len(), 2);
    assert!(listing.more, "a bounded listing says rows were left");

    let page2 = scope.tasks(Some(TaskId(11)), 10).unwrap();
    assert_eq!(
        page2.items.iter().map(|t| t.id.0).collect::<Vec<_>>(),
        vec![12, 13]
    );
    assert!(!page2.more);

    assert_eq!(store.catalog().locate_task(TaskId(13)).unwrap(), RunId(1));
    assert_eq!(store.catalog().task(TaskId(12)).unwrap().id, TaskId(12));
    assert!(matches!(
        store.catalog().task(TaskId(99)),
        Err(ReadError::NotFound { what: "task", .. })
    ));
}

/// A root's children are read from its run's task rows, not indexed under it (store format 6); a
/// deeper task's children are indexed. Both list in id order, bounded, and only the run's own.
#[test]
fn a_roots_children_come_from_the_run_s_rows_and_deeper_ones_from_the_index() {
    let (dir, store) = open_temp();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    for id in 11..=15 {
        create_task(&store, 1, id, Some(10));
    }
    create_task(&store, 1, 20, Some(11));
    create_task(&store, 1, 21, Some(11));
    create_run(&store, 2);
    create_task(&store, 2, 30, None);
    create_task(&store, 2, 31, Some(30));
    let ids = |l: Listing<Task>| (l.items.iter().map(|t| t.id.0).collect::<Vec<_>>(), l.more);
    let scope = store.run(RunId(1));
    assert_eq!(
        ids(scope.children(TaskId(10), 3).unwrap()),
        (vec![11, 12, 13], true)
    );
    assert_eq!(
        ids(scope.children(TaskId(10), 5).unwrap()),
        (vec![11, 12, 13, 14, 15], false)
    );
    assert_eq!(
        ids(scope.children(TaskId(11), 10).unwrap()),
        (vec![20, 21], false)
    );
    assert_eq!(
        ids(scope.children(TaskId(11), 1).unwrap()),
        (vec![20], true)
    );
    assert_eq!(
        ids(scope.children(TaskId(15), 10).unwrap()),
        (vec![], false)
    );
    assert_eq!(
        ids(store.run(RunId(2)).children(TaskId(30), 10).unwrap()),
        (vec![31], false)
    );
    assert!(matches!(
        scope.children(TaskId(99), 10),
        Err(ReadError::NotFound { what: "task", .. })
    ));
    drop(store);
    // The index holds the rows of the deeper children only.
    let db = redb::Database::open(dir.path().join("keel.redb")).unwrap();
    let def: redb::TableDefinition<'_, (u128, u128, u128), ()> =
        redb::TableDefinition::new("task_children");
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let table = txn.open_table(def).unwrap();
    let rows: Vec<_> = redb::ReadableTable::iter(&table)
        .unwrap()
        .map(|e| e.unwrap().0.value())
        .collect();
    assert_eq!(rows, vec![(1, 11, 20), (1, 11, 21)]);
}

/// A commit's manifest entries of one run are one row (store format 6): read back entry by entry
/// with their own numbers, from any point, bounded; numbering goes on after them in later commits
/// and after a reopen, which finds the end inside the last segment.
#[test]
fn a_commits_manifest_entries_are_one_row_read_back_entry_by_entry() {
    let (dir, store) = open_temp();
    let path = dir.path().join("keel.redb");
    create_run(&store, 1);
    create_run(&store, 2);
    let append = |store: &Store, run: u128, items: &[&str]| -> Vec<u64> {
        let scope = store.run(RunId(run));
        let batch: WriteBatch<'_> = items
            .iter()
            .map(|i| scope.stage_append_manifest(manifest(i)).unwrap())
            .collect();
        store
            .commit_group(batch, Durability::Immediate)
            .unwrap()
            .into_iter()
            .map(|a| match a {
                Applied::ManifestAppended { seq } => seq,
                other => panic!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(append(&store, 1, &["a", "b", "c"]), vec![1, 2, 3]);
    assert_eq!(append(&store, 2, &["x"]), vec![1]);
    assert_eq!(append(&store, 1, &["d", "e"]), vec![4, 5]);
    let read = |store: &Store, after: u64, limit: u32| {
        let l = store.run(RunId(1)).manifest(after, limit).unwrap();
        let items: Vec<_> = l
            .items
            .iter()
            .map(|s| (s.seq, s.value.item.clone()))
            .collect();
        (items, l.more)
    };
    let all: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, s)| (i as u64 + 1, s.to_string()))
        .collect();
    assert_eq!(read(&store, 0, 10), (all.clone(), false));
    assert_eq!(read(&store, 1, 2), (all[1..3].to_vec(), true));
    assert_eq!(read(&store, 2, 10), (all[2..].to_vec(), false));
    assert_eq!(read(&store, 5, 10), (vec![], false));
    assert_eq!(read(&store, u64::MAX, 10), (vec![], false));
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(append(&store, 1, &["f"]), vec![6]);
    assert_eq!(read(&store, 4, 10).0.len(), 2);
    drop(store);
    // Three rows for run 1 (two segments and a single entry), one for run 2.
    let db = redb::Database::open(&path).unwrap();
    let def: redb::TableDefinition<'_, (u128, u64), &[u8]> = redb::TableDefinition::new("manifest");
    let txn = redb::ReadableDatabase::begin_read(&db).unwrap();
    let table = txn.open_table(def).unwrap();
    let keys: Vec<_> = redb::ReadableTable::iter(&table)
        .unwrap()
        .map(|e| e.unwrap().0.value())
        .collect();
    assert_eq!(keys, vec![(1, 1), (1, 4), (1, 6), (2, 1)]);
}

#[test]
fn task_creation_checks_run_parent_and_uniqueness() {
    let (_dir, store) = open_temp();
    let scope = store.run(RunId(1));
    let err = store
        .commit_one(
            scope.stage_create_task(task(1, 10, None)).unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        CommitError::Item {
            index: 0,
            error: ItemError::RunNotFound(RunId(1))
        }
    ));

    create_run(&store, 1);
    create_run(&store, 2);
    create_task(&store, 1, 10, None);
    let err = store
        .commit_one(
            scope.stage_create_task(task(1, 11, Some(77))).unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        CommitError::Item {
            error: ItemError::ParentNotFound { .. },
            ..
        }
    ));
    // Task ids are unique store-wide: run 2 cannot reuse run 1's id.
    let err = store
        .commit_one(
            store
                .run(RunId(2))
                .stage_create_task(task(2, 10, None))
                .unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        CommitError::Item {
            error: ItemError::TaskIdTaken(TaskId(10)),
            ..
        }
    ));
    // Self-parenting is refused at staging.
    assert!(matches!(
        scope.stage_create_task(task(1, 12, Some(12))),
        Err(StageError::Invalid { .. })
    ));
    // A parent cannot change on update.
    create_task(&store, 1, 11, Some(10));
    let mut moved = task(1, 11, None);
    moved.status = TaskStatus::Running;
    let err = store
        .commit_one(
            scope.stage_update_task(moved).unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(matches!(
        err,
        CommitError::Item {
            error: ItemError::ParentChanged { .. },
            ..
        }
    ));
}

#[test]
fn group_commit_applies_many_runs_in_order_with_one_sync() {
    let disk = SimDisk::new();
    let store = Store::open_backend(disk.clone(), StoreConfig::default()).unwrap();
    let mut setup = WriteBatch::new();
    for r in 1..=3u128 {
        let scope = store.run(RunId(r));
        setup.push(scope.stage_create_run(run(r)).unwrap());
        setup.push(scope.stage_create_task(task(r, r * 100, None)).unwrap());
    }
    store.commit_group(setup, Durability::Immediate).unwrap();

    let syncs_before = disk.syncs();
    let mut batch = WriteBatch::new();
    for i in 0..30u64 {
        let r = u128::from(i % 3) + 1;
        let scope = store.run(RunId(r));
        batch.push(scope.stage_append_log(TaskId(r * 100), log_row(i)).unwrap());
        batch.push(
            scope
                .stage_append_manifest(manifest(&format!("item {i}")))
                .unwrap(),
        );
    }
    // A step result and its done-marker in the same transaction.
    let mut done = task(1, 100, None);
    done.status = TaskStatus::Complete;
    done.outcome = Some("found it".into());
    batch.push(store.run(RunId(1)).stage_update_task(done.clone()).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    let syncs = disk.syncs() - syncs_before;
    assert_eq!(
        syncs, 1,
        "one group commit costs one fsync, not one per record"
    );
    assert_eq!(applied.len(), 61);
    // Each run's log and manifest got consecutive sequence numbers, in batch order.
    assert_eq!(applied[0], Applied::LogAppended { seq: 1 });
    assert_eq!(applied[1], Applied::ManifestAppended { seq: 1 });
    assert_eq!(applied[6], Applied::LogAppended { seq: 2 });
    assert_eq!(applied[59], Applied::ManifestAppended { seq: 10 });
    assert!(matches!(applied[60], Applied::TaskUpdated { .. }));
    assert_eq!(store.run(RunId(1)).task(TaskId(100)).unwrap(), done);
    let m = store.run(RunId(3)).manifest(0, 100).unwrap();
    assert_eq!(m.items.len(), 10);
    assert_eq!(m.items[0].value.item, "item 2");
}

#[test]
fn a_failed_group_commits_nothing_and_the_store_stays_usable() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    let scope = store.run(RunId(1));
    store
        .commit_one(
            scope.stage_append_manifest(manifest("before")).unwrap(),
            Durability::Immediate,
        )
        .unwrap();

    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_manifest(manifest("lost")).unwrap());
    batch.push(scope.stage_append_log(TaskId(10), log_row(1)).unwrap());
    batch.push(scope.stage_append_log(TaskId(99), log_row(2)).unwrap()); // no such task
    let err = store
        .commit_group(batch, Durability::Immediate)
        .unwrap_err();
    assert!(matches!(
        err,
        CommitError::Item {
            index: 2,
            error: ItemError::TaskNotFound { .. }
        }
    ));
    let m = scope.manifest(0, 10).unwrap();
    assert_eq!(m.items.len(), 1);
    assert_eq!(m.items[0].value.item, "before");
    assert!(scope.last_log_rows(TaskId(10), 10).unwrap().is_empty());

    // Still usable: the next commit gets the next sequence number as if nothing happened.
    let applied = store
        .commit_one(
            scope.stage_append_manifest(manifest("after")).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(applied, Applied::ManifestAppended { seq: 2 });
}

#[test]
fn a_kept_batch_can_drop_its_failing_write_and_commit_the_rest() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_run(&store, 2);
    create_task(&store, 2, 20, None);
    let mut batch = WriteBatch::new();
    batch.push(
        store
            .run(RunId(1))
            .stage_append_manifest(manifest("one"))
            .unwrap(),
    );
    batch.push(
        store
            .run(RunId(1))
            .stage_append_log(TaskId(20), log_row(1))
            .unwrap(),
    ); // run 2's task
    batch.push(
        store
            .run(RunId(2))
            .stage_append_log(TaskId(20), log_row(2))
            .unwrap(),
    );
    let Err(CommitError::Item { index, .. }) = store.commit_batch(&batch, Durability::Immediate)
    else {
        panic!("the write through the wrong scope must fail")
    };
    assert_eq!(index, 1);
    let dropped = batch.remove(index as usize).unwrap();
    assert_eq!(dropped.run(), Some(RunId(1)));
    let applied = store.commit_batch(&batch, Durability::Immediate).unwrap();
    assert_eq!(
        applied,
        vec![
            Applied::ManifestAppended { seq: 1 },
            Applied::LogAppended { seq: 1 }
        ]
    );
    assert!(batch.remove(5).is_none());
}

#[test]
fn batch_size_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        batch_items_max: 2,
        ..Limits::default()
    };
    let store = Store::open_with(
        dir.path().join("k.redb"),
        StoreConfig {
            limits,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    create_run(&store, 1);
    let scope = store.run(RunId(1));
    let batch: WriteBatch<'_> = (0..3)
        .map(|i| {
            scope
                .stage_append_manifest(manifest(&i.to_string()))
                .unwrap()
        })
        .collect();
    assert!(matches!(
        store.commit_group(batch, Durability::Immediate),
        Err(CommitError::BatchTooLarge(LimitError {
            size: 3,
            limit: 2,
            ..
        }))
    ));
    assert!(scope.manifest(0, 10).unwrap().items.is_empty());
}

#[test]
fn idempotency_key_recorded_once_and_replay_gets_the_original() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_run(&store, 2);
    let scope = store.run(RunId(1));
    let first = store
        .commit_one(
            scope
                .stage_record_idempotency(idem("send-mail-42", "send mail"))
                .unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(first, Applied::IdempotencyRecorded);
    let mut replay = idem("send-mail-42", "send mail again");
    replay.ts_ms = 9_999;
    let again = store
        .commit_one(
            scope.stage_record_idempotency(replay).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(
        again,
        Applied::AlreadyRecorded(idem("send-mail-42", "send mail"))
    );
    // Twice within one batch: the second sees the first.
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_record_idempotency(idem("k2", "a")).unwrap());
    batch.push(scope.stage_record_idempotency(idem("k2", "b")).unwrap());
    let applied = store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(applied[0], Applied::IdempotencyRecorded);
    assert_eq!(applied[1], Applied::AlreadyRecorded(idem("k2", "a")));
    // Keys are per run.
    assert_eq!(
        store
            .commit_one(
                store
                    .run(RunId(2))
                    .stage_record_idempotency(idem("send-mail-42", "x"))
                    .unwrap(),
                Durability::Immediate
            )
            .unwrap(),
        Applied::IdempotencyRecorded
    );
    assert_eq!(
        scope.idempotency("send-mail-42").unwrap().unwrap().effect,
        "send mail"
    );
    assert!(scope.idempotency("unknown").unwrap().is_none());

    // Listing: this run's keys only, in key order, paged.
    let keys =
        |l: Listing<IdempotencyRecord>| l.items.into_iter().map(|r| r.key).collect::<Vec<_>>();
    let first = scope.idempotency_records(None, 1).unwrap();
    assert!(first.more);
    assert_eq!(keys(first), vec!["k2"]);
    let rest = scope.idempotency_records(Some("k2"), 10).unwrap();
    assert!(!rest.more);
    assert_eq!(keys(rest), vec!["send-mail-42"]);
    let other = store.run(RunId(2)).idempotency_records(None, 10).unwrap();
    assert_eq!(other.items, vec![idem("send-mail-42", "x")]);
    assert!(keys(store.run(RunId(3)).idempotency_records(None, 10).unwrap()).is_empty());
}

#[test]
fn other_records_round_trip_through_the_store() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    let scope = store.run(RunId(1));
    let checkpoint = Checkpoint {
        run_id: RunId(1),
        last_completed_step: Some("plan".into()),
        verified_outputs: vec![TaskId(3)],
        pending_work: vec![TaskId(4)],
        correlation_id: "c-1".into(),
        state: "{}".into(),
        written_ms: 5,
    };
    let dead = DeadLetter {
        ts_ms: 6,
        task_id: Some(TaskId(4)),
        subject: "report".into(),
        payload: "{..}".into(),
        reason: "node gone".into(),
        attempts: 3,
    };
    let audit = AuditEntry {
        ts_ms: 7,
        task_id: None,
        hook: "deny-rule".into(),
        tool: "Bash".into(),
        decision: HookDecision::Deny,
        reason: "rm -rf is denied".into(),
        input_digest: "abc".into(),
        rewritten: false,
    };
    let esc = Escalation {
        id: EscalationId(77),
        ts_ms: 8,
        task_id: Some(TaskId(4)),
        trigger: EscalationTrigger::PolicyGap,
        account: "acct-1".into(),
        asked: "refund".into(),
        attempted: "lookup".into(),
        diagnosis: "no rule".into(),
        amount_micros: Some(12_000_000),
        recommended_action: "approve".into(),
        options: vec!["allow".into(), "deny".into()],
        waiting: EscalationWait::ToolCall {
            tool: "Pay".into(),
            deadline_ms: 90,
        },
        resolution: None,
    };
    let profile = AgentProfile {
        name: "researcher".into(),
        description: "reads".into(),
        harness: "claude-code".into(),
        model: "model-a".into(),
        account: "acct-1".into(),
        tools: vec!["Read".into()],
        system_prompt: "be brief".into(),
        limits: AgentLimits {
            turns_max: 10,
            tokens_max: 100_000,
            timeout_ms: 60_000,
            spend_micros_max: None,
        },
    };
    let mut batch = WriteBatch::new();
    batch.push(scope.stage_put_checkpoint(checkpoint.clone()).unwrap());
    batch.push(scope.stage_append_dead_letter(dead.clone()).unwrap());
    batch.push(scope.stage_append_audit(audit.clone()).unwrap());
    batch.push(scope.stage_append_escalation(esc.clone()).unwrap());
    batch.push(store.stage_put_agent(profile.clone()).unwrap());
    store.commit_group(batch, Durability::Immediate).unwrap();
    assert_eq!(scope.checkpoint().unwrap(), Some(checkpoint));
    assert_eq!(scope.dead_letters(0, 10).unwrap().items[0].value, dead);
    assert_eq!(scope.audit(0, 10).unwrap().items[0].value, audit);
    assert_eq!(scope.escalations(0, 10).unwrap().items[0].value, esc);
    assert_eq!(store.agent_profile("researcher").unwrap(), profile);
    assert_eq!(store.catalog().agents(10).unwrap().items, vec![profile]);
    assert!(store.run(RunId(2)).checkpoint().unwrap().is_none());
}

#[test]
fn an_escalation_is_found_by_id_resolved_once_and_listed_while_open() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_run(&store, 2);
    let scope = store.run(RunId(1));
    let esc = |id: u128| Escalation {
        id: EscalationId(id),
        ts_ms: 8,
        task_id: None,
        trigger: EscalationTrigger::HumanRequested,
        account: String::new(),
        asked: "which?".into(),
        attempted: "x".into(),
        diagnosis: "y".into(),
        amount_micros: None,
        recommended_action: "answer".into(),
        options: Vec::new(),
        waiting: EscalationWait::Task,
        resolution: None,
    };
    let commit = |w: StagedWrite<'_>| store.commit_one(w, Durability::Immediate);
    commit(scope.stage_append_escalation(esc(5)).unwrap()).unwrap();
    commit(scope.stage_append_escalation(esc(6)).unwrap()).unwrap();
    // Appending an id again changes nothing; another run cannot take it.
    commit(scope.stage_append_escalation(esc(5)).unwrap()).unwrap();
    assert_eq!(scope.escalations(0, 10).unwrap().items.len(), 2);
    assert!(commit(store.run(RunId(2)).stage_append_escalation(esc(5)).unwrap()).is_err());
    let (run, row) = store.catalog().escalation(EscalationId(6)).unwrap();
    assert_eq!((run, row.seq), (RunId(1), 2));
    let answered = EscalationResolution::Answered {
        ts_ms: 9,
        text: "json".into(),
    };
    let first = commit(
        scope
            .stage_resolve_escalation(EscalationId(5), answered.clone())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first, Applied::EscalationResolved);
    let again = commit(
        scope
            .stage_resolve_escalation(EscalationId(5), EscalationResolution::Expired { ts_ms: 10 })
            .unwrap(),
    )
    .unwrap();
    assert_eq!(again, Applied::EscalationAlreadyResolved(answered.clone()));
    // Another run's scope cannot resolve it.
    assert!(
        commit(
            store
                .run(RunId(2))
                .stage_resolve_escalation(EscalationId(6), answered)
                .unwrap()
        )
        .is_err()
    );
    let open = store.catalog().escalations(None, true, 10).unwrap();
    assert_eq!(open.items.len(), 1);
    assert_eq!(open.items[0].1.value.id, EscalationId(6));
    assert_eq!(
        store
            .catalog()
            .escalations(Some(RunId(1)), false, 10)
            .unwrap()
            .items
            .len(),
        2
    );
    assert!(
        store
            .catalog()
            .escalations(Some(RunId(2)), false, 10)
            .unwrap()
            .items
            .is_empty()
    );
}

#[test]
fn session_log_last_n_in_order() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    create_task(&store, 1, 11, None);
    let scope = store.run(RunId(1));
    for i in 1..=20u64 {
        let mut batch = WriteBatch::new();
        batch.push(scope.stage_append_log(TaskId(10), log_row(i)).unwrap());
        batch.push(
            scope
                .stage_append_log(TaskId(11), log_row(100 + i))
                .unwrap(),
        );
        store.commit_group(batch, Durability::None).unwrap();
    }
    let last = scope.last_log_rows(TaskId(10), 5).unwrap();
    assert_eq!(
        last.iter()
            .map(|r| (r.seq, r.value.ts_ms))
            .collect::<Vec<_>>(),
        (16..=20).map(|i| (i, 10_000 + i)).collect::<Vec<_>>()
    );
    let all = scope.last_log_rows(TaskId(11), 100).unwrap();
    assert_eq!(all.len(), 20);
    let after = scope.log_rows_after(TaskId(10), 18, 10).unwrap();
    assert_eq!(
        after.items.iter().map(|r| r.seq).collect::<Vec<_>>(),
        vec![19, 20]
    );
    assert_eq!(
        store.catalog().session_log(TaskId(10), 3).unwrap(),
        last[2..]
    );
    assert!(matches!(
        scope.last_log_rows(TaskId(10), 1_000_000),
        Err(ReadError::TooManyRows(_))
    ));
}

/// A commit looks a task and its log's end up once and counts on (a dispatch's decision rows, a new
/// task's first rows): rows of a task created in the same batch start at 1, a task created in the
/// batch can parent another in it, a stored task's rows continue from its stored end, and a batch
/// that fails part-way (a row for a task that does not exist) leaves nothing cached for the next.
#[test]
fn log_rows_of_one_commit_are_numbered_from_the_task_and_its_log_end() {
    let (_dir, store) = open_temp();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    let scope = store.run(RunId(1));
    let mut first = WriteBatch::new();
    first.push(scope.stage_append_log(TaskId(10), log_row(1)).unwrap());
    store.commit_group(first, Durability::None).unwrap();

    let mut batch = WriteBatch::new();
    batch.push(scope.stage_append_log(TaskId(10), log_row(2)).unwrap());
    batch.push(scope.stage_create_task(task(1, 20, Some(10))).unwrap());
    batch.push(scope.stage_create_task(task(1, 21, Some(20))).unwrap());
    batch.push(scope.stage_append_log(TaskId(20), log_row(3)).unwrap());
    batch.push(scope.stage_append_log(TaskId(10), log_row(4)).unwrap());
    batch.push(scope.stage_append_log(TaskId(20), log_row(5)).unwrap());
    batch.push(scope.stage_append_log(TaskId(21), log_row(6)).unwrap());
    let applied = store.commit_group(batch, Durability::None).unwrap();
    let seqs: Vec<Option<u64>> = applied
        .iter()
        .map(|a| match a {
            Applied::LogAppended { seq } => Some(*seq),
            _ => None,
        })
        .collect();
    assert_eq!(
        seqs,
        vec![Some(2), None, None, Some(1), Some(3), Some(2), Some(1)]
    );

    let mut failing = WriteBatch::new();
    failing.push(scope.stage_append_log(TaskId(10), log_row(7)).unwrap());
    failing.push(scope.stage_append_log(TaskId(99), log_row(8)).unwrap());
    assert!(matches!(
        store.commit_group(failing, Durability::None),
        Err(CommitError::Item { index: 1, .. })
    ));
    let mut after = WriteBatch::new();
    after.push(scope.stage_append_log(TaskId(10), log_row(9)).unwrap());
    assert_eq!(
        store.commit_group(after, Durability::None).unwrap(),
        vec![Applied::LogAppended { seq: 4 }]
    );
    let rows = scope.last_log_rows(TaskId(10), 10).unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.seq, r.value.ts_ms))
            .collect::<Vec<_>>(),
        vec![(1, 10_001), (2, 10_002), (3, 10_004), (4, 10_009)]
    );
    assert_eq!(scope.children(TaskId(20), 10).unwrap().items.len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Appends to several tasks in random batch shapes: each task's rows come back in append order,
    /// numbered 1..=n without gaps, and the last-N read is the tail of that order.
    #[test]
    fn session_log_order_is_append_order(
        appends in proptest::collection::vec((0u128..3, 0usize..4), 1..40),
        n in 1u32..10,
    ) {
        let disk = SimDisk::new();
        let store = Store::open_backend(disk, StoreConfig::default()).unwrap();
        create_run(&store, 1);
        for t in 0..3u128 { create_task(&store, 1, 10 + t, None); }
        let scope = store.run(RunId(1));
        let mut expected: Vec<Vec<u64>> = vec![Vec::new(); 3];
        let mut counter = 0u64;
        let mut batch = WriteBatch::new();
        for (t, flush) in appends {
            counter += 1;
            expected[usize::try_from(t).unwrap()].push(counter);
            batch.push(scope.stage_append_log(TaskId(10 + t), log_row(counter)).unwrap());
            if flush == 0 {
                store.commit_group(std::mem::take(&mut batch), Durability::None).unwrap();
            }
        }
        store.commit_group(batch, Durability::Immediate).unwrap();
        for t in 0..3u128 {
            let want = &expected[usize::try_from(t).unwrap()];
            let rows = scope.last_log_rows(TaskId(10 + t), 1_000).unwrap();
            prop_assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), (1..=want.len() as u64).collect::<Vec<_>>());
            prop_assert_eq!(rows.iter().map(|r| r.value.ts_ms - 10_000).collect::<Vec<_>>(), want.clone());
            let tail = scope.last_log_rows(TaskId(10 + t), n).unwrap();
            let k = want.len().min(n as usize);
            prop_assert_eq!(tail, rows[rows.len() - k..].to_vec());
        }
    }

    /// The manifest is append-only: whatever else is committed (and whatever fails), every entry once
    /// read is read back identical under the same sequence number.
    #[test]
    fn manifest_entries_never_change(
        ops in proptest::collection::vec(0u8..4, 1..30),
    ) {
        let disk = SimDisk::new();
        let store = Store::open_backend(disk, StoreConfig::default()).unwrap();
        create_run(&store, 1);
        create_task(&store, 1, 10, None);
        let scope = store.run(RunId(1));
        let mut seen: Vec<Sequenced<ManifestEntry>> = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            let mut batch = WriteBatch::new();
            match op {
                0 => { batch.push(scope.stage_append_manifest(manifest(&format!("m{i}"))).unwrap()); }
                1 => {
                    // A batch that fails after a manifest append: the append must not land.
                    batch.push(scope.stage_append_manifest(manifest("never")).unwrap());
                    batch.push(scope.stage_append_log(TaskId(404), log_row(0)).unwrap());
                }
                2 => {
                    let mut t = task(1, 10, None);
                    t.progress_notes.push(format!("note {i}"));
                    batch.push(scope.stage_update_task(t).unwrap());
                }
                _ => { batch.push(scope.stage_put_checkpoint(Checkpoint {
                    run_id: RunId(1), last_completed_step: None, verified_outputs: vec![],
                    pending_work: vec![], correlation_id: format!("c{i}"), state: String::new(), written_ms: 0,
                }).unwrap()); }
            }
            let result = store.commit_group(batch, Durability::None);
            prop_assert_eq!(result.is_err(), op == 1);
            let now = scope.manifest(0, 1_000).unwrap().items;
            prop_assert!(now.len() >= seen.len());
            prop_assert_eq!(&now[..seen.len()], &seen[..]);
            prop_assert!(now.iter().all(|e| e.value.item != "never"));
            prop_assert_eq!(now.iter().map(|e| e.seq).collect::<Vec<_>>(), (1..=now.len() as u64).collect::<Vec<_>>());
            seen = now;
        }
    }
}

#[test]
fn oversize_input_is_refused_naming_field_size_and_limit() {
    let (_dir, store) = open_temp();
    let limits = *store.limits();
    let scope = store.run(RunId(1));
    let mut big = run(1);
    big.brief = "x".repeat(usize::try_from(limits.brief_bytes_max).unwrap() + 1);
    assert_eq!(
        scope.stage_create_run(big).unwrap_err(),
        StageError::Limit(LimitError {
            field: "run.brief",
            size: limits.brief_bytes_max + 1,
            limit: limits.brief_bytes_max,
        })
    );
    let mut row = log_row(1);
    row.summary = "s".repeat(600);
    assert!(matches!(
        scope.stage_append_log(TaskId(1), row),
        Err(StageError::Limit(LimitError {
            field: "session_log.summary",
            size: 600,
            limit: 512
        }))
    ));
    let mut row = log_row(1);
    row.detail = "d".repeat(20_000);
    assert!(matches!(
        scope.stage_append_log(TaskId(1), row),
        Err(StageError::Limit(LimitError {
            field: "session_log.detail",
            ..
        }))
    ));
    let mut t = task(1, 10, None);
    t.outcome = Some("o".repeat(usize::try_from(limits.output_bytes_max).unwrap() + 1));
    assert!(matches!(
        scope.stage_create_task(t),
        Err(StageError::Limit(LimitError {
            field: "task.outcome",
            ..
        }))
    ));
    assert!(matches!(
        scope.stage_put_blob(vec![
            0;
            usize::try_from(limits.attachment_bytes_max).unwrap()
                + 1
        ]),
        Err(StageError::Limit(LimitError {
            field: "attachment.body",
            ..
        }))
    ));
    // A record naming another run is refused by the scope.
    assert_eq!(
        scope.stage_create_task(task(2, 10, None)).unwrap_err(),
        StageError::RunMismatch {
            scope: RunId(1),
            record: RunId(2)
        }
    );
}

#[test]
fn large_attachments_are_stored_by_reference_small_ones_inline() {
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits {
        inline_bytes_max: 16,
        attachment_bytes_max: 1_000,
        ..Limits::default()
    };
    let store = Store::open_with(
        dir.path().join("k.redb"),
        StoreConfig {
            limits,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    create_run(&store, 1);
    let scope = store.run(RunId(1));
    let big = "b".repeat(500);
    let mut t = task(1, 10, None);
    t.attachments = vec![
        Attachment {
            name: "small.txt".into(),
            body: AttachmentBody::Inline("tiny".into()),
        },
        Attachment {
            name: "big.txt".into(),
            body: AttachmentBody::Inline(big.clone()),
        },
    ];
    let applied = store
        .commit_one(scope.stage_create_task(t).unwrap(), Durability::Immediate)
        .unwrap();
    let Applied::TaskCreated { blobbed } = applied else {
        panic!("expected TaskCreated, got {applied:?}")
    };
    assert_eq!(blobbed.len(), 1);
    assert_eq!(blobbed[0].0, 1);
    let stored = scope.task(TaskId(10)).unwrap();
    assert_eq!(
        stored.attachments[0].body,
        AttachmentBody::Inline("tiny".into())
    );
    let AttachmentBody::Blob { key, len } = stored.attachments[1].body else {
        panic!("big attachment should be a blob reference")
    };
    assert_eq!(len, 500);
    assert_eq!(scope.blob(key).unwrap(), big.into_bytes());
    // Another run cannot read it by key.
    assert!(matches!(
        store.run(RunId(2)).blob(key),
        Err(ReadError::NotFound { what: "blob", .. })
    ));
    // Over the attachment maximum: refused, not truncated.
    let mut t = task(1, 11, None);
    t.attachments = vec![Attachment {
        name: "huge".into(),
        body: AttachmentBody::Inline("h".repeat(1_001)),
    }];
    assert!(matches!(
        scope.stage_create_task(t),
        Err(StageError::Limit(LimitError {
            field: "attachment.body",
            size: 1_001,
            limit: 1_000
        }))
    ));
    // A reference to a blob that does not exist in this run is refused at commit.
    let mut t = task(1, 12, None);
    t.attachments = vec![Attachment {
        name: "ghost".into(),
        body: AttachmentBody::Blob { key: 999, len: 3 },
    }];
    assert!(matches!(
        store.commit_one(scope.stage_create_task(t).unwrap(), Durability::Immediate),
        Err(CommitError::Item {
            error: ItemError::BlobNotFound(999),
            ..
        })
    ));
    // An explicit blob (an output stored by reference) gets the next key.
    let applied = store
        .commit_one(
            scope.stage_put_blob(b"output".to_vec()).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    assert_eq!(
        applied,
        Applied::BlobStored {
            key: key + 1,
            len: 6
        }
    );
}

#[test]
fn a_corrupt_row_is_a_typed_error_naming_table_and_key_and_loses_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    {
        let store = Store::open(&path).unwrap();
        create_run(&store, 1);
        create_task(&store, 1, 10, None);
        create_task(&store, 1, 11, None);
    }
    // Damage one task row behind the store's back, through redb directly.
    {
        use redb::ReadableDatabase as _;
        let db = redb::Database::create(&path).unwrap();
        let def: redb::TableDefinition<'_, (u128, u128), &[u8]> =
            redb::TableDefinition::new("tasks");
        let txn = db.begin_write().unwrap();
        txn.open_table(def)
            .unwrap()
            .insert((1u128, 11u128), [1u8, 0xff, 0xff, 0xff].as_slice())
            .unwrap();
        txn.commit().unwrap();
        drop(db.begin_read().unwrap());
    }
    let store = Store::open(&path).unwrap();
    let scope = store.run(RunId(1));
    match scope.task(TaskId(11)) {
        Err(ReadError::Decode(DecodeError::Corrupt { table, key, .. })) => {
            assert_eq!(table, "tasks");
            assert_eq!(key, format!("{}/{}", RunId(1), TaskId(11)));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert_eq!(scope.task(TaskId(10)).unwrap(), task(1, 10, None));
    assert_eq!(scope.get().unwrap(), run(1));
    // The store still takes writes.
    create_task(&store, 1, 12, None);
}

#[test]
fn a_store_from_a_newer_keel_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    drop(Store::open(&path).unwrap());
    {
        let db = redb::Database::create(&path).unwrap();
        let def: redb::TableDefinition<'_, &str, u64> = redb::TableDefinition::new("meta");
        let txn = db.begin_write().unwrap();
        txn.open_table(def)
            .unwrap()
            .insert("store_format", STORE_FORMAT + 1)
            .unwrap();
        txn.commit().unwrap();
    }
    assert!(matches!(
        Store::open(&path),
        Err(OpenError::StoreFromFuture {
            found: 7,
            supported: 6
        })
    ));
}
