//! keel's durable model on redb (docs/DESIGN.md §5): runs, tasks, session logs, checkpoints, the manifest,
//! dead letters, idempotency records, the audit log, escalations, agent profiles and blobs.
//!
//! # Shape
//! - Synchronous and typed: no tokio, no actors, no clock. Timestamps and ids are arguments, so the
//!   simulator replays a run byte for byte.
//! - [`Store::run`] gives a [`RunScope`], the only way to reach one run's rows: every key starts with
//!   the run id and the scope never builds a key with another one (invariant 9).
//! - [`Store::catalog`] gives the [`Catalog`], the operator's read-only, store-wide view (`keel tasks`,
//!   `keel show TASK`). Actors do not use it.
//! - Writes are staged through a scope ([`RunScope::stage_create_task`], ...) and committed by
//!   [`Store::commit_group`] in one write transaction, with the [`Durability`] passed explicitly at
//!   every commit site: the checkpoint actor makes N results from many callers durable with one fsync.
//! - Values go through [`codec`]: serde + bincode 2 behind a schema version byte.
//! - [`Limits`] bound every field; oversize input is refused with a typed error or, for attachments,
//!   stored by reference in the blob table. Nothing is truncated silently.
//! - A damaged file is a typed error naming it ([`Corruption`]), never a panic: redb's panics on a
//!   corrupt page are caught at the store's boundary (see the `guard` module).
//! - [`Store::check_integrity`], [`Store::compact`] and [`Store::backup_to`] look after the file.
//! - [`SimDisk`] is a redb storage backend that crashes and fails like a disk, for the simulator.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use keel_store::*;
//! let dir = tempfile::tempdir()?;
//! let store = Store::open(dir.path().join("keel.redb"))?;
//! let run = RunId(7);
//! let scope = store.run(run);
//! store.commit_one(scope.stage_create_run(Run {
//!     id: run, brief: "summarise the repo".into(), plan: None, status: RunStatus::Pending,
//!     budget: Budget::default(), created_ms: 1, updated_ms: 1, config_snapshot: String::new(),
//!     outcome: None,
//! })?, Durability::Immediate)?;
//! assert_eq!(scope.get()?.brief, "summarise the repo");
//! assert!(store.run(RunId(8)).get().is_err());
//! # Ok(()) }
//! ```

pub mod codec;
pub mod model;

mod batch;
mod catalog;
mod error;
mod file;
mod guard;
mod journal;
mod known;
mod limits;
mod log_segment;
mod maintenance;
mod read;
mod redaction;
mod redo;
mod scope;
mod sim_disk;
mod snapshot;
mod store;
mod tables;
mod task_state;
mod upgrade;
mod writer;

pub use batch::{Applied, StagedWrite, WriteBatch};
pub use catalog::Catalog;
pub use codec::{DecodeError, EncodeError, SCHEMA_VERSION};
pub use error::{CommitError, Error, ItemError, OpenError, ReadError, StageError};
pub use guard::{Corruption, is_storage_panic};
pub use limits::{LimitError, Limits};
pub use maintenance::{Backup, COMPACTION_PASSES_MAX, Compaction, Integrity, MaintenanceError};
pub use model::*;
pub use read::{Listing, RunPage, Sequenced, TreeNode};
pub use redaction::{Redaction, SecretKind};
pub use scope::RunScope;
pub use sim_disk::{PENDING_OPS_MAX, SimDisk, TornCrashUnavailable};
pub use store::{JOURNALED_CACHE_BYTES, STORE_FORMAT, Sharing, Store, StoreConfig};

/// Whether a commit is durable when it returns (`Immediate`: one fsync) or only visible
/// (`None`: lost on a crash unless a later `Immediate` commit follows). Re-exported from redb so
/// callers need not depend on it; always passed explicitly.
pub use redb::Durability;
