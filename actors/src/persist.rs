//! Store writes as values. Machines never touch the store: they describe writes, the checkpoint machine
//! batches them (group commit), and its host commits each batch in one redb write transaction.
//!
//! [`PersistOp`] maps 1:1 onto keel-store's staged writes (`RunScope::stage_*`): the host turns each op
//! into the staged write of the same name under the op's run scope, pushes them into one `WriteBatch` in
//! order, and calls `Store::commit_group`. A [`Stage`] (the ops of one coordinator decision) is never
//! split across transactions, which is how a step result and its done-marker land together.

use keel_store::{
    AuditEntry, Checkpoint, DeadLetter, Escalation, EscalationId, EscalationResolution, GateMark,
    IdempotencyRecord, ManifestEntry, Run, RunId, RunScope, SessionLogRow, StageError, StagedWrite,
    Task, TaskId,
};

/// One store write, run-scoped by the [`Stage`] that carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PersistOp {
    /// `stage_create_run`: a new run row.
    CreateRun(Run),
    /// `stage_update_run`: replace the run row (status, budget, outcome); its plan stays as the run
    /// was created with it (a row without one keeps it).
    UpdateRun(Run),
    /// `stage_create_task`: a new task row, indexed under its run and parent.
    CreateTask(Task),
    /// `stage_update_task`: replace a task row (status, attempt, model, outcome).
    UpdateTask(Task),
    /// `stage_append_log`: one session log row; the store assigns its sequence number.
    AppendLog {
        /// The task whose log it extends.
        task: TaskId,
        /// The row.
        row: SessionLogRow,
    },
    /// `stage_put_checkpoint`: replace the run's checkpoint (the coordinator's snapshot rides in
    /// `Checkpoint::state`).
    PutCheckpoint(Checkpoint),
    /// `stage_append_manifest`: processed, failed or retried.
    AppendManifest(ManifestEntry),
    /// `stage_append_dead_letter`: an item whose retry budget is spent.
    AppendDeadLetter(DeadLetter),
    /// `stage_record_idempotency`: recorded before the side effect it guards.
    RecordIdempotency(IdempotencyRecord),
    /// `stage_append_audit`: a policy decision.
    AppendAudit(AuditEntry),
    /// `stage_append_gate_mark`: what a policy gate reads back (a count, a prerequisite met, a
    /// token, an amount).
    AppendGateMark(GateMark),
    /// `stage_append_escalation`: a hand-off to a human.
    AppendEscalation(Escalation),
    /// `stage_resolve_escalation`: a human's answer (or an approval's expiry); the first stays.
    ResolveEscalation {
        /// The escalation.
        id: EscalationId,
        /// How it closes.
        resolution: EscalationResolution,
    },
}

impl PersistOp {
    /// The staged write of the same name under `scope`: the one mapping from a machine's described
    /// write to the store, shared by every host (the ractor runtime and the simulator) so they cannot
    /// drift apart. Staging checks limits and the run; it does no IO.
    ///
    /// # Errors
    /// [`StageError`] when the op's row belongs to another run or is over a limit.
    pub fn stage(&self, scope: &RunScope<'_>) -> Result<StagedWrite<'_>, StageError> {
        // By reference: the checkpoint writer keeps a commit's ops for a retry, so the commit
        // encodes them from here rather than from a copy.
        match self {
            PersistOp::CreateRun(run) => scope.stage_create_run(run),
            PersistOp::UpdateRun(run) => scope.stage_update_run(run),
            PersistOp::CreateTask(task) => scope.stage_create_task(task),
            PersistOp::UpdateTask(task) => scope.stage_update_task(task),
            PersistOp::AppendLog { task, row } => scope.stage_append_log(*task, row),
            PersistOp::PutCheckpoint(c) => scope.stage_put_checkpoint(c),
            PersistOp::AppendManifest(m) => scope.stage_append_manifest(m),
            PersistOp::AppendDeadLetter(d) => scope.stage_append_dead_letter(d),
            PersistOp::RecordIdempotency(r) => scope.stage_record_idempotency(r),
            PersistOp::AppendAudit(a) => scope.stage_append_audit(a),
            PersistOp::AppendGateMark(m) => scope.stage_append_gate_mark(m),
            PersistOp::AppendEscalation(e) => scope.stage_append_escalation(e),
            PersistOp::ResolveEscalation { id, resolution } => {
                scope.stage_resolve_escalation(*id, resolution)
            }
        }
    }

    /// A short name for traces and the simulator's fault counters.
    pub fn name(&self) -> &'static str {
        match self {
            PersistOp::CreateRun(_) => "create_run",
            PersistOp::UpdateRun(_) => "update_run",
            PersistOp::CreateTask(_) => "create_task",
            PersistOp::UpdateTask(_) => "update_task",
            PersistOp::AppendLog { .. } => "append_log",
            PersistOp::PutCheckpoint(_) => "put_checkpoint",
            PersistOp::AppendManifest(_) => "append_manifest",
            PersistOp::AppendDeadLetter(_) => "append_dead_letter",
            PersistOp::RecordIdempotency(_) => "record_idempotency",
            PersistOp::AppendAudit(_) => "append_audit",
            PersistOp::AppendGateMark(_) => "append_gate_mark",
            PersistOp::AppendEscalation(_) => "append_escalation",
            PersistOp::ResolveEscalation { .. } => "resolve_escalation",
        }
    }
}

/// Most ops in one stage; a coordinator decision that needs more is a bug, not a bigger transaction.
pub const STAGE_OPS_MAX: usize = 512;

/// Who staged a [`Stage`], and so who hears that it is durable: the checkpoint machine answers a
/// coordinator's stage with `CoordinatorMsg::Durable` / `PersistFailed` to that run's coordinator,
/// and the host's own stage (pause, cancel, resume marks) with [`crate::Envelope::Host`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StageOwner {
    /// The run's coordinator: the ticket is its sequence number, counted from 1.
    Coordinator,
    /// The host (the runtime or the simulator): the ticket is the host's own.
    Host,
}

/// The writes of one decision of one run, committed atomically (never split across transactions) and
/// acknowledged to its `owner` by `ticket` once durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    /// The run whose rows every op touches (docs/DESIGN.md §12, invariant 9: the host stages them through
    /// this run's scope only).
    pub run: RunId,
    /// Who staged it and hears the answer.
    pub owner: StageOwner,
    /// The owner's sequence number for this stage; acks carry it back.
    pub ticket: u64,
    /// The writes, in order. Shared, not copied: the coordinator keeps the same ops for a re-send
    /// after a failed commit, and the checkpoint writer and its host only read them (a host that
    /// must change one, such as the simulator's mutations, copies it on write with `Arc::make_mut`).
    pub ops: std::sync::Arc<Vec<PersistOp>>,
}

/// Identifies one group commit of the checkpoint machine; its completion input carries it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitId(pub u64);

/// One group commit: every stage in it goes into one write transaction, in order, with
/// `Durability::Immediate`. The host answers with `CheckpointInput::Committed` or `CommitFailed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitBatch {
    /// Identifies the commit.
    pub id: CommitId,
    /// The stages, in the order they were received; shared with the writer, which keeps them for a
    /// retry and for the answers, so handing a batch to the host copies no ops.
    pub stages: std::sync::Arc<[Stage]>,
}

impl CommitBatch {
    /// Every op of the batch in commit order (what the host stages into one `WriteBatch`), except a
    /// replacement that a later replacement of the same row in this batch overwrites: a run's
    /// checkpoint, a run row update, a task row update. Both would land in one transaction under one
    /// key, so only the last is ever visible, and writing the others is work without effect (a
    /// dispatch of N steps stages N checkpoints of its run; N results update the run row N times).
    pub fn ops(&self) -> impl Iterator<Item = (RunId, &PersistOp)> {
        let mut last: std::collections::BTreeMap<(u8, RunId, RunId, u128), usize> =
            std::collections::BTreeMap::new();
        for (i, (run, op)) in self.all_ops().enumerate() {
            if let Some(key) = replaced_row(run, op) {
                last.insert(key, i);
            }
        }
        self.all_ops()
            .enumerate()
            .filter(move |(i, (run, op))| {
                replaced_row(*run, op).is_none_or(|key| last.get(&key) == Some(i))
            })
            .map(|(_, item)| item)
    }

    /// Every op of the batch in commit order, superseded replacements included.
    pub fn all_ops(&self) -> impl Iterator<Item = (RunId, &PersistOp)> {
        self.stages
            .iter()
            .flat_map(|s| s.ops.iter().map(move |op| (s.run, op)))
    }
}

/// The row an op replaces wholesale, if it is such an op: (kind, the stage's run, the row's own run,
/// the row's key). The row's own ids are part of it, so an op whose row belongs to another run (which
/// staging refuses) is never taken for a replacement of this run's row.
fn replaced_row(run: RunId, op: &PersistOp) -> Option<(u8, RunId, RunId, u128)> {
    match op {
        PersistOp::PutCheckpoint(c) => Some((0, run, c.run_id, 0)),
        PersistOp::UpdateRun(r) => Some((1, run, r.id, 0)),
        PersistOp::UpdateTask(t) => Some((2, run, t.run_id, t.id.0)),
        _ => None,
    }
}
