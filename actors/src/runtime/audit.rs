//! Policy decisions made durable: the audit rows of a tool call's verdict go through the checkpoint
//! actor (the only writer) as a host stage, and the caller waits for the commit before the tool may
//! run (docs/DESIGN.md §12, invariant 12).

use super::Runtime;
use super::node::Node;
use crate::persist::PersistOp;
use keel_store::{AuditEntry, RunId};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long a decision waits for its audit rows to be durable before the call is denied.
pub const AUDIT_WAIT_MS: u64 = 10_000;

/// A handle that appends audit rows to a run durably. It holds the node weakly: once the runtime is
/// gone every append fails, and a caller deciding a tool call then denies it.
#[derive(Clone, Debug)]
pub struct AuditWriter {
    node: Weak<Node>,
}

/// Why audit rows are not durable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    /// The runtime has stopped.
    #[error("the runtime has stopped")]
    Stopped,
    /// The commit failed or did not answer in time.
    #[error("the audit rows were not made durable: {0}")]
    NotDurable(String),
}

impl AuditWriter {
    /// Appends `entries` to `run`'s audit table as one durable commit, and returns once it is
    /// durable.
    ///
    /// # Errors
    /// [`AuditError`]: the rows may not be durable, so the call they decide must not run.
    pub async fn append(&self, run: RunId, entries: Vec<AuditEntry>) -> Result<(), AuditError> {
        let node = self.node.upgrade().ok_or(AuditError::Stopped)?;
        let ops = entries.into_iter().map(PersistOp::AppendAudit).collect();
        node.stage_host(run, ops, Duration::from_millis(AUDIT_WAIT_MS))
            .await
            .map_err(AuditError::NotDurable)
    }
}

impl Runtime {
    /// A handle for appending audit rows durably (the policy's decisions).
    pub fn audit_writer(&self) -> AuditWriter {
        AuditWriter {
            node: Arc::downgrade(&self.node),
        }
    }
}
