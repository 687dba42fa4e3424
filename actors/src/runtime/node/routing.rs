//! Delivering envelopes between the node's machines, the host's own stages through the checkpoint
//! actor, and turning lifecycle events into runtime events and run waiters' answers.

use super::{Node, Waiter, lock};
use crate::effect::Envelope;
use crate::message::{
    CheckpointInput, CheckpointMsg, CoordinatorInput, CoordinatorMsg, LifecycleEvent,
    SpecialistInput, SpecialistMsg, SupervisorInput,
};
use crate::persist::{PersistOp, Stage, StageOwner};
use crate::runtime::RuntimeEvent;
use keel_store::RunId;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::oneshot;

impl Node {
    /// Deliver one envelope to its machine's mailbox. A message for an actor that is gone is dropped:
    /// every message between machines is either resent by its sender or made moot by the store.
    pub(crate) fn route(&self, envelope: Envelope) {
        match envelope {
            Envelope::Host { ticket, result, .. } => self.host_ack(ticket, result),
            Envelope::Coordinator { run, msg } => {
                if self.frozen.load(Ordering::Acquire) {
                    return;
                }
                if let Some(c) = self.coordinator(run) {
                    let _ = c.send_message(crate::runtime::Deliver(CoordinatorInput::Msg(msg)));
                } else {
                    tracing::debug!(%run, "message for a coordinator that is not running, dropped");
                }
            }
            Envelope::Specialist { attempt, msg } => {
                let (actor, report) = match lock(&self.specialists).get_mut(&attempt) {
                    Some(s) => {
                        // An Ack means the result is durable: that is when a report exists for
                        // observers. Taken, so a re-ack of a duplicate reports nothing twice.
                        let report = if matches!(msg, SpecialistMsg::Ack) {
                            s.report.take().map(|r| (s.step.clone(), r))
                        } else {
                            None
                        };
                        (Some(s.inbox.clone()), report)
                    }
                    None => (None, None),
                };
                if let Some((step, report)) = report {
                    self.emit(RuntimeEvent::Report {
                        attempt,
                        step,
                        report,
                    });
                }
                match actor {
                    Some(inbox) => {
                        inbox.send(SpecialistInput::Msg(msg));
                    }
                    None => self.route_remote(attempt, msg),
                }
            }
            Envelope::Supervisor(m) => {
                if let Some(s) = self.supervisor.get() {
                    let _ = s.send_message(crate::runtime::Deliver(SupervisorInput::Msg(m)));
                }
            }
            Envelope::Checkpoint(m) => {
                if !from_coordinator(&m) {
                    self.to_checkpoint(CheckpointInput::Msg(m));
                    return;
                }
                // Checked and sent under the gate (see `freeze`): a coordinator's stage reaches the
                // checkpoint writer before the pause marks are read and staged, or not at all, so
                // nothing it decides after them is written over them (a paused run set back to
                // running, its spend or a cancel written after the pause).
                let _gate = lock(&self.freeze_gate);
                if self.frozen.load(Ordering::Acquire) {
                    tracing::debug!("a coordinator's stage after the node froze, dropped");
                    return;
                }
                self.to_checkpoint(CheckpointInput::Msg(m));
            }
        }
    }

    /// Deliver one sender's messages from one of its steps to `run`'s coordinator: one as
    /// [`Node::route`] does, several as one input ([`CoordinatorInput::Msgs`]), in order.
    pub(crate) fn route_to_coordinator(&self, run: RunId, mut msgs: Vec<CoordinatorMsg>) {
        if msgs.len() <= 1 {
            if let Some(msg) = msgs.pop() {
                self.route(Envelope::Coordinator { run, msg });
            }
            return;
        }
        if self.frozen.load(Ordering::Acquire) {
            return;
        }
        match self.coordinator(run) {
            Some(c) => {
                let _ = c.send_message(crate::runtime::Deliver(CoordinatorInput::Msgs(msgs)));
            }
            None => {
                tracing::debug!(%run, "messages for a coordinator that is not running, dropped")
            }
        }
    }

    /// Freeze the node's coordinators: they get no more messages or timers, and their stages are
    /// no longer sent to the checkpoint writer (a stage already sent is written first, see
    /// [`Node::settle_stages`]). A pause, and the pause the node starts by itself, freeze before
    /// they read a run's rows to mark it.
    pub(crate) fn freeze(&self) {
        let _gate = lock(&self.freeze_gate);
        self.frozen.store(true, Ordering::Release);
    }

    /// Wait (at most `wait`) until every stage sent to the checkpoint writer before now is
    /// written: an empty stage of the host's own queues behind them, and is answered only after
    /// they are. After [`Node::freeze`], the rows a pause reads then are the coordinators' last.
    pub(crate) async fn settle_stages(&self, run: RunId, wait: Duration) {
        if let Err(e) = self.stage_host(run, Vec::new(), wait).await {
            tracing::warn!(%run, error = %e, "the stages before the pause did not all settle");
        }
    }
}

/// Whether a message to the checkpoint writer carries a coordinator's stage.
fn from_coordinator(msg: &CheckpointMsg) -> bool {
    match msg {
        CheckpointMsg::Stage(stage) => stage.owner == StageOwner::Coordinator,
        CheckpointMsg::Stages(stages) | CheckpointMsg::Riding(stages) => {
            stages.iter().any(|s| s.owner == StageOwner::Coordinator)
        }
    }
}

impl Node {
    fn host_ack(&self, ticket: u64, result: Result<(), String>) {
        if let Some(tx) = lock(&self.host_acks).remove(&ticket) {
            let _ = tx.send(result);
        }
    }

    /// Make a stage of the host's own durable through the checkpoint writer (the only writer) and wait
    /// for its answer, at most `wait`.
    pub(crate) async fn stage_host(
        &self,
        run: RunId,
        ops: Vec<PersistOp>,
        wait: Duration,
    ) -> Result<(), String> {
        let ticket = self.next_host_ticket.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.host_acks).insert(ticket, tx);
        self.route(Envelope::Checkpoint(CheckpointMsg::Stage(Stage {
            run,
            owner: StageOwner::Host,
            ticket,
            ops: ops.into(),
        })));
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the checkpoint writer is gone".into()),
            Err(_) => {
                lock(&self.host_acks).remove(&ticket);
                Err(format!("no answer from the checkpoint writer in {wait:?}"))
            }
        }
    }

    /// Turn a machine's lifecycle event into runtime events; a run's end wakes the waiters of the
    /// hosting that ended it (`hosting`, the emitting coordinator's generation), not those of a
    /// later hosting of the same run.
    pub(crate) fn lifecycle(&self, event: LifecycleEvent, hosting: Option<u64>) {
        match event {
            LifecycleEvent::RunFinished(done) => {
                tracing::info!(status = ?done.status, "run finished");
                let run = done.run;
                // The event goes out before the waiters wake, so a caller that awaited the run's end
                // finds `Finished` already in its event channel.
                self.emit(RuntimeEvent::Finished(done.clone()));
                let woken = {
                    let mut map = lock(&self.waiters);
                    let all = map.remove(&run).unwrap_or_default();
                    let (woken, kept): (Vec<Waiter>, Vec<Waiter>) = all
                        .into_iter()
                        .partition(|w| hosting.is_none_or(|g| g == w.generation));
                    if !kept.is_empty() {
                        map.insert(run, kept);
                    }
                    woken
                };
                for w in woken {
                    let _ = w.tx.send(super::RunEnd::Finished(done.clone()));
                }
            }
            LifecycleEvent::SubagentError { attempt, kind } => {
                tracing::info!(failure = %kind, "attempt failed");
                let step = lock(&self.specialists)
                    .get(&attempt)
                    .map(|s| s.step.clone())
                    .unwrap_or_default();
                self.emit(RuntimeEvent::TaskFailed {
                    attempt,
                    step,
                    kind,
                });
            }
            LifecycleEvent::SubagentStop { .. } => tracing::info!("attempt finished"),
            LifecycleEvent::SubagentStart { .. } => {}
        }
    }
}
