//! The ractor runtime: the machines of this crate hosted as ractor actors on tokio, with their effects
//! executed for real (DESIGN.md §3, §4). It is the real-IO twin of the simulator's world loop and the
//! only module of the crate that awaits, spawns, reads the wall clock or draws OS entropy.
//!
//! - One actor per machine: a coordinator per run, one supervisor, one checkpoint writer, one
//!   specialist per attempt (linked to the supervisor actor, whose supervision events become
//!   `SupervisorMsg::SpecialistDown` inputs: ractor has no restart strategies; the machine decides).
//! - `Persist` effects become one redb write transaction per group commit (`Durability::Immediate`),
//!   executed off the actor thread; only the checkpoint actor's effects write.
//! - `StartHarness` starts a session through keel-harness; its events stream back into the
//!   specialist's mailbox and its replies go to the coordinator as messages.
//! - Timers are tokio sleeps that deliver the machine's timer input.
//!
//! Embedding: build a [`HarnessSet`], open a [`keel_store::Store`], call [`Runtime::start`] inside
//! your tokio runtime, [`Runtime::submit`] briefs, and read [`RuntimeEvent`]s from the channel it
//! returns. `examples/embed.rs` shows it end to end.
//!
//! Bounds: runs in flight are capped by a semaphore ([`RuntimeConfig::runs_in_flight_max`],
//! [`Runtime::submit`] waits for a slot: backpressure at the edge); specialists by the supervisor
//! machine; a session's events by keel-harness's bounded channel; events to observers by a bounded
//! channel that drops (and counts) rather than stall a machine.

pub mod clock;
mod harnesses;
pub mod host;
mod node;
pub mod scripted;
pub mod spans;

pub use clock::{EntropyError, OsEntropy, wall_clock_ms};
pub use harnesses::{ATTEMPT_ENV, HarnessSet, RUN_ID_ENV, SUBTASK_ID_ENV};
pub use host::{Deliver, Flow, Host, HostRef, HostState, Role};
pub use spans::SPAN_TARGET;

use crate::checkpoint::{CheckpointConfig, CheckpointWriter};
use crate::coordinator::{Coordinator, CoordinatorConfig};
use crate::host::decide::{self, FollowUpRoute, Marks, Refusal};
use crate::ids::{AttemptId, mint_run_id, mint_task_id};
use crate::message::{
    CoordinatorInput, CoordinatorMsg, FOLLOW_UP_BYTES_MAX, FollowUpRequest, RecoveredRun, RunMode,
    RunSpec, SpecialistMsg,
};
use crate::persist::PersistOp;
use crate::report::SubagentReport;
use crate::specialist::SpecialistConfig;
use crate::supervisor::{Supervisor, SupervisorConfig};
use keel_harness::{HarnessKind, TokenCounts};
use keel_store::{ReadError, RunId, RunStatus, Store, Task, TaskId, TaskKind, TaskStatus};
use node::{CheckpointRole, CoordinatorRole, Node, SupervisorRole, lock};
use ractor::Actor;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Everything the runtime is configured with.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The supervisor's limits and agents.
    pub supervisor: SupervisorConfig,
    /// Each coordinator's limits.
    pub coordinator: CoordinatorConfig,
    /// The checkpoint writer's bounds.
    pub checkpoint: CheckpointConfig,
    /// Each specialist's limits and working directory.
    pub specialist: SpecialistConfig,
    /// Most runs a node hosts at once; [`Runtime::submit`] waits for a slot.
    pub runs_in_flight_max: u32,
    /// How long a stopped specialist gets to end by itself before its actor is killed.
    pub stop_grace_ms: u64,
    /// Capacity of the event channel (events past it are dropped and counted).
    pub events_capacity: usize,
    /// Seed of the node's ChaCha8 stream; `None` seeds it from the OS (the normal case).
    pub seed: Option<u64>,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            supervisor: SupervisorConfig::default(),
            coordinator: CoordinatorConfig::default(),
            checkpoint: CheckpointConfig::default(),
            specialist: SpecialistConfig::default(),
            runs_in_flight_max: 64,
            stop_grace_ms: 10_000,
            events_capacity: 4_096,
            seed: None,
        }
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunOutcome {
    /// The run.
    pub run: RunId,
    /// Its terminal status (durable).
    pub status: RunStatus,
    /// The outcome text (the synthesis as JSON for a completed run, else the reason).
    pub outcome: String,
}

/// What an embedding host or a progress view hears about, as it happens. The store is the record;
/// these are a view of it, and a full channel drops them rather than stall a run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RuntimeEvent {
    /// A specialist attempt was admitted and spawned.
    TaskStarted {
        /// The attempt.
        attempt: AttemptId,
        /// Its plan step.
        step: String,
        /// The agent profile it runs as.
        agent: String,
        /// Its harness.
        harness: HarnessKind,
        /// Its model.
        model: String,
    },
    /// A session log line of an attempt (its latest row's summary).
    Progress {
        /// The attempt.
        attempt: AttemptId,
        /// One line.
        summary: String,
    },
    /// Cumulative spend of an attempt.
    Spend {
        /// The attempt.
        attempt: AttemptId,
        /// Micro-dollars so far.
        spent_micros: u64,
    },
    /// Token usage of an attempt's session so far (the harness's reports folded without double
    /// counting), sent whenever it changes.
    Usage {
        /// The attempt.
        attempt: AttemptId,
        /// Tokens (and the harness's own cost, when it reports one) of the session so far.
        tokens: TokenCounts,
        /// What the attempt has spent, in micro-dollars: the harness's cost, else its tokens at the
        /// specialist's price per million (the figure the budget is charged).
        spent_micros: u64,
    },
    /// A report was made durable and acknowledged.
    Report {
        /// The attempt that produced it.
        attempt: AttemptId,
        /// Its plan step.
        step: String,
        /// The verified report.
        report: SubagentReport,
    },
    /// An attempt failed (the supervisor decides what happens next).
    TaskFailed {
        /// The attempt.
        attempt: AttemptId,
        /// Its plan step (empty if the attempt was already gone).
        step: String,
        /// The failure kind's stable name.
        kind: String,
    },
    /// A run handed something to a human (durable).
    Escalation {
        /// The run.
        run: RunId,
        /// The task concerned, if any.
        task: Option<TaskId>,
        /// The diagnosis.
        reason: String,
    },
    /// A run reached a terminal state (durable).
    Finished(RunOutcome),
}

/// Why the runtime could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// No OS entropy for the node's stream.
    #[error(transparent)]
    Entropy(#[from] EntropyError),
    /// An actor could not be spawned.
    #[error("could not spawn the {what} actor: {detail}")]
    Spawn {
        /// Which actor.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// The store could not be read (recovery).
    #[error(transparent)]
    Store(#[from] crate::host::HostError),
    /// The run's state does not allow what was asked (the decision is
    /// [`crate::host::decide`]'s).
    #[error(transparent)]
    Refused(#[from] Refusal),
    /// The runtime stopped before the run finished.
    #[error("the runtime stopped before run {0} finished")]
    Stopped(RunId),
    /// A host write through the checkpoint actor failed.
    #[error("could not write through the checkpoint actor: {0}")]
    HostWrite(String),
    /// A follow-up names a task the store does not have.
    #[error("no task {0} in the store")]
    UnknownTask(TaskId),
    /// A follow-up asks for an agent this runtime is not configured with.
    #[error("no agent named {name:?} here (agents: {})", known.join(", "))]
    UnknownAgent {
        /// The name asked for.
        name: String,
        /// The agents this runtime has.
        known: Vec<String>,
    },
    /// A follow-up message is empty (or only white space).
    #[error("the follow-up message is empty")]
    EmptyMessage,
    /// A follow-up message is over [`FOLLOW_UP_BYTES_MAX`].
    #[error("the follow-up message is {bytes} bytes; the limit is {max}")]
    MessageTooLarge {
        /// Its size.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// The run ended without creating the follow-up's task: its coordinator refused it (the
    /// reason is a decision row in the log of the run's root task).
    #[error("run {run} refused the follow-up on {parent} (see the log of its root task)")]
    FollowUpRefused {
        /// The run.
        run: RunId,
        /// The task the follow-up was asked on.
        parent: TaskId,
    },
}

/// A submitted or resumed run: its id, and a way to wait for its end.
#[derive(Debug)]
pub struct RunHandle {
    run: RunId,
    done: oneshot::Receiver<RunOutcome>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

impl RunHandle {
    /// The run's id.
    pub fn id(&self) -> RunId {
        self.run
    }

    /// Wait for the run's terminal state.
    ///
    /// # Errors
    /// [`RuntimeError::Stopped`] if the runtime stopped (or paused) before the run ended.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future drops the handle (the run goes on).
    pub async fn finished(self) -> Result<RunOutcome, RuntimeError> {
        self.done.await.map_err(|_| RuntimeError::Stopped(self.run))
    }
}

/// A follow-up on its way: the run it joined, the id its task takes, and a way to wait for it.
pub struct FollowUpHandle {
    run: RunId,
    task: TaskId,
    parent: TaskId,
    reopened: bool,
    done: oneshot::Receiver<RunOutcome>,
    node: Arc<Node>,
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl std::fmt::Debug for FollowUpHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowUpHandle")
            .field("run", &self.run)
            .field("task", &self.task)
            .field("parent", &self.parent)
            .field("reopened", &self.reopened)
            .finish_non_exhaustive()
    }
}

/// How long a follow-up's wait sleeps between looks at whether its run's coordinator is gone.
const FOLLOW_UP_POLL: Duration = Duration::from_millis(250);

impl FollowUpHandle {
    /// The run the follow-up joined.
    pub fn run(&self) -> RunId {
        self.run
    }

    /// The id of the follow-up's task (kind `FollowUp`), chosen before the coordinator creates it.
    pub fn task(&self) -> TaskId {
        self.task
    }

    /// The task the follow-up was asked on (its task's parent is the newest task of that thread).
    pub fn parent(&self) -> TaskId {
        self.parent
    }

    /// Whether this call rebuilt the run from the store (it had ended, or was paused) rather than
    /// joining a run this runtime was hosting.
    pub fn reopened(&self) -> bool {
        self.reopened
    }

    /// Wait for the run to end (a reopened run ends once the follow-up is done; a run that was
    /// already hosted ends when all of its work is done) and read the follow-up's rows.
    ///
    /// # Errors
    /// [`RuntimeError::FollowUpRefused`] when the run ended without creating the follow-up's task;
    /// [`RuntimeError::Stopped`] when the runtime stopped or paused first; [`RuntimeError::Store`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future drops the handle (the follow-up goes on).
    pub async fn finished(self) -> Result<FollowUpOutcome, RuntimeError> {
        let FollowUpHandle {
            run,
            task,
            parent,
            mut done,
            node,
            ..
        } = self;
        // The run's end normally arrives through its waiter; the poll covers a follow-up that
        // reached a coordinator as it was stopping (its waiters already answered).
        let outcome = loop {
            tokio::select! {
                r = &mut done => break r.map_err(|_| RuntimeError::Stopped(run))?,
                () = tokio::time::sleep(FOLLOW_UP_POLL) => {
                    if lock(&node.coordinators).contains_key(&run) {
                        continue;
                    }
                    let store = Arc::clone(&node.store);
                    let row = tokio::task::spawn_blocking(move || store.catalog().run(run))
                        .await
                        .map_err(|e| RuntimeError::HostWrite(format!("read task failed: {e}")))?
                        .map_err(|e| RuntimeError::Store(crate::host::HostError::Read(e)))?;
                    if !row.status.is_terminal() {
                        return Err(RuntimeError::Stopped(run));
                    }
                    break RunOutcome {
                        run,
                        status: row.status,
                        outcome: row.outcome.unwrap_or_default(),
                    };
                }
            }
        };
        let store = Arc::clone(&node.store);
        let tasks =
            tokio::task::spawn_blocking(move || crate::host::store::all_tasks(&store.run(run)))
                .await
                .map_err(|e| RuntimeError::HostWrite(format!("read task failed: {e}")))??;
        let Some(first) = tasks.iter().find(|t| t.id == task).cloned() else {
            return Err(RuntimeError::FollowUpRefused { run, parent });
        };
        Ok(FollowUpOutcome {
            last: chain_end(&tasks, &first),
            task: first,
            run: outcome,
        })
    }
}

/// The newest task of `first`'s re-dispatch chain (`first` itself when it was never re-dispatched):
/// a re-dispatch is a new task of kind `Redispatch` whose parent is the task it replaces.
fn chain_end(tasks: &[Task], first: &Task) -> Task {
    let mut last = first.clone();
    // Bounded by the number of tasks: each step moves to a different, newer task.
    for _ in 0..tasks.len() {
        match tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Redispatch && t.parent == Some(last.id))
            .max_by_key(|t| t.id)
        {
            Some(next) => last = next.clone(),
            None => break,
        }
    }
    last
}

/// How a follow-up ended, read from the store after its run ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FollowUpOutcome {
    /// The run's end (a reopened run ends again after the follow-up).
    pub run: RunOutcome,
    /// The follow-up's task (kind `FollowUp`).
    pub task: Task,
    /// The newest task of its re-dispatch chain: the task itself, or the re-dispatch that ran it
    /// last. Its status is the follow-up's.
    pub last: Task,
}

impl FollowUpOutcome {
    /// Whether the follow-up produced a complete report.
    pub fn completed(&self) -> bool {
        self.last.status == TaskStatus::Complete
    }
}

/// What a graceful shutdown did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PauseSummary {
    /// Runs marked paused (durably).
    pub runs: Vec<RunId>,
    /// Tasks marked paused (durably).
    pub tasks_paused: u32,
    /// Specialists still alive when the wait ran out (they were killed).
    pub specialists_killed: u32,
}

/// A coordinator node hosted in the caller's tokio runtime.
pub struct Runtime {
    node: Arc<Node>,
    slots: Arc<Semaphore>,
    /// Held while a run that no coordinator hosts is rebuilt ([`Runtime::resume`],
    /// [`Runtime::follow_up`]), so two calls cannot both rebuild one run.
    reopening: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

/// The checks a follow-up message passes before anything starts (not blank, at most
/// [`FOLLOW_UP_BYTES_MAX`] bytes), public so a caller that hands the follow-up to another process
/// (`keel follow-up --detach`) can refuse bad input at once.
///
/// # Errors
/// [`RuntimeError::EmptyMessage`] or [`RuntimeError::MessageTooLarge`].
pub fn check_follow_up_message(message: &str) -> Result<(), RuntimeError> {
    if message.trim().is_empty() {
        return Err(RuntimeError::EmptyMessage);
    }
    if message.len() > FOLLOW_UP_BYTES_MAX {
        return Err(RuntimeError::MessageTooLarge {
            bytes: message.len(),
            max: FOLLOW_UP_BYTES_MAX,
        });
    }
    Ok(())
}

impl Runtime {
    /// Start the node's supervisor and checkpoint actors on `store`. The returned channel carries
    /// [`RuntimeEvent`]s; drop it if nobody listens.
    ///
    /// # Errors
    /// [`RuntimeError::Entropy`] or [`RuntimeError::Spawn`].
    pub async fn start(
        store: Arc<Store>,
        harnesses: HarnessSet,
        config: RuntimeConfig,
    ) -> Result<(Runtime, mpsc::Receiver<RuntimeEvent>), RuntimeError> {
        let mut entropy = match config.seed {
            Some(seed) => OsEntropy::from_seed(seed),
            None => OsEntropy::from_os()?,
        };
        let (tx, rx) = mpsc::channel(config.events_capacity.max(1));
        let slots = Arc::new(Semaphore::new(config.runs_in_flight_max.max(1) as usize));
        let supervisor_rng = entropy.fork();
        let checkpoint_rng = entropy.fork();
        let node = Arc::new(Node {
            store,
            harnesses,
            config: config.clone(),
            coordinators: Mutex::new(BTreeMap::new()),
            run_spans: Mutex::new(BTreeMap::new()),
            specialists: Mutex::new(BTreeMap::new()),
            by_actor: Mutex::new(BTreeMap::new()),
            supervisor: OnceLock::new(),
            checkpoint: OnceLock::new(),
            waiters: Mutex::new(BTreeMap::new()),
            host_acks: Mutex::new(BTreeMap::new()),
            next_host_ticket: AtomicU64::new(0),
            events: Some(tx),
            events_dropped: AtomicU64::new(0),
            pausing: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            commits_in_flight: AtomicU64::new(0),
            commits_total: AtomicU64::new(0),
            entropy: Mutex::new(entropy),
            started_keys: Mutex::new(BTreeSet::new()),
            sessions_started: AtomicU64::new(0),
            writer: OnceLock::new(),
        });
        let (writes, batches) = std::sync::mpsc::channel();
        let weak = Arc::downgrade(&node);
        // redb's commit blocks on fsync: the node's one store writer is a thread of its own.
        #[allow(clippy::disallowed_methods)]
        let writer = std::thread::Builder::new()
            .name("keel-store-writer".into())
            .spawn(move || node::store_writer(weak, batches));
        writer.map_err(|e| RuntimeError::Spawn {
            what: "store writer",
            detail: e.to_string(),
        })?;
        let _ = node.writer.set(writes);
        let (checkpoint, _) = Actor::spawn(
            None,
            Host::new(CheckpointRole {
                node: Arc::clone(&node),
            }),
            HostState::new(
                CheckpointWriter::new(config.checkpoint.clone()),
                checkpoint_rng,
                (),
            ),
        )
        .await
        .map_err(|e| RuntimeError::Spawn {
            what: "checkpoint",
            detail: e.to_string(),
        })?;
        let _ = node.checkpoint.set(checkpoint);
        let (supervisor, _) = Actor::spawn(
            None,
            Host::new(SupervisorRole {
                node: Arc::clone(&node),
            }),
            HostState::new(
                Supervisor::new(config.supervisor.clone()),
                supervisor_rng,
                (),
            ),
        )
        .await
        .map_err(|e| RuntimeError::Spawn {
            what: "supervisor",
            detail: e.to_string(),
        })?;
        let _ = node.supervisor.set(supervisor);
        Ok((
            Runtime {
                node,
                slots,
                reopening: tokio::sync::Mutex::new(()),
            },
            rx,
        ))
    }

    /// Submit a brief: mint its run id, start its coordinator and accept the run. Waits for a run
    /// slot when [`RuntimeConfig::runs_in_flight_max`] runs are in flight.
    ///
    /// # Errors
    /// [`RuntimeError::Spawn`] if the coordinator actor cannot start.
    pub async fn submit(
        &self,
        brief: String,
        mode: RunMode,
        budget_limit_micros: Option<u64>,
        config_snapshot: String,
    ) -> Result<RunHandle, RuntimeError> {
        let slot = self.slot().await?;
        let run = {
            let mut rng = lock(&self.node.entropy);
            mint_run_id(wall_clock_ms(), &mut *rng)
        };
        let spec = RunSpec {
            run,
            brief,
            mode,
            budget_limit_micros,
            config_snapshot,
        };
        self.host(
            run,
            CoordinatorInput::Msg(CoordinatorMsg::Accept(spec)),
            slot,
        )
        .await
    }

    /// Resume a run from the store after a crash or a pause: its coordinator is rebuilt from the
    /// durable rows, acknowledged work is not run again, and interrupted attempts run again as new
    /// attempts with resume preambles. A paused run is marked running again first
    /// ([`decide::resume`]).
    ///
    /// # Errors
    /// [`RuntimeError::Store`] (unknown run, unreadable rows), [`RuntimeError::Refused`] (terminal,
    /// already running), [`RuntimeError::HostWrite`], [`RuntimeError::Spawn`].
    pub async fn resume(&self, run: RunId) -> Result<RunHandle, RuntimeError> {
        let _reopening = self.reopening.lock().await;
        if lock(&self.node.coordinators).contains_key(&run) {
            return Err(Refusal::AlreadyRunning(run).into());
        }
        let mut rows = self.recover_run(run).await?;
        let hosted = lock(&self.node.coordinators).contains_key(&run);
        let marks = decide::resume(hosted, &rows.run, wall_clock_ms())?;
        let slot = self.slot().await?;
        if let Some(marks) = marks {
            self.write_marks(&mut rows.run, marks).await?;
        }
        self.host(run, CoordinatorInput::Recovered(Box::new(rows)), slot)
            .await
    }

    /// The rows of `run` a coordinator rebuilds from, read on the blocking pool.
    async fn recover_run(&self, run: RunId) -> Result<RecoveredRun, RuntimeError> {
        let store = Arc::clone(&self.node.store);
        tokio::task::spawn_blocking(move || crate::host::store::recover_run(&store, run))
            .await
            .map_err(|e| RuntimeError::HostWrite(format!("recovery task failed: {e}")))?
            .map_err(RuntimeError::from)
    }

    /// Write a decision's marks through the checkpoint actor (the only writer), and keep the run row
    /// a coordinator is rebuilt from in step with what was written.
    async fn write_marks(
        &self,
        run: &mut keel_store::Run,
        marks: Marks,
    ) -> Result<(), RuntimeError> {
        if let Some(PersistOp::UpdateRun(row)) = marks.ops.last() {
            *run = row.clone();
        }
        self.node
            .stage_host(run.id, marks.ops, Duration::from_secs(30))
            .await
            .map_err(RuntimeError::HostWrite)
    }

    /// Ask a follow-up on `task`'s thread: a new task of kind `FollowUp` whose parent is the newest
    /// task of that thread, served a standard preamble built from keel's rows (the parent's brief
    /// and outcome, its ancestors), its model resolved from its assignee's profile (`agent`, or
    /// the supervisor's pick). Never a native resume.
    ///
    /// Where the run stands decides what happens:
    /// - hosted by this runtime: the follow-up joins it (a message to its coordinator);
    /// - completed or failed (or paused): the run is reopened. Its row goes back to `Running`
    ///   (durably), its coordinator is rebuilt from the store as [`Runtime::resume`] does, with
    ///   the follow-up queued first; acknowledged work is not run again (a paused run's
    ///   interrupted work does run again). Once the follow-up is done the run ends again with a
    ///   synthesis over all of its steps, the follow-up included: `Completed` when any step has a
    ///   usable report, else `Failed`. The follow-up's own status is its task's;
    /// - open but not hosted here, cancelled, or over budget: refused.
    ///
    /// A follow-up that reaches a hosted run while the run's end is being made durable is refused
    /// by its coordinator (the handle then says [`RuntimeError::FollowUpRefused`]); asked again,
    /// it reopens the run.
    ///
    /// # Errors
    /// [`RuntimeError::EmptyMessage`], [`RuntimeError::MessageTooLarge`],
    /// [`RuntimeError::UnknownAgent`], [`RuntimeError::UnknownTask`],
    /// [`RuntimeError::Refused`] (not hosted here, not reopenable), [`RuntimeError::Store`],
    /// [`RuntimeError::HostWrite`], [`RuntimeError::Spawn`].
    pub async fn follow_up(
        &self,
        task: TaskId,
        message: &str,
        agent: Option<&str>,
    ) -> Result<FollowUpHandle, RuntimeError> {
        check_follow_up_message(message)?;
        let agents = &self.node.config.supervisor.agents;
        if let Some(name) = agent
            && !agents.iter().any(|a| a.name == name)
        {
            return Err(RuntimeError::UnknownAgent {
                name: name.to_owned(),
                known: agents.iter().map(|a| a.name.clone()).collect(),
            });
        }
        let store = Arc::clone(&self.node.store);
        let row = tokio::task::spawn_blocking(move || store.catalog().task(task))
            .await
            .map_err(|e| RuntimeError::HostWrite(format!("read task failed: {e}")))?;
        let run = match row {
            Ok(t) => t.run_id,
            Err(ReadError::NotFound { .. }) => return Err(RuntimeError::UnknownTask(task)),
            Err(e) => return Err(RuntimeError::Store(crate::host::HostError::Read(e))),
        };
        let preset = {
            let mut rng = lock(&self.node.entropy);
            mint_task_id(wall_clock_ms(), &mut *rng)
        };
        let request = FollowUpRequest {
            parent: task,
            brief: message.to_owned(),
            agent: agent.map(str::to_owned),
            task: Some(preset),
        };
        let _reopening = self.reopening.lock().await;
        let hosted = lock(&self.node.coordinators).get(&run).cloned();
        let mut rows = self.recover_run(run).await?;
        // A coordinator stays in the table for a moment after its run's end is durable (it stops
        // after that step): the decision reopens such a run rather than joining it.
        let route = decide::follow_up(hosted.is_some(), &rows.run, wall_clock_ms())?;
        let marks = match (route, hosted) {
            (FollowUpRoute::Reopen(marks), _) => marks,
            (FollowUpRoute::Join, Some(coordinator)) => {
                let (tx, rx) = oneshot::channel();
                lock(&self.node.waiters).entry(run).or_default().push(tx);
                // A coordinator that stopped meanwhile drops the message; the handle's wait notices.
                let _ = coordinator.send_message(Deliver(CoordinatorInput::Msg(
                    CoordinatorMsg::FollowUp {
                        parent: request.parent,
                        brief: request.brief,
                        agent: request.agent,
                        task: request.task,
                    },
                )));
                return Ok(FollowUpHandle {
                    run,
                    task: preset,
                    parent: task,
                    reopened: false,
                    done: rx,
                    node: Arc::clone(&self.node),
                    _slot: None,
                });
            }
            (FollowUpRoute::Join, None) => {
                // The decision joins only a hosted run; kept as a refusal rather than a panic.
                let status = rows.run.status;
                return Err(Refusal::NotHostedHere { run, status }.into());
            }
        };
        let slot = self.slot().await?;
        self.write_marks(&mut rows.run, marks).await?;
        let handle = self
            .host(
                run,
                CoordinatorInput::Reopened {
                    rows: Box::new(rows),
                    follow_up: request,
                },
                slot,
            )
            .await?;
        let RunHandle {
            done, _slot: slot, ..
        } = handle;
        Ok(FollowUpHandle {
            run,
            task: preset,
            parent: task,
            reopened: true,
            done,
            node: Arc::clone(&self.node),
            _slot: Some(slot),
        })
    }

    /// Every run of the store that is not terminal (running when the node died, or paused).
    ///
    /// # Errors
    /// [`RuntimeError::Store`].
    pub fn open_runs(&self) -> Result<Vec<RunId>, RuntimeError> {
        Ok(crate::host::store::open_runs(&self.node.store)?)
    }

    /// Cancel a run hosted here (idempotent; ignored once it is terminal). Returns whether the run
    /// is hosted here.
    pub fn cancel(&self, run: RunId, reason: &str) -> bool {
        let Some(c) = lock(&self.node.coordinators).get(&run).cloned() else {
            return false;
        };
        c.send_message(Deliver(CoordinatorInput::Msg(CoordinatorMsg::Cancel {
            reason: reason.to_owned(),
        })))
        .is_ok()
    }

    /// Kill one attempt's actor the hard way, as a crashed worker would die: no cancel, no report.
    /// The supervisor actor sees the link break and its machine decides (restart, reroute,
    /// escalate). Returns whether the attempt was alive here.
    pub fn kill_attempt(&self, attempt: AttemptId) -> bool {
        let Some(actor) = lock(&self.node.specialists)
            .get(&attempt)
            .map(|s| s.actor.clone())
        else {
            return false;
        };
        actor.kill();
        true
    }

    /// Mark a run that no process hosts as cancelled (its row and open tasks), through the
    /// checkpoint actor.
    ///
    /// # Errors
    /// [`RuntimeError::Store`], [`RuntimeError::Refused`] (terminal, already running),
    /// [`RuntimeError::HostWrite`].
    pub async fn cancel_stored(&self, run: RunId, reason: &str) -> Result<u32, RuntimeError> {
        if lock(&self.node.coordinators).contains_key(&run) {
            return Err(Refusal::AlreadyRunning(run).into());
        }
        let mut rows = self.recover_run(run).await?;
        let hosted = lock(&self.node.coordinators).contains_key(&run);
        let marks = decide::cancel_stored(hosted, &rows.run, &rows.tasks, reason, wall_clock_ms())?;
        let cancelled = marks.tasks;
        self.write_marks(&mut rows.run, marks).await?;
        Ok(cancelled)
    }

    /// Graceful shutdown: stop admitting, cancel every running session cooperatively (their log rows
    /// still reach the store), hold back unacknowledged results, then mark the open tasks and their
    /// runs paused through the checkpoint actor. Waits at most `wait` for sessions to end; the ones
    /// still running then are killed (they run again on resume all the same).
    pub async fn pause(&self, wait: Duration) -> PauseSummary {
        let node = &self.node;
        node.pausing.store(true, Ordering::Release);
        let live: Vec<(AttemptId, HostRef<crate::specialist::Specialist>)> =
            lock(&node.specialists)
                .iter()
                .map(|(a, s)| (*a, s.actor.clone()))
                .collect();
        for (_, actor) in &live {
            let _ = actor.send_message(Deliver(crate::message::SpecialistInput::Msg(
                SpecialistMsg::Cancel {
                    reason: "the node is shutting down".into(),
                },
            )));
        }
        let deadline = tokio::time::Instant::now() + wait;
        while !lock(&node.specialists).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut summary = PauseSummary::default();
        for (_, s) in lock(&node.specialists).iter() {
            s.actor.kill();
            summary.specialists_killed += 1;
        }
        // Let the last log rows and their commits land before the coordinators are frozen.
        let mut quiet_polls = 0;
        while quiet_polls < 3 && tokio::time::Instant::now() < deadline + Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if node.commits_in_flight.load(Ordering::Acquire) == 0 {
                quiet_polls += 1;
            } else {
                quiet_polls = 0;
            }
        }
        node.frozen.store(true, Ordering::Release);
        let runs: Vec<RunId> = lock(&node.coordinators).keys().copied().collect();
        for run in runs {
            let Ok(rows) = self.recover_run(run).await else {
                continue;
            };
            let Some(marks) = decide::pause(&rows.run, &rows.tasks, wall_clock_ms()) else {
                continue;
            };
            let paused = marks.tasks;
            match node
                .stage_host(run, marks.ops, Duration::from_secs(30))
                .await
            {
                Ok(()) => {
                    summary.runs.push(run);
                    summary.tasks_paused += paused;
                }
                Err(e) => tracing::error!(%run, error = %e, "could not mark the run paused"),
            }
        }
        summary
    }

    /// Stop every actor of the node (after [`Runtime::pause`], or when every run is done).
    pub async fn shutdown(self) {
        let coordinators: Vec<_> = lock(&self.node.coordinators).values().cloned().collect();
        for c in coordinators {
            c.stop(Some("node shutdown".into()));
        }
        let specialists: Vec<_> = lock(&self.node.specialists)
            .values()
            .map(|s| s.actor.clone())
            .collect();
        for s in specialists {
            s.kill();
        }
        if let Some(s) = self.node.supervisor.get() {
            s.stop(Some("node shutdown".into()));
        }
        if let Some(c) = self.node.checkpoint.get() {
            let _ = c
                .stop_and_wait(Some("node shutdown".into()), Some(Duration::from_secs(5)))
                .await;
        }
    }

    /// Events dropped because the channel was full.
    pub fn events_dropped(&self) -> u64 {
        self.node.events_dropped.load(Ordering::Relaxed)
    }

    /// Harness sessions this runtime started (each is one execution of a specialist).
    pub fn sessions_started(&self) -> u64 {
        self.node.sessions_started.load(Ordering::Relaxed)
    }

    /// Group commits (durable write transactions) this runtime handed to its store writer, failed
    /// ones included: the bench divides it by runs.
    pub fn commits(&self) -> u64 {
        self.node.commits_total.load(Ordering::Relaxed)
    }

    /// The store the node writes.
    pub fn store(&self) -> &Arc<Store> {
        &self.node.store
    }

    async fn slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, RuntimeError> {
        Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|e| RuntimeError::Spawn {
                what: "coordinator",
                detail: e.to_string(),
            })
    }

    async fn host(
        &self,
        run: RunId,
        first: CoordinatorInput,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<RunHandle, RuntimeError> {
        let (tx, rx) = oneshot::channel();
        lock(&self.node.waiters).entry(run).or_default().push(tx);
        let span = spans::run_span(run, &first);
        lock(&self.node.run_spans).insert(run, span.clone());
        let role = CoordinatorRole {
            node: Arc::clone(&self.node),
            run,
            span,
        };
        let state = HostState::new(
            Coordinator::new(self.node.config.coordinator.clone()),
            self.node.fork_rng(),
            (),
        );
        let (actor, _) = match Actor::spawn(None, Host::new(role), state).await {
            Ok(spawned) => spawned,
            Err(e) => {
                lock(&self.node.run_spans).remove(&run);
                return Err(RuntimeError::Spawn {
                    what: "coordinator",
                    detail: e.to_string(),
                });
            }
        };
        lock(&self.node.coordinators).insert(run, actor.clone());
        let _ = actor.send_message(Deliver(first));
        Ok(RunHandle {
            run,
            done: rx,
            _slot: slot,
        })
    }
}
