//! Hosting one specialist attempt: starting its task ([`crate::runtime::task_host`]; no ractor
//! actor), running its harness session and reading the session's events on that same task.

use super::{EXIT_REASON, LiveSpecialist, Node, lock, spawn};
use crate::effect::SpecialistEffect;
use crate::host;
use crate::ids::{AttemptId, IdempotencyKey};
use crate::message::{CoordinatorMsg, SpecialistInput, SpecialistReply, SpecialistStart};
use crate::report::{AttemptResult, FailureKind, SubtaskFailure};
use crate::runtime::harnesses::{SubagentAnswer, SubagentEvent};
use crate::runtime::machine_actor::{Flow, MachineActorState, Role};
use crate::runtime::session_feed::{SessionEvents, SessionServices};
use crate::runtime::task_host::{SpecialistInbox, host_on_task};
use crate::runtime::{RuntimeEvent, spans};
use crate::specialist::Specialist;
use keel_harness::{CancelToken, ErrorCategory, HarnessError, HarnessEvent, HarnessKind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tracing::{Instrument, Span};

impl Node {
    pub(crate) async fn spawn_specialist(self: &Arc<Self>, start: SpecialistStart) {
        if self.pausing.load(Ordering::Acquire) {
            // Shutting down: the attempt is recorded but never started; recovery runs it again.
            return;
        }
        if self.supervisor.get().is_none() {
            return;
        }
        let attempt = start.attempt;
        let step = start.brief.step.clone();
        let span = spans::task_span(
            &self.run_span(attempt.run),
            attempt,
            &start.assignment.agent,
            start.assignment.harness,
        );
        span.in_scope(
            || tracing::info!(%step, model = %start.assignment.model, "specialist started"),
        );
        if self.observed() {
            self.emit(RuntimeEvent::TaskStarted {
                attempt,
                step: step.clone(),
                agent: start.assignment.agent.clone(),
                harness: start.assignment.harness,
                model: start.assignment.model.clone(),
            });
        }
        // With a cluster layer the SubagentStart hooks run here, on the node that holds the policy
        // and the store, before the attempt can leave for a worker (a worker has neither): a veto
        // fails the attempt here, a note rides in the brief. Without one, at the session's start.
        let mut start = start;
        let start_decided = if self.has_remote() {
            let answer = self
                .harnesses
                .subagent_event(
                    attempt,
                    SubagentEvent::Start {
                        agent: &start.assignment.agent,
                        brief: &start.brief.brief,
                    },
                )
                .await;
            if answer.veto.is_none() {
                if let Some(note) = &answer.note {
                    start.brief.brief.push_str(&policy_note(note));
                }
                let Some(back) = self.place_remote(start) else {
                    return;
                };
                start = back;
            }
            Some(SubagentAnswer {
                veto: answer.veto,
                note: None,
            })
        } else {
            None
        };
        self.host_specialist(start, span, start_decided);
    }

    /// Host the attempt's task and enter it in the live table, unless a pause or shutdown has
    /// begun: the SubagentStart hooks and placement awaited since `spawn_specialist`'s first check,
    /// and a pause or shutdown kills only what it finds in the table. Refused, the attempt is
    /// recorded but never started; recovery runs it again (as a spawn during a pause).
    fn host_specialist(
        self: &Arc<Self>,
        start: SpecialistStart,
        span: Span,
        start_decided: Option<SubagentAnswer>,
    ) {
        let attempt = start.attempt;
        let step = start.brief.step.clone();
        let role = SpecialistRole {
            node: Arc::clone(self),
            attempt,
            harness: start.assignment.harness,
            span,
            start_decided,
        };
        let mut config = self.config.specialist.clone();
        config.session_tools = self.harnesses.session_tool_path(start.assignment.harness);
        let machine = Specialist::new(start, config);
        let state = MachineActorState::new(machine, self.fork_rng(), SpecialistLocal::default());
        let mut live = lock(&self.specialists);
        // Checked under the lock `stop_sessions` and `shutdown` set these under before listing.
        if self.pausing.load(Ordering::Acquire) || self.closed.load(Ordering::Acquire) {
            role.span
                .in_scope(|| tracing::info!("specialist not started: the node is stopping"));
            return;
        }
        let node = Arc::clone(self);
        let inbox = host_on_task(role, state, move |me, end| {
            node.specialist_ended(attempt, me, end);
        });
        // In the table before its first input, and `Begin` queued before the lock is released:
        // whatever it does finds it there, and a `Cancel` routed to it comes after its `Begin`.
        inbox.send(SpecialistInput::Begin);
        live.insert(
            attempt,
            LiveSpecialist {
                inbox,
                step,
                cancel: None,
                report: None,
            },
        );
    }
}

/// Per-attempt host state of a specialist.
#[derive(Default)]
pub(crate) struct SpecialistLocal {
    cancel: Option<CancelToken>,
    /// The running session, read on this task ([`Role::own_input`]).
    session: Option<SessionEvents>,
    /// What the progress view was last told of the session's usage.
    usage: crate::runtime::UsageSeen,
    /// The agent profile the session runs as (what the `SubagentStop` hooks match).
    agent: String,
}

/// Hosts one specialist attempt: runs its harness session and streams the session's events into it.
pub(crate) struct SpecialistRole {
    node: Arc<Node>,
    attempt: AttemptId,
    harness: HarnessKind,
    /// The attempt's span (see [`spans`]), a child of its run's.
    span: Span,
    /// The SubagentStart hooks' answer when they ran before placement (with a cluster layer; its
    /// note is already in the brief): the session's start does not ask again.
    start_decided: Option<SubagentAnswer>,
}

/// How a policy hook's note joins a brief or a report's summary.
pub(crate) fn policy_note(note: &str) -> String {
    format!("\n\nNote from keel's policy:\n{note}")
}

/// A SubagentStop answer applied to a finished attempt's result (here or from a worker): a veto
/// refuses the report (a permission failure with the hook's reason, its findings kept as
/// partial), a note joins the summary the lead sees.
pub(crate) fn apply_stop_answer(answer: SubagentAnswer, result: &mut AttemptResult) {
    let Ok(report) = &mut result.outcome else {
        return;
    };
    if let Some(reason) = answer.veto {
        result.outcome = Err(SubtaskFailure {
            kind: FailureKind::Harness(ErrorCategory::Permission),
            attempted: "the session reported; keel's policy refused the report".into(),
            partial: report.findings.clone(),
            retryable: false,
            retry_after_ms: None,
            detail: format!("the report was refused: {reason}"),
        });
        return;
    }
    if let Some(note) = answer.note {
        report.summary.push_str(&policy_note(&note));
    }
}

impl SpecialistRole {
    fn feed(me: &SpecialistInbox, input: SpecialistInput) {
        me.send(input);
    }

    /// A tool call from the node's MCP endpoint; false when the specialist is gone.
    fn feed_tool_call(me: &SpecialistInbox, call: crate::session_tool::SessionToolCall) -> bool {
        me.send(SpecialistInput::ToolCall(call))
    }

    /// The session ended: its endpoint token is revoked.
    fn close_session_tools(&self) {
        if let Some(endpoint) = self.node.harnesses.session_endpoint() {
            endpoint.close(self.attempt);
        }
    }

    async fn start_harness(
        &self,
        me: &SpecialistInbox,
        local: &mut SpecialistLocal,
        key: IdempotencyKey,
        spec: keel_harness::SessionSpec,
    ) {
        {
            let admitted = lock(&self.node.started_keys).admit(key);
            if let Err(refusal) = admitted {
                // docs/DESIGN.md §12 invariant 2: never two sessions with one key; and a full guard
                // refuses rather than forgets.
                Self::feed(
                    me,
                    SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(
                        refusal.to_string(),
                    ))),
                );
                return;
            }
        }
        // A session before this one has ended (a new start follows its terminal event); its
        // services end before this one's open.
        local.session = None;
        let mut spec = spec;
        local.agent = spec.agent.clone();
        let decided = self.start_decided.clone();
        if let Some(SubagentAnswer {
            veto: Some(reason), ..
        }) = &decided
        {
            Self::feed(
                me,
                SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::new(
                    ErrorCategory::Permission,
                    format!("the session was not started: {reason}"),
                ))),
            );
            return;
        }
        let Some(harness) = self.node.harnesses.get(self.harness) else {
            Self::feed(
                me,
                SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(format!(
                    "no {} harness is configured on this node",
                    self.harness
                )))),
            );
            return;
        };
        // The policy's SubagentStart hooks: a veto refuses the start (a permission failure with
        // the hook's reason), a note joins the brief; the decision is durable before either.
        let answer = match decided {
            Some(answer) => answer,
            None => {
                self.node
                    .harnesses
                    .subagent_event(
                        self.attempt,
                        SubagentEvent::Start {
                            agent: &spec.agent,
                            brief: &spec.prompt,
                        },
                    )
                    .await
            }
        };
        if let Some(reason) = answer.veto {
            Self::feed(
                me,
                SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::new(
                    ErrorCategory::Permission,
                    format!("the session was not started: {reason}"),
                ))),
            );
            return;
        }
        if let Some(note) = answer.note {
            spec.prompt.push_str(&policy_note(&note));
        }
        let mut spec = self.node.harnesses.prepare(spec, self.attempt);
        // From here what the start opens (the services' tokens, the session tools' token) ends
        // with this guard, even if the task is killed while the harness starts.
        let services = {
            let (node, attempt) = (Arc::clone(&self.node), self.attempt);
            SessionServices::new(move || node.harnesses.end_session(attempt))
        };
        let deliver = {
            let me = me.clone();
            Box::new(move |call| Self::feed_tool_call(&me, call))
        };
        if let Some(token) =
            self.node
                .harnesses
                .open_session_tools(&mut spec, self.harness, self.attempt, deliver)
        {
            // Registered before the session can print it: the mailbox delivers this first.
            Self::feed(me, SpecialistInput::SessionSecret(token));
        }
        self.node.sessions_started.fetch_add(1, Ordering::Relaxed);
        match harness.start(spec).await {
            Err(e) => {
                drop(services);
                Self::feed(
                    me,
                    SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(format!(
                        "the session could not start: {e}"
                    )))),
                );
            }
            Ok(session) => {
                local.cancel = Some(session.cancel_token());
                if let Some(live) = lock(&self.node.specialists).get_mut(&self.attempt) {
                    live.cancel = Some(session.cancel_token());
                }
                tracing::debug!("harness session started");
                // Services (the hook bridge's session token) end with the session however it ends.
                local.session = Some(SessionEvents::new(session, services));
            }
        }
    }
}

impl SpecialistRole {
    /// The policy's SubagentStop hooks on a report that came back: a veto refuses it (the attempt
    /// fails as a permission failure with the hook's reason, its findings kept as partial), a note
    /// joins the report's summary the lead sees. The decision is durable before either.
    async fn report_check(&self, local: &SpecialistLocal, result: &mut AttemptResult) {
        let Ok(report) = &result.outcome else {
            return;
        };
        let answer = self
            .node
            .harnesses
            .subagent_event(
                self.attempt,
                SubagentEvent::Stop {
                    agent: &local.agent,
                    report,
                },
            )
            .await;
        apply_stop_answer(answer, result);
    }
}

impl Role for SpecialistRole {
    type M = Specialist;
    type Local = SpecialistLocal;
    type Addr = SpecialistInbox;

    fn span(&self) -> Span {
        self.span.clone()
    }

    fn before(&self, input: &SpecialistInput, _local: &mut SpecialistLocal) {
        if let SpecialistInput::Harness(event) = input
            && event.is_terminal()
        {
            // The session is over: its token stops working now, not when the result is acknowledged.
            self.close_session_tools();
        }
    }

    fn after(&self, specialist: &Specialist, local: &mut SpecialistLocal) -> Flow {
        if let Some((tokens, spent_micros)) = local.usage.change(specialist) {
            self.node.emit(RuntimeEvent::Usage {
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
        local: &mut SpecialistLocal,
        effects: Vec<SpecialistEffect>,
    ) -> Flow {
        let mut flow = Flow::Continue;
        // The replies of this step, delivered together once its effects are done: one input of
        // the coordinator (its log rows and its result, most often) instead of one each.
        let mut replies = Vec::new();
        let mut reply_run = self.attempt.run;
        for effect in effects {
            match effect {
                SpecialistEffect::LoadContext(request) => {
                    let node = Arc::clone(&self.node);
                    let config = self.node.config.specialist.context;
                    let run = self.attempt.run;
                    let me = me.clone();
                    let span = self.span.clone();
                    let load = async move {
                        let rows = tokio::task::spawn_blocking(move || {
                            span.in_scope(|| {
                                let store = node.store.get().map_err(|e| e.to_string())?;
                                host::store::load_context(&store, run, &request, &config)
                            })
                        })
                        .await
                        .unwrap_or_else(|e| Err(format!("context load task failed: {e}")));
                        Self::feed(&me, SpecialistInput::ContextLoaded(rows));
                    };
                    spawn(load.instrument(self.span.clone()));
                }
                SpecialistEffect::StartHarness { key, spec } => {
                    // Boxed: a large future awaited once per attempt; inline it would enlarge
                    // the future of every step of the specialist.
                    Box::pin(self.start_harness(me, local, key, *spec)).await;
                }
                SpecialistEffect::AnswerTool { call_id, answer } => {
                    if let Some(endpoint) = self.node.harnesses.session_endpoint() {
                        endpoint.answer(self.attempt, &call_id, answer);
                    }
                }
                SpecialistEffect::AnswerDelegation { turn, .. } => {
                    // The MCP endpoint that would hold the lead's pending `delegate` call is not part
                    // of this runtime yet; the lead's session sees no answer.
                    tracing::warn!(attempt = %self.attempt, turn, "delegation answers need the MCP endpoint");
                }
                SpecialistEffect::CancelHarness => {
                    if let Some(c) = &local.cancel {
                        c.cancel();
                    }
                }
                SpecialistEffect::Reply(to, mut reply) => {
                    if let SpecialistReply::Finished(result) = &mut reply {
                        Box::pin(self.report_check(local, result)).await;
                    }
                    match &reply {
                        SpecialistReply::Finished(result) => {
                            // Kept for observers only (`RuntimeEvent::Report` when the `Ack` is
                            // routed): no observer, no copy.
                            if let Ok(report) = &result.outcome
                                && self.node.observed()
                                && let Some(live) =
                                    lock(&self.node.specialists).get_mut(&self.attempt)
                            {
                                live.report = Some(report.clone());
                            }
                            if self.node.pausing.load(Ordering::Acquire) {
                                // Held back during a pause: not acknowledged, so recovery re-runs
                                // the attempt with a resume preamble. The task ends here.
                                flow = Flow::Stop("paused".into());
                                continue;
                            }
                        }
                        SpecialistReply::Logs { rows } => {
                            if let Some((_, row)) = rows.last()
                                && self.node.observed()
                            {
                                self.node.emit(RuntimeEvent::Progress {
                                    attempt: self.attempt,
                                    summary: row.summary.clone(),
                                });
                            }
                        }
                        SpecialistReply::Spend { spent_micros } => {
                            self.node.emit(RuntimeEvent::Spend {
                                attempt: self.attempt,
                                spent_micros: *spent_micros,
                            });
                        }
                        SpecialistReply::Tool {
                            request: crate::session_tool::SessionRequest::ReportProgress { note },
                            ..
                        } => {
                            self.node.emit(RuntimeEvent::Progress {
                                attempt: self.attempt,
                                summary: format!("progress: {note}"),
                            });
                        }
                        SpecialistReply::Delegate { .. } | SpecialistReply::Tool { .. } => {}
                    }
                    reply_run = to.run();
                    replies.push(CoordinatorMsg::Specialist {
                        from: to.attempt(),
                        reply,
                    });
                }
                SpecialistEffect::SetTimer { timer, at } => {
                    let me = me.clone();
                    self.node
                        .timer(at, move || Self::feed(&me, SpecialistInput::Timer(timer)));
                }
                SpecialistEffect::Emit(event) => self.node.lifecycle(event, None),
                SpecialistEffect::Exit => flow = Flow::Stop(EXIT_REASON.into()),
            }
        }
        // A specialist's only address is its own run's coordinator (its `ReplyTo`).
        self.node.route_to_coordinator(reply_run, replies);
        flow
    }

    async fn own_input(&self, local: &mut SpecialistLocal) -> SpecialistInput {
        match local.session.as_mut() {
            Some(session) => session.next_input().await,
            None => std::future::pending().await,
        }
    }

    fn stopped(&self, me: &SpecialistInbox, local: &mut SpecialistLocal) {
        if let Some(c) = local.cancel.take() {
            c.cancel();
        }
        local.session = None;
        self.close_session_tools();
        let mut live = lock(&self.node.specialists);
        if live.get(&self.attempt).is_some_and(|s| s.inbox.same(me)) {
            live.remove(&self.attempt);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

    use super::*;
    use crate::runtime::test_support::{start, workspace};
    use keel_store::{RunId, TaskId};
    use std::time::Duration;

    fn scripted_start() -> SpecialistStart {
        let attempt = AttemptId {
            run: RunId(7),
            task: TaskId(11),
            attempt: 1,
        };
        crate::runtime::scripted::scripted_start(attempt, "say hello")
    }

    /// What hosting after `spawn_specialist`'s first check does once a pause has listed the live
    /// specialists (the SubagentStart hooks or placement awaited across the pause): nothing.
    #[tokio::test]
    async fn an_attempt_hosted_after_a_pause_listed_the_specialists_is_refused() {
        let (_dir, work, store) = workspace();
        let rt = start(&store, &work).await;
        let node = Arc::clone(&rt.node);
        let summary = rt.pause(Duration::from_millis(100)).await;
        assert_eq!(summary.specialists_killed, 0);
        node.host_specialist(scripted_start(), Span::none(), None);
        assert!(lock(&node.specialists).is_empty(), "hosted after the pause");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(node.sessions_started.load(Ordering::Relaxed), 0);
        rt.shutdown().await;
    }

    /// The same once a shutdown (without a pause first) has listed and killed the specialists.
    #[tokio::test]
    async fn an_attempt_hosted_after_shutdown_listed_the_specialists_is_refused() {
        let (_dir, work, store) = workspace();
        let rt = start(&store, &work).await;
        let node = Arc::clone(&rt.node);
        rt.shutdown().await;
        node.host_specialist(scripted_start(), Span::none(), None);
        assert!(
            lock(&node.specialists).is_empty(),
            "hosted after the shutdown"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(node.sessions_started.load(Ordering::Relaxed), 0);
    }

    /// A harness whose start never completes (a CLI that hangs before its first line).
    struct HangingStart;

    impl keel_harness::Harness for HangingStart {
        fn kind(&self) -> keel_harness::HarnessKind {
            keel_harness::HarnessKind::Scripted
        }

        fn start(
            &self,
            _spec: keel_harness::SessionSpec,
        ) -> keel_harness::session::BoxFuture<
            '_,
            Result<keel_harness::RunningSession, keel_harness::StartError>,
        > {
            Box::pin(std::future::pending())
        }
    }

    /// A session service counting what it is told (the hook bridge registers and revokes a token).
    #[derive(Default)]
    struct Counted {
        starting: std::sync::atomic::AtomicU32,
        ended: std::sync::atomic::AtomicU32,
    }

    impl crate::runtime::SessionService for Counted {
        fn session_starting(&self, _attempt: AttemptId, _spec: &mut keel_harness::SessionSpec) {
            self.starting.fetch_add(1, Ordering::SeqCst);
        }

        fn session_ended(&self, _attempt: AttemptId) {
            self.ended.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A session-tools endpoint counting the tokens it holds open (keel-mcp's registry).
    #[derive(Debug, Default)]
    struct CountedEndpoint {
        open: std::sync::atomic::AtomicI32,
    }

    impl crate::SessionEndpoint for CountedEndpoint {
        fn open(
            &self,
            _attempt: AttemptId,
            _deliver: crate::session_tool::DeliverToolCall,
        ) -> Result<crate::session_tool::SessionAccess, crate::session_tool::EndpointUnavailable>
        {
            self.open.fetch_add(1, Ordering::SeqCst);
            Ok(crate::session_tool::SessionAccess {
                url: "http://127.0.0.1:9/mcp".into(),
                token: "t".into(),
            })
        }

        fn close(&self, _attempt: AttemptId) {
            // Idempotent, as the registry's: a close of a closed token changes nothing.
            let _ = self
                .open
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n > 0).then(|| n - 1)
                });
        }

        fn answer(&self, _attempt: AttemptId, _call_id: &str, _answer: crate::SessionAnswer) {}
    }

    /// Polls `done` every 10 ms for at most 5 s.
    async fn eventually(done: impl Fn() -> bool) -> bool {
        for _ in 0..500 {
            if done() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        done()
    }

    /// A specialist killed while its harness is still starting ends what its start opened (the
    /// hook bridge's and the session tools' tokens would otherwise stay valid for a session that
    /// never ran).
    #[tokio::test]
    async fn a_kill_while_the_harness_starts_ends_the_sessions_services() {
        let (_dir, work, store) = workspace();
        let mut c = crate::runtime::RuntimeConfig::default();
        c.supervisor.agents = vec![crate::runtime::scripted::scripted_agent()];
        c.specialist.working_dir = work.clone();
        let counted = Arc::new(Counted::default());
        let endpoint = Arc::new(CountedEndpoint::default());
        let harnesses = crate::runtime::HarnessSet::new()
            .with(keel_harness::HarnessKind::Scripted, Arc::new(HangingStart))
            .with_service(Arc::clone(&counted) as Arc<dyn crate::runtime::SessionService>)
            .with_session_endpoint(Arc::clone(&endpoint) as Arc<dyn crate::SessionEndpoint>);
        let rt = crate::runtime::Runtime::start(Arc::clone(&store), harnesses, c)
            .await
            .unwrap()
            .0;
        let node = Arc::clone(&rt.node);
        let start = scripted_start();
        let attempt = start.attempt;
        node.host_specialist(start, Span::none(), None);
        assert!(
            eventually(|| counted.starting.load(Ordering::SeqCst) == 1).await,
            "the session's start never reached its services"
        );
        assert_eq!(counted.ended.load(Ordering::SeqCst), 0, "nothing ended yet");
        assert_eq!(
            endpoint.open.load(Ordering::SeqCst),
            1,
            "the tools' token is open"
        );
        let inbox = lock(&node.specialists)
            .get(&attempt)
            .map(|s| s.inbox.clone())
            .unwrap();
        inbox.kill();
        assert!(
            eventually(|| counted.ended.load(Ordering::SeqCst) == 1).await,
            "the killed start left its services open"
        );
        assert!(eventually(|| lock(&node.specialists).is_empty()).await);
        assert_eq!(counted.ended.load(Ordering::SeqCst), 1, "ended once");
        assert_eq!(
            endpoint.open.load(Ordering::SeqCst),
            0,
            "the killed start left the session tools' token open"
        );
        rt.shutdown().await;
    }

    /// Before a pause, the same call hosts the attempt (the refusal above is the pause's doing).
    #[tokio::test]
    async fn an_attempt_hosted_before_a_pause_is_live_and_the_pause_ends_it() {
        let (_dir, work, store) = workspace();
        let rt = start(&store, &work).await;
        let node = Arc::clone(&rt.node);
        node.host_specialist(scripted_start(), Span::none(), None);
        assert_eq!(lock(&node.specialists).len(), 1);
        rt.pause(Duration::from_secs(5)).await;
        assert!(lock(&node.specialists).is_empty(), "the pause ended it");
        rt.shutdown().await;
    }
}
