//! What observers of the runtime hear: how a run ended, and the events of its tasks as they happen.

use crate::ids::AttemptId;
use crate::report::SubagentReport;
use keel_harness::{HarnessKind, TokenCounts};
use keel_store::{RunId, TaskId};

pub use crate::message::RunOutcome;

/// What an embedding host or a progress view hears about, as it happens. The store is the record;
/// these are a view of it, and a full channel drops them rather than stall a run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeEvent {
    /// A specialist attempt was admitted and spawned.
    TaskStarted {
        /// The attempt.
        attempt: AttemptId,
        /// Its plan step.
        step: String,
        /// The agent profile it runs as.
        agent: String,
        /// Its harness.
        harness: HarnessKind,
        /// Its model.
        model: String,
    },
    /// A session log line of an attempt (its latest row's summary).
    Progress {
        /// The attempt.
        attempt: AttemptId,
        /// One line.
        summary: String,
    },
    /// Cumulative spend of an attempt.
    Spend {
        /// The attempt.
        attempt: AttemptId,
        /// Micro-dollars so far.
        spent_micros: u64,
    },
    /// Token usage of an attempt's session so far (the harness's reports folded without double
    /// counting), sent whenever it changes.
    Usage {
        /// The attempt.
        attempt: AttemptId,
        /// Tokens (and the harness's own cost, when it reports one) of the session so far.
        tokens: TokenCounts,
        /// What the attempt has spent, in micro-dollars: the harness's cost, else its tokens at the
        /// specialist's price per million (the figure the budget is charged).
        spent_micros: u64,
    },
    /// A report was made durable and acknowledged.
    Report {
        /// The attempt that produced it.
        attempt: AttemptId,
        /// Its plan step.
        step: String,
        /// The verified report.
        report: SubagentReport,
    },
    /// An attempt failed (the supervisor decides what happens next).
    TaskFailed {
        /// The attempt.
        attempt: AttemptId,
        /// Its plan step (empty if the attempt was already gone).
        step: String,
        /// What kind of failure (displayed as its stable name).
        kind: crate::report::FailureKind,
    },
    /// A run handed something to a human (durable).
    Escalation {
        /// The run.
        run: RunId,
        /// The task concerned, if any.
        task: Option<TaskId>,
        /// The diagnosis.
        reason: String,
    },
    /// A run reached a terminal state (durable).
    Finished(RunOutcome),
    /// The runtime paused a run by itself (its waiters hear [`super::WaitError::Paused`]): the run
    /// is not terminal and resumes later.
    Paused {
        /// The run.
        run: RunId,
        /// Why, and what to do.
        reason: PauseReason,
    },
}

/// Why the runtime paused a run by itself, rather than on its host's request ([`super::Runtime::pause`]).
/// Its text says what happened and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PauseReason {
    /// The disk holding the store is full: nothing more can be made durable, so every run of the
    /// node stops at once (its sessions cancelled, its unacknowledged results held back) instead of
    /// retrying writes that cannot succeed. Free space, then resume the run from a new runtime
    /// (`keel resume RUN`); the store is opened again then.
    #[error("the disk holding the store is full ({detail}); free space on it, then resume the run")]
    DiskFull {
        /// The store's error.
        detail: String,
    },
}
