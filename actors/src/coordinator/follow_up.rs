//! Follow-ups: derived tasks queued on a thread, started one at a time per thread.

use super::staging::Then;
use super::step::Step;
use super::{Phase, RunState, StepStatus};
use crate::effect::Effect;
use crate::machine::{Entropy, Millis};
use crate::message::{FOLLOW_UP_BYTES_MAX, FollowUpRequest};
use crate::plan::{PLAN_STEPS_MAX, PlanStep};
use crate::report::{TEXT_BYTES_MAX, bounded};
use keel_store::TaskId;
use std::collections::BTreeSet;

impl RunState {
    /// Queue a follow-up step on the thread of `request.parent` (it starts when the thread is free:
    /// see [`ready_follow_ups`]). Returns whether it was queued; a refusal is a logged decision.
    pub(super) fn queue_follow_up(
        &mut self,
        request: FollowUpRequest,
        now: Millis,
        out: &mut Vec<Effect>,
    ) -> bool {
        let FollowUpRequest {
            parent,
            brief,
            agent,
            task,
        } = request;
        let known = parent == self.root.id || self.by_task.contains_key(&parent);
        let taken = task.is_some_and(|t| {
            self.tasks.contains_key(&t) || self.steps.iter().any(|s| s.requested_task == Some(t))
        });
        if !known || taken || self.phase != Phase::Running || self.steps.len() >= PLAN_STEPS_MAX {
            self.decide(
                now,
                format_args!("follow-up on {parent} refused: not a task of this run, its task id is taken, the run is not running, or the step bound is reached"),
            );
            return false;
        }
        let n = self.steps.iter().filter(|s| s.thread.is_some()).count() + 1;
        let key = format!("f{n}");
        self.decide(
            now,
            format_args!("follow-up {key} queued on the thread of {parent}"),
        );
        let mut step = Step::new(
            PlanStep {
                key,
                brief: bounded(brief.clone(), FOLLOW_UP_BYTES_MAX),
                goal: bounded(brief, TEXT_BYTES_MAX),
                quality_criteria: Vec::new(),
                output_schema: None,
                assignee: agent,
                depends_on: Vec::new(),
                estimate_micros: self.config.default_estimate_micros,
            },
            Vec::new(),
        );
        step.thread = Some(parent);
        step.requested_task = task;
        self.steps.push(step);
        // In the checkpoint at once (its spec and the task id the host chose): a follow-up whose id
        // the host has handed out survives a crash even while it waits for its thread.
        self.stage(Vec::new(), Then::Nothing, true, now, out);
        true
    }
}

/// The parent of a follow-up step: the newest task of its thread before it (the thread's first
/// follow-up hangs under the task it was asked about). `None` for a step that is not a follow-up.
pub(super) fn follow_up_parent(run: &RunState, index: usize) -> Option<TaskId> {
    let thread = run.steps[index].thread?;
    let previous = run.steps[..index]
        .iter()
        .rev()
        .find(|s| s.thread == Some(thread))
        .and_then(|s| s.task_history.last().copied());
    Some(previous.unwrap_or(thread))
}

/// Follow-ups that can start now: waiting, with the thread's previous follow-up done and the task the
/// thread started from done (or the run's root). One at a time per thread, in arrival order.
pub(super) fn ready_follow_ups(run: &RunState) -> Vec<usize> {
    let mut ready = Vec::new();
    let mut busy: BTreeSet<TaskId> = BTreeSet::new();
    for (i, s) in run.steps.iter().enumerate() {
        let Some(thread) = s.thread else {
            continue;
        };
        if s.status == StepStatus::Done {
            continue;
        }
        if busy.insert(thread) && s.status == StepStatus::Waiting {
            let origin_done = thread == run.root.id
                || run
                    .by_task
                    .get(&thread)
                    .is_some_and(|&o| run.steps[o].status == StepStatus::Done);
            if origin_done {
                ready.push(i);
            }
        }
    }
    ready
}

impl RunState {
    pub(super) fn on_follow_up(
        &mut self,
        request: FollowUpRequest,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if self.queue_follow_up(request, now, out) {
            self.advance(now, rng, out);
        }
    }
}
