//! The coordinator: one per run, the hub (DESIGN.md §4, §8).
//!
//! It owns the plan and every decision: it validates a fixed plan (or hosts a lead agent's delegation
//! turns), dispatches independent steps together and dependent ones in order, gives each specialist only
//! what its brief needs, accepts a typed report only after it is durable, treats a failure as a failure,
//! asks the supervisor what to do after one, retries only what failed, annotates partial coverage, and
//! ends with a synthesis. Every decision is a session_log row on the run's root task, so a run can be
//! explained afterwards. Its state is rebuilt after a crash from the rows the store returns
//! ([`CoordinatorInput::Recovered`]); acknowledged work is never run again.

use crate::effect::{Effect, Envelope, TimerKey};
use crate::ids::{AttemptId, mint_task_id};
use crate::machine::{Entropy, Machine, Millis};
use crate::message::{
    Assignment, CheckpointMsg, CoordinatorInput, CoordinatorMsg, CoordinatorTimer, DelegationCall,
    FOLLOW_UP_BYTES_MAX, FollowUpRequest, LifecycleEvent, RecoveredRun, Refusal, RunMode, RunSpec,
    SpawnRequest, SpecialistMsg, SpecialistReply, SupervisorMsg, Verdict,
};
use crate::persist::{PersistOp, STAGE_OPS_MAX, Stage};
use crate::plan::{PLAN_STEPS_MAX, Plan, PlanStep, validate};
use crate::report::{
    AttemptResult, Continuity, FailureKind, PRIOR_FINDINGS_MAX, PriorFinding, ReportStatus,
    StepOutcome, SubagentReport, SubtaskBrief, SubtaskFailure, TEXT_BYTES_MAX, bounded,
};
use keel_store::{
    Budget, Checkpoint, DeadLetter, Escalation, EscalationTrigger, IdempotencyRecord, LogKind,
    ManifestEntry, ManifestOutcome, Run, RunId, RunStatus, SessionLogRow, Task, TaskId, TaskKind,
    TaskStatus,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The version of the snapshot kept in `Checkpoint::state`.
pub const SNAPSHOT_VERSION: u8 = 1;
/// Most findings a synthesis carries.
pub const SYNTHESIS_FINDINGS_MAX: usize = 256;
/// Most bytes of one claim in a synthesis.
pub const SYNTHESIS_CLAIM_BYTES_MAX: usize = 512;
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
        }
    }
}

/// Where a step stands in memory. The durable truth is the task row; this is the working copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepStatus {
    /// Not dispatched yet (its batch or turn has not come).
    Waiting,
    /// Its attempt's task row and idempotency record are being made durable.
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
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum BackoffNext {
    Readmit,
    NewAttempt { reroute: Option<String> },
}

#[derive(Clone, Debug)]
struct Step {
    spec: PlanStep,
    deps: Vec<usize>,
    task: Option<TaskId>,
    tasks: Vec<TaskId>,
    attempt: u32,
    attempts_total: u32,
    agent: Option<String>,
    continuity: Continuity,
    generation: u32,
    status: StepStatus,
    backoff: BackoffNext,
    outcome: Option<StepOutcome>,
    accepted: Option<AttemptId>,
    log_seq: u32,
    spent_micros: u64,
    assignment: Option<Assignment>,
    call_id: Option<String>,
    last_failure: Option<SubtaskFailure>,
    /// For a follow-up: the task whose thread it continues (its parent is that thread's newest task).
    thread: Option<TaskId>,
    /// For a follow-up: the id its task takes, when the host chose one.
    preset: Option<TaskId>,
    /// The kind of the last admission refusal logged for this step.
    last_refusal: Option<&'static str>,
}

impl Step {
    fn new(spec: PlanStep, deps: Vec<usize>) -> Self {
        Self {
            agent: spec.assignee.clone(),
            spec,
            deps,
            task: None,
            tasks: Vec::new(),
            attempt: 0,
            attempts_total: 0,
            continuity: Continuity::Fresh,
            generation: 0,
            status: StepStatus::Waiting,
            backoff: BackoffNext::Readmit,
            outcome: None,
            accepted: None,
            log_seq: 0,
            spent_micros: 0,
            assignment: None,
            call_id: None,
            last_failure: None,
            thread: None,
            preset: None,
            last_refusal: None,
        }
    }

    fn current(&self, run: RunId) -> Option<AttemptId> {
        self.task.map(|task| AttemptId {
            run,
            task,
            attempt: self.attempt,
        })
    }

    fn usable_report(&self) -> Option<&SubagentReport> {
        match &self.outcome {
            Some(StepOutcome::Report(r)) if r.status != ReportStatus::Blocked => Some(r),
            _ => None,
        }
    }
}

/// What to do when a stage is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Then {
    Nothing,
    Admit {
        step: usize,
        generation: u32,
    },
    Accepted {
        step: usize,
        attempt: AttemptId,
        outcome: StepOutcome,
    },
    Parked {
        step: usize,
        outcome: StepOutcome,
    },
    Finished {
        status: RunStatus,
        outcome: String,
    },
}

#[derive(Clone, Debug)]
struct Pending {
    ops: Vec<PersistOp>,
    checkpoint: bool,
    then: Then,
    restages: u32,
    /// Whether it is at the checkpoint now. A failed stage and every stage after it are held back and
    /// re-sent together in ticket order, so a run's writes always commit as a prefix of its decisions.
    sent: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    Finishing,
    Done(RunStatus),
}

#[derive(Clone, Debug, Default)]
struct Lead {
    turns_seen: u32,
    queue: VecDeque<(u32, Vec<usize>)>,
    active: Option<(u32, Vec<usize>)>,
    answered: BTreeMap<u32, Vec<(String, StepOutcome)>>,
}

/// The coordinator's snapshot, serialized (JSON) into `Checkpoint::state`. Task rows stay the truth
/// for outcomes; the snapshot says which tasks belong to which step and how far the attempts went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// [`SNAPSHOT_VERSION`].
    pub version: u8,
    /// The run's root task.
    pub root: TaskId,
    /// Whether the run is led by an agent (steps beyond the first are its delegations).
    pub lead: bool,
    /// One entry per step, in step order.
    pub steps: Vec<StepSnapshot>,
}

/// One step in a [`Snapshot`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSnapshot {
    /// The step as asked for, for steps that are not in the run's plan (a lead's delegations,
    /// follow-ups); `None` for plan steps, which come back from the run row's plan. Keeping plan steps
    /// out makes a checkpoint cheap to write after every decision.
    #[serde(default)]
    pub spec: Option<PlanStep>,
    /// Its tasks, oldest first (re-dispatches add one each).
    pub tasks: Vec<TaskId>,
    /// The current attempt number of the newest task.
    pub attempt: u32,
    /// Attempts across all its tasks.
    pub attempts_total: u32,
    /// The agent the next attempt asks for.
    pub agent: Option<String>,
    /// Set when the step was skipped (no task ever ran it).
    pub skipped: Option<String>,
    /// For a follow-up: the task whose thread it continues.
    #[serde(default)]
    pub thread: Option<TaskId>,
    /// For a lead's delegation: the lead's call id.
    #[serde(default)]
    pub call_id: Option<String>,
    /// For a follow-up: the task id the host chose for it (kept so a follow-up queued before a
    /// crash still takes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<TaskId>,
}

/// One line of a synthesis' coverage table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// The step.
    pub step: String,
    /// `complete`, `partial`, `blocked`, `failed`, `skipped` or `cancelled`.
    pub status: String,
    /// Why it is not complete, if it is not.
    pub note: Option<String>,
}

/// The end of a run: what was found, with its provenance, and an honest coverage table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Synthesis {
    /// Per step, in plan order.
    pub coverage: Vec<Coverage>,
    /// Whether any step is not complete (the annotation readers must see).
    pub partial_coverage: bool,
    /// Findings of every usable report, each with its step, bounded by [`SYNTHESIS_FINDINGS_MAX`].
    pub findings: Vec<PriorFinding>,
    /// Findings left out by the bound.
    pub findings_omitted: u32,
    /// Gaps of every report, prefixed with their step.
    pub gaps: Vec<String>,
    /// Places where steps disagree, each kept whole (never first-wins, never dropped), bounded by
    /// [`SYNTHESIS_CONFLICTS_MAX`].
    #[serde(default)]
    pub conflicts: Vec<Conflict>,
    /// One paragraph.
    pub summary: String,
}

/// Most conflicts a synthesis lists.
pub const SYNTHESIS_CONFLICTS_MAX: usize = 64;

/// Two or more steps cite the same place in the same source for different claims: a disagreement
/// about what that source says, which a reader must resolve. Every claim is kept with its step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// The source, with its document and page when given (`source#document@page`).
    pub location: String,
    /// `(step, claim)` for each distinct claim, in step order.
    pub claims: Vec<(String, String)>,
}

/// Find the conflicts among findings: same source location, different claims, from different steps.
/// Deterministic (ordered maps), bounded by [`SYNTHESIS_CONFLICTS_MAX`].
pub fn find_conflicts(findings: &[PriorFinding]) -> Vec<Conflict> {
    let mut by_location: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for f in findings {
        let loc = format!(
            "{}#{}@{}",
            f.finding.source.trim(),
            f.finding.document.as_deref().unwrap_or("").trim(),
            f.finding.page.map_or(String::new(), |p| p.to_string())
        );
        let claim = f
            .finding
            .claim
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let entry = by_location.entry(loc).or_default();
        if !entry.iter().any(|(_, c)| c.eq_ignore_ascii_case(&claim)) {
            entry.push((f.step.clone(), claim));
        }
    }
    by_location
        .into_iter()
        .filter(|(_, claims)| {
            let steps: BTreeSet<&str> = claims.iter().map(|(s, _)| s.as_str()).collect();
            claims.len() > 1 && steps.len() > 1
        })
        .take(SYNTHESIS_CONFLICTS_MAX)
        .map(|(location, claims)| Conflict { location, claims })
        .collect()
}

#[derive(Debug)]
struct RunState {
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
    decisions: Vec<SessionLogRow>,
    stale_logged: BTreeSet<AttemptId>,
    phase: Phase,
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

fn decision_row(now: Millis, summary: String) -> SessionLogRow {
    SessionLogRow {
        ts_ms: now,
        kind: LogKind::Lifecycle,
        summary: bounded(format!("decision: {summary}"), 512),
        detail: String::new(),
    }
}

fn outcome_status(outcome: &StepOutcome) -> TaskStatus {
    match outcome {
        StepOutcome::Report(r) => match r.status {
            ReportStatus::Complete => TaskStatus::Complete,
            ReportStatus::Partial => TaskStatus::Partial,
            ReportStatus::Blocked => TaskStatus::Blocked,
        },
        StepOutcome::Failed(_) => TaskStatus::Failed,
        StepOutcome::Skipped { .. } => TaskStatus::Cancelled,
    }
}

fn encode_outcome(outcome: &StepOutcome) -> String {
    // Plain data of strings and integers: serialising cannot fail; the fallback keeps the row valid.
    serde_json::to_string(outcome).unwrap_or_else(|_| "{}".into())
}

impl RunState {
    fn decide(&mut self, now: Millis, summary: String) {
        self.decisions.push(decision_row(now, summary));
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            version: SNAPSHOT_VERSION,
            root: self.root.id,
            lead: self.lead.is_some(),
            steps: self
                .steps
                .iter()
                .enumerate()
                .map(|(i, s)| StepSnapshot {
                    spec: (i >= self.plan_len).then(|| s.spec.clone()),
                    tasks: s.tasks.clone(),
                    attempt: s.attempt,
                    attempts_total: s.attempts_total,
                    agent: s.agent.clone(),
                    skipped: match &s.outcome {
                        Some(StepOutcome::Skipped { reason }) => Some(reason.clone()),
                        _ => None,
                    },
                    thread: s.thread,
                    preset: s.preset,
                    call_id: s.call_id.clone(),
                })
                .collect(),
        }
    }

    fn checkpoint_row(&self, now: Millis) -> Checkpoint {
        let verified = self
            .steps
            .iter()
            .filter(|s| s.status == StepStatus::Done)
            .filter_map(|s| s.task)
            .collect();
        let pending = self
            .steps
            .iter()
            .filter(|s| s.status != StepStatus::Done)
            .filter_map(|s| s.task)
            .collect();
        let last = self
            .steps
            .iter()
            .rev()
            .find(|s| s.status == StepStatus::Done)
            .map(|s| s.spec.key.clone());
        Checkpoint {
            run_id: self.id,
            last_completed_step: last,
            verified_outputs: verified,
            pending_work: pending,
            correlation_id: format!("{}/{}", self.id, self.next_ticket),
            state: serde_json::to_string(&self.snapshot()).unwrap_or_default(),
            written_ms: now,
        }
    }

    fn stage(
        &mut self,
        mut ops: Vec<PersistOp>,
        then: Then,
        checkpoint: bool,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let room = STAGE_OPS_MAX.saturating_sub(ops.len() + 1);
        let keep = self.decisions.len().min(room);
        for row in self.decisions.drain(..keep) {
            ops.push(PersistOp::AppendLog {
                task: self.root.id,
                row,
            });
        }
        self.decisions.clear();
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let held = self.pending.values().any(|p| !p.sent);
        let pending = Pending {
            ops,
            checkpoint,
            then,
            restages: 0,
            sent: !held,
        };
        if !held {
            self.send_stage(ticket, &pending, now, out);
        }
        self.pending.insert(ticket, pending);
    }

    fn send_stage(&self, ticket: u64, pending: &Pending, now: Millis, out: &mut Vec<Effect>) {
        let mut ops = pending.ops.clone();
        if pending.checkpoint {
            // Built when sent (and again when re-sent), so a later stage never carries an older snapshot.
            ops.push(PersistOp::PutCheckpoint(self.checkpoint_row(now)));
        }
        out.push(Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(
            Stage {
                run: self.id,
                ticket,
                ops,
            },
        ))));
    }

    /// Queue a follow-up step on the thread of `request.parent` (it starts when the thread is free:
    /// see [`ready_follow_ups`]). Returns whether it was queued; a refusal is a logged decision.
    fn queue_follow_up(&mut self, request: FollowUpRequest, estimate: u64, now: Millis) -> bool {
        let FollowUpRequest {
            parent,
            brief,
            agent,
            task,
        } = request;
        let known = parent == self.root.id || self.by_task.contains_key(&parent);
        let taken = task.is_some_and(|t| {
            self.tasks.contains_key(&t) || self.steps.iter().any(|s| s.preset == Some(t))
        });
        if !known || taken || self.phase != Phase::Running || self.steps.len() >= PLAN_STEPS_MAX {
            self.decide(
                now,
                format!("follow-up on {parent} refused: not a task of this run, its task id is taken, the run is not running, or the step bound is reached"),
            );
            return false;
        }
        let n = self.steps.iter().filter(|s| s.thread.is_some()).count() + 1;
        let key = format!("f{n}");
        self.decide(
            now,
            format!("follow-up {key} queued on the thread of {parent}"),
        );
        let mut step = Step::new(
            PlanStep {
                key,
                brief: bounded(brief.clone(), FOLLOW_UP_BYTES_MAX),
                goal: bounded(brief, TEXT_BYTES_MAX),
                quality_criteria: Vec::new(),
                output_schema: None,
                assignee: agent,
                depends_on: Vec::new(),
                estimate_micros: estimate,
            },
            Vec::new(),
        );
        step.thread = Some(parent);
        step.preset = task;
        self.steps.push(step);
        true
    }

    fn flush_decisions(&mut self, now: Millis, out: &mut Vec<Effect>) {
        if !self.decisions.is_empty() {
            self.stage(Vec::new(), Then::Nothing, false, now, out);
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

    /// The brief of a step: only what it needs (its own goal and criteria, the findings and gaps of the
    /// steps it depends on, the run's constraints restated).
    fn brief_for(&self, index: usize, task: TaskId) -> SubtaskBrief {
        let step = &self.steps[index];
        let mut prior = Vec::new();
        let mut gaps = Vec::new();
        for &d in &step.deps {
            let dep = &self.steps[d];
            if let Some(report) = dep.usable_report() {
                for f in &report.findings {
                    if prior.len() < PRIOR_FINDINGS_MAX {
                        prior.push(PriorFinding {
                            step: dep.spec.key.clone(),
                            finding: f.clone(),
                        });
                    }
                }
                for g in &report.gaps {
                    gaps.push(format!("{}: {g}", dep.spec.key));
                }
            }
        }
        gaps.truncate(crate::report::GAPS_MAX);
        SubtaskBrief {
            step: step.spec.key.clone(),
            task,
            brief: step.spec.brief.clone(),
            goal: step.spec.goal.clone(),
            quality_criteria: step.spec.quality_criteria.clone(),
            prior_findings: prior,
            output_schema: step.spec.output_schema.clone(),
            constraints: self.constraints.clone(),
            known_gaps: gaps,
            aliases: step.tasks.iter().copied().filter(|t| *t != task).collect(),
        }
    }

    fn depth_of(&self, index: usize, root_depth: u8) -> u8 {
        if self.lead.is_some() && index == 0 {
            root_depth
        } else {
            root_depth.saturating_add(1)
        }
    }
}

impl Coordinator {
    fn accept(&mut self, spec: RunSpec, now: Millis, rng: &mut dyn Entropy, out: &mut Vec<Effect>) {
        if let Some(run) = &mut self.run {
            run.decide(now, format!("ignored a second Accept of run {}", spec.run));
            run.flush_decisions(now, out);
            return;
        }
        let root_id = mint_task_id(now, rng);
        let brief = bounded(spec.brief.clone(), 64 * 1024);
        let plan_text = match &spec.mode {
            RunMode::Plan(plan) => serde_json::to_string(plan).ok(),
            RunMode::Lead { .. } => None,
        };
        let row = Run {
            id: spec.run,
            brief: brief.clone(),
            plan: plan_text,
            status: RunStatus::Running,
            budget: Budget {
                limit_micros: spec.budget_limit_micros,
                reserved_micros: 0,
                spent_micros: 0,
            },
            created_ms: now,
            updated_ms: now,
            config_snapshot: bounded(spec.config_snapshot.clone(), 64 * 1024),
            outcome: None,
        };
        let root = Task {
            id: root_id,
            run_id: spec.run,
            parent: None,
            depth: self.config.root_depth,
            kind: TaskKind::Root,
            brief: brief.clone(),
            goal: bounded(spec.brief.clone(), TEXT_BYTES_MAX),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            model: None,
            observed: None,
            status: TaskStatus::Running,
            attempt: 0,
            idempotency_key: None,
            outcome: None,
            attachments: Vec::new(),
            progress_notes: Vec::new(),
            created_ms: now,
            updated_ms: now,
        };
        let mut state = RunState {
            id: spec.run,
            row,
            root: root.clone(),
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
            decisions: Vec::new(),
            stale_logged: BTreeSet::new(),
            phase: Phase::Running,
        };
        match spec.mode {
            RunMode::Plan(plan) => match validate(plan) {
                Ok(valid) => {
                    state.constraints = valid.plan().constraints.clone();
                    for (i, s) in valid.plan().steps.iter().enumerate() {
                        let deps = s
                            .depends_on
                            .iter()
                            .filter_map(|d| valid.index_of(d))
                            .collect();
                        let mut step = Step::new(s.clone(), deps);
                        if step.spec.estimate_micros == 0 {
                            step.spec.estimate_micros = self.config.default_estimate_micros;
                        }
                        let _ = i;
                        state.steps.push(step);
                    }
                    state.batches = valid.batches().to_vec();
                    state.plan_len = valid.plan().steps.len();
                    let shape: Vec<String> = state
                        .batches
                        .iter()
                        .map(|b| {
                            b.iter()
                                .map(|&i| state.steps[i].spec.key.as_str())
                                .collect::<Vec<_>>()
                                .join(",")
                        })
                        .collect();
                    state.decide(
                        now,
                        format!(
                            "plan accepted: {} steps in {} batches [{}]",
                            state.steps.len(),
                            state.batches.len(),
                            shape.join("] [")
                        ),
                    );
                }
                Err(e) => {
                    state.decide(now, format!("plan rejected: {e}"));
                    let outcome = format!("plan rejected: {e}");
                    state.row.status = RunStatus::Failed;
                    state.row.outcome = Some(outcome.clone());
                    let mut root = state.root.clone();
                    root.status = TaskStatus::Failed;
                    root.outcome = Some(outcome.clone());
                    state.phase = Phase::Finishing;
                    let ops = vec![
                        PersistOp::CreateRun(state.row.clone()),
                        PersistOp::CreateTask(root),
                    ];
                    state.stage(
                        ops,
                        Then::Finished {
                            status: RunStatus::Failed,
                            outcome,
                        },
                        false,
                        now,
                        out,
                    );
                    self.run = Some(state);
                    return;
                }
            },
            RunMode::Lead { agent, constraints } => {
                state.constraints = constraints;
                let spec = PlanStep {
                    key: LEAD_STEP_KEY.into(),
                    brief: brief.clone(),
                    goal: bounded(spec.brief, TEXT_BYTES_MAX),
                    quality_criteria: Vec::new(),
                    output_schema: None,
                    assignee: agent,
                    depends_on: Vec::new(),
                    estimate_micros: self.config.default_estimate_micros,
                };
                let mut step = Step::new(spec, Vec::new());
                // The lead works on the root task itself.
                step.task = Some(root.id);
                step.tasks.push(root.id);
                state.steps.push(step);
                state.by_task.insert(root.id, 0);
                state.batches = vec![vec![0]];
                state.lead = Some(Lead::default());
                state.decide(now, "lead mode: the lead agent decomposes the brief".into());
            }
        }
        state.tasks.insert(root.id, root.clone());
        let ops = vec![
            PersistOp::CreateRun(state.row.clone()),
            PersistOp::CreateTask(root),
        ];
        state.stage(ops, Then::Nothing, true, now, out);
        state.send(
            SupervisorMsg::OpenRun {
                run: state.id,
                budget: state.row.budget,
            },
            out,
        );
        self.run = Some(state);
        self.advance(now, rng, out);
    }

    /// Move the run forward: dispatch the next batch (or turn) when the current one is done, skip steps
    /// whose dependencies produced nothing usable, and finish when nothing is left.
    fn advance(&mut self, now: Millis, rng: &mut dyn Entropy, out: &mut Vec<Effect>) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.phase != Phase::Running {
            return;
        }
        let ready = ready_follow_ups(run);
        for i in ready {
            self.begin_attempt(i, None, now, rng, out);
        }
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.lead.is_some() {
            self.advance_lead(now, rng, out);
            return;
        }
        // Bounded: each pass either dispatches a batch and returns, or moves past a finished batch.
        for _ in 0..=PLAN_STEPS_MAX {
            let Some(run) = self.run.as_mut() else {
                return;
            };
            let Some(batch) = run.batches.get(run.batch).cloned() else {
                if run.steps.iter().all(|s| s.status == StepStatus::Done) {
                    self.finish(now, out);
                }
                return;
            };
            let waiting: Vec<usize> = batch
                .iter()
                .copied()
                .filter(|&i| run.steps[i].status == StepStatus::Waiting)
                .collect();
            if waiting.is_empty() {
                if batch
                    .iter()
                    .all(|&i| run.steps[i].status == StepStatus::Done)
                {
                    run.batch += 1;
                    continue;
                }
                return; // the batch is in flight
            }
            let keys: Vec<&str> = waiting
                .iter()
                .map(|&i| run.steps[i].spec.key.as_str())
                .collect();
            let summary = format!(
                "dispatch batch {} together: [{}]",
                run.batch + 1,
                keys.join(", ")
            );
            run.decide(now, summary);
            let plans: Vec<(usize, Vec<String>)> = waiting
                .into_iter()
                .map(|i| {
                    let unusable = run.steps[i]
                        .deps
                        .iter()
                        .filter(|&&d| run.steps[d].usable_report().is_none())
                        .map(|&d| run.steps[d].spec.key.clone())
                        .collect();
                    (i, unusable)
                })
                .collect();
            for (i, unusable) in plans {
                if unusable.is_empty() {
                    self.begin_attempt(i, None, now, rng, out);
                } else {
                    let reason = format!(
                        "not dispatched: dependencies without a usable report: {}",
                        unusable.join(", ")
                    );
                    self.skip(i, reason, now, out);
                }
            }
            return;
        }
    }

    fn advance_lead(&mut self, now: Millis, rng: &mut dyn Entropy, out: &mut Vec<Effect>) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.steps[0].status == StepStatus::Waiting {
            self.begin_attempt(0, None, now, rng, out);
            return;
        }
        let Some(lead) = run.lead.as_mut() else {
            return;
        };
        // Answer the active turn once all its steps are done, then start the next queued turn.
        if let Some((turn, steps)) = lead.active.clone()
            && steps
                .iter()
                .all(|&i| run.steps[i].status == StepStatus::Done)
        {
            let results: Vec<(String, StepOutcome)> = steps
                .iter()
                .map(|&i| {
                    let s = &run.steps[i];
                    (
                        s.call_id.clone().unwrap_or_default(),
                        s.outcome.clone().unwrap_or(StepOutcome::Skipped {
                            reason: "no outcome".into(),
                        }),
                    )
                })
                .collect();
            if let Some(lead) = run.lead.as_mut() {
                lead.active = None;
                lead.answered.insert(turn, results.clone());
            }
            if let Some(attempt) = run.steps[0].current(run.id)
                && run.steps[0].status != StepStatus::Done
            {
                run.to_specialist(attempt, SpecialistMsg::Delegated { turn, results }, out);
            }
        }
        let next = run.lead.as_mut().and_then(|lead| {
            if lead.active.is_none() {
                let next = lead.queue.pop_front();
                lead.active = next.clone();
                next
            } else {
                None
            }
        });
        if let Some((turn, steps)) = next {
            run.decide(
                now,
                format!(
                    "dispatch delegation turn {turn}: {} calls in parallel",
                    steps.len()
                ),
            );
            for i in steps {
                self.begin_attempt(i, None, now, rng, out);
            }
            return;
        }
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let idle = run
            .lead
            .as_ref()
            .is_some_and(|l| l.active.is_none() && l.queue.is_empty());
        if idle && run.steps.iter().all(|s| s.status == StepStatus::Done) {
            self.finish(now, out);
        }
    }

    /// Start the next attempt of a step: a new task for its first attempt or a re-dispatch (reroute,
    /// harness switch, context overflow), the same task with the next attempt number for a restart.
    /// The task row and the idempotency record are made durable before admission is asked.
    fn begin_attempt(
        &mut self,
        index: usize,
        reroute: Option<String>,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let root_depth = self.config.root_depth;
        let attempts_max = self.config.attempts_per_step_max;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.steps[index].attempts_total >= attempts_max {
            let failure = run.steps[index]
                .last_failure
                .clone()
                .unwrap_or(SubtaskFailure {
                    kind: FailureKind::Refused,
                    attempted: "no attempt".into(),
                    partial: Vec::new(),
                    retryable: false,
                    retry_after_ms: None,
                    detail: String::new(),
                });
            let reason = format!("retry budget spent: {attempts_max} attempts");
            self.park(index, failure, reason, None, now, out);
            return;
        }
        let run_id = run.id;
        let root_id = run.root.id;
        let depth = run.depth_of(index, root_depth);
        let is_lead = run.lead.is_some() && index == 0;
        let previous = run.steps[index].task;
        let new_task = previous.is_none() || reroute.is_some();
        let (task_id, attempt, kind, parent, continuity) = match (previous, new_task) {
            (Some(prev), true) => (
                mint_task_id(now, rng),
                1,
                TaskKind::Redispatch,
                Some(prev),
                Continuity::Resume { from: prev },
            ),
            (Some(prev), false) => {
                let step = &run.steps[index];
                let kind = if is_lead {
                    TaskKind::Root
                } else {
                    step_kind(run, prev)
                };
                // The lead's first attempt works on the root task it was given: a fresh start.
                let continuity = if step.attempts_total == 0 {
                    Continuity::Fresh
                } else {
                    Continuity::Resume { from: prev }
                };
                (prev, step.attempt + 1, kind, None, continuity)
            }
            (None, _) => match follow_up_parent(run, index) {
                // A follow-up continues its thread: its parent is the thread's newest task, and its
                // session gets the standard preamble built from that parent and its ancestors.
                Some(parent) => (
                    run.steps[index]
                        .preset
                        .filter(|t| !run.tasks.contains_key(t))
                        .unwrap_or_else(|| mint_task_id(now, rng)),
                    1,
                    TaskKind::FollowUp,
                    Some(parent),
                    Continuity::Standard { parent },
                ),
                None => (
                    mint_task_id(now, rng),
                    1,
                    TaskKind::Subtask,
                    Some(root_id),
                    Continuity::Fresh,
                ),
            },
        };
        if let Some(agent) = reroute {
            run.steps[index].agent = Some(agent);
        }
        let attempt_id = AttemptId {
            run: run_id,
            task: task_id,
            attempt,
        };
        let brief = run.brief_for(index, task_id);
        let key = attempt_id.idempotency_key();
        let mut ops = Vec::new();
        let step_key = run.steps[index].spec.key.clone();
        if new_task {
            let step = &run.steps[index];
            let row = Task {
                id: task_id,
                run_id,
                parent,
                depth,
                kind,
                brief: brief.render(),
                goal: bounded(step.spec.goal.clone(), TEXT_BYTES_MAX),
                quality_criteria: step.spec.quality_criteria.clone(),
                output_schema: step.spec.output_schema.clone(),
                assignee: step.agent.clone(),
                // Resolved at admission from the assignee's profile; never copied from the parent.
                model: None,
                observed: None,
                status: TaskStatus::Pending,
                attempt,
                idempotency_key: Some(key.0.clone()),
                outcome: None,
                attachments: Vec::new(),
                progress_notes: Vec::new(),
                created_ms: now,
                updated_ms: now,
            };
            ops.push(PersistOp::CreateTask(row.clone()));
            run.tasks.insert(task_id, row);
            run.by_task.insert(task_id, index);
            run.steps[index].tasks.push(task_id);
        } else if let Some(row) = run.tasks.get_mut(&task_id) {
            row.attempt = attempt;
            row.status = TaskStatus::Pending;
            row.idempotency_key = Some(key.0.clone());
            row.assignee = run.steps[index].agent.clone();
            row.updated_ms = now;
            ops.push(PersistOp::UpdateTask(row.clone()));
        }
        ops.push(PersistOp::RecordIdempotency(IdempotencyRecord {
            key: key.0.clone(),
            ts_ms: now,
            task_id: Some(task_id),
            effect: format!("start a harness session for step {step_key} attempt {attempt}"),
            result: None,
        }));
        let step = &mut run.steps[index];
        step.task = Some(task_id);
        step.attempt = attempt;
        step.attempts_total += 1;
        step.continuity = continuity;
        step.generation += 1;
        step.status = StepStatus::Recording;
        step.log_seq = 0;
        step.spent_micros = 0;
        step.assignment = None;
        let generation = step.generation;
        if step.attempts_total > 1 {
            ops.push(PersistOp::AppendManifest(ManifestEntry {
                ts_ms: now,
                item: step_key.clone(),
                task_id: Some(task_id),
                outcome: ManifestOutcome::Retried {
                    attempt: step.attempts_total,
                },
            }));
        }
        let how = match (new_task, previous) {
            (true, Some(prev)) => {
                format!("re-dispatch of {prev} as a new task with a resume preamble")
            }
            (false, _) if continuity == Continuity::Fresh => "first attempt".to_string(),
            (false, _) => "restart with a resume preamble".to_string(),
            (true, None) => "first attempt".to_string(),
        };
        run.decide(
            now,
            format!("step {step_key}: attempt {attempt} of task {task_id} ({how})"),
        );
        run.stage(
            ops,
            Then::Admit {
                step: index,
                generation,
            },
            true,
            now,
            out,
        );
    }

    fn admit(&mut self, index: usize, out: &mut Vec<Effect>) {
        let root_depth = self.config.root_depth;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let Some(attempt) = run.steps[index].current(run.id) else {
            return;
        };
        let brief = run.brief_for(index, attempt.task);
        let step = &mut run.steps[index];
        step.status = StepStatus::Admitting;
        let kind = run
            .tasks
            .get(&attempt.task)
            .map_or(TaskKind::Subtask, |t| t.kind);
        let req = SpawnRequest {
            attempt,
            depth: run.depth_of(index, root_depth),
            kind,
            agent: run.steps[index].agent.clone(),
            estimate_micros: run.steps[index].spec.estimate_micros,
            brief,
            continuity: run.steps[index].continuity,
        };
        run.send(SupervisorMsg::Admit(req), out);
    }

    fn skip(&mut self, index: usize, reason: String, now: Millis, out: &mut Vec<Effect>) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let key = run.steps[index].spec.key.clone();
        run.decide(now, format!("step {key} skipped: {reason}"));
        let outcome = StepOutcome::Skipped {
            reason: reason.clone(),
        };
        run.steps[index].outcome = Some(outcome.clone());
        run.steps[index].status = StepStatus::Committing;
        let ops = vec![PersistOp::AppendManifest(ManifestEntry {
            ts_ms: now,
            item: key,
            task_id: None,
            outcome: ManifestOutcome::Failed { reason },
        })];
        run.stage(
            ops,
            Then::Parked {
                step: index,
                outcome,
            },
            true,
            now,
            out,
        );
    }

    /// Park a step whose retries are spent (or that was escalated): the task row says failed or
    /// escalated, the failure goes to the dead-letter table, the manifest records it.
    fn park(
        &mut self,
        index: usize,
        failure: SubtaskFailure,
        reason: String,
        escalate: Option<EscalationTrigger>,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let key = run.steps[index].spec.key.clone();
        let task = run.steps[index].task;
        let attempts = run.steps[index].attempts_total;
        let outcome = StepOutcome::Failed(failure.clone());
        let mut ops = Vec::new();
        if let Some(t) = task.and_then(|t| run.tasks.get_mut(&t)) {
            t.status = if escalate.is_some() {
                TaskStatus::Escalated
            } else {
                TaskStatus::Failed
            };
            t.outcome = Some(encode_outcome(&outcome));
            t.updated_ms = now;
            ops.push(PersistOp::UpdateTask(t.clone()));
        }
        let payload = bounded(
            serde_json::to_string(&failure).unwrap_or_default(),
            64 * 1024,
        );
        ops.push(PersistOp::AppendDeadLetter(DeadLetter {
            ts_ms: now,
            task_id: task,
            subject: format!("step {key}"),
            payload,
            reason: bounded(reason.clone(), TEXT_BYTES_MAX),
            attempts,
        }));
        if let Some(trigger) = escalate {
            ops.push(PersistOp::AppendEscalation(Escalation {
                ts_ms: now,
                task_id: task,
                trigger,
                account: run.steps[index]
                    .assignment
                    .as_ref()
                    .map(|a| a.account.clone())
                    .unwrap_or_default(),
                asked: bounded(run.steps[index].spec.brief.clone(), TEXT_BYTES_MAX),
                attempted: failure.attempted.clone(),
                diagnosis: bounded(reason.clone(), TEXT_BYTES_MAX),
                amount_micros: None,
                recommended_action:
                    "review the dead-lettered step and re-run it or adjust the plan".into(),
            }));
        }
        ops.push(PersistOp::AppendManifest(ManifestEntry {
            ts_ms: now,
            item: key.clone(),
            task_id: task,
            outcome: ManifestOutcome::Failed {
                reason: bounded(reason.clone(), TEXT_BYTES_MAX),
            },
        }));
        let verb = if escalate.is_some() {
            "escalated"
        } else {
            "failed"
        };
        run.decide(
            now,
            format!("step {key} {verb} and parked in the dead-letter table: {reason}"),
        );
        run.steps[index].status = StepStatus::Committing;
        // The task row carries the parked outcome; recovery reads it there.
        run.stage(
            ops,
            Then::Parked {
                step: index,
                outcome,
            },
            false,
            now,
            out,
        );
    }

    fn on_result(
        &mut self,
        from: AttemptId,
        result: AttemptResult,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let Some(&index) = run.by_task.get(&from.task) else {
            return; // not a task of this run
        };
        if run.phase != Phase::Running && run.steps[index].accepted != Some(from) {
            // The run is ending (cancelled, budget, synthesis): nothing more is accepted.
            run.to_specialist(
                from,
                SpecialistMsg::Cancel {
                    reason: "the run has ended".into(),
                },
                out,
            );
            return;
        }
        let current = run.steps[index].current(run.id);
        let status = run.steps[index].status;
        if current != Some(from)
            || !matches!(
                status,
                StepStatus::Admitting
                    | StepStatus::Running
                    | StepStatus::Committing
                    | StepStatus::Done
            )
        {
            if run.steps[index].accepted == Some(from) {
                run.to_specialist(from, SpecialistMsg::Ack, out);
                return;
            }
            if run.stale_logged.len() < STALE_LOGGED_MAX && run.stale_logged.insert(from) {
                let key = run.steps[index].spec.key.clone();
                run.decide(
                    now,
                    format!("step {key}: result of attempt {from} refused as stale (not the current attempt)"),
                );
            }
            run.to_specialist(
                from,
                SpecialistMsg::Cancel {
                    reason: "superseded by a newer attempt".into(),
                },
                out,
            );
            return;
        }
        match status {
            StepStatus::Committing => return, // a duplicate while its result is being made durable
            StepStatus::Done => {
                if run.steps[index].accepted == Some(from) {
                    run.to_specialist(from, SpecialistMsg::Ack, out);
                }
                return;
            }
            _ => {}
        }
        let key = run.steps[index].spec.key.clone();
        run.steps[index].spent_micros = run.steps[index].spent_micros.max(result.spent_micros);
        match result.outcome {
            Ok(report) => match report.verify(from.task) {
                Ok(()) => {
                    let outcome = StepOutcome::Report(report.clone());
                    let mut ops = Vec::new();
                    if let Some(t) = run.tasks.get_mut(&from.task) {
                        t.status = outcome_status(&outcome);
                        t.outcome = Some(encode_outcome(&outcome));
                        t.updated_ms = now;
                        ops.push(PersistOp::UpdateTask(t.clone()));
                    }
                    ops.push(PersistOp::AppendManifest(ManifestEntry {
                        ts_ms: now,
                        item: key.clone(),
                        task_id: Some(from.task),
                        outcome: ManifestOutcome::Processed,
                    }));
                    run.row.budget.spent_micros = run
                        .row
                        .budget
                        .spent_micros
                        .saturating_add(result.spent_micros);
                    run.row.updated_ms = now;
                    ops.push(PersistOp::UpdateRun(run.row.clone()));
                    run.decide(
                        now,
                        format!(
                            "step {key}: accepted a {:?} report of attempt {from} ({} findings, {} gaps)",
                            report.status,
                            report.findings.len(),
                            report.gaps.len()
                        ),
                    );
                    run.steps[index].status = StepStatus::Committing;
                    // No checkpoint here: the task row (result and done-marker, one transaction) is
                    // what recovery reads; the next dispatch or the synthesis writes the checkpoint.
                    run.stage(
                        ops,
                        Then::Accepted {
                            step: index,
                            attempt: from,
                            outcome,
                        },
                        false,
                        now,
                        out,
                    );
                }
                Err(e) => {
                    let failure = SubtaskFailure {
                        kind: FailureKind::MalformedReport,
                        attempted: format!("attempt {from}"),
                        partial: report.findings,
                        retryable: true,
                        retry_after_ms: None,
                        detail: e.to_string(),
                    };
                    self.on_failure(index, from, failure, result.spent_micros, now, out);
                }
            },
            Err(failure) => self.on_failure(index, from, failure, result.spent_micros, now, out),
        }
    }

    fn on_failure(
        &mut self,
        index: usize,
        from: AttemptId,
        failure: SubtaskFailure,
        spent_micros: u64,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let key = run.steps[index].spec.key.clone();
        run.decide(
            now,
            format!(
                "step {key}: attempt {from} failed ({}, retryable: {}): {}",
                failure.kind.name(),
                failure.retryable,
                one_line(&failure.detail)
            ),
        );
        run.steps[index].status = StepStatus::AwaitingVerdict;
        run.steps[index].last_failure = Some(failure.clone());
        if let Some(t) = run.tasks.get_mut(&from.task) {
            t.status = TaskStatus::Failed;
            t.updated_ms = now;
            t.outcome = Some(encode_outcome(&StepOutcome::Failed(failure.clone())));
        }
        run.send(
            SupervisorMsg::Settle {
                attempt: from,
                spent_micros,
                outcome: Err(failure),
            },
            out,
        );
    }

    fn apply_verdict(
        &mut self,
        index: usize,
        verdict: Verdict,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let attempts_max = self.config.attempts_per_step_max;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let key = run.steps[index].spec.key.clone();
        let failure = run.steps[index]
            .last_failure
            .clone()
            .unwrap_or(SubtaskFailure {
                kind: FailureKind::Crashed,
                attempted: String::new(),
                partial: Vec::new(),
                retryable: true,
                retry_after_ms: None,
                detail: "no failure recorded".into(),
            });
        let spent = run.steps[index].attempts_total >= attempts_max;
        match verdict {
            Verdict::Restart { .. } | Verdict::Reroute { .. } if spent => {
                let reason = format!("retry budget spent after {attempts_max} attempts");
                self.park(index, failure, reason, None, now, out);
            }
            Verdict::Restart { after_ms } => {
                run.decide(
                    now,
                    format!("step {key}: restart after {after_ms} ms (supervisor)"),
                );
                self.backoff(
                    index,
                    BackoffNext::NewAttempt { reroute: None },
                    after_ms,
                    now,
                    rng,
                    out,
                );
            }
            Verdict::Reroute { agent, after_ms } => {
                run.decide(
                    now,
                    format!(
                        "step {key}: reroute to agent {agent} after {after_ms} ms (supervisor)"
                    ),
                );
                self.backoff(
                    index,
                    BackoffNext::NewAttempt {
                        reroute: Some(agent),
                    },
                    after_ms,
                    now,
                    rng,
                    out,
                );
            }
            Verdict::Escalate { reason } => {
                let trigger = if matches!(failure.kind, FailureKind::Harness(_))
                    && !reason.starts_with("no meaningful progress")
                {
                    EscalationTrigger::PolicyGap
                } else {
                    EscalationTrigger::NoProgress
                };
                self.park(index, failure, reason, Some(trigger), now, out);
            }
            Verdict::GiveUp { reason } => self.park(index, failure, reason, None, now, out),
        }
    }

    fn backoff(
        &mut self,
        index: usize,
        next: BackoffNext,
        after_ms: Millis,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if after_ms == 0
            && let BackoffNext::NewAttempt { reroute } = next.clone()
        {
            self.begin_attempt(index, reroute, now, rng, out);
            return;
        }
        let step = &mut run.steps[index];
        step.status = StepStatus::Backoff;
        step.backoff = next;
        let generation = step.generation;
        run.timer(
            CoordinatorTimer::Redispatch {
                step: u32::try_from(index).unwrap_or(u32::MAX),
                generation,
            },
            now.saturating_add(after_ms),
            out,
        );
    }

    /// End the run now with a status that is not a synthesis (budget, cancel, store unavailable).
    fn finish_with(
        &mut self,
        status: RunStatus,
        outcome: String,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.phase != Phase::Running {
            return;
        }
        run.phase = Phase::Finishing;
        run.decide(now, format!("run ends: {status:?}: {outcome}"));
        let mut ops = Vec::new();
        let mut stopped = Vec::new();
        for step in &mut run.steps {
            if step.status != StepStatus::Done
                && let Some(task) = step.task
                && let Some(t) = run.tasks.get_mut(&task)
                && !t.status.is_terminal()
            {
                t.status = TaskStatus::Cancelled;
                t.updated_ms = now;
                ops.push(PersistOp::UpdateTask(t.clone()));
                stopped.push(task);
            }
        }
        run.row.status = status;
        run.row.outcome = Some(bounded(outcome.clone(), 64 * 1024));
        run.row.updated_ms = now;
        ops.push(PersistOp::UpdateRun(run.row.clone()));
        if run.lead.is_none() {
            let mut root = run.root.clone();
            root.status = TaskStatus::Cancelled;
            root.updated_ms = now;
            ops.push(PersistOp::UpdateTask(root));
        }
        ops.truncate(STAGE_OPS_MAX - 64);
        run.stage(ops, Then::Finished { status, outcome }, true, now, out);
    }

    /// End the run with a synthesis: a failure stays a failure, partial coverage is annotated.
    fn finish(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.phase != Phase::Running {
            return;
        }
        run.phase = Phase::Finishing;
        let synthesis = synthesize(&run.steps);
        let usable = run.steps.iter().any(|s| s.usable_report().is_some());
        let status = if usable {
            RunStatus::Completed
        } else {
            RunStatus::Failed
        };
        let text = serde_json::to_string(&synthesis).unwrap_or_default();
        let outcome = if usable {
            text
        } else {
            format!("no step produced a usable report: {}", synthesis.summary)
        };
        run.decide(
            now,
            format!("synthesis: {:?}; {}", status, synthesis.summary),
        );
        run.row.status = status;
        run.row.outcome = Some(outcome.clone());
        run.row.updated_ms = now;
        let mut root = run
            .tasks
            .get(&run.root.id)
            .cloned()
            .unwrap_or_else(|| run.root.clone());
        if run.lead.is_none() {
            root.status = if usable {
                TaskStatus::Complete
            } else {
                TaskStatus::Failed
            };
            root.outcome = Some(bounded(synthesis.summary.clone(), TEXT_BYTES_MAX));
            root.updated_ms = now;
        }
        let ops = vec![
            PersistOp::UpdateTask(root),
            PersistOp::UpdateRun(run.row.clone()),
        ];
        run.stage(ops, Then::Finished { status, outcome }, true, now, out);
    }

    fn on_durable(
        &mut self,
        ticket: u64,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let Some(pending) = run.pending.remove(&ticket) else {
            return;
        };
        match pending.then {
            Then::Nothing => {}
            Then::Admit { step, generation } => {
                if run.steps[step].generation == generation
                    && run.steps[step].status == StepStatus::Recording
                    && run.phase == Phase::Running
                {
                    self.admit(step, out);
                }
            }
            Then::Accepted {
                step,
                attempt,
                outcome,
            } => {
                let s = &mut run.steps[step];
                s.status = StepStatus::Done;
                s.outcome = Some(outcome);
                s.accepted = Some(attempt);
                let spent = s.spent_micros;
                run.to_specialist(attempt, SpecialistMsg::Ack, out);
                run.send(
                    SupervisorMsg::Settle {
                        attempt,
                        spent_micros: spent,
                        outcome: Ok(()),
                    },
                    out,
                );
                self.advance(now, rng, out);
            }
            Then::Parked { step, outcome } => {
                run.steps[step].status = StepStatus::Done;
                run.steps[step].outcome = Some(outcome);
                self.advance(now, rng, out);
            }
            Then::Finished { status, outcome } => {
                run.phase = Phase::Done(status);
                out.push(Effect::Emit(LifecycleEvent::RunFinished {
                    run: run.id,
                    status,
                    outcome,
                }));
                run.send(SupervisorMsg::CloseRun { run: run.id }, out);
            }
        }
    }

    fn on_persist_failed(
        &mut self,
        ticket: u64,
        error: String,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let restages_max = self.config.restages_max;
        let backoff = self.config.restage_backoff_ms;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let Some(pending) = run.pending.get_mut(&ticket) else {
            return;
        };
        if pending.restages < restages_max {
            pending.restages += 1;
            let restages = pending.restages;
            let was_holding = run.pending.values().any(|p| !p.sent);
            // Hold this stage and everything after it; one timer re-sends them all in order.
            for (_, p) in run.pending.range_mut(ticket..) {
                p.sent = false;
            }
            if !was_holding {
                let at = now.saturating_add(backoff.saturating_mul(u64::from(restages)));
                run.timer(CoordinatorTimer::Restage { ticket }, at, out);
            }
            return;
        }
        // The store is unavailable: stop here without pretending anything was written. The run is not
        // lost: a restart recovers it from its last durable checkpoint.
        run.pending.remove(&ticket);
        let outcome = format!("the store refused a write {restages_max} times: {error}");
        run.phase = Phase::Done(RunStatus::Failed);
        out.push(Effect::Emit(LifecycleEvent::RunFinished {
            run: run.id,
            status: RunStatus::Failed,
            outcome,
        }));
        run.send(SupervisorMsg::CloseRun { run: run.id }, out);
    }

    fn on_delegate(
        &mut self,
        from: AttemptId,
        turn: u32,
        calls: Vec<DelegationCall>,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let turns_max = self.config.delegation_turns_max;
        let calls_max = self.config.delegation_calls_max as usize;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.steps.first().and_then(|s| s.current(run.id)) != Some(from)
            || run.phase != Phase::Running
        {
            return;
        }
        let Some(lead) = run.lead.as_mut() else {
            return;
        };
        if turn <= lead.turns_seen {
            // A duplicate turn: answer again if it was answered (the answer may have been lost).
            if let Some(results) = lead.answered.get(&turn).cloned() {
                run.to_specialist(from, SpecialistMsg::Delegated { turn, results }, out);
            }
            return;
        }
        if turn > turns_max || run.steps.len() + calls.len() > PLAN_STEPS_MAX {
            run.decide(
                now,
                format!("delegation turn {turn} refused: over the delegation limits"),
            );
            let results = calls
                .iter()
                .map(|c| {
                    (
                        c.call_id.clone(),
                        StepOutcome::Skipped {
                            reason: "over the delegation limits".into(),
                        },
                    )
                })
                .collect();
            run.to_specialist(from, SpecialistMsg::Delegated { turn, results }, out);
            return;
        }
        lead.turns_seen = turn;
        let mut indices = Vec::new();
        for (i, call) in calls.into_iter().take(calls_max).enumerate() {
            let spec = PlanStep {
                key: format!("t{turn}.{i}"),
                brief: call.brief,
                goal: call.goal,
                quality_criteria: call.quality_criteria,
                output_schema: call.output_schema,
                assignee: call.assignee,
                depends_on: Vec::new(),
                estimate_micros: self.config.default_estimate_micros,
            };
            let mut step = Step::new(spec, Vec::new());
            step.call_id = Some(call.call_id);
            run.steps.push(step);
            indices.push(run.steps.len() - 1);
        }
        if let Some(lead) = run.lead.as_mut() {
            lead.queue.push_back((turn, indices));
        }
        self.advance(now, rng, out);
    }

    fn recover(
        &mut self,
        rows: RecoveredRun,
        follow_up: Option<FollowUpRequest>,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if self.run.is_some() {
            return;
        }
        let RecoveredRun {
            run: row,
            checkpoint,
            tasks,
            idempotency,
        } = rows;
        if row.status.is_terminal() {
            // Nothing more happens to a finished run: a host that recovers one gets a terminal
            // coordinator that accepts nothing, rather than a run that starts again.
            let status = row.status;
            let mut state = empty_state(row, now);
            state.phase = Phase::Done(status);
            // A follow-up that came with these rows is dropped with them: a terminal coordinator
            // writes nothing (a host reopens a run by marking it running before it sends its rows).
            let _ = follow_up;
            self.run = Some(state);
            return;
        }
        let tasks: BTreeMap<TaskId, Task> = tasks.into_iter().map(|t| (t.id, t)).collect();
        let snapshot = checkpoint
            .as_ref()
            .and_then(|c| serde_json::from_str::<Snapshot>(&c.state).ok());
        let root = snapshot
            .as_ref()
            .and_then(|s| tasks.get(&s.root).cloned())
            .or_else(|| {
                tasks
                    .values()
                    .find(|t| t.kind == TaskKind::Root && t.parent.is_none())
                    .cloned()
            });
        let Some(root) = root else {
            // Nothing durable beyond the run row: there is no root task to continue from. End the run
            // as failed rather than guess.
            let mut row = row;
            let id = row.id;
            row.status = RunStatus::Failed;
            row.outcome = Some("recovery found no root task and no checkpoint".into());
            row.updated_ms = now;
            let mut state = empty_state(row.clone(), now);
            state.phase = Phase::Finishing;
            state.decide(now, "recovery: no root task; the run fails".into());
            state.stage(
                vec![PersistOp::UpdateRun(row)],
                Then::Finished {
                    status: RunStatus::Failed,
                    outcome: format!("run {id}: nothing to recover"),
                },
                false,
                now,
                out,
            );
            self.run = Some(state);
            return;
        };
        let mut state = empty_state(row.clone(), now);
        state.root = root.clone();
        state.tasks = tasks;
        state.next_ticket = 1;
        let (lead, snap_steps) = match snapshot {
            Some(s) => (s.lead, s.steps),
            None => (false, Vec::new()),
        };
        // The plan comes back from the run row; the snapshot adds what happened to each step.
        let plan: Option<Plan> = row
            .plan
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok());
        if lead {
            state.lead = Some(Lead::default());
            state.batches = vec![vec![0]];
        } else if let Some(plan) = plan.clone() {
            match validate(plan) {
                Ok(valid) => {
                    state.constraints = valid.plan().constraints.clone();
                    state.batches = valid.batches().to_vec();
                    state.plan_len = valid.plan().steps.len();
                    for s in &valid.plan().steps {
                        let deps = s
                            .depends_on
                            .iter()
                            .filter_map(|d| valid.index_of(d))
                            .collect();
                        state.steps.push(Step::new(s.clone(), deps));
                    }
                }
                Err(_) => state.batches = Vec::new(),
            }
        }
        let max_attempt: BTreeMap<TaskId, u32> =
            idempotency.iter().fold(BTreeMap::new(), |mut m, r| {
                if let (Some(task), Some(n)) = (
                    r.task_id,
                    r.key.rsplit('/').next().and_then(|n| n.parse::<u32>().ok()),
                ) {
                    let e = m.entry(task).or_insert(0);
                    *e = (*e).max(n);
                }
                m
            });
        let mut redispatch = 0u32;
        let mut done = 0u32;
        for (i, snap) in snap_steps.into_iter().enumerate() {
            if i >= state.steps.len() {
                // Steps beyond the plan: a lead's delegations and follow-ups.
                let Some(spec) = snap.spec.clone() else {
                    break; // a step beyond the plan without its spec: nothing to rebuild it from
                };
                state.steps.push(Step::new(spec, Vec::new()));
            }
            let step = &mut state.steps[i];
            step.thread = snap.thread;
            step.call_id = snap.call_id.clone();
            step.preset = snap.preset;
            step.tasks = snap.tasks.clone();
            step.task = snap.tasks.last().copied();
            step.attempts_total = snap.attempts_total;
            step.agent = snap.agent.clone();
            step.attempt = snap.attempt;
            if let Some(task) = step.task {
                let row_attempt = state.tasks.get(&task).map_or(0, |t| t.attempt);
                step.attempt = step
                    .attempt
                    .max(row_attempt)
                    .max(max_attempt.get(&task).copied().unwrap_or(0));
            }
            for t in &snap.tasks {
                state.by_task.insert(*t, i);
            }
            if let Some(reason) = snap.skipped {
                step.outcome = Some(StepOutcome::Skipped { reason });
                step.status = StepStatus::Done;
                done += 1;
                continue;
            }
            let durable = step
                .task
                .and_then(|t| state.tasks.get(&t))
                .filter(|t| t.status.is_terminal())
                .and_then(|t| t.outcome.as_deref())
                .and_then(|o| serde_json::from_str::<StepOutcome>(o).ok());
            match durable {
                Some(outcome) => {
                    if matches!(outcome, StepOutcome::Report(_)) {
                        step.accepted = step.current(row.id);
                    }
                    step.outcome = Some(outcome);
                    step.status = StepStatus::Done;
                    done += 1;
                }
                None if step.task.is_some() => {
                    // Dispatched but not acknowledged: run again as the next attempt, with a resume
                    // preamble; a late result of the old attempt is refused as stale.
                    step.status = StepStatus::Backoff;
                    step.backoff = BackoffNext::NewAttempt { reroute: None };
                    redispatch += 1;
                }
                None => {}
            }
        }
        if lead && state.steps.is_empty() {
            let mut step = Step::new(
                PlanStep {
                    key: LEAD_STEP_KEY.into(),
                    brief: row.brief.clone(),
                    goal: bounded(row.brief.clone(), TEXT_BYTES_MAX),
                    quality_criteria: Vec::new(),
                    output_schema: None,
                    assignee: None,
                    depends_on: Vec::new(),
                    estimate_micros: self.config.default_estimate_micros,
                },
                Vec::new(),
            );
            step.task = Some(root.id);
            step.tasks.push(root.id);
            state.by_task.insert(root.id, 0);
            state.steps.push(step);
        }
        // Delegated steps of a recovered lead run form one pending turn, so they still finish.
        if lead {
            let open: Vec<usize> = (1..state.steps.len())
                .filter(|&i| {
                    state.steps[i].status != StepStatus::Done && state.steps[i].thread.is_none()
                })
                .collect();
            if let Some(l) = state.lead.as_mut() {
                l.turns_seen = u32::MAX / 2;
                if !open.is_empty() {
                    l.active = Some((0, open.clone()));
                }
            }
        }
        state.batch = state
            .batches
            .iter()
            .position(|b| {
                b.iter().any(|&i| {
                    state
                        .steps
                        .get(i)
                        .is_none_or(|s| s.status != StepStatus::Done)
                })
            })
            .unwrap_or(state.batches.len());
        state.decide(
            now,
            format!(
                "recovered from checkpoint: {done} steps durable, {redispatch} to run again, resuming at batch {}",
                state.batch + 1
            ),
        );
        state.send(
            SupervisorMsg::OpenRun {
                run: state.id,
                budget: row.budget,
            },
            out,
        );
        if let Some(f) = follow_up {
            // Queued before anything moves: a run whose steps are all done would otherwise end
            // again at once, before the follow-up is part of it.
            let estimate = self.config.default_estimate_micros;
            state.queue_follow_up(f, estimate, now);
        }
        // Steps that were dispatched run again; a recovered lead's delegations that never started start
        // now (their turn is already active).
        let resume: Vec<usize> = state
            .steps
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.status == StepStatus::Backoff
                    || (lead && *i > 0 && s.thread.is_none() && s.status == StepStatus::Waiting)
            })
            .map(|(i, _)| i)
            .collect();
        self.run = Some(state);
        for i in resume {
            self.begin_attempt(i, None, now, rng, out);
        }
        // Lead runs with open delegated steps already started them above; for a lead whose turns all
        // finished, `advance` finishes the run when the lead is done too.
        self.advance(now, rng, out);
    }
}

/// The parent of a follow-up step: the newest task of its thread before it (the thread's first
/// follow-up hangs under the task it was asked about). `None` for a step that is not a follow-up.
fn follow_up_parent(run: &RunState, index: usize) -> Option<TaskId> {
    let thread = run.steps[index].thread?;
    let previous = run.steps[..index]
        .iter()
        .rev()
        .find(|s| s.thread == Some(thread))
        .and_then(|s| s.tasks.last().copied());
    Some(previous.unwrap_or(thread))
}

/// Follow-ups that can start now: waiting, with the thread's previous follow-up done and the task the
/// thread started from done (or the run's root). One at a time per thread, in arrival order.
fn ready_follow_ups(run: &RunState) -> Vec<usize> {
    let mut ready = Vec::new();
    let mut busy: BTreeSet<TaskId> = BTreeSet::new();
    for (i, s) in run.steps.iter().enumerate() {
        let Some(thread) = s.thread else {
            continue;
        };
        if s.status == StepStatus::Done {
            continue;
        }
        if busy.insert(thread) && s.status == StepStatus::Waiting {
            let origin_done = thread == run.root.id
                || run
                    .by_task
                    .get(&thread)
                    .is_some_and(|&o| run.steps[o].status == StepStatus::Done);
            if origin_done {
                ready.push(i);
            }
        }
    }
    ready
}

fn refusal_kind(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::Concurrency { .. } => "concurrency",
        Refusal::Depth { .. } => "depth",
        Refusal::Budget { .. } => "budget",
        Refusal::Rate { .. } => "rate",
        Refusal::UnknownRun => "unknown_run",
        Refusal::NoAgent { .. } => "no_agent",
    }
}

fn step_kind(run: &RunState, task: TaskId) -> TaskKind {
    run.tasks.get(&task).map_or(TaskKind::Subtask, |t| t.kind)
}

fn one_line(text: &str) -> String {
    bounded(text.split_whitespace().collect::<Vec<_>>().join(" "), 200)
}

fn empty_state(row: Run, now: Millis) -> RunState {
    let root = Task {
        id: TaskId(0),
        run_id: row.id,
        parent: None,
        depth: 0,
        kind: TaskKind::Root,
        brief: row.brief.clone(),
        goal: String::new(),
        quality_criteria: Vec::new(),
        output_schema: None,
        assignee: None,
        model: None,
        observed: None,
        status: TaskStatus::Running,
        attempt: 0,
        idempotency_key: None,
        outcome: None,
        attachments: Vec::new(),
        progress_notes: Vec::new(),
        created_ms: now,
        updated_ms: now,
    };
    RunState {
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
        decisions: Vec::new(),
        stale_logged: BTreeSet::new(),
        phase: Phase::Running,
    }
}

/// Build the synthesis of a run from its steps: every usable finding with its step, every gap, and a
/// coverage line per step that says plainly what is missing.
fn synthesize(steps: &[Step]) -> Synthesis {
    let mut coverage = Vec::new();
    let mut findings = Vec::new();
    let mut omitted = 0u32;
    let mut gaps = Vec::new();
    let mut complete = 0usize;
    for s in steps {
        let (status, note) = match &s.outcome {
            Some(StepOutcome::Report(r)) => {
                for g in &r.gaps {
                    if gaps.len() < crate::report::GAPS_MAX * 4 {
                        gaps.push(format!("{}: {}", s.spec.key, bounded(g.clone(), 512)));
                    }
                }
                if r.status != ReportStatus::Blocked {
                    for f in &r.findings {
                        if findings.len() < SYNTHESIS_FINDINGS_MAX {
                            let mut f = f.clone();
                            f.claim = bounded(f.claim, SYNTHESIS_CLAIM_BYTES_MAX);
                            findings.push(PriorFinding {
                                step: s.spec.key.clone(),
                                finding: f,
                            });
                        } else {
                            omitted += 1;
                        }
                    }
                }
                match r.status {
                    ReportStatus::Complete => {
                        complete += 1;
                        ("complete", None)
                    }
                    ReportStatus::Partial => ("partial", Some(format!("{} gaps", r.gaps.len()))),
                    ReportStatus::Blocked => ("blocked", Some(one_line(&r.summary))),
                }
            }
            Some(StepOutcome::Failed(f)) => (
                "failed",
                Some(format!("{}: {}", f.kind.name(), one_line(&f.detail))),
            ),
            Some(StepOutcome::Skipped { reason }) => ("skipped", Some(reason.clone())),
            None => ("cancelled", Some("the run ended before it finished".into())),
        };
        coverage.push(Coverage {
            step: s.spec.key.clone(),
            status: status.into(),
            note,
        });
    }
    let partial = complete < steps.len();
    let summary = if partial {
        let missing: Vec<String> = coverage
            .iter()
            .filter(|c| c.status != "complete")
            .map(|c| format!("{} ({})", c.step, c.status))
            .collect();
        format!(
            "partial coverage: {complete} of {} steps complete; incomplete: {}",
            steps.len(),
            bounded(missing.join(", "), 2048)
        )
    } else {
        format!("complete coverage: all {} steps complete", steps.len())
    };
    let conflicts = find_conflicts(&findings);
    let summary = if conflicts.is_empty() {
        summary
    } else {
        format!(
            "{summary}; {} conflicts between steps kept for review",
            conflicts.len()
        )
    };
    Synthesis {
        coverage,
        partial_coverage: partial,
        findings,
        findings_omitted: omitted,
        gaps,
        conflicts,
        summary,
    }
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
        self.handle_input(input, now, rng, out);
        if let Some(run) = self.run.as_mut() {
            run.flush_decisions(now, out);
        }
        coalesce_stages(out, first);
    }
}

/// Every stage this input sent to the checkpoint writer, as one message (in ticket order, at the place
/// of the first): the writer then puts them all into one group commit instead of committing the first
/// alone while the others wait for the next. A single stage stays a [`CheckpointMsg::Stage`].
fn coalesce_stages(out: &mut Vec<Effect>, first: usize) {
    let count = out[first..]
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(_)))
            )
        })
        .count();
    if count < 2 {
        return;
    }
    let mut stages = Vec::with_capacity(count);
    let mut at = None;
    let mut kept = Vec::with_capacity(out.len() - first - count + 1);
    for (i, effect) in out.drain(first..).enumerate() {
        match effect {
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(stage))) => {
                at.get_or_insert(i);
                stages.push(stage);
            }
            other => kept.push(other),
        }
    }
    let at = at.unwrap_or(0).min(kept.len());
    kept.insert(
        at,
        Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stages(stages))),
    );
    out.extend(kept);
}

impl Coordinator {
    fn handle_input(
        &mut self,
        input: CoordinatorInput,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        match input {
            CoordinatorInput::Msg(CoordinatorMsg::Accept(spec)) => self.accept(spec, now, rng, out),
            CoordinatorInput::Recovered(rows) => self.recover(*rows, None, now, rng, out),
            CoordinatorInput::Reopened { rows, follow_up } => {
                self.recover(*rows, Some(follow_up), now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Durable { ticket }) => {
                self.on_durable(ticket, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::PersistFailed { ticket, error }) => {
                self.on_persist_failed(ticket, error, now, out);
            }
            CoordinatorInput::Timer(CoordinatorTimer::Restage { ticket }) => {
                let _ = ticket;
                if let Some(run) = self.run.as_mut() {
                    let held: Vec<u64> = run
                        .pending
                        .iter()
                        .filter(|(_, p)| !p.sent)
                        .map(|(t, _)| *t)
                        .collect();
                    for t in held {
                        if let Some(p) = run.pending.get(&t) {
                            run.send_stage(t, p, now, out);
                        }
                        if let Some(p) = run.pending.get_mut(&t) {
                            p.sent = true;
                        }
                    }
                }
            }
            CoordinatorInput::Timer(CoordinatorTimer::Redispatch { step, generation }) => {
                let index = step as usize;
                let Some(run) = self.run.as_mut() else {
                    return;
                };
                let Some(s) = run.steps.get(index) else {
                    return;
                };
                if s.generation != generation
                    || s.status != StepStatus::Backoff
                    || run.phase != Phase::Running
                {
                    return;
                }
                match s.backoff.clone() {
                    BackoffNext::Readmit => self.admit(index, out),
                    BackoffNext::NewAttempt { reroute } => {
                        self.begin_attempt(index, reroute, now, rng, out);
                    }
                }
            }
            CoordinatorInput::Msg(CoordinatorMsg::Admission { attempt, answer }) => {
                self.on_admission(attempt, answer, now, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Verdict { attempt, verdict }) => {
                let Some(run) = self.run.as_ref() else {
                    return;
                };
                let Some(&index) = run.by_task.get(&attempt.task) else {
                    return;
                };
                let s = &run.steps[index];
                if s.current(run.id) == Some(attempt)
                    && s.status == StepStatus::AwaitingVerdict
                    && run.phase == Phase::Running
                {
                    self.apply_verdict(index, verdict, now, rng, out);
                }
            }
            CoordinatorInput::Msg(CoordinatorMsg::AttemptLost {
                attempt,
                failure,
                verdict,
            }) => {
                let Some(run) = self.run.as_mut() else {
                    return;
                };
                let Some(&index) = run.by_task.get(&attempt.task) else {
                    return;
                };
                let s = &run.steps[index];
                if s.current(run.id) != Some(attempt)
                    || !matches!(s.status, StepStatus::Admitting | StepStatus::Running)
                    || run.phase != Phase::Running
                {
                    return;
                }
                let key = s.spec.key.clone();
                run.decide(
                    now,
                    format!(
                        "step {key}: attempt {attempt} lost ({}): {}",
                        failure.kind.name(),
                        one_line(&failure.detail)
                    ),
                );
                run.steps[index].last_failure = Some(failure);
                self.apply_verdict(index, verdict, now, rng, out);
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
            CoordinatorInput::Msg(CoordinatorMsg::FollowUp {
                parent,
                brief,
                agent,
                task,
            }) => {
                let request = FollowUpRequest {
                    parent,
                    brief,
                    agent,
                    task,
                };
                self.on_follow_up(request, now, rng, out);
            }
            CoordinatorInput::Msg(CoordinatorMsg::Cancel { reason }) => {
                self.finish_with(
                    RunStatus::Cancelled,
                    format!("cancelled: {reason}"),
                    now,
                    out,
                );
            }
            CoordinatorInput::Msg(CoordinatorMsg::Specialist { from, reply }) => {
                self.on_reply(from, reply, now, rng, out);
            }
        }
    }

    fn on_follow_up(
        &mut self,
        request: FollowUpRequest,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let estimate = self.config.default_estimate_micros;
        let Some(run) = self.run.as_mut() else {
            return;
        };
        if run.queue_follow_up(request, estimate, now) {
            self.advance(now, rng, out);
        }
    }

    fn on_admission(
        &mut self,
        attempt: AttemptId,
        answer: Result<Assignment, Refusal>,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(run) = self.run.as_mut() else {
            return;
        };
        let Some(&index) = run.by_task.get(&attempt.task) else {
            return;
        };
        if run.steps[index].current(run.id) != Some(attempt) || run.phase != Phase::Running {
            return;
        }
        if run.steps[index].status != StepStatus::Admitting {
            // The attempt's result can overtake its admission answer: still record who ran it, so the
            // task row carries the model resolved from the assignee.
            if let Ok(assignment) = answer
                && run.steps[index].assignment.is_none()
                && let Some(t) = run.tasks.get_mut(&attempt.task)
            {
                t.assignee = Some(assignment.agent.clone());
                t.model = Some(assignment.model.clone());
                t.updated_ms = now;
                let row = t.clone();
                run.steps[index].assignment = Some(assignment);
                run.stage(
                    vec![PersistOp::UpdateTask(row)],
                    Then::Nothing,
                    false,
                    now,
                    out,
                );
            }
            return;
        }
        let key = run.steps[index].spec.key.clone();
        match answer {
            Ok(assignment) => {
                run.decide(
                    now,
                    format!(
                        "step {key}: attempt {attempt} admitted as agent {} on {} with model {} (from the agent's profile)",
                        assignment.agent, assignment.harness, assignment.model
                    ),
                );
                run.steps[index].status = StepStatus::Running;
                if let Some(t) = run.tasks.get_mut(&attempt.task) {
                    t.assignee = Some(assignment.agent.clone());
                    t.model = Some(assignment.model.clone());
                    t.status = TaskStatus::Running;
                    t.updated_ms = now;
                    let row = t.clone();
                    run.steps[index].assignment = Some(assignment);
                    run.stage(
                        vec![PersistOp::UpdateTask(row)],
                        Then::Nothing,
                        false,
                        now,
                        out,
                    );
                } else {
                    run.steps[index].assignment = Some(assignment);
                }
            }
            Err(refusal) => {
                // A step waiting for a slot is asked about again every second or so: log a refusal
                // when its kind changes, not every time, so waiting cannot flood the run's log.
                let kind = refusal_kind(&refusal);
                if run.steps[index].last_refusal != Some(kind) {
                    run.steps[index].last_refusal = Some(kind);
                    run.decide(
                        now,
                        format!("step {key}: admission of {attempt} refused: {refusal:?}"),
                    );
                }
                if let Some(after) = refusal.retry_after_ms() {
                    let step = &mut run.steps[index];
                    step.status = StepStatus::Backoff;
                    step.backoff = BackoffNext::Readmit;
                    let generation = step.generation;
                    run.timer(
                        CoordinatorTimer::Redispatch {
                            step: u32::try_from(index).unwrap_or(u32::MAX),
                            generation,
                        },
                        now.saturating_add(after.max(1)),
                        out,
                    );
                    return;
                }
                if let Refusal::Budget {
                    committed_micros,
                    limit_micros,
                    ..
                } = refusal
                {
                    let outcome = format!(
                        "budget exceeded: {committed_micros} micro-dollars committed of a limit of {limit_micros}"
                    );
                    self.finish_with(RunStatus::BudgetExceeded, outcome, now, out);
                    return;
                }
                let failure = SubtaskFailure {
                    kind: FailureKind::Refused,
                    attempted: format!("admission of attempt {attempt}"),
                    partial: Vec::new(),
                    retryable: false,
                    retry_after_ms: None,
                    detail: format!("{refusal:?}"),
                };
                self.park(
                    index,
                    failure,
                    format!("admission refused: {refusal:?}"),
                    None,
                    now,
                    out,
                );
            }
        }
    }

    fn on_reply(
        &mut self,
        from: AttemptId,
        reply: SpecialistReply,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if from.run != self.run_id().unwrap_or(RunId(0)) {
            return;
        }
        match reply {
            SpecialistReply::Finished(result) => {
                // The attempt is the reply address's, never the payload's: a report cannot claim to be
                // from another attempt.
                let result = AttemptResult {
                    attempt: from,
                    ..result
                };
                self.on_result(from, result, now, out);
            }
            SpecialistReply::Logs { rows } => {
                let Some(run) = self.run.as_mut() else {
                    return;
                };
                let Some(&index) = run.by_task.get(&from.task) else {
                    return;
                };
                if run.steps[index].current(run.id) != Some(from) {
                    return;
                }
                let mut ops = Vec::new();
                for (seq, row) in rows
                    .into_iter()
                    .take(crate::specialist::LOG_ROWS_PER_REPLY_MAX)
                {
                    if seq > run.steps[index].log_seq {
                        run.steps[index].log_seq = seq;
                        ops.push(PersistOp::AppendLog {
                            task: from.task,
                            row,
                        });
                    }
                }
                if !ops.is_empty() {
                    run.stage(ops, Then::Nothing, false, now, out);
                }
            }
            SpecialistReply::Spend { spent_micros } => {
                let Some(run) = self.run.as_mut() else {
                    return;
                };
                let Some(&index) = run.by_task.get(&from.task) else {
                    return;
                };
                if run.steps[index].current(run.id) == Some(from) {
                    let s = &mut run.steps[index];
                    s.spent_micros = s.spent_micros.max(spent_micros);
                    run.send(
                        SupervisorMsg::Spend {
                            attempt: from,
                            spent_micros,
                        },
                        out,
                    );
                }
            }
            SpecialistReply::Delegate { turn, calls } => {
                self.on_delegate(from, turn, calls, now, rng, out);
            }
        }
    }
}
