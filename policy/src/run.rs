//! Running hooks (feature `io`): each matched hook of an event in the policy's fixed order, a command
//! hook as a process with its timeout, stopping at the first outcome that ends the hooks. A hook that
//! cannot start, crashes, answers nonsense or outlives its timeout is a failure, which the chain turns
//! into a denial when the hook is mandatory (it fails closed).
//!
//! A command hook gets Claude Code's command-hook contract, so one hook program serves every harness:
//! a JSON payload on stdin (`hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`, `cwd`, plus
//! keel's `run_id`, `task_id`, `harness`); exit 0 with nothing on stdout is no opinion; exit 0 with
//! `{"hookSpecificOutput": {"permissionDecision": "allow"|"deny"|"ask", "permissionDecisionReason":
//! ...}}` decides; exit 2 denies with stderr as the reason; anything else is a failure.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::chain::{HookOutcome, HookResult, Policy};
use crate::hook::{BuiltinHook, HookAction, HookEvent, HookSpec};

/// Most bytes of a hook's stdout or stderr read; the rest is ignored.
pub const HOOK_OUTPUT_BYTES_MAX: u64 = 16 * 1024;

/// Runs the hooks of `event` for a call of `tool` (or none, for an event without a tool) in the
/// policy's order with `payload` on stdin, until one ends the hooks. The outcomes go to
/// [`Policy::decide`].
pub async fn run_hooks(
    policy: &Policy,
    event: HookEvent,
    tool: Option<&str>,
    payload: &Value,
) -> Vec<HookOutcome> {
    let mut outcomes = Vec::new();
    for hook in policy.hooks_for(event, tool) {
        let outcome = HookOutcome {
            hook: hook.name.clone(),
            mandatory: hook.mandatory,
            result: run_hook(hook, payload).await,
        };
        let end = outcome.ends_hooks();
        outcomes.push(outcome);
        if end {
            break;
        }
    }
    outcomes
}

/// Runs one hook.
pub async fn run_hook(hook: &HookSpec, payload: &Value) -> HookResult {
    match &hook.action {
        HookAction::Builtin(BuiltinHook::Deny) => HookResult::Deny {
            reason: format!("hook {} denies every {} call", hook.name, tool_of(payload)),
        },
        HookAction::Builtin(BuiltinHook::Allow) => HookResult::Allow {
            reason: format!("hook {} allows it", hook.name),
        },
        HookAction::Command { program, args } => {
            let run = run_command(program, args, payload);
            match tokio::time::timeout(Duration::from_millis(hook.timeout_ms), run).await {
                Ok(result) => result,
                Err(_) => HookResult::TimedOut {
                    after_ms: hook.timeout_ms,
                },
            }
        }
    }
}

fn tool_of(payload: &Value) -> &str {
    payload
        .get("tool_name")
        .and_then(Value::as_str)
        .unwrap_or("matched")
}

async fn run_command(program: &str, args: &[String], payload: &Value) -> HookResult {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(cwd) = payload.get("cwd").and_then(Value::as_str)
        && std::path::Path::new(cwd).is_dir()
    {
        cmd.current_dir(cwd);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return HookResult::Failed {
                error: format!("could not start {program}: {e}"),
            };
        }
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that exits without reading its stdin is fine: its exit status decides.
        let _ = stdin.write_all(payload.to_string().as_bytes()).await;
    }
    let (mut out, mut err) = (String::new(), String::new());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let read_out = async {
        if let Some(s) = stdout {
            let _ = s.take(HOOK_OUTPUT_BYTES_MAX).read_to_string(&mut out).await;
        }
    };
    let read_err = async {
        if let Some(s) = stderr {
            let _ = s.take(HOOK_OUTPUT_BYTES_MAX).read_to_string(&mut err).await;
        }
    };
    tokio::join!(read_out, read_err);
    match child.wait().await {
        Ok(status) => interpret(status.code(), &out, &err),
        Err(e) => HookResult::Failed {
            error: format!("waiting for {program}: {e}"),
        },
    }
}

/// A command hook's answer from its exit code, stdout and stderr (pure).
pub fn interpret(code: Option<i32>, stdout: &str, stderr: &str) -> HookResult {
    let stderr = stderr.trim();
    match code {
        Some(0) => {
            let text = stdout.trim();
            if text.is_empty() {
                return HookResult::NoOpinion;
            }
            let Ok(v) = serde_json::from_str::<Value>(text) else {
                // Claude Code shows plain stdout to the user and carries on: no opinion.
                return HookResult::NoOpinion;
            };
            let out = v.get("hookSpecificOutput").unwrap_or(&Value::Null);
            let reason = out
                .get("permissionDecisionReason")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match out.get("permissionDecision").and_then(Value::as_str) {
                None => HookResult::NoOpinion,
                Some("allow") => HookResult::Allow { reason },
                Some("deny") => HookResult::Deny {
                    reason: if reason.is_empty() {
                        "denied by a hook".into()
                    } else {
                        reason
                    },
                },
                Some("ask") => HookResult::Ask { reason },
                Some(other) => HookResult::Failed {
                    error: format!("unknown permissionDecision {other:?}"),
                },
            }
        }
        Some(2) => HookResult::Deny {
            reason: if stderr.is_empty() {
                "denied by a hook (exit 2)".into()
            } else {
                stderr.to_owned()
            },
        },
        Some(code) => HookResult::Failed {
            error: format!("exit {code}: {stderr}"),
        },
        None => HookResult::Failed {
            error: format!("killed by a signal: {stderr}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hook::ToolMatcher;
    use serde_json::json;

    #[test]
    fn exit_codes_and_json_answers_are_read_like_claude_code_does() {
        let deny_json = r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"deny","permissionDecisionReason":"no rm"}}"#;
        assert_eq!(
            interpret(Some(0), deny_json, ""),
            HookResult::Deny {
                reason: "no rm".into()
            }
        );
        assert_eq!(interpret(Some(0), "", ""), HookResult::NoOpinion);
        assert_eq!(interpret(Some(0), "hello", ""), HookResult::NoOpinion);
        assert_eq!(
            interpret(Some(2), "", "not here\n"),
            HookResult::Deny {
                reason: "not here".into()
            }
        );
        assert!(matches!(
            interpret(Some(1), "", "boom"),
            HookResult::Failed { .. }
        ));
        assert!(matches!(interpret(None, "", ""), HookResult::Failed { .. }));
        assert!(matches!(
            interpret(
                Some(0),
                r#"{"hookSpecificOutput":{"permissionDecision":"maybe"}}"#,
                ""
            ),
            HookResult::Failed { .. }
        ));
    }

    fn command_hook(name: &str, script: &str, timeout_ms: u64) -> HookSpec {
        HookSpec {
            name: name.into(),
            event: HookEvent::PreToolUse,
            matcher: ToolMatcher::Any,
            action: HookAction::Command {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()],
            },
            timeout_ms,
            mandatory: true,
        }
    }

    #[tokio::test]
    async fn a_command_hook_reads_the_payload_and_a_hung_one_times_out() {
        let payload = json!({"hook_event_name": "PreToolUse", "tool_name": "Bash",
                             "tool_input": {"command": "touch x"}});
        let reads = command_hook(
            "reads",
            "grep -q '\"touch x\"' && { echo 'no touching' >&2; exit 2; }; exit 0",
            10_000,
        );
        assert_eq!(
            run_hook(&reads, &payload).await,
            HookResult::Deny {
                reason: "no touching".into()
            }
        );
        let hangs = command_hook("hangs", "sleep 30", 200);
        assert_eq!(
            run_hook(&hangs, &payload).await,
            HookResult::TimedOut { after_ms: 200 }
        );
        let missing = HookSpec {
            action: HookAction::Command {
                program: "/nonexistent/keel-hook".into(),
                args: Vec::new(),
            },
            ..hangs.clone()
        };
        assert!(matches!(
            run_hook(&missing, &payload).await,
            HookResult::Failed { .. }
        ));
    }

    #[tokio::test]
    async fn hooks_run_in_order_and_stop_at_a_denial() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let marker = dir.path().join("third-ran");
        let policy = Policy {
            hooks: vec![
                command_hook("first", "exit 0", 5_000),
                command_hook("second", "echo stop >&2; exit 2", 5_000),
                command_hook("third", &format!("touch {}", marker.display()), 5_000),
            ],
            ..Policy::default()
        };
        let outcomes = run_hooks(&policy, HookEvent::PreToolUse, Some("Bash"), &json!({})).await;
        let names: Vec<&str> = outcomes.iter().map(|o| o.hook.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
        assert!(!marker.exists(), "a hook after a denial ran");
    }
}
