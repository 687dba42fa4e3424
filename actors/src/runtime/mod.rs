//! The ractor runtime: the machines of this crate hosted as ractor actors on tokio, with their effects
//! executed for real (docs/DESIGN.md §3, §4). It is the real-IO twin of the simulator's world loop and the
//! only module of the crate that awaits, spawns, reads the wall clock or draws OS entropy.
//!
//! - One actor per node-wide machine: a coordinator per run, one supervisor. The checkpoint writer
//!   is hosted on the store writer thread that runs its commits (`node/store_writer.rs`).
//!   A specialist attempt is no actor: it is hosted on a plain tokio task with the same role hooks
//!   (`task_host.rs`, a ractor actor's cost per attempt was a fifth of a fan-out's CPU), and the end
//!   of that task (an exit, a kill, a panic) becomes a `SupervisorMsg::SpecialistDown` input of the
//!   supervisor unless it was the machine's own exit: the machine decides what follows.
//! - `Persist` effects become one redb write transaction per group commit (`Durability::Immediate`),
//!   executed on the store writer thread; only the checkpoint writer's effects write.
//! - `StartHarness` starts a session through keel-harness; its events stream back into the
//!   specialist's mailbox and its replies go to the coordinator as messages.
//! - Timers are tokio sleeps that deliver the machine's timer input.
//!
//! Embedding: build a [`HarnessSet`], open a [`keel_store::Store`] (wrapped in a [`NodeStore`] that
//! knows how to open it again after a failed write), call [`Runtime::start`] inside your tokio
//! runtime, [`Runtime::submit`] briefs, and read [`RuntimeEvent`]s from the channel it
//! returns. `examples/embed.rs` shows it end to end.
//!
//! Files: `lifecycle.rs` (start, submit, resume, hosting a run, shutdown), `follow_up.rs`,
//! `pause.rs` (graceful shutdown), `cancel.rs`, `config.rs`, `event.rs` (what observers hear),
//! `error.rs` (one error type per operation), `observe.rs` (the metrics hook), `node/` (the actors' shared routing table, the store writer, one file per role),
//! `machine_actor.rs` (any machine as a ractor actor), `task_host.rs` (a specialist on a task of its
//! own), `remote.rs` (specialists hosted on
//! other nodes through a cluster layer: [`RemoteHosts`], [`RemoteInbox`]), `session_feed.rs` (a
//! specialist's session events and usage, for every host of one). The decisions of pause, cancel, resume and reopen are
//! [`crate::host::decide`]'s, and the store IO is [`crate::host::store`]'s, shared with the simulator.
//!
//! Bounds: runs in flight are capped by a semaphore ([`RuntimeConfig::runs_in_flight_max`],
//! [`Runtime::submit`] waits for a slot: backpressure at the edge); specialists by the supervisor
//! machine; a session's events by keel-harness's bounded channel; events to observers by a bounded
//! channel that drops (and counts) rather than stall a machine.

mod audit;
mod cancel;
pub mod clock;
mod config;
mod error;
mod escalation;
mod event;
mod follow_up;
mod harnesses;
mod lifecycle;
pub mod machine_actor;
mod node;
mod node_store;
mod observe;
mod pause;
mod policy;
mod remote;
pub mod scripted;
mod session_feed;
pub mod spans;
pub mod task_host;
#[cfg(test)]
mod test_support;

pub use audit::{AUDIT_ROWS_READ_MAX, AUDIT_WAIT_MS, AuditError, AuditWriter};
pub use cancel::TaskCancel;
pub use clock::{EntropyError, OsEntropy, wall_clock_ms};
pub use config::RuntimeConfig;
pub use error::{
    CancelError, FollowUpError, HostWriteError, ResumeError, SpawnError, StartError,
    StoreReadError, SubmitError, WaitError,
};
pub use escalation::{
    AnswerError, Answered, ApprovalDesk, ApprovalEnd, ApprovalError, Delivered,
    ESCALATION_WRITE_WAIT_MS,
};
pub use event::{PauseReason, RunOutcome, RuntimeEvent};
pub use follow_up::{FollowUpHandle, FollowUpOutcome, check_follow_up_message};
pub use harnesses::{
    ATTEMPT_ENV, HarnessSet, MCP_TOKEN_ENV, RUN_ID_ENV, SUBTASK_ID_ENV, ServiceFuture,
    SessionService, SubagentAnswer, SubagentEvent,
};
pub use lifecycle::RunHandle;
pub use machine_actor::{Deliver, Flow, MachineActor, MachineActorState, MachineRef, Role};
pub use node_store::{NodeStore, StoreOpener};
pub use observe::{RuntimeObserver, refusal_reason};
pub use pause::PauseSummary;
pub use policy::{
    EventAnswer, GateTimes, PolicyDecider, PolicyFuture, PolicyHost, ToolAnswer, ToolScope,
    guard_service,
};
pub use remote::{RemoteHosts, RemoteInbox};
pub use session_feed::{SessionEvents, SessionServices, UsageSeen};
pub use spans::SPAN_TARGET;
pub use task_host::{HostedEnd, Inbox, SpecialistInbox, host_on_task};

use keel_store::{RunId, Store};
use node::Node;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::Semaphore;

/// A coordinator node hosted in the caller's tokio runtime.
pub struct Runtime {
    node: Arc<Node>,
    slots: Arc<Semaphore>,
    /// Held while a run that no coordinator hosts is rebuilt ([`Runtime::resume`],
    /// [`Runtime::follow_up`]), so two calls cannot both rebuild one run.
    reopening: tokio::sync::Mutex<()>,
    /// The store writer thread, joined by [`Runtime::shutdown`].
    store_writer: std::thread::JoinHandle<()>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").finish_non_exhaustive()
    }
}

impl Runtime {
    /// Every run of the store that is not terminal (running when the node died, or paused).
    ///
    /// # Errors
    /// [`StoreReadError`].
    pub async fn open_runs(&self) -> Result<Vec<RunId>, StoreReadError> {
        self.node.read(crate::host::store::open_runs).await
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

    /// The store the node writes (its current handle: after a failed write, the one opened again).
    ///
    /// # Errors
    /// [`crate::host::HostError::Closed`] while a write failed and the store is not open again.
    pub fn store(&self) -> Result<Arc<Store>, crate::host::HostError> {
        self.node.store.current()
    }
}
