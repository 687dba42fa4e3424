//! `keel status [RUN]`: one run's state (the latest run's when none is named), then every other run
//! that is not finished, newest first, each with the command that continues it: a paused run with
//! `keel resume`, a run with escalated tasks with the tasks to look at, a running one with how to
//! stop it (or resume it if its process died). What a user coming back to a home needs first.

use std::collections::BTreeMap;
use std::io::Write;

use keel_actors::host::store::all_tasks;
use keel_store::{Run, RunId, RunStatus, Store, Task, TaskKind, TaskStatus};
use serde_json::json;

use crate::run::summary::{NoRuns, one_line};
use crate::stdout::outln;

/// Most open runs `keel status` lists (found among all runs, however many have finished).
const STATUS_OPEN_RUNS_MAX: u32 = 1_000;
/// Most characters of one line.
const LINE_CHARS_MAX: usize = 160;
/// Most characters of a brief in the list of open runs.
const BRIEF_CHARS_MAX: usize = 60;

fn short(text: &str, chars_max: usize) -> String {
    // Scrubbed before the cut, so a cut cannot leave half of a secret (issue 16).
    one_line(&crate::redact::text(text), chars_max)
}

/// What a user does next with a run that is not finished, as commands.
fn next_step(run: &Run, escalated: &[&Task]) -> String {
    let id = run.id;
    let mut step = match run.status {
        RunStatus::Paused => format!("continue with `keel resume {id}`"),
        RunStatus::Running | RunStatus::Pending => format!(
            "stop with `keel cancel {id}`; if the process running it died, continue with `keel resume {id}`"
        ),
        _ => String::new(),
    };
    if !escalated.is_empty() {
        let tasks: Vec<String> = escalated
            .iter()
            .map(|t| format!("`keel show {}`", t.id))
            .collect();
        if !step.is_empty() {
            step.push_str("; ");
        }
        step.push_str(&format!(
            "{} escalated {} a human must look at: {}",
            escalated.len(),
            if escalated.len() == 1 {
                "task"
            } else {
                "tasks"
            },
            tasks.join(", ")
        ));
    }
    step
}

fn escalated(tasks: &[Task]) -> Vec<&Task> {
    tasks
        .iter()
        .filter(|t| t.status == TaskStatus::Escalated)
        .collect()
}

/// `keel status [RUN]`.
///
/// # Errors
/// [`NoRuns`] in a store without runs; a failed read.
pub(crate) fn status(store: &Store, run: Option<RunId>, json: bool) -> anyhow::Result<()> {
    let catalog = store.catalog();
    let named = run.is_some();
    let row = match run {
        Some(run) => catalog.run(run)?,
        None => catalog.latest_run()?.ok_or(NoRuns)?,
    };
    let tasks = all_tasks(&store.run(row.id))?;
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for t in tasks.iter().filter(|t| t.kind != TaskKind::Root) {
        *counts.entry(format!("{:?}", t.status)).or_default() += 1;
    }
    let own_escalated = escalated(&tasks);
    let own_next = next_step(&row, &own_escalated);
    // Every open run but this one, newest first, with its escalated tasks.
    let mut others: Vec<(Run, Vec<Task>)> = Vec::new();
    if !named {
        let mut open = catalog.open_runs(STATUS_OPEN_RUNS_MAX)?.items;
        open.retain(|r| r.id != row.id);
        open.reverse();
        for r in open {
            let tasks = all_tasks(&store.run(r.id))?;
            others.push((r, tasks));
        }
    }
    if json {
        let mut value = json!({
            "run": row.id.to_string(),
            "status": format!("{:?}", row.status),
            "tasks": counts,
            "brief": row.brief,
            "escalated_tasks": own_escalated.iter().map(|t| t.id.to_string()).collect::<Vec<_>>(),
            "next": if own_next.is_empty() { None } else { Some(&own_next) },
            "outcome": row.outcome.as_deref().map(crate::outcome::sentence),
        });
        if !others.is_empty() {
            value["other_open_runs"] = others
                .iter()
                .map(|(r, tasks)| {
                    let esc = escalated(tasks);
                    json!({
                        "run": r.id.to_string(),
                        "status": format!("{:?}", r.status),
                        "brief": r.brief,
                        "escalated_tasks": esc.iter().map(|t| t.id.to_string()).collect::<Vec<_>>(),
                        "next": next_step(r, &esc),
                    })
                })
                .collect();
        }
        crate::redact::json(&mut value);
        outln!("{value}")?;
        return Ok(());
    }
    let mut out = crate::stdout::lock();
    writeln!(out, "run {}: {:?}", row.id, row.status)?;
    writeln!(out, "brief: {}", short(&row.brief, LINE_CHARS_MAX))?;
    let line: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
    writeln!(out, "tasks: {}", line.join(", "))?;
    if row.status.is_terminal()
        && let Some(outcome) = &row.outcome
    {
        writeln!(
            out,
            "outcome: {}",
            short(&crate::outcome::sentence(outcome), LINE_CHARS_MAX)
        )?;
    }
    if !own_next.is_empty() {
        writeln!(out, "{own_next}")?;
    }
    if others.is_empty() {
        if !named {
            writeln!(out, "no other open runs")?;
        }
        return Ok(());
    }
    writeln!(out, "other open runs, newest first:")?;
    for (r, tasks) in &others {
        writeln!(
            out,
            "  {}  {:?}  {}",
            r.id,
            r.status,
            short(&r.brief, BRIEF_CHARS_MAX)
        )?;
        writeln!(out, "    {}", next_step(r, &escalated(tasks)))?;
    }
    Ok(())
}
