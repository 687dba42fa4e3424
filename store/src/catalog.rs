//! The operator view: read-only, store-wide.
//!
//! **This is not for code acting inside a run.** Actors, context builders and the checkpoint actor use
//! a [`crate::RunScope`]. The catalog exists for the operator's commands (`keel tasks`, `keel show
//! TASK`, `keel logs TASK`, `keel tree RUN`), which start from a bare task id and must find its run.
//! It has no write methods.

use crate::codec;
use crate::error::ReadError;
use crate::model::{
    AgentProfile, AuditEntry, Escalation, EscalationId, Run, RunId, SessionLogRow, Task, TaskId,
};
use crate::read::{self, Listing, RunPage, Sequenced, TreeNode};
use crate::store::Store;
use crate::tables::{self, name};

/// Store-wide, read-only queries for operators. See the module docs for why it is separate from
/// [`crate::RunScope`].
#[derive(Clone, Copy, Debug)]
pub struct Catalog<'s> {
    store: &'s Store,
}

impl<'s> Catalog<'s> {
    pub(crate) fn new(store: &'s Store) -> Self {
        Self { store }
    }

    fn limit(&self, n: u32) -> Result<usize, ReadError> {
        read::check_limit(self.store.limits(), n)
    }

    /// Runs in id order (creation order for ULIDs), at most `limit`.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`] if `limit` is over the read limit; [`ReadError::Decode`].
    pub fn runs(&self, limit: u32) -> Result<Listing<Run>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| read::runs(txn, limit))
    }

    /// Runs newest first, older than `before` when given (the last run of the page before), at
    /// most `limit`, with the count of older runs the page leaves out: what `keel runs` lists.
    /// Reads the page's rows only (the count comes from the table's length).
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`] if `limit` is over the read limit; [`ReadError::Decode`].
    pub fn runs_newest_first(
        &self,
        before: Option<RunId>,
        limit: u32,
    ) -> Result<RunPage, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::runs_newest_first(txn, before, limit))
    }

    /// The runs that are not terminal (pending, running, paused), oldest first, at most `limit`,
    /// found among every run of the store (not only the first page) through the open-runs index,
    /// so the cost is one row per open run however many runs ended: what a restarted node takes
    /// up again and what `keel status` lists.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`] if `limit` is over the read limit; [`ReadError::Decode`].
    pub fn open_runs(&self, limit: u32) -> Result<Listing<Run>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| read::open_runs(txn, limit))
    }

    /// The newest run (the highest id: run ids are ULIDs, which sort by creation time), or `None`
    /// in a store without runs: what `keel status` and `keel tree` show when no run is named.
    ///
    /// # Errors
    /// [`ReadError::Decode`].
    pub fn latest_run(&self) -> Result<Option<Run>, ReadError> {
        self.store.read(read::latest_run)
    }

    /// One run's row.
    ///
    /// # Errors
    /// [`ReadError::NotFound`].
    pub fn run(&self, run: RunId) -> Result<Run, ReadError> {
        self.store.read(|txn| read::get_run(txn, run))
    }

    /// Tasks of one run, or of all runs (by run, then task id), at most `limit`.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn tasks(&self, run: Option<RunId>, limit: u32) -> Result<Listing<Task>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| match run {
            Some(run) => read::tasks_of_run(txn, run, None, limit),
            None => read::all_tasks(txn, limit),
        })
    }

    /// Which run a task belongs to.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if no run has the task.
    pub fn locate_task(&self, task: TaskId) -> Result<RunId, ReadError> {
        self.store.read(|txn| read::locate_task(txn, task))
    }

    /// A task by id alone.
    ///
    /// # Errors
    /// [`ReadError::NotFound`], [`ReadError::Decode`].
    pub fn task(&self, task: TaskId) -> Result<Task, ReadError> {
        self.store.read(|txn| {
            let run = read::locate_task(txn, task)?;
            read::get_task(txn, run, task)
        })
    }

    /// A task's direct children, in id order.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the task does not exist.
    pub fn children(&self, task: TaskId, limit: u32) -> Result<Listing<Task>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            let run = read::locate_task(txn, task)?;
            read::children(txn, run, task, limit)
        })
    }

    /// A run's tasks as a tree, depth first (children in id order), reading at most `limit` tasks.
    /// A task whose parent was not among the rows read shows as a root; `more` says rows were left.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the run does not exist.
    pub fn tree(&self, run: RunId, limit: u32) -> Result<Listing<TreeNode>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| read::tree(txn, run, limit))
    }

    /// The last `n` session log rows of a task, oldest first.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the task does not exist.
    pub fn session_log(
        &self,
        task: TaskId,
        n: u32,
    ) -> Result<Vec<Sequenced<SessionLogRow>>, ReadError> {
        let n = self.limit(n)?;
        self.store.read(|txn| {
            let run = read::locate_task(txn, task)?;
            read::last_log_rows(txn, run, task, n)
        })
    }

    /// A run's audit rows (policy decisions) with a sequence number above `after_seq`, in order, at
    /// most `limit`: what `keel audit` prints.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn audit(
        &self,
        run: RunId,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<AuditEntry>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::seq_rows(txn, tables::AUDIT, name::AUDIT, run, after_seq, limit))
    }

    /// One escalation by its id: its run, its sequence number and the row.
    ///
    /// # Errors
    /// [`ReadError::NotFound`], [`ReadError::Decode`].
    pub fn escalation(
        &self,
        id: EscalationId,
    ) -> Result<(RunId, Sequenced<Escalation>), ReadError> {
        self.store.read(|txn| {
            let not_found = || ReadError::NotFound {
                what: "escalation",
                key: id.to_string(),
            };
            let (run, seq) = txn
                .open_table(tables::ESCALATION_IDS)?
                .get(id.0)?
                .map(|g| g.value())
                .ok_or_else(not_found)?;
            let table = txn.open_table(tables::ESCALATIONS)?;
            let row = table.get((run, seq))?.ok_or_else(not_found)?;
            let value = codec::decode(
                name::ESCALATIONS,
                &format_args!("{}/{seq}", RunId(run)),
                row.value(),
            )?;
            Ok((RunId(run), Sequenced { seq, value }))
        })
    }

    /// Escalations of one run, or of every run (by run, then in the order they were raised), the
    /// open ones only if `open_only`, at most `limit`: what `keel escalations` prints.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn escalations(
        &self,
        run: Option<RunId>,
        open_only: bool,
        limit: u32,
    ) -> Result<Listing<(RunId, Sequenced<Escalation>)>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            let table = txn.open_table(tables::ESCALATIONS)?;
            let range = match run {
                Some(r) => table.range((r.0, 0u64)..=(r.0, u64::MAX))?,
                None => table.range::<(u128, u64)>(..)?,
            };
            let mut items = Vec::new();
            let mut more = false;
            for entry in range {
                let (k, v) = entry?;
                let (run, seq) = k.value();
                let value: Escalation = codec::decode(
                    name::ESCALATIONS,
                    &format_args!("{}/{seq}", RunId(run)),
                    v.value(),
                )?;
                if open_only && !value.is_open() {
                    continue;
                }
                if items.len() == limit {
                    more = true;
                    break;
                }
                items.push((RunId(run), Sequenced { seq, value }));
            }
            Ok(Listing { items, more })
        })
    }

    /// An agent profile by name.
    ///
    /// # Errors
    /// [`ReadError::NotFound`], [`ReadError::Decode`].
    pub fn agent(&self, agent: &str) -> Result<AgentProfile, ReadError> {
        self.store.read(|txn| {
            let table = txn.open_table(tables::AGENTS)?;
            match table.get(agent)? {
                None => Err(ReadError::NotFound {
                    what: "agent profile",
                    key: agent.to_string(),
                }),
                Some(g) => Ok(codec::decode(name::AGENTS, &agent, g.value())?),
            }
        })
    }

    /// Agent profiles in name order, at most `limit`.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn agents(&self, limit: u32) -> Result<Listing<AgentProfile>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            let table = txn.open_table(tables::AGENTS)?;
            let mut items = Vec::new();
            let mut more = false;
            for entry in table.iter()? {
                let (k, v) = entry?;
                if items.len() == limit {
                    more = true;
                    break;
                }
                items.push(codec::decode(name::AGENTS, &k.value(), v.value())?);
            }
            Ok(Listing { items, more })
        })
    }
}
