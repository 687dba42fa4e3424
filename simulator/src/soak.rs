//! Many seeds in a row: the sweep `cargo test` runs and the soak `keel-sim --seeds N` runs, with totals
//! for the report (events, faults by kind, violations).

use crate::config::WorldConfig;
use crate::profile::FaultCounts;
use crate::violation::Violation;
use crate::world::{RunReport, run};

/// Totals over a range of seeds.
#[derive(Debug, Clone, Default)]
pub struct SoakSummary {
    /// Seeds run.
    pub seeds: u64,
    /// Events processed over all seeds.
    pub events: u64,
    /// Faults injected, by kind, over all seeds.
    pub faults: FaultCounts,
    /// Every violation found (one per failing seed).
    pub violations: Vec<Violation>,
    /// Seeds whose runs all ended `Completed`.
    pub runs_completed: u64,
    /// Runs that ended in another terminal state (failed, budget, cancelled).
    pub runs_other_terminal: u64,
}

impl SoakSummary {
    /// Adds one seed's report.
    pub fn add(&mut self, report: &RunReport) {
        self.seeds += 1;
        self.events += report.events;
        self.faults.merge(&report.faults);
        if let Some(v) = &report.violation {
            self.violations.push(v.clone());
        }
        for (status, _) in report.runs_final.values() {
            if *status == keel_store::RunStatus::Completed {
                self.runs_completed += 1;
            } else if status.is_terminal() {
                self.runs_other_terminal += 1;
            }
        }
    }
}

/// Runs seeds `from..from + count` with [`WorldConfig::for_seed`], calling `each` after every seed.
pub fn sweep(from: u64, count: u64, mut each: impl FnMut(&RunReport)) -> SoakSummary {
    let mut summary = SoakSummary::default();
    for seed in from..from.saturating_add(count) {
        let report = run(WorldConfig::for_seed(seed));
        each(&report);
        summary.add(&report);
    }
    summary
}
