//! A run's gate ledger, indexed (docs/DESIGN.md §9, gates): the store's table `gate_marks` holds one
//! [`GateMark`] per event, and the gates decide from the tallies of those marks per gate, for the
//! whole run and for each task. [`GateLedger`] keeps those tallies, so a check costs a few map
//! look-ups whatever the ledger's length, instead of a scan of every mark by every gate.
//!
//! The index is derived state: [`GateLedger::from_marks`] rebuilds it from the table (after a crash,
//! or whenever the holder is unsure), and [`GateLedger::record`] adds marks once they are durable, so
//! it never holds a mark the store does not. The tallies are exactly what a scan of the same marks
//! would count (tested against that scan in `gate_tests.rs`).

use std::collections::BTreeMap;

use keel_store::{GateEvent, GateMark, TaskId};

use crate::gate::GateScope;

/// What one gate's marks add up to, over a task or the whole run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// `Counted` marks: calls a counting gate let through.
    pub counted: u32,
    /// `Met` marks: successes a prerequisite gate waits for.
    pub met: u32,
    /// `Issued` marks: tokens issued.
    pub issued: u32,
    /// `Spent` marks: tokens spent.
    pub spent: u32,
    /// The sum of `Added` marks, in millionths (saturating).
    pub added_micros: u64,
}

impl Tally {
    fn record(&mut self, event: GateEvent) {
        match event {
            GateEvent::Counted => self.counted = self.counted.saturating_add(1),
            GateEvent::Met => self.met = self.met.saturating_add(1),
            GateEvent::Issued => self.issued = self.issued.saturating_add(1),
            GateEvent::Spent => self.spent = self.spent.saturating_add(1),
            GateEvent::Added { micros } => {
                self.added_micros = self.added_micros.saturating_add(micros);
            }
        }
    }
}

/// One gate's tallies: over the run, and per task (`None`: calls made outside any task).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct GateTallies {
    run: Tally,
    tasks: BTreeMap<Option<TaskId>, Tally>,
}

/// A run's gate ledger as the gates read it: per gate name, the tallies of its marks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateLedger {
    gates: BTreeMap<String, GateTallies>,
    marks: u64,
}

impl GateLedger {
    /// The index of `marks` (a run's whole `gate_marks` table, in any order).
    pub fn from_marks(marks: &[GateMark]) -> GateLedger {
        let mut ledger = GateLedger::default();
        ledger.record(marks);
        ledger
    }

    /// Adds `marks` (made durable since the index was built) to the tallies.
    pub fn record(&mut self, marks: &[GateMark]) {
        for mark in marks {
            let tallies = match self.gates.get_mut(mark.gate.as_str()) {
                Some(t) => t,
                None => self.gates.entry(mark.gate.clone()).or_default(),
            };
            tallies.run.record(mark.event);
            tallies
                .tasks
                .entry(mark.task_id)
                .or_default()
                .record(mark.event);
            self.marks = self.marks.saturating_add(1);
        }
    }

    /// What gate `gate`'s marks add up to for a call by `task`: over the run, or over that task's
    /// marks only.
    pub fn tally(&self, gate: &str, per: GateScope, task: Option<TaskId>) -> Tally {
        let Some(tallies) = self.gates.get(gate) else {
            return Tally::default();
        };
        match per {
            GateScope::Run => tallies.run,
            GateScope::Task => tallies.tasks.get(&task).copied().unwrap_or_default(),
        }
    }

    /// How many marks the index holds (what the store's table should hold).
    pub fn len(&self) -> u64 {
        self.marks
    }

    /// Whether it holds no mark.
    pub fn is_empty(&self) -> bool {
        self.marks == 0
    }
}
