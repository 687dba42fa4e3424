//! The script a scripted model follows: a list of turns, loadable from JSON or TOML.
//!
//! Example (TOML):
//! ```toml
//! [[turns]]
//! tool_calls = [{ shell = "echo hi > proof.txt" }]
//!
//! [[turns]]
//! failure = { kind = "rate_limited", retry_after_secs = 1, reset_after_secs = 30 }
//!
//! [[turns]]
//! text = "done"
//! ```
//! `[[key_failures]]` (`key = "..."`, `failure = {...}`) makes the HTTP server fail every request
//! sent with that key. Turns are consumed one per model request, in order. When they run out (or when there are none),
//! the model answers by the prompt rules of [`super::model::ScriptedModel`] unless `rules_after_turns = false`, in
//! which case every further request gets a 500 so a test notices the script was too short.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Most turns a script may hold; a limit on everything, and far above any real test.
pub const SCRIPT_TURNS_MAX: usize = 10_000;
/// Most bytes of text one turn may carry (an overlong-output failure may ask for more, up to
/// [`OVERLONG_BYTES_MAX`]).
pub const TURN_TEXT_BYTES_MAX: usize = 1 << 20;
/// Most bytes an overlong-output failure may produce.
pub const OVERLONG_BYTES_MAX: u64 = 16 << 20;
/// Longest a scripted hang may last when it names no duration, in milliseconds. A hang is bounded
/// so nothing waits forever even if the client never gives up.
pub const HANG_MS_DEFAULT: u64 = 300_000;

/// A whole script.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// Turns, one per model request, in order.
    #[serde(default)]
    pub turns: Vec<ScriptTurn>,
    /// What happens after the last turn: answer by the prompt rules (default) or fail with a 500.
    #[serde(default = "default_true")]
    pub rules_after_turns: bool,
    /// Usage reported for a turn that names none.
    #[serde(default)]
    pub default_usage: Option<ScriptUsage>,
    /// Failures by API key, for the HTTP server only: a request whose key (`x-api-key`, or
    /// `Authorization: Bearer`) is listed gets that failure, every time, before any injected
    /// failure or turn is used (the turns do not advance). How a test makes one account's key
    /// rate-limited while another's works.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_failures: Vec<KeyFailure>,
}

/// One entry of [`Script::key_failures`]: requests sent with `key` fail as `failure`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyFailure {
    /// The API key or bearer token, exactly as the client sends it.
    pub key: String,
    /// What every request with that key gets.
    pub failure: ScriptFailure,
}

fn default_true() -> bool {
    true
}

/// Token usage a scripted turn reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptUsage {
    /// Input tokens reported.
    pub input_tokens: u64,
    /// Output tokens reported.
    pub output_tokens: u64,
}

impl Default for ScriptUsage {
    fn default() -> Self {
        ScriptUsage {
            input_tokens: 10,
            output_tokens: 5,
        }
    }
}

/// One model turn: an answer (text and/or tool calls, with a stop reason) or a failure.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptTurn {
    /// Assistant text.
    #[serde(default)]
    pub text: Option<String>,
    /// Tool calls, in order.
    #[serde(default)]
    pub tool_calls: Vec<ScriptToolCall>,
    /// Anthropic-style stop reason (`end_turn`, `tool_use`, `max_tokens`, `refusal`, or anything
    /// else to test unknown values). Defaults to `tool_use` with tool calls, else `end_turn`.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// A failure instead of an answer.
    #[serde(default)]
    pub failure: Option<ScriptFailure>,
    /// Usage to report for this turn.
    #[serde(default)]
    pub usage: Option<ScriptUsage>,
}

/// A tool call in a script: a named tool with JSON input, or `shell`, which calls whatever shell tool
/// the request offers (Claude Code's `Bash`, pi's `bash`, Codex's `exec_command`...) with the command
/// in the argument shape that tool's schema asks for.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// Tool name, exactly as offered.
    #[serde(default)]
    pub name: Option<String>,
    /// Tool input (a JSON object); `{}` when absent.
    #[serde(default)]
    pub input: Option<serde_json::Value>,
    /// A shell command for the offered shell tool.
    #[serde(default)]
    pub shell: Option<String>,
}

/// A failure a scripted turn produces. Over HTTP each becomes the matching status or broken stream;
/// in process each becomes the error the HTTP client would have reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ScriptFailure {
    /// HTTP 429 with `retry-after` and, when set, a reset time that many seconds after the request.
    RateLimited {
        /// Value of the `retry-after` header, in seconds.
        #[serde(default = "one")]
        retry_after_secs: u64,
        /// Seconds from the request until the limit resets (sent as `anthropic-ratelimit-*-reset`
        /// and `x-ratelimit-reset-requests`).
        #[serde(default)]
        reset_after_secs: Option<u64>,
    },
    /// An HTTP error status with an error body (500, 529, 400, 401, ...).
    Http {
        /// The status code.
        status: u16,
        /// The error message in the body.
        #[serde(default)]
        message: Option<String>,
    },
    /// An answer of `bytes` bytes of text that stops with `max_tokens`.
    OverlongOutput {
        /// How many bytes of text.
        bytes: u64,
    },
    /// No response at all for `ms` milliseconds (default [`HANG_MS_DEFAULT`]), then the connection
    /// closes.
    Hang {
        /// How long to hang.
        #[serde(default)]
        ms: Option<u64>,
    },
    /// The stream starts normally, then stalls for `ms` milliseconds (default [`HANG_MS_DEFAULT`]).
    HangMidStream {
        /// How long to stall.
        #[serde(default)]
        ms: Option<u64>,
    },
    /// A 200 whose stream is not valid SSE/JSON.
    Malformed,
    /// A normal answer whose stream never says why it stopped (no `stop_reason`/`finish_reason`/
    /// `response.completed`): the trap that makes opencode loop.
    MissingFinishReason {
        /// The text of the answer.
        #[serde(default)]
        text: Option<String>,
    },
    /// The connection is closed in the middle of the stream.
    Disconnect,
}

fn one() -> u64 {
    1
}

/// Why a script could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    #[error("cannot read script {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The JSON does not describe a script.
    #[error("invalid JSON script: {0}")]
    Json(#[from] serde_json::Error),
    /// The TOML does not describe a script.
    #[error("invalid TOML script: {0}")]
    Toml(#[from] toml::de::Error),
    /// The file is neither `.json` nor `.toml`.
    #[error("script file must end in .json or .toml: {0}")]
    UnknownFormat(String),
    /// The script parses but breaks a rule.
    #[error("invalid script: turn {turn}: {reason}")]
    Invalid {
        /// Zero-based index of the offending turn.
        turn: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Script {
    /// A script with no turns: the model answers every request by the prompt rules.
    pub fn rules() -> Self {
        Script {
            turns: Vec::new(),
            rules_after_turns: true,
            default_usage: None,
            key_failures: Vec::new(),
        }
    }

    /// A script from turns, falling back to the prompt rules after them.
    pub fn from_turns(turns: Vec<ScriptTurn>) -> Self {
        Script {
            turns,
            rules_after_turns: true,
            default_usage: None,
            key_failures: Vec::new(),
        }
    }

    /// Parses a JSON script and validates it.
    ///
    /// # Errors
    /// [`ScriptError::Json`] or [`ScriptError::Invalid`].
    pub fn from_json_str(text: &str) -> Result<Self, ScriptError> {
        let script: Script = serde_json::from_str(text)?;
        script.validate()?;
        Ok(script)
    }

    /// Parses a TOML script and validates it.
    ///
    /// # Errors
    /// [`ScriptError::Toml`] or [`ScriptError::Invalid`].
    pub fn from_toml_str(text: &str) -> Result<Self, ScriptError> {
        let script: Script = toml::from_str(text)?;
        script.validate()?;
        Ok(script)
    }

    /// Loads a script file, choosing the format by extension (`.json` or `.toml`).
    ///
    /// # Errors
    /// Any [`ScriptError`].
    pub fn from_path(path: &Path) -> Result<Self, ScriptError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Io {
            path: shown.clone(),
            source,
        })?;
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => Script::from_json_str(&text),
            Some("toml") => Script::from_toml_str(&text),
            _ => Err(ScriptError::UnknownFormat(shown)),
        }
    }

    /// Checks the limits and that each turn is either an answer or a failure.
    ///
    /// # Errors
    /// [`ScriptError::Invalid`] naming the first offending turn.
    pub fn validate(&self) -> Result<(), ScriptError> {
        let invalid = |turn: usize, reason: &str| {
            Err(ScriptError::Invalid {
                turn,
                reason: reason.to_owned(),
            })
        };
        if self.turns.len() > SCRIPT_TURNS_MAX {
            return invalid(SCRIPT_TURNS_MAX, "too many turns");
        }
        for (i, turn) in self.turns.iter().enumerate() {
            if turn.failure.is_some()
                && (turn.text.is_some()
                    || !turn.tool_calls.is_empty()
                    || turn.stop_reason.is_some())
            {
                return invalid(i, "a turn is either a failure or an answer, not both");
            }
            if turn
                .text
                .as_ref()
                .is_some_and(|t| t.len() > TURN_TEXT_BYTES_MAX)
            {
                return invalid(i, "text exceeds TURN_TEXT_BYTES_MAX");
            }
            if let Some(ScriptFailure::OverlongOutput { bytes }) = &turn.failure
                && *bytes > OVERLONG_BYTES_MAX
            {
                return invalid(i, "overlong output exceeds OVERLONG_BYTES_MAX");
            }
            for call in &turn.tool_calls {
                match (&call.name, &call.shell) {
                    (Some(_), None) | (None, Some(_)) => {}
                    _ => return invalid(i, "a tool call names exactly one of `name` or `shell`"),
                }
                if call.shell.is_some() && call.input.is_some() {
                    return invalid(i, "a shell call takes no `input`");
                }
                if call.input.as_ref().is_some_and(|v| !v.is_object()) {
                    return invalid(i, "tool input must be a JSON object");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_json_scripts_load_the_same() {
        let toml_text = r#"
            [[turns]]
            tool_calls = [{ shell = "echo hi" }, { name = "Write", input = { file_path = "a", content = "b" } }]
            [[turns]]
            failure = { kind = "rate_limited", retry_after_secs = 2, reset_after_secs = 30 }
            [[turns]]
            text = "done"
        "#;
        let json_text = r#"{"turns":[
            {"tool_calls":[{"shell":"echo hi"},{"name":"Write","input":{"file_path":"a","content":"b"}}]},
            {"failure":{"kind":"rate_limited","retry_after_secs":2,"reset_after_secs":30}},
            {"text":"done"}]}"#;
        let a = Script::from_toml_str(toml_text).unwrap();
        let b = Script::from_json_str(json_text).unwrap();
        assert_eq!(a, b);
        assert!(a.rules_after_turns);
        assert_eq!(
            a.turns[1].failure,
            Some(ScriptFailure::RateLimited {
                retry_after_secs: 2,
                reset_after_secs: Some(30)
            })
        );
    }

    #[test]
    fn key_failures_load_from_toml() {
        let script = Script::from_toml_str(
            r#"
            [[key_failures]]
            key = "sk-limited"
            failure = { kind = "rate_limited", retry_after_secs = 60, reset_after_secs = 60 }
        "#,
        )
        .unwrap();
        assert_eq!(script.key_failures.len(), 1);
        assert_eq!(script.key_failures[0].key, "sk-limited");
        assert!(script.turns.is_empty());
        assert!(matches!(
            Script::from_toml_str("[[key_failures]]\nkey = \"k\"\n"),
            Err(ScriptError::Toml(_))
        ));
    }

    #[test]
    fn bad_scripts_give_typed_errors() {
        assert!(matches!(
            Script::from_json_str("{\"turns\": 3}"),
            Err(ScriptError::Json(_))
        ));
        assert!(matches!(
            Script::from_toml_str("turns = ["),
            Err(ScriptError::Toml(_))
        ));
        assert!(matches!(
            Script::from_json_str("{\"bogus\": 1}"),
            Err(ScriptError::Json(_))
        ));
        let both = r#"{"turns":[{"text":"x","failure":{"kind":"malformed"}}]}"#;
        assert!(matches!(
            Script::from_json_str(both),
            Err(ScriptError::Invalid { turn: 0, .. })
        ));
        let neither = r#"{"turns":[{"tool_calls":[{}]}]}"#;
        assert!(matches!(
            Script::from_json_str(neither),
            Err(ScriptError::Invalid { .. })
        ));
        let unknown_kind = r#"{"turns":[{"failure":{"kind":"explode"}}]}"#;
        assert!(matches!(
            Script::from_json_str(unknown_kind),
            Err(ScriptError::Json(_))
        ));
        let missing = Script::from_path(Path::new("no/such/script.toml"));
        assert!(matches!(missing, Err(ScriptError::Io { .. })));
    }
}
