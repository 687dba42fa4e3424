//! A host's side of the store: executing the checkpoint machine's `Persist` effects in one redb
//! write transaction, reading back what a restarted coordinator needs, and loading a specialist's
//! context rows. Every op becomes a staged write through the one shared mapping,
//! [`crate::PersistOp::stage`]. Called by the ractor runtime (on its store writer thread and blocking
//! pool) and by the simulator (over its `SimDisk`), so both execute the machines' effects alike.

use crate::context::{ContextConfig, RowSet};
use crate::message::{ContextRequest, RecoveredRun};
use crate::persist::CommitBatch;
use crate::specialist::context_rows;
use keel_store::{
    CommitError, Durability, IdempotencyRecord, ReadError, RunId, RunScope, StageError, Store,
    Task, WriteBatch,
};

/// Rows read per page when listing a run's tasks or idempotency records on recovery.
pub const RECOVERY_PAGE_ROWS: u32 = 1_000;
/// Most task rows of one run a recovery reads; a run past it is a runaway, refused as
/// [`HostError::TooManyTasks`].
pub const RECOVERY_TASKS_MAX: usize = 10_000;
/// Most idempotency records of one run a recovery reads (each task has at most a few attempts).
pub const RECOVERY_IDEMPOTENCY_MAX: usize = RECOVERY_TASKS_MAX * 8;
/// Most runs a node start (or a simulated restart) reloads.
pub const RECOVERY_RUNS_MAX: u32 = 1_000;

/// A store failure seen by a host: the one error of the shared host code, so the runtime and the
/// simulator classify failures alike (a disk fault, a limit, or a bug in the mapping).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
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
    /// The store could not apply one run's write in a group commit (a row it names is missing, a
    /// parent does not match): nothing of the batch was written, and the fault is that run's.
    #[error("commit refused a write of run {run}: {source}")]
    Refused {
        /// The run whose write was refused.
        run: RunId,
        /// What the store said ([`keel_store::CommitError::Item`]).
        source: keel_store::CommitError,
    },
    /// Opening (or reopening) the store failed.
    #[error("open failed: {0}")]
    Open(#[from] keel_store::OpenError),
    /// A read failed.
    #[error("read failed: {0}")]
    Read(#[from] ReadError),
    /// The store handle was closed after a failed write (redb refuses every later IO on it) and is
    /// not open again yet.
    #[error("the store is closed: {0}")]
    Closed(String),
    /// A run has more tasks (or idempotency records) than a recovery reads.
    #[error("run {0} has more than {RECOVERY_TASKS_MAX} tasks")]
    TooManyTasks(RunId),
}

impl HostError {
    /// The run whose own write made a group commit fail (a limit it passed, a row the store cannot
    /// apply), when the failure is that run's and not the disk's: such a failure is permanent
    /// (retrying the same writes fails the same way), and the other runs' writes of the batch
    /// commit without it (docs/DESIGN.md §4).
    pub fn refused_run(&self) -> Option<RunId> {
        match self {
            HostError::Stage { run, .. } | HostError::Refused { run, .. } => Some(*run),
            _ => None,
        }
    }
}

/// Commits one group commit of the checkpoint machine in one write transaction with
/// `Durability::Immediate`: the machine's durability point.
///
/// # Errors
/// [`HostError::Stage`] or [`HostError::Commit`]; nothing of the batch is written then.
pub fn commit(store: &Store, batch: &CommitBatch) -> Result<(), HostError> {
    let ops = batch.stages.iter().map(|s| s.ops.len()).sum();
    let mut writes = WriteBatch::with_capacity(ops);
    // The run of each write, so a write the store refuses is laid at its run's door.
    let mut runs = Vec::with_capacity(ops);
    for (run, op) in batch.ops() {
        let scope = store.run(run);
        let staged = op.stage(&scope).map_err(|source| HostError::Stage {
            op: op.name(),
            run,
            source,
        })?;
        writes.push(staged);
        runs.push(run);
    }
    store
        .commit_group(writes, Durability::Immediate)
        .map_err(|e| match e {
            // A stored row that does not decode is damage to the store, not this run's write.
            CommitError::Item {
                error: keel_store::ItemError::Decode(_),
                ..
            } => HostError::Commit(e),
            CommitError::Item { index, .. } => match runs.get(index as usize) {
                Some(&run) => HostError::Refused { run, source: e },
                None => HostError::Commit(e),
            },
            e => HostError::Commit(e),
        })?;
    Ok(())
}

/// The rows a restarted coordinator of `run` rebuilds from: the run row, its checkpoint, every task
/// and every idempotency record of the run.
///
/// # Errors
/// [`HostError::Read`] (the run is missing, the disk failed) or [`HostError::TooManyTasks`].
pub fn recover_run(store: &Store, run: RunId) -> Result<RecoveredRun, HostError> {
    let scope = store.run(run);
    let row = scope.get()?;
    let checkpoint = scope.checkpoint()?;
    let tasks = all_tasks(&scope)?;
    let idempotency = idempotency_records(&scope)?;
    let escalations = waiting_escalations(&scope)?;
    Ok(RecoveredRun {
        run: row,
        checkpoint,
        tasks,
        idempotency,
        escalations,
    })
}

/// The run's open escalations that pause a task, read in pages of the store's row limit.
fn waiting_escalations(scope: &RunScope<'_>) -> Result<Vec<keel_store::Escalation>, HostError> {
    let mut open = Vec::new();
    let mut after = 0;
    loop {
        let listing = scope.escalations(after, RECOVERY_PAGE_ROWS)?;
        if let Some(last) = listing.items.last() {
            after = last.seq;
        }
        open.extend(
            listing
                .items
                .into_iter()
                .map(|r| r.value)
                .filter(|e| e.is_open() && e.waiting == keel_store::EscalationWait::Task),
        );
        if !listing.more {
            return Ok(open);
        }
    }
}

/// Every run that is not terminal (running, paused, pending), oldest first, found among all the
/// store's runs however many have finished, at most [`RECOVERY_RUNS_MAX`] of them: the runs a
/// restarted node takes up again.
///
/// # Errors
/// [`HostError::Read`].
pub fn open_runs(store: &Store) -> Result<Vec<RunId>, HostError> {
    let runs = store.catalog().open_runs(RECOVERY_RUNS_MAX)?;
    Ok(runs.items.into_iter().map(|r| r.id).collect())
}

/// [`recover_run`] for every run of [`open_runs`]: what a restarted coordinator node hands its
/// coordinators.
///
/// # Errors
/// As [`recover_run`].
pub fn recover_open_runs(store: &Store) -> Result<Vec<RecoveredRun>, HostError> {
    open_runs(store)?
        .into_iter()
        .map(|run| recover_run(store, run))
        .collect()
}

/// Every task row of a run, paged, bounded by [`RECOVERY_TASKS_MAX`].
///
/// # Errors
/// [`HostError::Read`] or [`HostError::TooManyTasks`].
pub fn all_tasks(scope: &RunScope<'_>) -> Result<Vec<Task>, HostError> {
    let mut tasks: Vec<Task> = Vec::new();
    loop {
        let page = scope.tasks(tasks.last().map(|t| t.id), RECOVERY_PAGE_ROWS)?;
        tasks.extend(page.items);
        if tasks.len() > RECOVERY_TASKS_MAX {
            return Err(HostError::TooManyTasks(scope.id()));
        }
        if !page.more {
            return Ok(tasks);
        }
    }
}

/// Every idempotency record of the run, listed from the store's per-run range, paged and bounded.
///
/// Listed, not looked up per attempt: the store keys the records by `(run, key)`, so the run's range
/// holds every record the run ever wrote, whatever task or attempt it belongs to. A lookup of the
/// keys derived from each task's attempt counter (`AttemptId::idempotency_key` for attempts
/// `1..=task.attempt`) finds only the keys a host can guess: a record whose key is not derived that
/// way (a task's own `idempotency_key`, keys minted by a later kind of session) would be missed, and
/// a restarted coordinator would then start that session a second time (docs/DESIGN.md §12, invariant 2).
/// The listing is also one range scan per page instead of one read transaction per attempt.
fn idempotency_records(scope: &RunScope<'_>) -> Result<Vec<IdempotencyRecord>, HostError> {
    let mut out: Vec<IdempotencyRecord> = Vec::new();
    loop {
        let after = out.last().map(|r| r.key.clone());
        let page = scope.idempotency_records(after.as_deref(), RECOVERY_PAGE_ROWS)?;
        out.extend(page.items);
        if out.len() > RECOVERY_IDEMPOTENCY_MAX {
            return Err(HostError::TooManyTasks(scope.id()));
        }
        if !page.more {
            return Ok(out);
        }
    }
}

/// Loads the rows a specialist's preamble is built from, through the run's scope only (DESIGN.md
/// §12, invariant 9), with the context loaders' bounded walks.
///
/// # Errors
/// A one-line reason (the task is missing, the disk failed): the machine's input carries it as text,
/// and the attempt then fails as transient.
pub fn load_context(
    store: &Store,
    run: RunId,
    request: &ContextRequest,
    config: &ContextConfig,
) -> Result<RowSet, String> {
    context_rows(&store.run(run), request, config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;
    use keel_store::{Budget, Run, RunStatus};

    fn run(id: u128, status: RunStatus) -> Run {
        Run {
            id: RunId(id),
            brief: format!("run {id}"),
            plan: None,
            status,
            budget: Budget::default(),
            created_ms: 1,
            updated_ms: 1,
            config_snapshot: String::new(),
            outcome: None,
        }
    }

    #[test]
    fn open_runs_finds_an_open_run_behind_more_finished_runs_than_a_page() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("keel.redb")).unwrap();
        let finished = u128::from(RECOVERY_RUNS_MAX) + 5;
        let mut batch = WriteBatch::new();
        for id in 1..=finished {
            batch.push(
                store
                    .run(RunId(id))
                    .stage_create_run(run(id, RunStatus::Completed))
                    .unwrap(),
            );
        }
        // The newest run is the one open, past the first page of runs.
        batch.push(
            store
                .run(RunId(finished + 1))
                .stage_create_run(run(finished + 1, RunStatus::Paused))
                .unwrap(),
        );
        store.commit_group(batch, Durability::Immediate).unwrap();
        assert_eq!(open_runs(&store).unwrap(), vec![RunId(finished + 1)]);
    }
}
