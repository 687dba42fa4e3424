//! Typed failures of a harness session, shared by every adapter.
//!
//! The supervisor decides restart, reroute or escalation from these fields alone (docs/DESIGN.md §4), so
//! every adapter maps its harness's failure into the same categories instead of passing text along.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a session failed, at the granularity the supervisor acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCategory {
    /// A passing fault (5xx, overload, dropped connection, malformed stream): retry, maybe elsewhere.
    Transient,
    /// The account hit a rate or usage limit; `reset_at_unix_ms` says when it lifts, if known.
    RateLimited {
        /// Wall-clock time (Unix epoch, milliseconds) at which the limit resets, when the harness or
        /// endpoint said so.
        reset_at_unix_ms: Option<u64>,
    },
    /// The request itself is wrong for the endpoint (400, refused content, bad tool input): retrying
    /// the same thing gives the same answer.
    BusinessRule,
    /// A policy, sandbox or hook refused an action.
    Permission,
    /// Credentials are missing, wrong or expired.
    Auth,
    /// The conversation no longer fits the model's context window.
    ContextOverflow,
    /// keel or the harness broke (spawn failure, crash, protocol violation, unexpected exit).
    System,
    /// The caller cancelled the session; reported so a cancel is never mistaken for success.
    Cancelled,
}

impl ErrorCategory {
    /// The stable snake_case name used in logs and the store.
    pub fn name(&self) -> &'static str {
        match self {
            ErrorCategory::Transient => "transient",
            ErrorCategory::RateLimited { .. } => "rate_limited",
            ErrorCategory::BusinessRule => "business_rule",
            ErrorCategory::Permission => "permission",
            ErrorCategory::Auth => "auth",
            ErrorCategory::ContextOverflow => "context_overflow",
            ErrorCategory::System => "system",
            ErrorCategory::Cancelled => "cancelled",
        }
    }

    /// Whether a retry of the same request can succeed by itself; the default for `retryable`.
    pub fn retryable_by_default(&self) -> bool {
        matches!(
            self,
            ErrorCategory::Transient | ErrorCategory::RateLimited { .. }
        )
    }
}

impl fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Bound on the message kept in a [`HarnessError`], so a harness dumping a huge body cannot bloat the
/// store or a cluster message.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4096;

/// A typed session failure: what kind, whether a retry may help, and after how long.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[error("{category}: {message}")]
pub struct HarnessError {
    /// What kind of failure this is.
    pub category: ErrorCategory,
    /// Whether the same request may succeed if retried (possibly after `retry_after_ms`).
    pub retryable: bool,
    /// How long to wait before retrying, when the endpoint or harness said so.
    pub retry_after_ms: Option<u64>,
    /// Human-readable detail, bounded by [`ERROR_MESSAGE_BYTES_MAX`].
    pub message: String,
}

impl HarnessError {
    /// A failure with the category's default retryability.
    pub fn new(category: ErrorCategory, message: impl Into<String>) -> Self {
        HarnessError {
            retryable: category.retryable_by_default(),
            category,
            retry_after_ms: None,
            message: truncate_to(message.into(), ERROR_MESSAGE_BYTES_MAX),
        }
    }

    /// A passing fault worth retrying.
    pub fn transient(message: impl Into<String>) -> Self {
        HarnessError::new(ErrorCategory::Transient, message)
    }

    /// A rate or usage limit, with the reset time and retry delay when known.
    pub fn rate_limited(
        message: impl Into<String>,
        reset_at_unix_ms: Option<u64>,
        retry_after_ms: Option<u64>,
    ) -> Self {
        HarnessError::new(ErrorCategory::RateLimited { reset_at_unix_ms }, message)
            .with_retry_after_ms(retry_after_ms)
    }

    /// keel or the harness broke.
    pub fn system(message: impl Into<String>) -> Self {
        HarnessError::new(ErrorCategory::System, message)
    }

    /// The caller cancelled the session.
    pub fn cancelled() -> Self {
        HarnessError::new(ErrorCategory::Cancelled, "session cancelled")
    }

    /// Sets the retry delay.
    pub fn with_retry_after_ms(mut self, retry_after_ms: Option<u64>) -> Self {
        self.retry_after_ms = retry_after_ms;
        self
    }

    /// Overrides retryability (e.g. a 500 after the attempt cap is no longer worth retrying here).
    pub fn with_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }

    /// Maps an HTTP status from a model endpoint to a category, the one place this mapping lives so
    /// the native loop and the CLI adapters agree.
    pub fn from_http_status(
        status: u16,
        message: impl Into<String>,
        retry_after_ms: Option<u64>,
        reset_at_unix_ms: Option<u64>,
    ) -> Self {
        let message = message.into();
        match status {
            429 => HarnessError::rate_limited(message, reset_at_unix_ms, retry_after_ms),
            401 => HarnessError::new(ErrorCategory::Auth, message),
            403 => HarnessError::new(ErrorCategory::Permission, message),
            408 | 409 | 500..=599 => {
                HarnessError::transient(message).with_retry_after_ms(retry_after_ms)
            }
            413 => HarnessError::new(ErrorCategory::ContextOverflow, message),
            400..=499 => {
                if looks_like_context_overflow(&message) {
                    HarnessError::new(ErrorCategory::ContextOverflow, message)
                } else {
                    HarnessError::new(ErrorCategory::BusinessRule, message)
                }
            }
            _ => HarnessError::system(format!("unexpected HTTP status {status}: {message}")),
        }
    }
}

/// Heuristic used only for 4xx bodies: endpoints report an overlong prompt as a plain 400.
fn looks_like_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("prompt is too long")
        || m.contains("context window")
        || m.contains("context_length_exceeded")
}

/// Why a session could not start. Separate from [`HarnessError`] because nothing ran: the caller can
/// fix the spec or the installation and start again without any cleanup.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The spec breaks a precondition (see [`crate::spec::SessionSpec::validate`]).
    #[error("invalid session spec: {0}")]
    InvalidSpec(String),
    /// The harness binary or endpoint is not available.
    #[error("harness unavailable: {0}")]
    Unavailable(String),
    /// Credentials the spec names are missing.
    #[error("missing credential: {0}")]
    MissingCredential(String),
    /// Preparing the session (config dir, process spawn) failed.
    #[error("could not prepare the session: {0}")]
    Io(#[from] std::io::Error),
}

/// Cuts `text` to at most `bytes_max` bytes on a char boundary; shared by every bounded field.
pub fn truncate_to(mut text: String, bytes_max: usize) -> String {
    if text.len() > bytes_max {
        let mut cut = bytes_max;
        while cut > 0 && !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_status_mapping() {
        let e = HarnessError::from_http_status(429, "slow down", Some(1000), Some(5));
        assert_eq!(
            e.category,
            ErrorCategory::RateLimited {
                reset_at_unix_ms: Some(5)
            }
        );
        assert!(e.retryable);
        assert_eq!(e.retry_after_ms, Some(1000));
        assert_eq!(
            HarnessError::from_http_status(529, "x", None, None).category,
            ErrorCategory::Transient
        );
        assert_eq!(
            HarnessError::from_http_status(401, "x", None, None).category,
            ErrorCategory::Auth
        );
        let e =
            HarnessError::from_http_status(400, "prompt is too long: 300000 tokens", None, None);
        assert_eq!(e.category, ErrorCategory::ContextOverflow);
        assert!(!e.retryable);
        assert_eq!(
            HarnessError::from_http_status(400, "bad", None, None).category,
            ErrorCategory::BusinessRule
        );
    }

    #[test]
    fn messages_are_bounded_on_char_boundaries() {
        let e = HarnessError::system("é".repeat(ERROR_MESSAGE_BYTES_MAX));
        assert!(e.message.len() <= ERROR_MESSAGE_BYTES_MAX);
        assert!(e.message.chars().all(|c| c == 'é'));
    }
}
