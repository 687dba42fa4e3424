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
//! A CLI's own session events come the same way (`keel hook --event-for HARNESS`; `PreCompact`, a
//! CLI about to compact its context): they go to [`PolicyHost::on_session_event`], whose hooks'
//! audit rows are durable before the answer (a veto, or the notes to carry). Sessions get that
//! hook only when the deciding policy has hooks for such an event (on a cluster worker, the
//! coordinator node's: the question crosses to it, and no answer vetoes).
//!
//! Tokens are minted when a session starts ([`SessionService::session_starting`]) and revoked when it
//! ends, so a token never reaches another session or outlives its own.
//!
//! On a cluster worker the bridge asks the worker's remote policy instead ([`PolicyBridge::start`]
//! with a [`PolicyDecider`] that forwards to the coordinator node's [`PolicyHost`]): a session is
//! gated when the coordinator's policy gates it, and its gate waits as long as that policy needs.

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
    ApprovalDesk, AuditWriter, PolicyDecider, PolicyHost, SessionService, ToolScope,
};
use keel_harness::cli::handed_back::SessionResults;
use keel_harness::cli::post_tool;
use keel_harness::{GateCommand, SessionSpec, ToolOutput};
use keel_policy::{Decision, HookEvent, ToolCall};
use serde_json::Value;
use tokio::sync::watch;

use super::{HOOK_PATH, HOOK_TOKEN_ENV, HookAnswer, PAYLOAD_BYTES_MAX, POST_PAYLOAD_BYTES_MAX};

/// Time the gate command gets beyond its hooks' own timeouts and the audit commit: process start
/// and the round trip.
const GATE_MARGIN_MS: u64 = 5_000;

struct Inner {
    /// Where every decision is made (shared with keel's own loop in process).
    host: Arc<dyn PolicyDecider>,
    /// The live sessions by their token.
    sessions: Mutex<BTreeMap<String, Session>>,
    /// The gate command, its timeout set per session from the decider's times.
    gate: GateCommand,
}

/// A live session: who it is, and what the policy handed back for the results its CLI handed it
/// (read by the CLI runner, which logs them in place of the CLI's own account).
#[derive(Clone)]
struct Session {
    scope: ToolScope,
    results: Arc<SessionResults>,
    /// Why the session must stop at its batch's end: a failed call whose result the policy changed
    /// (Claude Code cannot replace a failure's result; its `PostToolBatch` hook asks here). Kept
    /// here, not in the session's folder, where its own tools could delete it.
    stops: Arc<Mutex<Vec<String>>>,
}

/// Most stop reasons one session keeps until its batch ends (one is enough to stop it).
const STOPS_MAX: usize = 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running bridge: the endpoint's server task and the session registry. Dropping it stops the
/// server.
pub(crate) struct PolicyBridge {
    inner: Arc<Inner>,
    /// The policy this node decides with, when it decides here (not on a cluster worker).
    local: Option<PolicyHost>,
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
        let mut bridge = Self::start_with(Arc::new(host.clone()), keel_exe).await?;
        bridge.local = Some(host);
        Ok(bridge)
    }

    /// Starts the endpoint for `decider` (a cluster worker's remote policy): its sessions are gated
    /// as it says.
    ///
    /// # Errors
    /// The port cannot be bound.
    pub(crate) async fn start_for(
        decider: Arc<dyn PolicyDecider>,
        keel_exe: &Path,
    ) -> anyhow::Result<PolicyBridge> {
        Self::start_with(decider, keel_exe).await
    }

    async fn start_with(
        decider: Arc<dyn PolicyDecider>,
        keel_exe: &Path,
    ) -> anyhow::Result<PolicyBridge> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .context("binding the hook bridge's endpoint on 127.0.0.1")?;
        let addr = listener.local_addr()?;
        let gate = GateCommand {
            program: keel_exe.display().to_string(),
            args: vec![
                "hook".into(),
                "--url".into(),
                format!("http://{addr}{HOOK_PATH}"),
            ],
            timeout_ms: GATE_MARGIN_MS,
        };
        let inner = Arc::new(Inner {
            host: decider,
            sessions: Mutex::new(BTreeMap::new()),
            gate,
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
        Ok(PolicyBridge {
            inner,
            local: None,
            addr,
            stop,
        })
    }

    /// Where decisions are made durable and approvals wait; until it is set every call is denied.
    /// Nothing to attach on a cluster worker: the coordinator node decides.
    pub(crate) fn attach(&self, audit: AuditWriter, desk: ApprovalDesk) {
        if let Some(host) = &self.local {
            host.attach_parts(audit, desk);
        }
    }

    /// The policy this node decides with (`None` on a cluster worker).
    pub(crate) fn local_host(&self) -> Option<&PolicyHost> {
        self.local.as_ref()
    }

    /// The service that gives each session its gate and token.
    pub(crate) fn service(&self) -> Arc<dyn SessionService> {
        Arc::new(BridgeService(Arc::clone(&self.inner)))
    }
}

struct BridgeService(Arc<Inner>);

impl SessionService for BridgeService {
    fn session_starting(&self, attempt: AttemptId, spec: &mut SessionSpec) {
        // A session the policy does not gate (a worker whose coordinator has none) gets no gate.
        let Some(times) = self.0.host.gate_times(attempt) else {
            return;
        };
        let token = match mint_token() {
            Ok(t) => t,
            Err(e) => {
                // No token: the gate is still installed and every call is denied (fail closed).
                tracing::error!(error = %e, "no session token for the hook bridge");
                String::new()
            }
        };
        let results = Arc::new(SessionResults::new());
        if !token.is_empty() {
            let session = Session {
                scope: ToolScope::of(attempt, spec),
                results: Arc::clone(&results),
                stops: Arc::default(),
            };
            lock(&self.0.sessions).insert(token.clone(), session);
        }
        // The gate waits as long as the decision may take, then the process start and round trip.
        spec.pre_tool_gate = Some(GateCommand {
            timeout_ms: times.decide_ms + GATE_MARGIN_MS,
            ..self.0.gate.clone()
        });
        // A result matters to the policy only when it says so; otherwise no CLI pays for the hook.
        spec.post_tool_hook = times.post_ms.map(|ms| GateCommand {
            timeout_ms: ms + GATE_MARGIN_MS,
            ..self.0.gate.clone()
        });
        if spec.post_tool_hook.is_some() {
            // The session's log records what the policy hands back, not what the CLI prints.
            spec.in_process.results = Some(results);
        }
        // A CLI's compaction asks the policy only when it has hooks for it (on a cluster worker:
        // the coordinator's policy, which the question goes to).
        spec.session_event_hook = times.session_events.then(|| GateCommand {
            timeout_ms: times.decide_ms + GATE_MARGIN_MS,
            ..self.0.gate.clone()
        });
        spec.env.insert(HOOK_TOKEN_ENV.into(), token);
    }

    fn session_ended(&self, attempt: AttemptId) {
        lock(&self.0.sessions).retain(|_, s| s.scope.attempt != attempt);
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
            context: None,
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
    let session = lock(&inner.sessions).get(token).cloned();
    let Some(Session {
        scope,
        results,
        stops,
    }) = session
    else {
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
    if payload.get("hook_event_name").and_then(Value::as_str) == Some(post_tool::BATCH_EVENT) {
        // Claude Code's batch end: a failed call's changed result stops the session (taken).
        let reasons = std::mem::take(&mut *lock(&stops));
        return match reasons.into_iter().next() {
            Some(reason) => answer(StatusCode::OK, Decision::Deny, reason),
            None => answer(StatusCode::OK, Decision::Allow, String::new()),
        };
    }
    if payload.get("hook_event_name").and_then(Value::as_str)
        == Some(HookEvent::PreCompact.as_str())
    {
        return session_event(&inner, &scope, HookEvent::PreCompact, payload).await;
    }
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
        return after_tool(&inner, &scope, (&results, &stops), call, payload).await;
    }
    if body.len() > PAYLOAD_BYTES_MAX {
        return answer(
            StatusCode::PAYLOAD_TOO_LARGE,
            Decision::Deny,
            format!("keel: a hook payload is at most {PAYLOAD_BYTES_MAX} bytes (denied)"),
        );
    }
    let id = payload
        .get("tool_use_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let decided = inner.host.before_tool(&scope, &call, payload).await;
    if decided.decision == Decision::Allow
        && let Some(id) = id
    {
        // Only an allowed call's result is recorded for the log, once (as the policy's own
        // allowance: `PolicyHost::after_tool`).
        results.allow(&id);
    }
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
/// `PostToolUse` hooks, their audit rows durable) and comes back as the model is to see it, which
/// the session's record keeps for its log.
async fn after_tool(
    inner: &Inner,
    scope: &ToolScope,
    (results, stops): (&SessionResults, &Mutex<Vec<String>>),
    call: ToolCall,
    payload: Value,
) -> Response {
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
    let id = payload
        .get("tool_use_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let original = output.clone();
    let failure = payload.get(post_tool::FAILURE_KEY) == Some(&Value::Bool(true));
    let result = inner.host.after_tool(scope, &call, payload, output).await;
    if failure && let Some(reason) = post_tool::failure_stop_reason(&original, &result) {
        let mut stops = lock(stops);
        if stops.len() < STOPS_MAX {
            stops.push(reason);
        }
    }
    results.record(
        id.as_deref(),
        (call.tool.as_str(), &call.input),
        &original,
        &result,
    );
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
            context: None,
        },
    )
}

/// A CLI's own session event (`PreCompact`): the event's hooks run, their audit rows are made
/// durable, and the answer is the veto or the notes to carry (rows that could not be recorded
/// veto).
async fn session_event(
    inner: &Inner,
    scope: &ToolScope,
    event: HookEvent,
    payload: Value,
) -> Response {
    let started = std::time::Instant::now();
    let answer = inner.host.on_session_event(scope, event, payload).await;
    tracing::info!(
        event = event.as_str(),
        decision = ?answer.decision,
        by = %answer.decided_by,
        elapsed_us = started.elapsed().as_micros() as u64,
        "session event decided and audited"
    );
    respond(
        StatusCode::OK,
        &HookAnswer {
            decision: answer.decision,
            reason: answer.reason,
            output: None,
            context: answer.context,
        },
    )
}
