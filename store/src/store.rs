//! The store: opening, group commit, and the two ways in (a run's scope, the operator's catalog).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use redb::{
    ConcurrencyMode, Database, Durability, ReadOnlyDatabase, ReadableDatabase, ReadableTable,
    StorageBackend, Table,
};

use crate::batch::{Applied, RunOp, Staged, StagedWrite, WriteBatch};
use crate::catalog::Catalog;
use crate::codec::{self, DecodeError};
use crate::error::{CommitError, ItemError, OpenError, ReadError, StageError};
use crate::file::AllocatedFile;
use crate::guard::guarded;
use crate::limits::{LimitError, Limits};
use crate::model::{
    AgentProfile, AttachmentBody, Escalation, IdempotencyRecord, Run, RunId, Task, TaskId,
};
use crate::scope::RunScope;
use crate::tables::{self, Row, name};
use crate::task_state::{StateOf, TaskHead};

/// The store format this build writes into the `meta` table. Bumped only when the table layout (not a
/// record's shape: that is the codec's schema version) changes incompatibly: an older keel refuses a
/// newer format rather than write rows without the tables that must change with them. History: 1, the
/// first; 2, the open-runs index and plans in their own table (the `upgrade` module; a writable open
/// upgrades a format-1 store in its set-up transaction); 3, a task's state in its own table
/// (`task_states`: an update that leaves the once-written fields alone writes only the state; a
/// format-2 row is a format-3 row without a state, so the upgrade only adds the table).
pub const STORE_FORMAT: u64 = 3;

/// How a store is opened. A struct rather than arguments so later options do not break callers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreConfig {
    /// The size limits enforced on every write and read.
    pub limits: Limits,
    /// Who else may open the file while this process has it open.
    pub sharing: Sharing,
}

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
            // As redb's own `create` opens it, behind a backend that allocates ahead of commits.
            let handle = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&file)
                .map_err(redb::DatabaseError::from)?;
            let db = Database::builder()
                .set_concurrency_mode(config.sharing.mode())
                .create_with_backend(AllocatedFile::new(handle)?)?;
            Self::init(db, config, Some(file.clone()))
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
            let db = Database::builder()
                .set_concurrency_mode(Sharing::WithReaders.mode())
                .open_read_only(&file)?;
            let txn = db.begin_read()?;
            let meta = match txn.open_table(tables::META) {
                Ok(meta) => meta,
                Err(redb::TableError::TableDoesNotExist(_)) => return Err(OpenError::NotAStore),
                Err(e) => return Err(e.into()),
            };
            let found = meta.get("store_format")?.map(|g| g.value());
            check_format(found)?;
            drop(meta);
            drop(txn);
            Ok(Self {
                db: Db::Reader(db),
                limits: config.limits,
                file: Some(file.clone()),
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
            Self::init(db, config, None)
        })
    }

    fn init(db: Database, config: StoreConfig, file: Option<PathBuf>) -> Result<Self, OpenError> {
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
        Ok(Self {
            db: Db::Writer(db),
            limits: config.limits,
            file,
        })
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
        guarded(self.file(), || {
            let mut txn = db.begin_write()?;
            txn.set_durability(durability)?;
            let outcome = work(&mut Writer::open(&txn, &self.limits));
            match outcome {
                Ok(result) => {
                    txn.commit()?;
                    Ok(result)
                }
                Err(e) => {
                    // The first failure is the one worth reporting; an abort that also fails leaves
                    // the transaction uncommitted all the same.
                    let _ = txn.abort();
                    Err(e)
                }
            }
        })
    }

    /// Runs `work` in one read transaction, guarded: a damaged page (redb's `Corrupted`, or a panic
    /// inside redb) comes back as [`ReadError::Corrupt`] naming the file. Every read of the
    /// catalog and of a run's scope goes through here.
    pub(crate) fn read<T>(
        &self,
        work: impl FnOnce(&redb::ReadTransaction) -> Result<T, ReadError>,
    ) -> Result<T, ReadError> {
        guarded(self.file(), || work(&self.begin_read()?))
    }

    pub(crate) fn begin_read(&self) -> Result<redb::ReadTransaction, ReadError> {
        Ok(match &self.db {
            Db::Writer(db) => db.begin_read()?,
            Db::Reader(db) => db.begin_read()?,
        })
    }
}

/// Creates the store file 0600 if it does not exist (redb would create it with the process's umask,
/// 0644 on most systems, readable by every local user). An existing file is left alone.
fn create_private(file: &Path) -> Result<(), OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(file)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(OpenError::from(redb::DatabaseError::Storage(
            redb::StorageError::Io(e),
        ))),
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

/// Attachments moved to the blob table: (attachment index, blob key).
type Blobbed = Vec<(u32, u128)>;

/// Why one write of a batch could not be applied.
pub(crate) enum Failure {
    Item(ItemError),
    Commit(CommitError),
}

impl Failure {
    /// The commit error for the write at `index` of its batch.
    fn at(self, index: usize) -> CommitError {
        match self {
            Failure::Item(error) => CommitError::Item {
                index: u32::try_from(index).unwrap_or(u32::MAX),
                error,
            },
            Failure::Commit(e) => e,
        }
    }
}

impl From<redb::StorageError> for Failure {
    fn from(e: redb::StorageError) -> Self {
        Self::Commit(e.into())
    }
}

impl From<ItemError> for Failure {
    fn from(e: ItemError) -> Self {
        Self::Item(e)
    }
}

impl From<DecodeError> for Failure {
    fn from(e: DecodeError) -> Self {
        Self::Item(ItemError::Decode(e))
    }
}

impl From<codec::EncodeError> for Failure {
    fn from(e: codec::EncodeError) -> Self {
        Self::Item(ItemError::Encode(e))
    }
}

/// The next sequence number under `prefix` in a `(prefix, seq)` table: 1 for an empty range.
fn next_seq<T: ReadableTable<tables::RunSeq, Row>>(
    table: &T,
    run: u128,
    name: &'static str,
) -> Result<u64, Failure> {
    let last = match table.range((run, 0u64)..=(run, u64::MAX))?.next_back() {
        None => None,
        Some(entry) => Some(entry?.0.value().1),
    };
    following(last, name)
}

/// The sequence number after `last` (1 when nothing is stored yet); a sequence that would pass
/// `u64::MAX` is the table's item error, not a wrap.
fn following(last: Option<u64>, name: &'static str) -> Result<u64, Failure> {
    match last {
        None => Ok(1),
        Some(k) => k
            .checked_add(1)
            .ok_or(Failure::Item(ItemError::SequenceExhausted(name))),
    }
}

/// A table of a write transaction, opened on first use: a commit that touches two tables opens (and
/// at commit flushes and closes) two, not all thirteen, which is most of a small commit's fixed cost.
struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    txn: &'t redb::WriteTransaction,
    definition: redb::TableDefinition<'static, K, V>,
    table: Option<Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(
        txn: &'t redb::WriteTransaction,
        definition: redb::TableDefinition<'static, K, V>,
    ) -> Self {
        Self {
            txn,
            definition,
            table: None,
        }
    }

    fn open(&mut self) -> Result<&mut Table<'t, K, V>, Failure> {
        let table = match self.table.take() {
            Some(table) => table,
            None => self
                .txn
                .open_table(self.definition)
                .map_err(|e| Failure::Commit(e.into()))?,
        };
        Ok(self.table.insert(table))
    }
}

/// The tables of one write transaction, applying staged writes in order.
struct Writer<'t> {
    limits: &'t Limits,
    runs: Lazy<'t, u128, Row>,
    open_runs: Lazy<'t, u128, ()>,
    plans: Lazy<'t, u128, &'static [u8]>,
    tasks: Lazy<'t, tables::RunPair, Row>,
    task_states: Lazy<'t, tables::RunPair, Row>,
    task_run: Lazy<'t, u128, u128>,
    children: Lazy<'t, tables::RunTriple, ()>,
    logs: Lazy<'t, tables::RunTaskSeq, Row>,
    checkpoints: Lazy<'t, u128, Row>,
    manifest: Lazy<'t, tables::RunSeq, Row>,
    dead_letters: Lazy<'t, tables::RunSeq, Row>,
    idempotency: Lazy<'t, (u128, &'static str), Row>,
    audit: Lazy<'t, tables::RunSeq, Row>,
    gate_marks: Lazy<'t, tables::RunSeq, Row>,
    escalations: Lazy<'t, tables::RunSeq, Row>,
    escalation_ids: Lazy<'t, u128, tables::RunSeq>,
    blobs: Lazy<'t, tables::RunPair, &'static [u8]>,
    agents: Lazy<'t, &'static str, Row>,
    run_agents: Lazy<'t, (u128, &'static str), Row>,
    /// Runs known to exist in this transaction, so a batch of N rows for one run checks it once.
    known_runs: BTreeSet<u128>,
    /// Tasks known to exist in this transaction (created in it, or found by a lookup), with the
    /// sequence number of their newest log row once it is known: a batch's log rows of one task
    /// (a dispatch's decision rows on the root task, an attempt's rows) look the task and its
    /// log's end up once, not once per row. Tasks are never deleted inside a commit, and only this
    /// writer appends to a task's log in it, so what is cached stays true until the commit ends.
    known_tasks: BTreeMap<(u128, u128), Option<u64>>,
}

impl<'t> Writer<'t> {
    fn open(txn: &'t redb::WriteTransaction, limits: &'t Limits) -> Self {
        Self {
            limits,
            runs: Lazy::new(txn, tables::RUNS),
            open_runs: Lazy::new(txn, tables::OPEN_RUNS),
            plans: Lazy::new(txn, tables::RUN_PLANS),
            tasks: Lazy::new(txn, tables::TASKS),
            task_states: Lazy::new(txn, tables::TASK_STATES),
            task_run: Lazy::new(txn, tables::TASK_RUN),
            children: Lazy::new(txn, tables::TASK_CHILDREN),
            logs: Lazy::new(txn, tables::SESSION_LOGS),
            checkpoints: Lazy::new(txn, tables::CHECKPOINTS),
            manifest: Lazy::new(txn, tables::MANIFEST),
            dead_letters: Lazy::new(txn, tables::DEAD_LETTERS),
            idempotency: Lazy::new(txn, tables::IDEMPOTENCY),
            audit: Lazy::new(txn, tables::AUDIT),
            gate_marks: Lazy::new(txn, tables::GATE_MARKS),
            escalations: Lazy::new(txn, tables::ESCALATIONS),
            escalation_ids: Lazy::new(txn, tables::ESCALATION_IDS),
            blobs: Lazy::new(txn, tables::BLOBS),
            agents: Lazy::new(txn, tables::AGENTS),
            run_agents: Lazy::new(txn, tables::RUN_AGENTS),
            known_runs: BTreeSet::new(),
            known_tasks: BTreeMap::new(),
        }
    }

    /// Whether task `task` of `run` is stored (or staged earlier in this transaction).
    fn task_exists(&mut self, run: RunId, task: TaskId) -> Result<bool, Failure> {
        if self.known_tasks.contains_key(&(run.0, task.0)) {
            return Ok(true);
        }
        let found = self.tasks.open()?.get((run.0, task.0))?.is_some();
        if found {
            self.known_tasks.insert((run.0, task.0), None);
        }
        Ok(found)
    }

    /// The sequence number the next log row of a stored task takes (1 for its first row), read
    /// from the log's end once per transaction and counted on from there.
    fn next_log_seq(&mut self, run: RunId, task: TaskId) -> Result<u64, Failure> {
        let last = match self.known_tasks.get(&(run.0, task.0)).copied().flatten() {
            Some(last) => Some(last),
            None => {
                let mut range = self
                    .logs
                    .open()?
                    .range((run.0, task.0, 0u64)..=(run.0, task.0, u64::MAX))?;
                match range.next_back() {
                    None => None,
                    Some(entry) => Some(entry?.0.value().2),
                }
            }
        };
        let seq = following(last, name::SESSION_LOGS)?;
        self.known_tasks.insert((run.0, task.0), Some(seq));
        Ok(seq)
    }

    fn require_run(&mut self, run: RunId) -> Result<(), Failure> {
        if self.known_runs.contains(&run.0) {
            return Ok(());
        }
        if self.runs.open()?.get(run.0)?.is_none() {
            return Err(ItemError::RunNotFound(run).into());
        }
        self.known_runs.insert(run.0);
        Ok(())
    }

    /// The once-written fields of a stored task of `run`, `None` when the task is not stored: read
    /// from the row's leading fields only, which every schema version lays out alike, instead of
    /// decoding the whole row.
    fn stored_head(&mut self, run: RunId, task: TaskId) -> Result<Option<TaskHead>, Failure> {
        match self.tasks.open()?.get((run.0, task.0))? {
            None => Ok(None),
            Some(g) => Ok(Some(codec::decode_prefix(
                name::TASKS,
                &format_args!("{run}/{task}"),
                g.value(),
            )?)),
        }
    }

    fn put_blob(&mut self, run: RunId, bytes: &[u8]) -> Result<(u128, u64), Failure> {
        let last = {
            let mut range = self
                .blobs
                .open()?
                .range((run.0, 0u128)..=(run.0, u128::MAX))?;
            match range.next_back() {
                None => None,
                Some(entry) => Some(entry?.0.value().1),
            }
        };
        let key = match last {
            None => 1,
            Some(k) => k
                .checked_add(1)
                .ok_or(Failure::Item(ItemError::SequenceExhausted("blobs")))?,
        };
        self.blobs.open()?.insert((run.0, key), bytes)?;
        Ok((key, u64::try_from(bytes.len()).unwrap_or(u64::MAX)))
    }

    /// Moves attachments over the inline threshold into the blob table and checks that blob
    /// references point at blobs of this run. Returns (attachment index, blob key) of moved ones.
    /// The task is copied only when an attachment moves, so the common case encodes the staged
    /// value as it is.
    fn externalize<'a>(
        &mut self,
        run: RunId,
        task: &'a Task,
    ) -> Result<(Cow<'a, Task>, Blobbed), Failure> {
        let mut moved = Vec::new();
        let mut task = Cow::Borrowed(task);
        let inline_max = self.limits.inline_bytes_max;
        for i in 0..task.attachments.len() {
            match &task.attachments[i].body {
                AttachmentBody::Inline(text)
                    if u64::try_from(text.len()).unwrap_or(u64::MAX) > inline_max =>
                {
                    let (key, len) = self.put_blob(run, text.as_bytes())?;
                    task.to_mut().attachments[i].body = AttachmentBody::Blob { key, len };
                    moved.push((u32::try_from(i).unwrap_or(u32::MAX), key));
                }
                AttachmentBody::Inline(_) => {}
                AttachmentBody::Blob { key, .. } => {
                    if self.blobs.open()?.get((run.0, *key))?.is_none() {
                        return Err(ItemError::BlobNotFound(*key).into());
                    }
                }
            }
        }
        Ok((task, moved))
    }

    fn apply(&mut self, write: &StagedWrite<'_>) -> Result<Applied, Failure> {
        let (run, op) = match &write.staged {
            Staged::Agent(profile) => {
                let bytes = codec::encode(name::AGENTS, profile)?;
                self.agents
                    .open()?
                    .insert(profile.name.as_str(), bytes.as_slice())?;
                return Ok(Applied::AgentProfileWritten);
            }
            Staged::Run { run, op } => (*run, op),
        };
        match op {
            RunOp::CreateRun(r) => {
                if self.runs.open()?.get(run.0)?.is_some() {
                    return Err(ItemError::RunExists(run).into());
                }
                if let Some(plan) = &r.plan {
                    self.plans.open()?.insert(run.0, plan.as_bytes())?;
                }
                self.put_run(r)?;
                self.known_runs.insert(run.0);
                Ok(Applied::RunCreated)
            }
            RunOp::UpdateRun(r) => {
                self.require_run(run)?;
                if let Some(plan) = &r.plan {
                    let same = self
                        .plans
                        .open()?
                        .get(run.0)?
                        .is_some_and(|g| g.value() == plan.as_bytes());
                    if !same {
                        return Err(ItemError::PlanChanged { run }.into());
                    }
                }
                self.put_run(r)?;
                Ok(Applied::RunUpdated)
            }
            RunOp::CreateTask(task) => {
                self.require_run(run)?;
                if self.task_run.open()?.get(task.id.0)?.is_some() {
                    return Err(ItemError::TaskIdTaken(task.id).into());
                }
                if let Some(parent) = task.parent
                    && !self.task_exists(run, parent)?
                {
                    return Err(ItemError::ParentNotFound {
                        task: task.id,
                        parent,
                    }
                    .into());
                }
                let (task, blobbed) = self.externalize(run, task)?;
                let bytes = codec::encode(name::TASKS, &*task)?;
                self.tasks
                    .open()?
                    .insert((run.0, task.id.0), bytes.as_slice())?;
                self.task_run.open()?.insert(task.id.0, run.0)?;
                if let Some(parent) = task.parent {
                    self.children
                        .open()?
                        .insert((run.0, parent.0, task.id.0), ())?;
                }
                // A new task has no log rows yet: its first row takes 1 without a lookup.
                self.known_tasks.insert((run.0, task.id.0), Some(0));
                Ok(Applied::TaskCreated { blobbed })
            }
            RunOp::UpdateTask(task) => {
                let Some(head) = self.stored_head(run, task.id)? else {
                    return Err(ItemError::TaskNotFound { run, task: task.id }.into());
                };
                if head.parent != task.parent {
                    return Err(ItemError::ParentChanged { task: task.id }.into());
                }
                let (task, blobbed) = self.externalize(run, task)?;
                let key = (run.0, task.id.0);
                if head.same_as(&task) {
                    // Only the state changed (the common case: a status, an outcome): the row's
                    // once-written part stays, the state row takes the rest.
                    let bytes = codec::encode(name::TASK_STATES, &StateOf::of(&task))?;
                    self.task_states.open()?.insert(key, bytes.as_slice())?;
                } else {
                    let bytes = codec::encode(name::TASKS, &*task)?;
                    self.tasks.open()?.insert(key, bytes.as_slice())?;
                    self.task_states.open()?.remove(key)?;
                }
                Ok(Applied::TaskUpdated { blobbed })
            }
            RunOp::AppendLog { task, row } => {
                let task = *task;
                if !self.task_exists(run, task)? {
                    return Err(ItemError::TaskNotFound { run, task }.into());
                }
                let seq = self.next_log_seq(run, task)?;
                let bytes = codec::encode(name::SESSION_LOGS, &row)?;
                self.logs
                    .open()?
                    .insert((run.0, task.0, seq), bytes.as_slice())?;
                Ok(Applied::LogAppended { seq })
            }
            RunOp::PutCheckpoint(c) => {
                self.require_run(run)?;
                let bytes = codec::encode(name::CHECKPOINTS, &c)?;
                self.checkpoints.open()?.insert(run.0, bytes.as_slice())?;
                Ok(Applied::CheckpointWritten)
            }
            RunOp::AppendManifest(m) => {
                self.require_run(run)?;
                let seq = next_seq(&*self.manifest.open()?, run.0, name::MANIFEST)?;
                let bytes = codec::encode(name::MANIFEST, &m)?;
                self.manifest
                    .open()?
                    .insert((run.0, seq), bytes.as_slice())?;
                Ok(Applied::ManifestAppended { seq })
            }
            RunOp::AppendDeadLetter(d) => {
                self.require_run(run)?;
                let seq = next_seq(&*self.dead_letters.open()?, run.0, name::DEAD_LETTERS)?;
                let bytes = codec::encode(name::DEAD_LETTERS, &d)?;
                self.dead_letters
                    .open()?
                    .insert((run.0, seq), bytes.as_slice())?;
                Ok(Applied::DeadLetterAppended { seq })
            }
            RunOp::AppendAudit(a) => {
                self.require_run(run)?;
                let seq = next_seq(&*self.audit.open()?, run.0, name::AUDIT)?;
                let bytes = codec::encode(name::AUDIT, &a)?;
                self.audit.open()?.insert((run.0, seq), bytes.as_slice())?;
                Ok(Applied::AuditAppended { seq })
            }
            RunOp::AppendGateMark(m) => {
                self.require_run(run)?;
                let seq = next_seq(&*self.gate_marks.open()?, run.0, name::GATE_MARKS)?;
                let bytes = codec::encode(name::GATE_MARKS, &m)?;
                self.gate_marks
                    .open()?
                    .insert((run.0, seq), bytes.as_slice())?;
                Ok(Applied::GateMarkAppended { seq })
            }
            RunOp::AppendEscalation(e) => {
                self.require_run(run)?;
                if let Some(g) = self.escalation_ids.open()?.get(e.id.0)? {
                    let (owner, seq) = g.value();
                    if owner != run.0 {
                        return Err(ItemError::EscalationIdTaken(e.id).into());
                    }
                    return Ok(Applied::EscalationAppended { seq });
                }
                let seq = next_seq(&*self.escalations.open()?, run.0, name::ESCALATIONS)?;
                let bytes = codec::encode(name::ESCALATIONS, &e)?;
                self.escalations
                    .open()?
                    .insert((run.0, seq), bytes.as_slice())?;
                self.escalation_ids.open()?.insert(e.id.0, (run.0, seq))?;
                Ok(Applied::EscalationAppended { seq })
            }
            RunOp::ResolveEscalation { id, resolution } => {
                let id = *id;
                let located = self.escalation_ids.open()?.get(id.0)?.map(|g| g.value());
                let Some((owner, seq)) = located.filter(|(owner, _)| *owner == run.0) else {
                    return Err(ItemError::EscalationNotFound { run, id }.into());
                };
                let mut row: Escalation = match self.escalations.open()?.get((owner, seq))? {
                    Some(g) => {
                        codec::decode(name::ESCALATIONS, &format_args!("{run}/{seq}"), g.value())?
                    }
                    None => return Err(ItemError::EscalationNotFound { run, id }.into()),
                };
                if let Some(first) = row.resolution {
                    return Ok(Applied::EscalationAlreadyResolved(first));
                }
                row.resolution = Some(resolution.clone().into_owned());
                let bytes = codec::encode(name::ESCALATIONS, &row)?;
                self.escalations
                    .open()?
                    .insert((owner, seq), bytes.as_slice())?;
                Ok(Applied::EscalationResolved)
            }
            RunOp::RecordIdempotency(record) => {
                self.require_run(run)?;
                if let Some(g) = self.idempotency.open()?.get((run.0, record.key.as_str()))? {
                    let original: IdempotencyRecord = codec::decode(
                        name::IDEMPOTENCY,
                        &format_args!("{run}/{}", record.key),
                        g.value(),
                    )?;
                    return Ok(Applied::AlreadyRecorded(original));
                }
                let bytes = codec::encode(name::IDEMPOTENCY, &record)?;
                self.idempotency
                    .open()?
                    .insert((run.0, record.key.as_str()), bytes.as_slice())?;
                Ok(Applied::IdempotencyRecorded)
            }
            RunOp::PutBlob(bytes) => {
                self.require_run(run)?;
                let (key, len) = self.put_blob(run, bytes)?;
                Ok(Applied::BlobStored { key, len })
            }
            RunOp::PutAgent(profile) => {
                // The run's row is not required: a node records its profiles as it submits the
                // run, which may be before the coordinator's first commit creates the row.
                let bytes = codec::encode(name::RUN_AGENTS, profile)?;
                self.run_agents
                    .open()?
                    .insert((run.0, profile.name.as_str()), bytes.as_slice())?;
                Ok(Applied::AgentProfileWritten)
            }
        }
    }

    /// Writes a run's row (without its plan: that is in its own table, written at creation) and
    /// keeps the open-runs index in step with it, in this same transaction: the index and the rows
    /// are committed (or lost in a crash) together, so they never disagree.
    fn put_run(&mut self, r: &Run) -> Result<(), Failure> {
        let bytes = if r.plan.is_some() {
            codec::encode(
                name::RUNS,
                &Run {
                    id: r.id,
                    brief: r.brief.clone(),
                    plan: None,
                    status: r.status,
                    budget: r.budget,
                    created_ms: r.created_ms,
                    updated_ms: r.updated_ms,
                    config_snapshot: r.config_snapshot.clone(),
                    outcome: r.outcome.clone(),
                },
            )?
        } else {
            codec::encode(name::RUNS, r)?
        };
        self.runs.open()?.insert(r.id.0, bytes.as_slice())?;
        if r.status.is_terminal() {
            self.open_runs.open()?.remove(r.id.0)?;
        } else {
            self.open_runs.open()?.insert(r.id.0, ())?;
        }
        Ok(())
    }
}
