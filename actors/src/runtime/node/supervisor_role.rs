//! Hosting the supervisor, whose linked children are the specialists.

use super::{EXIT_REASON, Node, lock};
use crate::effect::{Effect, Envelope};
use crate::message::{CoordinatorMsg, SupervisorInput, SupervisorMsg};
use crate::runtime::machine_actor::{Flow, MachineRef, Role};
use crate::supervisor::Supervisor;
use ractor::SupervisionEvent;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Hosts the supervisor: its linked children are the specialists, whose ends become
/// `SpecialistDown` inputs.
pub(crate) struct SupervisorRole {
    pub(crate) node: Arc<Node>,
}

impl Role for SupervisorRole {
    type M = Supervisor;
    type Local = ();

    async fn execute(
        &self,
        _me: &MachineRef<Supervisor>,
        _local: &mut (),
        effects: Vec<Effect>,
    ) -> Flow {
        if let Some(observer) = &self.node.config.observer {
            for effect in &effects {
                if let Effect::Send(Envelope::Coordinator {
                    msg:
                        CoordinatorMsg::Admission {
                            answer: Err(refusal),
                            ..
                        },
                    ..
                }) = effect
                {
                    observer.spawn_refused(crate::runtime::refusal_reason(refusal));
                }
            }
        }
        self.node.execute_node(effects, None).await;
        Flow::Continue
    }

    fn supervision(&self, event: &SupervisionEvent, _local: &mut ()) -> Option<SupervisorInput> {
        let (id, reason, panicked) = match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell.get_id(),
                reason.clone().unwrap_or_else(|| "stopped".into()),
                false,
            ),
            SupervisionEvent::ActorFailed(cell, error) => {
                (cell.get_id(), format!("failed: {error}"), true)
            }
            _ => return None,
        };
        let attempt = lock(&self.node.by_actor).remove(&id)?;
        {
            let mut live = lock(&self.node.specialists);
            if live.get(&attempt).is_some_and(|s| s.actor.get_id() == id)
                && let Some(gone) = live.remove(&attempt)
                && let Some(cancel) = gone.cancel
            {
                cancel.cancel();
            }
        }
        if reason == EXIT_REASON || self.node.pausing.load(Ordering::Acquire) {
            // A normal exit follows a settle; during a pause the attempt is left for recovery.
            return None;
        }
        Some(SupervisorInput::Msg(SupervisorMsg::SpecialistDown {
            attempt,
            reason,
            panicked,
        }))
    }
}
