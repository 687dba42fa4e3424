//! The scripted model served over HTTP on 127.0.0.1, for the real CLIs (and keel's own loop) to
//! talk to on a machine with no model access.
//!
//! One axum server speaks Anthropic Messages (`POST /v1/messages`, with or without `?beta=true`),
//! OpenAI Responses (`POST /v1/responses`) and OpenAI Chat Completions (`POST /v1/chat/completions`),
//! streaming (SSE) or plain JSON, as the request asks. Each request is answered by one shared
//! [`ScriptedModel`], recorded (method, path, headers with secrets redacted, body) for assertions,
//! and optionally written to a directory. Failures come from the script or are injected per request
//! with [`ModelServer::inject_failure`]. Every wait is bounded and ends at shutdown, so
//! [`ModelServer::shutdown`] returns promptly even with hung requests open.

pub mod encode;

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::rfc3339;
use crate::scripted::{
    KeyFailure, ModelReply, ModelRequest, Script, ScriptFailure, ScriptedModel, WireApi,
};
use encode::SseEvent;

/// Largest request body accepted; Claude Code's first request is about 76 KB, long conversations
/// grow, 32 MiB leaves room without letting one request exhaust memory.
pub const REQUEST_BODY_BYTES_MAX: usize = 32 << 20;
/// Requests kept in memory for [`ModelServer::requests`]; older ones are dropped (and counted).
pub const REQUESTS_RECORDED_MAX: usize = 10_000;
/// How long [`ModelServer::shutdown`] waits for the server task before aborting it.
pub const SHUTDOWN_WAIT_MS: u64 = 5_000;
/// Prefix of a secret header kept in recordings; the rest is redacted.
const SECRET_PREFIX_CHARS: usize = 12;

/// How to run a model server.
#[derive(Debug, Clone)]
pub struct ModelServerConfig {
    /// The script the model follows.
    pub script: Script,
    /// Where to listen; `127.0.0.1:0` (a free port) unless a standalone server wants a fixed port.
    pub bind: SocketAddr,
    /// A directory to write each request to as `NNN-METHOD-path.json`, if set.
    pub record_dir: Option<PathBuf>,
    /// Scripts for requests naming these models; other models follow `script`. One server can so
    /// drive several clients at once, each on its own script (give each its own model name), and a
    /// side request on another model (opencode's title request on its `small_model`) does not use
    /// up the main script's turns.
    pub scripts_by_model: BTreeMap<String, Script>,
}

impl ModelServerConfig {
    /// A config for `script` on a random free port of 127.0.0.1, recording in memory only.
    pub fn new(script: Script) -> Self {
        ModelServerConfig {
            script,
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            record_dir: None,
            scripts_by_model: BTreeMap::new(),
        }
    }

    /// Adds a script for requests naming `model`.
    pub fn with_model_script(mut self, model: impl Into<String>, script: Script) -> Self {
        self.scripts_by_model.insert(model.into(), script);
        self
    }
}

/// One request as the server received it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedRequest {
    /// 1-based arrival order.
    pub seq: u64,
    /// HTTP method.
    pub method: String,
    /// Path with query (e.g. `/v1/messages?beta=true`).
    pub path: String,
    /// Headers with lower-case names, in arrival order; secret values are cut to a short prefix.
    pub headers: Vec<(String, String)>,
    /// The body as JSON, or as a JSON string when it was not JSON.
    pub body: Value,
}

impl RecordedRequest {
    /// The first value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without its query string.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap_or("")
    }
}

/// Why the server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Binding the address failed.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The record directory could not be created.
    #[error("cannot create the record directory: {0}")]
    RecordDir(std::io::Error),
    /// The server task failed.
    #[error("server failed: {0}")]
    Serve(String),
    /// The script file could not be loaded.
    #[error(transparent)]
    Script(#[from] crate::scripted::ScriptError),
}

struct Shared {
    model: Mutex<ScriptedModel>,
    models_by_name: Mutex<BTreeMap<String, ScriptedModel>>,
    injected: Mutex<VecDeque<ScriptFailure>>,
    persistent: Mutex<Option<ScriptFailure>>,
    /// The script's failures by API key (read-only after start).
    key_failures: Vec<KeyFailure>,
    recorded: Mutex<VecDeque<RecordedRequest>>,
    seq: Mutex<u64>,
    record_dir: Option<PathBuf>,
    shutdown: watch::Receiver<bool>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data in a usable state.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A running scripted model server.
#[derive(Debug)]
pub struct ModelServer {
    addr: SocketAddr,
    shared: Arc<SharedHandle>,
    shutdown_tx: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Opaque wrapper so `ModelServer` can derive `Debug` without exposing the state.
struct SharedHandle(Arc<Shared>);

impl std::fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ModelServerState")
    }
}

impl ModelServer {
    /// Binds and starts serving in a background task.
    ///
    /// # Errors
    /// [`ServerError::Bind`] or [`ServerError::RecordDir`].
    pub async fn start(config: ModelServerConfig) -> Result<ModelServer, ServerError> {
        if let Some(dir) = &config.record_dir {
            std::fs::create_dir_all(dir).map_err(ServerError::RecordDir)?;
        }
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|source| ServerError::Bind {
                addr: config.bind,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: config.bind,
            source,
        })?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let key_failures = config.script.key_failures.clone();
        let shared = Arc::new(Shared {
            model: Mutex::new(ScriptedModel::new(config.script)),
            models_by_name: Mutex::new(
                config
                    .scripts_by_model
                    .into_iter()
                    .map(|(name, script)| (name, ScriptedModel::new(script)))
                    .collect(),
            ),
            injected: Mutex::new(VecDeque::new()),
            persistent: Mutex::new(None),
            key_failures,
            recorded: Mutex::new(VecDeque::new()),
            seq: Mutex::new(0),
            record_dir: config.record_dir,
            shutdown: shutdown_rx.clone(),
        });
        let app = Router::new().fallback(handle).with_state(shared.clone());
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await
        });
        Ok(ModelServer {
            addr,
            shared: Arc::new(SharedHandle(shared)),
            shutdown_tx,
            task,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: the base URL for Anthropic clients (`ANTHROPIC_BASE_URL`, no `/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the base URL for OpenAI-style clients (Codex, opencode, pi).
    pub fn openai_base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request received so far (the latest [`REQUESTS_RECORDED_MAX`]), in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.0.recorded).iter().cloned().collect()
    }

    /// How many requests arrived in total.
    pub fn requests_count(&self) -> u64 {
        *lock(&self.shared.0.seq)
    }

    /// Makes the next model request (of any wire API) fail this way, before the script is
    /// consulted; several injections apply to successive requests. The script does not advance.
    pub fn inject_failure(&self, failure: ScriptFailure) {
        lock(&self.shared.0.injected).push_back(failure);
    }

    /// Makes every model request fail this way until cleared with `None` (after any one-shot
    /// injections). For CLIs that retry on their own: each retry meets the same failure, like a
    /// real outage, so a test can count the attempts a CLI makes.
    pub fn set_failure_mode(&self, failure: Option<ScriptFailure>) {
        *lock(&self.shared.0.persistent) = failure;
    }

    /// Waits until at least `count` requests arrived, up to `wait_max`; returns whether they did.
    pub async fn wait_for_requests(&self, count: u64, wait_max: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait_max;
        loop {
            if self.requests_count() >= count {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops accepting, ends hung and streaming responses, and waits (bounded) for the task.
    ///
    /// # Errors
    /// [`ServerError::Serve`] if the server task had failed.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        self.shutdown_tx.send_replace(true);
        let mut task = self.task;
        match tokio::time::timeout(Duration::from_millis(SHUTDOWN_WAIT_MS), &mut task).await {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(ServerError::Serve(e.to_string())),
            Ok(Err(join)) => Err(ServerError::Serve(join.to_string())),
            Err(_elapsed) => {
                task.abort();
                Ok(())
            }
        }
    }
}

/// Runs a server until `shutdown` completes, calling `on_ready` with the bound address first. This
/// is what `keel model-server --script FILE` runs.
///
/// # Errors
/// Any [`ServerError`].
pub async fn serve(
    config: ModelServerConfig,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let server = ModelServer::start(config).await?;
    on_ready(server.addr());
    shutdown.await;
    server.shutdown().await
}

/// What `keel model-server --script FILE [--port N] [--record-dir DIR]` runs: loads the script
/// (JSON or TOML by extension), binds 127.0.0.1 on `port` (0 for a free one), calls `on_ready` with
/// the bound address, serves until `shutdown` completes, then stops within [`SHUTDOWN_WAIT_MS`].
///
/// # Errors
/// [`ServerError::Script`] for a bad script file, else as [`serve`].
pub async fn serve_script_file(
    script_path: &std::path::Path,
    port: u16,
    record_dir: Option<PathBuf>,
    on_ready: impl FnOnce(SocketAddr),
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServerError> {
    let script = Script::from_path(script_path)?;
    let mut config = ModelServerConfig::new(script);
    config.bind = SocketAddr::from(([127, 0, 0, 1], port));
    config.record_dir = record_dir;
    serve(config, on_ready, shutdown).await
}

fn redact(name: &str, value: &str) -> String {
    if matches!(
        name,
        "authorization" | "x-api-key" | "api-key" | "cookie" | "proxy-authorization"
    ) {
        let prefix: String = value.chars().take(SECRET_PREFIX_CHARS).collect();
        format!("{prefix}...<redacted>")
    } else {
        value.to_owned()
    }
}

fn record(shared: &Shared, method: &Method, path: &str, headers: &HeaderMap, body: &Bytes) -> u64 {
    let seq = {
        let mut s = lock(&shared.seq);
        *s += 1;
        *s
    };
    let body = match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(_) if body.is_empty() => Value::Null,
        Err(_) => Value::String(String::from_utf8_lossy(body).into_owned()),
    };
    let rec = RecordedRequest {
        seq,
        method: method.to_string(),
        path: path.to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    redact(n.as_str(), &String::from_utf8_lossy(v.as_bytes())),
                )
            })
            .collect(),
        body,
    };
    if let Some(dir) = &shared.record_dir {
        let slug: String = path
            .split('?')
            .next()
            .unwrap_or("")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect::<String>()
            .trim_matches('_')
            .chars()
            .take(40)
            .collect();
        let file = dir.join(format!("{seq:03}-{}-{slug}.json", rec.method));
        // Recording to disk is best effort: a full disk must not fail the model's answer.
        if let Ok(text) = serde_json::to_string_pretty(&rec) {
            let _ = std::fs::write(file, text);
        }
    }
    let mut recorded = lock(&shared.recorded);
    recorded.push_back(rec);
    while recorded.len() > REQUESTS_RECORDED_MAX {
        recorded.pop_front();
    }
    seq
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut r = Response::new(Body::from(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |pq| pq.as_str().to_owned());
    let body = match axum::body::to_bytes(body, REQUEST_BODY_BYTES_MAX).await {
        Ok(b) => b,
        Err(_) => {
            return json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &encode::error_body(None, 413, "request body too large"),
            );
        }
    };
    record(&shared, &parts.method, &path, &parts.headers, &body);
    let route = parts.uri.path();
    if parts.method == Method::HEAD {
        return Response::new(Body::empty());
    }
    if parts.method == Method::GET && route.ends_with("/models") {
        return json_response(
            StatusCode::OK,
            &json!({"object": "list", "data": [
            {"id": "scripted-model", "object": "model", "created": 0, "owned_by": "keel"}]}),
        );
    }
    if parts.method != Method::POST {
        return json_response(
            StatusCode::NOT_FOUND,
            &encode::error_body(None, 404, "not found"),
        );
    }
    if route.ends_with("/count_tokens") {
        return json_response(StatusCode::OK, &json!({"input_tokens": 10}));
    }
    let wire = if route.ends_with("/messages") {
        WireApi::AnthropicMessages
    } else if route.ends_with("/responses") {
        WireApi::OpenAiResponses
    } else if route.ends_with("/chat/completions") {
        WireApi::OpenAiChat
    } else {
        return json_response(
            StatusCode::NOT_FOUND,
            &encode::error_body(None, 404, &format!("unknown path {route}")),
        );
    };
    let parsed: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return json_response(
                StatusCode::BAD_REQUEST,
                &encode::error_body(Some(wire), 400, "request body is not a JSON object"),
            );
        }
    };
    let model_request = ModelRequest::from_body(wire, &parsed);
    let injected = key_failure(&shared.key_failures, &parts.headers)
        .or_else(|| lock(&shared.injected).pop_front())
        .or_else(|| lock(&shared.persistent).clone());
    let reply = match injected {
        Some(failure) => failure_reply(failure, &model_request),
        None => match lock(&shared.models_by_name).get_mut(&model_request.model) {
            Some(model) => model.respond(&model_request),
            None => lock(&shared.model).respond(&model_request),
        },
    };
    reply_response(&shared, wire, &model_request, reply).await
}

/// The failure the script names for the request's key (`x-api-key`, else `Authorization: Bearer`).
fn key_failure(failures: &[KeyFailure], headers: &HeaderMap) -> Option<ScriptFailure> {
    if failures.is_empty() {
        return None;
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = header("x-api-key")
        .or_else(|| header("authorization").and_then(|v| v.strip_prefix("Bearer ")))?;
    failures
        .iter()
        .find(|f| f.key == key)
        .map(|f| f.failure.clone())
}

/// Injected failures reuse the model's own failure encoding through a one-turn script, so an
/// injected 429 looks exactly like a scripted one; the shared model's script does not advance.
fn failure_reply(failure: ScriptFailure, request: &ModelRequest) -> ModelReply {
    let mut once = ScriptedModel::new(Script::from_turns(vec![crate::scripted::ScriptTurn {
        failure: Some(failure),
        ..Default::default()
    }]));
    once.respond(request)
}

fn unix_now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Steps of a streamed body: bytes to send, a bounded pause, or a broken connection.
enum Step {
    Send(String),
    Pause(u64),
    Break,
}

fn stream_body(steps: Vec<Step>, shutdown: watch::Receiver<bool>) -> Body {
    let state = (steps.into_iter(), shutdown);
    let stream = futures_util::stream::unfold(state, |(mut steps, mut shutdown)| async move {
        loop {
            match steps.next()? {
                Step::Send(text) => {
                    return Some((
                        Ok::<Bytes, std::io::Error>(Bytes::from(text)),
                        (steps, shutdown),
                    ));
                }
                Step::Pause(ms) => {
                    let stopped = tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(ms)) => false,
                        _ = shutdown.wait_for(|s| *s) => true,
                    };
                    if stopped {
                        return Some((
                            Err(std::io::Error::other("server shutting down")),
                            (steps, shutdown),
                        ));
                    }
                }
                Step::Break => {
                    return Some((
                        Err(std::io::Error::other("scripted disconnect")),
                        (Vec::new().into_iter(), shutdown),
                    ));
                }
            }
        }
    });
    Body::from_stream(stream)
}

fn sse_response(body: Body) -> Response {
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

fn sse_for(wire: WireApi, answer: &crate::scripted::Answer, model: &str) -> Vec<SseEvent> {
    match wire {
        WireApi::AnthropicMessages => encode::anthropic_sse(answer, model),
        WireApi::OpenAiResponses => encode::responses_sse(answer, model),
        WireApi::OpenAiChat => encode::chat_sse(answer, model),
    }
}

async fn reply_response(
    shared: &Shared,
    wire: WireApi,
    request: &ModelRequest,
    reply: ModelReply,
) -> Response {
    let model = if request.model.is_empty() {
        "scripted-model"
    } else {
        request.model.as_str()
    };
    match reply {
        ModelReply::Answer(answer) => {
            if request.stream {
                let steps = sse_for(wire, &answer, model)
                    .into_iter()
                    .map(|e| Step::Send(e.to_wire()))
                    .collect();
                sse_response(stream_body(steps, shared.shutdown.clone()))
            } else {
                let body = match wire {
                    WireApi::AnthropicMessages => encode::anthropic_json(&answer, model),
                    WireApi::OpenAiResponses => encode::responses_json(&answer, model),
                    WireApi::OpenAiChat => encode::chat_json(&answer, model),
                };
                json_response(StatusCode::OK, &body)
            }
        }
        ModelReply::StallMidStream { answer, ms } => {
            let events = sse_for(wire, &answer, model);
            let mut steps: Vec<Step> = events
                .iter()
                .take(1)
                .map(|e| Step::Send(e.to_wire()))
                .collect();
            steps.push(Step::Pause(ms));
            steps.push(Step::Break);
            sse_response(stream_body(steps, shared.shutdown.clone()))
        }
        ModelReply::Disconnect => {
            let answer = crate::scripted::Answer {
                message_seq: 0,
                text: "this answer is cut".into(),
                tool_calls: Vec::new(),
                stop_reason: Some("end_turn".into()),
                usage: crate::scripted::ScriptUsage::default(),
            };
            let mut steps: Vec<Step> = sse_for(wire, &answer, model)
                .iter()
                .take(2)
                .map(|e| Step::Send(e.to_wire()))
                .collect();
            steps.push(Step::Break);
            sse_response(stream_body(steps, shared.shutdown.clone()))
        }
        ModelReply::Malformed => {
            let steps = vec![Step::Send("event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\n\ndata: <<not json>>\n\n".to_owned())];
            sse_response(stream_body(steps, shared.shutdown.clone()))
        }
        ModelReply::Hang { ms } => {
            let mut shutdown = shared.shutdown.clone();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
            sse_response(stream_body(vec![Step::Break], shared.shutdown.clone()))
        }
        ModelReply::HttpError {
            status,
            message,
            retry_after_secs,
            reset_after_secs,
        } => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut r = json_response(code, &encode::error_body(Some(wire), status, &message));
            let h = r.headers_mut();
            if let Some(secs) = retry_after_secs
                && let Ok(v) = HeaderValue::from_str(&secs.to_string())
            {
                h.insert(header::RETRY_AFTER, v);
            }
            if let Some(secs) = reset_after_secs {
                let at = rfc3339::format_unix_secs(unix_now_secs() + secs);
                for name in [
                    "anthropic-ratelimit-requests-reset",
                    "anthropic-ratelimit-tokens-reset",
                ] {
                    if let Ok(v) = HeaderValue::from_str(&at) {
                        h.insert(name, v);
                    }
                }
                if let Ok(v) = HeaderValue::from_str(&format!("{secs}s")) {
                    h.insert("x-ratelimit-reset-requests", v.clone());
                    h.insert("x-ratelimit-reset-tokens", v);
                }
            }
            r
        }
    }
}
