//! Lead mode: the lead agent's delegation turns become steps, and their results go back to it.
//!
//! A delegation's identity (docs/DESIGN.md §7): a turn belongs to the lead attempt that asked for it
//! (each session numbers its turns from 1, so a turn number alone names nothing across sessions), and
//! a subtask is the step whose spec it asks for. A later session of the lead (a restart after a crash,
//! a retry) that asks again for a subtask an earlier session delegated gets that step's outcome, or
//! waits for the step still running: a subtask whose report is durable is never delegated twice.

use super::step::Step;
use super::{Phase, RunState, StepStatus};
use crate::effect::Effect;
use crate::ids::AttemptId;
use crate::machine::{Entropy, Millis};
use crate::message::{DelegationCall, SpecialistMsg};
use crate::plan::{PLAN_STEPS_MAX, PlanStep};
use crate::report::StepOutcome;
use std::collections::{BTreeMap, VecDeque};

/// The delegation state of a lead run.
#[derive(Clone, Debug, Default)]
pub(super) struct Lead {
    /// The lead attempt whose turns `turns_seen` and `answered` count; a new attempt of the lead is a
    /// new session whose turns number from 1 again.
    pub(super) attempt: Option<AttemptId>,
    /// The newest turn of `attempt` taken: a turn at or below it is a duplicate of that attempt.
    pub(super) turns_seen: u32,
    /// Turns that delegated at least one new step, across every attempt of the lead: what
    /// `CoordinatorConfig::delegation_turns_max` bounds, and the number in the new steps' keys.
    pub(super) turns_taken: u32,
    /// Turns waiting for the active one to be answered.
    pub(super) queue: VecDeque<LeadTurn>,
    /// The turn whose steps are running.
    pub(super) active: Option<LeadTurn>,
    /// The answers given to `attempt`, by turn, so a duplicate turn is answered again.
    pub(super) answered: BTreeMap<u32, Vec<(String, StepOutcome)>>,
}

/// One delegation turn: who asked, and which step each of its calls is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct LeadTurn {
    /// The lead attempt that asked; `None` for a turn recovered from a checkpoint (its session is
    /// gone, so nobody waits for its answer).
    pub(super) owner: Option<AttemptId>,
    /// The turn's number within its owner's session.
    pub(super) turn: u32,
    /// Per call, in call order: the step that does it and the call's id in this turn.
    pub(super) calls: Vec<(usize, String)>,
}

impl LeadTurn {
    fn steps(&self) -> impl Iterator<Item = usize> + '_ {
        self.calls.iter().map(|(i, _)| *i)
    }
}

/// Whether a delegated step is the subtask `call` asks for: same brief, goal, criteria, schema and
/// assignee (call ids are the session's own and differ between sessions).
fn same_subtask(spec: &PlanStep, call: &DelegationCall) -> bool {
    spec.brief == call.brief
        && spec.goal == call.goal
        && spec.quality_criteria == call.quality_criteria
        && spec.output_schema == call.output_schema
        && spec.assignee == call.assignee
}

impl RunState {
    pub(super) fn advance_lead(
        &mut self,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if self.steps[0].status == StepStatus::Waiting {
            self.begin_attempt(0, None, now, rng, out);
            return;
        }
        loop {
            let Some(lead) = self.lead.as_ref() else {
                return;
            };
            // Answer the active turn once all its steps are done, then start the next queued turn
            // (one whose steps are all done already, a later session asking again, is answered too).
            if let Some(active) = lead.active.clone() {
                if !active
                    .steps()
                    .all(|i| self.steps[i].status == StepStatus::Done)
                {
                    break;
                }
                self.answer_turn(&active, out);
                if let Some(lead) = self.lead.as_mut() {
                    lead.active = None;
                }
            }
            let next = self.lead.as_mut().and_then(|lead| {
                let next = lead.queue.pop_front();
                lead.active = next.clone();
                next
            });
            let Some(next) = next else {
                break;
            };
            let waiting: Vec<usize> = next
                .steps()
                .filter(|&i| self.steps[i].status == StepStatus::Waiting)
                .collect();
            if !waiting.is_empty() {
                self.decide(
                    now,
                    format_args!(
                        "dispatch delegation turn {}: {} calls in parallel",
                        next.turn,
                        waiting.len()
                    ),
                );
                for i in waiting {
                    self.begin_attempt(i, None, now, rng, out);
                }
                return;
            }
        }
        let idle = self
            .lead
            .as_ref()
            .is_some_and(|l| l.active.is_none() && l.queue.is_empty());
        if idle && self.steps.iter().all(|s| s.status == StepStatus::Done) {
            self.finish(now, out);
        }
    }

    /// Answers a turn whose steps are done to the lead attempt that asked, if it is still the lead's
    /// current attempt (a turn of an ended session is only remembered as done).
    fn answer_turn(&mut self, turn: &LeadTurn, out: &mut Vec<Effect>) {
        let results = self.turn_results(turn);
        let current = self.steps[0].current(self.id);
        let Some(owner) = turn.owner.filter(|o| Some(*o) == current) else {
            return;
        };
        if let Some(lead) = self.lead.as_mut()
            && lead.attempt == Some(owner)
        {
            lead.answered.insert(turn.turn, results.clone());
        }
        if self.steps[0].status != StepStatus::Done {
            self.to_specialist(
                owner,
                SpecialistMsg::Delegated {
                    turn: turn.turn,
                    results,
                },
                out,
            );
        }
    }

    /// The answer to a delegation turn whose steps are done: each call's id with its step's outcome.
    pub(super) fn turn_results(&self, turn: &LeadTurn) -> Vec<(String, StepOutcome)> {
        turn.calls
            .iter()
            .map(|(i, call_id)| {
                (
                    call_id.clone(),
                    self.steps[*i]
                        .outcome
                        .clone()
                        .unwrap_or(StepOutcome::Skipped {
                            reason: "no outcome".into(),
                        }),
                )
            })
            .collect()
    }

    pub(super) fn on_delegate(
        &mut self,
        from: AttemptId,
        turn: u32,
        calls: Vec<DelegationCall>,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let turns_max = self.config.delegation_turns_max;
        let calls_max = self.config.delegation_calls_max as usize;
        if self.steps.first().and_then(|s| s.current(self.id)) != Some(from)
            || self.phase != Phase::Running
        {
            return;
        }
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        if lead.attempt != Some(from) {
            // A new session of the lead: its turns are its own, numbered from 1.
            lead.attempt = Some(from);
            lead.turns_seen = 0;
            lead.answered.clear();
        }
        if turn <= lead.turns_seen {
            // A duplicate turn: answer again if it was answered (the answer may have been lost).
            if let Some(results) = lead.answered.get(&turn).cloned() {
                self.to_specialist(from, SpecialistMsg::Delegated { turn, results }, out);
            }
            return;
        }
        let calls: Vec<DelegationCall> = calls.into_iter().take(calls_max).collect();
        // Each call is a step an earlier session of the lead delegated (the same subtask, not yet
        // claimed by another call of this turn), or a new one.
        let mut claimed: Vec<Option<usize>> = Vec::with_capacity(calls.len());
        for call in &calls {
            let found = (1..self.steps.len()).find(|&i| {
                let s = &self.steps[i];
                s.turn.is_some()
                    && s.delegated_by != Some(from)
                    && same_subtask(&s.spec, call)
                    && !claimed.contains(&Some(i))
            });
            claimed.push(found);
        }
        let new = claimed.iter().filter(|c| c.is_none()).count();
        let turns_taken = self.lead.as_ref().map_or(0, |l| l.turns_taken);
        if new > 0 && (turns_taken >= turns_max || self.steps.len() + new > PLAN_STEPS_MAX) {
            self.decide(
                now,
                format_args!("delegation turn {turn} refused: over the delegation limits"),
            );
            let results = calls
                .iter()
                .map(|c| {
                    (
                        c.call_id.clone(),
                        StepOutcome::Skipped {
                            reason: "over the delegation limits".into(),
                        },
                    )
                })
                .collect();
            self.to_specialist(from, SpecialistMsg::Delegated { turn, results }, out);
            return;
        }
        let number = if new > 0 {
            turns_taken + 1
        } else {
            turns_taken
        };
        if let Some(lead) = self.lead.as_mut() {
            lead.turns_seen = turn;
            lead.turns_taken = number;
        }
        if new < calls.len() {
            self.decide(
                now,
                format_args!(
                    "delegation turn {turn}: {} of {} calls were delegated by an earlier session of the lead; not delegated again",
                    calls.len() - new,
                    calls.len()
                ),
            );
        }
        let mut turn_calls = Vec::with_capacity(calls.len());
        for (i, (call, found)) in calls.into_iter().zip(claimed).enumerate() {
            let index = match found {
                Some(index) => index,
                None => {
                    let spec = PlanStep {
                        key: format!("t{number}.{i}"),
                        brief: call.brief,
                        goal: call.goal,
                        quality_criteria: call.quality_criteria,
                        output_schema: call.output_schema,
                        assignee: call.assignee,
                        depends_on: Vec::new(),
                        estimate_micros: self.config.default_estimate_micros,
                    };
                    let mut step = Step::new(spec, Vec::new());
                    step.call_id = Some(call.call_id.clone());
                    step.turn = Some(number);
                    step.delegated_by = Some(from);
                    self.steps.push(step);
                    self.steps.len() - 1
                }
            };
            turn_calls.push((index, call.call_id));
        }
        if let Some(lead) = self.lead.as_mut() {
            lead.queue.push_back(LeadTurn {
                owner: Some(from),
                turn,
                calls: turn_calls,
            });
        }
        self.advance(now, rng, out);
    }
}
