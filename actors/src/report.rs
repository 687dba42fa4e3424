//! What flows along the spokes: the brief a specialist gets and the typed report or failure it returns
//! (docs/DESIGN.md §8). These are wire types (they cross nodes), so every field is fixed-width or bounded.

use crate::ids::AttemptId;
use crate::machine::Millis;
use keel_harness::ErrorCategory;
use keel_store::{Task, TaskId, TaskKind, TaskStatus};
use serde::{Deserialize, Serialize};

mod normalise;

/// Most findings one report may carry; more is a malformed report, not a bigger message.
pub const FINDINGS_MAX: usize = 256;
/// Most gaps one report may list.
pub const GAPS_MAX: usize = 64;
/// Most bytes of a claim, a summary, a gap or a brief field; longer input is cut on a char boundary.
pub const TEXT_BYTES_MAX: usize = 8 * 1024;
/// Most prior findings the coordinator passes to one specialist.
pub const PRIOR_FINDINGS_MAX: usize = 64;

/// Cut `text` to at most `bytes_max` bytes on a char boundary, so bounds never split a character.
pub fn bounded(mut text: String, bytes_max: usize) -> String {
    if text.len() > bytes_max {
        let mut cut = bytes_max;
        while cut > 0 && !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

/// How a subtask ended when it produced a report. A failure is not a status here: it is a
/// [`SubtaskFailure`], so an empty "success" cannot be expressed (docs/DESIGN.md §12, invariant 10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReportStatus {
    /// Every quality criterion met.
    Complete,
    /// Useful but incomplete: the gaps say what is missing, and the synthesis annotates it.
    Partial,
    /// Could not proceed; the gaps say why. Not usable as input for dependent steps.
    Blocked,
}

/// One claim bound to its source, so a synthesis can cite and a reviewer can check it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What was found, as one statement.
    pub claim: String,
    /// Where it comes from (a URL, a file path relative to the work dir, a tool call id). Required: a
    /// finding without a source is rejected by [`SubagentReport::verify`].
    pub source: String,
    /// The document inside the source, if any.
    #[serde(default)]
    pub document: Option<String>,
    /// The page or line, if any.
    #[serde(default)]
    pub page: Option<u32>,
    /// Confidence in per-mille (0..=1000); integers so replays compare exactly.
    pub confidence_permille: u16,
    /// Which agent or tool retrieved it.
    #[serde(default)]
    pub retrieved_by: String,
    /// When it was retrieved (host clock, milliseconds).
    #[serde(default)]
    pub retrieved_at_ms: Millis,
}

/// The typed report a specialist returns on success (docs/DESIGN.md §8).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubagentReport {
    /// The task the report is about (must match the attempt that sends it). Written as the task's ULID
    /// string, the form the agent saw in its brief.
    #[serde(with = "task_id_text")]
    pub subtask_id: TaskId,
    /// Complete, partial or blocked.
    pub status: ReportStatus,
    /// The findings, each bound to its source.
    pub findings: Vec<Finding>,
    /// What is missing or could not be checked.
    #[serde(default)]
    pub gaps: Vec<String>,
    /// A short human summary.
    pub summary: String,
}

/// Why a report was refused by [`SubagentReport::verify`]; turns into a typed failure, never a success.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum ReportError {
    /// The report names another task.
    #[error("report names task {got}, expected {expected}")]
    WrongSubtask {
        /// The task the attempt is for.
        expected: TaskId,
        /// The task the report names.
        got: TaskId,
    },
    /// A finding has no source.
    #[error("finding {index} has no source")]
    UnsourcedFinding {
        /// Its position in the report.
        index: u32,
    },
    /// More findings or gaps than the bounds allow.
    #[error("report exceeds its bounds ({findings} findings, {gaps} gaps)")]
    TooLarge {
        /// Findings given.
        findings: u32,
        /// Gaps given.
        gaps: u32,
    },
    /// A complete report with no findings and no summary: an empty success in disguise.
    #[error("a complete report with no findings and no summary is an empty success")]
    EmptySuccess,
    /// A partial or blocked report must say what is missing.
    #[error("a {0:?} report must list its gaps")]
    MissingGaps(ReportStatus),
    /// A confidence above 1000 per mille.
    #[error("finding {index} has confidence {value} > 1000")]
    BadConfidence {
        /// Its position in the report.
        index: u32,
        /// The value given.
        value: u16,
    },
}

impl SubagentReport {
    /// Check the report against the rules a coordinator relies on before it makes it durable.
    ///
    /// # Errors
    /// The first rule broken, as a [`ReportError`].
    pub fn verify(&self, expected: TaskId) -> Result<(), ReportError> {
        if self.subtask_id != expected {
            return Err(ReportError::WrongSubtask {
                expected,
                got: self.subtask_id,
            });
        }
        if self.findings.len() > FINDINGS_MAX || self.gaps.len() > GAPS_MAX {
            return Err(ReportError::TooLarge {
                findings: u32::try_from(self.findings.len()).unwrap_or(u32::MAX),
                gaps: u32::try_from(self.gaps.len()).unwrap_or(u32::MAX),
            });
        }
        for (i, f) in self.findings.iter().enumerate() {
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            if f.source.trim().is_empty() {
                return Err(ReportError::UnsourcedFinding { index });
            }
            if f.confidence_permille > 1000 {
                return Err(ReportError::BadConfidence {
                    index,
                    value: f.confidence_permille,
                });
            }
        }
        match self.status {
            ReportStatus::Complete
                if self.findings.is_empty() && self.summary.trim().is_empty() =>
            {
                Err(ReportError::EmptySuccess)
            }
            ReportStatus::Partial | ReportStatus::Blocked if self.gaps.is_empty() => {
                Err(ReportError::MissingGaps(self.status))
            }
            _ => Ok(()),
        }
    }

    /// Bound every free-text field, so a verbose agent cannot bloat the store or a message.
    pub fn bound(mut self) -> Self {
        self.summary = bounded(self.summary, TEXT_BYTES_MAX);
        self.gaps.truncate(GAPS_MAX);
        self.gaps = self
            .gaps
            .into_iter()
            .map(|g| bounded(g, TEXT_BYTES_MAX))
            .collect();
        self.findings.truncate(FINDINGS_MAX);
        for f in &mut self.findings {
            f.claim = bounded(std::mem::take(&mut f.claim), TEXT_BYTES_MAX);
            f.source = bounded(std::mem::take(&mut f.source), TEXT_BYTES_MAX);
        }
        self
    }
}

/// What kind of failure ended an attempt. Decides the supervisor's answer (restart, reroute, escalate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The harness reported a failure of this category.
    Harness(ErrorCategory),
    /// The session ended with a stop reason that is not success (max_tokens, refusal, budget, ...).
    NotSuccess,
    /// The final output was not a valid report.
    MalformedReport,
    /// The per-subtask deadline passed with no report.
    Timeout,
    /// The specialist or its node died (a supervision event).
    Crashed,
    /// The coordinator or an operator cancelled it.
    Cancelled,
    /// The admission was refused (limits or budget).
    Refused,
}

impl FailureKind {
    /// The stable name for logs and the store.
    pub fn name(&self) -> &'static str {
        match self {
            FailureKind::Harness(c) => c.name(),
            FailureKind::NotSuccess => "not_success",
            FailureKind::MalformedReport => "malformed_report",
            FailureKind::Timeout => "timeout",
            FailureKind::Crashed => "crashed",
            FailureKind::Cancelled => "cancelled",
            FailureKind::Refused => "refused",
        }
    }
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The typed failure a specialist (or its supervisor, on its behalf) returns (docs/DESIGN.md §8).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskFailure {
    /// What kind of failure.
    pub kind: FailureKind,
    /// What was attempted, in one bounded line (the tools used, how far it got).
    pub attempted: String,
    /// Findings gathered before the failure; kept, never presented as a success.
    pub partial: Vec<Finding>,
    /// Whether trying again can help.
    pub retryable: bool,
    /// When a retry makes sense at the earliest, in milliseconds from now, if the cause said so.
    pub retry_after_ms: Option<u64>,
    /// Bounded detail (the harness error message, the verify error).
    pub detail: String,
}

/// How a task's session starts, and with it what its first message carries: always from keel's
/// store, never from a native resume (docs/DESIGN.md §6). The coordinator decides it for each
/// attempt; `keel context` derives it from a task's row ([`Continuity::for_task`]); the context
/// builders take it to build the preamble ([`crate::context::context_for_task`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Continuity {
    /// A fresh subtask: the brief is the whole context.
    Fresh,
    /// A task with a parent: the standard preamble (parent inline, older ancestors as pointers).
    Standard {
        /// The parent task.
        parent: TaskId,
    },
    /// An interrupted task taken up again (restart, reroute, harness switch, context overflow): the
    /// resume preamble (original brief verbatim plus the last log lines of `from`).
    Resume {
        /// The task whose brief and logs the preamble is built from.
        from: TaskId,
    },
}

impl Continuity {
    /// How a new session of `task` starts, read from its row (what `keel context TASK` shows): a
    /// re-dispatch or a paused task resumes (from the task it replaces, or itself), a task with a
    /// parent gets the standard preamble, a task without one its brief alone.
    pub fn for_task(task: &Task) -> Self {
        if task.kind == TaskKind::Redispatch || task.status == TaskStatus::Paused {
            let from = match task.kind {
                TaskKind::Redispatch => task.parent.unwrap_or(task.id),
                _ => task.id,
            };
            return Self::Resume { from };
        }
        match task.parent {
            Some(parent) => Self::Standard { parent },
            None => Self::Fresh,
        }
    }

    /// Whether the session's preamble is built from stored rows (the standard or the resume
    /// preamble), which the host loads first.
    pub fn loads_rows(self) -> bool {
        !matches!(self, Self::Fresh)
    }
}

/// The readable JSON of a [`Continuity`] where a person reads it (`keel context --json`):
/// `{"kind": "fresh"}`, `{"kind": "standard", "parent": ULID}`, `{"kind": "resume", "from": ULID}`.
/// The wire form of the type (between machines) stays serde's default.
pub mod continuity_json {
    use super::Continuity;
    use keel_store::TaskId;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(tag = "kind", rename_all = "kebab-case")]
    enum Readable {
        Fresh,
        Standard { parent: String },
        Resume { from: String },
    }

    /// Writes `continuity` in its readable form.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(continuity: &Continuity, s: S) -> Result<S::Ok, S::Error> {
        match *continuity {
            Continuity::Fresh => Readable::Fresh,
            Continuity::Standard { parent } => Readable::Standard {
                parent: parent.to_string(),
            },
            Continuity::Resume { from } => Readable::Resume {
                from: from.to_string(),
            },
        }
        .serialize(s)
    }

    /// Reads the readable form back.
    ///
    /// # Errors
    /// An unknown kind, or an id that is not a ULID.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Continuity, D::Error> {
        let id = |text: String| {
            text.parse::<TaskId>()
                .map_err(<D::Error as serde::de::Error>::custom)
        };
        Ok(match Readable::deserialize(d)? {
            Readable::Fresh => Continuity::Fresh,
            Readable::Standard { parent } => Continuity::Standard {
                parent: id(parent)?,
            },
            Readable::Resume { from } => Continuity::Resume { from: id(from)? },
        })
    }
}

/// A finding of an earlier step passed to a dependent step, as structured data with its provenance.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorFinding {
    /// The plan step that produced it.
    pub step: String,
    /// The finding itself.
    pub finding: Finding,
}

/// Everything a specialist is given, and nothing else: goal, quality criteria, the relevant prior
/// findings, the output schema and every constraint restated (docs/DESIGN.md §8: nothing propagates by
/// itself).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubtaskBrief {
    /// The plan step this brief is for.
    pub step: String,
    /// The task it is dispatched as.
    pub task: TaskId,
    /// What to do, verbatim.
    pub brief: String,
    /// The goal, for the report check.
    pub goal: String,
    /// Explicit quality criteria.
    pub quality_criteria: Vec<String>,
    /// Findings of the steps this one depends on (only those), bounded by [`PRIOR_FINDINGS_MAX`].
    pub prior_findings: Vec<PriorFinding>,
    /// The output schema the report must follow.
    pub output_schema: Option<String>,
    /// Constraints, restated for every specialist.
    pub constraints: Vec<String>,
    /// Gaps of dependencies that ended partial, so this step knows its inputs are incomplete.
    pub known_gaps: Vec<String>,
    /// Earlier tasks of the same step (a re-dispatch continues them): a resumed session read their brief
    /// in its preamble and may report under the original id, which the specialist accepts and rewrites.
    #[serde(default)]
    pub aliases: Vec<TaskId>,
}

impl SubtaskBrief {
    /// A brief that is only its step, task, text and goal (no quality criteria, prior findings,
    /// schema, constraints, known gaps or aliases): what a scripted start, a test or a benchmark
    /// dispatches; a planned step's brief is built by the coordinator with all of them.
    pub fn plain(
        step: impl Into<String>,
        task: TaskId,
        brief: impl Into<String>,
        goal: impl Into<String>,
    ) -> Self {
        Self {
            step: step.into(),
            task,
            brief: brief.into(),
            goal: goal.into(),
            quality_criteria: Vec::new(),
            prior_findings: Vec::new(),
            output_schema: None,
            constraints: Vec::new(),
            known_gaps: Vec::new(),
            aliases: Vec::new(),
        }
    }
}

/// The result of a step as it is made durable: either a verified report or a typed failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepOutcome {
    /// A verified report from this attempt.
    Report(SubagentReport),
    /// The step's retry budget is spent or it was escalated; this is the last failure.
    Failed(SubtaskFailure),
    /// Not dispatched because a dependency produced no usable report.
    Skipped {
        /// Why (which dependency failed).
        reason: String,
    },
}

/// A report or failure tagged with the attempt it came from, as the coordinator receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptResult {
    /// Which attempt produced it.
    pub attempt: AttemptId,
    /// What it produced.
    pub outcome: Result<SubagentReport, SubtaskFailure>,
    /// What the attempt spent, in micro-dollars (settled in the supervisor's ledger).
    pub spent_micros: u64,
}

/// The instruction that ends every specialist prompt: the report format the specialist machine parses.
pub const REPORT_INSTRUCTION: &str = "When you are done, end your answer with one JSON object of this \
form and nothing after it: {\"subtask_id\": \"<task id>\", \"status\": \"complete\"|\"partial\"|\"blocked\", \
\"findings\": [{\"claim\": \"...\", \"source\": \"...\", \"confidence_permille\": 0-1000}], \"gaps\": [\"...\"], \
\"summary\": \"...\"}. Every finding names its source. A partial or blocked report lists its gaps.";

impl SubtaskBrief {
    /// The brief as the text a session reads and the task row keeps (so a resume preamble carries it
    /// verbatim): the brief, then goal, criteria, prior findings as JSON, known gaps, constraints, the
    /// output schema and the report instruction. Deterministic: same brief, same bytes.
    pub fn render(&self) -> String {
        let mut text = String::with_capacity(self.brief.len() + 512);
        text.push_str(&self.brief);
        text.push_str("\n\nSubtask id: ");
        text.push_str(&self.task.to_string());
        text.push_str("\nGoal: ");
        text.push_str(&self.goal);
        if !self.quality_criteria.is_empty() {
            text.push_str("\nQuality criteria:");
            for c in &self.quality_criteria {
                text.push_str("\n- ");
                text.push_str(c);
            }
        }
        if !self.prior_findings.is_empty() {
            text.push_str("\nPrior findings (JSON, from the steps this one depends on):\n");
            // Serialising plain strings and integers cannot fail; an empty list is the safe fallback.
            text.push_str(
                &serde_json::to_string(&self.prior_findings).unwrap_or_else(|_| "[]".into()),
            );
        }
        if !self.known_gaps.is_empty() {
            text.push_str("\nKnown gaps in those findings:");
            for g in &self.known_gaps {
                text.push_str("\n- ");
                text.push_str(g);
            }
        }
        if !self.constraints.is_empty() {
            text.push_str("\nConstraints:");
            for c in &self.constraints {
                text.push_str("\n- ");
                text.push_str(c);
            }
        }
        if let Some(schema) = &self.output_schema {
            text.push_str("\nOutput schema: ");
            text.push_str(schema);
        }
        text.push_str("\n\n");
        text.push_str(REPORT_INSTRUCTION);
        text
    }
}

/// A report read from a session's final text, with what had to be normalised to read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadReport {
    /// The report.
    pub report: SubagentReport,
    /// What was changed to read it, one phrase each (empty for a report written exactly to its
    /// shape): the specialist records it on the session's log.
    pub normalised: Vec<String>,
}

/// Where a report may stand in a final text, best first: the whole text, the last fenced ```json
/// block, then the spans from each of the last 64 `{` to the end (the last opening first).
fn candidates(trimmed: &str) -> (Vec<&str>, usize) {
    let mut found = vec![trimmed];
    if let Some(start) = trimmed.rfind("```json") {
        let body = &trimmed[start + "```json".len()..];
        found.push(body.split("```").next().unwrap_or(body).trim());
    }
    let openings = found.len();
    // Bounded: at most 64 candidate openings from the end.
    for (i, _) in trimmed.match_indices('{').rev().take(64) {
        found.push(trimmed[i..].trim());
    }
    (found, openings)
}

/// Find the report in a session's final text ([`candidates`]), read exactly as written; failing
/// that, read with the common variants of a real model's writing normalised (see
/// `report::normalise`: a confidence as a fraction or a percentage, a status in other words, a
/// missing list, summary or task id, which is then `expected`).
///
/// # Errors
/// The exact JSON error of the best candidate read as written, when none reads either way.
pub fn read_report(final_text: &str, expected: Option<TaskId>) -> Result<ReadReport, String> {
    let trimmed = final_text.trim();
    // The whole text is the first candidate: a report written exactly to its shape is read without
    // looking for the others.
    if let Ok(report) = serde_json::from_str::<SubagentReport>(trimmed) {
        return Ok(ReadReport {
            report,
            normalised: Vec::new(),
        });
    }
    let (candidates, openings) = candidates(trimmed);
    let mut last_err = String::from("no JSON object in the final text");
    for (i, candidate) in candidates.iter().enumerate().skip(1) {
        match serde_json::from_str::<SubagentReport>(candidate) {
            Ok(report) => {
                return Ok(ReadReport {
                    report,
                    normalised: Vec::new(),
                });
            }
            Err(e) if i >= openings => last_err = e.to_string(),
            Err(_) => {}
        }
    }
    let expected = expected.map(|t| t.to_string());
    for candidate in &candidates {
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(candidate) else {
            continue;
        };
        let normalised = normalise::normalise(&mut value, expected.as_deref());
        if normalised.is_empty() {
            continue;
        }
        if let Ok(report) = serde_json::from_value::<SubagentReport>(value) {
            return Ok(ReadReport { report, normalised });
        }
    }
    Err(last_err)
}

/// A session's final text as the report of `task` (or of one of `aliases`, the earlier tasks of its
/// step, rewritten to `task`): read ([`read_report`]), bounded and verified. One function for the
/// specialist's verdict and the Stop hook's report check, so both give the same exact error.
///
/// # Errors
/// The exact error, as the attempt's failure detail says it.
pub fn accept_report(
    final_text: &str,
    task: TaskId,
    aliases: &[TaskId],
) -> Result<ReadReport, String> {
    let read = read_report(final_text, Some(task))
        .map_err(|e| format!("the final output is not a report: {e}"))?;
    let mut report = read.report.bound();
    if aliases.contains(&report.subtask_id) {
        report.subtask_id = task;
    }
    report.verify(task).map_err(|e| e.to_string())?;
    Ok(ReadReport {
        report,
        normalised: read.normalised,
    })
}

/// What a session whose final text is not a report is sent back with: the exact `error`, then what
/// to do (docs/DESIGN.md §9, the Stop hook's report check).
pub fn re_ask_text(error: &str) -> String {
    format!(
        "{}: {error}. Reply once more with your report as one JSON object and nothing after it, \
         every finding with its source. {REPORT_INSTRUCTION}",
        keel_harness::RE_ASK_MARKER
    )
}

/// The Stop hook's report check as a judge (keel's own loop calls it in process; `keel hook stop`
/// calls [`judge_final_text`] for a CLI's Stop hook).
#[derive(Clone, Copy, Debug, Default)]
pub struct ReportJudge;

impl keel_harness::StopJudge for ReportJudge {
    fn judge(&self, check: &keel_harness::StopCheck, final_text: &str) -> Result<(), String> {
        judge_final_text(&check.report_for, final_text)
    }
}

/// Judges a final text against the task ids a report may name (the first is the session's own):
/// `Ok` when it is a valid report, else the re-ask ([`re_ask_text`]). Ids that are not task ids
/// leave nothing to check against, so the text passes (the specialist's own verdict still runs).
///
/// # Errors
/// The re-ask text.
pub fn judge_final_text(report_for: &[String], final_text: &str) -> Result<(), String> {
    let ids: Vec<TaskId> = report_for.iter().filter_map(|t| t.parse().ok()).collect();
    let Some((task, aliases)) = ids.split_first() else {
        return Ok(());
    };
    accept_report(final_text, *task, aliases)
        .map(|_| ())
        .map_err(|e| re_ask_text(&e))
}

/// [`read_report`] without a task to fill in: the report alone.
///
/// # Errors
/// As [`read_report`].
pub fn parse_report(final_text: &str) -> Result<SubagentReport, String> {
    read_report(final_text, None).map(|r| r.report)
}

/// Task ids as ULID text in reports, the form an agent reads in its brief and writes back.
mod task_id_text {
    use keel_store::TaskId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &TaskId, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<TaskId, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;

    const TASK: TaskId = TaskId(0x01AB_CDEF);

    #[test]
    fn a_report_written_slightly_off_is_read_and_the_changes_are_said() {
        let text = r#"Done. {"status": "Completed", "findings": [{"claim": "c", "source": "s", "confidence": 0.9}, {"claim": "d", "source": "t", "confidence_permille": "85%"}], "summary": "ok"}"#;
        let read = read_report(text, Some(TASK)).unwrap();
        assert_eq!(read.report.subtask_id, TASK);
        assert_eq!(read.report.status, ReportStatus::Complete);
        assert_eq!(read.report.findings[0].confidence_permille, 900);
        assert_eq!(read.report.findings[1].confidence_permille, 850);
        assert!(read.report.gaps.is_empty());
        let said = read.normalised.join("; ");
        assert!(said.contains("subtask_id missing"), "{said}");
        assert!(
            said.contains("status \"Completed\" read as \"complete\""),
            "{said}"
        );
        assert!(
            said.contains("finding 0: confidence 0.9 read as 900 per mille"),
            "{said}"
        );
        assert!(said.contains("gaps missing"), "{said}");
    }

    #[test]
    fn an_exact_report_is_not_normalised_and_a_broken_one_keeps_its_exact_error() {
        let exact = format!(
            r#"{{"subtask_id":"{TASK}","status":"complete","findings":[],"gaps":[],"summary":"s"}}"#
        );
        assert!(
            read_report(&exact, Some(TASK))
                .unwrap()
                .normalised
                .is_empty()
        );
        let broken = r#"{"subtask_id": 7, "status": "complete""#;
        let e = read_report(broken, Some(TASK)).unwrap_err();
        assert!(e.contains("EOF") || e.contains("line 1"), "{e}");
        // A confidence out of any range is left for the report's check to refuse.
        let loud = r#"{"status":"complete","findings":[{"claim":"c","source":"s","confidence":5000}],"summary":"s"}"#;
        assert!(read_report(loud, Some(TASK)).is_err());
    }
}
