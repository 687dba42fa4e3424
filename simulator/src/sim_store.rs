//! The coordinator node's store on its simulated disk: opening a real keel-store over a [`SimDisk`]
//! and crashing that disk. Executing the machines' effects on it (commits, recovery reads, context
//! rows) is the shared host code of keel-actors, [`keel_actors::host::store`], the same the ractor
//! runtime calls.

use keel_actors::host::HostError;
use keel_store::{SimDisk, Store, StoreConfig};

/// The coordinator node's store on its simulated disks: the store file's and its journal's (the
/// store is opened as `keel serve` opens it, alone and with its journal, so a crash exercises the
/// journal's replay as well as redb's recovery). Dropping it turns its disks' power off (every
/// write refused, see `power_off`): a clone of [`SimStore::disk`] kept past the drop sees a full disk.
#[derive(Debug)]
pub struct SimStore {
    disk: SimDisk,
    journal: SimDisk,
    store: Store,
}

impl SimStore {
    /// A fresh store on an empty disk.
    ///
    /// # Errors
    /// [`HostError::Open`] if redb cannot initialise the disk.
    pub fn new() -> Result<Self, HostError> {
        let disk = SimDisk::new();
        let journal = SimDisk::new();
        let store =
            Store::open_backend_journaled(disk.clone(), journal.clone(), StoreConfig::default())?;
        Ok(Self {
            disk,
            journal,
            store,
        })
    }

    /// The store, for the host code and the checker's reads.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store file's disk, to arm faults.
    pub fn disk(&self) -> &SimDisk {
        &self.disk
    }

    /// The journal's disk, to arm faults.
    pub fn journal_disk(&self) -> &SimDisk {
        &self.journal
    }

    /// The machine lost power: reopen from what was synced. Unsynced writes are gone.
    ///
    /// # Errors
    /// [`HostError::Open`] if the synced image does not open (a durability bug).
    pub fn crash_and_reopen(&mut self) -> Result<(), HostError> {
        let disk = self.disk.crash();
        let journal = self.journal.crash();
        let store =
            Store::open_backend_journaled(disk.clone(), journal.clone(), StoreConfig::default())?;
        // The crashed store is dropped here, and it closes as it is dropped: its disks have lost
        // power first, so the close writes nothing to disks nobody reads again.
        self.power_off();
        self.disk = disk;
        self.journal = journal;
        self.store = store;
        Ok(())
    }

    /// Every write to the current disks fails from now on (a full disk, as the store sees it), as
    /// after a power loss. redb's close, run when the store is dropped, then stops at its first
    /// write instead of writing and syncing a last commit: the closes of stores whose disks are
    /// never read again were 3% of a sweep's instructions, and this saves about a third of it.
    fn power_off(&self) {
        self.disk.set_capacity(Some(0));
        self.journal.set_capacity(Some(0));
    }
}

/// A world ends as a crash does: the store is dropped with its disks' power off, since nothing
/// reads them again (the world's report is already made).
impl Drop for SimStore {
    fn drop(&mut self) {
        self.power_off();
    }
}
