//! The one trait every actor's behaviour implements, and the two things the world injects: time and
//! randomness (docs/DESIGN.md §3).
//!
//! A machine is quinn-proto's sans-IO split applied to actors: `(state, input, now, rng) -> (state, effects)`.
//! It never reads a clock, a random source, a socket or a file; it never awaits. The ractor runtime and the
//! simulator are two hosts for the same machines: they feed inputs (typed messages, timer firings,
//! completions of effects), execute the effects that come out, and feed the completions back as inputs.
//!
//! # The four machines
//!
//! | Machine | One per | Input | Effect | Owns |
//! |---|---|---|---|---|
//! | [`crate::Coordinator`] | run | [`crate::CoordinatorInput`] | [`crate::Effect`] | the plan, every decision, the synthesis |
//! | [`crate::Specialist`] | attempt | [`crate::SpecialistInput`] | [`crate::SpecialistEffect`] | one harness session |
//! | [`crate::Supervisor`] | node group | [`crate::SupervisorInput`] | [`crate::Effect`] | admission, limits, ledger, deadlines, verdicts |
//! | [`crate::CheckpointWriter`] | coordinator node | [`crate::CheckpointInput`] | [`crate::Effect`] | every durable write (group commit) |
//!
//! # One step of a plan, as messages
//!
//! 1. The coordinator stages the attempt's task row and idempotency record ([`crate::CheckpointMsg::Stage`]);
//!    the checkpoint writer commits it ([`crate::Effect::Persist`]) and answers `Durable`.
//! 2. The coordinator asks for admission ([`crate::SupervisorMsg::Admit`]); the supervisor reserves the
//!    estimate in the run's ledger, takes a spawn-rate token, resolves agent, harness and model, answers
//!    `Admission`, arms the deadline and emits [`crate::Effect::SpawnSpecialist`].
//! 3. The specialist loads its preamble's rows if it needs them, starts the session
//!    ([`crate::SpecialistEffect::StartHarness`], keyed by the durable idempotency key), streams log rows and
//!    spend to its coordinator, and ends with `Finished` (a verified report or a typed failure), resent
//!    until acknowledged.
//! 4. The coordinator stages the result with its done-marker (task row, manifest, run budget) in one
//!    stage; only when it is `Durable` does it acknowledge the specialist, settle the supervisor's ledger,
//!    and move on (next batch, next turn, follow-ups, synthesis). A failure is settled instead and the
//!    supervisor answers with a [`crate::Verdict`]: restart, reroute, escalate or give up.
//!
//! # Recovery
//!
//! After a crash the host loads the run row, its checkpoint (whose `state` carries the coordinator's
//! snapshot: which tasks belong to which step, attempt numbers), its task rows and idempotency records,
//! and feeds them as [`crate::CoordinatorInput::Recovered`]. Task rows are the truth for outcomes: a step
//! whose row holds a terminal outcome is done and never runs again; a step that was dispatched but not
//! acknowledged runs as its next attempt with a resume preamble; a late result of the old attempt is
//! refused as stale.
//!
//! # Architecture invariants
//!
//! **No machine performs IO, reads a clock or a random source, or iterates a hash map.** Time and ids
//! come in through `now` and [`Entropy`].
//!
//! **A specialist can only address its coordinator**: its effect type has no other destination, and
//! [`crate::ReplyTo`] can only be minted by this crate (docs/DESIGN.md §12, invariant 7).
//!
//! **Only the checkpoint writer persists, and a result is acknowledged only after its commit.**
//!
//! **Every bound is explicit**: steps per plan, attempts per step, live specialists, queued stages,
//! commit retries, resends, log rows per attempt, findings per report.

/// Milliseconds since the Unix epoch on the host's clock: the wall clock in the runtime, the virtual clock
/// in the simulator. Machines only ever receive it; they never read it.
pub type Millis = u64;

/// The injected random stream. The simulator backs it with its seeded ChaCha8 stream; the runtime with a
/// ChaCha8 seeded from the OS once at start. Machines draw ids and jitter from it and nothing else, so a
/// seed replays a run bit for bit.
pub trait Entropy {
    /// The next 64 uniformly distributed bits of the stream.
    fn next_u64(&mut self) -> u64;
}

impl<E: Entropy + ?Sized> Entropy for &mut E {
    fn next_u64(&mut self) -> u64 {
        (**self).next_u64()
    }
}

/// A uniformly distributed value in `0..bound` (0 when `bound` is 0), by rejection so that replay does not
/// depend on a modulo bias.
pub fn uniform_below(rng: &mut dyn Entropy, bound: u64) -> u64 {
    if bound == 0 {
        return 0;
    }
    let zone = u64::MAX - (u64::MAX % bound);
    // Bounded: the chance that 16 draws all land in the rejected tail is below 2^-16 even for the worst
    // bound; after that the modulo bias is irrelevant for jitter and ids.
    for _ in 0..16 {
        let v = rng.next_u64();
        if v < zone {
            return v % bound;
        }
    }
    rng.next_u64() % bound
}

/// One actor's behaviour as a pure, deterministic state machine.
///
/// # Contract for hosts
/// - Call [`Machine::handle`] with one input at a time; inputs of one machine are never handled
///   concurrently. `now` must not go backwards for one machine.
/// - Execute every effect pushed into `out` in order. An effect that completes (a persist, a harness
///   session, a timer) comes back later as an input of the machine that emitted it; the machine's input
///   enum says which variant carries which completion.
/// - A machine never blocks and never waits: a question to another actor is a message out and a message
///   back in, with a timer in case the answer never comes.
/// - Every effect list is bounded by the machine's configured limits; a host may assert on that.
pub trait Machine {
    /// Everything that can happen to this machine: its messages, its timers, completions of its effects.
    type Input;
    /// What this machine can ask its host to do. A specialist's effect type cannot name a sibling
    /// (docs/DESIGN.md §12, invariant 7); see [`crate::SpecialistEffect`].
    type Effect;

    /// Handle one input at time `now`, drawing randomness only from `rng`, pushing effects into `out`.
    fn handle(
        &mut self,
        input: Self::Input,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Self::Effect>,
    );
}

/// A small deterministic stream (SplitMix64) for unit tests and doc examples of hosts. The simulator uses
/// ChaCha8; this exists so tests of the machines need no dependency and still replay.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl Entropy for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
