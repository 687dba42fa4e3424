//! A run's life in the runtime: starting the node's actors, submitting a run, resuming one from the
//! store, hosting its coordinator in a run slot, and stopping the node.

use super::NodeStore;
use super::node::{CoordinatorRole, HostedRun, Node, RunEnd, SupervisorRole, WriterInput, lock};
use super::pause::Halt;
use super::{
    Deliver, HarnessSet, HostWriteError, MachineActor, MachineActorState, OsEntropy, ResumeError,
    RunOutcome, Runtime, RuntimeConfig, RuntimeEvent, SpawnError, StartError, StoreReadError,
    SubmitError, WaitError, spans, wall_clock_ms,
};
use crate::checkpoint::CheckpointWriter;
use crate::coordinator::Coordinator;
use crate::host::decide::{self, Marks};
use crate::ids::mint_run_id;
use crate::message::{CoordinatorInput, CoordinatorMsg, RecoveredRun, RunMode, RunSpec};
use crate::persist::PersistOp;
use crate::supervisor::Supervisor;
use keel_store::RunId;
use ractor::Actor;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc, oneshot};

/// A coordinator actor started for a run and not yet given anything (see [`Runtime::begin`]).
pub(super) struct SpawnedCoordinator {
    run: RunId,
    hosted: HostedRun,
    span: tracing::Span,
}

impl SpawnedCoordinator {
    /// Which hosting of its run it is.
    pub(super) fn generation(&self) -> u64 {
        self.hosted.generation
    }

    /// The hosting will not begin (its marks could not be written): stop the idle actor.
    pub(super) fn abandon(self) {
        self.hosted
            .coordinator
            .stop(Some("its hosting did not begin".into()));
    }
}

/// A submitted or resumed run: its id, and a way to wait for its end.
#[derive(Debug)]
pub struct RunHandle {
    pub(super) run: RunId,
    pub(super) done: oneshot::Receiver<RunEnd>,
    pub(super) _slot: tokio::sync::OwnedSemaphorePermit,
}

impl RunHandle {
    /// The run's id.
    pub fn id(&self) -> RunId {
        self.run
    }

    /// Wait for the run's terminal state.
    ///
    /// # Errors
    /// [`WaitError::Stopped`] if the runtime stopped (or its host paused it) before the run ended;
    /// [`WaitError::Paused`] if the node paused it by itself (a full disk).
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future drops the handle (the run goes on).
    pub async fn finished(self) -> Result<RunOutcome, WaitError> {
        match self.done.await {
            Ok(RunEnd::Finished(outcome)) => Ok(outcome),
            Ok(RunEnd::Paused(reason)) => Err(WaitError::Paused {
                run: self.run,
                reason,
            }),
            Err(_) => Err(WaitError::Stopped(self.run)),
        }
    }
}

/// `config` with the values of the credentials `harnesses` names registered in the specialists'
/// scrubber, after checking the scrubber's patterns compiled (keel refuses to run without them). A
/// value the scrubber refuses (shorter than six characters: not a credential) is logged by its
/// variable's place in the list, never by its value, and left out.
fn with_credentials_registered(
    mut config: RuntimeConfig,
    harnesses: &HarnessSet,
) -> Result<RuntimeConfig, StartError> {
    crate::context::Scrubber::check_patterns()?;
    for (i, value) in harnesses.credential_values().iter().enumerate() {
        if let Err(e) = config.specialist.scrubber.register_secret(value) {
            tracing::warn!(credential = i, error = %e, "a credential is not scrubbed literally");
        }
    }
    Ok(config)
}

impl Runtime {
    /// Start the node's supervisor actor and its store writer thread (hosting the checkpoint
    /// writer) on `store`. The returned channel carries
    /// [`RuntimeEvent`]s; drop it if nobody listens.
    ///
    /// Every specialist's scrubber gets the values of the credentials `harnesses` names registered, so
    /// a session that prints its own key leaves none in the store (issue 16).
    ///
    /// # Errors
    /// [`StartError::Scrubber`] when the scrubber's patterns do not compile (keel does not run
    /// without them), [`StartError::Entropy`] or [`StartError::Spawn`].
    pub async fn start(
        store: impl Into<NodeStore>,
        harnesses: HarnessSet,
        config: RuntimeConfig,
    ) -> Result<(Runtime, mpsc::Receiver<RuntimeEvent>), StartError> {
        let config = with_credentials_registered(config, &harnesses)?;
        let mut entropy = match config.seed {
            Some(seed) => OsEntropy::from_seed(seed),
            None => OsEntropy::from_os()?,
        };
        let (tx, rx) = mpsc::channel(config.events_capacity.max(1));
        let slots = Arc::new(Semaphore::new(config.runs_in_flight_max.max(1) as usize));
        let supervisor_rng = entropy.fork();
        let checkpoint_rng = entropy.fork();
        let node = Arc::new(Node {
            store: store.into(),
            harnesses,
            config: config.clone(),
            coordinators: Mutex::new(BTreeMap::new()),
            next_generation: AtomicU64::new(0),
            #[cfg(test)]
            fail_coordinator_spawns: AtomicBool::new(false),
            run_spans: Mutex::new(BTreeMap::new()),
            specialists: Mutex::new(BTreeMap::new()),
            supervisor: OnceLock::new(),
            checkpoint: OnceLock::new(),
            waiters: Mutex::new(BTreeMap::new()),
            host_acks: Mutex::new(BTreeMap::new()),
            approvals: Mutex::new(BTreeMap::new()),
            next_host_ticket: AtomicU64::new(0),
            events: Some(tx),
            events_dropped: AtomicU64::new(0),
            pausing: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            freeze_gate: Mutex::new(()),
            shut: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            halt: Mutex::new(Halt::default()),
            tokio: tokio::runtime::Handle::current(),
            commits_in_flight: AtomicU64::new(0),
            commits_total: AtomicU64::new(0),
            entropy: Mutex::new(entropy),
            started_keys: Mutex::new(crate::host::StartedKeys::default()),
            sessions_started: AtomicU64::new(0),
            remote: OnceLock::new(),
            timers: super::node::Timers::start(),
        });
        let (inputs, queue) = std::sync::mpsc::channel();
        let weak = Arc::downgrade(&node);
        let checkpoint = CheckpointWriter::new(config.checkpoint.clone());
        // redb's commit blocks on fsync: the node's one store writer is a thread of its own, and
        // it hosts the checkpoint writer machine whose commits it runs.
        #[allow(clippy::disallowed_methods)]
        let writer = std::thread::Builder::new()
            .name("keel-store-writer".into())
            .spawn(move || super::node::store_writer(weak, queue, checkpoint, checkpoint_rng));
        let store_writer = writer.map_err(|e| SpawnError {
            what: "store writer",
            detail: e.to_string(),
        })?;
        let _ = node.checkpoint.set(inputs);
        let (supervisor, _) = Actor::spawn(
            None,
            MachineActor::new(SupervisorRole {
                node: Arc::clone(&node),
            }),
            MachineActorState::new(
                Supervisor::new(config.supervisor.clone()),
                supervisor_rng,
                (),
            ),
        )
        .await
        .map_err(|e| SpawnError {
            what: "supervisor",
            detail: e.to_string(),
        })?;
        let _ = node.supervisor.set(supervisor);
        Ok((
            Runtime {
                node,
                slots,
                reopening: tokio::sync::Mutex::new(()),
                store_writer,
            },
            rx,
        ))
    }

    /// Submit a brief: mint its run id, start its coordinator and accept the run. Waits for a run
    /// slot when [`RuntimeConfig::runs_in_flight_max`] runs are in flight.
    ///
    /// # Errors
    /// [`SubmitError::Spawn`] if the coordinator actor cannot start.
    pub async fn submit(
        &self,
        brief: String,
        mode: RunMode,
        budget_limit_micros: Option<u64>,
        config_snapshot: String,
    ) -> Result<RunHandle, SubmitError> {
        let slot = self.slot().await?;
        self.node.lift_halt();
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
        Ok(self
            .host(
                run,
                CoordinatorInput::Msg(CoordinatorMsg::Accept(spec)),
                slot,
            )
            .await?)
    }

    /// Resume a run from the store after a crash or a pause: its coordinator is rebuilt from the
    /// durable rows, acknowledged work is not run again, and interrupted attempts run again as new
    /// attempts with resume preambles. A paused run is marked running again first
    /// ([`decide::resume`]).
    ///
    /// # Errors
    /// [`ResumeError::Read`] (unknown run, unreadable rows), [`ResumeError::Refused`] (terminal,
    /// already running), [`ResumeError::Write`], [`ResumeError::Spawn`].
    pub async fn resume(&self, run: RunId) -> Result<RunHandle, ResumeError> {
        self.node.lift_halt();
        // A refusal needs no run slot: decide once before waiting for one.
        let rows = self.recover_run(run).await?;
        decide::resume(self.node.hosted(run).is_some(), &rows.run, wall_clock_ms())?;
        // The slot is waited for without the reopen lock, so a follow-up that joins a hosted run
        // (and needs no slot) is not held up behind a resume waiting for one.
        let slot = self.slot().await?;
        let _reopening = self.reopening.lock().await;
        // Decided again under the lock: the run may have been resumed or reopened meanwhile.
        let mut rows = self.recover_run(run).await?;
        let marks = decide::resume(self.node.hosted(run).is_some(), &rows.run, wall_clock_ms())?;
        // Started before the marks are written, so a coordinator that cannot start leaves the run
        // as it was rather than marked running with nothing hosting it.
        let spawned = self
            .spawn_coordinator(run, spans::rebuilt_run_span(&rows.run))
            .await?;
        if let Some(marks) = marks
            && let Err(e) = self.write_marks(&mut rows.run, marks).await
        {
            spawned.abandon();
            return Err(e.into());
        }
        Ok(self.begin(spawned, CoordinatorInput::Recovered(Box::new(rows)), slot))
    }

    /// The rows of `run` a coordinator rebuilds from, read on the blocking pool.
    pub(super) async fn recover_run(&self, run: RunId) -> Result<RecoveredRun, StoreReadError> {
        self.node.recover_run(run).await
    }

    /// Write a decision's marks through the checkpoint actor (the only writer), and keep the run row
    /// a coordinator is rebuilt from in step with what was written.
    pub(super) async fn write_marks(
        &self,
        run: &mut keel_store::Run,
        marks: Marks,
    ) -> Result<(), HostWriteError> {
        if let Some(PersistOp::UpdateRun(row)) = marks.ops.last() {
            *run = row.clone();
        }
        self.node
            .stage_host(run.id, marks.ops, Duration::from_secs(30))
            .await
            .map_err(HostWriteError)
    }

    pub(super) async fn slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, SpawnError> {
        Arc::clone(&self.slots)
            .acquire_owned()
            .await
            .map_err(|e| SpawnError {
                what: "coordinator",
                detail: e.to_string(),
            })
    }

    /// Start a new run's coordinator and give it its first input.
    pub(super) async fn host(
        &self,
        run: RunId,
        first: CoordinatorInput,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<RunHandle, SpawnError> {
        let spawned = self
            .spawn_coordinator(run, spans::run_span(run, &first))
            .await?;
        Ok(self.begin(spawned, first, slot))
    }

    /// Start a coordinator actor for `run` under a new hosting generation, not yet in the routing
    /// table and given nothing: until [`Runtime::begin`] it decides nothing and writes nothing.
    /// `span` is the run's (see [`spans`]).
    pub(super) async fn spawn_coordinator(
        &self,
        run: RunId,
        span: tracing::Span,
    ) -> Result<SpawnedCoordinator, SpawnError> {
        #[cfg(test)]
        if self
            .node
            .fail_coordinator_spawns
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Err(SpawnError {
                what: "coordinator",
                detail: "a test asked this spawn to fail".into(),
            });
        }
        let generation = self
            .node
            .next_generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let role = CoordinatorRole {
            node: Arc::clone(&self.node),
            run,
            span: span.clone(),
            generation,
        };
        let state = MachineActorState::new(
            Coordinator::new(self.node.config.coordinator.clone()),
            self.node.fork_rng(),
            (),
        );
        let (actor, _) = Actor::spawn(None, MachineActor::new(role), state)
            .await
            .map_err(|e| SpawnError {
                what: "coordinator",
                detail: e.to_string(),
            })?;
        Ok(SpawnedCoordinator {
            run,
            hosted: HostedRun {
                coordinator: actor,
                generation,
            },
            span,
        })
    }

    /// Put a spawned coordinator in the routing table (replacing an earlier hosting of its run
    /// that is only stopping) and give it its first input; its waiter is bound to its generation.
    pub(super) fn begin(
        &self,
        spawned: SpawnedCoordinator,
        first: CoordinatorInput,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) -> RunHandle {
        let SpawnedCoordinator { run, hosted, span } = spawned;
        let done = self.node.wait_for(run, hosted.generation);
        lock(&self.node.run_spans).insert(run, span);
        let coordinator = hosted.coordinator.clone();
        lock(&self.node.coordinators).insert(run, hosted);
        let _ = coordinator.send_message(Deliver(first));
        RunHandle {
            run,
            done,
            _slot: slot,
        }
    }

    /// Stop every actor of the node (after [`Runtime::pause`], or when every run is done), then end
    /// the store writer thread after the commit under way and wait for it, and drop the pending
    /// timers so the node and its store are let go.
    pub async fn shutdown(self) {
        let coordinators: Vec<_> = lock(&self.node.coordinators)
            .values()
            .map(|h| h.coordinator.clone())
            .collect();
        for c in coordinators {
            c.stop(Some("node shutdown".into()));
        }
        let specialists: Vec<_> = {
            let live = lock(&self.node.specialists);
            // Under the lock that hosting checks it under: a specialist is either listed here
            // (and killed) or never hosted.
            self.node.closed.store(true, Ordering::Release);
            live.values().map(|s| s.inbox.clone()).collect()
        };
        for s in specialists {
            s.kill();
        }
        if let Some(s) = self.node.supervisor.get() {
            s.stop(Some("node shutdown".into()));
        }
        // The store writer ends after the commit under way; the inputs queued behind are dropped
        // (their coordinators are stopped). Joined so a process that exits after this leaves no
        // commit, and no reference to the store, on a thread it does not wait for (a store closed
        // mid-commit needs a repair).
        if let Some(writer) = self.node.checkpoint.get() {
            let _ = writer.send(WriterInput::Shutdown);
        }
        let thread = self.store_writer;
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        // Pending timers hold the node: dropped now, so the node (and its store) goes with the
        // last handle rather than with the async runtime.
        self.node.timers.close();
    }
}
