//! The coordinator node's endpoint: the runtime's [`RemoteHosts`] (specialists placed on workers by
//! capability and load) and the actor that receives what workers send.
//!
//! Everything a worker produces arrives here as a message and goes into the runtime through its
//! [`RemoteInbox`] as the input a local specialist would have produced: the coordinator machine makes
//! it durable through the checkpoint writer before it acknowledges it, and the specialist on the
//! worker resends its result until that `Ack` (the machines' protocol, unchanged). A worker's lease,
//! spawn acknowledgements and stale attempts are [`Membership`]'s rules; this file carries them out.

use crate::membership::{Action, Membership, MembershipConfig};
use crate::name::{COORDINATOR_GROUP, NodeName, worker_group};
use crate::wire::{self, ClusterMsg, Envelope, ToCoordinator, ToWorker};
use keel_actors::runtime::{PolicyHost, RemoteHosts, RemoteInbox, Runtime, wall_clock_ms};
use keel_actors::{AttemptId, SpecialistMsg, SpecialistStart};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

/// How often leases, spawn acknowledgements and waiting attempts are checked.
pub const TICK: Duration = Duration::from_millis(200);

/// Most dispatch latencies kept for [`DispatchStats`].
const LATENCIES_MAX: usize = 100_000;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Remote dispatch latency: from the supervisor's decision (the spawn handed to the cluster layer) to
/// the worker's acknowledgement that the specialist's actor runs (one round trip over the network).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DispatchStats {
    /// Spawns acknowledged.
    pub count: usize,
    /// Median, in microseconds.
    pub median_us: u64,
    /// 99th percentile, in microseconds.
    pub p99_us: u64,
    /// Largest, in microseconds.
    pub max_us: u64,
}

struct Shared {
    name: NodeName,
    membership: Mutex<Membership>,
    inbox: OnceLock<RemoteInbox>,
    /// When each unacknowledged spawn was handed over (a monotonic clock, for the latency only).
    dispatched: Mutex<BTreeMap<AttemptId, Instant>>,
    latencies_us: Mutex<Vec<u64>>,
    /// Told what the endpoint measures as it happens (the node's `/metrics`).
    observer: OnceLock<Arc<dyn EndpointObserver>>,
    frames_received: AtomicU64,
    frames_sent: AtomicU64,
    /// The policy of keel.toml, when it has one: it decides the tool calls of sessions on workers.
    policy: OnceLock<PolicyHost>,
}

/// What a coordinator endpoint tells as it works (a node exports it in `/metrics`; see
/// [`CoordinatorEndpoint::observe`]).
pub trait EndpointObserver: Send + Sync {
    /// A worker acknowledged a spawn, `latency` after the supervisor's decision handed it over.
    fn dispatched(&self, latency: Duration);
    /// A frame arrived from another node (whether or not it decoded).
    fn frame_received(&self);
    /// A frame was handed to the transport for another node.
    fn frame_sent(&self);
}

/// Frames between this endpoint and other nodes so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameCounts {
    /// Frames that arrived.
    pub received: u64,
    /// Frames handed to the transport.
    pub sent: u64,
}

impl Shared {
    fn send(&self, worker: &NodeName, body: &ToWorker) {
        wire::cast_to_group(&worker_group(worker), &self.name, body);
        self.frames_sent.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = self.observer.get() {
            o.frame_sent();
        }
    }

    /// Carry out what the membership decided (never with its lock held).
    fn act(&self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Spawn {
                    worker,
                    incarnation,
                    start,
                } => {
                    tracing::info!(attempt = %start.attempt, %worker, "specialist placed on a worker");
                    let policy = self.policy.get().map(crate::remote_policy::terms_of);
                    self.send(
                        &worker,
                        &ToWorker::Spawn {
                            incarnation,
                            start,
                            policy,
                        },
                    );
                }
                Action::Down {
                    attempt,
                    reason,
                    panicked,
                } => {
                    lock(&self.dispatched).remove(&attempt);
                    tracing::warn!(%attempt, %reason, panicked, "remote attempt down");
                    if let Some(inbox) = self.inbox.get() {
                        inbox.down(attempt, reason, panicked);
                    }
                }
                Action::Cancel { worker, attempt } => {
                    tracing::info!(%attempt, %worker, "cancelling an attempt the coordinator does not expect on that worker");
                    self.send(
                        &worker,
                        &ToWorker::Specialist {
                            attempt,
                            msg: SpecialistMsg::Cancel {
                                reason: "the coordinator no longer expects this attempt here"
                                    .into(),
                            },
                        },
                    );
                }
                Action::Joined {
                    worker,
                    harnesses,
                    capacity,
                } => {
                    let harnesses: Vec<&str> = harnesses.iter().map(|h| h.as_str()).collect();
                    tracing::info!(%worker, ?harnesses, capacity, "worker joined");
                }
                Action::Lost { worker, attempts } => {
                    tracing::warn!(%worker, attempts, "worker lost: its lease expired");
                }
            }
        }
    }

    fn membership(&self, f: impl FnOnce(&mut Membership, &mut Vec<Action>)) {
        let mut out = Vec::new();
        f(&mut lock(&self.membership), &mut out);
        self.act(out);
    }
}

/// The runtime's remote hosts: the membership's placement.
struct Hosts(Arc<Shared>);

impl RemoteHosts for Hosts {
    fn place(&self, start: SpecialistStart) -> Result<(), Box<SpecialistStart>> {
        lock(&self.0.dispatched).insert(start.attempt, Instant::now());
        self.0
            .membership(|m, out| m.place(start, wall_clock_ms(), out));
        Ok(())
    }

    fn deliver(&self, attempt: AttemptId, msg: SpecialistMsg) -> Result<(), SpecialistMsg> {
        let worker = lock(&self.0.membership).worker_of(attempt).cloned();
        match worker {
            Some(worker) => {
                self.0.send(&worker, &ToWorker::Specialist { attempt, msg });
                Ok(())
            }
            None => {
                if matches!(msg, SpecialistMsg::Cancel { .. })
                    && lock(&self.0.membership).withdraw(attempt)
                {
                    // Stopped while waiting for a worker: the supervisor settled it already.
                    lock(&self.0.dispatched).remove(&attempt);
                    return Ok(());
                }
                Err(msg)
            }
        }
    }
}

/// The coordinator node's cluster endpoint: an actor in [`COORDINATOR_GROUP`] that receives workers'
/// frames, plus the timer that checks leases.
pub struct CoordinatorEndpoint {
    shared: Arc<Shared>,
    actor: ActorRef<ClusterMsg>,
}

impl std::fmt::Debug for CoordinatorEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorEndpoint")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

impl CoordinatorEndpoint {
    /// Attach to `runtime` as its remote hosts and start receiving workers' frames.
    ///
    /// # Errors
    /// When the endpoint's actor cannot start.
    pub async fn start(
        name: NodeName,
        runtime: &Runtime,
        config: MembershipConfig,
    ) -> Result<Self, ractor::SpawnErr> {
        let shared = Arc::new(Shared {
            name,
            membership: Mutex::new(Membership::new(config)),
            inbox: OnceLock::new(),
            dispatched: Mutex::new(BTreeMap::new()),
            latencies_us: Mutex::new(Vec::new()),
            observer: OnceLock::new(),
            frames_received: AtomicU64::new(0),
            frames_sent: AtomicU64::new(0),
            policy: OnceLock::new(),
        });
        let inbox = runtime.attach_remote(Arc::new(Hosts(Arc::clone(&shared))));
        let _ = shared.inbox.set(inbox);
        let (actor, _) = Actor::spawn(None, Receiver(Arc::clone(&shared)), ()).await?;
        let weak = Arc::downgrade(&shared);
        tokio::spawn(tick(weak));
        Ok(Self { shared, actor })
    }

    /// Decide the tool calls of sessions hosted on workers with `host` (keel.toml's policy, attached
    /// to the runtime): spawns from now on carry its terms, so workers gate their sessions and ask
    /// here. Call it before any run is submitted or resumed. Only the first host is kept: returns
    /// false for a second.
    pub fn serve_policy(&self, host: PolicyHost) -> bool {
        self.shared.policy.set(host).is_ok()
    }

    /// The live workers' names.
    pub fn live_workers(&self) -> Vec<NodeName> {
        lock(&self.shared.membership)
            .live_workers()
            .cloned()
            .collect()
    }

    /// Have `observer` told every remote dispatch latency and frame from now on (a node exports
    /// them in `/metrics`). Only the first observer set is kept: returns false for a second.
    pub fn observe(&self, observer: Arc<dyn EndpointObserver>) -> bool {
        self.shared.observer.set(observer).is_ok()
    }

    /// Frames between this endpoint and other nodes so far.
    pub fn frame_counts(&self) -> FrameCounts {
        FrameCounts {
            received: self.shared.frames_received.load(Ordering::Relaxed),
            sent: self.shared.frames_sent.load(Ordering::Relaxed),
        }
    }

    /// Remote dispatch latency so far.
    pub fn dispatch_stats(&self) -> DispatchStats {
        let mut v = lock(&self.shared.latencies_us).clone();
        if v.is_empty() {
            return DispatchStats::default();
        }
        v.sort_unstable();
        let at = |q: usize| v[((v.len() - 1) * q) / 100];
        DispatchStats {
            count: v.len(),
            median_us: at(50),
            p99_us: at(99),
            max_us: v[v.len() - 1],
        }
    }

    /// Stop receiving.
    pub fn stop(&self) {
        self.actor.stop(Some("node shutdown".into()));
    }
}

async fn tick(shared: Weak<Shared>) {
    loop {
        tokio::time::sleep(TICK).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.membership(|m, out| m.tick(wall_clock_ms(), out));
    }
}

struct Receiver(Arc<Shared>);

impl Actor for Receiver {
    type Msg = ClusterMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<ClusterMsg>,
        _: (),
    ) -> Result<(), ActorProcessingErr> {
        ractor::pg::join(COORDINATOR_GROUP.to_string(), vec![myself.get_cell()]);
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ClusterMsg>,
        message: ClusterMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        self.0.frames_received.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = self.0.observer.get() {
            o.frame_received();
        }
        if let Some(envelope) = wire::open::<ToCoordinator>(message) {
            self.receive(envelope);
        }
        Ok(())
    }
}

impl Receiver {
    fn receive(&self, Envelope { from, body }: Envelope<ToCoordinator>) {
        let shared = &self.0;
        let inbox = shared.inbox.get();
        match body {
            ToCoordinator::Heartbeat(status) => {
                shared.membership(|m, out| m.heartbeat(&from, status, wall_clock_ms(), out));
            }
            ToCoordinator::Spawned { attempt } => {
                let acked = lock(&shared.membership).spawned(&from, attempt).is_some();
                if let Some(at) = lock(&shared.dispatched).remove(&attempt)
                    && acked
                {
                    let latency = at.elapsed();
                    if let Some(o) = shared.observer.get() {
                        o.dispatched(latency);
                    }
                    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                    let mut l = lock(&shared.latencies_us);
                    if l.len() < LATENCIES_MAX {
                        l.push(us);
                    }
                    tracing::debug!(%attempt, worker = %from, latency_us = us, "specialist started on a worker");
                }
            }
            ToCoordinator::SpawnRefused { attempt, reason } => {
                let mut out = vec![Action::Down {
                    attempt,
                    reason: format!("worker {from} refused the spawn: {reason}"),
                    panicked: false,
                }];
                if !lock(&shared.membership).forget(&from, attempt, wall_clock_ms(), &mut out) {
                    out.remove(0);
                }
                shared.act(out);
            }
            ToCoordinator::Reply {
                from: attempt,
                reply,
            } => {
                if let Some(inbox) = inbox {
                    inbox.reply(attempt, reply);
                }
            }
            ToCoordinator::LoadContext { attempt, request } => {
                let Some(inbox) = inbox.cloned() else {
                    return;
                };
                let shared = Arc::clone(shared);
                tokio::spawn(async move {
                    let rows = inbox.load_context(attempt.run, request).await;
                    shared.send(&from, &ToWorker::ContextRows { attempt, rows });
                });
            }
            ToCoordinator::Policy {
                attempt,
                question,
                ask,
            } => {
                let host = shared.policy.get().cloned();
                let placed_there = lock(&shared.membership).worker_of(attempt) == Some(&from);
                if !placed_there {
                    tracing::warn!(%attempt, worker = %from, "a policy question about an attempt not placed on that worker");
                }
                let shared = Arc::clone(shared);
                // A decision may wait for a human: never on this actor.
                tokio::spawn(async move {
                    let answer =
                        crate::remote_policy::answer(host, placed_there, attempt, ask).await;
                    shared.send(
                        &from,
                        &ToWorker::PolicyAnswer {
                            attempt,
                            question,
                            answer,
                        },
                    );
                });
            }
            ToCoordinator::Lifecycle(event) => {
                if let Some(inbox) = inbox {
                    inbox.lifecycle(event);
                }
            }
            ToCoordinator::Usage {
                attempt,
                tokens,
                spent_micros,
            } => {
                if let Some(inbox) = inbox {
                    inbox.usage(attempt, tokens, spent_micros);
                }
            }
            ToCoordinator::Exited {
                attempt,
                normal,
                panicked,
                reason,
            } => {
                let mut out = Vec::new();
                let was_placed =
                    lock(&shared.membership).forget(&from, attempt, wall_clock_ms(), &mut out);
                if was_placed && !normal {
                    out.insert(
                        0,
                        Action::Down {
                            attempt,
                            reason: format!("its actor on worker {from} ended: {reason}"),
                            panicked,
                        },
                    );
                }
                shared.act(out);
            }
        }
    }
}
