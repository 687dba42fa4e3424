//! The store a node runs on, and how to open it again: redb refuses every read and write of a
//! database handle after one write failed (a full disk, a failed sync), until the handle is dropped
//! and the file opened again. [`NodeStore`] does that the next time the store is used, so a retry
//! after a failed commit is a real retry rather than a certain `NeedsReopen`.

use crate::host::HostError;
use keel_store::{OpenError, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

/// Opens the node's store again (the same file or backend, the same configuration).
pub type StoreOpener = Box<dyn Fn() -> Result<Store, OpenError> + Send + Sync>;

/// How long a reopen waits for the other holders of the failed handle (a read in flight) to let
/// go, in polls of [`REOPEN_POLL`]: a store file stays locked while any handle of it lives.
const REOPEN_POLLS_MAX: u32 = 500;
/// See [`REOPEN_POLLS_MAX`].
const REOPEN_POLL: Duration = Duration::from_millis(10);

/// The store a runtime runs on: the open handle, and (when the embedding host gave one) how to
/// open it again after a failed write. Built from an `Arc<Store>` (never reopened: after a failed
/// write every later commit fails until the host starts a new runtime) or with
/// [`NodeStore::reopenable`].
pub struct NodeStore {
    /// The open handle; `None` only while a reopen failed (the next use tries again).
    current: RwLock<Option<Arc<Store>>>,
    opener: Option<StoreOpener>,
    /// A write failed on the current handle: redb refuses it from now on.
    poisoned: AtomicBool,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore")
            .field("reopenable", &self.opener.is_some())
            .field("poisoned", &self.poisoned.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl From<Arc<Store>> for NodeStore {
    fn from(store: Arc<Store>) -> Self {
        Self {
            current: RwLock::new(Some(store)),
            opener: None,
            poisoned: AtomicBool::new(false),
        }
    }
}

impl NodeStore {
    /// `store`, opened again with `opener` after a write fails on it. The runtime must then hold
    /// the only handle: a clone of the `Arc` kept elsewhere keeps a store file locked, and the
    /// reopen gives up after a bounded wait (the store stays unusable until it succeeds).
    pub fn reopenable(
        store: Arc<Store>,
        opener: impl Fn() -> Result<Store, OpenError> + Send + Sync + 'static,
    ) -> Self {
        Self {
            current: RwLock::new(Some(store)),
            opener: Some(Box::new(opener)),
            poisoned: AtomicBool::new(false),
        }
    }

    /// The store to use now, opened again first if a write failed on the current handle. Blocks
    /// (bounded) while a reopen waits for other holders: call it off the async threads.
    ///
    /// # Errors
    /// [`HostError::Open`] if opening again failed, [`HostError::Closed`] if the failed handle is
    /// still held elsewhere or no reopen succeeded yet.
    pub(crate) fn get(&self) -> Result<Arc<Store>, HostError> {
        if !self.poisoned.load(Ordering::Acquire) || self.opener.is_none() {
            return self.current();
        }
        let mut slot = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if !self.poisoned.load(Ordering::Acquire) {
            // Another thread opened it again meanwhile.
            return slot.clone().ok_or_else(closed);
        }
        if let Some(mut old) = slot.take() {
            let mut polls = 0;
            loop {
                match Arc::try_unwrap(old) {
                    Ok(store) => {
                        drop(store);
                        break;
                    }
                    Err(held) if polls < REOPEN_POLLS_MAX => {
                        old = held;
                        polls += 1;
                        std::thread::sleep(REOPEN_POLL);
                    }
                    Err(held) => {
                        *slot = Some(held);
                        return Err(HostError::Closed(
                            "the failed store handle is still held elsewhere".into(),
                        ));
                    }
                }
            }
        }
        let Some(opener) = &self.opener else {
            return Err(closed());
        };
        let store = Arc::new(opener()?);
        *slot = Some(Arc::clone(&store));
        self.poisoned.store(false, Ordering::Release);
        tracing::info!("store opened again after a failed write");
        Ok(store)
    }

    /// The current handle, whatever its state (for reads that report errors themselves).
    ///
    /// # Errors
    /// [`HostError::Closed`] while a reopen has not succeeded.
    pub(crate) fn current(&self) -> Result<Arc<Store>, HostError> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(closed)
    }

    /// A write failed on the current handle: open it again on its next use.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }
}

fn closed() -> HostError {
    HostError::Closed("a write failed and the store has not been opened again".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::{CommitBatch, CommitId, PersistOp, Stage, StageOwner};
    use keel_store::{Run, RunId, RunStatus, SimDisk, StoreConfig};

    fn run_row(id: u128) -> Run {
        Run {
            id: RunId(id),
            brief: "b".into(),
            plan: None,
            status: RunStatus::Running,
            budget: keel_store::Budget::default(),
            created_ms: 1,
            updated_ms: 1,
            config_snapshot: String::new(),
            outcome: None,
        }
    }

    fn create(id: u128) -> CommitBatch {
        CommitBatch {
            id: CommitId(1),
            stages: vec![Stage {
                run: RunId(id),
                owner: StageOwner::Host,
                ticket: 0,
                ops: vec![PersistOp::CreateRun(run_row(id))].into(),
            }]
            .into(),
        }
    }

    #[test]
    fn a_store_poisoned_by_a_full_disk_is_opened_again_on_its_next_use() {
        let disk = SimDisk::new();
        let store = Store::open_backend(disk.clone(), StoreConfig::default()).unwrap();
        let again = disk.clone();
        let node = NodeStore::reopenable(Arc::new(store), move || {
            Store::open_backend(again.clone(), StoreConfig::default())
        });
        crate::host::store::commit(&node.get().unwrap(), &create(1)).unwrap();
        disk.set_write_budget(Some(0));
        let full = crate::host::store::commit(&node.get().unwrap(), &create(2));
        assert!(
            matches!(
                full,
                Err(HostError::Commit(keel_store::CommitError::DiskFull(_)))
            ),
            "{full:?}"
        );
        disk.set_write_budget(None);
        // Without a reopen, redb refuses the handle for good.
        let refused = crate::host::store::commit(&node.get().unwrap(), &create(2));
        assert!(
            matches!(
                refused,
                Err(HostError::Commit(keel_store::CommitError::NeedsReopen))
            ),
            "{refused:?}"
        );
        node.poison();
        let store = node.get().unwrap();
        crate::host::store::commit(&store, &create(2)).unwrap();
        assert_eq!(store.run(RunId(1)).get().unwrap().brief, "b");
        assert_eq!(store.run(RunId(2)).get().unwrap().id, RunId(2));
    }
}
