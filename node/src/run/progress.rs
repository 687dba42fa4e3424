//! The live view of a run: one line per specialist with its state, elapsed time, tokens and spend,
//! drawn with indicatif when stdout is a terminal, and plain lines (one per event) otherwise, so logs
//! and tests read the same story. Log lines (stderr) are printed above the bars through
//! [`AboveBars`], never through them.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_actors::AttemptId;
use keel_actors::runtime::RuntimeEvent;
use keel_harness::TokenCounts;
use tokio::sync::mpsc;

/// Most characters of a progress line's message.
const LINE_CHARS_MAX: usize = 100;

/// The bars of this process. One per process, so the log writer can suspend them around a line.
fn screen() -> &'static MultiProgress {
    static SCREEN: OnceLock<MultiProgress> = OnceLock::new();
    SCREEN.get_or_init(|| MultiProgress::with_draw_target(ProgressDrawTarget::stdout()))
}

/// Set while bars are on the terminal: only then does a log line need to clear and redraw them.
static DRAWING: AtomicBool = AtomicBool::new(false);

/// A `tracing` writer to stderr that prints each line above the live view's bars (indicatif's
/// `suspend`: the bars are cleared, the line printed, the bars redrawn), so a log line never lands
/// inside a bar. Without bars it writes straight to stderr.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct AboveBars;

/// The writer [`AboveBars`] hands to the formatter for one log line.
#[derive(Debug)]
pub(crate) struct AboveBarsWriter;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for AboveBars {
    type Writer = AboveBarsWriter;

    fn make_writer(&'a self) -> Self::Writer {
        AboveBarsWriter
    }
}

impl Write for AboveBarsWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter writes a whole line with one `write_all`, so one line is one suspension, and
        // the line is scrubbed whole (a tool input in a debug line included; issue 16).
        let line = crate::redact::log_line(buf);
        let print = || std::io::stderr().lock().write_all(&line);
        if DRAWING.load(Ordering::Acquire) {
            screen().suspend(print)?;
        } else {
            print()?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn short(text: &str) -> String {
    // Scrubbed before the cut, so a cut cannot leave half of a secret (issue 16).
    super::summary::one_line(&crate::redact::text(text), LINE_CHARS_MAX)
}

/// Below this many micro-dollars (one cent) a spend is shown to the micro-dollar, so a small session
/// never reads as free.
const CENT_MICROS: u64 = 10_000;

/// Micro-dollars as dollars: exact below a cent (`$0.000090`), else with four decimals (truncated: a
/// spend is never shown larger than it is).
pub(crate) fn micros(m: u64) -> String {
    if m < CENT_MICROS {
        format!("$0.{m:06}")
    } else {
        format!("${}.{:04}", m / 1_000_000, (m % 1_000_000) / 100)
    }
}

/// A count with thousands separators: `1234567` is `1,234,567`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One specialist's (or a run's) usage as one phrase: `1,234 in / 56 out tokens, $0.003870`, with the
/// prompt-cache tokens named when there are any (`1,234 in (+8,000 cached) / 56 out tokens, ...`).
pub(crate) fn usage_text(tokens: &TokenCounts, spent_micros: u64) -> String {
    let cached = tokens
        .cache_read_tokens
        .saturating_add(tokens.cache_write_tokens);
    let cached = if cached > 0 {
        format!(" (+{} cached)", count(cached))
    } else {
        String::new()
    };
    format!(
        "{} in{cached} / {} out tokens, {}",
        count(tokens.input_tokens),
        count(tokens.output_tokens),
        micros(spent_micros)
    )
}

/// What the view saw of a run's usage: the latest usage of every attempt, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Tokens of every attempt's session.
    pub(crate) tokens: TokenCounts,
    /// Spend of every attempt, in micro-dollars.
    pub(crate) spent_micros: u64,
    /// Attempts that started.
    pub(crate) attempts: u32,
}

impl Totals {
    /// Add one attempt's usage (saturating).
    pub(crate) fn add(&mut self, tokens: &TokenCounts, spent_micros: u64) {
        let t = &mut self.tokens;
        t.input_tokens = t.input_tokens.saturating_add(tokens.input_tokens);
        t.output_tokens = t.output_tokens.saturating_add(tokens.output_tokens);
        t.cache_read_tokens = t.cache_read_tokens.saturating_add(tokens.cache_read_tokens);
        t.cache_write_tokens = t
            .cache_write_tokens
            .saturating_add(tokens.cache_write_tokens);
        self.spent_micros = self.spent_micros.saturating_add(spent_micros);
    }
}

/// One specialist as the view knows it.
struct Line {
    bar: ProgressBar,
    step: String,
    /// A report or a failure was shown for it.
    closed: bool,
    started: Instant,
    tokens: TokenCounts,
    spent_micros: u64,
    last: String,
}

impl Line {
    fn usage(&self) -> String {
        usage_text(&self.tokens, self.spent_micros)
    }
}

/// Draw events until the channel closes or a `Finished` event arrives; returns the run's usage as
/// the events told it.
#[allow(clippy::disallowed_methods)] // Elapsed time on screen is wall-clock by nature.
pub(crate) async fn show(mut events: mpsc::Receiver<RuntimeEvent>, quiet: bool) -> Totals {
    let tty = std::io::stdout().is_terminal() && !quiet;
    let multi = screen();
    let style = ProgressStyle::with_template("{spinner} {prefix:<14} {elapsed:>4} {wide_msg}")
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let mut lines: BTreeMap<AttemptId, Line> = BTreeMap::new();
    let say = |line: String| {
        if !quiet {
            let mut out = crate::stdout::lock();
            let _ = writeln!(out, "{line}");
        }
    };
    DRAWING.store(tty, Ordering::Release);
    while let Some(event) = events.recv().await {
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
                let bar = if tty {
                    let bar = multi.add(ProgressBar::new_spinner());
                    bar.set_style(style.clone());
                    bar.set_prefix(step.clone());
                    bar.set_message(what.clone());
                    bar.enable_steady_tick(Duration::from_millis(120));
                    bar
                } else {
                    say(format!("started  {step:<14} {what}"));
                    ProgressBar::hidden()
                };
                lines.insert(
                    attempt,
                    Line {
                        bar,
                        step,
                        closed: false,
                        started: Instant::now(),
                        tokens: TokenCounts::default(),
                        spent_micros: 0,
                        last: what,
                    },
                );
            }
            RuntimeEvent::Progress { attempt, summary } => {
                if let Some(line) = lines.get_mut(&attempt) {
                    line.last = short(&summary);
                    if tty {
                        line.bar
                            .set_message(format!("{}: {}", line.usage(), line.last));
                    }
                }
            }
            RuntimeEvent::Usage {
                attempt,
                tokens,
                spent_micros,
            } => {
                if let Some(line) = lines.get_mut(&attempt) {
                    line.tokens = tokens;
                    line.spent_micros = spent_micros;
                    if tty {
                        line.bar
                            .set_message(format!("{}: {}", line.usage(), line.last));
                    }
                }
            }
            RuntimeEvent::Report {
                attempt,
                step,
                report,
            } => {
                let what = format!("{:?}: {}", report.status, short(&report.summary));
                if let Some(line) = lines.get_mut(&attempt) {
                    line.closed = true;
                }
                match lines.get(&attempt) {
                    Some(line) if tty => line.bar.finish_with_message(format!(
                        "done in {:.1}s, {}: {what}",
                        line.started.elapsed().as_secs_f64(),
                        line.usage()
                    )),
                    Some(line) => say(format!("report   {step:<14} {}; {what}", line.usage())),
                    None => say(format!("report   {step:<14} {what}")),
                }
            }
            RuntimeEvent::TaskFailed {
                attempt,
                step,
                kind,
            } => match lines.get_mut(&attempt).map(|line| {
                line.closed = true;
                &*line
            }) {
                Some(line) if tty => line
                    .bar
                    .abandon_with_message(format!("failed: {kind}, {}", line.usage())),
                Some(line) => say(format!("failed   {step:<14} {kind}; {}", line.usage())),
                None => say(format!("failed   {step:<14} {kind}")),
            },
            RuntimeEvent::Escalation { reason, .. } => {
                let text = format!("escalated: {}", short(&reason));
                if tty {
                    multi.suspend(|| say(text));
                } else {
                    say(text);
                }
            }
            RuntimeEvent::Finished(outcome) => {
                // Report events go out before the run's end; a line still open here lost its events
                // (the channel drops rather than stall) or never reported: it still ends with what
                // it used.
                for line in lines.values().filter(|l| !l.closed) {
                    if tty {
                        line.bar.abandon_with_message(format!(
                            "ended with the run, {}: {}",
                            line.usage(),
                            line.last
                        ));
                    } else {
                        say(format!(
                            "ended    {:<14} {}; no report seen before the run ended",
                            line.step,
                            line.usage()
                        ));
                    }
                }
                let totals = totals(&lines);
                if !tty {
                    say(format!(
                        "finished {:?}: {} specialists, {}",
                        outcome.status,
                        totals.attempts,
                        usage_text(&totals.tokens, totals.spent_micros)
                    ));
                }
                DRAWING.store(false, Ordering::Release);
                return totals;
            }
            _ => {}
        }
    }
    DRAWING.store(false, Ordering::Release);
    totals(&lines)
}

fn totals(lines: &BTreeMap<AttemptId, Line>) -> Totals {
    let mut totals = Totals {
        attempts: u32::try_from(lines.len()).unwrap_or(u32::MAX),
        ..Totals::default()
    };
    for line in lines.values() {
        totals.add(&line.tokens, line.spent_micros);
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(input: u64, output: u64, cached: u64) -> TokenCounts {
        TokenCounts {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: cached,
            ..TokenCounts::default()
        }
    }

    #[test]
    fn counts_get_thousands_separators() {
        for (n, text) in [
            (0, "0"),
            (7, "7"),
            (999, "999"),
            (1_000, "1,000"),
            (12_345, "12,345"),
            (1_234_567, "1,234,567"),
            (u64::MAX, "18,446,744,073,709,551,615"),
        ] {
            assert_eq!(count(n), text, "{n}");
        }
    }

    #[test]
    fn spend_is_exact_below_a_cent_and_never_rounded_up() {
        for (m, text) in [
            (0, "$0.000000"),
            (90, "$0.000090"),
            (4_250, "$0.004250"),
            (9_999, "$0.009999"),
            (10_000, "$0.0100"),
            (10_099, "$0.0100"),
            (1_500_000, "$1.5000"),
            (12_345_678, "$12.3456"),
        ] {
            assert_eq!(micros(m), text, "{m}");
        }
    }

    #[test]
    fn usage_names_input_output_cache_and_cost() {
        assert_eq!(
            usage_text(&tokens(1_234, 56, 0), 3_870),
            "1,234 in / 56 out tokens, $0.003870"
        );
        assert_eq!(
            usage_text(&tokens(1_234, 56, 8_000), 3_870),
            "1,234 in (+8,000 cached) / 56 out tokens, $0.003870"
        );
        assert_eq!(
            usage_text(&TokenCounts::default(), 0),
            "0 in / 0 out tokens, $0.000000"
        );
    }

    #[test]
    fn totals_add_every_attempt_and_saturate() {
        let mut t = Totals::default();
        t.add(&tokens(10, 2, 1), 5);
        t.add(&tokens(30, 4, 0), 7);
        assert_eq!(t.tokens, tokens(40, 6, 1));
        assert_eq!(t.spent_micros, 12);
        t.add(&tokens(u64::MAX, 0, 0), u64::MAX);
        assert_eq!(t.tokens.input_tokens, u64::MAX);
        assert_eq!(t.spent_micros, u64::MAX);
    }
}
