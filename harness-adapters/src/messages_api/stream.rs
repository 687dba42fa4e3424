//! Assembles an Anthropic Messages SSE stream into one [`AssistantMessage`].
//!
//! Tool input arrives as `input_json_delta` fragments; they are concatenated per block and parsed
//! only when the stream has ended, so no tool ever runs on half an input (docs/DESIGN.md §7). Pure.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::Value;

use super::sse::SseFrame;
use super::wire::{AssistantMessage, ContentBlock, WireUsage};

/// Most content blocks one message may have; a limit on a remote-controlled count.
pub const BLOCKS_MAX: usize = 1024;
/// Most bytes of one block's accumulated text or tool input.
pub const BLOCK_BYTES_MAX: usize = 16 << 20;

/// Why a stream did not yield a usable message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// An event's data is not the JSON it should be.
    #[error("malformed {event} event: {detail}")]
    Malformed {
        /// The event name.
        event: String,
        /// What was wrong.
        detail: String,
    },
    /// The endpoint sent an `error` event mid-stream (e.g. `overloaded_error`).
    #[error("endpoint error in stream: {kind}: {message}")]
    Endpoint {
        /// The error type, e.g. `overloaded_error`.
        kind: String,
        /// Its message.
        message: String,
    },
    /// The stream ended before saying why the message stopped.
    #[error("stream ended without a stop_reason")]
    MissingStopReason,
    /// The stream never started a message.
    #[error("stream ended without message_start")]
    MissingStart,
    /// A tool's accumulated input is not a JSON object.
    #[error("tool {id} input is not a JSON object: {detail}")]
    BadToolInput {
        /// The tool-use id.
        id: String,
        /// What was wrong.
        detail: String,
    },
    /// A bound was exceeded.
    #[error("stream exceeds a limit: {0}")]
    TooLarge(&'static str),
}

/// The typed shape of a `content_block_delta` event; strings borrow from the event when they hold
/// no escapes.
#[derive(serde::Deserialize)]
struct DeltaEvent<'a> {
    index: u64,
    #[serde(borrow)]
    delta: Delta<'a>,
}

#[derive(serde::Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    partial_json: Option<Cow<'a, str>>,
}

#[derive(Debug)]
enum Block {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
        initial: Value,
    },
    Ignored,
}

/// The assembler state.
#[derive(Debug, Default)]
pub struct MessageAssembler {
    id: Option<String>,
    model: String,
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<String>,
    usage: WireUsage,
    stopped: bool,
}

fn malformed(event: &str, detail: impl Into<String>) -> StreamError {
    StreamError::Malformed {
        event: event.to_owned(),
        detail: detail.into(),
    }
}

fn usage_from(v: &Value, into: &mut WireUsage) {
    let get = |k: &str| v.get(k).and_then(Value::as_u64);
    if let Some(n) = get("input_tokens") {
        into.input_tokens = n;
    }
    if let Some(n) = get("output_tokens") {
        into.output_tokens = n;
    }
    if let Some(n) = get("cache_creation_input_tokens") {
        into.cache_creation_input_tokens = n;
    }
    if let Some(n) = get("cache_read_input_tokens") {
        into.cache_read_input_tokens = n;
    }
}

impl MessageAssembler {
    /// An assembler before `message_start`.
    pub fn new() -> Self {
        MessageAssembler::default()
    }

    /// Whether `message_stop` arrived.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Applies one event. Returns a text delta when the event carried one, so callers may show
    /// progress; nothing else needs to be acted on before the end.
    ///
    /// # Errors
    /// [`StreamError`] for malformed events, endpoint errors and exceeded bounds.
    pub fn apply(&mut self, frame: &SseFrame) -> Result<(), StreamError> {
        let kind = if frame.event.is_empty() {
            None
        } else {
            Some(frame.event.as_str())
        };
        if kind == Some("ping") {
            return Ok(());
        }
        if kind == Some("content_block_delta") {
            // The bulk of every stream: parsed into borrowed, typed fields instead of a `Value`.
            let delta: DeltaEvent<'_> = serde_json::from_str(&frame.data)
                .map_err(|e| malformed("content_block_delta", e.to_string()))?;
            let d = &delta.delta;
            return self.apply_delta(
                delta.index,
                &d.kind,
                d.text.as_deref(),
                d.partial_json.as_deref(),
            );
        }
        let v: Value = serde_json::from_str(&frame.data)
            .map_err(|e| malformed(kind.unwrap_or("unnamed"), e.to_string()))?;
        let ty = v
            .get("type")
            .and_then(Value::as_str)
            .or(kind)
            .unwrap_or("")
            .to_owned();
        match ty.as_str() {
            "message_start" => {
                let m = v
                    .get("message")
                    .ok_or_else(|| malformed(&ty, "no message"))?;
                self.id = Some(m.get("id").and_then(Value::as_str).unwrap_or("").to_owned());
                self.model = m
                    .get("model")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                if let Some(u) = m.get("usage") {
                    usage_from(u, &mut self.usage);
                }
            }
            "content_block_start" => {
                let index = v
                    .get("index")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| malformed(&ty, "no index"))?;
                if self.blocks.len() >= BLOCKS_MAX {
                    return Err(StreamError::TooLarge("content blocks"));
                }
                let b = v
                    .get("content_block")
                    .ok_or_else(|| malformed(&ty, "no content_block"))?;
                let block = match b.get("type").and_then(Value::as_str) {
                    Some("text") => Block::Text(
                        b.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                    ),
                    Some("tool_use") => Block::Tool {
                        id: b
                            .get("id")
                            .and_then(Value::as_str)
                            .ok_or_else(|| malformed(&ty, "tool_use without id"))?
                            .to_owned(),
                        name: b
                            .get("name")
                            .and_then(Value::as_str)
                            .ok_or_else(|| malformed(&ty, "tool_use without name"))?
                            .to_owned(),
                        json: String::new(),
                        initial: b.get("input").cloned().unwrap_or(Value::Null),
                    },
                    // Thinking and other block kinds are not needed by keel's loop.
                    _ => Block::Ignored,
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let index = v
                    .get("index")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| malformed(&ty, "no index"))?;
                let delta = v.get("delta").ok_or_else(|| malformed(&ty, "no delta"))?;
                let kind = delta.get("type").and_then(Value::as_str).unwrap_or("");
                let text = delta.get("text").and_then(Value::as_str);
                let partial = delta.get("partial_json").and_then(Value::as_str);
                return self.apply_delta(index, kind, text, partial);
            }
            "content_block_stop" => {}
            "message_delta" => {
                if let Some(reason) = v
                    .get("delta")
                    .and_then(|d| d.get("stop_reason"))
                    .and_then(Value::as_str)
                {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(u) = v.get("usage") {
                    usage_from(u, &mut self.usage);
                }
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let e = v.get("error").unwrap_or(&Value::Null);
                return Err(StreamError::Endpoint {
                    kind: e
                        .get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("unknown")
                        .to_owned(),
                    message: e
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                });
            }
            // Unknown events are skipped so endpoint additions do not break the loop.
            _ => {}
        }
        Ok(())
    }

    fn apply_delta(
        &mut self,
        index: u64,
        kind: &str,
        text: Option<&str>,
        partial_json: Option<&str>,
    ) -> Result<(), StreamError> {
        let ty = "content_block_delta";
        let block = self
            .blocks
            .get_mut(&index)
            .ok_or_else(|| malformed(ty, format!("delta for unknown block {index}")))?;
        match (block, kind) {
            (Block::Text(buf), "text_delta") => {
                let part = text.unwrap_or("");
                if buf.len() + part.len() > BLOCK_BYTES_MAX {
                    return Err(StreamError::TooLarge("text block"));
                }
                buf.push_str(part);
            }
            (Block::Tool { json, .. }, "input_json_delta") => {
                let part = partial_json.unwrap_or("");
                if json.len() + part.len() > BLOCK_BYTES_MAX {
                    return Err(StreamError::TooLarge("tool input"));
                }
                json.push_str(part);
            }
            (Block::Ignored, _) => {}
            (_, other) => {
                return Err(malformed(
                    ty,
                    format!("delta {other:?} does not fit block {index}"),
                ));
            }
        }
        Ok(())
    }

    /// Finishes the message once the stream has ended, parsing every tool input now.
    ///
    /// # Errors
    /// [`StreamError::MissingStart`], [`StreamError::MissingStopReason`] or
    /// [`StreamError::BadToolInput`].
    pub fn finish(self) -> Result<AssistantMessage, StreamError> {
        let id = self.id.ok_or(StreamError::MissingStart)?;
        let stop_reason = self.stop_reason.ok_or(StreamError::MissingStopReason)?;
        let mut content = Vec::with_capacity(self.blocks.len());
        for block in self.blocks.into_values() {
            match block {
                Block::Text(text) => content.push(ContentBlock::Text { text }),
                Block::Tool {
                    id,
                    name,
                    json,
                    initial,
                } => {
                    let input = if json.trim().is_empty() {
                        if initial.is_object() {
                            initial
                        } else {
                            Value::Object(serde_json::Map::new())
                        }
                    } else {
                        serde_json::from_str::<Value>(&json).map_err(|e| {
                            StreamError::BadToolInput {
                                id: id.clone(),
                                detail: e.to_string(),
                            }
                        })?
                    };
                    if !input.is_object() {
                        return Err(StreamError::BadToolInput {
                            id,
                            detail: "not an object".into(),
                        });
                    }
                    content.push(ContentBlock::ToolUse { id, name, input });
                }
                Block::Ignored => {}
            }
        }
        Ok(AssistantMessage {
            id,
            model: self.model,
            content,
            stop_reason: Some(stop_reason),
            usage: self.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages_api::sse::SseParser;

    fn assemble(body: &str) -> Result<AssistantMessage, StreamError> {
        let mut parser = SseParser::new();
        let mut frames = Vec::new();
        parser.feed(body.as_bytes(), &mut frames).unwrap();
        let mut asm = MessageAssembler::new();
        for f in &frames {
            asm.apply(f)?;
        }
        asm.finish()
    }

    const TOOL_STREAM: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"model\":\"m\",\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me \"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"look.\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"bash\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"comm\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"and\\\": \\\"ls\\\"}\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":42}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );

    #[test]
    fn text_and_tool_input_are_accumulated() {
        let m = assemble(TOOL_STREAM).unwrap();
        assert_eq!(m.id, "msg_1");
        assert_eq!(m.text(), "Let me look.");
        assert_eq!(
            m.tool_uses(),
            vec![("toolu_1", "bash", &serde_json::json!({"command": "ls"}))]
        );
        assert_eq!(m.stop_reason.as_deref(), Some("tool_use"));
        assert_eq!((m.usage.input_tokens, m.usage.output_tokens), (10, 42));
    }

    #[test]
    fn unnamed_events_take_the_general_path_to_the_same_message() {
        let unnamed: String = TOOL_STREAM
            .lines()
            .filter(|l| !l.starts_with("event:"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(assemble(&unnamed).unwrap(), assemble(TOOL_STREAM).unwrap());
    }

    #[test]
    fn broken_streams_give_typed_errors() {
        let no_stop = TOOL_STREAM.replace("\"stop_reason\":\"tool_use\"", "\"stop_reason\":null");
        assert_eq!(assemble(&no_stop), Err(StreamError::MissingStopReason));
        let bad_input = TOOL_STREAM.replace("and\\\": \\\"ls\\\"}", "and\\\": ");
        assert!(matches!(
            assemble(&bad_input),
            Err(StreamError::BadToolInput { .. })
        ));
        let overloaded = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n";
        assert!(
            matches!(assemble(overloaded), Err(StreamError::Endpoint { ref kind, .. }) if kind == "overloaded_error")
        );
        assert_eq!(assemble(""), Err(StreamError::MissingStart));
        assert!(matches!(
            assemble("data: <<not json>>\n\n"),
            Err(StreamError::Malformed { .. })
        ));
    }
}
