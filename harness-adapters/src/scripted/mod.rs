//! The scripted model: a deterministic stand-in for a real model, so every adapter can be tested on
//! a machine with no model access (docs/DESIGN.md §7, §11).
//!
//! - [`script`]: the serde script format (JSON or TOML).
//! - [`request`]: a wire-independent view of a request.
//! - [`model`]: the pure model (no IO, no tokio), usable from the simulator.
//! - `harness`: the model as a `Harness`, running keel's loop in process (`io` feature).
//!
//! The HTTP server in [`crate::server`] serves this model to real CLIs.

#[cfg(feature = "io")]
pub mod harness;
pub mod model;
pub mod request;
pub mod script;

#[cfg(feature = "io")]
pub use harness::{InProcessTransport, ScriptedHarness};
pub use model::{Answer, ModelReply, PlannedToolCall, ScriptedModel};
pub use request::{ModelRequest, OfferedTool, OfferedToolKind, ToolResultSeen, WireApi};
pub use script::{
    KeyFailure, Script, ScriptError, ScriptFailure, ScriptToolCall, ScriptTurn, ScriptUsage,
};
