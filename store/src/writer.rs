//! The write side of one transaction: applying staged writes to the tables, in batch order.
//!
//! What it reads to check a write (does the run exist, the task, where does the task's log end) it
//! first looks up in the store's [`Known`] cache, which its earlier commits filled, and reads from
//! the tables only on a miss (see the `known` module for why that is sound).

use std::borrow::Cow;
use std::collections::BTreeMap;

use redb::{ReadableTable, Table};
use serde::Serialize;

use crate::batch::{Applied, RunOp, Staged, StagedWrite};
use crate::codec::{self, DecodeError};
use crate::error::{CommitError, ItemError};
use crate::known::{Known, SeqTable};
use crate::limits::Limits;
use crate::log_segment::{self, Segment};
use crate::model::{
    AttachmentBody, Budget, Escalation, IdempotencyRecord, ManifestEntry, Run, RunId, RunStatus,
    SessionLogRow, Task, TaskId,
};
use crate::redo::{self, tag};
use crate::tables::{self, Row, name};
use crate::task_state::{StateOf, TaskHead};

/// Attachments moved to the blob table: (attachment index, blob key).
type Blobbed = Vec<(u32, u128)>;

/// Why one write of a batch could not be applied.
pub(crate) enum Failure {
    Item(ItemError),
    Commit(CommitError),
}

impl Failure {
    /// The commit error for the write at `index` of its batch.
    pub(crate) fn at(self, index: usize) -> CommitError {
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

/// A journal record's entries that could not be written or read back, as the item error of the
/// write (or record) that needed them.
fn record_error(e: redo::RedoError) -> Failure {
    Failure::Item(ItemError::Encode(codec::EncodeError {
        table: "journal",
        reason: e.to_string(),
    }))
}

/// A journal record's entry that could not be read back, as the record's decode error.
fn replay_error(e: redo::RedoError) -> Failure {
    Failure::Item(ItemError::Decode(DecodeError::Corrupt {
        table: "journal",
        key: "a record's entries".to_string(),
        reason: e.to_string(),
    }))
}

/// The newest sequence number under `run` in a `(run, seq)` table (`None` for an empty range).
fn last_seq<T: ReadableTable<tables::RunSeq, Row>>(
    table: &T,
    run: u128,
) -> Result<Option<u64>, Failure> {
    Ok(
        match table.range((run, 0u64)..=(run, u64::MAX))?.next_back() {
            None => None,
            Some(entry) => Some(entry?.0.value().1),
        },
    )
}

/// The newest manifest entry's sequence number under `run` (`None` for none): the last key's, or
/// the last of the segment stored under it (store format 6).
fn last_manifest_seq<T: ReadableTable<tables::RunSeq, Row>>(
    table: &T,
    run: RunId,
) -> Result<Option<u64>, Failure> {
    match table.range((run.0, 0u64)..=(run.0, u64::MAX))?.next_back() {
        None => Ok(None),
        Some(entry) => {
            let (k, v) = entry?;
            let first = k.value().1;
            Ok(Some(log_segment::last_seq(
                name::MANIFEST,
                &format_args!("{run}/{first}"),
                first,
                v.value(),
            )?))
        }
    }
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
/// at commit flushes and closes) two, not all nineteen, which is most of a small commit's fixed cost.
struct Lazy<'t, K: redb::Key + 'static, V: redb::Value + 'static> {
    txn: &'t redb::WriteTransaction,
    definition: redb::TableDefinition<'static, K, V>,
    /// The table's tag in a journal record's entries (`redo`).
    tag: u8,
    table: Option<Table<'t, K, V>>,
}

impl<'t, K: redb::Key + 'static, V: redb::Value + 'static> Lazy<'t, K, V> {
    fn new(
        txn: &'t redb::WriteTransaction,
        definition: redb::TableDefinition<'static, K, V>,
        tag: u8,
    ) -> Self {
        Self {
            txn,
            definition,
            tag,
            table: None,
        }
    }

    /// Inserts a row, and records it in `redo` when the commit keeps a record of its rows; answers
    /// whether it replaced one.
    fn put<'k, 'v>(
        &mut self,
        redo: &mut Option<&mut Vec<u8>>,
        key: K::SelfType<'k>,
        value: V::SelfType<'v>,
    ) -> Result<bool, Failure> {
        if let Some(redo) = redo {
            redo::record::<K, V>(redo, self.tag, &key, Some(&value)).map_err(record_error)?;
        }
        Ok(self.open()?.insert(key, value)?.is_some())
    }

    /// Removes a row, and records the removal in `redo` as [`Lazy::put`] does.
    fn delete<'k>(
        &mut self,
        redo: &mut Option<&mut Vec<u8>>,
        key: K::SelfType<'k>,
    ) -> Result<(), Failure> {
        if let Some(redo) = redo {
            redo::record::<K, V>(redo, self.tag, &key, None).map_err(record_error)?;
        }
        self.open()?.remove(key)?;
        Ok(())
    }

    /// Applies the next entry of a journal record, whose tag named this table.
    fn replay(&mut self, entries: &mut redo::Entries<'_>, remove: bool) -> Result<(), Failure> {
        let key = entries.field::<K>().map_err(replay_error)?;
        if remove {
            self.open()?.remove(K::from_bytes(key))?;
        } else {
            let value = entries.field::<V>().map_err(replay_error)?;
            self.open()?
                .insert(K::from_bytes(key), V::from_bytes(value))?;
        }
        Ok(())
    }

    /// The open table. Borrowed in place: moving a redb `Table` out and back on every row is a
    /// copy of the whole handle each time.
    fn open(&mut self) -> Result<&mut Table<'t, K, V>, Failure> {
        match &mut self.table {
            Some(table) => Ok(table),
            slot @ None => Ok(slot.insert(
                self.txn
                    .open_table(self.definition)
                    .map_err(|e| Failure::Commit(e.into()))?,
            )),
        }
    }
}

/// The tables of one write transaction, applying staged writes in order.
pub(crate) struct Writer<'t> {
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
    /// What the store's commits (earlier ones and this one so far) say exists: checked before
    /// the tables, and taught what this transaction writes. The store clears it if this
    /// transaction does not commit.
    known: &'t mut Known,
    /// Runs whose row this transaction wrote terminal: the store drops them from the cache once
    /// the transaction has committed.
    finished: Vec<u128>,
    /// The buffer rows are encoded into, reused row after row.
    buf: Vec<u8>,
    /// Session-log rows staged by this transaction and not yet written, a segment per task
    /// (`log_segment`): written by [`Writer::finish`], before the commit.
    logs_pending: BTreeMap<(u128, u128), Segment>,
    /// Manifest entries staged by this transaction and not yet written, a segment per run (store
    /// format 6, as `logs_pending`).
    manifest_pending: BTreeMap<u128, Segment>,
    /// Where the rows this transaction writes are recorded for the journal (`redo`), when the
    /// commit is a journaled one.
    redo: Option<&'t mut Vec<u8>>,
}

impl<'t> Writer<'t> {
    pub(crate) fn open(
        txn: &'t redb::WriteTransaction,
        limits: &'t Limits,
        known: &'t mut Known,
    ) -> Self {
        Self {
            limits,
            runs: Lazy::new(txn, tables::RUNS, tag::RUNS),
            open_runs: Lazy::new(txn, tables::OPEN_RUNS, tag::OPEN_RUNS),
            plans: Lazy::new(txn, tables::RUN_PLANS, tag::RUN_PLANS),
            tasks: Lazy::new(txn, tables::TASKS, tag::TASKS),
            task_states: Lazy::new(txn, tables::TASK_STATES, tag::TASK_STATES),
            task_run: Lazy::new(txn, tables::TASK_RUN, tag::TASK_RUN),
            children: Lazy::new(txn, tables::TASK_CHILDREN, tag::TASK_CHILDREN),
            logs: Lazy::new(txn, tables::SESSION_LOGS, tag::SESSION_LOGS),
            checkpoints: Lazy::new(txn, tables::CHECKPOINTS, tag::CHECKPOINTS),
            manifest: Lazy::new(txn, tables::MANIFEST, tag::MANIFEST),
            dead_letters: Lazy::new(txn, tables::DEAD_LETTERS, tag::DEAD_LETTERS),
            idempotency: Lazy::new(txn, tables::IDEMPOTENCY, tag::IDEMPOTENCY),
            audit: Lazy::new(txn, tables::AUDIT, tag::AUDIT),
            gate_marks: Lazy::new(txn, tables::GATE_MARKS, tag::GATE_MARKS),
            escalations: Lazy::new(txn, tables::ESCALATIONS, tag::ESCALATIONS),
            escalation_ids: Lazy::new(txn, tables::ESCALATION_IDS, tag::ESCALATION_IDS),
            blobs: Lazy::new(txn, tables::BLOBS, tag::BLOBS),
            agents: Lazy::new(txn, tables::AGENTS, tag::AGENTS),
            run_agents: Lazy::new(txn, tables::RUN_AGENTS, tag::RUN_AGENTS),
            known,
            finished: Vec::new(),
            buf: Vec::new(),
            logs_pending: BTreeMap::new(),
            manifest_pending: BTreeMap::new(),
            redo: None,
        }
    }

    /// This writer, recording every row it inserts or removes at the end of `redo`, for the
    /// commit's journal record.
    pub(crate) fn recording(mut self, redo: &'t mut Vec<u8>) -> Self {
        self.redo = Some(redo);
        self
    }

    /// Writes what the transaction has staged and not written yet (its log and manifest segments;
    /// a failure is reported as the batch's first write's) and answers
    /// the runs it wrote terminal (for the store to forget once it commits). Called once, after
    /// the last write of the batch and before the commit.
    ///
    /// # Errors
    /// The storage's, as [`CommitError`].
    pub(crate) fn finish(mut self) -> Result<Vec<u128>, CommitError> {
        for ((run, task), segment) in std::mem::take(&mut self.logs_pending) {
            self.write_segment(run, task, &segment)
                .map_err(|f| f.at(0))?;
        }
        for (run, segment) in std::mem::take(&mut self.manifest_pending) {
            self.write_manifest_segment(run, &segment)
                .map_err(|f| f.at(0))?;
        }
        Ok(self.finished)
    }

    /// Applies a journal record's entries (payload version 2, `redo`): the rows a commit wrote,
    /// written again in the same order, with no checks to decide anything differently.
    ///
    /// # Errors
    /// A record that does not read back (truncated, an unknown table) as an item error; the
    /// storage's.
    pub(crate) fn replay(&mut self, record: &[u8]) -> Result<(), Failure> {
        // What the cache knows is not taught by rows written back; a record of staged writes
        // after this one (a journal an older keel began) reads the tables again.
        self.known.clear();
        let mut entries = redo::Entries::new(record);
        while let Some((table, remove)) = entries.next_tag() {
            match table {
                tag::RUNS => self.runs.replay(&mut entries, remove)?,
                tag::OPEN_RUNS => self.open_runs.replay(&mut entries, remove)?,
                tag::RUN_PLANS => self.plans.replay(&mut entries, remove)?,
                tag::TASKS => self.tasks.replay(&mut entries, remove)?,
                tag::TASK_STATES => self.task_states.replay(&mut entries, remove)?,
                tag::TASK_RUN => self.task_run.replay(&mut entries, remove)?,
                tag::TASK_CHILDREN => self.children.replay(&mut entries, remove)?,
                tag::SESSION_LOGS => self.logs.replay(&mut entries, remove)?,
                tag::CHECKPOINTS => self.checkpoints.replay(&mut entries, remove)?,
                tag::MANIFEST => self.manifest.replay(&mut entries, remove)?,
                tag::DEAD_LETTERS => self.dead_letters.replay(&mut entries, remove)?,
                tag::IDEMPOTENCY => self.idempotency.replay(&mut entries, remove)?,
                tag::AUDIT => self.audit.replay(&mut entries, remove)?,
                tag::GATE_MARKS => self.gate_marks.replay(&mut entries, remove)?,
                tag::ESCALATIONS => self.escalations.replay(&mut entries, remove)?,
                tag::ESCALATION_IDS => self.escalation_ids.replay(&mut entries, remove)?,
                tag::BLOBS => self.blobs.replay(&mut entries, remove)?,
                tag::AGENTS => self.agents.replay(&mut entries, remove)?,
                tag::RUN_AGENTS => self.run_agents.replay(&mut entries, remove)?,
                other => return Err(replay_error(redo::RedoError::UnknownTable(other))),
            }
        }
        Ok(())
    }

    fn write_segment(&mut self, run: u128, task: u128, segment: &Segment) -> Result<(), Failure> {
        self.logs.put(
            &mut self.redo,
            (run, task, segment.first()),
            segment.value().as_slice(),
        )?;
        Ok(())
    }

    /// Stages log row `seq` of a task into the task's segment of this transaction, writing the
    /// segment it cannot join (full, or not the row after its last) first.
    fn stage_log_row(
        &mut self,
        run: RunId,
        task: TaskId,
        seq: u64,
        row: &SessionLogRow,
    ) -> Result<(), Failure> {
        let key = (run.0, task.0);
        if self
            .logs_pending
            .get(&key)
            .is_some_and(|segment| !segment.takes(seq))
            && let Some(full) = self.logs_pending.remove(&key)
        {
            self.write_segment(run.0, task.0, &full)?;
        }
        self.logs_pending
            .entry(key)
            .or_insert_with(|| Segment::new(seq))
            .push(name::SESSION_LOGS, row)?;
        Ok(())
    }

    fn write_manifest_segment(&mut self, run: u128, segment: &Segment) -> Result<(), Failure> {
        self.manifest.put(
            &mut self.redo,
            (run, segment.first()),
            segment.value().as_slice(),
        )?;
        Ok(())
    }

    /// Stages manifest entry `seq` of a run into the run's segment of this transaction, writing
    /// the segment it cannot join first (as [`Writer::stage_log_row`]).
    fn stage_manifest_entry(
        &mut self,
        run: RunId,
        seq: u64,
        entry: &ManifestEntry,
    ) -> Result<(), Failure> {
        if self
            .manifest_pending
            .get(&run.0)
            .is_some_and(|segment| !segment.takes(seq))
            && let Some(full) = self.manifest_pending.remove(&run.0)
        {
            self.write_manifest_segment(run.0, &full)?;
        }
        self.manifest_pending
            .entry(run.0)
            .or_insert_with(|| Segment::new(seq))
            .push(name::MANIFEST, entry)?;
        Ok(())
    }

    /// Whether task `task` of `run` is stored (or staged earlier in this transaction), from the
    /// cache when it holds the task.
    fn task_exists(&mut self, run: RunId, task: TaskId) -> Result<bool, Failure> {
        if self.known.tasks.contains_key(&(run.0, task.0)) {
            return Ok(true);
        }
        let found = self.tasks.open()?.get((run.0, task.0))?.is_some();
        if found {
            self.known.tasks.insert((run.0, task.0), None);
        }
        Ok(found)
    }

    /// The sequence number the next log row of task `task` of `run` takes (1 for its first row),
    /// `None` when the task is not stored. The task and its log's end are read once while the
    /// cache holds the task (from its creation or its first row on), and counted on from there.
    fn next_log_seq(&mut self, run: RunId, task: TaskId) -> Result<Option<u64>, Failure> {
        let key = (run.0, task.0);
        // Rows this transaction numbered are not in the table until `finish`: their segment says
        // where the log ends, whatever the cache holds.
        if let Some(last) = self.logs_pending.get(&key).and_then(Segment::last) {
            let seq = following(Some(last), name::SESSION_LOGS)?;
            self.known.tasks.insert(key, Some(seq));
            return Ok(Some(seq));
        }
        match self.known.tasks.get_mut(&key) {
            Some(Some(last)) => {
                let seq = following(Some(*last), name::SESSION_LOGS)?;
                *last = seq;
                return Ok(Some(seq));
            }
            Some(None) => {}
            None => {
                if self.tasks.open()?.get(key)?.is_none() {
                    return Ok(None);
                }
            }
        }
        let last = {
            let mut range = self
                .logs
                .open()?
                .range((run.0, task.0, 0u64)..=(run.0, task.0, u64::MAX))?;
            match range.next_back() {
                None => None,
                Some(entry) => {
                    let (k, v) = entry?;
                    let first = k.value().2;
                    Some(log_segment::last_seq(
                        name::SESSION_LOGS,
                        &format_args!("{run}/{task}/{first}"),
                        first,
                        v.value(),
                    )?)
                }
            }
        };
        let seq = following(last, name::SESSION_LOGS)?;
        self.known.tasks.insert(key, Some(seq));
        Ok(Some(seq))
    }

    /// The sequence number the next row of a run's append-only `table` takes (1 for its first),
    /// read from the table's end once and counted on from there, this commit and later ones.
    fn next_run_seq(&mut self, table: SeqTable, run: RunId) -> Result<u64, Failure> {
        let pending = match table {
            SeqTable::Manifest => self.manifest_pending.get(&run.0).and_then(Segment::last),
            _ => None,
        };
        let last = match pending.or_else(|| self.known.seqs.get(&(run.0, table)).copied()) {
            Some(last) => Some(last),
            None => match table {
                SeqTable::Manifest => last_manifest_seq(&*self.manifest.open()?, run)?,
                SeqTable::DeadLetters => last_seq(&*self.dead_letters.open()?, run.0)?,
                SeqTable::Audit => last_seq(&*self.audit.open()?, run.0)?,
                SeqTable::GateMarks => last_seq(&*self.gate_marks.open()?, run.0)?,
                SeqTable::Escalations => last_seq(&*self.escalations.open()?, run.0)?,
            },
        };
        let seq = following(last, table.name())?;
        self.known.seqs.insert((run.0, table), seq);
        Ok(seq)
    }

    fn require_run(&mut self, run: RunId) -> Result<(), Failure> {
        if self.known.runs.contains(&run.0) {
            return Ok(());
        }
        if self.runs.open()?.get(run.0)?.is_none() {
            return Err(ItemError::RunNotFound(run).into());
        }
        self.known.runs.insert(run.0);
        Ok(())
    }

    /// Whether stored task `task` of `run` is a root (has no parent), from the cache when it
    /// holds the task.
    fn is_root(&mut self, run: RunId, task: TaskId) -> Result<bool, Failure> {
        if let Some(&root) = self.known.roots.get(&(run.0, task.0)) {
            return Ok(root);
        }
        let Some(head) = self.stored_head(run, task)? else {
            return Err(ItemError::TaskNotFound { run, task }.into());
        };
        let root = head.parent.is_none();
        self.known.roots.insert((run.0, task.0), root);
        Ok(root)
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
        self.blobs.put(&mut self.redo, (run.0, key), bytes)?;
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

    pub(crate) fn apply(&mut self, write: &StagedWrite<'_>) -> Result<Applied, Failure> {
        let (run, op) = match &write.staged {
            Staged::Agent(profile) => {
                let bytes = codec::encode_into(name::AGENTS, profile, &mut self.buf)?;
                self.agents
                    .put(&mut self.redo, profile.name.as_str(), bytes)?;
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
                    self.plans.put(&mut self.redo, run.0, plan.as_bytes())?;
                }
                self.put_run(r)?;
                self.known.runs.insert(run.0);
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
                // The index row is written as the id is checked (one descent of the tree, not a
                // read and then a write): a taken id fails the write, which aborts the whole
                // transaction, so the row it displaced is never committed.
                if self.task_run.put(&mut self.redo, task.id.0, run.0)? {
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
                let bytes = codec::encode_into(name::TASKS, &*task, &mut self.buf)?;
                self.tasks.put(&mut self.redo, (run.0, task.id.0), bytes)?;
                match task.parent {
                    // A child of a root is found by the run's task rows (`read::children`): a
                    // run's root has most of its tasks as children, which its rows list anyway.
                    Some(parent) if self.is_root(run, parent)? => {}
                    Some(parent) => {
                        self.children
                            .put(&mut self.redo, (run.0, parent.0, task.id.0), ())?;
                    }
                    None => {}
                }
                self.known
                    .roots
                    .insert((run.0, task.id.0), task.parent.is_none());
                // A new task has no log rows yet: its first row takes 1 without a lookup.
                self.known.tasks.insert((run.0, task.id.0), Some(0));
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
                    let bytes =
                        codec::encode_into(name::TASK_STATES, &StateOf::of(&task), &mut self.buf)?;
                    self.task_states.put(&mut self.redo, key, bytes)?;
                } else {
                    let bytes = codec::encode_into(name::TASKS, &*task, &mut self.buf)?;
                    self.tasks.put(&mut self.redo, key, bytes)?;
                    self.task_states.delete(&mut self.redo, key)?;
                }
                Ok(Applied::TaskUpdated { blobbed })
            }
            RunOp::AppendLog { task, row } => {
                let task = *task;
                let Some(seq) = self.next_log_seq(run, task)? else {
                    return Err(ItemError::TaskNotFound { run, task }.into());
                };
                self.stage_log_row(run, task, seq, row)?;
                Ok(Applied::LogAppended { seq })
            }
            RunOp::PutCheckpoint(c) => {
                self.require_run(run)?;
                let bytes = codec::encode_into(name::CHECKPOINTS, &c, &mut self.buf)?;
                self.checkpoints.put(&mut self.redo, run.0, bytes)?;
                Ok(Applied::CheckpointWritten)
            }
            RunOp::AppendManifest(m) => {
                self.require_run(run)?;
                let seq = self.next_run_seq(SeqTable::Manifest, run)?;
                self.stage_manifest_entry(run, seq, m)?;
                Ok(Applied::ManifestAppended { seq })
            }
            RunOp::AppendDeadLetter(d) => {
                self.require_run(run)?;
                let seq = self.next_run_seq(SeqTable::DeadLetters, run)?;
                let bytes = codec::encode_into(name::DEAD_LETTERS, &d, &mut self.buf)?;
                self.dead_letters.put(&mut self.redo, (run.0, seq), bytes)?;
                Ok(Applied::DeadLetterAppended { seq })
            }
            RunOp::AppendAudit(a) => {
                self.require_run(run)?;
                let seq = self.next_run_seq(SeqTable::Audit, run)?;
                let bytes = codec::encode_into(name::AUDIT, &a, &mut self.buf)?;
                self.audit.put(&mut self.redo, (run.0, seq), bytes)?;
                Ok(Applied::AuditAppended { seq })
            }
            RunOp::AppendGateMark(m) => {
                self.require_run(run)?;
                let seq = self.next_run_seq(SeqTable::GateMarks, run)?;
                let bytes = codec::encode_into(name::GATE_MARKS, &m, &mut self.buf)?;
                self.gate_marks.put(&mut self.redo, (run.0, seq), bytes)?;
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
                let seq = self.next_run_seq(SeqTable::Escalations, run)?;
                let bytes = codec::encode_into(name::ESCALATIONS, &e, &mut self.buf)?;
                self.escalations.put(&mut self.redo, (run.0, seq), bytes)?;
                self.escalation_ids
                    .put(&mut self.redo, e.id.0, (run.0, seq))?;
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
                let bytes = codec::encode_into(name::ESCALATIONS, &row, &mut self.buf)?;
                self.escalations.put(&mut self.redo, (owner, seq), bytes)?;
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
                let bytes = codec::encode_into(name::IDEMPOTENCY, &record, &mut self.buf)?;
                self.idempotency
                    .put(&mut self.redo, (run.0, record.key.as_str()), bytes)?;
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
                let bytes = codec::encode_into(name::RUN_AGENTS, profile, &mut self.buf)?;
                self.run_agents
                    .put(&mut self.redo, (run.0, profile.name.as_str()), bytes)?;
                Ok(Applied::AgentProfileWritten)
            }
        }
    }

    /// Writes a run's row (without its plan: that is in its own table, written at creation) and
    /// keeps the open-runs index in step with it, in this same transaction: the index and the rows
    /// are committed (or lost in a crash) together, so they never disagree.
    fn put_run(&mut self, r: &Run) -> Result<(), Failure> {
        let bytes = codec::encode_into(name::RUNS, &RunRow::of(r), &mut self.buf)?;
        self.runs.put(&mut self.redo, r.id.0, bytes)?;
        if r.status.is_terminal() {
            self.open_runs.delete(&mut self.redo, r.id.0)?;
            self.finished.push(r.id.0);
        } else {
            self.open_runs.put(&mut self.redo, r.id.0, ())?;
        }
        Ok(())
    }
}

/// A run's row as the `runs` table holds it: the run by reference with its plan left out (the plan
/// is in `run_plans`), encoded exactly as a [`Run`] whose plan is `None` (serde encodes a
/// reference as the value), so writing the row copies neither the brief nor the config snapshot.
#[derive(Serialize)]
struct RunRow<'a> {
    id: RunId,
    brief: &'a str,
    plan: Option<&'a str>,
    status: RunStatus,
    budget: &'a Budget,
    created_ms: u64,
    updated_ms: u64,
    config_snapshot: &'a str,
    outcome: Option<&'a str>,
}

impl<'a> RunRow<'a> {
    fn of(run: &'a Run) -> Self {
        // Named exhaustively, so a field added to `Run` cannot be left out of its row unnoticed.
        let Run {
            id,
            brief,
            plan: _,
            status,
            budget,
            created_ms,
            updated_ms,
            config_snapshot,
            outcome,
        } = run;
        Self {
            id: *id,
            brief,
            plan: None,
            status: *status,
            budget,
            created_ms: *created_ms,
            updated_ms: *updated_ms,
            config_snapshot,
            outcome: outcome.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;

    #[test]
    fn a_run_row_encodes_as_the_run_without_its_plan() {
        let run = Run {
            id: RunId(9),
            brief: "survey the folder".into(),
            plan: Some("{\"steps\":[]}".into()),
            status: RunStatus::Running,
            budget: Budget {
                limit_micros: Some(5),
                reserved_micros: 2,
                spent_micros: 1,
            },
            created_ms: 3,
            updated_ms: 4,
            config_snapshot: "agents: a, b".into(),
            outcome: Some("done".into()),
        };
        let mut buf = Vec::new();
        let row = codec::encode_into(name::RUNS, &RunRow::of(&run), &mut buf)
            .unwrap()
            .to_vec();
        let without = Run {
            plan: None,
            ..run.clone()
        };
        assert_eq!(row, codec::encode(name::RUNS, &without).unwrap());
        let read: Run = codec::decode(name::RUNS, &"9", &row).unwrap();
        assert_eq!(read, without);
        let unplanned = Run {
            outcome: None,
            ..without
        };
        let row = codec::encode_into(name::RUNS, &RunRow::of(&unplanned), &mut buf).unwrap();
        assert_eq!(row, codec::encode(name::RUNS, &unplanned).unwrap());
    }
}
