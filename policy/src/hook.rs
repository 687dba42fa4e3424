//! Hooks: a check that runs at one event of a session (before a tool call, after it, at a stop, ...),
//! chosen by the tool's literal name, that is a command or one of keel's built-ins, with a timeout
//! and a flag saying whether its failure denies. Built from `[[hooks]]` in keel.toml
//! ([`crate::config::HookConfig`]) or registered in code by an embedding host.

use std::sync::Arc;

use keel_harness::ToolOutput;
use serde::{Deserialize, Serialize};

use serde_json::Value;

use crate::call::ToolCall;
use crate::chain::HookResult;
use crate::event::EventResult;
use crate::post::PostHookResult;

/// The events a hook can be attached to (docs/DESIGN.md §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum HookEvent {
    /// Before a tool call runs; the hook can allow, deny or ask.
    PreToolUse,
    /// After a tool call ran, before the model sees its result.
    PostToolUse,
    /// When the session would end; the hook can refuse completion.
    Stop,
    /// Before a harness compacts its context (a CLI's own compaction, through the hook bridge;
    /// keel's own loop never compacts): a veto blocks it, an annotation goes into its
    /// instructions.
    PreCompact,
    /// When a specialist's session (a task's attempt, a delegated subtask included) is about to
    /// start on its brief: a veto refuses the start, an annotation is added to the brief.
    SubagentStart,
    /// When a specialist's report came back: a veto refuses the report (the attempt fails), an
    /// annotation is added to the report's summary the lead sees.
    SubagentStop,
}

impl HookEvent {
    /// Every event, in declaration order.
    pub const ALL: [HookEvent; 6] = [
        HookEvent::PreToolUse,
        HookEvent::PostToolUse,
        HookEvent::Stop,
        HookEvent::PreCompact,
        HookEvent::SubagentStart,
        HookEvent::SubagentStop,
    ];

    /// Whether the event concerns one tool call, so a tool matcher means something for it.
    pub fn is_tool_event(self) -> bool {
        matches!(self, HookEvent::PreToolUse | HookEvent::PostToolUse)
    }

    /// Whether the event is about a session rather than one tool call: its hooks veto or annotate it
    /// ([`crate::event`]), and a matcher names agents (`SubagentStart`, `SubagentStop`) or nothing.
    pub fn is_session_event(self) -> bool {
        matches!(
            self,
            HookEvent::SubagentStart | HookEvent::SubagentStop | HookEvent::PreCompact
        )
    }

    /// Whether keel runs hooks configured for this event (docs/DESIGN.md §9): the tool events, a
    /// specialist's start and report, and a CLI's compaction (`PreCompact`, on the harnesses whose
    /// compaction is bridged to keel: Claude Code and Codex; docs/HARNESSES.md). `Stop` is keel's
    /// own report check, not configurable, so it is refused in `[[hooks]]` (a hook that never runs
    /// would be a silent gap).
    pub fn runs_in_keel(self) -> bool {
        matches!(
            self,
            HookEvent::PreToolUse
                | HookEvent::PostToolUse
                | HookEvent::PreCompact
                | HookEvent::SubagentStart
                | HookEvent::SubagentStop
        )
    }

    /// The event's name as written in keel.toml and in a hook's JSON payload (`hook_event_name`).
    pub fn as_str(self) -> &'static str {
        match self {
            HookEvent::PreToolUse => "PreToolUse",
            HookEvent::PostToolUse => "PostToolUse",
            HookEvent::Stop => "Stop",
            HookEvent::PreCompact => "PreCompact",
            HookEvent::SubagentStart => "SubagentStart",
            HookEvent::SubagentStop => "SubagentStop",
        }
    }
}

/// Which tool calls a hook sees, by the tool's literal name (each harness's own spelling).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolMatcher {
    /// Every call (written `"*"`, or no matcher at all).
    Any,
    /// Calls of exactly these tools.
    Tools(Vec<String>),
}

impl ToolMatcher {
    /// Whether a call of `tool` is matched. An event without a tool (a stop) is matched only by
    /// [`ToolMatcher::Any`].
    pub fn matches(&self, tool: Option<&str>) -> bool {
        match (self, tool) {
            (ToolMatcher::Any, _) => true,
            (ToolMatcher::Tools(names), Some(tool)) => names.iter().any(|n| n == tool),
            (ToolMatcher::Tools(_), None) => false,
        }
    }
}

/// keel's built-in hooks: checks that need no program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BuiltinHook {
    /// Denies every matched call: a switch that turns a tool off for every harness at once.
    Deny,
    /// Allows every matched call (deny rules still apply after it).
    Allow,
}

/// A hook written in Rust by an embedding host and registered in code
/// ([`crate::Policy::register_hook`]): it runs in process, in the policy's order with the
/// configured hooks (keel.toml's first), on `PreToolUse`, `PostToolUse`, `PreCompact`,
/// `SubagentStart` and `SubagentStop`. It runs on the caller's
/// task, so it must answer quickly and never block; a panic is a failure (denying, or withholding
/// the result, when the hook is mandatory).
pub trait CodeHook: Send + Sync {
    /// `PreToolUse`: allow, deny, ask or no opinion on `call`.
    fn before_tool(&self, call: &ToolCall) -> HookResult {
        let _ = call;
        HookResult::NoOpinion
    }

    /// `PostToolUse`: keep, rewrite or withhold the result of `call` the model is about to see.
    fn after_tool(&self, call: &ToolCall, output: &ToolOutput) -> PostHookResult {
        let _ = (call, output);
        PostHookResult::Keep
    }

    /// A session event (`SubagentStart`, `SubagentStop`, `PreCompact`): veto it, annotate it, or
    /// no opinion. `payload` is what a command hook gets on stdin (`hook_event_name`, `run_id`,
    /// `task_id`, `attempt`, `agent`, and `brief`, `report`, or for `PreCompact` the CLI's own
    /// fields: `harness`, `trigger`, `custom_instructions`).
    fn on_event(&self, event: HookEvent, payload: &Value) -> EventResult {
        let _ = (event, payload);
        EventResult::NoOpinion
    }
}

/// A registered code hook, compared by identity.
#[derive(Clone)]
pub struct CodeHookRef(pub Arc<dyn CodeHook>);

impl std::fmt::Debug for CodeHookRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CodeHook")
    }
}

impl PartialEq for CodeHookRef {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CodeHookRef {}

/// What a hook runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HookAction {
    /// A program, run without a shell, with the event's JSON payload on stdin (Claude Code's command
    /// hook contract: exit 0 with no decision is no opinion, exit 0 with a JSON
    /// `hookSpecificOutput.permissionDecision` decides, exit 2 denies with stderr as the reason,
    /// anything else is an error).
    Command {
        /// The program (absolute, or found on PATH).
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// One of keel's built-ins.
    Builtin(BuiltinHook),
    /// A hook registered in code by an embedding host.
    Code(CodeHookRef),
}

/// One hook, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookSpec {
    /// Its name in audit rows (from keel.toml, or `hooks[N]` when none was given).
    pub name: String,
    /// The event it runs at.
    pub event: HookEvent,
    /// The calls it sees.
    pub matcher: ToolMatcher,
    /// What it runs.
    pub action: HookAction,
    /// How long it may take; past it the hook has timed out (not used for a hook in code, which
    /// runs on the caller's task).
    pub timeout_ms: u64,
    /// Whether an error or a timeout of this hook denies the call (fails closed). A hook that is not
    /// mandatory and fails is audited and then ignored.
    pub mandatory: bool,
}

impl HookSpec {
    /// A hook registered in code: `name` in audit rows, at `event` (one keel runs,
    /// [`HookEvent::runs_in_keel`]), on the calls (or, for a subagent event, the agents) `matcher`
    /// picks. Mandatory: its failure denies (or withholds).
    pub fn code(
        name: impl Into<String>,
        event: HookEvent,
        matcher: ToolMatcher,
        hook: Arc<dyn CodeHook>,
    ) -> HookSpec {
        HookSpec {
            name: name.into(),
            event,
            matcher,
            action: HookAction::Code(CodeHookRef(hook)),
            timeout_ms: 0,
            mandatory: true,
        }
    }

    /// Whether the hook runs for `event` on a call of `tool`.
    pub fn applies(&self, event: HookEvent, tool: Option<&str>) -> bool {
        self.event == event && self.matcher.matches(tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matchers_are_literal_and_any_matches_toolless_events() {
        let tools = ToolMatcher::Tools(vec!["Bash".into(), "shell".into()]);
        assert!(tools.matches(Some("Bash")));
        assert!(tools.matches(Some("shell")));
        assert!(!tools.matches(Some("bash")));
        assert!(!tools.matches(None));
        assert!(ToolMatcher::Any.matches(None));
        assert!(ToolMatcher::Any.matches(Some("x")));
    }

    #[test]
    fn only_tool_events_take_a_tool() {
        let tool_events: Vec<_> = HookEvent::ALL
            .into_iter()
            .filter(|e| e.is_tool_event())
            .collect();
        assert_eq!(
            tool_events,
            vec![HookEvent::PreToolUse, HookEvent::PostToolUse]
        );
    }
}
