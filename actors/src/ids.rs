//! Identities and addresses of the actors, minted from the injected random stream.
//!
//! Addresses are values, not handles: the runtime maps them to `ActorRef`s (ractor cannot send an
//! `ActorRef` across nodes), the simulator to its mailboxes. Who may hold which address is part of the
//! design: a specialist holds only a [`ReplyTo<Coordinator>`], which only this crate can mint, so it
//! cannot address a sibling (docs/DESIGN.md §12, invariant 7).

use crate::machine::{Entropy, Millis};
use keel_store::{RunId, TaskId};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::marker::PhantomData;

/// Mint a ULID-shaped id: 48 bits of `now` (so ids sort by creation) and 80 bits from the random stream.
pub fn mint_u128(now: Millis, rng: &mut dyn Entropy) -> u128 {
    let time = u128::from(now & 0xFFFF_FFFF_FFFF) << 80;
    let hi = u128::from(rng.next_u64() & 0xFFFF) << 64;
    let lo = u128::from(rng.next_u64());
    time | hi | lo
}

/// Mint a run id from the injected clock and stream.
pub fn mint_run_id(now: Millis, rng: &mut dyn Entropy) -> RunId {
    RunId(mint_u128(now, rng))
}

/// Mint a task id from the injected clock and stream.
pub fn mint_task_id(now: Millis, rng: &mut dyn Entropy) -> TaskId {
    TaskId(mint_u128(now, rng))
}

/// One attempt at one task: the identity of a specialist. Attempt numbers start at 1 and are made durable
/// (with an idempotency record) before the attempt starts, so a recovered coordinator never reuses one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct AttemptId {
    /// The run the task belongs to (every message is run-scoped, docs/DESIGN.md §12 invariant 9).
    pub run: RunId,
    /// The task being attempted.
    pub task: TaskId,
    /// 1 for the first attempt.
    pub attempt: u32,
}

impl AttemptId {
    /// The idempotency key of this attempt's side effect (starting a harness session). Recorded durably
    /// before the session starts; the simulator checks that no key is started twice.
    pub fn idempotency_key(&self) -> IdempotencyKey {
        IdempotencyKey(format!("start/{}/{}/{}", self.run, self.task, self.attempt))
    }
}

impl fmt::Display for AttemptId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.task, self.attempt)
    }
}

/// The key that makes a side effect happen at most once across crashes and replays (docs/DESIGN.md §12,
/// invariant 2).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct IdempotencyKey(pub String);

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub use crate::coordinator::Coordinator;

pub(crate) mod sealed {
    /// Seals [`super::ReplyTarget`]: only this crate decides which machines can be replied to.
    pub trait Sealed {}
    impl Sealed for crate::coordinator::Coordinator {}
}

/// A machine a reply address can point at. Sealed and implemented only by [`Coordinator`]: there is no
/// `ReplyTo<Specialist>`, so a specialist cannot be handed an address of a sibling.
pub trait ReplyTarget: sealed::Sealed {}
impl ReplyTarget for Coordinator {}

/// The only address a specialist holds: the reply port of the coordinator that spawned it, bound to the
/// attempt it serves. Only this crate mints one (when the coordinator asks for a spawn), so a reply always
/// names its run and attempt and the coordinator can tell a late report of an old attempt from a current
/// one.
///
/// Specialists cannot address each other; this does not compile:
///
/// ```compile_fail,E0277
/// use keel_actors::{ReplyTo, Specialist};
/// // There is no reply address of a specialist: `Specialist` is not a `ReplyTarget`.
/// fn sibling(_: ReplyTo<Specialist>) {}
/// ```
///
/// Nor can code outside this crate forge one:
///
/// ```compile_fail,E0451
/// use keel_actors::{AttemptId, Coordinator, ReplyTo};
/// fn forge(a: AttemptId) -> ReplyTo<Coordinator> { ReplyTo { attempt: a, role: std::marker::PhantomData } }
/// ```
#[derive(Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ReplyTo<R: ReplyTarget> {
    attempt: AttemptId,
    #[serde(skip)]
    role: PhantomData<fn() -> R>,
}

impl<R: ReplyTarget> ReplyTo<R> {
    /// Minted only by the coordinator's spawn path.
    pub(crate) fn new(attempt: AttemptId) -> Self {
        Self {
            attempt,
            role: PhantomData,
        }
    }

    /// The run whose coordinator receives the reply (hosts route on this).
    pub fn run(&self) -> RunId {
        self.attempt.run
    }

    /// The attempt the replies are about.
    pub fn attempt(&self) -> AttemptId {
        self.attempt
    }
}

impl<R: ReplyTarget> Clone for ReplyTo<R> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<R: ReplyTarget> Copy for ReplyTo<R> {}
impl<R: ReplyTarget> PartialEq for ReplyTo<R> {
    fn eq(&self, other: &Self) -> bool {
        self.attempt == other.attempt
    }
}
impl<R: ReplyTarget> Eq for ReplyTo<R> {}
impl<R: ReplyTarget> fmt::Debug for ReplyTo<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReplyTo({})", self.attempt)
    }
}
