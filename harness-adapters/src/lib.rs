//! keel's harness adapters: one interface over replaceable executors (DESIGN.md §7).
//!
//! - [`spec`], [`event`], [`error`], [`usage`]: plain data shared with the actor core and the
//!   simulator (no tokio needed to build or read them).
//! - [`session`]: the async [`session::Harness`] trait, running sessions and cancellation.

pub mod cli;
pub mod error;
pub mod event;
pub mod messages_api;
pub mod process;
pub mod rfc3339;
pub mod scripted;
pub mod server;
pub mod session;
pub mod spec;
pub mod tools;
pub mod usage;

pub use error::{ErrorCategory, HarnessError, StartError};
pub use event::{BoundedText, BudgetKind, HarnessEvent, StopReason};
pub use session::{CancelToken, EventSink, Harness, RunningSession, session_channel};
pub use spec::{
    Account, Credential, GateCommand, HarnessKind, McpEndpoint, PermissionMode, SessionLimits,
    SessionSpec,
};
pub use usage::{TokenCounts, UsageAccumulator, UsageReport, UsageScope};
