//! The Stop hook's report check (docs/DESIGN.md §9): when a session would end, its final text must be
//! keel's report for its task; a text that is not gets the same session one more turn with the exact
//! error, before the attempt fails. The re-ask is part of the session, so it is part of the same
//! attempt and idempotency key (invariant 2), never a new start.
//!
//! [`StopCheck`] is plain data in the spec (it crosses to worker nodes with it); the check itself is
//! keel-actors' report reader, reached by keel's own loop in process through a [`StopJudge`] the host
//! puts in the spec's [`InProcessHooks`], and by a CLI through its native Stop hook running the
//! spec's `stop_gate` command (Claude Code and Codex; docs/HARNESSES.md says which CLIs can).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// How many times a session is sent back for a report that does not read: once.
pub const RE_ASKS_MAX: u32 = 1;

/// Words every re-ask starts with, so a reader of the log (and the scripted model) can tell a
/// re-ask from the brief.
pub const RE_ASK_MARKER: &str = "[keel] Your final answer is not a valid keel report";

/// What keel checks when a session would end.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StopCheck {
    /// The task ids a report may name, the session's own first (then the earlier tasks of its step a
    /// resumed session may report under).
    pub report_for: Vec<String>,
    /// How many times the session is sent back ([`RE_ASKS_MAX`]).
    pub re_asks_max: u32,
}

/// The check a host runs in process for keel's own loop: `Ok` lets the session end, `Err` holds the
/// user text the session is sent back with (the exact error, starting with [`RE_ASK_MARKER`]).
pub trait StopJudge: Send + Sync {
    /// Judges the session's final text against `check`.
    ///
    /// # Errors
    /// The text to send the session back with.
    fn judge(&self, check: &StopCheck, final_text: &str) -> Result<(), String>;
}

/// What a host hands keel's own loop in process, next to the plain data of a spec. Never serialised:
/// each host (a worker node too) sets its own before a session starts.
#[derive(Clone, Default)]
pub struct InProcessHooks {
    /// The Stop hook's judge, for a spec with a [`StopCheck`].
    pub stop: Option<Arc<dyn StopJudge>>,
    /// The policy's guard for every tool call (`PreToolUse` and `PostToolUse`), in place of the
    /// spec's `pre_tool_gate` command.
    pub tool: Option<Arc<dyn crate::guard::ToolGuard>>,
    /// What the policy handed back for each result the session's CLI handed it, which the CLI
    /// runner logs in place of the CLI's own account of the result (see
    /// [`crate::guard::ResultRecords`]).
    pub results: Option<Arc<dyn crate::guard::ResultRecords>>,
}

impl fmt::Debug for InProcessHooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessHooks")
            .field("stop", &self.stop.is_some())
            .field("tool", &self.tool.is_some())
            .field("results", &self.results.is_some())
            .finish()
    }
}

/// Two hook sets are equal when they hold the same judges (by identity): a spec compares equal to
/// its clone.
impl PartialEq for InProcessHooks {
    fn eq(&self, other: &Self) -> bool {
        let stop = match (&self.stop, &other.stop) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        let tool = match (&self.tool, &other.tool) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        let results = match (&self.results, &other.results) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        stop && tool && results
    }
}

impl Eq for InProcessHooks {}
