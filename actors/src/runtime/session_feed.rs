//! What every host of a specialist does with its harness session, on any node: stream the session's
//! events into the specialist's mailbox, and tell observers the session's usage when it changes. The
//! coordinator node's specialist role and a worker's (keel-cluster) share it.

use super::machine_actor::{Deliver, MachineRef};
use crate::message::SpecialistInput;
use crate::specialist::Specialist;
use keel_harness::{HarnessError, HarnessEvent, RunningSession, TokenCounts, UsageAccumulator};

/// Stream `session`'s events into the specialist `me` until the terminal event. A session that ends
/// without one is reported as a failed session; if the specialist is gone the session is cancelled
/// rather than left running unobserved. Spawn the future on the runtime (the caller's span around it).
pub async fn feed_session(mut session: RunningSession, me: MachineRef<Specialist>) {
    loop {
        let Some(event) = session.next_event().await else {
            let _ = me.send_message(Deliver(SpecialistInput::Harness(HarnessEvent::Failed(
                HarnessError::system("the session ended without a terminal event"),
            ))));
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
        if me
            .send_message(Deliver(SpecialistInput::Harness(event)))
            .is_err()
        {
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

/// A session's usage as observers see it (the machine folds its own copy for the budget): the
/// harness's reports folded without double counting, told once per change.
#[derive(Debug, Default)]
pub struct UsageWatch {
    usage: UsageAccumulator,
    sent: Option<TokenCounts>,
}

impl UsageWatch {
    /// Look at an input of the specialist: for a usage report that changes the total, the new total
    /// and what it costs at `micros_per_mtok` ([`crate::specialist::spend_micros`]).
    pub fn observe(
        &mut self,
        input: &SpecialistInput,
        micros_per_mtok: u64,
    ) -> Option<(TokenCounts, u64)> {
        let SpecialistInput::Harness(HarnessEvent::Usage(report)) = input else {
            return None;
        };
        self.usage.record(report);
        let tokens = self.usage.total();
        if self.sent == Some(tokens) {
            return None;
        }
        self.sent = Some(tokens);
        Some((
            tokens,
            crate::specialist::spend_micros(&tokens, micros_per_mtok),
        ))
    }
}
