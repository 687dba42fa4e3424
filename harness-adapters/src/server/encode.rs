//! Encodes the scripted model's answers in each wire API, as SSE events or a plain JSON body.
//!
//! Pure functions, kept apart from the HTTP glue so the exact event sequences (the ones each CLI
//! needs, see the harness facts) are unit-tested without a socket.

use serde_json::{Value, json};

use crate::scripted::{Answer, PlannedToolCall, WireApi};

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` line, if any (Anthropic and Responses name events; Chat Completions does not).
    pub event: Option<String>,
    /// The `data:` payload.
    pub data: String,
}

impl SseEvent {
    fn named(name: &str, data: Value) -> Self {
        SseEvent {
            event: Some(name.to_owned()),
            data: data.to_string(),
        }
    }

    fn unnamed(data: String) -> Self {
        SseEvent { event: None, data }
    }

    /// The event as it goes on the wire, blank line included.
    pub fn to_wire(&self) -> String {
        let mut out = String::with_capacity(self.data.len() + 32);
        if let Some(name) = &self.event {
            out.push_str("event: ");
            out.push_str(name);
            out.push('\n');
        }
        for line in self.data.split('\n') {
            out.push_str("data: ");
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
        out
    }
}

/// Text longer than this goes out as several deltas, so clients' delta accumulation is exercised.
pub const TEXT_DELTA_BYTES_MAX: usize = 4096;

fn chunks(text: &str, bytes_max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(bytes_max);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        out.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    out
}

/// Splits JSON text in two, so a client must accumulate `input_json_delta`/argument deltas.
fn halves(text: &str) -> Vec<&str> {
    let mut mid = text.len() / 2;
    while !text.is_char_boundary(mid) {
        mid -= 1;
    }
    [&text[..mid], &text[mid..]]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
}

/// The tool-use id a wire shows for a planned call.
pub fn call_id(wire: WireApi, call: &PlannedToolCall) -> String {
    match wire {
        WireApi::AnthropicMessages => format!("toolu_scripted_{:03}", call.call_seq),
        WireApi::OpenAiResponses | WireApi::OpenAiChat => {
            format!("call_scripted_{:03}", call.call_seq)
        }
    }
}

fn unix_now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

// ------------------------------------------------------------------ Anthropic Messages

fn anthropic_usage(a: &Answer, output_tokens: u64) -> Value {
    json!({"input_tokens": a.usage.input_tokens, "output_tokens": output_tokens,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

/// A complete Anthropic `message` object (the non-streaming answer).
pub fn anthropic_json(a: &Answer, model: &str) -> Value {
    let mut content = Vec::new();
    if !a.text.is_empty() {
        content.push(json!({"type": "text", "text": a.text}));
    }
    for c in &a.tool_calls {
        content.push(json!({"type": "tool_use", "id": call_id(WireApi::AnthropicMessages, c), "name": c.name, "input": c.input}));
    }
    json!({"id": format!("msg_scripted_{:03}", a.message_seq), "type": "message", "role": "assistant", "model": model,
           "content": content, "stop_reason": a.stop_reason, "stop_sequence": null,
           "usage": anthropic_usage(a, a.usage.output_tokens)})
}

/// The Anthropic SSE sequence: `message_start`, per block `content_block_start`/`_delta`/`_stop`
/// (Claude Code rejects tool calls without `content_block_stop`), `message_delta` with the stop
/// reason and cumulative usage, `message_stop`. Without a stop reason, `message_delta` is left out.
pub fn anthropic_sse(a: &Answer, model: &str) -> Vec<SseEvent> {
    let mut ev = Vec::new();
    ev.push(SseEvent::named("message_start", json!({"type": "message_start", "message": {
        "id": format!("msg_scripted_{:03}", a.message_seq), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": anthropic_usage(a, 1)}})));
    let mut index = 0u64;
    if !a.text.is_empty() {
        ev.push(SseEvent::named(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "text", "text": ""}}),
        ));
        for part in chunks(&a.text, TEXT_DELTA_BYTES_MAX) {
            ev.push(SseEvent::named(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "text_delta", "text": part}}),
            ));
        }
        ev.push(SseEvent::named(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    for c in &a.tool_calls {
        ev.push(SseEvent::named("content_block_start", json!({"type": "content_block_start", "index": index,
            "content_block": {"type": "tool_use", "id": call_id(WireApi::AnthropicMessages, c), "name": c.name, "input": {}}})));
        let input = c.input.to_string();
        for part in halves(&input) {
            ev.push(SseEvent::named(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": part}}),
            ));
        }
        ev.push(SseEvent::named(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        index += 1;
    }
    if let Some(stop) = &a.stop_reason {
        ev.push(SseEvent::named("message_delta", json!({"type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": a.usage.output_tokens}})));
    }
    ev.push(SseEvent::named(
        "message_stop",
        json!({"type": "message_stop"}),
    ));
    ev
}

// ------------------------------------------------------------------ OpenAI Responses

fn responses_items(a: &Answer) -> Vec<Value> {
    let mut items = Vec::new();
    if !a.text.is_empty() {
        items.push(json!({"type": "message", "id": format!("msg_scripted_{:03}", a.message_seq), "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": a.text, "annotations": []}]}));
    }
    for c in &a.tool_calls {
        let id = call_id(WireApi::OpenAiResponses, c);
        if c.custom {
            items.push(json!({"type": "custom_tool_call", "id": format!("ctc_scripted_{:03}", c.call_seq), "call_id": id,
                "name": c.name, "input": c.custom_input(), "status": "completed"}));
        } else {
            let mut item = json!({"type": "function_call", "id": format!("fc_scripted_{:03}", c.call_seq), "call_id": id,
                "name": c.name, "arguments": c.input.to_string(), "status": "completed"});
            if let (Some(ns), Some(obj)) = (&c.namespace, item.as_object_mut()) {
                obj.insert("namespace".into(), json!(ns));
            }
            items.push(item);
        }
    }
    items
}

fn responses_final(a: &Answer, model: &str, created: u64) -> Value {
    let incomplete = a.stop_reason.as_deref() == Some("max_tokens");
    json!({"id": format!("resp_scripted_{:03}", a.message_seq), "object": "response", "created_at": created, "model": model,
        "status": if incomplete { "incomplete" } else { "completed" },
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "output": responses_items(a),
        "usage": {"input_tokens": a.usage.input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": a.usage.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": a.usage.input_tokens + a.usage.output_tokens}})
}

/// A complete Responses `response` object (the non-streaming answer).
pub fn responses_json(a: &Answer, model: &str) -> Value {
    responses_final(a, model, unix_now_secs())
}

/// The Responses SSE sequence. Codex needs `response.output_item.done` with the full item and
/// `response.completed` with the id and usage; the `.added`/`.delta` events are sent too for
/// clients that stream. Without a stop reason, `response.completed` is left out.
pub fn responses_sse(a: &Answer, model: &str) -> Vec<SseEvent> {
    let created = unix_now_secs();
    let mut seq = 0u64;
    let mut next = || {
        seq += 1;
        seq - 1
    };
    let rid = format!("resp_scripted_{:03}", a.message_seq);
    let base = json!({"id": rid, "object": "response", "created_at": created, "model": model, "status": "in_progress",
        "output": [], "usage": null});
    let mut ev = vec![
        SseEvent::named(
            "response.created",
            json!({"type": "response.created", "sequence_number": next(), "response": base}),
        ),
        SseEvent::named(
            "response.in_progress",
            json!({"type": "response.in_progress", "sequence_number": next(), "response": base}),
        ),
    ];
    for (index, item) in responses_items(a).into_iter().enumerate() {
        let item_id = item.get("id").cloned().unwrap_or(Value::Null);
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let mut empty = item.clone();
                empty["status"] = json!("in_progress");
                empty["content"] = json!([]);
                ev.push(SseEvent::named(
                    "response.output_item.added",
                    json!({"type": "response.output_item.added",
                    "sequence_number": next(), "output_index": index, "item": empty}),
                ));
                ev.push(SseEvent::named("response.content_part.added", json!({"type": "response.content_part.added",
                    "sequence_number": next(), "item_id": item_id, "output_index": index, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}})));
                for part in chunks(&a.text, TEXT_DELTA_BYTES_MAX) {
                    ev.push(SseEvent::named("response.output_text.delta", json!({"type": "response.output_text.delta",
                        "sequence_number": next(), "item_id": item_id, "output_index": index, "content_index": 0, "delta": part})));
                }
                ev.push(SseEvent::named("response.output_text.done", json!({"type": "response.output_text.done",
                    "sequence_number": next(), "item_id": item_id, "output_index": index, "content_index": 0, "text": a.text})));
                ev.push(SseEvent::named("response.content_part.done", json!({"type": "response.content_part.done",
                    "sequence_number": next(), "item_id": item_id, "output_index": index, "content_index": 0,
                    "part": item["content"][0]})));
            }
            Some("custom_tool_call") => {
                let mut empty = item.clone();
                empty["status"] = json!("in_progress");
                empty["input"] = json!("");
                ev.push(SseEvent::named(
                    "response.output_item.added",
                    json!({"type": "response.output_item.added",
                    "sequence_number": next(), "output_index": index, "item": empty}),
                ));
                ev.push(SseEvent::named("response.custom_tool_call_input.delta", json!({"type": "response.custom_tool_call_input.delta",
                    "sequence_number": next(), "item_id": item_id, "output_index": index, "delta": item["input"]})));
                ev.push(SseEvent::named("response.custom_tool_call_input.done", json!({"type": "response.custom_tool_call_input.done",
                    "sequence_number": next(), "item_id": item_id, "output_index": index, "input": item["input"]})));
            }
            _ => {
                let mut empty = item.clone();
                empty["status"] = json!("in_progress");
                empty["arguments"] = json!("");
                ev.push(SseEvent::named(
                    "response.output_item.added",
                    json!({"type": "response.output_item.added",
                    "sequence_number": next(), "output_index": index, "item": empty}),
                ));
                let args = item["arguments"].as_str().unwrap_or("").to_owned();
                for part in halves(&args) {
                    ev.push(SseEvent::named("response.function_call_arguments.delta", json!({"type": "response.function_call_arguments.delta",
                        "sequence_number": next(), "item_id": item_id, "output_index": index, "delta": part})));
                }
                ev.push(SseEvent::named("response.function_call_arguments.done", json!({"type": "response.function_call_arguments.done",
                    "sequence_number": next(), "item_id": item_id, "output_index": index, "arguments": args})));
            }
        }
        ev.push(SseEvent::named(
            "response.output_item.done",
            json!({"type": "response.output_item.done",
            "sequence_number": next(), "output_index": index, "item": item}),
        ));
    }
    if a.stop_reason.is_some() {
        let done = responses_final(a, model, created);
        let name = if done["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        ev.push(SseEvent::named(
            name,
            json!({"type": name, "sequence_number": next(), "response": done}),
        ));
    }
    ev
}

// ------------------------------------------------------------------ OpenAI Chat Completions

/// Maps an Anthropic-style stop reason to a Chat Completions `finish_reason`.
pub fn chat_finish_reason(stop: &str) -> &'static str {
    match stop {
        "tool_use" => "tool_calls",
        "max_tokens" => "length",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

fn chat_usage(a: &Answer) -> Value {
    json!({"prompt_tokens": a.usage.input_tokens, "completion_tokens": a.usage.output_tokens,
           "total_tokens": a.usage.input_tokens + a.usage.output_tokens})
}

/// A complete `chat.completion` object (the non-streaming answer).
pub fn chat_json(a: &Answer, model: &str) -> Value {
    let calls: Vec<Value> = a
        .tool_calls
        .iter()
        .map(|c| {
            json!({"id": call_id(WireApi::OpenAiChat, c), "type": "function",
                        "function": {"name": c.name, "arguments": c.input.to_string()}})
        })
        .collect();
    let mut message = json!({"role": "assistant", "content": if a.text.is_empty() { Value::Null } else { json!(a.text) }});
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls);
    }
    json!({"id": format!("chatcmpl-scripted{:03}", a.message_seq), "object": "chat.completion", "created": unix_now_secs(),
           "model": model, "choices": [{"index": 0, "message": message,
           "finish_reason": a.stop_reason.as_deref().map(chat_finish_reason)}], "usage": chat_usage(a)})
}

/// The Chat Completions SSE sequence: a role chunk, content and tool-call deltas, a chunk with
/// `finish_reason` (opencode loops forever without it; left out only when the answer has no stop
/// reason), a usage chunk and `[DONE]`.
pub fn chat_sse(a: &Answer, model: &str) -> Vec<SseEvent> {
    let id = format!("chatcmpl-scripted{:03}", a.message_seq);
    let created = unix_now_secs();
    let chunk = |delta: Value, finish: Option<&str>| {
        SseEvent::unnamed(
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            .to_string(),
        )
    };
    let mut ev = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    for part in chunks(&a.text, TEXT_DELTA_BYTES_MAX) {
        ev.push(chunk(json!({"content": part}), None));
    }
    for (index, c) in a.tool_calls.iter().enumerate() {
        ev.push(chunk(json!({"tool_calls": [{"index": index, "id": call_id(WireApi::OpenAiChat, c), "type": "function",
            "function": {"name": c.name, "arguments": ""}}]}), None));
        let args = c.input.to_string();
        for part in halves(&args) {
            ev.push(chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": part}}]}),
                None,
            ));
        }
    }
    if let Some(stop) = &a.stop_reason {
        ev.push(chunk(json!({}), Some(chat_finish_reason(stop))));
        ev.push(SseEvent::unnamed(
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": chat_usage(a)})
            .to_string(),
        ));
        ev.push(SseEvent::unnamed("[DONE]".to_owned()));
    }
    ev
}

/// The error body each wire API uses for an HTTP error status.
pub fn error_body(wire: Option<WireApi>, status: u16, message: &str) -> Value {
    match wire {
        Some(WireApi::AnthropicMessages) => {
            let kind = match status {
                429 => "rate_limit_error",
                529 => "overloaded_error",
                400 | 413 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        _ => {
            let kind = match status {
                429 => "rate_limit_exceeded",
                400 | 413 => "invalid_request_error",
                401 => "invalid_api_key",
                404 => "not_found",
                _ => "server_error",
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": kind}})
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripted::ScriptUsage;

    fn answer(text: &str, calls: Vec<PlannedToolCall>, stop: Option<&str>) -> Answer {
        Answer {
            message_seq: 1,
            text: text.into(),
            tool_calls: calls,
            stop_reason: stop.map(str::to_owned),
            usage: ScriptUsage::default(),
        }
    }

    fn call() -> PlannedToolCall {
        PlannedToolCall {
            call_seq: 7,
            name: "Bash".into(),
            input: json!({"command": "ls -la"}),
            namespace: None,
            custom: false,
        }
    }

    fn names(ev: &[SseEvent]) -> Vec<&str> {
        ev.iter()
            .map(|e| e.event.as_deref().unwrap_or("-"))
            .collect()
    }

    #[test]
    fn anthropic_tool_call_has_block_stop_and_split_input() {
        let ev = anthropic_sse(&answer("", vec![call()], Some("tool_use")), "m");
        assert_eq!(
            names(&ev),
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let joined: String = ev[2..4]
            .iter()
            .map(|e| {
                serde_json::from_str::<Value>(&e.data).unwrap()["delta"]["partial_json"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<Value>(&joined).unwrap(),
            json!({"command": "ls -la"})
        );
        assert!(ev[1].data.contains("toolu_scripted_007"));
    }

    #[test]
    fn missing_stop_reason_drops_the_finish_events() {
        let a = answer("hi", vec![], None);
        assert!(!names(&anthropic_sse(&a, "m")).contains(&"message_delta"));
        assert!(!names(&responses_sse(&a, "m")).contains(&"response.completed"));
        assert!(
            chat_sse(&a, "m")
                .iter()
                .all(|e| !e.data.contains("finish_reason\":\""))
        );
    }

    #[test]
    fn responses_and_chat_finish_properly() {
        let a = answer("hello", vec![call()], Some("tool_use"));
        let r = responses_sse(&a, "m");
        assert_eq!(
            r.last().and_then(|e| e.event.as_deref()),
            Some("response.completed")
        );
        assert_eq!(
            names(&r)
                .iter()
                .filter(|n| **n == "response.output_item.done")
                .count(),
            2
        );
        let c = chat_sse(&a, "m");
        assert_eq!(c.last().map(|e| e.data.as_str()), Some("[DONE]"));
        assert!(
            c.iter()
                .any(|e| e.data.contains("\"finish_reason\":\"tool_calls\""))
        );
        let wire = SseEvent::named("x", json!({"a": 1})).to_wire();
        assert_eq!(wire, "event: x\ndata: {\"a\":1}\n\n");
    }
}
