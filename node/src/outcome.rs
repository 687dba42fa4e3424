//! A stored outcome (a task's or a run's, kept as JSON in the store) told as a sentence for the
//! places a person reads it: the end of `keel run`, `keel show`, `keel status`. `--json` keeps
//! the structure; only the text output goes through here. Pure: no IO.

use keel_actors::{FailureKind, StepOutcome, Synthesis};
use keel_harness::ErrorCategory;

/// `outcome` as a person reads it: a failure as "what went wrong: the detail", a report as its
/// status and summary, a skipped step with its reason, a synthesis as its summary, anything else
/// (a plain reason such as "plan rejected: ...") as it is.
pub(crate) fn sentence(outcome: &str) -> String {
    if let Ok(step) = serde_json::from_str::<StepOutcome>(outcome) {
        return step_sentence(&step);
    }
    if let Ok(synthesis) = serde_json::from_str::<Synthesis>(outcome) {
        return synthesis.summary;
    }
    outcome.to_owned()
}

/// One step's outcome as a sentence.
pub(crate) fn step_sentence(step: &StepOutcome) -> String {
    match step {
        StepOutcome::Report(r) => {
            let status = match r.status {
                keel_actors::ReportStatus::Complete => "complete",
                keel_actors::ReportStatus::Partial => "partial",
                keel_actors::ReportStatus::Blocked => "blocked",
            };
            let mut text = format!("{status}: {}", r.summary.trim());
            if !r.gaps.is_empty() {
                text.push_str(&format!(" (gaps: {})", r.gaps.join("; ")));
            }
            text
        }
        StepOutcome::Failed(f) => {
            let detail = f.detail.trim();
            let what = failure_phrase(f.kind);
            if detail.is_empty() {
                what.to_owned()
            } else {
                format!("{what}: {detail}")
            }
        }
        StepOutcome::Skipped { reason } => format!("skipped: {reason}"),
    }
}

/// `outcome` as the lines `keel show` prints: the sentence, then a report's findings and gaps, or a
/// failure's attempt, whether a retry can help, and what it found before it failed.
pub(crate) fn lines(outcome: &str) -> Vec<String> {
    let Ok(step) = serde_json::from_str::<StepOutcome>(outcome) else {
        return vec![sentence(outcome)];
    };
    let mut lines = vec![step_sentence(&step)];
    let findings = match &step {
        StepOutcome::Report(r) => &r.findings[..],
        StepOutcome::Failed(f) => {
            if !f.attempted.trim().is_empty() {
                lines.push(format!("attempted: {}", f.attempted.trim()));
            }
            lines.push(if f.retryable {
                "a retry can help".to_owned()
            } else {
                "a retry of the same request will not help".to_owned()
            });
            &f.partial[..]
        }
        StepOutcome::Skipped { .. } => &[][..],
    };
    for f in findings {
        lines.push(format!(
            "finding: {} (source {}, confidence {}‰)",
            f.claim, f.source, f.confidence_permille
        ));
    }
    lines
}

/// What a kind of failure means, in words.
pub(crate) fn failure_phrase(kind: FailureKind) -> &'static str {
    match kind {
        FailureKind::Harness(c) => match c {
            ErrorCategory::Transient => "the harness hit a passing fault",
            ErrorCategory::RateLimited { .. } => "the account hit a rate limit",
            ErrorCategory::BusinessRule => "the model's endpoint refused the request",
            ErrorCategory::Permission => "a policy or sandbox refused an action",
            ErrorCategory::Auth => "the credentials were refused",
            ErrorCategory::ContextOverflow => "the conversation outgrew the model's context",
            ErrorCategory::System => "the harness could not run",
            ErrorCategory::Cancelled => "the session was cancelled",
        },
        FailureKind::NotSuccess => "the session stopped before it finished",
        FailureKind::MalformedReport => "the session's report could not be read",
        FailureKind::Timeout => "the subtask's deadline passed without a report",
        FailureKind::Crashed => "the specialist or its node died",
        FailureKind::Cancelled => "cancelled",
        FailureKind::Refused => "the supervisor refused to start it (a limit or the budget)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_actors::SubtaskFailure;

    #[test]
    fn a_failure_reads_as_what_went_wrong_then_its_detail() {
        let failed = StepOutcome::Failed(SubtaskFailure {
            kind: FailureKind::Harness(ErrorCategory::System),
            attempted: "start the session".into(),
            partial: Vec::new(),
            retryable: false,
            retry_after_ms: None,
            detail: "environment variable ANTHROPIC_API_KEY is not set".into(),
        });
        let stored = serde_json::to_string(&failed).unwrap_or_default();
        assert!(stored.starts_with("{\"Failed\""), "{stored}");
        assert_eq!(
            sentence(&stored),
            "the harness could not run: environment variable ANTHROPIC_API_KEY is not set"
        );
    }

    #[test]
    fn plain_text_stays_as_it_is() {
        assert_eq!(sentence("plan rejected: a cycle"), "plan rejected: a cycle");
        assert_eq!(
            sentence("{\"not\": \"an outcome\"}"),
            "{\"not\": \"an outcome\"}"
        );
    }
}
