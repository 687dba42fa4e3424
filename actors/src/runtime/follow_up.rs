//! Follow-ups: a new task on a thread of a run, joining the run when this runtime hosts it or
//! reopening it from the store when it has ended, and waiting for its outcome.

use super::node::{Node, RunEnd, lock};
use super::{
    Deliver, FollowUpError, RunHandle, RunOutcome, Runtime, StoreReadError, WaitError,
    wall_clock_ms,
};
use crate::coordinator::Snapshot;
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
    /// The hosting of the run the follow-up went to (see [`super::node::HostedRun::generation`]).
    generation: u64,
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

/// Most a follow-up waits to be durable before its id is handed out (a commit takes milliseconds;
/// this bounds a store that stopped committing).
const DURABLE_WAIT: Duration = Duration::from_secs(30);
/// How often that wait looks at the store.
const DURABLE_POLL: Duration = Duration::from_millis(10);

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

    /// Wait until the follow-up is durable: its task row is in the store, or its step is in the
    /// run's checkpoint (queued behind an earlier follow-up of its thread, with the task id it
    /// will take), so a crash after its id is handed out loses nothing (`keel resume` runs it).
    /// Also returns once the run's coordinator is gone (it refused the follow-up, or it stopped:
    /// [`FollowUpHandle::finished`] tells which). [`Runtime::follow_up`] returns only after it.
    ///
    /// # Errors
    /// [`FollowUpError::Read`] when the rows cannot be read, [`FollowUpError::NotDurable`] when
    /// the follow-up is not durable within [`DURABLE_WAIT`] (a store that stopped committing).
    async fn durable(&self) -> Result<(), FollowUpError> {
        let (run, task) = (self.run, self.task);
        let deadline = tokio::time::Instant::now() + DURABLE_WAIT;
        loop {
            let found = self
                .node
                .read(move |store| {
                    let scope = store.run(run);
                    match scope.task(task) {
                        Ok(_) => return Ok(true),
                        Err(ReadError::NotFound { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                    let queued = scope
                        .checkpoint()?
                        .and_then(|c| serde_json::from_str::<Snapshot>(&c.state).ok())
                        .is_some_and(|s| s.steps.iter().any(|step| step.preset == Some(task)));
                    Ok(queued)
                })
                .await?;
            if found || !self.node.hosts(run, self.generation) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(FollowUpError::NotDurable {
                    run,
                    task,
                    waited: DURABLE_WAIT,
                });
            }
            tokio::time::sleep(DURABLE_POLL).await;
        }
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
            generation,
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
                    if node.hosts(run, generation) {
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
        follow_up_outcome(&node, task, parent, outcome).await
    }
}

/// How the follow-up `task` (asked on `parent`) ended in a run that ended with `outcome`, from its
/// rows.
async fn follow_up_outcome(
    node: &Arc<Node>,
    task: TaskId,
    parent: TaskId,
    outcome: RunOutcome,
) -> Result<FollowUpOutcome, WaitError> {
    let run = outcome.run;
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
    /// How the follow-up `task` (asked on `parent`) ended, read from the store once its run has
    /// ended with `outcome`: what [`FollowUpHandle::finished`] answers, for a host that stopped
    /// waiting on the handle (a signal arrived as the run ended).
    ///
    /// # Errors
    /// [`WaitError::FollowUpRefused`] when the run has no such task; [`WaitError::Read`].
    pub async fn follow_up_outcome(
        &self,
        task: TaskId,
        parent: TaskId,
        outcome: RunOutcome,
    ) -> Result<FollowUpOutcome, WaitError> {
        follow_up_outcome(&self.node, task, parent, outcome).await
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
        let handle = match self.route_follow_up(run, preset, &request, None).await? {
            Routed::Handle(handle) => handle,
            Routed::NeedsSlot => {
                // Waited for without the reopen lock (see `route_follow_up`), then decided again.
                let slot = self.slot().await?;
                match self
                    .route_follow_up(run, preset, &request, Some(slot))
                    .await?
                {
                    Routed::Handle(handle) => handle,
                    Routed::NeedsSlot => {
                        return Err(FollowUpError::Spawn(super::SpawnError {
                            what: "coordinator",
                            detail: "no run slot for the reopened run".into(),
                        }));
                    }
                }
            }
        };
        handle.durable().await?;
        Ok(handle)
    }

    /// Decide where `request` goes, under the reopen lock, and carry it out: join the hosted run,
    /// or reopen the run in `slot`. A reopen without a slot answers [`Routed::NeedsSlot`] and
    /// holds nothing: the caller waits for a slot without the lock and asks again.
    async fn route_follow_up(
        &self,
        run: RunId,
        preset: TaskId,
        request: &FollowUpRequest,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<Routed, FollowUpError> {
        let _reopening = self.reopening.lock().await;
        let mut rows = self.recover_run(run).await?;
        let mut hosted = self.node.hosted(run);
        if let Some(stopping) = &hosted
            && rows.run.status.is_terminal()
        {
            // Its coordinator stops in the step that made the run's end durable: let it go before
            // the run is reopened, so its last messages reach it rather than the new coordinator.
            self.node
                .wait_gone(run, stopping.generation, STOPPING_WAIT)
                .await;
            hosted = self.node.hosted(run);
        }
        // A coordinator still in the table after the wait is reopened over, not joined: the
        // decision reopens a run whose row is terminal.
        let route = decide::follow_up(hosted.is_some(), &rows.run, wall_clock_ms())?;
        let marks = match (route, hosted) {
            (FollowUpRoute::Reopen(marks), _) => marks,
            (FollowUpRoute::Join, Some(hosted)) => {
                let done = self.node.wait_for(run, hosted.generation);
                // A coordinator that stopped meanwhile drops the message; the handle's wait notices.
                let _ = hosted
                    .coordinator
                    .send_message(Deliver(CoordinatorInput::Msg(CoordinatorMsg::FollowUp(
                        request.clone(),
                    ))));
                return Ok(Routed::Handle(self.follow_up_handle(
                    run,
                    preset,
                    request,
                    false,
                    hosted.generation,
                    done,
                    None,
                )));
            }
            (FollowUpRoute::Join, None) => {
                // The decision joins only a hosted run; kept as a refusal rather than a panic.
                let status = rows.run.status;
                return Err(Refusal::NotHostedHere { run, status }.into());
            }
        };
        let Some(slot) = slot else {
            return Ok(Routed::NeedsSlot);
        };
        // Started before the marks are written, so a coordinator that cannot start leaves the
        // run as it was (ended) rather than marked running with nothing hosting it.
        let spawned = self
            .spawn_coordinator(run, super::spans::rebuilt_run_span(&rows.run))
            .await?;
        if let Err(e) = self.write_marks(&mut rows.run, marks).await {
            spawned.abandon();
            return Err(e.into());
        }
        let generation = spawned.generation();
        let RunHandle {
            done, _slot: slot, ..
        } = self.begin(
            spawned,
            CoordinatorInput::Reopened {
                rows: Box::new(rows),
                follow_up: request.clone(),
            },
            slot,
        );
        Ok(Routed::Handle(self.follow_up_handle(
            run,
            preset,
            request,
            true,
            generation,
            done,
            Some(slot),
        )))
    }

    #[allow(clippy::too_many_arguments)] // The handle's fields, each from a different step.
    fn follow_up_handle(
        &self,
        run: RunId,
        preset: TaskId,
        request: &FollowUpRequest,
        reopened: bool,
        generation: u64,
        done: oneshot::Receiver<RunEnd>,
        slot: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> FollowUpHandle {
        FollowUpHandle {
            run,
            task: preset,
            parent: request.parent,
            reopened,
            generation,
            done,
            node: Arc::clone(&self.node),
            _slot: slot,
        }
    }
}

/// What one routing of a follow-up came to.
enum Routed {
    /// It joined or reopened the run.
    Handle(FollowUpHandle),
    /// It must reopen the run and needs a run slot first.
    NeedsSlot,
}

/// How long a follow-up waits for the coordinator of a run whose end is durable to stop before it
/// reopens the run (it stops in the same step, so this is a bound, not a delay).
const STOPPING_WAIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.
    use super::super::test_support::{gated_follow_up, root_of, start, workspace};
    use super::*;
    use crate::message::LifecycleEvent;
    use crate::{RunMode, runtime::scripted};
    use keel_store::RunStatus;
    use std::sync::atomic::Ordering;

    async fn completed_run(rt: &Runtime, store: &keel_store::Store) -> (RunId, TaskId) {
        let plan = scripted::fan_out_plan(1, |_| "echo first".to_string()).unwrap();
        let handle = rt
            .submit("a thread".into(), RunMode::Plan(plan), None, "test".into())
            .await
            .unwrap();
        let run = handle.id();
        let outcome = handle.finished().await.unwrap();
        assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
        (run, root_of(store, run).await)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reopen_whose_coordinator_cannot_start_leaves_the_run_as_it_ended() {
        let (_dir, work, store) = workspace();
        let rt = start(&store, &work).await;
        let (run, root) = completed_run(&rt, &store).await;
        let gate = work.join("gate");
        std::fs::write(&gate, "open").unwrap();
        let message = gated_follow_up(&gate, "later");

        rt.node
            .fail_coordinator_spawns
            .store(true, Ordering::Release);
        let e = rt.follow_up(root, &message, None).await.unwrap_err();
        assert!(matches!(e, FollowUpError::Spawn(_)), "{e}");
        // Not marked running with nothing hosting it: still as it ended, and reopenable.
        assert_eq!(
            store.catalog().run(run).unwrap().status,
            RunStatus::Completed
        );
        let done = rt
            .follow_up(root, &message, None)
            .await
            .unwrap()
            .finished()
            .await
            .unwrap();
        assert!(done.completed(), "{done:?}");
        rt.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_end_of_an_earlier_hosting_does_not_wake_the_reopened_runs_waiters() {
        let (_dir, work, store) = workspace();
        let rt = start(&store, &work).await;
        let (run, root) = completed_run(&rt, &store).await;
        let earlier = rt.node.next_generation.load(Ordering::Acquire) - 1;
        let gate = work.join("gate");
        let mut handle = rt
            .follow_up(root, &gated_follow_up(&gate, "later"), None)
            .await
            .unwrap();
        assert!(handle.reopened());
        // The first coordinator's end, late (as when it was still stopping when the run was
        // reopened): it must not answer the reopened run's waiter.
        let late = RunOutcome {
            run,
            status: RunStatus::Completed,
            outcome: "the first end".into(),
        };
        rt.node
            .lifecycle(LifecycleEvent::RunFinished(late), Some(earlier));
        assert!(
            matches!(
                handle.done.try_recv(),
                Err(oneshot::error::TryRecvError::Empty)
            ),
            "the reopened run's waiter was woken by the earlier hosting's end"
        );
        std::fs::write(&gate, "open").unwrap();
        let done = handle.finished().await.unwrap();
        assert!(done.completed(), "{done:?}");
        assert_ne!(done.run.outcome, "the first end");
        rt.shutdown().await;
    }
}
