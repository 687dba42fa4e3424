//! Table definitions. Every per-run table's key starts with the run id, so a run's rows are one
//! contiguous key range and a [`crate::RunScope`] only ever builds keys inside its own range.

use redb::{Key, TableDefinition, TypeName, Value};
use std::cmp::Ordering;

/// A key (or value) of fixed-width fields stored exactly as redb stores the tuple of the same
/// fields: the same bytes (each field little-endian, one after the other), the same order and the
/// same type name, so the tables are the tables a tuple definition opens and no store file
/// changes. The difference is the encoding's type: an array on the stack, where redb's tuples
/// build a `Vec` for every lookup, range bound and insert (the most frequent allocation of a
/// commit before, about 80 per specialist of `keel bench`).
macro_rules! flat_tuple {
    ($(#[$doc:meta])* $name:ident, ($($t:ty => $i:tt),+), $width:expr) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub(crate) struct $name;

        impl Value for $name {
            type SelfType<'a>
                = ($($t,)+)
            where
                Self: 'a;
            type AsBytes<'a>
                = [u8; $width]
            where
                Self: 'a;

            fn fixed_width() -> Option<usize> {
                Some($width)
            }

            fn from_bytes<'a>(data: &'a [u8]) -> Self::SelfType<'a>
            where
                Self: 'a,
            {
                <($($t,)+) as Value>::from_bytes(data)
            }

            fn as_bytes<'a, 'b: 'a>(value: &'a Self::SelfType<'b>) -> [u8; $width]
            where
                Self: 'a,
                Self: 'b,
            {
                let mut out = [0u8; $width];
                let mut at = 0;
                $(
                    let bytes = value.$i.to_le_bytes();
                    out[at..at + bytes.len()].copy_from_slice(&bytes);
                    at += bytes.len();
                )+
                debug_assert_eq!(at, $width);
                out
            }

            fn type_name() -> TypeName {
                <($($t,)+) as Value>::type_name()
            }
        }

        impl Key for $name {
            fn compare(data1: &[u8], data2: &[u8]) -> Ordering {
                <($($t,)+) as Key>::compare(data1, data2)
            }
        }
    };
}

flat_tuple!(
    /// `(run, task)` or `(run, blob key)`.
    RunPair, (u128 => 0, u128 => 1), 32
);
flat_tuple!(
    /// `(run, parent, child)`.
    RunTriple, (u128 => 0, u128 => 1, u128 => 2), 48
);
flat_tuple!(
    /// `(run, seq)`.
    RunSeq, (u128 => 0, u64 => 1), 24
);
flat_tuple!(
    /// `(run, task, seq)`.
    RunTaskSeq, (u128 => 0, u128 => 1, u64 => 2), 40
);

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
pub(crate) const TASKS: TableDefinition<'_, RunPair, Row> = TableDefinition::new("tasks");
/// (run, task) -> the task's state (store format 3): the fields that change after its creation,
/// written by an update that leaves the once-written fields as they are, instead of the whole row
/// again. A reader puts it over the `tasks` row; a task never updated has none.
pub(crate) const TASK_STATES: TableDefinition<'_, RunPair, Row> =
    TableDefinition::new("task_states");
/// task -> run: keeps task ids unique store-wide and lets the operator view locate a task.
pub(crate) const TASK_RUN: TableDefinition<'_, u128, u128> = TableDefinition::new("task_run");
/// (run, parent, child) -> (): the parent/child index.
pub(crate) const TASK_CHILDREN: TableDefinition<'_, RunTriple, ()> =
    TableDefinition::new("task_children");
/// (run, task, seq) -> SessionLogRow.
pub(crate) const SESSION_LOGS: TableDefinition<'_, RunTaskSeq, Row> =
    TableDefinition::new("session_logs");
/// run -> Checkpoint (the latest).
pub(crate) const CHECKPOINTS: TableDefinition<'_, u128, Row> = TableDefinition::new("checkpoints");
/// (run, seq) -> ManifestEntry; append-only.
pub(crate) const MANIFEST: TableDefinition<'_, RunSeq, Row> = TableDefinition::new("manifest");
/// (run, seq) -> DeadLetter.
pub(crate) const DEAD_LETTERS: TableDefinition<'_, RunSeq, Row> =
    TableDefinition::new("dead_letters");
/// (run, key) -> IdempotencyRecord.
pub(crate) const IDEMPOTENCY: TableDefinition<'_, (u128, &str), Row> =
    TableDefinition::new("idempotency");
/// (run, seq) -> AuditEntry.
pub(crate) const AUDIT: TableDefinition<'_, RunSeq, Row> = TableDefinition::new("audit");
/// (run, seq) -> GateMark: what the policy's gates read back (a counted call, a prerequisite met, a
/// token issued or spent, an amount added to a cap).
pub(crate) const GATE_MARKS: TableDefinition<'_, RunSeq, Row> = TableDefinition::new("gate_marks");
/// (run, seq) -> Escalation.
pub(crate) const ESCALATIONS: TableDefinition<'_, RunSeq, Row> =
    TableDefinition::new("escalations");
/// escalation id -> (run, seq): keeps escalation ids unique store-wide and lets `keel answer` find
/// one by its id alone.
pub(crate) const ESCALATION_IDS: TableDefinition<'_, u128, RunSeq> =
    TableDefinition::new("escalation_ids");
/// (run, blob key) -> raw bytes of an attachment or output stored by reference.
pub(crate) const BLOBS: TableDefinition<'_, RunPair, &[u8]> = TableDefinition::new("blobs");
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
    pub(crate) const TASK_STATES: &str = "task_states";
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;
    use redb::{Database, ReadableDatabase, ReadableTable};

    const AS_TUPLE: TableDefinition<'_, (u128, u128, u64), u64> = TableDefinition::new("t");
    const AS_FLAT: TableDefinition<'_, RunTaskSeq, u64> = TableDefinition::new("t");
    const SEQ_AS_TUPLE: TableDefinition<'_, (u128, u64), u64> = TableDefinition::new("s");
    const SEQ_AS_FLAT: TableDefinition<'_, RunSeq, u64> = TableDefinition::new("s");

    /// Keys chosen so that byte order and numeric order disagree (little-endian), across runs.
    fn keys() -> Vec<(u128, u128, u64)> {
        let mut keys = Vec::new();
        for run in [1u128, 256, u128::MAX - 1] {
            for task in [0u128, 255, 256, 1 << 70] {
                for seq in [1u64, 2, 255, 256, 65_536, u64::MAX] {
                    keys.push((run, task, seq));
                }
            }
        }
        keys
    }

    /// A table written through redb's tuples is the same table read through the flat keys (same
    /// type name, bytes and order), and the other way round: no store file changes.
    #[test]
    fn flat_keys_open_and_order_the_tables_tuple_keys_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("t.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(AS_TUPLE).unwrap();
            let mut s = txn.open_table(SEQ_AS_TUPLE).unwrap();
            for (i, k) in keys().into_iter().enumerate() {
                t.insert(k, i as u64).unwrap();
                s.insert((k.0, k.2), i as u64).unwrap();
            }
        }
        txn.commit().unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut t = txn.open_table(AS_FLAT).unwrap();
            let extra = (2u128, 3u128, 4u64);
            t.insert(extra, 999).unwrap();
            let mut s = txn.open_table(SEQ_AS_FLAT).unwrap();
            s.insert((2u128, 4u64), 999).unwrap();
        }
        txn.commit().unwrap();
        let mut expected = keys();
        expected.push((2, 3, 4));
        expected.sort_unstable();
        let read = db.begin_read().unwrap();
        let flat: Vec<(u128, u128, u64)> = read
            .open_table(AS_FLAT)
            .unwrap()
            .iter()
            .unwrap()
            .map(|e| e.unwrap().0.value())
            .collect();
        let tuple: Vec<(u128, u128, u64)> = read
            .open_table(AS_TUPLE)
            .unwrap()
            .iter()
            .unwrap()
            .map(|e| e.unwrap().0.value())
            .collect();
        assert_eq!(flat, expected);
        assert_eq!(tuple, expected);
        let (run, task) = (256u128, 255u128);
        let ranged: Vec<u64> = read
            .open_table(AS_FLAT)
            .unwrap()
            .range((run, task, 0u64)..=(run, task, u64::MAX))
            .unwrap()
            .map(|e| e.unwrap().0.value().2)
            .collect();
        assert_eq!(ranged, vec![1, 2, 255, 256, 65_536, u64::MAX]);
        let seqs = read.open_table(SEQ_AS_TUPLE).unwrap();
        assert_eq!(seqs.get((2u128, 4u64)).unwrap().unwrap().value(), 999);
        let seqs = read.open_table(SEQ_AS_FLAT).unwrap();
        assert_eq!(
            seqs.get((u128::MAX - 1, u64::MAX))
                .unwrap()
                .map(|g| g.value()),
            keys()
                .iter()
                .position(|k| *k == (u128::MAX - 1, 1 << 70, u64::MAX))
                .map(|i| i as u64)
        );
    }
}
