//! `keel context` over a real redb store: the report read through the store is the very report built
//! from the same rows in memory, for both kinds of session, and a missing task is a typed error.

use keel_actors::Continuity;
use keel_actors::context::{
    ContextConfig, ContextError, LoadError, RowSet, Scrubber, context_for_task, context_from_store,
};
use keel_store::{
    Budget, Durability, LogKind, Run, RunId, RunStatus, SessionLogRow, Store, Task, TaskId,
    TaskKind, TaskStatus, WriteBatch,
};

fn run(id: u128) -> Run {
    Run {
        id: RunId(id),
        brief: "run".into(),
        plan: None,
        status: RunStatus::Running,
        budget: Budget::default(),
        created_ms: 1,
        updated_ms: 1,
        config_snapshot: String::new(),
        outcome: None,
    }
}

fn task(run: u128, id: u128, parent: Option<u128>, kind: TaskKind, brief: &str) -> Task {
    Task {
        id: TaskId(id),
        run_id: RunId(run),
        parent: parent.map(TaskId),
        depth: 0,
        kind,
        brief: brief.into(),
        goal: String::new(),
        quality_criteria: vec![],
        output_schema: None,
        assignee: None,
        model: None,
        observed: None,
        status: TaskStatus::Complete,
        attempt: 1,
        idempotency_key: None,
        outcome: Some(format!(
            "outcome of {id}: used ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6"
        )),
        attachments: vec![],
        progress_notes: vec![format!("note of {id}")],
        created_ms: 1,
        updated_ms: 1,
    }
}

#[test]
fn keel_context_reads_the_store_exactly_as_the_rows_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("keel.redb")).unwrap();
    let scope = store.run(RunId(1));
    let mut tasks = vec![task(
        1,
        1,
        None,
        TaskKind::Root,
        "/plan the port\nof the parser",
    )];
    for n in 2..=7 {
        tasks.push(task(
            1,
            n,
            Some(n - 1),
            TaskKind::FollowUp,
            &format!("follow-up {n}"),
        ));
    }
    let mut paused = task(
        1,
        8,
        Some(7),
        TaskKind::Subtask,
        "/port module 8\nkeep the API",
    );
    paused.status = TaskStatus::Paused;
    tasks.push(paused);
    let mut again = task(1, 9, Some(8), TaskKind::Redispatch, "resume of 8");
    again.status = TaskStatus::Pending;
    tasks.push(again);

    let mut batch = WriteBatch::new();
    batch.push(scope.stage_create_run(run(1)).unwrap());
    let mut memory = RowSet::default();
    for t in &tasks {
        batch.push(scope.stage_create_task(t.clone()).unwrap());
        memory.put_task(t.clone());
    }
    for i in 0..70u64 {
        let r = SessionLogRow {
            ts_ms: i,
            kind: if i % 9 == 0 {
                LogKind::Steering
            } else {
                LogKind::ToolUse
            },
            summary: format!("Edit src/m{i}.rs"),
            detail: String::new(),
            redactions: Vec::new(),
        };
        batch.push(scope.stage_append_log(TaskId(8), r.clone()).unwrap());
        memory.append_log(TaskId(8), r);
    }
    store.commit_group(batch, Durability::Immediate).unwrap();

    let config = ContextConfig::default();
    let scrubber = Scrubber::new();
    for (id, start) in [
        (7, Continuity::Standard { parent: TaskId(6) }),
        (8, Continuity::Resume { from: TaskId(8) }),
        (9, Continuity::Resume { from: TaskId(8) }),
        (1, Continuity::Fresh),
    ] {
        let from_store = context_from_store(&store, TaskId(id), start, &config, &scrubber).unwrap();
        let from_memory = context_for_task(&memory, TaskId(id), start, &config, &scrubber).unwrap();
        assert_eq!(from_store, from_memory, "task {id} {start:?}");
        assert!(!from_store.prompt.contains("ghp_"));
    }
    // The re-dispatch resumes with the paused task's brief, its skill line first.
    let report = context_from_store(
        &store,
        TaskId(9),
        Continuity::Resume { from: TaskId(8) },
        &config,
        &scrubber,
    )
    .unwrap();
    assert!(
        report
            .prompt
            .starts_with("/port module 8\n<keel-context kind=\"resume\"")
    );
    assert!(
        report
            .prompt
            .contains("/port module 8\nkeep the API\n## Last session steps")
    );
    // Steering rows are kept apart from the steps: 62 steps in the log, the last 50 shown; 8 steering.
    let p = report.preamble.unwrap();
    assert_eq!(p.text.matches("\n- tool_use: ").count(), 50);
    assert!(p.text.contains(
        "## Steering messages (oldest first)\n- Edit src/m0.rs\n- Edit src/m9.rs\n- Edit src/m18.rs"
    ));
    assert!(!p.text.contains("- tool_use: Edit src/m9.rs"));
}

#[test]
fn keel_context_of_an_unknown_task_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("keel.redb")).unwrap();
    let err = context_from_store(
        &store,
        TaskId(42),
        Continuity::Fresh,
        &ContextConfig::default(),
        &Scrubber::new(),
    )
    .unwrap_err();
    assert!(matches!(err, ContextError::Load(LoadError::TaskNotFound(t)) if t == TaskId(42)));
    let bad = ContextConfig {
        standard_tokens_max: 10,
        ..ContextConfig::default()
    };
    let err = context_from_store(
        &store,
        TaskId(42),
        Continuity::Fresh,
        &bad,
        &Scrubber::new(),
    )
    .unwrap_err();
    assert!(matches!(err, ContextError::Config(_)), "{err}");
}
