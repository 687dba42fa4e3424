//! The store writer: the one thread that executes the checkpoint machine's group commits and
//! answers the checkpoint actor. A failed commit poisons the store handle (redb refuses it from
//! then on), so the next commit opens the store again first; a full disk pauses the node's runs
//! at once (see [`Node::halt`]) instead of retrying writes that cannot succeed.

use super::Node;
use crate::host::{self, HostError};
use crate::message::CheckpointInput;
use crate::persist::{CommitBatch, PersistOp};
use crate::runtime::PauseReason;
use crate::runtime::{RuntimeEvent, spans};
use keel_store::CommitError;
use std::sync::Arc;
use std::sync::atomic::Ordering;

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
    /// One group commit, handed to the store writer thread (redb's commit blocks on fsync); its
    /// completion goes back to the checkpoint machine, which keeps at most one commit in flight.
    pub(crate) fn persist(self: &Arc<Self>, batch: CommitBatch) {
        self.commits_in_flight.fetch_add(1, Ordering::AcqRel);
        self.commits_total.fetch_add(1, Ordering::Relaxed);
        // One run's commit runs in that run's span; a commit shared by several runs in its own.
        let first = batch.stages.first().map(|s| s.run);
        let span = match first {
            Some(run) if batch.stages.iter().all(|s| s.run == run) => self.run_span(run),
            _ => spans::commit_span(batch.stages.len()),
        };
        let id = batch.id;
        let sent = match &*super::lock(&self.writer) {
            Some(tx) => tx.send((batch, span)).is_ok(),
            None => false,
        };
        if !sent {
            self.committed(
                id,
                Err(("the store writer thread is gone".into(), None)),
                Vec::new(),
            );
        }
    }

    /// Execute one group commit on the calling thread (the store writer's) and answer the
    /// checkpoint actor.
    fn commit_now(self: &Arc<Self>, batch: CommitBatch) {
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
        self.committed(id, result, escalations);
    }

    fn committed(
        &self,
        id: crate::persist::CommitId,
        result: Result<(), (String, Option<keel_store::RunId>)>,
        escalations: Vec<RuntimeEvent>,
    ) {
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
        if let Some(c) = self.checkpoint.get() {
            let _ = c.send_message(crate::runtime::Deliver(input));
        }
        self.commits_in_flight.fetch_sub(1, Ordering::AcqRel);
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
