//! A task's state in its own table (store format 3): an update that keeps the once-written fields
//! writes only the state, every reader sees every field of the newest state, an update that changes
//! a once-written field rewrites the row, and a format-2 store is read as it is and upgraded.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use keel_store::*;
use redb::{ReadableDatabase, TableDefinition};

const TASKS: TableDefinition<'_, (u128, u128), &[u8]> = TableDefinition::new("tasks");
const STATES: TableDefinition<'_, (u128, u128), &[u8]> = TableDefinition::new("task_states");

/// A task as a specialist's result leaves it: every field that changes after creation changed.
fn finished(t: &Task) -> Task {
    Task {
        assignee: Some("reviewer".into()),
        model: Some("model-b".into()),
        observed: Some(ObservedSession {
            harness: "scripted".into(),
            account: "bench".into(),
            native_session_id: "s-1".into(),
        }),
        status: TaskStatus::Complete,
        attempt: 2,
        idempotency_key: Some("k-2".into()),
        outcome: Some("a report ".repeat(40)),
        attachments: vec![Attachment {
            name: "notes".into(),
            body: AttachmentBody::Inline("short".into()),
        }],
        progress_notes: vec!["half way".into()],
        updated_ms: 9_000,
        ..t.clone()
    }
}

fn update(store: &Store, t: &Task) {
    let scope = store.run(t.run_id);
    store
        .commit_one(
            scope.stage_update_task(t.clone()).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
}

/// The bytes of the task's row and of its state row, read with redb directly.
fn raw_rows(path: &std::path::Path, t: &Task) -> (Vec<u8>, Option<Vec<u8>>) {
    let db = redb::Database::open(path).unwrap();
    let txn = db.begin_read().unwrap();
    let key = (t.run_id.0, t.id.0);
    let row = txn
        .open_table(TASKS)
        .unwrap()
        .get(key)
        .unwrap()
        .unwrap()
        .value()
        .to_vec();
    let state = txn
        .open_table(STATES)
        .unwrap()
        .get(key)
        .unwrap()
        .map(|g| g.value().to_vec());
    (row, state)
}

fn every_reader_sees(store: &Store, want: &[Task]) {
    let run = want[0].run_id;
    let scope = store.run(run);
    let catalog = store.catalog();
    for t in want {
        assert_eq!(&scope.task(t.id).unwrap(), t);
        assert_eq!(&catalog.task(t.id).unwrap(), t);
    }
    assert_eq!(scope.tasks(None, 100).unwrap().items, want);
    assert_eq!(catalog.tasks(Some(run), 100).unwrap().items, want);
    assert_eq!(catalog.tasks(None, 100).unwrap().items, want);
    let tree: Vec<Task> = catalog
        .tree(run, 100)
        .unwrap()
        .items
        .into_iter()
        .map(|n| n.task)
        .collect();
    assert_eq!(tree, want);
    assert_eq!(scope.children(want[0].id, 100).unwrap().items, &want[1..]);
    assert_eq!(catalog.children(want[0].id, 100).unwrap().items, &want[1..]);
}

#[test]
fn an_update_of_the_state_leaves_the_row_and_every_reader_sees_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let store = Store::open(&path).unwrap();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    create_task(&store, 1, 11, Some(10));
    create_task(&store, 1, 12, Some(10));
    let scope = store.run(RunId(1));
    let mut big = task(1, 13, Some(10));
    big.brief = "a long brief with its context ".repeat(15);
    store
        .commit_one(
            scope.stage_create_task(big.clone()).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
    drop(store);
    let (created, none) = raw_rows(&path, &big);
    assert!(none.is_none(), "a task never updated has no state row");

    let store = Store::open(&path).unwrap();
    let done = finished(&big);
    update(&store, &done);
    let running = Task {
        status: TaskStatus::Running,
        ..task(1, 11, Some(10))
    };
    update(&store, &running);
    let want = vec![
        task(1, 10, None),
        running,
        task(1, 12, Some(10)),
        done.clone(),
    ];
    every_reader_sees(&store, &want);
    drop(store);

    let (row, state) = raw_rows(&path, &big);
    assert_eq!(row, created, "the once-written row is not rewritten");
    let state = state.unwrap();
    let whole = codec::encode("tasks", &done).unwrap();
    // What the update wrote: the state, without the brief (about 450 bytes here), not the row.
    assert!(
        state.len() + big.brief.len() <= whole.len(),
        "state {} bytes, whole row {} bytes",
        state.len(),
        whole.len()
    );
    assert!(whole.ends_with(&state[1..]), "the state is the row's tail");
}

#[test]
fn an_update_of_a_once_written_field_rewrites_the_row_and_drops_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let store = Store::open(&path).unwrap();
    create_run(&store, 1);
    create_task(&store, 1, 10, None);
    let first = finished(&task(1, 10, None));
    update(&store, &first);
    let rebriefed = Task {
        brief: "another brief".into(),
        status: TaskStatus::Running,
        ..first
    };
    update(&store, &rebriefed);
    assert_eq!(store.run(RunId(1)).task(TaskId(10)).unwrap(), rebriefed);
    // A parent still may not change.
    let moved = Task {
        parent: Some(TaskId(99)),
        ..rebriefed.clone()
    };
    let err = store
        .commit_one(
            store.run(RunId(1)).stage_update_task(moved).unwrap(),
            Durability::Immediate,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            CommitError::Item {
                error: ItemError::ParentChanged { .. },
                ..
            }
        ),
        "{err:?}"
    );
    drop(store);
    let (row, state) = raw_rows(&path, &rebriefed);
    assert!(state.is_none(), "a rewritten row holds the state itself");
    assert_eq!(row, codec::encode("tasks", &rebriefed).unwrap());
}

/// Writes a format-2 store with redb directly: whole task rows, no state table.
fn format_2_store(path: &std::path::Path, tasks: &[Task]) {
    let db = redb::Database::create(path).unwrap();
    let meta: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
    let runs: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("runs");
    let open: TableDefinition<'_, u128, ()> = TableDefinition::new("open_runs");
    let task_run: TableDefinition<'_, u128, u128> = TableDefinition::new("task_run");
    let children: TableDefinition<'_, (u128, u128, u128), ()> =
        TableDefinition::new("task_children");
    let txn = db.begin_write().unwrap();
    txn.open_table(meta)
        .unwrap()
        .insert("store_format", 2)
        .unwrap();
    {
        let r = run(1);
        let bytes = codec::encode("runs", &r).unwrap();
        txn.open_table(runs)
            .unwrap()
            .insert(1, bytes.as_slice())
            .unwrap();
        txn.open_table(open).unwrap().insert(1, ()).unwrap();
        let mut rows = txn.open_table(TASKS).unwrap();
        let mut located = txn.open_table(task_run).unwrap();
        let mut index = txn.open_table(children).unwrap();
        for t in tasks {
            let bytes = codec::encode("tasks", t).unwrap();
            rows.insert((1, t.id.0), bytes.as_slice()).unwrap();
            located.insert(t.id.0, 1).unwrap();
            if let Some(p) = t.parent {
                index.insert((1, p.0, t.id.0), ()).unwrap();
            }
        }
    }
    txn.commit().unwrap();
}

#[test]
fn a_format_2_store_is_read_as_it_is_and_upgraded_on_its_first_writable_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.redb");
    let tasks = vec![
        task(1, 10, None),
        finished(&task(1, 11, Some(10))),
        task(1, 12, Some(10)),
    ];
    format_2_store(&path, &tasks);

    let reader = Store::open_read_only(&path, StoreConfig::default()).unwrap();
    every_reader_sees(&reader, &tasks);
    drop(reader);

    let store = Store::open(&path).unwrap();
    every_reader_sees(&store, &tasks);
    let mut want = tasks.clone();
    want[2] = finished(&tasks[2]);
    update(&store, &want[2]);
    every_reader_sees(&store, &want);
    drop(store);
    let db = redb::Database::open(&path).unwrap();
    let meta: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
    let format = db
        .begin_read()
        .unwrap()
        .open_table(meta)
        .unwrap()
        .get("store_format")
        .unwrap()
        .unwrap()
        .value();
    assert_eq!(format, STORE_FORMAT);
    drop(db);
    let (row, state) = raw_rows(&path, &want[2]);
    assert_eq!(row, codec::encode("tasks", &tasks[2]).unwrap());
    assert!(state.is_some());
}
