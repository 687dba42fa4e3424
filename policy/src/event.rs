//! Session events (docs/DESIGN.md §9): `SubagentStart` (a specialist's session is about to start on
//! its brief), `SubagentStop` (its report came back) and `PreCompact` (a harness is about to compact
//! its context). Their hooks do not decide a tool call: each can **veto** the event (the start is
//! refused, the report refused, the compaction blocked) or **annotate** it (a note carried into the
//! brief, the report the lead sees, or the compaction's instructions).
//!
//! Rules, as one pure function ([`decide_event`]) over the outcomes the caller ran in the policy's
//! order:
//! - A veto, or a mandatory hook's error or timeout, vetoes the event: nothing later runs.
//! - An annotation adds its note; the notes are kept in hook order.
//! - A hook with no opinion, and a hook that is not mandatory and failed, hand the event on.
//!
//! Every hook that ran is one [`AuditLine`] (`Deny` for a veto, `Allow` for an annotation, `Defer`
//! for no opinion, `Error` for a failure), written durably before the event's effect.

use keel_store::HookDecision;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::chain::AuditLine;

/// What one hook answered about a session event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum EventResult {
    /// The event goes on.
    NoOpinion,
    /// The event goes on, with a note carried into what it produces.
    Annotate {
        /// The note.
        context: String,
    },
    /// The event must not happen.
    Veto {
        /// Why (recorded, and told to whoever the event concerns).
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

/// One hook's outcome on a session event, as the caller ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventOutcome {
    /// The hook's name.
    pub hook: String,
    /// Whether its failure vetoes the event.
    pub mandatory: bool,
    /// What it answered.
    pub result: EventResult,
}

impl EventOutcome {
    /// Whether no later hook should run: a veto, or a mandatory hook's failure (which vetoes).
    pub fn ends_hooks(&self) -> bool {
        match self.result {
            EventResult::Veto { .. } => true,
            EventResult::Failed { .. } | EventResult::TimedOut { .. } => self.mandatory,
            EventResult::NoOpinion | EventResult::Annotate { .. } => false,
        }
    }
}

/// The verdict on one session event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventVerdict {
    /// The veto, if any: the hook's audit name (`hook:NAME`) and why.
    pub veto: Option<(String, String)>,
    /// The annotations, in hook order, each `NAME: note`.
    pub notes: Vec<String>,
    /// Every hook that ran.
    pub trail: Vec<AuditLine>,
}

impl EventVerdict {
    /// The notes as one text to carry (empty when there are none).
    pub fn annotation(&self) -> Option<String> {
        (!self.notes.is_empty()).then(|| self.notes.join("\n"))
    }
}

/// The verdict of the hooks that ran on a session event `event` (its name, for the reasons),
/// in the order they ran.
pub fn decide_event(event: &str, outcomes: &[EventOutcome]) -> EventVerdict {
    let mut verdict = EventVerdict::default();
    for o in outcomes {
        let who = format!("hook:{}", o.hook);
        let failure = |what: String| {
            if o.mandatory {
                format!("mandatory {event} hook {} failed closed: {what}", o.hook)
            } else {
                format!(
                    "{event} hook {} failed (not mandatory, ignored): {what}",
                    o.hook
                )
            }
        };
        let (decision, reason) = match &o.result {
            EventResult::NoOpinion => (HookDecision::Defer, String::new()),
            EventResult::Annotate { context } => {
                verdict.notes.push(format!("{}: {context}", o.hook));
                (HookDecision::Allow, format!("annotated: {context}"))
            }
            EventResult::Veto { reason } => (HookDecision::Deny, reason.clone()),
            EventResult::Failed { error } => (HookDecision::Error, failure(error.clone())),
            EventResult::TimedOut { after_ms } => (
                HookDecision::Error,
                failure(format!("timed out after {after_ms} ms")),
            ),
        };
        if o.ends_hooks() {
            verdict.veto = Some((who.clone(), reason.clone()));
        }
        verdict.trail.push(AuditLine {
            who,
            decision,
            reason,
            rewritten: false,
        });
        if o.ends_hooks() {
            break;
        }
    }
    verdict
}

/// A session event's command hook answer (pure): exit 0 with nothing is no opinion; exit 0 with
/// `{"decision": "block", "reason": ...}` (Claude Code's shape) or exit 2 (stderr as the reason)
/// vetoes; exit 0 with `{"hookSpecificOutput": {"additionalContext": "..."}}` annotates; anything
/// else is a failure.
pub fn interpret_event(code: Option<i32>, stdout: &str, stderr: &str) -> EventResult {
    let stderr = stderr.trim();
    match code {
        Some(0) => {
            let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) else {
                return EventResult::NoOpinion;
            };
            match v.get("decision") {
                None => {}
                Some(Value::String(d)) if d == "block" => {
                    let reason = v
                        .get("reason")
                        .and_then(Value::as_str)
                        .unwrap_or("vetoed by a hook");
                    return EventResult::Veto {
                        reason: reason.to_owned(),
                    };
                }
                // A decision keel does not know is not read as "go ahead": a mandatory hook's
                // misspelt veto must still veto.
                Some(other) => {
                    return EventResult::Failed {
                        error: format!("unknown decision {other}"),
                    };
                }
            }
            match v
                .get("hookSpecificOutput")
                .and_then(|o| o.get("additionalContext"))
            {
                None => EventResult::NoOpinion,
                Some(Value::String(text)) if text.trim().is_empty() => EventResult::NoOpinion,
                Some(Value::String(text)) => EventResult::Annotate {
                    context: text.clone(),
                },
                Some(other) => EventResult::Failed {
                    error: format!("additionalContext is not a string: {other}"),
                },
            }
        }
        Some(2) if stderr.is_empty() => EventResult::Veto {
            reason: "vetoed by a hook (exit 2)".into(),
        },
        Some(2) => EventResult::Veto {
            reason: stderr.to_owned(),
        },
        Some(code) => EventResult::Failed {
            error: format!("exit {code}: {stderr}"),
        },
        None => EventResult::Failed {
            error: format!("killed by a signal: {stderr}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Vec<EventResult> {
        vec![
            EventResult::NoOpinion,
            EventResult::Annotate {
                context: "mind the budget".into(),
            },
            EventResult::Veto {
                reason: "not today".into(),
            },
            EventResult::Failed {
                error: "exit 1".into(),
            },
            EventResult::TimedOut { after_ms: 5 },
        ]
    }

    /// The documented rules as an oracle, over every pair of outcomes (each mandatory or not).
    #[test]
    fn every_pair_of_event_hooks_follows_the_documented_rules() {
        let mut checked = 0;
        for a in results() {
            for b in results() {
                for (ma, mb) in [(true, true), (true, false), (false, true), (false, false)] {
                    let outcomes = [
                        EventOutcome {
                            hook: "a".into(),
                            mandatory: ma,
                            result: a.clone(),
                        },
                        EventOutcome {
                            hook: "b".into(),
                            mandatory: mb,
                            result: b.clone(),
                        },
                    ];
                    // The caller stops at the first outcome that ends the hooks.
                    let ran = if outcomes[0].ends_hooks() { 1 } else { 2 };
                    let v = decide_event("SubagentStart", &outcomes[..ran]);
                    let vetoes = |r: &EventResult, m: bool| match r {
                        EventResult::Veto { .. } => true,
                        EventResult::Failed { .. } | EventResult::TimedOut { .. } => m,
                        _ => false,
                    };
                    let want_veto = if vetoes(&a, ma) {
                        Some("hook:a")
                    } else if vetoes(&b, mb) {
                        Some("hook:b")
                    } else {
                        None
                    };
                    assert_eq!(
                        v.veto.as_ref().map(|(w, _)| w.as_str()),
                        want_veto,
                        "{a:?}/{ma} {b:?}/{mb}"
                    );
                    assert_eq!(v.trail.len(), ran);
                    let notes = usize::from(matches!(a, EventResult::Annotate { .. }))
                        + usize::from(ran == 2 && matches!(b, EventResult::Annotate { .. }));
                    assert_eq!(v.notes.len(), notes);
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 100);
    }

    #[test]
    fn command_answers_are_read_like_claude_codes_hooks() {
        assert_eq!(interpret_event(Some(0), "", ""), EventResult::NoOpinion);
        assert!(matches!(
            interpret_event(Some(0), r#"{"decision":"deny"}"#, ""),
            EventResult::Failed { .. }
        ));
        assert_eq!(
            interpret_event(Some(0), r#"{"decision":"block","reason":"no"}"#, ""),
            EventResult::Veto {
                reason: "no".into()
            }
        );
        assert_eq!(
            interpret_event(
                Some(0),
                r#"{"hookSpecificOutput":{"additionalContext":"be brief"}}"#,
                ""
            ),
            EventResult::Annotate {
                context: "be brief".into()
            }
        );
        assert_eq!(
            interpret_event(Some(2), "", "stop"),
            EventResult::Veto {
                reason: "stop".into()
            }
        );
        assert!(matches!(
            interpret_event(Some(1), "", "boom"),
            EventResult::Failed { .. }
        ));
        assert!(matches!(
            interpret_event(None, "", ""),
            EventResult::Failed { .. }
        ));
        let v = decide_event(
            "SubagentStop",
            &[EventOutcome {
                hook: "n".into(),
                mandatory: true,
                result: EventResult::Annotate {
                    context: "checked".into(),
                },
            }],
        );
        assert_eq!(v.annotation().as_deref(), Some("n: checked"));
        assert!(v.veto.is_none());
    }
}
