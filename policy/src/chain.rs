//! The permission chain (docs/DESIGN.md §9): hooks → deny rules → ask rules → the permission mode →
//! allow rules (each list the policy's, then the session's agent's: [`crate::agent`]) → what an unmatched call gets, evaluated in that order by one pure function. The hooks'
//! outcomes are inputs: the caller runs them (in process, or as commands on the node) in the fixed
//! order [`Policy::hooks_for`] gives, stopping at the first outcome that [`HookOutcome::ends_hooks`].
//!
//! Rules of the chain:
//! - A hook that denies, or a mandatory hook that fails or times out, denies: nothing later runs.
//! - A deny rule beats everything after it, an allow from a hook included.
//! - A hook's allow skips the ask rules, the mode and the allow rules (it is the hook's call), but
//!   never a deny rule. A hook's ask is an ask unless a deny rule matches.
//! - A hook with no opinion, and a hook that is not mandatory and failed, hand the call on.
//!
//! Every link that decided, and every hook that ran, is one [`AuditLine`] of the verdict.

use keel_harness::PermissionMode;
use keel_store::{AuditEntry, HookDecision, TaskId, UnixMillis};
use serde::{Deserialize, Serialize};

use crate::agent::Caller;
use crate::call::ToolCall;
use crate::hook::{HookEvent, HookSpec};
use crate::rule::Rule;

/// The audit name of each link of the chain that is not a hook.
pub mod link {
    /// A deny rule decided.
    pub const DENY_RULE: &str = "deny-rule";
    /// An ask rule decided.
    pub const ASK_RULE: &str = "ask-rule";
    /// The permission mode decided.
    pub const PERMISSION_MODE: &str = "permission-mode";
    /// An allow rule decided.
    pub const ALLOW_RULE: &str = "allow-rule";
    /// A deny rule of the session's agent decided.
    pub const AGENT_DENY_RULE: &str = "agent-deny-rule";
    /// The session's tool list (its agent profile's `tools`) decided: the tool is not on it.
    pub const AGENT_TOOLS: &str = "agent-tools";
    /// An ask rule of the session's agent decided.
    pub const AGENT_ASK_RULE: &str = "agent-ask-rule";
    /// An allow rule of the session's agent decided.
    pub const AGENT_ALLOW_RULE: &str = "agent-allow-rule";
    /// Nothing matched: the policy's `unmatched` decision applied.
    pub const UNMATCHED: &str = "unmatched";
    /// A human answered an ask (allow or deny) through its approval escalation.
    pub const APPROVAL: &str = "approval";
}

/// Tools that only read (each harness's spelling, compared without case): what a read-only session
/// may call.
const READ_ONLY_TOOLS: [&str; 8] = [
    "read", "list", "ls", "grep", "glob", "find", "view", "webfetch",
];
/// Tools that edit files: what `accept_edits` allows without a rule.
const EDIT_TOOLS: [&str; 7] = [
    "write",
    "edit",
    "multiedit",
    "notebookedit",
    "apply_patch",
    "patch",
    "str_replace_based_edit_tool",
];

/// What a call that no link decided gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unmatched {
    /// It runs (keel's behaviour without a policy).
    #[default]
    Allow,
    /// It is refused.
    Deny,
    /// A human is asked.
    Ask,
}

/// The chain's answer for one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The call runs.
    Allow,
    /// The call is refused; the model is told why.
    Deny,
    /// The call waits for a human's answer (an approval escalation), denied if none comes in time.
    Ask,
}

impl Decision {
    /// The same decision in the audit table's vocabulary.
    pub fn audited(self) -> HookDecision {
        match self {
            Decision::Allow => HookDecision::Allow,
            Decision::Deny => HookDecision::Deny,
            Decision::Ask => HookDecision::Ask,
        }
    }
}

/// What one hook answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "result")]
pub enum HookResult {
    /// The call may run.
    Allow {
        /// Why, if the hook said.
        reason: String,
    },
    /// The call must not run.
    Deny {
        /// Why (told to the model).
        reason: String,
    },
    /// A human must confirm.
    Ask {
        /// What to ask.
        reason: String,
    },
    /// The hook has no opinion: the chain goes on.
    NoOpinion,
    /// The hook itself failed (could not start, crashed, answered nonsense).
    Failed {
        /// What went wrong.
        error: String,
    },
    /// The hook did not answer within its timeout.
    TimedOut {
        /// The timeout it had.
        after_ms: u64,
    },
}

/// One hook's outcome, as the caller ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookOutcome {
    /// The hook's name.
    pub hook: String,
    /// Whether its failure denies.
    pub mandatory: bool,
    /// What it answered.
    pub result: HookResult,
}

impl HookOutcome {
    /// Whether no later hook should run after this outcome: a denial, or a mandatory hook's failure
    /// or timeout (which denies).
    pub fn ends_hooks(&self) -> bool {
        match self.result {
            HookResult::Deny { .. } => true,
            HookResult::Failed { .. } | HookResult::TimedOut { .. } => self.mandatory,
            HookResult::Allow { .. } | HookResult::Ask { .. } | HookResult::NoOpinion => false,
        }
    }

    fn audit_line(&self) -> AuditLine {
        let (decision, reason) = match &self.result {
            HookResult::Allow { reason } => (HookDecision::Allow, reason.clone()),
            HookResult::Deny { reason } => (HookDecision::Deny, reason.clone()),
            HookResult::Ask { reason } => (HookDecision::Ask, reason.clone()),
            HookResult::NoOpinion => (HookDecision::Defer, String::new()),
            HookResult::Failed { error } => (HookDecision::Error, self.failure_reason(error)),
            HookResult::TimedOut { after_ms } => (
                HookDecision::Error,
                self.failure_reason(&format!("timed out after {after_ms} ms")),
            ),
        };
        AuditLine {
            who: format!("hook:{}", self.hook),
            decision,
            reason,
            rewritten: false,
        }
    }

    fn failure_reason(&self, what: &str) -> String {
        if self.mandatory {
            format!("mandatory hook {} failed closed: {what}", self.hook)
        } else {
            format!("hook {} failed (not mandatory, ignored): {what}", self.hook)
        }
    }
}

/// One line of a verdict's audit trail: who decided what, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLine {
    /// `hook:<name>` for a hook, or a [`link`] name.
    pub who: String,
    /// What it decided (`Defer` for a hook with no opinion, `Error` for a failed one).
    pub decision: HookDecision,
    /// Why, one line.
    pub reason: String,
    /// Whether the hook rewrote what it saw (a `PostToolUse` hook's new result).
    #[serde(default)]
    pub rewritten: bool,
}

/// The chain's verdict on one call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The decision.
    pub decision: Decision,
    /// The link that decided (`hook:<name>` or a [`link`] name).
    pub decided_by: String,
    /// Why, one line: what the model is told on a denial.
    pub reason: String,
    /// Every hook that ran, then the deciding link when it was not a hook.
    pub trail: Vec<AuditLine>,
}

impl Verdict {
    /// A human's approval of a call the chain asked about (`keel answer ID allow`), as a verdict the
    /// gates then check like any allowed call: an approval lifts the ask, never a gate's count, cap,
    /// prerequisite or token. `reason` names the escalation; the trail is the approval's audit line.
    pub fn approved(reason: String) -> Verdict {
        Verdict {
            decision: Decision::Allow,
            decided_by: link::APPROVAL.to_owned(),
            trail: vec![AuditLine {
                who: link::APPROVAL.to_owned(),
                decision: HookDecision::Allow,
                reason: reason.clone(),
                rewritten: false,
            }],
            reason,
        }
    }

    /// The audit rows of this verdict for `call` made by `task`'s session at `ts_ms`, one per line of
    /// the trail, to be written durably before the call runs (invariant 12).
    pub fn audit_entries(
        &self,
        ts_ms: UnixMillis,
        task_id: Option<TaskId>,
        call: &ToolCall,
    ) -> Vec<AuditEntry> {
        audit_rows(&self.trail, ts_ms, task_id, call)
    }
}

/// The audit rows of a trail for `call` made by `task_id`'s session at `ts_ms`, one per line.
pub fn audit_rows(
    trail: &[AuditLine],
    ts_ms: UnixMillis,
    task_id: Option<TaskId>,
    call: &ToolCall,
) -> Vec<AuditEntry> {
    let digest = call.input_digest();
    trail
        .iter()
        .map(|line| AuditEntry {
            ts_ms,
            task_id,
            hook: line.who.clone(),
            tool: call.tool.clone(),
            decision: line.decision,
            reason: line.reason.clone(),
            input_digest: digest.clone(),
            rewritten: line.rewritten,
        })
        .collect()
}

/// A run's policy: its hooks and rules, validated (built by [`crate::config::PolicyConfig::build`]
/// or by an embedder).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Every hook, in the order they run: the order they were declared.
    pub hooks: Vec<HookSpec>,
    /// Calls always refused.
    pub deny: Vec<Rule>,
    /// Calls a human must confirm.
    pub ask: Vec<Rule>,
    /// The permission mode, overriding the session's own when set.
    pub mode: Option<PermissionMode>,
    /// Calls allowed without asking.
    pub allow: Vec<Rule>,
    /// What a call no link decided gets.
    pub unmatched: Unmatched,
    /// How long an `ask` waits for a human before it is denied, in milliseconds.
    pub ask_timeout_ms: u64,
    /// Gates applied to a call the chain allowed ([`crate::gate::apply_gates`]).
    pub gates: Vec<crate::gate::Gate>,
    /// Agents' own rules, for the sessions of each (only agents that have some).
    pub agents: Vec<crate::agent::AgentRules>,
}

impl Policy {
    /// Whether the policy can change anything: without hooks, rules, a mode or a non-default
    /// `unmatched`, every call is allowed and no gate needs to be installed.
    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
            && self.deny.is_empty()
            && self.ask.is_empty()
            && self.mode.is_none()
            && self.allow.is_empty()
            && self.unmatched == Unmatched::Allow
            && self.gates.is_empty()
            && self.agents.iter().all(crate::agent::AgentRules::is_empty)
    }

    /// Registers a hook written in code (an embedding host's), after every hook already there: the
    /// documented order is keel.toml's hooks as declared, then hooks in code as registered.
    ///
    /// # Errors
    /// The hook's name is taken, or its event is not one keel runs hooks at
    /// ([`HookEvent::runs_in_keel`]).
    pub fn register_hook(&mut self, hook: HookSpec) -> Result<(), crate::PolicyConfigError> {
        let problem = if !hook.event.runs_in_keel() {
            Some(format!(
                "{} hooks are not run by keel; register PreToolUse, PostToolUse, PreCompact, \
                 SubagentStart or SubagentStop hooks",
                hook.event.as_str()
            ))
        } else if self.hooks.iter().any(|h| h.name == hook.name) {
            Some(format!("{:?} names two hooks", hook.name))
        } else {
            None
        };
        if let Some(message) = problem {
            return Err(crate::PolicyConfigError {
                field: format!("hook {}", hook.name),
                message,
                hook_index: None,
            });
        }
        self.hooks.push(hook);
        Ok(())
    }

    /// The rules of agent `name`, if it has any.
    pub fn agent_rules(&self, name: &str) -> Option<&crate::agent::AgentRules> {
        self.agents.iter().find(|a| a.agent == name)
    }

    /// The hooks that run for `event` on a call of `tool`, in their fixed order: the order of
    /// declaration (keel.toml's hooks first, then hooks registered in code).
    pub fn hooks_for<'a>(
        &'a self,
        event: HookEvent,
        tool: Option<&'a str>,
    ) -> impl Iterator<Item = &'a HookSpec> + 'a {
        self.hooks.iter().filter(move |h| h.applies(event, tool))
    }

    /// The chain's verdict on `call` in a session whose own mode is `session_mode`, given the
    /// outcomes of the `PreToolUse` hooks the caller ran (in [`Policy::hooks_for`] order), for a
    /// session without a tool list or agent rules.
    pub fn decide(
        &self,
        call: &ToolCall,
        session_mode: PermissionMode,
        hooks: &[HookOutcome],
    ) -> Verdict {
        self.decide_for(call, Caller::in_mode(session_mode), hooks)
    }

    /// The chain's verdict on `call` by `caller`: hooks, then the deny rules (the policy's, then
    /// the agent's, then the session's tool list), the ask rules (the policy's, then the agent's),
    /// the permission mode (the agent's, else the policy's, else the session's), the allow rules
    /// (the policy's, then the agent's), and `unmatched`.
    pub fn decide_for(
        &self,
        call: &ToolCall,
        caller: Caller<'_>,
        hooks: &[HookOutcome],
    ) -> Verdict {
        let mut trail = Vec::with_capacity(hooks.len() + 1);
        let mut hook_verdict: Option<(Decision, String, String)> = None;
        for outcome in hooks {
            let line = outcome.audit_line();
            let decided = match &outcome.result {
                HookResult::Deny { .. } => Some(Decision::Deny),
                HookResult::Failed { .. } | HookResult::TimedOut { .. } if outcome.mandatory => {
                    Some(Decision::Deny)
                }
                HookResult::Allow { .. } => Some(Decision::Allow),
                HookResult::Ask { .. } => Some(Decision::Ask),
                _ => None,
            };
            if let Some(decision) = decided {
                // A later hook's ask or allow does not override an earlier one's ask: the strictest
                // hook answer wins, and a denial ends the hooks.
                let stricter = matches!(
                    (&hook_verdict, decision),
                    (None, _)
                        | (Some(_), Decision::Deny)
                        | (Some((Decision::Allow, _, _)), Decision::Ask)
                );
                if stricter {
                    hook_verdict = Some((decision, line.who.clone(), line.reason.clone()));
                }
            }
            trail.push(line);
            if outcome.ends_hooks() {
                break;
            }
        }
        let mut verdict = |decision: Decision, who: &str, reason: String, audit: bool| {
            if audit {
                trail.push(AuditLine {
                    who: who.to_owned(),
                    decision: decision.audited(),
                    reason: reason.clone(),
                    rewritten: false,
                });
            }
            Verdict {
                decision,
                decided_by: who.to_owned(),
                reason,
                trail: std::mem::take(&mut trail),
            }
        };
        if let Some((Decision::Deny, who, reason)) = &hook_verdict {
            return verdict(Decision::Deny, who, reason.clone(), false);
        }
        if let Some(rule) = self.deny.iter().find(|r| r.matches(call)) {
            return verdict(
                Decision::Deny,
                link::DENY_RULE,
                format!("denied by rule {rule}"),
                true,
            );
        }
        let agent = caller.agent;
        let agent_name = agent.map_or("", |a| a.agent.as_str());
        if let Some(rule) = agent.and_then(|a| a.deny.iter().find(|r| r.matches(call))) {
            return verdict(
                Decision::Deny,
                link::AGENT_DENY_RULE,
                format!("denied by agent {agent_name}'s rule {rule}"),
                true,
            );
        }
        if !caller.tools.is_empty() && !caller.tools.contains(&call.tool) {
            return verdict(
                Decision::Deny,
                link::AGENT_TOOLS,
                format!(
                    "this session may use only {}; {} is not one of them",
                    caller.tools.join(", "),
                    call.tool
                ),
                true,
            );
        }
        match hook_verdict {
            Some((Decision::Allow, who, reason)) => {
                return verdict(Decision::Allow, &who, reason, false);
            }
            Some((Decision::Ask, who, reason)) => {
                return verdict(Decision::Ask, &who, reason, false);
            }
            _ => {}
        }
        if let Some(rule) = self.ask.iter().find(|r| r.matches(call)) {
            return verdict(
                Decision::Ask,
                link::ASK_RULE,
                format!("rule {rule} needs a human's approval"),
                true,
            );
        }
        if let Some(rule) = agent.and_then(|a| a.ask.iter().find(|r| r.matches(call))) {
            return verdict(
                Decision::Ask,
                link::AGENT_ASK_RULE,
                format!("agent {agent_name}'s rule {rule} needs a human's approval"),
                true,
            );
        }
        let mode = agent
            .and_then(|a| a.mode)
            .or(self.mode)
            .unwrap_or(caller.mode);
        let tool = call.tool.to_ascii_lowercase();
        match mode {
            PermissionMode::Bypass => {
                return verdict(
                    Decision::Allow,
                    link::PERMISSION_MODE,
                    "bypass mode allows every call no rule denies".into(),
                    true,
                );
            }
            PermissionMode::ReadOnly if READ_ONLY_TOOLS.contains(&tool.as_str()) => {
                return verdict(
                    Decision::Allow,
                    link::PERMISSION_MODE,
                    format!("{} only reads", call.tool),
                    true,
                );
            }
            PermissionMode::ReadOnly => {
                return verdict(
                    Decision::Deny,
                    link::PERMISSION_MODE,
                    format!("read-only mode: {} may change something", call.tool),
                    true,
                );
            }
            PermissionMode::AcceptEdits if EDIT_TOOLS.contains(&tool.as_str()) => {
                return verdict(
                    Decision::Allow,
                    link::PERMISSION_MODE,
                    format!("accept-edits mode allows {}", call.tool),
                    true,
                );
            }
            PermissionMode::AcceptEdits => {}
        }
        if let Some(rule) = self.allow.iter().find(|r| r.matches(call)) {
            return verdict(
                Decision::Allow,
                link::ALLOW_RULE,
                format!("allowed by rule {rule}"),
                true,
            );
        }
        if let Some(rule) = agent.and_then(|a| a.allow.iter().find(|r| r.matches(call))) {
            return verdict(
                Decision::Allow,
                link::AGENT_ALLOW_RULE,
                format!("allowed by agent {agent_name}'s rule {rule}"),
                true,
            );
        }
        let (decision, reason) = match self.unmatched {
            Unmatched::Allow => (Decision::Allow, "no rule matched; unmatched calls run"),
            Unmatched::Deny => (
                Decision::Deny,
                "no rule allows this call; unmatched calls are denied",
            ),
            Unmatched::Ask => (
                Decision::Ask,
                "no rule matched; unmatched calls need a human's approval",
            ),
        };
        verdict(decision, link::UNMATCHED, reason.to_owned(), true)
    }
}

#[cfg(test)]
#[path = "chain_tests.rs"]
mod tests;
