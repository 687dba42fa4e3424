//! The rows a journaled commit wrote, as its journal record carries them (payload version 2).
//!
//! Why: the journal's first records (version 1) carried a commit's staged writes, encoded with
//! bincode a second time after the commit had encoded every row for redb, and replayed through the
//! writes' checks. Now a record carries what the commit did to the tables: each row it inserted,
//! with the key and value bytes redb was given, and each row it removed. Encoding the record is a
//! copy of bytes already encoded, its index rows included; a state-only task update carries its
//! state row, not the whole task; and a replay inserts the same rows, so it cannot decide anything
//! differently from the commit that acknowledged them.
//!
//! An entry: one tag byte (the table, [`REMOVE`] set for a removal), the key, then for an insert
//! the value. A key or value of a type with a fixed width is its bytes; one of variable width is a
//! `u32` little-endian length and its bytes. The tags are part of the journal's format: a table
//! keeps its tag, a new table takes a new one.

use redb::{Key, Value};

/// Each table's tag, as the journal's records name it: never reused, never renumbered.
pub(crate) mod tag {
    pub(crate) const RUNS: u8 = 0;
    pub(crate) const OPEN_RUNS: u8 = 1;
    pub(crate) const RUN_PLANS: u8 = 2;
    pub(crate) const TASKS: u8 = 3;
    pub(crate) const TASK_STATES: u8 = 4;
    pub(crate) const TASK_RUN: u8 = 5;
    pub(crate) const TASK_CHILDREN: u8 = 6;
    pub(crate) const SESSION_LOGS: u8 = 7;
    pub(crate) const CHECKPOINTS: u8 = 8;
    pub(crate) const MANIFEST: u8 = 9;
    pub(crate) const DEAD_LETTERS: u8 = 10;
    pub(crate) const IDEMPOTENCY: u8 = 11;
    pub(crate) const AUDIT: u8 = 12;
    pub(crate) const GATE_MARKS: u8 = 13;
    pub(crate) const ESCALATIONS: u8 = 14;
    pub(crate) const ESCALATION_IDS: u8 = 15;
    pub(crate) const BLOBS: u8 = 16;
    pub(crate) const AGENTS: u8 = 17;
    pub(crate) const RUN_AGENTS: u8 = 18;
}

/// The tag bit of a removal.
pub(crate) const REMOVE: u8 = 0x80;

/// Why a record's entries could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RedoError {
    /// The record ends inside an entry.
    #[error("the record ends inside an entry ({needed} more bytes needed at byte {at})")]
    Truncated {
        /// Where the entry's field starts.
        at: usize,
        /// The bytes it needs past the record's end.
        needed: usize,
    },
    /// A tag no table has.
    #[error("no table has the tag {0:#04x}")]
    UnknownTable(u8),
    /// A field too long for an entry (a row is bounded far below it by the store's limits).
    #[error("a field of {0} bytes is over an entry's limit")]
    TooLong(usize),
}

/// Appends one entry: `value` is `None` for a removal.
///
/// # Errors
/// [`RedoError::TooLong`] for a field of 4 GiB or more.
pub(crate) fn record<K: Key, V: Value>(
    redo: &mut Vec<u8>,
    tag: u8,
    key: &K::SelfType<'_>,
    value: Option<&V::SelfType<'_>>,
) -> Result<(), RedoError> {
    redo.push(if value.is_some() { tag } else { tag | REMOVE });
    put::<K>(redo, K::as_bytes(key).as_ref())?;
    if let Some(value) = value {
        put::<V>(redo, V::as_bytes(value).as_ref())?;
    }
    Ok(())
}

/// A field: its bytes, after their length when `T` has no fixed width.
fn put<T: Value>(redo: &mut Vec<u8>, bytes: &[u8]) -> Result<(), RedoError> {
    if T::fixed_width().is_none() {
        let len = u32::try_from(bytes.len()).map_err(|_| RedoError::TooLong(bytes.len()))?;
        redo.extend_from_slice(&len.to_le_bytes());
    }
    redo.extend_from_slice(bytes);
    Ok(())
}

/// A record's entries, read in order.
pub(crate) struct Entries<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Entries<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// The next entry's table tag (without [`REMOVE`]) and whether it is a removal; `None` at the
    /// record's end.
    pub(crate) fn next_tag(&mut self) -> Option<(u8, bool)> {
        let tag = *self.bytes.get(self.at)?;
        self.at += 1;
        Some((tag & !REMOVE, tag & REMOVE != 0))
    }

    /// The next field, a key or value of type `T`.
    ///
    /// # Errors
    /// [`RedoError::Truncated`] when the record ends inside it.
    pub(crate) fn field<T: Value>(&mut self) -> Result<&'a [u8], RedoError> {
        let len = match T::fixed_width() {
            Some(width) => width,
            None => {
                let raw = self.take(4)?;
                let mut len = [0u8; 4];
                len.copy_from_slice(raw);
                usize::try_from(u32::from_le_bytes(len))
                    .map_err(|_| RedoError::TooLong(usize::MAX))?
            }
        };
        self.take(len)
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], RedoError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| RedoError::Truncated {
                at: self.at,
                needed: self.at.saturating_add(len).saturating_sub(self.bytes.len()),
            })?;
        let field = &self.bytes[self.at..end];
        self.at = end;
        Ok(field)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;
    use crate::tables::{Row, RunPair};

    #[test]
    fn entries_read_back_as_written_fixed_and_variable_alike() {
        let mut redo = Vec::new();
        record::<RunPair, Row>(&mut redo, 3, &(7, 9), Some(&&b"row bytes"[..])).unwrap();
        record::<u128, ()>(&mut redo, 5, &11, None).unwrap();
        record::<(u128, &str), Row>(&mut redo, 6, &(1, "key"), Some(&&b""[..])).unwrap();
        let mut entries = Entries::new(&redo);
        assert_eq!(entries.next_tag(), Some((3, false)));
        assert_eq!(
            RunPair::from_bytes(entries.field::<RunPair>().unwrap()),
            (7, 9)
        );
        assert_eq!(entries.field::<Row>().unwrap(), b"row bytes");
        // A fixed-width key has no length, a row has one: tag, key, length, value.
        assert_eq!(entries.at, 1 + 32 + 4 + 9);
        assert_eq!(entries.next_tag(), Some((5, true)));
        assert_eq!(u128::from_bytes(entries.field::<u128>().unwrap()), 11);
        assert_eq!(entries.next_tag(), Some((6, false)));
        assert_eq!(
            <(u128, &str)>::from_bytes(entries.field::<(u128, &str)>().unwrap()),
            (1, "key")
        );
        assert_eq!(entries.field::<Row>().unwrap(), b"");
        assert_eq!(entries.next_tag(), None);
    }

    #[test]
    fn a_record_cut_short_is_an_error_not_a_panic() {
        let mut redo = Vec::new();
        record::<RunPair, Row>(&mut redo, 3, &(7, 9), Some(&&b"row bytes"[..])).unwrap();
        for cut in 1..redo.len() {
            let mut entries = Entries::new(&redo[..cut]);
            entries.next_tag().unwrap();
            let read = entries
                .field::<RunPair>()
                .and_then(|_| entries.field::<Row>());
            assert!(
                matches!(read, Err(RedoError::Truncated { .. })),
                "cut at {cut}: {read:?}"
            );
        }
    }
}
