//! The durable-write queue: every decision's writes are staged to the checkpoint writer in ticket
//! order, and its consequence happens only once the stage is durable.

use super::{Phase, RunState, StepStatus};
use crate::effect::{Effect, Envelope};
use crate::ids::AttemptId;
use crate::machine::{Entropy, Millis};
use crate::message::{
    CheckpointMsg, CoordinatorTimer, LifecycleEvent, SpecialistMsg, SupervisorMsg,
};
use crate::persist::{PersistOp, STAGE_OPS_MAX, Stage};
use crate::report::StepOutcome;
use keel_store::RunStatus;

/// What to do when a stage is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Then {
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
pub(super) struct Pending {
    pub(super) ops: Vec<PersistOp>,
    pub(super) checkpoint: bool,
    pub(super) then: Then,
    pub(super) restages: u32,
    /// Whether it is at the checkpoint now. A failed stage and every stage after it are held back and
    /// re-sent together in ticket order, so a run's writes always commit as a prefix of its decisions.
    pub(super) sent: bool,
}

impl RunState {
    pub(super) fn stage(
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

    /// The restage timer fired: send every held stage again, in ticket order (a failed stage and every
    /// stage after it are held together, so the run's writes still commit as a prefix).
    pub(super) fn restage_held(&mut self, now: Millis, out: &mut Vec<Effect>) {
        let held: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.sent)
            .map(|(t, _)| *t)
            .collect();
        for t in held {
            if let Some(p) = self.pending.get(&t) {
                self.send_stage(t, p, now, out);
            }
            if let Some(p) = self.pending.get_mut(&t) {
                p.sent = true;
            }
        }
    }

    pub(super) fn send_stage(
        &self,
        ticket: u64,
        pending: &Pending,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
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
}

impl RunState {
    pub(super) fn on_durable(
        &mut self,
        ticket: u64,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(pending) = self.pending.remove(&ticket) else {
            return;
        };
        match pending.then {
            Then::Nothing => {}
            Then::Admit { step, generation } => {
                if self.steps[step].generation == generation
                    && self.steps[step].status == StepStatus::Recording
                    && self.phase == Phase::Running
                {
                    self.admit(step, out);
                }
            }
            Then::Accepted {
                step,
                attempt,
                outcome,
            } => {
                let s = &mut self.steps[step];
                s.status = StepStatus::Done;
                s.outcome = Some(outcome);
                s.accepted = Some(attempt);
                let spent = s.spent_micros;
                self.to_specialist(attempt, SpecialistMsg::Ack, out);
                self.send(
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
                self.steps[step].status = StepStatus::Done;
                self.steps[step].outcome = Some(outcome);
                self.advance(now, rng, out);
            }
            Then::Finished { status, outcome } => {
                self.phase = Phase::Done(status);
                out.push(Effect::Emit(LifecycleEvent::RunFinished {
                    run: self.id,
                    status,
                    outcome,
                }));
                self.send(SupervisorMsg::CloseRun { run: self.id }, out);
            }
        }
    }

    pub(super) fn on_persist_failed(
        &mut self,
        ticket: u64,
        error: String,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let restages_max = self.config.restages_max;
        let backoff = self.config.restage_backoff_ms;
        let Some(pending) = self.pending.get_mut(&ticket) else {
            return;
        };
        if pending.restages < restages_max {
            pending.restages += 1;
            let restages = pending.restages;
            let was_holding = self.pending.values().any(|p| !p.sent);
            // Hold this stage and everything after it; one timer re-sends them all in order.
            for (_, p) in self.pending.range_mut(ticket..) {
                p.sent = false;
            }
            if !was_holding {
                let at = now.saturating_add(backoff.saturating_mul(u64::from(restages)));
                self.timer(CoordinatorTimer::Restage { ticket }, at, out);
            }
            return;
        }
        // The store is unavailable: stop here without pretending anything was written. The run is not
        // lost: a restart recovers it from its last durable checkpoint.
        self.pending.remove(&ticket);
        let outcome = format!("the store refused a write {restages_max} times: {error}");
        self.phase = Phase::Done(RunStatus::Failed);
        out.push(Effect::Emit(LifecycleEvent::RunFinished {
            run: self.id,
            status: RunStatus::Failed,
            outcome,
        }));
        self.send(SupervisorMsg::CloseRun { run: self.id }, out);
    }
}

/// Every stage this input sent to the checkpoint writer, as one message (in ticket order, at the place
/// of the first): the writer then puts them all into one group commit instead of committing the first
/// alone while the others wait for the next. A single stage stays a [`CheckpointMsg::Stage`].
pub(super) fn coalesce_stages(out: &mut Vec<Effect>, first: usize) {
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
