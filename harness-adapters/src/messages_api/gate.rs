//! The pre-tool gate for keel's own loop: the spec's gate command checks each tool call before it
//! runs, with the same contract as a Claude Code `PreToolUse` command hook, so one gate program
//! serves every harness (docs/DESIGN.md §9).
//!
//! Contract: a JSON payload on stdin (`hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`,
//! `cwd`); exit 0 allows unless stdout holds a Claude-style JSON `deny` decision; exit 2 denies with
//! stderr as the reason; anything else (other exit codes, a crash, a timeout) denies: a mandatory
//! gate fails closed.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::spec::GateCommand;
use crate::tools::ToolError;

/// Most bytes of gate output read.
pub const GATE_OUTPUT_BYTES_MAX: u64 = 16 * 1024;

/// Asks the gate about one call, with the session's `env` added to keel's own environment.
///
/// # Errors
/// A permission [`ToolError`] carrying the gate's reason when the call is denied.
pub async fn check(
    gate: &GateCommand,
    env: &std::collections::BTreeMap<String, String>,
    cwd: &Path,
    tool_use_id: &str,
    tool_name: &str,
    input: &Value,
) -> Result<(), ToolError> {
    let payload = json!({"hook_event_name": "PreToolUse", "tool_name": tool_name, "tool_input": input,
                         "tool_use_id": tool_use_id, "cwd": cwd.display().to_string()});
    let mut child = tokio::process::Command::new(&gate.program)
        .args(&gate.args)
        // The spec's variables (a session-scoped token for keel's hook bridge, for one) reach the
        // gate as they reach a CLI's hooks.
        .envs(env)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            ToolError::permission(format!("the pre-tool gate could not start (denied): {e}"))
        })?;
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A gate that exits without reading its stdin is fine.
            let _ = stdin.write_all(payload.to_string().as_bytes()).await;
        }
        let mut out = String::new();
        let mut err = String::new();
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let read_out = async {
            if let Some(s) = stdout {
                let _ = s.take(GATE_OUTPUT_BYTES_MAX).read_to_string(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr {
                let _ = s.take(GATE_OUTPUT_BYTES_MAX).read_to_string(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    let (status, out, err) = tokio::time::timeout(Duration::from_millis(gate.timeout_ms), run)
        .await
        .map_err(|_| {
            ToolError::permission(format!(
                "the pre-tool gate timed out after {} ms (denied)",
                gate.timeout_ms
            ))
        })?;
    let status = status
        .map_err(|e| ToolError::permission(format!("the pre-tool gate failed (denied): {e}")))?;
    match status.code() {
        Some(0) => match json_deny_reason(&out) {
            Some(reason) => Err(ToolError::permission(reason)),
            None => Ok(()),
        },
        Some(2) => Err(ToolError::permission(err.trim().to_owned())),
        other => Err(ToolError::permission(format!(
            "the pre-tool gate failed ({other:?}), denied: {}",
            err.trim()
        ))),
    }
}

fn json_deny_reason(stdout: &str) -> Option<String> {
    let v: Value = serde_json::from_str(stdout.trim()).ok()?;
    let out = v.get("hookSpecificOutput")?;
    if out.get("permissionDecision").and_then(Value::as_str) != Some("deny") {
        return None;
    }
    Some(
        out.get("permissionDecisionReason")
            .and_then(Value::as_str)
            .unwrap_or("denied by the pre-tool gate")
            .to_owned(),
    )
}
