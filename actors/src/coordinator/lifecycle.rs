//! A run's start and end: accepting a run, moving it forward batch by batch, and finishing it.

use super::follow_up::ready_follow_ups;
use super::lead::Lead;
use super::staging::Then;
use super::step::{Step, usable_report};
use super::synthesis::{StepEnd, synthesize};
use super::{CoordinatorConfig, LEAD_STEP_KEY, Phase, RunState, StepStatus, bytes_max};
use crate::effect::Effect;
use crate::ids::mint_task_id;
use crate::machine::{Entropy, Millis};
use crate::message::{RunMode, RunSpec, SupervisorMsg};
use crate::persist::PersistOp;
use crate::plan::{PLAN_STEPS_MAX, PlanStep, validate};
use crate::report::{StepOutcome, TEXT_BYTES_MAX, bounded};
use keel_store::{Budget, Run, RunId, RunStatus, Task, TaskId, TaskKind, TaskStatus};

impl RunState {
    /// A new run from its spec: the run row and root task are staged, the plan is validated (a
    /// rejected plan ends the run as failed), and the first batch (or the lead) is dispatched.
    pub(super) fn accept(
        config: CoordinatorConfig,
        spec: RunSpec,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) -> RunState {
        let root_id = mint_task_id(now, rng);
        let brief = bounded(
            spec.brief.clone(),
            bytes_max(config.store_limits.brief_bytes_max),
        );
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
            config_snapshot: bounded(
                spec.config_snapshot.clone(),
                bytes_max(config.store_limits.text_bytes_max),
            ),
            outcome: None,
        };
        let root = root_task(
            root_id,
            spec.run,
            config.root_depth,
            brief.clone(),
            bounded(spec.brief.clone(), TEXT_BYTES_MAX),
            now,
        );
        let mut state = RunState::empty(config, row, now);
        state.root = root.clone();
        match spec.mode {
            RunMode::Plan(plan) => match validate(plan) {
                Ok(valid) => {
                    state.constraints = valid.plan().constraints.clone();
                    for s in &valid.plan().steps {
                        let deps = s
                            .depends_on
                            .iter()
                            .filter_map(|d| valid.index_of(d))
                            .collect();
                        let mut step = Step::new(s.clone(), deps);
                        if step.spec.estimate_micros == 0 {
                            step.spec.estimate_micros = state.config.default_estimate_micros;
                        }
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
                    let (steps, batches) = (state.steps.len(), state.batches.len());
                    state.decide(
                        now,
                        format_args!(
                            "plan accepted: {steps} steps in {batches} batches [{}]",
                            shape.join("] [")
                        ),
                    );
                }
                Err(e) => {
                    state.decide(now, format_args!("plan rejected: {e}"));
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
                    return state;
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
                    estimate_micros: state.config.default_estimate_micros,
                };
                let mut step = Step::new(spec, Vec::new());
                // The lead works on the root task itself.
                step.current_task = Some(root.id);
                step.task_history.push(root.id);
                state.steps.push(step);
                state.by_task.insert(root.id, 0);
                state.batches = vec![vec![0]];
                state.lead = Some(Lead::default());
                state.decide(now, "lead mode: the lead agent decomposes the brief");
            }
        }
        state.tasks.insert(root.id, root.clone());
        let ops = vec![
            PersistOp::CreateRun(state.row.clone()),
            PersistOp::CreateTask(root),
        ];
        state.stage(ops, Then::Nothing, true, now, out);
        // The plan is stored once, with the run's creation (in its own table); the row's later
        // updates leave it there, so the coordinator does not carry (nor rewrite) its text.
        state.row.plan = None;
        state.send(
            SupervisorMsg::OpenRun {
                run: state.id,
                budget: state.row.budget,
            },
            out,
        );
        state.advance(now, rng, out);
        state
    }

    /// Move the run forward: dispatch the next batch (or turn) when the current one is done, skip steps
    /// whose dependencies produced nothing usable, and finish when nothing is left.
    pub(super) fn advance(&mut self, now: Millis, rng: &mut dyn Entropy, out: &mut Vec<Effect>) {
        if self.phase != Phase::Running {
            return;
        }
        let ready = ready_follow_ups(self);
        for i in ready {
            self.begin_attempt(i, None, now, rng, out);
        }
        if self.lead.is_some() {
            self.advance_lead(now, rng, out);
            return;
        }
        // Bounded: each pass either dispatches a batch and returns, or moves past a finished batch.
        for _ in 0..=PLAN_STEPS_MAX {
            let Some(batch) = self.batches.get(self.batch).cloned() else {
                if self.steps.iter().all(|s| s.status == StepStatus::Done) {
                    self.finish(now, out);
                }
                return;
            };
            let waiting: Vec<usize> = batch
                .iter()
                .copied()
                .filter(|&i| self.steps[i].status == StepStatus::Waiting)
                .collect();
            if waiting.is_empty() {
                if batch
                    .iter()
                    .all(|&i| self.steps[i].status == StepStatus::Done)
                {
                    self.batch += 1;
                    continue;
                }
                return; // the batch is in flight
            }
            let keys: Vec<&str> = waiting
                .iter()
                .map(|&i| self.steps[i].spec.key.as_str())
                .collect();
            let summary = format!(
                "dispatch batch {} together: [{}]",
                self.batch + 1,
                keys.join(", ")
            );
            let plans: Vec<(usize, Vec<String>)> = waiting
                .into_iter()
                .map(|i| {
                    let unusable = self.steps[i]
                        .deps
                        .iter()
                        .filter(|&&d| self.steps[d].usable_report().is_none())
                        .map(|&d| self.steps[d].spec.key.clone())
                        .collect();
                    (i, unusable)
                })
                .collect();
            let starting: Vec<usize> = plans
                .iter()
                .filter(|(_, unusable)| unusable.is_empty())
                .map(|(i, _)| *i)
                .collect();
            let detail = self.announce_first_attempts(&starting, now, rng);
            self.decide_detailed(now, summary, detail);
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
            self.announced.clear();
            return;
        }
    }

    /// End the run now with a status that is not a synthesis (budget, cancel, store unavailable).
    pub(super) fn finish_with(
        &mut self,
        status: RunStatus,
        outcome: String,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        if self.phase != Phase::Running {
            return;
        }
        self.phase = Phase::Finishing;
        self.decide(now, format_args!("run ends: {status:?}: {outcome}"));
        // The tasks still in flight are cancelled first, in stages of their own when they do not fit
        // beside the run's end: each cancelled row stands alone, and the run ends only with the last
        // stage (its row, its root, its checkpoint). A crash in between leaves a running run whose
        // cancelled tasks recovery runs again, as if the end had never been decided.
        let mut stopped = Vec::new();
        for step in &mut self.steps {
            if step.status != StepStatus::Done
                && let Some(task) = step.current_task
                && let Some(t) = self.tasks.get_mut(&task)
                && !t.status.is_terminal()
            {
                t.status = TaskStatus::Cancelled;
                t.updated_ms = now;
                stopped.push(PersistOp::UpdateTask(t.clone()));
            }
        }
        self.row.status = status;
        self.row.outcome = Some(bounded(
            outcome.clone(),
            bytes_max(self.config.store_limits.output_bytes_max),
        ));
        self.row.updated_ms = now;
        let mut end = vec![PersistOp::UpdateRun(self.row.clone())];
        if self.lead.is_none() {
            let mut root = self.root.clone();
            root.status = TaskStatus::Cancelled;
            root.updated_ms = now;
            end.push(PersistOp::UpdateTask(root));
        }
        let room = self.stage_ops_max() - end.len() - 1;
        let ops = if stopped.len() <= room {
            stopped.extend(end);
            stopped
        } else {
            self.stage_independent(stopped, out);
            end
        };
        self.stage(ops, Then::Finished { status, outcome }, true, now, out);
    }

    /// Whether a result may still arrive soon from another step: one being recorded, admitted or
    /// running. While one may, a result rides with the next commit instead of starting its own.
    pub(super) fn results_expected(&self) -> bool {
        self.steps.iter().any(|s| {
            matches!(
                s.status,
                StepStatus::Recording | StepStatus::Admitting | StepStatus::Running
            )
        })
    }

    /// Stage the run's end right behind the last result it waited for, before that result is
    /// durable, when every step's outcome is decided (durable, or in a stage sent before this one)
    /// and nothing is left to dispatch: the results and the end share one commit. Stages commit in
    /// ticket order, so the end is never durable without the results; a crash after that commit and
    /// before the acknowledgements leaves results durable but unacknowledged in an ended run, which
    /// the host answers from the store (`host::decide::answer_after_end`).
    pub(super) fn finish_if_decided(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let decided = self
            .steps
            .iter()
            .all(|s| matches!(s.status, StepStatus::Done | StepStatus::Committing));
        if decided && self.lead.is_none() {
            self.finish(now, out);
        }
    }

    /// Each step's outcome as decided: durable, or in a stage on its way (a step whose result or
    /// parking is being committed).
    fn decided_outcomes(&self) -> Vec<Option<&StepOutcome>> {
        let mut outcomes: Vec<Option<&StepOutcome>> =
            self.steps.iter().map(|s| s.outcome.as_ref()).collect();
        for pending in self.pending.values() {
            if let Then::Accepted { step, outcome, .. } | Then::Parked { step, outcome } =
                &pending.then
                && let Some(slot) = outcomes.get_mut(*step)
                && slot.is_none()
            {
                *slot = Some(&**outcome);
            }
        }
        outcomes
    }

    /// End the run with a synthesis: a failure stays a failure, partial coverage is annotated.
    pub(super) fn finish(&mut self, now: Millis, out: &mut Vec<Effect>) {
        if self.phase != Phase::Running {
            return;
        }
        self.phase = Phase::Finishing;
        let outcomes = self.decided_outcomes();
        let ends: Vec<StepEnd<'_>> = self
            .steps
            .iter()
            .zip(&outcomes)
            .map(|(s, outcome)| StepEnd {
                key: &s.spec.key,
                outcome: *outcome,
            })
            .collect();
        let synthesis = synthesize(&ends);
        let usable = outcomes.iter().any(|o| usable_report(*o).is_some());
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
        self.decide(
            now,
            format_args!("synthesis: {:?}; {}", status, synthesis.summary),
        );
        self.row.status = status;
        self.row.outcome = Some(outcome.clone());
        self.row.updated_ms = now;
        let mut root = self
            .tasks
            .get(&self.root.id)
            .cloned()
            .unwrap_or_else(|| self.root.clone());
        if self.lead.is_none() {
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
            PersistOp::UpdateRun(self.row.clone()),
        ];
        self.stage(ops, Then::Finished { status, outcome }, true, now, out);
    }
}

/// A run's root task as the coordinator first holds it: running, attempt 0, with no assignee, model or
/// outcome yet. One constructor for a new run and for a recovery's placeholder, so the two cannot drift.
pub(super) fn root_task(
    id: TaskId,
    run: RunId,
    depth: u8,
    brief: String,
    goal: String,
    now: Millis,
) -> Task {
    Task {
        id,
        run_id: run,
        parent: None,
        depth,
        kind: TaskKind::Root,
        brief,
        goal,
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
    }
}
