//! Lead mode: the lead agent's delegation turns become steps, and their results go back to it.

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
    /// Which turns are already taken: a turn at or below it is a duplicate.
    pub(super) turns_seen: TurnsSeen,
    /// Turns waiting for the active one to be answered: (turn, the indices of its steps).
    pub(super) queue: VecDeque<(u32, Vec<usize>)>,
    /// The turn whose steps are running.
    pub(super) active: Option<(u32, Vec<usize>)>,
    /// The answers given, by turn, so a duplicate turn is answered again.
    pub(super) answered: BTreeMap<u32, Vec<(String, StepOutcome)>>,
}

/// Which delegation turns of a lead are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TurnsSeen {
    /// Every turn up to this one (0: none yet).
    UpTo(u32),
    /// A lead recovered from a checkpoint that does not say which turn asked for each delegated
    /// step (one written before the snapshot kept it): no turn number is taken as new, so nothing is
    /// delegated twice. A newer checkpoint gives `UpTo` the newest turn of its steps.
    Recovered,
}

impl Default for TurnsSeen {
    fn default() -> Self {
        TurnsSeen::UpTo(0)
    }
}

impl TurnsSeen {
    /// Whether `turn` was taken already.
    fn covers(self, turn: u32) -> bool {
        match self {
            TurnsSeen::UpTo(seen) => turn <= seen,
            TurnsSeen::Recovered => true,
        }
    }
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
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        // Answer the active turn once all its steps are done, then start the next queued turn.
        if let Some((turn, steps)) = lead.active.clone()
            && steps
                .iter()
                .all(|&i| self.steps[i].status == StepStatus::Done)
        {
            let results = self.turn_results(&steps);
            if let Some(lead) = self.lead.as_mut() {
                lead.active = None;
                lead.answered.insert(turn, results.clone());
            }
            if let Some(attempt) = self.steps[0].current(self.id)
                && self.steps[0].status != StepStatus::Done
            {
                self.to_specialist(attempt, SpecialistMsg::Delegated { turn, results }, out);
            }
        }
        let next = self.lead.as_mut().and_then(|lead| {
            if lead.active.is_none() {
                let next = lead.queue.pop_front();
                lead.active = next.clone();
                next
            } else {
                None
            }
        });
        if let Some((turn, steps)) = next {
            self.decide(
                now,
                format!(
                    "dispatch delegation turn {turn}: {} calls in parallel",
                    steps.len()
                ),
            );
            for i in steps {
                self.begin_attempt(i, None, now, rng, out);
            }
            return;
        }
        let idle = self
            .lead
            .as_ref()
            .is_some_and(|l| l.active.is_none() && l.queue.is_empty());
        if idle && self.steps.iter().all(|s| s.status == StepStatus::Done) {
            self.finish(now, out);
        }
    }

    /// The answer to a delegation turn whose steps are done: each call's id with its step's outcome.
    pub(super) fn turn_results(&self, steps: &[usize]) -> Vec<(String, StepOutcome)> {
        steps
            .iter()
            .map(|&i| {
                let s = &self.steps[i];
                (
                    s.call_id.clone().unwrap_or_default(),
                    s.outcome.clone().unwrap_or(StepOutcome::Skipped {
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
        if lead.turns_seen.covers(turn) {
            // A duplicate turn: answer again if it was answered (the answer may have been lost).
            if let Some(results) = lead.answered.get(&turn).cloned() {
                self.to_specialist(from, SpecialistMsg::Delegated { turn, results }, out);
            }
            return;
        }
        if turn > turns_max || self.steps.len() + calls.len() > PLAN_STEPS_MAX {
            self.decide(
                now,
                format!("delegation turn {turn} refused: over the delegation limits"),
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
        lead.turns_seen = TurnsSeen::UpTo(turn);
        let mut indices = Vec::new();
        for (i, call) in calls.into_iter().take(calls_max).enumerate() {
            let spec = PlanStep {
                key: format!("t{turn}.{i}"),
                brief: call.brief,
                goal: call.goal,
                quality_criteria: call.quality_criteria,
                output_schema: call.output_schema,
                assignee: call.assignee,
                depends_on: Vec::new(),
                estimate_micros: self.config.default_estimate_micros,
            };
            let mut step = Step::new(spec, Vec::new());
            step.call_id = Some(call.call_id);
            step.turn = Some(turn);
            self.steps.push(step);
            indices.push(self.steps.len() - 1);
        }
        if let Some(lead) = self.lead.as_mut() {
            lead.queue.push_back((turn, indices));
        }
        self.advance(now, rng, out);
    }
}
