//! Session-log segments (store format 4): the rows of one task staged in one commit, stored under
//! one key of `session_logs` (the first row's sequence number) instead of one key a row. Since
//! format 6 a run's manifest entries staged in one commit are stored the same way in `manifest`
//! (a specialist's entry was one insert of its own, 16 a run of `keel bench`).
//!
//! Why: a specialist's four rows (context built, session started, final text, session ended) were
//! four B-tree inserts of about 8 k instructions each, most of the store writer's work after the
//! task rows; one commit usually holds all of a task's rows of that moment. A segment is one insert.
//!
//! Layout: a single row is stored as it always was (`[schema version] ++ row`, what format 3
//! holds); two or more consecutive rows are `[SEGMENT_MARK] ++ [schema version] ++ bincode(Vec of
//! rows)`, keyed by the first row's sequence number, the others numbered on from it. No row starts
//! with the mark (0 is not a schema version), so a reader tells the two apart by the first byte;
//! every reader of the log (`read.rs`: the last N rows, the rows after a sequence number) expands
//! a segment back into its rows, so what a reader sees is the same rows with the same numbers.

use std::fmt;

use serde::Serialize;

use crate::codec::{self, DecodeError, EncodeError, Record};
use crate::read::Sequenced;

/// The first byte of a segment's value.
pub(crate) const SEGMENT_MARK: u8 = 0;

/// Most rows one segment holds: a reader of the last few rows decodes at most this many more.
pub(crate) const SEGMENT_ROWS_MAX: u64 = 64;

/// Most encoded bytes of rows one segment holds before the next row starts another (a row itself
/// is bounded by the limits on its summary and detail).
pub(crate) const SEGMENT_BYTES_MAX: usize = 32 * 1024;

/// The rows of one task's log (or one run's manifest) a commit has staged and not yet written,
/// consecutively numbered.
#[derive(Debug)]
pub(crate) struct Segment {
    /// The first row's sequence number (the key).
    first: u64,
    /// Rows in it.
    count: u64,
    /// The rows' encodings, one after the other, without a version byte.
    body: Vec<u8>,
}

impl Segment {
    /// An empty segment whose first row will be `first`.
    pub(crate) fn new(first: u64) -> Self {
        Self {
            first,
            count: 0,
            body: Vec::new(),
        }
    }

    /// The sequence number of its last row (`None` while it holds none).
    pub(crate) fn last(&self) -> Option<u64> {
        self.count
            .checked_sub(1)
            .and_then(|more| self.first.checked_add(more))
    }

    /// Whether the row numbered `seq` goes into this segment (it follows the last row, and the
    /// segment has room).
    pub(crate) fn takes(&self, seq: u64) -> bool {
        self.first.checked_add(self.count) == Some(seq)
            && self.count < SEGMENT_ROWS_MAX
            && self.body.len() < SEGMENT_BYTES_MAX
    }

    /// Adds the next row of `table`.
    ///
    /// # Errors
    /// [`EncodeError`] if bincode refuses the row.
    pub(crate) fn push(
        &mut self,
        table: &'static str,
        row: &impl Serialize,
    ) -> Result<(), EncodeError> {
        codec::append_body(table, row, &mut self.body)?;
        self.count += 1;
        Ok(())
    }

    /// The key's sequence number.
    pub(crate) fn first(&self) -> u64 {
        self.first
    }

    /// The value to store: a single row as format 3 stores it, more as a segment.
    pub(crate) fn value(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.body.len() + 12);
        if self.count != 1 {
            out.push(SEGMENT_MARK);
            out.push(codec::SCHEMA_VERSION);
            push_varint(&mut out, self.count);
        } else {
            out.push(codec::SCHEMA_VERSION);
        }
        out.extend_from_slice(&self.body);
        out
    }
}

/// Appends `n` as bincode's standard configuration encodes a `u64` (a varint: below 251 one byte,
/// else a marker byte and the value little-endian in 2, 4 or 8 bytes), the length prefix of the
/// segment's list, so the whole value decodes as a `Vec` of rows.
fn push_varint(out: &mut Vec<u8>, n: u64) {
    if let Some(small) = u8::try_from(n).ok().filter(|b| *b < 251) {
        out.push(small);
    } else if let Ok(n) = u16::try_from(n) {
        out.push(251);
        out.extend_from_slice(&n.to_le_bytes());
    } else if let Ok(n) = u32::try_from(n) {
        out.push(252);
        out.extend_from_slice(&n.to_le_bytes());
    } else {
        out.push(253);
        out.extend_from_slice(&n.to_le_bytes());
    }
}

/// The rows of `table` stored under the key numbered `seq` (a row, or a segment's rows numbered
/// from `seq`).
///
/// # Errors
/// [`DecodeError`] naming the row's key (a segment's key is its first row's).
pub(crate) fn rows_of<T: Record>(
    table: &'static str,
    key: &dyn fmt::Display,
    seq: u64,
    bytes: &[u8],
) -> Result<Vec<Sequenced<T>>, DecodeError> {
    match bytes.split_first() {
        Some((&SEGMENT_MARK, segment)) => {
            let rows: Vec<T> = codec::decode(table, key, segment)?;
            // The writer never stores an empty segment; one is damage, as `last_seq` says.
            if rows.is_empty() {
                return Err(past_the_end(table, key));
            }
            let mut out = Vec::with_capacity(rows.len());
            for (i, value) in rows.into_iter().enumerate() {
                let Some(seq) = u64::try_from(i).ok().and_then(|i| seq.checked_add(i)) else {
                    return Err(past_the_end(table, key));
                };
                out.push(Sequenced { seq, value });
            }
            Ok(out)
        }
        _ => Ok(vec![Sequenced {
            seq,
            value: codec::decode(table, key, bytes)?,
        }]),
    }
}

/// The sequence number of the last row of `table` stored under the key numbered `seq`.
///
/// # Errors
/// [`DecodeError`] if a segment's length does not decode.
pub(crate) fn last_seq(
    table: &'static str,
    key: &dyn fmt::Display,
    seq: u64,
    bytes: &[u8],
) -> Result<u64, DecodeError> {
    match bytes.split_first() {
        Some((&SEGMENT_MARK, segment)) => {
            let count: u64 = codec::decode_prefix(table, key, segment)?;
            count
                .checked_sub(1)
                .and_then(|more| seq.checked_add(more))
                .ok_or_else(|| past_the_end(table, key))
        }
        _ => Ok(seq),
    }
}

fn past_the_end(table: &'static str, key: &dyn fmt::Display) -> DecodeError {
    DecodeError::Corrupt {
        table,
        key: key.to_string(),
        reason: "a segment that is empty or numbers past u64::MAX".to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;
    use crate::model::{LogKind, SessionLogRow};
    use crate::tables::name;

    const LOGS: &str = name::SESSION_LOGS;

    fn row(n: u64) -> SessionLogRow {
        SessionLogRow {
            ts_ms: n,
            kind: LogKind::Text,
            summary: format!("row {n}"),
            detail: "d".repeat(usize::try_from(n).unwrap() % 7),
            redactions: Vec::new(),
        }
    }

    #[test]
    fn the_length_prefix_is_bincodes() {
        for n in [
            0u64,
            1,
            250,
            251,
            65_535,
            65_536,
            u64::from(u32::MAX) + 1,
            u64::MAX,
        ] {
            let mut ours = Vec::new();
            push_varint(&mut ours, n);
            assert_eq!(ours, codec::encode("t", &n).unwrap()[1..], "{n}");
        }
    }

    #[test]
    fn a_single_row_is_stored_as_format_3_and_more_as_a_segment() {
        let mut one = Segment::new(7);
        one.push(LOGS, &row(1)).unwrap();
        assert_eq!(
            one.value(),
            codec::encode(name::SESSION_LOGS, &row(1)).unwrap()
        );
        assert_eq!(last_seq(LOGS, &"k", 7, &one.value()).unwrap(), 7);
        assert_eq!(
            rows_of::<SessionLogRow>(LOGS, &"k", 7, &one.value()).unwrap()[0].value,
            row(1)
        );

        let mut many = Segment::new(7);
        for n in 1..=3 {
            assert!(many.takes(6 + n));
            many.push(LOGS, &row(n)).unwrap();
        }
        assert!(!many.takes(11));
        assert_eq!(last_seq(LOGS, &"k", 7, &many.value()).unwrap(), 9);
        let rows = rows_of::<SessionLogRow>(LOGS, &"k", 7, &many.value()).unwrap();
        assert_eq!(
            rows.iter()
                .map(|r| (r.seq, r.value.ts_ms))
                .collect::<Vec<_>>(),
            vec![(7, 1), (8, 2), (9, 3)]
        );
    }

    use crate::{Durability, RunId, Store, TaskId, WriteBatch, tables};
    use redb::ReadableTableMetadata;

    fn store_with_a_task(path: &std::path::Path) -> Store {
        let store = Store::open(path).unwrap();
        let scope = store.run(RunId(1));
        let mut batch = WriteBatch::new();
        batch.push(
            scope
                .stage_create_run(crate::Run {
                    id: RunId(1),
                    brief: "b".into(),
                    plan: None,
                    status: crate::RunStatus::Running,
                    budget: crate::Budget::default(),
                    created_ms: 1,
                    updated_ms: 1,
                    config_snapshot: String::new(),
                    outcome: None,
                })
                .unwrap(),
        );
        store.commit_group(batch, Durability::Immediate).unwrap();
        store
    }

    fn create_task(store: &Store, id: u128, rows: std::ops::RangeInclusive<u64>) {
        let scope = store.run(RunId(1));
        let task = crate::Task {
            id: TaskId(id),
            run_id: RunId(1),
            parent: None,
            depth: 0,
            kind: crate::TaskKind::Root,
            brief: "t".into(),
            goal: "g".into(),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            model: None,
            observed: None,
            status: crate::TaskStatus::Pending,
            attempt: 1,
            idempotency_key: None,
            outcome: None,
            attachments: Vec::new(),
            progress_notes: Vec::new(),
            created_ms: 1,
            updated_ms: 1,
        };
        let mut batch = WriteBatch::new();
        batch.push(scope.stage_create_task(task).unwrap());
        for n in rows {
            batch.push(scope.stage_append_log(TaskId(id), row(n)).unwrap());
        }
        store.commit_group(batch, Durability::Immediate).unwrap();
    }

    fn append(store: &Store, task: u128, rows: std::ops::RangeInclusive<u64>) {
        let scope = store.run(RunId(1));
        let mut batch = WriteBatch::new();
        for n in rows {
            batch.push(scope.stage_append_log(TaskId(task), row(n)).unwrap());
        }
        store.commit_group(batch, Durability::Immediate).unwrap();
    }

    fn entries(store: &Store) -> u64 {
        let txn = store.begin_read().unwrap();
        txn.open_table(tables::SESSION_LOGS).unwrap().len().unwrap()
    }

    fn every_row(store: &Store, task: u128) -> Vec<(u64, u64)> {
        store
            .run(RunId(1))
            .last_log_rows(TaskId(task), 1_000)
            .unwrap()
            .iter()
            .map(|r| (r.seq, r.value.ts_ms))
            .collect()
    }

    /// A specialist's four rows staged in one commit are one entry of the table; read back as
    /// four rows numbered as before.
    #[test]
    fn the_rows_of_a_task_in_one_commit_are_one_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store = store_with_a_task(&dir.path().join("keel.redb"));
        create_task(&store, 10, 1..=4);
        assert_eq!(entries(&store), 1);
        append(&store, 10, 5..=5);
        append(&store, 10, 6..=7);
        assert_eq!(entries(&store), 3);
        assert_eq!(
            every_row(&store, 10),
            (1..=7).map(|n| (n, n)).collect::<Vec<_>>()
        );
        let rows = SEGMENT_ROWS_MAX + 3;
        append(&store, 10, 8..=7 + rows);
        assert_eq!(entries(&store), 5, "a full segment starts another");
        assert_eq!(
            every_row(&store, 10).len(),
            usize::try_from(7 + rows).unwrap()
        );
    }

    /// A format-3 store (every row under its own key, `store_format` 3) is read as it is by a
    /// read-only handle, and a writable open upgrades it to format 4 and numbers on.
    #[test]
    fn a_format_3_log_reads_the_same_and_upgrades() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.redb");
        let store = store_with_a_task(&path);
        create_task(&store, 10, 1..=1);
        for n in 2..=5 {
            append(&store, 10, n..=n);
        }
        assert_eq!(entries(&store), 5, "one row a commit is a format-3 row");
        let crate::store::Db::Writer(db) = &store.db else {
            panic!("a writable store")
        };
        let txn = db.begin_write().unwrap();
        txn.open_table(tables::META)
            .unwrap()
            .insert("store_format", 3)
            .unwrap();
        txn.commit().unwrap();
        let want = every_row(&store, 10);
        drop(store);

        let reader = Store::open_read_only(&path, crate::StoreConfig::default()).unwrap();
        assert_eq!(every_row(&reader, 10), want);
        drop(reader);
        let store = Store::open(&path).unwrap();
        assert_eq!(every_row(&store, 10), want);
        let format = store
            .begin_read()
            .unwrap()
            .open_table(tables::META)
            .unwrap()
            .get("store_format")
            .unwrap()
            .map(|g| g.value());
        assert_eq!(format, Some(crate::STORE_FORMAT));
        append(&store, 10, 6..=8);
        assert_eq!(
            every_row(&store, 10),
            (1..=8).map(|n| (n, n)).collect::<Vec<_>>()
        );
        let after = store
            .run(RunId(1))
            .log_rows_after(TaskId(10), 6, 10)
            .unwrap();
        assert_eq!(
            after.items.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![7, 8]
        );
    }

    #[test]
    fn a_segment_is_bounded() {
        let mut s = Segment::new(1);
        for n in 0..SEGMENT_ROWS_MAX {
            assert!(s.takes(1 + n));
            s.push(LOGS, &row(n)).unwrap();
        }
        assert!(!s.takes(1 + SEGMENT_ROWS_MAX));
        let empty = [SEGMENT_MARK, codec::SCHEMA_VERSION, 0];
        assert!(last_seq(LOGS, &"k", 1, &empty).is_err());
        assert!(rows_of::<SessionLogRow>(LOGS, &"k", 1, &empty).is_err());
    }
}
