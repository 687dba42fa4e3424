//! Hosting a run's coordinator.

use super::{Node, lock};
use crate::coordinator::Coordinator;
use crate::effect::Effect;
use crate::runtime::machine_actor::{Flow, MachineRef, Role};
use keel_store::RunId;
use std::sync::Arc;
use tracing::Span;

/// Hosts a run's coordinator; stops the actor once the run is terminal.
pub(crate) struct CoordinatorRole {
    pub(crate) node: Arc<Node>,
    pub(crate) run: RunId,
    /// The run's span (see [`spans`]).
    pub(crate) span: Span,
    /// Which hosting of the run this coordinator is (see [`super::HostedRun::generation`]).
    pub(crate) generation: u64,
}

impl Role for CoordinatorRole {
    type M = Coordinator;
    type Local = ();
    type Addr = MachineRef<Coordinator>;

    fn span(&self) -> Span {
        self.span.clone()
    }

    async fn execute(
        &self,
        _me: &MachineRef<Coordinator>,
        _local: &mut (),
        effects: Vec<Effect>,
    ) -> Flow {
        self.node.execute_node(effects, Some(self.generation)).await;
        Flow::Continue
    }

    fn after(&self, machine: &Coordinator, _local: &mut ()) -> Flow {
        if machine.is_terminal() {
            Flow::Stop("run finished".into())
        } else {
            Flow::Continue
        }
    }

    fn stopped(&self, me: &MachineRef<Coordinator>, _local: &mut ()) {
        let mut map = lock(&self.node.coordinators);
        if map
            .get(&self.run)
            .is_some_and(|h| h.coordinator.get_id() == me.get_id())
        {
            map.remove(&self.run);
            lock(&self.node.run_spans).remove(&self.run);
        }
    }
}
