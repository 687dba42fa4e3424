//! Claude Code (`claude -p --output-format stream-json --verbose`).
//!
//! Facts this relies on (harnesses README §1): the endpoint comes from `ANTHROPIC_BASE_URL` and
//! `ANTHROPIC_API_KEY`/`ANTHROPIC_AUTH_TOKEN`; `CLAUDE_CODE_MAX_RETRIES=0` makes a failure surface in
//! under a second instead of ~3 minutes; `bypassPermissions` refuses to start as root unless
//! `IS_SANDBOX=1`; hooks come in through `--settings` (and are skipped under `--bare`, which is
//! therefore never used); every `assistant` frame repeats its message's usage and `result` carries
//! the session total; API errors end with `result.is_error=true` and `subtype:"success"`.

use std::path::Path;

use serde::Deserialize;

use super::jsonl::{ParseError, parse_json, str_field};
use super::{CliBinary, CliFlavor, EventParser, Invocation, ProcessOutcome, limits};
use crate::error::{ErrorCategory, HarnessError, StartError};
use crate::event::{HarnessEvent, StopReason};
use crate::spec::{Credential, HarnessKind, PermissionMode, SessionSpec};
use crate::usage::{TokenCounts, UsageReport, UsageScope};

/// The Claude Code adapter's flavor (use through [`super::CliHarness`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaudeCode;

/// Claude Code as a [`crate::Harness`].
pub type ClaudeCodeHarness = super::CliHarness<ClaudeCode>;

impl ClaudeCodeHarness {
    /// The adapter with default configuration.
    pub fn claude_code() -> Self {
        super::CliHarness::new(ClaudeCode, super::CliConfig::default())
    }
}

impl CliFlavor for ClaudeCode {
    fn kind(&self) -> HarnessKind {
        HarnessKind::ClaudeCode
    }

    fn binary(&self) -> CliBinary {
        CliBinary {
            env_var: "KEEL_CLAUDE_BIN",
            bin_name: "claude",
        }
    }

    fn invocation(
        &self,
        spec: &SessionSpec,
        program: &Path,
        session_dir: &Path,
    ) -> Result<Invocation, StartError> {
        let home = session_dir.join("home");
        let mut env = super::base_env(spec, &home);
        env.insert("CLAUDE_CODE_MAX_RETRIES".into(), "0".into());
        env.insert(
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
            "1".into(),
        );
        env.insert("DISABLE_AUTOUPDATER".into(), "1".into());
        if let Some(url) = &spec.account.base_url {
            env.insert(
                "ANTHROPIC_BASE_URL".into(),
                url.trim_end_matches('/').trim_end_matches("/v1").to_owned(),
            );
        }
        match super::credential_value(spec)? {
            Some((Credential::BearerTokenEnv(_), v)) => {
                env.insert("ANTHROPIC_AUTH_TOKEN".into(), v);
            }
            Some((_, v)) => {
                env.insert("ANTHROPIC_API_KEY".into(), v);
            }
            None => {}
        }
        let mode = match spec.permission_mode {
            PermissionMode::ReadOnly => "default",
            PermissionMode::AcceptEdits => "acceptEdits",
            PermissionMode::Bypass => {
                // Refuses to start as root otherwise; a Bypass spec is for sandboxed workers only.
                env.insert("IS_SANDBOX".into(), "1".into());
                "bypassPermissions"
            }
        };
        let mut files = Vec::new();
        let mut settings = serde_json::json!({});
        if let Some(gate) = &spec.pre_tool_gate {
            let wrapper = super::install_gate_wrapper(
                session_dir,
                gate,
                super::GateAllow::ClaudeCodeDecision,
                &mut files,
            );
            // The hook's own timeout is longer than the wrapper's, so the wrapper (which fails
            // closed) always answers first.
            let secs = gate.timeout_ms.div_ceil(1000).max(1) + 5;
            settings = serde_json::json!({"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [
                {"type": "command", "command": super::shell_quote(&wrapper.display().to_string()), "timeout": secs}
            ]}]}});
        }
        if let Some(hook) = &spec.post_tool_hook {
            // After every successful call: keel records the success and runs the PostToolUse
            // hooks; a changed result comes back as `updatedToolOutput` in the tool's own shape.
            let wrapper = super::post_tool::install_post_wrapper(
                session_dir,
                hook,
                HarnessKind::ClaudeCode,
                &mut files,
            );
            let secs = hook.timeout_ms.div_ceil(1000).max(1) + 5;
            settings["hooks"]["PostToolUse"] = serde_json::json!([{"matcher": "*", "hooks": [
                {"type": "command", "command": super::shell_quote(&wrapper.display().to_string()), "timeout": secs}
            ]}]);
            // After every failed call: keel sees the failure too (it earns no gate mark), and a
            // result the policy changes, which Claude Code cannot replace for a failure, stops the
            // session at the batch's end, before the model sees it.
            let (failure, batch) =
                super::post_tool::install_failure_wrappers(session_dir, hook, &mut files);
            settings["hooks"][super::post_tool::FAILURE_EVENT] = serde_json::json!([{"matcher": "*", "hooks": [
                {"type": "command", "command": super::shell_quote(&failure.display().to_string()), "timeout": secs}
            ]}]);
            settings["hooks"]["PostToolBatch"] = serde_json::json!([{"hooks": [
                {"type": "command", "command": super::shell_quote(&batch.display().to_string()), "timeout": 10}
            ]}]);
        }
        if let (Some(stop), Some(_)) = (&spec.stop_gate, &spec.stop_check) {
            // The report check at the session's end: the command judges `last_assistant_message`
            // and answers `{"decision": "block", "reason": ...}` to send the session back once.
            let command = super::gate::command_line(stop);
            let secs = stop.timeout_ms.div_ceil(1000).max(1);
            settings["hooks"]["Stop"] = serde_json::json!([{"hooks": [
                {"type": "command", "command": command, "timeout": secs}
            ]}]);
        }
        if let Some(hook) = &spec.session_event_hook {
            // Before Claude Code compacts its context (by hand or automatically): keel's policy
            // may veto it (exit 2 blocks the compaction) or add a note to its instructions.
            let wrapper = super::session_event::install_event_wrapper(
                session_dir,
                hook,
                HarnessKind::ClaudeCode,
                &mut files,
            );
            let secs = hook.timeout_ms.div_ceil(1000).max(1) + 5;
            settings["hooks"]["PreCompact"] = serde_json::json!([{"hooks": [
                {"type": "command", "command": super::shell_quote(&wrapper.display().to_string()), "timeout": secs}
            ]}]);
        }
        let mut args: Vec<String> = vec![
            "-p".into(),
            "--output-format".into(),
            "stream-json".into(),
            "--verbose".into(),
            // A Stop hook's decision is then a `system/hook_response` line: the log records a re-ask.
            "--include-hook-events".into(),
            "--model".into(),
            spec.model.clone(),
            "--permission-mode".into(),
            mode.into(),
            "--setting-sources".into(),
            "project".into(),
            "--settings".into(),
            settings.to_string(),
            "--strict-mcp-config".into(),
            "--no-session-persistence".into(),
            "--max-turns".into(),
            spec.limits.turns_max.to_string(),
        ];
        if let Some(mcp) = &spec.mcp_endpoint {
            let mut server = serde_json::json!({"type": "http", "url": mcp.url});
            if let Some(var) = &mcp.bearer_token_env {
                server["headers"] =
                    serde_json::json!({"Authorization": format!("Bearer ${{{var}}}")});
                if let Some(v) = spec.env_var(var) {
                    env.insert(var.clone(), v);
                }
            }
            args.push("--mcp-config".into());
            args.push(
                serde_json::json!({"mcpServers": {mcp.server_name.clone(): server}}).to_string(),
            );
            // Claude Code connects to MCP servers in the background by default, so under load its
            // first model request can go out before keel's tools are listed ("No such tool
            // available"); wait for the connection instead.
            env.insert("MCP_CONNECTION_NONBLOCKING".into(), "false".into());
        }
        if let Some(text) = &spec.append_system_prompt {
            args.push("--append-system-prompt".into());
            args.push(text.clone());
        }
        // keel's own MCP tools are allowed without a prompt (a `-p` session cannot answer one); the
        // rule `mcp__<server>` covers every tool of that server.
        let mut allowed = spec.allowed_tools.clone();
        if let Some(mcp) = &spec.mcp_endpoint {
            allowed.push(format!("mcp__{}", mcp.server_name));
        }
        if !allowed.is_empty() {
            args.push("--allowedTools".into());
            args.push(allowed.join(","));
        }
        if !spec.disallowed_tools.is_empty() {
            args.push("--disallowedTools".into());
            args.push(spec.disallowed_tools.join(","));
        }
        // `--` ends the options, so a prompt starting with `-` stays a prompt.
        args.push("--".into());
        args.push(spec.prompt.clone());
        Ok(Invocation {
            program: program.to_path_buf(),
            args,
            env,
            cwd: spec.working_dir.clone(),
            files,
            dirs: vec![home.clone()],
            stdin_file: None,
        })
    }

    fn parser(&self, _spec: &SessionSpec) -> Box<dyn EventParser> {
        Box::new(ClaudeParser::default())
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default, borrow)]
    subtype: Option<&'a str>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default)]
    is_error: Option<bool>,
    #[serde(default)]
    api_error_status: Option<u16>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    total_cost_usd: Option<f64>,
    #[serde(default)]
    num_turns: Option<u32>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    content: Option<serde_json::Value>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize, Default, Clone, Copy)]
struct Usage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl Usage {
    fn counts(self, cost_usd: Option<f64>) -> TokenCounts {
        TokenCounts {
            input_tokens: self.input_tokens.unwrap_or(0),
            output_tokens: self.output_tokens.unwrap_or(0),
            cache_read_tokens: self.cache_read_input_tokens.unwrap_or(0),
            cache_write_tokens: self.cache_creation_input_tokens.unwrap_or(0),
            cost_micros: cost_usd.map(usd_to_micros),
        }
    }
}

/// Dollars (float) to millionths, clamped at zero.
pub fn usd_to_micros(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 {
        (usd * 1_000_000.0).round() as u64
    } else {
        0
    }
}

/// The reason of a Stop hook's `block` decision in a `system/hook_response` line (the hook printed
/// `{"decision": "block", "reason": ...}`); `None` for any other hook's response.
fn sent_back(line: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    if v.get("hook_event").and_then(serde_json::Value::as_str) != Some("Stop") {
        return None;
    }
    let stdout = v.get("stdout").and_then(serde_json::Value::as_str)?;
    let decision: serde_json::Value = serde_json::from_str(stdout.trim()).ok()?;
    if decision.get("decision").and_then(serde_json::Value::as_str) != Some("block") {
        return None;
    }
    Some(str_field(&decision, "reason").to_owned())
}

/// Parses Claude Code's `stream-json` output.
#[derive(Debug, Default)]
pub struct ClaudeParser {
    turns: u32,
    last_message_id: Option<String>,
    last_text: String,
}

impl EventParser for ClaudeParser {
    fn parse_line(
        &mut self,
        line: &[u8],
        now_unix_ms: u64,
        out: &mut Vec<HarnessEvent>,
    ) -> Result<(), ParseError> {
        let l: Line<'_> = parse_json(line)?;
        match (l.kind, l.subtype) {
            ("system", Some("init")) => {
                out.push(HarnessEvent::Started {
                    native_session_id: l.session_id,
                    model: l.model,
                });
            }
            ("system", Some("hook_response")) => {
                if let Some(reason) = sent_back(line) {
                    out.push(HarnessEvent::SentBack { reason });
                }
            }
            ("assistant", _) => {
                let msg = l.message.ok_or(ParseError::MissingField {
                    event: "assistant".into(),
                    field: "message",
                })?;
                let synthetic = msg.model.as_deref() == Some("<synthetic>");
                if !synthetic && msg.id.is_some() && msg.id != self.last_message_id {
                    self.turns += 1;
                    self.last_message_id.clone_from(&msg.id);
                }
                for block in msg
                    .content
                    .as_ref()
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match block.get("type").and_then(serde_json::Value::as_str) {
                        Some("text") if !synthetic => {
                            let text = str_field(block, "text");
                            self.last_text = text.to_owned();
                            out.push(HarnessEvent::Text {
                                text: text.to_owned(),
                            });
                        }
                        Some("tool_use") => {
                            let id = str_field(block, "id");
                            let name = str_field(block, "name");
                            let input = block
                                .get("input")
                                .map(ToString::to_string)
                                .unwrap_or_else(|| "{}".into());
                            out.push(HarnessEvent::tool_use(id, name, input));
                        }
                        _ => {}
                    }
                }
                if let (false, Some(id), Some(u)) = (synthetic, msg.id, msg.usage) {
                    out.push(HarnessEvent::Usage(UsageReport {
                        scope: UsageScope::Message(id),
                        counts: u.counts(None),
                    }));
                }
            }
            ("user", _) => {
                let Some(msg) = l.message else { return Ok(()) };
                for block in msg
                    .content
                    .as_ref()
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if block.get("type").and_then(serde_json::Value::as_str) == Some("tool_result")
                    {
                        let id = str_field(block, "tool_use_id");
                        let is_error = block
                            .get("is_error")
                            .and_then(serde_json::Value::as_bool)
                            .unwrap_or(false);
                        let content = block
                            .get("content")
                            .map(super::content_text)
                            .unwrap_or_default();
                        out.push(HarnessEvent::tool_result(id, is_error, content));
                    }
                }
            }
            ("result", subtype) => {
                if let Some(u) = l.usage {
                    out.push(HarnessEvent::Usage(UsageReport {
                        scope: UsageScope::SessionTotal,
                        counts: u.counts(l.total_cost_usd),
                    }));
                }
                let text = l.result.unwrap_or_default();
                if l.is_error.unwrap_or(false) {
                    let message = if text.is_empty() {
                        format!("claude reported an error ({subtype:?})")
                    } else {
                        text
                    };
                    let err = match l.api_error_status {
                        Some(status) => limits::classify(&message, Some(status), None, now_unix_ms),
                        None if subtype == Some("error_max_turns") => {
                            out.push(HarnessEvent::Finished {
                                stop_reason: StopReason::Budget(crate::event::BudgetKind::Turns),
                                final_text: self.last_text.clone(),
                            });
                            return Ok(());
                        }
                        None => limits::classify(&message, None, None, now_unix_ms),
                    };
                    out.push(HarnessEvent::Failed(err));
                } else if subtype == Some("error_max_turns") {
                    out.push(HarnessEvent::Finished {
                        stop_reason: StopReason::Budget(crate::event::BudgetKind::Turns),
                        final_text: self.last_text.clone(),
                    });
                } else {
                    let stop_reason = match (l.stop_reason.as_deref(), subtype) {
                        (Some(r), _) => StopReason::from_wire(r),
                        (None, Some("success")) => StopReason::EndTurn,
                        (None, other) => StopReason::Other(other.unwrap_or("unknown").to_owned()),
                    };
                    if let Some(n) = l.num_turns {
                        self.turns = self.turns.max(n);
                    }
                    if self.turns == 0 && text.starts_with("Unknown command: ") {
                        // A slash command that exists nowhere: Claude Code answers by itself, calls
                        // no model and reports success. It is not one.
                        out.push(HarnessEvent::Failed(HarnessError::new(
                            ErrorCategory::BusinessRule,
                            text,
                        )));
                        return Ok(());
                    }
                    out.push(HarnessEvent::Finished {
                        stop_reason,
                        final_text: text,
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn turns(&self) -> u32 {
        self.turns
    }

    fn last_text(&self) -> &str {
        &self.last_text
    }

    fn finish(&mut self, outcome: &ProcessOutcome) -> HarnessEvent {
        // Startup failures (a bad flag, an auth problem) print to stderr only: classify that text.
        HarnessEvent::Failed(limits::classify(
            &super::died_message("claude", outcome),
            None,
            None,
            outcome.now_unix_ms,
        ))
    }
}
