//! The worker nodes: specialists hosted on them, their harness sessions, and the effects a
//! specialist emits.

use std::collections::{BTreeMap, VecDeque};

use keel_actors::session_tool::SessionToolCall;
use keel_actors::{
    AttemptId, Machine, SessionToolPath, Specialist, SpecialistEffect, SpecialistInput,
    SpecialistStart,
};
use keel_harness::{HarnessError, HarnessEvent};

use crate::harness;
use crate::net::NodeId;
use crate::profile::{FaultKind, HarnessBehaviour};

use super::World;
use super::event::Ev;
use super::frames::Frame;
use super::session_tools::ESCALATING_SESSION_PPM;
use keel_protocol::ToCoordinator;

/// A harness session in progress on a worker.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) id: u64,
    pub(super) events: VecDeque<(u64, HarnessEvent)>,
    /// Segments still to come: each is released by the answer to the tool call that ends the one
    /// before it (until then the session waits on that call).
    pub(super) after_answers: VecDeque<Vec<(u64, HarnessEvent)>>,
    /// The calls of keel's tools that end the current segment and the later ones but the last, as
    /// the node's endpoint delivers them (empty without an endpoint: a lead's `delegate` tool-use
    /// event is then the delegation turn).
    pub(super) calls: VecDeque<SessionToolCall>,
    /// The call the session waits on.
    pub(super) waiting: Option<String>,
    /// Delegation turns of this session answered so far (without an endpoint).
    pub(super) answered: u32,
    /// The plan step it works on (the claim of a call after its end names it).
    pub(super) step: String,
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
    /// Worker `node` hosts `start` (its spawn was accepted: `cluster.rs`).
    pub(super) fn host_specialist(&mut self, node: NodeId, start: SpecialistStart) {
        let w = &mut self.workers[usize::from(node.0) - 1];
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
                input: Box::new(SpecialistInput::Begin),
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
                        input: Box::new(SpecialistInput::ContextLoaded(Err(
                            "context rows unreachable (timed out)".into(),
                        ))),
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
                let working = matches!(
                    behaviour,
                    HarnessBehaviour::Success | HarnessBehaviour::ToolRoundTrip
                );
                let endpoint = self.config.specialist.session_tools == SessionToolPath::Endpoint;
                let tools = if step == keel_actors::coordinator::LEAD_STEP_KEY && working {
                    // A working lead delegates one or two turns of 1 to 4 calls, then reports.
                    let turns: Vec<u32> = (0..self.rng.range(1, LEAD_TURNS_MAX))
                        .map(|_| u32::try_from(self.rng.range(1, LEAD_CALLS_MAX)).unwrap_or(1))
                        .collect();
                    Some(harness::lead_script(attempt.task, native.clone(), &turns))
                } else if endpoint && working && self.rng.chance(self.config.tool_sessions_ppm) {
                    let then = if self.rng.chance(ESCALATING_SESSION_PPM) {
                        harness::ThenAsk::Human
                    } else {
                        harness::ThenAsk::Details(self.details_target(attempt))
                    };
                    Some(harness::tool_calling_script(
                        &step,
                        attempt.task,
                        native.clone(),
                        then,
                    ))
                } else {
                    None
                };
                let (events, after_answers, calls) = match tools {
                    Some(tools) => {
                        let mut segments: VecDeque<_> = tools.segments.into();
                        let first = segments.pop_front().unwrap_or_default();
                        // Without an endpoint only a lead's `delegate` tool-use events reach the
                        // specialist (as delegation turns); nothing else would answer a call.
                        let calls = if endpoint {
                            tools.calls.into()
                        } else {
                            VecDeque::new()
                        };
                        (first, segments, calls)
                    }
                    None => (
                        harness::script(behaviour, &step, attempt.task, native, self.now),
                        VecDeque::new(),
                        VecDeque::new(),
                    ),
                };
                let _ = spec;
                // A defective host bends every segment, the ones after a tool call's answer too.
                let events = self.mutate_session(events.into());
                let after_answers = after_answers
                    .into_iter()
                    .map(|segment| self.mutate_session(segment.into()).into())
                    .collect();
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                {
                    h.session = Some(Session {
                        id: session,
                        events,
                        after_answers,
                        calls,
                        waiting: None,
                        answered: 0,
                        step,
                    });
                }
                self.next_harness_event(node, inc, attempt, session);
            }
            SpecialistEffect::AnswerTool { call_id, answer } => {
                self.tool_answered(node, inc, attempt, &call_id, &answer);
            }
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
                            input: Box::new(SpecialistInput::Harness(HarnessEvent::Failed(
                                HarnessError::cancelled(),
                            ))),
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
                        input: Box::new(SpecialistInput::Timer(timer)),
                        inc: Some(inc),
                    },
                );
            }
            SpecialistEffect::Emit(_) => {}
            SpecialistEffect::Exit => {
                self.workers[usize::from(node.0) - 1]
                    .specialists
                    .remove(&attempt);
                // The worker's endpoint reports the ended actor, which frees its capacity.
                self.send_frame(
                    node,
                    NodeId::COORDINATOR,
                    Frame::ToCoordinator(ToCoordinator::Exited {
                        attempt,
                        normal: true,
                        panicked: false,
                        reason: "exit".into(),
                    }),
                );
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
        let ended = s.events.is_empty() && s.after_answers.is_empty();
        // The segment's last event is a call of keel's tools: the endpoint delivers it now.
        let call = if s.events.is_empty() && !ended {
            s.calls.pop_front()
        } else {
            None
        };
        let step = s.step.clone();
        if ended {
            h.session = None;
        }
        let terminal = matches!(
            event,
            HarnessEvent::Finished { .. } | HarnessEvent::Failed(_)
        );
        // A tool the session is about to run goes through keel's policy first (issue 13).
        let gated = match &event {
            HarnessEvent::ToolUse {
                id,
                name,
                input_json,
            } if self.policy.is_some() && call.is_none() && super::hooks::gated_tool(name) => {
                Some((id.clone(), name.clone(), input_json.text.clone()))
            }
            _ => None,
        };
        self.deliver_spec(node, attempt, SpecialistInput::Harness(event));
        if let Some((id, name, input)) = gated {
            let at = super::hooks::SessionAt {
                node,
                inc,
                attempt,
                session,
            };
            match self.gate_tool(at, &id, &name, &input) {
                // The tool does not run: its scripted result becomes the denial.
                super::hooks::Gate::Decided(Some(denied)) => self.replace_result(at, &id, denied),
                super::hooks::Gate::Decided(None) => {}
                // The harness waits in its PreToolUse hook until the policy answers.
                super::hooks::Gate::Waiting => return,
            }
        }
        if let Some(call) = call {
            self.deliver_tool_call(node, inc, attempt, session, call);
        } else if terminal {
            self.maybe_call_after_end(node, inc, attempt, &step);
        }
        self.next_harness_event(node, inc, attempt, session);
    }
}
