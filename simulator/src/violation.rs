//! What a broken invariant looks like when the world catches it: the seed, the event number, the
//! invariant, a one-line reproduction command and (on replay) the trace up to that event.

use std::fmt;

/// docs/DESIGN.md §12's invariants, by their number there, as far as the simulator can observe them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// 1. No task is lost: after the liveness phase every run is terminal.
    NoTaskLost,
    /// 2. A side effect with an idempotency key happens at most once across crashes and replays.
    IdempotentOnce,
    /// 3. Every tool_use gets exactly one tool_result, results before text.
    ToolPairing,
    /// 4. Preambles under their caps, brief intact, slash line first, no secret.
    PreambleBounds,
    /// 5. No native resume flag is passed to a harness.
    NoNativeResume,
    /// 6. A derived task's model comes from its assignee.
    ModelFromAssignee,
    /// 7. Specialists never address each other.
    NoSiblingAddress,
    /// 8. Concurrency, depth, budget and spawn-rate limits hold.
    LimitsHold,
    /// 9. One run never touches another run's state.
    RunIsolation,
    /// 10. A failure is never reported as an empty success.
    NoEmptySuccess,
    /// 11. Same seed, same trace.
    SameSeedSameTrace,
    /// 12. Every hook decision is audited before its tool runs; a mandatory hook's error or
    ///     timeout never lets a tool run.
    HookAudited,
    /// 13. A paused run resumes to the outcome it has without the pause (proposed, issue 10).
    PauseResumesSame,
    /// 14. A cancelled run starts no new session: its coordinator spawns nothing after the cancel.
    CancelStartsNothing,
    /// 15. A run reopened for a follow-up ends again, with exactly one new synthesis.
    ReopenEndsOnce,
    /// 16. A cancel never replaces a finished run's outcome: no write marks a run cancelled once
    ///     it ended completed or failed (a stale cancel, a cancel of a reopened run's follow-up).
    CancelKeepsOutcome,
    /// 17. A step's retries count its failures only: a step is parked for a spent retry budget
    ///     after `attempts_per_step_max` failed attempts only; a pause or a crash fails no attempt.
    RetriesCountFailures,
    /// 18. Every message between nodes crosses as a frame of the wire protocol and arrives as it was
    ///     sent: it encodes, and it decodes at its receiver (a frame of another version is refused).
    WireCarries,
    /// 19. Placement fits: a spawn goes only to a worker that has the attempt's harness installed
    ///     and room for it (issue 12: keel-protocol's `Membership` places by capability and load).
    PlacementFits,
    /// 20. A lost worker's work is re-placed: every attempt a crashed worker hosted is down at the
    ///     supervisor within the lease plus the network's longest delay (issue 12: leases expire).
    LostWorkReplaced,
    /// The world itself broke a bound (agenda full, event budget spent): a runaway, reported as such.
    WorldBound,
}

impl Invariant {
    /// The number in docs/DESIGN.md §12 (0 for the world's own bounds).
    pub fn number(self) -> u8 {
        match self {
            Self::NoTaskLost => 1,
            Self::IdempotentOnce => 2,
            Self::ToolPairing => 3,
            Self::PreambleBounds => 4,
            Self::NoNativeResume => 5,
            Self::ModelFromAssignee => 6,
            Self::NoSiblingAddress => 7,
            Self::LimitsHold => 8,
            Self::RunIsolation => 9,
            Self::NoEmptySuccess => 10,
            Self::SameSeedSameTrace => 11,
            Self::HookAudited => 12,
            Self::PauseResumesSame => 13,
            Self::CancelStartsNothing => 14,
            Self::ReopenEndsOnce => 15,
            Self::CancelKeepsOutcome => 16,
            Self::RetriesCountFailures => 17,
            Self::WireCarries => 18,
            Self::PlacementFits => 19,
            Self::LostWorkReplaced => 20,
            Self::WorldBound => 0,
        }
    }
}

/// A broken invariant, located in one seed's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The seed that reproduces it.
    pub seed: u64,
    /// The number of the event after which the check failed.
    pub event: u64,
    /// Which invariant.
    pub invariant: Invariant,
    /// What exactly was seen, in one line.
    pub detail: String,
}

impl Violation {
    /// The command that replays the run with its trace.
    pub fn reproduction(&self) -> String {
        format!("keel-sim --seed {:#018x}", self.seed)
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invariant {} ({:?}) broken at event {} of seed {:#018x}: {}\n  reproduce: {}",
            self.invariant.number(),
            self.invariant,
            self.event,
            self.seed,
            self.detail,
            self.reproduction()
        )
    }
}

/// Parses a seed as the reproduction command prints it (`0x...`) or as a decimal number.
///
/// # Errors
/// A message naming the input when it is neither.
pub fn parse_seed(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => t.replace('_', "").parse::<u64>(),
    };
    parsed.map_err(|e| format!("not a seed (0x-prefixed hex or decimal u64): {t:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reproduction_parses_back_to_the_seed() {
        let v = Violation {
            seed: 0xdead_beef,
            event: 3,
            invariant: Invariant::IdempotentOnce,
            detail: "x".into(),
        };
        let cmd = v.reproduction();
        let seed = cmd.rsplit(' ').next().unwrap();
        assert_eq!(parse_seed(seed), Ok(0xdead_beef));
        assert!(v.to_string().contains("event 3"));
        assert_eq!(parse_seed("42"), Ok(42));
        assert!(parse_seed("0xzz").is_err());
    }
}
