//! An operator's cancels: of the run (`keel cancel RUN`) and of one step (`keel cancel TASK`,
//! most often a follow-up).
//!
//! A run whose own work is all done (a finished run reopened for a follow-up, or one a follow-up
//! joined after its plan ended) keeps what it produced: a cancel of it ends its open follow-ups and
//! the run ends again with a synthesis over every step, so its earlier outcome is never replaced
//! by "cancelled". Any other run ends `Cancelled`.

use super::staging::Then;
use super::step::encode_outcome;
use super::{Phase, RunState, StepStatus};
use crate::effect::Effect;
use crate::machine::Millis;
use crate::message::{SpecialistMsg, SupervisorMsg};
use crate::persist::PersistOp;
use crate::report::{FailureKind, StepOutcome, SubtaskFailure, TEXT_BYTES_MAX, bounded};
use keel_store::{ManifestEntry, ManifestOutcome, RunStatus, TaskId, TaskStatus};

impl RunState {
    /// An operator cancels the run (see the module docs for a run whose own work is done).
    pub(super) fn on_cancel(&mut self, reason: String, now: Millis, out: &mut Vec<Effect>) {
        if self.phase != Phase::Running {
            return;
        }
        let open_follow_ups: Vec<usize> = (0..self.steps.len())
            .filter(|&i| self.steps[i].thread.is_some() && self.steps[i].status != StepStatus::Done)
            .collect();
        let own_work_done = self
            .steps
            .iter()
            .filter(|s| s.thread.is_none())
            .all(|s| s.status == StepStatus::Done);
        if own_work_done && !open_follow_ups.is_empty() {
            self.decide(
                now,
                format_args!(
                    "cancel: the run's own work is done, so only its {} open follow-ups end; the run ends again with a synthesis ({})",
                    open_follow_ups.len(),
                    super::one_line(&reason)
                ),
            );
            for i in open_follow_ups {
                self.cancel_step(i, &reason, now, out);
            }
            return;
        }
        self.finish_with(
            RunStatus::Cancelled,
            format!("cancelled: {reason}"),
            now,
            out,
        );
    }

    /// An operator cancels one task's step (the task, an earlier task of its re-dispatch chain, or
    /// the id a queued follow-up will take): its attempt stops, its task ends `Cancelled`, and the
    /// run goes on (it ends with a synthesis once nothing else is open). The run's root task names
    /// the whole run.
    pub(super) fn on_cancel_task(
        &mut self,
        task: TaskId,
        reason: String,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        if task == self.root.id && self.lead.is_none() {
            self.on_cancel(reason, now, out);
            return;
        }
        let index = self.by_task.get(&task).copied().or_else(|| {
            self.steps
                .iter()
                .position(|s| s.requested_task == Some(task))
        });
        let open = index.is_some_and(|i| {
            !matches!(
                self.steps[i].status,
                StepStatus::Done | StepStatus::Committing
            )
        });
        match index {
            Some(i) if open && self.phase == Phase::Running => {
                self.cancel_step(i, &reason, now, out);
            }
            _ => self.decide(
                now,
                format_args!("cancel of task {task} ignored: not an open step of this running run"),
            ),
        }
    }

    /// End one open step as cancelled: its live attempt is told to stop and settled with the
    /// supervisor (a cancel is not a failure: no verdict, no retry), its spend charged, and its task
    /// row ends `Cancelled` (a step that never started is skipped instead), durably before the step
    /// counts as done.
    fn cancel_step(&mut self, index: usize, reason: &str, now: Millis, out: &mut Vec<Effect>) {
        let step = &self.steps[index];
        if matches!(step.status, StepStatus::Done | StepStatus::Committing) {
            return;
        }
        let key = step.spec.key.clone();
        if let Some(attempt) = step.current(self.id)
            && matches!(step.status, StepStatus::Admitting | StepStatus::Running)
        {
            self.to_specialist(
                attempt,
                SpecialistMsg::Cancel {
                    reason: reason.to_owned(),
                },
                out,
            );
            self.send(
                SupervisorMsg::Settle {
                    attempt,
                    spent_micros: step.spent_micros,
                    outcome: Ok(()),
                },
                out,
            );
        }
        let Some(task) = self.steps[index].current_task else {
            // Never started (a queued follow-up): skipped, as the checkpoint keeps it.
            self.skip(index, format!("cancelled: {reason}"), now, out);
            return;
        };
        let outcome = StepOutcome::Failed(SubtaskFailure {
            kind: FailureKind::Cancelled,
            attempted: format!("step {key}"),
            partial: Vec::new(),
            retryable: false,
            retry_after_ms: None,
            detail: bounded(
                format!("cancelled by an operator: {reason}"),
                TEXT_BYTES_MAX,
            ),
        });
        let mut ops = Vec::new();
        if let Some(t) = self.tasks.get_mut(&task) {
            t.status = TaskStatus::Cancelled;
            t.outcome = Some(encode_outcome(&outcome));
            t.updated_ms = now;
            ops.push(PersistOp::UpdateTask(t.clone()));
        }
        if self.charge(index, now) {
            ops.push(PersistOp::UpdateRun(self.row.clone()));
        }
        ops.push(PersistOp::AppendManifest(ManifestEntry {
            ts_ms: now,
            item: key.clone(),
            task_id: Some(task),
            outcome: ManifestOutcome::Failed {
                reason: bounded(format!("cancelled: {reason}"), TEXT_BYTES_MAX),
            },
        }));
        self.decide(
            now,
            format_args!("step {key} cancelled: {}", super::one_line(reason)),
        );
        self.steps[index].status = StepStatus::Committing;
        self.stage(
            ops,
            Then::Parked {
                step: index,
                outcome: Box::new(outcome),
            },
            true,
            now,
            out,
        );
    }
}
