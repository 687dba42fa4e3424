//! keel's harness adapters: one interface over replaceable executors (docs/DESIGN.md §7).
//!
//! The crate is two halves. The vocabulary is always built: what a session is asked to do, what it
//! reports, its errors and usage, and the pure scripted model. The IO that runs sessions is the `io`
//! feature (on by default): the pure machines of keel-actors and the simulator build without it, so
//! without tokio, axum, reqwest, rustls or nix.
//!
//! - [`spec`], [`event`], [`error`], [`usage`]: plain data shared with the actor core and the
//!   simulator (no tokio needed to build or read them). [`credential`]: an account's secret, read
//!   from the variable or private file its [`Credential`] names.
//! - [`session`] (`io`): the async [`session::Harness`] trait, running sessions and cancellation.
//! - [`scripted`]: the deterministic scripted model (pure) and the in-process scripted harness (`io`).
//! - [`server`] (`io`): the scripted model served over HTTP on 127.0.0.1 for the real CLIs.
//! - [`messages_api`] (`io`): keel's own agent loop against an Anthropic-compatible endpoint.
//! - [`tools`] (`io`): the tool registry and the confined built-in tools of keel's loop.
//! - [`rfc3339`]: the UTC timestamps rate-limit reset headers use.
//! - [`stop`]: the Stop hook's report check as plain data, and the in-process seam to it.
//! - [`cli`] (`io`), [`process`] (`io`): the four CLI adapters and their process trees.

#[cfg(feature = "io")]
pub mod cli;
pub mod credential;
pub mod error;
pub mod event;
pub mod guard;
#[cfg(feature = "io")]
pub mod messages_api;
#[cfg(feature = "io")]
pub mod process;
pub mod rfc3339;
pub mod scripted;
#[cfg(feature = "io")]
pub mod server;
#[cfg(feature = "io")]
pub mod session;
pub mod spec;
pub mod stop;
#[cfg(feature = "io")]
pub mod tools;
pub mod usage;

pub use credential::CredentialError;
pub use error::{ErrorCategory, HarnessError, StartError};
pub use event::{BoundedText, BudgetKind, HarnessEvent, StopReason};
pub use guard::{
    GuardFuture, GuardedCall, HandedBack, ResultRecords, StreamResult, ToolGuard, ToolOutput,
};
#[cfg(feature = "io")]
pub use session::{CancelToken, EventSink, Harness, RunningSession, session_channel};
pub use spec::{
    Account, Credential, GateCommand, HarnessKind, McpEndpoint, PermissionMode, Provider,
    SessionLimits, SessionSpec,
};
pub use stop::{InProcessHooks, RE_ASK_MARKER, RE_ASKS_MAX, StopCheck, StopJudge};
pub use usage::{TokenCounts, UsageAccumulator, UsageReport, UsageScope};
