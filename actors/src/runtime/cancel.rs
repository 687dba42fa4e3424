//! Cancelling: a run hosted here (through its coordinator), a run no process hosts (through the
//! store), and killing one attempt the hard way.

use super::node::lock;
use super::{CancelError, Deliver, Runtime, wall_clock_ms};
use crate::host::decide::{self, Refusal};
use crate::ids::AttemptId;
use crate::message::{CoordinatorInput, CoordinatorMsg};
use keel_store::RunId;

impl Runtime {
    /// Cancel a run hosted here (idempotent; ignored once it is terminal). Returns whether the run
    /// is hosted here.
    pub fn cancel(&self, run: RunId, reason: &str) -> bool {
        let Some(c) = self.node.coordinator(run) else {
            return false;
        };
        c.send_message(Deliver(CoordinatorInput::Msg(CoordinatorMsg::Cancel {
            reason: reason.to_owned(),
        })))
        .is_ok()
    }

    /// Kill one attempt's actor the hard way, as a crashed worker would die: no cancel, no report.
    /// The supervisor actor sees the link break and its machine decides (restart, reroute,
    /// escalate). Returns whether the attempt was alive here.
    pub fn kill_attempt(&self, attempt: AttemptId) -> bool {
        let Some(actor) = lock(&self.node.specialists)
            .get(&attempt)
            .map(|s| s.actor.clone())
        else {
            return false;
        };
        actor.kill();
        true
    }

    /// Mark a run that no process hosts as cancelled (its row and open tasks), through the
    /// checkpoint actor.
    ///
    /// # Errors
    /// [`CancelError::Read`], [`CancelError::Refused`] (terminal, already running),
    /// [`CancelError::Write`].
    pub async fn cancel_stored(&self, run: RunId, reason: &str) -> Result<u32, CancelError> {
        if lock(&self.node.coordinators).contains_key(&run) {
            return Err(Refusal::AlreadyRunning(run).into());
        }
        let mut rows = self.recover_run(run).await?;
        let hosted = lock(&self.node.coordinators).contains_key(&run);
        let marks = decide::cancel_stored(hosted, &rows.run, &rows.tasks, reason, wall_clock_ms())?;
        let cancelled = marks.tasks;
        self.write_marks(&mut rows.run, marks).await?;
        Ok(cancelled)
    }
}
