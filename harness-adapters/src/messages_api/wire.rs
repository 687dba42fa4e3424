//! The Anthropic Messages types keel's loop sends and receives. Only what the loop uses; unknown
//! fields in responses are ignored so new endpoint features do not break parsing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The user (keel), including tool results.
    User,
    /// The model.
    Assistant,
}

/// One content block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A tool call by the model.
    ToolUse {
        /// Id the result must echo.
        id: String,
        /// Tool name.
        name: String,
        /// Tool input (a JSON object).
        input: Value,
    },
    /// A tool result from keel.
    ToolResult {
        /// The `ToolUse` id answered.
        tool_use_id: String,
        /// The result text (for errors: a JSON payload with `error_category` and `is_retryable`).
        content: String,
        /// Whether the tool failed or was refused.
        #[serde(default, skip_serializing_if = "is_false")]
        is_error: bool,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Blocks, in order.
    pub content: Vec<ContentBlock>,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// Name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its input.
    pub input_schema: Value,
}

/// A request to `POST /v1/messages`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessagesRequest {
    /// Model id, from the spec.
    pub model: String,
    /// Output cap for this turn.
    pub max_tokens: u32,
    /// System prompt (keel's base plus the spec's appended text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools offered.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolDefinition>,
    /// `{"type": "none"}` when the loop asks for a summary and wants no more tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Always true: keel streams so it can bound stalls.
    pub stream: bool,
}

/// Usage of one assistant message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WireUsage {
    /// Uncached input tokens.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Tokens written to the cache.
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    /// Tokens read from the cache.
    #[serde(default)]
    pub cache_read_input_tokens: u64,
}

/// A complete assistant message, assembled from a stream or read from a JSON answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Endpoint message id (keys usage so it is never counted twice).
    pub id: String,
    /// Model that answered.
    #[serde(default)]
    pub model: String,
    /// Blocks, in order.
    pub content: Vec<ContentBlock>,
    /// Raw stop reason.
    pub stop_reason: Option<String>,
    /// Usage.
    #[serde(default)]
    pub usage: WireUsage,
}

impl AssistantMessage {
    /// All text blocks joined, the message's answer.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        parts.join("\n")
    }

    /// The tool calls, in order: (id, name, input).
    pub fn tool_uses(&self) -> Vec<(&str, &str, &Value)> {
        self.content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::ToolUse { id, name, input } => {
                    Some((id.as_str(), name.as_str(), input))
                }
                _ => None,
            })
            .collect()
    }
}
