//! The coordinator node's store on its simulated disk: opening a real keel-store over a [`SimDisk`]
//! and crashing that disk. Executing the machines' effects on it (commits, recovery reads, context
//! rows) is the shared host code of keel-actors, [`keel_actors::host::store`], the same the ractor
//! runtime calls.

use keel_actors::host::HostError;
use keel_store::{SimDisk, Store, StoreConfig};

/// The coordinator node's store on its simulated disk.
#[derive(Debug)]
pub struct SimStore {
    disk: SimDisk,
    store: Store,
}

impl SimStore {
    /// A fresh store on an empty disk.
    ///
    /// # Errors
    /// [`HostError::Open`] if redb cannot initialise the disk.
    pub fn new() -> Result<Self, HostError> {
        let disk = SimDisk::new();
        let store = Store::open_backend(disk.clone(), StoreConfig::default())?;
        Ok(Self { disk, store })
    }

    /// The store, for the host code and the checker's reads.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The disk, to arm faults.
    pub fn disk(&self) -> &SimDisk {
        &self.disk
    }

    /// The machine lost power: reopen from what was synced. Unsynced writes are gone.
    ///
    /// # Errors
    /// [`HostError::Open`] if the synced image does not open (a durability bug).
    pub fn crash_and_reopen(&mut self) -> Result<(), HostError> {
        let disk = self.disk.crash();
        let store = Store::open_backend(disk.clone(), StoreConfig::default())?;
        self.disk = disk;
        self.store = store;
        Ok(())
    }
}
