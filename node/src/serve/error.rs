//! The API's errors: a status code and a JSON body that names the problem ([`ErrorBody`]). Every
//! refusal of a request happens before anything is written, so a 4xx changes nothing.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_actors::host::HostError;
use keel_actors::runtime::{CancelError, FollowUpError, ResumeError, StoreReadError, SubmitError};
use keel_store::ReadError;

use super::wire::ErrorBody;
use crate::exit::{Exit, Failed};

/// A request the server refuses or could not carry out.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
        }
    }

    /// 400: the request is malformed or a field is invalid; the message names it.
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 401: no token, or not an accepted one.
    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a bearer token of the server's token file is required (Authorization: Bearer TOKEN)",
        )
    }

    /// 404: no such run or task.
    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 409: the run's state does not allow it (terminal, not hosted here, not finished yet).
    pub(crate) fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }

    /// 503: every run slot is taken, or the server is stopping.
    pub(crate) fn busy(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "busy", message)
    }

    /// 500: the server failed (the store, the runtime).
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    /// A rejection by one of axum's extractors (a body too large, not JSON, a missing field, a bad
    /// query), with axum's text, which names the problem.
    pub(crate) fn rejected(status: StatusCode, text: String) -> Self {
        let kind = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            _ => "bad_request",
        };
        // A field of the right JSON with a wrong value is 422 in axum; one 400 for every bad body.
        let status = if status == StatusCode::UNPROCESSABLE_ENTITY {
            StatusCode::BAD_REQUEST
        } else {
            status
        };
        Self::new(status, kind, text)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.kind.to_owned(),
            // A message may quote what a request or the store held: scrubbed (issue 16).
            message: crate::redact::text(&self.message).into_owned(),
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

/// Whether a store read failed because the run or task does not exist.
fn missing(e: &StoreReadError) -> bool {
    matches!(
        e,
        StoreReadError::Store(HostError::Read(ReadError::NotFound { .. }))
    )
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        Self::internal(e.to_string())
    }
}

impl From<ResumeError> for ApiError {
    fn from(e: ResumeError) -> Self {
        let message = e.to_string();
        match e {
            ResumeError::Read(r) if missing(&r) => Self::not_found(message),
            ResumeError::Refused(_) => Self::conflict(message),
            _ => Self::internal(message),
        }
    }
}

impl From<FollowUpError> for ApiError {
    fn from(e: FollowUpError) -> Self {
        let message = e.to_string();
        match e {
            FollowUpError::UnknownTask(_) => Self::not_found(message),
            FollowUpError::Read(r) if missing(&r) => Self::not_found(message),
            FollowUpError::UnknownAgent { .. }
            | FollowUpError::EmptyMessage
            | FollowUpError::MessageTooLarge { .. } => Self::bad_request(message),
            FollowUpError::Refused(_) => Self::conflict(message),
            _ => Self::internal(message),
        }
    }
}

impl From<CancelError> for ApiError {
    fn from(e: CancelError) -> Self {
        let message = e.to_string();
        match e {
            CancelError::Read(r) if missing(&r) => Self::not_found(message),
            CancelError::UnknownTask(_) => Self::not_found(message),
            CancelError::Refused(_) => Self::conflict(message),
            _ => Self::internal(message),
        }
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> Self {
        Self::internal(e.to_string())
    }
}

impl From<ReadError> for ApiError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::NotFound { .. } => Self::not_found(e.to_string()),
            _ => Self::internal(e.to_string()),
        }
    }
}

impl From<Failed> for ApiError {
    fn from(f: Failed) -> Self {
        let message = format!("{:#}", f.error);
        match f.exit {
            Exit::NotFound => Self::not_found(message),
            Exit::Usage => Self::bad_request(message),
            _ => Self::internal(message),
        }
    }
}
