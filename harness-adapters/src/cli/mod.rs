//! Adapters for the four real coding-agent CLIs: Claude Code, Codex, opencode and pi.
//!
//! Each adapter is two halves, kept apart so the logic is testable without a process:
//!
//! - a pure **invocation builder** (`SessionSpec` + a per-session directory → argv, environment and
//!   the config files to write), and
//! - a pure **event parser** (one JSON line of the CLI's output → normalized [`HarnessEvent`]s),
//!
//! joined by one shared runner ([`CliHarness`]) that does the IO: it writes the files, spawns the
//! CLI through [`crate::process`] with stdin closed, reads stdout and stderr line by line, enforces
//! the spec's limits, honours cancellation, and always ends with exactly one terminal event.
//!
//! **Architecture invariant:** no adapter ever passes a native resume or continue flag (docs/DESIGN.md §6,
//! invariant 5). [`check_no_resume_flag`] refuses such an argv before anything is spawned.
//!
//! Files: this one holds what every adapter implements ([`CliFlavor`], [`EventParser`]) and the
//! parsers' shared helpers; `resume` the no-resume check, `binary` the executable lookup, `env` the
//! session's environment and credential, `gate` the fail-closed gate scripts, `post_tool` the
//! `PostToolUse` hook's payloads and answers, `session_event` the session-event hook's (`PreCompact`)
//! command and answers, `runner` the runner; one file per CLI; `jsonl` the
//! bounded line reader; `limits` rate-limit classification.

pub mod claude;
pub mod codex;
pub mod handed_back;
pub mod jsonl;
pub mod limits;
pub mod opencode;
pub mod pi;
pub mod post_tool;
pub mod session_event;

mod binary;
mod env;
mod gate;
mod resume;
mod runner;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::error::{StartError, truncate_to};
use crate::event::HarnessEvent;
use crate::spec::{HarnessKind, SessionSpec};

pub use binary::{CliBinary, INSTALL_COMMAND};
pub use env::{PASSTHROUGH_ENV, base_env, credential_value};
pub use gate::{
    GateAllow, gate_js_function, gate_wrapper_script, install_gate_wrapper, shell_quote,
};
pub use jsonl::ParseError;
pub use resume::{RESUME_FLAGS, check_no_resume_flag};
pub use runner::{
    CANCEL_GRACE, CliConfig, CliHarness, DRAIN_AFTER_EXIT_MAX, DRAIN_IDLE_MAX,
    EXIT_AFTER_TERMINAL_MAX, InvocationObserver, MALFORMED_LINES_MAX, STDERR_TAIL_BYTES_MAX,
    now_unix_ms,
};

/// What the CLI's process did when it ended, for parsers deciding on a terminal event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutcome {
    /// Exit code, when the process exited normally.
    pub exit_code: Option<i32>,
    /// The last bytes of stderr (bounded by [`STDERR_TAIL_BYTES_MAX`]).
    pub stderr_tail: String,
    /// When the process ended (Unix ms), for relative reset times.
    pub now_unix_ms: u64,
}

/// One CLI's output format, turned into normalized events. Pure: no IO, the time is an input.
pub trait EventParser: Send {
    /// Parses one stdout line (without its newline), pushing the events it yields.
    ///
    /// # Errors
    /// A typed [`ParseError`]; the parser's state stays usable for the next line.
    fn parse_line(
        &mut self,
        line: &[u8],
        now_unix_ms: u64,
        out: &mut Vec<HarnessEvent>,
    ) -> Result<(), ParseError>;

    /// Reads one stderr line. Most CLIs print only logs there; opencode's per-attempt model errors
    /// arrive only on stderr, so its parser ends the session from here.
    fn parse_stderr_line(&mut self, _line: &str, _now_unix_ms: u64, _out: &mut Vec<HarnessEvent>) {}

    /// Model turns (requests) seen so far, checked against `SessionLimits::turns_max`.
    fn turns(&self) -> u32;

    /// The last assistant text seen, the answer if the session stops at a budget.
    fn last_text(&self) -> &str;

    /// The terminal event for a process that ended without printing one.
    fn finish(&mut self, outcome: &ProcessOutcome) -> HarnessEvent;
}

/// Everything needed to start one CLI session: the command and the files it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The CLI executable.
    pub program: PathBuf,
    /// Arguments, without a shell.
    pub args: Vec<String>,
    /// The complete environment (nothing else is inherited).
    pub env: BTreeMap<String, String>,
    /// The working directory of the process.
    pub cwd: PathBuf,
    /// Files to write before the spawn (config, hooks, plugins), with their mode bits.
    pub files: Vec<SessionFile>,
    /// Directories to create before the spawn (HOME, config homes): some CLIs refuse a missing one.
    pub dirs: Vec<PathBuf>,
    /// A file (usually one of `files`) read as the process's stdin; `None` closes stdin.
    pub stdin_file: Option<PathBuf>,
}

/// A file an adapter writes into the session directory before the spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFile {
    /// Absolute path (inside the session directory).
    pub path: PathBuf,
    /// Content.
    pub contents: String,
    /// Whether to make it executable (gate wrapper scripts).
    pub executable: bool,
}

/// One CLI's adapter-specific half: how to build the invocation and the parser.
pub trait CliFlavor: Send + Sync + 'static {
    /// Which harness this is.
    fn kind(&self) -> HarnessKind;
    /// Where its executable is found.
    fn binary(&self) -> CliBinary;
    /// Builds the invocation for `spec` with `program`, using `session_dir` for HOME and config.
    ///
    /// # Errors
    /// [`StartError`] for a spec the CLI cannot run (e.g. a missing credential).
    fn invocation(
        &self,
        spec: &SessionSpec,
        program: &Path,
        session_dir: &Path,
    ) -> Result<Invocation, StartError>;
    /// A fresh parser for one session.
    fn parser(&self, spec: &SessionSpec) -> Box<dyn EventParser>;
    /// Whether the CLI prints the result of a call of `tool` (the name its stream gave the call)
    /// before its after-call hook has run, so the runner must wait for the policy's record of it
    /// before logging it (Codex prints a command's completion first). The others print a result
    /// after their hook: a record, if any, is there already.
    fn result_before_hook(&self, _tool: &str) -> bool {
        false
    }
    /// What [`CliFlavor::result_before_hook`] is for a result whose call the runner does not know
    /// (past its bound of calls remembered, or a result without its call): a CLI that prints some
    /// results before its hook waits for them all (fail closed).
    fn result_before_hook_unknown(&self) -> bool {
        false
    }
    /// Whether the ids its stream gives calls are the harness's call ids its hooks get
    /// (`tool_use_id`): only then is the policy's record of a result looked up by id. Codex's
    /// stream names calls `item_N`, which a session's own tools can guess and post records for.
    fn stream_ids_are_call_ids(&self) -> bool {
        true
    }
}

/// Collapses a tool result's content (a string, or a list of `{type:"text", text}` blocks) to text.
pub fn content_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => {
            let mut out = String::new();
            for item in items {
                if let Some(t) = item.get("text").and_then(serde_json::Value::as_str) {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(t);
                }
            }
            out
        }
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A message for a process that ended without the CLI's terminal event.
pub fn died_message(cli: &str, outcome: &ProcessOutcome) -> String {
    let code = outcome
        .exit_code
        .map_or_else(|| "a signal".to_owned(), |c| format!("code {c}"));
    let tail = outcome.stderr_tail.trim();
    truncate_to(
        if tail.is_empty() {
            format!("{cli} exited with {code} without a terminal event")
        } else {
            format!("{cli} exited with {code} without a terminal event; stderr: {tail}")
        },
        crate::error::ERROR_MESSAGE_BYTES_MAX,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_blocks_collapse_to_text() {
        let v: serde_json::Value = serde_json::json!([{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"b"}]);
        assert_eq!(content_text(&v), "a\nb");
        assert_eq!(content_text(&serde_json::json!("x")), "x");
    }
}
