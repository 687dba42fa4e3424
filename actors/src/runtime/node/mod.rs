//! The coordinator node: the shared routing table, the effect executors, and the hosts of the
//! machines (coordinator per run, one supervisor, one checkpoint writer, one specialist per attempt).
//!
//! Files: `routing.rs` (delivering envelopes, host stages, lifecycle events), `store_writer.rs`
//! (the thread that hosts the checkpoint writer and commits), `timers.rs` (the machines' timers),
//! one file per actor role (`coordinator_role.rs`, `supervisor_role.rs`, `specialist_role.rs`).
//!
//! Rules these files keep:
//! - Only the store writer thread writes the store, and only through [`crate::host::store::commit`]
//!   of a batch its checkpoint writer machine emitted. Specialists read their context rows; nothing else touches redb.
//! - Specialists never address anyone but their coordinator: their replies are routed by the
//!   [`crate::ReplyTo`] the machine holds.
//! - A specialist attempt is a task of its own, not an actor ([`crate::runtime::task_host`]): its
//!   end reaches the supervisor machine through [`Node::specialist_ended`].
//! - Every spawned task ends by itself: timers fire once (from the node's one timer task, which
//!   ends with the node, `timers.rs`), a session's events are read by its specialist's own task,
//!   commits end with their transaction.

mod coordinator_role;
mod routing;
pub(crate) mod specialist_role;
mod store_writer;
mod supervisor_role;
mod timers;

pub(crate) use coordinator_role::CoordinatorRole;
pub(crate) use store_writer::{WriterInput, store_writer};
pub(crate) use supervisor_role::SupervisorRole;
pub(crate) use timers::Timers;

use crate::coordinator::Coordinator;
use crate::effect::{Effect, Envelope, TimerKey};
use crate::host::HostError;
use crate::ids::AttemptId;
use crate::machine::Millis;
use crate::message::RecoveredRun;
use crate::message::{
    CheckpointInput, CoordinatorInput, CoordinatorMsg, SpecialistMsg, SupervisorInput,
};
use crate::report::SubagentReport;
use crate::runtime::clock::{OsEntropy, wall_clock_ms};
use crate::runtime::machine_actor::MachineRef;
use crate::runtime::pause::Halt;
use crate::runtime::task_host::SpecialistInbox;
use crate::runtime::{
    HarnessSet, NodeStore, PauseReason, RunOutcome, RuntimeConfig, RuntimeEvent, StoreReadError,
};
use crate::supervisor::Supervisor;
use keel_harness::CancelToken;
use keel_store::{RunId, Store};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tracing::Span;

/// The exit reason of a specialist that ended normally (its machine emitted `Exit`); any other end is
/// reported to the supervisor machine as `SpecialistDown`.
pub(crate) const EXIT_REASON: &str = "exit";

/// A poisoned lock only means another task panicked while holding plain data: keep going.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A run's coordinator as the routing table holds it.
#[derive(Clone)]
pub(crate) struct HostedRun {
    pub(crate) coordinator: MachineRef<Coordinator>,
    /// Which hosting of the run this is: every coordinator a node starts takes a new one, so the
    /// end of a run's earlier coordinator (still stopping when its run was reopened) wakes only the
    /// waiters of that hosting, never those of the reopened run.
    pub(crate) generation: u64,
}

/// Someone waiting for a run's end under one hosting of it.
pub(crate) struct Waiter {
    pub(crate) generation: u64,
    pub(crate) tx: oneshot::Sender<RunEnd>,
}

/// How a run hosted here ended, as its waiters hear it.
#[derive(Debug)]
pub(crate) enum RunEnd {
    /// It reached a terminal state (durable).
    Finished(RunOutcome),
    /// The node paused it by itself.
    Paused(PauseReason),
}

/// A live specialist as the routing table knows it.
pub(crate) struct LiveSpecialist {
    /// The inbox of its task (see [`crate::runtime::task_host`]).
    pub(crate) inbox: SpecialistInbox,
    pub(crate) step: String,
    /// Its running session's cancel switch, so a killed specialist's session is stopped too (a kill
    /// skips the role's own cleanup).
    pub(crate) cancel: Option<CancelToken>,
    /// The report of its finished session, waiting for the coordinator's acknowledgement: observers
    /// get it when the `Ack` is routed, so it reaches the event channel before the run's `Finished`
    /// (the coordinator routes the `Ack` before it can finish the run).
    pub(crate) report: Option<SubagentReport>,
}

/// Everything the node's actors share.
pub(crate) struct Node {
    pub(crate) store: NodeStore,
    pub(crate) harnesses: HarnessSet,
    pub(crate) config: RuntimeConfig,
    pub(crate) coordinators: Mutex<BTreeMap<RunId, HostedRun>>,
    /// The next hosting generation (see [`HostedRun::generation`]).
    pub(crate) next_generation: AtomicU64,
    /// Makes the next coordinator spawn fail (a fault only tests can set).
    #[cfg(test)]
    pub(crate) fail_coordinator_spawns: AtomicBool,
    /// The span of each hosted run, the parent of its tasks' spans (removed with the coordinator).
    pub(crate) run_spans: Mutex<BTreeMap<RunId, Span>>,
    pub(crate) specialists: Mutex<BTreeMap<AttemptId, LiveSpecialist>>,
    pub(crate) supervisor: OnceLock<MachineRef<Supervisor>>,
    /// The store writer thread's queue: the inputs of the checkpoint writer it hosts
    /// ([`store_writer`]), and at shutdown its end.
    pub(crate) checkpoint: OnceLock<std::sync::mpsc::Sender<WriterInput>>,
    pub(crate) waiters: Mutex<BTreeMap<RunId, Vec<Waiter>>>,
    /// Tool calls waiting for a human's approval, by escalation ([`crate::runtime::ApprovalDesk`]).
    pub(crate) approvals: Mutex<BTreeMap<keel_store::EscalationId, oneshot::Sender<String>>>,
    /// Waiters of the host's own stages ([`crate::StageOwner::Host`]), by the host's ticket.
    pub(crate) host_acks: Mutex<BTreeMap<u64, oneshot::Sender<Result<(), String>>>>,
    pub(crate) next_host_ticket: AtomicU64,
    pub(crate) events: Option<mpsc::Sender<RuntimeEvent>>,
    pub(crate) events_dropped: AtomicU64,
    /// Set by a graceful shutdown: no new specialists, results are held back (not acknowledged).
    pub(crate) pausing: AtomicBool,
    /// Set once the pause marks are being written: coordinators get nothing more, and nothing a
    /// coordinator stages from then on is written ([`Node::freeze`]).
    pub(crate) frozen: AtomicBool,
    /// Held while `frozen` is set, and while a coordinator's stage is checked against it and sent,
    /// so a stage reaches the checkpoint actor before the pause marks or not at all.
    pub(crate) freeze_gate: Mutex<()>,
    /// Set by [`crate::runtime::Runtime::pause`]: the host is shutting the node down for good.
    pub(crate) shut: AtomicBool,
    /// Set by [`crate::runtime::Runtime::shutdown`] under the `specialists` lock before it lists
    /// them: no specialist is hosted from then on (one hosted later would outlive the kill).
    pub(crate) closed: AtomicBool,
    /// A pause the node started by itself (a full disk), see [`Node::halt`].
    pub(crate) halt: Mutex<Halt>,
    /// The tokio runtime the node was started on, for work started off it (the store writer's
    /// pause on a full disk).
    pub(crate) tokio: tokio::runtime::Handle,
    pub(crate) commits_in_flight: AtomicU64,
    /// Group commits handed to the store writer (failed ones included), for `Runtime::commits`.
    pub(crate) commits_total: AtomicU64,
    pub(crate) entropy: Mutex<OsEntropy>,
    pub(crate) started_keys: Mutex<crate::host::StartedKeys>,
    pub(crate) sessions_started: AtomicU64,
    /// The cluster layer that hosts specialists on other nodes, once attached.
    pub(crate) remote: OnceLock<crate::runtime::remote::Remote>,
    /// The machines' timers (see [`Timers`]).
    pub(crate) timers: Timers,
}

impl Node {
    /// Read the store on tokio's blocking pool (a redb read may wait on the disk). A read task that
    /// panicked is a failed read ([`StoreReadError::Task`]), never mistaken for a failed write.
    ///
    /// The store is opened again first if a write failed on it; a read that finds the handle
    /// refused (a write failed meanwhile) marks it for the same.
    pub(crate) async fn read<T, F>(self: &Arc<Self>, read: F) -> Result<T, StoreReadError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T, HostError> + Send + 'static,
    {
        let node = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let result = read(&*node.store.get()?);
            if let Err(HostError::Read(keel_store::ReadError::NeedsReopen)) = &result {
                node.store.poison();
            }
            result
        })
        .await
        .map_err(|e| StoreReadError::Task(e.to_string()))?
        .map_err(StoreReadError::from)
    }

    /// The rows of `run` a coordinator rebuilds from, read on the blocking pool.
    pub(crate) async fn recover_run(
        self: &Arc<Self>,
        run: RunId,
    ) -> Result<RecoveredRun, StoreReadError> {
        self.read(move |store| crate::host::store::recover_run(store, run))
            .await
    }

    pub(crate) fn fork_rng(&self) -> OsEntropy {
        lock(&self.entropy).fork()
    }

    /// Whether anyone listens to the runtime's events: an event that must be built (copies of a
    /// report, of names) is built only then.
    pub(crate) fn observed(&self) -> bool {
        self.events.as_ref().is_some_and(|tx| !tx.is_closed())
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
    pub(crate) fn run_span(&self, run: RunId) -> Span {
        lock(&self.run_spans)
            .get(&run)
            .cloned()
            .unwrap_or_else(Span::none)
    }

    pub(crate) fn coordinator(&self, run: RunId) -> Option<MachineRef<Coordinator>> {
        lock(&self.coordinators)
            .get(&run)
            .map(|h| h.coordinator.clone())
    }

    /// The run's coordinator and its hosting generation, if this node hosts it.
    pub(crate) fn hosted(&self, run: RunId) -> Option<HostedRun> {
        lock(&self.coordinators).get(&run).cloned()
    }

    /// Whether this node hosts `run` under `generation` still.
    pub(crate) fn hosts(&self, run: RunId, generation: u64) -> bool {
        lock(&self.coordinators)
            .get(&run)
            .is_some_and(|h| h.generation == generation)
    }

    /// Wait for the end of `run`'s hosting `generation`.
    pub(crate) fn wait_for(&self, run: RunId, generation: u64) -> oneshot::Receiver<RunEnd> {
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters)
            .entry(run)
            .or_default()
            .push(Waiter { generation, tx });
        rx
    }

    /// Wait (at most `wait`) until `run`'s hosting `generation` is gone: its coordinator stops in
    /// the step that makes its run's end durable, so this is short.
    pub(crate) async fn wait_gone(&self, run: RunId, generation: u64, wait: Duration) {
        let deadline = tokio::time::Instant::now() + wait;
        while self.hosts(run, generation) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Fire `deliver` at host time `at` (a host timer of its own: a grace period, a specialist's
    /// timer on its task; a machine's goes through [`Node::set_timer`]).
    pub(crate) fn timer(&self, at: Millis, deliver: impl FnOnce() + Send + 'static) {
        self.timers.set(at, None, deliver);
    }

    /// Fire the machine timer `key` at host time `at`: its input goes to its machine then.
    pub(crate) fn set_timer(self: &Arc<Self>, key: TimerKey, at: Millis) {
        let node = Arc::clone(self);
        self.timers.set(at, Some(key), move || match key {
            TimerKey::Coordinator(run, t) => {
                if node.frozen.load(Ordering::Acquire) {
                    return; // a frozen coordinator gets nothing more
                }
                if let Some(c) = node.coordinator(run) {
                    let _ = c.send_message(crate::runtime::Deliver(CoordinatorInput::Timer(t)));
                }
            }
            TimerKey::Supervisor(t) => {
                if let Some(s) = node.supervisor.get() {
                    let _ = s.send_message(crate::runtime::Deliver(SupervisorInput::Timer(t)));
                }
            }
            TimerKey::Checkpoint(t) => {
                node.to_checkpoint(CheckpointInput::Timer(t));
            }
        });
    }

    /// Execute the effects of a coordinator-node machine (coordinator, supervisor);
    /// `hosting` is the generation of the coordinator that emitted them (`None` for the others).
    ///
    /// One step's messages to one machine travel as one mailbox message: its messages to the
    /// supervisor as one [`SupervisorInput::Msgs`] (a dispatch's admissions), sent after its other
    /// effects, and its consecutive messages to one run's coordinator (no other effect between
    /// them) as one [`CoordinatorInput::Msgs`] (the supervisor's answers to those admissions, which
    /// it emits ahead of its other effects; a checkpoint writer's failures of one message's
    /// stages).
    pub(crate) async fn execute_node(self: &Arc<Self>, effects: Vec<Effect>, hosting: Option<u64>) {
        let mut to_supervisor = Vec::new();
        let mut to_coordinator = ToCoordinator::default();
        for effect in effects {
            let Some(effect) = to_coordinator.gather(self, effect) else {
                continue;
            };
            match effect {
                Effect::Send(Envelope::Supervisor(msg)) => to_supervisor.push(msg),
                Effect::Send(envelope) => self.route(envelope),
                // Only the checkpoint writer commits, and it runs on the store writer thread
                // (`execute_checkpoint`).
                Effect::Persist(batch) => {
                    tracing::error!(commit = ?batch.id, "a commit asked for outside the checkpoint writer; dropped");
                }
                // Boxed: the spawn's future is large and most effects never await it, so inline it
                // would make every coordinator and checkpoint step's future (moved on each poll
                // set-up) as large as a spawn.
                Effect::SpawnSpecialist(start) => Box::pin(self.spawn_specialist(*start)).await,
                Effect::StopSpecialist { attempt, reason } => {
                    self.route(Envelope::Specialist {
                        attempt,
                        msg: SpecialistMsg::Cancel { reason },
                    });
                    // A cooperative cancel first; an attempt still alive after the grace period is
                    // killed (its session's process tree goes with the dropped session).
                    let node = Arc::clone(self);
                    let at = wall_clock_ms().saturating_add(self.config.stop_grace_ms);
                    self.timer(at, move || {
                        if let Some(live) = lock(&node.specialists).get(&attempt) {
                            live.inbox.kill();
                        }
                    });
                }
                Effect::SetTimer { key, at } => self.set_timer(key, at),
                Effect::CancelTimer { key } => self.timers.cancel(key),
                Effect::Emit(event) => self.lifecycle(event, hosting),
            }
        }
        to_coordinator.flush(self);
        if let Some(input) = SupervisorInput::batch(to_supervisor)
            && let Some(s) = self.supervisor.get()
        {
            let _ = s.send_message(crate::runtime::Deliver(input));
        }
    }
}

/// One machine step's consecutive messages to one run's coordinator, delivered as one input
/// ([`Node::route_to_coordinator`]); a message to another run, or any other effect in between,
/// sends what was gathered first.
#[derive(Default)]
pub(crate) struct ToCoordinator(Option<(RunId, Vec<CoordinatorMsg>)>);

impl ToCoordinator {
    /// Gather `effect` if it is a message to a coordinator; else send what was gathered (only
    /// consecutive messages to one coordinator travel together) and hand `effect` back.
    pub(crate) fn gather(&mut self, node: &Node, effect: Effect) -> Option<Effect> {
        if let Effect::Send(Envelope::Coordinator { run, msg }) = effect {
            self.push(node, run, msg);
            return None;
        }
        self.flush(node);
        Some(effect)
    }

    /// Gather `msg` for `run`'s coordinator.
    fn push(&mut self, node: &Node, run: RunId, msg: CoordinatorMsg) {
        match &mut self.0 {
            Some((to, msgs)) if *to == run => msgs.push(msg),
            other => {
                if let Some((to, msgs)) = other.replace((run, vec![msg])) {
                    node.route_to_coordinator(to, msgs);
                }
            }
        }
    }

    /// Send what was gathered.
    pub(crate) fn flush(&mut self, node: &Node) {
        if let Some((run, msgs)) = self.0.take() {
            node.route_to_coordinator(run, msgs);
        }
    }
}

/// Spawn a task of the runtime (the one module allowed to). The future is boxed first: a hosted
/// machine's task holds its whole machine (kilobytes), and tokio moves a task's stage by value as
/// it starts and ends; boxed, those moves are a pointer's.
#[allow(clippy::disallowed_methods)] // The runtime executes effects concurrently; machines never spawn.
pub(crate) fn spawn<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(Box::pin(future));
}
