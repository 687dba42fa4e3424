//! Codex CLI (`codex exec --json`).
//!
//! Facts this relies on (harnesses README §2): only the Responses wire API works, through a custom
//! model provider given entirely with `-c` (the built-in provider ignores `OPENAI_BASE_URL`);
//! `request_max_retries=0,stream_max_retries=0` in the provider table and `--disable
//! unbounded_connection_retries` make failures surface in well under a second (the default never
//! gives up on a dead endpoint); hooks need `--dangerously-bypass-hook-trust` or they are skipped
//! silently; the JSONL names tool calls by a local `item_N` id (the model's `call_id` is not
//! printed), so tool events pair by that id.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::jsonl::{ParseError, parse_json};
use super::{CliBinary, CliFlavor, EventParser, Invocation, ProcessOutcome, limits};
use crate::error::StartError;
use crate::event::{HarnessEvent, StopReason};
use crate::spec::{HarnessKind, PermissionMode, SessionSpec};
use crate::stop::{StopCheck, StopJudge};
use crate::usage::{TokenCounts, UsageReport, UsageScope};

/// The endpoint used when the account names none.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

/// The environment variable the custom provider reads its key from.
pub const KEY_VAR: &str = "KEEL_CODEX_API_KEY";

/// Most in-flight tool items remembered (an item's id is dropped when it completes).
const OPEN_ITEMS_MAX: usize = 1024;

/// The Codex adapter's flavor (use through [`super::CliHarness`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Codex;

/// Codex as a [`crate::Harness`].
pub type CodexHarness = super::CliHarness<Codex>;

impl CodexHarness {
    /// The adapter with default configuration.
    pub fn codex() -> Self {
        super::CliHarness::new(Codex, super::CliConfig::default())
    }
}

/// A TOML basic string (JSON string escapes are valid TOML escapes).
fn toml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

/// `-c hooks.EVENT=[...]`: one command hook for `event` (with `matcher = "*"` for a tool event),
/// running the shell command line `command` with a timeout of `secs` seconds.
fn hook_arg(event: &str, tool_event: bool, command: &str, secs: u64) -> String {
    let matcher = if tool_event { "matcher=\"*\"," } else { "" };
    format!(
        "hooks.{event}=[{{{matcher}hooks=[{{type=\"command\",command={},timeout={secs}}}]}}]",
        toml_str(command)
    )
}

/// The account's base URL in the form OpenAI-style clients want (`.../v1`).
pub fn openai_base_url(base_url: Option<&str>) -> String {
    match base_url {
        None => DEFAULT_BASE_URL.to_owned(),
        Some(u) => {
            let u = u.trim_end_matches('/');
            if u.ends_with("/v1") {
                u.to_owned()
            } else {
                format!("{u}/v1")
            }
        }
    }
}

impl CliFlavor for Codex {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Codex
    }

    fn binary(&self) -> CliBinary {
        CliBinary {
            env_var: "KEEL_CODEX_BIN",
            bin_name: "codex",
        }
    }

    fn invocation(
        &self,
        spec: &SessionSpec,
        program: &Path,
        session_dir: &Path,
    ) -> Result<Invocation, StartError> {
        let home = session_dir.join("home");
        let codex_home = session_dir.join("codex-home");
        let mut env = super::base_env(spec, &home);
        env.insert("CODEX_HOME".into(), codex_home.display().to_string());
        // A local endpoint needs no key, but the provider insists the variable exists.
        let key =
            super::credential_value(spec)?.map_or_else(|| "keel-no-key".to_owned(), |(_, v)| v);
        env.insert(KEY_VAR.into(), key);
        let base_url = openai_base_url(spec.account.base_url.as_deref());
        let provider = format!(
            "model_providers.keel={{name=\"keel\",base_url={},env_key=\"{KEY_VAR}\",wire_api=\"responses\",request_max_retries=0,stream_max_retries=0}}",
            toml_str(&base_url)
        );
        let mut args: Vec<String> = vec![
            "exec".into(),
            "--json".into(),
            "--skip-git-repo-check".into(),
            "--ephemeral".into(),
            "-C".into(),
            spec.working_dir.display().to_string(),
            "-m".into(),
            spec.model.clone(),
            "-c".into(),
            "model_provider=keel".into(),
            "-c".into(),
            provider,
            "-c".into(),
            "analytics.enabled=false".into(),
            "-c".into(),
            "check_for_update_on_startup=false".into(),
        ];
        for feature in [
            "plugins",
            "apps",
            "remote_plugin",
            "in_app_updates",
            "unbounded_connection_retries",
        ] {
            args.push("--disable".into());
            args.push(feature.into());
        }
        match spec.permission_mode {
            PermissionMode::ReadOnly => args.extend(["-s".into(), "read-only".into()]),
            PermissionMode::AcceptEdits => args.extend(["-s".into(), "workspace-write".into()]),
            PermissionMode::Bypass => {
                args.push("--dangerously-bypass-approvals-and-sandbox".into())
            }
        }
        if let Some(text) = &spec.append_system_prompt {
            args.push("-c".into());
            args.push(format!("developer_instructions={}", toml_str(text)));
        }
        let mut files = Vec::new();
        if let Some(gate) = &spec.pre_tool_gate {
            let wrapper = super::install_gate_wrapper(
                session_dir,
                gate,
                super::GateAllow::ExitZero,
                &mut files,
            );
            let secs = gate.timeout_ms.div_ceil(1000).max(1) + 5;
            let command = super::shell_quote(&wrapper.display().to_string());
            args.push("-c".into());
            args.push(hook_arg("PreToolUse", true, &command, secs));
        }
        if let Some(hook) = &spec.post_tool_hook {
            // After every call: keel records a success and runs the PostToolUse hooks; a changed
            // result comes back as `{"decision": "block", "reason": <the new result>}`, which Codex
            // sends the model instead of the output.
            let wrapper = super::post_tool::install_post_wrapper(
                session_dir,
                hook,
                HarnessKind::Codex,
                &mut files,
            );
            let secs = hook.timeout_ms.div_ceil(1000).max(1) + 5;
            let command = super::shell_quote(&wrapper.display().to_string());
            args.push("-c".into());
            args.push(hook_arg("PostToolUse", true, &command, secs));
        }
        let stop = match (&spec.stop_gate, &spec.stop_check) {
            (Some(stop), Some(_)) => Some(stop),
            _ => None,
        };
        if let Some(stop) = stop {
            // The report check when the session would end: the command judges
            // `last_assistant_message` and answers `{"decision": "block", "reason": ...}`, which
            // Codex sends the model as one more turn of the same session.
            let secs = stop.timeout_ms.div_ceil(1000).max(1);
            args.push("-c".into());
            args.push(hook_arg(
                "Stop",
                false,
                &super::gate::command_line(stop),
                secs,
            ));
        }
        if let Some(hook) = &spec.session_event_hook {
            // Before Codex compacts its context: keel's policy may veto it (`continue: false`,
            // which ends the turn: the attempt fails and is retried fresh). Codex takes no note.
            let wrapper = super::session_event::install_event_wrapper(
                session_dir,
                hook,
                HarnessKind::Codex,
                &mut files,
            );
            let secs = hook.timeout_ms.div_ceil(1000).max(1) + 5;
            let command = super::shell_quote(&wrapper.display().to_string());
            args.push("-c".into());
            args.push(hook_arg("PreCompact", false, &command, secs));
        }
        if spec.pre_tool_gate.is_some()
            || spec.post_tool_hook.is_some()
            || stop.is_some()
            || spec.session_event_hook.is_some()
        {
            // Hooks that are not trusted are skipped silently.
            args.push("--dangerously-bypass-hook-trust".into());
        }
        if let Some(mcp) = &spec.mcp_endpoint {
            let name = &mcp.server_name;
            args.push("-c".into());
            args.push(format!("mcp_servers.{name}.url={}", toml_str(&mcp.url)));
            args.push("-c".into());
            args.push(format!(
                "mcp_servers.{name}.default_tools_approval_mode=\"approve\""
            ));
            if let Some(var) = &mcp.bearer_token_env {
                args.push("-c".into());
                args.push(format!(
                    "mcp_servers.{name}.bearer_token_env_var={}",
                    toml_str(var)
                ));
                if let Some(v) = spec.env_var(var) {
                    env.insert(var.clone(), v);
                }
            }
        }
        // Codex has no allow/deny list for its built-in tools on the command line (README §2.4):
        // `allowed_tools`/`disallowed_tools` are enforced by the pre-tool gate, if any.
        args.push("--".into());
        args.push(spec.prompt.clone());
        Ok(Invocation {
            program: program.to_path_buf(),
            args,
            env,
            cwd: spec.working_dir.clone(),
            files,
            dirs: vec![home.clone(), codex_home.clone()],
            stdin_file: None,
        })
    }

    fn parser(&self, spec: &SessionSpec) -> Box<dyn EventParser> {
        Box::new(CodexParser::for_spec(spec))
    }

    /// Codex prints a command's or an MCP call's `item.completed` (with its original output) and
    /// runs its `PostToolUse` hook for both (probed: an MCP call's hook gets `tool_name`
    /// `mcp__SERVER__TOOL`, as the parser names it, and the result object whose text the stream
    /// shows). File changes are not waited for (their log row is a summary of the changes).
    fn result_before_hook(&self, tool: &str) -> bool {
        tool == "shell" || tool.starts_with("mcp__")
    }

    fn result_before_hook_unknown(&self) -> bool {
        true
    }

    /// Its stream's `item_N` ids are its own, not the call ids its hooks get.
    fn stream_ids_are_call_ids(&self) -> bool {
        false
    }
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    thread_id: Option<String>,
    #[serde(default, borrow)]
    item: Option<Item<'a>>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: Option<String>,
}

#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    command: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    aggregated_output: Option<Cow<'a, str>>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default, borrow)]
    status: Option<Cow<'a, str>>,
    #[serde(default)]
    changes: Option<serde_json::Value>,
    #[serde(default, borrow)]
    server: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool: Option<Cow<'a, str>>,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize, Clone, Copy)]
struct Usage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    cached_input_tokens: u64,
    #[serde(default)]
    cache_write_input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
}

/// Recognises the report check's re-ask in Codex's output, which does not show its Stop hook's
/// decision: the hook runs the same judge on the same text (`last_assistant_message`), and Codex
/// runs it only when a model response has no tool call, so a final message the judge refuses,
/// followed in the same turn by another message, was sent back (docs/HARNESSES.md). A re-ask
/// whose answer starts with a tool call is not recognised (the log then lacks its row; the
/// attempt's outcome does not depend on it).
struct StopWatch {
    judge: Arc<dyn StopJudge>,
    check: StopCheck,
    /// The refusal of the turn's latest message, while nothing followed it.
    refused: Option<String>,
    sent_back: u32,
}

impl std::fmt::Debug for StopWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StopWatch")
            .field("refused", &self.refused.is_some())
            .field("sent_back", &self.sent_back)
            .finish_non_exhaustive()
    }
}

impl StopWatch {
    /// A message completed: the earlier refused one was sent back, if there is one; this one is
    /// judged while re-asks are left.
    fn message(&mut self, text: &str, out: &mut Vec<HarnessEvent>) {
        if let Some(reason) = self.refused.take() {
            self.sent_back += 1;
            out.push(HarnessEvent::SentBack { reason });
        }
        if self.sent_back < self.check.re_asks_max {
            self.refused = self.judge.judge(&self.check, text).err();
        }
    }
}

/// Parses `codex exec --json` output.
#[derive(Debug, Default)]
pub struct CodexParser {
    open_items: BTreeSet<String>,
    tool_calls: u32,
    turns_completed: u32,
    last_text: String,
    last_error: Option<String>,
    stop: Option<StopWatch>,
}

impl CodexParser {
    /// The parser for a session of `spec`: it recognises the report check's re-ask when the spec
    /// installs Codex's Stop hook (`stop_gate` and `stop_check`) and the host gave the judge.
    pub fn for_spec(spec: &SessionSpec) -> CodexParser {
        let stop = match (&spec.stop_gate, &spec.stop_check, &spec.in_process.stop) {
            (Some(_), Some(check), Some(judge)) => Some(StopWatch {
                judge: Arc::clone(judge),
                check: check.clone(),
                refused: None,
                sent_back: 0,
            }),
            _ => None,
        };
        CodexParser {
            stop,
            ..CodexParser::default()
        }
    }

    fn tool_use(&mut self, item: &Item<'_>, out: &mut Vec<HarnessEvent>) {
        if self.open_items.contains(item.id.as_ref()) {
            return;
        }
        if let Some(watch) = &mut self.stop {
            // A message followed by a tool call was not a final answer (or its re-ask began with
            // a tool call, which cannot be told apart).
            watch.refused = None;
        }
        let (name, input) = match item.kind.as_ref() {
            "command_execution" => {
                // Built by hand: a `json!` map per call costs more than the rest of the line.
                let command = serde_json::to_string(item.command.as_deref().unwrap_or_default())
                    .unwrap_or_else(|_| "\"\"".to_owned());
                ("shell".to_owned(), format!("{{\"command\":{command}}}"))
            }
            "file_change" => (
                "apply_patch".to_owned(),
                serde_json::json!({"changes": item.changes}).to_string(),
            ),
            "mcp_tool_call" => (
                format!(
                    "mcp__{}__{}",
                    item.server.as_deref().unwrap_or(""),
                    item.tool.as_deref().unwrap_or("")
                ),
                item.arguments
                    .as_ref()
                    .map_or_else(|| "null".to_owned(), ToString::to_string),
            ),
            _ => return,
        };
        // Only a started item can complete later; a completed one is closed at once by the caller.
        if self.open_items.len() < OPEN_ITEMS_MAX {
            self.open_items.insert(item.id.to_string());
        }
        self.tool_calls += 1;
        out.push(HarnessEvent::tool_use(item.id.to_string(), name, input));
    }

    fn tool_result(&mut self, item: &Item<'_>, out: &mut Vec<HarnessEvent>) {
        let failed = item.status.as_deref() == Some("failed");
        let (is_error, content) = match item.kind.as_ref() {
            "command_execution" => (
                failed || item.exit_code.is_some_and(|c| c != 0),
                item.aggregated_output
                    .as_deref()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            "file_change" => {
                let summary = item
                    .changes
                    .as_ref()
                    .and_then(serde_json::Value::as_array)
                    .map(|cs| {
                        cs.iter()
                            .map(|c| {
                                format!(
                                    "{} {}",
                                    c.get("kind")
                                        .and_then(serde_json::Value::as_str)
                                        .unwrap_or("?"),
                                    c.get("path")
                                        .and_then(serde_json::Value::as_str)
                                        .unwrap_or("?")
                                )
                            })
                            .collect::<Vec<_>>()
                            .join("\n")
                    })
                    .unwrap_or_default();
                (failed, summary)
            }
            "mcp_tool_call" => {
                let err = item.error.as_ref().filter(|e| !e.is_null());
                match err {
                    Some(e) => (
                        true,
                        e.get("message")
                            .map_or_else(|| e.to_string(), super::content_text),
                    ),
                    None => (
                        failed,
                        item.result
                            .as_ref()
                            .and_then(|r| r.get("content"))
                            .map(super::content_text)
                            .unwrap_or_default(),
                    ),
                }
            }
            _ => return,
        };
        self.tool_use(item, out);
        self.open_items.remove(item.id.as_ref());
        out.push(HarnessEvent::tool_result(
            item.id.to_string(),
            is_error,
            content,
        ));
    }
}

impl EventParser for CodexParser {
    fn parse_line(
        &mut self,
        line: &[u8],
        now_unix_ms: u64,
        out: &mut Vec<HarnessEvent>,
    ) -> Result<(), ParseError> {
        let l: Line<'_> = parse_json(line)?;
        match l.kind {
            "thread.started" => out.push(HarnessEvent::Started {
                native_session_id: l.thread_id,
                model: None,
            }),
            "item.started" | "item.updated" => {
                let item = l.item.ok_or(ParseError::MissingField {
                    event: l.kind.into(),
                    field: "item",
                })?;
                self.tool_use(&item, out);
            }
            "item.completed" => {
                let item = l.item.ok_or(ParseError::MissingField {
                    event: l.kind.into(),
                    field: "item",
                })?;
                match item.kind.as_ref() {
                    "agent_message" => {
                        let text = item.text.map(Cow::into_owned).unwrap_or_default();
                        if let Some(watch) = &mut self.stop {
                            watch.message(&text, out);
                        }
                        self.last_text.clone_from(&text);
                        out.push(HarnessEvent::Text { text });
                    }
                    // Notices ("Model metadata ... not found", hook-trust warnings) are harmless.
                    "error" | "reasoning" | "todo_list" | "web_search" => {}
                    _ => self.tool_result(&item, out),
                }
            }
            "turn.completed" => {
                self.turns_completed += 1;
                if let Some(watch) = &mut self.stop {
                    watch.refused = None; // the session ends on it
                }
                if let Some(u) = l.usage {
                    // OpenAI counts cached tokens inside input_tokens; keel counts them apart.
                    out.push(HarnessEvent::Usage(UsageReport {
                        scope: UsageScope::Message(format!("turn-{}", self.turns_completed)),
                        counts: TokenCounts {
                            input_tokens: u.input_tokens.saturating_sub(u.cached_input_tokens),
                            output_tokens: u.output_tokens,
                            cache_read_tokens: u.cached_input_tokens,
                            cache_write_tokens: u.cache_write_input_tokens,
                            cost_micros: None,
                        },
                    }));
                }
                out.push(HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: self.last_text.clone(),
                });
            }
            "turn.failed" => {
                let message = l
                    .error
                    .and_then(|e| e.message)
                    .or_else(|| self.last_error.clone())
                    .unwrap_or_else(|| "codex turn failed".to_owned());
                out.push(HarnessEvent::Failed(limits::classify(
                    &message,
                    None,
                    None,
                    now_unix_ms,
                )));
            }
            "error" => self.last_error = l.message,
            _ => {}
        }
        Ok(())
    }

    fn turns(&self) -> u32 {
        // Codex prints no per-request event: each tool call implies one more model request.
        self.tool_calls + 1
    }

    fn last_text(&self) -> &str {
        &self.last_text
    }

    fn finish(&mut self, outcome: &ProcessOutcome) -> HarnessEvent {
        let message = match &self.last_error {
            Some(e) => e.clone(),
            None => super::died_message("codex", outcome),
        };
        HarnessEvent::Failed(limits::classify(&message, None, None, outcome.now_unix_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::GateCommand;

    /// Refuses any text that is not exactly `GOOD`.
    struct OnlyGood;

    impl StopJudge for OnlyGood {
        fn judge(&self, _check: &StopCheck, text: &str) -> Result<(), String> {
            if text == "GOOD" {
                Ok(())
            } else {
                Err(format!("refused: {text}"))
            }
        }
    }

    fn parser_with_stop_hook() -> CodexParser {
        let mut spec = SessionSpec::new("p", "m", "/tmp");
        spec.stop_check = Some(StopCheck {
            report_for: vec!["t".into()],
            re_asks_max: 1,
        });
        spec.stop_gate = Some(GateCommand {
            program: "keel".into(),
            args: vec!["hook".into()],
            timeout_ms: 1_000,
        });
        spec.in_process.stop = Some(Arc::new(OnlyGood));
        CodexParser::for_spec(&spec)
    }

    fn events(parser: &mut CodexParser, lines: &[&str]) -> Vec<HarnessEvent> {
        let mut out = Vec::new();
        for line in lines {
            parser
                .parse_line(line.as_bytes(), 0, &mut out)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        out
    }

    const MESSAGE_BAD: &str =
        r#"{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"BAD"}}"#;
    const MESSAGE_GOOD: &str =
        r#"{"type":"item.completed","item":{"id":"item_2","type":"agent_message","text":"GOOD"}}"#;
    const COMMAND: &str = r#"{"type":"item.started","item":{"id":"item_3","type":"command_execution","command":"ls","aggregated_output":"","status":"in_progress"}}"#;
    const TURN_DONE: &str =
        r#"{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":1}}"#;

    fn sent_back(events: &[HarnessEvent]) -> Vec<&str> {
        events
            .iter()
            .filter_map(|e| match e {
                HarnessEvent::SentBack { reason } => Some(reason.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn hook_arguments_are_codexs_toml() {
        assert_eq!(
            hook_arg("PreToolUse", true, "/s/keel-gate.sh", 15),
            r#"hooks.PreToolUse=[{matcher="*",hooks=[{type="command",command="/s/keel-gate.sh",timeout=15}]}]"#
        );
        assert_eq!(
            hook_arg("Stop", false, "keel hook --report-for 'a b'", 10),
            r#"hooks.Stop=[{hooks=[{type="command",command="keel hook --report-for 'a b'",timeout=10}]}]"#
        );
    }

    #[test]
    fn a_refused_message_followed_by_another_in_the_same_turn_was_sent_back_once() {
        let mut p = parser_with_stop_hook();
        let out = events(&mut p, &[MESSAGE_BAD, MESSAGE_GOOD, TURN_DONE]);
        assert_eq!(sent_back(&out), vec!["refused: BAD"]);
        // The re-ask comes between the refused message's text and the new one's.
        assert!(matches!(&out[1], HarnessEvent::SentBack { .. }), "{out:?}");
        assert!(
            matches!(&out[2], HarnessEvent::Text { text } if text == "GOOD"),
            "{out:?}"
        );
        // A second refusal is not judged again: the session was sent back once already.
        let mut p = parser_with_stop_hook();
        let out = events(&mut p, &[MESSAGE_BAD, MESSAGE_BAD, MESSAGE_BAD, TURN_DONE]);
        assert_eq!(sent_back(&out).len(), 1, "{out:?}");
    }

    #[test]
    fn a_message_before_a_tool_call_or_at_the_turns_end_was_not_sent_back() {
        let mut p = parser_with_stop_hook();
        let out = events(&mut p, &[MESSAGE_BAD, COMMAND, MESSAGE_GOOD, TURN_DONE]);
        assert_eq!(sent_back(&out), Vec::<&str>::new());
        let out = events(&mut p, &[MESSAGE_BAD, TURN_DONE]);
        assert_eq!(sent_back(&out), Vec::<&str>::new());
        // Without the Stop hook nothing is recognised.
        let mut plain = CodexParser::default();
        let out = events(&mut plain, &[MESSAGE_BAD, MESSAGE_GOOD, TURN_DONE]);
        assert_eq!(sent_back(&out), Vec::<&str>::new());
    }
}
