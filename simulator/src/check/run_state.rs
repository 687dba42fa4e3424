//! Checks on a run's state under pause, crash, cancel and follow-up (issue 17): a cancelled step
//! starts nothing more (invariant 14), a cancel never replaces a finished run's outcome (16), a
//! step's retries count its failures only (17), and a follow-up whose id was announced is never
//! lost (1).

use std::collections::{BTreeMap, BTreeSet};

use keel_actors::{AttemptId, PersistOp, SupervisorMsg};
use keel_store::{RunId, RunStatus, TaskId};

use super::Checker;
use crate::violation::Invariant;

/// The reason a coordinator parks a step whose retry budget is spent starts so
/// (`coordinator/step.rs`).
pub const RETRY_BUDGET_SPENT: &str = "retry budget spent";

/// What the checker keeps for these checks.
#[derive(Debug, Default)]
pub(super) struct RunStateChecks {
    /// Steps whose cancel took effect (invariant 14), by (run, step key).
    cancelled_steps: BTreeSet<(RunId, String)>,
    /// The step each admitted attempt works on.
    step_of_attempt: BTreeMap<AttemptId, String>,
    /// Per (run, step), the attempts that failed as the coordinator was told: a failure it settled
    /// with the supervisor, or an attempt the supervisor lost (invariant 17).
    failed: BTreeMap<(RunId, String), BTreeSet<AttemptId>>,
    /// `attempts_per_step_max` of the coordinators.
    attempts_per_step_max: u32,
}

impl RunStateChecks {
    pub(super) fn new(attempts_per_step_max: u32) -> Self {
        Self {
            attempts_per_step_max,
            ..Self::default()
        }
    }
}

impl Checker {
    /// A cancel of one step of `run` took effect (sent to its coordinator while the step was open,
    /// or written to the store): the step starts no new attempt from now on.
    pub fn step_cancel_requested(&mut self, run: RunId, step: String) {
        self.observed.step_cancels.push((run, step.clone()));
        self.run_state.cancelled_steps.insert((run, step));
    }

    /// The steps of `run` whose cancel the checker holds the world to.
    pub fn cancelled_steps(&self) -> Vec<(RunId, String)> {
        self.run_state.cancelled_steps.iter().cloned().collect()
    }

    /// A step cancel did not take (the coordinator went down before it was durable).
    pub fn step_cancel_withdrawn(&mut self, run: RunId, step: &str) {
        self.run_state
            .cancelled_steps
            .remove(&(run, step.to_owned()));
    }

    /// A spawn of `step` of `run` is about to be sent (invariant 14, for one step).
    pub(super) fn spawn_after_step_cancel(&mut self, event: u64, attempt: AttemptId, step: &str) {
        if self
            .run_state
            .cancelled_steps
            .contains(&(attempt.run, step.to_owned()))
        {
            self.fail(
                event,
                Invariant::CancelStartsNothing,
                format!(
                    "step {step} of run {} was cancelled but its coordinator spawned {attempt}",
                    attempt.run
                ),
            );
        }
    }

    /// The coordinator asked the supervisor to admit `attempt` of `step`.
    pub(super) fn admitted_step(&mut self, attempt: AttemptId, step: &str) {
        self.run_state
            .step_of_attempt
            .insert(attempt, step.to_owned());
    }

    /// A message between the coordinator node's machines that tells of a failed attempt: a
    /// coordinator settling a failure, or the supervisor telling a coordinator it lost one.
    pub(super) fn failure_told(&mut self, attempt: AttemptId) {
        let Some(step) = self.run_state.step_of_attempt.get(&attempt).cloned() else {
            return;
        };
        self.run_state
            .failed
            .entry((attempt.run, step))
            .or_default()
            .insert(attempt);
    }

    /// Whether `msg` to the supervisor settles a failure.
    pub(super) fn settles_failure(msg: &SupervisorMsg) -> Option<AttemptId> {
        match msg {
            SupervisorMsg::Settle {
                attempt,
                outcome: Err(_),
                ..
            } => Some(*attempt),
            _ => None,
        }
    }

    /// One persisted op of `run` (invariants 16 and 17).
    pub(super) fn persisted(&mut self, event: u64, run: RunId, op: &PersistOp) {
        match op {
            PersistOp::UpdateRun(row) if row.status == RunStatus::Cancelled => {
                let ended = self.observed.run_finished.get(&row.id).map(|(s, _)| *s);
                if let Some(status @ (RunStatus::Completed | RunStatus::Failed)) = ended {
                    self.fail(
                        event,
                        Invariant::CancelKeepsOutcome,
                        format!(
                            "run {} ended {status:?} and a later write marks it cancelled ({:?})",
                            row.id, row.outcome
                        ),
                    );
                }
            }
            PersistOp::AppendDeadLetter(letter)
                if letter.reason.starts_with(RETRY_BUDGET_SPENT) =>
            {
                let step = letter
                    .subject
                    .strip_prefix("step ")
                    .unwrap_or(&letter.subject)
                    .to_owned();
                let failed = self
                    .run_state
                    .failed
                    .get(&(run, step.clone()))
                    .map_or(0, BTreeSet::len);
                self.observed
                    .parked_for_retries
                    .push((run, step.clone(), failed));
                let max = self.run_state.attempts_per_step_max as usize;
                if failed < max {
                    self.fail(
                        event,
                        Invariant::RetriesCountFailures,
                        format!(
                            "step {step} of run {run} was parked for a spent retry budget after {failed} failed attempts (the limit is {max}): {}",
                            letter.reason
                        ),
                    );
                }
            }
            _ => {}
        }
    }

    /// A follow-up's id was announced (it is durable, as `Runtime::follow_up` returns it).
    pub fn follow_up_announced(&mut self, run: RunId, task: TaskId) {
        self.observed.follow_ups_announced.push((run, task));
    }

    /// At the end: every announced follow-up is still durable, a task row or a step of its run's
    /// checkpoint (invariant 1). `lost` holds those that are not.
    pub fn announced_follow_ups_kept(&mut self, event: u64, lost: &[(RunId, TaskId)]) {
        if let Some((run, task)) = lost.first() {
            self.fail(
                event,
                Invariant::NoTaskLost,
                format!(
                    "follow-up {task} of run {run} was announced, and the store has neither its task nor its step"
                ),
            );
        }
    }
}
