//! Staged writes and group commit batches.
//!
//! A [`StagedWrite`] is a checked, run-tagged write that has not happened yet. It can only be made by a
//! [`crate::RunScope`] (for per-run rows) or by the [`crate::Store`] itself (for store-wide agent
//! profiles): its fields are private and it has no public constructor, so a write to a run's rows
//! cannot be built without that run's scope, and the scope only ever tags writes with its own run.

use crate::model::{
    AgentProfile, AuditEntry, Checkpoint, DeadLetter, Escalation, EscalationId,
    EscalationResolution, GateMark, IdempotencyRecord, ManifestEntry, Run, RunId, SessionLogRow,
    Task, TaskId,
};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// A record a staged write takes either owned or borrowed (`Cow`): a caller that keeps its records
/// (the checkpoint writer keeps a commit's ops for a retry) stages them by reference, and the
/// commit encodes them from there, without a copy of each row.
macro_rules! owned_or_borrowed {
    ($($t:ty),+) => {
        $(
            impl From<$t> for Cow<'_, $t> {
                fn from(value: $t) -> Self {
                    Cow::Owned(value)
                }
            }

            impl<'a> From<&'a $t> for Cow<'a, $t> {
                fn from(value: &'a $t) -> Self {
                    Cow::Borrowed(value)
                }
            }
        )+
    };
}

owned_or_borrowed!(
    Run,
    Task,
    SessionLogRow,
    Checkpoint,
    ManifestEntry,
    DeadLetter,
    IdempotencyRecord,
    AuditEntry,
    GateMark,
    Escalation,
    EscalationResolution
);

/// A write that passed its limits and run checks and waits to be committed by
/// [`crate::Store::commit_group`] or [`crate::Store::commit_one`].
///
/// It cannot be built without a scope: its fields are private and it has no public constructor.
///
/// ```compile_fail,E0451
/// use keel_store::StagedWrite;
/// let w = StagedWrite { staged: unreachable!() };
/// ```
///
/// Nor can a bare record stand in for one: a batch accepts only staged writes.
///
/// ```compile_fail,E0308
/// use keel_store::{ManifestEntry, ManifestOutcome, WriteBatch};
/// let mut batch = WriteBatch::new();
/// batch.push(ManifestEntry { ts_ms: 0, item: "x".into(), task_id: None, outcome: ManifestOutcome::Processed });
/// ```
///
/// The way that compiles goes through a run's scope, which tags the write with its own run:
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use keel_store::{Durability, ManifestEntry, ManifestOutcome, RunId, Store, WriteBatch};
/// # let dir = tempfile::tempdir()?;
/// let store = Store::open(dir.path().join("keel.redb"))?;
/// # let run = keel_store::Run { id: RunId(1), brief: "b".into(), plan: None, status: keel_store::RunStatus::Pending,
/// #   budget: Default::default(), created_ms: 0, updated_ms: 0, config_snapshot: String::new(), outcome: None };
/// let scope = store.run(RunId(1));
/// let mut batch = WriteBatch::new();
/// batch.push(scope.stage_create_run(run)?);
/// batch.push(scope.stage_append_manifest(ManifestEntry {
///     ts_ms: 0, item: "x".into(), task_id: None, outcome: ManifestOutcome::Processed,
/// })?);
/// store.commit_group(batch, Durability::Immediate)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[must_use = "a staged write does nothing until it is committed"]
pub struct StagedWrite<'a> {
    pub(crate) staged: Staged<'a>,
}

impl<'a> StagedWrite<'a> {
    /// The run whose rows this write touches (`None` for a store-wide agent profile). Lets the
    /// checkpoint actor route results back to the run that asked.
    pub fn run(&self) -> Option<RunId> {
        match &self.staged {
            Staged::Run { run, .. } => Some(*run),
            Staged::Agent(_) => None,
        }
    }

    pub(crate) fn for_run(run: RunId, op: RunOp<'a>) -> Self {
        Self {
            staged: Staged::Run { run, op },
        }
    }
}

/// What a staged write touches: one run's rows (keys built from `run` only), or a store-wide profile.
/// Serialised only into the journal records an earlier keel wrote (payload version 1; a record now
/// carries the rows a commit wrote, `redo.rs`), which an open still replays through the same
/// checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Staged<'a> {
    Run { run: RunId, op: RunOp<'a> },
    Agent(AgentProfile),
}

/// A write to one run's rows; the run comes from the scope that staged it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RunOp<'a> {
    CreateRun(Cow<'a, Run>),
    UpdateRun(Cow<'a, Run>),
    CreateTask(Cow<'a, Task>),
    UpdateTask(Cow<'a, Task>),
    AppendLog {
        task: TaskId,
        row: Cow<'a, SessionLogRow>,
    },
    PutCheckpoint(Cow<'a, Checkpoint>),
    AppendManifest(Cow<'a, ManifestEntry>),
    AppendDeadLetter(Cow<'a, DeadLetter>),
    RecordIdempotency(Cow<'a, IdempotencyRecord>),
    AppendAudit(Cow<'a, AuditEntry>),
    AppendGateMark(Cow<'a, GateMark>),
    AppendEscalation(Cow<'a, Escalation>),
    ResolveEscalation {
        id: EscalationId,
        resolution: Cow<'a, EscalationResolution>,
    },
    PutBlob(Vec<u8>),
    PutAgent(AgentProfile),
}

/// Staged writes from any number of callers (and runs), committed together in one write
/// transaction with one fsync. The checkpoint actor collects results into a batch and commits it
/// when the batch is full or its timer fires.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriteBatch<'a> {
    pub(crate) items: Vec<StagedWrite<'a>>,
}

impl<'a> WriteBatch<'a> {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `writes` staged writes: a staged write is a few hundred bytes,
    /// so a batch grown by doubling copies each of them again at every step (a group commit of a
    /// few hundred writes, on the store writer's thread).
    pub fn with_capacity(writes: usize) -> Self {
        Self {
            items: Vec::with_capacity(writes),
        }
    }

    /// Adds a staged write; its result will be at the same index in the commit's results.
    pub fn push(&mut self, write: StagedWrite<'a>) -> &mut Self {
        self.items.push(write);
        self
    }

    /// How many writes are staged.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Takes out the write at `index` (for example the one a [`crate::CommitError::Item`] named), so
    /// the rest can be committed again with [`crate::Store::commit_batch`]. `None` if out of range.
    pub fn remove(&mut self, index: usize) -> Option<StagedWrite<'a>> {
        (index < self.items.len()).then(|| self.items.remove(index))
    }

    /// Whether nothing is staged.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<'a> FromIterator<StagedWrite<'a>> for WriteBatch<'a> {
    fn from_iter<I: IntoIterator<Item = StagedWrite<'a>>>(iter: I) -> Self {
        Self {
            items: iter.into_iter().collect(),
        }
    }
}

impl<'a> Extend<StagedWrite<'a>> for WriteBatch<'a> {
    fn extend<I: IntoIterator<Item = StagedWrite<'a>>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

/// What one staged write did once committed. Results come back in batch order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// A run row was created.
    RunCreated,
    /// A run row was replaced.
    RunUpdated,
    /// A task row was created (and indexed under its run and parent).
    TaskCreated {
        /// Attachments that were moved to the blob table, as (attachment index, blob key).
        blobbed: Vec<(u32, u128)>,
    },
    /// A task row was replaced.
    TaskUpdated {
        /// Attachments that were moved to the blob table, as (attachment index, blob key).
        blobbed: Vec<(u32, u128)>,
    },
    /// A session log row was appended under this sequence number (1 for a task's first row).
    LogAppended {
        /// The row's sequence number within its task.
        seq: u64,
    },
    /// The run's checkpoint was replaced.
    CheckpointWritten,
    /// A manifest entry was appended under this sequence number (1 for a run's first entry).
    ManifestAppended {
        /// The entry's sequence number within its run.
        seq: u64,
    },
    /// A dead letter was appended.
    DeadLetterAppended {
        /// Its sequence number within its run.
        seq: u64,
    },
    /// The idempotency key was new and is now recorded: go ahead with the side effect.
    IdempotencyRecorded,
    /// The idempotency key was recorded before: skip the side effect. Carries the original record.
    AlreadyRecorded(IdempotencyRecord),
    /// An audit entry was appended.
    AuditAppended {
        /// Its sequence number within its run.
        seq: u64,
    },
    /// A gate mark was appended.
    GateMarkAppended {
        /// Its sequence number within its run.
        seq: u64,
    },
    /// An escalation was appended (or was already there under its id: appending it again changes
    /// nothing).
    EscalationAppended {
        /// Its sequence number within its run.
        seq: u64,
    },
    /// An escalation was closed now.
    EscalationResolved,
    /// The escalation was closed before: the first resolution stays. Carries it.
    EscalationAlreadyResolved(EscalationResolution),
    /// A blob was stored; reference it with [`crate::AttachmentBody::Blob`].
    BlobStored {
        /// The blob's key within its run.
        key: u128,
        /// Its size in bytes.
        len: u64,
    },
    /// An agent profile was written (created or replaced).
    AgentProfileWritten,
}
