//! The node's side of the hook bridge: an HTTP endpoint on 127.0.0.1 that every session's pre-tool
//! gate (`keel hook`, installed in each CLI's native hook mechanism and in keel's own loop) asks for
//! a decision, with a session-scoped bearer token. The node runs the policy's hooks, evaluates the
//! permission chain (keel-policy), makes the decision's audit rows durable, and only then answers:
//! a CLI never decides policy on its own, and a call whose audit rows are not durable is denied.
//!
//! Tokens are minted when a session starts ([`SessionService::session_starting`]) and revoked when it
//! ends, so a token never reaches another session or outlives its own.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use anyhow::Context;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use keel_actors::AttemptId;
use keel_actors::escalation::{
    ApprovalCase, approval as approval_escalation, approves, mint_escalation_id,
};
use keel_actors::runtime::{
    AUDIT_WAIT_MS, ApprovalDesk, ApprovalEnd, AuditWriter, ESCALATION_WRITE_WAIT_MS, OsEntropy,
    SessionService, wall_clock_ms,
};
use keel_harness::{GateCommand, PermissionMode, SessionSpec};
use keel_policy::{Decision, HookEvent, Policy, ToolCall};
use keel_store::AuditEntry;
use serde_json::Value;
use tokio::sync::watch;

use super::{HOOK_PATH, HOOK_TOKEN_ENV, HookAnswer, PAYLOAD_BYTES_MAX};

/// Time the gate command gets beyond its hooks' own timeouts and the audit commit: process start
/// and the round trip.
const GATE_MARGIN_MS: u64 = 5_000;

/// A session the endpoint answers for.
#[derive(Clone, Copy, Debug)]
struct SessionScope {
    attempt: AttemptId,
    mode: PermissionMode,
}

struct Inner {
    policy: Policy,
    sessions: Mutex<BTreeMap<String, SessionScope>>,
    audit: OnceLock<AuditWriter>,
    /// Where an `ask` raises its approval and waits for the answer.
    desk: OnceLock<ApprovalDesk>,
    gate: GateCommand,
    /// Held from reading a gate's count to writing the row that counts the call.
    gates_serial: tokio::sync::Mutex<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running bridge: the endpoint's server task and the session registry. Dropping it stops the
/// server.
pub(crate) struct PolicyBridge {
    inner: Arc<Inner>,
    addr: SocketAddr,
    stop: watch::Sender<bool>,
}

impl std::fmt::Debug for PolicyBridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyBridge")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Drop for PolicyBridge {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl PolicyBridge {
    /// Starts the endpoint on a free port of 127.0.0.1 for `policy`; sessions will call it through
    /// `keel_exe hook`.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub(crate) async fn start(policy: Policy, keel_exe: &Path) -> anyhow::Result<PolicyBridge> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the hook bridge's endpoint on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let hooks_ms: u64 = policy.hooks.iter().map(|h| h.timeout_ms).sum();
        // An `ask` (from a rule or a hook) waits for a human up to its timeout, then records its
        // end: the gate waits that long too, so the node's decision is never cut off.
        let ask_ms = policy.ask_timeout_ms + 2 * ESCALATION_WRITE_WAIT_MS + AUDIT_WAIT_MS;
        let gate = GateCommand {
            program: keel_exe.display().to_string(),
            args: vec![
                "hook".into(),
                "--url".into(),
                format!("http://{addr}{HOOK_PATH}"),
            ],
            timeout_ms: hooks_ms + ask_ms + AUDIT_WAIT_MS + GATE_MARGIN_MS,
        };
        let inner = Arc::new(Inner {
            policy,
            sessions: Mutex::new(BTreeMap::new()),
            audit: OnceLock::new(),
            desk: OnceLock::new(),
            gate,
            gates_serial: tokio::sync::Mutex::new(()),
        });
        let app = Router::new()
            .route(HOOK_PATH, post(decide))
            .with_state(Arc::clone(&inner));
        let (stop, mut stopped) = watch::channel(false);
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "the hook bridge's endpoint stopped");
            }
        });
        Ok(PolicyBridge { inner, addr, stop })
    }

    /// Where decisions are made durable and approvals wait; until it is set every call is denied.
    pub(crate) fn attach(&self, audit: AuditWriter, desk: ApprovalDesk) {
        let _ = self.inner.audit.set(audit);
        let _ = self.inner.desk.set(desk);
    }

    /// The service that gives each session its gate and token.
    pub(crate) fn service(&self) -> Arc<dyn SessionService> {
        Arc::new(BridgeService(Arc::clone(&self.inner)))
    }
}

struct BridgeService(Arc<Inner>);

impl SessionService for BridgeService {
    fn session_starting(&self, attempt: AttemptId, spec: &mut SessionSpec) {
        let token = match mint_token() {
            Ok(t) => t,
            Err(e) => {
                // No token: the gate is still installed and every call is denied (fail closed).
                tracing::error!(error = %e, "no session token for the hook bridge");
                String::new()
            }
        };
        if !token.is_empty() {
            lock(&self.0.sessions).insert(
                token.clone(),
                SessionScope {
                    attempt,
                    mode: spec.permission_mode,
                },
            );
        }
        spec.pre_tool_gate = Some(self.0.gate.clone());
        spec.env.insert(HOOK_TOKEN_ENV.into(), token);
    }

    fn session_ended(&self, attempt: AttemptId) {
        lock(&self.0.sessions).retain(|_, s| s.attempt != attempt);
    }
}

/// 32 random bytes from the OS, as hex.
fn mint_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The answer as JSON (axum's `json` feature is not built: one small body needs no extractor).
fn answer(status: StatusCode, decision: Decision, reason: String) -> Response {
    let body = serde_json::to_vec(&HookAnswer { decision, reason }).unwrap_or_else(|_| {
        br#"{"decision":"deny","reason":"keel: the answer could not be encoded (denied)"}"#.to_vec()
    });
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// `POST /v1/hook`: one pre-tool decision for the session the bearer token names.
async fn decide(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let scope = lock(&inner.sessions).get(token).copied();
    let Some(scope) = scope else {
        return answer(
            StatusCode::UNAUTHORIZED,
            Decision::Deny,
            "keel: no live session has this hook token (denied)".into(),
        );
    };
    if body.len() > PAYLOAD_BYTES_MAX {
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            Decision::Deny,
            format!("keel: a hook payload is at most {PAYLOAD_BYTES_MAX} bytes (denied)"),
        );
    }
    let Ok(mut payload) = serde_json::from_slice::<Value>(&body) else {
        return answer(
            StatusCode::BAD_REQUEST,
            Decision::Deny,
            "keel: the hook payload is not JSON (denied)".into(),
        );
    };
    let Some(tool) = payload
        .get("tool_name")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return answer(
            StatusCode::BAD_REQUEST,
            Decision::Deny,
            "keel: the hook payload names no tool_name (denied)".into(),
        );
    };
    let started = std::time::Instant::now();
    let call = ToolCall::new(
        tool.clone(),
        payload.get("tool_input").cloned().unwrap_or(Value::Null),
    );
    if let Some(obj) = payload.as_object_mut() {
        obj.insert("run_id".into(), scope.attempt.run.to_string().into());
        obj.insert("task_id".into(), scope.attempt.task.to_string().into());
        obj.insert("attempt".into(), scope.attempt.attempt.into());
    }
    let outcomes =
        keel_policy::run::run_hooks(&inner.policy, HookEvent::PreToolUse, Some(&tool), &payload)
            .await;
    let Some(audit) = inner.audit.get() else {
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            Decision::Deny,
            "keel: the node is not ready to record decisions (denied)".into(),
        );
    };
    let verdict = inner.policy.decide(&call, scope.mode, &outcomes);
    // A gated call is decided one at a time, from the count in the store to the durable row that
    // counts it, so two concurrent calls cannot both take the last place.
    let gated = inner.policy.gates.iter().any(|g| g.rule.matches(&call));
    let serial = if gated {
        Some(inner.gates_serial.lock().await)
    } else {
        None
    };
    let verdict = if gated && verdict.decision == Decision::Allow {
        match audit.read_all(scope.attempt.run).await {
            Ok(rows) => keel_policy::apply_gates(&inner.policy.gates, &call, verdict, |g| {
                g.count(&rows, Some(scope.attempt.task))
            }),
            Err(e) => {
                return answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Decision::Deny,
                    format!("keel: a gate's count could not be read, so the call is denied: {e}"),
                );
            }
        }
    } else {
        verdict
    };
    let mut entries = verdict.audit_entries(wall_clock_ms(), Some(scope.attempt.task), &call);
    let (decision, reason) = match verdict.decision {
        Decision::Ask => {
            // The ask itself is durable before anyone is asked; the gate's lock (if any) is not
            // held while a human thinks.
            drop(serial);
            if let Err(e) = audit.append(scope.attempt.run, entries).await {
                return answer(
                    StatusCode::SERVICE_UNAVAILABLE,
                    Decision::Deny,
                    format!("keel: the decision could not be recorded, so the call is denied: {e}"),
                );
            }
            let (decision, reason, row) =
                approval(&inner, scope, &tool, &call, &verdict, &payload, audit).await;
            entries = vec![row];
            (decision, reason)
        }
        d => (d, verdict.reason.clone()),
    };
    if let Err(e) = audit.append(scope.attempt.run, entries).await {
        return answer(
            StatusCode::SERVICE_UNAVAILABLE,
            Decision::Deny,
            format!("keel: the decision could not be recorded, so the call is denied: {e}"),
        );
    }
    tracing::info!(
        tool = %tool,
        decision = ?decision,
        by = %verdict.decided_by,
        elapsed_us = started.elapsed().as_micros() as u64,
        "tool call decided and audited"
    );
    answer(StatusCode::OK, decision, reason)
}

/// An `ask`: raises an approval escalation (the policy-gap trigger) with the call's case, waits for
/// `keel answer` up to the policy's timeout, and answers the decision with its audit row: allowed
/// when a human approved, denied when a human refused, when the timeout passed first, or when the
/// escalation could not be raised.
async fn approval(
    inner: &Inner,
    scope: SessionScope,
    tool: &str,
    call: &ToolCall,
    verdict: &keel_policy::Verdict,
    payload: &Value,
    audit: &AuditWriter,
) -> (Decision, String, AuditEntry) {
    let row = |decision: keel_store::HookDecision, reason: String| AuditEntry {
        ts_ms: wall_clock_ms(),
        task_id: Some(scope.attempt.task),
        hook: "approval".into(),
        tool: tool.to_owned(),
        decision,
        reason,
        input_digest: call.input_digest(),
        rewritten: false,
    };
    let deny = |reason: String| {
        let entry = row(keel_store::HookDecision::Deny, reason.clone());
        (Decision::Deny, reason, entry)
    };
    let Some(desk) = inner.desk.get() else {
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
                        && r.tool == tool
                        && r.decision == keel_store::HookDecision::Allow
                })
                .count()
        })
        .unwrap_or(0);
    let input = payload.get("tool_input").unwrap_or(&Value::Null);
    let case = ApprovalCase {
        tool: tool.to_owned(),
        subject: call.subject().unwrap_or_else(|| tool.to_owned()),
        asked_by: format!("{} ({})", verdict.reason, verdict.decided_by),
        amount_micros: amount_micros(input),
        deadline_ms: now.saturating_add(inner.policy.ask_timeout_ms),
        approved_before: u32::try_from(approved_before).unwrap_or(u32::MAX),
    };
    let escalation = approval_escalation(id, now, scope.attempt.task, String::new(), case);
    let wait = std::time::Duration::from_millis(inner.policy.ask_timeout_ms);
    tracing::info!(escalation = %id, tool = %tool, "a tool call waits for a human's approval");
    match desk
        .raise_and_wait(scope.attempt.run, escalation, wait)
        .await
    {
        Ok(ApprovalEnd::Answered(text)) if approves(&text) => {
            let reason = format!("approved by a human (escalation {id})");
            let entry = row(keel_store::HookDecision::Allow, reason.clone());
            (Decision::Allow, reason, entry)
        }
        Ok(ApprovalEnd::Answered(text)) => deny(format!(
            "refused by a human (escalation {id}: {text}); do not retry this call"
        )),
        Ok(ApprovalEnd::Expired) => deny(format!(
            "timed out: nobody answered escalation {id} within {} s, so the call is denied",
            inner.policy.ask_timeout_ms / 1000
        )),
        Err(e) => deny(format!(
            "keel could not ask a human ({e}), so the call is denied"
        )),
    }
}

/// The amount a tool call moves, when its input names one: `amount_micros` (an integer) or `amount`
/// (a number of dollars).
fn amount_micros(input: &Value) -> Option<u64> {
    if let Some(m) = input.get("amount_micros").and_then(Value::as_u64) {
        return Some(m);
    }
    let dollars = input.get("amount").and_then(Value::as_f64)?;
    (dollars.is_finite() && dollars >= 0.0).then(|| (dollars * 1_000_000.0).round() as u64)
}
