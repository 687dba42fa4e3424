//! The API's escalation routes (docs/API.md): `GET /v1/escalations` lists them (open ones unless
//! `all=true`), `GET /v1/escalations/{id}` shows one, `POST /v1/escalations/{id}/answer` answers
//! one through the server's runtime, which makes the answer durable and delivers it (a paused task
//! of a run hosted here resumes; a tool call waiting for an approval is decided).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use keel_actors::runtime::AnswerError;
use keel_store::{EscalationId, RunId};
use serde::Deserialize;

use super::error::ApiError;
use axum::response::Response;

use super::routes::{ApiJson, ApiQuery, App, Format, blocking, bounded, capture_print};
use crate::escalations::{AnswerOutcome, print_list, view};
use crate::exit::failure;

/// Escalations listed when the request names no limit.
const LIST_LIMIT_DEFAULT: u32 = 100;

/// The query of `GET /v1/escalations`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    run: Option<String>,
    #[serde(default)]
    all: bool,
    limit: Option<u32>,
    #[serde(default)]
    format: Format,
}

/// The body of `POST /v1/escalations/{id}/answer`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AnswerBody {
    answer: String,
}

fn escalation_id(text: &str) -> Result<EscalationId, ApiError> {
    text.parse()
        .map_err(|e| ApiError::bad_request(format!("escalation: {e}")))
}

/// `GET /v1/escalations`: what `keel escalations` prints on the server's store, its `--json`
/// output (the default) or its text (`format=text`), printed by the same code.
pub(super) async fn list(
    State(app): State<Arc<App>>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    let run = match q.run.as_deref() {
        Some(r) => Some(
            r.parse::<RunId>()
                .map_err(|e| ApiError::bad_request(format!("run: {e}")))?,
        ),
        None => None,
    };
    let limit = bounded("limit", q.limit.unwrap_or(LIST_LIMIT_DEFAULT))?;
    let all = q.all;
    capture_print(&app, q.format, move |store, out| {
        failure(print_list(store, run, all, limit, out.json()))
    })
    .await
}

/// `GET /v1/escalations/{id}`.
pub(super) async fn show(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = escalation_id(&id)?;
    let store = app.store()?;
    let mut value = blocking(move || {
        let (run, row) = store.catalog().escalation(id)?;
        Ok(view(run, &row))
    })
    .await?;
    crate::redact::json(&mut value);
    Ok(Json(value))
}

/// `POST /v1/escalations/{id}/answer`: 400 for an answer the escalation does not take (blank,
/// too long, not one of its options), 404 for an unknown id, 409 for a closed escalation.
pub(super) async fn answer(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<AnswerBody>,
) -> Result<Json<AnswerOutcome>, ApiError> {
    let id = escalation_id(&id)?;
    match app.rt.answer_escalation(id, &body.answer).await {
        Ok(answered) => Ok(Json(AnswerOutcome::of(&answered))),
        Err(AnswerError::NotFound(_)) => {
            Err(ApiError::not_found(format!("escalation {id} not found")))
        }
        Err(AnswerError::Refused(keel_actors::escalation::AnswerRefusal::Closed { id, how })) => {
            Err(ApiError::conflict(format!(
                "escalation {id} is closed ({how})"
            )))
        }
        Err(AnswerError::Refused(e)) => Err(ApiError::bad_request(format!("answer: {e}"))),
        Err(e) => Err(ApiError::internal(e.to_string())),
    }
}
