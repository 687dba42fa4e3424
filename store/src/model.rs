//! The durable domain model (docs/DESIGN.md §5): the values keel keeps for every run and task.
//!
//! These are the store's public record types. They are plain data: no IO, no clock. Time is a field the
//! caller fills in (`*_ms`, milliseconds since the Unix epoch) so a simulator can replay a run byte for byte.
//! Every type here is encoded by the codec with a schema version byte in front; adding a field is a schema
//! change (bump the version and keep decoding the old one).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Milliseconds since the Unix epoch, as observed by whoever wrote the row. Passed in, never read here.
pub type UnixMillis = u64;

macro_rules! ulid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub u128);

        impl $name {
            /// The raw 128-bit value, as stored in keys.
            pub fn as_u128(self) -> u128 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                // Encoded on the stack and written as it is (width and precision ignored, as
                // before): ids are formatted about a dozen times a specialist, and the ULID's own
                // `Display` goes through two more `write!` levels to the same 26 characters.
                let mut text = [0u8; ulid::ULID_LEN];
                f.write_str(ulid::Ulid(self.0).array_to_str(&mut text))
            }
        }

        impl FromStr for $name {
            type Err = IdParseError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                ulid::Ulid::from_string(s.trim())
                    .map(|u| Self(u.0))
                    .map_err(|_| IdParseError { input: s.chars().take(64).collect() })
            }
        }
    };
}

ulid_id!(
    /// Identifies a run: one orchestrated job from a brief to a synthesis. Shown as a ULID; callers mint it
    /// from their own (seeded) random stream so the simulator stays replayable.
    RunId
);
ulid_id!(
    /// Identifies a task across the whole store. A task belongs to exactly one run.
    TaskId
);
ulid_id!(
    /// Identifies an escalation across the whole store (what `keel answer` names). An escalation
    /// belongs to exactly one run; its id is minted by whoever raises it.
    EscalationId
);

/// A string that is not a valid ULID was given where a run or task id was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a valid id (expected a 26-character ULID): {input:?}")]
pub struct IdParseError {
    /// The offending input, cut to 64 characters for the message.
    pub input: String,
}

/// Where a run stands. Terminal states are `Completed`, `Failed`, `Cancelled` and `BudgetExceeded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunStatus {
    /// Accepted, not yet planned.
    Pending,
    /// Specialists are being dispatched or are working.
    Running,
    /// Stopped by a graceful shutdown; resumes from its checkpoint.
    Paused,
    /// Synthesis written.
    Completed,
    /// Ended without a synthesis; the reason is in the run's outcome.
    Failed,
    /// Cancelled by an operator.
    Cancelled,
    /// A spend budget tripped; no new spawns were admitted and the run ended.
    BudgetExceeded,
}

impl RunStatus {
    /// Whether nothing more will happen to the run.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Cancelled | Self::BudgetExceeded
        )
    }
}

/// A spend budget kept as a ledger in micro-dollars (integers: no float drift across replays).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// The most the run may spend; `None` means unlimited.
    pub limit_micros: Option<u64>,
    /// Reserved before spawns and not yet settled.
    pub reserved_micros: u64,
    /// Settled spend.
    pub spent_micros: u64,
}

/// One orchestrated job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// The run's id.
    pub id: RunId,
    /// The brief as the user gave it.
    pub brief: String,
    /// The plan, if the run was given a fixed one (serialized by the actors crate; opaque here).
    pub plan: Option<String>,
    /// Where the run stands.
    pub status: RunStatus,
    /// Spend ledger.
    pub budget: Budget,
    /// When the run was accepted.
    pub created_ms: UnixMillis,
    /// When any field last changed.
    pub updated_ms: UnixMillis,
    /// The configuration the run started with (agent versions, limits), so it can be explained later.
    pub config_snapshot: String,
    /// Final outcome text (synthesis reference or failure reason), once terminal.
    pub outcome: Option<String>,
}

/// Why a task exists. Derived kinds (`FollowUp`, `Review`, `Redispatch`) resolve their model from their
/// own assignee, never from their parent (docs/DESIGN.md §12, invariant 6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskKind {
    /// The run's top task (the lead or the plan's root).
    Root,
    /// A subtask dispatched by a coordinator.
    Subtask,
    /// A follow-up message on an existing thread.
    FollowUp,
    /// A review of another task's output.
    Review,
    /// A new attempt of an interrupted or failed task (after a crash, a rate limit, a harness switch).
    Redispatch,
}

/// Where a task stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskStatus {
    /// Created, waiting for admission.
    Pending,
    /// Admitted by the supervisor, not yet started.
    Admitted,
    /// A harness session is working on it.
    Running,
    /// Finished with a complete report.
    Complete,
    /// Finished with a partial report (gaps annotated).
    Partial,
    /// Could not proceed (the report says why).
    Blocked,
    /// Ended with a typed failure.
    Failed,
    /// Cancelled by an operator or by the run ending.
    Cancelled,
    /// Handed to a human.
    Escalated,
    /// Stopped by a graceful shutdown; resumes with a resume preamble.
    Paused,
}

impl TaskStatus {
    /// Whether nothing more will happen to the task (a `Paused` task is not terminal: it resumes).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Complete
                | Self::Partial
                | Self::Blocked
                | Self::Failed
                | Self::Cancelled
                | Self::Escalated
        )
    }
}

/// What a harness said about the session it ran, kept together as one observed value for the record only.
/// keel never resumes a native session (docs/DESIGN.md §6): this is for explaining a run afterwards.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservedSession {
    /// The harness kind (`claude-code`, `codex`, `opencode`, `pi`, `messages-api`, `scripted`).
    pub harness: String,
    /// The account the session ran under.
    pub account: String,
    /// The harness's own session id, as it printed it.
    pub native_session_id: String,
}

/// An attachment of a task's output: small ones inline, large ones by reference to a stored blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    /// A name the agent and operator recognise (a file name, a label).
    pub name: String,
    /// The content or a reference to it.
    pub body: AttachmentBody,
}

/// The content of an attachment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AttachmentBody {
    /// Stored in the task row.
    Inline(String),
    /// Stored in the blob table under this key, with its size in bytes.
    Blob {
        /// The blob's key.
        key: u128,
        /// Its size in bytes.
        len: u64,
    },
}

/// One task: a unit of delegated work with its thread links.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    /// The task's id.
    pub id: TaskId,
    /// The run it belongs to.
    pub run_id: RunId,
    /// The task it was derived from or dispatched by.
    pub parent: Option<TaskId>,
    /// Nesting depth: 0 for a root.
    pub depth: u8,
    /// Why it exists.
    pub kind: TaskKind,
    /// What the assignee is asked to do, verbatim.
    pub brief: String,
    /// The goal, stated separately from the brief for the report check.
    pub goal: String,
    /// Explicit quality criteria the report is checked against.
    pub quality_criteria: Vec<String>,
    /// The output schema the report must follow, if any.
    pub output_schema: Option<String>,
    /// The agent profile the task is assigned to.
    pub assignee: Option<String>,
    /// The model resolved at dispatch from the assignee's profile. Never copied from a parent.
    pub model: Option<String>,
    /// What the harness reported about the session that ran it, for the record only.
    pub observed: Option<ObservedSession>,
    /// Where it stands.
    pub status: TaskStatus,
    /// How many attempts have started (1 for the first).
    pub attempt: u32,
    /// The key that makes its side effects happen at most once.
    pub idempotency_key: Option<String>,
    /// The outcome text (report summary or failure), once terminal.
    pub outcome: Option<String>,
    /// Attachments of its output.
    pub attachments: Vec<Attachment>,
    /// Progress notes the agent reported while working.
    pub progress_notes: Vec<String>,
    /// When it was created.
    pub created_ms: UnixMillis,
    /// When any field last changed.
    pub updated_ms: UnixMillis,
}

/// The kind of a session log row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogKind {
    /// Text the model produced.
    Text,
    /// A tool call.
    ToolUse,
    /// A tool's result.
    ToolResult,
    /// Token and cost usage.
    Usage,
    /// A steering message from a human or the coordinator.
    Steering,
    /// An error.
    Error,
    /// A lifecycle event (started, stopped, paused, decision of a coordinator).
    Lifecycle,
}

/// One row of a task's session log, keyed (task, seq) in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLogRow {
    /// When it happened.
    pub ts_ms: UnixMillis,
    /// What kind of row it is.
    pub kind: LogKind,
    /// One line a human or a resume preamble can read (a tool name and argument digest, not raw output).
    pub summary: String,
    /// Bounded detail.
    pub detail: String,
    /// What keel's scrubber removed from this row before it was stored, by kind, each kind at most
    /// once (empty: nothing was removed). Rows written before scrubbing at ingest (schema version 1)
    /// read back with none.
    pub redactions: Vec<crate::Redaction>,
}

/// A run's progress marker, written by the checkpoint actor at meaningful boundaries (a validated
/// milestone, a batch, a phase transition). One per run: the latest replaces the previous one, so a
/// restarted coordinator resumes from exactly one place.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The run it belongs to.
    pub run_id: RunId,
    /// The last step the coordinator completed and validated (a plan step name), if any.
    pub last_completed_step: Option<String>,
    /// Tasks whose outputs were checked and accepted; a resume does not redo them.
    pub verified_outputs: Vec<TaskId>,
    /// Tasks that were dispatched or planned but not yet verified; a resume looks at these first.
    pub pending_work: Vec<TaskId>,
    /// Ties the checkpoint to the messages and log rows that produced it, for explaining a run later.
    pub correlation_id: String,
    /// The coordinator's own serialized state (opaque here), bounded by the output limit.
    pub state: String,
    /// When it was written.
    pub written_ms: UnixMillis,
}

/// What happened to one item of work, as recorded in the append-only manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ManifestOutcome {
    /// The item was processed and its result is durable.
    Processed,
    /// The item failed; the reason is kept so a reader need not find the log row.
    Failed {
        /// Why it failed, one line.
        reason: String,
    },
    /// The item was retried; `attempt` is the attempt that was started (2 for the first retry).
    Retried {
        /// The attempt number that was started.
        attempt: u32,
    },
}

/// One row of a run's manifest, keyed (run, seq). Append-only: the store has no call that updates or
/// deletes one, so the manifest is a trustworthy history of what was processed, failed and retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    /// When it was recorded.
    pub ts_ms: UnixMillis,
    /// The item of work, as the coordinator names it (a plan step, a file, a query).
    pub item: String,
    /// The task that did the work, if one did.
    pub task_id: Option<TaskId>,
    /// What happened.
    pub outcome: ManifestOutcome,
}

/// A message or result that could not be delivered or processed after its retries, kept so that an
/// operator can inspect and replay it instead of it being lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// When it was given up on.
    pub ts_ms: UnixMillis,
    /// The task it concerned, if any.
    pub task_id: Option<TaskId>,
    /// The message kind or destination, one line.
    pub subject: String,
    /// The payload as text (bounded by the output limit).
    pub payload: String,
    /// Why it was given up on.
    pub reason: String,
    /// How many delivery attempts were made.
    pub attempts: u32,
}

/// A record that a side effect with this key was started, written before the side effect so that a
/// replay after a crash finds it and skips the effect (docs/DESIGN.md §12, invariant 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The idempotency key (unique within a run).
    pub key: String,
    /// When it was recorded.
    pub ts_ms: UnixMillis,
    /// The task whose side effect it guards, if any.
    pub task_id: Option<TaskId>,
    /// What the side effect is, one line (for the operator).
    pub effect: String,
    /// A result worth returning to a replay instead of redoing the effect, if known when recorded.
    pub result: Option<String>,
}

/// What a policy hook decided about a tool call (docs/DESIGN.md §9). `Error` is kept apart from `Deny`
/// so an audit can tell a refusal from a hook that failed (and failed closed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HookDecision {
    /// The call may proceed.
    Allow,
    /// The call was refused.
    Deny,
    /// A human must confirm.
    Ask,
    /// The decision was handed to the next link of the chain.
    Defer,
    /// The hook itself failed.
    Error,
}

/// What a gate mark records (docs/DESIGN.md §9, gates).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GateEvent {
    /// A counting gate let one call through.
    Counted,
    /// A call a prerequisite gate waits for succeeded.
    Met,
    /// A call that issues a token gate's token succeeded: one token of the gate's type.
    Issued,
    /// A call a token gate guards ran: one token spent.
    Spent,
    /// A call a cap gate guards ran with this amount, in millionths of the capped field's unit.
    Added {
        /// The amount, in millionths.
        micros: u64,
    },
}

/// One row of a run's gate ledger: what a gate reads back from the store before it decides, so
/// a crash of the node loses no count, prerequisite, token or amount. Written in the same commit as
/// the audit rows of the decision (or the tool result) that caused it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateMark {
    /// When it was recorded.
    pub ts_ms: UnixMillis,
    /// The task whose session made the call, if any.
    pub task_id: Option<TaskId>,
    /// The gate's name (`[[gates]] name`).
    pub gate: String,
    /// What happened.
    pub event: GateEvent,
}

/// One row of the audit log: every hook decision, denials and errors included (invariant 12).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When the decision was made.
    pub ts_ms: UnixMillis,
    /// The task whose session made the call, if any.
    pub task_id: Option<TaskId>,
    /// The hook or rule that decided (a hook name, `deny-rule`, `permission-mode`).
    pub hook: String,
    /// The tool the call was for, by its literal name.
    pub tool: String,
    /// The decision.
    pub decision: HookDecision,
    /// Why, one line (an actionable reason for a denial, the error for `Error`).
    pub reason: String,
    /// A digest of the tool input (never the raw input: it may hold secrets).
    pub input_digest: String,
    /// Whether the hook rewrote the input.
    pub rewritten: bool,
}

/// Why a task was handed to a human. Exactly three triggers exist (docs/DESIGN.md §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EscalationTrigger {
    /// The agent or user explicitly asked for a human.
    HumanRequested,
    /// A policy gap or exception: no rule covers the case.
    PolicyGap,
    /// No meaningful progress was made.
    NoProgress,
}

/// What waits for an escalation's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EscalationWait {
    /// Nothing: the escalation informs a human (rows written before escalations could be answered
    /// decode as this).
    Nothing,
    /// The task is paused until the answer; then a new session of it starts with the answer in its
    /// preamble.
    Task,
    /// A tool call waits for an approval (an `ask` rule): allowed when answered with an approval,
    /// denied otherwise and when `deadline_ms` passes first.
    ToolCall {
        /// The tool, by its literal name.
        tool: String,
        /// When the call is denied if nobody answered.
        deadline_ms: UnixMillis,
    },
}

/// How an escalation was closed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EscalationResolution {
    /// A human answered.
    Answered {
        /// When.
        ts_ms: UnixMillis,
        /// The answer, as given.
        text: String,
    },
    /// Nobody answered before what waited gave up (an approval's deadline).
    Expired {
        /// When.
        ts_ms: UnixMillis,
    },
}

/// A hand-off to a human. Self-contained: whoever picks it up needs nothing else to act on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalation {
    /// Its id, unique store-wide.
    pub id: EscalationId,
    /// When it was raised.
    pub ts_ms: UnixMillis,
    /// The task it concerns, if any.
    pub task_id: Option<TaskId>,
    /// Why it was raised.
    pub trigger: EscalationTrigger,
    /// The account concerned.
    pub account: String,
    /// What was asked.
    pub asked: String,
    /// What was attempted.
    pub attempted: String,
    /// The diagnosis: why it could not be done.
    pub diagnosis: String,
    /// The amount in micro-dollars, where money is involved.
    pub amount_micros: Option<u64>,
    /// What the human is recommended to do, computed from the case.
    pub recommended_action: String,
    /// The answers the asker can act on (empty: any text).
    pub options: Vec<String>,
    /// What waits for the answer.
    pub waiting: EscalationWait,
    /// How it was closed; `None` while it is open.
    pub resolution: Option<EscalationResolution>,
}

impl Escalation {
    /// Whether it still waits for a human.
    pub fn is_open(&self) -> bool {
        self.resolution.is_none()
    }
}

/// Ceilings for one agent profile; the supervisor and the agent loop enforce them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentLimits {
    /// Most model turns in one session.
    pub turns_max: u32,
    /// Most tokens (input plus output) in one session.
    pub tokens_max: u64,
    /// Wall-clock ceiling of one session, in milliseconds.
    pub timeout_ms: u64,
    /// Most spend of one session in micro-dollars; `None` means only the run's budget applies.
    pub spend_micros_max: Option<u64>,
}

/// A named agent an operator can assign tasks to. A task's model is resolved from its assignee's
/// profile at dispatch (never copied from a parent), which is why profiles live in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentProfile {
    /// The profile's unique name (the `assignee` of a task).
    pub name: String,
    /// What it is for, one paragraph.
    pub description: String,
    /// The harness kind that runs it (`claude-code`, `codex`, `opencode`, `pi`, `messages-api`, `scripted`).
    pub harness: String,
    /// The model it runs.
    pub model: String,
    /// The account it runs under.
    pub account: String,
    /// The tools it may use, by literal name.
    pub tools: Vec<String>,
    /// Its system prompt.
    pub system_prompt: String,
    /// Its ceilings.
    pub limits: AgentLimits,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;

    /// An id reads as its ULID's Crockford text, whatever the value, and parses back to itself.
    #[test]
    fn ids_display_as_their_ulid_and_parse_back() {
        for raw in [0u128, 1, 42, 1 << 80, u128::MAX - 7, u128::MAX] {
            let text = RunId(raw).to_string();
            assert_eq!(text, ulid::Ulid(raw).to_string());
            assert_eq!(text.len(), ulid::ULID_LEN);
            assert_eq!(text.parse::<RunId>().unwrap(), RunId(raw));
            assert_eq!(TaskId(raw).to_string(), text);
            assert_eq!(format!("run {}!", RunId(raw)), format!("run {text}!"));
        }
    }
}
