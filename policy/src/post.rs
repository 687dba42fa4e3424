//! `PostToolUse` (docs/DESIGN.md §9): after a call ran and before the model sees its result, the
//! matching hooks run in the policy's order, each on the result the previous one handed on. A hook
//! keeps the result, rewrites it (normalise, redact), or withholds it (the model sees the hook's
//! reason as an error instead). A mandatory hook that fails or times out withholds the result: a
//! redaction that could not run must not leak what it was meant to remove. A hook that is not
//! mandatory and fails is audited and ignored. Each hook that ran is one audit line.

use keel_harness::ToolOutput;
use keel_store::HookDecision;
use serde::{Deserialize, Serialize};

use crate::chain::AuditLine;

/// What one `PostToolUse` hook answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum PostHookResult {
    /// The result goes on unchanged.
    Keep,
    /// The result is replaced by `text` (same error flag).
    Rewrite {
        /// The new result.
        text: String,
    },
    /// The result is withheld: the model sees `reason` as an error result.
    Withhold {
        /// Why (told to the model).
        reason: String,
    },
    /// The hook itself failed.
    Failed {
        /// What went wrong.
        error: String,
    },
    /// The hook did not answer within its timeout.
    TimedOut {
        /// The timeout it had.
        after_ms: u64,
    },
}

/// One `PostToolUse` hook's outcome, as the caller ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostHookOutcome {
    /// The hook's name.
    pub hook: String,
    /// Whether its failure withholds the result.
    pub mandatory: bool,
    /// What it answered.
    pub result: PostHookResult,
}

impl PostHookOutcome {
    /// Applies this outcome to `output` (the result so far) and answers its audit line and whether
    /// no later hook should run (a withheld result).
    pub fn apply(&self, output: &mut ToolOutput) -> (AuditLine, bool) {
        let line = |decision: HookDecision, reason: String, rewritten: bool| AuditLine {
            who: format!("hook:{}", self.hook),
            decision,
            reason,
            rewritten,
        };
        let failure = |what: String, output: &mut ToolOutput| {
            if self.mandatory {
                let reason = format!(
                    "mandatory PostToolUse hook {} failed closed ({what}): the result is withheld",
                    self.hook
                );
                *output = ToolOutput {
                    is_error: true,
                    text: format!("keel: {reason}"),
                };
                (line(HookDecision::Error, reason, true), true)
            } else {
                let reason = format!(
                    "PostToolUse hook {} failed (not mandatory, ignored): {what}",
                    self.hook
                );
                (line(HookDecision::Error, reason, false), false)
            }
        };
        match &self.result {
            PostHookResult::Keep => (line(HookDecision::Defer, String::new(), false), false),
            PostHookResult::Rewrite { text } => {
                let reason = format!(
                    "rewrote the result ({} to {} bytes)",
                    output.text.len(),
                    text.len()
                );
                output.text = text.clone();
                (line(HookDecision::Allow, reason, true), false)
            }
            PostHookResult::Withhold { reason } => {
                *output = ToolOutput {
                    is_error: true,
                    text: reason.clone(),
                };
                (line(HookDecision::Deny, reason.clone(), true), true)
            }
            PostHookResult::Failed { error } => failure(error.clone(), output),
            PostHookResult::TimedOut { after_ms } => {
                failure(format!("timed out after {after_ms} ms"), output)
            }
        }
    }
}

/// Applies `outcomes` in order to `output`, stopping at the first that withholds it: the result the
/// model sees and the audit trail (pure; the caller ran the hooks, each on the result so far).
pub fn apply_post_hooks(
    outcomes: &[PostHookOutcome],
    mut output: ToolOutput,
) -> (ToolOutput, Vec<AuditLine>) {
    let mut trail = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        let (line, ends) = outcome.apply(&mut output);
        trail.push(line);
        if ends {
            break;
        }
    }
    (output, trail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(text: &str) -> ToolOutput {
        ToolOutput {
            is_error: false,
            text: text.into(),
        }
    }

    fn hook(name: &str, mandatory: bool, result: PostHookResult) -> PostHookOutcome {
        PostHookOutcome {
            hook: name.into(),
            mandatory,
            result,
        }
    }

    fn every_result() -> Vec<PostHookResult> {
        vec![
            PostHookResult::Keep,
            PostHookResult::Rewrite {
                text: "clean".into(),
            },
            PostHookResult::Withhold {
                reason: "no".into(),
            },
            PostHookResult::Failed {
                error: "crash".into(),
            },
            PostHookResult::TimedOut { after_ms: 5 },
        ]
    }

    /// Every pair of hooks, mandatory or not, against the documented rules written as an oracle.
    #[test]
    fn every_pair_of_post_hooks_follows_the_documented_rules() {
        let mut cases = 0;
        for (ma, a) in [false, true]
            .into_iter()
            .flat_map(|m| every_result().into_iter().map(move |r| (m, r)))
        {
            for (mb, b) in [false, true]
                .into_iter()
                .flat_map(|m| every_result().into_iter().map(move |r| (m, r)))
            {
                cases += 1;
                let outcomes = [hook("a", ma, a.clone()), hook("b", mb, b.clone())];
                let (got, trail) = apply_post_hooks(&outcomes, out("secret=1"));
                // Oracle: walk the hooks as the documentation says.
                let mut want = out("secret=1");
                let mut ran = 0;
                for (m, r) in [(ma, &a), (mb, &b)] {
                    ran += 1;
                    let withheld = match r {
                        PostHookResult::Keep => false,
                        PostHookResult::Rewrite { text } => {
                            want.text = text.clone();
                            false
                        }
                        PostHookResult::Withhold { reason } => {
                            want = ToolOutput {
                                is_error: true,
                                text: reason.clone(),
                            };
                            true
                        }
                        PostHookResult::Failed { .. } | PostHookResult::TimedOut { .. } => m,
                    };
                    if withheld {
                        if matches!(
                            r,
                            PostHookResult::Failed { .. } | PostHookResult::TimedOut { .. }
                        ) {
                            want.is_error = true;
                        }
                        break;
                    }
                }
                let case = format!("{ma} {a:?} / {mb} {b:?}");
                assert_eq!(trail.len(), ran, "{case}");
                assert_eq!(got.is_error, want.is_error, "{case}");
                if want.is_error && got.text.starts_with("keel: mandatory") {
                    assert!(!got.text.contains("secret"), "{case}");
                } else {
                    assert_eq!(got.text, want.text, "{case}");
                }
                assert!(!got.is_error || !got.text.contains("secret=1"), "{case}");
            }
        }
        assert_eq!(cases, 100);
    }

    #[test]
    fn a_rewrite_is_audited_as_rewritten_and_feeds_the_next_hook() {
        let outcomes = [
            hook(
                "redact",
                true,
                PostHookResult::Rewrite {
                    text: "token=[REDACTED]".into(),
                },
            ),
            hook("log", false, PostHookResult::Keep),
        ];
        let (got, trail) = apply_post_hooks(&outcomes, out("token=abc"));
        assert_eq!(got, out("token=[REDACTED]"));
        assert!(trail[0].rewritten);
        assert_eq!(trail[0].decision, HookDecision::Allow);
        assert_eq!(trail[1].decision, HookDecision::Defer);
        assert!(!trail[1].rewritten);
    }
}
