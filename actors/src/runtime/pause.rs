//! A graceful shutdown (SIGTERM): stop admitting, let sessions end, and mark the open runs paused.

use super::node::lock;
use super::{Deliver, HostRef, Runtime, wall_clock_ms};
use crate::host::decide::{self};
use crate::ids::AttemptId;
use crate::message::SpecialistMsg;
use keel_store::RunId;
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

impl Runtime {
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
}
