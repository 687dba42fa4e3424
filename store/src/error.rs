//! Errors: one `#[non_exhaustive]` enum per operation (open, read, stage, commit), each converting into
//! the crate's [`enum@Error`]. A caller that cares handles the operation's enum; one that only reports
//! uses [`enum@Error`].
//!
//! A note on IO failures: redb latches the first IO failure of its backend (a full disk, a failed
//! sync) and refuses every later operation with [`CommitError::NeedsReopen`] /
//! [`ReadError::NeedsReopen`] until the [`crate::Store`] is dropped and opened again. Nothing committed
//! before the failure is lost; the failed transaction leaves no trace.

use crate::codec::{DecodeError, EncodeError};
use crate::guard::{CarriesCorruption, Corruption, storage_corrupted};
use crate::limits::LimitError;
use crate::model::{EscalationId, RunId, TaskId};

/// Opening (or creating) a store failed. The variants tell apart what an operator does next: wait
/// for (or stop) the other process, fix a permission, restore a backup, free space.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Another process has the file open in a way that excludes this open: a writer (a running keel
    /// node) excludes a second writer, and an exclusive writer excludes readers too.
    #[error("the store is held by another process")]
    Locked,
    /// The file was left by a crash and needs the recovery a writable open does; a read-only open
    /// cannot repair it.
    #[error("the store needs recovery after a crash, which a read-only open cannot do")]
    NeedsRecovery,
    /// The file or its folder may not be read or written by this user.
    #[error("permission denied: {0}")]
    PermissionDenied(std::io::Error),
    /// There is no store file (a read-only open never creates one).
    #[error("no such file: {0}")]
    NotFound(std::io::Error),
    /// The file is not a redb database at all.
    #[error("the file is not a redb database")]
    NotADatabase,
    /// The file is a redb database, but its pages are damaged.
    #[error(transparent)]
    Corrupt(#[from] Corruption),
    /// Any other IO failure while opening (a full disk when creating, a failing device).
    #[error("IO failed while opening: {0}")]
    Io(std::io::Error),
    /// redb refused the file for another reason (an old file format that needs an upgrade).
    #[error("cannot open the database: {0}")]
    Database(redb::DatabaseError),
    /// The store's own format marker is newer than this build: upgrade keel to open it.
    #[error(
        "the store was written by a newer keel (store format {found}, this build reads up to {supported})"
    )]
    StoreFromFuture {
        /// The format found in the file.
        found: u8,
        /// The newest format this build reads.
        supported: u8,
    },
    /// A store of an older format could not be brought to this build's format on a writable open
    /// (a run row that does not decode): nothing was changed; restore a backup or open it with the
    /// keel that wrote it.
    #[error("cannot upgrade the store to format {to}: {source}")]
    Upgrade {
        /// The format the upgrade was to.
        to: u8,
        /// The row that stopped it (one that does not decode, or cannot be encoded again).
        source: ItemError,
    },
    /// A record of the store's journal (a commit acknowledged before a crash, not yet in the store
    /// file) could not be applied on open: nothing of the journal was applied; the journal file
    /// (`<store>.journal`) is left as it is for a keel that can read it.
    #[error("cannot replay record {seq} of the store's journal: {reason}")]
    Journal {
        /// The record's number.
        seq: u64,
        /// Why it did not apply.
        reason: String,
    },
    /// The file is a redb database but holds no keel store (opened read-only, nothing to read).
    #[error("the file is a database but not a keel store")]
    NotAStore,
    /// Creating the tables on first use failed to begin a transaction.
    #[error("cannot begin the set-up transaction: {0}")]
    Transaction(#[from] redb::TransactionError),
    /// A table could not be opened or created (for example, it exists with another key type).
    #[error("cannot open a table: {0}")]
    Table(#[from] redb::TableError),
    /// The storage failed while setting up.
    #[error("storage failed while setting up: {0}")]
    Storage(#[from] redb::StorageError),
    /// The set-up transaction could not be made durable.
    #[error("cannot commit the set-up transaction: {0}")]
    Commit(#[from] redb::CommitError),
    /// The set-up transaction's durability could not be set.
    #[error("cannot set durability: {0}")]
    Durability(#[from] redb::SetDurabilityError),
}

impl From<redb::DatabaseError> for OpenError {
    fn from(e: redb::DatabaseError) -> Self {
        use redb::DatabaseError as D;
        match e {
            D::DatabaseAlreadyOpen | D::LockProtocolMismatch => Self::Locked,
            D::RepairAborted => Self::NeedsRecovery,
            D::Storage(redb::StorageError::Io(io)) => match io.kind() {
                std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                    Self::PermissionDenied(io)
                }
                std::io::ErrorKind::NotFound => Self::NotFound(io),
                // redb reports a file that holds no redb header as InvalidData.
                std::io::ErrorKind::InvalidData => Self::NotADatabase,
                _ => Self::Io(io),
            },
            D::Storage(s) => Self::Storage(s),
            other => Self::Database(other),
        }
    }
}

impl CarriesCorruption for OpenError {
    fn corrupted_detail(&self) -> Option<String> {
        match self {
            Self::Storage(e) => storage_corrupted(e),
            Self::Transaction(redb::TransactionError::Storage(e))
            | Self::Table(redb::TableError::Storage(e))
            | Self::Commit(redb::CommitError::Storage(e))
            | Self::Database(redb::DatabaseError::Storage(e)) => storage_corrupted(e),
            _ => None,
        }
    }
}

/// A read failed. Reads never change what the store holds (a read of a store with a journal may
/// commit the journal's open transaction first, so that it sees every acknowledged commit).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// No such row in the scope asked. Through a [`crate::RunScope`], a row of another run is also
    /// `NotFound`: the scope cannot see it.
    #[error("{what} {key} not found")]
    NotFound {
        /// What was looked for (`run`, `task`, `blob`, `agent profile`, ...).
        what: &'static str,
        /// Its key, as text.
        key: String,
    },
    /// A row exists but does not decode (corrupt, or written by a newer keel).
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The caller asked for more rows than [`crate::Limits::read_rows_max`] allows.
    #[error("read refused: {0}")]
    TooManyRows(LimitError),
    /// A read transaction could not begin.
    #[error("cannot begin a read transaction: {0}")]
    Transaction(redb::TransactionError),
    /// A table could not be opened.
    #[error("cannot open a table: {0}")]
    Table(#[from] redb::TableError),
    /// The storage failed while reading.
    #[error("storage failed while reading: {0}")]
    Storage(redb::StorageError),
    /// The backend failed earlier and redb refuses further IO: drop the store and open it again.
    #[error("the storage failed earlier; reopen the store")]
    NeedsReopen,
    /// The store file's pages are damaged (redb reported them corrupt, or panicked on them).
    #[error(transparent)]
    Corrupt(#[from] Corruption),
}

impl ReadError {
    /// A failure to commit the journal's open transaction for a read, as the read's error. An IO
    /// failure stays one (redb then refuses further IO, so the next read is `NeedsReopen`); any
    /// other (redb discarded its allocator state after a failed commit, a record that did not
    /// apply again) is [`ReadError::NeedsReopen`] at once: a writer opened again replays the
    /// journal, and the node reopens its store on exactly this error.
    pub(crate) fn from_publish(e: CommitError) -> Self {
        match e {
            CommitError::Storage(s) | CommitError::DiskFull(s) => s.into(),
            _ => Self::NeedsReopen,
        }
    }
}

impl CarriesCorruption for ReadError {
    fn corrupted_detail(&self) -> Option<String> {
        match self {
            Self::Storage(e)
            | Self::Transaction(redb::TransactionError::Storage(e))
            | Self::Table(redb::TableError::Storage(e)) => storage_corrupted(e),
            _ => None,
        }
    }
}

impl From<redb::TransactionError> for ReadError {
    fn from(e: redb::TransactionError) -> Self {
        match e {
            redb::TransactionError::Storage(s) => s.into(),
            other => Self::Transaction(other),
        }
    }
}

impl From<redb::StorageError> for ReadError {
    fn from(e: redb::StorageError) -> Self {
        match e {
            redb::StorageError::PreviousIo => Self::NeedsReopen,
            other => Self::Storage(other),
        }
    }
}

/// A write could not be staged: it was refused before it reached any transaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StageError {
    /// A field is over its limit; nothing was truncated.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The record names another run than the scope it was staged through. A scope only ever writes
    /// its own run's rows.
    #[error("record belongs to run {record}, but was staged through the scope of run {scope}")]
    RunMismatch {
        /// The scope's run.
        scope: RunId,
        /// The run the record names.
        record: RunId,
    },
    /// The record is inconsistent in itself (a task that is its own parent, ...).
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// Why it is invalid.
        reason: &'static str,
    },
}

/// Why one item of a group commit could not be applied. The whole group is then not committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ItemError {
    /// The run does not exist (create it first, in this batch or an earlier one).
    #[error("run {0} not found")]
    RunNotFound(RunId),
    /// A run with this id already exists.
    #[error("run {0} already exists")]
    RunExists(RunId),
    /// The task does not exist in this run.
    #[error("task {task} not found in run {run}")]
    TaskNotFound {
        /// The run looked in.
        run: RunId,
        /// The task looked for.
        task: TaskId,
    },
    /// The task id is already used (by this run or another one): task ids are unique store-wide.
    #[error("task id {0} is already taken")]
    TaskIdTaken(TaskId),
    /// The task's parent does not exist in the same run.
    #[error("parent {parent} of task {task} not found in the task's run")]
    ParentNotFound {
        /// The task being created.
        task: TaskId,
        /// The parent it names.
        parent: TaskId,
    },
    /// An update tried to change a task's parent; thread links are fixed at creation.
    #[error("task {task}: its parent cannot change")]
    ParentChanged {
        /// The task being updated.
        task: TaskId,
    },
    /// An update of a run's row carried a plan other than the one the run was created with: a
    /// run's plan is fixed at creation (an update without a plan keeps it).
    #[error("run {run}: its plan cannot change")]
    PlanChanged {
        /// The run being updated.
        run: RunId,
    },
    /// The escalation id is already used by another run: escalation ids are unique store-wide.
    #[error("escalation id {0} is already taken")]
    EscalationIdTaken(EscalationId),
    /// No escalation with this id in this run.
    #[error("escalation {id} not found in run {run}")]
    EscalationNotFound {
        /// The run looked in.
        run: RunId,
        /// The escalation looked for.
        id: EscalationId,
    },
    /// An attachment references a blob that does not exist in this run.
    #[error("blob {0} not found in this run")]
    BlobNotFound(u128),
    /// A stored row the item needed to read does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The item could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// A sequence number ran out (more than 2^64 rows under one key prefix).
    #[error("sequence exhausted in table {0}")]
    SequenceExhausted(&'static str),
}

/// A group commit failed. Nothing of the group was committed; earlier commits are intact.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommitError {
    /// The batch has more items than [`crate::Limits::batch_items_max`].
    #[error("batch refused: {0}")]
    BatchTooLarge(LimitError),
    /// One item could not be applied; `index` is its position in the batch.
    #[error("item {index} of the batch: {error}")]
    Item {
        /// The item's position in the batch (0-based).
        index: u32,
        /// What was wrong.
        error: ItemError,
    },
    /// The write transaction could not begin.
    #[error("cannot begin a write transaction: {0}")]
    Begin(redb::TransactionError),
    /// The durability could not be set on the transaction.
    #[error("cannot set durability: {0}")]
    Durability(#[from] redb::SetDurabilityError),
    /// A table could not be opened.
    #[error("cannot open a table: {0}")]
    Table(#[from] redb::TableError),
    /// The disk (or backend) is full. Nothing of this group was committed; reopen the store once
    /// space is free.
    #[error("disk full: {0}")]
    DiskFull(redb::StorageError),
    /// The storage failed (IO error, corruption detected by redb).
    #[error("storage failed: {0}")]
    Storage(redb::StorageError),
    /// The backend failed earlier and redb refuses further IO: drop the store and open it again.
    #[error("the storage failed earlier; reopen the store")]
    NeedsReopen,
    /// The store was opened with [`crate::Store::open_read_only`].
    #[error("the store is open read-only")]
    ReadOnly,
    /// A commit's journal record was partly written, its append failed, and it could not be voided:
    /// the next open of the store may replay it. This handle takes no further commit, and must not
    /// be opened again by this process (a retry of the failed commit would then apply it twice):
    /// restart the process, whose open replays or drops the record.
    #[error("a failed commit's journal record could not be voided; restart the process")]
    JournalBroken,
    /// A journal record this process acknowledged did not apply again when the open transaction
    /// that held it was rebuilt (after a group that failed its checks partway, or a failed
    /// append): reopen the store, whose replay reports the same record as [`OpenError::Journal`]
    /// if it persists.
    #[error("journal record {seq} did not apply again: {reason}")]
    Journal {
        /// The record's number.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// The commit itself failed (the final write or sync).
    #[error("commit failed: {0}")]
    Commit(redb::CommitError),
    /// The store file's pages are damaged (redb reported them corrupt, or panicked on them).
    /// Nothing of this group was committed.
    #[error(transparent)]
    Corrupt(#[from] Corruption),
}

impl CarriesCorruption for CommitError {
    fn corrupted_detail(&self) -> Option<String> {
        match self {
            Self::Storage(e)
            | Self::Begin(redb::TransactionError::Storage(e))
            | Self::Table(redb::TableError::Storage(e))
            | Self::Commit(redb::CommitError::Storage(e)) => storage_corrupted(e),
            _ => None,
        }
    }
}

fn is_disk_full(e: &redb::StorageError) -> bool {
    matches!(e, redb::StorageError::Io(io) if io.kind() == std::io::ErrorKind::StorageFull)
}

impl From<redb::StorageError> for CommitError {
    fn from(e: redb::StorageError) -> Self {
        match e {
            redb::StorageError::PreviousIo => Self::NeedsReopen,
            e if is_disk_full(&e) => Self::DiskFull(e),
            other => Self::Storage(other),
        }
    }
}

impl From<redb::TransactionError> for CommitError {
    fn from(e: redb::TransactionError) -> Self {
        match e {
            redb::TransactionError::Storage(s) => s.into(),
            other => Self::Begin(other),
        }
    }
}

impl From<redb::CommitError> for CommitError {
    fn from(e: redb::CommitError) -> Self {
        match e {
            redb::CommitError::Storage(s) => s.into(),
            other => Self::Commit(other),
        }
    }
}

/// Any store error, for callers that only report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Opening failed.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// A read failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// A write was refused at staging.
    #[error(transparent)]
    Stage(#[from] StageError),
    /// A commit failed.
    #[error(transparent)]
    Commit(#[from] CommitError),
}
