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
//!
//! The in-process guard and the node's bridge ask a [`PolicyDecider`]: the [`PolicyHost`] itself
//! where the store is (a coordinator, `keel run`), or a cluster worker's remote policy, which
//! forwards each question to the coordinator node's [`PolicyHost`] and denies when no answer comes.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::sync::{Arc, OnceLock};

use keel_harness::{GuardFuture, GuardedCall, PermissionMode, SessionSpec, ToolGuard, ToolOutput};
use keel_policy::{
    AuditLine, Caller, Decision, GateLedger, HookEvent, Policy, ToolCall, Verdict, link,
};
use keel_store::{AuditEntry, GateMark, HookDecision, RunId};
use serde_json::{Value, json};

use super::Runtime;
use super::audit::{AUDIT_WAIT_MS, AuditError, AuditWriter};
use super::clock::{OsEntropy, wall_clock_ms};
use super::escalation::{ApprovalDesk, ApprovalEnd, ESCALATION_WRITE_WAIT_MS};
use super::harnesses::{ServiceFuture, SessionService, SubagentAnswer, SubagentEvent};
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

    /// The answer a recorded verdict gives.
    fn of(verdict: &Verdict) -> ToolAnswer {
        ToolAnswer {
            decision: verdict.decision,
            reason: verdict.reason.clone(),
            decided_by: verdict.decided_by.clone(),
        }
    }

    /// A decision whose rows are not durable: the call is denied.
    fn not_recorded(e: &AuditError) -> ToolAnswer {
        ToolAnswer::deny(format!(
            "keel: the decision could not be recorded, so the call is denied: {e}"
        ))
    }
}

/// What a session event's hooks answered ([`PolicyHost::on_session_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventAnswer {
    /// `Deny`: the event is vetoed; `Allow`: it goes on.
    pub decision: Decision,
    /// Why it was vetoed (empty when it goes on).
    pub reason: String,
    /// The hooks' annotations, to carry into the brief, the report or the compaction.
    pub context: Option<String>,
    /// The hook that vetoed (`hook:NAME`), `keel` when the decision could not be recorded, or
    /// empty.
    pub decided_by: String,
}

impl EventAnswer {
    fn go_on(context: Option<String>) -> EventAnswer {
        EventAnswer {
            decision: Decision::Allow,
            reason: String::new(),
            context,
            decided_by: String::new(),
        }
    }
}

/// The run's indexed gate ledger, built from the store's `gate_marks` when this host holds none
/// for it yet (the run's first gated call here, or after a failed commit).
async fn ledger_of<'a>(
    ledgers: &'a mut BTreeMap<RunId, GateLedger>,
    audit: &AuditWriter,
    run: RunId,
) -> Result<&'a mut GateLedger, AuditError> {
    match ledgers.entry(run) {
        Entry::Occupied(held) => Ok(held.into_mut()),
        Entry::Vacant(slot) => {
            let marks = audit.read_marks(run).await?;
            Ok(slot.insert(GateLedger::from_marks(&marks)))
        }
    }
}

/// Makes `entries` and `marks` durable in one commit and then adds the marks to the run's index,
/// when `ledgers` (the gates' lock) is held. A failed commit drops the run's index: whether its
/// marks reached the store is unknown, so the next gated call rebuilds it from the store.
async fn commit(
    ledgers: Option<&mut BTreeMap<RunId, GateLedger>>,
    audit: &AuditWriter,
    run: RunId,
    entries: Vec<AuditEntry>,
    marks: Vec<GateMark>,
) -> Result<(), AuditError> {
    let Some(ledgers) = ledgers else {
        return audit.append_with_marks(run, entries, marks).await;
    };
    let written = marks.clone();
    match audit.append_with_marks(run, entries, marks).await {
        Ok(()) => {
            if let Some(ledger) = ledgers.get_mut(&run) {
                ledger.record(&written);
            }
            Ok(())
        }
        Err(e) => {
            ledgers.remove(&run);
            Err(e)
        }
    }
}

struct Inner {
    policy: Policy,
    audit: OnceLock<AuditWriter>,
    desk: OnceLock<ApprovalDesk>,
    /// Each run's gate ledger, indexed ([`GateLedger`]): built from the store's `gate_marks` on the
    /// run's first gated call here (after a restart, from what is durable), then kept up to date
    /// with each mark once it is durable. The lock is held from the look-up to the commit of the
    /// marks a gated call writes, so two calls cannot both take the last place.
    ledgers: tokio::sync::Mutex<BTreeMap<RunId, GateLedger>>,
    /// The calls `before_tool` allowed and whose result has not come back yet, by attempt and the
    /// harness's call id: only such a call's success earns gate marks in `after_tool`. A CLI's
    /// result reaches the node through a hook command holding the session's token, which the
    /// session's own tools can read; a result for a call nobody allowed (made up by the session,
    /// or posted twice) earns nothing.
    allowed: std::sync::Mutex<AllowedCalls>,
}

/// [`Inner::allowed`]: bounded, the oldest attempts forgotten first (a forgotten call's success
/// earns no marks: fails closed).
#[derive(Default)]
struct AllowedCalls {
    by_attempt: BTreeMap<AttemptId, std::collections::VecDeque<String>>,
}

/// Most attempts whose allowed calls are remembered.
const ALLOWED_ATTEMPTS_MAX: usize = 4_096;
/// Most allowed calls remembered per attempt awaiting their results.
const ALLOWED_CALLS_MAX: usize = 1_024;

impl AllowedCalls {
    fn allow(&mut self, attempt: AttemptId, id: String) {
        if !self.by_attempt.contains_key(&attempt)
            && self.by_attempt.len() >= ALLOWED_ATTEMPTS_MAX
            && let Some(oldest) = self.by_attempt.keys().next().copied()
        {
            self.by_attempt.remove(&oldest);
        }
        let calls = self.by_attempt.entry(attempt).or_default();
        if calls.len() >= ALLOWED_CALLS_MAX {
            calls.pop_front();
        }
        calls.push_back(id);
    }

    /// Whether `id` was allowed for `attempt` and not yet taken; takes it.
    fn take(&mut self, attempt: AttemptId, id: &str) -> bool {
        let Some(calls) = self.by_attempt.get_mut(&attempt) else {
            return false;
        };
        let Some(at) = calls.iter().position(|c| c == id) else {
            return false;
        };
        calls.remove(at);
        if calls.is_empty() {
            self.by_attempt.remove(&attempt);
        }
        true
    }
}

/// The harness's id of a call in a hook payload (`tool_use_id`; the opencode plugin and the pi
/// extension put their call ids there).
fn call_id(payload: &Value) -> Option<String> {
    payload
        .get("tool_use_id")
        .and_then(Value::as_str)
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
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
                ledgers: tokio::sync::Mutex::new(BTreeMap::new()),
                allowed: std::sync::Mutex::new(AllowedCalls::default()),
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
        guard_service(Arc::new(self.clone()))
    }

    /// Decides `call` for `scope` before it runs: hooks, chain, gates, durable audit rows and gate
    /// marks, an approval for an ask. `payload` is the hook payload commands get (keel adds the
    /// run, task and attempt). An allowed call's id is remembered: only its result earns marks.
    pub async fn before_tool(
        &self,
        scope: &ToolScope,
        call: &ToolCall,
        payload: Value,
    ) -> ToolAnswer {
        let id = call_id(&payload);
        let answer = self.decide_before(scope, call, payload).await;
        if answer.decision == Decision::Allow
            && let Some(id) = id
        {
            lock_allowed(&self.inner.allowed).allow(scope.attempt, id);
        }
        answer
    }

    async fn decide_before(
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
        let run = scope.attempt.run;
        let task = Some(scope.attempt.task);
        let now = wall_clock_ms();
        // A gated call is decided one at a time, from the run's indexed ledger to the durable marks
        // it writes, so two concurrent calls cannot both take the last place. An ask is checked too:
        // nobody is asked about a call the gates refuse.
        let gated = keel_policy::guards(&policy.gates, call);
        let mut ledgers = if gated {
            Some(inner.ledgers.lock().await)
        } else {
            None
        };
        let (verdict, marks) = match ledgers.as_deref_mut() {
            Some(ledgers) if verdict.decision != Decision::Deny => {
                match ledger_of(ledgers, audit, run).await {
                    Ok(ledger) => {
                        keel_policy::apply_gates(&policy.gates, call, verdict, task, ledger, now)
                    }
                    Err(e) => {
                        return ToolAnswer::deny(format!(
                            "keel: the gates' ledger could not be read, so the call is denied: {e}"
                        ));
                    }
                }
            }
            _ => (verdict, Vec::new()),
        };
        let entries = verdict.audit_entries(now, task, call);
        if verdict.decision != Decision::Ask {
            return match commit(ledgers.as_deref_mut(), audit, run, entries, marks).await {
                Ok(()) => ToolAnswer::of(&verdict),
                Err(e) => ToolAnswer::not_recorded(&e),
            };
        }
        // The ask itself is durable before anyone is asked; the gates' lock is not held while a
        // human thinks.
        drop(ledgers);
        if let Err(e) = audit.append(run, entries).await {
            return ToolAnswer::not_recorded(&e);
        }
        let reason = match self.approval(scope, call, &verdict, audit).await {
            Ok(reason) => reason,
            Err(reason) => {
                let refused = AuditLine {
                    who: link::APPROVAL.into(),
                    decision: HookDecision::Deny,
                    reason: reason.clone(),
                    rewritten: false,
                };
                let rows = keel_policy::audit_rows(&[refused], wall_clock_ms(), task, call);
                if let Err(e) = audit.append(run, rows).await {
                    return ToolAnswer::not_recorded(&e);
                }
                return ToolAnswer {
                    decision: Decision::Deny,
                    reason,
                    decided_by: link::APPROVAL.into(),
                };
            }
        };
        // A human approved: the call still passes every gate, checked now against the ledger as it
        // is after the wait, and its marks are written with the approval's row.
        let approved = Verdict::approved(reason);
        let now = wall_clock_ms();
        let mut ledgers = if gated {
            Some(inner.ledgers.lock().await)
        } else {
            None
        };
        let (verdict, marks) = match ledgers.as_deref_mut() {
            Some(ledgers) => match ledger_of(ledgers, audit, run).await {
                Ok(ledger) => {
                    keel_policy::apply_gates(&policy.gates, call, approved, task, ledger, now)
                }
                Err(e) => {
                    return ToolAnswer::deny(format!(
                        "keel: the gates' ledger could not be read, so the approved call is \
                         denied: {e}"
                    ));
                }
            },
            None => (approved, Vec::new()),
        };
        let entries = verdict.audit_entries(now, task, call);
        match commit(ledgers.as_deref_mut(), audit, run, entries, marks).await {
            Ok(()) => ToolAnswer::of(&verdict),
            Err(e) => ToolAnswer::not_recorded(&e),
        }
    }

    /// A session event (`SubagentStart`, `SubagentStop`, `PreCompact`; docs/DESIGN.md §9): runs
    /// its hooks in the policy's order (matched by the scope's agent for a subagent event) and
    /// answers a veto (`Deny`) or that the event goes on (`Allow`, with the hooks' notes), once
    /// each hook's audit row is durable (the `tool` column holds the event's name). Rows that
    /// cannot be made durable veto the event. No hook: `Allow`, and nothing is written. `payload`
    /// is what a command hook gets on stdin (keel adds the event's name, the run, task, attempt
    /// and agent). The `keel hook` bridge calls it for the CLIs' own events.
    pub async fn on_session_event(
        &self,
        scope: &ToolScope,
        event: HookEvent,
        mut payload: Value,
    ) -> EventAnswer {
        let policy = &self.inner.policy;
        let agent = matches!(event, HookEvent::SubagentStart | HookEvent::SubagentStop)
            .then_some(scope.agent.as_str());
        if policy.hooks_for(event, agent).next().is_none() {
            return EventAnswer::go_on(None);
        }
        add_identity(&mut payload, scope);
        if let Some(obj) = payload.as_object_mut() {
            obj.insert("hook_event_name".into(), event.as_str().into());
            obj.insert("agent".into(), scope.agent.clone().into());
        }
        let outcomes = keel_policy::run::run_event_hooks(policy, event, agent, &payload).await;
        let verdict = keel_policy::decide_event(event.as_str(), &outcomes);
        let subject = ToolCall::new(event.as_str(), payload);
        let rows = keel_policy::audit_rows(
            &verdict.trail,
            wall_clock_ms(),
            Some(scope.attempt.task),
            &subject,
        );
        let recorded = match self.inner.audit.get() {
            Some(audit) => audit
                .append(scope.attempt.run, rows)
                .await
                .map_err(|e| e.to_string()),
            None => Err("the node is not ready to record decisions".into()),
        };
        if let Err(e) = recorded {
            return EventAnswer {
                decision: Decision::Deny,
                reason: format!(
                    "keel: the {} decision could not be recorded, so it is refused: {e}",
                    event.as_str()
                ),
                context: None,
                decided_by: "keel".into(),
            };
        }
        match verdict.veto {
            Some((who, reason)) => EventAnswer {
                decision: Decision::Deny,
                reason: format!("{} hook {who} vetoed it: {reason}", event.as_str()),
                context: None,
                decided_by: who,
            },
            None => EventAnswer::go_on(verdict.annotation()),
        }
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
        // Only the result of a call this host allowed, once, earns marks (see `Inner::allowed`).
        let allowed = call_id(&payload)
            .is_some_and(|id| lock_allowed(&self.inner.allowed).take(scope.attempt, &id));
        let marks = if output.is_error || !allowed {
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
            // Marks go into the run's index too, under the gates' lock, once they are durable.
            Some(audit) if !marks.is_empty() => {
                let mut ledgers = self.inner.ledgers.lock().await;
                commit(Some(&mut ledgers), audit, scope.attempt.run, entries, marks)
                    .await
                    .map_err(|e| e.to_string())
            }
            Some(audit) => audit
                .append(scope.attempt.run, entries)
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

    /// An `ask`: raises an approval escalation (the policy-gap trigger) with the call's case and
    /// waits for `keel answer` up to the policy's timeout. `Ok` with the approval's reason when a
    /// human approved (the gates are checked next); `Err` with the denial's reason when a human
    /// refused, when the timeout passed first, or when the escalation could not be raised.
    async fn approval(
        &self,
        scope: &ToolScope,
        call: &ToolCall,
        verdict: &Verdict,
        audit: &AuditWriter,
    ) -> Result<String, String> {
        let policy = &self.inner.policy;
        let deny = Err::<String, String>;
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
                            && r.hook == link::APPROVAL
                            && r.tool == call.tool
                            && r.decision == HookDecision::Allow
                    })
                    .count()
            })
            .unwrap_or(0);
        let case = ApprovalCase {
            tool: call.tool.clone(),
            subject: call.subject().unwrap_or(&call.tool).to_owned(),
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
                Ok(format!("approved by a human (escalation {id})"))
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

/// How long a policy may take to decide, which sets how long a session's gate waits: the sum of
/// its hooks' timeouts, an ask's wait for a human and the audit commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateTimes {
    /// Most milliseconds a pre-tool decision (or a session event's) takes.
    pub decide_ms: u64,
    /// `Some` when the policy needs tool results (a `PostToolUse` hook, or a gate waiting for a
    /// success): most milliseconds a post-tool decision takes. `None`: no CLI pays for the hook.
    pub post_ms: Option<u64>,
    /// Whether the policy has hooks for a CLI's own session events (`PreCompact`): only then does
    /// a session get the CLI's pre-compaction hook (no CLI pays for a hook nobody listens to).
    pub session_events: bool,
}

impl GateTimes {
    /// The times of `policy`.
    pub fn of(policy: &Policy) -> GateTimes {
        let hooks_ms: u64 = policy.hooks.iter().map(|h| h.timeout_ms).sum();
        // An `ask` (from a rule or a hook) waits for a human up to its timeout, then records its
        // end: the gate waits that long too, so the decision is never cut off.
        let ask_ms = policy.ask_timeout_ms + 2 * ESCALATION_WRITE_WAIT_MS + AUDIT_WAIT_MS;
        let needs_results = policy
            .hooks
            .iter()
            .any(|h| h.event == HookEvent::PostToolUse)
            || policy.gates.iter().any(|g| {
                matches!(
                    g.check,
                    keel_policy::GateCheck::Prerequisite { .. }
                        | keel_policy::GateCheck::Token { .. }
                )
            });
        let post_ms = needs_results.then(|| {
            let post_hooks_ms: u64 = policy
                .hooks
                .iter()
                .filter(|h| h.event == HookEvent::PostToolUse)
                .map(|h| h.timeout_ms)
                .sum();
            post_hooks_ms + AUDIT_WAIT_MS
        });
        GateTimes {
            decide_ms: hooks_ms + ask_ms + AUDIT_WAIT_MS,
            post_ms,
            session_events: policy
                .hooks
                .iter()
                .any(|h| h.event == HookEvent::PreCompact),
        }
    }
}

/// A boxed future a [`PolicyDecider`] answers with.
pub type PolicyFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Whoever decides a session's tool calls, as the in-process guard ([`guard_service`]) and the
/// node's `keel hook` bridge need it: the [`PolicyHost`] where the store is, or a cluster worker's
/// remote policy that asks the coordinator node's [`PolicyHost`] (the one place decisions are
/// made) and denies when it does not answer.
pub trait PolicyDecider: Send + Sync {
    /// Whether `attempt`'s session is gated, and how long its gate waits; `None`: no gate (a
    /// worker whose coordinator has no policy).
    fn gate_times(&self, attempt: AttemptId) -> Option<GateTimes>;

    /// As [`PolicyHost::before_tool`].
    fn before_tool<'a>(
        &'a self,
        scope: &'a ToolScope,
        call: &'a ToolCall,
        payload: Value,
    ) -> PolicyFuture<'a, ToolAnswer>;

    /// As [`PolicyHost::after_tool`].
    fn after_tool<'a>(
        &'a self,
        scope: &'a ToolScope,
        call: &'a ToolCall,
        payload: Value,
        output: ToolOutput,
    ) -> PolicyFuture<'a, ToolOutput>;

    /// As [`PolicyHost::on_session_event`].
    fn on_session_event<'a>(
        &'a self,
        scope: &'a ToolScope,
        event: HookEvent,
        payload: Value,
    ) -> PolicyFuture<'a, EventAnswer>;
}

impl PolicyDecider for PolicyHost {
    fn gate_times(&self, _attempt: AttemptId) -> Option<GateTimes> {
        Some(GateTimes::of(&self.inner.policy))
    }

    fn before_tool<'a>(
        &'a self,
        scope: &'a ToolScope,
        call: &'a ToolCall,
        payload: Value,
    ) -> PolicyFuture<'a, ToolAnswer> {
        Box::pin(PolicyHost::before_tool(self, scope, call, payload))
    }

    fn after_tool<'a>(
        &'a self,
        scope: &'a ToolScope,
        call: &'a ToolCall,
        payload: Value,
        output: ToolOutput,
    ) -> PolicyFuture<'a, ToolOutput> {
        Box::pin(PolicyHost::after_tool(self, scope, call, payload, output))
    }

    fn on_session_event<'a>(
        &'a self,
        scope: &'a ToolScope,
        event: HookEvent,
        payload: Value,
    ) -> PolicyFuture<'a, EventAnswer> {
        Box::pin(PolicyHost::on_session_event(self, scope, event, payload))
    }
}

/// The service that hands every gated session's spec a guard asking `decider` in process (keel's
/// own loop uses it; a CLI ignores it and is given the bridge's gate instead). A session
/// `decider` does not gate ([`PolicyDecider::gate_times`] `None`) gets no guard.
pub fn guard_service(decider: Arc<dyn PolicyDecider>) -> Arc<dyn SessionService> {
    Arc::new(GuardService(decider))
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

/// Gives each gated session a guard that asks the decider in process.
struct GuardService(Arc<dyn PolicyDecider>);

impl SessionService for GuardService {
    fn session_starting(&self, attempt: AttemptId, spec: &mut SessionSpec) {
        if self.0.gate_times(attempt).is_none() {
            return;
        }
        spec.in_process.tool = Some(Arc::new(SessionGuard {
            host: Arc::clone(&self.0),
            scope: ToolScope::of(attempt, spec),
        }));
    }

    fn session_ended(&self, _attempt: AttemptId) {}

    fn subagent_event<'a>(
        &'a self,
        attempt: AttemptId,
        event: SubagentEvent<'a>,
    ) -> ServiceFuture<'a, SubagentAnswer> {
        Box::pin(async move {
            // A session the policy does not gate has no hooks to ask either.
            if self.0.gate_times(attempt).is_none() {
                return SubagentAnswer::default();
            }
            let (kind, agent, payload) = match event {
                SubagentEvent::Start { agent, brief } => {
                    (HookEvent::SubagentStart, agent, json!({ "brief": brief }))
                }
                SubagentEvent::Stop { agent, report } => {
                    (HookEvent::SubagentStop, agent, json!({ "report": report }))
                }
            };
            let scope = ToolScope {
                attempt,
                mode: PermissionMode::default(),
                tools: Vec::new(),
                agent: agent.to_owned(),
            };
            let answer = self.0.on_session_event(&scope, kind, payload).await;
            SubagentAnswer {
                veto: (answer.decision != Decision::Allow).then_some(answer.reason),
                note: answer.context,
            }
        })
    }
}

/// One session's guard: the decider and who the session is.
struct SessionGuard {
    host: Arc<dyn PolicyDecider>,
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

/// The allowed calls, even if a holder panicked (the set stays consistent: each change is one
/// push or remove).
fn lock_allowed(m: &std::sync::Mutex<AllowedCalls>) -> std::sync::MutexGuard<'_, AllowedCalls> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
