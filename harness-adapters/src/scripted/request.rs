//! A wire-independent view of a model request: what the scripted model decides from.
//!
//! Each wire API (Anthropic Messages, OpenAI Responses, OpenAI Chat Completions) is reduced to the
//! same few facts, so the model's behaviour is identical whichever CLI is talking to it. Pure: it
//! reads a parsed JSON body and nothing else.

use serde_json::Value;

/// Which wire API a request arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireApi {
    /// Anthropic Messages (`/v1/messages`): Claude Code, pi, keel's messages-api loop.
    AnthropicMessages,
    /// OpenAI Responses (`/v1/responses`): Codex, pi.
    OpenAiResponses,
    /// OpenAI Chat Completions (`/v1/chat/completions`): opencode, pi.
    OpenAiChat,
}

/// How an offered tool is called.
#[derive(Debug, Clone, PartialEq)]
pub enum OfferedToolKind {
    /// A JSON-schema function tool.
    Function,
    /// A freeform tool taking raw text (Codex `apply_patch`, Responses `custom`).
    Custom,
    /// A function inside a Responses namespace (Codex MCP tools): called as `name` with `namespace`.
    Namespaced {
        /// The namespace, e.g. `mcp__echo`.
        namespace: String,
        /// The tool's own name inside it.
        name: String,
    },
}

/// A tool the request offers.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedTool {
    /// Name to match `CALL_TOOL:` and scripted calls against (`namespace__name` for namespaced tools).
    pub name: String,
    /// How it is called.
    pub kind: OfferedToolKind,
    /// Its JSON input schema (`Null` when it has none).
    pub schema: Value,
}

/// A tool result already present in the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResultSeen {
    /// The call id it answers.
    pub call_id: String,
    /// Its text content.
    pub text: String,
}

/// The facts of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    /// The wire API it came on.
    pub wire: WireApi,
    /// The `model` field, verbatim (tests assert the spec's model reached the endpoint).
    pub model: String,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// Every user text in the conversation, joined by newlines.
    pub user_text: String,
    /// The first line of the prompt as the model sees it: the first user text that is not a
    /// context block the harness injected (Claude Code's `<system-reminder>`, Codex's
    /// `<environment_context>`: a text whose first line is a lone `<tag>`). Tests assert a slash
    /// skill reached the model as line one with it.
    pub first_user_line: String,
    /// Tool results in the conversation, in order.
    pub tool_results: Vec<ToolResultSeen>,
    /// Tools offered.
    pub tools: Vec<OfferedTool>,
}

impl ModelRequest {
    /// Reduces a parsed request body of the given wire API. Never fails: missing fields simply
    /// contribute nothing, because a model answers whatever it gets.
    pub fn from_body(wire: WireApi, body: &Value) -> ModelRequest {
        let mut user_texts = Vec::new();
        let mut tool_results = Vec::new();
        let mut tools = Vec::new();
        match wire {
            WireApi::AnthropicMessages => {
                for m in array(body, "messages") {
                    if m.get("role").and_then(Value::as_str) != Some("user") {
                        continue;
                    }
                    match m.get("content") {
                        Some(Value::Array(blocks)) => {
                            for b in blocks {
                                match b.get("type").and_then(Value::as_str) {
                                    Some("tool_result") => tool_results.push(ToolResultSeen {
                                        call_id: str_of(b, "tool_use_id"),
                                        text: text_of(b.get("content")),
                                    }),
                                    Some("text") => user_texts.push(str_of(b, "text")),
                                    _ => {}
                                }
                            }
                        }
                        other => user_texts.push(text_of(other)),
                    }
                }
                for t in array(body, "tools") {
                    tools.push(OfferedTool {
                        name: str_of(t, "name"),
                        kind: OfferedToolKind::Function,
                        schema: t.get("input_schema").cloned().unwrap_or(Value::Null),
                    });
                }
            }
            WireApi::OpenAiResponses => {
                match body.get("input") {
                    Some(Value::String(s)) => user_texts.push(s.clone()),
                    Some(Value::Array(items)) => {
                        for it in items {
                            let ty = it.get("type").and_then(Value::as_str).unwrap_or("");
                            if matches!(
                                ty,
                                "function_call_output"
                                    | "custom_tool_call_output"
                                    | "local_shell_call_output"
                            ) {
                                let text = match it.get("output") {
                                    Some(Value::String(s)) => s.clone(),
                                    Some(Value::Array(_)) => text_of(it.get("output")),
                                    Some(other) => other.to_string(),
                                    None => String::new(),
                                };
                                tool_results.push(ToolResultSeen {
                                    call_id: str_of(it, "call_id"),
                                    text,
                                });
                            } else if it.get("role").and_then(Value::as_str) == Some("user") {
                                user_texts.push(text_of(it.get("content")));
                            }
                        }
                    }
                    _ => {}
                }
                for t in array(body, "tools") {
                    match t.get("type").and_then(Value::as_str) {
                        Some("function") => tools.push(OfferedTool {
                            name: str_of(t, "name"),
                            kind: OfferedToolKind::Function,
                            schema: t.get("parameters").cloned().unwrap_or(Value::Null),
                        }),
                        Some(ty @ ("custom" | "local_shell" | "freeform")) => {
                            tools.push(OfferedTool {
                                name: t
                                    .get("name")
                                    .and_then(Value::as_str)
                                    .unwrap_or(ty)
                                    .to_owned(),
                                kind: OfferedToolKind::Custom,
                                schema: Value::Null,
                            })
                        }
                        Some("namespace") => {
                            let ns = str_of(t, "name");
                            for sub in array(t, "tools") {
                                let name = str_of(sub, "name");
                                tools.push(OfferedTool {
                                    name: format!("{ns}__{name}"),
                                    kind: OfferedToolKind::Namespaced {
                                        namespace: ns.clone(),
                                        name,
                                    },
                                    schema: sub.get("parameters").cloned().unwrap_or(Value::Null),
                                });
                            }
                        }
                        _ => {}
                    }
                }
            }
            WireApi::OpenAiChat => {
                for m in array(body, "messages") {
                    match m.get("role").and_then(Value::as_str) {
                        Some("tool") => tool_results.push(ToolResultSeen {
                            call_id: str_of(m, "tool_call_id"),
                            text: text_of(m.get("content")),
                        }),
                        Some("user") => user_texts.push(text_of(m.get("content"))),
                        _ => {}
                    }
                }
                for t in array(body, "tools") {
                    let f = t.get("function").unwrap_or(&Value::Null);
                    tools.push(OfferedTool {
                        name: str_of(f, "name"),
                        kind: OfferedToolKind::Function,
                        schema: f.get("parameters").cloned().unwrap_or(Value::Null),
                    });
                }
            }
        }
        let first_user_line = user_texts
            .iter()
            .find(|t| !is_injected_context(t))
            .and_then(|t| t.lines().next())
            .unwrap_or("")
            .to_owned();
        ModelRequest {
            wire,
            model: str_of(body, "model"),
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            user_text: user_texts.join("\n"),
            first_user_line,
            tool_results,
            tools,
        }
    }

    /// The offered tool of that name, if any.
    pub fn tool(&self, name: &str) -> Option<&OfferedTool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// Whether a user text is a context block a harness injected (`<system-reminder>\n...`), not the
/// user's prompt.
fn is_injected_context(text: &str) -> bool {
    let first = text.trim_start().lines().next().unwrap_or("").trim();
    first.len() > 2 && first.starts_with('<') && first.ends_with('>') && !first[1..].contains('<')
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[])
}

fn str_of(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_owned()
}

/// The text of a content field in any of the three wire shapes (string, or blocks of
/// `text`/`input_text`/`output_text`/`tool_result`).
pub fn text_of(content: Option<&Value>) -> String {
    match content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::new();
            for b in blocks {
                match b {
                    Value::String(s) => parts.push(s.clone()),
                    Value::Object(_) => match b.get("type").and_then(Value::as_str) {
                        Some("text" | "input_text" | "output_text") => {
                            parts.push(str_of(b, "text"))
                        }
                        Some("tool_result") => parts.push(text_of(b.get("content"))),
                        _ => {}
                    },
                    _ => {}
                }
            }
            parts.join("\n")
        }
        Some(other) => other.to_string(),
    }
}
