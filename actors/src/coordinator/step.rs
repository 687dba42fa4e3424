//! One step's attempts: starting an attempt (a new task or the next attempt of its task), the brief it
//! gets, asking the supervisor for admission, and waiting out a backoff.

use super::follow_up::follow_up_parent;
use super::staging::Then;
use super::{Phase, RunState, StepStatus};
use crate::effect::Effect;
use crate::ids::{AttemptId, mint_task_id};
use crate::machine::{Entropy, Millis};
use crate::message::{Assignment, CoordinatorTimer, Refusal, SpawnRequest, SupervisorMsg};
use crate::persist::PersistOp;
use crate::plan::PlanStep;
use crate::report::{
    Continuity, FailureKind, PRIOR_FINDINGS_MAX, PriorFinding, ReportStatus, StepOutcome,
    SubagentReport, SubtaskBrief, SubtaskFailure, TEXT_BYTES_MAX, bounded,
};
use keel_store::{
    IdempotencyRecord, ManifestEntry, ManifestOutcome, RunId, RunStatus, Task, TaskId, TaskKind,
    TaskStatus,
};
use std::mem::Discriminant;

/// Most bytes of a batch's decision detail naming its first attempts (well under the store's
/// 16 KiB for a log row's detail); the steps past it write their own rows.
const ANNOUNCED_BYTES_MAX: usize = 8 * 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum BackoffNext {
    Readmit,
    NewAttempt { reroute: Option<String> },
}

/// One step of the run in memory: its spec, its tasks and attempts, and where it stands. The durable
/// truth is its task rows; this is the working copy.
#[derive(Clone, Debug)]
pub(super) struct Step {
    /// The step as planned (or as delegated, or as asked for by a follow-up).
    pub(super) spec: PlanStep,
    /// The indices of the steps it depends on.
    pub(super) deps: Vec<usize>,
    /// The task its current attempt runs as (`None` before its first attempt).
    pub(super) current_task: Option<TaskId>,
    /// Every task it ran as, oldest first (a re-dispatch adds one); the newest is `current_task`.
    pub(super) task_history: Vec<TaskId>,
    /// The attempt number within `current_task`.
    pub(super) attempt: u32,
    /// Attempts across all its tasks, interrupted ones included (a pause or a crash of the node
    /// interrupts an attempt; recovery starts the next one).
    pub(super) attempts_total: u32,
    /// Attempts that failed (a failure the coordinator received, or an attempt the supervisor
    /// lost): what the retry budget, `attempts_per_step_max`, counts. An attempt a pause or a crash
    /// of the node interrupted is not a failure.
    pub(super) failures: u32,
    /// The agent the next attempt asks for (a reroute changes it).
    pub(super) agent: Option<String>,
    /// The account the next attempt asks for (a rate limit's switch sets it, a reroute to another
    /// agent clears it); `None` bills to the agent profile's account.
    pub(super) account: Option<String>,
    /// How the current attempt's session gets its context.
    pub(super) continuity: Continuity,
    /// Bumped at every new attempt: a backoff timer or a recorded-attempt stage carries the value it
    /// was set for, and one that carries an older value is stale and ignored.
    pub(super) attempt_epoch: u32,
    /// Where it stands.
    pub(super) status: StepStatus,
    /// What its backoff timer does when it fires.
    pub(super) backoff: BackoffNext,
    /// Its durable outcome, once it is done.
    pub(super) outcome: Option<StepOutcome>,
    /// The attempt whose report was accepted.
    pub(super) accepted: Option<AttemptId>,
    /// The sequence number of the newest log row of the current attempt already staged.
    pub(super) log_seq: u32,
    /// What the current attempt has spent, in micro-dollars.
    pub(super) spent_micros: u64,
    /// How much of `spent_micros` is already in the run row's budget (charged as the attempt
    /// reports its spend, so an attempt a pause, a crash or a failure ends still counts).
    pub(super) charged_micros: u64,
    /// Who runs the current attempt, once admitted.
    pub(super) assignment: Option<Assignment>,
    /// For a lead's delegation: the lead's call id.
    pub(super) call_id: Option<String>,
    /// For a lead's delegation: the run-wide number of the delegation turn that asked for it.
    pub(super) turn: Option<u32>,
    /// For a lead's delegation: the lead attempt that asked for it (`None` once recovered: that
    /// session is gone). Another attempt of the lead asking for the same subtask gets this step.
    pub(super) delegated_by: Option<AttemptId>,
    /// The newest failure, for the verdict and the dead letter.
    pub(super) last_failure: Option<SubtaskFailure>,
    /// For a follow-up: the task whose thread it continues (its parent is that thread's newest task).
    pub(super) thread: Option<TaskId>,
    /// For a follow-up: the task id the host chose for it, which its task takes.
    pub(super) requested_task: Option<TaskId>,
    /// The kind of the last admission refusal logged for this step.
    pub(super) last_refusal: Option<Discriminant<Refusal>>,
    /// The escalation its task waits for (with [`StepStatus::AwaitingHuman`]), and where the
    /// escalated attempt's end is.
    pub(super) awaiting: Option<(keel_store::EscalationId, super::session_tools::EscalatedEnd)>,
    /// The brief its current attempt was recorded with, kept for that attempt's admission (built
    /// once per attempt; a later admission of the same attempt builds it again).
    pub(super) brief: Option<SubtaskBrief>,
}

impl Step {
    pub(super) fn new(spec: PlanStep, deps: Vec<usize>) -> Self {
        Self {
            agent: spec.assignee.clone(),
            account: None,
            spec,
            deps,
            current_task: None,
            task_history: Vec::new(),
            attempt: 0,
            attempts_total: 0,
            failures: 0,
            continuity: Continuity::Fresh,
            attempt_epoch: 0,
            status: StepStatus::Waiting,
            backoff: BackoffNext::Readmit,
            outcome: None,
            accepted: None,
            log_seq: 0,
            spent_micros: 0,
            charged_micros: 0,
            assignment: None,
            call_id: None,
            turn: None,
            delegated_by: None,
            last_failure: None,
            thread: None,
            requested_task: None,
            last_refusal: None,
            awaiting: None,
            brief: None,
        }
    }

    pub(super) fn current(&self, run: RunId) -> Option<AttemptId> {
        self.current_task.map(|task| AttemptId {
            run,
            task,
            attempt: self.attempt,
        })
    }

    pub(super) fn usable_report(&self) -> Option<&SubagentReport> {
        usable_report(self.outcome.as_ref())
    }
}

/// The report in an outcome, if it is one a synthesis or a dependent step can use (not blocked).
pub(super) fn usable_report(outcome: Option<&StepOutcome>) -> Option<&SubagentReport> {
    match outcome {
        Some(StepOutcome::Report(r)) if r.status != ReportStatus::Blocked => Some(r),
        _ => None,
    }
}

pub(super) fn outcome_status(outcome: &StepOutcome) -> TaskStatus {
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

pub(super) fn encode_outcome(outcome: &StepOutcome) -> String {
    // Plain data of strings and integers: serialising cannot fail; the fallback keeps the row valid.
    serde_json::to_string(outcome).unwrap_or_else(|_| "{}".into())
}

impl RunState {
    /// The brief of a step: only what it needs (its own goal and criteria, the findings and gaps of the
    /// steps it depends on, the run's constraints restated).
    pub(super) fn brief_for(&self, index: usize, task: TaskId) -> SubtaskBrief {
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
            aliases: step
                .task_history
                .iter()
                .copied()
                .filter(|t| *t != task)
                .collect(),
        }
    }

    pub(super) fn depth_of(&self, index: usize, root_depth: u8) -> u8 {
        if self.lead.is_some() && index == 0 {
            root_depth
        } else {
            root_depth.saturating_add(1)
        }
    }
}

impl RunState {
    /// Mints the task ids of the plain first attempts among `steps` (in their order, as
    /// [`RunState::begin_attempt`] would) and answers the lines that name them, for the batch's
    /// decision row: one row a batch instead of one a step (a specialist's admission wrote a row of
    /// about 140 bytes for this alone). A step that is not a plain first attempt, or whose line no
    /// longer fits in [`ANNOUNCED_BYTES_MAX`], keeps its own row.
    pub(super) fn announce_first_attempts(
        &mut self,
        steps: &[usize],
        now: Millis,
        rng: &mut dyn Entropy,
    ) -> String {
        let mut detail = String::new();
        for &index in steps {
            let step = &self.steps[index];
            if step.current_task.is_some()
                || step.failures >= self.config.attempts_per_step_max
                || (self.lead.is_some() && index == 0)
                || follow_up_parent(self, index).is_some()
            {
                continue;
            }
            let key = &self.steps[index].spec.key;
            // The line as the step's own row would have said it.
            let line_bytes = key.len() + 64;
            if detail.len() + line_bytes > ANNOUNCED_BYTES_MAX {
                break;
            }
            let task = mint_task_id(now, rng);
            if !detail.is_empty() {
                detail.push('\n');
            }
            detail.push_str(&format!(
                "step {key}: attempt 1 of task {task} (first attempt)"
            ));
            self.announced.insert(index, task);
        }
        detail
    }

    /// Start the next attempt of a step: a new task for its first attempt or a re-dispatch (reroute,
    /// harness switch, context overflow), the same task with the next attempt number for a restart.
    /// The task row, which carries the attempt number and its idempotency key, is made durable
    /// before admission is asked: it is the durable record that the attempt may start a session
    /// (docs/DESIGN.md §5), so no idempotency row of its own is written beside it.
    pub(super) fn begin_attempt(
        &mut self,
        index: usize,
        reroute: Option<String>,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let root_depth = self.config.root_depth;
        let attempts_max = self.config.attempts_per_step_max;
        if self.steps[index].failures >= attempts_max {
            let failure = self.steps[index]
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
            let reason = format!("retry budget spent: {attempts_max} failed attempts");
            self.park(index, failure, reason, None, now, out);
            return;
        }
        let run_id = self.id;
        let root_id = self.root.id;
        let depth = self.depth_of(index, root_depth);
        let is_lead = self.lead.is_some() && index == 0;
        let previous = self.steps[index].current_task;
        let new_task = previous.is_none() || reroute.is_some();
        // A first attempt its batch's decision row already names (task id and all).
        let announced = self.announced.remove(&index);
        let (task_id, attempt, kind, parent, continuity) = match (previous, new_task) {
            (Some(prev), true) => (
                mint_task_id(now, rng),
                1,
                TaskKind::Redispatch,
                Some(prev),
                Continuity::Resume { from: prev },
            ),
            (Some(prev), false) => {
                let step = &self.steps[index];
                let kind = if is_lead {
                    TaskKind::Root
                } else {
                    step_kind(self, prev)
                };
                // The lead's first attempt works on the root task it was given: a fresh start.
                let continuity = if step.attempts_total == 0 {
                    Continuity::Fresh
                } else {
                    Continuity::Resume { from: prev }
                };
                (prev, step.attempt + 1, kind, None, continuity)
            }
            (None, _) => match follow_up_parent(self, index) {
                // A follow-up continues its thread: its parent is the thread's newest task, and its
                // session gets the standard preamble built from that parent and its ancestors.
                Some(parent) => (
                    self.steps[index]
                        .requested_task
                        .filter(|t| !self.tasks.contains_key(t))
                        .unwrap_or_else(|| mint_task_id(now, rng)),
                    1,
                    TaskKind::FollowUp,
                    Some(parent),
                    Continuity::Standard { parent },
                ),
                None => (
                    announced.unwrap_or_else(|| mint_task_id(now, rng)),
                    1,
                    TaskKind::Subtask,
                    Some(root_id),
                    Continuity::Fresh,
                ),
            },
        };
        if let Some(agent) = reroute {
            self.steps[index].agent = Some(agent);
            // Another agent bills to its own profile's account.
            self.steps[index].account = None;
        }
        let attempt_id = AttemptId {
            run: run_id,
            task: task_id,
            attempt,
        };
        let brief = self.brief_for(index, task_id);
        let key = attempt_id.idempotency_key();
        let mut ops = Vec::new();
        let step_key = self.steps[index].spec.key.clone();
        if new_task
            && let Some(replaced) = previous.and_then(|p| self.replaced_task_end(index, p, now))
        {
            // The task this one replaces ends in the same stage that creates its replacement: the
            // store never holds a replaced task as still running, and a crash before the stage leaves
            // the old task current, so recovery runs it again.
            ops.push(PersistOp::UpdateTask(replaced));
        }
        if new_task {
            let step = &self.steps[index];
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
            self.tasks.insert(task_id, row);
            self.by_task.insert(task_id, index);
            self.steps[index].task_history.push(task_id);
        } else if let Some(row) = self.tasks.get_mut(&task_id) {
            row.attempt = attempt;
            row.status = TaskStatus::Pending;
            row.idempotency_key = Some(key.0.clone());
            row.assignee = self.steps[index].agent.clone();
            row.updated_ms = now;
            ops.push(PersistOp::UpdateTask(row.clone()));
        } else {
            // No row of the task to carry the attempt (never the case on this path: a step's
            // current task was created, or read back on recovery, with its row): the attempt is
            // recorded by an idempotency row of its own, which recovery reads too.
            ops.push(PersistOp::RecordIdempotency(IdempotencyRecord {
                key: key.0.clone(),
                ts_ms: now,
                task_id: Some(task_id),
                effect: format!("start a harness session for step {step_key} attempt {attempt}"),
                result: None,
            }));
        }
        let step = &mut self.steps[index];
        step.current_task = Some(task_id);
        step.attempt = attempt;
        step.attempts_total += 1;
        step.continuity = continuity;
        step.attempt_epoch += 1;
        step.status = StepStatus::Recording;
        step.log_seq = 0;
        step.spent_micros = 0;
        step.charged_micros = 0;
        step.assignment = None;
        step.brief = Some(brief);
        let generation = step.attempt_epoch;
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
        if announced != Some(task_id) {
            self.decide(
                now,
                format_args!("step {step_key}: attempt {attempt} of task {task_id} ({how})"),
            );
        }
        self.stage(
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

    /// The row of `task`, the step's current task that a re-dispatch replaces, ended as failed with
    /// the step's newest failure (or as lost, when none was recorded), and kept in memory so. `None`
    /// when the row is unknown or already terminal.
    fn replaced_task_end(&mut self, index: usize, task: TaskId, now: Millis) -> Option<Task> {
        let failure = self.steps[index]
            .last_failure
            .clone()
            .unwrap_or(SubtaskFailure {
                kind: FailureKind::Crashed,
                attempted: format!("task {task}"),
                partial: Vec::new(),
                retryable: true,
                retry_after_ms: None,
                detail: "replaced by a re-dispatch".into(),
            });
        let row = self.tasks.get_mut(&task)?;
        if row.status.is_terminal() {
            return None;
        }
        row.status = TaskStatus::Failed;
        row.outcome = Some(encode_outcome(&StepOutcome::Failed(failure)));
        row.updated_ms = now;
        Some(row.clone())
    }

    /// A step's backoff timer fired: admit it again or start its next attempt, unless the timer is
    /// stale (a newer attempt began since it was set) or the run is ending.
    pub(super) fn on_redispatch_timer(
        &mut self,
        index: usize,
        generation: u32,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(s) = self.steps.get(index) else {
            return;
        };
        if s.attempt_epoch != generation
            || s.status != StepStatus::Backoff
            || self.phase != Phase::Running
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

    pub(super) fn admit(&mut self, index: usize, out: &mut Vec<Effect>) {
        let root_depth = self.config.root_depth;
        let Some(attempt) = self.steps[index].current(self.id) else {
            return;
        };
        // The brief its attempt was recorded with (nothing it reads changes between the two: its
        // dependencies are done before it is dispatched), else built again (a re-admission).
        let brief = match self.steps[index].brief.take() {
            Some(brief) if brief.task == attempt.task => brief,
            _ => self.brief_for(index, attempt.task),
        };
        let step = &mut self.steps[index];
        step.status = StepStatus::Admitting;
        let kind = self
            .tasks
            .get(&attempt.task)
            .map_or(TaskKind::Subtask, |t| t.kind);
        let req = SpawnRequest {
            attempt,
            depth: self.depth_of(index, root_depth),
            kind,
            agent: self.steps[index].agent.clone(),
            account: self.steps[index].account.clone(),
            estimate_micros: self.steps[index].spec.estimate_micros,
            brief,
            continuity: self.steps[index].continuity,
        };
        self.send(SupervisorMsg::Admit(Box::new(req)), out);
    }

    pub(super) fn backoff(
        &mut self,
        index: usize,
        next: BackoffNext,
        after_ms: Millis,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if after_ms == 0
            && let BackoffNext::NewAttempt { reroute } = next.clone()
        {
            self.begin_attempt(index, reroute, now, rng, out);
            return;
        }
        self.wait_until(index, next, now.saturating_add(after_ms), out);
    }

    /// Park a step in backoff until `at`, when its timer does `next` (unless a newer attempt began).
    fn wait_until(&mut self, index: usize, next: BackoffNext, at: Millis, out: &mut Vec<Effect>) {
        let step = &mut self.steps[index];
        step.status = StepStatus::Backoff;
        step.backoff = next;
        let generation = step.attempt_epoch;
        self.timer(
            CoordinatorTimer::Redispatch {
                step: u32::try_from(index).unwrap_or(u32::MAX),
                generation,
            },
            at,
            out,
        );
    }
}

pub(super) fn step_kind(run: &RunState, task: TaskId) -> TaskKind {
    run.tasks.get(&task).map_or(TaskKind::Subtask, |t| t.kind)
}

impl RunState {
    pub(super) fn on_admission(
        &mut self,
        attempt: AttemptId,
        answer: Result<Assignment, Refusal>,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(&index) = self.by_task.get(&attempt.task) else {
            return;
        };
        if self.steps[index].current(self.id) != Some(attempt) || self.phase != Phase::Running {
            return;
        }
        if self.steps[index].status != StepStatus::Admitting {
            // The attempt's result can overtake its admission answer: still record who ran it, so the
            // task row carries the model resolved from the assignee.
            if let Ok(assignment) = answer
                && self.steps[index].assignment.is_none()
                && let Some(t) = self.tasks.get_mut(&attempt.task)
            {
                t.assignee = Some(assignment.agent.clone());
                t.model = Some(assignment.model.clone());
                t.updated_ms = now;
                let row = t.clone();
                self.steps[index].assignment = Some(assignment);
                self.stage_riding(vec![PersistOp::UpdateTask(row)], Then::Nothing, now, out);
            }
            return;
        }
        match answer {
            Ok(assignment) => {
                // No decision row: the admission is recorded by the task row (assignee, model,
                // running) written below and by the session's first log row (its account and
                // model, on the task's own log); the root's log kept a third copy of it.
                self.steps[index].status = StepStatus::Running;
                if let Some(t) = self.tasks.get_mut(&attempt.task) {
                    t.assignee = Some(assignment.agent.clone());
                    t.model = Some(assignment.model.clone());
                    t.status = TaskStatus::Running;
                    t.updated_ms = now;
                    let row = t.clone();
                    self.steps[index].assignment = Some(assignment);
                    // The admission's record rides with the next commit (the attempt's first
                    // results, most often): recovery treats a pending and a running task alike.
                    self.stage_riding(vec![PersistOp::UpdateTask(row)], Then::Nothing, now, out);
                } else {
                    self.steps[index].assignment = Some(assignment);
                }
            }
            Err(refusal) => {
                // A step waiting for a slot is asked about again every second or so: log a refusal
                // when its kind changes, not every time, so waiting cannot flood the run's log.
                let kind = std::mem::discriminant(&refusal);
                let key = self.steps[index].spec.key.clone();
                if self.steps[index].last_refusal != Some(kind) {
                    self.steps[index].last_refusal = Some(kind);
                    self.decide(
                        now,
                        format_args!("step {key}: admission of {attempt} refused: {refusal:?}"),
                    );
                }
                if let Some(after) = refusal.retry_after_ms() {
                    let at = now.saturating_add(after.max(1));
                    self.wait_until(index, BackoffNext::Readmit, at, out);
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
}
