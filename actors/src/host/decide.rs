//! The host's decisions about a whole run, as pure functions over its rows: pause (a graceful
//! shutdown, SIGTERM), cancel of a run no process hosts, resume, and where a follow-up goes (join a
//! hosted run, or reopen an ended one). Each takes what the host knows (the run row, its tasks,
//! whether a coordinator of this host has the run, the time) and answers either a [`Refusal`] or what
//! to do, with the exact rows to write: the host stages those through the checkpoint machine (the
//! only writer) and then acts. Nothing here reads the store, the clock or a lock, so the simulator
//! draws the same decisions as interventions and the runtime executes them for real.
//!
//! | Host call | Function | Writes |
//! |---|---|---|
//! | pause (SIGTERM) | [`pause`] | open child tasks `Paused`, the run `Paused` |
//! | cancel, run not hosted | [`cancel_stored`] | open tasks `Cancelled`, the run `Cancelled` (a reopened run: its follow-ups, the run as it ended) |
//! | cancel, run hosted | none: `CoordinatorMsg::Cancel` to its coordinator | the coordinator's |
//! | cancel a task, run not hosted | [`cancel_task_stored`] | the step's newest task `Cancelled` |
//! | cancel a task, run hosted | none: `CoordinatorMsg::CancelTask` to its coordinator | the coordinator's |
//! | resume | [`resume`] | a paused run `Running` |
//! | follow-up | [`follow_up`] | joined: nothing; reopened: the run `Running` |
//! | a result resent to an ended run no coordinator hosts | [`answer_after_end`] | nothing |
//!
//! A host that draws these (the simulator's interventions) keeps the same order as the runtime:
//! for a pause, stop the specialists and let their last commits land first, then write
//! [`Marks::ops`] and drop the coordinators; for a resume or a reopen, write the marks, then hand the
//! rows to a fresh coordinator as `CoordinatorInput::Recovered` or `CoordinatorInput::Reopened`.

use crate::ids::AttemptId;
use crate::machine::Millis;
use crate::message::SpecialistMsg;
use crate::persist::PersistOp;
use crate::report::{FailureKind, StepOutcome, SubtaskFailure, TEXT_BYTES_MAX, bounded};
use keel_store::{Run, RunId, RunStatus, Task, TaskKind, TaskStatus};

/// Why a host refuses to act on a run: the run's state does not allow what was asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The run is already terminal: nothing to resume or cancel.
    #[error("run {run} is already {status:?}")]
    Terminal {
        /// The run.
        run: RunId,
        /// Its status.
        status: RunStatus,
    },
    /// The run is already hosted by this host: rebuilding it could run it twice.
    #[error("run {0} is already running here")]
    AlreadyRunning(RunId),
    /// The run is open (running or pending) in the store but no coordinator of this host has it:
    /// another process holds it, or the process that ran it died (resume it first). Rebuilding it
    /// here could run it twice, so nothing is done.
    #[error(
        "run {run} is {status:?} but not hosted here: another process holds it, or the process that ran it died (resume it first)"
    )]
    NotHostedHere {
        /// The run.
        run: RunId,
        /// Its stored status.
        status: RunStatus,
    },
    /// The task's step has already ended (or the task is not one of the run's).
    #[error("task {task} has already ended{}", status.map(|s| format!(" ({s:?})")).unwrap_or_default())]
    TaskEnded {
        /// The task (the newest of its re-dispatch chain).
        task: keel_store::TaskId,
        /// Its status, when the task exists.
        status: Option<TaskStatus>,
    },
    /// The run ended in a way a follow-up does not undo (cancelled, or over its budget).
    #[error("run {run} is {status:?}; a follow-up does not reopen a cancelled or over-budget run")]
    NotReopenable {
        /// The run.
        run: RunId,
        /// Its stored status.
        status: RunStatus,
    },
}

/// The rows a decision writes, in one host stage, and how many tasks they change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marks {
    /// The writes, task rows first and the run row last (one stage: all or nothing).
    pub ops: Vec<PersistOp>,
    /// Task rows the marks change (paused or cancelled).
    pub tasks: u32,
}

/// A pause (graceful shutdown) of a run hosted here: every open task below the root (pending,
/// admitted, running) becomes `Paused` and the run `Paused`, so a resume runs the interrupted work
/// again with resume preambles. `None` for a run that ended meanwhile (nothing to mark).
pub fn pause(run: &Run, tasks: &[Task], now: Millis) -> Option<Marks> {
    if run.status.is_terminal() {
        return None;
    }
    let mut ops = Vec::new();
    for task in tasks {
        let open = matches!(
            task.status,
            TaskStatus::Pending | TaskStatus::Admitted | TaskStatus::Running
        );
        if open && task.parent.is_some() {
            let mut task = task.clone();
            task.status = TaskStatus::Paused;
            task.updated_ms = now;
            ops.push(PersistOp::UpdateTask(task));
        }
    }
    let tasks = count(&ops);
    let mut row = run.clone();
    row.status = RunStatus::Paused;
    row.updated_ms = now;
    ops.push(PersistOp::UpdateRun(row));
    Some(Marks { ops, tasks })
}

/// A cancel of a run that no coordinator of this host has (a paused run, or one whose process
/// died): every task that is not terminal becomes `Cancelled` and the run `Cancelled`, with the
/// reason as its outcome. A run whose own work is all done (reopened for a follow-up, then paused)
/// keeps its outcome instead: only its open follow-ups are cancelled, and it ends `Completed` when
/// any task has a usable report (else `Failed`), as its coordinator would end it. A run hosted here
/// is cancelled by its coordinator instead (`CoordinatorMsg::Cancel`), which stops its sessions.
///
/// # Errors
/// [`Refusal::AlreadyRunning`] when `hosted`; [`Refusal::Terminal`] when the run has ended.
pub fn cancel_stored(
    hosted: bool,
    run: &Run,
    tasks: &[Task],
    reason: &str,
    now: Millis,
) -> Result<Marks, Refusal> {
    stored_and_open(hosted, run)?;
    let own_work_done = tasks
        .iter()
        .filter(|t| t.parent.is_some() && !of_follow_up(t, tasks))
        .all(|t| t.status.is_terminal());
    let reopened = own_work_done
        && tasks
            .iter()
            .any(|t| !t.status.is_terminal() && of_follow_up(t, tasks));
    let mut ops = Vec::new();
    for task in tasks {
        if task.status.is_terminal() || (reopened && task.parent.is_none()) {
            continue;
        }
        let mut task = task.clone();
        task.status = TaskStatus::Cancelled;
        if task.parent.is_some() {
            task.outcome = Some(cancelled_outcome(reason));
        }
        task.updated_ms = now;
        ops.push(PersistOp::UpdateTask(task));
    }
    let tasks_marked = count(&ops);
    let mut row = run.clone();
    if reopened {
        let usable = tasks
            .iter()
            .any(|t| matches!(t.status, TaskStatus::Complete | TaskStatus::Partial));
        row.status = if usable {
            RunStatus::Completed
        } else {
            RunStatus::Failed
        };
        if row.outcome.is_none() {
            row.outcome = Some(format!("follow-ups cancelled while not running: {reason}"));
        }
    } else {
        row.status = RunStatus::Cancelled;
        row.outcome = Some(format!("cancelled while not running: {reason}"));
    }
    row.updated_ms = now;
    ops.push(PersistOp::UpdateRun(row));
    Ok(Marks {
        ops,
        tasks: tasks_marked,
    })
}

/// A cancel of one task's step in a run that no coordinator of this host has (a paused run): the
/// newest task of its re-dispatch chain ends `Cancelled` with a cancelled outcome, which a resume
/// reads as the step's end (it never runs again); the run is left as it is. A run hosted here gets
/// `CoordinatorMsg::CancelTask` instead. The root task names the whole run: see [`cancel_stored`].
///
/// # Errors
/// [`Refusal::AlreadyRunning`] when `hosted`; [`Refusal::Terminal`] when the run has ended;
/// [`Refusal::TaskEnded`] when the step's task has ended (or `task` is not one of `tasks`).
pub fn cancel_task_stored(
    hosted: bool,
    run: &Run,
    tasks: &[Task],
    task: keel_store::TaskId,
    reason: &str,
    now: Millis,
) -> Result<Marks, Refusal> {
    stored_and_open(hosted, run)?;
    let Some(first) = tasks.iter().find(|t| t.id == task) else {
        return Err(Refusal::TaskEnded { task, status: None });
    };
    let mut last = first;
    // Bounded by the number of tasks: each step moves to a newer task.
    for _ in 0..tasks.len() {
        match tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Redispatch && t.parent == Some(last.id))
            .max_by_key(|t| t.id)
        {
            Some(next) => last = next,
            None => break,
        }
    }
    if last.status.is_terminal() {
        return Err(Refusal::TaskEnded {
            task: last.id,
            status: Some(last.status),
        });
    }
    let mut row = last.clone();
    row.status = TaskStatus::Cancelled;
    row.outcome = Some(cancelled_outcome(reason));
    row.updated_ms = now;
    Ok(Marks {
        ops: vec![PersistOp::UpdateTask(row)],
        tasks: 1,
    })
}

/// Whether `task` belongs to a follow-up: a follow-up task, or a re-dispatch whose chain starts at
/// one.
fn of_follow_up(task: &Task, tasks: &[Task]) -> bool {
    let mut current = task;
    // Bounded by the number of tasks: a re-dispatch's parent is an older task.
    for _ in 0..=tasks.len() {
        match current.kind {
            TaskKind::FollowUp => return true,
            TaskKind::Redispatch => {
                match current
                    .parent
                    .and_then(|p| tasks.iter().find(|t| t.id == p))
                {
                    Some(parent) => current = parent,
                    None => return false,
                }
            }
            _ => return false,
        }
    }
    false
}

/// The outcome a cancelled step's task keeps: a failure of kind cancelled (what the coordinator
/// writes for a step it cancels), so a recovery reads the step as ended.
fn cancelled_outcome(reason: &str) -> String {
    let outcome = StepOutcome::Failed(SubtaskFailure {
        kind: FailureKind::Cancelled,
        attempted: "cancelled while not running".into(),
        partial: Vec::new(),
        retryable: false,
        retry_after_ms: None,
        detail: bounded(
            format!("cancelled by an operator: {reason}"),
            TEXT_BYTES_MAX,
        ),
    });
    serde_json::to_string(&outcome).unwrap_or_else(|_| "{}".into())
}

/// A resume of a run from its rows (after a crash or a pause). `Ok(Some(marks))`: write them (the
/// paused run becomes `Running`) before its coordinator is rebuilt; `Ok(None)`: rebuild it as it is
/// (it was running when its process died).
///
/// # Errors
/// [`Refusal::AlreadyRunning`] when `hosted`; [`Refusal::Terminal`] when the run has ended.
pub fn resume(hosted: bool, run: &Run, now: Millis) -> Result<Option<Marks>, Refusal> {
    stored_and_open(hosted, run)?;
    Ok((run.status == RunStatus::Paused).then(|| mark_running(run, now)))
}

/// Where a follow-up on a run goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FollowUpRoute {
    /// The run is hosted here and still open: send the follow-up to its coordinator
    /// (`CoordinatorMsg::FollowUp`). Nothing is written by the host.
    Join,
    /// The run has ended (completed or failed) or is paused: write these marks (the run becomes
    /// `Running`), then rebuild its coordinator from the run's rows with the follow-up queued
    /// first (`CoordinatorInput::Reopened`).
    Reopen(Marks),
}

/// Where a follow-up on `run` goes, given whether a coordinator of this host has the run. A hosted
/// run whose row is already terminal is reopened, not joined: its coordinator is only stopping.
///
/// # Errors
/// [`Refusal::NotReopenable`] (cancelled, over budget); [`Refusal::NotHostedHere`] (open in the
/// store but no coordinator here has it).
pub fn follow_up(hosted: bool, run: &Run, now: Millis) -> Result<FollowUpRoute, Refusal> {
    if hosted && !run.status.is_terminal() {
        return Ok(FollowUpRoute::Join);
    }
    match run.status {
        RunStatus::Completed | RunStatus::Failed | RunStatus::Paused => {
            Ok(FollowUpRoute::Reopen(mark_running(run, now)))
        }
        status @ (RunStatus::Cancelled | RunStatus::BudgetExceeded) => {
            Err(Refusal::NotReopenable {
                run: run.id,
                status,
            })
        }
        status @ (RunStatus::Running | RunStatus::Pending) => Err(Refusal::NotHostedHere {
            run: run.id,
            status,
        }),
    }
}

/// The run row `Running` again, as one write.
/// What the stored-run decisions refuse first: a run a coordinator of this host has (it decides for
/// itself) and a run that has ended.
fn stored_and_open(hosted: bool, run: &Run) -> Result<(), Refusal> {
    if hosted {
        return Err(Refusal::AlreadyRunning(run.id));
    }
    if run.status.is_terminal() {
        return Err(Refusal::Terminal {
            run: run.id,
            status: run.status,
        });
    }
    Ok(())
}

fn mark_running(run: &Run, now: Millis) -> Marks {
    let mut row = run.clone();
    row.status = RunStatus::Running;
    row.updated_ms = now;
    Marks {
        ops: vec![PersistOp::UpdateRun(row)],
        tasks: 0,
    }
}

fn count(ops: &[PersistOp]) -> u32 {
    u32::try_from(ops.len()).unwrap_or(u32::MAX)
}

/// The answer to a specialist that resends its result to a run no coordinator of this host has:
/// `Some(Ack)` when the run has ended and `task` (the attempt's task row, if stored) holds this
/// attempt's report durably, `Some(Cancel)` for any other attempt of an ended run, `None` when the
/// run has not ended (its coordinator, once rebuilt, answers).
///
/// Why this exists: a run's end rides in the commit of its last results, so a crash after that
/// commit and before the acknowledgements leaves an ended run (which no restart rebuilds) with
/// durable results whose specialists still wait for their acknowledgement.
pub fn answer_after_end(
    run: &Run,
    task: Option<&Task>,
    attempt: AttemptId,
) -> Option<SpecialistMsg> {
    if !run.status.is_terminal() {
        return None;
    }
    let durable = task.is_some_and(|t| {
        t.id == attempt.task
            && t.attempt == attempt.attempt
            && matches!(
                t.status,
                TaskStatus::Complete | TaskStatus::Partial | TaskStatus::Blocked
            )
    });
    Some(if durable {
        SpecialistMsg::Ack
    } else {
        SpecialistMsg::Cancel {
            reason: "the run has ended".into(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_store::{Budget, TaskId, TaskKind};

    fn run(status: RunStatus) -> Run {
        Run {
            id: RunId(7),
            brief: "b".into(),
            plan: None,
            status,
            budget: Budget::default(),
            created_ms: 1,
            updated_ms: 1,
            config_snapshot: String::new(),
            outcome: None,
        }
    }

    fn task(id: u128, parent: Option<u128>, status: TaskStatus) -> Task {
        Task {
            id: TaskId(id),
            run_id: RunId(7),
            parent: parent.map(TaskId),
            depth: u8::from(parent.is_some()),
            kind: TaskKind::Root,
            brief: "t".into(),
            goal: "t".into(),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            model: None,
            observed: None,
            status,
            attempt: 1,
            idempotency_key: None,
            outcome: None,
            attachments: Vec::new(),
            progress_notes: Vec::new(),
            created_ms: 1,
            updated_ms: 1,
        }
    }

    fn statuses(marks: &Marks) -> Vec<String> {
        marks
            .ops
            .iter()
            .map(|op| match op {
                PersistOp::UpdateTask(t) => format!("task {} {:?}", t.id.0, t.status),
                PersistOp::UpdateRun(r) => format!("run {:?}", r.status),
                other => other.name().to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_pause_marks_open_child_tasks_and_the_run_paused() {
        let tasks = [
            task(1, None, TaskStatus::Running),
            task(2, Some(1), TaskStatus::Running),
            task(3, Some(1), TaskStatus::Complete),
            task(4, Some(1), TaskStatus::Pending),
            task(5, Some(1), TaskStatus::Admitted),
        ];
        let marks = pause(&run(RunStatus::Running), &tasks, 99).expect("an open run pauses");
        assert_eq!(
            statuses(&marks),
            [
                "task 2 Paused",
                "task 4 Paused",
                "task 5 Paused",
                "run Paused"
            ]
        );
        assert_eq!(marks.tasks, 3);
        assert!(marks.ops.iter().all(|op| match op {
            PersistOp::UpdateTask(t) => t.updated_ms == 99,
            PersistOp::UpdateRun(r) => r.updated_ms == 99,
            _ => false,
        }));
    }

    #[test]
    fn a_run_that_ended_is_not_paused() {
        for status in [
            RunStatus::Completed,
            RunStatus::Cancelled,
            RunStatus::Failed,
        ] {
            assert_eq!(pause(&run(status), &[], 5), None, "{status:?}");
        }
    }

    #[test]
    fn a_stored_cancel_marks_every_open_task_and_keeps_the_reason() {
        let tasks = [
            task(1, None, TaskStatus::Running),
            task(2, Some(1), TaskStatus::Paused),
            task(3, Some(1), TaskStatus::Complete),
        ];
        let marks = cancel_stored(false, &run(RunStatus::Paused), &tasks, "operator", 9)
            .expect("a paused run is cancelled");
        assert_eq!(
            statuses(&marks),
            ["task 1 Cancelled", "task 2 Cancelled", "run Cancelled"]
        );
        assert_eq!(marks.tasks, 2);
        let Some(PersistOp::UpdateRun(row)) = marks.ops.last() else {
            panic!("the run row is written last");
        };
        assert_eq!(
            row.outcome.as_deref(),
            Some("cancelled while not running: operator")
        );
    }

    #[test]
    fn a_stored_cancel_refuses_hosted_and_terminal_runs() {
        assert_eq!(
            cancel_stored(true, &run(RunStatus::Running), &[], "r", 1),
            Err(Refusal::AlreadyRunning(RunId(7)))
        );
        assert_eq!(
            cancel_stored(false, &run(RunStatus::Completed), &[], "r", 1),
            Err(Refusal::Terminal {
                run: RunId(7),
                status: RunStatus::Completed
            })
        );
    }

    #[test]
    fn a_resume_marks_only_a_paused_run_running() {
        let marks = resume(false, &run(RunStatus::Paused), 3)
            .expect("a paused run resumes")
            .expect("and is marked running");
        assert_eq!(statuses(&marks), ["run Running"]);
        assert_eq!(resume(false, &run(RunStatus::Running), 3), Ok(None));
        assert_eq!(
            resume(true, &run(RunStatus::Running), 3),
            Err(Refusal::AlreadyRunning(RunId(7)))
        );
        assert_eq!(
            resume(false, &run(RunStatus::Failed), 3),
            Err(Refusal::Terminal {
                run: RunId(7),
                status: RunStatus::Failed
            })
        );
    }

    #[test]
    fn a_follow_up_joins_an_open_hosted_run_and_reopens_an_ended_one() {
        assert_eq!(
            follow_up(true, &run(RunStatus::Running), 4),
            Ok(FollowUpRoute::Join)
        );
        // A hosted run whose end is durable is only stopping: reopened, not joined.
        let ended = [
            (RunStatus::Completed, true),
            (RunStatus::Completed, false),
            (RunStatus::Failed, true),
            (RunStatus::Failed, false),
            (RunStatus::Paused, false),
        ];
        for (status, hosted) in ended {
            let Ok(FollowUpRoute::Reopen(marks)) = follow_up(hosted, &run(status), 4) else {
                panic!("{status:?} (hosted: {hosted}) is reopened");
            };
            assert_eq!(statuses(&marks), ["run Running"]);
        }
    }

    #[test]
    fn a_follow_up_refuses_cancelled_over_budget_and_foreign_runs() {
        for status in [RunStatus::Cancelled, RunStatus::BudgetExceeded] {
            assert_eq!(
                follow_up(false, &run(status), 4),
                Err(Refusal::NotReopenable {
                    run: RunId(7),
                    status
                })
            );
        }
        for status in [RunStatus::Running, RunStatus::Pending] {
            assert_eq!(
                follow_up(false, &run(status), 4),
                Err(Refusal::NotHostedHere {
                    run: RunId(7),
                    status
                })
            );
        }
    }

    #[test]
    fn a_result_resent_to_an_ended_run_is_acked_only_when_its_report_is_durable() {
        let attempt = AttemptId {
            run: RunId(7),
            task: TaskId(9),
            attempt: 1,
        };
        let done = task(9, Some(1), TaskStatus::Complete);
        let ended = run(RunStatus::Completed);
        assert_eq!(
            answer_after_end(&ended, Some(&done), attempt),
            Some(SpecialistMsg::Ack)
        );
        // Another attempt of the task, a task not ended, no row: told to stop, never acked.
        let older = AttemptId {
            attempt: 2,
            ..attempt
        };
        assert!(matches!(
            answer_after_end(&ended, Some(&done), older),
            Some(SpecialistMsg::Cancel { .. })
        ));
        let open = task(9, Some(1), TaskStatus::Running);
        assert!(matches!(
            answer_after_end(&ended, Some(&open), attempt),
            Some(SpecialistMsg::Cancel { .. })
        ));
        assert!(matches!(
            answer_after_end(&ended, None, attempt),
            Some(SpecialistMsg::Cancel { .. })
        ));
        // A run still open is its coordinator's to answer.
        assert_eq!(
            answer_after_end(&run(RunStatus::Running), Some(&done), attempt),
            None
        );
    }
}
