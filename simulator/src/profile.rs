//! Swarm testing: each seed samples its own fault profile (which fault classes are on, and how often
//! they strike) before the run starts, as TigerBeetle's VOPR does. A sweep over many seeds then covers
//! quiet runs, runs with one kind of trouble, and storms, instead of one average mix that hides bugs
//! needing a rare combination.

use crate::rng::{PPM_ONE, PartsPerMillion, SimRng};

/// What a scripted harness session does, chosen per session from the profile's weights
/// (docs/DESIGN.md §11). The names follow the failures real harnesses show (the captured harness outputs under `harness-adapters/tests/fixtures`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum HarnessBehaviour {
    /// Text, then `end_turn`: a complete report.
    Success,
    /// One tool call answered by one tool result, then `end_turn`.
    ToolRoundTrip,
    /// HTTP 429 with a reset time: retryable after it.
    RateLimited,
    /// HTTP 500: retryable.
    ServerError,
    /// The process ends with SIGTERM (exit 143) because its context filled up.
    ContextSaturated,
    /// The harness says "session not found": its native session is gone.
    SessionNotFound,
    /// Output that does not parse as the harness's event stream.
    Malformed,
    /// The session never answers again; only a timeout ends it.
    Hang,
}

impl HarnessBehaviour {
    /// Every behaviour, in the order of [`HarnessWeights`].
    pub const ALL: [Self; 8] = [
        Self::Success,
        Self::ToolRoundTrip,
        Self::RateLimited,
        Self::ServerError,
        Self::ContextSaturated,
        Self::SessionNotFound,
        Self::Malformed,
        Self::Hang,
    ];

    /// Whether the session ends without a usable report.
    pub fn is_failure(self) -> bool {
        !matches!(self, Self::Success | Self::ToolRoundTrip)
    }
}

/// Integer weights over [`HarnessBehaviour::ALL`].
pub type HarnessWeights = [u32; 8];

/// The fault mix of one seed. Probabilities are per opportunity: per message for the network, per fault
/// tick for partitions, crashes and disk faults, per session for harness behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultProfile {
    /// Smallest one-way message latency.
    pub latency_ms_min: u64,
    /// Largest one-way message latency; a wide range reorders messages.
    pub latency_ms_max: u64,
    /// A message is lost.
    pub drop_ppm: PartsPerMillion,
    /// A message is delivered twice (the copy with its own latency).
    pub duplicate_ppm: PartsPerMillion,
    /// Chance that a frame crossing the network is accompanied by a copy from a node of another
    /// protocol version, which the receiver must refuse (and change nothing).
    pub version_skew_ppm: PartsPerMillion,
    /// Per tick: a partition between two nodes starts.
    pub partition_ppm: PartsPerMillion,
    /// Share of partitions that block one direction only.
    pub partition_one_way_ppm: PartsPerMillion,
    /// Longest partition.
    pub partition_ms_max: u64,
    /// Per tick: a node crashes (in-memory state lost, synced store kept).
    pub crash_ppm: PartsPerMillion,
    /// Longest time a crashed node stays down.
    pub restart_ms_max: u64,
    /// Per tick: the coordinator node's disk fails its next write or sync.
    pub disk_fault_ppm: PartsPerMillion,
    /// How scripted harness sessions behave.
    pub harness_weights: HarnessWeights,
    /// Every this many virtual milliseconds the world rolls for partitions, crashes and disk faults.
    pub fault_tick_ms: u64,
}

impl FaultProfile {
    /// No faults at all: every message arrives once, after a fixed latency, and every session succeeds.
    /// The baseline the named scenarios compare against.
    pub fn calm() -> Self {
        Self {
            latency_ms_min: 1,
            latency_ms_max: 1,
            drop_ppm: 0,
            duplicate_ppm: 0,
            version_skew_ppm: 0,
            partition_ppm: 0,
            partition_one_way_ppm: 0,
            partition_ms_max: 0,
            crash_ppm: 0,
            restart_ms_max: 0,
            disk_fault_ppm: 0,
            harness_weights: [1, 0, 0, 0, 0, 0, 0, 0],
            fault_tick_ms: 1_000,
        }
    }

    /// Samples a profile from the seed's stream. Each fault class is switched on with probability one
    /// half (the "swarm"), then its rate is drawn; rates stay low enough that a run still makes progress.
    pub fn sample(rng: &mut SimRng) -> Self {
        let on = |rng: &mut SimRng| rng.chance(PPM_ONE / 2);
        let latency_ms_min = rng.range(1, 20);
        let latency_ms_max = if on(rng) {
            latency_ms_min + rng.range(0, 500)
        } else {
            latency_ms_min
        };
        let drop_ppm = if on(rng) {
            rng.range(1_000, 100_000) as u32
        } else {
            0
        };
        let duplicate_ppm = if on(rng) {
            rng.range(1_000, 100_000) as u32
        } else {
            0
        };
        let (partition_ppm, partition_one_way_ppm, partition_ms_max) = if on(rng) {
            (
                rng.range(10_000, 200_000) as u32,
                rng.range(0, u64::from(PPM_ONE)) as u32,
                rng.range(100, 30_000),
            )
        } else {
            (0, 0, 0)
        };
        let (crash_ppm, restart_ms_max) = if on(rng) {
            (rng.range(5_000, 100_000) as u32, rng.range(10, 20_000))
        } else {
            (0, 0)
        };
        let disk_fault_ppm = if on(rng) {
            rng.range(5_000, 100_000) as u32
        } else {
            0
        };
        let mut harness_weights = [0u32; 8];
        // Success always has weight, so a run can finish even with every failure kind on.
        harness_weights[0] = rng.range(20, 100) as u32;
        for w in harness_weights.iter_mut().skip(1) {
            if on(rng) {
                *w = rng.range(1, 20) as u32;
            }
        }
        let fault_tick_ms = rng.range(200, 5_000);
        // Drawn last, so the classes above keep the draws they had before it existed.
        let version_skew_ppm = if on(rng) {
            rng.range(1_000, 50_000) as u32
        } else {
            0
        };
        Self {
            latency_ms_min,
            latency_ms_max,
            drop_ppm,
            duplicate_ppm,
            version_skew_ppm,
            partition_ppm,
            partition_one_way_ppm,
            partition_ms_max,
            crash_ppm,
            restart_ms_max,
            disk_fault_ppm,
            harness_weights,
            fault_tick_ms,
        }
    }

    /// The profile of the liveness phase: everything healed, nothing new goes wrong, so every run must
    /// reach a terminal state (docs/DESIGN.md §12, invariant 1).
    pub fn healed(&self) -> Self {
        Self {
            latency_ms_min: self.latency_ms_min,
            latency_ms_max: self.latency_ms_min,
            ..Self::calm()
        }
    }
}

/// The kinds of fault the world injects, counted for the soak report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// A message was lost.
    MessageDropped,
    /// A message was delivered twice.
    MessageDuplicated,
    /// A two-way partition started.
    Partition,
    /// A one-way partition started.
    PartitionOneWay,
    /// A node crashed.
    NodeCrash,
    /// A disk sync failed.
    DiskFault,
    /// The disk was full when a commit wrote (`StorageFull` on its first write).
    DiskFull,
    /// A harness session ended with a 429.
    HarnessRateLimited,
    /// A harness session ended with a 500.
    HarnessServerError,
    /// A harness session was killed by SIGTERM 143 on a full context.
    HarnessContextSaturated,
    /// A harness session said "session not found".
    HarnessSessionNotFound,
    /// A harness session printed output that does not parse.
    HarnessMalformed,
    /// A harness session hung.
    HarnessHang,
    /// A frame from a node of another protocol version arrived (and was refused).
    VersionSkew,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [Self; 14] = [
        Self::MessageDropped,
        Self::MessageDuplicated,
        Self::Partition,
        Self::PartitionOneWay,
        Self::NodeCrash,
        Self::DiskFault,
        Self::DiskFull,
        Self::HarnessRateLimited,
        Self::HarnessServerError,
        Self::HarnessContextSaturated,
        Self::HarnessSessionNotFound,
        Self::HarnessMalformed,
        Self::HarnessHang,
        Self::VersionSkew,
    ];

    /// A short stable name for reports and traces.
    pub fn name(self) -> &'static str {
        match self {
            Self::MessageDropped => "message_dropped",
            Self::MessageDuplicated => "message_duplicated",
            Self::Partition => "partition",
            Self::PartitionOneWay => "partition_one_way",
            Self::NodeCrash => "node_crash",
            Self::DiskFault => "disk_fault",
            Self::DiskFull => "disk_full",
            Self::HarnessRateLimited => "harness_429",
            Self::HarnessServerError => "harness_500",
            Self::HarnessContextSaturated => "harness_sigterm_143",
            Self::HarnessSessionNotFound => "harness_session_not_found",
            Self::HarnessMalformed => "harness_malformed",
            Self::HarnessHang => "harness_hang",
            Self::VersionSkew => "version_skew",
        }
    }

    /// The fault kind a failing harness behaviour counts as.
    pub fn of_harness(b: HarnessBehaviour) -> Option<Self> {
        match b {
            HarnessBehaviour::Success | HarnessBehaviour::ToolRoundTrip => None,
            HarnessBehaviour::RateLimited => Some(Self::HarnessRateLimited),
            HarnessBehaviour::ServerError => Some(Self::HarnessServerError),
            HarnessBehaviour::ContextSaturated => Some(Self::HarnessContextSaturated),
            HarnessBehaviour::SessionNotFound => Some(Self::HarnessSessionNotFound),
            HarnessBehaviour::Malformed => Some(Self::HarnessMalformed),
            HarnessBehaviour::Hang => Some(Self::HarnessHang),
        }
    }
}

/// Faults injected, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts([u64; 14]);

impl FaultCounts {
    /// Counts one fault of `kind`.
    pub fn add(&mut self, kind: FaultKind) {
        self.0[kind as usize] += 1;
    }

    /// Faults of `kind` so far.
    pub fn get(&self, kind: FaultKind) -> u64 {
        self.0[kind as usize]
    }

    /// Adds another run's counts (for the soak totals).
    pub fn merge(&mut self, other: &Self) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }

    /// Faults of every kind.
    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_differ_across_seeds_and_repeat_within_one() {
        let a = FaultProfile::sample(&mut SimRng::new(1));
        let b = FaultProfile::sample(&mut SimRng::new(1));
        assert_eq!(a, b);
        let distinct = (0..64u64)
            .map(|s| FaultProfile::sample(&mut SimRng::new(s)))
            .filter(|p| *p != a)
            .count();
        assert!(distinct > 60);
    }

    #[test]
    fn the_swarm_turns_each_class_off_in_some_seeds_and_on_in_others() {
        let profiles: Vec<_> = (0..200u64)
            .map(|s| FaultProfile::sample(&mut SimRng::new(s)))
            .collect();
        let classes: [fn(&FaultProfile) -> u32; 4] = [
            |p| p.drop_ppm,
            |p| p.crash_ppm,
            |p| p.partition_ppm,
            |p| p.disk_fault_ppm,
        ];
        for class in classes {
            assert!(profiles.iter().any(|p| class(p) == 0));
            assert!(profiles.iter().any(|p| class(p) > 0));
        }
        assert!(profiles.iter().all(|p| p.harness_weights[0] > 0));
    }

    #[test]
    fn healed_has_no_faults() {
        let p = FaultProfile::sample(&mut SimRng::new(9)).healed();
        assert_eq!(
            (p.drop_ppm, p.crash_ppm, p.partition_ppm, p.disk_fault_ppm),
            (0, 0, 0, 0)
        );
        assert_eq!(&p.harness_weights[1..], &[0; 7]);
    }
}
