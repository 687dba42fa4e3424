//! The old native-resume resolver, kept as an observability shim (docs/DESIGN.md §6, invariant 5).
//!
//! Before keel, a resume meant handing the harness its own session id (`--resume ID`, `resumeThread`).
//! keel never does: the transcript may be gone (a container restart), belong to another harness or account,
//! or have grown past the context window. The resolver still runs where it used to, so an operator can see
//! which native sessions existed and why each was passed over; its result has no way to name a session to
//! resume ([`NeverResumed`] has no value).

use std::collections::BTreeSet;

use keel_store::ObservedSession;
use serde::{Deserialize, Serialize};

/// Candidates recorded per call; more are counted, not listed (a limit on everything).
pub const CANDIDATES_RECORDED_MAX: usize = 32;
/// Characters of a native session id kept in the record.
const SESSION_ID_CHARS_MAX: usize = 128;

/// A session that could be resumed. It has no value: the type system guarantees that the shim never
/// returns one (invariant 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NeverResumed {}

/// Why a candidate native session was not resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SkipReason {
    /// keel continues threads from its store, never from a harness transcript.
    ContinuityFromStore,
    /// Also, the candidate ran on another harness than the new session's: its id means nothing there.
    OtherHarness,
    /// The id is empty or blank: there was nothing to resume anyway.
    EmptyId,
    /// The same id was already listed.
    Duplicate,
}

/// One candidate passed over, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedSession {
    /// The harness that ran it.
    pub harness: String,
    /// The account it ran under.
    pub account: String,
    /// Its native id (cut to 128 characters).
    pub native_session_id: String,
    /// Why it was skipped (the most specific reason).
    pub reason: SkipReason,
}

/// What the resolver decided: nothing to resume, and the record of what it skipped.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NativeResumeReport {
    /// The candidates passed over, in the order given (at most [`CANDIDATES_RECORDED_MAX`]).
    pub skipped: Vec<SkippedSession>,
    /// Candidates beyond the record limit, counted only.
    pub unrecorded: u32,
}

impl NativeResumeReport {
    /// The native session to resume: always `None`.
    pub fn session_to_resume(&self) -> Option<NeverResumed> {
        None
    }

    /// Writes the record to the log (target `keel::continuity`), one event per skipped session, so a
    /// decision that used to be invisible is explained.
    pub fn log(&self, task: &str) {
        for s in &self.skipped {
            tracing::info!(
                target: "keel::continuity",
                task,
                harness = %s.harness,
                account = %s.account,
                native_session_id = %s.native_session_id,
                reason = ?s.reason,
                "native session not resumed: continuity comes from keel's store"
            );
        }
        if self.unrecorded > 0 {
            tracing::info!(
                target: "keel::continuity",
                task,
                unrecorded = self.unrecorded,
                "more native sessions not resumed"
            );
        }
    }
}

/// The old resolver: given the native sessions a thread ran (oldest first) and the harness of the new
/// session, returns nothing to resume and why each candidate was skipped. Pure; the caller logs it with
/// [`NativeResumeReport::log`].
pub fn resolve_native_resume(
    new_harness: &str,
    candidates: &[ObservedSession],
) -> NativeResumeReport {
    let mut seen: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut report = NativeResumeReport::default();
    for c in candidates {
        if report.skipped.len() >= CANDIDATES_RECORDED_MAX {
            report.unrecorded = report.unrecorded.saturating_add(1);
            continue;
        }
        let id = c.native_session_id.trim();
        let reason = if id.is_empty() {
            SkipReason::EmptyId
        } else if !seen.insert((c.harness.as_str(), id)) {
            SkipReason::Duplicate
        } else if c.harness != new_harness {
            SkipReason::OtherHarness
        } else {
            SkipReason::ContinuityFromStore
        };
        report.skipped.push(SkippedSession {
            harness: c.harness.clone(),
            account: c.account.clone(),
            native_session_id: id.chars().take(SESSION_ID_CHARS_MAX).collect(),
            reason,
        });
    }
    report
}
