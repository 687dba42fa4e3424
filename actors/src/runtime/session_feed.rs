//! What every host of a specialist does with its harness session, on any node: read the session's
//! events as the specialist's inputs on the specialist's own task, and tell observers the session's
//! usage when it changes. The coordinator node's specialist role and a worker's (keel-cluster)
//! share it.

use crate::message::SpecialistInput;
use crate::specialist::Specialist;
use keel_harness::{HarnessError, HarnessEvent, RunningSession, TokenCounts};

/// A specialist's running session, held by the specialist's task ([`crate::runtime::Role::own_input`]):
/// its events become the machine's inputs in the task that runs the machine, with no forwarding
/// task and no second queue between them (one task fewer a session, one queue hop fewer an
/// event). The
/// session ends once: at its terminal event, when its events stop without one (reported as a
/// failed session), or when the holder is dropped (the task stopped, was killed or panicked), which
/// cancels a session still running rather than leave it unobserved. Each way ends the session's
/// [`SessionServices`] once.
pub struct SessionEvents {
    session: Option<RunningSession>,
    services: Option<SessionServices>,
}

/// What a host opened for one attempt's session before starting it (the hook bridge's token,
/// registered by [`crate::runtime::HarnessSet::prepare`]), ended exactly once when this drops.
/// Taken right after `prepare`, it ends them however the start goes: the harness refused the
/// session, the session ran and ended (it is handed to [`SessionEvents`]), or the specialist's
/// task was killed while the harness was still starting (the start's future dropped with it).
#[must_use = "dropping it ends the session's services at once"]
pub struct SessionServices {
    end: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl SessionServices {
    /// Services that `end` closes.
    pub fn new(end: impl FnOnce() + Send + Sync + 'static) -> Self {
        Self {
            end: Some(Box::new(end)),
        }
    }
}

impl Drop for SessionServices {
    fn drop(&mut self) {
        if let Some(end) = self.end.take() {
            end();
        }
    }
}

impl SessionEvents {
    /// Reads `session`; its `services` end once when it ends however it ends.
    pub fn new(session: RunningSession, services: SessionServices) -> Self {
        Self {
            session: Some(session),
            services: Some(services),
        }
    }

    /// The session's next event as the specialist's input; never ready once the session ended.
    ///
    /// # Cancel safety
    /// Cancel safe: an event is taken from the session's channel only in the poll that returns it.
    pub async fn next_input(&mut self) -> SpecialistInput {
        let Some(session) = self.session.as_mut() else {
            return std::future::pending().await;
        };
        let event = session.next_event().await;
        let Some(event) = event else {
            self.end(false);
            return SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system(
                "the session ended without a terminal event",
            )));
        };
        if let HarnessEvent::ToolUse {
            name, input_json, ..
        } = &event
            && tracing::enabled!(tracing::Level::DEBUG)
        {
            // Scrubbed of the built-in shapes like the row it becomes (issue 16): a debug line is a
            // way out. `keel` scrubs every log line again with the credentials it knows.
            let input = crate::context::Scrubber::new().scrub(&input_json.text).text;
            tracing::debug!(tool = %name, input = %input, "tool call");
        }
        if event.is_terminal() {
            tracing::debug!("harness session ended");
            self.end(false);
        }
        SpecialistInput::Harness(event)
    }

    /// Ends the session once: `cancel` stops one still running.
    fn end(&mut self, cancel: bool) {
        if let Some(session) = self.session.take()
            && cancel
        {
            session.cancel();
        }
        drop(self.services.take());
    }
}

impl Drop for SessionEvents {
    fn drop(&mut self) {
        // The specialist is gone: stop the session rather than run it unobserved.
        self.end(true);
    }
}

impl std::fmt::Debug for SessionEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEvents")
            .field("running", &self.session.is_some())
            .finish_non_exhaustive()
    }
}

/// What observers (the progress view, a worker's coordinator) were last told of a specialist's usage,
/// so they hear of each change once. The figures are the machine's own ([`Specialist::usage`]): the
/// harness's reports are folded in one place, and the budget and the view show the same number.
#[derive(Debug, Default)]
pub struct UsageSeen {
    told: Option<TokenCounts>,
}

impl UsageSeen {
    /// After the machine took an input: its usage and spend if they changed since the last call (a
    /// session that has reported nothing yet has nothing to tell).
    pub fn change(&mut self, specialist: &Specialist) -> Option<(TokenCounts, u64)> {
        let (tokens, spent_micros) = specialist.usage();
        let unchanged = match self.told {
            Some(told) => told == tokens,
            None => tokens == TokenCounts::default(),
        };
        if unchanged {
            return None;
        }
        self.told = Some(tokens);
        Some((tokens, spent_micros))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

    use super::*;
    use keel_harness::{HarnessKind, StopReason, session_channel};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// A holder whose `on_end` counts its calls.
    fn counted(session: RunningSession) -> (SessionEvents, Arc<AtomicU32>) {
        let ends = Arc::new(AtomicU32::new(0));
        let seen = Arc::clone(&ends);
        let events = SessionEvents::new(
            session,
            SessionServices::new(move || {
                seen.fetch_add(1, Ordering::SeqCst);
            }),
        );
        (events, ends)
    }

    fn started() -> HarnessEvent {
        HarnessEvent::Started {
            native_session_id: None,
            model: None,
        }
    }

    #[tokio::test]
    async fn events_arrive_in_order_and_the_terminal_one_ends_the_session_once() {
        let (sink, cancel, session) = session_channel(HarnessKind::Scripted);
        let (mut events, ends) = counted(session);
        assert!(sink.send(started()).await);
        assert!(
            sink.send(HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: "done".into(),
            })
            .await
        );
        let first = events.next_input().await;
        assert!(matches!(
            first,
            SpecialistInput::Harness(HarnessEvent::Started { .. })
        ));
        assert_eq!(ends.load(Ordering::SeqCst), 0);
        let second = events.next_input().await;
        assert!(matches!(
            second,
            SpecialistInput::Harness(HarnessEvent::Finished { .. })
        ));
        assert_eq!(ends.load(Ordering::SeqCst), 1);
        // Ended: nothing more comes, and dropping it neither cancels nor ends it again.
        let more = tokio::time::timeout(Duration::from_millis(20), events.next_input()).await;
        assert!(more.is_err());
        drop(events);
        assert_eq!(ends.load(Ordering::SeqCst), 1);
        assert!(!cancel.is_cancelled());
    }

    #[tokio::test]
    async fn a_session_that_stops_without_a_terminal_event_is_a_failed_session() {
        let (sink, _cancel, session) = session_channel(HarnessKind::Scripted);
        let (mut events, ends) = counted(session);
        drop(sink);
        let input = events.next_input().await;
        let SpecialistInput::Harness(HarnessEvent::Failed(error)) = input else {
            panic!("expected a failed session, got {input:?}");
        };
        assert!(
            error.message.contains("without a terminal event"),
            "{error:?}"
        );
        assert_eq!(ends.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn dropping_the_holder_of_a_running_session_cancels_it_and_ends_it_once() {
        let (sink, cancel, session) = session_channel(HarnessKind::Scripted);
        let (mut events, ends) = counted(session);
        assert!(sink.send(started()).await);
        let _ = events.next_input().await;
        drop(events);
        assert!(cancel.is_cancelled());
        assert_eq!(ends.load(Ordering::SeqCst), 1);
        // The adapter hears it too: its sink is closed.
        tokio::time::timeout(Duration::from_secs(5), sink.closed())
            .await
            .expect("the sink closes once the holder is gone");
    }
}
