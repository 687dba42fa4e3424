//! The store's file on disk: redb's own file backend, with the file's blocks allocated ahead of the
//! commits that write into them.
//!
//! redb grows its file with `set_len`, which leaves the new space sparse; the first write into a hole
//! makes the filesystem allocate blocks, and the `fdatasync` that follows must then write the
//! allocation (the inode and its extents) as well as the data. What that costs depends on the disk
//! and on what else it is doing (docs/PERFORMANCE.md, "The store file's blocks written ahead"): on
//! the 2-vCPU VM's ext4 disk, quiet, an `fdatasync` of 26 pages written into holes took 0.33 ms at
//! the median against 0.27 ms over allocated blocks; in one window with other processes writing,
//! 3.97 ms against 0.21 ms. So this backend writes zeros ahead of redb's writes (what redb expects
//! of new space anyway, so the file's content is unchanged), a step at a time, and a commit's pages
//! land in blocks that already exist. On a quiet machine `keel bench` shows no difference beyond
//! its noise; the saving is in the allocation the commit no longer waits for.
//!
//! `fallocate` would not do: on ext4 it reserves unwritten extents, and the first write into one
//! converts it, which is an allocation to write again.
//!
//! The zeros carry nothing, so writing them is best effort: when it fails (a disk too full for a
//! whole step), redb's own operation goes on as it would without this backend, and its own write
//! reports a real shortage. A store file written before this backend existed keeps its holes (the
//! mark starts at the file's length).

use std::fs::File;
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

/// A store file whose blocks are written (with zeros) before redb's commits write into them.
/// Generic over the backend only so that a test can make the zeros fail; keel opens it over
/// redb's [`FileBackend`].
#[derive(Debug)]
pub(crate) struct AllocatedFile<B = FileBackend> {
    inner: B,
    /// Every byte at or past this offset was never written through this handle: from the file's
    /// length at open (what is there was written by earlier opens; a sparse part of it stays
    /// sparse) up to what this handle filled.
    filled: Mutex<u64>,
}

impl AllocatedFile {
    /// Wraps an open, writable store file.
    ///
    /// # Errors
    /// When redb cannot use the file or its length cannot be read.
    pub(crate) fn new(file: File) -> Result<Self, DatabaseError> {
        let len = file.metadata()?.len();
        Ok(Self::over(FileBackend::new(file)?, len))
    }
}

impl<B: StorageBackend> AllocatedFile<B> {
    /// Wraps `inner`, whose first `filled` bytes are taken as already written.
    fn over(inner: B, filled: u64) -> Self {
        Self {
            inner,
            filled: Mutex::new(filled),
        }
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

impl<B: StorageBackend> StorageBackend for AllocatedFile<B> {
    fn len(&self) -> Result<u64, BackendIoError> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), BackendIoError> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), BackendIoError> {
        let mut filled = self.filled.lock().unwrap_or_else(PoisonError::into_inner);
        let old = self.inner.len()?;
        self.inner.set_len(len)?;
        if len < *filled {
            // What was cut off is gone; space grown back later is sparse again.
            *filled = len;
        } else if len > old {
            // redb makes a growth durable (its own sync) before it uses the space: filling the
            // first step now puts the allocation in that sync rather than in a commit's.
            let from = *filled;
            self.fill_to(&mut filled, from);
        }
        Ok(())
    }

    fn sync_data(&self) -> Result<(), BackendIoError> {
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), BackendIoError> {
        let end = offset.saturating_add(data.len() as u64);
        {
            let mut filled = self.filled.lock().unwrap_or_else(PoisonError::into_inner);
            if end > *filled {
                self.fill_to(&mut filled, end);
                // If the zeros stopped short (a full disk), redb's page still lands past them: the
                // mark moves over it, so no later fill can zero it (what lies between stays a hole).
                *filled = (*filled).max(end);
            }
        }
        self.inner.write(offset, data)
    }

    fn close(&self) -> Result<(), BackendIoError> {
        self.inner.close()
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
        let path = dir.path().join("store.redb");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .unwrap();
        (AllocatedFile::new(file).unwrap(), path)
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
        let file = AllocatedFile::over(disk.clone(), 0);
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

    /// A disk on which zeros fail (a step of them does not fit) while redb's small writes land.
    #[derive(Debug, Default)]
    struct ZerosFail {
        disk: crate::SimDisk,
        failing: std::sync::atomic::AtomicBool,
    }

    impl StorageBackend for ZerosFail {
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
            if zeros && self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "full"));
            }
            self.disk.write(offset, data)
        }
    }

    #[test]
    fn a_page_written_past_zeros_that_failed_is_never_zeroed_later() {
        let file = AllocatedFile::over(ZerosFail::default(), 0);
        file.inner
            .failing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        file.set_len(8 << 20).unwrap();
        file.write(3 << 20, b"page").unwrap();
        // Space again: the next growth fills a step from the mark, which must lie past the page.
        file.inner
            .failing
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
        let file = AllocatedFile::new(file).unwrap();
        file.write(2, b"XX").unwrap();
        let mut out = [0u8; 8];
        file.read(0, &mut out).unwrap();
        assert_eq!(&out, b"exXXting");
    }
}
