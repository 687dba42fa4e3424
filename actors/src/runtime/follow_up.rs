//! Follow-ups: a new task on a thread of a run, joining the run when this runtime hosts it or
//! reopening it from the store when it has ended, and waiting for its outcome.

use super::node::{Node, RunEnd, lock};
use super::{
    Deliver, FollowUpError, RunHandle, RunOutcome, Runtime, StoreReadError, WaitError,
    wall_clock_ms,
};
use crate::host::decide::{self, FollowUpRoute, Refusal};
use crate::ids::mint_task_id;
use crate::message::{CoordinatorInput, CoordinatorMsg, FOLLOW_UP_BYTES_MAX, FollowUpRequest};
use keel_store::{ReadError, RunId, Task, TaskId, TaskKind, TaskStatus};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// A follow-up on its way: the run it joined, the id its task takes, and a way to wait for it.
pub struct FollowUpHandle {
    run: RunId,
    task: TaskId,
    parent: TaskId,
    reopened: bool,
    done: oneshot::Receiver<RunEnd>,
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
    /// [`WaitError::FollowUpRefused`] when the run ended without creating the follow-up's task;
    /// [`WaitError::Stopped`] when the runtime stopped or paused first; [`WaitError::Read`].
    ///
    /// # Cancel safety
    /// Not cancel safe: dropping the future drops the handle (the follow-up goes on).
    pub async fn finished(self) -> Result<FollowUpOutcome, WaitError> {
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
                r = &mut done => match r {
                    Ok(RunEnd::Finished(outcome)) => break outcome,
                    Ok(RunEnd::Paused(reason)) => return Err(WaitError::Paused { run, reason }),
                    Err(_) => return Err(WaitError::Stopped(run)),
                },
                () = tokio::time::sleep(FOLLOW_UP_POLL) => {
                    if lock(&node.coordinators).contains_key(&run) {
                        continue;
                    }
                    let row = node
                        .read(move |store| Ok(store.catalog().run(run)?))
                        .await?;
                    if !row.status.is_terminal() {
                        return Err(WaitError::Stopped(run));
                    }
                    break RunOutcome {
                        run,
                        status: row.status,
                        outcome: row.outcome.unwrap_or_default(),
                    };
                }
            }
        };
        let tasks = node
            .read(move |store| crate::host::store::all_tasks(&store.run(run)))
            .await?;
        let Some(first) = tasks.iter().find(|t| t.id == task).cloned() else {
            return Err(WaitError::FollowUpRefused { run, parent });
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

/// The checks a follow-up message passes before anything starts (not blank, at most
/// [`FOLLOW_UP_BYTES_MAX`] bytes), public so a caller that hands the follow-up to another process
/// (`keel follow-up --detach`) can refuse bad input at once.
///
/// # Errors
/// [`FollowUpError::EmptyMessage`] or [`FollowUpError::MessageTooLarge`].
pub fn check_follow_up_message(message: &str) -> Result<(), FollowUpError> {
    if message.trim().is_empty() {
        return Err(FollowUpError::EmptyMessage);
    }
    if message.len() > FOLLOW_UP_BYTES_MAX {
        return Err(FollowUpError::MessageTooLarge {
            bytes: message.len(),
            max: FOLLOW_UP_BYTES_MAX,
        });
    }
    Ok(())
}

impl Runtime {
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
    /// by its coordinator (the handle then says [`WaitError::FollowUpRefused`]); asked again,
    /// it reopens the run.
    ///
    /// # Errors
    /// [`FollowUpError::EmptyMessage`], [`FollowUpError::MessageTooLarge`],
    /// [`FollowUpError::UnknownAgent`], [`FollowUpError::UnknownTask`],
    /// [`FollowUpError::Refused`] (not hosted here, not reopenable), [`FollowUpError::Read`],
    /// [`FollowUpError::Write`], [`FollowUpError::Spawn`].
    pub async fn follow_up(
        &self,
        task: TaskId,
        message: &str,
        agent: Option<&str>,
    ) -> Result<FollowUpHandle, FollowUpError> {
        check_follow_up_message(message)?;
        self.node.lift_halt();
        let agents = &self.node.config.supervisor.agents;
        if let Some(name) = agent
            && !agents.iter().any(|a| a.name == name)
        {
            return Err(FollowUpError::UnknownAgent {
                name: name.to_owned(),
                known: agents.iter().map(|a| a.name.clone()).collect(),
            });
        }
        let row = self
            .node
            .read(move |store| Ok(store.catalog().task(task)))
            .await?;
        let run = match row {
            Ok(t) => t.run_id,
            Err(ReadError::NotFound { .. }) => return Err(FollowUpError::UnknownTask(task)),
            Err(e) => return Err(StoreReadError::Store(e.into()).into()),
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
                    CoordinatorMsg::FollowUp(request),
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
}
