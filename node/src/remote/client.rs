//! The HTTP client of the `keel` commands that talk to a server (`--server URL`, or the server
//! that holds the home): bearer token, JSON bodies, the server's error bodies as typed errors,
//! and a run's event stream read as server-sent events.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use keel_actors::runtime::RuntimeEvent;
use keel_harness::messages_api::sse::{SseFrame, SseParser};
use keel_store::RunId;
use reqwest::StatusCode;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::serve::wire::{ApiEvent, ErrorBody};

/// How long connecting to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request (not an event stream) may take: a follow-up's summary waits up to a
/// minute for the follow-up to end on the server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(90);
/// How long an event stream may be silent: the server sends a keep-alive every 15 seconds.
const STREAM_IDLE: Duration = Duration::from_secs(60);

/// Why a request to the server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ClientError {
    /// The server could not be reached, or the connection broke.
    #[error("cannot reach the keel server at {url}: {source}")]
    Unreachable {
        /// What was asked.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The server answered with an error: its message, as the local command would say it.
    #[error("{message}")]
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// The error's kind (`not_found`, `bad_request`, ...).
        kind: String,
        /// What the server said.
        message: String,
    },
    /// The answer is not what this version of keel expects.
    #[error("the keel server's answer to {url} is not understood: {detail}")]
    Unexpected {
        /// What was asked.
        url: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The event stream ended, broke or went silent before the run's end.
    #[error("the event stream of run {run} ended before the run did: {detail}")]
    StreamEnded {
        /// The run.
        run: RunId,
        /// Why.
        detail: String,
    },
}

impl ClientError {
    /// The HTTP status of a refusal.
    pub(crate) fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// How following a run's events ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Followed {
    /// The run ended.
    Finished,
    /// The run was paused (the server stopped, or its disk is full), for this reason.
    Paused(String),
}

/// A server and the token to show it.
#[derive(Clone)]
pub(crate) struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the server at `base` (`http://host:port`, or `https://`, whose certificate is
    /// checked against the CA certificates in the PEM file `ca` only when given, else against the
    /// platform's roots).
    ///
    /// # Errors
    /// When `ca` cannot be read or holds no certificate, or the HTTP client cannot be built.
    pub(crate) fn new(base: &str, token: String, ca: Option<&Path>) -> anyhow::Result<Self> {
        keel_harness::messages_api::http::install_crypto_provider();
        let mut builder = reqwest::Client::builder().connect_timeout(CONNECT_TIMEOUT);
        if let Some(ca) = ca {
            let pem = std::fs::read(ca)
                .with_context(|| format!("reading the CA file {}", ca.display()))?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem)
                .with_context(|| format!("the CA file {}", ca.display()))?;
            if certs.is_empty() {
                anyhow::bail!("the CA file {} holds no certificate", ca.display());
            }
            builder = builder.tls_certs_only(certs);
        }
        let http = builder.build()?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// The server's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::Response, ClientError> {
        let response = request
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.to_owned(),
                source,
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let (kind, message) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => (body.error, body.message),
            Err(_) => ("unknown".to_owned(), text),
        };
        Err(ClientError::Refused {
            status,
            kind,
            message,
        })
    }

    /// `GET path`, the body as text.
    pub(crate) async fn get_text(&self, path: &str) -> Result<String, ClientError> {
        let url = self.url(path);
        let response = self
            .send(self.http.get(&url).timeout(REQUEST_TIMEOUT), &url)
            .await?;
        response
            .text()
            .await
            .map_err(|source| ClientError::Unreachable { url, source })
    }

    /// `GET path`, the body as JSON.
    pub(crate) async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, ClientError> {
        let url = self.url(path);
        let text = self.get_text(path).await?;
        serde_json::from_str(&text).map_err(|e| ClientError::Unexpected {
            url,
            detail: e.to_string(),
        })
    }

    /// `POST path` with a JSON body, the answer as JSON.
    pub(crate) async fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let url = self.url(path);
        let response = self
            .send(
                self.http.post(&url).timeout(REQUEST_TIMEOUT).json(body),
                &url,
            )
            .await?;
        let text = response
            .text()
            .await
            .map_err(|source| ClientError::Unreachable {
                url: url.clone(),
                source,
            })?;
        serde_json::from_str(&text).map_err(|e| ClientError::Unexpected {
            url,
            detail: e.to_string(),
        })
    }

    /// Follow a run's events from event `from` on, handing each to `events` as the runtime's own
    /// event, until the run's `Finished` (which is handed on too) or its pause.
    ///
    /// # Errors
    /// [`ClientError`]; [`ClientError::StreamEnded`] when the stream ends, breaks or stays silent
    /// for a minute before the run's end (a server stopped by a signal pauses its runs).
    pub(crate) async fn follow(
        &self,
        run: RunId,
        from: u64,
        events: mpsc::Sender<RuntimeEvent>,
    ) -> Result<Followed, ClientError> {
        let url = self.url(&format!("/v1/runs/{run}/events?from={from}"));
        let mut response = self.send(self.http.get(&url), &url).await?;
        let mut parser = SseParser::new();
        let mut frames: Vec<SseFrame> = Vec::new();
        let ended = |detail: String| ClientError::StreamEnded { run, detail };
        loop {
            let chunk = tokio::time::timeout(STREAM_IDLE, response.chunk())
                .await
                .map_err(|_| ended(format!("no event or keep-alive for {STREAM_IDLE:?}")))?
                .map_err(|e| ended(e.to_string()))?;
            let Some(chunk) = chunk else {
                return Err(ended("the server closed it".into()));
            };
            parser
                .feed(&chunk, &mut frames)
                .map_err(|e| ended(e.to_string()))?;
            for frame in frames.drain(..) {
                if frame.data.is_empty() || matches!(frame.event.as_str(), "lagged" | "dropped") {
                    // Keep-alives, and notices that some events were skipped (the summary
                    // still counts every one: the server adds them up itself).
                    continue;
                }
                let event: ApiEvent =
                    serde_json::from_str(&frame.data).map_err(|e| ClientError::Unexpected {
                        url: url.clone(),
                        detail: format!("event {:?}: {e}", frame.event),
                    })?;
                if let ApiEvent::Paused { reason, .. } = event {
                    return Ok(Followed::Paused(reason));
                }
                let finished = matches!(event, ApiEvent::Finished { .. });
                if let Some(event) = event.into_runtime() {
                    // A view that stopped listening is not an error of the stream.
                    let _ = events.send(event).await;
                }
                if finished {
                    return Ok(Followed::Finished);
                }
            }
        }
    }
}
