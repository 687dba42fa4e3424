//! Gates: checks on a call the chain allowed, from what the store already holds, so they survive a
//! crash of the node. Built: the counting gate (at most N calls matching a rule per task or per run),
//! counted from the run's audit rows: every call a counting gate let through is one `gate:<name>`
//! allow row, written durably before the call runs, so the calls made before a SIGKILL still count.
//! Planned (issue 13): prerequisite, token-typed and aggregate-cap gates.

use keel_store::{AuditEntry, HookDecision, TaskId};
use serde::{Deserialize, Serialize};

use crate::call::ToolCall;
use crate::chain::{AuditLine, Decision, Verdict};
use crate::rule::Rule;

/// What a counting gate counts over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateScope {
    /// The calls of one task (all its attempts and sessions).
    Task,
    /// The calls of the whole run.
    Run,
}

/// At most `max_calls` calls matching `rule` per task or per run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CountGate {
    /// Its name in audit rows (`gate:<name>`).
    pub name: String,
    /// The calls it counts.
    pub rule: Rule,
    /// How many may run.
    pub max_calls: u32,
    /// Over what.
    pub per: GateScope,
}

impl CountGate {
    /// The audit name of this gate's rows.
    pub fn who(&self) -> String {
        format!("gate:{}", self.name)
    }

    /// The calls this gate already let through for `task`, from the run's audit rows.
    pub fn count(&self, rows: &[AuditEntry], task: Option<TaskId>) -> u32 {
        let who = self.who();
        let n = rows
            .iter()
            .filter(|r| r.hook == who && r.decision == HookDecision::Allow)
            .filter(|r| self.per == GateScope::Run || r.task_id == task)
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// Applies `gates` to a verdict of the chain for `call`: an allowed call that a gate has no room for
/// is denied (only that gate's line is added); an allowed call every matching gate has room for gets
/// one allow line per gate (what the next count reads). `counted` answers each gate's count so far.
pub fn apply_gates(
    gates: &[CountGate],
    call: &ToolCall,
    mut verdict: Verdict,
    counted: impl Fn(&CountGate) -> u32,
) -> Verdict {
    if verdict.decision != Decision::Allow {
        return verdict;
    }
    let matching: Vec<(&CountGate, u32)> = gates
        .iter()
        .filter(|g| g.rule.matches(call))
        .map(|g| (g, counted(g)))
        .collect();
    if let Some((gate, n)) = matching.iter().find(|(g, n)| *n >= g.max_calls) {
        let per = match gate.per {
            GateScope::Task => "task",
            GateScope::Run => "run",
        };
        let reason = format!(
            "gate {} allows at most {} calls matching {} per {per}; {n} already ran",
            gate.name, gate.max_calls, gate.rule
        );
        verdict.trail.push(AuditLine {
            who: gate.who(),
            decision: HookDecision::Deny,
            reason: reason.clone(),
        });
        verdict.decision = Decision::Deny;
        verdict.decided_by = gate.who();
        verdict.reason = reason;
        return verdict;
    }
    for (gate, n) in matching {
        verdict.trail.push(AuditLine {
            who: gate.who(),
            decision: HookDecision::Allow,
            reason: format!("call {} of at most {}", n + 1, gate.max_calls),
        });
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::Policy;
    use keel_harness::PermissionMode;
    use serde_json::json;

    fn gate(per: GateScope, max_calls: u32) -> CountGate {
        CountGate {
            name: "push".into(),
            rule: "Bash(git push*)".parse().unwrap_or_else(|e| panic!("{e}")),
            max_calls,
            per,
        }
    }

    /// Decides `call` by `task` against the rows so far and appends the verdict's rows, like the node.
    fn decide(
        gates: &[CountGate],
        rows: &mut Vec<AuditEntry>,
        task: TaskId,
        command: &str,
    ) -> Decision {
        let call = ToolCall::new("Bash", json!({ "command": command }));
        let v = Policy::default().decide(&call, PermissionMode::AcceptEdits, &[]);
        let v = apply_gates(gates, &call, v, |g| g.count(rows, Some(task)));
        rows.extend(v.audit_entries(0, Some(task), &call));
        v.decision
    }

    #[test]
    fn a_counting_gate_lets_n_calls_through_per_scope_and_ignores_others() {
        let (a, b) = (TaskId(1), TaskId(2));
        for (per, b_first) in [
            (GateScope::Task, Decision::Allow),
            (GateScope::Run, Decision::Deny),
        ] {
            let gates = [gate(per, 2)];
            let mut rows = Vec::new();
            assert_eq!(decide(&gates, &mut rows, a, "git push a"), Decision::Allow);
            assert_eq!(
                decide(&gates, &mut rows, a, "ls"),
                Decision::Allow,
                "not counted"
            );
            assert_eq!(decide(&gates, &mut rows, a, "git push b"), Decision::Allow);
            assert_eq!(decide(&gates, &mut rows, a, "git push c"), Decision::Deny);
            assert_eq!(
                decide(&gates, &mut rows, b, "git push d"),
                b_first,
                "{per:?}"
            );
            // The rows are all a restarted node needs: the count comes from them alone.
            assert_eq!(gates[0].count(&rows, Some(a)), 2);
        }
    }

    #[test]
    fn a_call_the_chain_denied_is_not_counted() {
        let gates = [gate(GateScope::Run, 1)];
        let call = ToolCall::new("Bash", json!({"command": "git push"}));
        let policy = Policy {
            deny: vec!["Bash".parse().unwrap_or_else(|e| panic!("{e}"))],
            ..Policy::default()
        };
        let v = policy.decide(&call, PermissionMode::AcceptEdits, &[]);
        let v = apply_gates(&gates, &call, v, |_| 0);
        assert_eq!(v.decision, Decision::Deny);
        assert!(v.trail.iter().all(|l| l.who != "gate:push"));
    }
}
