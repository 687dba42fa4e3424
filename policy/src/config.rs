//! The policy as keel.toml writes it: `[[hooks]]` and `[permissions]` (docs/CONFIG.md), read strictly
//! (unknown keys refused) and turned into a [`Policy`] by [`PolicyConfig::build`], whose errors name the
//! field (`hooks[1].timeout_ms`, `permissions.deny[0]`).

use keel_harness::PermissionMode;
use serde::{Deserialize, Serialize};

use crate::agent::AgentRules;
use crate::chain::{Policy, Unmatched};
use crate::gate::{Gate, GateCheck, GateScope, MICROS_PER_UNIT};
use crate::hook::{BuiltinHook, HookAction, HookEvent, HookSpec, ToolMatcher};
use crate::rule::Rule;

/// A hook's timeout when keel.toml gives none.
pub const HOOK_TIMEOUT_MS_DEFAULT: u64 = 10_000;
/// The longest timeout a hook may have: a tool call waits for it.
pub const HOOK_TIMEOUT_MS_MAX: u64 = 600_000;
/// How long an `ask` waits for a human when keel.toml says nothing.
pub const ASK_TIMEOUT_S_DEFAULT: u64 = 300;
/// The longest an `ask` may wait.
pub const ASK_TIMEOUT_S_MAX: u64 = 86_400;
/// Most hooks in one configuration; each runs on every matched call.
pub const HOOKS_MAX: usize = 64;
/// Most rules in one list.
pub const RULES_MAX: usize = 1024;
/// The longest hook name.
pub const HOOK_NAME_BYTES_MAX: usize = 64;

/// The policy sections of keel.toml.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `[[hooks]]`.
    pub hooks: Vec<HookConfig>,
    /// `[permissions]`.
    pub permissions: PermissionsConfig,
    /// `[[gates]]`.
    pub gates: Vec<GateConfig>,
    /// The policy half of each `[[agents]]` table, in keel.toml's order (so an error names
    /// `agents[N]` as the file does).
    pub agents: Vec<AgentRulesConfig>,
}

/// The policy keys of one `[[agents]]` table: its permission mode and its rules (the agent's
/// `tools` reach the chain through the session's tool list).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentRulesConfig {
    /// The agent's name.
    pub name: String,
    /// Its permission mode, over `[permissions] mode` and the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<PermissionMode>,
    /// Its deny, ask and allow rules.
    #[serde(default)]
    pub rules: RuleListsConfig,
}

/// `rules = { deny = [...], ask = [...], allow = [...] }` of an agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuleListsConfig {
    /// Rules whose calls are refused.
    pub deny: Vec<String>,
    /// Rules whose calls wait for a human's approval.
    pub ask: Vec<String>,
    /// Rules whose calls run without asking.
    pub allow: Vec<String>,
}

impl AgentRulesConfig {
    fn build(&self, i: usize) -> Result<AgentRules, PolicyConfigError> {
        let at = |list: &str| format!("agents[{i}].rules.{list}");
        Ok(AgentRules {
            agent: self.name.clone(),
            mode: self.permission_mode,
            deny: rules_at(&at("deny"), &self.rules.deny)?,
            ask: rules_at(&at("ask"), &self.rules.ask)?,
            allow: rules_at(&at("allow"), &self.rules.allow)?,
        })
    }
}

/// The kinds of gate (docs/CONFIG.md, docs/DESIGN.md §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    /// At most `max_calls` calls matching `rule` per task or run.
    Count,
    /// A call matching `rule` only after a call matching `after` succeeded in the task (or run).
    Prerequisite,
    /// A call matching `rule` only with a token issued by an earlier successful call matching
    /// `issued_by`; each call spends one.
    Token,
    /// The input's numeric `field` summed over the run (or task), refused past `max_total`.
    Cap,
}

impl GateKind {
    fn as_str(self) -> &'static str {
        match self {
            GateKind::Count => "count",
            GateKind::Prerequisite => "prerequisite",
            GateKind::Token => "token",
            GateKind::Cap => "cap",
        }
    }

    /// What the gate's marks are read over when `per` is not given: a count and a prerequisite
    /// per task, a token and a cap per run (a token comes from an earlier step, a cap spans the run).
    fn default_scope(self) -> GateScope {
        match self {
            GateKind::Count | GateKind::Prerequisite => GateScope::Task,
            GateKind::Token | GateKind::Cap => GateScope::Run,
        }
    }
}

/// One `[[gates]]` table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    /// Its name in audit rows (`gate:<name>`); unique.
    pub name: String,
    /// Which kind.
    pub kind: GateKind,
    /// The calls it applies to, as a permission rule (`"Bash(git push*)"`).
    pub rule: String,
    /// For `count`: how many calls may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_calls: Option<u32>,
    /// For `prerequisite`: the rule a call must match, and succeed, first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// For `token`: the rule whose successful calls issue one token each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_by: Option<String>,
    /// For `cap`: the numeric input field summed, a dotted path (`amount`, `payment.amount`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// For `cap`: the largest total allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total: Option<f64>,
    /// `task` or `run`; by default `task` for `count` and `prerequisite`, `run` for `token` and
    /// `cap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<GateScope>,
}

/// Most gates in one configuration.
pub const GATES_MAX: usize = 64;

impl GateConfig {
    fn build(&self, i: usize) -> Result<Gate, PolicyConfigError> {
        let field = |name: &str| format!("gates[{i}].{name}");
        if self.name.trim().is_empty() || self.name.len() > HOOK_NAME_BYTES_MAX {
            return Err(err(
                field("name"),
                format!("a name is 1 to {HOOK_NAME_BYTES_MAX} bytes"),
            ));
        }
        let kind = self.kind.as_str();
        let parse = |name: &str, text: &str| -> Result<Rule, PolicyConfigError> {
            text.parse().map_err(|e| err(field(name), format!("{e}")))
        };
        let rule = parse("rule", &self.rule)?;
        // Every key that belongs to another kind is refused: a key that is ignored would be a
        // silent gap.
        let stray = [
            ("max_calls", self.max_calls.is_some(), GateKind::Count),
            ("after", self.after.is_some(), GateKind::Prerequisite),
            ("issued_by", self.issued_by.is_some(), GateKind::Token),
            ("field", self.field.is_some(), GateKind::Cap),
            ("max_total", self.max_total.is_some(), GateKind::Cap),
        ]
        .into_iter()
        .find(|(_, set, owner)| *set && *owner != self.kind);
        if let Some((key, _, owner)) = stray {
            return Err(err(
                field(key),
                format!("{key} belongs to {} gates, not {kind}", owner.as_str()),
            ));
        }
        let needs = |key: &str| err(field(key), format!("a {kind} gate needs {key}"));
        let check = match self.kind {
            GateKind::Count => GateCheck::Count {
                max_calls: self.max_calls.ok_or_else(|| needs("max_calls"))?,
            },
            GateKind::Prerequisite => GateCheck::Prerequisite {
                after: parse(
                    "after",
                    self.after.as_deref().ok_or_else(|| needs("after"))?,
                )?,
            },
            GateKind::Token => GateCheck::Token {
                issued_by: parse(
                    "issued_by",
                    self.issued_by
                        .as_deref()
                        .ok_or_else(|| needs("issued_by"))?,
                )?,
            },
            GateKind::Cap => {
                let path = self.field.as_deref().ok_or_else(|| needs("field"))?;
                if path.is_empty() || path.split('.').any(|k| k.trim().is_empty()) {
                    return Err(err(
                        field("field"),
                        "a field is a dotted path of names, e.g. \"amount\" or \"payment.amount\"",
                    ));
                }
                let max = self.max_total.ok_or_else(|| needs("max_total"))?;
                let micros = max * MICROS_PER_UNIT as f64;
                if !micros.is_finite() || micros < 0.0 || micros >= u64::MAX as f64 {
                    return Err(err(
                        field("max_total"),
                        format!("must be a number from 0 to {}", u64::MAX / MICROS_PER_UNIT),
                    ));
                }
                GateCheck::Cap {
                    field: path.to_owned(),
                    max_micros: micros.round() as u64,
                }
            }
        };
        Ok(Gate {
            name: self.name.clone(),
            rule,
            per: self.per.unwrap_or(self.kind.default_scope()),
            check,
        })
    }
}

/// One `[[hooks]]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// Its name in audit rows; `hooks[N]` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The event it runs at.
    pub event: HookEvent,
    /// The tools it sees: one literal name, a list of them, or `"*"` (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<MatcherConfig>,
    /// A program and its arguments, run without a shell. Exactly one of `command` and `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// One of keel's built-in hooks. Exactly one of `command` and `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<BuiltinHook>,
    /// How long it may take, in milliseconds ([`HOOK_TIMEOUT_MS_DEFAULT`] when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Whether its error or timeout denies the call. `true` unless set: a policy fails closed.
    #[serde(default = "mandatory_default")]
    pub mandatory: bool,
}

fn mandatory_default() -> bool {
    true
}

/// A matcher as written: one name or a list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MatcherConfig {
    /// One tool name, or `"*"` for all.
    One(String),
    /// Several tool names.
    List(Vec<String>),
}

/// `[permissions]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PermissionsConfig {
    /// Overrides every session's permission mode when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<PermissionMode>,
    /// Rules whose calls are refused.
    pub deny: Vec<String>,
    /// Rules whose calls wait for a human's approval.
    pub ask: Vec<String>,
    /// Rules whose calls run without asking.
    pub allow: Vec<String>,
    /// What a call no rule, hook or mode decided gets.
    pub unmatched: Unmatched,
    /// How long an `ask` waits for an answer before it is denied, in seconds.
    pub ask_timeout_s: u64,
}

impl Default for PermissionsConfig {
    fn default() -> Self {
        PermissionsConfig {
            mode: None,
            deny: Vec::new(),
            ask: Vec::new(),
            allow: Vec::new(),
            unmatched: Unmatched::Allow,
            ask_timeout_s: ASK_TIMEOUT_S_DEFAULT,
        }
    }
}

/// Why a policy configuration cannot be used: the field (as a path into keel.toml) and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct PolicyConfigError {
    /// The field, e.g. `hooks[1].timeout_ms` or `permissions.deny[0]`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
    /// The index of the `[[hooks]]` table concerned, if any (for a line number).
    pub hook_index: Option<usize>,
}

fn err(field: impl Into<String>, message: impl Into<String>) -> PolicyConfigError {
    PolicyConfigError {
        field: field.into(),
        message: message.into(),
        hook_index: None,
    }
}

impl PolicyConfig {
    /// Validates the configuration and builds the policy it describes.
    ///
    /// # Errors
    /// The first invalid field, named.
    pub fn build(&self) -> Result<Policy, PolicyConfigError> {
        if self.hooks.len() > HOOKS_MAX {
            return Err(err(
                "hooks",
                format!("{} hooks; at most {HOOKS_MAX}", self.hooks.len()),
            ));
        }
        let mut hooks = Vec::with_capacity(self.hooks.len());
        for (i, hook) in self.hooks.iter().enumerate() {
            let spec = hook.build(i).map_err(|mut e| {
                e.hook_index = Some(i);
                e
            })?;
            if hooks.iter().any(|h: &HookSpec| h.name == spec.name) {
                return Err(PolicyConfigError {
                    hook_index: Some(i),
                    ..err(
                        format!("hooks[{i}].name"),
                        format!("{:?} names two hooks", spec.name),
                    )
                });
            }
            hooks.push(spec);
        }
        let p = &self.permissions;
        if p.ask_timeout_s == 0 || p.ask_timeout_s > ASK_TIMEOUT_S_MAX {
            return Err(err(
                "permissions.ask_timeout_s",
                format!("must be 1 to {ASK_TIMEOUT_S_MAX} seconds"),
            ));
        }
        if self.gates.len() > GATES_MAX {
            return Err(err(
                "gates",
                format!("{} gates; at most {GATES_MAX}", self.gates.len()),
            ));
        }
        let mut gates: Vec<Gate> = Vec::with_capacity(self.gates.len());
        for (i, g) in self.gates.iter().enumerate() {
            let gate = g.build(i)?;
            if gates.iter().any(|o| o.name == gate.name) {
                return Err(err(
                    format!("gates[{i}].name"),
                    format!("{:?} names two gates", gate.name),
                ));
            }
            gates.push(gate);
        }
        let agents = self
            .agents
            .iter()
            .enumerate()
            .map(|(i, a)| a.build(i))
            .filter(|a| a.as_ref().map_or(true, |a| !a.is_empty()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy {
            agents,
            gates,
            hooks,
            deny: rules("deny", &p.deny)?,
            ask: rules("ask", &p.ask)?,
            mode: p.mode,
            allow: rules("allow", &p.allow)?,
            unmatched: p.unmatched,
            ask_timeout_ms: p.ask_timeout_s * 1000,
        })
    }
}

fn rules(list: &str, texts: &[String]) -> Result<Vec<Rule>, PolicyConfigError> {
    rules_at(&format!("permissions.{list}"), texts)
}

/// The rules of the list at `field` (`permissions.deny`, `agents[0].rules.ask`).
fn rules_at(field: &str, texts: &[String]) -> Result<Vec<Rule>, PolicyConfigError> {
    if texts.len() > RULES_MAX {
        return Err(err(
            field,
            format!("{} rules; at most {RULES_MAX}", texts.len()),
        ));
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.parse()
                .map_err(|e| err(format!("{field}[{i}]"), format!("{e}")))
        })
        .collect()
}

impl HookConfig {
    fn build(&self, i: usize) -> Result<HookSpec, PolicyConfigError> {
        let field = |name: &str| format!("hooks[{i}].{name}");
        let name = match &self.name {
            Some(n) if n.trim().is_empty() || n.len() > HOOK_NAME_BYTES_MAX => {
                return Err(err(
                    field("name"),
                    format!("a name is 1 to {HOOK_NAME_BYTES_MAX} bytes"),
                ));
            }
            Some(n) => n.clone(),
            None => format!("hooks[{i}]"),
        };
        if !self.event.runs_in_keel() {
            return Err(err(
                field("event"),
                format!(
                    "{} hooks are not run by keel (PreToolUse, PostToolUse, PreCompact, \
                     SubagentStart and SubagentStop are); a hook that never runs would be a \
                     silent gap",
                    self.event.as_str()
                ),
            ));
        }
        if self.event != HookEvent::PreToolUse && self.builtin.is_some() {
            return Err(err(
                field("builtin"),
                format!(
                    "{} hooks are commands (or hooks registered in code); the built-ins decide \
                     calls before they run",
                    self.event.as_str()
                ),
            ));
        }
        let matcher = match &self.matcher {
            None => ToolMatcher::Any,
            Some(MatcherConfig::One(s)) if s == "*" => ToolMatcher::Any,
            Some(MatcherConfig::One(s)) => ToolMatcher::Tools(vec![s.clone()]),
            Some(MatcherConfig::List(names)) => ToolMatcher::Tools(names.clone()),
        };
        if let ToolMatcher::Tools(names) = &matcher {
            if names.is_empty() || names.iter().any(|n| n.trim().is_empty() || n == "*") {
                return Err(err(
                    field("matcher"),
                    "a matcher is \"*\", one tool name, or a non-empty list of tool names",
                ));
            }
            if !self.event.is_tool_event()
                && !matches!(
                    self.event,
                    HookEvent::SubagentStart | HookEvent::SubagentStop
                )
            {
                return Err(err(
                    field("matcher"),
                    format!(
                        "{} is not about a tool: leave matcher out",
                        self.event.as_str()
                    ),
                ));
            }
        }
        let action = match (&self.command, self.builtin) {
            (Some(_), Some(_)) => {
                return Err(err(
                    field("command"),
                    "give either command or builtin, not both",
                ));
            }
            (None, None) => return Err(err(field("command"), "give command or builtin")),
            (None, Some(b)) => HookAction::Builtin(b),
            (Some(argv), None) => match argv.split_first() {
                Some((program, args)) if !program.trim().is_empty() => HookAction::Command {
                    program: program.clone(),
                    args: args.to_vec(),
                },
                _ => {
                    return Err(err(
                        field("command"),
                        "a command is a non-empty list: the program, then its arguments",
                    ));
                }
            },
        };
        let timeout_ms = self.timeout_ms.unwrap_or(HOOK_TIMEOUT_MS_DEFAULT);
        if timeout_ms == 0 || timeout_ms > HOOK_TIMEOUT_MS_MAX {
            return Err(err(
                field("timeout_ms"),
                format!("must be 1 to {HOOK_TIMEOUT_MS_MAX} milliseconds"),
            ));
        }
        Ok(HookSpec {
            name,
            event: self.event,
            matcher,
            action,
            timeout_ms,
            mandatory: self.mandatory,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> PolicyConfig {
        toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn check_err(text: &str, field: &str, needle: &str) {
        match parse(text).build() {
            Ok(p) => panic!("accepted {text:?} as {p:?}"),
            Err(e) => {
                assert_eq!(e.field, field, "{e}");
                assert!(e.to_string().contains(needle), "{e} lacks {needle:?}");
            }
        }
    }

    #[test]
    fn subagent_hooks_build_with_an_agent_matcher() {
        let policy = parse(
            "[[hooks]]\nname = \"briefs\"\nevent = \"SubagentStart\"\nmatcher = \"coder\"\n\
             command = [\"check-brief\"]\n[[hooks]]\nevent = \"SubagentStop\"\n\
             command = [\"check-report\"]\n",
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.hooks.len(), 2);
        assert_eq!(policy.hooks[0].event, HookEvent::SubagentStart);
        assert_eq!(
            policy.hooks[0].matcher,
            ToolMatcher::Tools(vec!["coder".into()])
        );
        assert_eq!(
            policy
                .hooks_for(HookEvent::SubagentStart, Some("coder"))
                .count(),
            1
        );
        assert_eq!(
            policy
                .hooks_for(HookEvent::SubagentStart, Some("lead"))
                .count(),
            0
        );
        assert_eq!(
            policy
                .hooks_for(HookEvent::SubagentStop, Some("lead"))
                .count(),
            1
        );
    }

    #[test]
    fn a_pre_compact_hook_builds_and_matches_every_compaction() {
        let policy = parse(
            "[[hooks]]\nname = \"keep-context\"\nevent = \"PreCompact\"\n\
             command = [\"check-compaction\"]\nmandatory = true\n",
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.hooks[0].event, HookEvent::PreCompact);
        assert_eq!(policy.hooks[0].matcher, ToolMatcher::Any);
        assert_eq!(policy.hooks_for(HookEvent::PreCompact, None).count(), 1);
        assert_eq!(policy.hooks_for(HookEvent::PreToolUse, None).count(), 0);
    }

    #[test]
    fn a_full_configuration_builds() {
        let policy = parse(
            r#"
[[hooks]]
name = "guard"
event = "PreToolUse"
matcher = ["Bash", "shell"]
command = ["/usr/local/bin/guard", "--strict"]
timeout_ms = 2000
[[hooks]]
event = "PreToolUse"
matcher = "Write"
builtin = "deny"
mandatory = false
[permissions]
mode = "read_only"
deny = ["Bash(rm *)"]
ask = ["Bash(git push*)"]
allow = ["Read"]
unmatched = "deny"
ask_timeout_s = 60
"#,
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.hooks.len(), 2);
        assert_eq!(policy.hooks[0].name, "guard");
        assert_eq!(
            policy.hooks[0].action,
            HookAction::Command {
                program: "/usr/local/bin/guard".into(),
                args: vec!["--strict".into()]
            }
        );
        assert!(policy.hooks[0].mandatory);
        assert_eq!(policy.hooks[1].name, "hooks[1]");
        assert_eq!(policy.hooks[1].timeout_ms, HOOK_TIMEOUT_MS_DEFAULT);
        assert!(!policy.hooks[1].mandatory);
        assert_eq!(policy.mode, Some(PermissionMode::ReadOnly));
        assert_eq!(policy.unmatched, Unmatched::Deny);
        assert_eq!(policy.ask_timeout_ms, 60_000);
        assert_eq!(policy.deny[0].to_string(), "Bash(rm *)");
    }

    #[test]
    fn nothing_configured_is_an_empty_policy() {
        let policy = parse("").build().unwrap_or_else(|e| panic!("{e}"));
        assert!(policy.is_empty());
    }

    #[test]
    fn invalid_fields_are_named() {
        let hook = "[[hooks]]\nevent = \"PreToolUse\"\n";
        check_err(hook, "hooks[0].command", "command or builtin");
        check_err(
            &format!("{hook}command = [\"a\"]\nbuiltin = \"deny\"\n"),
            "hooks[0].command",
            "not both",
        );
        check_err(
            &format!("{hook}command = []\n"),
            "hooks[0].command",
            "non-empty",
        );
        check_err(
            &format!("{hook}command = [\"a\"]\ntimeout_ms = 0\n"),
            "hooks[0].timeout_ms",
            "1 to",
        );
        check_err(
            &format!("{hook}command = [\"a\"]\nmatcher = []\n"),
            "hooks[0].matcher",
            "non-empty",
        );
        check_err(
            &format!("{hook}command = [\"a\"]\nname = \"\"\n"),
            "hooks[0].name",
            "1 to",
        );
        check_err(
            &format!(
                "{hook}command = [\"a\"]\nname = \"x\"\n{hook}builtin = \"deny\"\nname = \"x\"\n"
            ),
            "hooks[1].name",
            "two hooks",
        );
        check_err(
            "[[hooks]]\nevent = \"Stop\"\ncommand = [\"a\"]\n",
            "hooks[0].event",
            "not run by keel",
        );
        check_err(
            "[[hooks]]\nevent = \"PreCompact\"\ncommand = [\"a\"]\nmatcher = \"auto\"\n",
            "hooks[0].matcher",
            "leave matcher out",
        );
        check_err(
            "[[hooks]]\nevent = \"PreCompact\"\nbuiltin = \"deny\"\n",
            "hooks[0].builtin",
            "PreCompact hooks are commands",
        );
        check_err(
            "[[hooks]]\nevent = \"SubagentStart\"\nbuiltin = \"deny\"\n",
            "hooks[0].builtin",
            "SubagentStart hooks are commands",
        );
        check_err(
            "[permissions]\ndeny = [\"Bash\", \"Bash(rm *\"]\n",
            "permissions.deny[1]",
            "pattern",
        );
        check_err(
            "[permissions]\nask_timeout_s = 0\n",
            "permissions.ask_timeout_s",
            "seconds",
        );
    }

    #[test]
    fn every_gate_kind_builds_and_bad_fields_are_named() {
        let policy = parse(
            r#"
[[gates]]
name = "push"
kind = "count"
rule = "Bash(git push*)"
max_calls = 2
per = "run"
[[gates]]
name = "tested"
kind = "prerequisite"
rule = "Bash(git push*)"
after = "Bash(cargo test*)"
[[gates]]
name = "approval"
kind = "token"
rule = "pay"
issued_by = "approve"
[[gates]]
name = "spend"
kind = "cap"
rule = "pay"
field = "payment.amount"
max_total = 100.25
"#,
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
        let scopes: Vec<GateScope> = policy.gates.iter().map(|g| g.per).collect();
        assert_eq!(
            scopes,
            [
                GateScope::Run,
                GateScope::Task,
                GateScope::Run,
                GateScope::Run
            ]
        );
        assert_eq!(
            policy.gates[3].check,
            GateCheck::Cap {
                field: "payment.amount".into(),
                max_micros: 100_250_000
            }
        );
        assert!(!policy.is_empty());
        let g = |kind: &str, rest: &str| {
            format!("[[gates]]\nname = \"p\"\nkind = \"{kind}\"\nrule = \"x\"\n{rest}")
        };
        check_err(&g("count", ""), "gates[0].max_calls", "needs max_calls");
        check_err(&g("prerequisite", ""), "gates[0].after", "needs after");
        check_err(&g("token", ""), "gates[0].issued_by", "needs issued_by");
        check_err(
            &g("cap", "max_total = 1\n"),
            "gates[0].field",
            "needs field",
        );
        check_err(
            &g("cap", "field = \"a\"\n"),
            "gates[0].max_total",
            "needs max_total",
        );
        check_err(
            &g("cap", "field = \"a..b\"\nmax_total = 1\n"),
            "gates[0].field",
            "dotted path",
        );
        check_err(
            &g("cap", "field = \"a\"\nmax_total = -1\n"),
            "gates[0].max_total",
            "from 0",
        );
        check_err(
            &g("count", "max_calls = 1\nafter = \"y\"\n"),
            "gates[0].after",
            "belongs to prerequisite gates, not count",
        );
        check_err(
            &g("prerequisite", "after = \"y(\"\n"),
            "gates[0].after",
            "pattern",
        );
        check_err(
            &format!(
                "{}{}",
                g("count", "max_calls = 1\n"),
                g("count", "max_calls = 1\n")
            ),
            "gates[1].name",
            "two gates",
        );
    }

    #[test]
    fn agent_rules_build_and_bad_ones_are_named() {
        let policy = parse(
            r#"
[[agents]]
name = "plain"
[[agents]]
name = "careful"
permission_mode = "read_only"
rules = { deny = ["Bash(rm *)"], ask = ["Bash(git push*)"], allow = ["Read"] }
"#,
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.agents.len(), 1, "an agent without rules adds none");
        let careful = policy
            .agent_rules("careful")
            .unwrap_or_else(|| panic!("no rules for careful"));
        assert_eq!(careful.mode, Some(PermissionMode::ReadOnly));
        assert_eq!(careful.deny[0].to_string(), "Bash(rm *)");
        assert!(policy.agent_rules("plain").is_none());
        assert!(!policy.is_empty());
        check_err(
            "[[agents]]\nname = \"a\"\n[[agents]]\nname = \"b\"\nrules = { ask = [\"ok\", \"Bash(x\"] }\n",
            "agents[1].rules.ask[1]",
            "pattern",
        );
        assert!(
            toml::from_str::<PolicyConfig>("[[agents]]\nname = \"a\"\nrules = { maybe = [] }\n")
                .is_err()
        );
    }

    #[test]
    fn unknown_keys_and_events_are_refused_by_the_parser() {
        assert!(
            toml::from_str::<PolicyConfig>("[[hooks]]\nevent = \"PreToolUse\"\ncomand = [\"a\"]\n")
                .is_err()
        );
        assert!(
            toml::from_str::<PolicyConfig>(
                "[[hooks]]\nevent = \"BeforeTool\"\nbuiltin = \"deny\"\n"
            )
            .is_err()
        );
        assert!(toml::from_str::<PolicyConfig>("[permissions]\nmode = \"yolo\"\n").is_err());
    }
}
