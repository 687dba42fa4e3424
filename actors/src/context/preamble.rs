//! The built preamble and the record of what was cut from it, so an operator (`keel context`) and a test
//! can see exactly what the agent will see and what it will not.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::scrub::{Redactions, SecretKind};
use super::text;

/// Which builder made a preamble.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreambleKind {
    /// For a task with a parent: the thread above it.
    Standard,
    /// For an interrupted task: its brief and where it stopped.
    Resume,
}

impl fmt::Display for PreambleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Standard => "standard",
            Self::Resume => "resume",
        })
    }
}

/// A part of a preamble that can be cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Section {
    /// The parent's brief (standard).
    ParentBrief,
    /// The parent's outcome (standard).
    ParentOutcome,
    /// The parent's attachments (standard).
    ParentAttachments,
    /// The one-line pointers to older ancestors (standard).
    Ancestors,
    /// The session step summaries (resume).
    Steps,
    /// The steering messages (resume).
    Steering,
    /// The progress notes (resume).
    ProgressNotes,
    /// The subtasks a lead delegated, with their outcomes (resume).
    Delegated,
    /// The whole text: a last-resort cut that only a cap below the framing's own size can cause.
    Whole,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ParentBrief => "parent brief",
            Self::ParentOutcome => "parent outcome",
            Self::ParentAttachments => "parent attachments",
            Self::Ancestors => "older ancestors",
            Self::Steps => "session steps",
            Self::Steering => "steering messages",
            Self::ProgressNotes => "progress notes",
            Self::Delegated => "delegated subtasks",
            Self::Whole => "whole preamble",
        })
    }
}

/// What a cut counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CutUnit {
    /// Characters removed from inside a field or line.
    Characters,
    /// Whole items (lines, messages, notes, attachments, ancestors) left out.
    Items,
}

/// One cut, as marked in the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Truncation {
    /// Where.
    pub section: Section,
    /// How much.
    pub cut: u32,
    /// Of what.
    pub unit: CutUnit,
}

impl fmt::Display for Truncation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.unit {
            CutUnit::Characters => "characters",
            CutUnit::Items => "items",
        };
        write!(f, "{}: {} {unit}", self.section, self.cut)
    }
}

/// A preamble ready to be placed into a prompt, with its size and what was cut and redacted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preamble {
    /// Which builder made it.
    pub kind: PreambleKind,
    /// The text the agent sees. Never starts with a newline nor a slash (placement relies on it).
    pub text: String,
    /// Its size in characters.
    pub chars: u32,
    /// The cap it was built under, in characters.
    pub chars_max: u32,
    /// Every cut, in the order of the text.
    pub truncations: Vec<Truncation>,
    /// How many secrets of each kind were removed.
    pub redactions: BTreeMap<SecretKind, u32>,
    /// Resume only: the brief alone (never cut) is larger than the cap, so the text is the framed brief
    /// and one line saying what was left out. `chars` then exceeds `chars_max`, by the brief's doing.
    pub brief_over_cap: bool,
}

impl Preamble {
    pub(crate) fn new(
        kind: PreambleKind,
        text: String,
        chars_max: usize,
        truncations: Vec<Truncation>,
        redactions: &Redactions,
        brief_over_cap: bool,
    ) -> Self {
        let chars = text::chars(&text);
        Self {
            kind,
            text,
            chars: u32::try_from(chars).unwrap_or(u32::MAX),
            chars_max: u32::try_from(chars_max).unwrap_or(u32::MAX),
            truncations,
            redactions: redactions.iter().collect(),
            brief_over_cap,
        }
    }

    /// Whether anything was cut.
    pub fn is_truncated(&self) -> bool {
        !self.truncations.is_empty()
    }
}

pub(crate) fn cut(section: Section, cut: usize, unit: CutUnit) -> Truncation {
    Truncation {
        section,
        cut: u32::try_from(cut).unwrap_or(u32::MAX),
        unit,
    }
}

/// Blocks of text joined by newlines, with their size kept as they are added.
#[derive(Default)]
pub(crate) struct Blocks {
    parts: Vec<String>,
    chars: usize,
}

impl Blocks {
    pub(crate) fn push(&mut self, block: impl Into<String>) {
        let block = block.into();
        if !self.parts.is_empty() {
            self.chars += 1;
        }
        self.chars += text::chars(&block);
        self.parts.push(block);
    }

    pub(crate) fn chars(&self) -> usize {
        self.chars
    }

    pub(crate) fn finish(self) -> String {
        self.parts.join("\n")
    }
}

/// The last-resort guarantee of the cap: if the text is over it (only possible under a cap smaller than
/// the framing), cut it and say so. With a validated config this never fires; the tests check that.
pub(crate) fn enforce_cap(
    text: String,
    chars_max: usize,
    truncations: &mut Vec<Truncation>,
) -> String {
    let n = text::chars(&text);
    if n <= chars_max {
        return text;
    }
    let fitted = text::fit(&text, n, 0, chars_max);
    truncations.push(cut(Section::Whole, fitted.cut_chars, CutUnit::Characters));
    fitted.text
}
