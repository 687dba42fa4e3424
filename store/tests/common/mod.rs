//! Builders that read like the records they make, shared by the store's integration tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use keel_store::*;

pub fn open_temp() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("keel.redb")).unwrap();
    (dir, store)
}

pub fn run(id: u128) -> Run {
    Run {
        id: RunId(id),
        brief: format!("brief of run {id}"),
        plan: None,
        status: RunStatus::Running,
        budget: Budget {
            limit_micros: Some(5_000_000),
            reserved_micros: 0,
            spent_micros: 0,
        },
        created_ms: 1_000,
        updated_ms: 1_000,
        config_snapshot: "agents: v1".into(),
        outcome: None,
    }
}

pub fn task(run: u128, id: u128, parent: Option<u128>) -> Task {
    Task {
        id: TaskId(id),
        run_id: RunId(run),
        parent: parent.map(TaskId),
        depth: u8::from(parent.is_some()),
        kind: if parent.is_some() {
            TaskKind::Subtask
        } else {
            TaskKind::Root
        },
        brief: format!("task {id} of run {run}"),
        goal: "find out".into(),
        quality_criteria: vec!["cite sources".into()],
        output_schema: None,
        assignee: Some("researcher".into()),
        model: Some("model-a".into()),
        observed: None,
        status: TaskStatus::Pending,
        attempt: 1,
        idempotency_key: None,
        outcome: None,
        attachments: Vec::new(),
        progress_notes: Vec::new(),
        created_ms: 2_000,
        updated_ms: 2_000,
    }
}

pub fn log_row(n: u64) -> SessionLogRow {
    SessionLogRow {
        ts_ms: 10_000 + n,
        kind: LogKind::Text,
        summary: format!("row {n}"),
        detail: format!("detail of row {n}"),
        redactions: Vec::new(),
    }
}

pub fn manifest(item: &str) -> ManifestEntry {
    ManifestEntry {
        ts_ms: 3_000,
        item: item.into(),
        task_id: None,
        outcome: ManifestOutcome::Processed,
    }
}

pub fn idem(key: &str, effect: &str) -> IdempotencyRecord {
    IdempotencyRecord {
        key: key.into(),
        ts_ms: 4_000,
        task_id: None,
        effect: effect.into(),
        result: None,
    }
}

/// Creates a run (and optionally tasks without parents) durably.
pub fn create_run(store: &Store, id: u128) {
    let scope = store.run(RunId(id));
    store
        .commit_one(
            scope.stage_create_run(run(id)).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
}

pub fn create_task(store: &Store, run: u128, id: u128, parent: Option<u128>) {
    let scope = store.run(RunId(run));
    store
        .commit_one(
            scope.stage_create_task(task(run, id, parent)).unwrap(),
            Durability::Immediate,
        )
        .unwrap();
}
