//! A worker node's endpoint: stateless (it never opens the store), it hosts the specialists the
//! coordinator node places on it, advertises its harnesses and capacity by heartbeat (which renews
//! its lease), and sends everything its specialists produce back as messages.
//!
//! Spawns are deduplicated per incarnation (one attempt, one specialist) and refused when addressed
//! to another incarnation or past the capacity. A specialist's results are resent by its machine
//! until the coordinator acknowledges them; its log rows and usage are sent once (a lost one is lost,
//! as in one process: the resume preamble needs only the recent rows).

use crate::name::{COORDINATOR_GROUP, NodeName, WORKERS_GROUP, worker_group};
use crate::remote_policy::RemotePolicy;
use crate::wire::{self, ClusterMsg, Envelope, PolicyTerms, ToCoordinator, ToWorker, WorkerStatus};
use crate::worker_role::WorkerSpecialistRole;
use keel_actors::host::StartedKeys;
use keel_actors::runtime::{
    HarnessSet, HostedEnd, MachineActorState, OsEntropy, SpecialistInbox, host_on_task,
};
use keel_actors::{AttemptId, Specialist, SpecialistConfig, SpecialistInput, SpecialistStart};
use keel_harness::HarnessKind;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The exit reason of a specialist whose machine ended it (as in the runtime).
pub(crate) const EXIT_REASON: &str = "exit";

/// Why a spawn that reaches a stopping worker is refused.
const STOPPING: &str = "this worker is stopping";

/// Most attempts one incarnation remembers having hosted (to refuse duplicate spawns).
const HOSTED_REMEMBERED_MAX: usize = 100_000;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a worker node is configured with.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Its name.
    pub name: NodeName,
    /// Most specialists it hosts at once.
    pub capacity: u32,
    /// The harnesses it can run sessions on (with their accounts).
    pub harnesses: HarnessSet,
    /// Its specialists' limits and working directory (on this machine).
    pub specialist: SpecialistConfig,
    /// How often it sends a heartbeat (keep it well under the coordinator's lease).
    pub heartbeat: Duration,
    /// How long a specialist waits for the rows of its preamble from the coordinator node.
    pub context_wait: Duration,
    /// Where the hosted sessions' policy questions go to the coordinator node (the sessions'
    /// guards and bridge hold it too): this endpoint tells it each spawn's policy terms, each
    /// answer, and each attempt's end.
    pub policy: Arc<RemotePolicy>,
}

pub(crate) struct WorkerShared {
    pub(crate) config: WorkerConfig,
    pub(crate) incarnation: u64,
    pub(crate) hosted: Mutex<BTreeMap<AttemptId, SpecialistInbox>>,
    /// Set by [`WorkerEndpoint::stop`] under the `hosted` lock before it lists what to kill: no
    /// spawn is hosted from then on (one hosted later would run a session on a worker that left,
    /// and keep its heartbeat going).
    stopping: AtomicBool,
    hosted_ever: Mutex<BTreeSet<AttemptId>>,
    pub(crate) started_keys: Mutex<StartedKeys>,
    /// Attempts waiting for their preamble's rows: whoever removes one first (the rows, or the
    /// timeout) answers it.
    pub(crate) context_waiting: Mutex<BTreeSet<AttemptId>>,
    entropy: Mutex<OsEntropy>,
}

impl WorkerShared {
    /// A hosted specialist's task ended (`me` is its address): it leaves the table, and the
    /// coordinator node hears how (its supervisor decides what follows).
    fn specialist_ended(&self, attempt: AttemptId, me: &SpecialistInbox, end: HostedEnd) {
        {
            let mut hosted = lock(&self.hosted);
            if hosted.get(&attempt).is_some_and(|h| h.same(me)) {
                hosted.remove(&attempt);
            }
        }
        lock(&self.context_waiting).remove(&attempt);
        self.config.policy.ended(attempt);
        let reason = end.reason();
        self.send(&ToCoordinator::Exited {
            attempt,
            normal: reason == EXIT_REASON,
            panicked: end.panicked(),
            reason,
        });
    }

    /// Send a message to the coordinator node (dropped, with a debug line, while it is unreachable:
    /// results are resent by their machine until acknowledged).
    pub(crate) fn send(&self, body: &ToCoordinator) {
        wire::cast_to_group(COORDINATOR_GROUP, &self.config.name, body);
    }

    fn status(&self) -> WorkerStatus {
        let harnesses = HarnessKind::ALL
            .iter()
            .copied()
            .filter(|k| self.config.harnesses.get(*k).is_some())
            .collect();
        WorkerStatus {
            incarnation: self.incarnation,
            harnesses,
            capacity: self.config.capacity,
            hosting: lock(&self.hosted).keys().copied().collect(),
        }
    }
}

/// A worker node's cluster endpoint: an actor in [`WORKERS_GROUP`] and in its own
/// [`worker_group`], the specialists it hosts (each on a task of its own), and its heartbeat.
pub struct WorkerEndpoint {
    shared: Arc<WorkerShared>,
    actor: ActorRef<ClusterMsg>,
}

impl std::fmt::Debug for WorkerEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerEndpoint")
            .field("name", &self.shared.config.name)
            .field("incarnation", &self.shared.incarnation)
            .finish_non_exhaustive()
    }
}

/// Why a worker endpoint did not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// No OS entropy for the specialists' streams.
    #[error("{0}")]
    Entropy(#[from] keel_actors::runtime::EntropyError),
    /// The endpoint actor did not start.
    #[error("the worker endpoint did not start: {0}")]
    Spawn(#[from] ractor::SpawnErr),
}

impl WorkerEndpoint {
    /// Start hosting specialists and sending heartbeats.
    ///
    /// # Errors
    /// [`WorkerError`].
    pub async fn start(config: WorkerConfig) -> Result<Self, WorkerError> {
        let mut entropy = OsEntropy::from_os()?;
        let incarnation = {
            use keel_actors::Entropy;
            entropy.next_u64()
        };
        let heartbeat = config.heartbeat;
        let shared = Arc::new(WorkerShared {
            config,
            incarnation,
            hosted: Mutex::new(BTreeMap::new()),
            stopping: AtomicBool::new(false),
            hosted_ever: Mutex::new(BTreeSet::new()),
            started_keys: Mutex::new(StartedKeys::default()),
            context_waiting: Mutex::new(BTreeSet::new()),
            entropy: Mutex::new(entropy),
        });
        let (actor, _) = Actor::spawn(None, Endpoint(Arc::clone(&shared)), ()).await?;
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            loop {
                let Some(shared) = weak.upgrade() else { return };
                shared.send(&ToCoordinator::Heartbeat(shared.status()));
                drop(shared);
                tokio::time::sleep(heartbeat).await;
            }
        });
        Ok(Self { shared, actor })
    }

    /// The specialists hosted right now.
    pub fn hosting(&self) -> usize {
        lock(&self.shared.hosted).len()
    }

    /// Stop: kill every hosted specialist (their sessions are cancelled) and leave the groups.
    pub fn stop(&self) {
        let hosted: Vec<_> = {
            let hosted = lock(&self.shared.hosted);
            // Under the lock a spawn checks it under: a specialist is either listed here (and
            // killed) or never hosted.
            self.shared.stopping.store(true, Ordering::Release);
            hosted.values().cloned().collect()
        };
        for h in hosted {
            h.kill();
        }
        self.actor.stop(Some("node shutdown".into()));
    }
}

struct Endpoint(Arc<WorkerShared>);

impl Actor for Endpoint {
    type Msg = ClusterMsg;
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<ClusterMsg>,
        _: (),
    ) -> Result<(), ActorProcessingErr> {
        ractor::pg::join(WORKERS_GROUP.to_string(), vec![myself.get_cell()]);
        ractor::pg::join(worker_group(&self.0.config.name), vec![myself.get_cell()]);
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ClusterMsg>,
        message: ClusterMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        if let Some(Envelope { body, .. }) = wire::open::<ToWorker>(message) {
            self.receive(body).await;
        }
        Ok(())
    }
}

impl Endpoint {
    async fn receive(&self, body: ToWorker) {
        match body {
            ToWorker::Spawn {
                incarnation,
                start,
                policy,
            } => {
                // With its pair on the coordinator ("specialist placed on a worker"), the one-way
                // time of a spawn at debug level (docs/PERFORMANCE.md, cluster).
                tracing::debug!(attempt = %start.attempt, "spawn received");
                self.spawn(incarnation, *start, policy);
            }
            ToWorker::PolicyAnswer {
                attempt,
                question,
                answer,
            } => self.0.config.policy.answered(attempt, question, answer),
            ToWorker::Specialist { attempt, msg } => {
                let inbox = lock(&self.0.hosted).get(&attempt).cloned();
                match inbox {
                    Some(inbox) => {
                        inbox.send(SpecialistInput::Msg(msg));
                    }
                    None => {
                        tracing::debug!(%attempt, "message for an attempt not hosted here, dropped")
                    }
                }
            }
            ToWorker::ContextRows { attempt, rows } => {
                if !lock(&self.0.context_waiting).remove(&attempt) {
                    return;
                }
                let inbox = lock(&self.0.hosted).get(&attempt).cloned();
                if let Some(inbox) = inbox {
                    inbox.send(SpecialistInput::ContextLoaded(rows));
                }
            }
        }
    }

    fn spawn(&self, incarnation: u64, start: SpecialistStart, policy: Option<PolicyTerms>) {
        let shared = &self.0;
        let attempt = start.attempt;
        let refuse = |reason: String| {
            tracing::warn!(%attempt, %reason, "spawn refused");
            shared.send(&ToCoordinator::SpawnRefused { attempt, reason });
        };
        if incarnation != shared.incarnation {
            return refuse(format!(
                "addressed to incarnation {incarnation:x}, this worker is {:x}",
                shared.incarnation
            ));
        }
        {
            let mut ever = lock(&shared.hosted_ever);
            if ever.contains(&attempt) {
                // A duplicate spawn: one attempt, one specialist; acknowledge again.
                drop(ever);
                shared.send(&ToCoordinator::Spawned { attempt });
                return;
            }
            if ever.len() >= HOSTED_REMEMBERED_MAX {
                drop(ever);
                return refuse(
                    "this worker has hosted as many attempts as it remembers; restart it".into(),
                );
            }
            if lock(&shared.hosted).len() >= shared.config.capacity as usize {
                drop(ever);
                return refuse(format!("at capacity ({})", shared.config.capacity));
            }
            ever.insert(attempt);
        }
        let role = WorkerSpecialistRole::new(Arc::clone(shared), &start);
        let mut config = shared.config.specialist.clone();
        // The session calls keel's tools on this worker's endpoint (a lead's `delegate` among them).
        config.session_tools = shared
            .config
            .harnesses
            .session_tool_path(start.assignment.harness);
        let machine = Specialist::new(start, config);
        let rng = lock(&shared.entropy).fork();
        let state = MachineActorState::new(machine, rng, Default::default());
        // Before the session can start: whether the coordinator's policy gates it.
        shared.config.policy.hosting(attempt, policy);
        {
            let mut hosted = lock(&shared.hosted);
            if shared.stopping.load(Ordering::Acquire) {
                // `stop` has listed what it kills: not hosted, and forgotten, as if never sent.
                drop(hosted);
                lock(&shared.hosted_ever).remove(&attempt);
                shared.config.policy.ended(attempt);
                return refuse(STOPPING.into());
            }
            let ended = Arc::clone(shared);
            let inbox = host_on_task(role, state, move |me, end| {
                ended.specialist_ended(attempt, me, end);
            });
            // `Begin` queued before the table lets a routed message reach it.
            inbox.send(SpecialistInput::Begin);
            hosted.insert(attempt, inbox);
        }
        tracing::info!(%attempt, "specialist started");
        shared.send(&ToCoordinator::Spawned { attempt });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

    use super::*;
    use keel_store::{RunId, TaskId};

    /// A worker in this process with no harness (a session it starts fails at once).
    async fn worker() -> WorkerEndpoint {
        let name = NodeName::new("stopping-worker").unwrap();
        WorkerEndpoint::start(WorkerConfig {
            name: name.clone(),
            capacity: 4,
            harnesses: HarnessSet::new(),
            specialist: SpecialistConfig::default(),
            heartbeat: Duration::from_secs(60),
            context_wait: Duration::from_secs(1),
            policy: Arc::new(RemotePolicy::new(name)),
        })
        .await
        .unwrap()
    }

    fn start(n: u32) -> SpecialistStart {
        let attempt = AttemptId {
            run: RunId(7),
            task: TaskId(11),
            attempt: n,
        };
        keel_actors::runtime::scripted::scripted_start(attempt, "say hello")
    }

    /// A spawn handled after `stop` listed the hosted specialists (it was in the endpoint's
    /// mailbox, or being handled) is refused: nothing runs on a worker that left.
    #[tokio::test]
    async fn a_spawn_after_stop_listed_the_hosted_is_refused() {
        let ep = worker().await;
        let endpoint = Endpoint(Arc::clone(&ep.shared));
        endpoint.spawn(ep.shared.incarnation, start(1), None);
        assert_eq!(ep.hosting(), 1, "hosted before the stop");
        ep.stop();
        endpoint.spawn(ep.shared.incarnation, start(2), None);
        let hosted: Vec<_> = lock(&ep.shared.hosted).keys().map(|a| a.attempt).collect();
        assert!(!hosted.contains(&2), "hosted after the stop: {hosted:?}");
        assert!(
            !lock(&ep.shared.hosted_ever).iter().any(|a| a.attempt == 2),
            "a refused spawn is not remembered as hosted"
        );
        // The one hosted before was killed by the stop; its end takes it out of the table.
        for _ in 0..500 {
            if ep.hosting() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(ep.hosting(), 0);
    }
}
