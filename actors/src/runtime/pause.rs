//! Pausing: a graceful shutdown asked by the host (SIGTERM: stop admitting, let sessions end, mark
//! the open runs paused), and the pause the node starts by itself when the disk holding its store
//! is full (every run stops at once; its waiters hear why).

use super::node::{Node, RunEnd, lock};
use super::{MachineRef, PauseReason, Runtime, RuntimeEvent, wall_clock_ms};
use crate::host::decide;
use crate::message::{CheckpointInput, SpecialistMsg};
use crate::runtime::task_host::SpecialistInbox;
use keel_store::RunId;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

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

/// How long a pause the node started by itself waits for a run's pause marks: with the disk full
/// they most likely fail too, and the run then stays `Running` in the store, which a resume takes
/// up as it would after a crash.
const HALT_MARKS_WAIT: Duration = Duration::from_secs(5);

/// Where the node stands with a pause it started by itself ([`Node::halt`]).
#[derive(Debug, Default)]
pub(crate) enum Halt {
    /// Not paused by itself.
    #[default]
    Running,
    /// Stopping its runs.
    Halting,
    /// Its runs are stopped; the next resume, submit or follow-up takes the node up again.
    Halted,
}

impl Runtime {
    /// Graceful shutdown: stop admitting, cancel every running session cooperatively (their log rows
    /// still reach the store), hold back unacknowledged results, then mark the open tasks and their
    /// runs paused through the checkpoint actor. Waits at most `wait` for sessions to end; the ones
    /// still running then are killed (they run again on resume all the same). The runtime hosts
    /// nothing more afterwards: shut it down.
    pub async fn pause(&self, wait: Duration) -> PauseSummary {
        let node = &self.node;
        node.shut.store(true, Ordering::Release);
        node.pausing.store(true, Ordering::Release);
        let deadline = tokio::time::Instant::now() + wait;
        let mut summary = PauseSummary {
            specialists_killed: node.stop_sessions(wait).await,
            ..PauseSummary::default()
        };
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
        node.freeze();
        let runs: Vec<RunId> = lock(&node.coordinators).keys().copied().collect();
        for run in runs {
            if let Some(paused) = node.mark_paused(run, Duration::from_secs(30)).await {
                summary.runs.push(run);
                summary.tasks_paused += paused;
            }
        }
        summary
    }
}

impl Node {
    /// Cancel every running session cooperatively, wait at most `wait` for the specialists to end,
    /// and kill the ones still alive (returning how many).
    async fn stop_sessions(&self, wait: Duration) -> u32 {
        let live: Vec<SpecialistInbox> = {
            let live = lock(&self.specialists);
            // Under the lock that hosting checks it under (the callers set it already; here it
            // is so by construction): a specialist is either listed here or never hosted.
            self.pausing.store(true, Ordering::Release);
            live.values().map(|s| s.inbox.clone()).collect()
        };
        for inbox in &live {
            inbox.send(crate::message::SpecialistInput::Msg(
                SpecialistMsg::Cancel {
                    reason: "the node is shutting down".into(),
                },
            ));
        }
        let deadline = tokio::time::Instant::now() + wait;
        while !lock(&self.specialists).is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut killed = 0;
        for (_, s) in lock(&self.specialists).iter() {
            s.inbox.kill();
            killed += 1;
        }
        killed
    }

    /// Mark `run`'s open tasks and the run paused through the checkpoint actor ([`decide::pause`]),
    /// waiting at most `wait`; the number of tasks marked, or `None` when nothing was written.
    async fn mark_paused(self: &Arc<Self>, run: RunId, wait: Duration) -> Option<u32> {
        // What the coordinator staged before the freeze is written first: the marks are made
        // from its last rows, and nothing of it lands after them.
        self.settle_stages(run, wait).await;
        let rows = match self.recover_run(run).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(%run, error = %e, "could not read the run to mark it paused");
                return None;
            }
        };
        let marks = decide::pause(&rows.run, &rows.tasks, wall_clock_ms())?;
        let paused = marks.tasks;
        match self.stage_host(run, marks.ops, wait).await {
            Ok(()) => Some(paused),
            Err(e) => {
                tracing::error!(%run, error = %e, "could not mark the run paused");
                None
            }
        }
    }

    /// Pause every run of the node at once, by the node's own decision (a commit found the disk
    /// full): no new specialists, no more input to the coordinators, every session cancelled, the
    /// pause marks tried, and each run's waiters answered with `reason`
    /// ([`super::WaitError::Paused`]). Called from the store writer thread; the work runs on the
    /// tokio runtime the node started on. A second call while one is under way does nothing.
    pub(crate) fn halt(self: &Arc<Self>, reason: PauseReason) {
        {
            let mut halt = lock(&self.halt);
            if !matches!(*halt, Halt::Running) {
                return;
            }
            *halt = Halt::Halting;
        }
        tracing::error!(%reason, "pausing every run of the node");
        self.pausing.store(true, Ordering::Release);
        self.freeze();
        let node = Arc::clone(self);
        self.tokio
            .spawn(async move { node.halt_runs(reason).await });
    }

    async fn halt_runs(self: Arc<Self>, reason: PauseReason) {
        let wait = Duration::from_millis(self.config.stop_grace_ms);
        self.stop_sessions(wait).await;
        let hosted: Vec<(RunId, MachineRef<crate::coordinator::Coordinator>)> =
            lock(&self.coordinators)
                .iter()
                .map(|(run, h)| (*run, h.coordinator.clone()))
                .collect();
        let mut ends = Vec::new();
        for (run, coordinator) in hosted {
            self.mark_paused(run, HALT_MARKS_WAIT).await;
            {
                let mut map = lock(&self.coordinators);
                if map
                    .get(&run)
                    .is_some_and(|h| h.coordinator.get_id() == coordinator.get_id())
                {
                    map.remove(&run);
                    lock(&self.run_spans).remove(&run);
                }
            }
            coordinator.stop(Some(format!("paused: {reason}")));
            ends.push((run, lock(&self.waiters).remove(&run).unwrap_or_default()));
        }
        // Nothing decided before the pause may be written after the runs are taken up again.
        self.to_checkpoint(CheckpointInput::Abandon {
            reason: format!("the node paused: {reason}"),
        });
        let deadline = tokio::time::Instant::now() + HALT_MARKS_WAIT;
        while self.commits_in_flight.load(Ordering::Acquire) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Halted before anyone hears of it, so a waiter that resumes at once finds the node ready.
        *lock(&self.halt) = Halt::Halted;
        for (run, waiters) in ends {
            self.emit(RuntimeEvent::Paused {
                run,
                reason: reason.clone(),
            });
            for w in waiters {
                let _ = w.tx.send(RunEnd::Paused(reason.clone()));
            }
        }
    }

    /// Take the node up again after a pause it started by itself (every run of it stopped), so a
    /// resume, submit or follow-up runs normally; a pause the host asked for ([`Runtime::pause`])
    /// stays.
    pub(crate) fn lift_halt(&self) {
        let mut halt = lock(&self.halt);
        if matches!(*halt, Halt::Halted) && !self.shut.load(Ordering::Acquire) {
            *halt = Halt::Running;
            self.frozen.store(false, Ordering::Release);
            self.pausing.store(false, Ordering::Release);
        }
    }
}
