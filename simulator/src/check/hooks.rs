//! Invariant 12 (docs/DESIGN.md §12, issue 13): every hook decision is audited before its tool
//! runs, a mandatory hook's error or timeout never lets a tool run, and a call a hook asked about
//! runs only after a durable human approval and its audit row (a refused or expired ask never
//! runs). The checker hears what each
//! hook answered from the world's bridge and, when a tool runs, reads which audit rows of that call
//! the store holds at that moment; it does not ask the chain what it decided.

use std::collections::BTreeMap;

use keel_actors::AttemptId;
use keel_policy::{HookOutcome, HookResult};
use keel_store::HookDecision;

use super::Checker;
use crate::violation::Invariant;

/// What the checker remembers of the hooks that ran for each gated call.
#[derive(Debug, Default)]
pub(super) struct HookCalls {
    /// Per (attempt, tool-use id): what its hooks answered.
    calls: BTreeMap<(AttemptId, String), HookCall>,
}

/// What the hooks of one gated call answered, as the checker remembers it.
#[derive(Clone, Debug)]
struct HookCall {
    /// How many hooks ran.
    ran: usize,
    /// The mandatory hook that failed or timed out, if any.
    failed: Option<String>,
    /// Whether a hook asked for a human's approval.
    asked: bool,
}

impl Checker {
    /// The hooks of `attempt`'s tool-use `id` answered `outcomes`, in the order they ran.
    pub fn hooks_answered(&mut self, attempt: AttemptId, id: &str, outcomes: &[HookOutcome]) {
        for o in outcomes {
            let kind = match (&o.result, o.mandatory) {
                (HookResult::Allow { .. }, _) => "allow",
                (HookResult::Deny { .. }, _) => "deny",
                (HookResult::Ask { .. }, _) => "ask",
                (HookResult::NoOpinion, _) => "no_opinion",
                (HookResult::Failed { .. }, true) => "error_mandatory",
                (HookResult::Failed { .. }, false) => "error",
                (HookResult::TimedOut { .. }, true) => "timeout_mandatory",
                (HookResult::TimedOut { .. }, false) => "timeout",
            };
            *self.observed.hook_outcomes.entry(kind).or_default() += 1;
        }
        let failed = outcomes
            .iter()
            .find(|o| {
                o.mandatory
                    && matches!(
                        o.result,
                        HookResult::Failed { .. } | HookResult::TimedOut { .. }
                    )
            })
            .map(|o| o.hook.clone());
        let asked = outcomes
            .iter()
            .any(|o| matches!(o.result, HookResult::Ask { .. }));
        self.hooks.calls.insert(
            (attempt, id.to_owned()),
            HookCall {
                ran: outcomes.len(),
                failed,
                asked,
            },
        );
        self.observed.gated_calls += 1;
    }

    /// A gated call's audit rows were not made durable (`timed_out`: the checkpoint writer never
    /// answered their host stage in time; otherwise it answered with a failure): the call is
    /// denied.
    pub fn audit_not_durable(&mut self, timed_out: bool) {
        let kind = if timed_out {
            "audit_unanswered"
        } else {
            "audit_failed"
        };
        *self.observed.hook_outcomes.entry(kind).or_default() += 1;
    }

    /// An approval escalation was raised for an asked call.
    pub fn approval_asked(&mut self) {
        *self.observed.hook_outcomes.entry("ask_raised").or_default() += 1;
    }

    /// A human's answer to an ask (`answered`: approve or deny became durable; otherwise nobody
    /// answered in time) and whether the bridge let the call through.
    pub fn approval_answered(&mut self, answered: bool, approved: bool) {
        let kind = match (answered, approved) {
            (true, true) => "ask_approved",
            (true, false) => "ask_refused",
            (false, _) => "ask_expired",
        };
        *self.observed.hook_outcomes.entry(kind).or_default() += 1;
    }

    /// `attempt`'s tool `tool` (tool-use `id`) runs now; `audited` holds who decided what in the
    /// audit rows of this call the store holds at this moment; `approval`, when an approval
    /// escalation was raised for it, whether the store holds it answered with an approval.
    pub fn tool_runs(
        &mut self,
        event: u64,
        attempt: AttemptId,
        id: &str,
        tool: &str,
        audited: &[(String, HookDecision)],
        approval: Option<bool>,
    ) {
        self.observed.gated_runs += 1;
        let Some(HookCall {
            ran: hooks_ran,
            failed,
            asked,
        }) = self.hooks.calls.get(&(attempt, id.to_owned())).cloned()
        else {
            return self.fail(
                event,
                Invariant::HookAudited,
                format!("attempt {attempt}: tool {tool} ({id}) ran without its hooks"),
            );
        };
        if let Some(hook) = failed {
            return self.fail(
                event,
                Invariant::HookAudited,
                format!(
                    "attempt {attempt}: tool {tool} ({id}) ran although mandatory hook {hook} failed or timed out"
                ),
            );
        }
        // A call a hook asked about runs only after a human approved it: the escalation answered
        // with an approval and the `approval` row allowing it are durable before it runs; a refused
        // or expired ask never runs.
        if asked {
            let approved_row = audited
                .iter()
                .any(|(who, d)| who == "approval" && *d == HookDecision::Allow);
            if approval != Some(true) || !approved_row {
                return self.fail(
                    event,
                    Invariant::HookAudited,
                    format!(
                        "attempt {attempt}: tool {tool} ({id}) ran although it was asked about and \
                         {}",
                        match approval {
                            None => "no human was asked",
                            Some(false) => "no durable approval answers its escalation",
                            Some(true) => "no durable approval row allows it",
                        }
                    ),
                );
            }
        }
        // One row per hook that ran, and the decision that lets the call run among them.
        if audited.len() < hooks_ran || !audited.iter().any(|(_, d)| *d == HookDecision::Allow) {
            self.fail(
                event,
                Invariant::HookAudited,
                format!(
                    "attempt {attempt}: tool {tool} ({id}) ran before its decision was audited ({} durable rows, {hooks_ran} hooks ran)",
                    audited.len()
                ),
            );
        }
    }
}
