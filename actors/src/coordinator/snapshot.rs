//! The coordinator's snapshot, kept in the run's checkpoint row, and the checkpoint row itself.

use super::{RunState, SNAPSHOT_VERSION, StepStatus};
use crate::machine::Millis;
use crate::plan::PlanStep;
use crate::report::{StepOutcome, SubtaskFailure};
use keel_store::{Checkpoint, TaskId};
use serde::{Deserialize, Serialize};

/// The coordinator's snapshot, serialized (JSON) into `Checkpoint::state`. Task rows stay the truth
/// for outcomes; the snapshot says which tasks belong to which step and how far the attempts went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_VERSION`].
    pub version: u8,
    /// The run's root task.
    pub root: TaskId,
    /// Whether the run is led by an agent (steps beyond the first are its delegations).
    pub lead: bool,
    /// One entry per step, in step order.
    pub steps: Vec<StepSnapshot>,
}

/// One step in a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSnapshot {
    /// The step as asked for, for steps that are not in the run's plan (a lead's delegations,
    /// follow-ups); `None` for plan steps, which come back from the run row's plan. Keeping plan steps
    /// out makes a checkpoint cheap to write after every decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PlanStep>,
    /// Its tasks, oldest first (re-dispatches add one each).
    pub tasks: Vec<TaskId>,
    /// The current attempt number of the newest task.
    pub attempt: u32,
    /// Attempts across all its tasks, interrupted ones included.
    pub attempts_total: u32,
    /// Attempts that failed: what the retry budget counts (absent in checkpoints written before it
    /// was kept, which count none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub failures: u32,
    /// The step's newest failure, restored with it (a step parked after a recovery says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<SubtaskFailure>,
    /// The agent the next attempt asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The account the next attempt asks for, after a rate limit moved the step to it (absent in
    /// checkpoints written before accounts were switched, and when the profile's account is used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Set when the step was skipped (no task ever ran it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// For a follow-up: the task whose thread it continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<TaskId>,
    /// For a lead's delegation: the lead's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<String>,
    /// For a lead's delegation: the run-wide number of the delegation turn that asked for it, counted
    /// over every session of the lead (absent in checkpoints written before it was kept: a lead
    /// recovered from one counts one turn per delegated step as used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    /// For a follow-up: the task id the host chose for it (kept so a follow-up queued before a
    /// crash still takes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<TaskId>,
}

/// Whether a count is zero: such a field is left out of the snapshot's JSON (every field that is
/// left out when empty reads back as empty, in this build and in older ones, so a checkpoint of a
/// plan's steps carries only what differs from a step's start).
fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RunState {
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            root: self.root.id,
            lead: self.lead.is_some(),
            steps: self
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| StepSnapshot {
                    spec: (i >= self.plan_len).then(|| s.spec.clone()),
                    tasks: s.task_history.clone(),
                    attempt: s.attempt,
                    attempts_total: s.attempts_total,
                    failures: s.failures,
                    last_failure: s.last_failure.clone(),
                    agent: s.agent.clone(),
                    account: s.account.clone(),
                    skipped: match &s.outcome {
                        Some(StepOutcome::Skipped { reason }) => Some(reason.clone()),
                        _ => None,
                    },
                    thread: s.thread,
                    preset: s.requested_task,
                    call_id: s.call_id.clone(),
                    turn: s.turn,
                })
                .collect(),
        }
    }

    pub(super) fn checkpoint_row(&self, now: Millis) -> Checkpoint {
        // A step whose outcome is being committed counts as done: its stage was sent in an earlier
        // input or in this one (whose stages commit together), so it is durable whenever this
        // checkpoint is (the run's end rides with the last result).
        let done =
            |s: &&super::step::Step| matches!(s.status, StepStatus::Done | StepStatus::Committing);
        let verified = self
            .steps
            .iter()
            .filter(done)
            .filter_map(|s| s.current_task)
            .collect();
        let pending = self
            .steps
            .iter()
            .filter(|s| !done(s))
            .filter_map(|s| s.current_task)
            .collect();
        let last = self
            .steps
            .iter()
            .rev()
            .find(done)
            .map(|s| s.spec.key.clone());
        Checkpoint {
            run_id: self.id,
            last_completed_step: last,
            verified_outputs: verified,
            pending_work: pending,
            correlation_id: format!("{}/{}", self.id, self.next_ticket),
            state: serde_json::to_string(&self.snapshot()).unwrap_or_default(),
            written_ms: now,
        }
    }
}
