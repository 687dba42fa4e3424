//! The operator's interventions, carried out as the runtime does them: a pause (SIGTERM of the
//! coordinator node), a cancel, and a follow-up that joins a running run or reopens an ended one. Each
//! decision is `keel_actors::host::decide`'s, over the run's rows as the store holds them; the rows it
//! answers are committed as one host stage before the host acts on them.

use keel_actors::coordinator::Snapshot;
use keel_actors::host::decide::{self, FollowUpRoute, Marks};
use keel_actors::host::{self};
use keel_actors::{
    CommitBatch, CommitId, Coordinator, CoordinatorInput, CoordinatorMsg, Effect, FollowUpRequest,
    PersistOp, SpecialistMsg, Stage, StageOwner,
};
use keel_store::{RunId, RunStatus, TaskId, TaskStatus};

use crate::mutation::Mutation;
use crate::net::NodeId;

use super::World;
use super::event::Ev;

/// The reason the specialists of a pausing node are given.
pub const PAUSE_REASON: &str = "the node is shutting down (pause)";

/// Mixed into the seed (with the event number) for the id a follow-up's task takes: a stream of
/// its own, so choosing the id draws nothing from the world's.
const FOLLOW_UP_ID_STREAM: u64 = 0x666f_6c6c_6f77_7570;

/// A follow-up handed to a coordinator whose id is not announced yet: it is once the follow-up is
/// durable, as `Runtime::follow_up` returns it only then.
#[derive(Debug, Clone, Copy)]
pub(super) struct Announcing {
    run: RunId,
    task: TaskId,
    /// Crash the coordinator node for this long right after the announcement.
    crash_down_ms: Option<u64>,
}

/// Whether the follow-up `task` of `run` is durable: its task row is in the store, or its step
/// (with the id it will take) is in the run's checkpoint.
pub(super) fn follow_up_durable(store: &keel_store::Store, run: RunId, task: TaskId) -> bool {
    let scope = store.run(run);
    if scope.task(task).is_ok() {
        return true;
    }
    scope
        .checkpoint()
        .ok()
        .flatten()
        .and_then(|c| serde_json::from_str::<Snapshot>(&c.state).ok())
        .is_some_and(|s| s.steps.iter().any(|step| step.preset == Some(task)))
}

impl World {
    /// Commits a decision's marks for `run` as one host stage; they pass the checker first, like
    /// every write. Whether they became durable.
    pub(super) fn commit_marks(&mut self, run: RunId, marks: Marks) -> bool {
        // The host's tickets count on their own (its stages name their owner), from 1 like a
        // coordinator's. The commit bypasses the checkpoint writer, so its id answers nobody.
        self.host_stages += 1;
        let n = self.host_stages;
        let batch = CommitBatch {
            id: CommitId(n),
            stages: vec![Stage {
                run,
                owner: StageOwner::Host,
                ticket: n,
                ops: marks.ops.into(),
            }]
            .into(),
        };
        let effect = Effect::Persist(batch);
        self.checker
            .coord_effect(self.event_no, self.now, Some(run), &effect, None);
        let Effect::Persist(batch) = effect else {
            return false;
        };
        self.commits += 1;
        match host::store::commit(self.store.store(), &batch) {
            Ok(()) => true,
            Err(e) => {
                self.checker.commit_failed(self.event_no, &e);
                self.checker.world_bound(
                    self.event_no,
                    format!("the host's marks for run {run} did not commit: {e}"),
                );
                false
            }
        }
    }

    /// A graceful shutdown of the coordinator node (SIGTERM): the specialists are told to stop, every
    /// run it hosts is marked paused, the node stops, and after `down_ms` it starts again (the
    /// restart resumes the paused runs).
    pub(super) fn pause(&mut self, down_ms: u64) {
        let Some(node) = &self.coord else { return };
        let runs: Vec<RunId> = node.coordinators.keys().copied().collect();
        let placed: Vec<_> = node.supervisor.live_attempts().collect();
        for attempt in placed {
            self.send_to_specialist(
                attempt,
                SpecialistMsg::Cancel {
                    reason: PAUSE_REASON.into(),
                },
            );
        }
        for run in runs {
            // A run whose row never became durable has nothing to mark: its submitter submits it
            // again after the restart.
            let Ok(rows) = host::store::recover_run(self.store.store(), run) else {
                continue;
            };
            if let Some(mut marks) = decide::pause(&rows.run, &rows.tasks, self.now) {
                if self.config.mutation == Some(Mutation::PauseCancelsRun) {
                    for op in &mut marks.ops {
                        match op {
                            PersistOp::UpdateTask(t) => t.status = TaskStatus::Cancelled,
                            PersistOp::UpdateRun(r) => r.status = RunStatus::Cancelled,
                            _ => {}
                        }
                    }
                    for root in rows.tasks.iter().filter(|t| t.parent.is_none()) {
                        let mut root = root.clone();
                        root.status = TaskStatus::Cancelled;
                        marks.ops.insert(0, PersistOp::UpdateTask(root));
                    }
                }
                self.commit_marks(run, marks);
            }
        }
        self.coord = None;
        self.coord_inc += 1;
        self.checker.coordinator_paused();
        self.withdraw_undurable_cancels();
        self.schedule(self.now + down_ms, Ev::Restart(NodeId::COORDINATOR));
    }

    /// On the coordinator node's restart, before recovery: every paused run is marked running again
    /// (`keel resume`), so its coordinator is rebuilt from its rows.
    pub(super) fn resume_paused_runs(&mut self) {
        let open = match host::store::open_runs(self.store.store()) {
            Ok(open) => open,
            Err(e) => {
                self.checker
                    .world_bound(self.event_no, format!("open runs unreadable: {e}"));
                return;
            }
        };
        for run in open {
            let Ok(row) = self.store.store().run(run).get() else {
                continue;
            };
            if row.status != RunStatus::Paused {
                continue;
            }
            match decide::resume(false, &row, self.now) {
                Ok(Some(marks)) => {
                    self.commit_marks(run, marks);
                }
                Ok(None) => {}
                Err(refusal) => self.checker.operator_refused(run, refusal.to_string()),
            }
        }
    }

    /// The coordinator node went away: a cancel that was sent to a coordinator but is not durable
    /// yet did not take (the operator sees the cancel fail and may retry). The same for a step's
    /// cancel, and a follow-up not announced yet is gone with the process that was asked for it.
    pub(super) fn withdraw_undurable_cancels(&mut self) {
        self.announcing.clear();
        for (run, step) in self.checker.cancelled_steps() {
            if !self.step_cancel_durable(run, &step) {
                self.checker.step_cancel_withdrawn(run, &step);
            }
        }
        for run in self.checker.cancelled_runs() {
            let durable = self
                .store
                .store()
                .run(run)
                .get()
                .is_ok_and(|r| r.status == RunStatus::Cancelled);
            if !durable {
                self.checker.cancel_withdrawn(run);
            }
        }
    }

    /// An operator cancels `run`: its coordinator is told when this node hosts it; otherwise the
    /// run's rows are cancelled in the store.
    pub(super) fn cancel(&mut self, run: RunId, reason: String) {
        if self.cancel_goes_to_coordinator(run) {
            let ended = self.run_ended(run);
            if ended && self.config.mutation == Some(Mutation::CancelEndedRun) {
                self.cancel_ended(run, &reason);
                return;
            }
            if !ended {
                self.checker.cancel_requested(run);
            }
            self.deliver_coord(
                run,
                CoordinatorInput::Msg(CoordinatorMsg::Cancel { reason }),
            );
            return;
        }
        let Some(rows) = self.rows_to_cancel(run) else {
            return;
        };
        match decide::cancel_stored(false, &rows.run, &rows.tasks, &reason, self.now) {
            Ok(marks) => {
                if self.commit_marks(run, marks) {
                    self.checker.cancel_requested(run);
                }
            }
            Err(decide::Refusal::Terminal { .. })
                if self.config.mutation == Some(Mutation::CancelEndedRun) =>
            {
                self.cancel_ended(run, &reason);
            }
            Err(refusal) => self.checker.operator_refused(run, refusal.to_string()),
        }
    }

    /// Whether a cancel of `run` goes to its coordinator: this node hosts it (and the host is not
    /// [`Mutation::CancelAsIfNotHosted`]).
    fn cancel_goes_to_coordinator(&self, run: RunId) -> bool {
        let hosted = self
            .coord
            .as_ref()
            .is_some_and(|c| c.coordinators.contains_key(&run));
        hosted && self.config.mutation != Some(Mutation::CancelAsIfNotHosted)
    }

    /// The stored rows of `run` a cancel decides over (`None`, and the refusal noted, when they
    /// cannot be read).
    fn rows_to_cancel(&mut self, run: RunId) -> Option<keel_actors::RecoveredRun> {
        match host::store::recover_run(self.store.store(), run) {
            Ok(rows) => Some(rows),
            Err(e) => {
                self.checker
                    .operator_refused(run, format!("the run's rows are unreadable: {e}"));
                None
            }
        }
    }

    /// Whether `run` has ended in the store.
    fn run_ended(&self, run: RunId) -> bool {
        self.store
            .store()
            .run(run)
            .get()
            .is_ok_and(|r| r.status.is_terminal())
    }

    /// [`Mutation::CancelEndedRun`]: the run's row is written cancelled although it has ended.
    fn cancel_ended(&mut self, run: RunId, reason: &str) {
        let Ok(mut row) = self.store.store().run(run).get() else {
            return;
        };
        row.status = RunStatus::Cancelled;
        row.outcome = Some(format!("cancelled: {reason}"));
        row.updated_ms = self.now;
        self.commit_marks(
            run,
            Marks {
                ops: vec![PersistOp::UpdateRun(row)],
                tasks: 0,
            },
        );
    }

    /// The first task `step` of `run` was dispatched as, as the checker saw it spawned.
    fn first_task_of(&self, run: RunId, step: &str) -> Option<TaskId> {
        self.checker
            .observed()
            .spawns
            .iter()
            .find(|(a, s)| a.run == run && s.step == step)
            .map(|(a, _)| a.task)
    }

    /// The newest task of `step`'s re-dispatch chain in the store (the task its status is the
    /// step's), starting from the first task the checker saw spawned for it.
    fn newest_task_of(&self, run: RunId, step: &str) -> Option<keel_store::Task> {
        let first = self.first_task_of(run, step)?;
        let tasks = host::store::all_tasks(&self.store.store().run(run)).ok()?;
        let mut last = tasks.iter().find(|t| t.id == first)?;
        // Bounded by the number of tasks: each step moves to a newer task.
        for _ in 0..tasks.len() {
            match tasks
                .iter()
                .filter(|t| t.kind == keel_store::TaskKind::Redispatch && t.parent == Some(last.id))
                .max_by_key(|t| t.id)
            {
                Some(next) => last = next,
                None => break,
            }
        }
        Some(last.clone())
    }

    /// Whether a cancel of `step` of `run` is durable: the step's newest task is cancelled.
    fn step_cancel_durable(&self, run: RunId, step: &str) -> bool {
        self.newest_task_of(run, step)
            .is_some_and(|t| t.status == TaskStatus::Cancelled)
    }

    /// An operator cancels one task's step of `run` (`keel cancel TASK`): its coordinator is told
    /// when this node hosts the run; otherwise the step's newest task is cancelled in the store.
    pub(super) fn cancel_task(&mut self, run: RunId, step: String, reason: String) {
        let Some(task) = self.first_task_of(run, &step) else {
            self.checker
                .operator_refused(run, format!("no task of step {step} to cancel yet"));
            return;
        };
        if self.cancel_goes_to_coordinator(run) {
            if !self.run_ended(run) && !self.step_ended(run, &step) {
                self.checker.step_cancel_requested(run, step);
            }
            self.deliver_coord(
                run,
                CoordinatorInput::Msg(CoordinatorMsg::CancelTask { task, reason }),
            );
            return;
        }
        let Some(rows) = self.rows_to_cancel(run) else {
            return;
        };
        match decide::cancel_task_stored(false, &rows.run, &rows.tasks, task, &reason, self.now) {
            Ok(marks) => {
                if self.commit_marks(run, marks) {
                    self.checker.step_cancel_requested(run, step);
                }
            }
            Err(refusal) => self.checker.operator_refused(run, refusal.to_string()),
        }
    }

    /// Whether `step` of `run` has ended in the store (a step committing its end may still be open
    /// there: its coordinator then ignores the cancel, and the step starts nothing more either way).
    fn step_ended(&self, run: RunId, step: &str) -> bool {
        self.newest_task_of(run, step)
            .is_some_and(|t| t.status.is_terminal())
    }

    /// A user's follow-up on `run`: joined to its coordinator while it runs here, or reopening it
    /// when it has ended (a fresh coordinator gets the rows and the follow-up).
    pub(super) fn follow_up(
        &mut self,
        run: RunId,
        step: Option<String>,
        brief: String,
        agent: Option<String>,
    ) {
        self.follow_up_then(run, step, brief, agent, None);
    }

    /// A follow-up whose id the host chooses and announces once it is durable; with
    /// `crash_down_ms`, the coordinator node crashes right after the announcement.
    pub(super) fn follow_up_then(
        &mut self,
        run: RunId,
        step: Option<String>,
        brief: String,
        agent: Option<String>,
        crash_down_ms: Option<u64>,
    ) {
        // The thread starts at the first task the step was dispatched as (or the run's first).
        let parent = self
            .checker
            .observed()
            .spawns
            .iter()
            .find(|(a, s)| a.run == run && step.as_ref().is_none_or(|k| *k == s.step))
            .map(|(a, _)| a.task);
        let Some(parent) = parent else {
            match step {
                Some(step) => self.checker.world_bound(
                    self.event_no,
                    format!("no task of step {step} to follow up"),
                ),
                None => self
                    .checker
                    .operator_refused(run, "no task to follow up yet".into()),
            }
            return;
        };
        let mut ids =
            crate::rng::SimRng::new(self.config.seed ^ FOLLOW_UP_ID_STREAM ^ self.event_no);
        let task = keel_actors::ids::mint_task_id(self.now, &mut ids);
        let request = FollowUpRequest {
            parent,
            brief,
            agent,
            task: Some(task),
        };
        let announcing = Announcing {
            run,
            task,
            crash_down_ms,
        };
        let Some(node) = &self.coord else {
            self.checker
                .operator_refused(run, "no node is up to take the follow-up".into());
            return;
        };
        let hosted = node.coordinators.contains_key(&run);
        let route = match self.store.store().run(run).get() {
            Ok(row) => decide::follow_up(hosted, &row, self.now),
            // Not durable yet: only the coordinator that accepted it knows the run.
            Err(_) if hosted => Ok(FollowUpRoute::Join),
            Err(e) => {
                self.checker
                    .operator_refused(run, format!("the run is unreadable: {e}"));
                return;
            }
        };
        match route {
            Ok(FollowUpRoute::Join) => {
                self.deliver_coord(
                    run,
                    CoordinatorInput::Msg(CoordinatorMsg::FollowUp(request)),
                );
                self.await_announcement(announcing);
            }
            Ok(FollowUpRoute::Reopen(marks)) => {
                if !self.commit_marks(run, marks) {
                    return;
                }
                let rows = match host::store::recover_run(self.store.store(), run) {
                    Ok(rows) => rows,
                    Err(e) => {
                        self.checker.world_bound(
                            self.event_no,
                            format!("a reopened run's rows are unreadable: {e}"),
                        );
                        return;
                    }
                };
                self.checker.reopen_requested(run);
                if self.config.mutation == Some(Mutation::ReopenWithoutCoordinator) {
                    return;
                }
                let config = self.config.coordinator.clone();
                if let Some(node) = &mut self.coord {
                    // The ended run's coordinator (if it is still here) is only stopping: a fresh one
                    // takes the run over from its rows.
                    node.coordinators.insert(run, Coordinator::new(config));
                }
                self.deliver_coord(
                    run,
                    CoordinatorInput::Reopened {
                        rows: Box::new(rows),
                        follow_up: request,
                    },
                );
                self.await_announcement(announcing);
            }
            Err(refusal) => self.checker.operator_refused(run, refusal.to_string()),
        }
    }
}

impl World {
    /// A follow-up was handed to its coordinator: its id is announced once it is durable
    /// ([`World::announce_durable_follow_ups`], after every event), or at once with
    /// [`Mutation::AnnounceFollowUpBeforeDurable`].
    fn await_announcement(&mut self, a: Announcing) {
        if self.config.mutation == Some(Mutation::AnnounceFollowUpBeforeDurable) {
            self.announce(a);
        } else {
            self.announcing.push(a);
        }
    }

    fn announce(&mut self, a: Announcing) {
        self.checker.follow_up_announced(a.run, a.task);
        if let Some(down_ms) = a.crash_down_ms {
            self.crash(NodeId::COORDINATOR, down_ms);
        }
    }

    /// After every event: announce the follow-ups that became durable; drop those whose run ended
    /// without them (the coordinator refused them, so `Runtime::follow_up` would have said so).
    pub(super) fn announce_durable_follow_ups(&mut self) {
        if self.announcing.is_empty() {
            return;
        }
        for a in std::mem::take(&mut self.announcing) {
            if self.coord.is_none() {
                break; // the process that was asked is gone, and its announcements with it
            }
            if follow_up_durable(self.store.store(), a.run, a.task) {
                self.announce(a);
            } else if !self.run_ended(a.run) {
                self.announcing.push(a);
            }
        }
    }

    /// The announced follow-ups that are not durable (any at the end is a lost task).
    pub(super) fn announced_follow_ups_lost(&self) -> Vec<(RunId, TaskId)> {
        self.checker
            .observed()
            .follow_ups_announced
            .iter()
            .filter(|(run, task)| !follow_up_durable(self.store.store(), *run, *task))
            .copied()
            .collect()
    }
}
