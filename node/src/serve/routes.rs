//! The API's routes and handlers (docs/openapi.yaml). Every route but `/healthz` and `/readyz`
//! needs a bearer token. A request is checked completely (token, body size and shape, ids,
//! fields, the run's state) before anything is written: a refused request changes nothing.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::Stream;
use keel_actors::runtime::{FollowUpOutcome, RunOutcome, Runtime, TaskCancel};
use keel_store::{RunId, Store, TaskId};
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, watch};

use super::auth::Tokens;
use super::error::ApiError;
use super::hub::{Hub, Sequenced, Subscription};
use super::metrics::Metrics;
use super::wire::{
    ApiEvent, AskFollowUp, CancelRun, FollowUpStarted, Printed, SubmitRun, Submitted,
};
use crate::exit::Failed;
use crate::home::Home;
use crate::read::{self, Read};
use crate::render::Output;
use crate::run::summary::{self, Usage};

/// Largest `limit` or `tail` a read accepts (the store reads at most this many rows at once).
const READ_LIMIT_MAX: u32 = 10_000;
/// How long a follow-up's summary waits for the follow-up to end.
const FOLLOW_UP_WAIT: Duration = Duration::from_secs(60);
/// How long `POST /v1/runs` waits for the new run's row in the store before answering (so a read
/// right after the answer finds the run); past it, it answers anyway.
const ADMITTED_WAIT: Duration = Duration::from_secs(10);
/// How often it looks.
const ADMITTED_EVERY: Duration = Duration::from_millis(10);
/// Most follow-ups whose outcome the server remembers for their summary.
const FOLLOW_UPS_KEPT_MAX: usize = 1_024;
/// The reason a cancel without one is recorded with (as `keel cancel`'s).
const CANCEL_REASON: &str = "cancelled by an operator";

/// How a follow-up ended, as its summary needs it.
type FollowUpEnd = Option<Result<FollowUpOutcome, String>>;

/// What the server decided at start for every run it is asked to start.
pub(crate) struct Launch {
    /// Whether runs use the built-in scripted model (a brief gets its survey plan).
    pub(crate) scripted: bool,
    /// Whether a brief without a plan runs as a lead session (as under `keel run`).
    pub(crate) lead_capable: bool,
    /// A run's budget in micro-dollars.
    pub(crate) budget_micros: Option<u64>,
    /// The configuration snapshot stored with each run.
    pub(crate) snapshot: String,
    /// The agent profiles a request may name.
    pub(crate) agents: Vec<String>,
    /// Where sessions work.
    pub(crate) work_dir: PathBuf,
}

/// Everything the handlers share.
pub(crate) struct App {
    pub(crate) rt: Arc<Runtime>,
    pub(crate) home: Home,
    pub(crate) hub: Hub,
    pub(crate) metrics: Metrics,
    pub(crate) tokens: Tokens,
    pub(crate) launch: Launch,
    /// One permit per run this server may host at once (the runtime's run slots): a request
    /// that would wait for one is refused with 503 instead.
    pub(crate) slots: Arc<Semaphore>,
    /// Follow-ups started here, oldest first, with how they ended.
    pub(crate) follow_ups: Mutex<VecDeque<(TaskId, watch::Receiver<FollowUpEnd>)>>,
    /// Cleared when the server begins to stop.
    pub(crate) ready: AtomicBool,
    /// The largest request body accepted.
    pub(crate) body_bytes_max: usize,
}

type Shared = Arc<App>;

impl App {
    /// The store the runtime writes (its current handle: opened again after a failed write).
    pub(super) fn store(&self) -> Result<Arc<Store>, ApiError> {
        Ok(self.rt.store()?)
    }
}

/// The API's router.
pub(crate) fn router(app: Shared) -> Router {
    let authed = Router::new()
        .route("/v1/runs", get(runs).post(submit))
        .route("/v1/runs/{run}", get(status))
        .route("/v1/runs/{run}/tree", get(tree))
        .route("/v1/runs/{run}/audit", get(audit))
        .route("/v1/runs/{run}/tasks", get(run_tasks))
        .route("/v1/runs/{run}/events", get(events))
        .route("/v1/runs/{run}/summary", get(run_summary))
        .route("/v1/runs/{run}/cancel", post(cancel))
        .route("/v1/runs/{run}/resume", post(resume))
        .route("/v1/tasks", get(tasks))
        .route("/v1/tasks/{task}", get(show))
        .route("/v1/tasks/{task}/logs", get(logs))
        .route("/v1/tasks/{task}/context", get(context))
        .route("/v1/tasks/{task}/follow-ups", post(follow_up))
        .route("/v1/tasks/{task}/cancel", post(cancel_task))
        .route("/v1/follow-ups/{task}/summary", get(follow_up_summary))
        .route("/v1/escalations", get(super::escalations::list))
        .route("/v1/escalations/{id}", get(super::escalations::show))
        .route(
            "/v1/escalations/{id}/answer",
            post(super::escalations::answer),
        )
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(app.body_bytes_max))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&app),
            require_token,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .merge(authed)
        .fallback(|| async { ApiError::not_found("no such route (see docs/openapi.yaml)") })
        .with_state(app)
}

/// Refuse a request without an accepted bearer token, before its body is read.
async fn require_token(State(app): State<Shared>, request: Request, next: Next) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    if !app.tokens.accepts(header) {
        return ApiError::unauthorized().into_response();
    }
    next.run(request).await
}

async fn readyz(State(app): State<Shared>) -> Result<&'static str, ApiError> {
    if !app.ready.load(Ordering::Acquire) {
        return Err(ApiError::busy("the server is stopping"));
    }
    let store = app.store()?;
    blocking(move || {
        store
            .catalog()
            .latest_run()
            .map(|_| ())
            .map_err(ApiError::from)
    })
    .await?;
    Ok("ready\n")
}

/// A JSON body, refused with a 4xx that names the problem (axum's own text) when it is not one.
pub(super) struct ApiJson<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Self(v)),
            Err(e) => Err(json_rejection(e)),
        }
    }
}

fn json_rejection(e: JsonRejection) -> ApiError {
    ApiError::rejected(e.status(), e.body_text())
}

/// Query parameters, refused with a 400 that names the problem.
pub(super) struct ApiQuery<T>(pub(super) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(Self(v)),
            Err(e) => Err(query_rejection(e)),
        }
    }
}

fn query_rejection(e: QueryRejection) -> ApiError {
    ApiError::rejected(StatusCode::BAD_REQUEST, e.body_text())
}

/// How a read answers: the command's `--json` output (the default) or its text for people.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Format {
    #[default]
    Json,
    Text,
}

/// The query of a read.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    #[serde(default)]
    format: Format,
    limit: Option<u32>,
    tail: Option<u32>,
    /// `GET /v1/runs`: only runs older than this one (the next page).
    before: Option<String>,
}

impl ReadQuery {
    fn limit(&self, default: u32) -> Result<u32, ApiError> {
        bounded("limit", self.limit.unwrap_or(default))
    }
}

/// A limit or tail of a read: at most [`READ_LIMIT_MAX`]; 0 is an empty page, as the command
/// prints it locally.
pub(super) fn bounded(name: &str, n: u32) -> Result<u32, ApiError> {
    if n > READ_LIMIT_MAX {
        return Err(ApiError::bad_request(format!(
            "{name} must be at most {READ_LIMIT_MAX}, not {n}"
        )));
    }
    Ok(n)
}

/// The query of a summary and of an event stream: from which event on (as answered by the
/// request that started the run, resumed it or asked the follow-up), and for a summary whether
/// it is the command's `--json` output.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FromQuery {
    from: Option<u64>,
    #[serde(default)]
    json: bool,
}

fn run_id(text: &str) -> Result<RunId, ApiError> {
    text.parse()
        .map_err(|e| ApiError::bad_request(format!("run: {e}")))
}

fn task_id(text: &str) -> Result<TaskId, ApiError> {
    text.parse()
        .map_err(|e| ApiError::bad_request(format!("task: {e}")))
}

/// A run id, or `latest`.
fn run_or_latest(text: &str) -> Result<Option<RunId>, ApiError> {
    if text == "latest" {
        Ok(None)
    } else {
        run_id(text).map(Some)
    }
}

/// Run blocking work (store reads, the render code) on the blocking pool.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("a blocking task failed: {e}")))?
}

/// Answer a read with exactly what the command prints.
async fn read(app: &Shared, command: Read, format: Format) -> Result<Response, ApiError> {
    capture_print(app, format, move |store, out| command.print(store, out)).await
}

/// Answer with what `print` prints on the server's store, as text or JSON.
pub(super) async fn capture_print(
    app: &Shared,
    format: Format,
    print: impl FnOnce(&Store, &Output) -> Result<(), Failed> + Send + 'static,
) -> Result<Response, ApiError> {
    let store = app.store()?;
    let json = format == Format::Json;
    let text = blocking(move || {
        let (result, text) = crate::stdout::capture(|| print(&store, &Output::new(json)));
        result.map_err(ApiError::from)?;
        Ok(text)
    })
    .await?;
    let kind = if json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    Ok(([(header::CONTENT_TYPE, kind)], text).into_response())
}

/// The query of `GET /v1/tasks/{task}/context`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextQuery {
    #[serde(default)]
    format: Format,
    /// `keel context --resume`.
    #[serde(default)]
    resume: bool,
}

/// `keel context TASK`: what the task's agent is shown, with the caps of the server's keel.toml
/// and the credentials of the server's environment (those its sessions have) scrubbed.
async fn context(
    State(app): State<Shared>,
    Path(task): Path<String>,
    ApiQuery(q): ApiQuery<ContextQuery>,
) -> Result<Response, ApiError> {
    let task = task_id(&task)?;
    let caps = app
        .home
        .config()
        .map_err(|e| ApiError::internal(e.to_string()))?
        .context
        .context_config();
    capture_print(&app, q.format, move |store, out| {
        crate::context::print(store, task, q.resume, &caps, out)
    })
    .await
}

async fn runs(
    State(app): State<Shared>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit(read::RUNS_LIMIT_DEFAULT)?;
    let before = q.before.as_deref().map(run_id).transpose()?;
    read(&app, Read::Runs { limit, before }, q.format).await
}

async fn status(
    State(app): State<Shared>,
    Path(run): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let run = run_or_latest(&run)?;
    read(&app, Read::Status { run }, q.format).await
}

async fn tree(
    State(app): State<Shared>,
    Path(run): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let run = run_or_latest(&run)?;
    let limit = q.limit(read::TREE_LIMIT_DEFAULT)?;
    read(&app, Read::Tree { run, limit }, q.format).await
}

async fn audit(
    State(app): State<Shared>,
    Path(run): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let run = run_or_latest(&run)?;
    let limit = q.limit(read::AUDIT_LIMIT_DEFAULT)?;
    read(&app, Read::Audit { run, limit }, q.format).await
}

async fn run_tasks(
    State(app): State<Shared>,
    Path(run): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let run = Some(run_id(&run)?);
    let limit = q.limit(read::TASKS_LIMIT_DEFAULT)?;
    read(&app, Read::Tasks { run, limit }, q.format).await
}

async fn tasks(
    State(app): State<Shared>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let limit = q.limit(read::TASKS_LIMIT_DEFAULT)?;
    read(&app, Read::Tasks { run: None, limit }, q.format).await
}

async fn show(
    State(app): State<Shared>,
    Path(task): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let task = task_id(&task)?;
    read(&app, Read::Show { task }, q.format).await
}

async fn logs(
    State(app): State<Shared>,
    Path(task): Path<String>,
    ApiQuery(q): ApiQuery<ReadQuery>,
) -> Result<Response, ApiError> {
    let task = task_id(&task)?;
    let tail = bounded("tail", q.tail.unwrap_or(read::LOGS_TAIL_DEFAULT))?;
    read(&app, Read::Logs { task, tail }, q.format).await
}

/// A run slot, or 503.
fn slot(app: &App) -> Result<OwnedSemaphorePermit, ApiError> {
    if !app.ready.load(Ordering::Acquire) {
        return Err(ApiError::busy("the server is stopping"));
    }
    Arc::clone(&app.slots).try_acquire_owned().map_err(|_| {
        ApiError::busy("every run slot of this server is taken; try again when a run has ended")
    })
}

fn work_dir(app: &App) -> String {
    app.launch.work_dir.display().to_string()
}

/// The checks a brief must pass before anything is written.
fn check_submission(app: &App, body: &SubmitRun) -> Result<(), ApiError> {
    if body.brief.trim().is_empty() {
        return Err(ApiError::bad_request("brief: it is empty"));
    }
    let max = keel_store::Limits::default().brief_bytes_max;
    if body.brief.len() as u64 > max {
        return Err(ApiError::bad_request(format!(
            "brief: it is {} bytes; the limit is {max}",
            body.brief.len()
        )));
    }
    if let Some(agent) = &body.agent
        && !app.launch.agents.iter().any(|a| a == agent)
    {
        return Err(ApiError::bad_request(format!(
            "agent: no agent named {agent:?} on this server (agents: {})",
            app.launch.agents.join(", ")
        )));
    }
    if let Some(plan) = &body.plan {
        keel_actors::plan::validate(plan.clone())
            .map_err(|e| ApiError::bad_request(format!("plan: {e}")))?;
    }
    Ok(())
}

async fn submit(
    State(app): State<Shared>,
    ApiJson(body): ApiJson<SubmitRun>,
) -> Result<(StatusCode, Json<Submitted>), ApiError> {
    check_submission(&app, &body)?;
    let mode = crate::run::run_mode(
        &body.brief,
        body.plan,
        app.launch.scripted,
        app.launch.lead_capable,
        body.agent,
    )
    .map_err(|e| ApiError::bad_request(format!("brief: {e:#}")))?;
    let permit = slot(&app)?;
    let handle = app
        .rt
        .submit(
            body.brief,
            mode,
            app.launch.budget_micros,
            app.launch.snapshot.clone(),
        )
        .await?;
    let run = handle.id();
    // A new run: its events start at 1, whether or not the first ones were published already.
    app.hub.open(run);
    let from = 1;
    tokio::spawn(async move {
        // The handle holds the runtime's run slot: keep it (and the server's) until the end.
        let _ = handle.finished().await;
        drop(permit);
    });
    admitted(&app, run).await;
    Ok((
        StatusCode::CREATED,
        Json(Submitted {
            run,
            events_from: from,
            work_dir: work_dir(&app),
        }),
    ))
}

/// Wait (at most [`ADMITTED_WAIT`]) until `run`'s row is in the store: the runtime's handle does
/// not say when its first commit is done, and a client reads the run as soon as it is answered.
async fn admitted(app: &App, run: RunId) {
    let Ok(store) = app.store() else {
        return;
    };
    let started = tokio::time::Instant::now();
    while started.elapsed() < ADMITTED_WAIT {
        let store = Arc::clone(&store);
        let missing = tokio::task::spawn_blocking(move || {
            matches!(
                store.catalog().run(run),
                Err(keel_store::ReadError::NotFound { .. })
            )
        })
        .await
        .unwrap_or(false);
        if !missing {
            return;
        }
        tokio::time::sleep(ADMITTED_EVERY).await;
    }
}

async fn resume(
    State(app): State<Shared>,
    Path(run): Path<String>,
) -> Result<Json<Submitted>, ApiError> {
    let run = run_id(&run)?;
    let permit = slot(&app)?;
    let from = app.hub.track(run);
    let handle = app.rt.resume(run).await?;
    tokio::spawn(async move {
        let _ = handle.finished().await;
        drop(permit);
    });
    Ok(Json(Submitted {
        run,
        events_from: from,
        work_dir: work_dir(&app),
    }))
}

/// A cancel's reason from its optional body: none (or `{}`) cancels with the default reason.
fn cancel_reason(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<String, ApiError> {
    let body = body.map_err(|e| ApiError::rejected(e.status(), e.body_text()))?;
    let body: CancelRun = if body.iter().all(u8::is_ascii_whitespace) {
        CancelRun::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("body: {e}")))?
    };
    let reason = body.reason.unwrap_or_else(|| CANCEL_REASON.to_owned());
    if reason.len() > keel_actors::FOLLOW_UP_BYTES_MAX {
        return Err(ApiError::bad_request(format!(
            "reason: it is {} bytes; the limit is {}",
            reason.len(),
            keel_actors::FOLLOW_UP_BYTES_MAX
        )));
    }
    Ok(reason)
}

async fn cancel(
    State(app): State<Shared>,
    Path(run): Path<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let run = run_id(&run)?;
    let reason = cancel_reason(body)?;
    if app.rt.cancel(run, &reason) {
        return Ok(Json(
            serde_json::json!({"run": run.to_string(), "status": "cancel_requested"}),
        ));
    }
    let tasks = app.rt.cancel_stored(run, &reason).await?;
    Ok(Json(
        serde_json::json!({"run": run.to_string(), "status": "cancelled", "tasks_cancelled": tasks}),
    ))
}

/// `keel cancel TASK`: one task's step (a follow-up, most often) ends; the run goes on. What has
/// ended, and an unknown id, are refused first, as the local command refuses them.
async fn cancel_task(
    State(app): State<Shared>,
    Path(task): Path<String>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let task = task_id(&task)?;
    let reason = cancel_reason(body)?;
    let store = app.store()?;
    blocking(move || {
        crate::run::check_cancel(&store, RunId(task.0)).map_err(|e| {
            let message = format!("{e:#}");
            match e.downcast_ref::<crate::run::CancelRefused>() {
                Some(crate::run::CancelRefused::Unknown(_)) => ApiError::not_found(message),
                Some(_) => ApiError::conflict(message),
                None => ApiError::internal(message),
            }
        })
    })
    .await?;
    Ok(Json(match app.rt.cancel_task(task, &reason).await? {
        TaskCancel::Sent { run } => serde_json::json!({
            "task": task.to_string(), "run": run.to_string(), "status": "cancel_requested"
        }),
        TaskCancel::Stored { run, tasks } => serde_json::json!({
            "task": task.to_string(), "run": run.to_string(), "status": "cancelled",
            "tasks_cancelled": tasks
        }),
    }))
}

async fn follow_up(
    State(app): State<Shared>,
    Path(task): Path<String>,
    ApiJson(body): ApiJson<AskFollowUp>,
) -> Result<(StatusCode, Json<FollowUpStarted>), ApiError> {
    let task = task_id(&task)?;
    keel_actors::runtime::check_follow_up_message(&body.message)?;
    let permit = slot(&app)?;
    let run = {
        let store = app.store()?;
        blocking(move || Ok(store.catalog().task(task)?.run_id)).await?
    };
    let from = app.hub.track(run);
    let handle = app
        .rt
        .follow_up(task, &body.message, body.agent.as_deref())
        .await?;
    let (run, id, reopened) = (handle.run(), handle.task(), handle.reopened());
    let (tx, rx) = watch::channel(None);
    {
        let mut kept = app
            .follow_ups
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if kept.len() == FOLLOW_UPS_KEPT_MAX {
            kept.pop_front();
        }
        kept.push_back((id, rx));
    }
    tokio::spawn(async move {
        let end = handle.finished().await.map_err(|e| e.to_string());
        drop(permit);
        let _ = tx.send(Some(end));
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(FollowUpStarted {
            run,
            task: id,
            reopened,
            events_from: from,
            work_dir: work_dir(&app),
        }),
    ))
}

/// Print a summary on the blocking pool, capturing what the command would print.
async fn printed(
    f: impl FnOnce() -> anyhow::Result<()> + Send + 'static,
    completed: bool,
) -> Result<Json<Printed>, ApiError> {
    let stdout = blocking(move || {
        let (result, text) = crate::stdout::capture(f);
        result.map_err(|e| ApiError::internal(format!("{e:#}")))?;
        String::from_utf8(text).map_err(|e| ApiError::internal(e.to_string()))
    })
    .await?;
    Ok(Json(Printed {
        stdout,
        completed: Some(completed),
    }))
}

fn usage(app: &App, run: RunId, from: u64) -> Usage {
    Usage {
        totals: app.hub.totals(run, from),
        events_dropped: app.rt.events_dropped(),
    }
}

async fn run_summary(
    State(app): State<Shared>,
    Path(run): Path<String>,
    ApiQuery(q): ApiQuery<FromQuery>,
) -> Result<Json<Printed>, ApiError> {
    let run = run_id(&run)?;
    let row = {
        let store = app.store()?;
        blocking(move || Ok(store.catalog().run(run)?)).await?
    };
    if !row.status.is_terminal() {
        return Err(ApiError::conflict(format!(
            "run {run} has not ended (it is {:?})",
            row.status
        )));
    }
    let outcome = RunOutcome {
        run,
        status: row.status,
        outcome: row.outcome.unwrap_or_default(),
    };
    let completed = outcome.status == keel_store::RunStatus::Completed;
    let usage = usage(&app, run, q.from.unwrap_or(1));
    let (home, store) = (app.home.clone(), app.store()?);
    printed(
        move || summary::print(&home, &store, run, &outcome, &usage, q.json),
        completed,
    )
    .await
}

async fn follow_up_summary(
    State(app): State<Shared>,
    Path(task): Path<String>,
    ApiQuery(q): ApiQuery<FromQuery>,
) -> Result<Json<Printed>, ApiError> {
    let task = task_id(&task)?;
    let found = app
        .follow_ups
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .find(|(t, _)| *t == task)
        .map(|(_, rx)| rx.clone());
    let Some(mut rx) = found else {
        return Err(ApiError::not_found(format!(
            "no follow-up {task} was asked on this server since it started"
        )));
    };
    let end = tokio::time::timeout(FOLLOW_UP_WAIT, rx.wait_for(Option::is_some))
        .await
        .map_err(|_| ApiError::conflict(format!("follow-up {task} has not ended yet")))?
        .map_err(|_| ApiError::internal("the follow-up's waiter is gone"))?
        .clone();
    let outcome = match end {
        Some(Ok(outcome)) => outcome,
        Some(Err(e)) => return Err(ApiError::conflict(e)),
        None => return Err(ApiError::internal("the follow-up has no outcome")),
    };
    let completed = outcome.completed();
    let usage = usage(&app, outcome.run.run, q.from.unwrap_or(1));
    let (home, store) = (app.home.clone(), app.store()?);
    printed(
        move || summary::follow_up(&home, &store, &outcome, &usage, q.json),
        completed,
    )
    .await
}

async fn metrics(State(app): State<Shared>) -> Result<Response, ApiError> {
    let (store, rt, metrics) = (app.store()?, Arc::clone(&app.rt), app.metrics.clone());
    let text = blocking(move || {
        metrics
            .render(&store, &rt)
            .map_err(|e| ApiError::internal(format!("{e:#}")))
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response())
}

/// What an event stream still has to send.
struct Streaming {
    replay: VecDeque<Sequenced>,
    live: Option<broadcast::Receiver<Sequenced>>,
    /// A notice to send first (events dropped before the stream opened).
    notice: Option<Event>,
    done: bool,
}

fn sse_event((seq, event): &Sequenced) -> Event {
    // Scrubbed string by string like every way out of keel (issue 16).
    let mut value = serde_json::to_value(event).unwrap_or_default();
    crate::redact::json(&mut value);
    let data = value.to_string();
    Event::default()
        .event(event.name())
        .id(seq.to_string())
        .data(data)
}

async fn events(
    State(app): State<Shared>,
    Path(run): Path<String>,
    ApiQuery(q): ApiQuery<FromQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let run = run_id(&run)?;
    let from = q.from.unwrap_or(1);
    let sub = match app.hub.subscribe(run, from) {
        Some(sub) => sub,
        None => stored_end(&app, run).await?,
    };
    let notice = (sub.dropped > 0).then(|| {
        Event::default()
            .event("dropped")
            .data(sub.dropped.to_string())
    });
    let state = Streaming {
        replay: sub.replay.into(),
        live: sub.live,
        notice,
        done: false,
    };
    let stream = futures_util::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        if let Some(notice) = st.notice.take() {
            return Some((Ok(notice), st));
        }
        if let Some(item) = st.replay.pop_front() {
            st.done = item.1.ends_stream();
            return Some((Ok(sse_event(&item)), st));
        }
        let live = st.live.as_mut()?;
        match live.recv().await {
            Ok(item) => {
                st.done = item.1.ends_stream();
                Some((Ok(sse_event(&item)), st))
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                let lagged = Event::default().event("lagged").data(n.to_string());
                Some((Ok(lagged), st))
            }
            Err(broadcast::error::RecvError::Closed) => None,
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// The stream of a run the hub does not know (ended before this server started, or forgotten):
/// its end from the store, or 409 when it is open but not hosted here (paused: resume it).
async fn stored_end(app: &App, run: RunId) -> Result<Subscription, ApiError> {
    let store: Arc<Store> = app.store()?;
    let row = blocking(move || Ok(store.catalog().run(run)?)).await?;
    if !row.status.is_terminal() {
        return Err(ApiError::conflict(format!(
            "run {run} is {:?} and not hosted by this server: resume it with POST /v1/runs/{run}/resume",
            row.status
        )));
    }
    let end = ApiEvent::Finished {
        run,
        status: row.status,
        outcome: row.outcome.unwrap_or_default(),
    };
    Ok(Subscription {
        replay: vec![(1, end)],
        dropped: 0,
        live: None,
    })
}
