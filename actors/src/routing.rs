//! Model routing: a task's model comes from its assignee's profile, never from its parent
//! (docs/DESIGN.md §6, §12 invariant 6).
//!
//! The public anchor copied a parent's model into follow-ups, so a thread moved to another agent kept
//! running on the wrong model. Here the only input that can decide a model is the assignee's
//! [`AgentProfile`]: the parent is an input for links and depth, and its `model` field is never read.

use crate::ids::mint_task_id;
use crate::machine::{Entropy, Millis};
use keel_store::{AgentProfile, Task, TaskKind, TaskStatus};

/// The model a task assigned to `assignee` runs on.
pub fn model_for(assignee: &AgentProfile) -> &str {
    &assignee.model
}

/// Why a task could not be derived.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeriveError {
    /// Only follow-ups, reviews and re-dispatches are derived tasks.
    #[error("{0:?} is not a derived task kind")]
    NotDerived(TaskKind),
    /// The parent is already at the deepest depth a task may have.
    #[error("the parent is at depth {0}, the deepest a task may have")]
    TooDeep(u8),
}

/// A derived task (follow-up, review, re-dispatch, harness switch) of `parent`, assigned to `assignee`.
/// Its model is resolved from the assignee's profile; the parent's model is deliberately not read.
///
/// # Errors
/// [`DeriveError`] when `kind` is not a derived kind, or the parent's depth cannot grow.
pub fn derive_task(
    parent: &Task,
    kind: TaskKind,
    assignee: &AgentProfile,
    brief: String,
    now: Millis,
    rng: &mut dyn Entropy,
) -> Result<Task, DeriveError> {
    if !matches!(
        kind,
        TaskKind::FollowUp | TaskKind::Review | TaskKind::Redispatch
    ) {
        return Err(DeriveError::NotDerived(kind));
    }
    // A re-dispatch continues its parent at the same depth; follow-ups and reviews nest one deeper.
    let depth = if kind == TaskKind::Redispatch {
        parent.depth
    } else {
        parent
            .depth
            .checked_add(1)
            .ok_or(DeriveError::TooDeep(parent.depth))?
    };
    Ok(Task {
        id: mint_task_id(now, rng),
        run_id: parent.run_id,
        parent: Some(parent.id),
        depth,
        kind,
        brief,
        goal: parent.goal.clone(),
        quality_criteria: parent.quality_criteria.clone(),
        output_schema: parent.output_schema.clone(),
        assignee: Some(assignee.name.clone()),
        model: Some(model_for(assignee).to_string()),
        observed: None,
        status: TaskStatus::Pending,
        attempt: 1,
        idempotency_key: None,
        outcome: None,
        attachments: Vec::new(),
        progress_notes: Vec::new(),
        created_ms: now,
        updated_ms: now,
    })
}
