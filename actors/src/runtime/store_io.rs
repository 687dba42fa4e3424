//! The runtime's side of the store: executing the checkpoint machine's `Persist` effects in one redb
//! write transaction, reading back what a restarted node's coordinators need, and loading a
//! specialist's context rows. The simulator has a twin of this over its `SimDisk`; both turn each op
//! into a staged write through the one shared mapping, [`crate::PersistOp::stage`].

use crate::context::{ContextConfig, RowSet};
use crate::message::{ContextRequest, RecoveredRun};
use crate::persist::CommitBatch;
use crate::specialist::context_rows;
use keel_store::{
    Durability, IdempotencyRecord, ReadError, RunId, RunScope, StageError, Store, Task, WriteBatch,
};

/// Rows read per page when listing a run's tasks on recovery.
pub const RECOVERY_PAGE_ROWS: u32 = 1_000;
/// Most task rows of one run a recovery reads.
pub const RECOVERY_TASKS_MAX: usize = 10_000;
/// Most runs a node start reloads.
pub const RECOVERY_RUNS_MAX: u32 = 1_000;

/// A store failure seen by the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreIoError {
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
    /// The commit failed: nothing of the batch was written.
    #[error("commit failed: {0}")]
    Commit(#[from] keel_store::CommitError),
    /// A read failed.
    #[error("read failed: {0}")]
    Read(#[from] ReadError),
    /// A run has more tasks than a recovery reads.
    #[error("run {0} has more than {RECOVERY_TASKS_MAX} tasks")]
    TooManyTasks(RunId),
}

/// Commits one group commit in one write transaction with `Durability::Immediate`.
///
/// # Errors
/// [`StoreIoError::Stage`] or [`StoreIoError::Commit`]; nothing of the batch is written then.
pub fn commit(store: &Store, batch: &CommitBatch) -> Result<(), StoreIoError> {
    let mut writes = WriteBatch::new();
    for (run, op) in batch.ops() {
        let scope = store.run(run);
        let staged = op.stage(&scope).map_err(|source| StoreIoError::Stage {
            op: op.name(),
            run,
            source,
        })?;
        writes.push(staged);
    }
    store.commit_group(writes, Durability::Immediate)?;
    Ok(())
}

/// The rows a restarted coordinator of `run` rebuilds from.
///
/// # Errors
/// [`StoreIoError::Read`] (the run is missing, the disk failed) or [`StoreIoError::TooManyTasks`].
pub fn recover_run(store: &Store, run: RunId) -> Result<RecoveredRun, StoreIoError> {
    let scope = store.run(run);
    let row = scope.get()?;
    let checkpoint = scope.checkpoint()?;
    let tasks = all_tasks(&scope)?;
    let idempotency = idempotency_records(&scope, &tasks)?;
    Ok(RecoveredRun {
        run: row,
        checkpoint,
        tasks,
        idempotency,
    })
}

/// Every run that is not terminal (running, paused, pending), newest last, bounded by
/// [`RECOVERY_RUNS_MAX`].
///
/// # Errors
/// [`StoreIoError::Read`].
pub fn open_runs(store: &Store) -> Result<Vec<RunId>, StoreIoError> {
    let runs = store.catalog().runs(RECOVERY_RUNS_MAX)?;
    Ok(runs
        .items
        .into_iter()
        .filter(|r| !r.status.is_terminal())
        .map(|r| r.id)
        .collect())
}

/// Every task row of a run, paged.
///
/// # Errors
/// [`StoreIoError::Read`] or [`StoreIoError::TooManyTasks`].
pub fn all_tasks(scope: &RunScope<'_>) -> Result<Vec<Task>, StoreIoError> {
    let mut tasks: Vec<Task> = Vec::new();
    loop {
        let page = scope.tasks(tasks.last().map(|t| t.id), RECOVERY_PAGE_ROWS)?;
        tasks.extend(page.items);
        if tasks.len() > RECOVERY_TASKS_MAX {
            return Err(StoreIoError::TooManyTasks(scope.id()));
        }
        if !page.more {
            return Ok(tasks);
        }
    }
}

/// Every idempotency record of the run, paged, bounded like its tasks.
fn idempotency_records(
    scope: &RunScope<'_>,
    _tasks: &[Task],
) -> Result<Vec<IdempotencyRecord>, StoreIoError> {
    let mut out: Vec<IdempotencyRecord> = Vec::new();
    loop {
        let after = out.last().map(|r| r.key.clone());
        let page = scope.idempotency_records(after.as_deref(), RECOVERY_PAGE_ROWS)?;
        out.extend(page.items);
        if out.len() > RECOVERY_TASKS_MAX * 8 {
            return Err(StoreIoError::TooManyTasks(scope.id()));
        }
        if !page.more {
            return Ok(out);
        }
    }
}

/// Loads the rows a specialist's preamble is built from, through the run's scope only (DESIGN.md
/// §12, invariant 9).
///
/// # Errors
/// A one-line reason (the task is missing, the disk failed); the attempt then fails as transient.
pub fn load_context(
    store: &Store,
    run: RunId,
    request: &ContextRequest,
    config: &ContextConfig,
) -> Result<RowSet, String> {
    context_rows(&store.run(run), request, config).map_err(|e| e.to_string())
}
