//! What a read of the store sees: a redb read transaction, or the journal's open write transaction.
//!
//! A journaled store keeps one redb write transaction open from commit to commit (see
//! `journal.rs`); the commits it holds are acknowledged but not yet in redb's committed state. A
//! read in the process used to commit that transaction first (a non-durable redb commit, which
//! copies every page it touches), so every read between two commits cost a commit: in the
//! simulator, whose checker reads after most steps, a tenth of all the work. A read now reads the
//! open transaction itself, under the journal's lock, and the transaction stays open. The read
//! helpers take a [`Snapshot`] and open tables as [`View`]s, so one helper serves both.

use std::borrow::Borrow;
use std::ops::RangeBounds;

use redb::{
    AccessGuard, Key, Range, ReadOnlyTable, ReadTransaction, ReadableTable, ReadableTableMetadata,
    StorageError, Table, TableDefinition, TableError, Value, WriteTransaction,
};

/// The state a read sees: every commit acknowledged before it began.
pub(crate) enum Snapshot<'s> {
    /// A redb read transaction: the committed state holds every acknowledged commit.
    Committed(ReadTransaction),
    /// The journal's open write transaction, which holds the acknowledged commits redb's committed
    /// state does not have yet. Read only: nothing here writes to it.
    Open(&'s WriteTransaction),
}

impl Snapshot<'_> {
    /// Opens a table to read. Every table exists in a store opened for writing (its open creates
    /// them all), so opening one in the open transaction creates nothing; a store opened read-only
    /// reads a read transaction, where a table an older format lacks is `TableDoesNotExist`.
    pub(crate) fn open_table<K: Key + 'static, V: Value + 'static>(
        &self,
        definition: TableDefinition<'_, K, V>,
    ) -> Result<View<'_, K, V>, TableError> {
        match self {
            Self::Committed(txn) => txn.open_table(definition).map(View::Committed),
            Self::Open(txn) => txn.open_table(definition).map(View::Open),
        }
    }
}

/// A table opened by a read, in either kind of [`Snapshot`]. redb's `ReadableTable` is sealed, so
/// the reads the store makes are forwarded here by hand.
pub(crate) enum View<'s, K: Key + 'static, V: Value + 'static> {
    /// A table of a read transaction.
    Committed(ReadOnlyTable<K, V>),
    /// A table of the open write transaction, only read.
    Open(Table<'s, K, V>),
}

impl<K: Key + 'static, V: Value + 'static> View<'_, K, V> {
    /// The value under `key`, if any.
    pub(crate) fn get<'a>(
        &self,
        key: impl Borrow<K::SelfType<'a>>,
    ) -> Result<Option<AccessGuard<'_, V>>, StorageError> {
        match self {
            Self::Committed(t) => t.get(key),
            Self::Open(t) => t.get(key),
        }
    }

    /// The rows in `range`, in key order (and back).
    pub(crate) fn range<'a, KR>(
        &self,
        range: impl RangeBounds<KR> + 'a,
    ) -> Result<Range<'_, K, V>, StorageError>
    where
        KR: Borrow<K::SelfType<'a>> + 'a,
    {
        match self {
            Self::Committed(t) => t.range(range),
            Self::Open(t) => t.range(range),
        }
    }

    /// Every row, in key order (and back).
    pub(crate) fn iter(&self) -> Result<Range<'_, K, V>, StorageError> {
        match self {
            Self::Committed(t) => t.iter(),
            Self::Open(t) => t.iter(),
        }
    }

    /// How many rows the table holds (kept by redb, not counted).
    pub(crate) fn len(&self) -> Result<u64, StorageError> {
        match self {
            Self::Committed(t) => t.len(),
            Self::Open(t) => t.len(),
        }
    }
}
