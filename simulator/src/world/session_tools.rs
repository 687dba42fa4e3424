//! The node's MCP endpoint as the world plays it (docs/DESIGN.md §10, issue 11): a session's call of
//! keel's tools reaches its specialist as `SpecialistInput::ToolCall` (sometimes twice, as a
//! retrying client would send it), the specialist's `AnswerTool` releases the session with the
//! answer as its tool result, a call whose answer is lost (the network between specialist and
//! coordinator drops messages) is answered with a tool error at the endpoint's timeout, and a call
//! may arrive after its session ended (it must be refused and change nothing). At the end the
//! checker compares what sessions were told was recorded with the store.

use keel_actors::session_tool::{SessionAnswer, SessionRequest, SessionToolCall};
use keel_actors::{AttemptId, SpecialistInput};
use keel_store::{RunId, TaskId};

use crate::harness::{self, ESCALATION_OPTIONS};
use crate::mutation::Mutation;
use crate::net::NodeId;

use super::World;
use super::event::Ev;

/// Chance (parts per million) that the endpoint delivers a call twice.
pub const DUPLICATE_CALL_PPM: u32 = 100_000;
/// Chance (parts per million) that a duplicate comes late, after the call was answered.
pub const LATE_DUPLICATE_PPM: u32 = 500_000;
/// The range of a late duplicate's delay after the call (ms).
pub const DUPLICATE_LATE_MS_MIN: u64 = 1_000;
/// See [`DUPLICATE_LATE_MS_MIN`].
pub const DUPLICATE_LATE_MS_MAX: u64 = 30_000;
/// Chance (parts per million) that a call arrives after its session ended.
pub const LATE_CALL_PPM: u32 = 200_000;
/// The call id of a call after a session's end.
pub const LATE_CALL_ID: &str = "toolu_sim_mcp_late";
/// Chance (parts per million) that a tool-calling session escalates to a human.
pub const ESCALATING_SESSION_PPM: u32 = 250_000;
/// How long after an `escalate` call the simulated human looks for open escalations, and again
/// while none is open yet.
pub const HUMAN_ANSWER_DELAY_MS: u64 = 10_000;
/// How many looks find nothing open before the human stops looking (the call was lost).
pub const HUMAN_LOOKS_MAX: u32 = 30;

impl World {
    /// The session's call of keel's tools reaches its specialist; the session waits for the answer
    /// (a timeout entry makes sure it never waits past the endpoint's limit).
    pub(super) fn deliver_tool_call(
        &mut self,
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
        call: SessionToolCall,
    ) {
        let timeout = if matches!(call.request, SessionRequest::Delegate { .. }) {
            harness::DELEGATE_ANSWER_TIMEOUT_MS
        } else {
            harness::TOOL_ANSWER_TIMEOUT_MS
        };
        let deadline = self.now + timeout;
        let call_id = call.call_id.clone();
        if let Some(s) = self.workers[usize::from(node.0) - 1]
            .specialists
            .get_mut(&attempt)
            .and_then(|h| h.session.as_mut())
            .filter(|s| s.id == session)
        {
            s.waiting = Some(call.call_id.clone());
        }
        // A defective endpoint that resolves the session's token to a session of another run.
        let crossed = if self.config.mutation == Some(Mutation::TokenOfAnotherRun)
            && !matches!(call.request, SessionRequest::Delegate { .. })
        {
            self.other_runs_specialist(attempt)
        } else {
            None
        };
        let (to_node, to_inc, to_attempt, delivered) = match crossed {
            Some((n, i, a)) => (
                n,
                i,
                a,
                SessionToolCall {
                    call_id: format!("{}_crossed", call.call_id),
                    request: call.request.clone(),
                },
            ),
            None => (node, inc, attempt, call.clone()),
        };
        self.checker
            .tool_call(self.event_no, attempt, to_attempt, &delivered, false);
        if matches!(call.request, SessionRequest::Escalate { .. }) {
            self.schedule(
                self.now + HUMAN_ANSWER_DELAY_MS,
                Ev::HumanAnswers {
                    run: attempt.run,
                    tries: 0,
                },
            );
        }
        // The call, and sometimes the same call again (a retrying client), right behind it or
        // late, after it was answered.
        let mut deliveries = vec![(1, delivered.clone())];
        if self.rng.chance(DUPLICATE_CALL_PPM) {
            let delay = if self.rng.chance(LATE_DUPLICATE_PPM) {
                self.rng.range(DUPLICATE_LATE_MS_MIN, DUPLICATE_LATE_MS_MAX)
            } else {
                2
            };
            deliveries.push((delay, delivered.clone()));
            self.checker.tool_duplicated();
        }
        if self.config.mutation == Some(Mutation::RedeliverDelegateAsNew)
            && matches!(call.request, SessionRequest::Delegate { .. })
        {
            // A defective endpoint that takes a retried `delegate` request for a new call.
            deliveries.push((
                2,
                SessionToolCall {
                    call_id: format!("{}_again", call.call_id),
                    request: call.request.clone(),
                },
            ));
        }
        for (delay, call) in deliveries {
            self.schedule(
                self.now + delay,
                Ev::Spec {
                    node: to_node,
                    attempt: to_attempt,
                    input: Box::new(SpecialistInput::ToolCall(call)),
                    inc: Some(to_inc),
                },
            );
        }
        self.schedule(
            deadline,
            Ev::ToolTimeout {
                node,
                inc,
                attempt,
                session,
                call_id: call_id.into_boxed_str(),
            },
        );
    }

    /// The specialist answered a call: the session waiting on it gets the answer as its tool result
    /// and goes on with its next segment; any other answer (a duplicate, a late or refused call, a
    /// session already gone) is dropped, as the endpoint drops an answer nobody waits for.
    pub(super) fn tool_answered(
        &mut self,
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        call_id: &str,
        answer: &SessionAnswer,
    ) {
        self.checker
            .tool_answered(self.event_no, attempt, call_id, answer);
        let resumed = self.workers[usize::from(node.0) - 1]
            .specialists
            .get_mut(&attempt)
            .and_then(|h| h.session.as_mut())
            .and_then(|s| {
                if !s.events.is_empty() || s.waiting.as_deref() != Some(call_id) {
                    return None;
                }
                let next = s.after_answers.pop_front()?;
                s.waiting = None;
                s.events
                    .push_back((5, harness::tool_answer(call_id, answer)));
                s.events.extend(next);
                Some(s.id)
            });
        if let Some(session) = resumed {
            self.next_harness_event(node, inc, attempt, session);
        }
    }

    /// A session waiting on a call whose answer did not come by the endpoint's deadline gets a tool
    /// error and goes on.
    pub(super) fn tool_wait_over(
        &mut self,
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
        call_id: &str,
    ) {
        let w = &mut self.workers[usize::from(node.0) - 1];
        if !w.up || w.inc != inc {
            return;
        }
        let resumed = w
            .specialists
            .get_mut(&attempt)
            .and_then(|h| h.session.as_mut())
            .filter(|s| s.id == session && s.events.is_empty())
            .and_then(|s| {
                if s.waiting.as_deref() != Some(call_id) {
                    return None;
                }
                let next = s.after_answers.pop_front()?;
                s.waiting = None;
                s.events.push_back((5, harness::tool_timed_out(call_id)));
                s.events.extend(next);
                Some(s.id)
            });
        if let Some(session) = resumed {
            self.checker.tool_timed_out();
            self.next_harness_event(node, inc, attempt, session);
        }
    }

    /// Sometimes a call reaches the specialist after its session ended (a client that sent it late):
    /// findings the specialist must refuse.
    pub(super) fn maybe_call_after_end(
        &mut self,
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        step: &str,
    ) {
        if self.config.specialist.session_tools != keel_actors::SessionToolPath::Endpoint
            || !self.rng.chance(LATE_CALL_PPM)
        {
            return;
        }
        let call = SessionToolCall {
            call_id: LATE_CALL_ID.to_owned(),
            request: harness::findings_request(harness::late_claim(step), step),
        };
        self.checker
            .tool_call(self.event_no, attempt, attempt, &call, true);
        self.schedule(
            self.now + 1,
            Ev::Spec {
                node,
                attempt,
                input: Box::new(SpecialistInput::ToolCall(call)),
                inc: Some(inc),
            },
        );
    }

    /// A human answers every open escalation of `run` that waits for a task, as `keel answer` does:
    /// the answer durable first (one host stage), then the run's coordinator told. While none is
    /// open (the call's commit is on its way, or the coordinator node is down) the human looks
    /// again later, a bounded number of times.
    pub(super) fn human_answers(&mut self, run: RunId, tries: u32) {
        let open: Vec<keel_store::Escalation> = if self.coord.is_some() {
            self.store
                .store()
                .run(run)
                .escalations(0, 1_000)
                .map(|l| l.items.into_iter().map(|e| e.value).collect())
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let open: Vec<_> = open
            .into_iter()
            .filter(|e| {
                e.resolution.is_none()
                    && e.waiting == keel_store::EscalationWait::Task
                    && e.task_id.is_some()
            })
            .collect();
        if open.is_empty() {
            if tries < HUMAN_LOOKS_MAX && !self.checker.run_finished(run) {
                self.schedule(
                    self.now + HUMAN_ANSWER_DELAY_MS,
                    Ev::HumanAnswers {
                        run,
                        tries: tries + 1,
                    },
                );
            }
            return;
        }
        for escalation in open {
            let Ok(text) =
                keel_actors::escalation::check_answer(&escalation, ESCALATION_OPTIONS[0])
            else {
                continue;
            };
            let ops = keel_actors::escalation::answer_ops(&escalation, &text, self.now);
            if !self.commit_marks(run, keel_actors::host::decide::Marks { ops, tasks: 0 }) {
                continue;
            }
            self.checker.escalation_answered();
            if let Some(task) = escalation.task_id {
                self.deliver_coord(
                    run,
                    keel_actors::CoordinatorInput::Msg(
                        keel_actors::CoordinatorMsg::EscalationAnswered {
                            escalation: escalation.id,
                            task,
                        },
                    ),
                );
            }
        }
    }

    /// A live specialist of another run than `attempt`'s: where a defective endpoint
    /// ([`Mutation::TokenOfAnotherRun`]) delivers the session's calls.
    fn other_runs_specialist(&self, attempt: AttemptId) -> Option<(NodeId, u32, AttemptId)> {
        self.workers.iter().enumerate().find_map(|(i, w)| {
            let other = w.specialists.keys().find(|a| a.run != attempt.run)?;
            let node = NodeId(u8::try_from(i + 1).ok()?);
            w.up.then_some((node, w.inc, *other))
        })
    }

    /// The task a session's `get_task_details` asks for: a task of another run hosted on some worker
    /// now (which must be refused), else the session's own.
    pub(super) fn details_target(&self, attempt: AttemptId) -> TaskId {
        self.workers
            .iter()
            .flat_map(|w| w.specialists.keys())
            .find(|a| a.run != attempt.run)
            .map_or(attempt.task, |a| a.task)
    }

    /// At the end: every finding a session was told is recorded is on its task's row in the store,
    /// and nothing a call after its session's end carried is.
    pub(super) fn check_reported_findings(&mut self) {
        let reported = self.checker.reported_tasks();
        let mut rows = Vec::new();
        for (run, task) in reported {
            let stored = self
                .store
                .store()
                .run(run)
                .task(task)
                .ok()
                .map(|t| keel_actors::session_tool::reported_findings(&t));
            rows.push((task, stored));
        }
        self.checker.reported_findings_kept(self.event_no, &rows);
    }
}
