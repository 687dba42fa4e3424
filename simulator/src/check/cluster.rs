//! The cluster's invariants (issue 12), as the simulated nodes speak keel-protocol's `Membership`:
//!
//! - **19, placement fits**: a spawn goes only to a worker that has the attempt's harness installed
//!   and room for it (what the worker really has, not what it advertised).
//! - **20, a lost worker's work is re-placed in time**: every attempt a crashed worker hosted is
//!   reported down to the supervisor (which restarts it elsewhere with a resume preamble) within
//!   the lease plus the network's longest delay after the crash; a supervisor still holding it live
//!   later is the violation.
//!
//! That a late report of a lost attempt is never accepted next to its replacement's is invariant 2
//! (`Checker::acked`: one accepted report per step).

use std::collections::BTreeMap;

use keel_actors::{AttemptId, Supervisor};
use keel_harness::HarnessKind;

use crate::net::NodeId;
use crate::queue::SimMillis;
use crate::violation::Invariant;

use super::Checker;

/// What the cluster checks remember.
#[derive(Debug, Default)]
pub(super) struct ClusterChecks {
    /// Attempts a crashed worker hosted, with the time by which the supervisor must have heard
    /// they are down, and the worker.
    lost: BTreeMap<AttemptId, (SimMillis, NodeId)>,
}

/// A spawn the coordinator node sends, with what its worker really is.
#[derive(Debug, Clone, Copy)]
pub struct PlacementSeen<'a> {
    /// The worker.
    pub node: NodeId,
    /// The harness the attempt needs.
    pub harness: HarnessKind,
    /// The harnesses installed on the worker.
    pub installed: &'a [HarnessKind],
    /// Attempts the coordinator node has placed on it, this one included.
    pub load: usize,
    /// Most specialists the worker hosts.
    pub capacity: u32,
}

impl Checker {
    /// Invariant 19: the coordinator node sends `attempt` to a worker.
    pub fn placed(&mut self, event: u64, attempt: AttemptId, seen: PlacementSeen<'_>) {
        if !seen.installed.contains(&seen.harness) {
            self.fail(
                event,
                Invariant::PlacementFits,
                format!(
                    "{attempt} was placed on worker {} for the {} harness, which it does not have \
                     (it has {:?})",
                    seen.node, seen.harness, seen.installed
                ),
            );
        } else if seen.load > seen.capacity as usize {
            self.fail(
                event,
                Invariant::PlacementFits,
                format!(
                    "{attempt} was placed on worker {} past its capacity: {} placed, capacity {}",
                    seen.node, seen.load, seen.capacity
                ),
            );
        }
    }

    /// Invariant 20: worker `node` crashed while hosting `attempts`: each must be down at the
    /// supervisor by `deadline`.
    pub fn worker_crashed(
        &mut self,
        node: NodeId,
        attempts: impl IntoIterator<Item = AttemptId>,
        deadline: SimMillis,
    ) {
        for attempt in attempts {
            self.cluster.lost.insert(attempt, (deadline, node));
        }
    }

    /// Invariant 20, after every event while the coordinator node is up.
    pub(super) fn lost_attempts_down(
        &mut self,
        event: u64,
        now: SimMillis,
        supervisor: &Supervisor,
    ) {
        if self.cluster.lost.is_empty() {
            return;
        }
        let due: Vec<(AttemptId, NodeId, SimMillis)> = self
            .cluster
            .lost
            .iter()
            .filter(|(_, (deadline, _))| *deadline < now)
            .map(|(a, (d, n))| (*a, *n, *d))
            .collect();
        for (attempt, node, deadline) in due {
            self.cluster.lost.remove(&attempt);
            if supervisor.live_attempts().any(|a| a == attempt) {
                self.fail(
                    event,
                    Invariant::LostWorkReplaced,
                    format!(
                        "{attempt} was hosted on worker {node} when it crashed and is still live at \
                         the supervisor at {now} ms, past the lease bound of {deadline} ms"
                    ),
                );
            }
        }
    }
}
