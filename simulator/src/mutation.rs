//! Deliberate defects the simulator's host can inject, one per invariant check, so a test can show
//! that the checker catches what it claims (issue 10): with a mutation set, the world breaks exactly one
//! invariant on purpose and the checker must name that invariant, with the seed.
//!
//! Every mutation is compiled always and off by default ([`crate::WorldConfig::mutation`] is `None`);
//! only tests set one. They act in the host (what the world does with an effect, what its harness
//! sessions emit, how it builds the node's machines), never inside the machines of `keel-actors`.

use std::sync::atomic::{AtomicU64, Ordering};

/// One deliberate defect of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// Invariant 1: the host answers a commit as durable without writing it, so the coordinator
    /// acknowledges results that a crash would lose (acknowledge before durable).
    AckBeforeDurable,
    /// Invariant 1 (tasks): the host drops the writes that make a failed, escalated or cancelled
    /// task terminal, so the run ends while one of its tasks stays open.
    LoseTaskEnd,
    /// Invariant 2: the host starts a harness session twice for one idempotency key.
    StartSessionTwice,
    /// Invariant 2: the host's recovery read hands a restarted coordinator the tasks whose reports
    /// were accepted as still running (their done-markers lost), so such a step runs, and is
    /// accepted, again.
    ForgetDoneMarkers,
    /// Invariant 3: the host's harness answers every tool_use twice.
    AnswerToolUseTwice,
    /// Invariant 3: the host's harness calls one more tool just before it finishes and never
    /// answers it.
    LeaveToolUseUnanswered,
    /// Invariant 4: the host puts the planted secret into a session's prompt.
    LeakSecretIntoPrompt,
    /// Invariant 4: the host drops a line of the brief from a session's prompt.
    CutBriefLine,
    /// Invariant 4: the host pads a session's preamble far past its cap.
    InflatePreamble,
    /// Invariant 4: the host starts a resumed attempt's session without its resume preamble, as if
    /// it were a fresh start.
    ResumeAsFresh,
    /// Invariant 4: the host puts a resume preamble into a fresh attempt's prompt.
    PreambleForFresh,
    /// Invariant 4: the host puts a line before the slash skill line a prompt opens with.
    SlashLineNotFirst,
    /// Invariant 5: the host passes a native resume flag in a session's environment.
    PassResumeFlag,
    /// Invariant 6: a derived task (follow-up, review, re-dispatch) runs on its parent's model
    /// instead of its assignee's.
    InheritParentModel,
    /// Invariant 7: the host routes a specialist's reply through another live specialist's address.
    ReplyAsSibling,
    /// Invariant 8: the host builds the supervisor with ten times the configured concurrency limit.
    ExceedConcurrency,
    /// Invariant 8: the host builds the supervisor with a spawn rate a hundred times the configured
    /// one.
    LooseSpawnRate,
    /// Invariant 8: the host builds the supervisor with a nesting depth limit eight levels above
    /// the configured one.
    LooseDepth,
    /// Invariant 8: the host opens each run's budget ledger at the supervisor with a hundred times
    /// the run's limit.
    LooseBudget,
    /// Invariant 8: the host loses a run's budget trip on its way to the coordinator and rebuilds the
    /// run's ledger at the supervisor without the trip (as a restarted supervisor that forgot it
    /// would), so the coordinator goes on dispatching and the supervisor admits after the trip.
    ForgetBudgetTrip,
    /// Invariant 9: the host writes a task row under another run's id.
    WriteAnotherRunsRow,
    /// Invariant 9: the host's context read hands a specialist a task row of another run.
    ReadAnotherRunsScope,
    /// Invariant 10: the host turns a failed attempt's result into an empty success.
    ReportEmptySuccess,
    /// Invariant 13: the host's pause marks the run and its open tasks cancelled instead of paused,
    /// so the restart does not resume it.
    PauseCancelsRun,
    /// Invariant 14: the host cancels a run it hosts as if no coordinator had it (in the store only),
    /// and its coordinator goes on dispatching.
    CancelAsIfNotHosted,
    /// Invariant 15: the host reopens an ended run for a follow-up (marks it running) but rebuilds no
    /// coordinator for it.
    ReopenWithoutCoordinator,
    /// Invariant 16: the host carries out a cancel of a run that has ended (a stale request, as a
    /// leftover control file was, issue 17): it writes the run cancelled over its outcome.
    CancelEndedRun,
    /// Invariant 17: the host's recovery read hands a restarted coordinator a checkpoint whose every
    /// step counts each attempt it started as failed (as keel counted before issue 17), so pauses
    /// and crashes use up a step's retries.
    CountInterruptedAttempts,
    /// Invariant 1: the host announces a follow-up's id as soon as it hands the follow-up to the
    /// coordinator, before it is durable, so a crash right after the announcement loses it.
    AnnounceFollowUpBeforeDurable,
    /// Invariant 18: the network cuts the last byte off every frame it carries between nodes.
    TruncateFrame,
    /// Invariant 19 (issue 12): the workers advertise every harness in their heartbeats, installed
    /// or not, so the coordinator node's membership places attempts on workers that cannot run them.
    AdvertiseAllHarnesses,
    /// Invariant 20 (issue 12): the coordinator node never ticks its membership, so a crashed
    /// worker's lease never expires and its attempts are never reported down.
    NeverExpireLeases,
    /// Invariant 1 (issue 11): the host's commits drop the findings a task row carries, so a
    /// session told its `report_findings` call is recorded finds them gone.
    LoseReportedFindings,
    /// Invariant 2 (issue 11): the host's MCP endpoint takes a retried `delegate` request for a new
    /// call (a fresh call id), so the lead's subtasks are delegated, and run, twice.
    RedeliverDelegateAsNew,
    /// Invariant 9 (issue 11): the host's MCP endpoint resolves a session's token to a live session
    /// of another run and delivers its calls there.
    TokenOfAnotherRun,
    /// Invariant 12 (issue 13): the host's hook bridge lets a tool run before its decision's audit
    /// rows are durable (and writes them after).
    RunToolBeforeAudit,
    /// Invariant 12 (issue 13): the host's hook bridge takes a mandatory hook's error or timeout
    /// for no opinion, so the chain lets the call run.
    MandatoryHookErrorAllows,
    /// Invariant 12 (issue 13): the host's hook bridge takes an `ask` for an allow: the call runs
    /// with no human's approval.
    RunAskWithoutApproval,
    /// Invariant 12 (issue 13): the host's hook bridge takes a human's refusal, or an ask nobody
    /// answered, for an approval, and lets the call run.
    RunRefusedAsk,
    /// Invariant 11: the host keeps state across worlds in one process (a process-wide counter that
    /// shifts a timer), so the same seed gives another trace the second time.
    LeakProcessState,
}

/// The process-wide counter of [`Mutation::LeakProcessState`]: the one piece of state that outlives
/// a world, on purpose.
static LEAKED_WORLDS: AtomicU64 = AtomicU64::new(0);

/// For [`Mutation::LeakProcessState`]: how many worlds this process built before this one.
pub(crate) fn leaked_world_count() -> u64 {
    LEAKED_WORLDS.fetch_add(1, Ordering::Relaxed)
}
