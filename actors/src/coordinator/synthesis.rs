//! The end of a run: its synthesis, coverage table and conflicts, as pure functions of the steps'
//! outcomes (no state, no clock), so each rule is tested on its own.

use super::one_line;
use crate::report::{PriorFinding, ReportStatus, StepOutcome, bounded};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Most findings a synthesis carries.
pub const SYNTHESIS_FINDINGS_MAX: usize = 256;

/// Most bytes of one claim in a synthesis.
pub const SYNTHESIS_CLAIM_BYTES_MAX: usize = 512;

/// One line of a synthesis' coverage table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// The step.
    pub step: String,
    /// How much of it was done.
    pub status: CoverageStatus,
    /// Why it is not complete, if it is not.
    pub note: Option<String>,
}

/// How much of a step a run covered. Serialized as its lower-case name (`complete`, `partial`, ...),
/// which is what a synthesis row and `keel` output show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoverageStatus {
    /// A complete report.
    Complete,
    /// A report with gaps.
    Partial,
    /// A report that says the step could not be done (its findings are not used).
    Blocked,
    /// The step failed and its retries were spent (or it was escalated).
    Failed,
    /// The step was not dispatched (its dependencies produced nothing usable).
    Skipped,
    /// The run ended before the step did.
    Cancelled,
}

impl CoverageStatus {
    /// The stable name, as serialized.
    pub fn as_str(&self) -> &'static str {
        match self {
            CoverageStatus::Complete => "complete",
            CoverageStatus::Partial => "partial",
            CoverageStatus::Blocked => "blocked",
            CoverageStatus::Failed => "failed",
            CoverageStatus::Skipped => "skipped",
            CoverageStatus::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for CoverageStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One step as a synthesis sees it: its key and its durable outcome (`None` when it never finished).
#[derive(Clone, Copy, Debug)]
pub struct StepEnd<'a> {
    /// The step's key.
    pub key: &'a str,
    /// Its outcome, if it has one.
    pub outcome: Option<&'a StepOutcome>,
}

/// The coverage line of one step: a report's status, or why there is none, with a note that says
/// plainly what is missing.
pub fn coverage_of(step: StepEnd<'_>) -> Coverage {
    let (status, note) = match step.outcome {
        Some(StepOutcome::Report(r)) => match r.status {
            ReportStatus::Complete => (CoverageStatus::Complete, None),
            ReportStatus::Partial => (
                CoverageStatus::Partial,
                Some(format!("{} gaps", r.gaps.len())),
            ),
            ReportStatus::Blocked => (CoverageStatus::Blocked, Some(one_line(&r.summary))),
        },
        Some(StepOutcome::Failed(f)) => (
            CoverageStatus::Failed,
            Some(format!("{}: {}", f.kind.name(), one_line(&f.detail))),
        ),
        Some(StepOutcome::Skipped { reason }) => (CoverageStatus::Skipped, Some(reason.clone())),
        None => (
            CoverageStatus::Cancelled,
            Some("the run ended before it finished".into()),
        ),
    };
    Coverage {
        step: step.key.to_string(),
        status,
        note,
    }
}

/// The end of a run: what was found, with its provenance, and an honest coverage table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Synthesis {
    /// Per step, in plan order.
    pub coverage: Vec<Coverage>,
    /// Whether any step is not complete (the annotation readers must see).
    pub partial_coverage: bool,
    /// Findings of every usable report, each with its step, bounded by [`SYNTHESIS_FINDINGS_MAX`].
    pub findings: Vec<PriorFinding>,
    /// Findings left out by the bound.
    pub findings_omitted: u32,
    /// Gaps of every report, prefixed with their step.
    pub gaps: Vec<String>,
    /// Places where steps disagree, each kept whole (never first-wins, never dropped), bounded by
    /// [`SYNTHESIS_CONFLICTS_MAX`].
    #[serde(default)]
    pub conflicts: Vec<Conflict>,
    /// One paragraph.
    pub summary: String,
}

/// Most conflicts a synthesis lists.
pub const SYNTHESIS_CONFLICTS_MAX: usize = 64;

/// Two or more steps cite the same place in the same source for different claims: a disagreement
/// about what that source says, which a reader must resolve. Every claim is kept with its step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// The source, with its document and page when given (`source#document@page`).
    pub location: String,
    /// `(step, claim)` for each distinct claim, in step order.
    pub claims: Vec<(String, String)>,
}

/// Find the conflicts among findings: same source location, different claims, from different steps.
/// Deterministic (ordered maps), bounded by [`SYNTHESIS_CONFLICTS_MAX`].
pub fn find_conflicts(findings: &[PriorFinding]) -> Vec<Conflict> {
    let mut by_location: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for f in findings {
        let loc = format!(
            "{}#{}@{}",
            f.finding.source.trim(),
            f.finding.document.as_deref().unwrap_or("").trim(),
            f.finding.page.map_or(String::new(), |p| p.to_string())
        );
        let claim = crate::context::collapse_whitespace(&f.finding.claim, usize::MAX);
        let entry = by_location.entry(loc).or_default();
        if !entry.iter().any(|(_, c)| c.eq_ignore_ascii_case(&claim)) {
            entry.push((f.step.clone(), claim.into_owned()));
        }
    }
    by_location
        .into_iter()
        .filter(|(_, claims)| {
            let steps: BTreeSet<&str> = claims.iter().map(|(s, _)| s.as_str()).collect();
            claims.len() > 1 && steps.len() > 1
        })
        .take(SYNTHESIS_CONFLICTS_MAX)
        .map(|(location, claims)| Conflict { location, claims })
        .collect()
}

/// Build the synthesis of a run from its steps: every usable finding with its step, every gap, and a
/// coverage line per step ([`coverage_of`]). Findings beyond [`SYNTHESIS_FINDINGS_MAX`] are counted in
/// `findings_omitted`; disagreements are listed by [`find_conflicts`].
pub fn synthesize(steps: &[StepEnd<'_>]) -> Synthesis {
    let mut coverage = Vec::new();
    let mut findings = Vec::new();
    let mut omitted = 0u32;
    let mut gaps = Vec::new();
    for s in steps {
        if let Some(StepOutcome::Report(r)) = s.outcome {
            for g in &r.gaps {
                if gaps.len() < crate::report::GAPS_MAX * 4 {
                    gaps.push(format!("{}: {}", s.key, bounded(g.clone(), 512)));
                }
            }
            if r.status != ReportStatus::Blocked {
                for f in &r.findings {
                    if findings.len() < SYNTHESIS_FINDINGS_MAX {
                        let mut f = f.clone();
                        f.claim = bounded(f.claim, SYNTHESIS_CLAIM_BYTES_MAX);
                        findings.push(PriorFinding {
                            step: s.key.to_string(),
                            finding: f,
                        });
                    } else {
                        omitted += 1;
                    }
                }
            }
        }
        coverage.push(coverage_of(*s));
    }
    let complete = coverage
        .iter()
        .filter(|c| c.status == CoverageStatus::Complete)
        .count();
    let partial = complete < steps.len();
    let summary = if partial {
        let missing: Vec<String> = coverage
            .iter()
            .filter(|c| c.status != CoverageStatus::Complete)
            .map(|c| format!("{} ({})", c.step, c.status))
            .collect();
        format!(
            "partial coverage: {complete} of {} steps complete; incomplete: {}",
            steps.len(),
            bounded(missing.join(", "), 2048)
        )
    } else {
        format!("complete coverage: all {} steps complete", steps.len())
    };
    let conflicts = find_conflicts(&findings);
    let summary = if conflicts.is_empty() {
        summary
    } else {
        format!(
            "{summary}; {} conflicts between steps kept for review",
            conflicts.len()
        )
    };
    Synthesis {
        coverage,
        partial_coverage: partial,
        findings,
        findings_omitted: omitted,
        gaps,
        conflicts,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{FailureKind, Finding, SubagentReport, SubtaskFailure};
    use keel_store::TaskId;

    fn finding(claim: &str, source: &str, page: Option<u32>) -> Finding {
        Finding {
            claim: claim.into(),
            source: source.into(),
            document: None,
            page,
            confidence_permille: 500,
            retrieved_by: String::new(),
            retrieved_at_ms: 0,
        }
    }

    fn report(status: ReportStatus, findings: Vec<Finding>, gaps: &[&str]) -> StepOutcome {
        StepOutcome::Report(SubagentReport {
            subtask_id: TaskId(1),
            status,
            findings,
            gaps: gaps.iter().map(|g| g.to_string()).collect(),
            summary: "could not  reach\nthe source".into(),
        })
    }

    fn failed() -> StepOutcome {
        StepOutcome::Failed(SubtaskFailure {
            kind: FailureKind::Timeout,
            attempted: String::new(),
            partial: Vec::new(),
            retryable: false,
            retry_after_ms: None,
            detail: "no report in time".into(),
        })
    }

    fn end<'a>(key: &'a str, outcome: Option<&'a StepOutcome>) -> StepEnd<'a> {
        StepEnd { key, outcome }
    }

    /// One coverage line per outcome: `(status, note)`.
    fn check_coverage(outcome: Option<&StepOutcome>, status: CoverageStatus, note: Option<&str>) {
        let c = coverage_of(end("s", outcome));
        assert_eq!(
            (c.step.as_str(), c.status, c.note.as_deref()),
            ("s", status, note)
        );
    }

    #[test]
    fn coverage_says_what_each_outcome_is_and_what_is_missing() {
        let complete = report(ReportStatus::Complete, Vec::new(), &[]);
        let partial = report(ReportStatus::Partial, Vec::new(), &["g1", "g2"]);
        let blocked = report(ReportStatus::Blocked, Vec::new(), &[]);
        let skipped = StepOutcome::Skipped {
            reason: "dependency a failed".into(),
        };
        check_coverage(Some(&complete), CoverageStatus::Complete, None);
        check_coverage(Some(&partial), CoverageStatus::Partial, Some("2 gaps"));
        check_coverage(
            Some(&blocked),
            CoverageStatus::Blocked,
            Some("could not reach the source"),
        );
        check_coverage(
            Some(&failed()),
            CoverageStatus::Failed,
            Some("timeout: no report in time"),
        );
        check_coverage(
            Some(&skipped),
            CoverageStatus::Skipped,
            Some("dependency a failed"),
        );
        check_coverage(
            None,
            CoverageStatus::Cancelled,
            Some("the run ended before it finished"),
        );
    }

    #[test]
    fn coverage_status_serializes_as_its_lower_case_name() {
        for status in [
            CoverageStatus::Complete,
            CoverageStatus::Partial,
            CoverageStatus::Blocked,
            CoverageStatus::Failed,
            CoverageStatus::Skipped,
            CoverageStatus::Cancelled,
        ] {
            let json = serde_json::to_string(&status).unwrap_or_default();
            assert_eq!(json, format!("\"{status}\""));
        }
    }

    #[test]
    fn a_synthesis_of_complete_steps_is_complete_and_keeps_every_finding_with_its_step() {
        let a = report(ReportStatus::Complete, vec![finding("x", "s1", None)], &[]);
        let b = report(ReportStatus::Complete, vec![finding("y", "s2", None)], &[]);
        let s = synthesize(&[end("a", Some(&a)), end("b", Some(&b))]);
        assert!(!s.partial_coverage);
        assert_eq!(s.summary, "complete coverage: all 2 steps complete");
        let got: Vec<(&str, &str)> = s
            .findings
            .iter()
            .map(|f| (f.step.as_str(), f.finding.claim.as_str()))
            .collect();
        assert_eq!(got, vec![("a", "x"), ("b", "y")]);
    }

    #[test]
    fn a_failure_stays_a_failure_and_blocked_findings_are_not_used_but_its_gaps_are_kept() {
        let blocked = report(
            ReportStatus::Blocked,
            vec![finding("z", "s", None)],
            &["no access"],
        );
        let ok = report(ReportStatus::Complete, Vec::new(), &[]);
        let failed = failed();
        let s = synthesize(&[
            end("a", Some(&ok)),
            end("b", Some(&blocked)),
            end("c", Some(&failed)),
            end("d", None),
        ]);
        assert!(s.partial_coverage);
        assert!(
            s.findings.is_empty(),
            "a blocked report's findings are not used"
        );
        assert_eq!(s.gaps, vec!["b: no access".to_string()]);
        assert_eq!(
            s.summary,
            "partial coverage: 1 of 4 steps complete; incomplete: b (blocked), c (failed), d (cancelled)"
        );
    }

    #[test]
    fn findings_beyond_the_bound_are_counted_not_silently_lost() {
        let many: Vec<Finding> = (0..SYNTHESIS_FINDINGS_MAX + 3)
            .map(|i| finding(&format!("claim {i}"), "s", None))
            .collect();
        let a = report(ReportStatus::Complete, many, &[]);
        let s = synthesize(&[end("a", Some(&a))]);
        assert_eq!(s.findings.len(), SYNTHESIS_FINDINGS_MAX);
        assert_eq!(s.findings_omitted, 3);
    }

    #[test]
    fn a_disagreement_between_steps_is_a_conflict_and_is_named_in_the_summary() {
        let a = report(
            ReportStatus::Complete,
            vec![finding("it is 20", "doc", Some(4))],
            &[],
        );
        let b = report(
            ReportStatus::Complete,
            vec![finding("it is 30", "doc", Some(4))],
            &[],
        );
        let s = synthesize(&[end("a", Some(&a)), end("b", Some(&b))]);
        assert_eq!(s.conflicts.len(), 1);
        assert_eq!(s.conflicts[0].location, "doc#@4");
        assert!(
            s.summary
                .ends_with("; 1 conflicts between steps kept for review")
        );
    }

    #[test]
    fn the_same_claim_from_two_steps_or_two_claims_from_one_step_are_not_conflicts() {
        let prior = |step: &str, claim: &str| PriorFinding {
            step: step.into(),
            finding: finding(claim, "doc", Some(1)),
        };
        assert!(find_conflicts(&[prior("a", "It is  20"), prior("b", "it is 20")]).is_empty());
        assert!(find_conflicts(&[prior("a", "it is 20"), prior("a", "it is 30")]).is_empty());
        assert_eq!(
            find_conflicts(&[prior("a", "it is 20"), prior("b", "it is 30")]).len(),
            1
        );
    }
}
