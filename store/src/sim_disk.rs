//! An in-memory redb [`StorageBackend`] that can crash and fail like a disk, for the simulator and the
//! crash tests.
//!
//! It models a page cache in front of a disk: every write lands in a volatile image (what reads see);
//! `sync_data` copies the volatile image to the durable image. [`SimDisk::crash`] returns a new disk
//! holding only the durable image, as a machine would find its disk after losing power. Faults:
//! a capacity (writes that would grow the file past it fail with `StorageFull`), a write budget
//! (writes fail once a number of bytes has been written), failing syncs, and a power loss scheduled
//! at any backend operation (so a crash can land in the middle of a commit).
//!
//! What it does not model: torn writes (a write that half reaches the disk) and writes that reach the
//! disk without a sync (a crash image is exactly the last synced state). redb's own crash test goes
//! further for the header page; keel relies on redb for that and tests its own contract: committed
//! `Immediate` survives, the rest leaves no trace.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::StorageBackend;

#[derive(Debug, Default)]
struct DiskState {
    /// What reads see: the page cache over the disk.
    volatile: Vec<u8>,
    /// What survives a crash: the image at the last successful sync.
    durable: Vec<u8>,
    /// Writes or growth past this length fail with `StorageFull`.
    capacity: Option<u64>,
    /// Bytes that may still be written before writes fail with `StorageFull`.
    write_budget: Option<u64>,
    /// How many of the next syncs fail.
    syncs_to_fail: u32,
    /// Successful syncs so far.
    syncs: u64,
    /// Backend operations (writes, resizes, syncs) so far.
    ops: u64,
    /// Power is lost when `ops` reaches this: from then on nothing more becomes durable.
    power_loss_at_op: Option<u64>,
}

impl DiskState {
    /// Counts one operation; returns whether power is already lost (the durable image is frozen).
    fn tick(&mut self) -> bool {
        self.ops += 1;
        self.power_lost()
    }

    fn power_lost(&self) -> bool {
        self.power_loss_at_op.is_some_and(|at| self.ops >= at)
    }
}

/// A shareable simulated disk: clones share one state, so the simulator can keep a handle, give a
/// clone to [`crate::Store::open_backend`], and later [`SimDisk::crash`] it while the store owns it.
#[derive(Clone, Debug, Default)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

fn full() -> io::Error {
    io::Error::new(io::ErrorKind::StorageFull, "simulated disk is full")
}

fn to_usize(v: u64) -> io::Result<usize> {
    usize::try_from(v).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))
}

impl SimDisk {
    /// An empty disk with no faults.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        // A panic while holding the lock leaves plain bytes behind, still meaningful to read.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The disk as it would be found after a power loss now: only what was synced. The returned disk
    /// is independent of this one (and has no faults set); whatever still holds this one (a store
    /// that "crashed") may go on writing to it without affecting the crashed image.
    pub fn crash(&self) -> SimDisk {
        let durable = self.lock().durable.clone();
        SimDisk {
            state: Arc::new(Mutex::new(DiskState {
                volatile: durable.clone(),
                durable,
                ..DiskState::default()
            })),
        }
    }

    /// Limits the file's length: a write or resize past `capacity` bytes fails with `StorageFull`
    /// (a full disk). `None` removes the limit.
    pub fn set_capacity(&self, capacity: Option<u64>) {
        self.lock().capacity = capacity;
    }

    /// Lets only `budget` more bytes be written; after that every write fails with `StorageFull`.
    /// `None` removes the budget.
    pub fn set_write_budget(&self, budget: Option<u64>) {
        self.lock().write_budget = budget;
    }

    /// Makes the next `count` syncs fail with an IO error (the durable image is then not updated).
    pub fn fail_next_syncs(&self, count: u32) {
        self.lock().syncs_to_fail = count;
    }

    /// Schedules a power loss `ops_from_now` backend operations (writes, resizes, syncs) from now:
    /// from that operation on, syncs still return `Ok` (the process does not know) but nothing more
    /// becomes durable. [`SimDisk::crash`] then shows the disk as the power loss left it, which may
    /// be in the middle of a commit. `None` cancels it.
    pub fn schedule_power_loss(&self, ops_from_now: Option<u64>) {
        let mut s = self.lock();
        s.power_loss_at_op = ops_from_now.map(|n| s.ops.saturating_add(n));
    }

    /// Whether a scheduled power loss has happened.
    pub fn power_lost(&self) -> bool {
        self.lock().power_lost()
    }

    /// Backend operations so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Successful syncs so far, so a test can see that a group commit cost one sync, not N.
    pub fn syncs(&self) -> u64 {
        self.lock().syncs
    }

    /// The length of the volatile image (what the database sees as its file size).
    pub fn len_bytes(&self) -> u64 {
        u64::try_from(self.lock().volatile.len()).unwrap_or(u64::MAX)
    }

    /// Whether the volatile image differs from the durable one (unsynced writes are pending).
    pub fn has_unsynced_writes(&self) -> bool {
        let s = self.lock();
        s.volatile != s.durable
    }
}

impl StorageBackend for SimDisk {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.len_bytes())
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let s = self.lock();
        let start = to_usize(offset)?;
        let end = start
            .checked_add(out.len())
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        let src = s
            .volatile
            .get(start..end)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut s = self.lock();
        s.tick();
        if let Some(cap) = s.capacity
            && len > cap
        {
            return Err(full());
        }
        let len = to_usize(len)?;
        s.volatile.resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut guard = self.lock();
        let s = &mut *guard;
        let lost = s.tick();
        if s.syncs_to_fail > 0 {
            s.syncs_to_fail -= 1;
            return Err(io::Error::other("simulated sync failure"));
        }
        if !lost {
            s.durable.clone_from(&s.volatile);
        }
        s.syncs += 1;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut s = self.lock();
        s.tick();
        let data_len = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let end = offset
            .checked_add(data_len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset overflow"))?;
        if let Some(cap) = s.capacity
            && end > cap
        {
            return Err(full());
        }
        if let Some(budget) = s.write_budget {
            if data_len > budget {
                s.write_budget = Some(0);
                return Err(full());
            }
            s.write_budget = Some(budget - data_len);
        }
        let start = to_usize(offset)?;
        let end = to_usize(end)?;
        if end > s.volatile.len() {
            s.volatile.resize(end, 0);
        }
        s.volatile[start..end].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_keeps_only_synced_bytes() {
        let disk = SimDisk::new();
        disk.write(0, b"synced").unwrap();
        disk.sync_data().unwrap();
        disk.write(0, b"SYNCED, then more").unwrap();
        let crashed = disk.crash();
        assert_eq!(crashed.len().unwrap(), 6);
        let mut out = [0u8; 6];
        crashed.read(0, &mut out).unwrap();
        assert_eq!(&out, b"synced");
        // The original keeps its volatile bytes; the crashed image is independent of it.
        assert_eq!(disk.len().unwrap(), 17);
        disk.sync_data().unwrap();
        assert_eq!(crashed.len().unwrap(), 6);
    }

    #[test]
    fn capacity_and_write_budget_fail_with_storage_full() {
        let disk = SimDisk::new();
        disk.set_capacity(Some(8));
        assert!(disk.write(0, b"12345678").is_ok());
        let err = disk.write(4, b"56789").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert_eq!(
            disk.set_len(9).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
        disk.set_capacity(None);
        disk.set_write_budget(Some(3));
        assert!(disk.write(0, b"abc").is_ok());
        assert_eq!(
            disk.write(0, b"d").unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
    }

    #[test]
    fn failed_syncs_and_power_loss_make_nothing_durable() {
        let disk = SimDisk::new();
        disk.write(0, b"a").unwrap();
        disk.fail_next_syncs(1);
        assert!(disk.sync_data().is_err());
        assert_eq!(disk.crash().len().unwrap(), 0);
        disk.sync_data().unwrap();
        assert_eq!(disk.crash().len().unwrap(), 1);
        disk.schedule_power_loss(Some(1));
        disk.write(1, b"b").unwrap(); // the op at which power is lost
        assert!(disk.power_lost());
        disk.sync_data().unwrap(); // returns Ok, but nothing becomes durable
        assert_eq!(disk.crash().len().unwrap(), 1);
    }
}
