//! An in-memory redb [`StorageBackend`] that can crash and fail like a disk, for the simulator and the
//! crash tests.
//!
//! It models a page cache in front of a disk: every write lands in a volatile image (what reads see);
//! `sync_data` copies the volatile image to the durable image. [`SimDisk::crash`] returns a new disk
//! holding only the durable image, as a machine would find its disk after losing power. Faults:
//! a capacity (writes that would grow the file past it fail with `StorageFull`), a write budget
//! (writes fail once a number of bytes has been written), failing syncs, and a power loss scheduled
//! at any backend operation or at a sync (so a crash can land in the middle of a commit).
//!
//! [`SimDisk::crash_torn`] goes further: any chosen subset of the operations since the last sync
//! also reached the disk (a commit's pages in any order, the header without the data, a lost file
//! extension), which is what a real power loss can leave. What it does not model: a single write
//! torn inside itself (sectors of one write surviving apart), and reads that fail.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redb::StorageBackend;

#[derive(Debug, Default)]
struct DiskState {
    /// What reads see: the page cache over the disk.
    volatile: Image,
    /// What survives a crash: the image at the last successful sync.
    durable: Image,
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
    /// Power is lost at the sync after this many more syncs (0: the next one).
    syncs_until_power_loss: Option<u64>,
    /// Writes and resizes since the last sync that took effect, in order, for a torn crash
    /// ([`SimDisk::crash_torn`]) and for the next sync to copy; emptied once more than
    /// [`PENDING_OPS_MAX`] piled up.
    pending: Vec<Pending>,
    /// The bytes of the pending writes, end to end: one buffer reused from sync to sync rather than
    /// an allocation per write.
    pending_bytes: Vec<u8>,
    /// Set when the pending log overflowed since the last sync.
    pending_overflow: bool,
}

/// Most unsynced operations a disk remembers for [`SimDisk::crash_torn`]; past this it refuses a
/// torn crash rather than model one wrongly. redb syncs at every durable commit, so only a
/// workload with a huge durable-less stretch gets there.
pub const PENDING_OPS_MAX: usize = 1 << 16;

/// One operation that reached the page cache but not yet the disk.
#[derive(Debug, Clone)]
enum Pending {
    /// `len` bytes at `offset` of the file, held at `at` in the pending bytes.
    Write {
        offset: usize,
        at: usize,
        len: usize,
    },
    SetLen(usize),
}

/// A torn crash could not be modelled: too many unsynced operations were pending.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("more than {PENDING_OPS_MAX} unsynced operations pending: a torn crash cannot be modelled")]
pub struct TornCrashUnavailable;

impl DiskState {
    /// Logs an operation that took effect on the page cache; `false` if it is not logged (after a
    /// power loss nothing reaches anything, and after an overflow the log is abandoned until the
    /// next sync).
    fn remember(&mut self, op: Pending) -> bool {
        if self.power_lost() || self.pending_overflow {
            return false;
        }
        if self.pending.len() < PENDING_OPS_MAX {
            self.pending.push(op);
            true
        } else {
            self.pending.clear();
            self.pending_bytes.clear();
            self.pending_overflow = true;
            false
        }
    }

    fn remember_write(&mut self, offset: usize, data: &[u8]) {
        let at = self.pending_bytes.len();
        let len = data.len();
        if self.remember(Pending::Write { offset, at, len }) {
            self.pending_bytes.extend_from_slice(data);
        }
    }

    /// Counts one operation; returns whether power is already lost (the durable image is frozen).
    fn tick(&mut self) -> bool {
        self.ops += 1;
        self.power_lost()
    }

    fn power_lost(&self) -> bool {
        self.power_loss_at_op.is_some_and(|at| self.ops >= at)
    }

    /// A successful sync: the durable image becomes the volatile one. The pending log holds every
    /// operation since the last successful sync in order (the volatile image is the durable one with
    /// them applied), so replaying it copies only what changed; a sync after a huge stretch whose log
    /// overflowed copies the whole image.
    fn make_durable(&mut self) {
        if std::mem::take(&mut self.pending_overflow) {
            self.durable.clone_from(&self.volatile);
        } else {
            for op in &self.pending {
                apply(&mut self.durable, op, &self.pending_bytes);
            }
        }
        self.pending.clear();
        self.pending_bytes.clear();
    }
}

/// Whether every byte is zero, 64 bytes at a time: the journal's fill writes are 64 KiB each, and a
/// byte-by-byte scan of them was a tenth of the simulator's instructions. The bytes of a chunk are
/// OR-ed together without an early exit, which the compiler turns into a few vector instructions
/// (a 16-byte word at a time, with an exit after each, was still half of a disk write's time).
fn all_zero(data: &[u8]) -> bool {
    let (chunks, tail) = data.as_chunks::<64>();
    chunks
        .iter()
        .all(|c| c.iter().fold(0u8, |acc, b| acc | b) == 0)
        && tail.iter().all(|b| *b == 0)
}

/// Applies one pending operation to an image; `bytes` are the pending bytes it indexes into.
fn apply(image: &mut Image, op: &Pending, bytes: &[u8]) {
    match *op {
        Pending::Write { offset, at, len } => image.write(offset, &bytes[at..at + len]),
        Pending::SetLen(len) => image.resize(len),
    }
}

/// Bytes of one block of an [`Image`]: redb's page size, so a page write touches one block.
const BLOCK: usize = 4096;

/// The bytes of a file, held in blocks of [`BLOCK`] bytes, a block never written being zeros
/// with nothing allocated. The store's file and journal are written with zeros far ahead of their
/// data (a MiB of the journal at a time, more of the store file), which a flat `Vec<u8>` zeroed on
/// every growth, copied on every reallocation and again at every crash (the blocks took 12% off the
/// simulator's instructions). Blocks are shared between images (a crash's two images, a clone)
/// and copied only when one of them writes to a shared block.
#[derive(Clone, Debug, Default)]
struct Image {
    /// The file's length in bytes.
    len: usize,
    /// Block `i` holds bytes `i * BLOCK ..`; `None` is a block of zeros. Never more blocks than
    /// the length needs.
    blocks: Vec<Option<Arc<[u8; BLOCK]>>>,
}

impl Image {
    fn len(&self) -> usize {
        self.len
    }

    /// Grows the file with zeros or cuts it: bytes past a cut read as zeros if it grows again.
    fn resize(&mut self, len: usize) {
        if len < self.len {
            self.blocks.truncate(len.div_ceil(BLOCK));
            let tail = len % BLOCK;
            if tail != 0
                && let Some(Some(block)) = self.blocks.last_mut()
            {
                Arc::make_mut(block)[tail..].fill(0);
            }
        } else {
            self.blocks.resize(len.div_ceil(BLOCK), None);
        }
        self.len = len;
    }

    /// Writes `data` at `offset`, growing the file if it ends past it.
    fn write(&mut self, offset: usize, data: &[u8]) {
        let end = offset + data.len();
        if end > self.len {
            self.resize(end);
        }
        let mut at = offset;
        let mut rest = data;
        while !rest.is_empty() {
            let (index, within) = (at / BLOCK, at % BLOCK);
            let n = rest.len().min(BLOCK - within);
            let slot = &mut self.blocks[index];
            // A whole block written over zeros or over a block this image does not own alone: a
            // new block made from the bytes, rather than zeros or a copy of the shared block, then
            // overwritten (redb writes whole pages, and after a crash every block is shared with
            // the durable image).
            if n == BLOCK && slot.as_mut().is_none_or(|b| Arc::get_mut(b).is_none()) {
                *slot = Some(whole_block(&rest[..BLOCK]));
            } else {
                let block = slot.get_or_insert_with(|| Arc::new([0; BLOCK]));
                Arc::make_mut(block)[within..within + n].copy_from_slice(&rest[..n]);
            }
            at += n;
            rest = &rest[n..];
        }
    }

    /// Reads `out.len()` bytes at `offset`; `false` (nothing read) if they run past the end.
    fn read(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset
            .checked_add(out.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        let mut at = offset;
        let mut filled = 0;
        while filled < out.len() {
            let (index, within) = (at / BLOCK, at % BLOCK);
            let n = (out.len() - filled).min(BLOCK - within);
            let target = &mut out[filled..filled + n];
            match &self.blocks[index] {
                Some(block) => target.copy_from_slice(&block[within..within + n]),
                None => target.fill(0),
            }
            at += n;
            filled += n;
        }
        true
    }
}

/// A block holding `bytes` (exactly [`BLOCK`] of them), copied once into its allocation.
fn whole_block(bytes: &[u8]) -> Arc<[u8; BLOCK]> {
    let shared: Arc<[u8]> = Arc::from(bytes);
    // The callers hand exactly one block, so the conversion does not fail; the fallback (a zeroed
    // block written over) would be slower, not different.
    Arc::<[u8; BLOCK]>::try_from(shared).unwrap_or_else(|_| {
        let mut block = Arc::new([0; BLOCK]);
        let n = bytes.len().min(BLOCK);
        Arc::make_mut(&mut block)[..n].copy_from_slice(&bytes[..n]);
        block
    })
}

impl PartialEq for Image {
    /// The same bytes, whichever blocks are allocated.
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len
            && self
                .blocks
                .iter()
                .zip(&other.blocks)
                .all(|pair| match pair {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a[..] == b[..],
                    (Some(block), None) | (None, Some(block)) => all_zero(&block[..]),
                    (None, None) => true,
                })
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

    /// Like [`SimDisk::crash`], but each operation that reached the page cache since the last sync
    /// may also have reached the disk, in any subset: `survives(i)` decides for the `i`-th pending
    /// operation (a seeded random stream in the simulator). This is what a real power loss can
    /// leave: a commit's pages partly written, the header written before the data, a file extension
    /// lost. A write survives whole or not at all (no torn sectors).
    ///
    /// # Errors
    /// [`TornCrashUnavailable`] if more than [`PENDING_OPS_MAX`] operations were pending.
    pub fn crash_torn(
        &self,
        mut survives: impl FnMut(usize) -> bool,
    ) -> Result<SimDisk, TornCrashUnavailable> {
        let s = self.lock();
        if s.pending_overflow {
            return Err(TornCrashUnavailable);
        }
        let mut image = s.durable.clone();
        for (i, op) in s.pending.iter().enumerate() {
            if survives(i) {
                apply(&mut image, op, &s.pending_bytes);
            }
        }
        Ok(SimDisk {
            state: Arc::new(Mutex::new(DiskState {
                volatile: image.clone(),
                durable: image,
                ..DiskState::default()
            })),
        })
    }

    /// How many operations are pending (reached the page cache, not the disk) for a torn crash.
    pub fn pending_ops(&self) -> usize {
        self.lock().pending.len()
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

    /// Schedules a power loss at a sync: `syncs_from_now` syncs go through, and power is lost at the
    /// next one, so everything written since the previous sync (a whole commit) is pending and a
    /// [`SimDisk::crash_torn`] decides which of it reached the disk. `None` cancels it.
    pub fn schedule_power_loss_at_sync(&self, syncs_from_now: Option<u64>) {
        self.lock().syncs_until_power_loss = syncs_from_now;
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
        if s.volatile.read(to_usize(offset)?, out) {
            Ok(())
        } else {
            Err(io::Error::from(io::ErrorKind::UnexpectedEof))
        }
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
        s.volatile.resize(len);
        s.remember(Pending::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        let mut guard = self.lock();
        let s = &mut *guard;
        match s.syncs_until_power_loss {
            Some(0) => {
                s.power_loss_at_op = Some(s.ops + 1);
                s.syncs_until_power_loss = None;
            }
            Some(n) => s.syncs_until_power_loss = Some(n - 1),
            None => {}
        }
        let lost = s.tick();
        if s.syncs_to_fail > 0 {
            s.syncs_to_fail -= 1;
            return Err(io::Error::other("simulated sync failure"));
        }
        if !lost {
            s.make_durable();
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
        // Zeros written at or past the end only grow the file: the same image as a resize, and
        // kept as one (the store's journal writes its file's blocks with zeros ahead, a MiB at a
        // time, which would otherwise be copied into the pending log and again at the sync).
        if start >= s.volatile.len() && all_zero(data) {
            s.volatile.resize(end);
            s.remember(Pending::SetLen(end));
            return Ok(());
        }
        s.volatile.write(start, data);
        s.remember_write(start, data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of an image, end to end.
    fn bytes(image: &Image) -> Vec<u8> {
        let mut out = vec![0xAA; image.len()];
        assert!(image.read(0, &mut out));
        out
    }

    #[test]
    fn an_image_reads_as_the_flat_bytes_it_was_written_with() {
        let mut image = Image::default();
        let mut flat = Vec::new();
        // A write across three blocks, one far past the end (a hole of zeros), a cut inside a
        // block, then growth again: the cut-off bytes come back as zeros.
        let steps: [(usize, usize, u8); 4] = [
            (100, 2 * BLOCK + 50, 1),
            (9 * BLOCK + 7, 10, 2),
            (BLOCK - 1, 2, 3),
            (0, 1, 4),
        ];
        for (offset, len, byte) in steps {
            image.write(offset, &vec![byte; len]);
            if flat.len() < offset + len {
                flat.resize(offset + len, 0);
            }
            flat[offset..offset + len].fill(byte);
        }
        assert_eq!(bytes(&image), flat);
        image.resize(BLOCK + 10);
        flat.truncate(BLOCK + 10);
        image.resize(3 * BLOCK);
        flat.resize(3 * BLOCK, 0);
        assert_eq!(bytes(&image), flat);
        let mut past = [0u8; 2];
        assert!(!image.read(3 * BLOCK - 1, &mut past));
        assert!(image.read(3 * BLOCK - 2, &mut past));
    }

    #[test]
    fn images_are_equal_by_their_bytes_not_their_blocks() {
        let mut written = Image::default();
        written.write(0, &[0; BLOCK]);
        let mut grown = Image::default();
        grown.resize(BLOCK);
        assert_eq!(written, grown);
        let copy = written.clone();
        written.write(5, &[1]);
        assert_ne!(written, copy, "a write to a shared block changed its clone");
        assert_eq!(bytes(&copy), vec![0; BLOCK]);
    }

    #[test]
    fn all_zero_finds_a_single_set_byte_anywhere() {
        for len in [0, 1, 63, 64, 65, 200, 4096] {
            let mut data = vec![0u8; len];
            assert!(all_zero(&data));
            for i in 0..len {
                data[i] = 1;
                assert!(!all_zero(&data), "len {len}, byte {i}");
                data[i] = 0;
            }
        }
    }

    #[test]
    fn whole_block_writes_replace_shared_blocks_without_touching_the_clone() {
        let mut image = Image::default();
        image.write(0, &vec![1; 3 * BLOCK]);
        let copy = image.clone();
        // Whole blocks over a shared one, over a hole, and one straddling two blocks.
        image.write(BLOCK, &vec![2; BLOCK]);
        image.write(5 * BLOCK, &vec![3; BLOCK]);
        image.write(BLOCK / 2, &vec![4; BLOCK]);
        let mut flat = vec![1; 3 * BLOCK];
        flat[BLOCK..2 * BLOCK].fill(2);
        flat.resize(6 * BLOCK, 0);
        flat[5 * BLOCK..].fill(3);
        flat[BLOCK / 2..BLOCK / 2 + BLOCK].fill(4);
        assert_eq!(bytes(&image), flat);
        assert_eq!(bytes(&copy), vec![1; 3 * BLOCK]);
    }

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

    #[test]
    fn a_sync_replaying_its_log_leaves_the_durable_image_equal_to_the_volatile_one() {
        let disk = SimDisk::new();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..200u64 {
            for _ in 0..(next() % 8) {
                let offset = next() % 9000;
                let len = usize::try_from(next() % 300).unwrap();
                if next() % 5 == 0 {
                    disk.set_len(offset).unwrap();
                } else {
                    disk.write(offset, &vec![u8::try_from(round % 251).unwrap(); len])
                        .unwrap();
                }
            }
            if round % 7 == 3 {
                disk.fail_next_syncs(1);
                assert!(disk.sync_data().is_err());
            }
            disk.sync_data().unwrap();
            assert!(!disk.has_unsynced_writes(), "round {round}");
        }
    }

    #[test]
    fn a_torn_crash_keeps_any_chosen_subset_of_unsynced_writes() {
        let disk = SimDisk::new();
        disk.write(0, b"0000").unwrap();
        disk.sync_data().unwrap();
        disk.schedule_power_loss_at_sync(Some(0));
        disk.write(0, b"a").unwrap();
        disk.write(2, b"c").unwrap();
        disk.set_len(6).unwrap();
        assert_eq!(disk.pending_ops(), 3);
        disk.sync_data().unwrap(); // power is lost here: nothing becomes durable
        assert!(disk.power_lost());
        disk.write(3, b"x").unwrap(); // after the loss: never reaches anything
        assert_eq!(disk.pending_ops(), 3);
        let image = |d: &SimDisk| {
            let mut out = vec![0u8; usize::try_from(d.len().unwrap()).unwrap()];
            d.read(0, &mut out).unwrap();
            out
        };
        assert_eq!(image(&disk.crash_torn(|_| false).unwrap()), b"0000");
        assert_eq!(image(&disk.crash_torn(|_| true).unwrap()), b"a0c0\0\0");
        assert_eq!(image(&disk.crash_torn(|i| i == 1).unwrap()), b"00c0");
        assert_eq!(image(&disk.crash()), b"0000");
    }
}
