//! Table definitions. Every per-run table's key starts with the run id, so a run's rows are one
//! contiguous key range and a [`crate::RunScope`] only ever builds keys inside its own range.

use redb::TableDefinition;

/// Bytes of one encoded row (schema version byte + bincode).
pub(crate) type Row = &'static [u8];

/// Store-wide facts: the store format.
pub(crate) const META: TableDefinition<'_, &str, u64> = TableDefinition::new("meta");
/// run -> Run.
pub(crate) const RUNS: TableDefinition<'_, u128, Row> = TableDefinition::new("runs");
/// run -> (): every run whose status is not terminal (pending, running, paused), written in the same
/// transaction as the run's row, so recovery and `keel status` read the open runs without decoding
/// every run (store format 2; a format-1 store gets it built on its first writable open).
pub(crate) const OPEN_RUNS: TableDefinition<'_, u128, ()> = TableDefinition::new("open_runs");
/// run -> the plan's text (UTF-8), written once when the run is created: a plan of 1,024 steps is
/// hundreds of KiB, so it lives beside the run's row, not in it, and an update of the row (status,
/// spend) never rewrites it (store format 2; a format-1 store has its plans moved here on its first
/// writable open).
pub(crate) const RUN_PLANS: TableDefinition<'_, u128, &[u8]> = TableDefinition::new("run_plans");
/// (run, task) -> Task. The per-run index is the key order itself.
pub(crate) const TASKS: TableDefinition<'_, (u128, u128), Row> = TableDefinition::new("tasks");
/// task -> run: keeps task ids unique store-wide and lets the operator view locate a task.
pub(crate) const TASK_RUN: TableDefinition<'_, u128, u128> = TableDefinition::new("task_run");
/// (run, parent, child) -> (): the parent/child index.
pub(crate) const TASK_CHILDREN: TableDefinition<'_, (u128, u128, u128), ()> =
    TableDefinition::new("task_children");
/// (run, task, seq) -> SessionLogRow.
pub(crate) const SESSION_LOGS: TableDefinition<'_, (u128, u128, u64), Row> =
    TableDefinition::new("session_logs");
/// run -> Checkpoint (the latest).
pub(crate) const CHECKPOINTS: TableDefinition<'_, u128, Row> = TableDefinition::new("checkpoints");
/// (run, seq) -> ManifestEntry; append-only.
pub(crate) const MANIFEST: TableDefinition<'_, (u128, u64), Row> = TableDefinition::new("manifest");
/// (run, seq) -> DeadLetter.
pub(crate) const DEAD_LETTERS: TableDefinition<'_, (u128, u64), Row> =
    TableDefinition::new("dead_letters");
/// (run, key) -> IdempotencyRecord.
pub(crate) const IDEMPOTENCY: TableDefinition<'_, (u128, &str), Row> =
    TableDefinition::new("idempotency");
/// (run, seq) -> AuditEntry.
pub(crate) const AUDIT: TableDefinition<'_, (u128, u64), Row> = TableDefinition::new("audit");
/// (run, seq) -> GateMark: what the policy's gates read back (a counted call, a prerequisite met, a
/// token issued or spent, an amount added to a cap).
pub(crate) const GATE_MARKS: TableDefinition<'_, (u128, u64), Row> =
    TableDefinition::new("gate_marks");
/// (run, seq) -> Escalation.
pub(crate) const ESCALATIONS: TableDefinition<'_, (u128, u64), Row> =
    TableDefinition::new("escalations");
/// escalation id -> (run, seq): keeps escalation ids unique store-wide and lets `keel answer` find
/// one by its id alone.
pub(crate) const ESCALATION_IDS: TableDefinition<'_, u128, (u128, u64)> =
    TableDefinition::new("escalation_ids");
/// (run, blob key) -> raw bytes of an attachment or output stored by reference.
pub(crate) const BLOBS: TableDefinition<'_, (u128, u128), &[u8]> = TableDefinition::new("blobs");
/// agent name -> AgentProfile (store-wide: profiles are shared by all runs).
pub(crate) const AGENTS: TableDefinition<'_, &str, Row> = TableDefinition::new("agents");
/// (run, agent name) -> AgentProfile: the profiles a run was hosted with, as the node that hosted it
/// had them (an ad-hoc `keel run --harness X --model M` profile included), so a follow-up or a
/// resume in another process gives a task's assignee the same harness and model.
pub(crate) const RUN_AGENTS: TableDefinition<'_, (u128, &str), Row> =
    TableDefinition::new("run_agents");

/// Table names as they appear in errors.
pub(crate) mod name {
    pub(crate) const RUNS: &str = "runs";
    pub(crate) const RUN_PLANS: &str = "run_plans";
    pub(crate) const TASKS: &str = "tasks";
    pub(crate) const SESSION_LOGS: &str = "session_logs";
    pub(crate) const CHECKPOINTS: &str = "checkpoints";
    pub(crate) const MANIFEST: &str = "manifest";
    pub(crate) const DEAD_LETTERS: &str = "dead_letters";
    pub(crate) const IDEMPOTENCY: &str = "idempotency";
    pub(crate) const AUDIT: &str = "audit";
    pub(crate) const GATE_MARKS: &str = "gate_marks";
    pub(crate) const ESCALATIONS: &str = "escalations";
    pub(crate) const AGENTS: &str = "agents";
    pub(crate) const RUN_AGENTS: &str = "run_agents";
}
