//! The operator's interventions, carried out as the runtime does them: a pause (SIGTERM of the
//! coordinator node), a cancel, and a follow-up that joins a running run or reopens an ended one. Each
//! decision is `keel_actors::host::decide`'s, over the run's rows as the store holds them; the rows it
//! answers are committed as one host stage before the host acts on them.

use keel_actors::host::decide::{self, FollowUpRoute, Marks};
use keel_actors::host::{self};
use keel_actors::{
    CommitBatch, CommitId, Coordinator, CoordinatorInput, CoordinatorMsg, Effect, FollowUpRequest,
    PersistOp, SpecialistMsg, Stage, StageOwner,
};
use keel_store::{RunId, RunStatus, TaskStatus};

use crate::mutation::Mutation;
use crate::net::NodeId;

use super::World;
use super::event::Ev;

/// The reason the specialists of a pausing node are given.
pub const PAUSE_REASON: &str = "the node is shutting down (pause)";

impl World {
    /// Commits a decision's marks for `run` as one host stage; they pass the checker first, like
    /// every write. Whether they became durable.
    fn commit_marks(&mut self, run: RunId, marks: Marks) -> bool {
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
                ops: marks.ops,
            }],
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
        let placed: Vec<_> = node.placement.keys().copied().collect();
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
    /// yet did not take (the operator sees the cancel fail and may retry).
    pub(super) fn withdraw_undurable_cancels(&mut self) {
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
        let hosted = self
            .coord
            .as_ref()
            .is_some_and(|c| c.coordinators.contains_key(&run));
        if hosted && self.config.mutation != Some(Mutation::CancelAsIfNotHosted) {
            let ended = self
                .store
                .store()
                .run(run)
                .get()
                .is_ok_and(|r| r.status.is_terminal());
            if !ended {
                self.checker.cancel_requested(run);
            }
            self.deliver_coord(
                run,
                CoordinatorInput::Msg(CoordinatorMsg::Cancel { reason }),
            );
            return;
        }
        let rows = match host::store::recover_run(self.store.store(), run) {
            Ok(rows) => rows,
            Err(e) => {
                self.checker
                    .operator_refused(run, format!("the run's rows are unreadable: {e}"));
                return;
            }
        };
        match decide::cancel_stored(false, &rows.run, &rows.tasks, &reason, self.now) {
            Ok(marks) => {
                if self.commit_marks(run, marks) {
                    self.checker.cancel_requested(run);
                }
            }
            Err(refusal) => self.checker.operator_refused(run, refusal.to_string()),
        }
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
        let request = FollowUpRequest {
            parent,
            brief,
            agent,
            task: None,
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
            Ok(FollowUpRoute::Join) => self.deliver_coord(
                run,
                CoordinatorInput::Msg(CoordinatorMsg::FollowUp(request)),
            ),
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
            }
            Err(refusal) => self.checker.operator_refused(run, refusal.to_string()),
        }
    }
}
