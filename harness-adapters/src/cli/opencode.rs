//! opencode (`opencode run --format json`).
//!
//! Facts this relies on (harnesses README §3): configuration comes whole through
//! `OPENCODE_CONFIG_CONTENT`; the working directory is `$PWD` or `--dir`, not the process cwd; the
//! prompt is read from stdin when no message word is given (positional words are not safe: a word
//! containing a space is wrapped in quotes and a numeric word crashes `run`); there is no final event (the run ends at process exit); retries cannot be configured
//! (5 per request, up to ~70 s), so the adapter runs with `--print-logs` and ends the session at the
//! first `stream error` log line instead, leaving retry policy to keel's supervisor; a stream without
//! `finish_reason` makes it loop forever (each step ends with reason `unknown`), which the parser
//! bounds.

use std::path::Path;

use serde::Deserialize;

use super::codex::openai_base_url;
use super::jsonl::{ParseError, parse_json};
use super::{CliBinary, CliFlavor, EventParser, Invocation, ProcessOutcome, SessionFile, limits};
use crate::error::{ErrorCategory, StartError};
use crate::event::{HarnessEvent, StopReason};
use crate::spec::{HarnessKind, PermissionMode, SessionSpec};
use crate::usage::{TokenCounts, UsageReport, UsageScope};

/// Consecutive steps ending with reason `unknown` before the session is declared a runaway loop.
pub const UNKNOWN_STEPS_MAX: u32 = 3;

/// The environment variable the provider reads its key from (`{env:...}` in the config).
pub const KEY_VAR: &str = "KEEL_OPENCODE_API_KEY";

/// The opencode adapter's flavor (use through [`super::CliHarness`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Opencode;

/// opencode as a [`crate::Harness`].
pub type OpencodeHarness = super::CliHarness<Opencode>;

impl OpencodeHarness {
    /// The adapter with default configuration.
    pub fn opencode() -> Self {
        super::CliHarness::new(Opencode, super::CliConfig::default())
    }
}

impl CliFlavor for Opencode {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Opencode
    }

    fn binary(&self) -> CliBinary {
        CliBinary {
            env_var: "KEEL_OPENCODE_BIN",
            bin_name: "opencode",
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
        for (var, sub) in [
            ("XDG_CONFIG_HOME", "config"),
            ("XDG_DATA_HOME", "data"),
            ("XDG_STATE_HOME", "state"),
            ("XDG_CACHE_HOME", "cache"),
        ] {
            env.insert(var.into(), session_dir.join(sub).display().to_string());
        }
        env.insert("PWD".into(), spec.working_dir.display().to_string());
        env.insert("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into());
        env.insert("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into());
        env.insert("OPENCODE_DISABLE_DEFAULT_PLUGINS".into(), "1".into());
        // Stops the background `npm install` opencode starts in every config dir.
        env.insert("npm_config_offline".into(), "true".into());
        let key =
            super::credential_value(spec)?.map_or_else(|| "keel-no-key".to_owned(), |(_, v)| v);
        env.insert(KEY_VAR.into(), key);

        let permission = match spec.permission_mode {
            PermissionMode::ReadOnly => {
                serde_json::json!({"edit": "deny", "bash": "deny", "webfetch": "deny", "external_directory": "deny"})
            }
            PermissionMode::AcceptEdits => {
                serde_json::json!({"edit": "allow", "bash": "allow", "webfetch": "allow", "external_directory": "deny"})
            }
            PermissionMode::Bypass => {
                serde_json::json!({"edit": "allow", "bash": "allow", "webfetch": "allow", "external_directory": "allow"})
            }
        };
        let model_ref = format!("keel/{}", spec.model);
        let mut config = serde_json::json!({
            "model": model_ref,
            "small_model": model_ref,
            "autoupdate": false,
            "share": "disabled",
            "provider": {"keel": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "keel",
                "options": {"baseURL": openai_base_url(spec.account.base_url.as_deref()), "apiKey": format!("{{env:{KEY_VAR}}}")},
                "models": {spec.model.clone(): {"name": spec.model, "tool_call": true, "limit": {"context": 200_000, "output": 32_000}}}
            }},
            "permission": permission,
            "agent": {"title": {"disable": true}},
        });
        let mut tools = serde_json::Map::new();
        for t in &spec.disallowed_tools {
            tools.insert(t.clone(), serde_json::Value::Bool(false));
        }
        if !tools.is_empty() {
            config["tools"] = serde_json::Value::Object(tools);
        }
        let mut files = Vec::new();
        if let Some(text) = &spec.append_system_prompt {
            let path = session_dir.join("keel-instructions.md");
            files.push(SessionFile {
                path: path.clone(),
                contents: text.clone(),
                executable: false,
            });
            config["instructions"] = serde_json::json!([path.display().to_string()]);
        }
        // One plugin holds keel's hooks: `tool.execute.before` runs the gate and throws the reason
        // to block; `tool.execute.after` hands the result to keel and puts a changed one in place
        // (`output.output` for opencode's tools, `output.content` for an MCP tool's).
        let mut prelude = String::new();
        let mut handlers = String::new();
        if let Some(gate) = &spec.pre_tool_gate {
            let wrapper = super::install_gate_wrapper(
                session_dir,
                gate,
                super::GateAllow::ExitZero,
                &mut files,
            );
            prelude.push_str(&super::gate_js_function(&wrapper, HarnessKind::Opencode));
            handlers.push_str("  \"tool.execute.before\": async (input, output) => {\n    const reason = keelGate(input.tool, output.args, input.callID, ctx?.directory);\n    if (reason !== null) throw new Error(reason);\n  },\n");
        }
        if let Some(hook) = &spec.post_tool_hook {
            let wrapper = super::post_tool::install_post_wrapper(
                session_dir,
                hook,
                HarnessKind::Opencode,
                &mut files,
            );
            prelude.push_str(&super::post_tool::post_js_function(
                &wrapper,
                HarnessKind::Opencode,
            ));
            handlers.push_str("  \"tool.execute.after\": async (input, output) => {\n    const mcp = typeof output?.output !== \"string\" && Array.isArray(output?.content);\n    const text = mcp ? output.content.filter((c) => c?.type === \"text\").map((c) => c.text).join(\"\\n\") : String(output?.output ?? \"\");\n    const a = keelPost(input.tool, input.args, input.callID, ctx?.directory, false, text);\n    if (!a.changed) return;\n    if (mcp) output.content = [{ type: \"text\", text: a.text }];\n    else output.output = a.text;\n  },\n");
        }
        if !handlers.is_empty() {
            let plugin = session_dir.join("keel-gate.js");
            files.push(SessionFile {
                path: plugin.clone(),
                contents: format!(
                    "{prelude}\nexport const KeelGate = async (ctx) => ({{\n{handlers}}});\n"
                ),
                executable: false,
            });
            config["plugin"] = serde_json::json!([format!("file://{}", plugin.display())]);
        }
        if let Some(mcp) = &spec.mcp_endpoint {
            let mut server = serde_json::json!({"type": "remote", "url": mcp.url, "enabled": true});
            if let Some(var) = &mcp.bearer_token_env {
                server["headers"] =
                    serde_json::json!({"Authorization": format!("Bearer {{env:{var}}}")});
                if let Some(v) = spec.env_var(var) {
                    env.insert(var.clone(), v);
                }
            }
            config["mcp"] = serde_json::json!({mcp.server_name.clone(): server});
        }
        env.insert("OPENCODE_CONFIG_CONTENT".into(), config.to_string());
        let args: Vec<String> = vec![
            "run".into(),
            "--format".into(),
            "json".into(),
            "--print-logs".into(),
            "--log-level".into(),
            "WARN".into(),
            "--title".into(),
            "keel".into(),
            "-m".into(),
            model_ref,
            "--dir".into(),
            spec.working_dir.display().to_string(),
        ];
        // The prompt goes in on stdin, exactly: `run` appends stdin to its (here empty) message
        // words. As words it broke: yargs turns a word such as `1` into a number, and opencode then
        // fails on `.includes(" ")` before any request ("G.includes is not a function").
        let prompt_file = session_dir.join("keel-prompt.txt");
        files.push(SessionFile {
            path: prompt_file.clone(),
            contents: spec.prompt.clone(),
            executable: false,
        });
        Ok(Invocation {
            program: program.to_path_buf(),
            args,
            env,
            cwd: spec.working_dir.clone(),
            files,
            dirs: vec![home.clone()],
            stdin_file: Some(prompt_file),
        })
    }

    fn parser(&self, _spec: &SessionSpec) -> Box<dyn EventParser> {
        Box::new(OpencodeParser::default())
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default, rename = "sessionID")]
    session_id: Option<String>,
    #[serde(default)]
    part: Option<Part>,
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    tool: Option<String>,
    #[serde(default, rename = "callID")]
    call_id: Option<String>,
    #[serde(default)]
    state: Option<ToolState>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default, rename = "messageID")]
    message_id: Option<String>,
    #[serde(default)]
    tokens: Option<Tokens>,
    #[serde(default)]
    cost: Option<f64>,
}

#[derive(Deserialize)]
struct ToolState {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    input: Option<serde_json::Value>,
    #[serde(default)]
    output: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize, Clone, Copy, Default)]
struct Tokens {
    #[serde(default)]
    input: u64,
    #[serde(default)]
    output: u64,
    #[serde(default)]
    reasoning: u64,
    #[serde(default)]
    cache: Cache,
}

#[derive(Deserialize, Clone, Copy, Default)]
struct Cache {
    #[serde(default)]
    read: u64,
    #[serde(default)]
    write: u64,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    data: Option<ErrorData>,
}

#[derive(Deserialize)]
struct ErrorData {
    #[serde(default)]
    message: Option<String>,
    #[serde(default, rename = "statusCode")]
    status_code: Option<u16>,
    #[serde(default, rename = "responseHeaders")]
    response_headers: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Parses `opencode run --format json` output and its `--print-logs` stderr.
#[derive(Debug, Default)]
pub struct OpencodeParser {
    started: bool,
    steps: u32,
    unknown_streak: u32,
    last_reason: Option<String>,
    last_text: String,
    permission_rejected: Option<String>,
    failed: bool,
}

fn retry_after_ms(headers: Option<&serde_json::Map<String, serde_json::Value>>) -> Option<u64> {
    let h = headers?;
    let get = |k: &str| {
        h.get(k)
            .and_then(serde_json::Value::as_str)
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    if let Some(ms) = get("retry-after-ms") {
        return Some(ms.max(0.0) as u64);
    }
    get("retry-after").map(|s| (s.max(0.0) * 1000.0) as u64)
}

impl EventParser for OpencodeParser {
    fn parse_line(
        &mut self,
        line: &[u8],
        now_unix_ms: u64,
        out: &mut Vec<HarnessEvent>,
    ) -> Result<(), ParseError> {
        let l: Line<'_> = parse_json(line)?;
        if !self.started && l.kind != "error" {
            self.started = true;
            out.push(HarnessEvent::Started {
                native_session_id: l.session_id.clone(),
                model: None,
            });
        }
        match l.kind {
            "step_start" => self.steps += 1,
            "text" => {
                let part = l.part.ok_or(ParseError::MissingField {
                    event: "text".into(),
                    field: "part",
                })?;
                let text = part.text.unwrap_or_default();
                self.last_text.clone_from(&text);
                out.push(HarnessEvent::Text { text });
            }
            "tool_use" => {
                let part = l.part.ok_or(ParseError::MissingField {
                    event: "tool_use".into(),
                    field: "part",
                })?;
                let id = part.call_id.unwrap_or_default();
                let state = part.state.ok_or(ParseError::MissingField {
                    event: "tool_use".into(),
                    field: "state",
                })?;
                let input = state
                    .input
                    .map_or_else(|| "{}".to_owned(), |v| v.to_string());
                out.push(HarnessEvent::tool_use(
                    id.clone(),
                    part.tool.unwrap_or_default(),
                    input,
                ));
                let is_error = state.status.as_deref() == Some("error");
                let content = if is_error {
                    state
                        .error
                        .as_ref()
                        .map(super::content_text)
                        .unwrap_or_default()
                } else {
                    state
                        .output
                        .as_ref()
                        .map(super::content_text)
                        .unwrap_or_default()
                };
                if is_error && content.contains("rejected permission") {
                    self.permission_rejected = Some(content.clone());
                }
                out.push(HarnessEvent::tool_result(id, is_error, content));
            }
            "step_finish" => {
                let part = l.part.ok_or(ParseError::MissingField {
                    event: "step_finish".into(),
                    field: "part",
                })?;
                if let Some(t) = part.tokens {
                    let id = part
                        .message_id
                        .clone()
                        .unwrap_or_else(|| format!("step-{}", self.steps));
                    out.push(HarnessEvent::Usage(UsageReport {
                        scope: UsageScope::Message(id),
                        counts: TokenCounts {
                            input_tokens: t.input,
                            output_tokens: t.output.saturating_add(t.reasoning),
                            cache_read_tokens: t.cache.read,
                            cache_write_tokens: t.cache.write,
                            cost_micros: part.cost.map(super::claude::usd_to_micros),
                        },
                    }));
                }
                if part.reason.as_deref() == Some("unknown") {
                    self.unknown_streak += 1;
                    if self.unknown_streak >= UNKNOWN_STEPS_MAX && !self.failed {
                        self.failed = true;
                        out.push(HarnessEvent::Failed(crate::error::HarnessError::transient(format!(
                            "opencode ended {UNKNOWN_STEPS_MAX} steps in a row without a finish reason; \
                             the endpoint's stream lacks finish_reason and opencode would loop forever"
                        ))));
                    }
                } else {
                    self.unknown_streak = 0;
                }
                self.last_reason = part.reason;
            }
            "error" => {
                let body = l.error.ok_or(ParseError::MissingField {
                    event: "error".into(),
                    field: "error",
                })?;
                let data = body.data;
                let message = data
                    .as_ref()
                    .and_then(|d| d.message.clone())
                    .or(body.name)
                    .unwrap_or_else(|| "opencode reported an error".to_owned());
                let status = data.as_ref().and_then(|d| d.status_code);
                let retry = retry_after_ms(data.as_ref().and_then(|d| d.response_headers.as_ref()));
                if !self.failed {
                    self.failed = true;
                    out.push(HarnessEvent::Failed(limits::classify(
                        &message,
                        status,
                        retry,
                        now_unix_ms,
                    )));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn parse_stderr_line(&mut self, line: &str, now_unix_ms: u64, out: &mut Vec<HarnessEvent>) {
        // `level=ERROR ... message="stream error" ... error.error="AI_APICallError: <message>"`: a
        // model request failed and opencode is about to retry it on its own schedule.
        if self.failed
            || !line.contains("level=ERROR")
            || !line.contains("message=\"stream error\"")
        {
            return;
        }
        let detail = line
            .split_once("error.error=\"")
            .map(|(_, rest)| rest.strip_suffix('"').unwrap_or(rest))
            .unwrap_or(line);
        let detail = detail.strip_prefix("AI_APICallError: ").unwrap_or(detail);
        let mut err = limits::classify(detail, None, None, now_unix_ms);
        if err.category == ErrorCategory::System {
            // A failed model request with no recognisable cause: worth a retry by the supervisor.
            err = crate::error::HarnessError::transient(err.message);
        }
        self.failed = true;
        out.push(HarnessEvent::Failed(err));
    }

    fn turns(&self) -> u32 {
        self.steps
    }

    fn last_text(&self) -> &str {
        &self.last_text
    }

    fn finish(&mut self, outcome: &ProcessOutcome) -> HarnessEvent {
        if outcome.exit_code == Some(0) {
            let stop_reason = match self.last_reason.as_deref() {
                Some("stop") => StopReason::EndTurn,
                Some("length") => StopReason::MaxTokens,
                Some("content-filter") => StopReason::Refusal,
                Some(other) => StopReason::Other(other.to_owned()),
                None => StopReason::Other("none".to_owned()),
            };
            if stop_reason.is_success() {
                return HarnessEvent::Finished {
                    stop_reason,
                    final_text: self.last_text.clone(),
                };
            }
            if let Some(why) = &self.permission_rejected {
                // `run` auto-rejects an "ask" permission and stops with exit 0 (README §3.4).
                return HarnessEvent::Failed(crate::error::HarnessError::new(
                    ErrorCategory::Permission,
                    why.clone(),
                ));
            }
            return HarnessEvent::Finished {
                stop_reason,
                final_text: self.last_text.clone(),
            };
        }
        HarnessEvent::Failed(limits::classify(
            &super::died_message("opencode", outcome),
            None,
            None,
            outcome.now_unix_ms,
        ))
    }
}
