//! The checkpoint writer: the only writer of progress, with group commit (DESIGN.md §4).

use crate::machine::Millis;

/// Bounds of the checkpoint writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Most ops in one commit (the store's `batch_items_max`).
    pub batch_ops_max: u32,
    /// Most stages waiting for a commit; past it a stage is refused with `PersistFailed`.
    pub queued_stages_max: u32,
    /// Most retries of a failed commit before its stages are answered with `PersistFailed`.
    pub commit_retries_max: u32,
    /// Wait before the first retry; doubles per retry.
    pub retry_backoff_ms: Millis,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            batch_ops_max: 4096,
            queued_stages_max: 4096,
            commit_retries_max: 5,
            retry_backoff_ms: 20,
        }
    }
}

/// The checkpoint writer of a coordinator node (named for its role; the store's `Checkpoint` row is
/// one of the things it writes).
#[derive(Debug)]
pub struct CheckpointWriter {
    #[allow(dead_code)]
    config: CheckpointConfig,
}
