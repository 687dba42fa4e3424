//! What the checker saw, kept across crashes for the scenario tests: spawns, sessions, results,
//! acknowledgements, verdicts, log rows and the operator's interventions.

use std::collections::{BTreeMap, BTreeSet};

use keel_actors::{AttemptId, Continuity, Refusal, SubagentReport, Verdict};
use keel_store::{RunId, RunStatus, SessionLogRow, TaskId, TaskKind};

use crate::profile::HarnessBehaviour;

/// What was admitted for one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnObs {
    /// The run.
    pub run: RunId,
    /// The plan step.
    pub step: String,
    /// Why the task exists.
    pub kind: TaskKind,
    /// How its session gets continuity.
    pub continuity: Continuity,
    /// The agent it runs as.
    pub agent: String,
    /// The harness that runs it.
    pub harness: String,
    /// The model the supervisor resolved.
    pub model: String,
    /// The brief text as the coordinator gave it.
    pub brief: String,
}

/// One harness session start, as the world saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionObs {
    /// The attempt.
    pub attempt: AttemptId,
    /// Its spawn record, if the checker saw it (it always does: a specialist exists only by a spawn).
    pub step: String,
    /// The model the spec carries.
    pub model: String,
    /// The preamble kind found in the prompt (`standard`, `resume`), if any.
    pub preamble: Option<String>,
    /// Characters of the preamble.
    pub preamble_chars: usize,
    /// Characters of the whole prompt.
    pub prompt_chars: usize,
    /// Whether the preamble says something was cut to fit.
    pub preamble_truncated: bool,
    /// Lines of the preamble.
    pub preamble_lines: usize,
}

impl Observed {
    /// The accepted report of every step, with the task id blanked (ids are minted from the stream, so
    /// a crashed-and-recovered run names its tasks differently): what two runs compare.
    pub fn accepted_report_contents(&self) -> BTreeMap<(RunId, String), Vec<SubagentReport>> {
        let mut out = BTreeMap::new();
        for (key, attempts) in &self.accepted_reports {
            let reports = attempts
                .iter()
                .filter_map(|a| self.reports.get(a))
                .map(|r| SubagentReport {
                    subtask_id: TaskId(0),
                    ..r.clone()
                })
                .collect();
            out.insert(key.clone(), reports);
        }
        out
    }

    /// The sessions of one plan step, in start order.
    pub fn sessions_of(&self, step: &str) -> Vec<&SessionObs> {
        self.sessions.iter().filter(|s| s.step == step).collect()
    }
}

/// One delegation turn's answer as a lead's session got it: (call id, whether a report) per call.
pub type DelegationAnswer = Vec<(String, bool)>;

/// Everything the checker saw, for the scenario tests.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Spawns that reached a worker, by attempt.
    pub spawns: BTreeMap<AttemptId, SpawnObs>,
    /// Every harness session start, in order.
    pub sessions: Vec<SessionObs>,
    /// The scripted behaviour of each attempt's session.
    pub behaviours: BTreeMap<AttemptId, HarnessBehaviour>,
    /// What each attempt reported last: `true` for a report, `false` for a failure.
    pub results: BTreeMap<AttemptId, bool>,
    /// Reports sent by attempts, by attempt.
    pub reports: BTreeMap<AttemptId, SubagentReport>,
    /// Attempts a coordinator acknowledged.
    pub acked: BTreeSet<AttemptId>,
    /// Attempts acknowledged while their task waited paused for a human's answer to their
    /// escalation: settled, never accepted (their step's next attempt carries it on).
    pub acked_escalated: BTreeSet<AttemptId>,
    /// Per (run, plan step), the attempts whose *report* (not failure) was acknowledged. A re-dispatch
    /// is a new task of the same step, so "accepted once" is counted per step.
    pub accepted_reports: BTreeMap<(RunId, String), BTreeSet<AttemptId>>,
    /// Results delivered to a coordinator from an attempt that was not the accepted one of its task,
    /// after another attempt's report had been accepted (late duplicates).
    pub late_results: Vec<AttemptId>,
    /// Run-finished events, by run (last one wins).
    pub run_finished: BTreeMap<RunId, (RunStatus, String)>,
    /// Admissions that were refused, with the reason.
    pub refusals: Vec<(AttemptId, Refusal)>,
    /// Admissions granted.
    pub admissions: u64,
    /// Specialists the coordinator node asked to stop.
    pub stops: Vec<AttemptId>,
    /// Verdicts about failed attempts (from `Verdict` and `AttemptLost`).
    pub verdicts: Vec<(AttemptId, Verdict)>,
    /// Attempts the supervisor gave up on (deadline or node down).
    pub lost: Vec<AttemptId>,
    /// Runs whose budget tripped.
    pub budget_trips: Vec<RunId>,
    /// Specs that carried a native resume marker (must stay 0).
    pub native_resume_calls: u64,
    /// Idempotency keys of started sessions.
    pub keys_started: BTreeMap<String, AttemptId>,
    /// How often the coordinator node crashed.
    pub coordinator_crashes: u32,
    /// Session log rows each attempt sent, by its own sequence number.
    pub logs: BTreeMap<AttemptId, BTreeMap<u32, SessionLogRow>>,
    /// Admissions granted while a run's budget had tripped.
    pub admissions_after_trip: u64,
    /// Every task row a checkpoint commit created: (kind, parent), by task.
    pub tasks_created: BTreeMap<TaskId, (TaskKind, Option<TaskId>)>,
    /// Commits made on a full disk: (event, whether the store answered `DiskFull`, whether the disk
    /// synced during the commit).
    pub full_disk_commits: Vec<(u64, bool, bool)>,
    /// Delegation turns leads asked: (attempt, turn, call ids), in order.
    pub delegations: Vec<(AttemptId, u32, Vec<String>)>,
    /// Delegation answers handed to leads' sessions: (attempt, turn, (call id, whether a report)).
    pub delegation_answers: Vec<(AttemptId, u32, DelegationAnswer)>,
    /// Runs whose cancel took effect, in order.
    pub cancels: Vec<RunId>,
    /// Runs reopened for a follow-up, in order.
    pub reopens: Vec<RunId>,
    /// Pauses of the coordinator node.
    pub pauses: u32,
    /// Operator requests the host's decision refused: (run, why).
    pub operator_refusals: Vec<(RunId, String)>,
    /// Step cancels that took effect: (run, step key), in order.
    pub step_cancels: Vec<(RunId, String)>,
    /// Follow-ups whose id was announced (durable by then): (run, task), in order.
    pub follow_ups_announced: Vec<(RunId, TaskId)>,
    /// Steps parked for a spent retry budget: (run, step key, failed attempts the checker saw).
    pub parked_for_retries: Vec<(RunId, String, usize)>,
    /// Calls of keel's tools the endpoint delivered to specialists, by tool (a duplicate delivery
    /// counted once; calls after their session's end under `late`).
    pub tool_calls: BTreeMap<&'static str, u64>,
    /// Calls the endpoint delivered a second time (as a retrying client sends them).
    pub tool_duplicates: u64,
    /// Answers specialists gave to those calls (to sessions still waiting or not).
    pub tool_answers: u64,
    /// Calls whose answer did not come before the endpoint's timeout.
    pub tool_timeouts: u64,
    /// Escalations a simulated human answered.
    pub escalations_answered: u64,
    /// What the hooks of gated tool calls answered, by kind (issue 13).
    pub hook_outcomes: BTreeMap<&'static str, u64>,
    /// Tool calls the policy gated.
    pub gated_calls: u64,
    /// Of those, the calls whose tool ran.
    pub gated_runs: u64,
}
