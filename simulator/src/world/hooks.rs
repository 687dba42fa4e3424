//! keel's policy as the world plays it (docs/DESIGN.md §9, issue 13): before a session's tool runs,
//! its `PreToolUse` hooks answer (an outcome the seed draws for each: allow, deny, ask, no opinion,
//! an error or a timeout), keel-policy's pure chain decides ([`keel_policy::Policy::decide`], the
//! function the node's `keel hook` bridge calls), and the verdict's audit rows are committed on the
//! coordinator node's store; only then does the tool run, and only if the verdict allows it. An
//! `ask` raises an approval escalation (the rows the runtime's approval desk stages), the seed
//! draws the human (approve, deny, or never: the deadline passes and the expiry is recorded), the
//! answer is committed as `keel answer` stages it, then the `approval` audit row; the call runs
//! only when the approval and its row are durable. A denial answers the tool_use with an error
//! result instead of the tool's output. When the rows cannot be made durable
//! (the coordinator node is down, the disk fails) the call is denied: the bridge fails closed.
//!
//! The checker is told what each hook answered and, when a tool runs, which audit rows of that
//! call the store holds at that moment (invariant 12).

use keel_actors::escalation::{APPROVE, ApprovalCase, REFUSE, approves};
use keel_actors::{AttemptId, CommitBatch, CommitId, Effect, Stage, StageOwner};
use keel_harness::{HarnessEvent, PermissionMode};
use keel_policy::{
    BuiltinHook, Decision, HookAction, HookEvent, HookOutcome, HookResult, HookSpec, Policy, Rule,
    ToolCall, ToolMatcher, Verdict, link,
};
use keel_store::{AuditEntry, EscalationId, HookDecision, RunId};

use crate::harness::KEEL_TOOL_PREFIX;
use crate::mutation::Mutation;
use crate::net::NodeId;

use super::World;

/// How long an ask waits for a human before the call is denied (the simulated human answers at
/// once, or never).
const ASK_TIMEOUT_MS: u64 = 300_000;

/// How an ask ended for the bridge.
struct Asked {
    /// Whether the call may run (approved, and the approval's row durable).
    approved: bool,
    /// What the model is told when it may not.
    reason: String,
    /// The escalation raised, if it was.
    escalation: Option<EscalationId>,
}

/// The mandatory hook of the simulated policy: its error or timeout denies.
pub const GUARD_HOOK: &str = "guard";
/// The hook that is not mandatory: its error or timeout is audited and ignored.
pub const NOTES_HOOK: &str = "notes";
/// How long each simulated hook may take (a timeout is drawn, not waited for).
const HOOK_TIMEOUT_MS: u64 = 5_000;
/// Most audit rows read per page when the world looks a call's rows up.
const AUDIT_PAGE: u32 = 500;
/// Most pages read per look-up.
const AUDIT_PAGES_MAX: u32 = 100;

/// The policy of a world whose sessions' tools are gated: a mandatory hook and one that is not, a
/// deny rule no scripted call matches, and calls nothing decided run (keel's default).
pub fn sim_policy() -> Result<Policy, keel_policy::RuleError> {
    let hook = |name: &str, mandatory: bool| HookSpec {
        name: name.into(),
        event: HookEvent::PreToolUse,
        matcher: ToolMatcher::Any,
        // The world draws each outcome itself; the action is what a keel.toml would name.
        action: HookAction::Builtin(BuiltinHook::Allow),
        timeout_ms: HOOK_TIMEOUT_MS,
        mandatory,
    };
    Ok(Policy {
        hooks: vec![hook(GUARD_HOOK, true), hook(NOTES_HOOK, false)],
        deny: vec!["Bash(rm -rf *)".parse::<Rule>()?],
        ..Policy::default()
    })
}

/// One hook's answer as the seed draws it: mostly no opinion or allow, sometimes a denial, an ask, an
/// error or a timeout.
fn draw_result(roll: u64) -> HookResult {
    match roll {
        0..=34 => HookResult::NoOpinion,
        35..=69 => HookResult::Allow {
            reason: "looks fine".into(),
        },
        70..=77 => HookResult::Deny {
            reason: "not in this task".into(),
        },
        78..=83 => HookResult::Ask {
            reason: "a human should confirm".into(),
        },
        84..=91 => HookResult::Failed {
            error: "hook exited with status 1".into(),
        },
        _ => HookResult::TimedOut {
            after_ms: HOOK_TIMEOUT_MS,
        },
    }
}

/// Whether `name` is a tool the policy gates: a harness tool, not one of keel's own (those are
/// answered by keel's endpoint, which is the policy's side already).
pub fn gated_tool(name: &str) -> bool {
    !name.starts_with(KEEL_TOOL_PREFIX)
}

impl World {
    /// The session of `attempt` is about to run tool `name` (its tool_use `id` was just delivered):
    /// its hooks answer, the chain decides, the audit rows are committed, and the tool runs only if
    /// it was allowed and the rows are durable. Returns the tool result that replaces the tool's
    /// own output when it must not run.
    pub(super) fn gate_tool(
        &mut self,
        node: NodeId,
        attempt: AttemptId,
        id: &str,
        name: &str,
        input_json: &str,
    ) -> Option<HarnessEvent> {
        let policy = self.policy.clone()?;
        let input = serde_json::from_str(input_json).unwrap_or(serde_json::Value::Null);
        let call = ToolCall::new(name, input);
        let outcomes: Vec<HookOutcome> = policy
            .hooks_for(HookEvent::PreToolUse, Some(name))
            .map(|h| HookOutcome {
                hook: h.name.clone(),
                mandatory: h.mandatory,
                result: draw_result(self.rng.range(0, 100)),
            })
            .collect();
        // The hooks run in order and stop at the first that ends them; the checker sees those.
        let ran = outcomes
            .iter()
            .position(HookOutcome::ends_hooks)
            .map_or(outcomes.len(), |i| i + 1);
        let mut outcomes = outcomes;
        outcomes.truncate(ran);
        self.checker.hooks_answered(attempt, id, &outcomes);
        // A defective bridge that takes a mandatory hook's error or timeout for no opinion.
        let decided_on: Vec<HookOutcome> =
            if self.config.mutation == Some(Mutation::MandatoryHookErrorAllows) {
                outcomes
                    .iter()
                    .cloned()
                    .map(|mut o| {
                        if matches!(
                            o.result,
                            HookResult::Failed { .. } | HookResult::TimedOut { .. }
                        ) {
                            o.result = HookResult::NoOpinion;
                        }
                        o
                    })
                    .collect()
            } else {
                outcomes
            };
        let verdict = policy.decide(&call, PermissionMode::default(), &decided_on);
        let rows = verdict.audit_entries(self.now, Some(attempt.task), &call);
        let before = self.audit_seq(attempt.run);
        let run_first = self.config.mutation == Some(Mutation::RunToolBeforeAudit);
        let durable = if run_first {
            // A defective bridge that lets the tool run and writes the rows after.
            true
        } else {
            self.commit_audit(attempt.run, &rows)
        };
        let mut allowed = verdict.decision == Decision::Allow && durable;
        let mut why = if durable {
            verdict.reason.clone()
        } else {
            "the decision could not be audited (failed closed)".into()
        };
        let mut escalation = None;
        if verdict.decision == Decision::Ask && durable {
            if self.config.mutation == Some(Mutation::RunAskWithoutApproval) {
                // A defective bridge that takes an ask for an allow.
                allowed = true;
            } else {
                let asked = self.ask_a_human(attempt, &call, &verdict);
                allowed = asked.approved;
                why = asked.reason;
                escalation = asked.escalation;
            }
        }
        if allowed {
            let audited = self.audit_rows_after(attempt.run, before, attempt, &call);
            let approval = escalation.map(|e| self.approved_in_store(attempt.run, e));
            self.checker
                .tool_runs(self.event_no, attempt, id, name, &audited, approval);
        }
        if run_first {
            self.commit_audit(attempt.run, &rows);
        }
        let _ = node;
        (!allowed)
            .then(|| HarnessEvent::tool_result(id, true, format!("denied by keel's policy: {why}")))
    }

    /// An `ask`: raises an approval escalation through the rows the runtime's approval desk
    /// stages, draws the human (approve, deny, or never: the deadline passes), commits the answer
    /// as `keel answer` stages it (or the expiry the desk writes), then the `approval` audit row,
    /// as `PolicyHost` does. The call may run only when the approval and its row are durable.
    fn ask_a_human(&mut self, attempt: AttemptId, call: &ToolCall, verdict: &Verdict) -> Asked {
        let run = attempt.run;
        let denied = |reason: String, escalation| Asked {
            approved: false,
            reason,
            escalation,
        };
        let id = keel_actors::escalation::mint_escalation_id(self.now, &mut self.rng);
        let case = ApprovalCase {
            tool: call.tool.clone(),
            subject: call.subject().unwrap_or(&call.tool).to_owned(),
            asked_by: format!("{} ({})", verdict.reason, verdict.decided_by),
            amount_micros: None,
            deadline_ms: self.now.saturating_add(ASK_TIMEOUT_MS),
            approved_before: 0,
        };
        let raised =
            keel_actors::escalation::approval(id, self.now, attempt.task, String::new(), case);
        if !self.commit_ops(
            run,
            vec![keel_actors::PersistOp::AppendEscalation(raised.clone())],
        ) {
            return denied(
                "keel could not ask a human, so the call is denied".into(),
                None,
            );
        }
        self.checker.approval_asked();
        let human = match self.rng.range(0, 100) {
            0..=44 => Some(APPROVE),
            45..=74 => Some(REFUSE),
            _ => None,
        };
        let answered = human.and_then(|text| {
            let text = keel_actors::escalation::check_answer(&raised, text).ok()?;
            let ops = keel_actors::escalation::answer_ops(&raised, &text, self.now);
            // An answer that is not durable never reaches the waiting call.
            self.commit_ops(run, ops).then_some(text)
        });
        let approved = match &answered {
            Some(text) => approves(text),
            None => {
                // Nobody answered in time: the desk records the expiry (a failed write still
                // denies).
                let expired = keel_actors::PersistOp::ResolveEscalation {
                    id,
                    resolution: keel_store::EscalationResolution::Expired { ts_ms: self.now },
                };
                self.commit_ops(run, vec![expired]);
                false
            }
        };
        // A defective bridge that takes a refusal or an expiry for an approval.
        let approved = approved || self.config.mutation == Some(Mutation::RunRefusedAsk);
        self.checker.approval_answered(answered.is_some(), approved);
        let reason = if approved {
            format!("approved by a human (escalation {id})")
        } else if answered.is_some() {
            format!("refused by a human (escalation {id})")
        } else {
            format!("timed out: nobody answered escalation {id}")
        };
        let row = AuditEntry {
            ts_ms: self.now,
            task_id: Some(attempt.task),
            hook: link::APPROVAL.into(),
            tool: call.tool.clone(),
            decision: if approved {
                HookDecision::Allow
            } else {
                HookDecision::Deny
            },
            reason: reason.clone(),
            input_digest: call.input_digest(),
            rewritten: false,
        };
        if !self.commit_audit(run, &[row]) {
            return denied(
                "the approval could not be audited (failed closed)".into(),
                Some(id),
            );
        }
        Asked {
            approved,
            reason,
            escalation: Some(id),
        }
    }

    /// Whether the store holds escalation `id` of `run` answered with an approval.
    fn approved_in_store(&self, run: RunId, id: EscalationId) -> bool {
        let Ok(page) = self.store.store().run(run).escalations(0, 1_000) else {
            return false;
        };
        page.items.iter().any(|e| {
            e.value.id == id
                && matches!(
                    &e.value.resolution,
                    Some(keel_store::EscalationResolution::Answered { text, .. }) if approves(text)
                )
        })
    }

    /// Commits a verdict's audit rows on the coordinator node's store (the bridge's own write);
    /// `false` when they could not be made durable.
    fn commit_audit(&mut self, run: RunId, rows: &[AuditEntry]) -> bool {
        let ops = rows
            .iter()
            .cloned()
            .map(keel_actors::PersistOp::AppendAudit)
            .collect();
        self.commit_ops(run, ops)
    }

    /// Commits `ops` as one host stage on the coordinator node's store; `false` when they could
    /// not be made durable.
    fn commit_ops(&mut self, run: RunId, ops: Vec<keel_actors::PersistOp>) -> bool {
        if self.coord.is_none() {
            return false;
        }
        // A host stage, as the bridge stages its rows through the node's checkpoint writer; it
        // passes the checker first, like every write. A disk that fails the commit fails it closed.
        self.host_stages += 1;
        let n = self.host_stages;
        let effect = Effect::Persist(CommitBatch {
            id: CommitId(n),
            stages: vec![Stage {
                run,
                owner: StageOwner::Host,
                ticket: n,
                ops: ops.into(),
            }]
            .into(),
        });
        self.checker
            .coord_effect(self.event_no, self.now, Some(run), &effect, None);
        let Effect::Persist(batch) = effect else {
            return false;
        };
        self.commits += 1;
        match keel_actors::host::store::commit(self.store.store(), &batch) {
            Ok(()) => true,
            Err(e) => {
                self.checker.commit_failed(self.event_no, &e);
                false
            }
        }
    }

    /// The newest audit sequence number of `run` the store holds (0: none), read on from where the
    /// world looked last.
    fn audit_seq(&mut self, run: RunId) -> u64 {
        let from = self.audit_seen.get(&run).copied().unwrap_or(0);
        let seq = self.audit_rows(run, from, |_| {});
        self.audit_seen.insert(run, seq);
        seq
    }

    /// The audit rows (who, decision) of `call` by `attempt`'s task that the store holds after
    /// sequence number `after`.
    fn audit_rows_after(
        &self,
        run: RunId,
        after: u64,
        attempt: AttemptId,
        call: &ToolCall,
    ) -> Vec<(String, HookDecision)> {
        let digest = call.input_digest();
        let mut found = Vec::new();
        self.audit_rows(run, after, |row| {
            if row.task_id == Some(attempt.task)
                && row.tool == call.tool
                && row.input_digest == digest
            {
                found.push((row.hook.clone(), row.decision));
            }
        });
        found
    }

    /// Reads `run`'s audit rows after sequence number `after`, page by page, handing each to
    /// `each`; the last sequence number read (`after` when there is none).
    fn audit_rows(&self, run: RunId, after: u64, mut each: impl FnMut(&AuditEntry)) -> u64 {
        let scope = self.store.store().run(run);
        let mut seq = after;
        for _ in 0..AUDIT_PAGES_MAX {
            let Ok(page) = scope.audit(seq, AUDIT_PAGE) else {
                break;
            };
            for row in &page.items {
                each(&row.value);
                seq = row.seq;
            }
            if !page.more || page.items.is_empty() {
                break;
            }
        }
        seq
    }
}
