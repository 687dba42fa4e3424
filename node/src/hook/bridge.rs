//! The node's side of the hook bridge: an HTTP endpoint on 127.0.0.1 that every session's pre-tool
//! gate (`keel hook`, installed in each CLI's native hook mechanism and in keel's own loop) asks for
//! a decision, with a session-scoped bearer token. The decision is the runtime's
//! [`PolicyHost::before_tool`], the same keel's own loop calls in process: hooks, the permission
//! chain, the gates, the audit rows made durable, and only then the answer. A CLI never decides
//! policy on its own, and a call whose audit rows are not durable is denied.
//!
//! The same endpoint takes a CLI's `PostToolUse` calls (`keel hook --post-for HARNESS`): the result
//! goes to [`PolicyHost::after_tool`], the same keel's own loop calls, so a success meets a
//! prerequisite or issues a token and the `PostToolUse` hooks run, their rows durable before the
//! answer, which carries the result the model is to see. Sessions get that hook only when the policy
//! needs results (a `PostToolUse` hook, or a gate waiting for a success).
//!
//! Tokens are minted when a session starts ([`SessionService::session_starting`]) and revoked when it
//! ends, so a token never reaches another session or outlives its own.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use axum::routing::post;
use keel_actors::AttemptId;
use keel_actors::runtime::{
    AUDIT_WAIT_MS, ApprovalDesk, AuditWriter, ESCALATION_WRITE_WAIT_MS, PolicyHost, SessionService,
    ToolScope,
};
use keel_harness::cli::post_tool;
use keel_harness::{GateCommand, SessionSpec, ToolOutput};
use keel_policy::{Decision, GateCheck, HookEvent, ToolCall};
use serde_json::Value;
use tokio::sync::watch;

use super::{HOOK_PATH, HOOK_TOKEN_ENV, HookAnswer, PAYLOAD_BYTES_MAX, POST_PAYLOAD_BYTES_MAX};

/// Time the gate command gets beyond its hooks' own timeouts and the audit commit: process start
/// and the round trip.
const GATE_MARGIN_MS: u64 = 5_000;

struct Inner {
    /// Where every decision is made (shared with keel's own loop in process).
    host: PolicyHost,
    /// The live sessions by their token.
    sessions: Mutex<BTreeMap<String, ToolScope>>,
    gate: GateCommand,
    /// The `PostToolUse` hook's command, when the policy needs results.
    post: Option<GateCommand>,
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
    pub(crate) async fn start(host: PolicyHost, keel_exe: &Path) -> anyhow::Result<PolicyBridge> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the hook bridge's endpoint on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let policy = host.policy();
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
        // A result matters to the policy only when a PostToolUse hook may change it or a gate
        // waits for a success; otherwise no CLI pays for the hook.
        let needs_results = policy
            .hooks
            .iter()
            .any(|h| h.event == HookEvent::PostToolUse)
            || policy.gates.iter().any(|g| {
                matches!(
                    g.check,
                    GateCheck::Prerequisite { .. } | GateCheck::Token { .. }
                )
            });
        let post_hook = needs_results.then(|| {
            let post_hooks_ms: u64 = policy
                .hooks
                .iter()
                .filter(|h| h.event == HookEvent::PostToolUse)
                .map(|h| h.timeout_ms)
                .sum();
            GateCommand {
                timeout_ms: post_hooks_ms + AUDIT_WAIT_MS + GATE_MARGIN_MS,
                ..gate.clone()
            }
        });
        let inner = Arc::new(Inner {
            host,
            sessions: Mutex::new(BTreeMap::new()),
            gate,
            post: post_hook,
        });
        let app = Router::new()
            .route(HOOK_PATH, post(decide))
            .layer(axum::extract::DefaultBodyLimit::max(POST_PAYLOAD_BYTES_MAX))
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
        self.inner.host.attach_parts(audit, desk);
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
            lock(&self.0.sessions).insert(token.clone(), ToolScope::of(attempt, spec));
        }
        spec.pre_tool_gate = Some(self.0.gate.clone());
        spec.post_tool_hook = self.0.post.clone();
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
    respond(
        status,
        &HookAnswer {
            decision,
            reason,
            output: None,
        },
    )
}

fn respond(status: StatusCode, answer: &HookAnswer) -> Response {
    let body = serde_json::to_vec(answer).unwrap_or_else(|_| {
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

/// `POST /v1/hook`: one pre-tool decision, or one `PostToolUse` result, for the session the bearer
/// token names.
async fn decide(State(inner): State<Arc<Inner>>, headers: HeaderMap, body: Bytes) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    let scope = lock(&inner.sessions).get(token).cloned();
    let Some(scope) = scope else {
        return answer(
            StatusCode::UNAUTHORIZED,
            Decision::Deny,
            "keel: no live session has this hook token (denied)".into(),
        );
    };
    if body.len() > POST_PAYLOAD_BYTES_MAX {
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            Decision::Deny,
            format!("keel: a hook payload is at most {PAYLOAD_BYTES_MAX} bytes (denied)"),
        );
    }
    let Ok(payload) = serde_json::from_slice::<Value>(&body) else {
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
    if payload.get("hook_event_name").and_then(Value::as_str)
        == Some(HookEvent::PostToolUse.as_str())
    {
        return after_tool(&inner, &scope, call, payload).await;
    }
    if body.len() > PAYLOAD_BYTES_MAX {
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            Decision::Deny,
            format!("keel: a hook payload is at most {PAYLOAD_BYTES_MAX} bytes (denied)"),
        );
    }
    let decided = inner.host.before_tool(&scope, &call, payload).await;
    tracing::info!(
        tool = %tool,
        decision = ?decided.decision,
        by = %decided.decided_by,
        elapsed_us = started.elapsed().as_micros() as u64,
        "tool call decided and audited"
    );
    let status = if decided.decided_by == "keel" && decided.decision == Decision::Deny {
        // The node could not decide (not ready, the store failed): the gate denies either way.
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    answer(status, decided.decision, decided.reason)
}

/// A CLI's `PostToolUse`: the result goes through the policy (a success's gate marks, the
/// `PostToolUse` hooks, their audit rows durable) and comes back as the model is to see it.
async fn after_tool(inner: &Inner, scope: &ToolScope, call: ToolCall, payload: Value) -> Response {
    let Some(output) = payload
        .get(post_tool::TOOL_OUTPUT_KEY)
        .cloned()
        .and_then(|v| serde_json::from_value::<ToolOutput>(v).ok())
    else {
        return answer(
            StatusCode::BAD_REQUEST,
            Decision::Deny,
            format!(
                "keel: the PostToolUse payload has no {} (withheld)",
                post_tool::TOOL_OUTPUT_KEY
            ),
        );
    };
    let started = std::time::Instant::now();
    let tool = call.tool.clone();
    let result = inner.host.after_tool(scope, &call, payload, output).await;
    tracing::info!(
        tool = %tool,
        is_error = result.is_error,
        elapsed_us = started.elapsed().as_micros() as u64,
        "tool result handed to the policy"
    );
    respond(
        StatusCode::OK,
        &HookAnswer {
            decision: Decision::Allow,
            reason: String::new(),
            output: Some(result),
        },
    )
}
