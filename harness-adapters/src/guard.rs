//! The tool guard: how keel's own loop reaches the node's policy in process (docs/DESIGN.md §9),
//! with no `keel hook` process and no HTTP round trip. The host puts a [`ToolGuard`] for the session
//! in the spec's [`crate::InProcessHooks`]; the loop asks it before every call (`PreToolUse`: the
//! hooks, the permission chain, the gates, the audit rows made durable) and hands it every result
//! before the model sees it (`PostToolUse`: hooks may normalise or redact the result; a successful
//! call may meet a prerequisite or issue a token). A CLI reaches the same policy through its native
//! hooks and the `keel hook` bridge instead.
//!
//! Plain data and a trait: no runtime needed, so the vocabulary half of the crate can name it.

use std::future::Future;
use std::path::Path;
use std::pin::Pin;

use serde_json::Value;

/// A boxed future a guard answers with (the trait stays object safe without an async-trait crate).
pub type GuardFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One tool call as the loop hands it to the guard.
#[derive(Clone, Copy, Debug)]
pub struct GuardedCall<'a> {
    /// The call's id in the model's message.
    pub tool_use_id: &'a str,
    /// The tool's literal name.
    pub tool: &'a str,
    /// The input the model sent.
    pub input: &'a Value,
    /// The session's working directory.
    pub cwd: &'a Path,
}

/// A tool's result as the model will see it (also what the `keel hook` bridge carries for a CLI's
/// `PostToolUse`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ToolOutput {
    /// Whether it is an error result.
    pub is_error: bool,
    /// Its text (the output, or the error's message).
    pub text: String,
}

/// The policy, in process, for one session's tool calls.
pub trait ToolGuard: Send + Sync {
    /// Decides a call before it runs; `Err` holds the reason the model is told when it is denied.
    /// Fails closed: anything that goes wrong inside denies.
    fn before_tool<'a>(&'a self, call: GuardedCall<'a>) -> GuardFuture<'a, Result<(), String>>;

    /// Hands back the result the model sees for a call that ran: `output` itself, or a rewritten
    /// (normalised, redacted) one, or an error that withholds it.
    fn after_tool<'a>(
        &'a self,
        call: GuardedCall<'a>,
        output: ToolOutput,
    ) -> GuardFuture<'a, ToolOutput>;
}

/// What keel's policy did with a CLI's result, as the session's log needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandedBack {
    /// The model sees the result as the tool produced it: the CLI's stream shows it right.
    Unchanged,
    /// The policy rewrote or withheld it: the model sees this text, whatever the CLI's stream
    /// shows (`is_error` when the policy made the result an error).
    Changed(ToolOutput),
}

/// The results a session's CLI handed keel's policy through its after-call hook (the `keel hook`
/// bridge) and what the policy handed back, so the session's log records what the model saw: a
/// CLI's own event stream may still show the original output of a call whose result a
/// `PostToolUse` hook redacted (Codex's `--json` stream does; docs/HARNESSES.md). The host puts one
/// in the spec's [`crate::InProcessHooks`] for a session that gets a `post_tool_hook`; the CLI runner
/// asks it before a tool result becomes an event.
pub trait ResultRecords: Send + Sync {
    /// What the policy handed back for `result`: by the harness's call id when the stream names
    /// calls by it, else by the call's command (or tool and input) together with the output the
    /// hook saw (Codex's stream names calls by its own item ids, which a session can guess). Waits
    /// up to `wait_ms` for the hook's record; `None` when none came. A result more than one
    /// differing record could answer gets a withholding answer (fail closed).
    fn result_for<'a>(
        &'a self,
        result: StreamResult<'a>,
        wait_ms: u64,
    ) -> GuardFuture<'a, Option<HandedBack>>;
}

/// A tool result as a CLI's stream shows it, as [`ResultRecords::result_for`] looks it up.
#[derive(Clone, Copy, Debug)]
pub struct StreamResult<'a> {
    /// The stream's id of the call when it is the harness's call id (the hook's `tool_use_id`);
    /// `None` when the stream names calls its own way (Codex's `item_N`).
    pub call_id: Option<&'a str>,
    /// The tool's name as the stream gave it.
    pub tool: &'a str,
    /// The call's input as the stream gave it (JSON text).
    pub input: &'a str,
    /// The result's text as the stream shows it (possibly cut at the event's bound).
    pub original: &'a str,
}
