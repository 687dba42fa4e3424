//! Invariant 12 (docs/DESIGN.md §12, issue 13): every hook decision is audited before its tool
//! runs, and a mandatory hook's error or timeout never lets a tool run. The checker hears what each
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
    /// Per (attempt, tool-use id): how many hooks ran, and the mandatory one that failed, if any.
    calls: BTreeMap<(AttemptId, String), (usize, Option<String>)>,
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
        self.hooks
            .calls
            .insert((attempt, id.to_owned()), (outcomes.len(), failed));
        self.observed.gated_calls += 1;
    }

    /// `attempt`'s tool `tool` (tool-use `id`) runs now; `audited` holds the decisions of the audit
    /// rows of this call the store holds at this moment.
    pub fn tool_runs(
        &mut self,
        event: u64,
        attempt: AttemptId,
        id: &str,
        tool: &str,
        audited: &[HookDecision],
    ) {
        self.observed.gated_runs += 1;
        let Some((hooks_ran, failed)) = self.hooks.calls.get(&(attempt, id.to_owned())).cloned()
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
        // One row per hook that ran, and the decision that lets the call run among them.
        if audited.len() < hooks_ran || !audited.contains(&HookDecision::Allow) {
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
