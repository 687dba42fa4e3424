//! Looking after the store file: redb's integrity check, compaction, and a consistent backup
//! (`keel store check`, `keel store compact`, `keel store backup PATH`).
//!
//! redb 4.6 has no backup facility of its own, so [`Store::backup_to`] copies every keel table
//! inside one read transaction into a new redb file: the copy is the store as of one commit, even
//! while a node (the writer, opened with [`crate::Sharing::WithReaders`]) goes on committing.
//! Check and compaction need the file alone (redb's `check_integrity` and `compact` take the
//! database handle exclusively), so they run on a writable [`Store`] no other process holds.

use std::path::{Path, PathBuf};

use redb::{
    Database, Durability, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction,
};

use crate::error::{OpenError, ReadError};
use crate::guard::{CarriesCorruption, Corruption, guarded, storage_corrupted};
use crate::store::{Db, Store};
use crate::tables;

/// Most compaction passes one [`Store::compact`] makes; redb compacts in passes that each move
/// some pages, and says when there is nothing left to move. A bound, so a pass that keeps finding
/// work cannot loop forever.
pub const COMPACTION_PASSES_MAX: u32 = 64;

/// What redb's integrity check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Integrity {
    /// Every page's checksum matched: the file is as redb wrote it.
    Intact,
    /// The check failed but redb repaired the file (from the previous commit's pages); the last
    /// commit may be lost.
    Repaired,
}

/// What [`Store::compact`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    /// Passes that moved pages (0: the file was already compact).
    pub passes: u32,
    /// The file's size before, in bytes (`None` on a custom backend).
    pub bytes_before: Option<u64>,
    /// The file's size after, in bytes (`None` on a custom backend).
    pub bytes_after: Option<u64>,
}

/// What [`Store::backup_to`] copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backup {
    /// The backup file.
    pub file: PathBuf,
    /// Tables copied.
    pub tables: u32,
    /// Entries copied, over all tables (a session-log segment of several rows is one entry).
    pub rows: u64,
}

/// A maintenance operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MaintenanceError {
    /// The store was opened read-only; check and compaction need it writable and alone.
    #[error("the store is open read-only; checking and compacting need it open for writing")]
    ReadOnly,
    /// A transaction of this process is still open on the store.
    #[error("a transaction is still open on the store")]
    Busy,
    /// The file is damaged beyond what redb can repair.
    #[error(transparent)]
    Corrupt(#[from] Corruption),
    /// The storage failed.
    #[error("storage failed: {0}")]
    Storage(redb::StorageError),
    /// Compaction could not start (a savepoint exists).
    #[error("cannot compact: {0}")]
    Compaction(redb::CompactionError),
    /// Reading the store for the backup failed.
    #[error("reading the store: {0}")]
    Read(#[from] ReadError),
    /// The backup file exists already; a backup never overwrites a file.
    #[error("{} exists already; a backup never overwrites a file", .0.display())]
    BackupExists(PathBuf),
    /// The backup file could not be created or written.
    #[error("cannot write the backup {}: {source}", path.display())]
    BackupWrite {
        /// The backup file.
        path: PathBuf,
        /// What redb or the file system said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The finished backup does not open as a keel store.
    #[error("the backup {} does not open as a store: {source}", path.display())]
    BackupUnreadable {
        /// The backup file.
        path: PathBuf,
        /// Why.
        source: OpenError,
    },
}

impl CarriesCorruption for MaintenanceError {
    fn corrupted_detail(&self) -> Option<String> {
        match self {
            Self::Storage(e) => storage_corrupted(e),
            Self::Compaction(redb::CompactionError::Storage(e)) => storage_corrupted(e),
            Self::Read(e) => e.corrupted_detail(),
            _ => None,
        }
    }
}

impl From<redb::DatabaseError> for MaintenanceError {
    fn from(e: redb::DatabaseError) -> Self {
        match e {
            redb::DatabaseError::TransactionInProgress => Self::Busy,
            redb::DatabaseError::Storage(s) => Self::Storage(s),
            other => Self::Storage(redb::StorageError::Backend(Box::new(other))),
        }
    }
}

impl Store {
    /// Runs redb's integrity check over every page of the file (slow: it reads the whole file).
    ///
    /// # Errors
    /// [`MaintenanceError::ReadOnly`] on a read-only store; [`MaintenanceError::Busy`] if a
    /// transaction of this process is open; [`MaintenanceError::Corrupt`] if the file is damaged
    /// beyond repair.
    pub fn check_integrity(&mut self) -> Result<Integrity, MaintenanceError> {
        let file = self.file().cloned();
        let db = self.writer_mut()?;
        guarded(file.as_ref(), || {
            Ok(if db.check_integrity()? {
                Integrity::Intact
            } else {
                Integrity::Repaired
            })
        })
    }

    /// Compacts the file: moves pages so the free space at its end is released, in at most
    /// [`COMPACTION_PASSES_MAX`] passes.
    ///
    /// # Errors
    /// As [`Store::check_integrity`]; [`MaintenanceError::Compaction`] if a savepoint exists.
    pub fn compact(&mut self) -> Result<Compaction, MaintenanceError> {
        let file = self.file().cloned();
        let size = |file: &Option<PathBuf>| {
            file.as_ref()
                .and_then(|path| std::fs::metadata(path).ok())
                .map(|meta| meta.len())
        };
        let bytes_before = size(&file);
        let db = self.writer_mut()?;
        let passes = guarded(file.as_ref(), || {
            let mut passes = 0;
            while passes < COMPACTION_PASSES_MAX {
                let moved = db.compact().map_err(|e| match e {
                    redb::CompactionError::Storage(s) => MaintenanceError::Storage(s),
                    redb::CompactionError::TransactionInProgress => MaintenanceError::Busy,
                    other => MaintenanceError::Compaction(other),
                })?;
                if !moved {
                    break;
                }
                passes += 1;
            }
            Ok::<u32, MaintenanceError>(passes)
        })?;
        Ok(Compaction {
            passes,
            bytes_before,
            bytes_after: size(&file),
        })
    }

    /// Writes a consistent copy of the store to a new file at `path`: every keel table, copied in
    /// one read transaction (so the copy is the store as of one commit, while a writer in another
    /// process goes on), committed durably, then opened once to prove it is a store. Works on a
    /// read-only store, so `keel store backup` runs beside a node.
    ///
    /// # Errors
    /// [`MaintenanceError::BackupExists`] if `path` exists; [`MaintenanceError::BackupWrite`] if it
    /// cannot be created or written; [`MaintenanceError::Read`] / [`MaintenanceError::Corrupt`] if
    /// this store cannot be read; [`MaintenanceError::BackupUnreadable`] if the copy does not open.
    pub fn backup_to(&self, path: &Path) -> Result<Backup, MaintenanceError> {
        let write_failed =
            |source: Box<dyn std::error::Error + Send + Sync>| MaintenanceError::BackupWrite {
                path: path.to_path_buf(),
                source,
            };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(MaintenanceError::BackupExists(path.to_path_buf()));
            }
            Err(e) => return Err(write_failed(Box::new(e))),
        };
        let copied = guarded(self.file(), || {
            let backend =
                redb::backends::FileBackend::new(file).map_err(|e| write_failed(Box::new(e)))?;
            let target = Database::builder()
                .create_with_backend(backend)
                .map_err(|e| write_failed(Box::new(e)))?;
            let source = self.begin_read()?;
            let mut txn = target
                .begin_write()
                .map_err(|e| write_failed(Box::new(e)))?;
            txn.set_durability(Durability::Immediate)
                .map_err(|e| write_failed(Box::new(e)))?;
            let rows = copy_tables(&source, &txn).map_err(|e| match e {
                CopyFailed::Read(e) => MaintenanceError::Read(e),
                CopyFailed::Write(e) => write_failed(e),
            })?;
            txn.commit().map_err(|e| write_failed(Box::new(e)))?;
            Ok(rows)
        });
        let (tables, rows) = match copied {
            Ok(copied) => copied,
            Err(e) => {
                // A half-written backup is not a backup: remove it so no one restores from it.
                let _ = std::fs::remove_file(path);
                return Err(e);
            }
        };
        Store::open_read_only(path, crate::StoreConfig::default()).map_err(|source| {
            MaintenanceError::BackupUnreadable {
                path: path.to_path_buf(),
                source,
            }
        })?;
        Ok(Backup {
            file: path.to_path_buf(),
            tables,
            rows,
        })
    }

    fn writer_mut(&mut self) -> Result<&mut Database, MaintenanceError> {
        // Commits only the journal holds are made durable in the file first: maintenance works
        // on the file's durable state.
        self.settle_journal().map_err(|e| match e {
            crate::CommitError::Storage(s) | crate::CommitError::DiskFull(s) => {
                MaintenanceError::Storage(s)
            }
            other => MaintenanceError::Storage(redb::StorageError::Backend(Box::new(other))),
        })?;
        self.forget_known();
        match &mut self.db {
            Db::Writer(db) => Ok(db),
            Db::Reader(_) => Err(MaintenanceError::ReadOnly),
        }
    }
}

/// Why copying a table failed: reading the store, or writing the backup.
enum CopyFailed {
    Read(ReadError),
    Write(Box<dyn std::error::Error + Send + Sync>),
}

/// Copies every keel table from `source` into `target`; returns (tables, rows).
fn copy_tables(
    source: &ReadTransaction,
    target: &WriteTransaction,
) -> Result<(u32, u64), CopyFailed> {
    let counts = [
        copy(source, target, tables::META)?,
        copy(source, target, tables::RUNS)?,
        copy(source, target, tables::OPEN_RUNS)?,
        copy(source, target, tables::RUN_PLANS)?,
        copy(source, target, tables::TASKS)?,
        copy(source, target, tables::TASK_STATES)?,
        copy(source, target, tables::TASK_RUN)?,
        copy(source, target, tables::TASK_CHILDREN)?,
        copy(source, target, tables::SESSION_LOGS)?,
        copy(source, target, tables::CHECKPOINTS)?,
        copy(source, target, tables::MANIFEST)?,
        copy(source, target, tables::DEAD_LETTERS)?,
        copy(source, target, tables::IDEMPOTENCY)?,
        copy(source, target, tables::AUDIT)?,
        copy(source, target, tables::GATE_MARKS)?,
        copy(source, target, tables::ESCALATIONS)?,
        copy(source, target, tables::ESCALATION_IDS)?,
        copy(source, target, tables::BLOBS)?,
        copy(source, target, tables::AGENTS)?,
        copy(source, target, tables::RUN_AGENTS)?,
    ];
    let tables = u32::try_from(counts.len()).unwrap_or(u32::MAX);
    Ok((tables, counts.iter().sum()))
}

/// Copies one table, row by row in key order; returns the rows copied.
fn copy<K: redb::Key + 'static, V: redb::Value + 'static>(
    source: &ReadTransaction,
    target: &WriteTransaction,
    definition: TableDefinition<'static, K, V>,
) -> Result<u64, CopyFailed> {
    let read = |e: ReadError| CopyFailed::Read(e);
    let from = match source.open_table(definition) {
        Ok(table) => table,
        // A store of an older format has no table its format did not have (a read-only open
        // does not upgrade): the backup is a faithful copy of that format, its `meta` says which.
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(read(e.into())),
    };
    let mut to = target
        .open_table(definition)
        .map_err(|e| CopyFailed::Write(Box::new(e)))?;
    let mut rows = 0u64;
    for entry in from.iter().map_err(|e| read(e.into()))? {
        let (key, value) = entry.map_err(|e| read(e.into()))?;
        to.insert(key.value(), value.value())
            .map_err(|e| CopyFailed::Write(Box::new(e)))?;
        rows += 1;
    }
    Ok(rows)
}
