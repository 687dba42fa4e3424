//! The coordinator node: the coordinators, the supervisor and the checkpoint writer, the effects
//! they emit, and the store commits and context reads they need.

use std::collections::BTreeMap;

use keel_actors::host::{self, HostError};
use keel_actors::{
    AttemptId, CheckpointInput, CheckpointWriter, Coordinator, CoordinatorInput, CoordinatorMsg,
    Effect, Envelope, Machine, SpecialistMsg, Supervisor, SupervisorInput, SupervisorMsg, TimerKey,
};
use keel_store::{RunId, SimDisk};

use crate::config::DiskFault;
use crate::mutation::Mutation;
use crate::net::NodeId;

use super::World;
use super::event::Ev;
use super::frames::Frame;
use keel_protocol::{Membership, ToWorker};

/// The coordinator node's machines: everything here is lost in a crash; the store is not.
#[derive(Debug)]
pub(super) struct CoordinatorNode {
    pub(super) coordinators: BTreeMap<RunId, Coordinator>,
    pub(super) supervisor: Supervisor,
    pub(super) checkpoint: CheckpointWriter,
    /// The workers and where each attempt is placed: keel-protocol's membership, as the cluster
    /// endpoint of `keel node` keeps it (host memory, lost in a crash like everything else).
    pub(super) membership: Membership,
    /// When the membership's next tick is on the agenda.
    pub(super) tick_at: Option<crate::queue::SimMillis>,
}

impl World {
    pub(super) fn fresh_coordinator_node(&self) -> CoordinatorNode {
        let mut sup = self.config.supervisor.clone();
        sup.agents = crate::setup::agents();
        if self.config.mutation == Some(Mutation::ExceedConcurrency) {
            sup.specialists_max = sup.specialists_max.saturating_mul(10);
        }
        if self.config.mutation == Some(Mutation::LooseDepth) {
            sup.depth_max = sup.depth_max.saturating_add(8);
        }
        if self.config.mutation == Some(Mutation::LooseSpawnRate) {
            sup.spawn_burst = sup.spawn_burst.saturating_mul(100);
            sup.spawn_interval_ms = (sup.spawn_interval_ms / 100).max(1);
        }
        CoordinatorNode {
            coordinators: BTreeMap::new(),
            supervisor: Supervisor::new(sup),
            checkpoint: CheckpointWriter::new(self.config.checkpoint.clone()),
            membership: Membership::new(self.config.membership.clone()),
            tick_at: None,
        }
    }

    pub(super) fn ensure_coordinator(&mut self, run: RunId) {
        let config = self.config.coordinator.clone();
        if let Some(node) = &mut self.coord {
            node.coordinators
                .entry(run)
                .or_insert_with(|| Coordinator::new(config));
        }
    }

    pub(super) fn deliver_coord(&mut self, run: RunId, input: CoordinatorInput) {
        let mut out = std::mem::take(&mut self.coord_effects);
        out.clear();
        {
            let Some(node) = &mut self.coord else { return };
            let Some(coordinator) = node.coordinators.get_mut(&run) else {
                self.coord_effects = out;
                self.answer_after_end(run, &input);
                return;
            };
            self.checker.coordinator_input(self.event_no, run, &input);
            coordinator.handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out.drain(..) {
            self.coord_effect(Some(run), effect);
        }
        self.flush_outbox();
        self.coord_effects = out;
    }

    /// Delivers the held messages to one run's coordinator: one as it is, several as one input.
    fn flush_coordinator_outbox(&mut self) {
        if let Some((run, msgs)) = self.outbox.coordinator.take()
            && let Some(input) = CoordinatorInput::batch(msgs)
        {
            let inc = Some(self.coord_inc);
            self.schedule(
                self.now,
                Ev::Coord {
                    run,
                    input: Box::new(input),
                    inc,
                },
            );
        }
    }

    /// Delivers what the step just executed sent and held back (see [`Outbox`]), unless the node
    /// crashed in the middle of its effects (then it went with the node).
    fn flush_outbox(&mut self) {
        if self.coord.is_none() {
            self.outbox = Outbox::default();
            return;
        }
        self.flush_coordinator_outbox();
        if let Some(input) = SupervisorInput::batch(std::mem::take(&mut self.outbox.supervisor)) {
            let inc = Some(self.coord_inc);
            self.schedule(
                self.now,
                Ev::Sup {
                    input: Box::new(input),
                    inc,
                },
            );
        }
    }

    /// A specialist's result for a run no coordinator here has: if the run ended (its end rode in
    /// the commit of its last results, and a crash came before their acknowledgements), the host
    /// answers from the store as the runtime does (`host::decide::answer_after_end`).
    fn answer_after_end(&mut self, run: RunId, input: &CoordinatorInput) {
        let CoordinatorInput::Msg(CoordinatorMsg::Specialist {
            from,
            reply: keel_actors::SpecialistReply::Finished(_),
        }) = input
        else {
            return;
        };
        let scope = self.store.store().run(run);
        let Ok(row) = scope.get() else { return };
        let task = scope.task(from.task).ok();
        if let Some(msg) = host::decide::answer_after_end(&row, task.as_ref(), *from) {
            self.coord_effect(
                Some(run),
                Effect::Send(Envelope::Specialist {
                    attempt: *from,
                    msg,
                }),
            );
        }
    }

    pub(super) fn deliver_sup(&mut self, input: SupervisorInput) {
        let mut out = Vec::new();
        {
            let Some(node) = &mut self.coord else { return };
            node.supervisor
                .handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out {
            self.coord_effect(None, effect);
        }
        self.flush_outbox();
    }

    pub(super) fn deliver_ckpt(&mut self, input: CheckpointInput) {
        let mut out = Vec::new();
        {
            let Some(node) = &mut self.coord else { return };
            node.checkpoint
                .handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out {
            self.coord_effect(None, effect);
        }
        self.flush_outbox();
    }

    /// Executes one effect of a coordinator-node machine. `from_run` names the coordinator that
    /// emitted it (`None` for the supervisor and the checkpoint writer).
    pub(super) fn coord_effect(&mut self, from_run: Option<RunId>, effect: Effect) {
        if self.coord.is_none() {
            // The node crashed in the middle of this effect list (a scripted crash at a boundary).
            return;
        }
        self.effects_executed += 1;
        let effect = self.mutate_coord_effect(effect);
        if let Effect::Send(Envelope::Specialist {
            attempt,
            msg: SpecialistMsg::Ack,
        }) = &effect
        {
            // An acknowledgement lets the specialist exit: its result must be durable by now.
            let scope = self.store.store().run(attempt.run);
            let stored = scope.task(attempt.task).ok().map(|t| t.status);
            // An escalated attempt ends with its task paused until a human answers: durable once
            // the escalation its task waits for is in the store too.
            let escalated = stored == Some(keel_store::TaskStatus::Paused)
                && scope.escalations(0, 1_000).is_ok_and(|page| {
                    page.items.iter().any(|e| {
                        e.value.task_id == Some(attempt.task)
                            && e.value.waiting == keel_store::EscalationWait::Task
                    })
                });
            self.checker
                .ack_durability(self.event_no, *attempt, stored, escalated);
        }
        let sup = self.coord.as_ref().map(|c| &c.supervisor);
        self.checker
            .coord_effect(self.event_no, self.now, from_run, &effect, sup);
        let inc = Some(self.coord_inc);
        if !matches!(effect, Effect::Send(Envelope::Coordinator { .. })) {
            // Only consecutive messages to one coordinator travel together, as in the runtime.
            self.flush_coordinator_outbox();
        }
        match effect {
            Effect::Send(Envelope::Coordinator {
                run,
                msg: CoordinatorMsg::BudgetTripped { .. },
            }) if self.config.mutation == Some(Mutation::ForgetBudgetTrip) => {
                for msg in [
                    SupervisorMsg::CloseRun { run },
                    SupervisorMsg::OpenRun {
                        run,
                        budget: keel_store::Budget::default(),
                    },
                ] {
                    self.schedule(
                        self.now,
                        Ev::Sup {
                            input: Box::new(SupervisorInput::Msg(msg)),
                            inc,
                        },
                    );
                }
            }
            Effect::Send(Envelope::Coordinator { run, msg }) => {
                match &mut self.outbox.coordinator {
                    Some((to, msgs)) if *to == run => msgs.push(msg),
                    _ => {
                        self.flush_coordinator_outbox();
                        self.outbox.coordinator = Some((run, vec![msg]));
                    }
                }
            }
            Effect::Send(Envelope::Supervisor(msg)) => self.outbox.supervisor.push(msg),
            Effect::Send(envelope) => match envelope {
                // Held in the outbox above.
                Envelope::Coordinator { .. } | Envelope::Supervisor(_) => {}
                Envelope::Checkpoint(msg) => self.schedule(
                    self.now,
                    Ev::Ckpt {
                        input: CheckpointInput::Msg(msg),
                        inc: self.coord_inc,
                    },
                ),
                Envelope::Specialist { attempt, msg } => self.send_to_specialist(attempt, msg),
                // The answer to a stage the host owns: a gated call's audit rows (`hooks.rs`).
                Envelope::Host { ticket, result, .. } => self.gate_answered(ticket, result),
            },
            Effect::Persist(batch) => {
                let outcome = if self.config.mutation == Some(Mutation::AckBeforeDurable) {
                    Ok(())
                } else {
                    self.commit(&batch)
                };
                let input = match outcome {
                    Ok(()) => CheckpointInput::Committed(batch.id),
                    Err((error, Some(run))) => CheckpointInput::Refused {
                        id: batch.id,
                        run,
                        error,
                    },
                    Err((error, None)) => CheckpointInput::CommitFailed {
                        id: batch.id,
                        error,
                    },
                };
                let at = self.now + self.rng.range(1, 3);
                self.schedule(
                    at,
                    Ev::Ckpt {
                        input,
                        inc: self.coord_inc,
                    },
                );
            }
            Effect::SpawnSpecialist(start) => self.place(*start),
            Effect::StopSpecialist { attempt, reason } => {
                self.send_to_specialist(attempt, SpecialistMsg::Cancel { reason });
            }
            // Every timer fires here, cancelled or not: a machine must ignore a stale firing, and
            // firing them keeps that checked. Cancelling is the runtime's bound on what it holds.
            Effect::CancelTimer { .. } => {}
            Effect::SetTimer { key, at } => match key {
                TimerKey::Coordinator(run, t) => self.schedule(
                    at,
                    Ev::Coord {
                        run,
                        input: Box::new(CoordinatorInput::Timer(t)),
                        inc,
                    },
                ),
                TimerKey::Supervisor(t) => self.schedule(
                    at,
                    Ev::Sup {
                        input: Box::new(SupervisorInput::Timer(t)),
                        inc,
                    },
                ),
                TimerKey::Checkpoint(t) => self.schedule(
                    at,
                    Ev::Ckpt {
                        input: CheckpointInput::Timer(t),
                        inc: self.coord_inc,
                    },
                ),
            },
            Effect::Emit(_) => {}
        }
        if self.config.crash_after_coord_effect == Some(self.effects_executed) {
            self.crash(NodeId::COORDINATOR, self.config.restart_after_ms);
        }
    }

    /// Commits `batch` on the world's store; a failure's text and, when it is one run's write
    /// that the store refused, that run ([`HostError::refused_run`]).
    pub(super) fn commit(
        &mut self,
        batch: &keel_actors::CommitBatch,
    ) -> Result<(), (String, Option<keel_store::RunId>)> {
        self.commits += 1;
        let fault = self.disk_fault_armed.take();
        // The store file and its journal share the node's one disk: a fault is armed on both (the
        // commit syncs one of them: the journal, or the file when its durable commit is due), and
        // what this commit did not meet is cleared after it.
        let disks = [self.store.disk().clone(), self.store.journal_disk().clone()];
        for disk in &disks {
            match fault {
                Some(DiskFault::FailedSync) => disk.fail_next_syncs(1),
                Some(DiskFault::Full) => disk.set_write_budget(Some(0)),
                None => {}
            }
        }
        let syncs: u64 = disks.iter().map(SimDisk::syncs).sum();
        let outcome = host::store::commit(self.store.store(), batch);
        if fault == Some(DiskFault::FailedSync) {
            for disk in &disks {
                disk.fail_next_syncs(0);
            }
        }
        if fault == Some(DiskFault::Full) {
            let disk_full = matches!(
                outcome,
                Err(HostError::Commit(keel_store::CommitError::DiskFull(_)))
            );
            let synced = disks.iter().map(SimDisk::syncs).sum::<u64>() != syncs;
            self.checker
                .full_disk_commit(self.event_no, disk_full, synced);
            // Space is free again: the retry of the checkpoint writer may succeed.
            for disk in &disks {
                disk.set_write_budget(None);
            }
        }
        match outcome {
            Ok(()) => Ok(()),
            Err(e) => {
                self.checker.commit_failed(self.event_no, &e);
                // redb asks for a reopen after a failed commit; the durable image is what it reopens.
                if let Err(reopen) = self.store.crash_and_reopen() {
                    self.checker
                        .world_bound(self.event_no, format!("the store did not reopen: {reopen}"));
                }
                Err((e.to_string(), e.refused_run()))
            }
        }
    }

    pub(super) fn context_request(
        &mut self,
        node: NodeId,
        attempt: AttemptId,
        request: keel_actors::ContextRequest,
    ) {
        if self.coord.is_none() {
            return;
        }
        let rows = host::store::load_context(
            self.store.store(),
            attempt.run,
            &request,
            &self.config.specialist.context,
        );
        let rows = self.mutate_context_rows(attempt.run, rows);
        self.checker.context_loaded(self.event_no, attempt, &rows);
        self.send_frame(
            NodeId::COORDINATOR,
            node,
            Frame::ToWorker(ToWorker::ContextRows { attempt, rows }),
        );
    }
}

/// One coordinator-node step's messages held back until its effects are executed, so they reach
/// their machine as the runtime's `Node::execute_node` delivers them: everything for the
/// supervisor as one input, consecutive messages for one run's coordinator as one input.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    supervisor: Vec<SupervisorMsg>,
    coordinator: Option<(RunId, Vec<CoordinatorMsg>)>,
}
