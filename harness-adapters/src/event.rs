//! The normalized events every harness session yields, whatever its native output format.
//!
//! Plain data (serde, no tokio, no `serde_json::Value`) so events can be logged to the store, sent
//! across nodes with bincode, and produced by the pure simulator. Tool inputs travel as JSON *text*
//! for the same reason: a `Value` cannot be decoded by a non-self-describing format.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{HarnessError, truncate_to};
use crate::usage::UsageReport;

/// Bound on the tool-result content kept in an event. The harness saw the full result; keel keeps a
/// bounded copy for logs and preambles (docs/DESIGN.md §5: bounded detail).
pub const TOOL_RESULT_BYTES_MAX: usize = 16 * 1024;

/// Bound on the tool input JSON kept in an event, for the same reason.
pub const TOOL_INPUT_BYTES_MAX: usize = 64 * 1024;

/// Why a model turn or a whole session stopped. Only [`StopReason::EndTurn`] is success
/// (docs/DESIGN.md §7); everything else has its own handling and is never read as "done".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    EndTurn,
    /// The model wants tools run (a mid-session stop, never final on its own).
    ToolUse,
    /// The output hit the max_tokens cap: the answer is cut.
    MaxTokens,
    /// A caller-supplied stop sequence matched.
    StopSequence,
    /// The endpoint paused a long turn; the loop must continue it.
    PauseTurn,
    /// The model refused for policy reasons.
    Refusal,
    /// The conversation outgrew the context window.
    ModelContextWindowExceeded,
    /// A keel budget (turns, tokens, wall-clock) was reached: a checkpoint, not a failure.
    Budget(BudgetKind),
    /// A runaway guard stopped a repeated identical tool call.
    DuplicateToolCall,
    /// A value keel does not know; treated as not-success and kept verbatim for diagnosis.
    Other(String),
}

/// Which budget stopped a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetKind {
    /// `SessionLimits::turns_max`.
    Turns,
    /// `SessionLimits::tokens_max`.
    Tokens,
    /// `SessionLimits::wall_clock_ms_max`.
    WallClock,
}

impl StopReason {
    /// Parses an Anthropic `stop_reason` value; unknown values are kept as [`StopReason::Other`].
    pub fn from_wire(value: &str) -> StopReason {
        match value {
            "end_turn" => StopReason::EndTurn,
            "tool_use" => StopReason::ToolUse,
            "max_tokens" => StopReason::MaxTokens,
            "stop_sequence" => StopReason::StopSequence,
            "pause_turn" => StopReason::PauseTurn,
            "refusal" => StopReason::Refusal,
            "model_context_window_exceeded" => StopReason::ModelContextWindowExceeded,
            other => StopReason::Other(other.to_owned()),
        }
    }

    /// The only success is `end_turn`.
    pub fn is_success(&self) -> bool {
        matches!(self, StopReason::EndTurn)
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::EndTurn => f.write_str("end_turn"),
            StopReason::ToolUse => f.write_str("tool_use"),
            StopReason::MaxTokens => f.write_str("max_tokens"),
            StopReason::StopSequence => f.write_str("stop_sequence"),
            StopReason::PauseTurn => f.write_str("pause_turn"),
            StopReason::Refusal => f.write_str("refusal"),
            StopReason::ModelContextWindowExceeded => f.write_str("model_context_window_exceeded"),
            StopReason::Budget(BudgetKind::Turns) => f.write_str("budget_turns"),
            StopReason::Budget(BudgetKind::Tokens) => f.write_str("budget_tokens"),
            StopReason::Budget(BudgetKind::WallClock) => f.write_str("budget_wall_clock"),
            StopReason::DuplicateToolCall => f.write_str("duplicate_tool_call"),
            StopReason::Other(v) => write!(f, "other:{v}"),
        }
    }
}

/// Text bounded to a fixed size, remembering how much was cut so a reader knows it is partial.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct BoundedText {
    /// The kept prefix (valid UTF-8, cut on a char boundary).
    pub text: String,
    /// Bytes dropped from the end; 0 when complete.
    pub truncated_bytes: u64,
}

impl BoundedText {
    /// Keeps at most `bytes_max` bytes of `text`.
    pub fn new(text: impl Into<String>, bytes_max: usize) -> Self {
        let text = text.into();
        let full = text.len();
        let text = truncate_to(text, bytes_max);
        let truncated_bytes = (full - text.len()) as u64;
        BoundedText {
            text,
            truncated_bytes,
        }
    }

    /// Whether the text is complete.
    pub fn is_complete(&self) -> bool {
        self.truncated_bytes == 0
    }
}

/// One normalized event from a running session. A session yields exactly one terminal event,
/// [`HarnessEvent::Finished`] or [`HarnessEvent::Failed`], and nothing after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HarnessEvent {
    /// The session is running. The harness's own session id is kept for the record only: keel never
    /// resumes through it (docs/DESIGN.md §6).
    Started {
        /// The harness's session/thread id, if it reports one.
        native_session_id: Option<String>,
        /// The model the harness says it is using (may differ in form from the spec's, e.g. aliases).
        model: Option<String>,
    },
    /// Assistant text (a whole block, not a token delta).
    Text {
        /// The text.
        text: String,
    },
    /// The model called a tool.
    ToolUse {
        /// The tool-use id that the result pairs with.
        id: String,
        /// Tool name as the harness names it.
        name: String,
        /// The tool input as JSON text, bounded by [`TOOL_INPUT_BYTES_MAX`].
        input_json: BoundedText,
    },
    /// A tool returned (or was refused). Pairs with the `ToolUse` of the same id.
    ToolResult {
        /// The tool-use id this result answers.
        id: String,
        /// Whether the tool failed or was refused.
        is_error: bool,
        /// The result content, bounded by [`TOOL_RESULT_BYTES_MAX`].
        content: BoundedText,
    },
    /// The session would have ended, and a Stop hook sent it back for one more turn with this text
    /// (the report check: its final text was not a valid report). Not terminal.
    SentBack {
        /// What the session was told, the exact error included.
        reason: String,
    },
    /// Token usage; feed these to a [`crate::usage::UsageAccumulator`], never sum them by hand.
    Usage(UsageReport),
    /// The session ended. `stop_reason.is_success()` tells success from a checkpoint or a refusal.
    Finished {
        /// Why it ended.
        stop_reason: StopReason,
        /// The last assistant text, the session's answer.
        final_text: String,
    },
    /// The session failed.
    Failed(HarnessError),
}

impl HarnessEvent {
    /// A `ToolUse` event with its input bounded.
    pub fn tool_use(
        id: impl Into<String>,
        name: impl Into<String>,
        input_json: impl Into<String>,
    ) -> Self {
        HarnessEvent::ToolUse {
            id: id.into(),
            name: name.into(),
            input_json: BoundedText::new(input_json, TOOL_INPUT_BYTES_MAX),
        }
    }

    /// A `ToolResult` event with its content bounded.
    pub fn tool_result(id: impl Into<String>, is_error: bool, content: impl Into<String>) -> Self {
        HarnessEvent::ToolResult {
            id: id.into(),
            is_error,
            content: BoundedText::new(content, TOOL_RESULT_BYTES_MAX),
        }
    }

    /// Whether this event ends the session.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            HarnessEvent::Finished { .. } | HarnessEvent::Failed(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_end_turn_is_success() {
        for v in [
            "tool_use",
            "max_tokens",
            "stop_sequence",
            "pause_turn",
            "refusal",
            "model_context_window_exceeded",
            "something_new",
        ] {
            let r = StopReason::from_wire(v);
            assert!(!r.is_success(), "{v}");
            if v != "something_new" {
                assert_eq!(r.to_string(), v);
            }
        }
        assert_eq!(
            StopReason::from_wire("something_new"),
            StopReason::Other("something_new".into())
        );
        assert!(StopReason::from_wire("end_turn").is_success());
    }

    #[test]
    fn bounded_text_counts_what_it_cut() {
        let b = BoundedText::new("abcdef", 4);
        assert_eq!(b.text, "abcd");
        assert_eq!(b.truncated_bytes, 2);
        assert!(!b.is_complete());
        assert!(BoundedText::new("ab", 4).is_complete());
    }

    #[test]
    fn events_round_trip_through_json() {
        let ev = HarnessEvent::tool_use("toolu_1", "bash", r#"{"command":"ls"}"#);
        let back: HarnessEvent =
            serde_json::from_str(&serde_json::to_string(&ev).unwrap()).unwrap();
        assert_eq!(ev, back);
    }

    #[test]
    fn events_round_trip_through_bincode() {
        // Events cross nodes with bincode, which cannot decode self-describing types.
        let events = vec![
            HarnessEvent::Started {
                native_session_id: Some("s".into()),
                model: None,
            },
            HarnessEvent::tool_use("toolu_1", "bash", r#"{"command":"ls"}"#),
            HarnessEvent::tool_result("toolu_1", true, "denied"),
            HarnessEvent::Finished {
                stop_reason: StopReason::Budget(BudgetKind::Tokens),
                final_text: "x".into(),
            },
            HarnessEvent::Failed(HarnessError::rate_limited("429", Some(1), Some(2))),
        ];
        let cfg = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&events, cfg).unwrap();
        let (back, _): (Vec<HarnessEvent>, usize) =
            bincode::serde::decode_from_slice(&bytes, cfg).unwrap();
        assert_eq!(events, back);
    }
}
