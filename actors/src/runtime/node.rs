//! The coordinator node: the shared routing table, the effect executors, and the four roles that host
//! the machines (coordinator per run, one supervisor, one checkpoint writer, one specialist per attempt).
//!
//! Rules this file keeps:
//! - Only the checkpoint role writes the store, and only through [`crate::host::store::commit`] of a batch its
//!   machine emitted. Specialists read their context rows; nothing else touches redb.
//! - Specialists never address anyone but their coordinator: their replies are routed by the
//!   [`crate::ReplyTo`] the machine holds.
//! - Every spawned task ends by itself: timers fire once, forwarders end at the session's terminal
//!   event or when the specialist is gone, commits end with their transaction.

use crate::checkpoint::CheckpointWriter;
use crate::coordinator::Coordinator;
use crate::effect::{Effect, Envelope, SpecialistEffect, TimerKey};
use crate::host;
use crate::ids::{AttemptId, IdempotencyKey};
use crate::machine::Millis;
use crate::message::{
    CheckpointInput, CheckpointMsg, CoordinatorInput, CoordinatorMsg, LifecycleEvent,
    SpecialistInput, SpecialistMsg, SpecialistReply, SpecialistStart, SupervisorInput,
    SupervisorMsg,
};
use crate::persist::{CommitBatch, PersistOp, Stage};
use crate::report::{AttemptResult, SubagentReport};
use crate::runtime::clock::{OsEntropy, wall_clock_ms};
use crate::runtime::host::{Flow, Host, HostRef, HostState, Role};
use crate::runtime::{HarnessSet, RunOutcome, RuntimeConfig, RuntimeEvent, spans};
use crate::specialist::Specialist;
use crate::supervisor::Supervisor;
use keel_harness::{CancelToken, HarnessError, HarnessEvent, HarnessKind, UsageAccumulator};
use keel_store::{RunId, Store};
use ractor::{Actor, ActorId, SupervisionEvent};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::{Instrument, Span};

/// Tickets at or above this are the host's own stages (pause marks, resume marks), answered to the
/// host instead of a coordinator. Coordinators count their tickets from 1.
pub(crate) const HOST_TICKET_BASE: u64 = u64::MAX / 2;

/// The exit reason of a specialist that ended normally (its machine emitted `Exit`); any other end is
/// reported to the supervisor machine as `SpecialistDown`.
pub(crate) const EXIT_REASON: &str = "exit";

/// Most idempotency keys remembered by the in-process double-start guard.
const STARTED_KEYS_MAX: usize = 1 << 20;

/// A poisoned lock only means another task panicked while holding plain data: keep going.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A live specialist as the routing table knows it.
pub(crate) struct LiveSpecialist {
    pub(crate) actor: HostRef<Specialist>,
    pub(crate) step: String,
    /// Its running session's cancel switch, so a killed actor's session is stopped too (a kill
    /// skips the actor's own cleanup).
    pub(crate) cancel: Option<CancelToken>,
    /// The report of its finished session, waiting for the coordinator's acknowledgement: observers
    /// get it when the `Ack` is routed, so it reaches the event channel before the run's `Finished`
    /// (the coordinator routes the `Ack` before it can finish the run).
    pub(crate) report: Option<SubagentReport>,
}

/// Everything the node's actors share.
pub(crate) struct Node {
    pub(crate) store: Arc<Store>,
    pub(crate) harnesses: HarnessSet,
    pub(crate) config: RuntimeConfig,
    pub(crate) coordinators: Mutex<BTreeMap<RunId, HostRef<Coordinator>>>,
    /// The span of each hosted run, the parent of its tasks' spans (removed with the coordinator).
    pub(crate) run_spans: Mutex<BTreeMap<RunId, Span>>,
    pub(crate) specialists: Mutex<BTreeMap<AttemptId, LiveSpecialist>>,
    pub(crate) by_actor: Mutex<BTreeMap<ActorId, AttemptId>>,
    pub(crate) supervisor: OnceLock<HostRef<Supervisor>>,
    pub(crate) checkpoint: OnceLock<HostRef<CheckpointWriter>>,
    pub(crate) waiters: Mutex<BTreeMap<RunId, Vec<oneshot::Sender<RunOutcome>>>>,
    pub(crate) host_acks: Mutex<BTreeMap<u64, oneshot::Sender<Result<(), String>>>>,
    pub(crate) next_host_ticket: AtomicU64,
    pub(crate) events: Option<mpsc::Sender<RuntimeEvent>>,
    pub(crate) events_dropped: AtomicU64,
    /// Set by a graceful shutdown: no new specialists, results are held back (not acknowledged).
    pub(crate) pausing: AtomicBool,
    /// Set once the pause marks are being written: coordinators get nothing more.
    pub(crate) frozen: AtomicBool,
    pub(crate) commits_in_flight: AtomicU64,
    /// Group commits handed to the store writer (failed ones included), for `Runtime::commits`.
    pub(crate) commits_total: AtomicU64,
    pub(crate) entropy: Mutex<OsEntropy>,
    pub(crate) started_keys: Mutex<BTreeSet<IdempotencyKey>>,
    pub(crate) sessions_started: AtomicU64,
    /// The store writer thread's queue (see [`store_writer`]); set once at start.
    pub(crate) writer: OnceLock<std::sync::mpsc::Sender<(CommitBatch, tracing::Span)>>,
}

/// The store writer: one OS thread that executes the checkpoint machine's group commits, one at a
/// time (the machine keeps at most one in flight), and answers the checkpoint actor. A thread of its
/// own rather than a `spawn_blocking` per commit: redb's commit blocks on fsync, and handing each
/// commit to tokio's blocking pool (a task, a pool wake-up, a join) costs more than the commit's own
/// CPU. It holds the node weakly, so it ends when the node is gone (its queue's sender with it).
pub(crate) fn store_writer(
    node: std::sync::Weak<Node>,
    batches: std::sync::mpsc::Receiver<(CommitBatch, tracing::Span)>,
) {
    while let Ok((batch, span)) = batches.recv() {
        let Some(node) = node.upgrade() else {
            return;
        };
        span.in_scope(|| node.commit_now(batch));
    }
}

impl Node {
    pub(crate) fn fork_rng(&self) -> OsEntropy {
        lock(&self.entropy).fork()
    }

    /// Tell observers; never blocks a machine (a full channel drops the event and counts it: the
    /// store is the record, events are a view of it).
    pub(crate) fn emit(&self, event: RuntimeEvent) {
        if let Some(tx) = &self.events
            && tx.try_send(event).is_err()
        {
            self.events_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The span of a run hosted here (`Span::none()` for a run that is not).
    fn run_span(&self, run: RunId) -> Span {
        lock(&self.run_spans)
            .get(&run)
            .cloned()
            .unwrap_or_else(Span::none)
    }

    fn coordinator(&self, run: RunId) -> Option<HostRef<Coordinator>> {
        lock(&self.coordinators).get(&run).cloned()
    }

    /// Deliver one envelope to its machine's mailbox. A message for an actor that is gone is dropped:
    /// every message between machines is either resent by its sender or made moot by the store.
    pub(crate) fn route(&self, envelope: Envelope) {
        match envelope {
            Envelope::Coordinator { run, msg } => {
                if let CoordinatorMsg::Durable { ticket } = &msg
                    && *ticket >= HOST_TICKET_BASE
                {
                    self.host_ack(*ticket, Ok(()));
                    return;
                }
                if let CoordinatorMsg::PersistFailed { ticket, error } = &msg
                    && *ticket >= HOST_TICKET_BASE
                {
                    self.host_ack(*ticket, Err(error.clone()));
                    return;
                }
                if self.frozen.load(Ordering::Acquire) {
                    return;
                }
                if let Some(c) = self.coordinator(run) {
                    let _ = c.send_message(crate::runtime::Deliver(CoordinatorInput::Msg(msg)));
                } else {
                    tracing::debug!(%run, "message for a coordinator that is not running, dropped");
                }
            }
            Envelope::Specialist { attempt, msg } => {
                let (actor, report) = match lock(&self.specialists).get_mut(&attempt) {
                    Some(s) => {
                        // An Ack means the result is durable: that is when a report exists for
                        // observers. Taken, so a re-ack of a duplicate reports nothing twice.
                        let report = if matches!(msg, SpecialistMsg::Ack) {
                            s.report.take().map(|r| (s.step.clone(), r))
                        } else {
                            None
                        };
                        (Some(s.actor.clone()), report)
                    }
                    None => (None, None),
                };
                if let Some((step, report)) = report {
                    self.emit(RuntimeEvent::Report {
                        attempt,
                        step,
                        report,
                    });
                }
                if let Some(a) = actor {
                    let _ = a.send_message(crate::runtime::Deliver(SpecialistInput::Msg(msg)));
                }
            }
            Envelope::Supervisor(m) => {
                if let Some(s) = self.supervisor.get() {
                    let _ = s.send_message(crate::runtime::Deliver(SupervisorInput::Msg(m)));
                }
            }
            Envelope::Checkpoint(m) => {
                if let Some(c) = self.checkpoint.get() {
                    let _ = c.send_message(crate::runtime::Deliver(CheckpointInput::Msg(m)));
                }
            }
        }
    }

    fn host_ack(&self, ticket: u64, result: Result<(), String>) {
        if let Some(tx) = lock(&self.host_acks).remove(&ticket) {
            let _ = tx.send(result);
        }
    }

    /// Make a stage of the host's own durable through the checkpoint actor (the only writer) and wait
    /// for its answer, at most `wait`.
    pub(crate) async fn stage_host(
        &self,
        run: RunId,
        ops: Vec<PersistOp>,
        wait: Duration,
    ) -> Result<(), String> {
        let ticket = HOST_TICKET_BASE + self.next_host_ticket.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.host_acks).insert(ticket, tx);
        self.route(Envelope::Checkpoint(CheckpointMsg::Stage(Stage {
            run,
            ticket,
            ops,
        })));
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err("the checkpoint actor is gone".into()),
            Err(_) => {
                lock(&self.host_acks).remove(&ticket);
                Err(format!("no answer from the checkpoint actor in {wait:?}"))
            }
        }
    }

    fn lifecycle(&self, event: LifecycleEvent) {
        match event {
            LifecycleEvent::RunFinished {
                run,
                status,
                outcome,
            } => {
                tracing::info!(?status, "run finished");
                let done = RunOutcome {
                    run,
                    status,
                    outcome,
                };
                // The event goes out before the waiters wake, so a caller that awaited the run's end
                // finds `Finished` already in its event channel.
                self.emit(RuntimeEvent::Finished(done.clone()));
                let waiters = lock(&self.waiters).remove(&run).unwrap_or_default();
                for w in waiters {
                    let _ = w.send(done.clone());
                }
            }
            LifecycleEvent::SubagentError { attempt, kind } => {
                tracing::info!(failure = %kind, "attempt failed");
                let step = lock(&self.specialists)
                    .get(&attempt)
                    .map(|s| s.step.clone())
                    .unwrap_or_default();
                self.emit(RuntimeEvent::TaskFailed {
                    attempt,
                    step,
                    kind,
                });
            }
            LifecycleEvent::SubagentStop { .. } => tracing::info!("attempt finished"),
            LifecycleEvent::SubagentStart { .. } => {}
        }
    }

    /// Fire `deliver` at host time `at` (timers are never cancelled; machines ignore stale ones).
    fn timer(at: Millis, deliver: impl FnOnce() + Send + 'static) {
        let wait = Duration::from_millis(at.saturating_sub(wall_clock_ms()));
        spawn(async move {
            tokio::time::sleep(wait).await;
            deliver();
        });
    }

    /// Execute the effects of a coordinator-node machine (coordinator, supervisor, checkpoint).
    pub(crate) async fn execute_node(self: &Arc<Self>, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send(envelope) => self.route(envelope),
                Effect::Persist(batch) => self.persist(batch),
                Effect::SpawnSpecialist(start) => self.spawn_specialist(start).await,
                Effect::StopSpecialist { attempt, reason } => {
                    self.route(Envelope::Specialist {
                        attempt,
                        msg: SpecialistMsg::Cancel { reason },
                    });
                    // A cooperative cancel first; an attempt still alive after the grace period is
                    // killed (its session's process tree goes with the dropped session).
                    let node = Arc::clone(self);
                    let at = wall_clock_ms().saturating_add(self.config.stop_grace_ms);
                    Self::timer(at, move || {
                        let live = lock(&node.specialists)
                            .get(&attempt)
                            .map(|s| s.actor.clone());
                        if let Some(actor) = live {
                            actor.kill();
                        }
                    });
                }
                Effect::SetTimer { key, at } => {
                    let node = Arc::clone(self);
                    Self::timer(at, move || match key {
                        TimerKey::Coordinator(run, t) => {
                            if let Some(c) = node.coordinator(run) {
                                let _ = c.send_message(crate::runtime::Deliver(
                                    CoordinatorInput::Timer(t),
                                ));
                            }
                        }
                        TimerKey::Supervisor(t) => {
                            if let Some(s) = node.supervisor.get() {
                                let _ = s.send_message(crate::runtime::Deliver(
                                    SupervisorInput::Timer(t),
                                ));
                            }
                        }
                        TimerKey::Checkpoint(t) => {
                            if let Some(c) = node.checkpoint.get() {
                                let _ = c.send_message(crate::runtime::Deliver(
                                    CheckpointInput::Timer(t),
                                ));
                            }
                        }
                    });
                }
                Effect::Emit(event) => self.lifecycle(event),
            }
        }
    }

    /// One group commit, handed to the store writer thread (redb's commit blocks on fsync); its
    /// completion goes back to the checkpoint machine, which keeps at most one commit in flight.
    fn persist(self: &Arc<Self>, batch: CommitBatch) {
        self.commits_in_flight.fetch_add(1, Ordering::AcqRel);
        self.commits_total.fetch_add(1, Ordering::Relaxed);
        // One run's commit runs in that run's span; a commit shared by several runs in its own.
        let first = batch.stages.first().map(|s| s.run);
        let span = match first {
            Some(run) if batch.stages.iter().all(|s| s.run == run) => self.run_span(run),
            _ => spans::commit_span(batch.stages.len()),
        };
        let id = batch.id;
        let sent = match self.writer.get() {
            Some(tx) => tx.send((batch, span)).is_ok(),
            None => false,
        };
        if !sent {
            self.committed(
                id,
                Err("the store writer thread is gone".into()),
                Vec::new(),
            );
        }
    }

    /// Execute one group commit on the calling thread (the store writer's) and answer the
    /// checkpoint actor.
    fn commit_now(&self, batch: CommitBatch) {
        let escalations: Vec<RuntimeEvent> = batch
            .ops()
            .filter_map(|(run, op)| match op {
                PersistOp::AppendEscalation(e) => Some(RuntimeEvent::Escalation {
                    run,
                    task: e.task_id,
                    reason: e.diagnosis.clone(),
                }),
                _ => None,
            })
            .collect();
        let id = batch.id;
        let store = &self.store;
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            host::store::commit(store, &batch)
        }))
        .map_err(|_| "the commit panicked".to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        self.committed(id, result, escalations);
    }

    fn committed(
        &self,
        id: crate::persist::CommitId,
        result: Result<(), String>,
        escalations: Vec<RuntimeEvent>,
    ) {
        let input = match result {
            Ok(()) => {
                for e in escalations {
                    self.emit(e);
                }
                CheckpointInput::Committed(id)
            }
            Err(error) => {
                tracing::warn!(%error, "group commit failed");
                CheckpointInput::CommitFailed { id, error }
            }
        };
        if let Some(c) = self.checkpoint.get() {
            let _ = c.send_message(crate::runtime::Deliver(input));
        }
        self.commits_in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    async fn spawn_specialist(self: &Arc<Self>, start: SpecialistStart) {
        if self.pausing.load(Ordering::Acquire) {
            // Shutting down: the attempt is recorded but never started; recovery runs it again.
            return;
        }
        let Some(supervisor) = self.supervisor.get() else {
            return;
        };
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
        self.emit(RuntimeEvent::TaskStarted {
            attempt,
            step: step.clone(),
            agent: start.assignment.agent.clone(),
            harness: start.assignment.harness,
            model: start.assignment.model.clone(),
        });
        let role = SpecialistRole {
            node: Arc::clone(self),
            attempt,
            harness: start.assignment.harness,
            span,
        };
        let machine = Specialist::new(start, self.config.specialist.clone());
        let state = HostState::new(machine, self.fork_rng(), SpecialistLocal::default());
        match Actor::spawn_linked(None, Host::new(role), state, supervisor.get_cell()).await {
            Ok((actor, _join)) => {
                lock(&self.by_actor).insert(actor.get_id(), attempt);
                lock(&self.specialists).insert(
                    attempt,
                    LiveSpecialist {
                        actor: actor.clone(),
                        step,
                        cancel: None,
                        report: None,
                    },
                );
                let _ = actor.send_message(crate::runtime::Deliver(SpecialistInput::Begin));
            }
            Err(e) => {
                tracing::error!(%attempt, error = %e, "could not spawn a specialist");
                self.route(Envelope::Supervisor(SupervisorMsg::SpecialistDown {
                    attempt,
                    reason: format!("spawn failed: {e}"),
                }));
            }
        }
    }
}

/// Spawn a task of the runtime (the one module allowed to).
#[allow(clippy::disallowed_methods)] // The runtime executes effects concurrently; machines never spawn.
pub(crate) fn spawn<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(future);
}

/// Hosts a run's coordinator; stops the actor once the run is terminal.
pub(crate) struct CoordinatorRole {
    pub(crate) node: Arc<Node>,
    pub(crate) run: RunId,
    /// The run's span (see [`spans`]).
    pub(crate) span: Span,
}

impl Role for CoordinatorRole {
    type M = Coordinator;
    type Local = ();

    fn span(&self) -> Span {
        self.span.clone()
    }

    async fn execute(
        &self,
        _me: &HostRef<Coordinator>,
        _local: &mut (),
        effects: Vec<Effect>,
    ) -> Flow {
        self.node.execute_node(effects).await;
        Flow::Continue
    }

    fn after(&self, machine: &Coordinator, _local: &mut ()) -> Flow {
        if machine.is_terminal() {
            Flow::Stop("run finished".into())
        } else {
            Flow::Continue
        }
    }

    fn stopped(&self, me: &HostRef<Coordinator>, _local: &mut ()) {
        let mut map = lock(&self.node.coordinators);
        if map
            .get(&self.run)
            .is_some_and(|c| c.get_id() == me.get_id())
        {
            map.remove(&self.run);
            lock(&self.node.run_spans).remove(&self.run);
        }
    }
}

/// Hosts the supervisor: its linked children are the specialists, whose ends become
/// `SpecialistDown` inputs.
pub(crate) struct SupervisorRole {
    pub(crate) node: Arc<Node>,
}

impl Role for SupervisorRole {
    type M = Supervisor;
    type Local = ();

    async fn execute(
        &self,
        _me: &HostRef<Supervisor>,
        _local: &mut (),
        effects: Vec<Effect>,
    ) -> Flow {
        self.node.execute_node(effects).await;
        Flow::Continue
    }

    fn supervision(&self, event: &SupervisionEvent, _local: &mut ()) -> Option<SupervisorInput> {
        let (id, reason) = match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell.get_id(),
                reason.clone().unwrap_or_else(|| "stopped".into()),
            ),
            SupervisionEvent::ActorFailed(cell, error) => {
                (cell.get_id(), format!("failed: {error}"))
            }
            _ => return None,
        };
        let attempt = lock(&self.node.by_actor).remove(&id)?;
        {
            let mut live = lock(&self.node.specialists);
            if live.get(&attempt).is_some_and(|s| s.actor.get_id() == id)
                && let Some(gone) = live.remove(&attempt)
                && let Some(cancel) = gone.cancel
            {
                cancel.cancel();
            }
        }
        if reason == EXIT_REASON || self.node.pausing.load(Ordering::Acquire) {
            // A normal exit follows a settle; during a pause the attempt is left for recovery.
            return None;
        }
        Some(SupervisorInput::Msg(SupervisorMsg::SpecialistDown {
            attempt,
            reason,
        }))
    }
}

/// Hosts the checkpoint writer: the only writer of the store.
pub(crate) struct CheckpointRole {
    pub(crate) node: Arc<Node>,
}

impl Role for CheckpointRole {
    type M = CheckpointWriter;
    type Local = ();

    async fn execute(
        &self,
        _me: &HostRef<CheckpointWriter>,
        _local: &mut (),
        effects: Vec<Effect>,
    ) -> Flow {
        self.node.execute_node(effects).await;
        Flow::Continue
    }
}

/// Per-attempt host state of a specialist.
#[derive(Default)]
pub(crate) struct SpecialistLocal {
    cancel: Option<CancelToken>,
    result: Option<AttemptResult>,
    /// The session's usage as observers see it (the machine folds its own copy for the budget).
    usage: UsageAccumulator,
    usage_sent: Option<keel_harness::TokenCounts>,
}

/// Hosts one specialist attempt: runs its harness session and streams the session's events into it.
pub(crate) struct SpecialistRole {
    node: Arc<Node>,
    attempt: AttemptId,
    harness: HarnessKind,
    /// The attempt's span (see [`spans`]), a child of its run's.
    span: Span,
}

impl SpecialistRole {
    fn feed(me: &HostRef<Specialist>, input: SpecialistInput) {
        let _ = me.send_message(crate::runtime::Deliver(input));
    }

    async fn start_harness(
        &self,
        me: &HostRef<Specialist>,
        local: &mut SpecialistLocal,
        key: IdempotencyKey,
        spec: keel_harness::SessionSpec,
    ) {
        {
            let mut started = lock(&self.node.started_keys);
            if started.contains(&key) {
                // DESIGN.md §12 invariant 2: never two sessions with one key.
                Self::feed(
                    me,
                    SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(format!(
                        "a session was already started with key {key}"
                    )))),
                );
                return;
            }
            if started.len() >= STARTED_KEYS_MAX {
                started.clear();
            }
            started.insert(key);
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
        let spec = self.node.harnesses.prepare(spec, self.attempt);
        self.node.sessions_started.fetch_add(1, Ordering::Relaxed);
        match harness.start(spec).await {
            Err(e) => Self::feed(
                me,
                SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(format!(
                    "the session could not start: {e}"
                )))),
            ),
            Ok(mut session) => {
                local.cancel = Some(session.cancel_token());
                if let Some(live) = lock(&self.node.specialists).get_mut(&self.attempt) {
                    live.cancel = Some(session.cancel_token());
                }
                let me = me.clone();
                tracing::debug!("harness session started");
                let forward = async move {
                    loop {
                        let Some(event) = session.next_event().await else {
                            Self::feed(
                                &me,
                                SpecialistInput::Harness(HarnessEvent::Failed(
                                    HarnessError::system(
                                        "the session ended without a terminal event",
                                    ),
                                )),
                            );
                            return;
                        };
                        let terminal = event.is_terminal();
                        if me
                            .send_message(crate::runtime::Deliver(SpecialistInput::Harness(event)))
                            .is_err()
                        {
                            // The specialist is gone: stop the session rather than run it unobserved.
                            session.cancel();
                            return;
                        }
                        if terminal {
                            tracing::debug!("harness session ended");
                            return;
                        }
                    }
                };
                spawn(forward.instrument(self.span.clone()));
            }
        }
    }
}

impl Role for SpecialistRole {
    type M = Specialist;
    type Local = SpecialistLocal;

    fn span(&self) -> Span {
        self.span.clone()
    }

    fn before(&self, input: &SpecialistInput, local: &mut SpecialistLocal) {
        if let SpecialistInput::Harness(HarnessEvent::Usage(report)) = input {
            local.usage.record(report);
            let tokens = local.usage.total();
            if local.usage_sent != Some(tokens) {
                local.usage_sent = Some(tokens);
                self.node.emit(RuntimeEvent::Usage {
                    attempt: self.attempt,
                    tokens,
                    spent_micros: crate::specialist::spend_micros(
                        &tokens,
                        self.node.config.specialist.micros_per_mtok,
                    ),
                });
            }
        }
    }

    async fn execute(
        &self,
        me: &HostRef<Specialist>,
        local: &mut SpecialistLocal,
        effects: Vec<SpecialistEffect>,
    ) -> Flow {
        let mut flow = Flow::Continue;
        for effect in effects {
            match effect {
                SpecialistEffect::LoadContext(request) => {
                    let store = Arc::clone(&self.node.store);
                    let config = self.node.config.specialist.context;
                    let run = self.attempt.run;
                    let me = me.clone();
                    let span = self.span.clone();
                    let load = async move {
                        let rows = tokio::task::spawn_blocking(move || {
                            span.in_scope(|| {
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
                    self.start_harness(me, local, key, *spec).await;
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
                SpecialistEffect::Reply(to, reply) => {
                    match &reply {
                        SpecialistReply::Finished(result) => {
                            local.result = Some(result.clone());
                            if let Ok(report) = &result.outcome
                                && let Some(live) =
                                    lock(&self.node.specialists).get_mut(&self.attempt)
                            {
                                live.report = Some(report.clone());
                            }
                            if self.node.pausing.load(Ordering::Acquire) {
                                // Held back during a pause: not acknowledged, so recovery re-runs
                                // the attempt with a resume preamble. The actor ends here.
                                flow = Flow::Stop("paused".into());
                                continue;
                            }
                        }
                        SpecialistReply::Logs { rows } => {
                            if let Some((_, row)) = rows.last() {
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
                        SpecialistReply::Delegate { .. } => {}
                    }
                    self.node.route(Envelope::Coordinator {
                        run: to.run(),
                        msg: CoordinatorMsg::Specialist {
                            from: to.attempt(),
                            reply,
                        },
                    });
                }
                SpecialistEffect::SetTimer { timer, at } => {
                    let me = me.clone();
                    Node::timer(at, move || Self::feed(&me, SpecialistInput::Timer(timer)));
                }
                SpecialistEffect::Emit(event) => self.node.lifecycle(event),
                SpecialistEffect::Exit => flow = Flow::Stop(EXIT_REASON.into()),
            }
        }
        flow
    }

    fn stopped(&self, me: &HostRef<Specialist>, local: &mut SpecialistLocal) {
        if let Some(c) = local.cancel.take() {
            c.cancel();
        }
        let mut live = lock(&self.node.specialists);
        if live
            .get(&self.attempt)
            .is_some_and(|s| s.actor.get_id() == me.get_id())
        {
            live.remove(&self.attempt);
        }
    }
}
