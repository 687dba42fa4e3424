//! How a worker hosts one specialist attempt: the runtime's task host
//! ([`host_on_task`](keel_actors::runtime::host_on_task), no ractor actor per attempt) with a role
//! whose effects go over the wire instead of into a local store or coordinator. The machine is the
//! same `Specialist` the coordinator node would host.

use crate::wire::ToCoordinator;
use crate::worker::{EXIT_REASON, WorkerShared, lock};
use keel_actors::runtime::{
    Flow, Role, SessionEvents, SessionServices, SpecialistInbox, UsageSeen, wall_clock_ms,
};
use keel_actors::{
    AttemptId, IdempotencyKey, Specialist, SpecialistEffect, SpecialistInput, SpecialistStart,
};
use keel_harness::{CancelToken, HarnessError, HarnessEvent, HarnessKind, SessionSpec};
use std::sync::Arc;
use std::time::Duration;
use tracing::Span;

/// Per-attempt host state on the worker.
#[derive(Default)]
pub(crate) struct WorkerLocal {
    cancel: Option<CancelToken>,
    /// The running session, read on the attempt's own task ([`Role::own_input`]).
    session: Option<SessionEvents>,
    usage: UsageSeen,
}

/// Hosts one specialist attempt on a worker.
pub(crate) struct WorkerSpecialistRole {
    worker: Arc<WorkerShared>,
    attempt: AttemptId,
    harness: HarnessKind,
    span: Span,
}

impl WorkerSpecialistRole {
    pub(crate) fn new(worker: Arc<WorkerShared>, start: &SpecialistStart) -> Self {
        let span = tracing::info_span!(
            target: keel_actors::runtime::SPAN_TARGET,
            "task",
            run = %start.attempt.run,
            task = %start.attempt.task,
            attempt = start.attempt.attempt,
            agent = %start.assignment.agent,
            harness = %start.assignment.harness,
        );
        Self {
            worker,
            attempt: start.attempt,
            harness: start.assignment.harness,
            span,
        }
    }

    fn feed(me: &SpecialistInbox, input: SpecialistInput) {
        me.send(input);
    }

    fn fail(me: &SpecialistInbox, detail: String) {
        Self::feed(
            me,
            SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(detail))),
        );
    }

    async fn start_harness(
        &self,
        me: &SpecialistInbox,
        local: &mut WorkerLocal,
        key: IdempotencyKey,
        spec: SessionSpec,
    ) {
        if let Err(refusal) = lock(&self.worker.started_keys).admit(key) {
            // docs/DESIGN.md §12 invariant 2: never two sessions with one key on this worker.
            return Self::fail(me, refusal.to_string());
        }
        // A session before this one has ended (a new start follows its terminal event); its
        // services end before this one's open.
        local.session = None;
        let harnesses = &self.worker.config.harnesses;
        let Some(harness) = harnesses.get(self.harness) else {
            return Self::fail(
                me,
                format!(
                    "no {} harness is installed on worker {}",
                    self.harness, self.worker.config.name
                ),
            );
        };
        let mut spec = harnesses.prepare(spec, self.attempt);
        // From here what the start opens (the services' tokens, the session tools' token) ends
        // with this guard, even if the task is killed while the harness starts.
        let services = {
            let (worker, attempt) = (Arc::clone(&self.worker), self.attempt);
            SessionServices::new(move || worker.config.harnesses.end_session(attempt))
        };
        // keel's session tools, when this worker serves the MCP endpoint: a call becomes the
        // specialist's input here, its reply crosses to the coordinator and the answer comes back.
        let deliver = {
            let me = me.clone();
            let attempt = self.attempt;
            Box::new(move |call: keel_actors::SessionToolCall| {
                tracing::info!(%attempt, tool = call.request.tool(), "a session tool call, for the coordinator node");
                me.send(SpecialistInput::ToolCall(call))
            })
        };
        if let Some(token) =
            harnesses.open_session_tools(&mut spec, self.harness, self.attempt, deliver)
        {
            // Registered with the specialist's scrubber before the session can print it.
            Self::feed(me, SpecialistInput::SessionSecret(token));
        }
        match harness.start(spec).await {
            Err(e) => {
                drop(services);
                Self::fail(me, format!("the session could not start: {e}"));
            }
            Ok(session) => {
                local.cancel = Some(session.cancel_token());
                // Services (the hook bridge's session token) end with the session however it ends.
                local.session = Some(SessionEvents::new(session, services));
            }
        }
    }

    /// The session ended (or the attempt did): its endpoint token is revoked.
    fn close_session_tools(&self) {
        if let Some(endpoint) = self.worker.config.harnesses.session_endpoint() {
            endpoint.close(self.attempt);
        }
    }

    fn load_context(&self, me: &SpecialistInbox, request: keel_actors::ContextRequest) {
        let attempt = self.attempt;
        lock(&self.worker.context_waiting).insert(attempt);
        self.worker
            .send(&ToCoordinator::LoadContext { attempt, request });
        let wait = self.worker.config.context_wait;
        let worker = Arc::clone(&self.worker);
        let me = me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if lock(&worker.context_waiting).remove(&attempt) {
                Self::feed(
                    &me,
                    SpecialistInput::ContextLoaded(Err(format!(
                        "no answer from the coordinator node within {wait:?}"
                    ))),
                );
            }
        });
    }
}

impl Role for WorkerSpecialistRole {
    type M = Specialist;
    type Local = WorkerLocal;
    type Addr = SpecialistInbox;

    fn span(&self) -> Span {
        self.span.clone()
    }

    fn before(&self, input: &SpecialistInput, _local: &mut WorkerLocal) {
        if let SpecialistInput::Harness(event) = input
            && event.is_terminal()
        {
            // The session is over: its endpoint token stops working now.
            self.close_session_tools();
        }
    }

    fn after(&self, specialist: &Specialist, local: &mut WorkerLocal) -> Flow {
        if let Some((tokens, spent_micros)) = local.usage.change(specialist) {
            self.worker.send(&ToCoordinator::Usage {
                attempt: self.attempt,
                tokens,
                spent_micros,
            });
        }
        Flow::Continue
    }

    async fn execute(
        &self,
        me: &SpecialistInbox,
        local: &mut WorkerLocal,
        effects: Vec<SpecialistEffect>,
    ) -> Flow {
        let mut flow = Flow::Continue;
        for effect in effects {
            match effect {
                SpecialistEffect::LoadContext(request) => self.load_context(me, request),
                SpecialistEffect::StartHarness { key, spec } => {
                    self.start_harness(me, local, key, *spec).await;
                }
                SpecialistEffect::AnswerTool { call_id, answer } => {
                    if let Some(endpoint) = self.worker.config.harnesses.session_endpoint() {
                        endpoint.answer(self.attempt, &call_id, answer);
                    }
                }
                SpecialistEffect::AnswerDelegation { turn, .. } => {
                    tracing::warn!(attempt = %self.attempt, turn, "delegation answers need the MCP endpoint");
                }
                SpecialistEffect::CancelHarness => {
                    if let Some(c) = &local.cancel {
                        c.cancel();
                    }
                }
                SpecialistEffect::Reply(to, reply) => {
                    self.worker.send(&ToCoordinator::Reply {
                        from: to.attempt(),
                        reply,
                    });
                }
                SpecialistEffect::SetTimer { timer, at } => {
                    let me = me.clone();
                    let wait = Duration::from_millis(at.saturating_sub(wall_clock_ms()));
                    tokio::spawn(async move {
                        tokio::time::sleep(wait).await;
                        Self::feed(&me, SpecialistInput::Timer(timer));
                    });
                }
                SpecialistEffect::Emit(event) => {
                    self.worker.send(&ToCoordinator::Lifecycle(event));
                }
                SpecialistEffect::Exit => flow = Flow::Stop(EXIT_REASON.into()),
            }
        }
        flow
    }

    async fn own_input(&self, local: &mut WorkerLocal) -> SpecialistInput {
        match local.session.as_mut() {
            Some(session) => session.next_input().await,
            None => std::future::pending().await,
        }
    }

    fn stopped(&self, _me: &SpecialistInbox, local: &mut WorkerLocal) {
        self.close_session_tools();
        if let Some(c) = local.cancel.take() {
            c.cancel();
        }
        local.session = None;
    }
}
