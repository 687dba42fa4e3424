//! The scripted model: a deterministic stand-in for a real model, so every adapter can be tested on
//! a machine with no model access (DESIGN.md §7, §11).
//!
//! - [`script`]: the serde script format (JSON or TOML).
//! - [`request`]: a wire-independent view of a request.
//! - [`model`]: the pure model (no IO, no tokio), usable from the simulator.
//!
//! The HTTP server in [`crate::server`] serves this model to real CLIs.

pub mod model;
pub mod request;
pub mod script;

pub use model::{Answer, ModelReply, PlannedToolCall, ScriptedModel};
pub use request::{ModelRequest, OfferedTool, OfferedToolKind, ToolResultSeen, WireApi};
pub use script::{Script, ScriptError, ScriptFailure, ScriptToolCall, ScriptTurn, ScriptUsage};
