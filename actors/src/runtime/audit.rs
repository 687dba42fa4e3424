//! Policy decisions made durable: the audit rows of a tool call's verdict go through the checkpoint
//! actor (the only writer) as a host stage, and the caller waits for the commit before the tool may
//! run (docs/DESIGN.md §12, invariant 12); and read back, for the gates that count from them.

use super::Runtime;
use super::node::Node;
use crate::persist::PersistOp;
use keel_store::{AuditEntry, GateMark, RunId};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How long a decision waits for its audit rows to be durable before the call is denied.
pub const AUDIT_WAIT_MS: u64 = 10_000;

/// Reads one page of a run's sequenced table: the rows after a sequence number, at most a limit.
type PageOf<T> = fn(
    &keel_store::RunScope<'_>,
    u64,
    u32,
)
    -> Result<keel_store::Listing<keel_store::Sequenced<T>>, keel_store::ReadError>;

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
    /// The rows could not be read.
    #[error("the audit rows could not be read: {0}")]
    Read(String),
}

/// Most audit rows [`AuditWriter::read_all`] reads for one run.
pub const AUDIT_ROWS_READ_MAX: usize = 1_000_000;

impl AuditWriter {
    /// Appends `entries` to `run`'s audit table as one durable commit, and returns once it is
    /// durable.
    ///
    /// # Errors
    /// [`AuditError`]: the rows may not be durable, so the call they decide must not run.
    pub async fn append(&self, run: RunId, entries: Vec<AuditEntry>) -> Result<(), AuditError> {
        self.append_with_marks(run, entries, Vec::new()).await
    }

    /// Appends `entries` and the gate `marks` they decided to `run` as one durable commit (a gate's
    /// state and the decision that changed it are never apart), and returns once it is durable.
    ///
    /// # Errors
    /// [`AuditError`]: the rows may not be durable, so the call they decide must not run.
    pub async fn append_with_marks(
        &self,
        run: RunId,
        entries: Vec<AuditEntry>,
        marks: Vec<GateMark>,
    ) -> Result<(), AuditError> {
        if entries.is_empty() && marks.is_empty() {
            return Ok(());
        }
        let node = self.node.upgrade().ok_or(AuditError::Stopped)?;
        let ops = entries
            .into_iter()
            .map(PersistOp::AppendAudit)
            .chain(marks.into_iter().map(PersistOp::AppendGateMark))
            .collect();
        node.stage_host(run, ops, Duration::from_millis(AUDIT_WAIT_MS))
            .await
            .map_err(AuditError::NotDurable)
    }

    /// Every audit row of `run`, oldest first, read on the blocking pool: what an approval counts.
    /// Reads pages of the store's row limit, at most [`AUDIT_ROWS_READ_MAX`] rows.
    ///
    /// # Errors
    /// [`AuditError::Read`].
    pub async fn read_all(&self, run: RunId) -> Result<Vec<AuditEntry>, AuditError> {
        self.read_pages(run, "audit rows", |scope, after, page| {
            scope.audit(after, page)
        })
        .await
    }

    /// Every gate mark of `run`, oldest first, read on the blocking pool: what the gates decide
    /// from. At most [`AUDIT_ROWS_READ_MAX`] marks.
    ///
    /// # Errors
    /// [`AuditError::Read`] (a gate must then deny: it cannot tell).
    pub async fn read_marks(&self, run: RunId) -> Result<Vec<GateMark>, AuditError> {
        self.read_pages(run, "gate marks", |scope, after, page| {
            scope.gate_marks(after, page)
        })
        .await
    }

    /// Every row of one of `run`'s sequenced tables, page by page, at most [`AUDIT_ROWS_READ_MAX`].
    async fn read_pages<T: Send + 'static>(
        &self,
        run: RunId,
        what: &'static str,
        page_of: PageOf<T>,
    ) -> Result<Vec<T>, AuditError> {
        let node = self.node.upgrade().ok_or(AuditError::Stopped)?;
        node.read(move |store| {
            let scope = store.run(run);
            let page = u32::try_from(store.limits().read_rows_max).unwrap_or(u32::MAX);
            let mut rows = Vec::new();
            let mut after = 0;
            loop {
                let listing = page_of(&scope, after, page)?;
                if let Some(last) = listing.items.last() {
                    after = last.seq;
                }
                rows.extend(listing.items.into_iter().map(|r| r.value));
                if !listing.more {
                    return Ok(Ok(rows));
                }
                if rows.len() >= AUDIT_ROWS_READ_MAX {
                    return Ok(Err(AuditError::Read(format!(
                        "run {run} has more than {AUDIT_ROWS_READ_MAX} {what}"
                    ))));
                }
            }
        })
        .await
        .map_err(|e| AuditError::Read(e.to_string()))?
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
