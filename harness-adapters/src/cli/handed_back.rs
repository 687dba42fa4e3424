//! One session's record of what keel's policy handed back for each result its CLI handed it
//! ([`ResultRecords`]): the node's hook bridge writes a record when it answers a CLI's after-call
//! hook, and the CLI runner reads it before a tool result becomes an event, so the session log
//! holds the result the model saw (a redaction included), not the CLI's own account of it.
//!
//! Only the result of a call the policy allowed is recorded, once ([`SessionResults::allow`] when
//! the gate allows a call, by the harness's call id): a result the session's own tools post with
//! the hook token for a call nobody allowed, or a second one for the same call, is not. Records
//! are matched by the harness's call id when the CLI's stream names calls by it (Claude Code,
//! opencode, pi), else (Codex: its stream names calls `item_N`, which a session can guess) never by
//! id but by the call's command (its tool and input for others) together with the output the hook
//! saw (Codex prints byte for byte the `tool_response` its hook got). When records that answer
//! differently could both match, the result is withheld (fail closed). A record that arrives after
//! the runner stopped waiting for it is dropped. Each record answers once. A session holds at most
//! [`RECORDS_MAX`] unclaimed records; past that the oldest is dropped (a result whose record was
//! dropped is logged as withheld by a CLI that waits for one, and as its stream says by the
//! others).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Notify;

use crate::event::TOOL_RESULT_BYTES_MAX;
use crate::guard::{GuardFuture, HandedBack, ResultRecords, StreamResult, ToolOutput};

/// Most unclaimed records one session keeps (also: allowed calls awaiting a result, and results
/// the runner stopped waiting for).
pub const RECORDS_MAX: usize = 256;

/// Most allowed calls one session remembers while their results are due.
const ALLOWED_MAX: usize = 1_024;

#[derive(Debug)]
struct Record {
    /// The harness's call id, as the hook's payload gave it.
    id: String,
    /// The tool's name as the hook's payload gave it.
    tool: String,
    /// The call's input as the hook's payload gave it.
    input: Value,
    /// The result's text as the hook saw it.
    original: String,
    handed: HandedBack,
}

/// A result the runner stopped waiting for (matched by content: no call id).
#[derive(Debug)]
struct GaveUp {
    tool: String,
    input: String,
    original: String,
}

#[derive(Debug, Default)]
struct State {
    records: VecDeque<Record>,
    /// Call ids the policy allowed whose result has not been recorded.
    allowed: VecDeque<String>,
    gave_up: VecDeque<GaveUp>,
}

/// One session's records (share it in an `Arc` between the bridge and the spec).
#[derive(Debug, Default)]
pub struct SessionResults {
    state: Mutex<State>,
    added: Notify,
}

impl SessionResults {
    /// An empty record.
    pub fn new() -> SessionResults {
        SessionResults::default()
    }

    /// The policy allowed the call `id`: its result, when it comes, is recorded (once).
    pub fn allow(&self, id: &str) {
        if id.is_empty() {
            return;
        }
        let mut state = self.lock();
        if state.allowed.len() >= ALLOWED_MAX {
            state.allowed.pop_front();
        }
        state.allowed.push_back(id.to_owned());
    }

    /// The policy handed back `handed_back` for the call `id` (of `tool` with `input`) whose
    /// result the hook saw as `original`. Not recorded unless the call was allowed and has no
    /// record yet; nor when the runner already stopped waiting for it.
    pub fn record(
        &self,
        id: Option<&str>,
        call: (&str, &Value),
        original: &ToolOutput,
        handed_back: &ToolOutput,
    ) {
        let Some(id) = id.filter(|i| !i.is_empty()) else {
            return;
        };
        let handed = if handed_back == original {
            HandedBack::Unchanged
        } else {
            // An error only when the policy made it one (Codex's results reach the policy marked
            // failed for the gates, which the log need not repeat).
            HandedBack::Changed(ToolOutput {
                is_error: handed_back.is_error && !original.is_error,
                text: handed_back.text.clone(),
            })
        };
        let (tool, input) = call;
        let record = Record {
            id: id.to_owned(),
            tool: tool.to_owned(),
            input: input.clone(),
            original: original.text.clone(),
            handed,
        };
        {
            let mut state = self.lock();
            let Some(at) = state.allowed.iter().position(|a| a == id) else {
                return;
            };
            state.allowed.remove(at);
            let late = state.gave_up.iter().position(|g| {
                same_call(&record, g.tool.as_str(), g.input.as_str())
                    && same_output(&record, &g.original)
            });
            if let Some(at) = late {
                state.gave_up.remove(at);
                return;
            }
            if state.records.len() >= RECORDS_MAX {
                state.records.pop_front();
            }
            state.records.push_back(record);
        }
        self.added.notify_waiters();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The record that answers `result`, taken; `Err` when records that answer differently could
    /// (all such candidates are dropped: the result is withheld).
    fn take(&self, result: &StreamResult<'_>) -> Option<Result<HandedBack, Ambiguous>> {
        let mut state = self.lock();
        let records = &mut state.records;
        if let Some(id) = result.call_id {
            let at = records.iter().position(|r| r.id == id)?;
            return records.remove(at).map(|r| Ok(r.handed));
        }
        let matching: Vec<usize> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                same_call(r, result.tool, result.input) && same_output(r, result.original)
            })
            .map(|(at, _)| at)
            .collect();
        let first = *matching.first()?;
        if matching
            .iter()
            .all(|&at| records[at].handed == records[first].handed)
        {
            return records.remove(first).map(|r| Ok(r.handed));
        }
        for at in matching.into_iter().rev() {
            records.remove(at);
        }
        Some(Err(Ambiguous))
    }

    fn gave_up(&self, result: &StreamResult<'_>) {
        if result.call_id.is_some() {
            return;
        }
        let mut state = self.lock();
        if state.gave_up.len() >= RECORDS_MAX {
            state.gave_up.pop_front();
        }
        state.gave_up.push_back(GaveUp {
            tool: result.tool.to_owned(),
            input: result.input.to_owned(),
            original: result.original.to_owned(),
        });
    }
}

/// More than one record with differing answers could be a result's.
struct Ambiguous;

/// Whether the stream's `original` (cut at the event's bound, perhaps) is the record's output.
fn same_output(record: &Record, original: &str) -> bool {
    let cut = original.len() + 4 >= TOOL_RESULT_BYTES_MAX;
    record.original == original || (cut && record.original.starts_with(original))
}

/// Whether the stream's call (`tool` with the JSON text `input`) is the record's: the same command
/// when both name one (the stream may show it wrapped in its shell, `/bin/bash -lc '<command>'`),
/// else the same tool and input.
fn same_call(record: &Record, tool: &str, input: &str) -> bool {
    let Ok(input) = serde_json::from_str::<Value>(input) else {
        return false;
    };
    let command = |v: &Value| v.get("command").and_then(Value::as_str).map(str::to_owned);
    match (command(&input), command(&record.input)) {
        (Some(streamed), Some(hooked)) => {
            streamed == hooked || shell_wrapped(&streamed).as_deref() == Some(hooked.as_str())
        }
        (None, None) => record.tool == tool && record.input == input,
        _ => false,
    }
}

/// The command inside `SHELL -lc WORD` (or `-c`): `WORD` unquoted as a POSIX shell would; `None`
/// for anything else.
fn shell_wrapped(command: &str) -> Option<String> {
    let (shell, rest) = command
        .split_once(" -lc ")
        .or_else(|| command.split_once(" -c "))?;
    if shell.is_empty() || shell.contains(char::is_whitespace) {
        return None;
    }
    let mut out = String::new();
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => loop {
                match chars.next()? {
                    '\'' => break,
                    c => out.push(c),
                }
            },
            '"' => loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        c @ ('"' | '\\' | '$' | '`') => out.push(c),
                        '\n' => {}
                        c => {
                            out.push('\\');
                            out.push(c);
                        }
                    },
                    c => out.push(c),
                }
            },
            '\\' => out.push(chars.next()?),
            c if c.is_whitespace() => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

impl ResultRecords for SessionResults {
    fn result_for<'a>(
        &'a self,
        result: StreamResult<'a>,
        wait_ms: u64,
    ) -> GuardFuture<'a, Option<HandedBack>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
            loop {
                // Registered before the look, so a record added in between wakes it.
                let added = self.added.notified();
                tokio::pin!(added);
                added.as_mut().enable();
                match self.take(&result) {
                    Some(Ok(found)) => return Some(found),
                    Some(Err(Ambiguous)) => {
                        return Some(HandedBack::Changed(ToolOutput {
                            is_error: true,
                            text: super::runner::RESULT_NOT_RECORDED.to_owned(),
                        }));
                    }
                    None => {}
                }
                if tokio::time::timeout_at(deadline, added).await.is_err() {
                    if wait_ms > 0 {
                        self.gave_up(&result);
                    }
                    return None;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(text: &str) -> ToolOutput {
        ToolOutput {
            is_error: false,
            text: text.into(),
        }
    }

    fn bash(command: &str) -> Value {
        serde_json::json!({ "command": command })
    }

    /// A Codex command result as its stream shows it: no call id.
    fn codex<'a>(input: &'a str, original: &'a str) -> StreamResult<'a> {
        StreamResult {
            call_id: None,
            tool: "shell",
            input,
            original,
        }
    }

    fn allowed_record(
        results: &SessionResults,
        id: &str,
        command: &str,
        original: &str,
        handed: &str,
    ) {
        results.allow(id);
        results.record(
            Some(id),
            ("Bash", &bash(command)),
            &out(original),
            &out(handed),
        );
    }

    #[tokio::test]
    async fn a_result_is_found_by_its_id_or_its_command_and_output_once() {
        let results = SessionResults::new();
        allowed_record(&results, "toolu_1", "cat pw", "pw-hunter2", "pw-REDACTED");
        allowed_record(&results, "call_2", "echo same", "same", "same");
        let claude = |id| StreamResult {
            call_id: Some(id),
            tool: "Bash",
            input: "{}",
            original: "whatever",
        };
        assert_eq!(
            results.result_for(claude("toolu_1"), 0).await,
            Some(HandedBack::Changed(out("pw-REDACTED")))
        );
        assert_eq!(results.result_for(claude("toolu_1"), 0).await, None);
        // Codex: the stream's item id is not the call id; the command is wrapped in its shell.
        assert_eq!(
            results
                .result_for(
                    codex(r#"{"command":"/bin/bash -lc 'echo same'"}"#, "same"),
                    0
                )
                .await,
            Some(HandedBack::Unchanged)
        );
    }

    #[tokio::test]
    async fn a_forged_result_is_not_recorded_and_never_matched_by_a_guessed_item_id() {
        let results = SessionResults::new();
        // The session posts results with the hook token for calls the policy never allowed.
        for n in 1..=60 {
            let id = format!("item_{n}");
            results.record(
                Some(&id),
                ("Bash", &bash("cat .env")),
                &out("harmless"),
                &out("harmless"),
            );
        }
        // The real call: allowed, redacted; a second post for it is not recorded.
        allowed_record(
            &results,
            "call_9",
            "cat .env",
            "SECRET=1",
            "SECRET=[redacted]",
        );
        results.record(
            Some("call_9"),
            ("Bash", &bash("cat .env")),
            &out("SECRET=1"),
            &out("SECRET=1"),
        );
        let stream = StreamResult {
            call_id: None,
            ..codex(r#"{"command":"/bin/bash -lc 'cat .env'"}"#, "SECRET=1")
        };
        assert_eq!(
            results.result_for(stream, 0).await,
            Some(HandedBack::Changed(out("SECRET=[redacted]")))
        );
        assert_eq!(results.result_for(stream, 0).await, None);
        assert_eq!(
            results
                .result_for(codex(r#"{"command":"cat .env"}"#, "harmless"), 0)
                .await,
            None
        );
    }

    #[tokio::test]
    async fn same_output_of_different_commands_is_not_swapped_and_an_ambiguous_match_is_withheld() {
        let results = SessionResults::new();
        allowed_record(&results, "call_1", "cat a", "x", "[redacted]");
        allowed_record(&results, "call_2", "cat b", "x", "x");
        assert_eq!(
            results
                .result_for(codex(r#"{"command":"cat b"}"#, "x"), 0)
                .await,
            Some(HandedBack::Unchanged)
        );
        assert_eq!(
            results
                .result_for(codex(r#"{"command":"cat a"}"#, "x"), 0)
                .await,
            Some(HandedBack::Changed(out("[redacted]")))
        );
        // Same command, same output, different answers: neither is trusted.
        allowed_record(&results, "call_3", "cat c", "y", "[redacted]");
        allowed_record(&results, "call_4", "cat c", "y", "y");
        let withheld = results
            .result_for(codex(r#"{"command":"cat c"}"#, "y"), 0)
            .await;
        assert!(
            matches!(&withheld, Some(HandedBack::Changed(o)) if o.text == super::super::runner::RESULT_NOT_RECORDED),
            "{withheld:?}"
        );
        assert_eq!(
            results
                .result_for(codex(r#"{"command":"cat c"}"#, "y"), 0)
                .await,
            None
        );
    }

    #[tokio::test]
    async fn a_record_that_comes_while_the_runner_waits_is_taken_and_one_after_it_gave_up_is_dropped()
     {
        let results = std::sync::Arc::new(SessionResults::new());
        let writer = std::sync::Arc::clone(&results);
        let waiting = tokio::spawn(async move {
            writer
                .result_for(codex(r#"{"command":"late"}"#, "late"), 60_000)
                .await
        });
        // The record is written only once the runner looked and is waiting (the test's runtime has
        // one thread: a yield lets the spawned look run).
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        assert!(
            !waiting.is_finished(),
            "the runner did not wait for the record"
        );
        allowed_record(&results, "call_4", "late", "late", "withheld");
        assert_eq!(
            waiting.await.ok().flatten(),
            Some(HandedBack::Changed(out("withheld")))
        );
        // The runner gave up on this one; its record comes later and is not kept for another call.
        assert_eq!(
            results
                .result_for(codex(r#"{"command":"ls"}"#, "same"), 10)
                .await,
            None
        );
        allowed_record(&results, "call_5", "ls", "same", "[redacted]");
        allowed_record(&results, "call_6", "ls", "same", "same");
        assert_eq!(
            results
                .result_for(codex(r#"{"command":"ls"}"#, "same"), 0)
                .await,
            Some(HandedBack::Unchanged)
        );
    }

    #[test]
    fn a_shell_wrapped_command_is_unquoted() {
        assert_eq!(
            shell_wrapped(r#"/bin/bash -lc 'echo out; cat /x'"#).as_deref(),
            Some("echo out; cat /x")
        );
        assert_eq!(
            shell_wrapped(r#"/bin/bash -lc 'it'"'"'s'"#).as_deref(),
            Some("it's")
        );
        assert_eq!(
            shell_wrapped(r#"bash -c "a \"b\" \$c""#).as_deref(),
            Some(r#"a "b" $c"#)
        );
        assert_eq!(shell_wrapped("bash -lc ls").as_deref(), Some("ls"));
        assert_eq!(shell_wrapped("bash -lc ls -la"), None);
        assert_eq!(shell_wrapped("echo hi"), None);
    }
}
