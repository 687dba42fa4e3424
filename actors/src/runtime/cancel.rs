//! Cancelling: a run hosted here (through its coordinator), a run no process hosts (through the
//! store), one task's step (either way), and killing one attempt the hard way.

use super::node::lock;
use super::{CancelError, Deliver, Runtime, StoreReadError, wall_clock_ms};
use crate::host::decide::{self, Refusal};
use crate::ids::AttemptId;
use crate::message::{CoordinatorInput, CoordinatorMsg};
use keel_store::{ReadError, RunId, TaskId};

/// What [`Runtime::cancel_task`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskCancel {
    /// The run is hosted here: its coordinator was told (it ends the step, or the run for its
    /// root task, durably, in its own time).
    Sent {
        /// The task's run.
        run: RunId,
    },
    /// The run is hosted nowhere: its rows were marked in the store.
    Stored {
        /// The task's run.
        run: RunId,
        /// Tasks marked cancelled.
        tasks: u32,
    },
}

impl Runtime {
    /// Cancel a run hosted here (idempotent; ignored once it is terminal). Returns whether the run
    /// is hosted here.
    pub fn cancel(&self, run: RunId, reason: &str) -> bool {
        let Some(c) = self.node.coordinator(run) else {
            return false;
        };
        c.send_message(Deliver(CoordinatorInput::Msg(CoordinatorMsg::Cancel {
            reason: reason.to_owned(),
        })))
        .is_ok()
    }

    /// Kill one attempt's task the hard way, as a crashed worker would die: no cancel, no report.
    /// The supervisor hears of its end and its machine decides (restart, reroute, escalate).
    /// Returns whether the attempt was alive here.
    pub fn kill_attempt(&self, attempt: AttemptId) -> bool {
        let Some(inbox) = lock(&self.node.specialists)
            .get(&attempt)
            .map(|s| s.inbox.clone())
        else {
            return false;
        };
        inbox.kill();
        true
    }

    /// Cancel one task's step (`keel cancel TASK`; a follow-up, most often): for a run hosted here,
    /// its coordinator stops the step's attempt and ends its task `Cancelled`, and the run goes on
    /// (a reopened run ends again with a synthesis once nothing else is open); for a run no process
    /// hosts, the step's newest task is marked `Cancelled` in the store
    /// ([`decide::cancel_task_stored`]). The run's root task names the whole run, as
    /// [`Runtime::cancel`] and [`Runtime::cancel_stored`] do it.
    ///
    /// # Errors
    /// [`CancelError::UnknownTask`], [`CancelError::Read`], [`CancelError::Refused`] (the run or
    /// the step has ended), [`CancelError::Write`].
    pub async fn cancel_task(&self, task: TaskId, reason: &str) -> Result<TaskCancel, CancelError> {
        let row = self
            .node
            .read(move |store| Ok(store.catalog().task(task)))
            .await?;
        let row = match row {
            Ok(row) => row,
            Err(ReadError::NotFound { .. }) => return Err(CancelError::UnknownTask(task)),
            Err(e) => return Err(StoreReadError::Store(e.into()).into()),
        };
        let run = row.run_id;
        if row.parent.is_none() {
            if self.cancel(run, reason) {
                return Ok(TaskCancel::Sent { run });
            }
            let tasks = self.cancel_stored(run, reason).await?;
            return Ok(TaskCancel::Stored { run, tasks });
        }
        if let Some(c) = self.node.coordinator(run) {
            let sent = c
                .send_message(Deliver(CoordinatorInput::Msg(CoordinatorMsg::CancelTask {
                    task,
                    reason: reason.to_owned(),
                })))
                .is_ok();
            if sent {
                return Ok(TaskCancel::Sent { run });
            }
        }
        let mut rows = self.recover_run(run).await?;
        let hosted = lock(&self.node.coordinators).contains_key(&run);
        let marks = decide::cancel_task_stored(
            hosted,
            &rows.run,
            &rows.tasks,
            task,
            reason,
            wall_clock_ms(),
        )?;
        let tasks = marks.tasks;
        self.write_marks(&mut rows.run, marks).await?;
        Ok(TaskCancel::Stored { run, tasks })
    }

    /// Mark a run that no process hosts as cancelled (its row and open tasks), through the
    /// checkpoint actor.
    ///
    /// # Errors
    /// [`CancelError::Read`], [`CancelError::Refused`] (terminal, already running),
    /// [`CancelError::Write`].
    pub async fn cancel_stored(&self, run: RunId, reason: &str) -> Result<u32, CancelError> {
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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.
    use super::super::test_support::{start, workspace};
    use super::*;
    use crate::{RunMode, runtime::scripted};
    use keel_store::RunStatus;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancelled_runs_specialist_task_ends() {
        let (_dir, work, store) = workspace();
        let rt = start(&store, &work).await;
        // Its session waits (at most a minute) for a file nobody writes: only a cancel ends it.
        let wait = format!(
            "for n in $(seq 1 1200); do [ -e {} ] && break; sleep 0.05; done; echo late",
            work.join("never").display()
        );
        let plan = scripted::fan_out_plan(1, |_| wait.clone()).unwrap();
        let handle = rt
            .submit("cancel".into(), RunMode::Plan(plan), None, "test".into())
            .await
            .unwrap();
        let run = handle.id();
        let mut inbox = None;
        for _ in 0..3_000 {
            inbox = lock(&rt.node.specialists)
                .values()
                .find(|s| s.cancel.is_some())
                .map(|s| s.inbox.clone());
            if inbox.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let inbox = inbox.expect("a specialist with a running session");
        assert!(rt.cancel(run, "no longer needed"));
        let outcome = handle.finished().await.unwrap();
        assert_eq!(outcome.status, RunStatus::Cancelled, "{}", outcome.outcome);
        for _ in 0..3_000 {
            if inbox.ended() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            inbox.ended(),
            "the cancelled specialist's task is still running"
        );
        assert!(lock(&rt.node.specialists).is_empty());
        rt.shutdown().await;
    }
}
