//! What a run left behind, told from the store (the durable truth, not the event stream): outcome,
//! coverage, what failed and why, and where the synthesis is.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use keel_actors::host::store::all_tasks;
use keel_actors::runtime::{FollowUpOutcome, RunOutcome};
use keel_actors::{CoverageStatus, StepOutcome, Synthesis};
use keel_store::{Run, RunId, Store, Task, TaskStatus};
use serde_json::json;

use crate::home::Home;
use crate::run::progress::{Totals, count, micros, usage_text};
use crate::stdout::outln;

/// Most characters of one line of the summary.
const LINE_CHARS_MAX: usize = 160;

fn short(text: &str) -> String {
    // Scrubbed before the cut, so a cut cannot leave half of a secret (issue 16).
    one_line(&crate::redact::text(text), LINE_CHARS_MAX)
}

/// `text` as one line of at most `chars_max` characters (whitespace collapsed, an ellipsis where it
/// was cut): the live view and the summary show notes, reports and outcomes this way.
pub(crate) fn one_line(text: &str, chars_max: usize) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= chars_max {
        line
    } else {
        let cut: String = line.chars().take(chars_max.saturating_sub(1)).collect();
        format!("{cut}…")
    }
}

/// Where a run's synthesis is written as Markdown.
pub(crate) fn synthesis_path(home: &Home, run: RunId) -> PathBuf {
    home.dir().join("synthesis").join(format!("{run}.md"))
}

fn markdown(run: &Run, synthesis: &Synthesis) -> String {
    let mut md = format!(
        "# Synthesis of run {}\n\nBrief: {}\n\n{}\n\n## Coverage\n\n",
        run.id, run.brief, synthesis.summary
    );
    if synthesis.partial_coverage {
        md.push_str("**Partial coverage**: some steps are not complete.\n\n");
    }
    for c in &synthesis.coverage {
        md.push_str(&format!(
            "- {}: {}{}\n",
            c.step,
            c.status,
            c.note
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        ));
    }
    md.push_str("\n## Findings\n\n");
    for f in &synthesis.findings {
        md.push_str(&format!(
            "- [{}] {} (source: {}, confidence {}‰)\n",
            f.step, f.finding.claim, f.finding.source, f.finding.confidence_permille
        ));
    }
    if !synthesis.gaps.is_empty() {
        md.push_str("\n## Gaps\n\n");
        for g in &synthesis.gaps {
            md.push_str(&format!("- {g}\n"));
        }
    }
    md
}

/// The failed and escalated tasks: id, why as a sentence, and the stored outcome as JSON (the
/// structure `--json` keeps; `null` when none was recorded or it is not JSON).
fn failures(tasks: &[Task]) -> Vec<(String, String, serde_json::Value)> {
    tasks
        .iter()
        .filter(|t| matches!(t.status, TaskStatus::Failed | TaskStatus::Escalated))
        .map(|t| {
            let stored = t.outcome.as_deref().unwrap_or("no outcome recorded");
            (
                t.id.to_string(),
                short(&crate::outcome::sentence(stored)),
                serde_json::from_str(stored).unwrap_or(serde_json::Value::Null),
            )
        })
        .collect()
}

/// A run's usage as the live view added it up from the runtime's events (the store keeps each
/// session's usage in its log rows, not as token fields of a task).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    /// The totals, if the view ended with the run.
    pub(crate) totals: Option<Totals>,
    /// Events the runtime dropped on a full channel: when not zero the totals may be low.
    pub(crate) events_dropped: u64,
}

impl Usage {
    /// The summary's usage line.
    fn line(&self) -> String {
        match &self.totals {
            None => "usage: unknown (the live view did not end with the run)".to_owned(),
            Some(t) => {
                let mut line = format!(
                    "usage: {} across {} specialist attempts",
                    usage_text(&t.tokens, t.spent_micros),
                    count(u64::from(t.attempts))
                );
                if self.events_dropped > 0 {
                    line.push_str(&format!(
                        " (at least; {} progress events were dropped)",
                        count(self.events_dropped)
                    ));
                }
                line
            }
        }
    }

    fn json(&self) -> serde_json::Value {
        match &self.totals {
            None => serde_json::Value::Null,
            Some(t) => json!({
                "input_tokens": t.tokens.input_tokens,
                "output_tokens": t.tokens.output_tokens,
                "cache_read_tokens": t.tokens.cache_read_tokens,
                "cache_write_tokens": t.tokens.cache_write_tokens,
                "spent_micros": t.spent_micros,
                "spent": micros(t.spent_micros),
                "attempts": t.attempts,
                "events_dropped": self.events_dropped,
            }),
        }
    }
}

/// Write a run's synthesis as Markdown, when it has one; returns where.
fn write_synthesis(
    home: &Home,
    store: &Store,
    run: RunId,
    synthesis: Option<&Synthesis>,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(s) = synthesis else {
        return Ok(None);
    };
    let row = store.catalog().run(run)?;
    let path = synthesis_path(home, run);
    if let Some(dir) = path.parent() {
        crate::private::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // The brief is the user's, kept as given in the store: scrubbed on its way into the file.
    crate::private::write_file(&path, crate::redact::text(&markdown(&row, s)).as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(Some(path))
}

/// Print the end of a run (and write its synthesis file when it has one).
pub(crate) fn print(
    home: &Home,
    store: &Store,
    run: RunId,
    outcome: &RunOutcome,
    usage: &Usage,
    json: bool,
) -> anyhow::Result<()> {
    let tasks = all_tasks(&store.run(run))?;
    let synthesis: Option<Synthesis> = serde_json::from_str(&outcome.outcome).ok();
    let synthesis_file = write_synthesis(home, store, run, synthesis.as_ref())?;
    let failed = failures(&tasks);
    if json {
        let mut value = json!({
            "run": run.to_string(),
            "status": format!("{:?}", outcome.status),
            "coverage": synthesis.as_ref().map(|s| &s.coverage),
            "partial_coverage": synthesis.as_ref().map(|s| s.partial_coverage),
            "failed": failed.iter().map(|(t, why, outcome)| json!({"task": t, "why": why, "outcome": outcome})).collect::<Vec<_>>(),
            "synthesis_file": synthesis_file,
            "usage": usage.json(),
            "outcome": if synthesis.is_some() { None } else { Some(&outcome.outcome) },
        });
        crate::redact::json(&mut value);
        outln!("{value}")?;
        return Ok(());
    }
    let mut out = crate::stdout::lock();
    writeln!(out, "\nrun {run}: {:?}", outcome.status)?;
    match &synthesis {
        Some(s) => {
            let complete = s
                .coverage
                .iter()
                .filter(|c| c.status == CoverageStatus::Complete)
                .count();
            writeln!(
                out,
                "coverage: {complete} of {} steps complete{}",
                s.coverage.len(),
                if s.partial_coverage {
                    " (partial coverage)"
                } else {
                    ""
                }
            )?;
            for c in &s.coverage {
                writeln!(
                    out,
                    "  {:<14} {}{}",
                    c.step,
                    c.status,
                    c.note
                        .as_deref()
                        .map(|n| format!(": {}", short(n)))
                        .unwrap_or_default()
                )?;
            }
            writeln!(out, "summary: {}", short(&s.summary))?;
        }
        None => writeln!(out, "outcome: {}", short(&outcome.outcome))?,
    }
    if failed.is_empty() {
        writeln!(out, "failures: none")?;
    } else {
        writeln!(out, "failures:")?;
        for (task, why, _) in &failed {
            writeln!(out, "  {task}: {why}")?;
        }
    }
    writeln!(out, "{}", usage.line())?;
    if let Some(p) = &synthesis_file {
        writeln!(out, "synthesis: {}", p.display())?;
    }
    writeln!(
        out,
        "explore: keel tree {run}   keel logs TASK   keel status {run}"
    )?;
    Ok(())
}

/// The end of a follow-up: the run's summary (it ended again), then the follow-up's own lines: its
/// task, status, agent and model, and what it answered.
pub(crate) fn follow_up(
    home: &Home,
    store: &Store,
    outcome: &FollowUpOutcome,
    usage: &Usage,
    json: bool,
) -> anyhow::Result<()> {
    let last = &outcome.last;
    let answer = match last
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<StepOutcome>(o).ok())
    {
        Some(StepOutcome::Report(r)) => r.summary,
        Some(StepOutcome::Failed(f)) => format!("failed ({}): {}", f.kind.name(), f.detail),
        Some(StepOutcome::Skipped { reason }) => format!("skipped: {reason}"),
        None => "no outcome recorded".into(),
    };
    if json {
        let synthesis: Option<Synthesis> = serde_json::from_str(&outcome.run.outcome).ok();
        let synthesis_file = write_synthesis(home, store, outcome.run.run, synthesis.as_ref())?;
        let mut value = json!({
            "run": outcome.run.run.to_string(),
            "run_status": format!("{:?}", outcome.run.status),
            "synthesis_file": synthesis_file,
            "task": outcome.task.id.to_string(),
            "parent": outcome.task.parent.map(|p| p.to_string()),
            "last_task": last.id.to_string(),
            "status": format!("{:?}", last.status),
            "agent": last.assignee,
            "model": last.model,
            "answer": answer,
            "usage": usage.json(),
        });
        crate::redact::json(&mut value);
        outln!("{value}")?;
        return Ok(());
    }
    print(home, store, outcome.run.run, &outcome.run, usage, false)?;
    let mut out = crate::stdout::lock();
    let parent = outcome
        .task
        .parent
        .map_or_else(|| "none".to_string(), |p| p.to_string());
    writeln!(
        out,
        "follow-up {}: {:?} (agent {}, model {}, parent {parent})",
        outcome.task.id,
        last.status,
        last.assignee.as_deref().unwrap_or("?"),
        last.model.as_deref().unwrap_or("?"),
    )?;
    if last.id != outcome.task.id {
        writeln!(out, "  re-dispatched; last task {}", last.id)?;
    }
    writeln!(out, "answer: {}", short(&answer))?;
    writeln!(
        out,
        "explore: keel logs {}   keel context {}",
        last.id, last.id
    )?;
    Ok(())
}

/// A command that shows the latest run when none is named found no run at all.
#[derive(Debug, thiserror::Error)]
#[error("no runs in this store yet: start one with `keel run \"BRIEF\"`")]
pub(crate) struct NoRuns;

#[cfg(test)]
mod tests {
    use super::*;
    use keel_harness::TokenCounts;

    fn totals() -> Totals {
        Totals {
            tokens: TokenCounts {
                input_tokens: 12_000,
                output_tokens: 345,
                ..TokenCounts::default()
            },
            spent_micros: 37_035,
            attempts: 3,
        }
    }

    #[test]
    fn the_usage_line_gives_the_run_totals() {
        let usage = Usage {
            totals: Some(totals()),
            events_dropped: 0,
        };
        assert_eq!(
            usage.line(),
            "usage: 12,000 in / 345 out tokens, $0.0370 across 3 specialist attempts"
        );
        let v = usage.json();
        assert_eq!(v["input_tokens"], 12_000);
        assert_eq!(v["output_tokens"], 345);
        assert_eq!(v["spent_micros"], 37_035);
    }

    #[test]
    fn dropped_events_and_a_missing_view_are_said() {
        let usage = Usage {
            totals: Some(totals()),
            events_dropped: 2,
        };
        assert!(
            usage
                .line()
                .ends_with("(at least; 2 progress events were dropped)")
        );
        let none = Usage::default();
        assert!(none.line().contains("unknown"), "{}", none.line());
        assert!(none.json().is_null());
    }
}
