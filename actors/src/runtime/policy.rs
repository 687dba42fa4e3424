//! The policy hosted by the runtime (docs/DESIGN.md §9): one place where a tool call is decided and
//! its result handed back, for every harness. keel's own loop calls it in process (the
//! [`ToolGuard`] [`PolicyHost::service`] puts in each session's spec); the CLIs reach the same
//! [`PolicyHost::before_tool`] through their native hooks and the node's `keel hook` bridge.
//!
//! Before a call: the `PreToolUse` hooks run (keel.toml's, then hooks registered in code), the
//! permission chain decides with the session's tool list and its agent's rules, the gates check an
//! allowed call against the run's gate ledger in the store, and the decision's audit rows and gate
//! marks are made durable in one commit before the answer (invariant 12): a call whose rows are not
//! durable is denied. An `ask` raises an approval escalation and waits for `keel answer`.
//! After a call: the `PostToolUse` hooks may rewrite or withhold the result, and a successful call
//! may meet a prerequisite or issue a token; those rows are durable before the model sees the
//! result.
//!
//! An embedding host builds a [`Policy`] (registering its own hooks with
//! [`Policy::register_hook`]), wraps it in a [`PolicyHost`], adds [`PolicyHost::service`] to its
//! [`super::HarnessSet`] and calls [`PolicyHost::attach`] once its [`Runtime`] has started.

use std::sync::{Arc, OnceLock};

use keel_harness::{GuardFuture, GuardedCall, PermissionMode, SessionSpec, ToolGuard, ToolOutput};
use keel_policy::{Caller, Decision, HookEvent, Policy, ToolCall, Verdict};
use keel_store::{AuditEntry, HookDecision};
use serde_json::{Value, json};

use super::Runtime;
use super::audit::AuditWriter;
use super::clock::{OsEntropy, wall_clock_ms};
use super::escalation::{ApprovalDesk, ApprovalEnd};
use super::harnesses::SessionService;
use crate::escalation::{
    ApprovalCase, approval as approval_escalation, approves, mint_escalation_id,
};
use crate::ids::AttemptId;

/// Who a decision is for: the session's attempt and what the chain needs about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolScope {
    /// The session's attempt (its run and task).
    pub attempt: AttemptId,
    /// The session's own permission mode.
    pub mode: PermissionMode,
    /// The tools the session may use (its profile's, with keel's session tools); empty: any.
    pub tools: Vec<String>,
    /// The agent profile it runs as.
    pub agent: String,
}

impl ToolScope {
    /// The scope of `attempt`'s session as its spec describes it (after the host prepared it).
    pub fn of(attempt: AttemptId, spec: &SessionSpec) -> ToolScope {
        ToolScope {
            attempt,
            mode: spec.permission_mode,
            tools: spec.allowed_tools.clone(),
            agent: spec.agent.clone(),
        }
    }
}

/// The answer for one call: the decision and the reason the model is told on a denial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolAnswer {
    /// Allow or deny (an ask has been answered by then).
    pub decision: Decision,
    /// Why.
    pub reason: String,
    /// The link that decided (`hook:NAME`, `deny-rule`, `gate:NAME`, `approval`, ...).
    pub decided_by: String,
}

impl ToolAnswer {
    fn deny(reason: String) -> ToolAnswer {
        ToolAnswer {
            decision: Decision::Deny,
            reason,
            decided_by: "keel".into(),
        }
    }
}

struct Inner {
    policy: Policy,
    audit: OnceLock<AuditWriter>,
    desk: OnceLock<ApprovalDesk>,
    /// Held from reading the gate ledger to the commit of the marks a gated call writes.
    gates_serial: tokio::sync::Mutex<()>,
}

/// The runtime's policy: cheap to clone, shared by the in-process guards and the `keel hook`
/// bridge. Until [`PolicyHost::attach`] every call is denied (nothing could be recorded).
#[derive(Clone)]
pub struct PolicyHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PolicyHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyHost")
            .field("hooks", &self.inner.policy.hooks.len())
            .field("gates", &self.inner.policy.gates.len())
            .field("attached", &self.inner.audit.get().is_some())
            .finish_non_exhaustive()
    }
}

impl PolicyHost {
    /// A host for `policy` (hooks in code already registered on it).
    pub fn new(policy: Policy) -> PolicyHost {
        PolicyHost {
            inner: Arc::new(Inner {
                policy,
                audit: OnceLock::new(),
                desk: OnceLock::new(),
                gates_serial: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// The policy it applies.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Records decisions and raises approvals through `runtime` from now on.
    pub fn attach(&self, runtime: &Runtime) {
        self.attach_parts(runtime.audit_writer(), runtime.approval_desk());
    }

    /// [`PolicyHost::attach`] from the runtime's two handles.
    pub fn attach_parts(&self, audit: AuditWriter, desk: ApprovalDesk) {
        let _ = self.inner.audit.set(audit);
        let _ = self.inner.desk.set(desk);
    }

    /// The service that hands every session's spec a guard calling this host in process (keel's
    /// own loop uses it; a CLI ignores it and is given the bridge's gate instead).
    pub fn service(&self) -> Arc<dyn SessionService> {
        Arc::new(GuardService(self.clone()))
    }

    /// Decides `call` for `scope` before it runs: hooks, chain, gates, durable audit rows and gate
    /// marks, an approval for an ask. `payload` is the hook payload commands get (keel adds the
    /// run, task and attempt).
    pub async fn before_tool(
        &self,
        scope: &ToolScope,
        call: &ToolCall,
        mut payload: Value,
    ) -> ToolAnswer {
        let inner = &*self.inner;
        let policy = &inner.policy;
        add_identity(&mut payload, scope);
        let outcomes = keel_policy::run::run_hooks(policy, call, &payload).await;
        let Some(audit) = inner.audit.get() else {
            return ToolAnswer::deny(
                "keel: the node is not ready to record decisions (denied)".into(),
            );
        };
        let caller = Caller {
            mode: scope.mode,
            tools: &scope.tools,
            agent: policy.agent_rules(&scope.agent),
        };
        let verdict = policy.decide_for(call, caller, &outcomes);
        let task = Some(scope.attempt.task);
        let now = wall_clock_ms();
        // A gated call is decided one at a time, from the ledger in the store to the durable marks
        // it writes, so two concurrent calls cannot both take the last place.
        let gated = keel_policy::guards(&policy.gates, call);
        let serial = if gated {
            Some(inner.gates_serial.lock().await)
        } else {
            None
        };
        let (verdict, marks) = if gated && verdict.decision == Decision::Allow {
            match audit.read_marks(scope.attempt.run).await {
                Ok(ledger) => {
                    keel_policy::apply_gates(&policy.gates, call, verdict, task, &ledger, now)
                }
                Err(e) => {
                    return ToolAnswer::deny(format!(
                        "keel: the gates' ledger could not be read, so the call is denied: {e}"
                    ));
                }
            }
        } else {
            (verdict, Vec::new())
        };
        let mut entries = verdict.audit_entries(now, task, call);
        let mut answer = ToolAnswer {
            decision: verdict.decision,
            reason: verdict.reason.clone(),
            decided_by: verdict.decided_by.clone(),
        };
        if verdict.decision == Decision::Ask {
            // The ask itself is durable before anyone is asked; the gates' lock is not held while
            // a human thinks.
            drop(serial);
            if let Err(e) = audit.append(scope.attempt.run, entries).await {
                return ToolAnswer::deny(format!(
                    "keel: the decision could not be recorded, so the call is denied: {e}"
                ));
            }
            let (decision, reason, row) = self.approval(scope, call, &verdict, audit).await;
            answer = ToolAnswer {
                decision,
                reason,
                decided_by: "approval".into(),
            };
            entries = vec![row];
        }
        if let Err(e) = audit
            .append_with_marks(scope.attempt.run, entries, marks)
            .await
        {
            return ToolAnswer::deny(format!(
                "keel: the decision could not be recorded, so the call is denied: {e}"
            ));
        }
        answer
    }

    /// Hands back the result the model sees for `call`, which ran and produced `output`: the
    /// `PostToolUse` hooks' result, after their audit rows (and the gate marks a successful call
    /// earns) are durable. A result a hook changed whose rows cannot be recorded is withheld.
    pub async fn after_tool(
        &self,
        scope: &ToolScope,
        call: &ToolCall,
        mut payload: Value,
        output: ToolOutput,
    ) -> ToolOutput {
        let policy = &self.inner.policy;
        let task = Some(scope.attempt.task);
        let now = wall_clock_ms();
        let marks = if output.is_error {
            Vec::new()
        } else {
            keel_policy::marks_on_success(&policy.gates, call, task, now)
        };
        let has_hooks = policy
            .hooks_for(HookEvent::PostToolUse, Some(&call.tool))
            .next()
            .is_some();
        if !has_hooks && marks.is_empty() {
            return output;
        }
        let (result, trail) = if has_hooks {
            add_identity(&mut payload, scope);
            keel_policy::run::run_post_hooks(policy, call, &payload, output).await
        } else {
            (output, Vec::new())
        };
        let entries = keel_policy::audit_rows(&trail, now, task, call);
        let recorded = match self.inner.audit.get() {
            Some(audit) => audit
                .append_with_marks(scope.attempt.run, entries, marks)
                .await
                .map_err(|e| e.to_string()),
            None => Err("the node is not ready to record decisions".into()),
        };
        match recorded {
            Ok(()) => result,
            Err(e) if !trail.is_empty() => ToolOutput {
                is_error: true,
                text: format!(
                    "keel: the PostToolUse decision could not be recorded ({e}); the result is \
                     withheld"
                ),
            },
            // Only marks were lost: the result stands; a gate waiting for them stays closed.
            Err(e) => {
                tracing::warn!(error = %e, tool = %call.tool, "a gate mark was not recorded");
                result
            }
        }
    }

    /// An `ask`: raises an approval escalation (the policy-gap trigger) with the call's case, waits
    /// for `keel answer` up to the policy's timeout, and answers the decision with its audit row:
    /// allowed when a human approved, denied when a human refused, when the timeout passed first,
    /// or when the escalation could not be raised.
    async fn approval(
        &self,
        scope: &ToolScope,
        call: &ToolCall,
        verdict: &Verdict,
        audit: &AuditWriter,
    ) -> (Decision, String, AuditEntry) {
        let policy = &self.inner.policy;
        let row = |decision: HookDecision, reason: String| AuditEntry {
            ts_ms: wall_clock_ms(),
            task_id: Some(scope.attempt.task),
            hook: "approval".into(),
            tool: call.tool.clone(),
            decision,
            reason,
            input_digest: call.input_digest(),
            rewritten: false,
        };
        let deny = |reason: String| {
            let entry = row(HookDecision::Deny, reason.clone());
            (Decision::Deny, reason, entry)
        };
        let Some(desk) = self.inner.desk.get() else {
            return deny(format!(
                "{}; keel cannot ask a human here, so the call is denied",
                verdict.reason
            ));
        };
        let now = wall_clock_ms();
        let id = match OsEntropy::from_os() {
            Ok(mut rng) => mint_escalation_id(now, &mut rng),
            Err(e) => {
                return deny(format!(
                    "keel: no escalation id ({e}), so the call is denied"
                ));
            }
        };
        let approved_before = audit
            .read_all(scope.attempt.run)
            .await
            .map(|rows| {
                rows.iter()
                    .filter(|r| {
                        r.task_id == Some(scope.attempt.task)
                            && r.hook == "approval"
                            && r.tool == call.tool
                            && r.decision == HookDecision::Allow
                    })
                    .count()
            })
            .unwrap_or(0);
        let case = ApprovalCase {
            tool: call.tool.clone(),
            subject: call.subject().unwrap_or_else(|| call.tool.clone()),
            asked_by: format!("{} ({})", verdict.reason, verdict.decided_by),
            amount_micros: amount_micros(&call.input),
            deadline_ms: now.saturating_add(policy.ask_timeout_ms),
            approved_before: u32::try_from(approved_before).unwrap_or(u32::MAX),
        };
        let escalation = approval_escalation(id, now, scope.attempt.task, String::new(), case);
        let wait = std::time::Duration::from_millis(policy.ask_timeout_ms);
        tracing::info!(escalation = %id, tool = %call.tool, "a tool call waits for a human's approval");
        match desk
            .raise_and_wait(scope.attempt.run, escalation, wait)
            .await
        {
            Ok(ApprovalEnd::Answered(text)) if approves(&text) => {
                let reason = format!("approved by a human (escalation {id})");
                let entry = row(HookDecision::Allow, reason.clone());
                (Decision::Allow, reason, entry)
            }
            Ok(ApprovalEnd::Answered(text)) => deny(format!(
                "refused by a human (escalation {id}: {text}); do not retry this call"
            )),
            Ok(ApprovalEnd::Expired) => deny(format!(
                "timed out: nobody answered escalation {id} within {} s, so the call is denied",
                policy.ask_timeout_ms / 1000
            )),
            Err(e) => deny(format!(
                "keel could not ask a human ({e}), so the call is denied"
            )),
        }
    }
}

/// keel's identity of the call in a hook's payload: the run, task and attempt.
fn add_identity(payload: &mut Value, scope: &ToolScope) {
    if let Some(obj) = payload.as_object_mut() {
        obj.insert("run_id".into(), scope.attempt.run.to_string().into());
        obj.insert("task_id".into(), scope.attempt.task.to_string().into());
        obj.insert("attempt".into(), scope.attempt.attempt.into());
    }
}

/// The amount a tool call moves, when its input names one: `amount_micros` (an integer) or
/// `amount` (a number of dollars): what an approval's escalation shows.
fn amount_micros(input: &Value) -> Option<u64> {
    if let Some(m) = input.get("amount_micros").and_then(Value::as_u64) {
        return Some(m);
    }
    keel_policy::gate::amount_micros(input, "amount").ok()
}

/// Gives each session a guard that calls the host in process.
struct GuardService(PolicyHost);

impl SessionService for GuardService {
    fn session_starting(&self, attempt: AttemptId, spec: &mut SessionSpec) {
        spec.in_process.tool = Some(Arc::new(SessionGuard {
            host: self.0.clone(),
            scope: ToolScope::of(attempt, spec),
        }));
    }

    fn session_ended(&self, _attempt: AttemptId) {}
}

/// One session's guard: the host and who the session is.
struct SessionGuard {
    host: PolicyHost,
    scope: ToolScope,
}

impl SessionGuard {
    fn payload(call: &GuardedCall<'_>, event: &str) -> Value {
        json!({"hook_event_name": event, "tool_name": call.tool, "tool_input": call.input,
               "tool_use_id": call.tool_use_id, "cwd": call.cwd.display().to_string()})
    }
}

impl ToolGuard for SessionGuard {
    fn before_tool<'a>(&'a self, call: GuardedCall<'a>) -> GuardFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let tool_call = ToolCall::new(call.tool, call.input.clone());
            let payload = Self::payload(&call, HookEvent::PreToolUse.as_str());
            let answer = self
                .host
                .before_tool(&self.scope, &tool_call, payload)
                .await;
            match answer.decision {
                Decision::Allow => Ok(()),
                Decision::Deny | Decision::Ask => Err(answer.reason),
            }
        })
    }

    fn after_tool<'a>(
        &'a self,
        call: GuardedCall<'a>,
        output: ToolOutput,
    ) -> GuardFuture<'a, ToolOutput> {
        Box::pin(async move {
            let tool_call = ToolCall::new(call.tool, call.input.clone());
            let payload = Self::payload(&call, HookEvent::PostToolUse.as_str());
            self.host
                .after_tool(&self.scope, &tool_call, payload, output)
                .await
        })
    }
}
