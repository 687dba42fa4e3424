//! pi (`pi -p --mode json`).
//!
//! Facts this relies on (harnesses README §4): the provider lives in `models.json` under
//! `PI_CODING_AGENT_DIR`, where `apiKey` may name an environment variable; retries at both levels
//! are turned off in `settings.json`; **with `--mode json` pi exits 0 even when the turn failed**,
//! so success is read from the last assistant message's `stopReason` in `agent_end`, never from the
//! exit code; pi has no permission system, so the gate is an extension (`-e`) whose `tool_call`
//! handler returns `{block: true, reason}`.

use std::path::Path;

use serde::Deserialize;

use super::codex::openai_base_url;
use super::jsonl::{ParseError, parse_json, str_field};
use super::{CliBinary, CliFlavor, EventParser, Invocation, ProcessOutcome, SessionFile, limits};
use crate::error::{HarnessError, StartError};
use crate::event::{HarnessEvent, StopReason};
use crate::spec::{HarnessKind, PermissionMode, SessionSpec};
use crate::usage::{TokenCounts, UsageReport, UsageScope};

/// The environment variable `models.json` names as the provider's key.
pub const KEY_VAR: &str = "KEEL_PI_API_KEY";

/// Which wire API pi speaks to the account's endpoint (pi supports all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PiWireApi {
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    #[default]
    OpenAiCompletions,
    /// OpenAI Responses (`/v1/responses`).
    OpenAiResponses,
    /// Anthropic Messages (`/v1/messages`).
    AnthropicMessages,
}

/// The pi adapter's flavor (use through [`super::CliHarness`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Pi {
    /// The wire API for the account's endpoint.
    pub api: PiWireApi,
}

/// pi as a [`crate::Harness`].
pub type PiHarness = super::CliHarness<Pi>;

impl PiHarness {
    /// The adapter with default configuration (Chat Completions).
    pub fn pi() -> Self {
        super::CliHarness::new(Pi::default(), super::CliConfig::default())
    }
}

impl CliFlavor for Pi {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Pi
    }

    fn binary(&self) -> CliBinary {
        CliBinary {
            env_var: "KEEL_PI_BIN",
            bin_name: "pi",
        }
    }

    fn invocation(
        &self,
        spec: &SessionSpec,
        program: &Path,
        session_dir: &Path,
    ) -> Result<Invocation, StartError> {
        let home = session_dir.join("home");
        let agent_dir = session_dir.join("pi-agent");
        let mut env = super::base_env(spec, &home);
        env.insert(
            "PI_CODING_AGENT_DIR".into(),
            agent_dir.display().to_string(),
        );
        env.insert("PI_OFFLINE".into(), "1".into());
        let key =
            super::credential_value(spec)?.map_or_else(|| "keel-no-key".to_owned(), |(_, v)| v);
        env.insert(KEY_VAR.into(), key);
        let (api, base_url) = match self.api {
            PiWireApi::OpenAiCompletions => (
                "openai-completions",
                openai_base_url(spec.account.base_url.as_deref()),
            ),
            PiWireApi::OpenAiResponses => (
                "openai-responses",
                openai_base_url(spec.account.base_url.as_deref()),
            ),
            PiWireApi::AnthropicMessages => (
                "anthropic-messages",
                spec.account
                    .base_url
                    .as_deref()
                    .unwrap_or("https://api.anthropic.com")
                    .trim_end_matches('/')
                    .trim_end_matches("/v1")
                    .to_owned(),
            ),
        };
        let models = serde_json::json!({"providers": {"keel": {
            "baseUrl": base_url,
            "api": api,
            "apiKey": KEY_VAR,
            "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
            "models": [{"id": spec.model, "name": spec.model, "contextWindow": 200_000, "maxTokens": 32_000}]
        }}});
        let settings =
            serde_json::json!({"retry": {"enabled": false, "provider": {"maxRetries": 0}}});
        let mut files = vec![
            SessionFile {
                path: agent_dir.join("models.json"),
                contents: models.to_string(),
                executable: false,
            },
            SessionFile {
                path: agent_dir.join("settings.json"),
                contents: settings.to_string(),
                executable: false,
            },
        ];
        let mut args: Vec<String> = vec![
            "--mode".into(),
            "json".into(),
            "-p".into(),
            "--no-session".into(),
            "--no-extensions".into(),
            "--model".into(),
            format!("keel/{}", spec.model),
        ];
        if let Some(text) = &spec.append_system_prompt {
            // `--append-system-prompt` takes text or a file path; a file keeps any text literal.
            let path = session_dir.join("keel-append-system-prompt.md");
            files.push(SessionFile {
                path: path.clone(),
                contents: text.clone(),
                executable: false,
            });
            args.push("--append-system-prompt".into());
            args.push(path.display().to_string());
        }
        let mut tools: Vec<String> = if !spec.allowed_tools.is_empty() {
            spec.allowed_tools.clone()
        } else if spec.permission_mode == PermissionMode::ReadOnly {
            // pi has no permission modes: read-only means only the reading tools.
            ["read", "grep", "find", "ls"].map(String::from).to_vec()
        } else {
            Vec::new()
        };
        if !spec.disallowed_tools.is_empty() {
            if tools.is_empty() {
                tools = ["read", "bash", "edit", "write"].map(String::from).to_vec();
            }
            tools.retain(|t| !spec.disallowed_tools.contains(t));
        }
        if !tools.is_empty() {
            args.push("--tools".into());
            args.push(tools.join(","));
        }
        // One extension holds keel's hooks: `tool_call` runs the gate and returns `{block, reason}`;
        // `tool_result` hands the result to keel and returns a changed one (`{content, isError}`).
        let mut prelude = String::new();
        let mut handlers = String::new();
        if let Some(gate) = &spec.pre_tool_gate {
            let wrapper = super::install_gate_wrapper(
                session_dir,
                gate,
                super::GateAllow::ExitZero,
                &mut files,
            );
            prelude.push_str(&super::gate_js_function(&wrapper, HarnessKind::Pi));
            handlers.push_str("  pi.on(\"tool_call\", async (event: any, ctx: any) => {\n    const reason = keelGate(event.toolName, event.input, event.toolCallId, ctx?.cwd);\n    if (reason !== null) return { block: true, reason };\n  });\n");
        }
        if let Some(hook) = &spec.post_tool_hook {
            let wrapper = super::post_tool::install_post_wrapper(
                session_dir,
                hook,
                HarnessKind::Pi,
                &mut files,
            );
            prelude.push_str(&super::post_tool::post_js_function(
                &wrapper,
                HarnessKind::Pi,
            ));
            handlers.push_str("  pi.on(\"tool_result\", async (event: any, ctx: any) => {\n    const text = (event.content ?? []).filter((c: any) => c?.type === \"text\").map((c: any) => c.text).join(\"\\n\");\n    const a = keelPost(event.toolName, event.input, event.toolCallId, ctx?.cwd, event.isError, text);\n    if (a.changed) return { content: [{ type: \"text\", text: a.text }], isError: !!a.is_error };\n  });\n");
        }
        if !handlers.is_empty() {
            let ext = session_dir.join("keel-gate.ts");
            files.push(SessionFile {
                path: ext.clone(),
                contents: format!(
                    "{prelude}\nexport default function (pi: any) {{\n{handlers}}}\n"
                ),
                executable: false,
            });
            args.push("-e".into());
            args.push(ext.display().to_string());
        }
        // pi has no built-in MCP client (README §4.6): `mcp_endpoint` is not wired for pi.
        args.push(spec.prompt.clone());
        Ok(Invocation {
            program: program.to_path_buf(),
            args,
            env,
            cwd: spec.working_dir.clone(),
            files,
            dirs: vec![home.clone(), agent_dir.clone()],
            stdin_file: None,
        })
    }

    fn parser(&self, _spec: &SessionSpec) -> Box<dyn EventParser> {
        Box::new(PiParser::default())
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    message: Option<Message>,
    #[serde(default, rename = "toolCallId")]
    tool_call_id: Option<String>,
    #[serde(default)]
    result: Option<ToolOutput>,
    #[serde(default, rename = "isError")]
    is_error: Option<bool>,
}

#[derive(Deserialize)]
struct ToolOutput {
    #[serde(default)]
    content: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<serde_json::Value>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default, rename = "stopReason")]
    stop_reason: Option<String>,
    #[serde(default, rename = "errorMessage")]
    error_message: Option<String>,
    #[serde(default, rename = "responseId")]
    response_id: Option<String>,
}

#[derive(Deserialize, Clone, Copy, Default)]
struct Usage {
    #[serde(default)]
    input: u64,
    #[serde(default)]
    output: u64,
    #[serde(default, rename = "cacheRead")]
    cache_read: u64,
    #[serde(default, rename = "cacheWrite")]
    cache_write: u64,
    #[serde(default)]
    cost: Option<Cost>,
}

#[derive(Deserialize, Clone, Copy, Default)]
struct Cost {
    #[serde(default)]
    total: f64,
}

/// Event types read for nothing but their shape (see `parse_line`).
const SKIPPED_TYPES: [&[u8]; 6] = [
    b"message_update",
    b"message_start",
    b"tool_execution_start",
    b"tool_execution_update",
    b"turn_end",
    b"auto_retry_start",
];

/// Parses `pi --mode json` output.
#[derive(Debug, Default)]
pub struct PiParser {
    turns: u32,
    assistant_messages: u32,
    model: Option<String>,
    last_text: String,
    last_stop: Option<String>,
    last_error: Option<String>,
}

impl EventParser for PiParser {
    fn parse_line(
        &mut self,
        line: &[u8],
        now_unix_ms: u64,
        out: &mut Vec<HarnessEvent>,
    ) -> Result<(), ParseError> {
        // Streaming updates repeat the whole partial message on every delta and make up most of the
        // bytes; nothing in them is needed (message_end carries the final content), so they are
        // skipped with only a structural check.
        if let Some(kind) = super::jsonl::leading_type(line)
            && SKIPPED_TYPES.contains(&kind)
        {
            return super::jsonl::check_closed(line);
        }
        let l: Line<'_> = parse_json(line)?;
        match l.kind {
            "session" => out.push(HarnessEvent::Started {
                native_session_id: l.id,
                model: None,
            }),
            "turn_start" => self.turns += 1,
            "message_end" => {
                let msg = l.message.ok_or(ParseError::MissingField {
                    event: "message_end".into(),
                    field: "message",
                })?;
                if msg.role.as_deref() != Some("assistant") {
                    return Ok(());
                }
                self.assistant_messages += 1;
                for block in msg
                    .content
                    .as_ref()
                    .and_then(serde_json::Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match block.get("type").and_then(serde_json::Value::as_str) {
                        Some("text") => {
                            let text = str_field(block, "text");
                            self.last_text = text.to_owned();
                            out.push(HarnessEvent::Text {
                                text: text.to_owned(),
                            });
                        }
                        Some("toolCall") => {
                            let id = str_field(block, "id");
                            let name = str_field(block, "name");
                            let input = block
                                .get("arguments")
                                .map_or_else(|| "{}".to_owned(), ToString::to_string);
                            out.push(HarnessEvent::tool_use(id, name, input));
                        }
                        _ => {}
                    }
                }
                if let Some(u) = msg.usage {
                    let id = msg
                        .response_id
                        .unwrap_or_else(|| format!("message-{}", self.assistant_messages));
                    out.push(HarnessEvent::Usage(UsageReport {
                        scope: UsageScope::Message(id),
                        counts: TokenCounts {
                            input_tokens: u.input,
                            output_tokens: u.output,
                            cache_read_tokens: u.cache_read,
                            cache_write_tokens: u.cache_write,
                            cost_micros: u.cost.map(|c| super::claude::usd_to_micros(c.total)),
                        },
                    }));
                }
                if msg.model.is_some() {
                    self.model = msg.model;
                }
                self.last_stop = msg.stop_reason;
                self.last_error = msg.error_message;
                let _ = now_unix_ms;
            }
            "tool_execution_end" => {
                let id = l.tool_call_id.ok_or(ParseError::MissingField {
                    event: "tool_execution_end".into(),
                    field: "toolCallId",
                })?;
                let content = l
                    .result
                    .and_then(|r| r.content)
                    .map(|c| super::content_text(&c))
                    .unwrap_or_default();
                out.push(HarnessEvent::tool_result(
                    id,
                    l.is_error.unwrap_or(false),
                    content,
                ));
            }
            "agent_end" => out.push(self.verdict(now_unix_ms)),
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
        if self.last_stop.as_deref() == Some("error") {
            return self.verdict(outcome.now_unix_ms);
        }
        HarnessEvent::Failed(limits::classify(
            &super::died_message("pi", outcome),
            None,
            None,
            outcome.now_unix_ms,
        ))
    }
}

impl PiParser {
    /// The terminal event from the last assistant message: pi's exit code says nothing.
    fn verdict(&self, now_unix_ms: u64) -> HarnessEvent {
        match self.last_stop.as_deref() {
            Some("stop") => HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: self.last_text.clone(),
            },
            Some("length") => HarnessEvent::Finished {
                stop_reason: StopReason::MaxTokens,
                final_text: self.last_text.clone(),
            },
            Some("error") => {
                let message = self
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "pi reported an error".to_owned());
                HarnessEvent::Failed(limits::classify(&message, None, None, now_unix_ms))
            }
            Some("aborted") => HarnessEvent::Failed(HarnessError::cancelled()),
            Some(other) => HarnessEvent::Finished {
                stop_reason: StopReason::Other(other.to_owned()),
                final_text: self.last_text.clone(),
            },
            None => HarnessEvent::Failed(HarnessError::system(
                "pi ended without an assistant message",
            )),
        }
    }
}
