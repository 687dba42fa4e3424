//! What every host of a specialist does with its harness session, on any node: stream the session's
//! events into the specialist's mailbox, and tell observers the session's usage when it changes. The
//! coordinator node's specialist role and a worker's (keel-cluster) share it.

use super::task_host::SpecialistInbox;
use crate::message::SpecialistInput;
use crate::specialist::Specialist;
use keel_harness::{HarnessError, HarnessEvent, RunningSession, TokenCounts};

/// Stream `session`'s events into the specialist `me` until the terminal event. A session that ends
/// without one is reported as a failed session; if the specialist is gone the session is cancelled
/// rather than left running unobserved. Spawn the future on the runtime (the caller's span around it).
pub async fn feed_session(mut session: RunningSession, me: SpecialistInbox) {
    loop {
        let Some(event) = session.next_event().await else {
            me.send(SpecialistInput::Harness(HarnessEvent::Failed(
                HarnessError::system("the session ended without a terminal event"),
            )));
            return;
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
        let terminal = event.is_terminal();
        if !me.send(SpecialistInput::Harness(event)) {
            // The specialist is gone: stop the session rather than run it unobserved.
            session.cancel();
            return;
        }
        if terminal {
            tracing::debug!("harness session ended");
            return;
        }
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
