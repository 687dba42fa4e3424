//! The runtime's tracing spans: one per run, one per task attempt (a child of its run's), entered
//! around every machine step and effect of that run or attempt, and carried into the tasks the runtime
//! spawns for them (context loads, group commits). Every log line emitted inside
//! names its run and task, in the human format (`run{run=..}:task{task=..}:`) and in JSON (`spans`).
//!
//! Cost: a span is created once per run and once per attempt; each step clones and enters it (a
//! reference count and a thread-local push in the subscriber). With no subscriber installed (an
//! embedding host that does not log, `keel bench`) creating one is a disabled check and entering it
//! does nothing.

use crate::ids::AttemptId;
use crate::message::{CoordinatorInput, CoordinatorMsg};
use keel_harness::HarnessKind;
use keel_store::RunId;
use tracing::Span;

/// The target of every span the runtime opens. A subscriber that filters events by level can still
/// enable these spans by target, so a warning inside a task names the task even when info lines are
/// off (`keel` does exactly that).
pub const SPAN_TARGET: &str = "keel::span";

/// The span of one run. `mode` is `plan` (a fixed plan) or `lead` (a lead agent delegates);
/// `resumed` says the coordinator was rebuilt from the store (a recovery, or a reopening for a
/// follow-up).
pub(crate) fn run_span(run: RunId, first: &CoordinatorInput) -> Span {
    let (mode, resumed) = match first {
        CoordinatorInput::Msg(CoordinatorMsg::Accept(spec)) => (mode_name(&spec.mode), false),
        CoordinatorInput::Recovered(rows) | CoordinatorInput::Reopened { rows, .. } => {
            return rebuilt_run_span(&rows.run);
        }
        _ => ("unknown", false),
    };
    tracing::info_span!(target: SPAN_TARGET, "run", run = %run, mode, resumed)
}

/// The span of a run whose coordinator is rebuilt from its stored row (`resumed`).
pub(crate) fn rebuilt_run_span(row: &keel_store::Run) -> Span {
    let mode = if row.plan.is_some() { "plan" } else { "lead" };
    tracing::info_span!(target: SPAN_TARGET, "run", run = %row.id, mode, resumed = true)
}

/// The span of one task attempt, a child of its run's span (`Span::none()` when the run has none).
pub(crate) fn task_span(
    parent: &Span,
    attempt: AttemptId,
    agent: &str,
    harness: HarnessKind,
) -> Span {
    tracing::info_span!(
        target: SPAN_TARGET,
        parent: parent,
        "task",
        task = %attempt.task,
        attempt = attempt.attempt,
        agent,
        harness = %harness,
    )
}

/// The span of a group commit that holds several runs' writes (one run's commit uses its run span).
pub(crate) fn commit_span(runs: usize) -> Span {
    tracing::info_span!(target: SPAN_TARGET, "commit", runs)
}

fn mode_name(mode: &crate::message::RunMode) -> &'static str {
    match mode {
        crate::message::RunMode::Plan(_) => "plan",
        crate::message::RunMode::Lead { .. } => "lead",
    }
}
