//! Sending one turn to an Anthropic-compatible endpoint and reading the streamed answer.
//!
//! [`ModelTransport`] is the seam between the agent loop and the model: [`HttpTransport`] speaks
//! real HTTP (the native adapter, tested against the scripted model server on 127.0.0.1), and the
//! scripted harness plugs in the in-process model. Every wait here is bounded: connect timeout,
//! an idle timeout per stream chunk, a cap on body size, and the session's cancel token.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::Value;

use super::sse::{SseFrame, SseParser};
use super::stream::{MessageAssembler, StreamError};
use super::wire::{AssistantMessage, MessagesRequest};
use crate::error::{ErrorCategory, HarnessError};
use crate::rfc3339;
use crate::session::{BoxFuture, CancelToken};

/// The `anthropic-version` header keel sends.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// Most bytes of one streamed answer.
pub const RESPONSE_BYTES_MAX: usize = 64 << 20;
/// Most bytes of an error body kept for the message.
pub const ERROR_BODY_BYTES_MAX: usize = 64 * 1024;

/// Sends one model turn. Implementations must return within bounded time and honour `cancel`.
pub trait ModelTransport: Send + Sync {
    /// Sends `request` and returns the complete assistant message.
    ///
    /// # Errors
    /// A typed [`HarnessError`]; `retryable` tells the loop whether to back off and retry.
    fn send<'a>(
        &'a self,
        request: &'a MessagesRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<AssistantMessage, HarnessError>>;
}

/// How the endpoint authenticates keel.
#[derive(Clone)]
pub enum Auth {
    /// No credential (local endpoints).
    None,
    /// `x-api-key: <key>`.
    ApiKey(String),
    /// `Authorization: Bearer <token>`.
    Bearer(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.write_str(match self {
            Auth::None => "Auth::None",
            Auth::ApiKey(_) => "Auth::ApiKey(<redacted>)",
            Auth::Bearer(_) => "Auth::Bearer(<redacted>)",
        })
    }
}

/// The HTTP transport.
#[derive(Debug, Clone)]
pub struct HttpTransport {
    client: reqwest::Client,
    messages_url: String,
    auth: Auth,
    stream_idle_ms_max: u64,
}

impl HttpTransport {
    /// A transport for `base_url` (without `/v1`, like `ANTHROPIC_BASE_URL`).
    pub fn new(
        client: reqwest::Client,
        base_url: &str,
        auth: Auth,
        stream_idle_ms_max: u64,
    ) -> Self {
        HttpTransport {
            client,
            messages_url: format!("{}/v1/messages", base_url.trim_end_matches('/')),
            auth,
            stream_idle_ms_max,
        }
    }

    fn headers(&self) -> Result<HeaderMap, HarnessError> {
        let mut h = HeaderMap::new();
        h.insert(
            "anthropic-version",
            HeaderValue::from_static(ANTHROPIC_VERSION),
        );
        h.insert("accept", HeaderValue::from_static("text/event-stream"));
        let bad = |_| {
            HarnessError::new(
                ErrorCategory::Auth,
                "the credential contains characters not allowed in a header",
            )
        };
        match &self.auth {
            Auth::None => {}
            Auth::ApiKey(k) => {
                let mut v = HeaderValue::from_str(k).map_err(bad)?;
                v.set_sensitive(true);
                h.insert("x-api-key", v);
            }
            Auth::Bearer(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}")).map_err(bad)?;
                v.set_sensitive(true);
                h.insert("authorization", v);
            }
        }
        Ok(h)
    }

    async fn send_inner(
        &self,
        request: &MessagesRequest,
    ) -> Result<AssistantMessage, HarnessError> {
        let idle = Duration::from_millis(self.stream_idle_ms_max);
        let send = self
            .client
            .post(&self.messages_url)
            .headers(self.headers()?)
            .json(request)
            .send();
        let mut response = match tokio::time::timeout(idle, send).await {
            Err(_) => {
                return Err(HarnessError::transient(
                    "no response headers within the idle timeout",
                ));
            }
            Ok(Err(e)) => return Err(HarnessError::transient(format!("request failed: {e}"))),
            Ok(Ok(r)) => r,
        };
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let (retry_after_ms, reset_at_unix_ms) = rate_limit_headers(response.headers());
            let body = read_bounded(&mut response, ERROR_BODY_BYTES_MAX, idle)
                .await
                .unwrap_or_default();
            let message = error_message(&body).unwrap_or_else(|| format!("HTTP {status}"));
            return Err(HarnessError::from_http_status(
                status,
                message,
                retry_after_ms,
                reset_at_unix_ms,
            ));
        }
        let is_sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_sse {
            // Some proxies answer a stream request with one JSON message: accept it.
            let body = read_bounded(&mut response, RESPONSE_BYTES_MAX, idle).await?;
            return serde_json::from_slice::<AssistantMessage>(&body).map_err(|e| {
                HarnessError::transient(format!("answer is neither SSE nor a message: {e}"))
            });
        }
        let mut parser = SseParser::new();
        let mut assembler = MessageAssembler::new();
        let mut frames: Vec<SseFrame> = Vec::new();
        let mut total = 0usize;
        loop {
            let chunk = match tokio::time::timeout(idle, response.chunk()).await {
                Err(_) => {
                    return Err(HarnessError::transient(
                        "the stream stalled past the idle timeout",
                    ));
                }
                Ok(Err(e)) => {
                    return Err(HarnessError::transient(format!("the stream broke: {e}")));
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(c))) => c,
            };
            total += chunk.len();
            if total > RESPONSE_BYTES_MAX {
                return Err(HarnessError::transient(
                    "the answer exceeds RESPONSE_BYTES_MAX",
                ));
            }
            parser
                .feed(&chunk, &mut frames)
                .map_err(|e| HarnessError::transient(format!("bad SSE: {e}")))?;
            for frame in frames.drain(..) {
                assembler.apply(&frame).map_err(stream_error)?;
            }
            if assembler.is_stopped() {
                break;
            }
        }
        assembler.finish().map_err(stream_error)
    }
}

impl ModelTransport for HttpTransport {
    fn send<'a>(
        &'a self,
        request: &'a MessagesRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<AssistantMessage, HarnessError>> {
        Box::pin(async move {
            tokio::select! {
                r = self.send_inner(request) => r,
                _ = cancel.cancelled() => Err(HarnessError::cancelled()),
            }
        })
    }
}

impl<T: ModelTransport + ?Sized> ModelTransport for Arc<T> {
    fn send<'a>(
        &'a self,
        request: &'a MessagesRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<AssistantMessage, HarnessError>> {
        (**self).send(request, cancel)
    }
}

/// Maps a stream problem to a session error: an endpoint `overloaded_error`/`api_error` mid-stream
/// and a broken stream are transient; a tool input that is not JSON is the model's fault and also
/// worth one more try.
pub fn stream_error(e: StreamError) -> HarnessError {
    match &e {
        StreamError::Endpoint { kind, .. } if kind == "rate_limit_error" => {
            HarnessError::rate_limited(e.to_string(), None, None)
        }
        StreamError::Endpoint { kind, .. } if kind == "invalid_request_error" => {
            HarnessError::new(ErrorCategory::BusinessRule, e.to_string())
        }
        _ => HarnessError::transient(e.to_string()),
    }
}

async fn read_bounded(
    response: &mut reqwest::Response,
    bytes_max: usize,
    idle: Duration,
) -> Result<Vec<u8>, HarnessError> {
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(idle, response.chunk()).await {
            Err(_) => {
                return Err(HarnessError::transient(
                    "the body stalled past the idle timeout",
                ));
            }
            Ok(Err(e)) => {
                return Err(HarnessError::transient(format!(
                    "reading the body failed: {e}"
                )));
            }
            Ok(Ok(None)) => return Ok(body),
            Ok(Ok(Some(c))) => {
                let room = bytes_max.saturating_sub(body.len());
                body.extend_from_slice(&c[..c.len().min(room)]);
                if body.len() >= bytes_max {
                    return Ok(body);
                }
            }
        }
    }
}

fn error_message(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let e = v.get("error")?;
    let kind = e.get("type").and_then(Value::as_str).unwrap_or("error");
    let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
    Some(format!("{kind}: {msg}"))
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Reads `retry-after` (seconds; or `retry-after-ms`) and the latest `anthropic-ratelimit-*-reset`
/// time (RFC 3339), falling back to now + `retry-after` for the reset.
pub fn rate_limit_headers(headers: &HeaderMap) -> (Option<u64>, Option<u64>) {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let retry_after_ms = text("retry-after-ms")
        .and_then(|v| v.parse::<u64>().ok())
        .or_else(|| {
            text("retry-after")
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(|s| (s * 1000.0) as u64)
        });
    let reset = headers
        .iter()
        .filter(|(n, _)| {
            n.as_str().starts_with("anthropic-ratelimit-") && n.as_str().ends_with("-reset")
        })
        .filter_map(|(_, v)| v.to_str().ok().and_then(rfc3339::parse_to_unix_ms))
        .max()
        .or_else(|| retry_after_ms.map(|ms| unix_now_ms() + ms));
    (retry_after_ms, reset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_errors_map_to_categories() {
        let endpoint = |kind: &str| StreamError::Endpoint {
            kind: kind.into(),
            message: "m".into(),
        };
        assert!(matches!(
            stream_error(endpoint("rate_limit_error")).category,
            ErrorCategory::RateLimited { .. }
        ));
        assert_eq!(
            stream_error(endpoint("overloaded_error")).category,
            ErrorCategory::Transient
        );
        let bad = stream_error(endpoint("invalid_request_error"));
        assert_eq!(bad.category, ErrorCategory::BusinessRule);
        assert!(!bad.retryable);
        assert_eq!(
            stream_error(StreamError::MissingStopReason).category,
            ErrorCategory::Transient
        );
    }

    #[test]
    fn rate_limit_headers_are_read() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        h.insert(
            "anthropic-ratelimit-requests-reset",
            HeaderValue::from_static("2027-01-01T00:00:00Z"),
        );
        h.insert(
            "anthropic-ratelimit-tokens-reset",
            HeaderValue::from_static("2027-01-01T00:00:30Z"),
        );
        assert_eq!(
            rate_limit_headers(&h),
            (Some(7000), Some(1_798_761_630_000))
        );
        let empty = HeaderMap::new();
        assert_eq!(rate_limit_headers(&empty), (None, None));
        assert!(format!("{:?}", Auth::ApiKey("sk-secret".into())).contains("redacted"));
    }
}
