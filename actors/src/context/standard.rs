//! The standard preamble: the thread above a task, under a hard cap (docs/DESIGN.md §6).
//!
//! Layout (each part on its own line):
//!
//! ```text
//! <keel-context kind="standard" task="ID">
//! (one line saying what this is and how to expand a pointer)
//! ## Parent task ID (kind, status)
//! ### Brief
//! ...
//! ### Outcome
//! ...
//! ### Attachments            (only when there are some)
//! - name: body
//! ## Earlier tasks (nearest first)   (only when there are some, or the walk ended early)
//! - ID (kind, status): first line of the brief
//! </keel-context>
//! ```
//!
//! The framing and the older-ancestor lines are bounded on their own; what is left of the cap is shared
//! between the parent's brief, outcome and attachments, each an equal share, with what a short one leaves
//! going to the others (max-min fair).

use keel_store::{AttachmentBody, Task, TaskId, TaskKind, TaskStatus};
use serde::{Deserialize, Serialize};

use super::ContextConfig;
use super::preamble::{
    Blocks, CutUnit, Preamble, PreambleKind, Section, Truncation, cut, enforce_cap,
};
use super::scrub::{Redactions, Scrubber};
use super::text::{self, chars, fair_shares, fit, one_line, prefix_bytes};

/// Bytes kept beyond a field's share when it is cut before scrubbing, so a secret that starts inside the
/// share is still whole enough to be recognised. Longer than any secret the patterns know.
pub(crate) const PRECUT_MARGIN_BYTES: usize = 4_096;

/// Smallest share an attachment gets before it is left out altogether (its name and a useful start).
const ATTACHMENT_SHARE_MIN: usize = 64;

/// How a walk up the parent links ended. Corrupt data ends a walk; it never loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WalkEnd {
    /// The last task has no parent.
    Root,
    /// The walk stopped at its limit while older tasks exist.
    Limit,
    /// This parent id is not in the store.
    Missing(TaskId),
    /// This id was already visited: the parent links form a cycle.
    Cycle(TaskId),
    /// This parent belongs to another run; it is not read (one run never reads another's state).
    OtherRun(TaskId),
}

/// A task and the thread above it, as loaded from the store: what the standard builder reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadView {
    /// The task the new session is for.
    pub task: Task,
    /// Its ancestors, nearest (the parent) first; at most [`ContextConfig::ancestors_max`] are used.
    pub ancestors: Vec<Task>,
    /// How the walk ended.
    pub walk_end: WalkEnd,
}

/// Builds the standard preamble of a task with a parent, or `None` for a task without one (its prompt
/// is its brief alone). Pure: same view, config and scrubber, same bytes.
pub fn standard_preamble(
    view: &ThreadView,
    config: &ContextConfig,
    scrubber: &Scrubber,
) -> Option<Preamble> {
    view.task.parent?;
    let chars_max = config.standard_chars_max();
    let mut redactions = Redactions::default();
    let mut truncations: Vec<Truncation> = Vec::new();
    let ancestors_max = usize::from(config.ancestors_max).max(1);
    let ancestors = &view.ancestors[..view.ancestors.len().min(ancestors_max)];
    // More ancestors loaded than the config allows count as a walk stopped at its limit.
    let walk_end = if view.ancestors.len() > ancestors_max {
        WalkEnd::Limit
    } else {
        view.walk_end
    };

    let mut head = Blocks::default();
    head.push(format!(
        "<keel-context kind=\"standard\" task=\"{}\">",
        view.task.id
    ));
    head.push(
        "This session continues a thread that keel stored (not a harness transcript). The parent task \
         is inline; older tasks are one line each: expand any task with the get_task_details tool by id.",
    );

    let Some(parent) = ancestors.first() else {
        // The parent link points nowhere we may read: say so instead of inventing a thread.
        head.push("## Parent task");
        head.push(walk_note(walk_end, 0));
        head.push("</keel-context>");
        let text = enforce_cap(head.finish(), chars_max, &mut truncations);
        return Some(Preamble::new(
            PreambleKind::Standard,
            text,
            chars_max,
            truncations,
            &redactions,
            false,
        ));
    };

    // Older ancestors: one line each, scrubbed, bounded.
    let line_max = usize::from(config.ancestor_line_chars_max);
    let mut older: Vec<String> = ancestors[1..]
        .iter()
        .map(|t| ancestor_line(t, line_max, scrubber, &mut redactions))
        .collect();
    let note = match walk_end {
        WalkEnd::Root => None,
        end => Some(walk_note(end, ancestors.len())),
    };

    let parent_heading = format!(
        "## Parent task {} ({}, {})",
        parent.id,
        kind_label(parent.kind),
        status_label(parent.status)
    );
    let footer = "</keel-context>";

    // The fixed part: everything but the three parent fields' bodies.
    let fixed = |older: &[String], dropped: usize, with_attachments: bool| -> usize {
        let mut n = head.chars() + 1 + chars(&parent_heading);
        n += 1 + "### Brief".len() + 1 + 1 + "### Outcome".len() + 1;
        if with_attachments {
            n += 1 + "### Attachments".len() + 1;
        }
        if !older.is_empty() || note.is_some() || dropped > 0 {
            n += 1 + "## Earlier tasks (nearest first)".len();
            n += older.iter().map(|l| 1 + chars(l)).sum::<usize>();
            if dropped > 0 {
                n += 1 + chars(&dropped_ancestors_line(dropped));
            }
            if let Some(note) = &note {
                n += 1 + chars(note);
            }
        }
        n + 1 + footer.len()
    };
    let with_attachments = !parent.attachments.is_empty();
    // Keep room for the parent's fields: drop the oldest pointer lines first if the framing alone is big.
    let mut dropped = 0usize;
    while !older.is_empty()
        && fixed(&older, dropped, with_attachments) + 3 * ATTACHMENT_SHARE_MIN > chars_max
    {
        older.pop();
        dropped += 1;
    }
    if dropped > 0 {
        truncations.push(cut(Section::Ancestors, dropped, CutUnit::Items));
    }
    let budget = chars_max.saturating_sub(fixed(&older, dropped, with_attachments));

    // The parent's fields, scrubbed before they are cut, each cut to its share.
    let brief = if parent.brief.is_empty() {
        Clean::fixed("(empty)")
    } else {
        Clean::new(&parent.brief, budget, scrubber, &mut redactions)
    };
    let outcome = match &parent.outcome {
        Some(o) if !o.is_empty() => Clean::new(o, budget, scrubber, &mut redactions),
        _ => Clean::fixed("(none recorded)"),
    };
    let entries = attachment_entries(
        parent,
        budget,
        usize::from(config.attachments_max),
        scrubber,
        &mut redactions,
    );
    let attachment_demand = if with_attachments {
        attachments_demand(&entries, parent.attachments.len())
    } else {
        0
    };
    let shares = fair_shares(
        &[brief.demand(), outcome.demand(), attachment_demand],
        budget,
    );

    let brief_fit = brief.fit(shares[0]);
    if brief_fit.cut_chars > 0 {
        truncations.push(cut(
            Section::ParentBrief,
            brief_fit.cut_chars,
            CutUnit::Characters,
        ));
    }
    let outcome_fit = outcome.fit(shares[1]);
    if outcome_fit.cut_chars > 0 {
        truncations.push(cut(
            Section::ParentOutcome,
            outcome_fit.cut_chars,
            CutUnit::Characters,
        ));
    }
    let attachments_text = if with_attachments {
        Some(attachments_block(
            entries,
            parent.attachments.len(),
            shares[2],
            attachment_demand,
            &mut truncations,
        ))
    } else {
        None
    };

    let mut blocks = head;
    blocks.push(parent_heading);
    blocks.push("### Brief");
    blocks.push(brief_fit.text);
    blocks.push("### Outcome");
    blocks.push(outcome_fit.text);
    if let Some(a) = attachments_text {
        blocks.push("### Attachments");
        blocks.push(a);
    }
    if !older.is_empty() || note.is_some() || dropped > 0 {
        blocks.push("## Earlier tasks (nearest first)");
        for line in older {
            blocks.push(line);
        }
        if dropped > 0 {
            blocks.push(dropped_ancestors_line(dropped));
        }
        if let Some(note) = note {
            blocks.push(note);
        }
    }
    blocks.push(footer);
    debug_assert!(blocks.chars() <= chars_max || chars_max < ContextConfig::CAP_CHARS_MIN as usize);
    let text = enforce_cap(blocks.finish(), chars_max, &mut truncations);
    Some(Preamble::new(
        PreambleKind::Standard,
        text,
        chars_max,
        truncations,
        &redactions,
        false,
    ))
}

/// A field scrubbed and ready to be cut: its text, its size, and what was cut before scrubbing.
pub(crate) struct Clean {
    pub(crate) text: String,
    pub(crate) chars: usize,
    pub(crate) unseen: usize,
}

impl Clean {
    /// Scrubs `raw`, after cutting it to `window_chars` plus a margin (so a huge field costs its share,
    /// not its size, while a secret straddling the cut is still recognised).
    pub(crate) fn new(
        raw: &str,
        window_chars: usize,
        scrubber: &Scrubber,
        redactions: &mut Redactions,
    ) -> Self {
        let margin = PRECUT_MARGIN_BYTES.max(scrubber.longest_registered_bytes());
        let window = prefix_bytes(raw, window_chars.saturating_mul(4).saturating_add(margin));
        let unseen = if window.len() < raw.len() {
            chars(&raw[window.len()..])
        } else {
            0
        };
        let scrubbed = scrubber.scrub(window);
        redactions.merge(&scrubbed.redactions);
        let text = scrubbed.text.into_owned();
        Self {
            chars: chars(&text),
            text,
            unseen,
        }
    }

    pub(crate) fn fixed(s: &str) -> Self {
        Self {
            text: s.to_owned(),
            chars: chars(s),
            unseen: 0,
        }
    }

    pub(crate) fn demand(&self) -> usize {
        self.chars + self.unseen
    }

    pub(crate) fn fit(&self, share: usize) -> text::Fitted {
        fit(&self.text, self.chars, self.unseen, share)
    }
}

fn ancestor_line(
    task: &Task,
    line_max: usize,
    scrubber: &Scrubber,
    redactions: &mut Redactions,
) -> String {
    let prefix = format!(
        "- {} ({}, {}): ",
        task.id,
        kind_label(task.kind),
        status_label(task.status)
    );
    let first_line = task.brief.lines().next().unwrap_or("");
    let room = line_max.saturating_sub(chars(&prefix));
    let clean = Clean::new(first_line, room, scrubber, redactions);
    let body = one_line(&clean.text);
    let more = clean.unseen + usize::from(task.brief.lines().nth(1).is_some());
    // A pointer line is a pointer: cut silently-but-visibly with an ellipsis, the full brief is one
    // get_task_details call away.
    let body_chars = chars(&body);
    let body = if body_chars > room || more > 0 {
        let keep = room.saturating_sub(1).min(body_chars);
        let mut b: String = body.chars().take(keep).collect();
        b.push('…');
        b
    } else {
        body
    };
    format!("{prefix}{body}")
}

fn dropped_ancestors_line(dropped: usize) -> String {
    format!("- [truncated: {dropped} older tasks left out to fit the cap]")
}

fn walk_note(end: WalkEnd, walked: usize) -> String {
    match end {
        WalkEnd::Root => "- [the thread starts here]".to_owned(),
        WalkEnd::Limit => format!(
            "- [walk stopped after {walked} ancestors; older tasks exist: expand the oldest shown with get_task_details]"
        ),
        WalkEnd::Missing(id) => {
            format!("- [parent {id} is not in the store; the thread stops here]")
        }
        WalkEnd::Cycle(id) => {
            format!("- [corrupt parent links: {id} repeats; the thread stops here]")
        }
        WalkEnd::OtherRun(id) => {
            format!("- [parent {id} belongs to another run and is not read; the thread stops here]")
        }
    }
}

fn attachment_prefix(name: &str) -> String {
    let name: String = one_line(name).chars().take(100).collect();
    format!("- {name}: ")
}

fn blob_text(len: u64) -> String {
    format!("stored blob of {len} bytes (get_task_details on the parent)")
}

/// The line that counts attachments left out.
fn omitted_attachments_line(omitted: usize) -> String {
    format!("- [truncated: {omitted} attachments left out]")
}

/// The parent's attachments that can be listed (up to the count limit), each scrubbed once, with the
/// line prefix that names it.
fn attachment_entries(
    parent: &Task,
    budget: usize,
    attachments_max: usize,
    scrubber: &Scrubber,
    redactions: &mut Redactions,
) -> Vec<(String, Clean)> {
    let listable = parent.attachments.len().min(attachments_max);
    parent.attachments[..listable]
        .iter()
        .map(|a| {
            let prefix = attachment_prefix(&a.name);
            let body = match &a.body {
                AttachmentBody::Inline(s) => Clean::new(s, budget, scrubber, redactions),
                AttachmentBody::Blob { len, .. } => Clean::fixed(&blob_text(*len)),
            };
            (prefix, body)
        })
        .collect()
}

/// What the attachments would take uncut, measured after scrubbing (a marker can be longer than the
/// secret it replaced), the line counting those over the count limit included.
fn attachments_demand(entries: &[(String, Clean)], total: usize) -> usize {
    let mut n = entries
        .iter()
        .map(|(p, b)| chars(p) + b.demand())
        .sum::<usize>()
        + entries.len().saturating_sub(1);
    if total > entries.len() {
        n += usize::from(!entries.is_empty())
            + chars(&omitted_attachments_line(total - entries.len()));
    }
    n
}

fn attachments_block(
    entries: Vec<(String, Clean)>,
    total: usize,
    share: usize,
    demand: usize,
    truncations: &mut Vec<Truncation>,
) -> String {
    // All listable ones when they fit; otherwise as many as can each get a useful share.
    let listed = if demand <= share {
        entries.len()
    } else {
        let line_room = share.saturating_sub(chars(&omitted_attachments_line(total)) + 1);
        entries.len().min(line_room / ATTACHMENT_SHARE_MIN)
    };
    let omitted = total - listed;
    let omitted_line = (omitted > 0).then(|| omitted_attachments_line(omitted));
    let mut room = share;
    if let Some(l) = &omitted_line {
        room = room.saturating_sub(chars(l) + usize::from(listed > 0));
    }
    // One newline between listed entries.
    room = room.saturating_sub(listed.saturating_sub(1));
    let mut entries = entries;
    entries.truncate(listed);
    let demands: Vec<usize> = entries.iter().map(|(p, b)| chars(p) + b.demand()).collect();
    let shares = fair_shares(&demands, room);
    let mut cut_chars = 0usize;
    let mut lines: Vec<String> = Vec::with_capacity(entries.len() + 1);
    for ((prefix, body), share) in entries.iter().zip(shares) {
        let fitted = body.fit(share.saturating_sub(chars(prefix)));
        cut_chars += fitted.cut_chars;
        lines.push(format!("{prefix}{}", fitted.text));
    }
    if cut_chars > 0 {
        truncations.push(cut(
            Section::ParentAttachments,
            cut_chars,
            CutUnit::Characters,
        ));
    }
    if let Some(l) = omitted_line {
        truncations.push(cut(Section::ParentAttachments, omitted, CutUnit::Items));
        lines.push(l);
    }
    lines.join("\n")
}

/// The word a preamble uses for a task kind.
pub(crate) fn kind_label(kind: TaskKind) -> &'static str {
    match kind {
        TaskKind::Root => "root",
        TaskKind::Subtask => "subtask",
        TaskKind::FollowUp => "follow-up",
        TaskKind::Review => "review",
        TaskKind::Redispatch => "re-dispatch",
    }
}

/// The word a preamble uses for a task status.
pub(crate) fn status_label(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Pending => "pending",
        TaskStatus::Admitted => "admitted",
        TaskStatus::Running => "running",
        TaskStatus::Complete => "complete",
        TaskStatus::Partial => "partial",
        TaskStatus::Blocked => "blocked",
        TaskStatus::Failed => "failed",
        TaskStatus::Cancelled => "cancelled",
        TaskStatus::Escalated => "escalated",
        TaskStatus::Paused => "paused",
    }
}
