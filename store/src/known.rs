//! What the writer knows of the stored rows from its own commits, so a later commit need not read
//! it again: which runs and tasks exist, which tasks are roots, where a task's session log ends,
//! where a run's append-only tables (manifest, audit, ...) end.
//!
//! Sound because this store is the file's only writer (redb locks the file against other writers,
//! and a read-only handle never writes; a custom backend such as `SimDisk` has no lock, so it takes
//! one `Store` per disk at a time), rows of these kinds are never deleted, and every entry is
//! a fact of the last successful commit: the writer updates the cache while it applies a commit
//! and the store clears all of it when that commit does not end in a successful `commit()` (an
//! item refused, the disk failing, a panic caught by the guard), and whenever maintenance takes
//! the database (an integrity check's repair can drop the last commit). A missing entry only
//! means a read: nothing depends on the cache being complete, so it is bounded by clearing it.

use std::collections::{BTreeMap, BTreeSet};

use crate::tables::name;

/// Most tasks the cache holds before it starts over empty at the next commit: a long-lived node
/// touches tasks of many runs, and a finished run's tasks leave with it, so this is a backstop
/// (about 48 bytes a task in `tasks`, about 40 more in `roots`).
pub(crate) const KNOWN_TASKS_MAX: usize = 16_384;

/// Most runs the cache holds before it starts over, as [`KNOWN_TASKS_MAX`] (and up to
/// [`SEQ_TABLES`] sequence ends each).
pub(crate) const KNOWN_RUNS_MAX: usize = 4_096;

/// How many append-only tables a run's sequence ends are kept for ([`SeqTable`]'s variants).
pub(crate) const SEQ_TABLES: usize = 5;

/// A run's append-only table numbered per run, whose end the cache keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SeqTable {
    Manifest,
    DeadLetters,
    Audit,
    GateMarks,
    Escalations,
}

impl SeqTable {
    /// The table's name, for errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Manifest => name::MANIFEST,
            Self::DeadLetters => name::DEAD_LETTERS,
            Self::Audit => name::AUDIT,
            Self::GateMarks => name::GATE_MARKS,
            Self::Escalations => name::ESCALATIONS,
        }
    }
}

/// The cache itself, owned by the store and lent to one write transaction at a time.
#[derive(Debug, Default)]
pub(crate) struct Known {
    /// Runs whose row exists.
    pub(crate) runs: BTreeSet<u128>,
    /// Tasks that exist, keyed (run, task), with the sequence number of their newest log row once
    /// it is known (0: the task has no log rows).
    pub(crate) tasks: BTreeMap<(u128, u128), Option<u64>>,
    /// The newest sequence number of a run's append-only table (absent: not known).
    pub(crate) seqs: BTreeMap<(u128, SeqTable), u64>,
    /// Whether a task, keyed (run, task), is a root (has no parent): a child of a root is not
    /// indexed under it (store format 6, `Writer::apply`).
    pub(crate) roots: BTreeMap<(u128, u128), bool>,
}

impl Known {
    /// Forgets everything: after a commit that did not succeed, or when maintenance takes the file.
    pub(crate) fn clear(&mut self) {
        self.runs.clear();
        self.tasks.clear();
        self.seqs.clear();
        self.roots.clear();
    }

    /// Starts over empty when the cache has grown past its bounds (called as a commit begins).
    pub(crate) fn bound(&mut self) {
        if self.tasks.len() > KNOWN_TASKS_MAX
            || self.roots.len() > KNOWN_TASKS_MAX
            || self.runs.len() > KNOWN_RUNS_MAX
            || self.seqs.len() > KNOWN_RUNS_MAX * SEQ_TABLES
        {
            self.clear();
        }
    }

    /// Forgets a run and its tasks: its row was written terminal, so few rows of it follow (a
    /// follow-up reads what it needs again).
    pub(crate) fn forget_run(&mut self, run: u128) {
        self.runs.remove(&run);
        let tasks: Vec<_> = self
            .tasks
            .range((run, 0)..=(run, u128::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in tasks {
            self.tasks.remove(&key);
        }
        let roots: Vec<_> = self
            .roots
            .range((run, 0)..=(run, u128::MAX))
            .map(|(k, _)| *k)
            .collect();
        for key in roots {
            self.roots.remove(&key);
        }
        let seqs: Vec<_> = self
            .seqs
            .range((run, SeqTable::Manifest)..=(run, SeqTable::Escalations))
            .map(|(k, _)| *k)
            .collect();
        for key in seqs {
            self.seqs.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgetting_a_run_keeps_the_others() {
        let mut known = Known::default();
        for run in [1u128, 2, 3] {
            known.runs.insert(run);
            known.tasks.insert((run, 10), Some(4));
            known.tasks.insert((run, u128::MAX), None);
            known.roots.insert((run, 10), true);
            known.seqs.insert((run, SeqTable::Manifest), 2);
            known.seqs.insert((run, SeqTable::Escalations), 1);
        }
        known.forget_run(2);
        assert_eq!(known.runs.iter().copied().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(known.tasks.len(), 4);
        assert!(known.tasks.keys().all(|(run, _)| *run != 2));
        assert_eq!(known.roots.len(), 2);
        assert!(known.roots.keys().all(|(run, _)| *run != 2));
        assert_eq!(known.seqs.len(), 4);
        assert!(known.seqs.keys().all(|(run, _)| *run != 2));
    }

    #[test]
    fn a_cache_past_its_bound_starts_over() {
        let mut known = Known::default();
        for task in 0..=KNOWN_TASKS_MAX as u128 {
            known.tasks.insert((1, task), None);
        }
        known.runs.insert(1);
        known.bound();
        assert!(known.tasks.is_empty() && known.runs.is_empty());
        known.tasks.insert((1, 1), Some(0));
        known.bound();
        assert_eq!(known.tasks.len(), 1);
        // Five sequence ends a run do not count as five runs.
        for run in 0..KNOWN_RUNS_MAX as u128 {
            for table in [
                SeqTable::Manifest,
                SeqTable::DeadLetters,
                SeqTable::Audit,
                SeqTable::GateMarks,
                SeqTable::Escalations,
            ] {
                known.seqs.insert((run, table), 1);
            }
        }
        known.bound();
        assert_eq!(known.seqs.len(), KNOWN_RUNS_MAX * SEQ_TABLES);
        known.seqs.insert((u128::MAX, SeqTable::Manifest), 1);
        known.bound();
        assert!(known.seqs.is_empty());
    }
}
