//! Model routing: a derived task's model comes from its assignee's profile, never from its parent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::SplitMix64;
use keel_actors::routing::{DeriveError, derive_task, model_for};
use keel_store::{AgentProfile, RunId, Task, TaskId, TaskKind, TaskStatus};

fn profile(name: &str, model: &str) -> AgentProfile {
    AgentProfile {
        name: name.into(),
        description: String::new(),
        harness: "codex".into(),
        model: model.into(),
        account: String::new(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }
}

fn parent(model: &str) -> Task {
    Task {
        id: TaskId(1),
        run_id: RunId(9),
        parent: None,
        depth: 1,
        kind: TaskKind::Subtask,
        brief: "b".into(),
        goal: "g".into(),
        quality_criteria: Vec::new(),
        output_schema: None,
        assignee: Some("old".into()),
        model: Some(model.into()),
        observed: None,
        status: TaskStatus::Complete,
        attempt: 1,
        idempotency_key: None,
        outcome: None,
        attachments: Vec::new(),
        progress_notes: Vec::new(),
        created_ms: 0,
        updated_ms: 0,
    }
}

/// Derive a task of `kind` from a parent on `parent_model` for an assignee on `assignee_model`.
fn check(
    kind: TaskKind,
    parent_model: &str,
    assignee_model: &str,
    expected: Result<(&str, u8), DeriveError>,
) {
    let got = derive_task(
        &parent(parent_model),
        kind,
        &profile("new", assignee_model),
        "follow".into(),
        5,
        &mut SplitMix64(1),
    )
    .map(|t| {
        assert_eq!(t.parent, Some(TaskId(1)));
        assert_eq!(t.assignee.as_deref(), Some("new"));
        (t.model.unwrap(), t.depth)
    });
    assert_eq!(got, expected.map(|(m, d)| (m.to_string(), d)));
}

#[test]
fn derived_tasks_take_the_assignees_model() {
    check(
        TaskKind::FollowUp,
        "parent-model",
        "assignee-model",
        Ok(("assignee-model", 2)),
    );
    check(
        TaskKind::Review,
        "parent-model",
        "assignee-model",
        Ok(("assignee-model", 2)),
    );
    check(
        TaskKind::Redispatch,
        "parent-model",
        "assignee-model",
        Ok(("assignee-model", 1)),
    );
    check(
        TaskKind::Subtask,
        "p",
        "a",
        Err(DeriveError::NotDerived(TaskKind::Subtask)),
    );
    assert_eq!(model_for(&profile("x", "m")), "m");
}
