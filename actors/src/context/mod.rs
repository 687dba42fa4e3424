//! Context continuity: bounded, secret-scrubbed preambles built from store rows (docs/DESIGN.md §6).
//!
//! keel never resumes a harness's own session. A new session continues a thread from what keel stored,
//! through one of two builders, both pure functions over rows that were already loaded:
//!
//! - [`standard_preamble`] for a task with a parent: the parent inline, older ancestors one line each,
//!   under a hard cap (8,000 characters by default);
//! - [`resume_preamble`] for an interrupted task: the original brief verbatim, then the last session
//!   steps, steering messages, progress notes and (for a lead) the subtasks it delegated, under a hard cap (16,000 characters by default).
//!
//! Every field is scrubbed of secrets ([`Scrubber`]) before it is cut. [`place_preamble`] puts the result
//! into the prompt without displacing a slash skill from line one. [`load_thread`] and [`load_resume`]
//! fill the views from any [`ThreadSource`] (the store, or rows in memory), with a bounded walk that
//! stops on a cycle. [`context_for_task`] is what `keel context TASK [--resume]` prints.
//! [`resolve_native_resume`] is the old resume resolver, kept only to record what it skipped.

mod load;
mod placement;
mod preamble;
mod resume;
pub mod scrub;
mod shim;
mod standard;
mod text;
pub(crate) use text::collapse_whitespace;

pub use load::{
    ContextError, ContextReport, LoadError, RESUME_INSTRUCTION, RowSet, ThreadSource,
    context_for_task, context_from_store, load_resume, load_thread, resume_prompt,
};
pub use placement::{is_slash_skill_line, place_preamble};
pub use preamble::{CutUnit, Preamble, PreambleKind, Section, Truncation};
pub use resume::{LogEntry, ResumeView, resume_preamble};
pub use scrub::{PatternError, Redactions, RegisterSecretError, Scrubber, SecretKind};
pub use shim::{
    NativeResumeReport, NeverResumed, SkipReason, SkippedSession, resolve_native_resume,
};
pub use standard::{ThreadView, WalkEnd, standard_preamble};

use serde::{Deserialize, Serialize};

/// The limits of both builders. Caps are set in tokens and converted at a fixed characters-per-token
/// ratio, because the budget that matters is the model's context while the builders count characters
/// (deterministic, no tokenizer). Every list and line has its own ceiling so no input can grow a preamble.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextConfig {
    /// Cap of the standard preamble, in tokens (default 2,000).
    pub standard_tokens_max: u32,
    /// Cap of the resume preamble, in tokens (default 4,000).
    pub resume_tokens_max: u32,
    /// Characters counted per token (default 4).
    pub chars_per_token: u32,
    /// Ancestors walked for a standard preamble (default 5: the parent and four one-line pointers).
    pub ancestors_max: u8,
    /// Re-dispatch links followed back to the original brief (default 32).
    pub redispatch_chain_max: u8,
    /// Session steps summarised in a resume preamble (default 50).
    pub log_rows_max: u16,
    /// Characters of one session step line (default 200).
    pub step_line_chars_max: u16,
    /// Steering messages kept (default 10, newest).
    pub steering_count_max: u8,
    /// Characters of one steering message (default 1,000).
    pub steering_chars_max: u16,
    /// Progress notes kept (default 10, newest).
    pub notes_count_max: u8,
    /// Characters of one progress note (default 500).
    pub note_chars_max: u16,
    /// Characters of one older-ancestor line (default 200).
    pub ancestor_line_chars_max: u16,
    /// Attachments of the parent listed (default 16).
    pub attachments_max: u8,
    /// Delegated subtasks a resumed lead's preamble lists (default 32, the oldest first).
    #[serde(default = "default_delegated_max")]
    pub delegated_max: u8,
}

fn default_delegated_max() -> u8 {
    32
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            standard_tokens_max: 2_000,
            resume_tokens_max: 4_000,
            chars_per_token: 4,
            ancestors_max: 5,
            redispatch_chain_max: 32,
            log_rows_max: 50,
            step_line_chars_max: 200,
            steering_count_max: 10,
            steering_chars_max: 1_000,
            notes_count_max: 10,
            note_chars_max: 500,
            ancestor_line_chars_max: 200,
            attachments_max: 16,
            delegated_max: default_delegated_max(),
        }
    }
}

/// A [`ContextConfig`] outside the ranges the builders are made for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContextConfigError {
    /// A cap below [`ContextConfig::CAP_CHARS_MIN`] or above [`ContextConfig::CAP_CHARS_MAX`] characters.
    #[error("the {which} cap must be {min}..={max} characters, got {got}")]
    CapOutOfRange {
        /// Which cap (`standard` or `resume`).
        which: &'static str,
        /// The cap in characters.
        got: u64,
        /// Lowest allowed.
        min: u32,
        /// Highest allowed.
        max: u32,
    },
    /// A per-item limit of zero, or one larger than its ceiling.
    #[error("{field} must be 1..={max}, got {got}")]
    LimitOutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        got: u32,
        /// Highest allowed.
        max: u32,
    },
}

impl ContextConfig {
    /// Lowest cap: below it the framing and markers would not fit.
    pub const CAP_CHARS_MIN: u32 = 1_000;
    /// Highest cap (a quarter of a million tokens at 4 characters per token).
    pub const CAP_CHARS_MAX: u32 = 1_000_000;

    /// The standard preamble's cap in characters.
    pub fn standard_chars_max(&self) -> usize {
        cap(self.standard_tokens_max, self.chars_per_token)
    }

    /// The resume preamble's cap in characters.
    pub fn resume_chars_max(&self) -> usize {
        cap(self.resume_tokens_max, self.chars_per_token)
    }

    /// Checks every limit; the builders assume a validated config.
    ///
    /// # Errors
    /// [`ContextConfigError`] naming the first limit out of range.
    pub fn validate(&self) -> Result<(), ContextConfigError> {
        for (which, tokens) in [
            ("standard", self.standard_tokens_max),
            ("resume", self.resume_tokens_max),
        ] {
            let got = u64::from(tokens) * u64::from(self.chars_per_token);
            if got < u64::from(Self::CAP_CHARS_MIN) || got > u64::from(Self::CAP_CHARS_MAX) {
                return Err(ContextConfigError::CapOutOfRange {
                    which,
                    got,
                    min: Self::CAP_CHARS_MIN,
                    max: Self::CAP_CHARS_MAX,
                });
            }
        }
        let limits: [(&'static str, u32, u32); 11] = [
            ("ancestors_max", self.ancestors_max.into(), 16),
            (
                "redispatch_chain_max",
                self.redispatch_chain_max.into(),
                128,
            ),
            ("log_rows_max", self.log_rows_max.into(), 500),
            (
                "step_line_chars_max",
                self.step_line_chars_max.into(),
                2_000,
            ),
            ("steering_count_max", self.steering_count_max.into(), 100),
            ("steering_chars_max", self.steering_chars_max.into(), 10_000),
            ("notes_count_max", self.notes_count_max.into(), 100),
            ("note_chars_max", self.note_chars_max.into(), 10_000),
            (
                "ancestor_line_chars_max",
                self.ancestor_line_chars_max.into(),
                2_000,
            ),
            ("attachments_max", self.attachments_max.into(), 64),
            ("delegated_max", self.delegated_max.into(), 128),
        ];
        for (field, got, max) in limits {
            if got == 0 || got > max {
                return Err(ContextConfigError::LimitOutOfRange { field, got, max });
            }
        }
        Ok(())
    }
}

fn cap(tokens: u32, chars_per_token: u32) -> usize {
    let chars = u64::from(tokens) * u64::from(chars_per_token);
    usize::try_from(chars).unwrap_or(usize::MAX)
}
