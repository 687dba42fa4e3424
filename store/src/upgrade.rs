//! Bringing a store written by an older keel to this build's [`crate::STORE_FORMAT`], inside the
//! writable open's set-up transaction (so an upgrade is all or nothing: a crash during it leaves the
//! old format, upgraded again on the next open).
//!
//! Format history: 1, the first; 2, the open-runs index (`open_runs`: every run that is not
//! terminal, kept in the same transaction as the run's row) and plans beside their run (`run_plans`:
//! a run row never holds its plan). Format 1 → 2 reads every run row once: each open run is
//! indexed, each plan is moved out of its row. A format-1 store opened read-only is read as it is
//! (the readers fall back to scanning run rows and to the plan inside a row).
//!
//! 3, a task's state in its own table (`task_states`, the `task_state` module). A format-2 task
//! row is whole, which is what a format-3 row of a task without a state row is, so format 2 → 3
//! moves nothing: the set-up transaction creates the table and records the format, and an older
//! keel then refuses the store (it would read a task's row without its newer state). A format-2
//! store opened read-only has no such table and reads its rows as they are.
//!
//! 4, session-log segments (`log_segment`): a task's rows staged in one commit are one entry. A
//! single row is stored as format 3 stored it, so format 3 → 4 moves nothing either: the set-up
//! transaction records the format, and an older keel then refuses the store.
//!
//! 5, the journal; 6, a root's children found by its run's task rows, not indexed (`read::children`),
//! and a run's manifest entries of one commit as one segment (`log_segment`). Neither moves
//! anything: a format-5 store's index rows for a root's children are not read, and its single
//! manifest entries are what a format-6 segment of one entry is.

use redb::{ReadableTable, WriteTransaction};

use crate::codec;
use crate::error::{ItemError, OpenError};
use crate::model::{Run, RunId};
use crate::tables::{self, name};

/// The format that introduced the open-runs index and the plans table.
pub(crate) const FORMAT_OPEN_RUNS_INDEX: u64 = 2;

/// Upgrades a store older than [`FORMAT_OPEN_RUNS_INDEX`] in `txn`: indexes its open runs and moves
/// its plans out of their run rows.
pub(crate) fn to_open_runs_index(txn: &WriteTransaction) -> Result<(), OpenError> {
    let mut runs = txn.open_table(tables::RUNS)?;
    let mut open = txn.open_table(tables::OPEN_RUNS)?;
    let mut plans = txn.open_table(tables::RUN_PLANS)?;
    // Rows with a plan are rewritten after the scan (a table cannot be written while iterated).
    let mut planned: Vec<Run> = Vec::new();
    for entry in runs.iter()? {
        let (k, v) = entry?;
        let id = RunId(k.value());
        let run: Run = codec::decode(name::RUNS, &id, v.value()).map_err(|e| failed(e.into()))?;
        if !run.status.is_terminal() {
            open.insert(id.0, ())?;
        }
        if run.plan.is_some() {
            planned.push(run);
        }
    }
    for mut run in planned {
        if let Some(plan) = run.plan.take() {
            plans.insert(run.id.0, plan.as_bytes())?;
        }
        let bytes = codec::encode(name::RUNS, &run).map_err(|e| failed(e.into()))?;
        runs.insert(run.id.0, bytes.as_slice())?;
    }
    Ok(())
}

fn failed(source: ItemError) -> OpenError {
    OpenError::Upgrade {
        to: u8::try_from(FORMAT_OPEN_RUNS_INDEX).unwrap_or(u8::MAX),
        source,
    }
}
