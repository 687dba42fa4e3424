//! The coordinator: one per run, the hub (docs/DESIGN.md §4, §8).
//!
//! It owns the plan and every decision: it validates a fixed plan (or hosts a lead agent's delegation
//! turns), dispatches independent steps together and dependent ones in order, gives each specialist only
//! what its brief needs, accepts a typed report only after it is durable, treats a failure as a failure,
//! asks the supervisor what to do after one, retries only what failed, annotates partial coverage, and
//! ends with a synthesis. Every decision is a session_log row on the run's root task, so a run can be
//! explained afterwards. Its state is rebuilt after a crash from the rows the store returns
//! ([`CoordinatorInput::Recovered`]); acknowledged work is never run again.

mod cancel;
mod follow_up;
mod lead;
mod lifecycle;
mod outcome;
mod recovery;
mod session_tools;
mod snapshot;
mod staging;
mod step;
mod synthesis;

pub use snapshot::{Snapshot, StepSnapshot};
pub use staging::{STAGE_OPS_MIN, StageRefusal};
pub use synthesis::{
    Conflict, Coverage, CoverageStatus, SYNTHESIS_CLAIM_BYTES_MAX, SYNTHESIS_CONFLICTS_MAX,
    SYNTHESIS_FINDINGS_MAX, StepEnd, Synthesis, coverage_of, find_conflicts, synthesize,
};

use crate::effect::{Effect, Envelope, TimerKey};
use crate::ids::AttemptId;
use crate::machine::{Entropy, Machine, Millis};
use crate::message::{
    CoordinatorInput, CoordinatorMsg, CoordinatorTimer, SpecialistMsg, SupervisorMsg,
};
use crate::report::{StepOutcome, bounded};
use keel_store::{LogKind, Run, RunId, RunStatus, SessionLogRow, Task, TaskId};
use lead::Lead;
use serde::{Deserialize, Serialize};
use session_tools::SessionTools;
use staging::{Pending, Then, coalesce_stages};
use std::collections::{BTreeMap, BTreeSet};
use step::Step;

/// The version of the snapshot kept in `Checkpoint::state`.
pub const SNAPSHOT_VERSION: u8 = 1;

/// Most stale attempts whose late results are logged (beyond it they are still refused, silently).
pub const STALE_LOGGED_MAX: usize = 1024;

/// The key of the lead agent's step in lead mode.
pub const LEAD_STEP_KEY: &str = "lead";

/// Limits of one coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    /// Most attempts one step may get (across re-dispatches) before it is parked in the dead-letter
    /// table.
    pub attempts_per_step_max: u32,
    /// Most times a failed stage is sent again before the run gives up on the store.
    pub restages_max: u32,
    /// Wait between restages.
    pub restage_backoff_ms: Millis,
    /// Most delegation turns of a lead.
    pub delegation_turns_max: u32,
    /// Most calls in one delegation turn.
    pub delegation_calls_max: u32,
    /// Nesting depth of the run's root task (0 for a top-level run).
    pub root_depth: u8,
    /// Reservation per step when the plan gives none, in micro-dollars.
    pub default_estimate_micros: u64,
    /// Most ops in one stage (kept within [`STAGE_OPS_MIN`] and [`crate::persist::STAGE_OPS_MAX`]):
    /// a decision's writes never exceed it; a run's end that would is split (see
    /// [`StageRefusal`] for what is refused instead).
    pub stage_ops_max: usize,
    /// The store's limits, which bound what the coordinator writes (a run's brief, its outcome, a
    /// dead letter's payload) so a write is cut where the store would refuse it, never refused.
    pub store_limits: keel_store::Limits,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            attempts_per_step_max: 5,
            restages_max: 8,
            restage_backoff_ms: 500,
            delegation_turns_max: 16,
            delegation_calls_max: 16,
            root_depth: 0,
            default_estimate_micros: 0,
            stage_ops_max: crate::persist::STAGE_OPS_MAX,
            store_limits: keel_store::Limits::default(),
        }
    }
}

/// Where a step stands in memory. The durable truth is the task row; this is the working copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepStatus {
    /// Not dispatched yet (its batch or turn has not come).
    Waiting,
    /// Its attempt's task row (the attempt number and its idempotency key) is being made durable.
    Recording,
    /// Asked the supervisor for admission.
    Admitting,
    /// A specialist is working on it.
    Running,
    /// Failed; waiting for the supervisor's verdict.
    AwaitingVerdict,
    /// Waiting for a timer (a retryable refusal or a verdict's backoff).
    Backoff,
    /// Its result is being made durable.
    Committing,
    /// Its outcome is durable (report, parked failure, or skipped).
    Done,
    /// Its session escalated to a human (`escalate`): the task is paused until the answer, then its
    /// next attempt starts with the answer in its preamble.
    AwaitingHuman,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    Finishing,
    Done(RunStatus),
}

#[derive(Debug)]
struct RunState {
    /// The coordinator's limits.
    config: CoordinatorConfig,
    id: RunId,
    row: Run,
    root: Task,
    steps: Vec<Step>,
    batches: Vec<Vec<usize>>,
    /// How many leading steps come from the run's plan (their specs are not repeated in checkpoints).
    plan_len: usize,
    batch: usize,
    lead: Option<Lead>,
    constraints: Vec<String>,
    tasks: BTreeMap<TaskId, Task>,
    by_task: BTreeMap<TaskId, usize>,
    next_ticket: u64,
    pending: BTreeMap<u64, Pending>,
    /// The newest stage sent in this input that wants the run's checkpoint (`staging.rs`).
    checkpoint_due: Option<u64>,
    decisions: Vec<SessionLogRow>,
    /// Task ids minted for the first attempts of a batch being dispatched, already named in the
    /// batch's decision row (so each attempt writes no row of its own); emptied by the dispatch.
    announced: BTreeMap<usize, TaskId>,
    stale_logged: BTreeSet<AttemptId>,
    phase: Phase,
    /// Its sessions' tool calls (session_tools.rs).
    tools: SessionTools,
}

/// The coordinator of one run. Build it with [`Coordinator::new`], then feed it either
/// `CoordinatorMsg::Accept` (a new run) or `CoordinatorInput::Recovered` (after a restart).
#[derive(Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    run: Option<RunState>,
}

impl Coordinator {
    /// A coordinator waiting for its run.
    pub fn new(config: CoordinatorConfig) -> Self {
        Self { config, run: None }
    }

    /// The run, once accepted or recovered.
    pub fn run_id(&self) -> Option<RunId> {
        self.run.as_ref().map(|r| r.id)
    }

    /// The run's status as this coordinator sees it (`None` before a run arrives).
    pub fn status(&self) -> Option<RunStatus> {
        self.run.as_ref().map(|r| match r.phase {
            Phase::Done(s) => s,
            _ => RunStatus::Running,
        })
    }

    /// Whether the run reached a terminal state (durably, or after giving up on the store).
    pub fn is_terminal(&self) -> bool {
        self.run
            .as_ref()
            .is_some_and(|r| matches!(r.phase, Phase::Done(_)))
    }

    /// Each step's key, status and durable outcome, in step order (for tests and invariant checks).
    pub fn steps(&self) -> Vec<(String, StepStatus, Option<StepOutcome>)> {
        self.run.as_ref().map_or_else(Vec::new, |r| {
            r.steps
                .iter()
                .map(|s| (s.spec.key.clone(), s.status, s.outcome.clone()))
                .collect()
        })
    }

    /// The attempt whose result was accepted for each done step (for duplicate-acceptance checks).
    pub fn accepted_attempts(&self) -> Vec<(String, Option<AttemptId>)> {
        self.run.as_ref().map_or_else(Vec::new, |r| {
            r.steps
                .iter()
                .map(|s| (s.spec.key.clone(), s.accepted))
                .collect()
        })
    }

    /// The current attempt of each step that has one.
    pub fn current_attempts(&self) -> Vec<AttemptId> {
        self.run.as_ref().map_or_else(Vec::new, |r| {
            r.steps.iter().filter_map(|s| s.current(r.id)).collect()
        })
    }
}

fn decision_row(now: Millis, summary: impl std::fmt::Display) -> SessionLogRow {
    SessionLogRow {
        ts_ms: now,
        kind: LogKind::Lifecycle,
        // Written once, prefix and all (callers pass `format_args!`, not a `String` of their own).
        summary: bounded(format!("decision: {summary}"), 512),
        detail: String::new(),
        redactions: Vec::new(),
    }
}

impl RunState {
    /// A state with the run row and nothing else yet: a new run sets its root task, a recovery
    /// replaces the placeholder root with the one it finds.
    fn empty(config: CoordinatorConfig, row: Run, now: Millis) -> RunState {
        let root =
            lifecycle::root_task(TaskId(0), row.id, 0, row.brief.clone(), String::new(), now);
        RunState {
            config,
            id: row.id,
            row,
            root,
            steps: Vec::new(),
            batches: Vec::new(),
            plan_len: 0,
            batch: 0,
            lead: None,
            constraints: Vec::new(),
            tasks: BTreeMap::new(),
            by_task: BTreeMap::new(),
            next_ticket: 1,
            pending: BTreeMap::new(),
            checkpoint_due: None,
            decisions: Vec::new(),
            announced: BTreeMap::new(),
            stale_logged: BTreeSet::new(),
            phase: Phase::Running,
            tools: Default::default(),
        }
    }

    fn decide(&mut self, now: Millis, summary: impl std::fmt::Display) {
        self.decisions.push(decision_row(now, summary));
    }

    /// A decision with lines of detail (a batch's attempts, one line each).
    fn decide_detailed(&mut self, now: Millis, summary: impl std::fmt::Display, detail: String) {
        let mut row = decision_row(now, summary);
        row.detail = detail;
        self.decisions.push(row);
    }

    fn flush_decisions(&mut self, now: Millis, out: &mut Vec<Effect>) {
        if !self.decisions.is_empty() {
            // Decision rows explain the run; nothing waits on them: they ride with the next commit.
            self.stage_riding(Vec::new(), Then::Nothing, now, out);
        }
    }

    fn send(&self, msg: SupervisorMsg, out: &mut Vec<Effect>) {
        out.push(Effect::Send(Envelope::Supervisor(msg)));
    }

    fn to_specialist(&self, attempt: AttemptId, msg: SpecialistMsg, out: &mut Vec<Effect>) {
        out.push(Effect::Send(Envelope::Specialist { attempt, msg }));
    }

    fn timer(&self, timer: CoordinatorTimer, at: Millis, out: &mut Vec<Effect>) {
        out.push(Effect::SetTimer {
            key: TimerKey::Coordinator(self.id, timer),
            at,
        });
    }
}

/// A byte limit of the store as a length for [`bounded`].
fn bytes_max(limit: u64) -> usize {
    usize::try_from(limit).unwrap_or(usize::MAX)
}

fn one_line(text: &str) -> String {
    bounded(
        crate::context::collapse_whitespace(text, usize::MAX).into_owned(),
        200,
    )
}

impl Machine for Coordinator {
    type Input = CoordinatorInput;
    type Effect = Effect;

    fn handle(
        &mut self,
        input: CoordinatorInput,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let first = out.len();
        match &mut self.run {
            Some(run) => run.handle(input, now, rng, out),
            None => self.run = RunState::start(&self.config, input, now, rng, out),
        }
        if let Some(run) = self.run.as_mut() {
            run.flush_decisions(now, out);
            run.attach_checkpoint(now, &mut out[first..]);
        }
        coalesce_stages(out, first);
    }
}

impl RunState {
    /// The run an input starts: a new run (`Accept`) or one rebuilt from its rows (`Recovered`,
    /// `Reopened`). Any other input before a run has nothing to act on and is dropped.
    fn start(
        config: &CoordinatorConfig,
        input: CoordinatorInput,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) -> Option<RunState> {
        let config = config.clone();
        match input {
            CoordinatorInput::Msg(CoordinatorMsg::Accept(spec)) => {
                Some(RunState::accept(config, spec, now, rng, out))
            }
            CoordinatorInput::Recovered(rows) => {
                Some(RunState::recover(config, *rows, None, now, rng, out))
            }
            CoordinatorInput::Reopened { rows, follow_up } => Some(RunState::recover(
                config,
                *rows,
                Some(follow_up),
                now,
                rng,
                out,
            )),
            CoordinatorInput::Msg(_) | CoordinatorInput::Msgs(_) | CoordinatorInput::Timer(_) => {
                None
            }
        }
    }

    /// One input to a run that exists: dispatch it to the part of the coordinator that owns it.
    fn handle(
        &mut self,
        input: CoordinatorInput,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        match input {
            CoordinatorInput::Msgs(msgs) => {
                for msg in msgs {
                    self.handle(CoordinatorInput::Msg(msg), now, rng, out);
                }
            }
            CoordinatorInput::Msg(CoordinatorMsg::Accept(spec)) => {
                self.decide(
                    now,
                    format_args!("ignored a second Accept of run {}", spec.run),
                );
            }
            // A coordinator holds one run: rows for it once it has one are stale.
            CoordinatorInput::Recovered(_) | CoordinatorInput::Reopened { .. } => {}
            CoordinatorInput::Msg(CoordinatorMsg::Durable { ticket }) => {
                self.on_durable(ticket, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::PersistFailed {
                ticket,
                error,
                permanent,
            }) => {
                self.on_persist_failed(ticket, error, permanent, now, out);
            }
            CoordinatorInput::Timer(CoordinatorTimer::Restage { .. }) => {
                self.restage_held(out);
            }
            CoordinatorInput::Timer(CoordinatorTimer::Redispatch { step, generation }) => {
                self.on_redispatch_timer(step as usize, generation, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Admission { attempt, answer }) => {
                self.on_admission(attempt, answer, now, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Verdict { attempt, verdict }) => {
                self.on_verdict(attempt, verdict, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::AttemptLost {
                attempt,
                failure,
                verdict,
            }) => {
                self.on_attempt_lost(attempt, failure, verdict, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::BudgetTripped {
                committed_micros,
                limit_micros,
            }) => {
                let outcome = format!(
                    "budget exceeded: {committed_micros} micro-dollars committed of a limit of {limit_micros}"
                );
                self.finish_with(RunStatus::BudgetExceeded, outcome, now, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::FollowUp(request)) => {
                self.on_follow_up(request, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Cancel { reason }) => {
                self.on_cancel(reason, now, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::CancelTask { task, reason }) => {
                self.on_cancel_task(task, reason, now, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::EscalationAnswered { escalation, task }) => {
                self.on_escalation_answered(escalation, task, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Specialist { from, reply }) => {
                self.on_reply(from, reply, now, rng, out);
            }
        }
    }
}
