//! What machines ask their hosts to do. Effects are values; executing them is the host's job, and their
//! completions come back as inputs (see each machine's input enum).

use crate::ids::{AttemptId, Coordinator, IdempotencyKey, ReplyTo};
use crate::machine::Millis;
use crate::message::{
    CheckpointMsg, CheckpointTimer, ContextRequest, CoordinatorMsg, CoordinatorTimer,
    LifecycleEvent, SpecialistMsg, SpecialistReply, SpecialistStart, SpecialistTimer,
    SupervisorMsg, SupervisorTimer,
};
use crate::persist::CommitBatch;
use keel_harness::SessionSpec;
use keel_store::RunId;

/// A message with its destination, as emitted by the machines of the coordinator node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// To the coordinator of a run.
    Coordinator {
        /// The run.
        run: RunId,
        /// The message.
        msg: CoordinatorMsg,
    },
    /// To one specialist attempt (only the coordinator node's machines can name one).
    Specialist {
        /// The attempt.
        attempt: AttemptId,
        /// The message.
        msg: SpecialistMsg,
    },
    /// To the supervisor.
    Supervisor(SupervisorMsg),
    /// To the checkpoint actor.
    Checkpoint(CheckpointMsg),
    /// To the host: the answer to a stage it owns ([`crate::StageOwner::Host`]), exactly once per
    /// ticket, as a coordinator hears `Durable` or `PersistFailed`.
    Host {
        /// The run the stage wrote.
        run: RunId,
        /// The host's ticket of the stage.
        ticket: u64,
        /// `Ok` once durable, else why it was not written.
        result: Result<(), String>,
    },
}

/// Which machine a timer belongs to, so a host can route its firing back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerKey {
    /// A coordinator's timer.
    Coordinator(RunId, CoordinatorTimer),
    /// The supervisor's timer.
    Supervisor(SupervisorTimer),
    /// The checkpoint's timer.
    Checkpoint(CheckpointTimer),
}

/// An effect of the coordinator-node machines (coordinator, supervisor, checkpoint).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Deliver a message (see the message's `# Delivery`).
    Send(Envelope),
    /// Commit this batch in one write transaction with `Durability::Immediate`; answer with
    /// `CheckpointInput::Committed` or `CheckpointInput::CommitFailed`. Only the checkpoint machine
    /// emits it: it is the only writer of progress.
    Persist(CommitBatch),
    /// Create a specialist for this attempt (on a worker node or locally) and give it
    /// `SpecialistInput::Begin`. Only the supervisor emits it, after admission.
    ///
    /// # Delivery
    /// Remote when the specialist runs on a worker: may be delayed, lost or duplicated. The worker host
    /// creates at most one specialist per `AttemptId` (it remembers the attempts it has spawned and
    /// drops a duplicate), because every specialist starts a session with the attempt's idempotency key
    /// and a key must never start two sessions. A lost spawn is healed by the supervisor's deadline.
    /// Boxed: the largest effect by far, and one in many; inline it made every effect (and every
    /// `Vec` of them a machine fills) its size.
    SpawnSpecialist(Box<SpecialistStart>),
    /// Stop a specialist and its harness session (the host delivers `SpecialistMsg::Cancel` and, if the
    /// attempt does not end by itself, kills it).
    StopSpecialist {
        /// The attempt.
        attempt: AttemptId,
        /// Why, one line.
        reason: String,
    },
    /// Fire this timer at `at` (host time). A machine ignores a stale firing, so a host may fire a
    /// timer that was cancelled.
    SetTimer {
        /// Which timer.
        key: TimerKey,
        /// When.
        at: Millis,
    },
    /// Every pending firing of this timer is no longer wanted: the host may drop them. Only a
    /// bound on what a host holds: a host that fires them anyway is correct (the machine ignores
    /// them), and the simulator does, so the machines' staleness checks stay exercised. The
    /// supervisor cancels an attempt's deadline when the attempt ends: a node that runs thousands
    /// of specialists a second would otherwise hold each one's deadline for its whole timeout.
    CancelTimer {
        /// Which timer.
        key: TimerKey,
    },
    /// Tell observers.
    Emit(LifecycleEvent),
}

/// An effect of a specialist. It has no variant that names another specialist: its only outbound
/// address is its [`ReplyTo<Coordinator>`] (docs/DESIGN.md §12, invariant 7).
///
/// ```compile_fail,E0599
/// use keel_actors::{SpecialistEffect, Envelope};
/// // A specialist cannot send to an arbitrary envelope (a sibling included): no such variant.
/// fn to_sibling(e: Envelope) -> SpecialistEffect { SpecialistEffect::Send(e) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecialistEffect {
    /// Load the rows its preamble is built from; answer with `SpecialistInput::ContextLoaded`.
    LoadContext(ContextRequest),
    /// Start the harness session. The key is durable already (the coordinator recorded it before
    /// admission); a host must never start two sessions with one key. Events come back as
    /// `SpecialistInput::Harness`.
    StartHarness {
        /// The attempt's idempotency key.
        key: IdempotencyKey,
        /// The session, fully described (prompt with preamble placed, model resolved).
        spec: Box<SessionSpec>,
    },
    /// Return a delegation turn's outcomes to the session as the result of its `delegate` tool call
    /// (the host's MCP endpoint holds the pending call).
    AnswerDelegation {
        /// The turn.
        turn: u32,
        /// `(call_id, outcome)` per call.
        results: Vec<(String, crate::report::StepOutcome)>,
    },
    /// Answer a tool call of the session (the host's MCP endpoint holds the pending call).
    AnswerTool {
        /// The call.
        call_id: String,
        /// The answer.
        answer: crate::session_tool::SessionAnswer,
    },
    /// Cancel the running harness session (it then ends with a `Failed(cancelled)` event).
    CancelHarness,
    /// Send to its coordinator, and nowhere else.
    Reply(ReplyTo<Coordinator>, SpecialistReply),
    /// Fire this timer at `at`.
    SetTimer {
        /// Which timer.
        timer: SpecialistTimer,
        /// When.
        at: Millis,
    },
    /// Tell observers.
    Emit(LifecycleEvent),
    /// The attempt is over (acknowledged, cancelled, or out of resends): the host may drop it.
    Exit,
}
