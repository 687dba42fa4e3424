//! The store writer: the one thread that hosts the checkpoint writer machine and executes its group
//! commits. A failed commit poisons the store handle (redb refuses it from then on), so the next
//! commit opens the store again first; a full disk pauses the node's runs at once (see
//! [`Node::halt`]) instead of retrying writes that cannot succeed.
//!
//! The machine lives on this thread, not on an actor of the async runtime: a commit's outcome goes
//! straight back into it and the next commit starts at once, where an actor's commit waited for
//! the outcome to cross to a runtime worker, wait its turn there, and the next batch to cross
//! back (docs/PERFORMANCE.md, "The checkpoint writer on the store writer thread").

use super::{Node, ToCoordinator};
use crate::checkpoint::CheckpointWriter;
use crate::effect::Effect;
use crate::host::{self, HostError};
use crate::machine::Machine;
use crate::message::CheckpointInput;
use crate::persist::{CommitBatch, PersistOp};
use crate::runtime::PauseReason;
use crate::runtime::clock::{MonotonicMillis, OsEntropy};
use crate::runtime::{RuntimeEvent, spans};
use keel_store::CommitError;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::{Arc, Weak};

/// What reaches the store writer thread.
pub(crate) enum WriterInput {
    /// An input of the checkpoint writer it hosts.
    Checkpoint(CheckpointInput),
    /// The node shuts down: the thread ends after the commit under way, and the inputs queued
    /// behind this one are dropped (their coordinators are stopped already).
    Shutdown,
}

/// Most inputs taken from the queue while a commit's outcome waits to go into the machine (see
/// [`store_writer`]): a bound, so a flood of inputs cannot hold an outcome back for ever.
const INPUTS_BEFORE_OUTCOME_MAX: usize = 4096;

/// The store writer thread's body: hosts the checkpoint writer `machine` with its stream `rng`,
/// executes its effects, and runs each commit it asks for on this thread (redb's commit blocks on
/// fsync). A commit's outcome goes into the machine once the inputs that arrived during the commit
/// have (at most [`INPUTS_BEFORE_OUTCOME_MAX`] of them), so their stages wait in the machine's queue
/// and all go into the next commit. It holds the node weakly and ends when the node is gone, on
/// [`WriterInput::Shutdown`], or when the machine panics (logged; the node then writes nothing
/// more and its runs' stages go unanswered, as when its actor died before this thread hosted it).
pub(crate) fn store_writer(
    node: Weak<Node>,
    inputs: Receiver<WriterInput>,
    machine: CheckpointWriter,
    rng: OsEntropy,
) {
    let mut hosted = Hosted {
        machine,
        clock: MonotonicMillis::default(),
        rng,
    };
    let mut outcomes: VecDeque<CheckpointInput> = VecDeque::new();
    let mut taken_before_outcome = 0usize;
    let mut commits = Vec::new();
    loop {
        let next = if outcomes.is_empty() {
            inputs.recv().ok()
        } else if taken_before_outcome >= INPUTS_BEFORE_OUTCOME_MAX {
            None
        } else {
            match inputs.try_recv() {
                Ok(input) => Some(input),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return,
            }
        };
        let input = match next {
            Some(WriterInput::Checkpoint(input)) => {
                taken_before_outcome += 1;
                input
            }
            Some(WriterInput::Shutdown) => return,
            None => match outcomes.pop_front() {
                Some(outcome) => {
                    taken_before_outcome = 0;
                    outcome
                }
                // The queue is closed (the node is gone).
                None => return,
            },
        };
        let Some(node) = node.upgrade() else {
            return;
        };
        let stepped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hosted.step(&node, input, &mut commits)
        }));
        if stepped.is_err() {
            tracing::error!("the checkpoint writer panicked; this node writes nothing more");
            return;
        }
        // The machine keeps at most one commit in flight: this is at most one.
        for batch in commits.drain(..) {
            outcomes.push_back(node.commit_now(batch));
        }
    }
}

/// The checkpoint writer machine with its injected clock and stream, as an actor's state held them.
struct Hosted {
    machine: CheckpointWriter,
    clock: MonotonicMillis,
    rng: OsEntropy,
}

impl Hosted {
    /// One input through the machine; its effects executed, its commits left in `commits`.
    fn step(&mut self, node: &Arc<Node>, input: CheckpointInput, commits: &mut Vec<CommitBatch>) {
        let now = self.clock.now();
        let mut effects = Vec::new();
        self.machine.handle(input, now, &mut self.rng, &mut effects);
        node.execute_checkpoint(effects, commits);
    }
}

impl Node {
    /// Hand the checkpoint writer an input. Once the store writer thread is gone (shut down, or its
    /// machine panicked) the input is dropped, as a message to a dead actor was: every stage's
    /// sender waits with a bound or is answered by the store after a restart.
    pub(crate) fn to_checkpoint(&self, input: CheckpointInput) {
        let sent = self
            .checkpoint
            .get()
            .is_some_and(|tx| tx.send(WriterInput::Checkpoint(input)).is_ok());
        if !sent {
            tracing::debug!("an input for the checkpoint writer after its thread ended, dropped");
        }
    }

    /// Execute the checkpoint writer's effects on the store writer thread: its answers to
    /// coordinators (consecutive ones to one run as one input) and to the host, its timers; its
    /// commits are left in `commits` for the thread to run.
    fn execute_checkpoint(self: &Arc<Self>, effects: Vec<Effect>, commits: &mut Vec<CommitBatch>) {
        let mut to_coordinator = ToCoordinator::default();
        for effect in effects {
            let Some(effect) = to_coordinator.gather(self, effect) else {
                continue;
            };
            match effect {
                Effect::Persist(batch) => commits.push(batch),
                Effect::SetTimer { key, at } => self.set_timer(key, at),
                Effect::CancelTimer { key } => self.timers.cancel(key),
                Effect::Send(envelope) => self.route(envelope),
                Effect::Emit(event) => self.lifecycle(event, None),
                Effect::SpawnSpecialist(_) | Effect::StopSpecialist { .. } => {
                    tracing::error!("the checkpoint writer asked for a specialist; ignored");
                }
            }
        }
        to_coordinator.flush(self);
    }

    /// Execute one group commit on the calling thread (the store writer's): the checkpoint
    /// writer's input that answers it.
    fn commit_now(self: &Arc<Self>, batch: CommitBatch) -> CheckpointInput {
        self.commits_in_flight.fetch_add(1, Ordering::AcqRel);
        self.commits_total.fetch_add(1, Ordering::Relaxed);
        // One run's commit runs in that run's span; a commit shared by several runs in its own.
        let first = batch.stages.first().map(|s| s.run);
        let span = match first {
            Some(run) if batch.stages.iter().all(|s| s.run == run) => self.run_span(run),
            _ => spans::commit_span(batch.stages.len()),
        };
        let _entered = span.enter();
        // Every op, superseded or not: an escalation is never superseded, and `all_ops` is a plain
        // walk where `ops` first indexes the replaced rows.
        let escalations: Vec<RuntimeEvent> = batch
            .all_ops()
            .filter_map(|(run, op)| match op {
                PersistOp::AppendEscalation(e) => Some(RuntimeEvent::Escalation {
                    run,
                    task: e.task_id,
                    reason: format!("escalation {}: {}", e.id, e.diagnosis),
                }),
                _ => None,
            })
            .collect();
        let id = batch.id;
        // The observer's commit latency is wall-clock time by nature.
        #[allow(clippy::disallowed_methods)]
        let began = std::time::Instant::now();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            host::store::commit(&*self.store.get()?, &batch)
        }))
        .unwrap_or_else(|_| Err(HostError::Closed("the commit panicked".into())));
        let result = result.map_err(|e| {
            if poisons(&e) {
                self.store.poison();
            }
            if let HostError::Commit(CommitError::DiskFull(detail)) = &e {
                self.halt(PauseReason::DiskFull {
                    detail: detail.to_string(),
                });
            }
            (e.to_string(), e.refused_run())
        });
        if let Some(observer) = &self.config.observer {
            observer.commit_ended(began.elapsed(), result.is_ok());
        }
        let input = match result {
            Ok(()) => {
                for e in escalations {
                    self.emit(e);
                }
                CheckpointInput::Committed(id)
            }
            Err((error, Some(run))) => {
                tracing::warn!(%error, %run, "group commit refused a run's write");
                CheckpointInput::Refused { id, run, error }
            }
            Err((error, None)) => {
                tracing::warn!(%error, "group commit failed");
                CheckpointInput::CommitFailed { id, error }
            }
        };
        self.commits_in_flight.fetch_sub(1, Ordering::AcqRel);
        input
    }
}

/// Whether a failed commit leaves the store handle refused by redb (an IO failure, latched), so
/// the next use must open it again. A refused batch (a limit, a bad item, a staging error) does
/// not: nothing reached the disk.
fn poisons(e: &HostError) -> bool {
    match e {
        HostError::Commit(c) => !matches!(
            c,
            CommitError::BatchTooLarge(_)
                | CommitError::Item { .. }
                | CommitError::ReadOnly
                // Opened again, the store would replay the failed commit's record, and the retry
                // would apply it twice: only a new process may open it.
                | CommitError::JournalBroken
        ),
        HostError::Stage { .. } | HostError::Refused { .. } | HostError::TooManyTasks(_) => false,
        _ => true,
    }
}
