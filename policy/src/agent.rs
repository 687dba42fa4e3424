//! Per-agent rules (docs/DESIGN.md §9): what an agent profile (`[[agents]]` in keel.toml) adds to the
//! policy for the sessions of that agent: the tools it may use, its permission mode, and its own
//! deny, ask and allow rules. The chain applies them in the same order as the policy's own
//! ([`crate::Policy::decide_for`]).

use keel_harness::PermissionMode;

use crate::rule::Rule;

/// One agent's rules, validated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentRules {
    /// The agent's name (in the reasons the model is told).
    pub agent: String,
    /// Its permission mode, over the policy's and the session's when set.
    pub mode: Option<PermissionMode>,
    /// Its calls always refused (after the policy's deny rules).
    pub deny: Vec<Rule>,
    /// Its calls a human must confirm (after the policy's ask rules).
    pub ask: Vec<Rule>,
    /// Its calls allowed without asking (after the policy's allow rules).
    pub allow: Vec<Rule>,
}

impl AgentRules {
    /// Whether the rules change nothing.
    pub fn is_empty(&self) -> bool {
        self.mode.is_none() && self.deny.is_empty() && self.ask.is_empty() && self.allow.is_empty()
    }
}

/// Who is calling, as the chain sees it: the session's own permission mode, the tools the session
/// may use (its agent profile's `tools`, with keel's own session tools; empty: any), and its
/// agent's rules, if the agent has any.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    /// The session's permission mode.
    pub mode: PermissionMode,
    /// The tools the session may use, by literal name; empty: any.
    pub tools: &'a [String],
    /// The session's agent's rules.
    pub agent: Option<&'a AgentRules>,
}

impl Caller<'_> {
    /// A session in `mode` with no tool list and no agent rules.
    pub fn in_mode(mode: PermissionMode) -> Caller<'static> {
        Caller {
            mode,
            tools: &[],
            agent: None,
        }
    }
}
