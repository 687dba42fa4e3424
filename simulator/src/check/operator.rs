//! Checks on the operator's interventions (issue 10 §2): a cancelled run starts no new session
//! (invariant 14), and a run reopened for a follow-up ends again with exactly one new synthesis
//! (invariant 15). That a paused run resumes to the same outcome (13) compares two worlds, so it is
//! [`crate::soak::pause_resumes_same`], not a check of one world.

use keel_store::{RunId, RunStatus};

use super::Checker;
use crate::violation::Invariant;

impl Checker {
    /// A cancel of `run` took effect (sent to its coordinator, or written to the store): from now on
    /// the run spawns nothing.
    pub fn cancel_requested(&mut self, run: RunId) {
        self.cancelled.insert(run);
        self.observed.cancels.push(run);
    }

    /// The runs whose cancel the checker holds the world to.
    pub fn cancelled_runs(&self) -> Vec<RunId> {
        self.cancelled.iter().copied().collect()
    }

    /// A cancel did not take: the coordinator went down before the cancel was durable, or the run
    /// ended otherwise and was reopened. The run may spawn again.
    pub fn cancel_withdrawn(&mut self, run: RunId) {
        self.cancelled.remove(&run);
    }

    /// A spawn of `run` is about to be sent (invariant 14).
    pub(super) fn spawn_after_cancel(&mut self, event: u64, run: RunId, what: &str) {
        if self.cancelled.contains(&run) {
            self.fail(
                event,
                Invariant::CancelStartsNothing,
                format!("run {run} was cancelled but {what}"),
            );
        }
    }

    /// An operator's request was refused by the host's decision (kept for the scenarios).
    pub fn operator_refused(&mut self, run: RunId, why: String) {
        self.observed.operator_refusals.push((run, why));
    }

    /// `run` was reopened for a follow-up: it must end once more, and only once.
    pub fn reopen_requested(&mut self, run: RunId) {
        self.reopened.insert(run, 0);
        self.cancel_withdrawn(run);
        self.observed.reopens.push(run);
    }

    /// A run-finished event of `run` (invariant 15: at most one per reopen).
    pub(super) fn run_finished_after_reopen(&mut self, event: u64, run: RunId) {
        let Some(count) = self.reopened.get_mut(&run) else {
            return;
        };
        *count += 1;
        if *count > 1 {
            let count = *count;
            self.fail(
                event,
                Invariant::ReopenEndsOnce,
                format!("run {run} ended {count} times after one reopen (one synthesis each)"),
            );
        }
    }

    /// At the end, after the liveness phase: every reopened run ended again (invariant 15).
    pub(super) fn reopened_runs_ended(
        &mut self,
        event: u64,
        status_of: impl Fn(RunId) -> Option<RunStatus>,
    ) {
        let runs: Vec<RunId> = self.reopened.keys().copied().collect();
        for run in runs {
            let status = status_of(run);
            if !status.is_some_and(RunStatus::is_terminal) {
                self.fail(
                    event,
                    Invariant::ReopenEndsOnce,
                    format!(
                        "run {run} was reopened for a follow-up and never ended again ({status:?})"
                    ),
                );
            }
        }
    }
}
