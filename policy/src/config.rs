//! The policy as keel.toml writes it: `[[hooks]]` and `[permissions]` (docs/CONFIG.md), read strictly
//! (unknown keys refused) and turned into a [`Policy`] by [`PolicyConfig::build`], whose errors name the
//! field (`hooks[1].timeout_ms`, `permissions.deny[0]`).

use keel_harness::PermissionMode;
use serde::{Deserialize, Serialize};

use crate::chain::{Policy, Unmatched};
use crate::gate::{CountGate, GateScope};
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `[[hooks]]`.
    pub hooks: Vec<HookConfig>,
    /// `[permissions]`.
    pub permissions: PermissionsConfig,
    /// `[[gates]]`.
    pub gates: Vec<GateConfig>,
}

/// The kinds of gate (docs/CONFIG.md). Only `count` is built; the others are refused by
/// [`PolicyConfig::build`] rather than accepted and not enforced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateKind {
    /// At most `max_calls` calls matching `rule` per task or run.
    Count,
    /// A tool only after another succeeded in the task (not built).
    Prerequisite,
    /// A tool only with a token issued by an earlier step (not built).
    Token,
    /// A numeric field summed over the run, refused past a cap (not built).
    Cap,
}

/// One `[[gates]]` table.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    /// For `count`: per `task` (the default) or per `run`.
    #[serde(default = "gate_scope_default")]
    pub per: GateScope,
}

fn gate_scope_default() -> GateScope {
    GateScope::Task
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
        let mut gates: Vec<CountGate> = Vec::with_capacity(self.gates.len());
        for (i, g) in self.gates.iter().enumerate() {
            let field = |name: &str| format!("gates[{i}].{name}");
            if g.name.trim().is_empty() || g.name.len() > HOOK_NAME_BYTES_MAX {
                return Err(err(
                    field("name"),
                    format!("a name is 1 to {HOOK_NAME_BYTES_MAX} bytes"),
                ));
            }
            if gates.iter().any(|o| o.name == g.name) {
                return Err(err(field("name"), format!("{:?} names two gates", g.name)));
            }
            if g.kind != GateKind::Count {
                return Err(err(
                    field("kind"),
                    format!(
                        "{:?} gates are not built yet (only \"count\"); a gate that never checks \
                         would be a silent gap",
                        g.kind
                    ),
                ));
            }
            let rule = g
                .rule
                .parse()
                .map_err(|e| err(field("rule"), format!("{e}")))?;
            let Some(max_calls) = g.max_calls else {
                return Err(err(field("max_calls"), "a count gate needs max_calls"));
            };
            gates.push(CountGate {
                name: g.name.clone(),
                rule,
                max_calls,
                per: g.per,
            });
        }
        Ok(Policy {
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
    if texts.len() > RULES_MAX {
        return Err(err(
            format!("permissions.{list}"),
            format!("{} rules; at most {RULES_MAX}", texts.len()),
        ));
    }
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.parse()
                .map_err(|e| err(format!("permissions.{list}[{i}]"), format!("{e}")))
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
        if self.event != HookEvent::PreToolUse {
            return Err(err(
                field("event"),
                format!(
                    "{} hooks are not run by keel yet (only PreToolUse is enforced); \
                     a hook that never runs would be a silent gap",
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
            if !self.event.is_tool_event() {
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
            "not run by keel yet",
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
    fn gates_build_and_unbuilt_kinds_are_refused() {
        let policy = parse(
            "[[gates]]\nname = \"push\"\nkind = \"count\"\nrule = \"Bash(git push*)\"\nmax_calls = 2\nper = \"run\"\n",
        )
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(policy.gates.len(), 1);
        assert_eq!(policy.gates[0].per, GateScope::Run);
        assert!(!policy.is_empty());
        check_err(
            "[[gates]]\nname = \"p\"\nkind = \"cap\"\nrule = \"x\"\n",
            "gates[0].kind",
            "not built yet",
        );
        check_err(
            "[[gates]]\nname = \"p\"\nkind = \"count\"\nrule = \"x\"\n",
            "gates[0].max_calls",
            "needs max_calls",
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
