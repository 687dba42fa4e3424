//! Why the runtime could not do what was asked.

use super::EntropyError;
use crate::host::decide::Refusal;
use keel_store::{RunId, TaskId};

/// Why the runtime could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No OS entropy for the node's stream.
    #[error(transparent)]
    Entropy(#[from] EntropyError),
    /// An actor could not be spawned.
    #[error("could not spawn the {what} actor: {detail}")]
    Spawn {
        /// Which actor.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The store could not be read (recovery).
    #[error(transparent)]
    Store(#[from] crate::host::HostError),
    /// The run's state does not allow what was asked (the decision is
    /// [`crate::host::decide`]'s).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The runtime stopped before the run finished.
    #[error("the runtime stopped before run {0} finished")]
    Stopped(RunId),
    /// A host write through the checkpoint actor failed.
    #[error("could not write through the checkpoint actor: {0}")]
    HostWrite(String),
    /// A follow-up names a task the store does not have.
    #[error("no task {0} in the store")]
    UnknownTask(TaskId),
    /// A follow-up asks for an agent this runtime is not configured with.
    #[error("no agent named {name:?} here (agents: {})", known.join(", "))]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The agents this runtime has.
        known: Vec<String>,
    },
    /// A follow-up message is empty (or only white space).
    #[error("the follow-up message is empty")]
    EmptyMessage,
    /// A follow-up message is over [`FOLLOW_UP_BYTES_MAX`].
    #[error("the follow-up message is {bytes} bytes; the limit is {max}")]
    MessageTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
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
}
