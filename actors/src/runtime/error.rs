//! Why the runtime could not do what was asked: one error type per operation (start, submit,
//! resume, follow-up, cancel, waiting for a run's end), built from a few shared parts, so a caller
//! matches only on what its operation can answer.

use super::EntropyError;
use super::event::PauseReason;
use crate::host::HostError;
use crate::host::decide::Refusal;
use keel_store::{RunId, TaskId};

/// An actor (or the store writer thread) could not be started.
#[derive(Debug, thiserror::Error)]
#[error("could not spawn the {what} actor: {detail}")]
pub struct SpawnError {
    /// Which actor.
    pub what: &'static str,
    /// Why.
    pub detail: String,
}

/// A read of the store, done on tokio's blocking pool, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreReadError {
    /// The store answered with an error (a missing row, a disk fault, a runaway run).
    #[error(transparent)]
    Store(#[from] HostError),
    /// The blocking task that read it panicked or was cancelled: nothing was read.
    #[error("the store read task failed: {0}")]
    Task(String),
}

/// A write of the host's own (a decision's marks) through the checkpoint actor failed or got no
/// answer: nothing of it is known to be durable.
#[derive(Debug, thiserror::Error)]
#[error("could not write through the checkpoint actor: {0}")]
pub struct HostWriteError(pub String);

/// Why [`super::Runtime::start`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The secret scrubber's patterns do not compile: keel does not run rather than scrub less.
    #[error(transparent)]
    Scrubber(#[from] crate::context::PatternError),
    /// No OS entropy for the node's stream.
    #[error(transparent)]
    Entropy(#[from] EntropyError),
    /// The checkpoint or supervisor actor, or the store writer thread, could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// Why [`super::Runtime::submit`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The run's coordinator could not start (or the runtime is shutting down).
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// Why [`super::Runtime::resume`] failed. Nothing was started; the stored run is as it was,
/// except after [`ResumeError::Spawn`], where its row is put back as it was found (best effort).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    /// The run's rows could not be read (unknown run, a disk fault).
    #[error(transparent)]
    Read(#[from] StoreReadError),
    /// The run's state does not allow it (terminal, already running here).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The mark that the run is running again could not be written.
    #[error(transparent)]
    Write(#[from] HostWriteError),
    /// The run's coordinator could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
}

/// Why [`super::Runtime::follow_up`] (or [`super::check_follow_up_message`]) refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FollowUpError {
    /// The follow-up message is empty (or only white space).
    #[error("the follow-up message is empty")]
    EmptyMessage,
    /// The follow-up message is over [`crate::message::FOLLOW_UP_BYTES_MAX`].
    #[error("the follow-up message is {bytes} bytes; the limit is {max}")]
    MessageTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The follow-up asks for an agent this runtime is not configured with.
    #[error("no agent named {name:?} here (agents: {})", known.join(", "))]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The agents this runtime has.
        known: Vec<String>,
    },
    /// The follow-up names a task the store does not have.
    #[error("no task {0} in the store")]
    UnknownTask(TaskId),
    /// The run's rows could not be read.
    #[error(transparent)]
    Read(#[from] StoreReadError),
    /// The run's state does not allow it (not hosted here, not reopenable).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The mark that reopens the run could not be written.
    #[error(transparent)]
    Write(#[from] HostWriteError),
    /// The reopened run's coordinator could not start.
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// The follow-up was handed to the run's coordinator but did not become durable in time (a
    /// store that stopped committing): its id is not handed out.
    #[error("follow-up {task} of run {run} was not durable within {waited:?}")]
    NotDurable {
        /// The run.
        run: RunId,
        /// The follow-up's task id.
        task: TaskId,
        /// How long it was waited for.
        waited: std::time::Duration,
    },
}

/// Why [`super::Runtime::cancel_stored`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CancelError {
    /// The task named is not in the store.
    #[error("no task {0} in the store")]
    UnknownTask(TaskId),
    /// The run's rows could not be read (unknown run, a disk fault).
    #[error(transparent)]
    Read(#[from] StoreReadError),
    /// The run's state does not allow it (terminal, hosted here).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The cancel marks could not be written.
    #[error(transparent)]
    Write(#[from] HostWriteError),
}

/// Why waiting for a run's end ([`super::RunHandle::finished`],
/// [`super::FollowUpHandle::finished`]) ended without it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WaitError {
    /// The runtime stopped (or was paused by its host) before the run ended.
    #[error("the runtime stopped before run {0} finished")]
    Stopped(RunId),
    /// The runtime paused the run by itself; the reason says why and how to go on.
    #[error("run {run} paused: {reason}")]
    Paused {
        /// The run.
        run: RunId,
        /// Why, and what to do.
        reason: PauseReason,
    },
    /// The run ended without creating the follow-up's task: its coordinator refused it (the
    /// reason is a decision row in the log of the run's root task).
    #[error("run {run} refused the follow-up on {parent} (see the log of its root task)")]
    FollowUpRefused {
        /// The run.
        run: RunId,
        /// The task the follow-up was asked on.
        parent: TaskId,
    },
    /// The rows that tell how it ended could not be read.
    #[error(transparent)]
    Read(#[from] StoreReadError),
}
