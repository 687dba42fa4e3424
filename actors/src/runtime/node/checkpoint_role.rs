//! Hosting the checkpoint writer, the only writer of the store.

use super::Node;
use crate::checkpoint::CheckpointWriter;
use crate::effect::Effect;
use crate::runtime::machine_actor::{Flow, MachineRef, Role};
use std::sync::Arc;

/// Hosts the checkpoint writer: the only writer of the store.
pub(crate) struct CheckpointRole {
    pub(crate) node: Arc<Node>,
}

impl Role for CheckpointRole {
    type M = CheckpointWriter;
    type Local = ();
    type Addr = MachineRef<CheckpointWriter>;

    async fn execute(
        &self,
        _me: &MachineRef<CheckpointWriter>,
        _local: &mut (),
        effects: Vec<Effect>,
    ) -> Flow {
        self.node.execute_node(effects, None).await;
        Flow::Continue
    }
}
