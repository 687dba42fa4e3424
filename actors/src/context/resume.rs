//! The resume preamble: an interrupted task's brief and where it stopped, under a hard cap (docs/DESIGN.md §6).
//!
//! Layout:
//!
//! ```text
//! <keel-context kind="resume" task="ID">
//! (one line saying what this is)
//! ## Original brief (verbatim, task ID)
//! ...the brief, never cut...
//! ## Last session steps (oldest first)      (when there are some)
//! - tool_use: Read src/lib.rs
//! ## Steering messages (oldest first)        (when there are some)
//! ## Progress notes (oldest first)           (when there are some)
//! ## Subtasks you delegated (oldest first)     (a lead's, when there are some)
//! - ID [complete] goal: report complete: its summary
//! </keel-context>
//! ```
//!
//! Over the cap the oldest step lines go first, then the oldest steering messages, then the oldest notes,
//! then the oldest delegated subtasks;
//! every cut leaves a `[truncated: N ...]` line. The brief is never cut: when the brief alone is larger
//! than the cap, the brief wins and the preamble says what it left out (`brief_over_cap`).

use keel_store::{LogKind, SessionLogRow, Task, TaskId, TaskKind};

use super::ContextConfig;
use super::preamble::{
    Blocks, CutUnit, Preamble, PreambleKind, Section, Truncation, cut, enforce_cap,
};
use super::scrub::{Redactions, Scrubber};
use super::standard::{Clean, WalkEnd, status_label};
use super::text::{chars, fit, one_line};
use crate::report::StepOutcome;

/// One session log row and where it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogEntry {
    /// The attempt (task) that logged it.
    pub task: TaskId,
    /// Its sequence number within that task's log.
    pub seq: u64,
    /// The row.
    pub row: SessionLogRow,
}

/// An interrupted task and its record, as loaded from the store: what the resume builder reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeView {
    /// The task the new session is for (a paused task, or the re-dispatch of an interrupted one).
    pub task: Task,
    /// The attempts it continues, nearest first, following re-dispatch links back to the original task
    /// (the first that is not a re-dispatch). Empty for a task that resumes itself.
    pub earlier_attempts: Vec<Task>,
    /// How that walk ended.
    pub walk_end: WalkEnd,
    /// Session log rows of the task and its earlier attempts, oldest first.
    pub log: Vec<LogEntry>,
    /// The subtasks the task and its earlier attempts delegated (a lead's), oldest first, at most
    /// [`ContextConfig::delegated_max`]: a resumed lead is told what it already asked for and how each
    /// ended, so it does not ask again for work that is done.
    pub delegated: Vec<Task>,
}

impl ResumeView {
    /// The task whose brief the preamble carries: the first of the chain that is not a re-dispatch, or
    /// the oldest attempt reached when the chain is broken. The flag says whether it is the original.
    pub fn original(&self) -> (&Task, bool) {
        let chain = std::iter::once(&self.task).chain(self.earlier_attempts.iter());
        let mut last = &self.task;
        for t in chain {
            if t.kind != TaskKind::Redispatch {
                return (t, true);
            }
            last = t;
        }
        (last, false)
    }
}

/// Builds the resume preamble of an interrupted task. Pure: same view, config and scrubber, same bytes.
pub fn resume_preamble(view: &ResumeView, config: &ContextConfig, scrubber: &Scrubber) -> Preamble {
    let chars_max = config.resume_chars_max();
    let mut redactions = Redactions::default();
    let mut truncations: Vec<Truncation> = Vec::new();
    let (original, is_original) = view.original();

    let mut head = Blocks::default();
    head.push(format!(
        "<keel-context kind=\"resume\" task=\"{}\">",
        view.task.id
    ));
    head.push(
        "This task was interrupted and is resumed in a new session. keel does not resume harness \
         sessions: below is keel's own record. Continue from where the work stopped; do not redo \
         finished steps.",
    );
    if is_original {
        head.push(format!(
            "## Original brief (verbatim, task {})",
            original.id
        ));
    } else {
        head.push(format!(
            "## Brief of the oldest attempt reached (verbatim, task {})",
            original.id
        ));
        head.push(chain_note(view.walk_end));
    }
    // The brief is scrubbed whole and never cut.
    let brief = if original.brief.is_empty() {
        "(empty)".to_owned()
    } else {
        let scrubbed = scrubber.scrub(&original.brief);
        redactions.merge(&scrubbed.redactions);
        scrubbed.text.into_owned()
    };
    head.push(brief);
    let footer = "</keel-context>";

    // Steps: the last rows that are not usage nor steering, one line each.
    let step_max = usize::from(config.step_line_chars_max);
    let steps_src: Vec<&LogEntry> = view
        .log
        .iter()
        .filter(|e| !matches!(e.row.kind, LogKind::Usage | LogKind::Steering))
        .collect();
    let first_step = steps_src
        .len()
        .saturating_sub(usize::from(config.log_rows_max));
    let mut line_cut = 0usize;
    let steps: Vec<String> = steps_src[first_step..]
        .iter()
        .map(|e| {
            let prefix = format!("- {}: ", log_kind_label(e.row.kind));
            let room = step_max.saturating_sub(chars(&prefix));
            let (body, cut_chars) = line(&e.row.summary, room, scrubber, &mut redactions);
            line_cut += cut_chars;
            format!("{prefix}{body}")
        })
        .collect();
    if line_cut > 0 {
        truncations.push(cut(Section::Steps, line_cut, CutUnit::Characters));
    }

    // Steering: the newest messages, each bounded.
    let steering_src: Vec<&LogEntry> = view
        .log
        .iter()
        .filter(|e| e.row.kind == LogKind::Steering)
        .collect();
    let steering_over = steering_src
        .len()
        .saturating_sub(usize::from(config.steering_count_max));
    let mut steering_cut = 0usize;
    let steering: Vec<String> = steering_src[steering_over..]
        .iter()
        .map(|e| {
            let text = if e.row.detail.is_empty() {
                &e.row.summary
            } else {
                &e.row.detail
            };
            let (body, c) = line(
                text,
                usize::from(config.steering_chars_max).saturating_sub(2),
                scrubber,
                &mut redactions,
            );
            steering_cut += c;
            format!("- {body}")
        })
        .collect();
    if steering_cut > 0 {
        truncations.push(cut(Section::Steering, steering_cut, CutUnit::Characters));
    }

    // Progress notes of every attempt, oldest first; the newest kept.
    let mut notes_src: Vec<&String> = Vec::new();
    for t in view.earlier_attempts.iter().rev() {
        notes_src.extend(t.progress_notes.iter());
    }
    notes_src.extend(view.task.progress_notes.iter());
    let notes_over = notes_src
        .len()
        .saturating_sub(usize::from(config.notes_count_max));
    let mut note_cut = 0usize;
    let notes: Vec<String> = notes_src[notes_over..]
        .iter()
        .map(|n| {
            let (body, c) = line(
                n,
                usize::from(config.note_chars_max).saturating_sub(2),
                scrubber,
                &mut redactions,
            );
            note_cut += c;
            format!("- {body}")
        })
        .collect();
    if note_cut > 0 {
        truncations.push(cut(Section::ProgressNotes, note_cut, CutUnit::Characters));
    }

    // Delegated subtasks, oldest first, one line each with where they stand.
    let mut delegated_cut = 0usize;
    let delegated: Vec<String> = view
        .delegated
        .iter()
        .map(|t| {
            let prefix = format!("- {} [{}] ", t.id, status_label(t.status));
            let room = step_max.saturating_sub(chars(&prefix));
            let (body, c) = line(&delegated_line(t), room, scrubber, &mut redactions);
            delegated_cut += c;
            format!("{prefix}{body}")
        })
        .collect();
    if delegated_cut > 0 {
        truncations.push(cut(Section::Delegated, delegated_cut, CutUnit::Characters));
    }

    let sections = [
        Part::new(
            "## Last session steps (oldest first)",
            steps,
            0,
            "older steps",
        ),
        Part::new(
            "## Steering messages (oldest first)",
            steering,
            steering_over,
            "older steering messages",
        ),
        Part::new(
            "## Progress notes (oldest first)",
            notes,
            notes_over,
            "older progress notes",
        ),
        Part::new(
            "## Subtasks you delegated (oldest first; asking for one again gets its outcome, never a second run)",
            delegated,
            0,
            "older delegated subtasks",
        ),
    ];
    const SECTIONS: [Section; 4] = [
        Section::Steps,
        Section::Steering,
        Section::ProgressNotes,
        Section::Delegated,
    ];
    let fixed = head.chars() + 1 + footer.len();
    let mut dropped = [0usize; 4];
    let total = |dropped: &[usize; 4]| -> usize {
        fixed
            + sections
                .iter()
                .zip(dropped.iter())
                .map(|(s, d)| s.chars(*d))
                .sum::<usize>()
    };
    // Oldest step lines first, then steering, then notes, then delegated subtasks.
    'cut: while total(&dropped) > chars_max {
        for (i, s) in sections.iter().enumerate() {
            if dropped[i] < s.lines.len() {
                dropped[i] += 1;
                continue 'cut;
            }
        }
        break;
    }

    let mut blocks = head;
    let brief_over_cap = if total(&dropped) > chars_max {
        // Even with every optional line gone the framing does not fit: the brief wins over the cap.
        let all = |i: usize| sections[i].lines.len() + sections[i].pre_dropped;
        for (i, section) in SECTIONS.into_iter().enumerate() {
            if all(i) > 0 {
                truncations.push(cut(section, all(i), CutUnit::Items));
            }
        }
        let subtasks = if all(3) > 0 {
            format!(", {} delegated subtasks", all(3))
        } else {
            String::new()
        };
        blocks.push(format!(
            "[truncated: {} steps, {} steering messages, {} progress notes{subtasks} left out: the brief alone fills the {chars_max}-character cap]",
            all(0),
            all(1),
            all(2)
        ));
        blocks.push(footer);
        blocks.chars() > chars_max
    } else {
        for ((s, d), section) in sections.iter().zip(dropped).zip(SECTIONS) {
            if d + s.pre_dropped > 0 {
                truncations.push(cut(section, d + s.pre_dropped, CutUnit::Items));
            }
            s.render(d, &mut blocks);
        }
        blocks.push(footer);
        false
    };
    let text = if brief_over_cap {
        blocks.finish()
    } else {
        enforce_cap(blocks.finish(), chars_max, &mut truncations)
    };
    Preamble::new(
        PreambleKind::Resume,
        text,
        chars_max,
        truncations,
        &redactions,
        brief_over_cap,
    )
}

/// One optional section: its heading, its lines (oldest first), and how many items were left out before
/// the cap was applied (over its count limit).
struct Part {
    heading: &'static str,
    lines: Vec<String>,
    line_chars: Vec<usize>,
    pre_dropped: usize,
    what: &'static str,
}

impl Part {
    fn new(
        heading: &'static str,
        lines: Vec<String>,
        pre_dropped: usize,
        what: &'static str,
    ) -> Self {
        let line_chars = lines.iter().map(|l| chars(l)).collect();
        Self {
            heading,
            lines,
            line_chars,
            pre_dropped,
            what,
        }
    }

    fn marker(&self, dropped: usize) -> Option<String> {
        let n = dropped + self.pre_dropped;
        (n > 0).then(|| format!("[truncated: {n} {} left out]", self.what))
    }

    /// Size of the section with the `dropped` oldest lines left out, newline before each block included.
    fn chars(&self, dropped: usize) -> usize {
        let kept = &self.line_chars[dropped..];
        let marker = self.marker(dropped);
        if kept.is_empty() && marker.is_none() {
            return 0;
        }
        1 + self.heading.len()
            + marker.map_or(0, |m| 1 + chars(&m))
            + kept.iter().map(|n| 1 + n).sum::<usize>()
    }

    fn render(&self, dropped: usize, blocks: &mut Blocks) {
        let marker = self.marker(dropped);
        if self.lines.len() == dropped && marker.is_none() {
            return;
        }
        blocks.push(self.heading);
        if let Some(m) = marker {
            blocks.push(m);
        }
        for l in &self.lines[dropped..] {
            blocks.push(l.clone());
        }
    }
}

/// Scrubs, flattens and bounds one line; returns it and how many characters were cut.
fn line(
    raw: &str,
    max_chars: usize,
    scrubber: &Scrubber,
    redactions: &mut Redactions,
) -> (String, usize) {
    let clean = Clean::new(raw, max_chars, scrubber, redactions);
    let flat = one_line(&clean.text);
    let fitted = fit(&flat, clean.chars, clean.unseen, max_chars);
    (fitted.text, fitted.cut_chars)
}

/// What a delegated subtask's line says after its id and status: its goal, then how it ended (from
/// its outcome row) or that it has not ended yet.
fn delegated_line(task: &Task) -> String {
    let goal = if task.goal.is_empty() {
        "(no goal)"
    } else {
        &task.goal
    };
    let outcome = task
        .outcome
        .as_deref()
        .and_then(|o| serde_json::from_str::<StepOutcome>(o).ok());
    let ended = match outcome {
        Some(StepOutcome::Report(r)) => format!("report {}: {}", report_label(r.status), r.summary),
        Some(StepOutcome::Failed(f)) => format!("failed: {}", f.detail),
        Some(StepOutcome::Skipped { reason }) => format!("skipped: {reason}"),
        None if task.status.is_terminal() => "ended without an outcome".to_owned(),
        None => "not ended yet (it runs on; asking for it again waits for it)".to_owned(),
    };
    format!("{goal}: {ended}")
}

fn report_label(status: crate::report::ReportStatus) -> &'static str {
    match status {
        crate::report::ReportStatus::Complete => "complete",
        crate::report::ReportStatus::Partial => "partial",
        crate::report::ReportStatus::Blocked => "blocked",
    }
}

fn chain_note(end: WalkEnd) -> String {
    match end {
        WalkEnd::Root => "[the re-dispatch chain ends without an original task]".to_owned(),
        WalkEnd::Limit => {
            "[the re-dispatch chain is longer than the walk allows; the original was not reached]"
                .to_owned()
        }
        WalkEnd::Missing(id) => {
            format!("[the original could not be reached: task {id} is not in the store]")
        }
        WalkEnd::Cycle(id) => {
            format!("[the original could not be reached: corrupt parent links, {id} repeats]")
        }
        WalkEnd::OtherRun(id) => {
            format!("[the original could not be reached: task {id} belongs to another run]")
        }
    }
}

fn log_kind_label(kind: LogKind) -> &'static str {
    match kind {
        LogKind::Text => "text",
        LogKind::ToolUse => "tool_use",
        LogKind::ToolResult => "tool_result",
        LogKind::Usage => "usage",
        LogKind::Steering => "steering",
        LogKind::Error => "error",
        LogKind::Lifecycle => "lifecycle",
    }
}
