//! Tool pairing (docs/DESIGN.md §12, invariant 3) over one attempt's log rows, matched by tool id.

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

/// Tool pairing over the gapless prefix of one attempt's log: the ids of the tool_uses still open at
/// its end, or what broke the pairing.
pub(super) fn tool_pairing(
    attempt: AttemptId,
    log: &BTreeMap<u32, SessionLogRow>,
) -> Result<BTreeSet<String>, String> {
    let mut open: BTreeSet<String> = BTreeSet::new();
    let mut answered: BTreeSet<String> = BTreeSet::new();
    let first_seq = log.keys().next().copied().unwrap_or(1);
    for (expected, (seq, row)) in (first_seq..).zip(log.iter()) {
        if *seq != expected {
            break;
        }
        match row.kind {
            LogKind::ToolUse => {
                let id = tool_id(row);
                if open.contains(id) || answered.contains(id) {
                    return Err(format!(
                        "attempt {attempt}: tool_use row {seq} reuses the id {id}"
                    ));
                }
                open.insert(id.to_string());
            }
            LogKind::ToolResult => {
                let id = tool_id(row);
                if !open.remove(id) {
                    return Err(if answered.contains(id) {
                        format!(
                            "attempt {attempt}: tool_result row {seq} answers tool_use {id} a second time"
                        )
                    } else {
                        format!(
                            "attempt {attempt}: tool_result row {seq} ({id}) answers no open tool_use"
                        )
                    });
                }
                answered.insert(id.to_string());
            }
            LogKind::Text if !open.is_empty() => {
                let ids: Vec<&str> = open.iter().map(String::as_str).collect();
                return Err(format!(
                    "attempt {attempt}: text row {seq} before the results of {}",
                    ids.join(", ")
                ));
            }
            _ => {}
        }
    }
    Ok(open)
}
