//! The `Harness` interface: start a session, read its events, cancel it.
//!
//! Events flow through a bounded channel so a slow consumer slows the harness down instead of
//! growing memory without limit. Cancellation is a shared token the adapter watches; every adapter
//! must turn a cancel into a terminal event within a bounded time (graceful stop, then kill).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::error::{HarnessError, StartError};
use crate::event::HarnessEvent;
use crate::spec::{HarnessKind, SessionSpec};

/// How many events may wait in a session's channel before the producer waits for the consumer.
pub const EVENT_CHANNEL_CAPACITY: usize = 256;

/// A boxed, sendable future; lets `Harness` be used as `dyn Harness` without a macro crate.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A replaceable executor of coding sessions (docs/DESIGN.md §7). Implementations: the four CLI adapters,
/// the native Messages-API loop and the scripted model.
pub trait Harness: Send + Sync {
    /// Which executor this is, for logs and the store.
    fn kind(&self) -> HarnessKind;

    /// Starts one session. Returns once the session is running (or could not start); the session's
    /// own failures arrive later as a [`HarnessEvent::Failed`].
    ///
    /// # Errors
    /// [`StartError`] when nothing could be started (bad spec, missing binary or credential).
    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>>;
}

/// A cancellation signal shared between the session's owner and the adapter running it.
#[derive(Debug, Clone)]
pub struct CancelToken {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for CancelToken {
    fn default() -> Self {
        CancelToken::new()
    }
}

impl CancelToken {
    /// A fresh, uncancelled token.
    pub fn new() -> Self {
        let (tx, _rx) = watch::channel(false);
        CancelToken { tx: Arc::new(tx) }
    }

    /// Requests cancellation. Idempotent.
    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }

    /// Whether cancellation was requested.
    pub fn is_cancelled(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once cancellation is requested (at once if it already was).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future loses nothing.
    pub async fn cancelled(&self) {
        let mut rx = self.tx.subscribe();
        // An error means the sender is gone, which cannot happen while `self` holds it.
        let _ = rx.wait_for(|cancelled| *cancelled).await;
    }
}

/// How long a terminal event may wait for room in a full channel before it is dropped (the consumer
/// then sees the channel close without one, which [`RunningSession::collect`] reports as a failure).
pub const TERMINAL_SEND_WAIT_MS: u64 = 5_000;

/// The producer side of a session's event channel, held by the adapter.
#[derive(Debug, Clone)]
pub struct EventSink {
    tx: mpsc::Sender<HarnessEvent>,
    cancel: CancelToken,
}

impl EventSink {
    /// Sends one event, waiting while the channel is full. Returns `false` when the consumer is gone,
    /// or when the session is cancelled while the channel is full (so a consumer that stopped
    /// reading cannot hold the adapter forever); the adapter should then wind down.
    pub async fn send(&self, event: HarnessEvent) -> bool {
        tokio::select! {
            biased;
            sent = self.tx.send(event) => sent.is_ok(),
            _ = self.cancel.cancelled() => false,
        }
    }

    /// Completes when the consumer has dropped its [`RunningSession`]: an adapter treats that as a
    /// cancel, so abandoned sessions stop their processes instead of running to their budgets.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Sends the session's terminal event, waiting at most [`TERMINAL_SEND_WAIT_MS`] for room even
    /// after a cancel, so the consumer learns how the session ended whenever it can.
    pub async fn send_terminal(&self, event: HarnessEvent) -> bool {
        matches!(
            tokio::time::timeout(
                Duration::from_millis(TERMINAL_SEND_WAIT_MS),
                self.tx.send(event)
            )
            .await,
            Ok(Ok(()))
        )
    }
}

/// A started session: its events and its cancel switch.
#[derive(Debug)]
pub struct RunningSession {
    kind: HarnessKind,
    events: mpsc::Receiver<HarnessEvent>,
    cancel: CancelToken,
}

/// Creates the channel and token for a new session: the adapter keeps the sink and a clone of the
/// token, and returns the `RunningSession` to the caller.
pub fn session_channel(kind: HarnessKind) -> (EventSink, CancelToken, RunningSession) {
    let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
    let cancel = CancelToken::new();
    let session = RunningSession {
        kind,
        events: rx,
        cancel: cancel.clone(),
    };
    (
        EventSink {
            tx,
            cancel: cancel.clone(),
        },
        cancel,
        session,
    )
}

impl RunningSession {
    /// Which executor runs this session.
    pub fn kind(&self) -> HarnessKind {
        self.kind
    }

    /// The next event, or `None` once the adapter has finished and dropped its sink.
    ///
    /// # Cancel safety
    /// Cancel safe (an `mpsc::Receiver::recv`).
    pub async fn next_event(&mut self) -> Option<HarnessEvent> {
        self.events.recv().await
    }

    /// Requests cancellation; the adapter ends the session with a terminal event shortly after.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// A clone of the cancel token, e.g. for a supervisor timer.
    pub fn cancel_token(&self) -> CancelToken {
        self.cancel.clone()
    }

    /// Reads events until the terminal one (or the channel closes), waiting at most `wait_max`
    /// overall; on timeout it cancels the session, waits up to `wait_max` again for the adapter to
    /// wind down, and returns what arrived with a `Failed(system)` appended if no terminal event came.
    /// Never waits forever.
    pub async fn collect(mut self, wait_max: Duration) -> Vec<HarnessEvent> {
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + wait_max;
        let mut cancelled = false;
        let mut deadline_now = deadline;
        loop {
            match tokio::time::timeout_at(deadline_now, self.events.recv()).await {
                Ok(Some(event)) => {
                    let terminal = event.is_terminal();
                    events.push(event);
                    if terminal {
                        return events;
                    }
                }
                Ok(None) => break,
                Err(_elapsed) if !cancelled => {
                    self.cancel.cancel();
                    cancelled = true;
                    deadline_now = tokio::time::Instant::now() + wait_max;
                }
                Err(_elapsed) => break,
            }
        }
        if !events.last().is_some_and(HarnessEvent::is_terminal) {
            events.push(HarnessEvent::Failed(HarnessError::system(
                "session ended without a terminal event (timed out or the adapter stopped)",
            )));
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::StopReason;

    #[tokio::test]
    async fn cancel_token_wakes_waiters() {
        let token = CancelToken::new();
        let waiter = token.clone();
        let handle = tokio::spawn(async move { waiter.cancelled().await });
        assert!(!token.is_cancelled());
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), handle)
            .await
            .unwrap()
            .unwrap();
        assert!(token.is_cancelled());
        // Already cancelled: returns at once.
        token.cancelled().await;
    }

    #[tokio::test]
    async fn collect_stops_at_the_terminal_event() {
        let (sink, _cancel, session) = session_channel(HarnessKind::Scripted);
        tokio::spawn(async move {
            sink.send(HarnessEvent::Text { text: "hi".into() }).await;
            sink.send(HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: "hi".into(),
            })
            .await;
            sink.send(HarnessEvent::Text {
                text: "after".into(),
            })
            .await;
        });
        let events = session.collect(Duration::from_secs(5)).await;
        assert_eq!(events.len(), 2);
        assert!(events[1].is_terminal());
    }

    #[tokio::test]
    async fn collect_is_bounded_when_an_adapter_hangs() {
        let (sink, cancel, session) = session_channel(HarnessKind::Scripted);
        let hold = tokio::spawn(async move {
            cancel.cancelled().await;
            // A well-behaved adapter ends with a terminal event after the cancel.
            sink.send(HarnessEvent::Failed(HarnessError::cancelled()))
                .await;
        });
        let events = session.collect(Duration::from_millis(50)).await;
        assert!(
            matches!(events.last(), Some(HarnessEvent::Failed(e)) if e.category == crate::error::ErrorCategory::Cancelled)
        );
        hold.await.unwrap();
    }

    #[tokio::test]
    async fn a_full_channel_does_not_hold_a_cancelled_adapter() {
        let (sink, cancel, session) = session_channel(HarnessKind::Scripted);
        for _ in 0..EVENT_CHANNEL_CAPACITY {
            assert!(sink.send(HarnessEvent::Text { text: "x".into() }).await);
        }
        cancel.cancel();
        let blocked = tokio::time::timeout(
            Duration::from_secs(5),
            sink.send(HarnessEvent::Text { text: "y".into() }),
        )
        .await;
        assert_eq!(blocked, Ok(false));
        drop(session);
        assert!(
            !sink
                .send_terminal(HarnessEvent::Failed(HarnessError::cancelled()))
                .await
        );
    }
}
