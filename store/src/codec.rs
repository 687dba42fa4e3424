//! The one place rows become bytes: serde + bincode 2 (standard config), behind one schema version byte.
//!
//! Why a version byte: an upgraded keel must read rows an older keel wrote, and an older keel must
//! refuse (not misread) rows a newer one wrote. The byte says which schema the rest was written with.
//!
//! # Upgrading the schema
//! When a record type changes shape, bump [`SCHEMA_VERSION`], copy the old shape into a frozen module
//! (`v1::Task`, ...) and decode older versions through it with a conversion into the current type in
//! [`decode`]. The fixtures under `tests/fixtures/v1/` hold bytes of every record type as version 1
//! wrote them; `tests/codec.rs` decodes them forever, so a change that breaks old rows fails CI.

use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt;

/// The schema version this build writes. Rows with a larger version are refused with
/// [`DecodeError::SchemaFromFuture`]; rows with this or an older known version decode.
///
/// History: 1, the first; 2, a session log row records what the scrubber removed from it
/// (`SessionLogRow::redactions`); 3, an escalation has an id, options, what waits for it and its
/// resolution (`Escalation::{id, options, waiting, resolution}`). Every other record type is laid
/// out as in version 1.
pub const SCHEMA_VERSION: u8 = 3;

/// The oldest schema version this build still decodes.
pub const SCHEMA_VERSION_MIN: u8 = 1;

fn config() -> bincode::config::Configuration {
    bincode::config::standard()
}

/// A row could not be turned back into a value. Names the table and the key so an operator can find
/// the row; nothing else in the store is affected by one bad row.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The row was written by a newer keel (a schema version this build does not know). Upgrade keel
    /// to read it; this build never guesses at a newer layout.
    #[error(
        "row {key} in table {table} has schema version {version}, newer than this build's {supported}: upgrade keel"
    )]
    SchemaFromFuture {
        /// The table holding the row.
        table: &'static str,
        /// The row's key, as text.
        key: String,
        /// The version byte found.
        version: u8,
        /// The newest version this build reads.
        supported: u8,
    },
    /// The row's bytes are not a valid encoding of its type (truncated, garbled, empty, trailing bytes,
    /// or an unknown old version).
    #[error("row {key} in table {table} is corrupt: {reason}")]
    Corrupt {
        /// The table holding the row.
        table: &'static str,
        /// The row's key, as text.
        key: String,
        /// What was wrong with it.
        reason: String,
    },
}

/// A value could not be encoded. Cannot happen for the store's own record types (they have no maps
/// with non-string keys or unsized sequences), but is typed rather than panicking.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("could not encode a row for table {table}: {reason}")]
pub struct EncodeError {
    /// The table the row was for.
    pub table: &'static str,
    /// What bincode reported.
    pub reason: String,
}

/// A type the store keeps as rows. Its [`Record::decode_older`] reads a body written by an older
/// schema version: by default the layout has not changed since version 1, so the body decodes as it
/// is; a type whose layout changed decodes its frozen old shape and converts it.
pub trait Record: Serialize + DeserializeOwned {
    /// Decodes `body`, written with schema `version` (`SCHEMA_VERSION_MIN..SCHEMA_VERSION`), into
    /// the current type; answers the value and how many bytes it read.
    ///
    /// # Errors
    /// What bincode reported, as text.
    fn decode_older(version: u8, body: &[u8]) -> Result<(Self, usize), String> {
        let _ = version;
        decode_body(body)
    }
}

fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<(T, usize), String> {
    bincode::serde::decode_from_slice::<T, _>(body, config()).map_err(|e| e.to_string())
}

/// The frozen shapes of schema version 1 whose layout has changed since.
mod v1 {
    use crate::model::{LogKind, UnixMillis};
    use serde::Deserialize;

    /// An escalation as versions 1 and 2 wrote it (no id: nothing could answer it).
    #[derive(Deserialize)]
    pub(super) struct Escalation {
        pub(super) ts_ms: UnixMillis,
        pub(super) task_id: Option<crate::model::TaskId>,
        pub(super) trigger: crate::model::EscalationTrigger,
        pub(super) account: String,
        pub(super) asked: String,
        pub(super) attempted: String,
        pub(super) diagnosis: String,
        pub(super) amount_micros: Option<u64>,
        pub(super) recommended_action: String,
    }

    /// A session log row as version 1 wrote it (no redaction counts: nothing was scrubbed at ingest).
    #[derive(Deserialize)]
    pub(super) struct SessionLogRow {
        pub(super) ts_ms: UnixMillis,
        pub(super) kind: LogKind,
        pub(super) summary: String,
        pub(super) detail: String,
    }
}

impl Record for crate::model::SessionLogRow {
    fn decode_older(version: u8, body: &[u8]) -> Result<(Self, usize), String> {
        // Version 2 is laid out as version 3; only version 1 is older than the current layout.
        if version >= 2 {
            return decode_body(body);
        }
        let (old, read) = decode_body::<v1::SessionLogRow>(body)?;
        let row = Self {
            ts_ms: old.ts_ms,
            kind: old.kind,
            summary: old.summary,
            detail: old.detail,
            redactions: Vec::new(),
        };
        Ok((row, read))
    }
}

impl Record for crate::model::Escalation {
    fn decode_older(version: u8, body: &[u8]) -> Result<(Self, usize), String> {
        // Versions 1 and 2 wrote the same layout. Such a row waited for nothing and has no id (id 0):
        // it is shown, never answered.
        let _ = version;
        let (old, read) = decode_body::<v1::Escalation>(body)?;
        let row = Self {
            id: crate::model::EscalationId(0),
            ts_ms: old.ts_ms,
            task_id: old.task_id,
            trigger: old.trigger,
            account: old.account,
            asked: old.asked,
            attempted: old.attempted,
            diagnosis: old.diagnosis,
            amount_micros: old.amount_micros,
            recommended_action: old.recommended_action,
            options: Vec::new(),
            waiting: crate::model::EscalationWait::Nothing,
            resolution: None,
        };
        Ok((row, read))
    }
}

/// A list of records (the fixtures keep some this way): an older body is the list's length, then
/// each element in its own older layout.
impl<T: Record> Record for Vec<T> {
    fn decode_older(version: u8, body: &[u8]) -> Result<(Self, usize), String> {
        let (len, mut read) = decode_body::<u64>(body)?;
        let mut items = Vec::new();
        for _ in 0..len {
            let rest = body.get(read..).ok_or("the list runs past the row")?;
            let (item, n) = T::decode_older(version, rest)?;
            items.push(item);
            read += n;
        }
        Ok((items, read))
    }
}

/// Record types whose layout is the same in every schema version.
macro_rules! unchanged_since_v1 {
    ($($t:ty),* $(,)?) => { $(impl Record for $t {})* };
}
unchanged_since_v1!(
    crate::model::Run,
    crate::model::Task,
    crate::model::Checkpoint,
    crate::model::ManifestEntry,
    crate::model::DeadLetter,
    crate::model::IdempotencyRecord,
    crate::model::AuditEntry,
    crate::model::AgentProfile,
    crate::model::GateMark,
);

/// Encodes a value as `[SCHEMA_VERSION] ++ bincode(value)`.
///
/// # Errors
/// [`EncodeError`] if bincode refuses the value.
pub fn encode<T: Serialize>(table: &'static str, value: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    encode_into(table, value, &mut out)?;
    Ok(out)
}

/// [`encode`] into `buf` (its old contents dropped), answering the row: the store's writer encodes
/// every row of a commit into one buffer, so a row costs no allocation (and no regrowth) of its own.
///
/// # Errors
/// As [`encode`].
pub(crate) fn encode_into<'b, T: Serialize>(
    table: &'static str,
    value: &T,
    buf: &'b mut Vec<u8>,
) -> Result<&'b [u8], EncodeError> {
    buf.clear();
    buf.push(SCHEMA_VERSION);
    append_body(table, value, buf)?;
    Ok(buf.as_slice())
}

/// Appends the encoding of `value` to `buf` without a version byte: a row of a session-log segment,
/// whose one version byte leads the segment.
///
/// # Errors
/// As [`encode`].
pub(crate) fn append_body<T: Serialize>(
    table: &'static str,
    value: &T,
    buf: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    bincode::serde::encode_into_std_write(value, buf, config()).map_err(|e| EncodeError {
        table,
        reason: e.to_string(),
    })?;
    Ok(())
}

/// Decodes a row written by [`encode`] in this or an older known schema version (an older one
/// through [`Record::decode_older`]).
///
/// # Errors
/// [`DecodeError::SchemaFromFuture`] for a newer version byte, [`DecodeError::Corrupt`] for anything
/// that does not decode exactly (including trailing bytes).
pub fn decode<T: Record>(
    table: &'static str,
    key: &dyn fmt::Display,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    let corrupt = |reason: String| DecodeError::Corrupt {
        table,
        key: key.to_string(),
        reason,
    };
    let (version, body) = versioned(table, key, bytes)?;
    let (value, read) = if version == SCHEMA_VERSION {
        decode_body::<T>(body)
    } else {
        T::decode_older(version, body)
    }
    .map_err(corrupt)?;
    if read != body.len() {
        return Err(corrupt(format!(
            "{} trailing bytes after the value",
            body.len() - read
        )));
    }
    Ok(value)
}

/// A row's schema version and body, the version checked: one this build writes or still reads.
fn versioned<'b>(
    table: &'static str,
    key: &dyn fmt::Display,
    bytes: &'b [u8],
) -> Result<(u8, &'b [u8]), DecodeError> {
    let Some((&version, body)) = bytes.split_first() else {
        return Err(DecodeError::Corrupt {
            table,
            key: key.to_string(),
            reason: "empty row (no schema version byte)".to_string(),
        });
    };
    if version > SCHEMA_VERSION {
        return Err(DecodeError::SchemaFromFuture {
            table,
            key: key.to_string(),
            version,
            supported: SCHEMA_VERSION,
        });
    }
    if version < SCHEMA_VERSION_MIN {
        return Err(DecodeError::Corrupt {
            table,
            key: key.to_string(),
            reason: format!("unknown schema version {version}"),
        });
    }
    Ok((version, body))
}

/// Decodes the leading fields of a row as `T` (a struct of the first fields of the row's type, in
/// order) and ignores the rest: what a write checks in a stored row without decoding all of it
/// (a task's parent before its update). Only for a prefix whose layout every schema version from
/// [`SCHEMA_VERSION_MIN`] shares; the row's version is checked as [`decode`] checks it.
///
/// # Errors
/// [`DecodeError`] as [`decode`], except that trailing bytes are expected.
pub(crate) fn decode_prefix<T: DeserializeOwned>(
    table: &'static str,
    key: &dyn fmt::Display,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    let (_, body) = versioned(table, key, bytes)?;
    let corrupt = |reason: String| DecodeError::Corrupt {
        table,
        key: key.to_string(),
        reason,
    };
    decode_body::<T>(body)
        .map(|(value, _)| value)
        .map_err(corrupt)
}
