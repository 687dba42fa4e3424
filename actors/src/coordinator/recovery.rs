//! Recovery: a coordinator's state rebuilt from the rows the store returns after a crash.

use super::lead::Lead;
use super::snapshot::Snapshot;
use super::staging::Then;
use super::step::{BackoffNext, Step};
use super::{Coordinator, LEAD_STEP_KEY, Phase, RunState, StepStatus};
use crate::effect::Effect;
use crate::machine::{Entropy, Millis};
use crate::message::{FollowUpRequest, RecoveredRun, SupervisorMsg};
use crate::persist::PersistOp;
use crate::plan::{Plan, PlanStep, validate};
use crate::report::{StepOutcome, TEXT_BYTES_MAX, bounded};
use keel_store::{Run, RunStatus, Task, TaskId, TaskKind, TaskStatus};
use std::collections::{BTreeMap, BTreeSet};

impl Coordinator {
    pub(super) fn recover(
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

pub(super) fn empty_state(row: Run, now: Millis) -> RunState {
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
