//! keel's harness adapters: one interface over replaceable executors (DESIGN.md §7).
//!
//! - [`spec`], [`event`], [`error`], [`usage`]: plain data shared with the actor core and the
//!   simulator (no tokio needed to build or read them).
//! - [`session`]: the async [`session::Harness`] trait, running sessions and cancellation.
//! - [`scripted`]: the deterministic scripted model (pure) and the in-process scripted harness.
//! - [`server`]: the scripted model served over HTTP on 127.0.0.1 for the real CLIs.
//! - [`messages_api`]: keel's own agent loop against an Anthropic-compatible endpoint.
//! - [`tools`]: the tool registry and the confined built-in tools of keel's loop.
//! - [`rfc3339`]: the UTC timestamps rate-limit reset headers use.

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
