//! keel's policy as the world plays it (docs/DESIGN.md §9, issue 13): before a session's tool runs,
//! its `PreToolUse` hooks answer (an outcome the seed draws for each: allow, deny, ask, no opinion,
//! an error or a timeout) and keel-policy's pure chain decides ([`keel_policy::Policy::decide`], the
//! function the node's `keel hook` bridge calls). The verdict's audit rows go to the coordinator
//! node's checkpoint writer as a host stage, as the runtime's `AuditWriter` stages them, and the
//! session waits in its hook for the writer's answer (`Envelope::Host`): the tool runs only if the
//! verdict allows it and the answer is durable. A failed commit, or no answer within
//! `AUDIT_WAIT_MS` (the node crashed and the stage was lost with it), denies the call: the bridge
//! fails closed. An `ask` (once its verdict's rows are durable) raises an approval escalation (the
//! rows the runtime's approval desk stages), the seed draws the human (approve, deny, or never: the
//! deadline passes and the expiry is recorded), the answer is committed as `keel answer` stages it,
//! then the `approval` audit row; the call runs only when the approval and its row are durable.
//! Those three commits are still the world's own, synchronous and alone (not the desk's host
//! stages). A denial answers the tool_use with an error result instead of the tool's output.
//!
//! The checker is told what each hook answered and, when a tool runs, which audit rows of that
//! call the store holds at that moment (invariant 12).

use keel_actors::escalation::{APPROVE, ApprovalCase, REFUSE, approves};
use keel_actors::{
    AttemptId, CheckpointInput, CheckpointMsg, CommitBatch, CommitId, Effect, Stage, StageOwner,
};
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
use super::event::Ev;

/// How long a gated call waits for the checkpoint writer's answer to its audit rows before it is
/// denied: the runtime's `AUDIT_WAIT_MS` (keel-actors' `runtime` module, which this crate builds
/// without).
const AUDIT_WAIT_MS: u64 = 10_000;

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

/// Where a harness session is: its worker, the worker's incarnation, its attempt and its id.
#[derive(Clone, Copy, Debug)]
pub(super) struct SessionAt {
    pub(super) node: NodeId,
    pub(super) inc: u32,
    pub(super) attempt: AttemptId,
    pub(super) session: u64,
}

/// What the policy made of a tool_use.
pub(super) enum Gate {
    /// Decided now: `Some` is the result that replaces the tool's (it does not run).
    Decided(Option<HarnessEvent>),
    /// Its audit rows are staged; the session waits for the checkpoint writer's answer.
    Waiting,
}

/// A gated call whose audit rows wait for the checkpoint writer's answer (by host ticket).
#[derive(Debug)]
pub(super) struct PendingGate {
    at: SessionAt,
    id: String,
    call: ToolCall,
    verdict: Verdict,
    /// The newest audit sequence number of the run before its rows were staged.
    before: u64,
}

/// The result a denied call's tool_use gets instead of the tool's output.
fn denial(id: &str, why: &str) -> HarnessEvent {
    HarnessEvent::tool_result(id, true, format!("denied by keel's policy: {why}"))
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
    /// its hooks answer and the chain decides, then the verdict's audit rows are staged to the
    /// coordinator node's checkpoint writer as a host stage, as the runtime's `AuditWriter` stages
    /// them, and the session waits for the writer's answer ([`World::gate_answered`]) or for
    /// [`AUDIT_WAIT_MS`] to pass ([`World::gate_wait_over`]).
    pub(super) fn gate_tool(
        &mut self,
        at: SessionAt,
        id: &str,
        name: &str,
        input_json: &str,
    ) -> Gate {
        let Some(policy) = self.policy.clone() else {
            return Gate::Decided(None);
        };
        let attempt = at.attempt;
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
        if self.config.mutation == Some(Mutation::RunToolBeforeAudit)
            && verdict.decision == Decision::Allow
        {
            // A defective bridge that lets the tool run and stages the rows after, unwaited.
            let audited = self.audit_rows_after(attempt.run, before, attempt, &call);
            self.checker
                .tool_runs(self.event_no, attempt, id, name, &audited, None);
            self.stage_audit(attempt.run, rows);
            return Gate::Decided(None);
        }
        let Some(ticket) = self.stage_audit(attempt.run, rows) else {
            // The coordinator node is down: the bridge cannot reach it and fails closed.
            return Gate::Decided(Some(denial(
                id,
                "the decision could not be audited (failed closed)",
            )));
        };
        self.gates.insert(
            ticket,
            PendingGate {
                at,
                id: id.to_owned(),
                call,
                verdict,
                before,
            },
        );
        self.schedule(self.now + AUDIT_WAIT_MS, Ev::AuditWait { ticket });
        Gate::Waiting
    }

    /// Stages a verdict's audit rows to the coordinator node's checkpoint writer as one host stage
    /// (an urgent `Stage`, scheduled as the world schedules every checkpoint input); its ticket, or
    /// `None` when the node is down.
    fn stage_audit(&mut self, run: RunId, rows: Vec<AuditEntry>) -> Option<u64> {
        self.coord.as_ref()?;
        self.host_stages += 1;
        let ticket = self.host_stages;
        let stage = Stage {
            run,
            owner: StageOwner::Host,
            ticket,
            ops: rows
                .into_iter()
                .map(keel_actors::PersistOp::AppendAudit)
                .collect::<Vec<_>>()
                .into(),
        };
        self.schedule(
            self.now,
            Ev::Ckpt {
                input: CheckpointInput::Msg(CheckpointMsg::Stage(stage)),
                inc: self.coord_inc,
            },
        );
        Some(ticket)
    }

    /// The checkpoint writer answered host stage `ticket` (`Ok`: its rows are durable). A gated
    /// call waiting for it is decided: it runs only if its verdict allows it and its rows are
    /// durable (an `ask` is put to a human first); otherwise its result becomes the denial. Its
    /// session then goes on.
    pub(super) fn gate_answered(&mut self, ticket: u64, result: Result<(), String>) {
        self.gate_decided(ticket, result.is_ok(), false);
    }

    /// The wait for host stage `ticket`'s answer is over: if a gated call still waits for it (the
    /// coordinator node crashed, the writer never answered), it is denied, as the runtime's
    /// `AuditWriter` gives up after `AUDIT_WAIT_MS`.
    pub(super) fn gate_wait_over(&mut self, ticket: u64) {
        self.gate_decided(ticket, false, true);
    }

    /// Decides the gated call waiting for host stage `ticket`, if one still does: `durable` its
    /// rows, or `timed_out` waiting for them.
    fn gate_decided(&mut self, ticket: u64, durable: bool, timed_out: bool) {
        let Some(gate) = self.gates.remove(&ticket) else {
            // Not a gate's stage, or its wait is over already (the call was denied).
            return;
        };
        if !durable {
            self.checker.audit_not_durable(timed_out);
        }
        let PendingGate {
            at,
            id,
            call,
            verdict,
            before,
        } = gate;
        let attempt = at.attempt;
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
                .tool_runs(self.event_no, attempt, &id, &call.tool, &audited, approval);
        } else {
            let denied = denial(&id, &why);
            self.replace_result(at, &id, denied);
        }
        self.next_harness_event(at.node, at.inc, attempt, at.session);
    }

    /// Replaces the scripted result of tool_use `id`, the next event of the session at `at`, with
    /// `result`: the tool does not run.
    pub(super) fn replace_result(&mut self, at: SessionAt, id: &str, result: HarnessEvent) {
        let Some(w) = self.workers.get_mut(usize::from(at.node.0) - 1) else {
            return;
        };
        if !w.up || w.inc != at.inc {
            return;
        }
        if let Some(s) = w
            .specialists
            .get_mut(&at.attempt)
            .and_then(|h| h.session.as_mut())
            .filter(|s| s.id == at.session)
            && let Some((_, next)) = s.events.front_mut()
            && matches!(next, HarnessEvent::ToolResult { id: r, .. } if r.as_str() == id)
        {
            *next = result;
        }
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
