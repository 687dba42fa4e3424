//! The store: opening, group commit, and the two ways in (a run's scope, the operator's catalog).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use redb::{
    ConcurrencyMode, Database, Durability, ReadOnlyDatabase, ReadableDatabase, ReadableTable,
    StorageBackend, WriteTransaction,
};

use crate::batch::{Applied, Staged, StagedWrite, WriteBatch};
use crate::catalog::Catalog;
use crate::error::{CommitError, OpenError, ReadError, StageError};
use crate::file::{AllocatedFile, FileMode};
use crate::guard::guarded;
use crate::journal::{self, AppendError, Journal};
use crate::known::Known;
use crate::limits::{LimitError, Limits};
use crate::model::{AgentProfile, RunId};
use crate::scope::RunScope;
use crate::snapshot::Snapshot;
use crate::tables;
use crate::writer::{Failure, Writer};

/// The store format this build writes into the `meta` table. Bumped only when the table layout (not a
/// record's shape: that is the codec's schema version) changes incompatibly: an older keel refuses a
/// newer format rather than write rows without the tables that must change with them. History: 1, the
/// first; 2, the open-runs index and plans in their own table (the `upgrade` module; a writable open
/// upgrades a format-1 store in its set-up transaction); 3, a task's state in its own table
/// (`task_states`: an update that leaves the once-written fields alone writes only the state; a
/// format-2 row is a format-3 row without a state, so the upgrade only adds the table); 4, a task's
/// session-log rows staged in one commit stored as one segment under the first row's key
/// (`log_segment`: a format-3 log is a format-4 log of single rows, so the upgrade moves nothing; an
/// older keel refuses the file rather than misread a segment); 5, the journal (`journal`): a store
/// written alone may hold commits only in `<file>.journal`, which an older keel would not replay
/// (the upgrade moves nothing); 6, a root's children not indexed in `task_children` (they are read
/// from the run's task rows, which list them anyway; a format-5 store's index rows for them are
/// left and not needed), and a run's manifest entries of one commit stored as one segment
/// (`log_segment`); the upgrade moves nothing; an older keel would miss the children a format-6
/// store did not index and misread a manifest segment.
pub const STORE_FORMAT: u64 = 6;

/// How a store is opened. A struct rather than arguments so later options do not break callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreConfig {
    /// The size limits enforced on every write and read.
    pub limits: Limits,
    /// Who else may open the file while this process has it open.
    pub sharing: Sharing,
    /// Whether a group commit asked to be [`Durability::Immediate`] is made durable by the store's
    /// journal (one record appended to `<file>.journal` and synced) rather than by a durable redb
    /// commit, which then comes every few dozen commits (the `journal` module's doc). Taken only
    /// with [`Sharing::Exclusive`]: a store shared with readers in other processes must show them
    /// every commit in its file. Whatever this says, a writable open replays a journal it finds.
    pub journal: bool,
    /// The most bytes of the file's pages redb keeps in memory for a file store. `None`:
    /// [`JOURNALED_CACHE_BYTES`] for a store opened with the journal, redb's own default (1 GiB)
    /// otherwise (docs/STORE.md, "The store file's backend and redb's cache").
    pub cache_bytes: Option<usize>,
}

/// The page cache of a journaled store unless [`StoreConfig::cache_bytes`] says otherwise. With
/// redb's 1 GiB a node held its whole store file in memory as it grew, every page new to the cache
/// a fresh allocation and its page faults; bounded, pages leaving it are reused. Only for the
/// journal's store: once redb's cache is full, a page it writes out is not kept, and the next
/// commit that touches it reads it back from the file. A journaled store writes its file out once
/// every 64 commits; a store that syncs the file at every commit would read its tables' right
/// edges back at every commit once its file outgrew the cache (`keel bench --scale-runs 10000
/// --scale-fan-out 1024`, whose store is shared: its run of 1,024 specialists on a 260 MiB store
/// took 117 to 125 ms in six runs with 64 MiB, 43 to 129 ms, four of six under 50, with redb's
/// default), so it keeps redb's default.
pub const JOURNALED_CACHE_BYTES: usize = 64 << 20;

/// Who else may open a store file while a writer has it open. A choice with a cost, so it is explicit:
/// sharing the file with readers in other processes rules out `Durability::None` commits, because
/// redb cannot show a commit that was never written to the file to another process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Sharing {
    /// This process alone: both durabilities work; [`Store::open_read_only`] from another process is
    /// refused while the store is open. The default, and the only mode of a custom backend.
    #[default]
    Exclusive,
    /// This process writes and any number of [`Store::open_read_only`] handles (the operator's
    /// `keel tasks` while a node runs) share the file and follow its commits. Every commit must be
    /// [`Durability::Immediate`]; a `None` commit fails with [`CommitError::Durability`].
    WithReaders,
}

impl Sharing {
    fn mode(self) -> ConcurrencyMode {
        match self {
            Self::Exclusive => ConcurrencyMode::ExclusiveWriter,
            Self::WithReaders => ConcurrencyMode::SingleWriter,
        }
    }
}

/// keel's durable model: one redb database holding every run, task, log row and record.
///
/// Per-run state is reached only through [`Store::run`] (a [`RunScope`]); store-wide reads for the
/// operator go through [`Store::catalog`]. Writes are staged through a scope and committed by
/// [`Store::commit_group`] with a durability chosen by the caller at every commit site.
///
/// `Store` is `Send + Sync`; redb serializes write transactions, so concurrent committers queue.
pub struct Store {
    pub(crate) db: Db,
    limits: Limits,
    /// The file, for errors that name it (`None` on a custom backend).
    file: Option<PathBuf>,
    /// What this store's own commits say exists (runs, tasks, the ends of logs), so a commit checks
    /// a write against it rather than reading the tables again; held by the one write transaction
    /// under way (redb runs one at a time), cleared whenever a commit does not succeed.
    known: Mutex<Known>,
    /// The journal that makes commits durable, when the store was opened with one, with the
    /// write transaction it keeps open (locked before a commit begins its transaction, and by a
    /// read before it begins its own).
    journal: Option<Mutex<JournalState>>,
}

/// The journal, the redb write transaction that holds the records not yet committed to redb, and
/// whether the journal can still be trusted: a record of a failed commit that could not be voided
/// may be replayed by the next open, so the store takes no further commit.
struct JournalState {
    journal: Journal,
    broken: bool,
    /// The write transaction that stays open from commit to commit, holding every record appended
    /// since redb last committed (none between a commit of it and the next journaled commit).
    open: Option<WriteTransaction>,
    /// The last record redb's committed state holds, as far as this process knows: when no
    /// transaction is open and records after it were appended, the transaction that held them was
    /// lost and the next use replays them (`Store::reapply`).
    held: u64,
}

impl std::fmt::Debug for JournalState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournalState")
            .field("journal", &self.journal)
            .field("broken", &self.broken)
            .field("open", &self.open.is_some())
            .field("held", &self.held)
            .finish()
    }
}

impl JournalState {
    /// Whether acknowledged records are neither in redb's committed state nor in an open
    /// transaction (the transaction that held them was dropped, or its commit failed: then redb
    /// takes no new write transaction and the store must be opened again, which replays them).
    fn lacks_records(&self) -> bool {
        self.open.is_none() && self.held < self.journal.last_seq()
    }
}

/// The first byte of every journal record's payload: how what follows is encoded. Version 2, what
/// this keel writes: the rows the commit inserted and removed (`redo`). Version 1, what keel wrote
/// before and still replays: the commit's staged writes (bincode 2, standard configuration, of
/// `[StagedWrite]`), applied through their checks again. A record of another version does not
/// replay: the open fails with [`OpenError::Journal`] rather than misread it.
const JOURNAL_PAYLOAD_VERSION: u8 = 2;
/// The payload version of records of staged writes (see [`JOURNAL_PAYLOAD_VERSION`]).
const JOURNAL_PAYLOAD_STAGED: u8 = 1;

/// The key in `meta` of the number of the last journal record a commit holds.
const JOURNAL_SEQ: &str = "journal_seq";
/// The key in `meta` of the epoch the journal's records are written under: every writable open
/// with a journal moves it on, durably, before its first record (`journal::scan`).
const JOURNAL_EPOCH: &str = "journal_epoch";

/// The journal's number and epoch as `meta` holds them (0 and 0 for a store that never had one).
fn journal_marks(
    meta: &impl ReadableTable<&'static str, u64>,
) -> Result<(u64, u32), redb::StorageError> {
    let seq = meta.get(JOURNAL_SEQ)?.map_or(0, |g| g.value());
    let epoch = meta.get(JOURNAL_EPOCH)?.map_or(0, |g| g.value());
    Ok((seq, u32::try_from(epoch % (1 << 32)).unwrap_or(0)))
}

impl Drop for Store {
    /// The open transaction's records are committed to redb (non-durably; redb makes its pending
    /// commits durable when the database closes, right after), so a clean close leaves a file that
    /// needs no replay. If that fails the journal still holds them for the next open.
    fn drop(&mut self) {
        if let Some(journal) = self.journal.as_mut() {
            let state = journal
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(txn) = state.open.take() {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| txn.commit()));
            }
        }
    }
}

/// A journal's IO failure as the commit's error (a full disk is [`CommitError::DiskFull`]).
fn io_error(e: std::io::Error) -> CommitError {
    CommitError::from(redb::StorageError::Io(e))
}

/// The journal beside the store file `file`.
fn journal_path(file: &Path) -> PathBuf {
    let mut path = file.as_os_str().to_owned();
    path.push(".journal");
    PathBuf::from(path)
}

/// The open database: a writer, or a read-only handle that follows a writer in another process.
pub(crate) enum Db {
    Writer(Database),
    Reader(ReadOnlyDatabase),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens the store file at `path` for writing, creating the file and its tables on first use, with
    /// the default [`Limits`] and [`Sharing::Exclusive`]. The parent directory must exist. One process
    /// writes a store at a time.
    ///
    /// # Errors
    /// [`OpenError::Database`] if the file is locked by another process, is not a redb database, or
    /// IO fails; [`OpenError::StoreFromFuture`] if a newer keel wrote it.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, OpenError> {
        Self::open_with(path, StoreConfig::default())
    }

    /// Like [`Store::open`] with explicit configuration. A new store file is created 0600 (the owner
    /// alone reads and writes it: it holds every transcript), by this `open` itself, before redb
    /// initialises the empty file; an existing file keeps its mode.
    ///
    /// # Errors
    /// As [`Store::open`].
    pub fn open_with(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, OpenError> {
        let file = path.as_ref().to_path_buf();
        create_private(&file)?;
        guarded(Some(&file), || {
            // As redb's own `create` opens it, behind a backend that gathers redb's writes until
            // its syncs and (without the journal, where every commit syncs the file) allocates
            // ahead of commits.
            let handle = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&file)
                .map_err(redb::DatabaseError::from)?;
            let keep = config.journal && config.sharing == Sharing::Exclusive;
            let mode = match config.sharing {
                Sharing::WithReaders => FileMode::Shared,
                Sharing::Exclusive if keep => FileMode::Journaled,
                Sharing::Exclusive => FileMode::Alone,
            };
            let backend = AllocatedFile::new(handle, mode)?;
            let mut builder = Database::builder();
            builder.set_concurrency_mode(config.sharing.mode());
            let journaled_cache = (mode == FileMode::Journaled).then_some(JOURNALED_CACHE_BYTES);
            if let Some(bytes) = config.cache_bytes.or(journaled_cache) {
                builder.set_cache_size(bytes);
            }
            let db = builder.create_with_backend(backend)?;
            let journal_file = journal_path(&file);
            let journal: Option<Box<dyn StorageBackend>> = if keep || journal_file.exists() {
                create_private(&journal_file)?;
                let handle = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&journal_file)
                    .map_err(redb::DatabaseError::from)?;
                Some(Box::new(redb::backends::FileBackend::new(handle)?))
            } else {
                None
            };
            Self::init(db, config, Some(file.clone()), journal.map(|j| (j, keep)))
        })
    }

    /// Opens an existing store file read-only, alongside the process that writes it if that one opened
    /// it with [`Sharing::WithReaders`] (a running node): the CLI's read commands use this so they
    /// work while a node holds the store. `config.sharing` is ignored (a reader always shares).
    /// Every commit on the returned store fails with [`CommitError::ReadOnly`].
    ///
    /// # Errors
    /// [`OpenError::Database`] if the file does not exist, is not a redb database, is held by an
    /// [`Sharing::Exclusive`] writer (`DatabaseAlreadyOpen`), or needs recovery after a crash (a
    /// read-only handle cannot repair it: open it once with [`Store::open`]);
    /// [`OpenError::StoreFromFuture`]; [`OpenError::NotAStore`] if the file holds no keel tables.
    pub fn open_read_only(path: impl AsRef<Path>, config: StoreConfig) -> Result<Self, OpenError> {
        let file = path.as_ref().to_path_buf();
        guarded(Some(&file), || {
            let mut builder = Database::builder();
            builder.set_concurrency_mode(Sharing::WithReaders.mode());
            if let Some(bytes) = config.cache_bytes {
                builder.set_cache_size(bytes);
            }
            let db = builder.open_read_only(&file)?;
            let txn = db.begin_read()?;
            let meta = match txn.open_table(tables::META) {
                Ok(meta) => meta,
                Err(redb::TableError::TableDoesNotExist(_)) => return Err(OpenError::NotAStore),
                Err(e) => return Err(e.into()),
            };
            let found = meta.get("store_format")?.map(|g| g.value());
            check_format(found)?;
            let (applied, epoch) = journal_marks(&meta)?;
            drop(meta);
            drop(txn);
            // Commits only the journal holds are not in the file yet: only a writable open can
            // replay them, and this handle would show the store without them.
            let journal_file = journal_path(&file);
            if journal_file.exists() {
                let handle =
                    std::fs::File::open(&journal_file).map_err(redb::DatabaseError::from)?;
                let backend = redb::backends::FileBackend::new(handle)?;
                let tail = journal::scan(&backend, applied, epoch)
                    .map_err(|e| OpenError::from(redb::DatabaseError::Storage(e.into())))?;
                if !tail.is_empty() {
                    return Err(OpenError::NeedsRecovery);
                }
            }
            Ok(Self {
                db: Db::Reader(db),
                limits: config.limits,
                file: Some(file.clone()),
                known: Mutex::new(Known::default()),
                journal: None,
            })
        })
    }

    /// Opens (or creates) a store on any redb [`StorageBackend`]: the simulator and the crash tests
    /// pass a [`crate::SimDisk`] here; reopening after a simulated crash is another call with the
    /// crashed disk.
    ///
    /// # Errors
    /// As [`Store::open`]; a backend that fails its IO gives [`OpenError::Database`].
    pub fn open_backend(
        backend: impl StorageBackend,
        config: StoreConfig,
    ) -> Result<Self, OpenError> {
        guarded(None, || {
            let db = Database::builder().create_with_backend(backend)?;
            Self::init(db, config, None, None)
        })
    }

    /// [`Store::open_backend`] with its journal on a backend of its own (`config.journal` is
    /// implied): the simulator passes a second [`crate::SimDisk`], and a crash reopens both.
    ///
    /// # Errors
    /// As [`Store::open_backend`]; a journal record that does not replay gives
    /// [`OpenError::Journal`].
    pub fn open_backend_journaled(
        backend: impl StorageBackend,
        journal: impl StorageBackend,
        config: StoreConfig,
    ) -> Result<Self, OpenError> {
        guarded(None, || {
            let db = Database::builder().create_with_backend(backend)?;
            Self::init(db, config, None, Some((Box::new(journal), true)))
        })
    }

    /// Sets the store up (format, tables) and replays its journal, if it has one; `journal` is the
    /// journal's file and whether commits go on using it.
    fn init(
        db: Database,
        config: StoreConfig,
        file: Option<PathBuf>,
        journal: Option<(Box<dyn StorageBackend>, bool)>,
    ) -> Result<Self, OpenError> {
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut meta = txn.open_table(tables::META)?;
            let found = meta.get("store_format")?.map(|g| g.value());
            check_format(found)?;
            if found.is_some_and(|f| f < crate::upgrade::FORMAT_OPEN_RUNS_INDEX) {
                crate::upgrade::to_open_runs_index(&txn)?;
            }
            if found != Some(STORE_FORMAT) {
                meta.insert("store_format", STORE_FORMAT)?;
            }
            txn.open_table(tables::RUNS)?;
            txn.open_table(tables::OPEN_RUNS)?;
            txn.open_table(tables::RUN_PLANS)?;
            txn.open_table(tables::TASKS)?;
            txn.open_table(tables::TASK_STATES)?;
            txn.open_table(tables::TASK_RUN)?;
            txn.open_table(tables::TASK_CHILDREN)?;
            txn.open_table(tables::SESSION_LOGS)?;
            txn.open_table(tables::CHECKPOINTS)?;
            txn.open_table(tables::MANIFEST)?;
            txn.open_table(tables::DEAD_LETTERS)?;
            txn.open_table(tables::IDEMPOTENCY)?;
            txn.open_table(tables::AUDIT)?;
            txn.open_table(tables::GATE_MARKS)?;
            txn.open_table(tables::ESCALATIONS)?;
            txn.open_table(tables::ESCALATION_IDS)?;
            txn.open_table(tables::BLOBS)?;
            txn.open_table(tables::AGENTS)?;
            txn.open_table(tables::RUN_AGENTS)?;
        }
        txn.commit()?;
        let mut store = Self {
            db: Db::Writer(db),
            limits: config.limits,
            file,
            known: Mutex::new(Known::default()),
            journal: None,
        };
        if let Some((file, keep)) = journal {
            let (next, epoch) = store.replay(&*file)?;
            if keep {
                let journal = Journal::new(file, next, epoch)
                    .map_err(|e| OpenError::from(redb::DatabaseError::Storage(e.into())))?;
                store.journal = Some(Mutex::new(JournalState {
                    journal,
                    broken: false,
                    open: None,
                    held: next.saturating_sub(1),
                }));
            }
        }
        Ok(store)
    }

    /// Applies, in one durable transaction, the journal's records that no durable commit holds
    /// yet (their rows; a record of staged writes through the same checks as any commit), and
    /// moves the journal's epoch on in the same transaction; answers the number the next record
    /// takes and the new epoch.
    fn replay(&self, file: &dyn StorageBackend) -> Result<(u64, u32), OpenError> {
        let Db::Writer(db) = &self.db else {
            return Err(OpenError::NeedsRecovery);
        };
        let (applied, epoch) = {
            let txn = db.begin_read()?;
            let meta = txn.open_table(tables::META)?;
            journal_marks(&meta)?
        };
        let records = journal::scan(file, applied, epoch)
            .map_err(|e| OpenError::from(redb::DatabaseError::Storage(e.into())))?;
        let last = records.last().map_or(applied, |r| r.seq);
        let next_epoch = epoch.wrapping_add(1);
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut known = self.known();
            known.clear();
            let mut writer = Writer::open(&txn, &self.limits, &mut known);
            for record in &records {
                apply_record(&mut writer, record).map_err(|f| f.into_open(record.seq))?;
            }
            writer.finish().map_err(|e| OpenError::Journal {
                seq: last,
                reason: e.to_string(),
            })?;
            known.clear();
        }
        {
            let mut meta = txn.open_table(tables::META)?;
            meta.insert(JOURNAL_SEQ, last)?;
            meta.insert(JOURNAL_EPOCH, u64::from(next_epoch))?;
        }
        txn.commit()?;
        Ok((last + 1, next_epoch))
    }

    /// The store file (`None` on a custom backend): what errors about the file name.
    pub fn file(&self) -> Option<&PathBuf> {
        self.file.as_ref()
    }

    /// The limits this store enforces.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The handle to one run's state. Every key it builds starts with `run`; a row of another run is
    /// `NotFound` through it and cannot be written through it. Creating a scope does no IO: a scope
    /// for a run that does not exist yet is how the run is created ([`RunScope::stage_create_run`]).
    pub fn run(&self, run: RunId) -> RunScope<'_> {
        RunScope::new(self, run)
    }

    /// The operator view: read-only, store-wide (list runs and tasks, locate a task's run). For the
    /// CLI's `keel tasks` / `keel show TASK`, never for an actor acting inside a run.
    pub fn catalog(&self) -> Catalog<'_> {
        Catalog::new(self)
    }

    /// An agent profile by name. Profiles are store-wide configuration (shared by all runs), so they
    /// are read from the store rather than through a run's scope; the supervisor resolves a task's
    /// model from its assignee's profile here.
    ///
    /// # Errors
    /// [`ReadError::NotFound`], [`ReadError::Decode`].
    pub fn agent_profile(&self, agent: &str) -> Result<AgentProfile, ReadError> {
        self.catalog().agent(agent)
    }

    /// Stages an agent profile write (store-wide: profiles are shared by all runs).
    ///
    /// # Errors
    /// [`StageError::Limit`] if a field is over its limit.
    pub fn stage_put_agent(
        &self,
        profile: AgentProfile,
    ) -> Result<StagedWrite<'static>, StageError> {
        self.check_agent(&profile)?;
        Ok(StagedWrite {
            staged: Staged::Agent(profile),
        })
    }

    /// The checks a profile passes before it is staged, store-wide or for one run: its fields within
    /// their limits, and a name (the key it is found by).
    pub(crate) fn check_agent(&self, profile: &AgentProfile) -> Result<(), StageError> {
        self.limits.check_agent(profile)?;
        if profile.name.is_empty() {
            return Err(StageError::Invalid {
                field: "agent.name",
                reason: "empty",
            });
        }
        Ok(())
    }

    /// Commits one staged write in its own transaction.
    ///
    /// # Errors
    /// As [`Store::commit_group`].
    pub fn commit_one(
        &self,
        write: StagedWrite<'_>,
        durability: Durability,
    ) -> Result<Applied, CommitError> {
        self.in_write_txn(durability, |writer| {
            writer.apply(&write).map_err(|f| f.at(0))
        })
    }

    /// Commits every staged write of `batch` in one write transaction (one fsync with
    /// [`Durability::Immediate`]), in batch order, and returns one [`Applied`] per write at the same
    /// index. Either all of them are committed or none is.
    ///
    /// `durability` is explicit at every call: `Immediate` is durable when this returns; `None` is
    /// visible to readers at once but lost on a crash unless a later `Immediate` commit follows.
    ///
    /// # Errors
    /// [`CommitError::Item`] names the first write that could not be applied (nothing committed);
    /// [`CommitError::DiskFull`] / [`CommitError::Storage`] for the backend (nothing committed, earlier
    /// commits intact; reopen the store before writing again).
    pub fn commit_group(
        &self,
        batch: WriteBatch<'_>,
        durability: Durability,
    ) -> Result<Vec<Applied>, CommitError> {
        self.commit_batch(&batch, durability)
    }

    /// [`Store::commit_group`] by reference: the caller keeps the batch, so after a
    /// [`CommitError::Item`] it can [`WriteBatch::remove`] the failing write (and answer its caller)
    /// and commit the rest again, without one bad write failing every caller of a group.
    ///
    /// # Errors
    /// As [`Store::commit_group`].
    pub fn commit_batch(
        &self,
        batch: &WriteBatch<'_>,
        durability: Durability,
    ) -> Result<Vec<Applied>, CommitError> {
        let count = u64::try_from(batch.items.len()).unwrap_or(u64::MAX);
        if count > self.limits.batch_items_max {
            return Err(CommitError::BatchTooLarge(LimitError {
                field: "batch.items",
                size: count,
                limit: self.limits.batch_items_max,
            }));
        }
        self.in_write_txn(durability, |writer| {
            let mut applied = Vec::with_capacity(batch.items.len());
            for (index, write) in batch.items.iter().enumerate() {
                applied.push(writer.apply(write).map_err(|f| f.at(index))?);
            }
            Ok(applied)
        })
    }

    /// Runs `work` in one write transaction with `durability`; commits if it succeeds, aborts if not.
    fn in_write_txn<R>(
        &self,
        durability: Durability,
        work: impl FnOnce(&mut Writer<'_>) -> Result<R, CommitError>,
    ) -> Result<R, CommitError> {
        let Db::Writer(db) = &self.db else {
            return Err(CommitError::ReadOnly);
        };
        match &self.journal {
            None => guarded(self.file(), || self.commit_in_redb(db, durability, work)),
            Some(journal) => guarded(self.file(), || {
                self.commit_in_journal(db, journal, durability, work)
            }),
        }
    }

    /// A commit without a journal: its own redb transaction, committed with `durability`.
    fn commit_in_redb<R>(
        &self,
        db: &Database,
        durability: Durability,
        work: impl FnOnce(&mut Writer<'_>) -> Result<R, CommitError>,
    ) -> Result<R, CommitError> {
        let mut txn = db.begin_write()?;
        txn.set_durability(durability)?;
        let mut known = self.known();
        known.bound();
        let outcome = {
            let mut writer = Writer::open(&txn, &self.limits, &mut known);
            work(&mut writer).and_then(|result| writer.finish().map(|finished| (result, finished)))
        };
        let committed = outcome.and_then(|done| txn.commit().map(|()| done).map_err(Into::into));
        settled(&mut known, committed)
    }

    /// A commit with the journal: `work` applies the writes in the open transaction, then the
    /// record is appended (and synced when `durability` is `Immediate`), which acknowledges the
    /// commit; the transaction stays open for the next one. The commit that comes when
    /// [`Journal::durable_due`] is instead a durable redb commit of the open transaction, after which
    /// the journal starts over.
    fn commit_in_journal<R>(
        &self,
        db: &Database,
        journal: &Mutex<JournalState>,
        durability: Durability,
        work: impl FnOnce(&mut Writer<'_>) -> Result<R, CommitError>,
    ) -> Result<R, CommitError> {
        // Held for the whole commit, so records are in commit order and the open transaction has
        // one user.
        let mut state = journal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.broken {
            return Err(CommitError::JournalBroken);
        }
        let mut txn = self.open_transaction(db, &mut state)?;
        let mut known = self.known();
        known.bound();
        // The rows are recorded, straight into the journal's next record, unless this commit is
        // the durable redb commit, which needs no record.
        let durable = state.journal.durable_due();
        let outcome = {
            let mut writer = Writer::open(&txn, &self.limits, &mut known);
            if !durable {
                let record = state.journal.record();
                record.push(JOURNAL_PAYLOAD_VERSION);
                writer = writer.recording(record);
            }
            work(&mut writer).and_then(|result| writer.finish().map(|finished| (result, finished)))
        };
        // From here until the record is appended, a failure drops `txn` (redb aborts it) with the
        // records of earlier commits it held: `lacks_records` then has the next use replay them.
        let outcome = outcome.and_then(|done| {
            if durable {
                // The journal starts over after this commit: it must hold every record so far,
                // whatever this commit asked for.
                txn.set_durability(Durability::Immediate)?;
                txn.commit()?;
                state.held = state.journal.last_seq();
                state.journal.restart();
                return Ok(done);
            }
            let seq = state.journal.next_seq();
            txn.open_table(tables::META)?.insert(JOURNAL_SEQ, seq)?;
            let record = state
                .journal
                .append_recorded(matches!(durability, Durability::Immediate));
            match record {
                Ok(_) => {
                    state.open = Some(txn);
                    Ok(done)
                }
                Err(AppendError::Failed(e)) => Err(io_error(e)),
                Err(AppendError::Unvoided) => {
                    state.broken = true;
                    Err(CommitError::JournalBroken)
                }
            }
        });
        settled(&mut known, outcome)
    }

    /// The transaction the next journaled commit applies its writes in: the open one, or a new
    /// one (non-durable) that first replays the records a lost one held.
    fn open_transaction(
        &self,
        db: &Database,
        state: &mut JournalState,
    ) -> Result<WriteTransaction, CommitError> {
        if let Some(txn) = state.open.take() {
            return Ok(txn);
        }
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::None)?;
        if state.lacks_records() {
            self.reapply(&txn, state)?;
        }
        Ok(txn)
    }

    /// Replays into `txn` the journal's records that redb's committed state does not hold (by the
    /// number in its `meta`), up to the last one appended: the transaction that held them was
    /// dropped (a group that failed its checks partway, a failed append). The same records,
    /// as a writable open would replay.
    fn reapply(&self, txn: &WriteTransaction, state: &JournalState) -> Result<(), CommitError> {
        let (applied, _) = journal_marks(&txn.open_table(tables::META)?)?;
        let last = state.journal.last_seq();
        if applied >= last {
            return Ok(());
        }
        let records = journal::scan(state.journal.file(), applied, state.journal.epoch())
            .map_err(io_error)?;
        let mut known = self.known();
        known.clear();
        let replayed = (|| {
            let mut writer = Writer::open(txn, &self.limits, &mut known);
            let mut replayed = applied;
            for record in records.iter().filter(|r| r.seq <= last) {
                apply_record(&mut writer, record).map_err(|f| f.into_commit(record.seq))?;
                replayed = record.seq;
            }
            writer.finish()?;
            Ok::<_, CommitError>(replayed)
        })();
        // What the replay taught the cache is only good once it is committed with the rest; a
        // commit after this one learns it again from the transaction.
        known.clear();
        let replayed = replayed?;
        if replayed != last {
            return Err(CommitError::Journal {
                seq: replayed + 1,
                reason: "the journal no longer holds this acknowledged record".to_string(),
            });
        }
        txn.open_table(tables::META)?.insert(JOURNAL_SEQ, last)?;
        Ok(())
    }

    /// Commits the open transaction (or replays what a lost one held and commits that) so that
    /// every acknowledged commit is in redb: non-durably before a redb read transaction is handed
    /// out ([`Store::begin_read`]: maintenance's copy, tests), durably (`durable`) before
    /// maintenance takes the database, after which the journal starts over.
    fn publish(&self, durable: bool) -> Result<(), CommitError> {
        let (Db::Writer(db), Some(journal)) = (&self.db, &self.journal) else {
            return Ok(());
        };
        let mut state = journal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let needed =
            state.open.is_some() || state.lacks_records() || (durable && state.journal.pending());
        if !needed {
            return Ok(());
        }
        let mut txn = self.open_transaction(db, &mut state)?;
        if durable {
            txn.set_durability(Durability::Immediate)?;
        }
        txn.commit()?;
        state.held = state.journal.last_seq();
        if durable {
            state.journal.restart();
        }
        Ok(())
    }

    /// Makes every commit so far durable in the store file (a durable redb commit) if the journal
    /// holds any the file does not; the journal starts over. Maintenance calls it before it takes
    /// the database.
    ///
    /// # Errors
    /// As a commit's.
    pub(crate) fn settle_journal(&self) -> Result<(), CommitError> {
        guarded(self.file(), || self.publish(true))
    }

    /// The writer's cache, for the one write transaction under way. A panic caught by the guard
    /// in an earlier transaction left it poisoned and perhaps half updated: it starts over empty.
    fn known(&self) -> MutexGuard<'_, Known> {
        match self.known.lock() {
            Ok(known) => known,
            Err(poisoned) => {
                let mut known = poisoned.into_inner();
                known.clear();
                self.known.clear_poison();
                known
            }
        }
    }

    /// Forgets what the writer's cache holds: maintenance is about to take the database (an
    /// integrity check that repairs the file can drop the last commit).
    pub(crate) fn forget_known(&mut self) {
        match self.known.get_mut() {
            Ok(known) => known.clear(),
            Err(poisoned) => poisoned.into_inner().clear(),
        }
        self.known.clear_poison();
    }

    /// Runs `work` on a snapshot holding every acknowledged commit, guarded: a damaged page (redb's
    /// `Corrupted`, or a panic inside redb) comes back as [`ReadError::Corrupt`] naming the file.
    /// Every read of the catalog and of a run's scope goes through here.
    ///
    /// A journaled store that holds commits redb has not committed yet (its open transaction, or
    /// records a dropped one held) is read in that open transaction, under the journal's lock, and
    /// it stays open: a read costs no commit. Otherwise `work` gets a read transaction, and the
    /// lock is not held while it runs.
    pub(crate) fn read<T>(
        &self,
        work: impl FnOnce(&Snapshot<'_>) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        guarded(self.file(), || {
            if let (Db::Writer(db), Some(journal)) = (&self.db, &self.journal) {
                let mut state = journal
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if state.open.is_some() || state.lacks_records() {
                    let txn = self
                        .open_transaction(db, &mut state)
                        .map_err(ReadError::from_publish)?;
                    let outcome = work(&Snapshot::Open(&txn));
                    // A read that met a failing or damaged store (or redb refusing it) gives the
                    // transaction up, and the next commit or read rebuilds it from the journal; a
                    // row that is missing, too many or undecodable says nothing against it.
                    if matches!(
                        outcome,
                        Ok(_)
                            | Err(ReadError::NotFound { .. }
                                | ReadError::TooManyRows(_)
                                | ReadError::Decode(_))
                    ) {
                        state.open = Some(txn);
                    }
                    return outcome;
                }
            }
            work(&Snapshot::Committed(self.begin_read()?))
        })
    }

    /// A read transaction that sees every acknowledged commit: the journal's open transaction is
    /// committed (non-durably) first.
    pub(crate) fn begin_read(&self) -> Result<redb::ReadTransaction, ReadError> {
        self.publish(false).map_err(ReadError::from_publish)?;
        Ok(match &self.db {
            Db::Writer(db) => db.begin_read()?,
            Db::Reader(db) => db.begin_read()?,
        })
    }
}

/// The writer's cache after a commit: a committed one forgets the runs it finished; one that did
/// not commit forgets all its transaction taught it (the transaction is dropped, and redb aborts
/// it, or it was the journal's open one and is rebuilt from the journal).
fn settled<R>(
    known: &mut Known,
    outcome: Result<(R, Vec<u128>), CommitError>,
) -> Result<R, CommitError> {
    match outcome {
        Ok((result, finished)) => {
            for run in finished {
                known.forget_run(run);
            }
            Ok(result)
        }
        Err(e) => {
            known.clear();
            Err(e)
        }
    }
}

/// Why a journal record did not apply.
enum RecordFailure {
    /// The storage under the transaction failed (IO, a full disk, damage): not the record's fault.
    Storage(CommitError),
    /// The record itself: another payload version, a payload that does not decode, or a write
    /// its checks refuse.
    Record(String),
}

impl RecordFailure {
    /// As a commit's error: a storage failure as itself, the record's as [`CommitError::Journal`].
    fn into_commit(self, seq: u64) -> CommitError {
        match self {
            Self::Storage(e) => e,
            Self::Record(reason) => CommitError::Journal { seq, reason },
        }
    }

    /// As an open's error: a storage failure as the database's, the record's as
    /// [`OpenError::Journal`].
    fn into_open(self, seq: u64) -> OpenError {
        match self {
            Self::Storage(CommitError::Storage(e) | CommitError::DiskFull(e)) => {
                OpenError::from(redb::DatabaseError::Storage(e))
            }
            Self::Storage(other) => OpenError::Journal {
                seq,
                reason: other.to_string(),
            },
            Self::Record(reason) => OpenError::Journal { seq, reason },
        }
    }
}

/// Applies one journal record through `writer`: its rows (payload version 2), or its staged writes
/// through their checks (version 1).
fn apply_record(writer: &mut Writer<'_>, record: &journal::Record) -> Result<(), RecordFailure> {
    let as_record = |f| match f {
        Failure::Commit(e) => RecordFailure::Storage(e),
        Failure::Item(item) => RecordFailure::Record(item.to_string()),
    };
    let body = match record.payload.split_first() {
        Some((&JOURNAL_PAYLOAD_VERSION, rows)) => {
            // A record is trusted once its CRC matches, and redb's decoding of a table's key and
            // value types panics on bytes it cannot read: rows that do not decode (a keel bug, not
            // a torn write) fail the record, not the process.
            let replayed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.replay(rows)));
            return match replayed {
                Ok(done) => done.map_err(as_record),
                Err(_) => Err(RecordFailure::Record(
                    "a row of the record does not decode as its table's types".to_string(),
                )),
            };
        }
        Some((&JOURNAL_PAYLOAD_STAGED, body)) => body,
        other => {
            return Err(RecordFailure::Record(format!(
                "payload version {:?}, this keel reads {JOURNAL_PAYLOAD_STAGED} and \
                 {JOURNAL_PAYLOAD_VERSION}",
                other.map(|(version, _)| version)
            )));
        }
    };
    let (writes, _): (Vec<StagedWrite<'static>>, usize) =
        bincode::serde::decode_from_slice(body, bincode::config::standard())
            .map_err(|e| RecordFailure::Record(e.to_string()))?;
    for write in &writes {
        writer.apply(write).map_err(as_record)?;
    }
    Ok(())
}

/// Creates the store file (or its journal) 0600 if it does not exist (redb would create it with the
/// process's umask, 0644 on most systems, readable by every local user), and syncs the directory
/// that holds it: the file's entry is the directory's data, and without the sync a power loss could
/// lose a new file with the commits already made durable in it; a failed sync fails the open. The
/// directory is synced for an existing file too (one fsync an open, its failure ignored), since the
/// open that created it may have died before its own sync. An existing file's mode is left alone.
fn create_private(file: &Path) -> Result<(), OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e| OpenError::from(redb::DatabaseError::Storage(redb::StorageError::Io(e)));
    let created = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
    {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(io(e)),
    };
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match std::fs::File::open(dir).and_then(|dir| dir.sync_all()) {
        Err(e) if created => Err(io(e)),
        // For a file that was there, the sync is a second chance, not a condition of the open.
        _ => Ok(()),
    }
}

fn check_format(found: Option<u64>) -> Result<(), OpenError> {
    match found {
        Some(found) if found > STORE_FORMAT => Err(OpenError::StoreFromFuture {
            found: u8::try_from(found).unwrap_or(u8::MAX),
            supported: u8::try_from(STORE_FORMAT).unwrap_or(u8::MAX),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::model::{Budget, Run, RunStatus};
    use crate::sim_disk::SimDisk;

    /// A store's configuration with its journal.
    fn journaled() -> StoreConfig {
        StoreConfig {
            journal: true,
            ..StoreConfig::default()
        }
    }

    /// A running run with id `id`.
    fn running(id: RunId) -> Run {
        Run {
            id,
            brief: "brief".into(),
            plan: None,
            status: RunStatus::Running,
            budget: Budget::default(),
            created_ms: 1,
            updated_ms: 1,
            config_snapshot: String::new(),
            outcome: None,
        }
    }

    /// Appends `payload` to the store's journal as a record of its own, synced.
    fn append_raw(store: &Store, payload: &[u8]) {
        let mut state = store.journal.as_ref().unwrap().lock().unwrap();
        assert!(state.journal.append(payload, true).is_ok());
    }

    /// Whether the journal holds an open transaction now.
    fn is_open(store: &Store) -> bool {
        let journal = store.journal.as_ref().unwrap();
        journal.lock().unwrap().open.is_some()
    }

    /// A read between journaled commits reads the open transaction and leaves it open (a read
    /// used to commit it: a redb commit per read), read after read.
    #[test]
    fn a_read_leaves_the_open_transaction_open() {
        let store =
            Store::open_backend_journaled(SimDisk::new(), SimDisk::new(), journaled()).unwrap();
        let id = RunId(1 << 90);
        let scope = store.run(id);
        let run = running(id);
        let mut batch = WriteBatch::new();
        batch.push(scope.stage_create_run(run).unwrap());
        store.commit_group(batch, Durability::Immediate).unwrap();
        assert!(is_open(&store));
        assert_eq!(scope.get().unwrap().id, id);
        assert!(is_open(&store), "the read committed the open transaction");
        assert_eq!(scope.get().unwrap().brief, "brief");
        assert!(is_open(&store));
    }

    /// A journal whose records carry staged writes (payload version 1, what keel wrote before
    /// records carried rows) still replays, record for record after those of rows.
    #[test]
    fn a_record_of_staged_writes_replays_after_records_of_rows() {
        use crate::model::{ManifestEntry, ManifestOutcome};
        let (disk, journal) = (SimDisk::new(), SimDisk::new());
        let store =
            Store::open_backend_journaled(disk.clone(), journal.clone(), journaled()).unwrap();
        let id = RunId(1 << 90);
        let scope = store.run(id);
        let run = running(id);
        // Record 1, of rows: the run.
        store
            .commit_one(scope.stage_create_run(run).unwrap(), Durability::Immediate)
            .unwrap();
        // Record 2, as keel wrote it before: a manifest entry's staged write.
        let entry = ManifestEntry {
            ts_ms: 2,
            item: "step one".into(),
            task_id: None,
            outcome: ManifestOutcome::Processed,
        };
        let write = scope.stage_append_manifest(entry.clone()).unwrap();
        let mut payload = vec![JOURNAL_PAYLOAD_STAGED];
        bincode::serde::encode_into_std_write(
            std::slice::from_ref(&write),
            &mut payload,
            bincode::config::standard(),
        )
        .unwrap();
        append_raw(&store, &payload);
        // The power goes: redb's file holds neither; the journal holds both.
        drop(store);
        let store =
            Store::open_backend_journaled(disk.crash(), journal.crash(), journaled()).unwrap();
        let scope = store.run(id);
        assert_eq!(scope.get().unwrap().brief, "brief");
        let manifest = scope.manifest(0, 10).unwrap().items;
        assert_eq!(manifest.len(), 1);
        assert_eq!((manifest[0].seq, &manifest[0].value), (1, &entry));
    }

    /// A record of another payload version fails the open with the record's number, rather than
    /// being misread.
    #[test]
    fn a_record_of_an_unknown_payload_version_fails_the_open() {
        let (disk, journal) = (SimDisk::new(), SimDisk::new());
        let store =
            Store::open_backend_journaled(disk.clone(), journal.clone(), journaled()).unwrap();
        append_raw(&store, &[9, 1, 2, 3]);
        drop(store);
        let opened = Store::open_backend_journaled(disk.crash(), journal.crash(), journaled());
        assert!(
            matches!(&opened, Err(OpenError::Journal { seq: 1, reason }) if reason.contains("payload version")),
            "{opened:?}"
        );
    }
}
