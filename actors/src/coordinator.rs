//! The coordinator: one per run, the hub (DESIGN.md §4, §8).

use crate::machine::Millis;

/// Limits of one coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Most attempts one plan step may get before it is parked in the dead-letter table.
    pub attempts_per_step_max: u32,
    /// Most stages in flight at the checkpoint at once.
    pub stages_inflight_max: u32,
    /// Most times a failed stage is sent again before the run gives up on the store.
    pub restages_max: u32,
    /// Wait between restages.
    pub restage_backoff_ms: Millis,
    /// Most lead delegation turns and calls per turn.
    pub delegation_turns_max: u32,
    /// Most calls in one delegation turn.
    pub delegation_calls_max: u32,
    /// Nesting depth of the run's root task (0 for a top-level run).
    pub root_depth: u8,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            attempts_per_step_max: 5,
            stages_inflight_max: 256,
            restages_max: 8,
            restage_backoff_ms: 500,
            delegation_turns_max: 16,
            delegation_calls_max: 16,
            root_depth: 0,
        }
    }
}

/// The coordinator of one run. Build it with [`Coordinator::new`], then feed it either
/// `CoordinatorMsg::Accept` (a new run) or `CoordinatorInput::Recovered` (after a restart).
#[derive(Debug)]
pub struct Coordinator {
    #[allow(dead_code)]
    config: CoordinatorConfig,
}

impl Coordinator {
    /// A coordinator waiting for its run.
    pub fn new(config: CoordinatorConfig) -> Self {
        Self { config }
    }
}
