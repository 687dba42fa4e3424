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
pub const SCHEMA_VERSION: u8 = 1;

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

/// Encodes a value as `[SCHEMA_VERSION] ++ bincode(value)`.
///
/// # Errors
/// [`EncodeError`] if bincode refuses the value.
pub fn encode<T: Serialize>(table: &'static str, value: &T) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    out.push(SCHEMA_VERSION);
    bincode::serde::encode_into_std_write(value, &mut out, config()).map_err(|e| EncodeError {
        table,
        reason: e.to_string(),
    })?;
    Ok(out)
}

/// Decodes a row written by [`encode`] in this or an older known schema version.
///
/// # Errors
/// [`DecodeError::SchemaFromFuture`] for a newer version byte, [`DecodeError::Corrupt`] for anything
/// that does not decode exactly (including trailing bytes).
pub fn decode<T: DeserializeOwned>(
    table: &'static str,
    key: &dyn fmt::Display,
    bytes: &[u8],
) -> Result<T, DecodeError> {
    let corrupt = |reason: String| DecodeError::Corrupt {
        table,
        key: key.to_string(),
        reason,
    };
    let Some((&version, body)) = bytes.split_first() else {
        return Err(corrupt("empty row (no schema version byte)".to_string()));
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
        return Err(corrupt(format!("unknown schema version {version}")));
    }
    // Only version 1 exists so far; an older version would be decoded here through its frozen type.
    let (value, read) = bincode::serde::decode_from_slice::<T, _>(body, config())
        .map_err(|e| corrupt(e.to_string()))?;
    if read != body.len() {
        return Err(corrupt(format!(
            "{} trailing bytes after the value",
            body.len() - read
        )));
    }
    Ok(value)
}
