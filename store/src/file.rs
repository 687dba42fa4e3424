//! The store's file on disk: redb's own file backend, with redb's writes gathered until its syncs
//! and the file's blocks allocated ahead of the commits that write into them.
//!
//! redb grows its file with `set_len`, which leaves the new space sparse; the first write into a hole
//! makes the filesystem allocate blocks, and the `fdatasync` that follows must then write the
//! allocation (the inode and its extents) as well as the data. What that costs depends on the disk
//! and on what else it is doing (docs/PERFORMANCE.md, "The store file's blocks written ahead"): on
//! the 2-vCPU VM's ext4 disk, quiet, an `fdatasync` of 26 pages written into holes took 0.33 ms at
//! the median against 0.27 ms over allocated blocks; in one window with other processes writing,
//! 3.97 ms against 0.21 ms. So this backend writes zeros ahead of redb's writes (what redb expects
//! of new space anyway, so the file's content is unchanged), a step at a time, and a commit's pages
//! land in blocks that already exist. Not for a store with the journal ([`FileMode::Journaled`]):
//! its file is synced once every few dozen commits, which pay one allocation between them. On a quiet machine `keel bench` shows no difference beyond
//! its noise; the saving is in the allocation the commit no longer waits for.
//!
//! `fallocate` would not do: on ext4 it reserves unwritten extents, and the first write into one
//! converts it, which is an allocation to write again.
//!
//! The zeros carry nothing, so writing them is best effort: when it fails (a disk too full for a
//! whole step), redb's own operation goes on as it would without this backend, and its own write
//! reports a real shortage. A store file written before this backend existed keeps its holes (the
//! mark starts at the file's length).
//!
//! It also gathers redb's page writes until the next sync. A durable redb commit writes every page
//! it changed with a call of its own, in no order (its write buffer is a hash map): about fifteen
//! `pwrite`s a run of `keel bench`, each a system call, a page-cache lookup and an `ext4` write of
//! a page. Held by offset until redb syncs (or reads, resizes or closes the file), they go out as
//! one write a stretch of adjacent pages, about two a run (docs/PERFORMANCE.md), each stretch a
//! `pwritev` of the pages' own buffers rather than a copy of them joined. Nothing redb
//! relies on changes: a write that was not synced is not durable either way, a read sees every
//! write before it, and the order of writes between two syncs is free (the kernel's page cache
//! does not keep it either). A write that fails now fails the sync that sends it, which fails
//! redb's commit as the write would have; what the failed flush held is dropped with it, and
//! every later use of the handle fails the same way (redb writes some pages out best effort and
//! goes on when that fails, so commits must not go on over pages that were lost): the store is
//! opened again, and its journal replays what was acknowledged.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::IoSlice;
use std::ops::Bound;
use std::sync::{Mutex, PoisonError};

use redb::backends::FileBackend;
use redb::{BackendError, DatabaseError, StorageBackend};

/// redb's backend IO error (without its experimental API, a plain `io::Error`).
type BackendIoError = std::io::Error;

/// The least and the most one step of zeros writes: a step is a quarter of what is already filled,
/// within these bounds, so a small store does not write megabytes it will not use and a large one
/// does not fill in steps so small that many commits pay for one.
const FILL_STEP_MIN: u64 = 1 << 20;
const FILL_STEP_MAX: u64 = 64 << 20;

/// Zeros are written from this buffer, one write call per chunk.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The most bytes of redb's writes held before a sync: past this they are sent at once, so a
/// commit larger than this (or non-durable commits' pages that redb writes out to make room in its
/// cache, with no sync after them) holds a bounded amount of memory.
const GATHER_MAX: usize = 8 << 20;

/// redb's writes since the last sync, by offset (the module's doc).
#[derive(Debug, Default)]
struct Gathered {
    /// Each write's bytes at its offset. No two overlap: a write that would overlap another at a
    /// different offset or length sends everything first.
    writes: BTreeMap<u64, Vec<u8>>,
    /// The bytes in `writes`.
    bytes: usize,
    /// A stretch of adjacent writes joined for one call over a backend without `pwritev` (a
    /// test's), kept between flushes so that a warm flush allocates nothing there; on the file, a
    /// stretch's list of buffers is allocated at each flush.
    stretch: Vec<u8>,
    /// How the first failed send failed. From then on every use of the file fails the same way:
    /// redb writes out some pages best effort (a read making room in its cache) and does not stop
    /// when that fails, so pages it no longer holds could otherwise be lost under commits that
    /// go on; the store is opened again instead, and its journal replays what it acknowledged.
    failed: Option<(std::io::ErrorKind, String)>,
}

impl Gathered {
    /// The error of an earlier failed send, again.
    fn failure(&self) -> Result<(), BackendIoError> {
        match &self.failed {
            Some((kind, message)) => Err(std::io::Error::new(
                *kind,
                format!("an earlier write of the store file failed: {message}"),
            )),
            None => Ok(()),
        }
    }
}

impl Gathered {
    /// Whether `[offset, end)` overlaps a held write other than one of exactly that range.
    fn overlaps(&self, offset: u64, end: u64) -> bool {
        let before = self
            .writes
            .range(..offset)
            .next_back()
            .is_some_and(|(o, d)| o.saturating_add(d.len() as u64) > offset);
        let after = self
            .writes
            .range(offset..end)
            .any(|(o, d)| *o != offset || o.saturating_add(d.len() as u64) != end);
        before || after
    }
}

/// A store file as redb sees it: its writes gathered until redb syncs, and its blocks written
/// (with zeros) before redb's commits write into them, as [`FileMode`] says. Generic over the
/// backend only so that a test can count writes and make them fail; keel opens it over redb's
/// [`FileBackend`].
#[derive(Debug)]
pub(crate) struct AllocatedFile<B: StorageBackend = FileBackend> {
    inner: B,
    /// The same file, to send a stretch of adjacent writes as one `pwritev` from their own
    /// buffers; `None` over a test's backend (the stretch is joined, then written through `inner`).
    vectored: Option<File>,
    /// Every byte at or past this offset was never written through this handle: from the file's
    /// length at open (what is there was written by earlier opens; a sparse part of it stays
    /// sparse) up to what this handle filled.
    filled: Mutex<u64>,
    /// redb's writes not yet sent (the module's doc).
    gathered: Mutex<Gathered>,
    /// Whether redb's writes are held until its syncs ([`FileMode`]).
    gather: bool,
    /// Whether zeros are written ahead of redb's writes ([`FileMode`]).
    fill_ahead: bool,
}

impl AllocatedFile {
    /// Wraps an open, writable store file, opened as `mode` says.
    ///
    /// # Errors
    /// When redb cannot use the file or its length cannot be read.
    pub(crate) fn new(file: File, mode: FileMode) -> Result<Self, DatabaseError> {
        let len = file.metadata()?.len();
        // A duplicate of the descriptor (same file, same open): where there is none to be had,
        // stretches are joined and written, as over any backend.
        let vectored = file.try_clone().ok();
        let mut opened = Self::over(FileBackend::new(file)?, len, mode);
        opened.vectored = vectored;
        Ok(opened)
    }
}

/// How the store file is opened, which decides what [`AllocatedFile`] does with redb's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileMode {
    /// Shared with readers in other processes, which read the file through the kernel and must see
    /// a commit's pages as soon as redb has written them: writes go straight through, and zeros
    /// are written ahead (every commit syncs the file).
    Shared,
    /// This process alone, every commit synced to the file: writes gathered, zeros ahead.
    Alone,
    /// This process alone, commits made durable by the store's journal: writes gathered, and no
    /// zeros. The file is synced only at a durable redb commit, every few dozen commits, so an
    /// allocation it waits for is paid once for all of them, while the zeros cost every run their
    /// copy into the page cache and their write to the disk (docs/PERFORMANCE.md).
    Journaled,
}

impl<B: StorageBackend> AllocatedFile<B> {
    /// Wraps `inner`, whose first `filled` bytes are taken as already written, opened as `mode`
    /// says.
    fn over(inner: B, filled: u64, mode: FileMode) -> Self {
        Self {
            inner,
            vectored: None,
            filled: Mutex::new(filled),
            gathered: Mutex::new(Gathered::default()),
            gather: mode != FileMode::Shared,
            fill_ahead: mode != FileMode::Journaled,
        }
    }

    /// Sends every held write, one call a stretch of adjacent ones, in the order of their offsets.
    /// On a failure the rest is dropped with the failed one: the sync (or read, resize, close)
    /// that asked fails, and with it redb's commit, which redb then does not take as written.
    fn send(&self) -> Result<(), BackendIoError> {
        let mut gathered = self.gathered.lock().unwrap_or_else(PoisonError::into_inner);
        gathered.failure()?;
        if gathered.writes.is_empty() {
            return Ok(());
        }
        let writes = std::mem::take(&mut gathered.writes);
        gathered.bytes = 0;
        let mut stretch = std::mem::take(&mut gathered.stretch);
        let result = self.send_stretches(writes, &mut stretch);
        stretch.clear();
        // Kept for the next flush unless a rare large commit grew it past the bound.
        if stretch.capacity() <= GATHER_MAX {
            gathered.stretch = stretch;
        }
        if let Err(e) = &result {
            gathered.failed = Some((e.kind(), e.to_string()));
        }
        result
    }

    fn send_stretches(
        &self,
        writes: BTreeMap<u64, Vec<u8>>,
        stretch: &mut Vec<u8>,
    ) -> Result<(), BackendIoError> {
        let mut writes = writes.into_iter().peekable();
        while let Some((offset, data)) = writes.next() {
            let mut end = offset.saturating_add(data.len() as u64);
            if writes.peek().is_none_or(|(next, _)| *next != end) {
                // No neighbour: sent from its own bytes, with no copy.
                self.inner.write(offset, &data)?;
                continue;
            }
            if let Some(file) = &self.vectored {
                let mut parts = vec![data];
                while let Some((_, data)) = writes.next_if(|(next, _)| *next == end) {
                    end = end.saturating_add(data.len() as u64);
                    parts.push(data);
                }
                let mut slices: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
                write_all_vectored_at(file, offset, &mut slices)?;
                continue;
            }
            stretch.clear();
            stretch.extend_from_slice(&data);
            while let Some((_, data)) = writes.next_if(|(next, _)| *next == end) {
                stretch.extend_from_slice(&data);
                end = end.saturating_add(data.len() as u64);
            }
            self.inner.write(offset, stretch)?;
        }
        Ok(())
    }

    /// Writes zeros from the filled mark up to `end`, or further by a step (never past the file's
    /// length, which is redb's to set), and moves the mark over what was written. Called with the
    /// mark's lock held, and the mark only ever covers bytes this handle wrote or zeroed, so no
    /// write of redb's can land in the range being zeroed. Best effort: a failure stops the
    /// filling there and is not redb's failure.
    fn fill_to(&self, filled: &mut u64, end: u64) {
        let Ok(len) = self.inner.len() else { return };
        let step = (*filled / 4).clamp(FILL_STEP_MIN, FILL_STEP_MAX);
        let target = end.max(filled.saturating_add(step)).min(len);
        while *filled < target {
            let chunk = (target - *filled).min(ZEROS.len() as u64);
            // `chunk` is at most ZEROS.len(), so the cast cannot truncate.
            #[allow(clippy::cast_possible_truncation)]
            if self.inner.write(*filled, &ZEROS[..chunk as usize]).is_err() {
                return;
            }
            *filled += chunk;
        }
    }
}

/// The most buffers one `pwritev` takes (`IOV_MAX` on Linux).
const SLICES_MAX: usize = 1024;

/// Writes every byte of `slices`, in order, from `offset` on: `pwritev` until all are written, at
/// most [`SLICES_MAX`] buffers a call, a short write resumed where it stopped.
fn write_all_vectored_at(
    file: &File,
    mut offset: u64,
    mut slices: &mut [IoSlice<'_>],
) -> Result<(), BackendIoError> {
    while !slices.is_empty() {
        let take = slices.len().min(SLICES_MAX);
        match rustix::io::pwritev(file, &slices[..take], offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                offset = offset.saturating_add(n as u64);
                IoSlice::advance_slices(&mut slices, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

impl<B: StorageBackend> Drop for AllocatedFile<B> {
    /// Writes redb made and did not sync still reach the file, as they would have without the
    /// gathering (a process that exits leaves its unsynced writes to the kernel). Best effort:
    /// nothing is left to tell of a failure.
    fn drop(&mut self) {
        let _ = self.send();
    }
}

impl<B: StorageBackend> StorageBackend for AllocatedFile<B> {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        // A read must see every write before it; redb reads its file rarely (its cache serves it).
        self.send()?;
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        // Before the file changes length: a held write past a shrink must not grow it back.
        self.send()?;
        let mut filled = self.filled.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.inner.len()?;
        self.inner.set_len(len)?;
        if len < *filled {
            // What was cut off is gone; space grown back later is sparse again.
            *filled = len;
        } else if len > old && self.fill_ahead {
            // redb makes a growth durable (its own sync) before it uses the space: filling the
            // first step now puts the allocation in that sync rather than in a commit's.
            let from = *filled;
            self.fill_to(&mut filled, from);
        }
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.send()?;
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        let end = offset.saturating_add(data.len() as u64);
        {
            let mut filled = self.filled.lock().unwrap_or_else(PoisonError::into_inner);
            if self.fill_ahead && end > *filled {
                self.fill_to(&mut filled, end);
                // If the zeros stopped short (a full disk), redb's page still lands past them: the
                // mark moves over it, so no later fill can zero it (what lies between stays a hole).
                *filled = (*filled).max(end);
            }
        }
        if !self.gather {
            return self.inner.write(offset, data);
        }
        let mut gathered = self.gathered.lock().unwrap_or_else(PoisonError::into_inner);
        gathered.failure()?;
        if data.is_empty() {
            // Nothing to write (and an empty entry would replace a held write at its offset).
            return Ok(());
        }
        if gathered.overlaps(offset, end) {
            // Not redb's way (a page is rewritten whole, at its own offset), but kept in order if
            // it happens: what is held goes first, then this write.
            drop(gathered);
            self.send()?;
            return self.inner.write(offset, data);
        }
        gathered.bytes = gathered.bytes.saturating_add(data.len());
        if let Some(replaced) = gathered.writes.insert(offset, data.to_vec()) {
            gathered.bytes = gathered.bytes.saturating_sub(replaced.len());
        }
        let full = gathered.bytes > GATHER_MAX;
        drop(gathered);
        if full { self.send() } else { Ok(()) }
    }

    fn close(&self) -> Result<(), BackendIoError> {
        // redb closes a backend once and relies on it to let go of the file's locks, so the inner
        // close runs whatever the send did; the first error is the one reported.
        let sent = self.send();
        let closed = self.inner.close();
        sent.and(closed)
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn open(dir: &tempfile::TempDir) -> (AllocatedFile, std::path::PathBuf) {
        open_as(dir, FileMode::Alone)
    }

    fn open_as(dir: &tempfile::TempDir, mode: FileMode) -> (AllocatedFile, std::path::PathBuf) {
        let path = dir.path().join("store.redb");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        (AllocatedFile::new(file, mode).unwrap(), path)
    }

    /// Bytes the filesystem holds for the file (a sparse file holds fewer than its length).
    fn allocated(path: &std::path::Path) -> u64 {
        std::fs::metadata(path).unwrap().blocks() * 512
    }

    #[test]
    fn growth_is_filled_a_step_at_once_and_a_write_past_the_mark_fills_up_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = open(&dir);
        file.set_len(16 << 20).unwrap();
        assert_eq!(file.len().unwrap(), 16 << 20);
        // The first step (1 MiB from an empty file) is written at the growth itself.
        assert!(allocated(&path) >= FILL_STEP_MIN, "{}", allocated(&path));
        assert!(allocated(&path) < 16 << 20, "{}", allocated(&path));
        // A write past the mark fills everything before it (so no commit writes into a hole).
        file.write(9 << 20, b"page").unwrap();
        assert!(allocated(&path) >= (9 << 20) + 4, "{}", allocated(&path));
        // Never past redb's length.
        assert_eq!(file.len().unwrap(), 16 << 20);
    }

    #[test]
    fn filling_never_overwrites_what_was_written_and_new_space_reads_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let (file, _) = open(&dir);
        file.set_len(4096).unwrap();
        file.write(100, b"kept").unwrap();
        file.set_len(8 << 20).unwrap();
        file.write(6 << 20, b"late").unwrap();
        let mut out = [0u8; 4];
        file.read(100, &mut out).unwrap();
        assert_eq!(&out, b"kept");
        file.read(6 << 20, &mut out).unwrap();
        assert_eq!(&out, b"late");
        let mut zeros = vec![1u8; 64 << 10];
        file.read(3 << 20, &mut zeros).unwrap();
        assert!(zeros.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_shrink_moves_the_mark_back_so_space_grown_again_is_filled_again() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = open(&dir);
        file.set_len(2 << 20).unwrap();
        file.write(0, b"head").unwrap();
        file.set_len(4096).unwrap();
        assert!(allocated(&path) <= 8192, "{}", allocated(&path));
        file.set_len(2 << 20).unwrap();
        assert!(allocated(&path) >= FILL_STEP_MIN, "{}", allocated(&path));
        let mut out = [0u8; 4];
        file.read(0, &mut out).unwrap();
        assert_eq!(&out, b"head");
    }

    #[test]
    fn zeros_that_cannot_be_written_fail_nothing_of_redbs() {
        // A disk that takes no more bytes: redb's growth still succeeds (the zeros are not written),
        // and the new space reads as zeros, as redb requires.
        let disk = crate::SimDisk::new();
        disk.set_write_budget(Some(0));
        let file = AllocatedFile::over(disk.clone(), 0, FileMode::Alone);
        file.set_len(8 << 20).unwrap();
        assert_eq!(file.len().unwrap(), 8 << 20);
        let mut out = [1u8; 4];
        file.read(4 << 20, &mut out).unwrap();
        assert_eq!(out, [0; 4]);
        // Once the disk takes bytes again, a write fills up to it and lands.
        disk.set_write_budget(None);
        file.write(3 << 20, b"page").unwrap();
        file.read(3 << 20, &mut out).unwrap();
        assert_eq!(&out, b"page");
    }

    #[test]
    fn a_journaled_file_gets_no_zeros_and_holds_writes_until_the_sync() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = open_as(&dir, FileMode::Journaled);
        file.set_len(16 << 20).unwrap();
        file.write(9 << 20, &[3; 4096]).unwrap();
        // Neither a step of zeros at the growth nor up to the page; the page is not written yet.
        assert!(allocated(&path) < FILL_STEP_MIN, "{}", allocated(&path));
        let mut on_disk = vec![1u8; 4096];
        let raw = std::fs::File::open(&path).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&raw, &mut on_disk, 9 << 20).unwrap();
        assert_eq!(on_disk, vec![0; 4096], "held until the sync");
        file.sync_data().unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&raw, &mut on_disk, 9 << 20).unwrap();
        assert_eq!(on_disk, vec![3; 4096]);
        assert!(allocated(&path) < FILL_STEP_MIN, "{}", allocated(&path));
    }

    #[test]
    fn a_shared_file_is_written_at_once_for_readers_in_other_processes() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = open_as(&dir, FileMode::Shared);
        file.set_len(1 << 20).unwrap();
        file.write(4096, &[5; 4096]).unwrap();
        // Another handle (another process) reads it before any sync.
        let mut seen = vec![0u8; 4096];
        let raw = std::fs::File::open(&path).unwrap();
        std::os::unix::fs::FileExt::read_exact_at(&raw, &mut seen, 4096).unwrap();
        assert_eq!(seen, vec![5; 4096]);
    }

    /// A disk that counts the writes that reach it and can be told to fail them: only a step of
    /// zeros (`failing_zeros`: a step does not fit while redb's small writes land), or every write.
    #[derive(Debug, Default)]
    struct TestDisk {
        disk: crate::SimDisk,
        failing_zeros: std::sync::atomic::AtomicBool,
        failing: std::sync::atomic::AtomicBool,
        writes: std::sync::atomic::AtomicUsize,
    }

    impl TestDisk {
        fn writes(&self) -> usize {
            self.writes.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl StorageBackend for TestDisk {
        fn len(&self) -> Result<u64, BackendIoError> {
            self.disk.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
            self.disk.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
            self.disk.set_len(len)
        }
        fn sync_data(&self) -> Result<(), BackendIoError> {
            self.disk.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
            let zeros = data.len() == ZEROS.len() && data.iter().all(|&b| b == 0);
            let failing_zeros = self.failing_zeros.load(std::sync::atomic::Ordering::SeqCst);
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) || (zeros && failing_zeros) {
                return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "full"));
            }
            self.writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.disk.write(offset, data)
        }
    }

    #[test]
    fn a_page_written_past_zeros_that_failed_is_never_zeroed_later() {
        let file = AllocatedFile::over(TestDisk::default(), 0, FileMode::Alone);
        file.inner
            .failing_zeros
            .store(true, std::sync::atomic::Ordering::SeqCst);
        file.set_len(8 << 20).unwrap();
        file.write(3 << 20, b"page").unwrap();
        // Space again: the next growth fills a step from the mark, which must lie past the page.
        file.inner
            .failing_zeros
            .store(false, std::sync::atomic::Ordering::SeqCst);
        file.set_len(16 << 20).unwrap();
        file.write(12 << 20, b"late").unwrap();
        let mut out = [0u8; 4];
        file.read(3 << 20, &mut out).unwrap();
        assert_eq!(&out, b"page");
    }

    #[test]
    fn an_existing_file_is_taken_as_filled_up_to_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.redb");
        std::fs::write(&path, b"existing").unwrap();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let file = AllocatedFile::new(file, FileMode::Alone).unwrap();
        file.write(2, b"XX").unwrap();
        let mut out = [0u8; 8];
        file.read(0, &mut out).unwrap();
        assert_eq!(&out, b"exXXting");
    }

    /// Over a file already filled to 1 MiB, so that only redb's writes reach the disk.
    fn counting() -> AllocatedFile<TestDisk> {
        let file = AllocatedFile::over(TestDisk::default(), 1 << 20, FileMode::Alone);
        file.inner.disk.set_len(1 << 20).unwrap();
        file
    }

    fn read_at(file: &AllocatedFile<TestDisk>, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        file.read(offset, &mut out).unwrap();
        out
    }

    #[test]
    fn pages_written_out_of_order_go_out_at_the_sync_one_write_a_stretch() {
        let file = counting();
        // Two stretches (pages 3 to 5 and page 9), written in no order.
        for page in [5u64, 9, 3, 4] {
            file.write(page * 4096, &[page as u8; 4096]).unwrap();
        }
        assert_eq!(file.inner.writes(), 0, "held until the sync");
        file.sync_data().unwrap();
        assert_eq!(file.inner.writes(), 2);
        for page in [3u64, 4, 5, 9] {
            assert_eq!(read_at(&file, page * 4096, 4096), vec![page as u8; 4096]);
        }
        assert_eq!(read_at(&file, 6 * 4096, 4096), vec![0; 4096]);
    }

    /// On a real file a stretch goes out as `pwritev` of the pages' own buffers: a stretch longer
    /// than one call takes (1,100 pages), and one page on its own, land where they were written.
    #[test]
    fn a_stretch_of_more_pages_than_one_pwritev_takes_lands_whole_on_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (file, path) = open_as(&dir, FileMode::Journaled);
        assert!(file.vectored.is_some());
        file.set_len(8 << 20).unwrap();
        let pages = 1_100u64;
        // Out of order, as redb writes them: every other page first.
        for page in (0..pages).step_by(2).chain((1..pages).step_by(2)) {
            file.write(page * 4096, &[(page % 251) as u8; 4096])
                .unwrap();
        }
        file.write(1_500 * 4096, &[9; 4096]).unwrap();
        file.sync_data().unwrap();
        drop(file);
        let bytes = std::fs::read(&path).unwrap();
        for page in 0..pages {
            let at = (page * 4096) as usize;
            assert_eq!(
                bytes[at..at + 4096],
                [(page % 251) as u8; 4096],
                "page {page}"
            );
        }
        assert_eq!(bytes[1_500 * 4096..1_501 * 4096], [9; 4096]);
        assert_eq!(bytes[1_100 * 4096..1_101 * 4096], [0; 4096]);
    }

    #[test]
    fn a_read_sees_every_write_before_it_and_a_later_write_of_a_page_wins() {
        let file = counting();
        file.write(8192, &[1; 4096]).unwrap();
        file.write(8192, &[2; 4096]).unwrap();
        assert_eq!(read_at(&file, 8192, 4096), vec![2; 4096]);
        // A write overlapping a held one at another offset keeps the order too.
        file.write(4096, &[3; 8192]).unwrap();
        file.write(6144, &[4; 1024]).unwrap();
        let got = read_at(&file, 4096, 8192);
        assert_eq!(&got[..2048], &[3; 2048][..]);
        assert_eq!(&got[2048..3072], &[4; 1024][..]);
        assert_eq!(&got[3072..], &[3; 5120][..]);
    }

    #[test]
    fn a_shrink_does_not_let_a_held_write_grow_the_file_back() {
        let file = counting();
        file.write(900 << 10, &[7; 4096]).unwrap();
        file.set_len(512 << 10).unwrap();
        file.sync_data().unwrap();
        assert_eq!(file.len().unwrap(), 512 << 10);
    }

    #[test]
    fn a_failed_send_fails_the_sync_and_every_later_use_of_the_file() {
        let file = counting();
        file.write(4096, &[1; 4096]).unwrap();
        file.inner
            .failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let err = file.sync_data().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull);
        file.inner
            .failing
            .store(false, std::sync::atomic::Ordering::SeqCst);
        // The disk takes writes again, but this handle does not: what the failed send held is
        // gone, so nothing after it may go on as if it were written (the store is opened again).
        let mut out = [0u8; 4];
        assert!(file.read(4096, &mut out).is_err());
        assert!(file.write(8192, &[2; 4096]).is_err());
        assert!(file.set_len(2 << 20).is_err());
        assert_eq!(
            file.sync_data().unwrap_err().kind(),
            std::io::ErrorKind::StorageFull
        );
        assert!(file.close().is_err());
        let mut page = vec![7u8; 4096];
        file.inner.disk.read(4096, &mut page).unwrap();
        assert_eq!(
            page,
            vec![0; 4096],
            "the failed send's page never reached the disk"
        );
        drop(file);
    }

    #[test]
    fn an_empty_write_leaves_a_held_write_at_its_offset() {
        let file = counting();
        file.write(4096, &[9; 4096]).unwrap();
        file.write(4096, &[]).unwrap();
        assert_eq!(read_at(&file, 4096, 4096), vec![9; 4096]);
    }

    #[test]
    fn held_writes_past_the_bound_go_out_without_a_sync_and_a_drop_sends_the_rest() {
        let file = counting();
        file.inner.disk.set_len(64 << 20).unwrap();
        let page = vec![5u8; 1 << 20];
        for i in 0..9u64 {
            file.write((i + 1) << 20, &page).unwrap();
        }
        assert!(file.inner.writes() >= 1, "more than GATHER_MAX was held");
        file.write(40 << 20, &page).unwrap();
        let disk = file.inner.disk.clone();
        let before = file.inner.writes();
        drop(file);
        let mut out = vec![0u8; 16];
        disk.read(40 << 20, &mut out).unwrap();
        assert_eq!(
            out,
            vec![5u8; 16],
            "sent by the drop (after {before} writes)"
        );
    }
}
