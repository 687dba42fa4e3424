//! The closed message enums, one per actor, and each machine's input enum (messages, timers,
//! completions of effects).
//!
//! Delivery vocabulary used in every `# Delivery` section:
//! - **cast**: fire and forget; **call**: the receiver answers with a named message back to the sender.
//! - **local**: sender and receiver live on the coordinator node (coordinator, supervisor, checkpoint);
//!   per-sender FIFO, never dropped while the node is up, lost with the node on a crash (the store is
//!   what survives).
//! - **remote**: crosses to or from a worker node (specialist <-> coordinator); may be delayed,
//!   reordered, duplicated or lost. Every remote message is idempotent at the receiver and the sender
//!   retries on a timer, with a bound.

use crate::ids::AttemptId;
use crate::machine::Millis;
use crate::persist::{CommitId, Stage};
use crate::plan::Plan;
use crate::report::{AttemptResult, Continuity, SubtaskBrief, SubtaskFailure};
use keel_harness::{HarnessEvent, HarnessKind};
use keel_store::{
    Budget, Checkpoint, IdempotencyRecord, Run, RunId, SessionLogRow, Task, TaskId, TaskKind,
};
use serde::{Deserialize, Serialize};

/// How a run is decomposed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunMode {
    /// A fixed plan, dispatched by code (sectioning).
    Plan(Plan),
    /// A lead agent decomposes the brief with delegation calls (orchestrator-workers).
    Lead {
        /// The agent profile of the lead; `None` lets the supervisor pick.
        agent: Option<String>,
        /// Constraints restated to every specialist the lead delegates to.
        constraints: Vec<String>,
    },
}

/// A run as submitted: the brief plus how to decompose it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The run's id (minted by the submitter from its own stream).
    pub run: RunId,
    /// The brief, verbatim.
    pub brief: String,
    /// Plan or lead.
    pub mode: RunMode,
    /// The most the run may spend, in micro-dollars; `None` is unlimited.
    pub budget_limit_micros: Option<u64>,
    /// The configuration the run starts with, recorded on the run row so it can be explained later.
    pub config_snapshot: String,
}

/// One delegation call of a lead agent: a subtask it wants done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelegationCall {
    /// The lead's own id for the call, unique within its attempt (answers carry it back).
    pub call_id: String,
    /// The brief of the subtask.
    pub brief: String,
    /// Its goal.
    pub goal: String,
    /// Its quality criteria.
    pub quality_criteria: Vec<String>,
    /// The output schema of its report.
    pub output_schema: Option<String>,
    /// The agent to ask for, if any.
    pub assignee: Option<String>,
}

/// What the supervisor decided for a spawn request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The agent profile the attempt runs as.
    pub agent: String,
    /// The harness that runs it.
    pub harness: HarnessKind,
    /// The model, resolved from the agent's profile (never from a parent task).
    pub model: String,
    /// The account the session bills to.
    pub account: String,
    /// The profile's tools: the session's allowed tools (empty: the harness's default set).
    #[serde(default)]
    pub tools: Vec<String>,
    /// The profile's system prompt, appended to the harness's own (empty: none).
    #[serde(default)]
    pub system_prompt: String,
    /// The profile's most model turns per session (`None`: the node's default session limit).
    #[serde(default)]
    pub turns_max: Option<u32>,
}

/// Why a spawn was refused: a typed answer, never a hang (docs/DESIGN.md §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// Max concurrent specialists reached; retry after `retry_after_ms`.
    Concurrency {
        /// The limit.
        limit: u32,
        /// When a slot is worth asking for again.
        retry_after_ms: u64,
    },
    /// Too deep.
    Depth {
        /// The depth requested.
        depth: u8,
        /// The limit.
        limit: u8,
    },
    /// The spend budget cannot cover the reservation, or has tripped: the run ends with a budget outcome.
    Budget {
        /// Settled plus reserved.
        committed_micros: u64,
        /// The reservation asked for.
        requested_micros: u64,
        /// The run's limit.
        limit_micros: u64,
    },
    /// The spawn rate is exceeded; retry after `retry_after_ms`.
    Rate {
        /// When a token will be available.
        retry_after_ms: u64,
    },
    /// The run is not open at the supervisor (closed, or never opened).
    UnknownRun,
    /// No agent profile fits (unknown assignee, or every harness is cooling down).
    NoAgent {
        /// Why.
        reason: String,
    },
}

impl Refusal {
    /// When asking again can succeed, if ever (budget, depth and missing agents are final).
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            Refusal::Concurrency { retry_after_ms, .. } | Refusal::Rate { retry_after_ms } => {
                Some(*retry_after_ms)
            }
            _ => None,
        }
    }
}

/// The supervisor's decision after an attempt failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// Try again with the same agent after a backoff.
    Restart {
        /// Wait this long first.
        after_ms: u64,
    },
    /// Try again on another agent or harness (rate limit, repeated failures of one harness, context
    /// overflow): a re-dispatched derived task with a resume preamble, model from the new assignee.
    Reroute {
        /// The agent to use.
        agent: String,
        /// Wait this long first.
        after_ms: u64,
    },
    /// Hand it to a human; the step is parked in the dead-letter table.
    Escalate {
        /// Why (one line).
        reason: String,
    },
    /// Not retryable and nothing to escalate: the step fails (parked in the dead-letter table).
    GiveUp {
        /// Why (one line).
        reason: String,
    },
    /// The attempt hit its account's rate limit: try again with the same agent, billed to another
    /// account of the same provider (the next attempt of the same task, with a resume preamble).
    /// The coordinator keeps the account in its checkpoint, so a restart does not lose the switch.
    SwitchAccount {
        /// The account the next attempt bills to.
        account: String,
        /// Wait this long first.
        after_ms: u64,
    },
}

/// A request to admit one specialist attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// The attempt to spawn (its task row, carrying the attempt and its idempotency key, is
    /// durable already).
    pub attempt: AttemptId,
    /// Nesting depth of the task (root 0, subtasks 1, ...).
    pub depth: u8,
    /// Why the task exists.
    pub kind: TaskKind,
    /// The agent to use; `None` lets the supervisor pick.
    pub agent: Option<String>,
    /// The account to bill, after a [`Verdict::SwitchAccount`]; `None` (or an account that does
    /// not serve the agent's provider) uses the agent profile's.
    #[serde(default)]
    pub account: Option<String>,
    /// The reservation for the budget ledger.
    pub estimate_micros: u64,
    /// Everything the specialist is given.
    pub brief: SubtaskBrief,
    /// How the session gets its continuity.
    pub continuity: Continuity,
}

/// Messages to a coordinator (one per run).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorMsg {
    /// Start a run.
    ///
    /// # Delivery
    /// Local cast from the host (submission API). Idempotent: a second `Accept` of the same run, or any
    /// `Accept` after a `Recovered`, is ignored (and logged as a decision).
    Accept(RunSpec),
    /// A reply of one specialist attempt.
    ///
    /// # Delivery
    /// Remote cast from a specialist's [`crate::ReplyTo`]. May be lost, duplicated or late: the
    /// specialist resends `Finished` until it gets [`SpecialistMsg::Ack`]; the coordinator accepts a
    /// result only from the task's current attempt and only once (a duplicate is re-acked, a stale one
    /// is logged and dropped); log rows carry per-attempt sequence numbers and are deduplicated.
    Specialist {
        /// The attempt that sent it (taken from the reply address, not from the payload).
        from: AttemptId,
        /// What it says.
        reply: SpecialistReply,
    },
    /// A stage is durable, and with it every stage its coordinator sent before it.
    ///
    /// # Delivery
    /// Local; the answer to [`CheckpointMsg::Stage`]: once per run and commit, naming the newest
    /// ticket of the run in that commit (a run's stages commit in ticket order), in ticket order.
    Durable {
        /// The stage's ticket.
        ticket: u64,
    },
    /// A stage could not be made durable after the checkpoint's retries; nothing of it was written.
    ///
    /// # Delivery
    /// Local; the alternative answer to [`CheckpointMsg::Stage`]; exactly once per ticket.
    PersistFailed {
        /// The stage's ticket.
        ticket: u64,
        /// Why, one line.
        error: String,
        /// Whether sending it again cannot help: the store refused this run's own write (a limit
        /// it passes, a row it cannot apply) or the stage is over the writer's bounds. The run
        /// then fails at once instead of restaging.
        permanent: bool,
    },
    /// The supervisor's answer to [`SupervisorMsg::Admit`].
    ///
    /// # Delivery
    /// Local; exactly one per `Admit` (a repeated `Admit` of the same attempt gets the same answer).
    Admission {
        /// The attempt asked about.
        attempt: AttemptId,
        /// Admitted with an assignment (the specialist is being spawned), or refused.
        answer: Result<Assignment, Refusal>,
    },
    /// The supervisor's decision about a failed attempt (answer to [`SupervisorMsg::Settle`] with a
    /// failure).
    ///
    /// # Delivery
    /// Local; exactly one per failed settle.
    Verdict {
        /// The attempt that failed.
        attempt: AttemptId,
        /// What to do.
        verdict: Verdict,
    },
    /// The supervisor gave up on a live attempt (its deadline passed, or its node died) and already
    /// stopped it and settled it; the failure is synthesised, the verdict decided.
    ///
    /// # Delivery
    /// Local cast, at most once per attempt. A report of that attempt arriving later is stale.
    AttemptLost {
        /// The attempt.
        attempt: AttemptId,
        /// What happened, as a typed failure (kind `Timeout` or `Crashed`).
        failure: SubtaskFailure,
        /// What to do.
        verdict: Verdict,
    },
    /// The run's spend budget tripped: no spawn will be admitted; the run must end with a budget outcome.
    ///
    /// # Delivery
    /// Local cast, at most once per run; the supervisor has already stopped the run's live specialists.
    BudgetTripped {
        /// Settled plus reserved spend when it tripped.
        committed_micros: u64,
        /// The limit.
        limit_micros: u64,
    },
    /// A follow-up message on a thread: a new derived task (kind `FollowUp`) whose parent is the newest
    /// task of the thread that `parent` started, served with a standard preamble built from keel's rows
    /// (never a native resume), its model resolved from its own assignee. Follow-ups of one thread run
    /// one after another, each against the previous one, so each has a distinct parent.
    ///
    /// # Delivery
    /// Local cast from the host (API, or a worker relaying a user's message). Not idempotent: each is a
    /// new follow-up. Refused (a logged decision) when `parent` is not a task of this run, when the run
    /// is no longer running, when `task` names a task that exists, or past the step bound.
    FollowUp(FollowUpRequest),
    /// An operator cancels the run. A run whose own work is all done (reopened for a follow-up)
    /// ends only its open follow-ups and ends again with a synthesis: its outcome is never
    /// replaced by a cancel.
    ///
    /// # Delivery
    /// Local cast from the host. Idempotent; ignored once the run is terminal.
    Cancel {
        /// Why, one line.
        reason: String,
    },
    /// A human answered an escalation of one of the run's tasks; the host made the answer durable
    /// (the escalation's resolution and the task's steering row) before it sends this. A task that
    /// waits for it starts its next attempt.
    ///
    /// # Delivery
    /// Local cast from the host. Idempotent: a task that no longer waits for it is left alone.
    EscalationAnswered {
        /// The escalation.
        escalation: keel_store::EscalationId,
        /// Its task.
        task: TaskId,
    },
    /// An operator cancels one task's step (a follow-up, most often; `keel cancel TASK`): its
    /// attempt stops and its task ends `Cancelled`; the run goes on.
    ///
    /// # Delivery
    /// Local cast from the host. Idempotent; ignored (a logged decision) for a task that is not an
    /// open step of this run, or once the run is terminal.
    CancelTask {
        /// The task (any task of the step's re-dispatch chain, or a queued follow-up's id).
        task: TaskId,
        /// Why, one line.
        reason: String,
    },
}

/// What a specialist tells its coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpecialistReply {
    /// New session log rows, numbered per attempt from 1 (duplicates and gaps are tolerated: the
    /// coordinator keeps rows with a number above the last one it staged).
    ///
    /// # Delivery
    /// Remote cast, never resent: a lost row is lost (the resume preamble only needs the recent ones);
    /// a duplicate is dropped by its number; rows of a superseded attempt are dropped.
    Logs {
        /// `(seq, row)` pairs in order, at most [`crate::specialist::LOG_ROWS_PER_REPLY_MAX`].
        rows: Vec<(u32, SessionLogRow)>,
    },
    /// Cumulative spend of the attempt so far (a budget trip inside a child is seen from this).
    ///
    /// # Delivery
    /// Remote cast; cumulative, so a lost one is covered by the next and a stale one is ignored.
    Spend {
        /// Micro-dollars spent so far by this attempt.
        spent_micros: u64,
    },
    /// The attempt's result.
    ///
    /// # Delivery
    /// Remote cast, resent on a timer until [`SpecialistMsg::Ack`] (bounded by
    /// `SpecialistConfig::resends_max`); accepted at most once, and only from the current attempt.
    Finished(AttemptResult),
    /// A lead agent's delegation calls of one turn (run in parallel; turns run in sequence).
    ///
    /// # Delivery
    /// Remote cast; a repeated turn number is a duplicate and is answered again, not run again.
    Delegate {
        /// The lead's turn number, from 1; a repeated turn is a duplicate.
        turn: u32,
        /// The calls.
        calls: Vec<DelegationCall>,
    },
    /// A tool call of the attempt's session (`get_task_details`, `report_progress`,
    /// `report_findings`, `escalate`; `delegate` travels as [`SpecialistReply::Delegate`]).
    ///
    /// # Delivery
    /// Remote cast, not resent by the specialist (the session's own call times out instead); a repeated
    /// `call_id` of one attempt is a duplicate: answered again, never done twice. Answered with
    /// [`SpecialistMsg::ToolAnswer`], after the writes it asks for are durable.
    Tool {
        /// The call's id, unique within the attempt.
        call_id: String,
        /// What the session asks.
        request: crate::session_tool::SessionRequest,
    },
}

/// Messages to a specialist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpecialistMsg {
    /// Its result is durable: stop resending and exit.
    ///
    /// # Delivery
    /// Remote cast from the coordinator; sent again for every duplicate `Finished`, so a lost ack heals.
    Ack,
    /// The outcomes of a lead's delegation turn, in call order (answer to `SpecialistReply::Delegate`).
    ///
    /// # Delivery
    /// Remote cast from the coordinator; resent for a repeated `Delegate` of the same turn, so the
    /// specialist ignores a turn it has already answered.
    Delegated {
        /// The turn answered.
        turn: u32,
        /// `(call_id, outcome)` per call.
        results: Vec<(String, crate::report::StepOutcome)>,
    },
    /// The answer to a session's tool call ([`SpecialistReply::Tool`]).
    ///
    /// # Delivery
    /// Remote cast from the coordinator, once the writes the call asked for are durable; sent again for
    /// a repeated call, so the specialist ignores an answer for a call it is not waiting for.
    ToolAnswer {
        /// The call answered.
        call_id: String,
        /// The answer.
        answer: crate::session_tool::SessionAnswer,
    },
    /// Stop now (deadline, budget trip, run cancelled, superseded attempt).
    ///
    /// # Delivery
    /// Remote cast from the coordinator or supervisor; idempotent.
    Cancel {
        /// Why, one line.
        reason: String,
    },
}

/// Messages to the supervisor (one per node group).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupervisorMsg {
    /// Open (or re-open after recovery) a run's ledger.
    ///
    /// # Delivery
    /// Local cast from a coordinator. Idempotent: re-opening keeps the ledger's settled spend if it is
    /// higher than the given one.
    OpenRun {
        /// The run.
        run: RunId,
        /// Its budget as last made durable.
        budget: Budget,
    },
    /// Admit or refuse one attempt.
    ///
    /// # Delivery
    /// Local call; answered with exactly one [`CoordinatorMsg::Admission`]. Idempotent per attempt.
    Admit(Box<SpawnRequest>),
    /// Cumulative spend of a live attempt.
    ///
    /// # Delivery
    /// Local cast, forwarded by the coordinator; stale values (lower than known) are ignored.
    Spend {
        /// The attempt.
        attempt: AttemptId,
        /// Micro-dollars spent so far.
        spent_micros: u64,
    },
    /// An attempt ended: release its slot, settle its reservation, and for a failure decide.
    ///
    /// # Delivery
    /// Local call for a failure (answered with [`CoordinatorMsg::Verdict`]), cast for a success.
    /// Idempotent per attempt: a second settle of the same attempt is ignored.
    Settle {
        /// The attempt.
        attempt: AttemptId,
        /// Final spend.
        spent_micros: u64,
        /// `Ok` for a durable report, `Err` for a failure.
        outcome: Result<(), SubtaskFailure>,
    },
    /// A specialist died (its task was killed or panicked, or its node went away).
    ///
    /// # Delivery
    /// Local cast from the host. Ignored for attempts already settled.
    SpecialistDown {
        /// The attempt.
        attempt: AttemptId,
        /// What the host saw.
        reason: String,
        /// Whether its host panicked (keel's adapter or the harness broke): counted as its harness
        /// failing, so repeated panics cool the harness down and reroute its work. A lost node, a
        /// stop or a spawn that could not happen is not the harness's failure.
        panicked: bool,
    },
    /// Stop every live attempt of a run (cancel, budget outcome, synthesis done) and drop its ledger.
    ///
    /// # Delivery
    /// Local cast. Idempotent.
    CloseRun {
        /// The run.
        run: RunId,
    },
}

/// Messages to the checkpoint actor (one per coordinator node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointMsg {
    /// Make these writes durable, atomically, then acknowledge.
    ///
    /// # Delivery
    /// Local call from a coordinator; answered with exactly one [`CoordinatorMsg::Durable`] or
    /// [`CoordinatorMsg::PersistFailed`] carrying the ticket. Stages of one run commit in the order
    /// they were sent.
    Stage(Stage),
    /// Several stages of one coordinator decision (every stage one input of the coordinator staged),
    /// in ticket order: the writer queues them all before it starts a commit, so the writes of one
    /// decision (a run's creation and its first dispatch of N steps) go into one group commit rather
    /// than one commit for the first stage and another for the rest.
    ///
    /// # Delivery
    /// As [`CheckpointMsg::Stage`], once per stage.
    Stages(Vec<Stage>),
    /// Stages that may ride with a later commit (docs/DESIGN.md §4, riding stages): no consequence
    /// waits on them soon (log rows, admission records, decision rows, a result while others of its
    /// batch are still running), so the writer commits them with the next commit another stage
    /// needs, or once they have waited its linger bound, whichever comes first. A stage is still
    /// answered only once it is durable, and a run's stages still commit in ticket order.
    ///
    /// # Delivery
    /// As [`CheckpointMsg::Stage`], once per stage.
    Riding(Vec<Stage>),
}

/// A coordinator's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CoordinatorTimer {
    /// Ask for admission of a step again (after a retryable refusal) or dispatch a retry (after a
    /// verdict's backoff).
    Redispatch {
        /// The plan step index.
        step: u32,
        /// Which attempt the timer was set for; stale timers are ignored.
        generation: u32,
    },
    /// A stage failed; stage it again.
    Restage {
        /// The ticket.
        ticket: u64,
    },
}

/// The supervisor's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SupervisorTimer {
    /// The per-subtask deadline of an attempt.
    Deadline(AttemptId),
}

/// The checkpoint's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CheckpointTimer {
    /// Retry a failed commit.
    RetryCommit(CommitId),
    /// Riding stages have waited their linger bound: commit them (the number tells a stale timer).
    Linger(u64),
}

/// A specialist's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SpecialistTimer {
    /// Resend the unacknowledged result (the number of resends so far).
    ResendResult(u32),
}

/// The rows a restarted coordinator node loads for one non-terminal run. The host reads them through
/// the run's scope and hands them over as [`CoordinatorInput::Recovered`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveredRun {
    /// The run row.
    pub run: Run,
    /// The run's checkpoint, if one was written (it carries the coordinator's snapshot).
    pub checkpoint: Option<Checkpoint>,
    /// Every task row of the run.
    pub tasks: Vec<Task>,
    /// Every idempotency record of the run.
    pub idempotency: Vec<IdempotencyRecord>,
    /// The run's open escalations that pause a task: such a task waits for its answer instead of
    /// running again.
    pub escalations: Vec<keel_store::Escalation>,
}

/// Everything that can happen to a coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorInput {
    /// A message.
    Msg(CoordinatorMsg),
    /// Several messages of one sender from one of its steps (a specialist's log rows and its
    /// result; the supervisor's answers to a dispatch's admissions; any machine's consecutive
    /// messages to one run), handled in order exactly as if each came alone, in one input: one
    /// mailbox message and one message of stages to the checkpoint writer instead of one each.
    ///
    /// # Delivery
    /// Local only (a host batches what one machine it hosts sent at once); never on the wire.
    Msgs(Vec<CoordinatorMsg>),
    /// A timer it set fired.
    Timer(CoordinatorTimer),
    /// The node restarted: rebuild from these rows and continue without re-running acknowledged work.
    Recovered(Box<RecoveredRun>),
    /// A run that no coordinator hosts (it ended, or it is paused) takes a follow-up: rebuild from
    /// these rows exactly as [`CoordinatorInput::Recovered`] does and queue the follow-up before
    /// anything moves, so a finished run does not end again before it has it. The host marks the run
    /// running again (durably) before it sends this; rows of a terminal run are refused as
    /// `Recovered` refuses them. The run ends again, with a synthesis over every step (the follow-up
    /// included), once the follow-up and anything left of the run are done.
    Reopened {
        /// The run's rows, as for a recovery.
        rows: Box<RecoveredRun>,
        /// The follow-up to queue.
        follow_up: FollowUpRequest,
    },
}

impl CoordinatorInput {
    /// One step's messages as one input: a lone message as itself, several as
    /// [`CoordinatorInput::Msgs`], none as nothing.
    pub fn batch(mut msgs: Vec<CoordinatorMsg>) -> Option<Self> {
        match msgs.len() {
            0 | 1 => msgs.pop().map(Self::Msg),
            _ => Some(Self::Msgs(msgs)),
        }
    }
}

/// Most bytes of a follow-up message: the task's rendered brief (the message, its goal, the run's
/// constraints and the report instruction) must stay under the store's 64 KiB brief limit.
pub const FOLLOW_UP_BYTES_MAX: usize = 32 * 1024;

/// A follow-up as a host asks for it: sent to a running coordinator as [`CoordinatorMsg::FollowUp`],
/// or with a reopened run's rows as [`CoordinatorInput::Reopened`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUpRequest {
    /// The task the thread started from.
    pub parent: TaskId,
    /// The follow-up message, verbatim (cut to [`FOLLOW_UP_BYTES_MAX`]).
    pub brief: String,
    /// The agent to ask for; `None` lets the supervisor pick.
    pub agent: Option<String>,
    /// The id the follow-up's task takes, chosen by the host so it can find the task afterwards;
    /// `None` lets the coordinator mint one.
    pub task: Option<TaskId>,
}

/// Everything that can happen to a supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupervisorInput {
    /// A message.
    Msg(SupervisorMsg),
    /// The messages one coordinator step sent (a dispatch's admissions), handled in order as if
    /// each came alone, in one input; the answers to the coordinator are emitted before the other
    /// effects (spawns, stops, timers), so a host delivers them as one coordinator input.
    ///
    /// # Delivery
    /// Local only (a host batches what one coordinator step sent); never on the wire.
    Msgs(Vec<SupervisorMsg>),
    /// A timer it set fired.
    Timer(SupervisorTimer),
}

impl SupervisorInput {
    /// One step's messages as one input: a lone message as itself, several as
    /// [`SupervisorInput::Msgs`], none as nothing.
    pub fn batch(mut msgs: Vec<SupervisorMsg>) -> Option<Self> {
        match msgs.len() {
            0 | 1 => msgs.pop().map(Self::Msg),
            _ => Some(Self::Msgs(msgs)),
        }
    }
}

/// Everything that can happen to the checkpoint machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointInput {
    /// A message.
    Msg(CheckpointMsg),
    /// Completion of [`crate::Effect::Persist`]: the batch's transaction committed durably.
    Committed(CommitId),
    /// Completion of [`crate::Effect::Persist`]: the transaction failed and nothing of it was written.
    CommitFailed {
        /// The batch.
        id: CommitId,
        /// Why, one line.
        error: String,
    },
    /// Completion of [`crate::Effect::Persist`]: the store refused a write of `run` (a limit it
    /// passed, a row it cannot apply) and nothing of the batch was written. The failure is
    /// permanent and `run`'s alone: its stages are answered with the failure, and the other runs'
    /// stages of the batch are committed again at once, without a retry's backoff.
    Refused {
        /// The batch.
        id: CommitId,
        /// The run whose write was refused.
        run: keel_store::RunId,
        /// Why, one line.
        error: String,
    },
    /// A timer it set fired.
    Timer(CheckpointTimer),
    /// The host stopped every run (the node paused by itself: a full disk): answer every stage
    /// waiting for a commit or in flight with `reason` as a failure and go idle, so nothing decided
    /// before the pause is written after the runs are taken up again.
    ///
    /// # Delivery
    /// Local, from the host, at most once per pause. A completion of the abandoned commit that
    /// arrives later is ignored (its id is no longer waited for).
    Abandon {
        /// Why, one line.
        reason: String,
    },
}

/// What a specialist asks its host to load before it starts its session: the rows its preamble is built
/// from. The host fills a [`crate::context::RowSet`] with [`crate::specialist::context_rows`] over its
/// store (any [`crate::context::ThreadSource`]) and answers with `SpecialistInput::ContextLoaded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextRequest {
    /// The task the new session is for.
    pub task: TaskId,
    /// How the session starts: the standard or the resume preamble.
    pub start: Continuity,
}

/// Everything that can happen to a specialist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecialistInput {
    /// The host spawned it: begin (load context if needed, then start the session).
    Begin,
    /// A message.
    Msg(SpecialistMsg),
    /// Completion of [`crate::SpecialistEffect::LoadContext`]; `Err` carries why the rows could not be
    /// read (the attempt then fails as a transient system failure).
    ContextLoaded(Result<crate::context::RowSet, String>),
    /// An event of its harness session (completion stream of
    /// [`crate::SpecialistEffect::StartHarness`]); `Finished` or `Failed` ends the session.
    Harness(HarnessEvent),
    /// A tool call of its session, from the host's MCP endpoint; answered with
    /// [`crate::SpecialistEffect::AnswerTool`] (always: a call of an ended session is refused).
    ToolCall(crate::session_tool::SessionToolCall),
    /// A secret the host minted for its session (the MCP endpoint's bearer token), delivered before
    /// any event of that session: registered with its scrubber, so a session that echoes it leaves
    /// it in no row, answer or preamble (issue 16).
    SessionSecret(SessionSecret),
    /// A timer it set fired.
    Timer(SpecialistTimer),
}

/// A secret a host minted for one session. Its `Debug` never shows the value (inputs are traced).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSecret(pub String);

impl std::fmt::Debug for SessionSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionSecret(..)")
    }
}

/// Something a run did that an operator or embedding host may want to hear about (docs/DESIGN.md §8).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LifecycleEvent {
    /// A specialist invocation started (once per attempt).
    SubagentStart {
        /// The attempt.
        attempt: AttemptId,
    },
    /// A specialist completed normally with a report.
    SubagentStop {
        /// The attempt.
        attempt: AttemptId,
    },
    /// A specialist failed or was cancelled.
    SubagentError {
        /// The attempt.
        attempt: AttemptId,
        /// What kind of failure (its stable name is [`crate::report::FailureKind::name`]).
        kind: crate::report::FailureKind,
    },
    /// A run reached a terminal state (its row is durable).
    RunFinished(RunOutcome),
}

/// How a run ended: what its coordinator emits once the run's terminal row is durable, and what a
/// host hands to whoever waits for the run (the runtime's `RunHandle::finished`, its `Finished`
/// event, the simulator's checker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The run.
    pub run: RunId,
    /// Its terminal status (durable).
    pub status: keel_store::RunStatus,
    /// The outcome text (the synthesis as JSON for a completed run, else the reason).
    pub outcome: String,
}

/// When the supervisor spawns a specialist, everything the host needs to create and begin it
/// (serde: a cluster node carries it to the worker that hosts the attempt).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecialistStart {
    /// The attempt (the specialist's identity).
    pub attempt: AttemptId,
    /// Its only address: the coordinator's reply port for this attempt.
    pub reply_to: crate::ids::ReplyTo<crate::ids::Coordinator>,
    /// What it is given.
    pub brief: SubtaskBrief,
    /// Who runs it.
    pub assignment: Assignment,
    /// How its session gets continuity.
    pub continuity: Continuity,
    /// Why the task exists.
    pub kind: TaskKind,
    /// The per-subtask deadline (the supervisor enforces it; the session limits mirror it).
    pub deadline_at: Millis,
    /// The task the attempt belongs to (same as `attempt.task`, for hosts that index by task).
    pub task: TaskId,
}
