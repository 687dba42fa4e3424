//! Recovery: a run's state rebuilt from the rows the store returns after a crash or a restart
//! (docs/DESIGN.md §8).
//!
//! The durable truth is the rows, never memory: the run row (status, plan, budget), the task rows
//! (each step's outcome and done-marker land in one transaction), the idempotency records (which
//! attempts were started), and the checkpoint's [`Snapshot`] (which tasks belong to which step, how
//! far the attempts went). From them a step is either done (its outcome is durable: it is never run
//! again), dispatched but not acknowledged (it runs again as the next attempt, so a late result of
//! the old attempt is refused as stale), or not started yet. Nothing is guessed: a run without a root
//! task ends as failed, and a finished run stays finished.

use super::lead::{Lead, LeadTurn};
use super::snapshot::{Snapshot, StepSnapshot};
use super::staging::Then;
use super::step::{BackoffNext, Step};
use super::{CoordinatorConfig, LEAD_STEP_KEY, Phase, RunState, StepStatus};
use crate::effect::Effect;
use crate::machine::{Entropy, Millis};
use crate::message::{FollowUpRequest, RecoveredRun, SupervisorMsg};
use crate::persist::PersistOp;
use crate::plan::{Plan, PlanStep, validate};
use crate::report::{StepOutcome, TEXT_BYTES_MAX, bounded};
use keel_store::{IdempotencyRecord, Run, RunStatus, Task, TaskId, TaskKind};
use std::collections::BTreeMap;

impl RunState {
    /// The run's state rebuilt from `rows`, then moved forward: steps that were dispatched but not
    /// acknowledged start their next attempt, a follow-up that came with the rows (a reopened run) is
    /// queued first, and a run whose steps are all durable finishes.
    ///
    /// A run whose row is terminal comes back as a terminal state that accepts nothing; a run with no
    /// root task to continue from ends as failed.
    pub(super) fn recover(
        config: CoordinatorConfig,
        rows: RecoveredRun,
        follow_up: Option<FollowUpRequest>,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) -> RunState {
        let RecoveredRun {
            run: row,
            checkpoint,
            tasks,
            idempotency,
            escalations,
        } = rows;
        if row.status.is_terminal() {
            // Nothing more happens to a finished run: a host that recovers one gets a terminal
            // coordinator that accepts nothing, rather than a run that starts again. A follow-up that
            // came with these rows is dropped with them: a terminal coordinator writes nothing (a host
            // reopens a run by marking it running before it sends its rows).
            let status = row.status;
            let mut state = RunState::empty(config, row, now);
            state.phase = Phase::Done(status);
            return state;
        }
        let tasks: BTreeMap<TaskId, Task> = tasks.into_iter().map(|t| (t.id, t)).collect();
        let snapshot = checkpoint
            .as_ref()
            .and_then(|c| serde_json::from_str::<Snapshot>(&c.state).ok());
        let Some(root) = find_root(snapshot.as_ref(), &tasks) else {
            return RunState::without_root(config, row, now, out);
        };
        let mut state = RunState::empty(config, row.clone(), now);
        state.root = root.clone();
        state.tasks = tasks;
        state.next_ticket = 1;
        let (lead, snap_steps) = match snapshot {
            Some(s) => (s.lead, s.steps),
            None => (false, Vec::new()),
        };
        if lead {
            state.lead = Some(Lead::default());
            state.batches = vec![vec![0]];
        } else {
            state.rebuild_plan(&row);
        }
        // The stored plan stays in the store: updates of the row leave it (see `accept`).
        state.row.plan = None;
        let attempts = attempts_started(&idempotency);
        let waiting: BTreeMap<TaskId, keel_store::EscalationId> = escalations
            .iter()
            .filter(|e| e.is_open() && e.waiting == keel_store::EscalationWait::Task)
            .filter_map(|e| e.task_id.map(|t| (t, e.id)))
            .collect();
        let (done, redispatch) = state.restore_steps(snap_steps, &attempts, &waiting);
        if lead {
            state.restore_lead(&row, root.id);
        }
        state.batch = state.first_open_batch();
        let resume_at = state.batch + 1;
        state.decide(
            now,
            format_args!(
                "recovered from checkpoint: {done} steps durable, {redispatch} to run again, resuming at batch {resume_at}"
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
            state.queue_follow_up(f, now, out);
        }
        // Steps that were dispatched run again; a recovered lead's delegations of its active turn that
        // never started start now (a queued turn starts when the active one is answered).
        let active: Vec<usize> = state
            .lead
            .as_ref()
            .and_then(|l| l.active.as_ref())
            .map(|t| t.calls.iter().map(|(i, _)| *i).collect())
            .unwrap_or_default();
        let resume: Vec<usize> = state
            .steps
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                s.status == StepStatus::Backoff
                    || (active.contains(i) && s.status == StepStatus::Waiting)
            })
            .map(|(i, _)| i)
            .collect();
        for i in resume {
            state.begin_attempt(i, None, now, rng, out);
        }
        // Lead runs with open delegated steps already started them above; for a lead whose turns all
        // finished, `advance` finishes the run when the lead is done too.
        state.advance(now, rng, out);
        state
    }

    /// A run with nothing durable beyond its row: there is no root task to continue from. It ends as
    /// failed rather than guess.
    fn without_root(
        config: CoordinatorConfig,
        mut row: Run,
        now: Millis,
        out: &mut Vec<Effect>,
    ) -> RunState {
        let id = row.id;
        row.status = RunStatus::Failed;
        row.outcome = Some("recovery found no root task and no checkpoint".into());
        row.updated_ms = now;
        let mut state = RunState::empty(config, row.clone(), now);
        state.phase = Phase::Finishing;
        state.decide(now, "recovery: no root task; the run fails");
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
        state
    }

    /// The plan's steps, their dependencies and batches, from the run row (a checkpoint does not repeat
    /// them). A plan that no longer validates leaves no batches.
    fn rebuild_plan(&mut self, row: &Run) {
        let plan: Option<Plan> = row
            .plan
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok());
        let Some(plan) = plan else {
            return;
        };
        match validate(plan) {
            Ok(valid) => {
                self.constraints = valid.plan().constraints.clone();
                self.batches = valid.batches().to_vec();
                self.plan_len = valid.plan().steps.len();
                for s in &valid.plan().steps {
                    let deps = s
                        .depends_on
                        .iter()
                        .filter_map(|d| valid.index_of(d))
                        .collect();
                    self.steps.push(Step::new(s.clone(), deps));
                }
            }
            Err(_) => self.batches = Vec::new(),
        }
    }

    /// What happened to each step, from the snapshot and the task rows. Steps beyond the plan (a
    /// lead's delegations, follow-ups) come back from the spec the snapshot kept. A step whose outcome
    /// is durable is done; a step that was dispatched but not acknowledged waits to run again as its
    /// next attempt. Returns how many steps are done and how many run again.
    fn restore_steps(
        &mut self,
        snapshots: Vec<StepSnapshot>,
        attempts: &BTreeMap<TaskId, u32>,
        waiting: &BTreeMap<TaskId, keel_store::EscalationId>,
    ) -> (u32, u32) {
        let run_id = self.id;
        let mut redispatch = 0u32;
        let mut done = 0u32;
        for (i, snap) in snapshots.into_iter().enumerate() {
            if i >= self.steps.len() {
                let Some(spec) = snap.spec.clone() else {
                    break; // a step beyond the plan without its spec: nothing to rebuild it from
                };
                self.steps.push(Step::new(spec, Vec::new()));
            }
            let step = &mut self.steps[i];
            step.thread = snap.thread;
            step.call_id = snap.call_id.clone();
            step.turn = snap.turn;
            step.requested_task = snap.preset;
            step.task_history = snap.tasks.clone();
            step.current_task = snap.tasks.last().copied();
            step.attempts_total = snap.attempts_total;
            step.failures = snap.failures;
            step.last_failure = snap.last_failure.clone();
            step.agent = snap.agent.clone();
            step.account = snap.account.clone();
            step.attempt = snap.attempt;
            if let Some(task) = step.current_task {
                // The newest attempt anything durable knows of: the snapshot, the task row (which
                // carries the attempt it was last started for, durable before that session), or an
                // idempotency record (an older store's, or one written for a task without a row).
                let row_attempt = self.tasks.get(&task).map_or(0, |t| t.attempt);
                step.attempt = step
                    .attempt
                    .max(row_attempt)
                    .max(attempts.get(&task).copied().unwrap_or(0));
            }
            for t in &snap.tasks {
                self.by_task.insert(*t, i);
            }
            if let Some(reason) = snap.skipped {
                step.outcome = Some(StepOutcome::Skipped { reason });
                step.status = StepStatus::Done;
                done += 1;
                continue;
            }
            let durable = step
                .current_task
                .and_then(|t| self.tasks.get(&t))
                .filter(|t| t.status.is_terminal())
                .and_then(|t| t.outcome.as_deref())
                .and_then(|o| serde_json::from_str::<StepOutcome>(o).ok());
            match durable {
                Some(outcome) => {
                    if matches!(outcome, StepOutcome::Report(_)) {
                        step.accepted = step.current(run_id);
                    }
                    step.outcome = Some(outcome);
                    step.status = StepStatus::Done;
                    done += 1;
                }
                None if step.current_task.is_some_and(|t| waiting.contains_key(&t)) => {
                    // Its session escalated to a human who has not answered yet: it keeps waiting
                    // (the answer starts its next attempt).
                    step.status = StepStatus::AwaitingHuman;
                    step.awaiting = step
                        .current_task
                        .and_then(|t| waiting.get(&t))
                        .map(|&id| (id, super::session_tools::EscalatedEnd::Settled));
                }
                None if step.current_task.is_some() => {
                    // Dispatched but not acknowledged: run again as the next attempt, with a resume
                    // preamble; a late result of the old attempt is refused as stale.
                    step.status = StepStatus::Backoff;
                    step.backoff = BackoffNext::NewAttempt { reroute: None };
                    redispatch += 1;
                }
                None => {}
            }
        }
        (done, redispatch)
    }

    /// A lead run's own step (on the root task) when the snapshot had none, and its delegation turns.
    /// The session that asked for them is gone (the lead runs again as a new attempt, whose turns
    /// number from 1), so they come back without an owner: the open ones run in order, the first
    /// active and the rest queued, and the turns taken still count against the limit. A new session
    /// asking again for one of these subtasks gets its step (lead.rs), never a second one.
    fn restore_lead(&mut self, row: &Run, root: TaskId) {
        if self.steps.is_empty() {
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
            step.current_task = Some(root);
            step.task_history.push(root);
            self.by_task.insert(root, 0);
            self.steps.push(step);
        }
        let delegated: Vec<usize> = (1..self.steps.len())
            .filter(|&i| self.steps[i].thread.is_none())
            .collect();
        let mut turns: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        let mut untold = Vec::new();
        for &i in &delegated {
            match self.steps[i].turn {
                Some(turn) => turns.entry(turn).or_default().push(i),
                None => untold.push(i),
            }
        }
        // An older checkpoint does not say which turn asked for what: its delegations count as one
        // turn each (an upper bound on the turns used) and the open ones finish as one turn.
        let untold_count = u32::try_from(untold.len()).unwrap_or(u32::MAX);
        if !untold.is_empty() {
            for (n, &i) in untold.iter().enumerate() {
                self.steps[i].turn = Some(u32::try_from(n).unwrap_or(u32::MAX).saturating_add(1));
            }
            turns = BTreeMap::from([(0, untold)]);
        }
        let newest = turns.keys().next_back().copied().unwrap_or(0);
        let mut open = std::collections::VecDeque::new();
        for (turn, steps) in turns {
            if steps
                .iter()
                .any(|&i| self.steps[i].status != StepStatus::Done)
            {
                let calls = steps
                    .into_iter()
                    .map(|i| (i, self.steps[i].call_id.clone().unwrap_or_default()))
                    .collect();
                open.push_back(LeadTurn {
                    owner: None,
                    turn,
                    calls,
                });
            }
        }
        if let Some(l) = self.lead.as_mut() {
            l.turns_taken = newest.max(untold_count);
            l.active = open.pop_front();
            l.queue = open;
        }
    }

    /// The first batch with a step that is not done (the number of batches when all are done).
    fn first_open_batch(&self) -> usize {
        self.batches
            .iter()
            .position(|b| {
                b.iter().any(|&i| {
                    self.steps
                        .get(i)
                        .is_none_or(|s| s.status != StepStatus::Done)
                })
            })
            .unwrap_or(self.batches.len())
    }
}

/// The run's root task: the one the snapshot names, else the task row of kind root without a parent.
fn find_root(snapshot: Option<&Snapshot>, tasks: &BTreeMap<TaskId, Task>) -> Option<Task> {
    snapshot
        .and_then(|s| tasks.get(&s.root).cloned())
        .or_else(|| {
            tasks
                .values()
                .find(|t| t.kind == TaskKind::Root && t.parent.is_none())
                .cloned()
        })
}

/// The newest attempt number started per task, from the idempotency records (their keys end in
/// `/<attempt>`): a record is written before its session starts, so it can be newer than the snapshot.
/// The task row itself carries its newest attempt (written in the stage that starts it), so the
/// coordinator writes a record only for an attempt whose task has no row in memory; the records an
/// older keel wrote for every attempt are still read here. No store format change: an older keel
/// reading a store without them takes the attempt from the task row alike.
fn attempts_started(records: &[IdempotencyRecord]) -> BTreeMap<TaskId, u32> {
    records.iter().fold(BTreeMap::new(), |mut m, r| {
        if let (Some(task), Some(n)) = (
            r.task_id,
            r.key.rsplit('/').next().and_then(|n| n.parse::<u32>().ok()),
        ) {
            let e = m.entry(task).or_insert(0);
            *e = (*e).max(n);
        }
        m
    })
}
