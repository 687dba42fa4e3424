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

use keel_harness::ToolOutput;

use crate::call::ToolCall;
use crate::chain::{AuditLine, HookOutcome, HookResult, Policy};
use crate::event::{EventOutcome, EventResult, interpret_event};
use crate::hook::{BuiltinHook, HookAction, HookEvent, HookSpec};
use crate::post::{PostHookOutcome, PostHookResult};

/// Most bytes of a hook's stdout, its answer: a hook that writes more failed (its answer is never
/// read cut short: a rewrite or a denial cut in the middle must not pass for "keep" or "no
/// opinion"). Large enough for a `PostToolUse` hook to hand back a rewritten result.
pub const HOOK_OUTPUT_BYTES_MAX: u64 = 1024 * 1024;

/// Most bytes of a hook's stderr read (a reason, shown to the model or a human); the rest is
/// ignored.
pub const HOOK_STDERR_BYTES_MAX: u64 = 16 * 1024;

/// Runs the `PreToolUse` hooks for `call` in the policy's order (a command with `payload` on
/// stdin, a hook in code with the call), until one ends the hooks. The outcomes go to
/// [`Policy::decide`].
pub async fn run_hooks(policy: &Policy, call: &ToolCall, payload: &Value) -> Vec<HookOutcome> {
    let mut outcomes = Vec::new();
    for hook in policy.hooks_for(HookEvent::PreToolUse, Some(&call.tool)) {
        let result = match &hook.action {
            HookAction::Code(code) => in_code(&hook.name, || code.0.before_tool(call))
                .unwrap_or_else(|error| HookResult::Failed { error }),
            _ => run_hook(hook, payload).await,
        };
        let outcome = HookOutcome {
            hook: hook.name.clone(),
            mandatory: hook.mandatory,
            result,
        };
        let end = outcome.ends_hooks();
        outcomes.push(outcome);
        if end {
            break;
        }
    }
    outcomes
}

/// Runs the hooks of session event `event` (`SubagentStart`, `SubagentStop`, `PreCompact`) whose
/// matcher picks `agent` (`None`: only hooks matching `*`), in the policy's order, until one ends
/// them (a veto, or a mandatory hook's failure): a command with `payload` on stdin, a hook in code
/// with the payload. The outcomes go to [`crate::event::decide_event`].
pub async fn run_event_hooks(
    policy: &Policy,
    event: HookEvent,
    agent: Option<&str>,
    payload: &Value,
) -> Vec<EventOutcome> {
    let mut outcomes = Vec::new();
    for hook in policy.hooks_for(event, agent) {
        let result = match &hook.action {
            HookAction::Code(code) => in_code(&hook.name, || code.0.on_event(event, payload))
                .unwrap_or_else(|error| EventResult::Failed { error }),
            HookAction::Command { program, args } => {
                let run = run_command(program, args, payload);
                match tokio::time::timeout(Duration::from_millis(hook.timeout_ms), run).await {
                    Ok(Ok((code, out, err))) => interpret_event(code, &out, &err),
                    Ok(Err(error)) => EventResult::Failed { error },
                    Err(_) => EventResult::TimedOut {
                        after_ms: hook.timeout_ms,
                    },
                }
            }
            HookAction::Builtin(BuiltinHook::Deny) => EventResult::Veto {
                reason: format!("hook {} refuses every {}", hook.name, event.as_str()),
            },
            HookAction::Builtin(BuiltinHook::Allow) => EventResult::NoOpinion,
        };
        let outcome = EventOutcome {
            hook: hook.name.clone(),
            mandatory: hook.mandatory,
            result,
        };
        let end = outcome.ends_hooks();
        outcomes.push(outcome);
        if end {
            break;
        }
    }
    outcomes
}

/// Runs a hook in code, a panic being its failure.
fn in_code<T>(name: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|_| format!("hook {name} panicked"))
}

/// Runs the `PostToolUse` hooks for `call` in the policy's order, each on the result the previous
/// one handed on (a command with `payload` plus `tool_response` on stdin, a hook in code with the
/// result), until one withholds it: the result the model sees and the audit trail.
pub async fn run_post_hooks(
    policy: &Policy,
    call: &ToolCall,
    payload: &Value,
    output: ToolOutput,
) -> (ToolOutput, Vec<AuditLine>) {
    let mut output = output;
    let mut trail = Vec::new();
    for hook in policy.hooks_for(HookEvent::PostToolUse, Some(&call.tool)) {
        let result = match &hook.action {
            HookAction::Code(code) => in_code(&hook.name, || code.0.after_tool(call, &output))
                .unwrap_or_else(|error| PostHookResult::Failed { error }),
            HookAction::Command { program, args } => {
                let mut payload = payload.clone();
                if let Some(obj) = payload.as_object_mut() {
                    obj.insert("hook_event_name".into(), "PostToolUse".into());
                    obj.insert(
                        "tool_response".into(),
                        serde_json::json!({"is_error": output.is_error, "output": output.text}),
                    );
                }
                let run = run_command(program, args, &payload);
                match tokio::time::timeout(Duration::from_millis(hook.timeout_ms), run).await {
                    Ok(Ok((code, out, err))) => interpret_post(code, &out, &err),
                    Ok(Err(error)) => PostHookResult::Failed { error },
                    Err(_) => PostHookResult::TimedOut {
                        after_ms: hook.timeout_ms,
                    },
                }
            }
            // The configuration refuses built-ins here; one registered anyway keeps the result.
            HookAction::Builtin(_) => PostHookResult::Keep,
        };
        let outcome = PostHookOutcome {
            hook: hook.name.clone(),
            mandatory: hook.mandatory,
            result,
        };
        let (line, ends) = outcome.apply(&mut output);
        trail.push(line);
        if ends {
            break;
        }
    }
    (output, trail)
}

/// A `PostToolUse` command hook's answer (pure): exit 0 with nothing is keep; exit 0 with
/// `{"hookSpecificOutput": {"updatedToolOutput": "..."}}` rewrites; exit 0 with `{"decision":
/// "block", "reason": ...}` (Claude Code's shape) or exit 2 (stderr as the reason) withholds;
/// anything else is a failure.
pub fn interpret_post(code: Option<i32>, stdout: &str, stderr: &str) -> PostHookResult {
    let stderr = stderr.trim();
    match code {
        Some(0) => {
            let Ok(v) = serde_json::from_str::<Value>(stdout.trim()) else {
                return PostHookResult::Keep;
            };
            if v.get("decision").and_then(Value::as_str) == Some("block") {
                let reason = v
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("the result was withheld by a hook");
                return PostHookResult::Withhold {
                    reason: reason.to_owned(),
                };
            }
            match v
                .get("hookSpecificOutput")
                .and_then(|o| o.get("updatedToolOutput"))
            {
                None => PostHookResult::Keep,
                Some(Value::String(text)) => PostHookResult::Rewrite { text: text.clone() },
                Some(other) => PostHookResult::Failed {
                    error: format!("updatedToolOutput is not a string: {other}"),
                },
            }
        }
        code => match refused_or_failed(code, stderr, "the result was withheld by a hook (exit 2)")
        {
            Ok(reason) => PostHookResult::Withhold { reason },
            Err(error) => PostHookResult::Failed { error },
        },
    }
}

/// What a command hook's exit status other than 0 says: exit 2 refuses, with stderr as the reason
/// (`refused` when it is empty); anything else, a signal included, is a failure.
fn refused_or_failed(code: Option<i32>, stderr: &str, refused: &str) -> Result<String, String> {
    match code {
        Some(2) if stderr.is_empty() => Ok(refused.to_owned()),
        Some(2) => Ok(stderr.to_owned()),
        Some(code) => Err(format!("exit {code}: {stderr}")),
        None => Err(format!("killed by a signal: {stderr}")),
    }
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
                Ok(Ok((code, out, err))) => interpret(code, &out, &err),
                Ok(Err(error)) => HookResult::Failed { error },
                Err(_) => HookResult::TimedOut {
                    after_ms: hook.timeout_ms,
                },
            }
        }
        HookAction::Code(code) => {
            let call = ToolCall::new(
                tool_of(payload),
                payload.get("tool_input").cloned().unwrap_or(Value::Null),
            );
            in_code(&hook.name, || code.0.before_tool(&call))
                .unwrap_or_else(|error| HookResult::Failed { error })
        }
    }
}

fn tool_of(payload: &Value) -> &str {
    payload
        .get("tool_name")
        .and_then(Value::as_str)
        .unwrap_or("matched")
}

/// Runs a command hook with `payload` on stdin: its exit code, stdout and stderr, or why it could
/// not run.
async fn run_command(
    program: &str,
    args: &[String],
    payload: &Value,
) -> Result<(Option<i32>, String, String), String> {
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
        Err(e) => return Err(format!("could not start {program}: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that exits without reading its stdin is fine: its exit status decides.
        let _ = stdin.write_all(payload.to_string().as_bytes()).await;
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let read_out = async {
        if let Some(s) = stdout {
            // One byte past the limit tells a full answer from a cut one.
            let _ = s
                .take(HOOK_OUTPUT_BYTES_MAX + 1)
                .read_to_end(&mut out)
                .await;
        }
    };
    let read_err = async {
        if let Some(s) = stderr {
            let _ = s.take(HOOK_STDERR_BYTES_MAX).read_to_end(&mut err).await;
        }
    };
    tokio::join!(read_out, read_err);
    let out = answer_text(program, out)?;
    let err = String::from_utf8_lossy(&err).into_owned();
    match child.wait().await {
        Ok(status) => Ok((status.code(), out, err)),
        Err(e) => Err(format!("waiting for {program}: {e}")),
    }
}

/// A hook's stdout as its answer, or why it cannot be one: over [`HOOK_OUTPUT_BYTES_MAX`] (read
/// cut short, a JSON answer would not parse and pass for no answer at all) or not UTF-8.
fn answer_text(program: &str, out: Vec<u8>) -> Result<String, String> {
    if out.len() as u64 > HOOK_OUTPUT_BYTES_MAX {
        return Err(format!(
            "{program} wrote more than {HOOK_OUTPUT_BYTES_MAX} bytes on stdout: its answer is not read"
        ));
    }
    String::from_utf8(out).map_err(|_| format!("{program} wrote stdout that is not UTF-8"))
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
        code => match refused_or_failed(code, stderr, "denied by a hook (exit 2)") {
            Ok(reason) => HookResult::Deny { reason },
            Err(error) => HookResult::Failed { error },
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

    /// A `PostToolUse` redaction that hands back a 20 KB result is read whole (it once passed for
    /// "keep" when cut at 16 KiB, and the unredacted result reached the model); an answer over the
    /// limit is a failure, never a cut answer.
    #[tokio::test]
    async fn a_large_rewrite_is_read_whole_and_an_answer_over_the_limit_fails() {
        let big = "x".repeat(20_000);
        let script =
            format!(r#"printf '{{"hookSpecificOutput":{{"updatedToolOutput":"%s"}}}}' '{big}'"#);
        let payload = json!({"hook_event_name": "PostToolUse", "tool_name": "Bash"});
        let (code, out, _) = run_command("/bin/sh", &["-c".into(), script], &payload)
            .await
            .unwrap();
        match interpret_post(code, &out, "") {
            PostHookResult::Rewrite { text } => assert_eq!(text, big),
            other => panic!("{other:?}"),
        }
        let over = format!(
            "head -c {} /dev/zero | tr '\\0' x",
            HOOK_OUTPUT_BYTES_MAX + 10
        );
        let err = run_command("/bin/sh", &["-c".into(), over], &payload)
            .await
            .unwrap_err();
        assert!(err.contains("more than"), "{err}");
        assert!(answer_text("h", vec![0xff, 0xfe]).is_err());
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
        let call = ToolCall::new("Bash", json!({}));
        let outcomes = run_hooks(&policy, &call, &json!({})).await;
        let names: Vec<&str> = outcomes.iter().map(|o| o.hook.as_str()).collect();
        assert_eq!(names, ["first", "second"]);
        assert!(!marker.exists(), "a hook after a denial ran");
    }

    struct Redactor;

    impl crate::hook::CodeHook for Redactor {
        fn before_tool(&self, call: &ToolCall) -> HookResult {
            if call.subject().is_some_and(|s| s.contains("panic")) {
                panic!("a hook in code panicked");
            }
            HookResult::NoOpinion
        }

        fn after_tool(&self, _call: &ToolCall, output: &ToolOutput) -> PostHookResult {
            PostHookResult::Rewrite {
                text: output.text.replace("hunter2", "[REDACTED]"),
            }
        }
    }

    #[tokio::test]
    async fn post_hooks_run_in_order_on_the_result_so_far_and_code_hooks_follow_the_configured() {
        let mut policy = Policy {
            hooks: vec![HookSpec {
                event: HookEvent::PostToolUse,
                ..command_hook(
                    "upper",
                    r#"out=$(cat | sed -n 's/.*"output":"\([^"]*\)".*/\1/p' | tr a-z A-Z); printf '{"hookSpecificOutput":{"updatedToolOutput":"%s"}}' "$out""#,
                    10_000,
                )
            }],
            ..Policy::default()
        };
        policy
            .register_hook(HookSpec::code(
                "redact",
                HookEvent::PostToolUse,
                ToolMatcher::Any,
                std::sync::Arc::new(Redactor),
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        let call = ToolCall::new("Bash", json!({"command": "cat pw"}));
        let (out, trail) = run_post_hooks(
            &policy,
            &call,
            &json!({"tool_name": "Bash"}),
            ToolOutput {
                is_error: false,
                text: "pw hunter2".into(),
            },
        )
        .await;
        // The command upper-cased first, so the code hook saw HUNTER2 and left it.
        assert_eq!(out.text, "PW HUNTER2");
        let names: Vec<&str> = trail.iter().map(|l| l.who.as_str()).collect();
        assert_eq!(names, ["hook:upper", "hook:redact"]);
        assert!(trail.iter().all(|l| l.rewritten));

        let hangs = Policy {
            hooks: vec![HookSpec {
                event: HookEvent::PostToolUse,
                ..command_hook("hangs", "sleep 30", 200)
            }],
            ..Policy::default()
        };
        let (out, _) = run_post_hooks(
            &hangs,
            &call,
            &json!({}),
            ToolOutput {
                is_error: false,
                text: "hunter2".into(),
            },
        )
        .await;
        assert!(out.is_error && !out.text.contains("hunter2"), "{out:?}");
    }

    #[tokio::test]
    async fn a_hook_in_code_that_panics_fails_closed_and_runs_after_the_configured_ones() {
        let mut policy = Policy {
            hooks: vec![command_hook("first", "exit 0", 5_000)],
            ..Policy::default()
        };
        policy
            .register_hook(HookSpec::code(
                "code",
                HookEvent::PreToolUse,
                ToolMatcher::Any,
                std::sync::Arc::new(Redactor),
            ))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            policy
                .register_hook(HookSpec::code(
                    "code",
                    HookEvent::PreToolUse,
                    ToolMatcher::Any,
                    std::sync::Arc::new(Redactor),
                ))
                .is_err()
        );
        let call = ToolCall::new("Bash", json!({"command": "panic now"}));
        let outcomes = run_hooks(&policy, &call, &json!({})).await;
        let names: Vec<&str> = outcomes.iter().map(|o| o.hook.as_str()).collect();
        assert_eq!(names, ["first", "code"]);
        assert!(matches!(outcomes[1].result, HookResult::Failed { .. }));
        let v = policy.decide(&call, keel_harness::PermissionMode::Bypass, &outcomes);
        assert_eq!(v.decision, crate::chain::Decision::Deny);
        assert_eq!(
            interpret_post(Some(0), r#"{"decision":"block","reason":"no"}"#, ""),
            PostHookResult::Withhold {
                reason: "no".into()
            }
        );
        assert_eq!(interpret_post(Some(0), "", ""), PostHookResult::Keep);
        assert!(matches!(
            interpret_post(Some(3), "", "x"),
            PostHookResult::Failed { .. }
        ));
    }
}
