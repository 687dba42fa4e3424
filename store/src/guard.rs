//! The store's boundary against a damaged file. redb trusts the pages it reads: on a page that does
//! not decode it mostly returns `StorageError::Corrupted`, but in some places it panics
//! (`unreachable!()` in its B-tree cursor, for one), so a corrupted store file made `keel tasks`
//! exit 101 with a stack trace. Every public operation of [`crate::Store`], [`crate::Catalog`] and
//! [`crate::RunScope`] that reaches redb runs inside [`guarded`], which turns such a panic, and any
//! `Corrupted` error redb returns, into one typed error naming the file: [`Corruption`].
//!
//! # Unwind safety
//! `catch_unwind` needs the closure to be unwind safe; it is asserted, not proven. What a panic can
//! leave half-done is redb's in-memory state for the transaction that panicked, which is dropped
//! while unwinding and never committed: a write transaction that panics is not durable, and redb's
//! commit protocol keeps the file as it was at the last commit. A lock poisoned by the panic makes
//! later operations fail with an error (`LockPoisoned`), not with wrong data. So after a
//! [`Corruption`] the store answers errors, never rows from a half-applied change. The panic's
//! message still reaches the process's panic hook; a program that reports [`Corruption`] itself
//! can keep redb's panics off stderr with [`is_storage_panic`].

use std::panic::{AssertUnwindSafe, PanicHookInfo, catch_unwind};
use std::path::PathBuf;

/// A store file whose pages do not read back as redb wrote them: damaged on disk, or altered by
/// something other than redb. Named by file so the operator knows which one to check or restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the store {} is corrupt: {detail}", where_(.file))]
pub struct Corruption {
    /// The store file; `None` for a store on a custom storage backend (the simulator's disk).
    pub file: Option<PathBuf>,
    /// What redb reported: its `Corrupted` message, or the message of the panic it raised.
    pub detail: String,
}

fn where_(file: &Option<PathBuf>) -> String {
    match file {
        Some(path) => format!("file {}", path.display()),
        None => "on its storage backend".to_string(),
    }
}

/// An error that can carry a [`Corruption`], and can say whether it already wraps redb's
/// `Corrupted` (so [`guarded`] names the file there too).
pub(crate) trait CarriesCorruption: From<Corruption> {
    /// redb's `Corrupted` message, if this error is one.
    fn corrupted_detail(&self) -> Option<String>;
}

/// redb's message if `e` is `StorageError::Corrupted`.
pub(crate) fn storage_corrupted(e: &redb::StorageError) -> Option<String> {
    match e {
        redb::StorageError::Corrupted(message) => Some(message.clone()),
        _ => None,
    }
}

/// Runs `work` (one store operation that reaches redb) so that a panic inside redb, or a
/// `Corrupted` error from it, comes back as the operation's own error type holding a
/// [`Corruption`] that names `file`.
pub(crate) fn guarded<T, E: CarriesCorruption>(
    file: Option<&PathBuf>,
    work: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let corruption = |detail: String| Corruption {
        file: file.cloned(),
        detail,
    };
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => match e.corrupted_detail() {
            Some(detail) => Err(corruption(detail).into()),
            None => Err(e),
        },
        Err(payload) => {
            let detail = if let Some(text) = payload.downcast_ref::<&str>() {
                (*text).to_string()
            } else if let Some(text) = payload.downcast_ref::<String>() {
                text.clone()
            } else {
                "redb panicked while reading the file".to_string()
            };
            Err(corruption(format!("redb panicked: {detail}")).into())
        }
    }
}

/// Whether a panic was raised inside redb: [`guarded`] reports those as [`Corruption`], so a
/// program's panic hook may leave them out of stderr. Every redb call of this crate is guarded;
/// a panic inside redb outside this crate is not, and a hook that hides it hides a crash.
pub fn is_storage_panic(info: &PanicHookInfo<'_>) -> bool {
    info.location().is_some_and(|at| {
        let file = at.file();
        file.contains("/redb-") || file.contains("\\redb-")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    enum Probe {
        Corrupt(Corruption),
        Storage(String),
    }

    impl From<Corruption> for Probe {
        fn from(c: Corruption) -> Self {
            Self::Corrupt(c)
        }
    }

    impl CarriesCorruption for Probe {
        fn corrupted_detail(&self) -> Option<String> {
            match self {
                Self::Storage(detail) if detail.starts_with("corrupted") => Some(detail.clone()),
                _ => None,
            }
        }
    }

    #[test]
    fn a_panic_and_a_corrupted_error_become_a_corruption_naming_the_file() {
        let file = PathBuf::from("/tmp/keel.redb");
        let panicked: Result<(), Probe> = guarded(Some(&file), || panic!("entered unreachable"));
        let Err(Probe::Corrupt(c)) = panicked else {
            panic!("not a corruption: {panicked:?}");
        };
        assert_eq!(c.file.as_ref(), Some(&file));
        assert!(c.detail.contains("entered unreachable"), "{c}");
        assert!(c.to_string().contains("/tmp/keel.redb"), "{c}");

        let corrupted: Result<(), Probe> =
            guarded(Some(&file), || Err(Probe::Storage("corrupted page".into())));
        assert!(matches!(corrupted, Err(Probe::Corrupt(_))));

        let other: Result<(), Probe> = guarded(None, || Err(Probe::Storage("io".into())));
        assert_eq!(other, Err(Probe::Storage("io".into())));
        assert_eq!(guarded::<u8, Probe>(None, || Ok(7)), Ok(7));
    }
}
