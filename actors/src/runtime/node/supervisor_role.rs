//! Hosting the supervisor, and telling it of a specialist's end.

use super::{EXIT_REASON, Node, lock};
use crate::effect::{Effect, Envelope};
use crate::ids::AttemptId;
use crate::message::{CoordinatorMsg, SupervisorMsg};
use crate::runtime::machine_actor::{Flow, MachineRef, Role};
use crate::runtime::task_host::{HostedEnd, SpecialistInbox};
use crate::supervisor::Supervisor;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Hosts the supervisor. Specialists are not its ractor children: their tasks report their ends
/// ([`Node::specialist_ended`]).
pub(crate) struct SupervisorRole {
    pub(crate) node: Arc<Node>,
}

impl Role for SupervisorRole {
    type M = Supervisor;
    type Local = ();
    type Addr = MachineRef<Supervisor>;

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
}

impl Node {
    /// A specialist's task ended (`me` is its address): it leaves the live table (its session, if
    /// one still runs, is cancelled: a kill or a panic skips the role's own cleanup), and unless its
    /// machine ended it, or the node is pausing (the attempt is left for recovery), the supervisor
    /// machine hears `SpecialistDown` and decides (restart, reroute, escalate). A panic counts
    /// against the harness.
    pub(crate) fn specialist_ended(
        &self,
        attempt: AttemptId,
        me: &SpecialistInbox,
        end: HostedEnd,
    ) {
        {
            let mut live = lock(&self.specialists);
            if live.get(&attempt).is_some_and(|s| s.inbox.same(me))
                && let Some(gone) = live.remove(&attempt)
                && let Some(cancel) = gone.cancel
            {
                cancel.cancel();
            }
        }
        let reason = end.reason();
        if reason == EXIT_REASON || self.pausing.load(Ordering::Acquire) {
            // A normal exit follows a settle; during a pause the attempt is left for recovery.
            return;
        }
        if end.panicked() {
            tracing::warn!(%attempt, %reason, "a specialist panicked");
        }
        self.route(Envelope::Supervisor(SupervisorMsg::SpecialistDown {
            attempt,
            reason,
            panicked: end.panicked(),
        }));
    }
}
