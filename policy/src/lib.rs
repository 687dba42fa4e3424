//! keel-policy: what must always hold, enforced in code rather than asked of the model
//! (docs/DESIGN.md §9).
//!
//! - [`chain`]: the permission chain, hooks → deny rules → ask rules → the permission mode → allow
//!   rules, as one pure function ([`Policy::decide`]) whose verdict carries its audit rows.
//! - [`hook`]: hook events, matchers and actions; [`rule`]: `Tool(pattern)` rules; [`call`]: a tool
//!   call as the policy sees it.
//! - [`gate`]: gates on an allowed call from what the store holds (the counting gate).
//! - [`config`]: `[[hooks]]`, `[permissions]` and `[[gates]]` of keel.toml, validated with errors naming the field.
//! - `run` (feature `io`): running a command hook with its timeout, failing closed.
//!
//! Without the `io` feature the crate reads no clock, spawns nothing and does no IO.

pub mod call;
pub mod chain;
pub mod config;
pub mod gate;
pub mod hook;
pub mod rule;
#[cfg(feature = "io")]
pub mod run;

pub use call::ToolCall;
pub use chain::{AuditLine, Decision, HookOutcome, HookResult, Policy, Unmatched, Verdict, link};
pub use config::{
    GateConfig, GateKind, HookConfig, MatcherConfig, PermissionsConfig, PolicyConfig,
    PolicyConfigError,
};
pub use gate::{CountGate, GateScope, apply_gates};
pub use hook::{BuiltinHook, HookAction, HookEvent, HookSpec, ToolMatcher};
pub use rule::{Rule, RuleError};
