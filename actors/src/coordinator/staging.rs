//! The durable-write queue: every decision's writes are staged to the checkpoint writer in ticket
//! order, and its consequence happens only once the stage is durable.

use super::{Phase, RunState, StepStatus};
use crate::effect::{Effect, Envelope};
use crate::ids::AttemptId;
use crate::machine::{Entropy, Millis};
use crate::message::{
    CheckpointMsg, CoordinatorTimer, LifecycleEvent, RunOutcome, SpecialistMsg, SupervisorMsg,
};
use crate::persist::{PersistOp, STAGE_OPS_MAX, Stage, StageOwner};
use crate::report::StepOutcome;
use keel_store::{RunStatus, SessionLogRow};
use std::sync::Arc;

/// What to do when a stage is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Then {
    Nothing,
    Admit {
        step: usize,
        generation: u32,
    },
    // The large payloads are boxed: a pending stage is moved as the queue's map inserts and
    // removes around it, and most stages carry none.
    Accepted {
        step: usize,
        attempt: AttemptId,
        outcome: Box<StepOutcome>,
    },
    Parked {
        step: usize,
        outcome: Box<StepOutcome>,
    },
    Finished {
        status: RunStatus,
        outcome: String,
    },
    /// A session's tool call whose writes these are: answered once they are durable.
    ToolAnswer {
        attempt: AttemptId,
        call_id: String,
        answer: Box<crate::session_tool::SessionAnswer>,
    },
    /// A session's `escalate` call whose escalation and paused task these are: answered once they
    /// are durable, then its session is stopped (the task waits for the human).
    Escalated {
        attempt: AttemptId,
        call_id: String,
        answer: Box<crate::session_tool::SessionAnswer>,
    },
    /// The run row recording an escalated attempt's end (its spend): once durable, the attempt is
    /// acknowledged.
    EscalatedEnded {
        step: usize,
        attempt: AttemptId,
    },
}

/// Whether a stage needs a commit now or may ride with the next one (docs/DESIGN.md §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Urgency {
    /// A consequence waits on it (an admission, the run's end, a tool's answer, the last result
    /// the run expects): the checkpoint writer starts a commit for it.
    Now,
    /// Nothing waits on it soon (log and decision rows, an admission's record, a result while
    /// other steps still run): it rides with the next commit, or gets one after the writer's
    /// linger bound. It is still answered only once durable.
    Ride,
}

#[derive(Clone, Debug)]
pub(super) struct Pending {
    /// The decision's writes, shared with the [`Stage`] that carries them (no copy per send).
    pub(super) ops: Arc<Vec<PersistOp>>,
    /// Whether the run's checkpoint is written with it (see [`RunState::attach_checkpoint`]).
    pub(super) checkpoint: bool,
    pub(super) urgency: Urgency,
    pub(super) then: Then,
    pub(super) restages: u32,
    /// Whether it is at the checkpoint now. A failed stage and every stage after it are held back and
    /// re-sent together in ticket order, so a run's writes always commit as a prefix of its decisions.
    pub(super) sent: bool,
}

/// Fewest ops a coordinator's stage bound may be: the largest decision it must always be able to send
/// whole, a re-dispatch (the replaced task's end, the new task, the manifest's retry entry, the
/// checkpoint), with room for one more (an idempotency row, written only for an attempt whose task
/// has no row in memory).
pub const STAGE_OPS_MIN: usize = 5;

/// Why the coordinator refused to send a stage. A stage is one decision's writes, committed atomically;
/// cutting it to fit would commit part of a decision (a result without its done-marker), so a stage
/// over the bound is refused whole and the run fails with this reason in its log and outcome.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StageRefusal {
    /// The decision needs more writes than one stage may carry: a coordinator bug (every decision's
    /// writes are bounded by constants far below [`crate::persist::STAGE_OPS_MAX`]).
    #[error("a decision of {ops} writes is over the bound of {max} writes per stage")]
    OverBound {
        /// The writes the decision needs, its checkpoint included.
        ops: usize,
        /// The bound ([`super::CoordinatorConfig::stage_ops_max`]).
        max: usize,
    },
}

impl RunState {
    /// The most ops one stage may carry: the configured bound within [`STAGE_OPS_MIN`] and the
    /// checkpoint writer's [`STAGE_OPS_MAX`].
    pub(super) fn stage_ops_max(&self) -> usize {
        self.config
            .stage_ops_max
            .clamp(STAGE_OPS_MIN, STAGE_OPS_MAX)
    }

    /// Queue the writes of one decision as one stage (and its checkpoint, when `checkpoint`), with the
    /// decision rows logged since the last stage; `then` happens once it is durable.
    ///
    /// Nothing is dropped to fit the stage bound. Decision rows that do not fit beside the ops go
    /// first, in stages of their own: stages commit in ticket order, so a crash between them loses the
    /// decision (which recovery takes again), never a row of a decision that is durable. A decision
    /// whose own ops do not fit is refused whole ([`StageRefusal`]) and the run fails.
    pub(super) fn stage(
        &mut self,
        ops: Vec<PersistOp>,
        then: Then,
        checkpoint: bool,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        self.stage_as(Urgency::Now, ops, then, checkpoint, now, out);
    }

    /// As [`RunState::stage`], for writes nothing waits on soon: they ride with the next commit.
    pub(super) fn stage_riding(
        &mut self,
        ops: Vec<PersistOp>,
        then: Then,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        self.stage_as(Urgency::Ride, ops, then, false, now, out);
    }

    fn stage_as(
        &mut self,
        urgency: Urgency,
        mut ops: Vec<PersistOp>,
        then: Then,
        checkpoint: bool,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let max = self.stage_ops_max();
        let own = ops.len() + usize::from(checkpoint);
        if own > max {
            self.refuse_stage(StageRefusal::OverBound { ops: own, max }, now, out);
            return;
        }
        let early = self.decisions.len().saturating_sub(max - own);
        if early > 0 {
            let rows: Vec<SessionLogRow> = self.decisions.drain(..early).collect();
            for chunk in rows.chunks(max) {
                let logs = chunk.iter().cloned().map(|row| self.log_op(row)).collect();
                self.enqueue(logs, Then::Nothing, false, Urgency::Ride, out);
            }
        }
        let root = self.root.id;
        ops.extend(
            self.decisions
                .drain(..)
                .map(|row| PersistOp::AppendLog { task: root, row }),
        );
        self.enqueue(ops, then, checkpoint, urgency, out);
    }

    /// Writes that are independent of each other (each row stands alone when durable), staged in as
    /// many stages as the bound needs, before the decision they belong to. They ride: the decision
    /// staged after them (or the writer's linger bound) commits them.
    pub(super) fn stage_independent(&mut self, ops: Vec<PersistOp>, out: &mut Vec<Effect>) {
        let max = self.stage_ops_max();
        let mut ops = ops.into_iter();
        loop {
            let chunk: Vec<PersistOp> = ops.by_ref().take(max).collect();
            if chunk.is_empty() {
                break;
            }
            self.enqueue(chunk, Then::Nothing, false, Urgency::Ride, out);
        }
    }

    /// End the run as failed because a stage was refused: the refusal is a decision row and the run's
    /// outcome, written with the run row (a stage that always fits).
    fn refuse_stage(&mut self, refusal: StageRefusal, now: Millis, out: &mut Vec<Effect>) {
        if matches!(self.phase, Phase::Done(_)) {
            return;
        }
        let outcome = format!("stage refused: {refusal}");
        self.decide(now, format_args!("run ends: Failed: {outcome}"));
        self.phase = Phase::Finishing;
        self.row.status = RunStatus::Failed;
        self.row.outcome = Some(outcome.clone());
        self.row.updated_ms = now;
        let ops = vec![PersistOp::UpdateRun(self.row.clone())];
        let then = Then::Finished {
            status: RunStatus::Failed,
            outcome,
        };
        self.stage(ops, then, false, now, out);
    }

    fn log_op(&self, row: SessionLogRow) -> PersistOp {
        PersistOp::AppendLog {
            task: self.root.id,
            row,
        }
    }

    /// One stage in ticket order: sent now, or held behind a failed stage until the restage timer.
    fn enqueue(
        &mut self,
        ops: Vec<PersistOp>,
        then: Then,
        checkpoint: bool,
        urgency: Urgency,
        out: &mut Vec<Effect>,
    ) {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let held = self.holding();
        let pending = Pending {
            ops: Arc::new(ops),
            checkpoint,
            urgency,
            then,
            restages: 0,
            sent: !held,
        };
        self.pending.insert(ticket, pending);
        if !held {
            self.send_stage(ticket, out);
        }
    }

    /// Whether a stage is held back after a failure. Held stages are always the newest (a failure
    /// holds its stage and every later one, a stage enqueued behind a held one is held, the restage
    /// timer sends them all, and removing a stage keeps the rest in order), so the newest pending
    /// stage answers without a walk over the queue.
    fn holding(&self) -> bool {
        let held = self.pending.last_key_value().is_some_and(|(_, p)| !p.sent);
        debug_assert_eq!(held, self.pending.values().any(|p| !p.sent));
        held
    }

    /// The restage timer fired: send every held stage again, in ticket order (a failed stage and every
    /// stage after it are held together, so the run's writes still commit as a prefix).
    pub(super) fn restage_held(&mut self, out: &mut Vec<Effect>) {
        let held: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| !p.sent)
            .map(|(t, _)| *t)
            .collect();
        for t in held {
            self.send_stage(t, out);
            if let Some(p) = self.pending.get_mut(&t) {
                p.sent = true;
            }
        }
    }

    /// Send the stage of `ticket` to the checkpoint writer; its ops are shared with the pending
    /// entry, not copied. A stage that wants the run's checkpoint gets it once the input is
    /// handled ([`RunState::attach_checkpoint`]).
    pub(super) fn send_stage(&mut self, ticket: u64, out: &mut Vec<Effect>) {
        let Some(pending) = self.pending.get(&ticket) else {
            return;
        };
        let stage = Stage {
            run: self.id,
            owner: StageOwner::Coordinator,
            ticket,
            ops: Arc::clone(&pending.ops),
        };
        let msg = match pending.urgency {
            Urgency::Now => CheckpointMsg::Stage(stage),
            Urgency::Ride => CheckpointMsg::Riding(vec![stage]),
        };
        if pending.checkpoint {
            self.checkpoint_due = Some(ticket);
        }
        out.push(Effect::Send(Envelope::Checkpoint(msg)));
    }

    /// After an input: the newest stage it sent that wants the run's checkpoint gets it, built
    /// now, once, from the state the whole input left (one snapshot per input, not one per stage:
    /// a dispatch of N steps built and serialised N snapshots of which the commit kept the last).
    /// The stages of one input go to the checkpoint writer as one message, which it never splits
    /// across commits, so the checkpoint is durable exactly when every stage of the input is, as
    /// when each stage carried its own. Runs before [`coalesce_stages`].
    pub(super) fn attach_checkpoint(&mut self, now: Millis, out: &mut [Effect]) {
        let Some(ticket) = self.checkpoint_due.take() else {
            return;
        };
        let row = self.checkpoint_row(now);
        for effect in out.iter_mut().rev() {
            let stage = match effect {
                Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(stage))) => Some(stage),
                Effect::Send(Envelope::Checkpoint(CheckpointMsg::Riding(riding))) => {
                    riding.iter_mut().find(|s| s.ticket == ticket)
                }
                _ => None,
            };
            if let Some(stage) = stage.filter(|s| s.ticket == ticket && s.run == self.id) {
                let mut ops = Vec::with_capacity(stage.ops.len() + 1);
                ops.extend(stage.ops.iter().cloned());
                ops.push(PersistOp::PutCheckpoint(row));
                stage.ops = Arc::new(ops);
                return;
            }
        }
    }
}

impl RunState {
    /// `ticket` is durable, and with it every stage sent before it: the checkpoint writer answers
    /// once per run and commit with the newest ticket, and a run's stages commit in ticket order.
    /// A stage held back after a failure (not sent) is not covered; it is re-sent and answered.
    pub(super) fn on_durable(
        &mut self,
        ticket: u64,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let durable: Vec<u64> = self
            .pending
            .range(..=ticket)
            .filter(|(t, p)| p.sent || **t == ticket)
            .map(|(t, _)| *t)
            .collect();
        for t in durable {
            self.on_stage_durable(t, now, rng, out);
        }
    }

    fn on_stage_durable(
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
                if self.steps[step].attempt_epoch == generation
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
                s.outcome = Some(*outcome);
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
                self.steps[step].outcome = Some(*outcome);
                self.advance(now, rng, out);
            }
            Then::ToolAnswer {
                attempt,
                call_id,
                answer,
            } => self.on_tool_durable(attempt, call_id, *answer, out),
            Then::Escalated {
                attempt,
                call_id,
                answer,
            } => self.on_escalation_durable(attempt, call_id, *answer, out),
            Then::EscalatedEnded { step, attempt } => {
                self.on_escalated_end_durable(step, attempt, out);
            }
            Then::Finished { status, outcome } => {
                self.phase = Phase::Done(status);
                out.push(Effect::Emit(LifecycleEvent::RunFinished(RunOutcome {
                    run: self.id,
                    status,
                    outcome,
                })));
                self.send(SupervisorMsg::CloseRun { run: self.id }, out);
            }
        }
    }

    pub(super) fn on_persist_failed(
        &mut self,
        ticket: u64,
        error: String,
        permanent: bool,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let restages_max = self.config.restages_max;
        let backoff = self.config.restage_backoff_ms;
        if permanent && matches!(self.phase, Phase::Done(_)) {
            // A later stage of a run that already ended on a refused write: nothing to redo.
            self.pending.remove(&ticket);
            return;
        }
        let Some(pending) = self.pending.get_mut(&ticket) else {
            return;
        };
        if !permanent && pending.restages < restages_max {
            pending.restages += 1;
            let restages = pending.restages;
            let was_holding = self.holding();
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
        let outcome = if permanent {
            format!("the store refused a write of this run: {error}")
        } else {
            format!("the store refused a write {restages_max} times: {error}")
        };
        self.phase = Phase::Done(RunStatus::Failed);
        out.push(Effect::Emit(LifecycleEvent::RunFinished(RunOutcome {
            run: self.id,
            status: RunStatus::Failed,
            outcome,
        })));
        self.send(SupervisorMsg::CloseRun { run: self.id }, out);
    }
}

/// Every stage this input sent to the checkpoint writer, as one message (in ticket order, at the place
/// of the first): the writer then puts them all into one group commit instead of committing the first
/// alone while the others wait for the next. A single stage stays as it was sent; several ride only
/// if every one of them rides (one that needs a commit takes the others into it).
pub(super) fn coalesce_stages(out: &mut Vec<Effect>, first: usize) {
    let mut count = 0;
    let mut urgent = false;
    for e in &out[first..] {
        match e {
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(_))) => {
                count += 1;
                urgent = true;
            }
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Riding(r))) => count += r.len(),
            _ => {}
        }
    }
    if count < 2 {
        return;
    }
    let mut stages = Vec::with_capacity(count);
    let mut at = None;
    let mut kept = Vec::with_capacity(out.len() - first);
    for (i, effect) in out.drain(first..).enumerate() {
        match effect {
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(stage))) => {
                at.get_or_insert(i);
                stages.push(stage);
            }
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Riding(riding))) => {
                at.get_or_insert(i);
                stages.extend(riding);
            }
            other => kept.push(other),
        }
    }
    let at = at.unwrap_or(0).min(kept.len());
    let msg = if urgent {
        CheckpointMsg::Stages(stages)
    } else {
        CheckpointMsg::Riding(stages)
    };
    kept.insert(at, Effect::Send(Envelope::Checkpoint(msg)));
    out.extend(kept);
}
