//! A task's state row (store format 3): what changes in a task after its creation, kept apart from
//! the once-written part of its row.
//!
//! Why: a specialist's task row is written when it is admitted and again when its result is made
//! durable; the second write changed only its status, outcome and times, yet re-encoded the whole
//! row, brief included (a brief with its context is most of a row: about 950 bytes a specialist of
//! `keel bench`, of which about 560 unchanged). Now an update whose once-written fields are those of
//! the stored row writes only the state, into `task_states`; a reader puts the state over the row.
//!
//! The state is the tail of a [`Task`]'s own encoding (its fields from `assignee` on, in the same
//! order), so the head/state line is the same in the row and in the state: a state decoded from the
//! `task_states` table replaces exactly the fields a full row's tail holds.

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::error::ReadError;
use crate::model::{Attachment, ObservedSession, RunId, Task, TaskId, TaskKind, TaskStatus};
use crate::snapshot::{Snapshot, View};
use crate::tables::{self, Row, name};

/// The fields of a task that change after its creation, in [`Task`]'s order (its encoding's tail).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskState {
    assignee: Option<String>,
    model: Option<String>,
    observed: Option<ObservedSession>,
    status: TaskStatus,
    attempt: u32,
    idempotency_key: Option<String>,
    outcome: Option<String>,
    attachments: Vec<Attachment>,
    progress_notes: Vec<String>,
    created_ms: u64,
    updated_ms: u64,
}

impl codec::Record for TaskState {}

impl TaskState {
    /// Puts this state over a task read from its row.
    fn apply(self, task: &mut Task) {
        task.assignee = self.assignee;
        task.model = self.model;
        task.observed = self.observed;
        task.status = self.status;
        task.attempt = self.attempt;
        task.idempotency_key = self.idempotency_key;
        task.outcome = self.outcome;
        task.attachments = self.attachments;
        task.progress_notes = self.progress_notes;
        task.created_ms = self.created_ms;
        task.updated_ms = self.updated_ms;
    }
}

/// A task's state by reference, encoded exactly as [`TaskState`] decodes (serde encodes a
/// reference as the value), so an update encodes its state without copying it.
#[derive(Serialize)]
pub(crate) struct StateOf<'a> {
    assignee: &'a Option<String>,
    model: &'a Option<String>,
    observed: &'a Option<ObservedSession>,
    status: TaskStatus,
    attempt: u32,
    idempotency_key: &'a Option<String>,
    outcome: &'a Option<String>,
    attachments: &'a [Attachment],
    progress_notes: &'a [String],
    created_ms: u64,
    updated_ms: u64,
}

impl<'a> StateOf<'a> {
    pub(crate) fn of(task: &'a Task) -> Self {
        // Every field named, none by `..`: a field added to `Task` does not compile here until it
        // is placed in the head (`TaskHead`) or the state, so no update can drop it unnoticed.
        let Task {
            id: _,
            run_id: _,
            parent: _,
            depth: _,
            kind: _,
            brief: _,
            goal: _,
            quality_criteria: _,
            output_schema: _,
            assignee,
            model,
            observed,
            status,
            attempt,
            idempotency_key,
            outcome,
            attachments,
            progress_notes,
            created_ms,
            updated_ms,
        } = task;
        Self {
            assignee,
            model,
            observed,
            status: *status,
            attempt: *attempt,
            idempotency_key,
            outcome,
            attachments,
            progress_notes,
            created_ms: *created_ms,
            updated_ms: *updated_ms,
        }
    }
}

/// The once-written fields of a task, in [`Task`]'s order (its encoding's head): what an update
/// compares with the stored row to know whether the state alone can be written.
#[derive(Debug, PartialEq, Eq, Deserialize)]
pub(crate) struct TaskHead {
    id: TaskId,
    run_id: RunId,
    /// The parent: an update may not change it.
    pub(crate) parent: Option<TaskId>,
    depth: u8,
    kind: TaskKind,
    brief: String,
    goal: String,
    quality_criteria: Vec<String>,
    output_schema: Option<String>,
}

impl TaskHead {
    /// Whether `task`'s once-written fields are these.
    pub(crate) fn same_as(&self, task: &Task) -> bool {
        // Every field named (see `StateOf::of`): a new head field must be compared here.
        let Task {
            id,
            run_id,
            parent,
            depth,
            kind,
            brief,
            goal,
            quality_criteria,
            output_schema,
            assignee: _,
            model: _,
            observed: _,
            status: _,
            attempt: _,
            idempotency_key: _,
            outcome: _,
            attachments: _,
            progress_notes: _,
            created_ms: _,
            updated_ms: _,
        } = task;
        self.id == *id
            && self.run_id == *run_id
            && self.parent == *parent
            && self.depth == *depth
            && self.kind == *kind
            && self.brief == *brief
            && self.goal == *goal
            && self.quality_criteria == *quality_criteria
            && self.output_schema == *output_schema
    }
}

/// The state table of a read, to put each task's newest state over its row. Absent in a format-2
/// store opened read-only, whose rows are whole.
pub(crate) struct States<'s>(Option<View<'s, tables::RunPair, Row>>);

impl<'s> States<'s> {
    pub(crate) fn open(txn: &'s Snapshot<'_>) -> Result<Self, ReadError> {
        crate::read::table_if_any(txn, tables::TASK_STATES).map(Self)
    }

    /// The task with its newest state (a task never updated since its creation keeps its row's).
    pub(crate) fn attach(&self, mut task: Task) -> Result<Task, ReadError> {
        if let Some(table) = &self.0
            && let Some(g) = table.get((task.run_id.0, task.id.0))?
        {
            let state: TaskState = codec::decode(
                name::TASK_STATES,
                &format_args!("{}/{}", task.run_id, task.id),
                g.value(),
            )?;
            state.apply(&mut task);
        }
        Ok(task)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;
    use crate::model::AttachmentBody;

    fn task() -> Task {
        Task {
            id: TaskId(7),
            run_id: RunId(3),
            parent: Some(TaskId(5)),
            depth: 1,
            kind: TaskKind::Subtask,
            brief: "a brief".into(),
            goal: "a goal".into(),
            quality_criteria: vec!["cited".into()],
            output_schema: Some("{}".into()),
            assignee: Some("writer".into()),
            model: Some("m".into()),
            observed: Some(ObservedSession {
                harness: "scripted".into(),
                account: "a".into(),
                native_session_id: "n".into(),
            }),
            status: TaskStatus::Complete,
            attempt: 2,
            idempotency_key: Some("k".into()),
            outcome: Some("done".into()),
            attachments: vec![Attachment {
                name: "x".into(),
                body: AttachmentBody::Blob { key: 9, len: 10 },
            }],
            progress_notes: vec!["half".into()],
            created_ms: 11,
            updated_ms: 12,
        }
    }

    /// The state is the tail of the row: a row's bytes are its head's then its state's, so the
    /// head/state line is the same in both tables.
    #[test]
    fn a_row_is_its_head_then_its_state() {
        let t = task();
        let row = codec::encode("t", &t).unwrap();
        let state = codec::encode("s", &StateOf::of(&t)).unwrap();
        assert!(row.ends_with(&state[1..]), "the state is the row's tail");
        let head: TaskHead = codec::decode_prefix("t", &"k", &row).unwrap();
        assert!(head.same_as(&t));
        assert_eq!(head.parent, Some(TaskId(5)));
        let mut other = t.clone();
        other.brief.push('!');
        assert!(!head.same_as(&other));
    }

    /// Every field of the state comes back over a stale row.
    #[test]
    fn a_state_replaces_every_changing_field() {
        let new = task();
        let mut stale = Task {
            assignee: None,
            model: None,
            observed: None,
            status: TaskStatus::Pending,
            attempt: 1,
            idempotency_key: None,
            outcome: None,
            attachments: Vec::new(),
            progress_notes: Vec::new(),
            created_ms: 1,
            updated_ms: 1,
            ..new.clone()
        };
        let bytes = codec::encode("s", &StateOf::of(&new)).unwrap();
        let state: TaskState = codec::decode("s", &"k", &bytes).unwrap();
        state.apply(&mut stale);
        assert_eq!(stale, new);
    }
}
