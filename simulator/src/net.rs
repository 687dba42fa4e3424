//! The simulated network between nodes: latency, loss, duplication and partitions (one-way too), all
//! decided by the seed's stream. It only decides *when* (and whether) a message arrives; the world
//! schedules the deliveries.

use std::collections::BTreeMap;

use crate::profile::{FaultKind, FaultProfile};
use crate::queue::SimMillis;
use crate::rng::SimRng;

/// A simulated machine. Node 0 is the coordinator node (store, coordinator, supervisor, checkpoint);
/// the others are stateless worker nodes that run specialists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u8);

impl NodeId {
    /// The coordinator node.
    pub const COORDINATOR: Self = Self(0);
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == Self::COORDINATOR {
            write!(f, "coord")
        } else {
            write!(f, "w{}", self.0)
        }
    }
}

/// What the network does with one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Lost (dropped, or blocked by a partition).
    Lost(FaultKind),
    /// Arrives once at this time.
    Once(SimMillis),
    /// Arrives twice: the duplicate has its own latency and may overtake the original.
    Twice(SimMillis, SimMillis),
}

/// Directed links that are currently cut, with the time each heals.
#[derive(Debug, Default, Clone)]
pub struct Network {
    cut_until: BTreeMap<(NodeId, NodeId), SimMillis>,
}

impl Network {
    /// Whether `from -> to` is cut at `now`.
    pub fn is_cut(&self, from: NodeId, to: NodeId, now: SimMillis) -> bool {
        self.cut_until
            .get(&(from, to))
            .is_some_and(|until| *until > now)
    }

    /// Cuts `from -> to` (and `to -> from` unless `one_way`) until `until`.
    pub fn cut(&mut self, from: NodeId, to: NodeId, one_way: bool, until: SimMillis) {
        self.cut_until.insert((from, to), until);
        if !one_way {
            self.cut_until.insert((to, from), until);
        }
    }

    /// Heals every link (the liveness phase).
    pub fn heal_all(&mut self) {
        self.cut_until.clear();
    }

    /// Decides the fate of one message sent at `now`. A message between two actors on the same node
    /// never crosses the network: it arrives after 0 ms, once, in order.
    pub fn route(
        &mut self,
        rng: &mut SimRng,
        profile: &FaultProfile,
        from: NodeId,
        to: NodeId,
        now: SimMillis,
    ) -> Route {
        if from == to {
            return Route::Once(now);
        }
        if self.is_cut(from, to, now) {
            return Route::Lost(FaultKind::Partition);
        }
        if rng.chance(profile.drop_ppm) {
            return Route::Lost(FaultKind::MessageDropped);
        }
        let first = now + rng.range(profile.latency_ms_min, profile.latency_ms_max);
        if rng.chance(profile.duplicate_ppm) {
            let second = now + rng.range(profile.latency_ms_min, profile.latency_ms_max);
            return Route::Twice(first, second);
        }
        Route::Once(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_way_cut_blocks_one_direction_until_it_heals() {
        let mut net = Network::default();
        let (a, b) = (NodeId(0), NodeId(1));
        net.cut(a, b, true, 100);
        assert!(net.is_cut(a, b, 50));
        assert!(!net.is_cut(b, a, 50));
        assert!(!net.is_cut(a, b, 100));
        let mut rng = SimRng::new(1);
        let calm = FaultProfile::calm();
        assert_eq!(
            net.route(&mut rng, &calm, a, b, 10),
            Route::Lost(FaultKind::Partition)
        );
        assert_eq!(net.route(&mut rng, &calm, b, a, 10), Route::Once(11));
    }

    #[test]
    fn local_messages_never_cross_the_network() {
        let mut net = Network::default();
        let mut rng = SimRng::new(1);
        let mut storm = FaultProfile::calm();
        storm.drop_ppm = crate::rng::PPM_ONE;
        assert_eq!(
            net.route(&mut rng, &storm, NodeId(2), NodeId(2), 7),
            Route::Once(7)
        );
        assert_eq!(
            net.route(&mut rng, &storm, NodeId(2), NodeId(1), 7),
            Route::Lost(FaultKind::MessageDropped)
        );
    }
}
