//! keel-policy: what must always hold, enforced in code rather than asked of the model
//! (docs/DESIGN.md §9).
//!
//! - [`chain`]: the permission chain, hooks → deny rules → ask rules → the permission mode → allow
//!   rules, as one pure function ([`Policy::decide`]) whose verdict carries its audit rows.
//! - [`hook`]: hook events, matchers and actions; [`rule`]: `Tool(pattern)` rules; [`call`]: a tool
//!   call as the policy sees it.
//! - [`gate`]: gates on an allowed call from the run's gate ledger in the store (count,
//!   prerequisite, token, cap).
//! - [`ledger`]: a run's gate ledger indexed by gate and task, what the gates read.
//! - [`event`]: session events (`SubagentStart`, `SubagentStop`, `PreCompact`): veto or annotate.
//! - [`config`]: `[[hooks]]`, `[permissions]` and `[[gates]]` of keel.toml, validated with errors naming the field.
//! - `run` (feature `io`): running a command hook with its timeout, failing closed.
//!
//! Without the `io` feature the crate reads no clock, spawns nothing and does no IO.

pub mod agent;
pub mod call;
pub mod chain;
pub mod config;
pub mod event;
pub mod gate;
pub mod hook;
pub mod ledger;
pub mod post;
pub mod rule;
#[cfg(feature = "io")]
pub mod run;

pub use agent::{AgentRules, Caller};
pub use call::ToolCall;
pub use chain::{
    AuditLine, Decision, HookOutcome, HookResult, Policy, Unmatched, Verdict, audit_rows, link,
};
pub use config::{
    AgentRulesConfig, GateConfig, GateKind, HookConfig, MatcherConfig, PermissionsConfig,
    PolicyConfig, PolicyConfigError, RuleListsConfig,
};
pub use event::{EventOutcome, EventResult, EventVerdict, decide_event};
pub use gate::{
    Gate, GateCheck, GateScope, apply_gates, guards, marks_on_success, watches_success,
};
pub use hook::{BuiltinHook, CodeHook, CodeHookRef, HookAction, HookEvent, HookSpec, ToolMatcher};
pub use ledger::{GateLedger, Tally};
pub use post::{PostHookOutcome, PostHookResult, apply_post_hooks};
pub use rule::{Rule, RuleError};
