//! One session's record of what keel's policy handed back for each result its CLI handed it
//! ([`ResultRecords`]): the node's hook bridge writes a record when it answers a CLI's after-call
//! hook, and the CLI runner reads it before a tool result becomes an event, so the session log
//! holds the result the model saw (a redaction included), not the CLI's own account of it.
//!
//! Records are matched by the harness's call id when the CLI's stream names calls by it (Claude
//! Code, opencode, pi), else by the output the hook saw (Codex: its stream names calls `item_N`,
//! and the output it prints is byte for byte the `tool_response` its hook got), the oldest first.
//! Each record answers once. A session holds at most [`RECORDS_MAX`] unclaimed records; past that
//! the oldest is dropped (a result whose record was dropped is logged as withheld by a CLI that
//! waits for one, and as its stream says by the others).

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::event::TOOL_RESULT_BYTES_MAX;
use crate::guard::{GuardFuture, HandedBack, ResultRecords, ToolOutput};

/// Most unclaimed records one session keeps.
pub const RECORDS_MAX: usize = 256;

#[derive(Debug)]
struct Record {
    /// The harness's call id, as the hook's payload gave it.
    id: Option<String>,
    /// The result's text as the hook saw it.
    original: String,
    handed: HandedBack,
}

/// One session's records (share it in an `Arc` between the bridge and the spec).
#[derive(Debug, Default)]
pub struct SessionResults {
    records: Mutex<VecDeque<Record>>,
    added: Notify,
}

impl SessionResults {
    /// An empty record.
    pub fn new() -> SessionResults {
        SessionResults::default()
    }

    /// The policy handed back `handed_back` for the call `id` whose result the hook saw as
    /// `original`.
    pub fn record(&self, id: Option<&str>, original: &ToolOutput, handed_back: &ToolOutput) {
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
        {
            let mut records = self.lock();
            if records.len() >= RECORDS_MAX {
                records.pop_front();
            }
            records.push_back(Record {
                id: id.filter(|i| !i.is_empty()).map(str::to_owned),
                original: original.text.clone(),
                handed,
            });
        }
        self.added.notify_waiters();
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Record>> {
        self.records.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The record of `id`, else the oldest whose original is `original` (or starts with it, when
    /// `original` is an event's text cut at its bound); taken.
    fn take(&self, id: &str, original: &str) -> Option<HandedBack> {
        let cut = original.len() + 4 >= TOOL_RESULT_BYTES_MAX;
        let mut records = self.lock();
        let at = records
            .iter()
            .position(|r| r.id.as_deref() == Some(id))
            .or_else(|| {
                records.iter().position(|r| {
                    r.original == original || (cut && r.original.starts_with(original))
                })
            })?;
        records.remove(at).map(|r| r.handed)
    }
}

impl ResultRecords for SessionResults {
    fn result_for<'a>(
        &'a self,
        id: &'a str,
        original: &'a str,
        wait_ms: u64,
    ) -> GuardFuture<'a, Option<HandedBack>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
            loop {
                // Registered before the look, so a record added in between wakes it.
                let added = self.added.notified();
                tokio::pin!(added);
                added.as_mut().enable();
                if let Some(found) = self.take(id, original) {
                    return Some(found);
                }
                if tokio::time::timeout_at(deadline, added).await.is_err() {
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

    #[tokio::test]
    async fn a_result_is_found_by_its_id_or_its_output_once_and_waited_for() {
        let results = std::sync::Arc::new(SessionResults::new());
        results.record(Some("toolu_1"), &out("pw-hunter2"), &out("pw-REDACTED"));
        results.record(Some("call_2"), &out("same"), &out("same"));
        assert_eq!(
            results.result_for("toolu_1", "whatever", 0).await,
            Some(HandedBack::Changed(out("pw-REDACTED")))
        );
        assert_eq!(results.result_for("toolu_1", "whatever", 0).await, None);
        // Codex: the stream's item id is not the call id; the output is the same bytes.
        assert_eq!(
            results.result_for("item_3", "same", 0).await,
            Some(HandedBack::Unchanged)
        );
        // A record that comes while the runner waits.
        let writer = std::sync::Arc::clone(&results);
        let waiting =
            tokio::spawn(async move { writer.result_for("item_4", "late", 60_000).await });
        tokio::task::yield_now().await;
        results.record(Some("call_4"), &out("late"), &out("withheld"));
        assert_eq!(
            waiting.await.ok().flatten(),
            Some(HandedBack::Changed(out("withheld")))
        );
        assert_eq!(results.result_for("item_5", "never", 10).await, None);
    }
}
