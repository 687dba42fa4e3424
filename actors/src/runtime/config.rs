//! What the runtime is configured with.

use crate::checkpoint::CheckpointConfig;
use crate::coordinator::CoordinatorConfig;
use crate::specialist::SpecialistConfig;
use crate::supervisor::SupervisorConfig;

/// Everything the runtime is configured with.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The supervisor's limits and agents.
    pub supervisor: SupervisorConfig,
    /// Each coordinator's limits.
    pub coordinator: CoordinatorConfig,
    /// The checkpoint writer's bounds.
    pub checkpoint: CheckpointConfig,
    /// Each specialist's limits and working directory.
    pub specialist: SpecialistConfig,
    /// Most runs a node hosts at once; [`Runtime::submit`] waits for a slot.
    pub runs_in_flight_max: u32,
    /// How long a stopped specialist gets to end by itself before its actor is killed.
    pub stop_grace_ms: u64,
    /// Capacity of the event channel (events past it are dropped and counted).
    pub events_capacity: usize,
    /// Seed of the node's ChaCha8 stream; `None` seeds it from the OS (the normal case).
    pub seed: Option<u64>,
    /// Where the runtime's measurements go (commit latency, spawn refusals); `None` for nowhere.
    pub observer: Option<std::sync::Arc<dyn super::RuntimeObserver>>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            supervisor: SupervisorConfig::default(),
            coordinator: CoordinatorConfig::default(),
            checkpoint: CheckpointConfig::default(),
            specialist: SpecialistConfig::default(),
            runs_in_flight_max: 64,
            stop_grace_ms: 10_000,
            events_capacity: 4_096,
            seed: None,
            observer: None,
        }
    }
}
