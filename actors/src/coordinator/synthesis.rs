//! The end of a run: its synthesis, coverage table and conflicts.

use super::one_line;
use super::step::Step;
use crate::report::{PriorFinding, ReportStatus, StepOutcome, bounded};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Most findings a synthesis carries.
pub const SYNTHESIS_FINDINGS_MAX: usize = 256;

/// Most bytes of one claim in a synthesis.
pub const SYNTHESIS_CLAIM_BYTES_MAX: usize = 512;

/// One line of a synthesis' coverage table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// The step.
    pub step: String,
    /// `complete`, `partial`, `blocked`, `failed`, `skipped` or `cancelled`.
    pub status: String,
    /// Why it is not complete, if it is not.
    pub note: Option<String>,
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
        let claim = f
            .finding
            .claim
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let entry = by_location.entry(loc).or_default();
        if !entry.iter().any(|(_, c)| c.eq_ignore_ascii_case(&claim)) {
            entry.push((f.step.clone(), claim));
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
/// coverage line per step that says plainly what is missing.
pub(super) fn synthesize(steps: &[Step]) -> Synthesis {
    let mut coverage = Vec::new();
    let mut findings = Vec::new();
    let mut omitted = 0u32;
    let mut gaps = Vec::new();
    let mut complete = 0usize;
    for s in steps {
        let (status, note) = match &s.outcome {
            Some(StepOutcome::Report(r)) => {
                for g in &r.gaps {
                    if gaps.len() < crate::report::GAPS_MAX * 4 {
                        gaps.push(format!("{}: {}", s.spec.key, bounded(g.clone(), 512)));
                    }
                }
                if r.status != ReportStatus::Blocked {
                    for f in &r.findings {
                        if findings.len() < SYNTHESIS_FINDINGS_MAX {
                            let mut f = f.clone();
                            f.claim = bounded(f.claim, SYNTHESIS_CLAIM_BYTES_MAX);
                            findings.push(PriorFinding {
                                step: s.spec.key.clone(),
                                finding: f,
                            });
                        } else {
                            omitted += 1;
                        }
                    }
                }
                match r.status {
                    ReportStatus::Complete => {
                        complete += 1;
                        ("complete", None)
                    }
                    ReportStatus::Partial => ("partial", Some(format!("{} gaps", r.gaps.len()))),
                    ReportStatus::Blocked => ("blocked", Some(one_line(&r.summary))),
                }
            }
            Some(StepOutcome::Failed(f)) => (
                "failed",
                Some(format!("{}: {}", f.kind.name(), one_line(&f.detail))),
            ),
            Some(StepOutcome::Skipped { reason }) => ("skipped", Some(reason.clone())),
            None => ("cancelled", Some("the run ended before it finished".into())),
        };
        coverage.push(Coverage {
            step: s.spec.key.clone(),
            status: status.into(),
            note,
        });
    }
    let partial = complete < steps.len();
    let summary = if partial {
        let missing: Vec<String> = coverage
            .iter()
            .filter(|c| c.status != "complete")
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
