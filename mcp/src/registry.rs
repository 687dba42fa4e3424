//! The open sessions of one endpoint: token to attempt, and the calls waiting for their answers.

use dashmap::DashMap;
use keel_actors::AttemptId;
use keel_actors::session_tool::{
    DeliverToolCall, SessionAnswer, SessionRequest, SessionToolCall, ToolRefusal,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// Bytes of randomness in a token (hex-encoded, so a token is twice as many characters).
pub const TOKEN_BYTES: usize = 32;
/// Most sessions open at once on one endpoint; past it `open` is refused.
pub const SESSIONS_OPEN_MAX: usize = 65_536;
/// Most calls of one session waiting at once; past it a call is refused.
pub const CALLS_WAITING_PER_SESSION_MAX: usize = 64;

/// No token could be minted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The operating system gave no randomness.
    #[error("no randomness for a token: {0}")]
    Entropy(String),
    /// Too many sessions are open.
    #[error("{SESSIONS_OPEN_MAX} sessions are open already")]
    Full,
}

/// One open session.
struct OpenSession {
    attempt: AttemptId,
    deliver: DeliverToolCall,
    next_call: AtomicU64,
    waiting: AtomicU64,
}

/// Every open session of an endpoint, keyed by its token and by its attempt, and every call waiting
/// for its answer. Lock-free maps (dashmap): the HTTP handlers and the runtime's actors use it at
/// once.
#[derive(Default)]
pub struct SessionRegistry {
    by_token: DashMap<String, Arc<OpenSession>>,
    by_attempt: DashMap<AttemptId, String>,
    waiting: DashMap<(AttemptId, String), oneshot::Sender<SessionAnswer>>,
}

impl std::fmt::Debug for SessionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the tokens.
        f.debug_struct("SessionRegistry")
            .field("open", &self.by_attempt.len())
            .field("waiting", &self.waiting.len())
            .finish()
    }
}

impl SessionRegistry {
    /// Mints a token for `attempt` (replacing the one it had).
    ///
    /// # Errors
    /// [`TokenError`] when the OS gives no randomness or too many sessions are open.
    pub fn open(&self, attempt: AttemptId, deliver: DeliverToolCall) -> Result<String, TokenError> {
        if self.by_attempt.len() >= SESSIONS_OPEN_MAX && !self.by_attempt.contains_key(&attempt) {
            return Err(TokenError::Full);
        }
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| TokenError::Entropy(e.to_string()))?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        self.close(attempt);
        let session = OpenSession {
            attempt,
            deliver,
            next_call: AtomicU64::new(1),
            waiting: AtomicU64::new(0),
        };
        self.by_token.insert(token.clone(), Arc::new(session));
        self.by_attempt.insert(attempt, token.clone());
        Ok(token)
    }

    /// Revokes the attempt's token; its waiting calls are answered as ended. Idempotent.
    pub fn close(&self, attempt: AttemptId) {
        if let Some((_, token)) = self.by_attempt.remove(&attempt) {
            self.by_token.remove(&token);
        }
        // Dropping a waiting call's sender wakes it with "ended".
        self.waiting.retain(|(a, _), _| *a != attempt);
    }

    /// The attempt a live token belongs to.
    pub fn attempt_of(&self, token: &str) -> Option<AttemptId> {
        self.by_token.get(token).map(|s| s.attempt)
    }

    /// How many sessions are open.
    pub fn open_count(&self) -> usize {
        self.by_attempt.len()
    }

    /// Hands an answer to the call waiting for it; an answer nobody waits for is dropped.
    pub fn answer(&self, attempt: AttemptId, call_id: &str, answer: SessionAnswer) {
        if let Some((_, tx)) = self.waiting.remove(&(attempt, call_id.to_owned())) {
            let _ = tx.send(answer);
        }
    }

    /// Runs one call of the session holding `token`: delivered to its specialist, answered within
    /// `timeout`. A revoked token, a gone specialist and a timeout are typed refusals.
    pub async fn call(
        &self,
        token: &str,
        request: SessionRequest,
        timeout: Duration,
    ) -> Result<SessionAnswer, CallError> {
        let Some(session) = self.by_token.get(token).map(|s| Arc::clone(&s)) else {
            return Err(CallError::Revoked);
        };
        let attempt = session.attempt;
        if session.waiting.fetch_add(1, Ordering::AcqRel) >= CALLS_WAITING_PER_SESSION_MAX as u64 {
            session.waiting.fetch_sub(1, Ordering::AcqRel);
            return Ok(SessionAnswer::Refused(ToolRefusal::OverLimit {
                limit: format!("{CALLS_WAITING_PER_SESSION_MAX} calls waiting at once"),
            }));
        }
        let _count = WaitingCount(&session.waiting);
        let call_id = format!("call-{}", session.next_call.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        self.waiting.insert((attempt, call_id.clone()), tx);
        // Closed between the lookup and now: the close did not see this call, so refuse it here.
        if !self.by_token.contains_key(token) {
            self.waiting.remove(&(attempt, call_id));
            return Err(CallError::Revoked);
        }
        let delivered = (session.deliver)(SessionToolCall {
            call_id: call_id.clone(),
            request,
        });
        if !delivered {
            self.waiting.remove(&(attempt, call_id));
            return Ok(SessionAnswer::Refused(ToolRefusal::SessionEnded));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Ok(SessionAnswer::Refused(ToolRefusal::SessionEnded)),
            Err(_) => {
                self.waiting.remove(&(attempt, call_id));
                Err(CallError::TimedOut(timeout))
            }
        }
    }
}

/// Decrements a session's waiting count when its call ends, however it ends.
struct WaitingCount<'a>(&'a AtomicU64);

impl Drop for WaitingCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a call got no answer from keel.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The token is not (or no longer) valid.
    #[error("the session's token is not valid (unknown, or the session ended)")]
    Revoked,
    /// No answer came in time; the call may still be done (its answer is then dropped).
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}
