//! The live view of a run: one line per specialist with its state, elapsed time and spend, drawn with
//! indicatif when stdout is a terminal, and plain lines (one per event) otherwise, so logs and tests
//! read the same story.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use keel_actors::AttemptId;
use keel_actors::runtime::RuntimeEvent;
use tokio::sync::mpsc;

/// Most characters of a progress line's message.
const LINE_CHARS_MAX: usize = 100;

fn short(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= LINE_CHARS_MAX {
        line
    } else {
        let cut: String = line.chars().take(LINE_CHARS_MAX - 1).collect();
        format!("{cut}…")
    }
}

fn micros(m: u64) -> String {
    format!("${}.{:04}", m / 1_000_000, (m % 1_000_000) / 100)
}

/// Draw events until the channel closes or a `Finished` event arrives; returns how many events it saw.
#[allow(clippy::disallowed_methods)] // Elapsed time on screen is wall-clock by nature.
pub(crate) async fn show(mut events: mpsc::Receiver<RuntimeEvent>, quiet: bool) -> u64 {
    let tty = std::io::stdout().is_terminal() && !quiet;
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template("{spinner} {prefix:<14} {elapsed:>4} {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let mut bars: BTreeMap<AttemptId, (ProgressBar, String, Instant, u64)> = BTreeMap::new();
    let mut seen = 0u64;
    let say = |line: String| {
        if !quiet {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
        }
    };
    while let Some(event) = events.recv().await {
        seen += 1;
        match event {
            RuntimeEvent::TaskStarted {
                attempt,
                step,
                agent,
                harness,
                model,
            } => {
                let what = format!(
                    "{agent} on {harness} ({model}), attempt {}",
                    attempt.attempt
                );
                if tty {
                    let bar = multi.add(ProgressBar::new_spinner());
                    bar.set_style(style.clone());
                    bar.set_prefix(step.clone());
                    bar.set_message(what);
                    bar.enable_steady_tick(Duration::from_millis(120));
                    bars.insert(attempt, (bar, step, Instant::now(), 0));
                } else {
                    say(format!("started  {step:<14} {what}"));
                    bars.insert(attempt, (ProgressBar::hidden(), step, Instant::now(), 0));
                }
            }
            RuntimeEvent::Progress { attempt, summary } => {
                if let Some((bar, _, _, spent)) = bars.get(&attempt)
                    && tty
                {
                    bar.set_message(format!("{} {}", micros(*spent), short(&summary)));
                }
            }
            RuntimeEvent::Spend {
                attempt,
                spent_micros,
            } => {
                if let Some(entry) = bars.get_mut(&attempt) {
                    entry.3 = spent_micros;
                }
            }
            RuntimeEvent::Report {
                attempt,
                step,
                report,
            } => {
                let line = format!("{:?}: {}", report.status, short(&report.summary));
                match bars.get(&attempt) {
                    Some((bar, _, started, spent)) if tty => bar.finish_with_message(format!(
                        "done in {:.1}s, {}: {line}",
                        started.elapsed().as_secs_f64(),
                        micros(*spent)
                    )),
                    _ => say(format!("report   {step:<14} {line}")),
                }
            }
            RuntimeEvent::TaskFailed {
                attempt,
                step,
                kind,
            } => match bars.get(&attempt) {
                Some((bar, _, _, _)) if tty => bar.abandon_with_message(format!("failed: {kind}")),
                _ => say(format!("failed   {step:<14} {kind}")),
            },
            RuntimeEvent::Escalation { reason, .. } => {
                say(format!("escalated: {}", short(&reason)));
            }
            RuntimeEvent::Finished(outcome) => {
                for (bar, _, _, _) in bars.values() {
                    if !bar.is_finished() {
                        bar.abandon();
                    }
                }
                if !tty {
                    say(format!("finished {:?}", outcome.status));
                }
                break;
            }
            _ => {}
        }
    }
    seen
}
