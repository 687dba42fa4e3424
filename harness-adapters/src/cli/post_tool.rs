//! `PostToolUse` on the four CLIs (docs/HARNESSES.md, "Policy hooks"): after a tool call ran, each
//! CLI's native hook hands keel the result, keel's policy records a success (a prerequisite met, a
//! token issued) and runs the `PostToolUse` hooks, and where the CLI lets a hook change what the
//! model sees, the hook's rewrite (normalised, redacted, withheld) replaces the result.
//!
//! This file holds the pure half: reading the result out of each CLI's hook payload, the answer
//! each CLI understands for a changed result, the answer when keel could not check the result
//! (failing closed: the result never reaches the model unchecked), the fail-closed wrapper every
//! hook runs, and the JavaScript the opencode plugin and the pi extension call. The shapes were
//! checked on the pinned CLIs (Claude Code 2.1.197, Codex 0.171.0, opencode 1.18.33, pi 0.73.1):
//!
//! - **Claude Code** gives `tool_response` as the tool's own structured output (Bash: `{stdout,
//!   stderr, interrupted, isImage, noOutputExpected}`) and replaces it with `hookSpecificOutput.
//!   updatedToolOutput`, which must keep the tool's output shape (otherwise it logs an error and
//!   sends the ORIGINAL output); `{"decision": "block"}` only adds a message beside the original.
//!   `{"continue": false}` ends the session before its next model request: the only way to withhold
//!   a result whose shape keel cannot rebuild.
//! - **Codex** gives `tool_response` as a string (the shell's output; an MCP call's result object
//!   `{content, isError}`, whose text blocks keel joins) and, for `{"decision":
//!   "block", "reason": R}`, sends the model R instead of the output (R must not be empty).
//! - **opencode** (`tool.execute.after`, output `{title, output, metadata}`; MCP tools `{content}`)
//!   and **pi** (`tool_result`, `{content, isError}`, answered with `{content, isError}`) let the
//!   plugin replace the result itself: they get keel's plain answer ([`PostAnswer`]).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::SessionFile;
use super::gate::{command_line, shell_quote};
use crate::guard::ToolOutput;
use crate::spec::{GateCommand, HarnessKind};

/// The argument the adapters append to the spec's `post_tool_hook` so the command knows whose
/// payload it reads and whose answer it prints (`keel hook --url URL --post-for claude-code`).
pub const POST_FOR_ARG: &str = "--post-for";

/// The key under which the command hands the node the result as text (`{is_error, text}`), beside
/// the CLI's own payload.
pub const TOOL_OUTPUT_KEY: &str = "tool_output";

/// The `hook_event_name` of Claude Code's after-call hook for a call that failed: its payload has
/// the failure's text in `error` and no `tool_response`, and its answer cannot replace the output
/// (only add context), nor does it honour `{"continue": false}` (probed on 2.1.197).
pub const FAILURE_EVENT: &str = "PostToolUseFailure";

/// Where a session's `PostToolUseFailure` wrapper leaves the fail-closed stop when it could not
/// reach the node, which its `PostToolBatch` wrapper prints at the end of the batch (in the
/// session's own folder). A stop the policy decided is kept by the node, not here: the session's
/// own tools can delete this file.
pub const FAILURE_STOP_FILE: &str = "keel-failure-stop.json";

/// The key `keel hook` adds to a failed call's payload for the node (`true`), so the node keeps
/// the stop a changed result needs for the batch's end.
pub const FAILURE_KEY: &str = "keel_failure";

/// The `hook_event_name` of Claude Code's hook after a batch of calls, before its next model
/// request: `keel hook --post-for claude-code` asks the node whether a failed call of the session
/// needs the session stopped.
pub const BATCH_EVENT: &str = "PostToolBatch";

/// What the model is told when keel could not check a result.
pub const WITHHELD_TEXT: &str =
    "keel: the PostToolUse check could not run, so this result is withheld (failed closed)";

/// keel's plain answer to a `PostToolUse` call, printed for the opencode plugin and the pi
/// extension, which replace the result themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostAnswer {
    /// Whether the result the model sees is an error.
    pub is_error: bool,
    /// The result's text.
    pub text: String,
    /// Whether it differs from what the tool returned (only then does a CLI replace it).
    pub changed: bool,
}

/// The result as text, out of a CLI's `PostToolUse` payload: Claude Code's and Codex's
/// `tool_response`, or the `tool_output` the opencode plugin and the pi extension put in. `None`
/// when the payload holds neither.
pub fn tool_output_of(payload: &Value) -> Option<ToolOutput> {
    if is_failure(payload) {
        // Claude Code's PostToolUseFailure: the failure's text (a shell's exit code and output).
        return Some(ToolOutput {
            is_error: true,
            text: payload.get("error").map(response_text)?,
        });
    }
    if let Some(out) = payload.get(TOOL_OUTPUT_KEY) {
        return Some(ToolOutput {
            is_error: out
                .get("is_error")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            text: out.get("text").and_then(Value::as_str)?.to_owned(),
        });
    }
    let response = payload.get("tool_response")?;
    Some(ToolOutput {
        // Claude Code runs PostToolUse for successes only (failures go to PostToolUseFailure);
        // Codex reports a failed command's output as its result too, not as an error.
        is_error: false,
        text: response_text(response),
    })
}

/// Whether `payload` is Claude Code's `PostToolUseFailure` (a call that failed).
pub fn is_failure(payload: &Value) -> bool {
    payload.get("hook_event_name").and_then(Value::as_str) == Some(FAILURE_EVENT)
}

/// What Claude Code's `PostToolUseFailure` hook prints once keel decided on a failed call's
/// result: nothing when it stands; when the policy changed it (a rewrite, or withheld), which
/// Claude Code cannot take for a failure, the answer that stops the session, which the
/// failure wrapper keeps for the batch's `PostToolBatch` hook ([`install_failure_wrappers`]).
pub fn failure_answer(original: &ToolOutput, final_output: &ToolOutput) -> Option<String> {
    failure_stop_reason(original, final_output).map(|reason| stop_claude_code(&reason))
}

/// Why a failed call's result stops the session, when the policy changed it (the node keeps it
/// for the batch's end, [`BATCH_EVENT`]).
pub fn failure_stop_reason(original: &ToolOutput, final_output: &ToolOutput) -> Option<String> {
    (original != final_output).then(|| {
        format!(
            "keel: a PostToolUse hook changed the result of a failed call, which Claude Code \
             cannot replace, so the session stops before the model sees it: {}",
            first_line(&final_output.text)
        )
    })
}

/// Claude Code's answer that stops the session at a batch's end for `reason`.
pub fn batch_stop_answer(reason: &str) -> String {
    stop_claude_code(reason)
}

/// [`tool_output_of`] for `harness`'s payload, with what keel can tell of the call's success:
/// Codex's `PostToolUse` payload holds a command's output and no exit status, so a Codex result is
/// taken as failed (`is_error`) for the gates: a command that may have failed meets no
/// prerequisite and issues no token (fails closed; prerequisite and token gates are not met
/// through Codex). The hooks still see and may rewrite it, and the model's view is unchanged
/// unless they do.
pub fn tool_output_for(harness: HarnessKind, payload: &Value) -> Option<ToolOutput> {
    let mut output = tool_output_of(payload)?;
    if harness == HarnessKind::Codex && payload.get(TOOL_OUTPUT_KEY).is_none() {
        output.is_error = true;
    }
    Some(output)
}

/// A tool response as the text the policy's hooks read: a string as is; a shell result's stdout
/// (and its stderr after a newline, when there is one); MCP text blocks joined; anything else as
/// its JSON, which a hook can edit and [`rebuilt_response`] reads back.
pub fn response_text(response: &Value) -> String {
    match response {
        Value::String(s) => s.clone(),
        Value::Object(o) if o.get("stdout").is_some_and(Value::is_string) => {
            let stdout = o.get("stdout").and_then(Value::as_str).unwrap_or_default();
            match o.get("stderr").and_then(Value::as_str) {
                Some(err) if !err.is_empty() => format!("{stdout}\n{err}"),
                _ => stdout.to_owned(),
            }
        }
        Value::Array(blocks) if text_blocks(blocks).is_some() => {
            text_blocks(blocks).unwrap_or_default().join("\n")
        }
        // An MCP tool's result as Codex hands it: `{"content": [text blocks], "isError": ...}`.
        Value::Object(o) if mcp_result_blocks(o).is_some() => {
            mcp_result_blocks(o).unwrap_or_default().join("\n")
        }
        other => other.to_string(),
    }
}

/// The text blocks of an MCP tool result object (`{"content": [...], "isError": ...}`, nothing
/// else in it).
fn mcp_result_blocks(o: &serde_json::Map<String, Value>) -> Option<Vec<&str>> {
    if o.keys()
        .any(|k| k != "content" && k != "isError" && k != "structuredContent")
    {
        return None;
    }
    text_blocks(o.get("content")?.as_array()?)
}

fn text_blocks(blocks: &[Value]) -> Option<Vec<&str>> {
    blocks
        .iter()
        .map(|b| {
            (b.get("type").and_then(Value::as_str) == Some("text"))
                .then(|| b.get("text").and_then(Value::as_str))
                .flatten()
        })
        .collect()
}

/// `original`'s shape holding `text` instead: what Claude Code accepts as `updatedToolOutput`. A
/// string stays a string; a shell result gets `text` as its stdout and an empty stderr; text blocks
/// become one block; any other value must be `text` read back as JSON of the same kind (a hook
/// edited the JSON [`response_text`] gave it). `None` when the shape cannot be rebuilt.
pub fn rebuilt_response(original: &Value, text: &str) -> Option<Value> {
    match original {
        Value::String(_) => Some(Value::String(text.to_owned())),
        Value::Object(o) if o.get("stdout").is_some_and(Value::is_string) => {
            let mut o = o.clone();
            o.insert("stdout".into(), Value::String(text.to_owned()));
            if o.contains_key("stderr") {
                o.insert("stderr".into(), Value::String(String::new()));
            }
            Some(Value::Object(o))
        }
        Value::Array(blocks) if text_blocks(blocks).is_some() => {
            Some(json!([{"type": "text", "text": text}]))
        }
        Value::Object(o) if mcp_result_blocks(o).is_some() => {
            let mut o = o.clone();
            o.insert("content".into(), json!([{"type": "text", "text": text}]));
            o.remove("structuredContent");
            Some(Value::Object(o))
        }
        other => {
            let back: Value = serde_json::from_str(text).ok()?;
            let same_kind = matches!(
                (other, &back),
                (Value::Object(_), Value::Object(_))
                    | (Value::Array(_), Value::Array(_))
                    | (Value::Number(_), Value::Number(_))
                    | (Value::Bool(_), Value::Bool(_))
                    | (Value::Null, Value::Null)
            );
            same_kind.then_some(back)
        }
    }
}

/// What the hook prints for `harness` once keel decided: nothing when the result stands, else the
/// CLI's way of replacing it with `final_output` (`payload` is the CLI's payload, `original` the
/// result it held).
pub fn answer_for(
    harness: HarnessKind,
    payload: &Value,
    original: &ToolOutput,
    final_output: &ToolOutput,
) -> Option<String> {
    let changed = original != final_output;
    match harness {
        HarnessKind::ClaudeCode => {
            if !changed {
                return None;
            }
            let rebuilt = payload
                .get("tool_response")
                .and_then(|r| rebuilt_response(r, &final_output.text));
            Some(match rebuilt {
                Some(updated) => json!({"hookSpecificOutput": {"hookEventName": "PostToolUse",
                                         "updatedToolOutput": updated}})
                .to_string(),
                // The shape cannot hold the new text: Claude Code would send the original, so the
                // session ends before the model sees it.
                None => stop_claude_code(&format!(
                    "keel: a PostToolUse hook changed this result and Claude Code cannot take \
                     the change for this tool, so the session stops: {}",
                    first_line(&final_output.text)
                )),
            })
        }
        HarnessKind::Codex => changed.then(|| codex_block(&final_output.text)),
        _ => Some(
            serde_json::to_string(&PostAnswer {
                is_error: final_output.is_error,
                text: final_output.text.clone(),
                changed,
            })
            .unwrap_or_else(|_| failed_closed_answer(harness)),
        ),
    }
}

/// What the hook prints for `harness` when keel could not check the result (the node unreachable,
/// the payload unreadable, the command crashed or timed out): the result never reaches the model.
pub fn failed_closed_answer(harness: HarnessKind) -> String {
    match harness {
        HarnessKind::ClaudeCode => stop_claude_code(WITHHELD_TEXT),
        HarnessKind::Codex => codex_block(WITHHELD_TEXT),
        _ => json!({"is_error": true, "text": WITHHELD_TEXT, "changed": true}).to_string(),
    }
}

fn stop_claude_code(reason: &str) -> String {
    json!({"continue": false, "stopReason": reason}).to_string()
}

/// Codex sends the model a block's reason instead of the output; an empty reason would be refused
/// (and the original sent), so an empty result is said in words.
fn codex_block(text: &str) -> String {
    let reason = if text.trim().is_empty() {
        "(no output)"
    } else {
        text
    };
    json!({"decision": "block", "reason": reason}).to_string()
}

fn first_line(text: &str) -> &str {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(200) {
        Some((i, _)) => &line[..i],
        None => line,
    }
}

/// The spec's `post_tool_hook` with the harness named, as the adapters run it.
pub fn post_command(hook: &GateCommand, harness: HarnessKind) -> GateCommand {
    let mut command = hook.clone();
    command.args.push(POST_FOR_ARG.into());
    command.args.push(harness.as_str().into());
    command
}

/// Adds the `PostToolUse` wrapper script to a session's files and returns its path. The script runs
/// `keel hook ... --post-for HARNESS` with a timeout and prints its answer; when the command fails
/// in any way it prints [`failed_closed_answer`] instead, so a CLI never sends the model a result
/// keel did not check. It always exits 0 (the answer is on stdout).
pub fn install_post_wrapper(
    session_dir: &Path,
    hook: &GateCommand,
    harness: HarnessKind,
    files: &mut Vec<SessionFile>,
) -> PathBuf {
    super::gate::add_script(
        session_dir,
        "keel-post-tool.sh",
        post_wrapper_script(&post_command(hook, harness), harness),
        files,
    )
}

/// The script of [`install_post_wrapper`].
pub fn post_wrapper_script(command: &GateCommand, harness: HarnessKind) -> String {
    let cmd = command_line(command);
    let secs = command.timeout_ms.div_ceil(1000).max(1);
    format!(
        "#!/bin/sh\n# keel PostToolUse wrapper: fail closed.\nout=$(timeout -k 1 {secs} {cmd})\n\
         if [ \"$?\" -eq 0 ]; then\n  [ -n \"$out\" ] && printf '%s\\n' \"$out\"\n  exit 0\nfi\n\
         printf '%s\\n' {}\nexit 0\n",
        shell_quote(&failed_closed_answer(harness))
    )
}

/// Adds Claude Code's two wrappers for failed calls to a session's files and returns their paths:
/// the `PostToolUseFailure` wrapper runs `keel hook ... --post-for claude-code` on the failure and,
/// when keel's policy changed its result (or the check could not run: failing closed), keeps the
/// answer that stops the session in [`FAILURE_STOP_FILE`]; the `PostToolBatch` wrapper, which
/// Claude Code runs once the batch's results are in and before its next model request, prints that
/// answer (`{"continue": false, "stopReason": ...}` there ends the session before the request;
/// from `PostToolUseFailure` it is ignored). Both always exit 0.
pub fn install_failure_wrappers(
    session_dir: &Path,
    hook: &GateCommand,
    files: &mut Vec<SessionFile>,
) -> (PathBuf, PathBuf) {
    let stop_file = session_dir.join(FAILURE_STOP_FILE);
    let failure = super::gate::add_script(
        session_dir,
        "keel-post-failure.sh",
        failure_wrapper_script(&post_command(hook, HarnessKind::ClaudeCode), &stop_file),
        files,
    );
    let batch = super::gate::add_script(
        session_dir,
        "keel-post-batch.sh",
        batch_wrapper_script(&post_command(hook, HarnessKind::ClaudeCode), &stop_file),
        files,
    );
    (failure, batch)
}

/// The `PostToolUseFailure` script of [`install_failure_wrappers`].
pub fn failure_wrapper_script(command: &GateCommand, stop_file: &Path) -> String {
    let cmd = command_line(command);
    let secs = command.timeout_ms.div_ceil(1000).max(1);
    let stop_file = shell_quote(&stop_file.display().to_string());
    format!(
        "#!/bin/sh\n# keel PostToolUseFailure wrapper: a failed call's result keel's policy changed, or \
         could not check, stops the session at the batch's end.\nout=$(timeout -k 1 {secs} {cmd})\n\
         st=$?\nif [ \"$st\" -eq 0 ] && [ -z \"$out\" ]; then\n  exit 0\nfi\n\
         if [ \"$st\" -ne 0 ]; then\n  out={}\nfi\nprintf '%s\\n' \"$out\" > {stop_file}\nexit 0\n",
        shell_quote(&failed_closed_answer(HarnessKind::ClaudeCode))
    )
}

/// The `PostToolBatch` script of [`install_failure_wrappers`]: the fail-closed stop a failure
/// wrapper left (it could not reach the node), else the node's answer to [`BATCH_EVENT`] (the stop
/// the policy decided for a failed call of the session, kept there per session token); a node that
/// cannot be asked stops the session (fail closed).
pub fn batch_wrapper_script(command: &GateCommand, stop_file: &Path) -> String {
    let cmd = command_line(command);
    let secs = command.timeout_ms.div_ceil(1000).max(1);
    let stop_file = shell_quote(&stop_file.display().to_string());
    let ask = shell_quote(&json!({"hook_event_name": BATCH_EVENT}).to_string());
    format!(
        "#!/bin/sh\n# keel PostToolBatch wrapper: stops the session when a failed call's result was \
         withheld.\ncat > /dev/null\nif [ -f {stop_file} ] && out=$(cat {stop_file}) && [ -n \"$out\" ]; then\n  \
         printf '%s\\n' \"$out\"\n  exit 0\nfi\n\
         out=$(printf '%s' {ask} | timeout -k 1 {secs} {cmd})\nst=$?\n\
         if [ \"$st\" -ne 0 ]; then\n  out={}\nfi\nif [ -n \"$out\" ]; then\n  printf '%s\\n' \"$out\"\nfi\n\
         exit 0\n",
        shell_quote(&failed_closed_answer(HarnessKind::ClaudeCode))
    )
}

/// The JavaScript the opencode plugin and the pi extension call after a tool ran:
/// `keelPost(toolName, toolInput, toolUseId, cwd, isError, text)` returns keel's [`PostAnswer`]
/// (`{is_error, text, changed}`), or a withheld error when the check could not run.
pub fn post_js_function(wrapper: &Path, harness: HarnessKind) -> String {
    let wrapper =
        serde_json::to_string(&wrapper.display().to_string()).unwrap_or_else(|_| "\"\"".to_owned());
    let withheld = serde_json::to_string(WITHHELD_TEXT).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        r#"import {{ spawnSync as keelPostSpawn }} from "node:child_process";
const KEEL_POST = {wrapper};
function keelPost(toolName, toolInput, toolUseId, cwd, isError, text) {{
  const payload = JSON.stringify({{ hook_event_name: "PostToolUse", harness: "{harness}", tool_name: toolName,
    tool_input: toolInput ?? {{}}, tool_use_id: toolUseId ?? null, cwd: cwd ?? process.cwd(),
    {TOOL_OUTPUT_KEY}: {{ is_error: !!isError, text: String(text ?? "") }} }});
  const r = keelPostSpawn(KEEL_POST, [], {{ input: payload, encoding: "utf8", maxBuffer: 64 * 1024 * 1024 }});
  try {{
    const a = JSON.parse(String(r.stdout ?? "").trim());
    if (r.status === 0 && typeof a.text === "string") return a;
  }} catch (e) {{}}
  return {{ is_error: true, text: {withheld}, changed: true }};
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(text: &str) -> ToolOutput {
        ToolOutput {
            is_error: false,
            text: text.into(),
        }
    }

    /// The payloads as the pinned CLIs sent them (docs/HARNESSES.md).
    fn claude_bash(stdout: &str) -> Value {
        json!({"hook_event_name": "PostToolUse", "tool_name": "Bash",
               "tool_input": {"command": "cat secret.txt"},
               "tool_response": {"stdout": stdout, "stderr": "", "interrupted": false,
                                 "isImage": false, "noOutputExpected": false},
               "tool_use_id": "toolu_scripted_001"})
    }

    #[test]
    fn the_result_is_read_from_each_clis_payload() {
        assert_eq!(
            tool_output_of(&claude_bash("pw-hunter2")),
            Some(out("pw-hunter2"))
        );
        let codex = json!({"hook_event_name": "PostToolUse", "tool_name": "Bash",
                           "tool_response": "pw-hunter2\n"});
        assert_eq!(tool_output_of(&codex), Some(out("pw-hunter2\n")));
        let plugin = json!({"tool_name": "bash", TOOL_OUTPUT_KEY: {"is_error": true, "text": "x"}});
        assert_eq!(
            tool_output_of(&plugin),
            Some(ToolOutput {
                is_error: true,
                text: "x".into()
            })
        );
        assert_eq!(tool_output_of(&json!({"tool_name": "x"})), None);
        // Codex says nothing of a command's exit status: its result meets no gate.
        assert!(
            tool_output_for(HarnessKind::Codex, &codex)
                .unwrap()
                .is_error
        );
        assert!(
            !tool_output_for(HarnessKind::ClaudeCode, &claude_bash("ok"))
                .unwrap()
                .is_error
        );
        let with_err = json!({"stdout": "a", "stderr": "b"});
        assert_eq!(response_text(&with_err), "a\nb");
        let mcp = json!([{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]);
        assert_eq!(response_text(&mcp), "one\ntwo");
        // Codex's MCP result object: its text, as Codex's stream shows it.
        let codex_mcp = json!({"content": [{"text": "recorded: progress note 1", "type": "text"}],
                               "isError": false});
        assert_eq!(response_text(&codex_mcp), "recorded: progress note 1");
        assert_eq!(
            rebuilt_response(&codex_mcp, "x").unwrap_or_default(),
            json!({"content": [{"type": "text", "text": "x"}], "isError": false})
        );
        let read = json!({"type": "text", "file": {"content": "pw-hunter2"}});
        assert_eq!(response_text(&read), read.to_string());
    }

    #[test]
    fn a_rewrite_keeps_the_response_shape_or_is_refused() {
        let bash = claude_bash("pw-hunter2")["tool_response"].clone();
        let rebuilt = rebuilt_response(&bash, "pw-REDACTED").unwrap_or_default();
        assert_eq!(rebuilt["stdout"], "pw-REDACTED");
        assert_eq!(rebuilt["interrupted"], false);
        assert_eq!(
            rebuilt_response(&json!("a"), "b"),
            Some(Value::String("b".into()))
        );
        let read = json!({"type": "text", "file": {"content": "pw-hunter2"}});
        let edited = response_text(&read).replace("hunter2", "REDACTED");
        assert_eq!(
            rebuilt_response(&read, &edited).unwrap_or_default()["file"]["content"],
            "pw-REDACTED"
        );
        assert_eq!(rebuilt_response(&read, "not json"), None);
        assert_eq!(rebuilt_response(&read, "[1]"), None);
    }

    #[test]
    fn each_cli_gets_its_own_answer_and_nothing_when_the_result_stands() {
        let payload = claude_bash("pw-hunter2");
        let original = out("pw-hunter2");
        assert_eq!(
            answer_for(HarnessKind::ClaudeCode, &payload, &original, &original),
            None
        );
        assert_eq!(
            answer_for(HarnessKind::Codex, &payload, &original, &original),
            None
        );
        let redacted = out("pw-REDACTED");
        let claude: Value = serde_json::from_str(
            &answer_for(HarnessKind::ClaudeCode, &payload, &original, &redacted)
                .unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(
            claude["hookSpecificOutput"]["updatedToolOutput"]["stdout"],
            "pw-REDACTED"
        );
        let unknown_shape = json!({"tool_response": {"file": {"content": "pw-hunter2"}}});
        let claude: Value = serde_json::from_str(
            &answer_for(
                HarnessKind::ClaudeCode,
                &unknown_shape,
                &original,
                &redacted,
            )
            .unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(claude["continue"], false, "{claude}");
        let codex: Value = serde_json::from_str(
            &answer_for(HarnessKind::Codex, &payload, &original, &out("")).unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(codex, json!({"decision": "block", "reason": "(no output)"}));
        let plain: PostAnswer = serde_json::from_str(
            &answer_for(HarnessKind::Pi, &payload, &original, &original).unwrap_or_default(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(!plain.changed);
    }

    /// Claude Code's failure payload (as 2.1.197 sent it) is read as an error result; a changed one
    /// stops the session; the failure wrapper keeps that answer (or the fail-closed one) for the
    /// batch wrapper, run for real, and a result that stands leaves nothing.
    #[test]
    fn a_failed_call_whose_result_changed_stops_the_session_at_the_batch() {
        let payload = json!({"hook_event_name": FAILURE_EVENT, "tool_name": "Bash",
                             "tool_input": {"command": "cat secret.txt; exit 3"},
                             "tool_use_id": "toolu_scripted_001",
                             "error": "Exit code 3\npw-hunter2", "is_interrupt": false});
        let original = tool_output_of(&payload).expect("a result");
        assert!(original.is_error && original.text == "Exit code 3\npw-hunter2");
        assert_eq!(failure_answer(&original, &original), None);
        let stop: Value = serde_json::from_str(
            &failure_answer(&original, &out("Exit code 3\npw-REDACTED")).unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(stop["continue"], false, "{stop}");
        let dir = tempfile::tempdir().expect("a temp dir");
        let stop_file = dir.path().join(FAILURE_STOP_FILE);
        let batch = dir.path().join("batch.sh");
        // The node, asked at the batch's end: no stop decided.
        let node = |script: &str| GateCommand {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout_ms: 1_000,
        };
        let run_batch = |node_says: &str| {
            std::fs::write(&batch, batch_wrapper_script(&node(node_says), &stop_file))
                .expect("writes");
            let out = std::process::Command::new("/bin/sh")
                .arg(&batch)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("runs");
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        let run = |script: &str| {
            let command = GateCommand {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()],
                timeout_ms: 1_000,
            };
            let path = dir.path().join("failure.sh");
            std::fs::write(&path, failure_wrapper_script(&command, &stop_file)).expect("writes");
            let status = std::process::Command::new("/bin/sh")
                .arg(&path)
                .status()
                .expect("runs");
            assert_eq!(status.code(), Some(0));
            run_batch("cat > /dev/null")
        };
        assert_eq!(run("true"), "", "a result that stands stops nothing");
        assert_eq!(run("echo '{\"continue\":false}'"), "{\"continue\":false}");
        let _ = std::fs::remove_file(&stop_file);
        let closed: Value = serde_json::from_str(&run("exit 3")).expect("JSON");
        assert_eq!(
            closed["continue"], false,
            "a failed check stops the session"
        );
        // The stop file deleted (by the session's own tools) or never written (a full disk): the
        // node's kept decision still stops the session, and a node that cannot be asked does too.
        let _ = std::fs::remove_file(&stop_file);
        let kept = batch_stop_answer("withheld");
        assert_eq!(
            run_batch(&format!(
                "grep -q PostToolBatch && printf '%s' {}",
                shell_quote(&kept)
            )),
            kept
        );
        let unreachable: Value = serde_json::from_str(&run_batch("exit 3")).expect("JSON");
        assert_eq!(unreachable["continue"], false, "{unreachable}");
        let slow: Value = serde_json::from_str(&run_batch("sleep 5")).expect("JSON");
        assert_eq!(slow["continue"], false, "{slow}");
        assert_eq!(run_batch("cat > /dev/null"), "", "nothing to stop");
    }

    /// The wrapper, run for real: a command's answer passes through; a crash, a non-zero exit or a
    /// timeout prints the fail-closed answer.
    #[test]
    fn the_wrapper_prints_the_answer_or_fails_closed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let run = |script: &str, harness: HarnessKind| {
            let command = GateCommand {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()],
                timeout_ms: 1_000,
            };
            let path = dir.path().join("w.sh");
            std::fs::write(&path, post_wrapper_script(&command, harness)).expect("writes");
            let out = std::process::Command::new("/bin/sh")
                .arg(&path)
                .output()
                .expect("runs");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            )
        };
        assert_eq!(
            run("echo '{\"a\":1}'", HarnessKind::Codex),
            (Some(0), "{\"a\":1}".into())
        );
        assert_eq!(run("true", HarnessKind::Codex), (Some(0), String::new()));
        let (code, text) = run("exit 3", HarnessKind::ClaudeCode);
        assert_eq!(code, Some(0));
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["continue"], false);
        let (_, text) = run("sleep 5", HarnessKind::Opencode);
        let v: PostAnswer = serde_json::from_str(&text).expect("JSON");
        assert!(v.is_error && v.changed && v.text == WITHHELD_TEXT, "{v:?}");
    }
}
