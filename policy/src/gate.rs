//! Gates: checks on a call the chain allowed, decided from the run's gate ledger in the store (its
//! [`GateMark`] rows), so they survive a crash of the node (docs/DESIGN.md §9). The seed's kinds:
//!
//! - **count**: at most N calls matching a rule per task or per run (a `Counted` mark per call let
//!   through);
//! - **prerequisite**: a call only after a call matching another rule succeeded in this task (a `Met`
//!   mark written when that call's result came back without error), across sessions and restarts;
//! - **token**: a call only with a token of the gate's type, issued by an earlier successful call
//!   matching another rule (an `Issued` mark), and spent by the call it lets through (a `Spent` mark);
//! - **cap**: a numeric field of the call's input summed over the run (an `Added` mark per call),
//!   refused when the sum would pass the cap; a missing, negative or non-numeric field denies.
//!
//! Evaluation is pure: the caller holds the run's marks indexed ([`GateLedger`], rebuilt from the store
//! after a crash), [`apply_gates`] answers the verdict and the marks
//! to write, and the caller writes them in the same durable commit as the decision's audit rows,
//! before the call runs, holding one lock from the read to the commit so two calls cannot both take
//! the last place. [`marks_on_success`] answers the marks a successful call earns (PostToolUse).

use keel_store::{GateEvent, GateMark, HookDecision, TaskId, UnixMillis};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::call::ToolCall;
use crate::chain::{AuditLine, Decision, Verdict};
use crate::ledger::{GateLedger, Tally};
use crate::rule::Rule;

/// Millionths in one unit of a capped field.
pub const MICROS_PER_UNIT: u64 = 1_000_000;

/// What a gate counts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateScope {
    /// The calls of one task (all its attempts and sessions).
    Task,
    /// The calls of the whole run.
    Run,
}

impl GateScope {
    fn noun(self) -> &'static str {
        match self {
            GateScope::Task => "task",
            GateScope::Run => "run",
        }
    }
}

/// What a gate checks, by kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateCheck {
    /// At most `max_calls` calls.
    Count {
        /// How many may run.
        max_calls: u32,
    },
    /// Only after a call matching `after` succeeded.
    Prerequisite {
        /// The call that must have succeeded first.
        after: Rule,
    },
    /// Only with an unspent token issued by a successful call matching `issued_by`.
    Token {
        /// The calls whose success issues one token.
        issued_by: Rule,
    },
    /// The input's `field` summed over the calls, at most `max_micros`.
    Cap {
        /// The field, a dotted path into the tool input (`amount`, `payment.amount`).
        field: String,
        /// The cap, in millionths of the field's unit.
        max_micros: u64,
    },
}

/// One gate, validated (built from `[[gates]]` by [`crate::config::PolicyConfig::build`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// Its name in audit rows (`gate:<name>`) and in its marks.
    pub name: String,
    /// The calls it guards.
    pub rule: Rule,
    /// Over what its marks are read.
    pub per: GateScope,
    /// What it checks.
    pub check: GateCheck,
}

impl Gate {
    /// The audit name of this gate's rows.
    pub fn who(&self) -> String {
        format!("gate:{}", self.name)
    }

    /// The calls this counting gate already let through for `task`.
    pub fn count(&self, ledger: &GateLedger, task: Option<TaskId>) -> u32 {
        self.tally(ledger, task).counted
    }

    /// This gate's tally for a call by `task`, over its scope.
    fn tally(&self, ledger: &GateLedger, task: Option<TaskId>) -> Tally {
        ledger.tally(&self.name, self.per, task)
    }

    /// Checks `call` by `task` against the ledger: the mark to write when it passes, or why not.
    fn check(
        &self,
        call: &ToolCall,
        ledger: &GateLedger,
        task: Option<TaskId>,
    ) -> Result<(String, Option<GateEvent>), String> {
        let per = self.per.noun();
        let tally = self.tally(ledger, task);
        match &self.check {
            GateCheck::Count { max_calls } => {
                let n = tally.counted;
                if n >= *max_calls {
                    return Err(format!(
                        "gate {} allows at most {max_calls} calls matching {} per {per}; {n} already ran",
                        self.name, self.rule
                    ));
                }
                Ok((
                    format!("call {} of at most {max_calls}", n + 1),
                    Some(GateEvent::Counted),
                ))
            }
            GateCheck::Prerequisite { after } => {
                if tally.met == 0 {
                    return Err(format!(
                        "gate {}: a call matching {after} must succeed in this {per} before {}; \
                         run it first, then retry",
                        self.name, call.tool
                    ));
                }
                Ok((format!("{after} succeeded earlier in this {per}"), None))
            }
            GateCheck::Token { issued_by } => {
                let (issued, spent) = (tally.issued, tally.spent);
                if issued <= spent {
                    return Err(format!(
                        "gate {}: {} needs a {} token, issued when a call matching {issued_by} \
                         succeeds; {issued} issued and {spent} spent in this {per}",
                        self.name, call.tool, self.name
                    ));
                }
                Ok((
                    format!("spends token {} of {issued}", spent + 1),
                    Some(GateEvent::Spent),
                ))
            }
            GateCheck::Cap { field, max_micros } => {
                let amount = amount_micros(&call.input, field)
                    .map_err(|why| format!("gate {}: {why}, so the call is denied", self.name))?;
                let total = tally.added_micros;
                let after = total.saturating_add(amount);
                if after > *max_micros {
                    return Err(format!(
                        "gate {}: {field} {} would bring this {per}'s total to {}, past the cap of \
                         {}",
                        self.name,
                        units(amount),
                        units(after),
                        units(*max_micros)
                    ));
                }
                Ok((
                    format!(
                        "{field} {}: total {} of {}",
                        units(amount),
                        units(after),
                        units(*max_micros)
                    ),
                    Some(GateEvent::Added { micros: amount }),
                ))
            }
        }
    }
}

/// The numeric field at `path` (dotted) of a tool input, in millionths: a JSON number, at least 0.
///
/// # Errors
/// Why the field cannot be summed (missing, not a number, negative, too large).
pub fn amount_micros(input: &Value, path: &str) -> Result<u64, String> {
    let mut at = input;
    for key in path.split('.') {
        at = at
            .get(key)
            .ok_or_else(|| format!("the input has no numeric field {path}"))?;
    }
    if let Some(n) = at.as_u64() {
        return n
            .checked_mul(MICROS_PER_UNIT)
            .ok_or_else(|| format!("{path} is too large to sum"));
    }
    match at.as_f64() {
        Some(x) if x.is_finite() && x >= 0.0 => {
            let micros = (x * MICROS_PER_UNIT as f64).round();
            if micros >= u64::MAX as f64 {
                Err(format!("{path} is too large to sum"))
            } else {
                Ok(micros as u64)
            }
        }
        Some(x) => Err(format!(
            "{path} is {x}; a capped amount is a number of at least 0"
        )),
        None => Err(format!("{path} is not a number ({at})")),
    }
}

/// Millionths as a decimal number of units (`12.5`, `3`).
pub fn units(micros: u64) -> String {
    let whole = micros / MICROS_PER_UNIT;
    let frac = micros % MICROS_PER_UNIT;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = format!("{frac:06}");
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// Applies `gates` to the chain's verdict on `call` by `task`, from the run's indexed `ledger`. A
/// denied call is returned unchanged. An allowed or asked call that a matching gate refuses is
/// denied (that gate's line is added; gates are checked in declaration order, the first refusal
/// decides), so nobody is asked about a call the gates would refuse. An asked call the gates pass is
/// returned unchanged, with no mark: a human's approval ([`Verdict::approved`]) is checked again
/// when it comes. An allowed call every matching gate passes gets one allow line per gate, and the
/// marks to write with the decision's audit rows. A call let through counts from this decision
/// (`Counted`, `Spent`, `Added`), whether the tool then succeeds or fails: the mark is durable
/// before the call runs, so a crash during the call cannot lose it, and a call that failed may
/// still have had its effect.
pub fn apply_gates(
    gates: &[Gate],
    call: &ToolCall,
    mut verdict: Verdict,
    task: Option<TaskId>,
    ledger: &GateLedger,
    ts_ms: UnixMillis,
) -> (Verdict, Vec<GateMark>) {
    if verdict.decision == Decision::Deny {
        return (verdict, Vec::new());
    }
    let mut passed = Vec::new();
    for gate in gates.iter().filter(|g| g.rule.matches(call)) {
        match gate.check(call, ledger, task) {
            Ok((reason, event)) => passed.push((gate, reason, event)),
            Err(reason) => {
                verdict.trail.push(AuditLine {
                    who: gate.who(),
                    decision: HookDecision::Deny,
                    reason: reason.clone(),
                    rewritten: false,
                });
                verdict.decision = Decision::Deny;
                verdict.decided_by = gate.who();
                verdict.reason = reason;
                return (verdict, Vec::new());
            }
        }
    }
    if verdict.decision == Decision::Ask {
        // Nobody is asked about a call the gates refuse; one they pass now is checked again, and
        // its marks written, once a human approved it (`Verdict::approved`).
        return (verdict, Vec::new());
    }
    let mut written = Vec::new();
    for (gate, reason, event) in passed {
        verdict.trail.push(AuditLine {
            who: gate.who(),
            decision: HookDecision::Allow,
            reason,
            rewritten: false,
        });
        if let Some(event) = event {
            written.push(GateMark {
                ts_ms,
                task_id: task,
                gate: gate.name.clone(),
                event,
            });
        }
    }
    (verdict, written)
}

/// Whether any gate guards `call` (it must then be decided under the gates' lock).
pub fn guards(gates: &[Gate], call: &ToolCall) -> bool {
    gates.iter().any(|g| g.rule.matches(call))
}

/// The marks a call earns when its result came back without error: `Met` for every prerequisite
/// gate waiting for such a call, `Issued` for every token gate such a call issues a token for.
pub fn marks_on_success(
    gates: &[Gate],
    call: &ToolCall,
    task: Option<TaskId>,
    ts_ms: UnixMillis,
) -> Vec<GateMark> {
    gates
        .iter()
        .filter_map(|g| {
            let event = match &g.check {
                GateCheck::Prerequisite { after } if after.matches(call) => GateEvent::Met,
                GateCheck::Token { issued_by } if issued_by.matches(call) => GateEvent::Issued,
                _ => return None,
            };
            Some(GateMark {
                ts_ms,
                task_id: task,
                gate: g.name.clone(),
                event,
            })
        })
        .collect()
}

/// Whether any gate waits for the success of calls like `call` (its result must then be reported).
pub fn watches_success(gates: &[Gate], call: &ToolCall) -> bool {
    gates.iter().any(|g| match &g.check {
        GateCheck::Prerequisite { after } => after.matches(call),
        GateCheck::Token { issued_by } => issued_by.matches(call),
        _ => false,
    })
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
