//! The wire protocol between keel nodes: typed messages, an explicit bincode 2 encoding behind a
//! protocol version, and a decoder that is total (docs/DESIGN.md §10).
//!
//! A frame is `[version: u16, big-endian][bincode 2 of Envelope<Body>]`. The version is read before
//! anything else, so a message of another protocol version is refused as exactly that
//! ([`WireError::Version`]) instead of being misread; garbage, truncation, trailing bytes and
//! oversized frames are typed errors too. Nothing here panics on input: decoding is bounded by
//! [`FRAME_BYTES_MAX`] (bincode's allocation limit), and the machines' own types (attempts, replies,
//! specialist messages) travel unchanged. `ActorRef`s never cross the wire: a message names its
//! sender by [`NodeName`] and its subject by keel's ids (run, task, attempt).

use crate::name::NodeName;
use keel_actors::context::RowSet;
use keel_actors::{
    AttemptId, ContextRequest, LifecycleEvent, SpecialistMsg, SpecialistReply, SpecialistStart,
};
use keel_harness::{HarnessKind, PermissionMode, TokenCounts, ToolOutput};
use keel_policy::{Decision, HookEvent};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The protocol version this build speaks. Bump it on any change to the enums below that an older
/// node could misread (a new variant, a changed field); nodes of different versions refuse each
/// other's messages with a logged error (docs/OPERATIONS.md: rolling upgrades).
///
/// History: 1, the first cluster; 2, a session log row carries its redactions and an assignment
/// carries its agent profile's tools, system prompt and turn limit; 3, a spawn carries the
/// coordinator's policy terms and a worker asks the coordinator's policy about its sessions' tool
/// calls ([`ToCoordinator::Policy`], [`ToWorker::PolicyAnswer`]); 4, the policy terms say whether
/// the coordinator's policy has `PreCompact` hooks ([`PolicyTerms::session_events`]).
pub const PROTOCOL_VERSION: u16 = 5;

/// Most bytes of one frame (also below ractor_cluster's 16 MiB inbound frame limit).
pub const FRAME_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Bytes of the version header.
const HEADER_BYTES: usize = 2;

/// One message on the wire: who sent it and what it says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope<B> {
    /// The sending node's name.
    pub from: NodeName,
    /// The message.
    pub body: B,
}

/// What a worker tells the coordinator about itself, every heartbeat: the lease is renewed by it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Minted at the worker's start: a new value means the worker restarted (and lost what it hosted).
    pub incarnation: u64,
    /// The harnesses installed on the worker.
    pub harnesses: Vec<HarnessKind>,
    /// Most specialists it hosts at once.
    pub capacity: u32,
    /// The attempts it hosts right now.
    pub hosting: Vec<AttemptId>,
}

/// Messages from the coordinator node to a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToWorker {
    /// Host this specialist. Answered with [`ToCoordinator::Spawned`] (again for a duplicate) or
    /// [`ToCoordinator::SpawnRefused`].
    Spawn {
        /// The worker incarnation the spawn is addressed to; another incarnation refuses it.
        incarnation: u64,
        /// What the supervisor decided.
        start: Box<SpecialistStart>,
        /// The coordinator's policy, when its keel.toml has one: the worker then gates every tool
        /// call of the attempt's session and asks the coordinator ([`ToCoordinator::Policy`]).
        /// `None`: no gate, as on a node without a policy.
        policy: Option<PolicyTerms>,
    },
    /// A coordinator's or supervisor's message to a hosted attempt (`Ack`, `Cancel`, answers).
    Specialist {
        /// The attempt.
        attempt: AttemptId,
        /// The message, as the machines define it.
        msg: SpecialistMsg,
    },
    /// The rows of a remote specialist's preamble (answer to [`ToCoordinator::LoadContext`]).
    ContextRows {
        /// The attempt that asked.
        attempt: AttemptId,
        /// The rows, or why they could not be read.
        rows: Result<RowSet, String>,
    },
    /// The coordinator's policy answered a hosted attempt's question ([`ToCoordinator::Policy`]),
    /// once its audit rows were durable.
    PolicyAnswer {
        /// The attempt that asked.
        attempt: AttemptId,
        /// The question's id, as the worker minted it.
        question: u64,
        /// The answer.
        answer: PolicyAnswer,
    },
}

/// How long the coordinator's policy may take to decide, so that a worker's gate waits long
/// enough (and no longer): derived from the coordinator's keel.toml (hooks' timeouts, the ask
/// timeout, the audit commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyTerms {
    /// Most milliseconds a pre-tool decision (or a session event's) takes on the coordinator.
    pub decide_ms: u64,
    /// `Some` when the policy needs tool results (a `PostToolUse` hook, or a gate waiting for a
    /// success): most milliseconds a post-tool decision takes.
    pub post_ms: Option<u64>,
    /// Whether the coordinator's policy has hooks for a CLI's own session events (`PreCompact`):
    /// the worker then installs the CLI's pre-compaction hook, which asks the coordinator
    /// ([`PolicyQuestion::SessionEvent`]) before the CLI compacts its context.
    pub session_events: bool,
}

/// Who asks: the session's permission mode, tools and agent (the attempt travels beside it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyScope {
    /// The session's own permission mode.
    pub mode: PermissionMode,
    /// The tools the session may use; empty: any.
    pub tools: Vec<String>,
    /// The agent profile it runs as.
    pub agent: String,
}

/// A question a worker asks the coordinator's policy about a session it hosts. JSON travels as
/// text (bincode cannot carry a self-describing `serde_json::Value`); the coordinator denies a
/// question whose JSON does not parse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyQuestion {
    /// May this call run? (`PolicyHost::before_tool`.)
    BeforeTool {
        /// Who asks.
        scope: PolicyScope,
        /// The tool.
        tool: String,
        /// Its input, JSON text.
        input: String,
        /// The hook payload, JSON text.
        payload: String,
    },
    /// The call ran: the result the model is to see (`PolicyHost::after_tool`).
    AfterTool {
        /// Who asks.
        scope: PolicyScope,
        /// The tool.
        tool: String,
        /// Its input, JSON text.
        input: String,
        /// The hook payload, JSON text.
        payload: String,
        /// What the tool produced.
        output: ToolOutput,
    },
    /// A session event's hooks (`PolicyHost::on_session_event`).
    SessionEvent {
        /// Who asks.
        scope: PolicyScope,
        /// The event.
        event: HookEvent,
        /// The hook payload, JSON text.
        payload: String,
    },
}

/// The coordinator's answer to a [`PolicyQuestion`], of the question's kind.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyAnswer {
    /// For [`PolicyQuestion::BeforeTool`] and [`PolicyQuestion::SessionEvent`]: the decision.
    Decided {
        /// Allow or deny (an ask has been answered on the coordinator by then).
        decision: Decision,
        /// Why (the model is told on a denial).
        reason: String,
        /// The link that decided.
        decided_by: String,
        /// A session event's hooks' notes.
        context: Option<String>,
    },
    /// For [`PolicyQuestion::AfterTool`]: the result the model is to see.
    Output(ToolOutput),
}

/// Messages from a worker to the coordinator node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// The worker is alive; its capabilities and load.
    Heartbeat(WorkerStatus),
    /// The attempt's specialist runs here.
    Spawned {
        /// The attempt.
        attempt: AttemptId,
    },
    /// The attempt was not started here (another incarnation, full).
    SpawnRefused {
        /// The attempt.
        attempt: AttemptId,
        /// Why, one line.
        reason: String,
    },
    /// A reply of a hosted attempt to its coordinator (`CoordinatorMsg::Specialist` on arrival).
    Reply {
        /// The attempt that sent it (from its reply address).
        from: AttemptId,
        /// What it says.
        reply: SpecialistReply,
    },
    /// A hosted attempt needs the rows of its preamble (workers never open the store).
    LoadContext {
        /// The attempt.
        attempt: AttemptId,
        /// What to load.
        request: ContextRequest,
    },
    /// A hosted attempt's session asks the coordinator's policy (answered with
    /// [`ToWorker::PolicyAnswer`]; the worker denies when no answer comes in time).
    Policy {
        /// The attempt whose session asks.
        attempt: AttemptId,
        /// Minted by the worker; the answer carries it back.
        question: u64,
        /// The question.
        ask: PolicyQuestion,
    },
    /// A lifecycle event a hosted attempt emitted.
    Lifecycle(LifecycleEvent),
    /// Token usage of a hosted attempt's session so far.
    Usage {
        /// The attempt.
        attempt: AttemptId,
        /// Tokens so far.
        tokens: TokenCounts,
        /// Spend so far, in micro-dollars.
        spent_micros: u64,
    },
    /// A hosted attempt's actor ended: normally (its machine exited) or not (a crash).
    Exited {
        /// The attempt.
        attempt: AttemptId,
        /// Whether its machine ended it.
        normal: bool,
        /// Whether its actor panicked (keel's adapter or the harness broke): the coordinator's
        /// supervisor counts it against the harness, as for a local specialist.
        panicked: bool,
        /// The exit reason.
        reason: String,
    },
}

/// Why a frame was not decoded. Every failure of [`decode`] is one of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the version header.
    #[error("a frame of {len} bytes is too short for the protocol version header")]
    Truncated {
        /// Its length.
        len: usize,
    },
    /// Another protocol version.
    #[error("refused a message of protocol version {got} (this node speaks {PROTOCOL_VERSION})")]
    Version {
        /// The version the frame says.
        got: u16,
    },
    /// Larger than [`FRAME_BYTES_MAX`].
    #[error("a frame of {len} bytes is larger than the {FRAME_BYTES_MAX}-byte limit")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// The body is not a message of this version.
    #[error("a malformed message: {0}")]
    Malformed(String),
    /// Bytes after the message.
    #[error("{extra} unexpected bytes after the message")]
    Trailing {
        /// How many.
        extra: usize,
    },
    /// The message could not be encoded (it does not fit the frame limit).
    #[error("a message could not be encoded: {0}")]
    Encode(String),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<FRAME_BYTES_MAX>()
}

/// Encode a message of this protocol version.
///
/// # Errors
/// [`WireError::Encode`] when it does not fit [`FRAME_BYTES_MAX`].
pub fn encode<B: Serialize>(from: &NodeName, body: &B) -> Result<Vec<u8>, WireError> {
    #[derive(Serialize)]
    struct EnvelopeRef<'a, B> {
        from: &'a NodeName,
        body: &'a B,
    }
    // The body is encoded straight after the header, not into a vector of its own and copied.
    let mut bytes = PROTOCOL_VERSION.to_be_bytes().to_vec();
    bincode::serde::encode_into_std_write(EnvelopeRef { from, body }, &mut bytes, config())
        .map_err(|e| WireError::Encode(e.to_string()))?;
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(WireError::Encode(format!(
            "{} bytes exceed the frame limit",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Encode with an explicit version header: how a test plays a node of another version.
///
/// # Errors
/// As [`encode`].
pub fn encode_as_version<B: Serialize>(
    version: u16,
    from: &NodeName,
    body: &B,
) -> Result<Vec<u8>, WireError> {
    let mut bytes = encode(from, body)?;
    bytes[..HEADER_BYTES].copy_from_slice(&version.to_be_bytes());
    Ok(bytes)
}

/// Decode a frame of this protocol version. Total: any input gives a message or a [`WireError`].
///
/// # Errors
/// [`WireError`] saying what is wrong with the frame.
pub fn decode<B: DeserializeOwned>(bytes: &[u8]) -> Result<Envelope<B>, WireError> {
    let Some((header, body)) = bytes.split_first_chunk::<HEADER_BYTES>() else {
        return Err(WireError::Truncated { len: bytes.len() });
    };
    let version = u16::from_be_bytes(*header);
    if version != PROTOCOL_VERSION {
        return Err(WireError::Version { got: version });
    }
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(WireError::TooLarge { len: bytes.len() });
    }
    let (envelope, read): (Envelope<B>, usize) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| WireError::Malformed(e.to_string()))?;
    if read != body.len() {
        return Err(WireError::Trailing {
            extra: body.len() - read,
        });
    }
    Ok(envelope)
}
