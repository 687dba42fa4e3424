//! The run-scoped handle: the only way to reach one run's rows.

use crate::batch::{RunOp, StagedWrite};
use crate::codec;
use crate::error::{ReadError, StageError};
use crate::model::{
    AgentProfile, AuditEntry, Checkpoint, DeadLetter, Escalation, EscalationId,
    EscalationResolution, GateMark, IdempotencyRecord, ManifestEntry, Run, RunId, SessionLogRow,
    Task, TaskId,
};
use crate::read::{self, Listing, Sequenced};
use crate::store::Store;
use crate::tables::{self, name};
use std::borrow::Cow;

/// One run's view of the store (docs/DESIGN.md §12, invariant 9: one run never reads or writes another
/// run's state).
///
/// Every key this handle builds starts with its own run id, which it never lets a caller change: a
/// task id of another run is `NotFound` here, and a record naming another run is refused at staging
/// with [`StageError::RunMismatch`]. It is a cheap borrow of the store; make one per use.
#[derive(Clone, Copy, Debug)]
pub struct RunScope<'s> {
    store: &'s Store,
    run: RunId,
}

impl<'s> RunScope<'s> {
    pub(crate) fn new(store: &'s Store, run: RunId) -> Self {
        Self { store, run }
    }

    /// The run this scope reaches.
    pub fn id(&self) -> RunId {
        self.run
    }

    fn limit(&self, n: u32) -> Result<usize, ReadError> {
        read::check_limit(self.store.limits(), n)
    }

    fn same_run(&self, record: RunId) -> Result<(), StageError> {
        if record != self.run {
            return Err(StageError::RunMismatch {
                scope: self.run,
                record,
            });
        }
        Ok(())
    }

    // ----- reads -----

    /// The run's row.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the run was never created.
    pub fn get(&self) -> Result<Run, ReadError> {
        self.store.read(|txn| read::get_run(txn, self.run))
    }

    /// A task of this run. A task of another run is `NotFound`, exactly as a task that never existed.
    ///
    /// # Errors
    /// [`ReadError::NotFound`], [`ReadError::Decode`].
    pub fn task(&self, task: TaskId) -> Result<Task, ReadError> {
        self.store.read(|txn| read::get_task(txn, self.run, task))
    }

    /// This run's tasks in id order (creation order for ULIDs), at most `limit`, starting after
    /// `after` when paging.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`] if `limit` is over the read limit.
    pub fn tasks(&self, after: Option<TaskId>, limit: u32) -> Result<Listing<Task>, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::tasks_of_run(txn, self.run, after, limit))
    }

    /// The direct children of a task of this run, in id order.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the parent is not a task of this run.
    pub fn children(&self, parent: TaskId, limit: u32) -> Result<Listing<Task>, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::children(txn, self.run, parent, limit))
    }

    /// The task's ancestors, nearest first (parent, grandparent, ...), at most `max` of them: what the
    /// standard preamble walks.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the task is not a task of this run.
    pub fn ancestors(&self, task: TaskId, max: u32) -> Result<Vec<Task>, ReadError> {
        let max = self.limit(max)?;
        self.store
            .read(|txn| read::ancestors(txn, self.run, task, max))
    }

    /// The last `n` session log rows of a task, oldest first: what the resume preamble summarises.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the task is not a task of this run.
    pub fn last_log_rows(
        &self,
        task: TaskId,
        n: u32,
    ) -> Result<Vec<Sequenced<SessionLogRow>>, ReadError> {
        let n = self.limit(n)?;
        self.store
            .read(|txn| read::last_log_rows(txn, self.run, task, n))
    }

    /// A task's session log rows with a sequence number above `after_seq`, oldest first.
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the task is not a task of this run.
    pub fn log_rows_after(
        &self,
        task: TaskId,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<SessionLogRow>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::log_rows_after(txn, self.run, task, after_seq, limit))
    }

    /// The run's latest checkpoint, if one was written.
    ///
    /// # Errors
    /// [`ReadError::Decode`] if the row is corrupt.
    pub fn checkpoint(&self) -> Result<Option<Checkpoint>, ReadError> {
        self.store.read(|txn| {
            let table = txn.open_table(tables::CHECKPOINTS)?;
            match table.get(self.run.0)? {
                None => Ok(None),
                Some(g) => Ok(Some(codec::decode(
                    name::CHECKPOINTS,
                    &self.run,
                    g.value(),
                )?)),
            }
        })
    }

    /// Manifest entries with a sequence number above `after_seq`, in order.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn manifest(
        &self,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<ManifestEntry>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::manifest_rows(txn, self.run, after_seq, limit))
    }

    /// Dead letters with a sequence number above `after_seq`, in order.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn dead_letters(
        &self,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<DeadLetter>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            read::seq_rows(
                txn,
                tables::DEAD_LETTERS,
                name::DEAD_LETTERS,
                self.run,
                after_seq,
                limit,
            )
        })
    }

    /// Audit entries with a sequence number above `after_seq`, in order.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn audit(
        &self,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<AuditEntry>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store
            .read(|txn| read::seq_rows(txn, tables::AUDIT, name::AUDIT, self.run, after_seq, limit))
    }

    /// Gate marks (what the policy's gates count and check) with a sequence number above
    /// `after_seq`, in order.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn gate_marks(
        &self,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<GateMark>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            read::seq_rows(
                txn,
                tables::GATE_MARKS,
                name::GATE_MARKS,
                self.run,
                after_seq,
                limit,
            )
        })
    }

    /// Escalations with a sequence number above `after_seq`, in order.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn escalations(
        &self,
        after_seq: u64,
        limit: u32,
    ) -> Result<Listing<Sequenced<Escalation>>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            read::seq_rows(
                txn,
                tables::ESCALATIONS,
                name::ESCALATIONS,
                self.run,
                after_seq,
                limit,
            )
        })
    }

    /// The idempotency record under `key` in this run, if the key was recorded.
    ///
    /// # Errors
    /// [`ReadError::Decode`] if the row is corrupt.
    pub fn idempotency(&self, key: &str) -> Result<Option<IdempotencyRecord>, ReadError> {
        self.store.read(|txn| {
            let table = txn.open_table(tables::IDEMPOTENCY)?;
            match table.get((self.run.0, key))? {
                None => Ok(None),
                Some(g) => Ok(Some(codec::decode(
                    name::IDEMPOTENCY,
                    &format_args!("{}/{key}", self.run),
                    g.value(),
                )?)),
            }
        })
    }

    /// This run's idempotency records in key order, starting after `after_key` when paging: what a
    /// restarted coordinator reads to know which side effects already started.
    ///
    /// # Errors
    /// [`ReadError::TooManyRows`], [`ReadError::Decode`].
    pub fn idempotency_records(
        &self,
        after_key: Option<&str>,
        limit: u32,
    ) -> Result<Listing<IdempotencyRecord>, ReadError> {
        let limit = self.limit(limit)?;
        self.store.read(|txn| {
            let table = txn.open_table(tables::IDEMPOTENCY)?;
            let start = (self.run.0, after_key.unwrap_or(""));
            let mut items = Vec::new();
            let mut more = false;
            // Keys of this run only: the range ends at the next run id (or the table's end for the last).
            let range = match self.run.0.checked_add(1) {
                Some(next) => table.range::<(u128, &str)>(start..(next, ""))?,
                None => table.range::<(u128, &str)>(start..)?,
            };
            for entry in range {
                let (k, v) = entry?;
                let (_, key) = k.value();
                if after_key == Some(key) {
                    continue;
                }
                if items.len() == limit {
                    more = true;
                    break;
                }
                items.push(codec::decode(
                    name::IDEMPOTENCY,
                    &format_args!("{}/{key}", self.run),
                    v.value(),
                )?);
            }
            Ok(Listing { items, more })
        })
    }

    /// The bytes of a blob of this run (an attachment or output stored by reference).
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if this run has no blob under `key`.
    pub fn blob(&self, key: u128) -> Result<Vec<u8>, ReadError> {
        self.store.read(|txn| {
            let table = txn.open_table(tables::BLOBS)?;
            match table.get((self.run.0, key))? {
                None => Err(ReadError::NotFound {
                    what: "blob",
                    key: key.to_string(),
                }),
                Some(g) => Ok(g.value().to_vec()),
            }
        })
    }

    /// The agent profile named `agent` this run was hosted with (see
    /// [`RunScope::stage_put_agent`]).
    ///
    /// # Errors
    /// [`ReadError::NotFound`] if the run has no profile of that name (a store written before runs
    /// kept their profiles has none); [`ReadError::Decode`].
    pub fn agent(&self, agent: &str) -> Result<AgentProfile, ReadError> {
        let not_found = || ReadError::NotFound {
            what: "agent profile of the run",
            key: format!("{}/{agent}", self.run),
        };
        self.store.read(|txn| {
            let table = match txn.open_table(tables::RUN_AGENTS) {
                Ok(table) => table,
                // A read-only open of a store no writer of this version has opened yet.
                Err(redb::TableError::TableDoesNotExist(_)) => return Err(not_found()),
                Err(e) => return Err(e.into()),
            };
            match table.get((self.run.0, agent))? {
                None => Err(not_found()),
                Some(g) => Ok(codec::decode(
                    name::RUN_AGENTS,
                    &format_args!("{}/{agent}", self.run),
                    g.value(),
                )?),
            }
        })
    }

    // ----- staged writes -----

    /// Stages the creation of this run's row. The commit fails with `RunExists` if it exists.
    ///
    /// # Errors
    /// [`StageError::RunMismatch`] if `run.id` is not this scope's run; [`StageError::Limit`].
    pub fn stage_create_run<'a>(
        &self,
        run: impl Into<Cow<'a, Run>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let run: Cow<'a, Run> = run.into();
        self.same_run(run.id)?;
        self.store.limits().check_run(&run)?;
        Ok(StagedWrite::for_run(self.run, RunOp::CreateRun(run)))
    }

    /// Stages a replacement of this run's row (status, budget, outcome).
    ///
    /// # Errors
    /// [`StageError::RunMismatch`], [`StageError::Limit`].
    pub fn stage_update_run<'a>(
        &self,
        run: impl Into<Cow<'a, Run>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let run: Cow<'a, Run> = run.into();
        self.same_run(run.id)?;
        self.store.limits().check_run(&run)?;
        Ok(StagedWrite::for_run(self.run, RunOp::UpdateRun(run)))
    }

    /// Stages a new task of this run, indexed under its parent (which must be a task of this run).
    /// Attachments over the inline threshold are moved to the blob table at commit.
    ///
    /// # Errors
    /// [`StageError::RunMismatch`], [`StageError::Limit`], [`StageError::Invalid`] for a task that is
    /// its own parent.
    pub fn stage_create_task<'a>(
        &self,
        task: impl Into<Cow<'a, Task>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let task: Cow<'a, Task> = task.into();
        self.same_run(task.run_id)?;
        if task.parent == Some(task.id) {
            return Err(StageError::Invalid {
                field: "task.parent",
                reason: "a task cannot be its own parent",
            });
        }
        self.store.limits().check_task(&task)?;
        Ok(StagedWrite::for_run(self.run, RunOp::CreateTask(task)))
    }

    /// Stages a replacement of a task of this run (status, outcome, attachments, notes). Its parent
    /// cannot change.
    ///
    /// # Errors
    /// [`StageError::RunMismatch`], [`StageError::Limit`].
    pub fn stage_update_task<'a>(
        &self,
        task: impl Into<Cow<'a, Task>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let task: Cow<'a, Task> = task.into();
        self.same_run(task.run_id)?;
        self.store.limits().check_task(&task)?;
        Ok(StagedWrite::for_run(self.run, RunOp::UpdateTask(task)))
    }

    /// Stages a session log row for a task of this run; it gets the task's next sequence number at
    /// commit ([`crate::Applied::LogAppended`]).
    ///
    /// # Errors
    /// [`StageError::Limit`] for a summary or detail over its limit.
    pub fn stage_append_log<'a>(
        &self,
        task: TaskId,
        row: impl Into<Cow<'a, SessionLogRow>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let row: Cow<'a, SessionLogRow> = row.into();
        self.store.limits().check_log_row(&row)?;
        Ok(StagedWrite::for_run(
            self.run,
            RunOp::AppendLog { task, row },
        ))
    }

    /// Stages this run's checkpoint (replacing the previous one).
    ///
    /// # Errors
    /// [`StageError::RunMismatch`], [`StageError::Limit`].
    pub fn stage_put_checkpoint<'a>(
        &self,
        checkpoint: impl Into<Cow<'a, Checkpoint>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let checkpoint: Cow<'a, Checkpoint> = checkpoint.into();
        self.same_run(checkpoint.run_id)?;
        self.store.limits().check_checkpoint(&checkpoint)?;
        Ok(StagedWrite::for_run(
            self.run,
            RunOp::PutCheckpoint(checkpoint),
        ))
    }

    /// Stages a manifest entry; it gets the run's next sequence number at commit. There is no way to
    /// update or delete one: the manifest is the run's trustworthy history.
    ///
    /// ```compile_fail,E0599
    /// # fn f(store: &keel_store::Store, entry: keel_store::ManifestEntry) {
    /// let w = store.run(keel_store::RunId(1)).stage_update_manifest(1, entry);
    /// # }
    /// ```
    ///
    /// ```compile_fail,E0599
    /// # fn f(store: &keel_store::Store) {
    /// let w = store.run(keel_store::RunId(1)).stage_delete_manifest(1);
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`StageError::Limit`].
    pub fn stage_append_manifest<'a>(
        &self,
        entry: impl Into<Cow<'a, ManifestEntry>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let entry: Cow<'a, ManifestEntry> = entry.into();
        self.store.limits().check_manifest(&entry)?;
        Ok(StagedWrite::for_run(self.run, RunOp::AppendManifest(entry)))
    }

    /// Stages a dead letter.
    ///
    /// # Errors
    /// [`StageError::Limit`].
    pub fn stage_append_dead_letter<'a>(
        &self,
        letter: impl Into<Cow<'a, DeadLetter>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let letter: Cow<'a, DeadLetter> = letter.into();
        self.store.limits().check_dead_letter(&letter)?;
        Ok(StagedWrite::for_run(
            self.run,
            RunOp::AppendDeadLetter(letter),
        ))
    }

    /// Stages an idempotency record. Commit it (durably) before the side effect it guards: the
    /// result is [`crate::Applied::IdempotencyRecorded`] the first time and
    /// [`crate::Applied::AlreadyRecorded`] with the original record on any replay.
    ///
    /// # Errors
    /// [`StageError::Limit`], [`StageError::Invalid`] for an empty key.
    pub fn stage_record_idempotency<'a>(
        &self,
        record: impl Into<Cow<'a, IdempotencyRecord>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let record: Cow<'a, IdempotencyRecord> = record.into();
        if record.key.is_empty() {
            return Err(StageError::Invalid {
                field: "idempotency.key",
                reason: "empty",
            });
        }
        self.store.limits().check_idempotency(&record)?;
        Ok(StagedWrite::for_run(
            self.run,
            RunOp::RecordIdempotency(record),
        ))
    }

    /// Stages an audit entry (one hook decision).
    ///
    /// # Errors
    /// [`StageError::Limit`].
    pub fn stage_append_audit<'a>(
        &self,
        entry: impl Into<Cow<'a, AuditEntry>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let entry: Cow<'a, AuditEntry> = entry.into();
        self.store.limits().check_audit(&entry)?;
        Ok(StagedWrite::for_run(self.run, RunOp::AppendAudit(entry)))
    }

    /// Stages a gate mark (what a gate reads back: a counted call, a met prerequisite, a token,
    /// an amount).
    ///
    /// # Errors
    /// [`StageError::Limit`].
    pub fn stage_append_gate_mark<'a>(
        &self,
        mark: impl Into<Cow<'a, GateMark>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let mark: Cow<'a, GateMark> = mark.into();
        self.store.limits().check_gate_mark(&mark)?;
        Ok(StagedWrite::for_run(self.run, RunOp::AppendGateMark(mark)))
    }

    /// Stages an escalation.
    ///
    /// # Errors
    /// [`StageError::Limit`].
    pub fn stage_append_escalation<'a>(
        &self,
        escalation: impl Into<Cow<'a, Escalation>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let escalation: Cow<'a, Escalation> = escalation.into();
        self.store.limits().check_escalation(&escalation)?;
        Ok(StagedWrite::for_run(
            self.run,
            RunOp::AppendEscalation(escalation),
        ))
    }

    /// Stages the resolution of one of this run's escalations: the first resolution stays (a later
    /// one commits as [`crate::Applied::EscalationAlreadyResolved`] and changes nothing).
    ///
    /// # Errors
    /// [`StageError::Limit`] for an answer over the text limit.
    pub fn stage_resolve_escalation<'a>(
        &self,
        id: EscalationId,
        resolution: impl Into<Cow<'a, EscalationResolution>>,
    ) -> Result<StagedWrite<'a>, StageError> {
        let resolution: Cow<'a, EscalationResolution> = resolution.into();
        self.store.limits().check_resolution(&resolution)?;
        Ok(StagedWrite::for_run(
            self.run,
            RunOp::ResolveEscalation { id, resolution },
        ))
    }

    /// Stages a blob (an output stored by reference); its key is returned at commit in
    /// [`crate::Applied::BlobStored`].
    ///
    /// # Errors
    /// [`StageError::Limit`] above the attachment maximum.
    pub fn stage_put_blob(&self, bytes: Vec<u8>) -> Result<StagedWrite<'static>, StageError> {
        self.store
            .limits()
            .check_blob_len(u64::try_from(bytes.len()).unwrap_or(u64::MAX))?;
        Ok(StagedWrite::for_run(self.run, RunOp::PutBlob(bytes)))
    }

    /// Stages an agent profile this run is hosted with (created or replaced by name): a task's
    /// model comes from its assignee's profile, and a follow-up or resume in another process reads
    /// it here, so an ad-hoc profile (`keel run --harness X --model M`) outlives the process that
    /// made it. Unlike every other write of a run, the run's row need not exist yet.
    ///
    /// # Errors
    /// [`StageError::Limit`] if a field is over its limit; [`StageError::Invalid`] for an empty name.
    pub fn stage_put_agent(
        &self,
        profile: AgentProfile,
    ) -> Result<StagedWrite<'static>, StageError> {
        self.store.check_agent(&profile)?;
        Ok(StagedWrite::for_run(self.run, RunOp::PutAgent(profile)))
    }
}
