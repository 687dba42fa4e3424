//! Tool pairing (docs/DESIGN.md §12, invariant 3) over one attempt's log rows, matched by tool id.
//!
//! The pairing is advanced as the rows arrive rather than recomputed over the whole log at every
//! reply: a long session sends hundreds of rows, one reply at a time, and a recomputation made the
//! check quadratic in the session's length.

use std::collections::{BTreeMap, BTreeSet};

use keel_actors::AttemptId;
use keel_store::{LogKind, SessionLogRow};

/// The id a tool row carries: the specialist writes a tool_use's and a tool_result's detail as
/// `"{id}: {text}"`.
fn tool_id(row: &SessionLogRow) -> &str {
    row.detail
        .split_once(": ")
        .map_or(&row.detail, |(id, _)| id)
}

/// Tool pairing over the gapless prefix of one attempt's log (from its smallest sequence number),
/// as far as it has been checked.
#[derive(Debug)]
pub(super) struct Pairing {
    /// The sequence number the checked prefix starts at.
    start: u32,
    /// The next sequence number to check: the rows from `start` below it are checked.
    next: u32,
    /// Tool_uses without their result yet.
    open: BTreeSet<String>,
    /// Tool_uses answered.
    answered: BTreeSet<String>,
    /// What broke the pairing, once something did.
    broken: Option<String>,
}

impl Pairing {
    fn new(start: u32) -> Self {
        Self {
            start,
            next: start,
            open: BTreeSet::new(),
            answered: BTreeSet::new(),
            broken: None,
        }
    }

    /// The pairing of `log` (every row this attempt sent so far): the ids of the tool_uses still
    /// open at the end of its gapless prefix, or what broke the pairing. Only rows the last call
    /// did not reach are read; a row older than the prefix's start (rows arrive out of order)
    /// starts the prefix again from it.
    pub(super) fn advance(
        &mut self,
        attempt: AttemptId,
        log: &BTreeMap<u32, SessionLogRow>,
    ) -> Result<&BTreeSet<String>, String> {
        let first = log.keys().next().copied().unwrap_or(1);
        if first < self.start {
            *self = Pairing::new(first);
        }
        if let Some(broken) = &self.broken {
            return Err(broken.clone());
        }
        for (seq, row) in log.range(self.next..) {
            if *seq != self.next {
                break;
            }
            if let Err(broken) = self.check_row(attempt, *seq, row) {
                self.broken = Some(broken.clone());
                return Err(broken);
            }
            self.next = self.next.saturating_add(1);
        }
        Ok(&self.open)
    }

    fn check_row(
        &mut self,
        attempt: AttemptId,
        seq: u32,
        row: &SessionLogRow,
    ) -> Result<(), String> {
        match row.kind {
            LogKind::ToolUse => {
                let id = tool_id(row);
                if self.open.contains(id) || self.answered.contains(id) {
                    return Err(format!(
                        "attempt {attempt}: tool_use row {seq} reuses the id {id}"
                    ));
                }
                self.open.insert(id.to_string());
            }
            LogKind::ToolResult => {
                let id = tool_id(row);
                if !self.open.remove(id) {
                    return Err(if self.answered.contains(id) {
                        format!(
                            "attempt {attempt}: tool_result row {seq} answers tool_use {id} a second time"
                        )
                    } else {
                        format!(
                            "attempt {attempt}: tool_result row {seq} ({id}) answers no open tool_use"
                        )
                    });
                }
                self.answered.insert(id.to_string());
            }
            LogKind::Text if !self.open.is_empty() => {
                let ids: Vec<&str> = self.open.iter().map(String::as_str).collect();
                return Err(format!(
                    "attempt {attempt}: text row {seq} before the results of {}",
                    ids.join(", ")
                ));
            }
            _ => {}
        }
        Ok(())
    }
}

/// The pairing of `log` for `attempt`, advanced in `pairings` (created at the log's first row).
pub(super) fn tool_pairing<'p>(
    pairings: &'p mut BTreeMap<AttemptId, Pairing>,
    attempt: AttemptId,
    log: &BTreeMap<u32, SessionLogRow>,
) -> Result<&'p BTreeSet<String>, String> {
    let first = log.keys().next().copied().unwrap_or(1);
    pairings
        .entry(attempt)
        .or_insert_with(|| Pairing::new(first))
        .advance(attempt, log)
}
