//! The simulator's side of the store: executing the checkpoint machine's `Persist` effects on a real
//! keel-store over a [`SimDisk`], crashing that disk, and reading back what a restarted coordinator node
//! and a specialist's context load need. This is host code (the ractor runtime has its own), kept free of
//! policy: the machines decide what to write, this only writes it.

use keel_actors::context::{ContextConfig, RowSet};
use keel_actors::specialist::context_rows;
use keel_actors::{AttemptId, CommitBatch, ContextRequest, RecoveredRun};
use keel_store::{
    Durability, IdempotencyRecord, ReadError, RunId, RunScope, SimDisk, StageError, Store,
    StoreConfig, Task, TaskId, WriteBatch,
};

/// Rows read per page when listing a run's tasks on recovery.
pub const RECOVERY_PAGE_ROWS: u32 = 1_000;
/// Most task rows of one run a recovery reads; a run past it is a runaway the checker reports.
pub const RECOVERY_TASKS_MAX: usize = 10_000;
/// Most runs a recovery reloads.
pub const RECOVERY_RUNS_MAX: u32 = 1_000;

/// A store failure, as the world reports it (a disk fault, or a bug in the mapping).
#[derive(Debug, thiserror::Error)]
pub enum StoreHostError {
    /// A write could not be staged (a limit, or a run mismatch: an isolation bug).
    #[error("staging {op} for run {run}: {source}")]
    Stage {
        /// The op's name.
        op: &'static str,
        /// The run whose scope staged it.
        run: RunId,
        /// Why.
        source: StageError,
    },
    /// The commit failed (disk fault): nothing of the batch was written.
    #[error("commit failed: {0}")]
    Commit(#[from] keel_store::CommitError),
    /// Opening the store failed.
    #[error("open failed: {0}")]
    Open(#[from] keel_store::OpenError),
    /// A read failed.
    #[error("read failed: {0}")]
    Read(#[from] ReadError),
    /// A run has more tasks than a recovery reads.
    #[error("run {0} has more than {RECOVERY_TASKS_MAX} tasks")]
    TooManyTasks(RunId),
}

/// The coordinator node's store on its simulated disk.
#[derive(Debug)]
pub struct SimStore {
    disk: SimDisk,
    store: Store,
}

impl SimStore {
    /// A fresh store on an empty disk.
    ///
    /// # Errors
    /// [`StoreHostError::Open`] if redb cannot initialise the disk.
    pub fn new() -> Result<Self, StoreHostError> {
        let disk = SimDisk::new();
        let store = Store::open_backend(disk.clone(), StoreConfig::default())?;
        Ok(Self { disk, store })
    }

    /// The store, for reads.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The disk, to arm faults.
    pub fn disk(&self) -> &SimDisk {
        &self.disk
    }

    /// The machine lost power: reopen from what was synced. Unsynced writes are gone.
    ///
    /// # Errors
    /// [`StoreHostError::Open`] if the synced image does not open (a durability bug).
    pub fn crash_and_reopen(&mut self) -> Result<(), StoreHostError> {
        let disk = self.disk.crash();
        let store = Store::open_backend(disk.clone(), StoreConfig::default())?;
        self.disk = disk;
        self.store = store;
        Ok(())
    }

    /// Commits one group commit of the checkpoint machine in one write transaction, durably.
    ///
    /// # Errors
    /// [`StoreHostError::Stage`] or [`StoreHostError::Commit`]; nothing of the batch is written then.
    pub fn commit(&self, batch: &CommitBatch) -> Result<(), StoreHostError> {
        let mut writes = WriteBatch::new();
        for (run, op) in batch.ops() {
            let scope = self.store.run(run);
            let staged = op.stage(&scope).map_err(|source| StoreHostError::Stage {
                op: op.name(),
                run,
                source,
            })?;
            writes.push(staged);
        }
        self.store.commit_group(writes, Durability::Immediate)?;
        Ok(())
    }

    /// Every non-terminal run with its checkpoint, tasks and idempotency records: what a restarted
    /// coordinator node hands its coordinators.
    ///
    /// # Errors
    /// [`StoreHostError::Read`] or [`StoreHostError::TooManyTasks`].
    pub fn recover(&self) -> Result<Vec<RecoveredRun>, StoreHostError> {
        let runs = self.store.catalog().runs(RECOVERY_RUNS_MAX)?;
        let mut out = Vec::new();
        for run in runs.items {
            if run.status.is_terminal() {
                continue;
            }
            let scope = self.store.run(run.id);
            let checkpoint = scope.checkpoint()?;
            let tasks = all_tasks(&scope)?;
            let idempotency = idempotency_records(&scope, &tasks)?;
            out.push(RecoveredRun {
                run,
                checkpoint,
                tasks,
                idempotency,
            });
        }
        Ok(out)
    }

    /// The rows a specialist's preamble is built from, read through the run's scope with the context
    /// loaders' bounded walks (`context_rows`), as the runtime host does.
    ///
    /// # Errors
    /// A one-line reason when the rows cannot be read (the task is missing, the disk failed).
    pub fn load_context(
        &self,
        run: RunId,
        request: &ContextRequest,
        config: &ContextConfig,
    ) -> Result<RowSet, String> {
        context_rows(&self.store.run(run), request, config).map_err(|e| e.to_string())
    }

    /// A run's tasks (for the checker and the scenario assertions).
    ///
    /// # Errors
    /// As [`SimStore::recover`].
    pub fn tasks(&self, run: RunId) -> Result<Vec<Task>, StoreHostError> {
        all_tasks(&self.store.run(run))
    }

    /// One task of a run.
    ///
    /// # Errors
    /// [`StoreHostError::Read`].
    pub fn task(&self, run: RunId, task: TaskId) -> Result<Task, StoreHostError> {
        Ok(self.store.run(run).task(task)?)
    }
}

fn all_tasks(scope: &RunScope<'_>) -> Result<Vec<Task>, StoreHostError> {
    let mut tasks: Vec<Task> = Vec::new();
    loop {
        let page = scope.tasks(tasks.last().map(|t| t.id), RECOVERY_PAGE_ROWS)?;
        tasks.extend(page.items);
        if tasks.len() > RECOVERY_TASKS_MAX {
            return Err(StoreHostError::TooManyTasks(scope.id()));
        }
        if !page.more {
            return Ok(tasks);
        }
    }
}

/// The store keeps idempotency records by key and has no per-run listing; the keys of a run are the
/// start keys of every attempt its tasks record (`AttemptId::idempotency_key`), so they are looked up
/// one by one.
fn idempotency_records(
    scope: &RunScope<'_>,
    tasks: &[Task],
) -> Result<Vec<IdempotencyRecord>, StoreHostError> {
    let mut out = Vec::new();
    for task in tasks {
        for attempt in 1..=task.attempt {
            let key = AttemptId {
                run: scope.id(),
                task: task.id,
                attempt,
            }
            .idempotency_key();
            if let Some(record) = scope.idempotency(&key.0)? {
                out.push(record);
            }
        }
        if let Some(key) = &task.idempotency_key
            && !out.iter().any(|r| &r.key == key)
            && let Some(record) = scope.idempotency(key)?
        {
            out.push(record);
        }
    }
    Ok(out)
}
