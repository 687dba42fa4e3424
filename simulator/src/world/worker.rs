//! The worker nodes: specialists hosted on them, their harness sessions, and the effects a
//! specialist emits.

use std::collections::{BTreeMap, VecDeque};

use keel_actors::{
    AttemptId, Machine, Specialist, SpecialistEffect, SpecialistInput, SpecialistStart,
};
use keel_harness::{HarnessError, HarnessEvent};

use crate::harness;
use crate::net::NodeId;
use crate::profile::{FaultKind, HarnessBehaviour};

use super::World;
use super::event::Ev;
use super::frames::Frame;
use keel_protocol::ToCoordinator;

/// A harness session in progress on a worker.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: u64,
    pub(super) events: VecDeque<(u64, HarnessEvent)>,
    /// A lead's segments still to come: each is released by the answer to the delegation turn that
    /// ends the one before it (until then the session waits on its `delegate` tool call).
    pub(super) after_answers: VecDeque<Vec<(u64, HarnessEvent)>>,
    /// Delegation turns of this session answered so far.
    pub(super) answered: u32,
}

/// A specialist hosted on a worker.
#[derive(Debug)]
pub(super) struct Hosted {
    pub(super) machine: Specialist,
    pub(super) session: Option<Session>,
    pub(super) context_pending: bool,
    /// Its address at the coordinator (what a defective host could hand to a sibling).
    pub(super) reply_to: keel_actors::ReplyTo<keel_actors::Coordinator>,
}

/// A worker node.
#[derive(Debug, Default)]
pub(super) struct Worker {
    pub(super) up: bool,
    pub(super) inc: u32,
    pub(super) specialists: BTreeMap<AttemptId, Hosted>,
    /// Attempts this incarnation has hosted: a duplicated or late spawn of one of them is refused,
    /// as a worker's actor registry would (memory only: lost when the worker crashes).
    pub(super) hosted_ever: std::collections::BTreeSet<AttemptId>,
}

/// Most delegation turns a simulated lead's session makes.
pub const LEAD_TURNS_MAX: u64 = 2;
/// Most calls in one of its turns.
pub const LEAD_CALLS_MAX: u64 = 4;

/// Most attempts a worker remembers having hosted.
pub const HOSTED_REMEMBERED_MAX: usize = 100_000;

impl World {
    pub(super) fn spawn_arrives(&mut self, node: NodeId, start: SpecialistStart, inc: u32) {
        let w = &mut self.workers[usize::from(node.0) - 1];
        if w.up && inc != w.inc {
            // Addressed to an earlier incarnation of this worker: a late copy of a spawn the worker
            // may have hosted before it crashed (its memory of that is gone, the session may have
            // run). Refused: the supervisor's deadline or down-detection already took the attempt
            // over, and the coordinator runs the step again as a new attempt with a new key.
            self.stale_spawns_refused += 1;
            return;
        }
        if !w.up
            || w.hosted_ever.contains(&start.attempt)
            || w.hosted_ever.len() >= HOSTED_REMEMBERED_MAX
        {
            // A duplicate spawn message is ignored: one attempt, one specialist.
            return;
        }
        w.hosted_ever.insert(start.attempt);
        let attempt = start.attempt;
        self.checker.spawned(self.event_no, &start);
        let reply_to = start.reply_to;
        let machine = Specialist::new(start, self.config.specialist.clone());
        w.specialists.insert(
            attempt,
            Hosted {
                machine,
                session: None,
                context_pending: false,
                reply_to,
            },
        );
        let inc = w.inc;
        self.schedule(
            self.now,
            Ev::Spec {
                node,
                attempt,
                input: SpecialistInput::Begin,
                inc: Some(inc),
            },
        );
    }

    pub(super) fn deliver_spec(
        &mut self,
        node: NodeId,
        attempt: AttemptId,
        input: SpecialistInput,
    ) {
        let mut out = std::mem::take(&mut self.spec_effects);
        out.clear();
        {
            let w = &mut self.workers[usize::from(node.0) - 1];
            let Some(hosted) = w.specialists.get_mut(&attempt) else {
                self.spec_effects = out;
                return;
            };
            if matches!(input, SpecialistInput::ContextLoaded(_)) {
                if !hosted.context_pending {
                    // A duplicate or late answer: the first one won.
                    self.spec_effects = out;
                    return;
                }
                hosted.context_pending = false;
            }
            hosted
                .machine
                .handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out.drain(..) {
            let effect = self.mutate_spec_effect(attempt, effect);
            if self.duplicates_session_start(&effect) {
                self.spec_effect(node, attempt, effect.clone());
            }
            self.spec_effect(node, attempt, effect);
        }
        self.spec_effects = out;
    }

    pub(super) fn spec_effect(
        &mut self,
        node: NodeId,
        attempt: AttemptId,
        effect: SpecialistEffect,
    ) {
        self.checker
            .spec_effect(self.event_no, self.now, attempt, &effect);
        let inc = self.workers[usize::from(node.0) - 1].inc;
        match effect {
            SpecialistEffect::LoadContext(request) => {
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                {
                    h.context_pending = true;
                }
                self.send_frame(
                    node,
                    NodeId::COORDINATOR,
                    Frame::ToCoordinator(ToCoordinator::LoadContext { attempt, request }),
                );
                // Nothing may wait forever: if the answer is lost, the load fails after a bound.
                let at = self.now + self.config.context_timeout_ms;
                self.schedule(
                    at,
                    Ev::Spec {
                        node,
                        attempt,
                        input: SpecialistInput::ContextLoaded(Err(
                            "context rows unreachable (timed out)".into(),
                        )),
                        inc: Some(inc),
                    },
                );
            }
            SpecialistEffect::StartHarness { key: _, spec } => {
                let behaviour = self.pick_behaviour(attempt);
                self.checker.session_behaviour(attempt, behaviour);
                if let Some(kind) = FaultKind::of_harness(behaviour) {
                    self.faults.add(kind);
                }
                self.sessions_started += 1;
                let session = self.sessions_started;
                let step = self.checker.step_of(attempt).unwrap_or_default();
                let native = format!("native-{:016x}", self.rng.next_u64());
                let lead = step == keel_actors::coordinator::LEAD_STEP_KEY
                    && matches!(
                        behaviour,
                        HarnessBehaviour::Success | HarnessBehaviour::ToolRoundTrip
                    );
                let (events, after_answers) = if lead {
                    // A working lead delegates one or two turns of 1 to 4 calls, then reports.
                    let turns: Vec<u32> = (0..self.rng.range(1, LEAD_TURNS_MAX))
                        .map(|_| u32::try_from(self.rng.range(1, LEAD_CALLS_MAX)).unwrap_or(1))
                        .collect();
                    let mut segments: VecDeque<_> =
                        harness::lead_script(attempt.task, native, &turns).into();
                    let first = segments.pop_front().unwrap_or_default();
                    (first, segments)
                } else {
                    (
                        harness::script(behaviour, &step, attempt.task, native, self.now),
                        VecDeque::new(),
                    )
                };
                let _ = spec;
                let events = self.mutate_session(events.into());
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                {
                    h.session = Some(Session {
                        id: session,
                        events,
                        after_answers,
                        answered: 0,
                    });
                }
                self.next_harness_event(node, inc, attempt, session);
            }
            // The simulator's sessions call no tools through an endpoint yet (their delegations are
            // tool-use events, answered below), so no call waits for this answer.
            SpecialistEffect::AnswerTool { .. } => {}
            SpecialistEffect::AnswerDelegation { turn, results } => {
                // The host answers the session's pending `delegate` tool call with the turn's
                // outcomes and the session goes on; an answer to a turn the session is not waiting on
                // (it was cancelled, or its worker restarted) is dropped.
                let resumed = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                    .and_then(|h| h.session.as_mut())
                    .and_then(|s| {
                        if !s.events.is_empty() || turn != s.answered + 1 {
                            return None;
                        }
                        let next = s.after_answers.pop_front()?;
                        s.answered = turn;
                        s.events
                            .push_back((5, harness::delegation_answer(turn, &results)));
                        s.events.extend(next);
                        Some(s.id)
                    });
                if let Some(session) = resumed {
                    self.next_harness_event(node, inc, attempt, session);
                }
            }
            SpecialistEffect::CancelHarness => {
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                    && let Some(session) = h.session.take()
                {
                    let _ = session;
                    self.schedule(
                        self.now + 1,
                        Ev::Spec {
                            node,
                            attempt,
                            input: SpecialistInput::Harness(HarnessEvent::Failed(
                                HarnessError::cancelled(),
                            )),
                            inc: Some(inc),
                        },
                    );
                }
            }
            SpecialistEffect::Reply(to, reply) => {
                self.send_frame(
                    node,
                    NodeId::COORDINATOR,
                    Frame::ToCoordinator(ToCoordinator::Reply {
                        from: to.attempt(),
                        reply,
                    }),
                );
            }
            SpecialistEffect::SetTimer { timer, at } => {
                self.schedule(
                    at,
                    Ev::Spec {
                        node,
                        attempt,
                        input: SpecialistInput::Timer(timer),
                        inc: Some(inc),
                    },
                );
            }
            SpecialistEffect::Emit(_) => {}
            SpecialistEffect::Exit => {
                self.workers[usize::from(node.0) - 1]
                    .specialists
                    .remove(&attempt);
            }
        }
    }

    pub(super) fn pick_behaviour(&mut self, attempt: AttemptId) -> HarnessBehaviour {
        if let Some(step) = self.checker.step_of(attempt) {
            let ordinal = self.checker.sessions_of_step(&step);
            if let Some(b) = self.config.harness_script.get(&(step, ordinal)) {
                return *b;
            }
        }
        let i = self.rng.weighted(&self.profile.harness_weights);
        HarnessBehaviour::ALL[i]
    }

    pub(super) fn next_harness_event(
        &mut self,
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
    ) {
        let delay = self.workers[usize::from(node.0) - 1]
            .specialists
            .get(&attempt)
            .and_then(|h| h.session.as_ref())
            .filter(|s| s.id == session)
            .and_then(|s| s.events.front().map(|(d, _)| *d));
        if let Some(delay) = delay {
            self.schedule(
                self.now + delay,
                Ev::HarnessNext {
                    node,
                    inc,
                    attempt,
                    session,
                },
            );
        }
    }

    pub(super) fn harness_next(
        &mut self,
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
    ) {
        let w = &mut self.workers[usize::from(node.0) - 1];
        if !w.up || w.inc != inc {
            return;
        }
        let Some(h) = w.specialists.get_mut(&attempt) else {
            return;
        };
        let Some(s) = h.session.as_mut().filter(|s| s.id == session) else {
            return;
        };
        let Some((_, event)) = s.events.pop_front() else {
            return;
        };
        if s.events.is_empty() && s.after_answers.is_empty() {
            h.session = None;
        }
        self.deliver_spec(node, attempt, SpecialistInput::Harness(event));
        self.next_harness_event(node, inc, attempt, session);
    }
}
