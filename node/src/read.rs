//! The read commands (`keel runs`, `tasks`, `show`, `logs`, `tree`, `status`, `audit`) over an open store:
//! one place that the command line (on a store opened read-only) and the HTTP API (on its
//! server's store, answering with the text the command prints) both call, so both print the same.

use keel_store::{RunId, Store, TaskId};

use crate::exit::{self, Failed};
use crate::render::Output;
use crate::run;

/// `keel runs` shows at most this many (the newest) when no `--limit` is given.
pub(crate) const RUNS_LIMIT_DEFAULT: u32 = 20;
/// `keel tasks` shows at most this many when no `--limit` is given.
pub(crate) const TASKS_LIMIT_DEFAULT: u32 = 500;
/// `keel tree` reads at most this many tasks when no `--limit` is given.
pub(crate) const TREE_LIMIT_DEFAULT: u32 = 2_000;
/// `keel logs` shows at most this many rows when no `--tail` is given.
pub(crate) const LOGS_TAIL_DEFAULT: u32 = 200;
/// `keel audit` shows at most this many rows when no `--limit` is given.
pub(crate) const AUDIT_LIMIT_DEFAULT: u32 = 200;

/// One read command with its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Read {
    /// `keel runs`.
    Runs {
        /// Most runs shown.
        limit: u32,
        /// Only runs older than this one: the next page.
        before: Option<RunId>,
    },
    /// `keel tasks`.
    Tasks {
        /// Only this run's tasks.
        run: Option<RunId>,
        /// Most tasks shown.
        limit: u32,
    },
    /// `keel show TASK`.
    Show {
        /// The task.
        task: TaskId,
    },
    /// `keel logs TASK`.
    Logs {
        /// The task.
        task: TaskId,
        /// Only the last rows.
        tail: u32,
    },
    /// `keel tree [RUN]`.
    Tree {
        /// The run; the latest when `None`.
        run: Option<RunId>,
        /// Most tasks read.
        limit: u32,
    },
    /// `keel status [RUN]`.
    Status {
        /// The run; the latest when `None`.
        run: Option<RunId>,
    },
    /// `keel audit [RUN]`.
    Audit {
        /// The run; the latest when `None`.
        run: Option<RunId>,
        /// Most rows shown.
        limit: u32,
    },
}

impl Read {
    /// Print the command's output for `store` through `out`.
    ///
    /// # Errors
    /// [`Failed`] with the command's exit code (3 for an unknown run or task).
    pub(crate) fn print(self, store: &Store, out: &Output) -> Result<(), Failed> {
        let catalog = store.catalog();
        match self {
            Read::Runs { limit, before } => {
                out.runs(&catalog.runs_newest_first(before, limit)?, limit)?
            }
            Read::Tasks { run, limit } => out.tasks(&catalog.tasks(run, limit)?)?,
            Read::Show { task } => {
                let task = catalog.task(task)?;
                let children = catalog.children(task.id, 200)?;
                out.show(&task, &children)?;
            }
            Read::Logs { task, tail } => out.logs(task, &catalog.session_log(task, tail)?)?,
            Read::Tree { run, limit } => {
                let header = match run {
                    Some(run) => catalog.run(run)?,
                    None => catalog.latest_run()?.ok_or(run::summary::NoRuns)?,
                };
                out.tree(&header, &catalog.tree(header.id, limit)?)?;
            }
            Read::Status { run } => {
                exit::failure(crate::status::status(store, run, out.json()))?;
            }
            Read::Audit { run, limit } => {
                let run = match run {
                    Some(run) => catalog.run(run)?.id,
                    None => catalog.latest_run()?.ok_or(run::summary::NoRuns)?.id,
                };
                out.audit(run, &catalog.audit(run, 0, limit)?)?;
            }
        }
        Ok(())
    }
}
