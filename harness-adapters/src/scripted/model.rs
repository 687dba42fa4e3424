//! The scripted model itself: pure, deterministic, no IO, no clock, no tokio.
//!
//! `respond` maps a [`ModelRequest`] to a [`ModelReply`]. Given the same script and the same
//! sequence of requests it gives the same replies, which is what the simulator and the conformance
//! tests rely on. The HTTP server and the in-process harness only encode its replies.

use serde_json::{Map, Value, json};

use super::request::{ModelRequest, OfferedToolKind};
use super::script::{HANG_MS_DEFAULT, Script, ScriptFailure, ScriptToolCall, ScriptUsage};

/// Shell tool names the rules look for, in order of preference (the names the four CLIs and keel's
/// own loop give their shell tool).
pub const SHELL_TOOL_NAMES: [&str; 6] = [
    "Bash",
    "bash",
    "shell",
    "exec_command",
    "shell_command",
    "local_shell",
];

/// How much of a tool result the rule-mode final answer echoes, in characters.
pub const ECHO_CHARS_MAX: usize = 300;

/// The text of a rule-mode answer when there is nothing else to say.
pub const GREETING: &str = "Hello from the scripted model.";

/// A tool call the model decided on.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedToolCall {
    /// A per-model counter, unique across the model's life; wires format ids from it
    /// (`toolu_scripted_001`, `call_scripted_001`), so ids are stable across runs.
    pub call_seq: u64,
    /// The tool's name as the client offered it (the inner name for namespaced tools).
    pub name: String,
    /// The JSON input (for a custom tool: `{"input": "<raw text>"}`).
    pub input: Value,
    /// The Responses namespace, for namespaced tools.
    pub namespace: Option<String>,
    /// Whether this is a freeform (custom) tool call.
    pub custom: bool,
}

impl PlannedToolCall {
    /// The raw text input of a custom tool call.
    pub fn custom_input(&self) -> String {
        self.input
            .get("input")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    }
}

/// A normal answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// A per-model counter, unique per reply; wires format message ids from it.
    pub message_seq: u64,
    /// Assistant text (may be empty when there are tool calls).
    pub text: String,
    /// Tool calls, in order.
    pub tool_calls: Vec<PlannedToolCall>,
    /// Anthropic-style stop reason; `None` when the stream must not say why it stopped (the
    /// missing-finish-reason trap).
    pub stop_reason: Option<String>,
    /// Usage to report.
    pub usage: ScriptUsage,
}

/// What the model does with one request.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelReply {
    /// A normal answer.
    Answer(Answer),
    /// A normal answer whose stream stalls after its first event for `ms` milliseconds.
    StallMidStream {
        /// The answer that would have been streamed.
        answer: Answer,
        /// How long to stall.
        ms: u64,
    },
    /// An HTTP error status.
    HttpError {
        /// Status code.
        status: u16,
        /// Error message for the body.
        message: String,
        /// `retry-after` seconds, when set.
        retry_after_secs: Option<u64>,
        /// Seconds until the rate limit resets, when set.
        reset_after_secs: Option<u64>,
    },
    /// No response for `ms` milliseconds.
    Hang {
        /// How long.
        ms: u64,
    },
    /// A 200 with a body that is not a valid stream.
    Malformed,
    /// The connection closes mid-stream.
    Disconnect,
}

/// A deterministic model following a [`Script`].
#[derive(Debug, Clone)]
pub struct ScriptedModel {
    script: Script,
    next_turn: usize,
    message_seq: u64,
    call_seq: u64,
}

impl ScriptedModel {
    /// A model at the start of its script.
    pub fn new(script: Script) -> Self {
        ScriptedModel {
            script,
            next_turn: 0,
            message_seq: 0,
            call_seq: 0,
        }
    }

    /// How many requests it has answered.
    pub fn requests_answered(&self) -> u64 {
        self.message_seq
    }

    /// Whether every scripted turn has been used.
    pub fn script_finished(&self) -> bool {
        self.next_turn >= self.script.turns.len()
    }

    /// Decides the reply to one request and advances the script.
    pub fn respond(&mut self, request: &ModelRequest) -> ModelReply {
        self.message_seq += 1;
        let usage_default = self.script.default_usage.unwrap_or_default();
        let Some(turn) = self.script.turns.get(self.next_turn).cloned() else {
            if self.script.rules_after_turns {
                return ModelReply::Answer(self.rules_answer(request, usage_default));
            }
            return ModelReply::HttpError {
                status: 500,
                message: "the script has no more turns".to_owned(),
                retry_after_secs: None,
                reset_after_secs: None,
            };
        };
        self.next_turn += 1;
        let usage = turn.usage.unwrap_or(usage_default);
        if let Some(failure) = turn.failure {
            return self.failure_reply(failure, usage);
        }
        let tool_calls: Vec<PlannedToolCall> = turn
            .tool_calls
            .iter()
            .filter_map(|c| self.scripted_call(request, c))
            .collect();
        let stop = turn.stop_reason.unwrap_or_else(|| {
            if tool_calls.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            }
            .to_owned()
        });
        ModelReply::Answer(Answer {
            message_seq: self.message_seq,
            text: turn.text.unwrap_or_default(),
            tool_calls,
            stop_reason: Some(stop),
            usage,
        })
    }

    fn failure_reply(&mut self, failure: ScriptFailure, usage: ScriptUsage) -> ModelReply {
        match failure {
            ScriptFailure::RateLimited {
                retry_after_secs,
                reset_after_secs,
            } => ModelReply::HttpError {
                status: 429,
                message: "scripted rate limit".to_owned(),
                retry_after_secs: Some(retry_after_secs),
                reset_after_secs,
            },
            ScriptFailure::Http { status, message } => ModelReply::HttpError {
                status,
                message: message.unwrap_or_else(|| format!("scripted {status}")),
                retry_after_secs: None,
                reset_after_secs: None,
            },
            ScriptFailure::OverlongOutput { bytes } => {
                let len = usize::try_from(bytes).unwrap_or(usize::MAX);
                let text: String = "overlong ".chars().cycle().take(len).collect();
                ModelReply::Answer(Answer {
                    message_seq: self.message_seq,
                    text,
                    tool_calls: Vec::new(),
                    stop_reason: Some("max_tokens".to_owned()),
                    usage,
                })
            }
            ScriptFailure::Hang { ms } => ModelReply::Hang {
                ms: ms.unwrap_or(HANG_MS_DEFAULT),
            },
            ScriptFailure::HangMidStream { ms } => ModelReply::StallMidStream {
                answer: Answer {
                    message_seq: self.message_seq,
                    text: "this answer stalls".to_owned(),
                    tool_calls: Vec::new(),
                    stop_reason: Some("end_turn".to_owned()),
                    usage,
                },
                ms: ms.unwrap_or(HANG_MS_DEFAULT),
            },
            ScriptFailure::Malformed => ModelReply::Malformed,
            ScriptFailure::MissingFinishReason { text } => ModelReply::Answer(Answer {
                message_seq: self.message_seq,
                text: text.unwrap_or_else(|| GREETING.to_owned()),
                tool_calls: Vec::new(),
                stop_reason: None,
                usage,
            }),
            ScriptFailure::Disconnect => ModelReply::Disconnect,
        }
    }

    fn next_call_seq(&mut self) -> u64 {
        self.call_seq += 1;
        self.call_seq
    }

    fn scripted_call(
        &mut self,
        request: &ModelRequest,
        call: &ScriptToolCall,
    ) -> Option<PlannedToolCall> {
        if let Some(cmd) = &call.shell {
            return self.shell_call(request, cmd).or_else(|| {
                // No shell tool offered: still call `bash`, so the client sees the scripted intent
                // (and keel's loop answers with an unknown-tool error result).
                let seq = self.next_call_seq();
                Some(PlannedToolCall {
                    call_seq: seq,
                    name: "bash".into(),
                    input: json!({"command": cmd}),
                    namespace: None,
                    custom: false,
                })
            });
        }
        let name = call.name.clone()?;
        let input = call
            .input
            .clone()
            .unwrap_or_else(|| Value::Object(Map::new()));
        Some(self.named_call(request, &name, input))
    }

    fn named_call(&mut self, request: &ModelRequest, name: &str, input: Value) -> PlannedToolCall {
        let seq = self.next_call_seq();
        match request.tool(name).map(|t| &t.kind) {
            Some(OfferedToolKind::Custom) => PlannedToolCall {
                call_seq: seq,
                name: name.to_owned(),
                input: json!({"input": input.get("input").and_then(Value::as_str).unwrap_or("")}),
                namespace: None,
                custom: true,
            },
            Some(OfferedToolKind::Namespaced {
                namespace,
                name: inner,
            }) => PlannedToolCall {
                call_seq: seq,
                name: inner.clone(),
                input,
                namespace: Some(namespace.clone()),
                custom: false,
            },
            _ => PlannedToolCall {
                call_seq: seq,
                name: name.to_owned(),
                input,
                namespace: None,
                custom: false,
            },
        }
    }

    /// Calls the offered shell tool with `cmd`, shaping the arguments to its schema.
    fn shell_call(&mut self, request: &ModelRequest, cmd: &str) -> Option<PlannedToolCall> {
        let tool = SHELL_TOOL_NAMES.iter().find_map(|n| request.tool(n))?;
        let props = tool
            .schema
            .get("properties")
            .cloned()
            .unwrap_or(Value::Null);
        let mut args = Map::new();
        match props
            .get("command")
            .map(|c| c.get("type").and_then(Value::as_str))
        {
            Some(Some("array")) => {
                args.insert("command".into(), json!(["bash", "-lc", cmd]));
            }
            Some(_) => {
                args.insert("command".into(), json!(cmd));
            }
            None if props.get("cmd").is_some() => {
                args.insert("cmd".into(), json!(cmd));
            }
            None => {
                args.insert("command".into(), json!(cmd));
            }
        }
        if props.get("description").is_some() {
            args.insert("description".into(), json!("run scripted command"));
        }
        let name = tool.name.clone();
        Some(self.named_call(request, &name, Value::Object(args)))
    }

    /// The prompt rules (the behaviour of the probe server the CLI facts were gathered with):
    /// `CALL_TOOL: <Name> <json>` calls an offered tool, `RUN_TOOL: <cmd> ;;` calls the shell tool;
    /// both only while the conversation holds no tool result. Once one is present the answer is
    /// `FINAL: tool <id> returned: <first 300 chars>`, proving which result came back.
    fn rules_answer(&mut self, request: &ModelRequest, usage: ScriptUsage) -> Answer {
        let mut tool_calls = Vec::new();
        if !request.tools.is_empty() && request.tool_results.is_empty() {
            if let Some((name, input)) = parse_call_tool(&request.user_text)
                && request.tool(&name).is_some()
            {
                tool_calls.push(self.named_call(request, &name, input));
            } else if let Some(cmd) = parse_run_tool(&request.user_text)
                && let Some(call) = self.shell_call(request, &cmd)
            {
                tool_calls.push(call);
            }
        }
        let (text, stop) = if !tool_calls.is_empty() {
            (String::new(), "tool_use")
        } else if !request.tool_results.is_empty()
            && let Some(malformed) = malformed_report(&request.user_text)
        {
            (malformed, "end_turn")
        } else if let Some(last) = request.tool_results.last() {
            match report_after_tool(&request.user_text, &last.call_id, &last.text) {
                Some(report) => (report, "end_turn"),
                None => {
                    let echoed: String = last.text.chars().take(ECHO_CHARS_MAX).collect();
                    (
                        format!("FINAL: tool {} returned: {}", last.call_id, echoed),
                        "end_turn",
                    )
                }
            }
        } else {
            (GREETING.to_owned(), "end_turn")
        };
        Answer {
            message_seq: self.message_seq,
            text,
            tool_calls,
            stop_reason: Some(stop.to_owned()),
            usage,
        }
    }
}

/// The marker of the report rule: a prompt holding it is answered, once a tool result is present,
/// with a keel report instead of the `FINAL:` echo.
pub const REPORT_AFTER_TOOL: &str = "REPORT_AFTER_TOOL";

/// The report rule: when the prompt holds [`REPORT_AFTER_TOOL`] and names its task on a
/// `Subtask id: <id>` line (the last such line: a session's own brief comes after its preamble), the
/// answer is a complete keel report for that task whose one finding is the first line of the last
/// tool result (cut to 120 characters of `[A-Za-z0-9 ._:/-]`), sourced to the tool call. Lets a
/// scripted lead end with a report after its `delegate` call is answered.
pub fn report_after_tool(user_text: &str, call_id: &str, result: &str) -> Option<String> {
    if !user_text.contains(REPORT_AFTER_TOOL) {
        return None;
    }
    let task = user_text
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Subtask id:"))?
        .trim();
    let claim: String = result
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || " ._:/-".contains(*c))
        .take(120)
        .collect();
    let claim = if claim.trim().is_empty() {
        "the tool answered".to_owned()
    } else {
        claim
    };
    Some(
        json!({
            "subtask_id": task,
            "status": "complete",
            "findings": [{"claim": claim, "source": format!("tool {call_id}"), "confidence_permille": 800}],
            "gaps": [],
            "summary": "reported after the tool answered",
        })
        .to_string(),
    )
}

/// The marker of the malformed-report rule: `MALFORMED_REPORTS: <n>` in a prompt makes the model
/// answer, once a tool result is present, with an unsourced report (no task id, its one finding's
/// source empty) until the conversation holds `n` re-asks of keel's report check
/// ([`crate::stop::RE_ASK_MARKER`]); then the other rules answer. Lets a test drive the Stop hook's
/// re-ask on any harness.
pub const MALFORMED_REPORTS: &str = "MALFORMED_REPORTS:";

/// The unsourced report of the malformed-report rule, while the prompt asks for more of them than
/// the conversation was re-asked for.
pub fn malformed_report(user_text: &str) -> Option<String> {
    let wanted = user_text.lines().find_map(|l| {
        let at = l.find(MALFORMED_REPORTS)?;
        l[at + MALFORMED_REPORTS.len()..]
            .split_whitespace()
            .next()?
            .parse::<usize>()
            .ok()
    })?;
    let re_asked = user_text.matches(crate::stop::RE_ASK_MARKER).count();
    (re_asked < wanted).then(|| {
        json!({"status": "complete",
               "findings": [{"claim": "an unsourced claim", "source": "", "confidence_permille": 900}],
               "summary": "a report without its source"})
        .to_string()
    })
}

/// Finds `CALL_TOOL: <Name> <json object>` on one line; the JSON runs to the last `}` of that line.
pub fn parse_call_tool(text: &str) -> Option<(String, Value)> {
    for line in text.lines() {
        let Some(at) = line.find("CALL_TOOL:") else {
            continue;
        };
        let rest = line[at + "CALL_TOOL:".len()..].trim_start();
        let name_end = rest.find(char::is_whitespace)?;
        let name = &rest[..name_end];
        let args = rest[name_end..].trim_start();
        if !args.starts_with('{') {
            continue;
        }
        let close = args.rfind('}')?;
        if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(&args[..=close]) {
            return Some((name.to_owned(), value));
        }
    }
    None
}

/// Finds `RUN_TOOL: <cmd> ;;` (or to the end of the line) and returns the trimmed command.
pub fn parse_run_tool(text: &str) -> Option<String> {
    for line in text.lines() {
        let Some(at) = line.find("RUN_TOOL:") else {
            continue;
        };
        let rest = &line[at + "RUN_TOOL:".len()..];
        let cmd = rest.find(";;").map_or(rest, |end| &rest[..end]).trim();
        if !cmd.is_empty() {
            return Some(cmd.to_owned());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::request::WireApi;
    use super::super::script::ScriptTurn;
    use super::*;

    fn anthropic(body: Value) -> ModelRequest {
        ModelRequest::from_body(WireApi::AnthropicMessages, &body)
    }

    #[test]
    fn rules_call_the_shell_tool_by_its_schema() {
        let mut m = ScriptedModel::new(Script::rules());
        let claude = anthropic(json!({
            "model": "claude-x",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "RUN_TOOL: echo hi > p.txt ;; then stop"}]}],
            "tools": [{"name": "Read", "input_schema": {}},
                      {"name": "Bash", "input_schema": {"properties": {"command": {"type": "string"}, "description": {}}}}]
        }));
        let ModelReply::Answer(a) = m.respond(&claude) else {
            panic!("answer")
        };
        assert_eq!(a.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!(a.tool_calls[0].name, "Bash");
        assert_eq!(
            a.tool_calls[0].input,
            json!({"command": "echo hi > p.txt", "description": "run scripted command"})
        );

        let codex = ModelRequest::from_body(
            WireApi::OpenAiResponses,
            &json!({
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "RUN_TOOL: ls"}]}],
                "tools": [{"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {}}}}]
            }),
        );
        let ModelReply::Answer(a) = m.respond(&codex) else {
            panic!("answer")
        };
        assert_eq!(a.tool_calls[0].input, json!({"cmd": "ls"}));
        assert_eq!(
            a.tool_calls[0].call_seq, 2,
            "call ids keep counting across requests"
        );
    }

    #[test]
    fn rules_echo_the_last_tool_result() {
        let mut m = ScriptedModel::new(Script::rules());
        let chat = ModelRequest::from_body(
            WireApi::OpenAiChat,
            &json!({
                "messages": [{"role": "user", "content": "RUN_TOOL: x"},
                             {"role": "assistant", "tool_calls": []},
                             {"role": "tool", "tool_call_id": "call_7", "content": "tool-ran\n"}],
                "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
            }),
        );
        let ModelReply::Answer(a) = m.respond(&chat) else {
            panic!("answer")
        };
        assert_eq!(a.text, "FINAL: tool call_7 returned: tool-ran\n");
        assert!(a.tool_calls.is_empty());
    }

    #[test]
    fn the_malformed_report_rule_stops_once_re_asked_enough() {
        let mut m = ScriptedModel::new(Script::rules());
        let ask = |texts: &[&str]| {
            let mut messages = vec![
                json!({"role": "user", "content": texts[0]}),
                json!({"role": "assistant", "tool_calls": []}),
                json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"}),
            ];
            for t in &texts[1..] {
                messages.push(json!({"role": "user", "content": t}));
            }
            ModelRequest::from_body(
                WireApi::OpenAiChat,
                &json!({"messages": messages,
                        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}]}),
            )
        };
        let brief = "RUN_TOOL: x\nMALFORMED_REPORTS: 1";
        let ModelReply::Answer(first) = m.respond(&ask(&[brief])) else {
            panic!("answer")
        };
        assert!(first.text.contains(r#""source":"""#), "{}", first.text);
        let re_ask = format!("{}: finding 0 has no source", crate::stop::RE_ASK_MARKER);
        let ModelReply::Answer(second) = m.respond(&ask(&[brief, &re_ask])) else {
            panic!("answer")
        };
        assert_eq!(second.text, "FINAL: tool call_1 returned: ok");
    }

    #[test]
    fn call_tool_parses_json_and_ignores_unoffered_tools() {
        assert_eq!(
            parse_call_tool(
                "please\nCALL_TOOL: Write {\"file_path\": \"a\", \"content\": \"{x}\"} trailing"
            ),
            Some(("Write".into(), json!({"file_path": "a", "content": "{x}"})))
        );
        assert_eq!(parse_call_tool("CALL_TOOL: Write not-json"), None);
        let mut m = ScriptedModel::new(Script::rules());
        let req = anthropic(json!({
            "messages": [{"role": "user", "content": "CALL_TOOL: Nope {}"}],
            "tools": [{"name": "Bash", "input_schema": {}}]
        }));
        let ModelReply::Answer(a) = m.respond(&req) else {
            panic!("answer")
        };
        assert!(a.tool_calls.is_empty());
        assert_eq!(a.text, GREETING);
    }

    #[test]
    fn turns_play_in_order_then_rules_or_500() {
        let turns = vec![
            ScriptTurn {
                failure: Some(ScriptFailure::RateLimited {
                    retry_after_secs: 3,
                    reset_after_secs: Some(60),
                }),
                ..Default::default()
            },
            ScriptTurn {
                text: Some("one".into()),
                ..Default::default()
            },
        ];
        let req = anthropic(json!({"messages": [{"role": "user", "content": "hi"}]}));
        let mut m = ScriptedModel::new(Script::from_turns(turns.clone()));
        assert!(matches!(
            m.respond(&req),
            ModelReply::HttpError {
                status: 429,
                retry_after_secs: Some(3),
                reset_after_secs: Some(60),
                ..
            }
        ));
        assert!(
            matches!(m.respond(&req), ModelReply::Answer(Answer { ref text, .. }) if text == "one")
        );
        assert!(m.script_finished());
        assert!(
            matches!(m.respond(&req), ModelReply::Answer(Answer { ref text, .. }) if text == GREETING)
        );
        let mut strict = ScriptedModel::new(Script {
            rules_after_turns: false,
            ..Script::from_turns(turns)
        });
        strict.respond(&req);
        strict.respond(&req);
        assert!(matches!(
            strict.respond(&req),
            ModelReply::HttpError { status: 500, .. }
        ));
    }

    #[test]
    fn same_script_same_replies() {
        let script = Script::from_json_str(r#"{"turns":[{"tool_calls":[{"shell":"ls"}]},{"failure":{"kind":"overlong_output","bytes":50}}]}"#).unwrap();
        let req = anthropic(
            json!({"messages": [{"role": "user", "content": "go"}], "tools": [{"name": "bash", "input_schema": {}}]}),
        );
        let run = || {
            let mut m = ScriptedModel::new(script.clone());
            (0..3).map(|_| m.respond(&req)).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let ModelReply::Answer(overlong) = &a[1] else {
            panic!("answer")
        };
        assert_eq!(overlong.text.len(), 50);
        assert_eq!(overlong.stop_reason.as_deref(), Some("max_tokens"));
    }
}
