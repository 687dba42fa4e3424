//! The store's journal: what makes a group commit durable without a redb commit.
//!
//! A durable redb commit writes every page the commit touched (about 25 of them, scattered over the
//! file, for a group commit of `keel bench`) and syncs them: most of a sequential run's wait, and a
//! `pwrite` a page on the store writer's thread. Even a non-durable redb commit copies every page
//! it touches into new pages (zeroed, then filled), because the next transaction may not change a
//! committed page in place. With a journal, a group commit applies its writes to one redb write
//! transaction that stays open from commit to commit, and is made durable by appending the rows it
//! wrote (`redo.rs`) as one record at the end of this file and syncing that: one sequential write.
//! A read of this process reads the open transaction itself (`snapshot.rs`), so it sees every
//! acknowledged commit and commits nothing. The open transaction is committed every
//! [`DURABLE_EVERY`] commits (or once the journal holds [`JOURNAL_BYTES_MAX`]), or before
//! maintenance, as a durable redb commit, which writes each page once however many commits touched
//! it; the journal then starts over.
//!
//! Recovery: every journaled commit also writes its record's sequence number into the store's
//! `meta` table, so whatever redb made durable (a durable commit, or the promotion of pending
//! non-durable commits redb does when a database closes) says which records it holds. A writable
//! open replays, in order and in one durable transaction, the records after that number. Within a
//! process, an open transaction dropped because a group failed its checks partway, or its record's
//! append failed, is rebuilt the same way: a new transaction replays the records the committed
//! state does not hold, up to the last one appended. After a failed redb commit redb takes no new
//! write transaction: the store is opened again, and the open replays.
//!
//! The order within a journaled commit: the writes are applied in the open transaction (a write
//! that fails its checks fails the commit with nothing journaled, and the transaction, which may
//! hold part of it, is dropped), then the record is appended and synced: only then is the commit
//! acknowledged. A record whose append failed after part of it was written is voided (its header
//! overwritten and synced) so no later open replays what this one reported failed.
//!
//! The file: records back to back from offset 0, each a [`HEADER`]-byte header (magic, payload
//! length, sequence number, CRC-32 of the length, sequence number and payload) and the payload.
//! Starting over only moves the write position back to 0: the bytes after the new records are
//! records a durable commit already holds (their numbers are at most the one in `meta`) or the torn
//! remains of one, and a reader stops at the first record that is neither valid nor the next
//! number, or of another epoch (every writable open moves the epoch on). The file's blocks are
//! written with zeros ahead of the records, a MiB at a time (as the store file's are, see
//! `file.rs`), so most records' syncs write data, not a change of the file's size.

use std::io;

use redb::StorageBackend;

/// The first four bytes of every record: "KJN1".
const MAGIC: u32 = 0x4b4a_4e31;
/// Bytes of a record's header: magic, payload length (u32), sequence number (u64), CRC-32, and the
/// epoch (u32) of the open that wrote it.
pub(crate) const HEADER: usize = 24;
/// A payload longer than this is not a record (a reader's guard against a garbage length; a batch
/// is bounded far below it by the store's limits).
const PAYLOAD_MAX: u32 = 1 << 30;
/// Commits between two durable redb commits.
pub(crate) const DURABLE_EVERY: u32 = 64;
/// A journal this long makes the next commit a durable redb commit, whatever the count.
pub(crate) const JOURNAL_BYTES_MAX: u64 = 16 << 20;
/// Zeros are written ahead of the records in steps of this many bytes.
const FILL_STEP: u64 = 1 << 20;
/// The zeros, one write of them at a time.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// The journal of a store opened with it: the file and where the next record goes.
pub(crate) struct Journal {
    file: Box<dyn StorageBackend>,
    /// Where the next record goes.
    end: u64,
    /// Bytes from the start of the file known to exist on it (records or zeros), so a record below
    /// this never changes the file's size.
    filled: u64,
    /// The number the next record takes.
    next_seq: u64,
    /// Records appended since the last durable redb commit.
    since_durable: u32,
    /// The epoch of this open, written into every record.
    epoch: u32,
    /// The record being written, reused from commit to commit.
    buf: Vec<u8>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("end", &self.end)
            .field("next_seq", &self.next_seq)
            .field("since_durable", &self.since_durable)
            .finish_non_exhaustive()
    }
}

/// Why an append failed.
#[derive(Debug)]
pub(crate) enum AppendError {
    /// Nothing of the record can be replayed (it was never written, or its header was
    /// overwritten durably).
    Failed(io::Error),
    /// The record was written and could not be voided: the next open may replay it.
    Unvoided,
}

/// One record read back: its number and its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) seq: u64,
    pub(crate) payload: Vec<u8>,
}

fn crc(len: u32, seq: u64, epoch: u32, payload: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&len.to_le_bytes());
    hasher.update(&seq.to_le_bytes());
    hasher.update(&epoch.to_le_bytes());
    hasher.update(payload);
    hasher.finalize()
}

/// The records of a journal after `applied` written under `epoch`, in order: from the start of
/// the file, records whose number is at most `applied` are skipped (a durable commit holds them),
/// the next numbers are taken, and the first record that is torn, damaged, out of sequence or of
/// another epoch ends the journal. Every writable open of a store moves its epoch on (in `meta`),
/// so records left by an earlier open of another file (a store file restored or deleted beside its
/// journal) never match the file's own.
///
/// # Errors
/// The file's reads.
pub(crate) fn scan(file: &dyn StorageBackend, applied: u64, epoch: u32) -> io::Result<Vec<Record>> {
    let len = file.len()?;
    let mut at = 0u64;
    let mut records = Vec::new();
    let mut header = [0u8; HEADER];
    while at + HEADER as u64 <= len {
        file.read(at, &mut header)?;
        let field = |from: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&header[from..from + 4]);
            u32::from_le_bytes(bytes)
        };
        let mut seq_bytes = [0u8; 8];
        seq_bytes.copy_from_slice(&header[8..16]);
        let (magic, payload_len, seq, sum, record_epoch) = (
            field(0),
            field(4),
            u64::from_le_bytes(seq_bytes),
            field(16),
            field(20),
        );
        let end = at + HEADER as u64 + u64::from(payload_len);
        if magic != MAGIC || payload_len > PAYLOAD_MAX || end > len || record_epoch != epoch {
            break;
        }
        let expected = applied + 1 + records.len() as u64;
        if seq > applied && seq != expected {
            break;
        }
        let mut payload = vec![0u8; payload_len as usize];
        file.read(at + HEADER as u64, &mut payload)?;
        if crc(payload_len, seq, epoch, &payload) != sum {
            break;
        }
        if seq > applied {
            records.push(Record { seq, payload });
        }
        at = end;
    }
    Ok(records)
}

impl Journal {
    /// A journal over `file` whose next record takes `next_seq`, written from the start of the
    /// file (what is there is either held by a durable commit or torn: see the module's doc).
    ///
    /// # Errors
    /// The file's length.
    pub(crate) fn new(
        file: Box<dyn StorageBackend>,
        next_seq: u64,
        epoch: u32,
    ) -> io::Result<Self> {
        let filled = file.len()?;
        Ok(Self {
            file,
            end: 0,
            filled,
            next_seq,
            since_durable: 0,
            epoch,
            buf: Vec::new(),
        })
    }

    /// The number the next record takes (the commit writes it into `meta` before appending).
    pub(crate) fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The number of the last record appended (0 before the first of a store's life).
    pub(crate) fn last_seq(&self) -> u64 {
        self.next_seq.saturating_sub(1)
    }

    /// The file, to read the records back (`scan`) when a transaction holding them was lost.
    pub(crate) fn file(&self) -> &dyn StorageBackend {
        &*self.file
    }

    /// The epoch this open writes its records under.
    pub(crate) fn epoch(&self) -> u32 {
        self.epoch
    }

    /// Whether the next commit should be a durable redb commit (and the journal start over).
    pub(crate) fn durable_due(&self) -> bool {
        self.since_durable >= DURABLE_EVERY || self.end >= JOURNAL_BYTES_MAX
    }

    /// Whether records were appended since the last durable commit.
    pub(crate) fn pending(&self) -> bool {
        self.since_durable > 0
    }

    /// A durable redb commit holds every record so far: the journal starts over.
    pub(crate) fn restart(&mut self) {
        self.end = 0;
        self.since_durable = 0;
    }

    /// Appends `payload` as record [`Journal::next_seq`], synced when `sync` (a commit asked to be
    /// durable; an unsynced record becomes durable with the next synced one, as a non-durable redb
    /// commit does with the next durable one); answers where it starts.
    /// Only once this returns is a synced commit durable.
    ///
    /// # Errors
    /// The file's writes and sync; a payload over the record limit is `InvalidInput`. Nothing is
    /// counted as appended then.
    #[cfg(test)]
    pub(crate) fn append(&mut self, payload: &[u8], sync: bool) -> Result<u64, AppendError> {
        self.append_with(sync, |buf| {
            buf.extend_from_slice(payload);
            Ok(())
        })
    }

    /// [`Journal::append`] of the payload `write` puts at the end of the buffer it is given (a
    /// test's way to a record; a commit uses [`Journal::record`]).
    ///
    /// # Errors
    /// As [`Journal::append`], and `write`'s.
    #[cfg(test)]
    pub(crate) fn append_with(
        &mut self,
        sync: bool,
        write: impl FnOnce(&mut Vec<u8>) -> io::Result<()>,
    ) -> Result<u64, AppendError> {
        write(self.record()).map_err(AppendError::Failed)?;
        self.append_recorded(sync)
    }

    /// The buffer of the next record, emptied, with room for its header: a commit puts its
    /// payload straight at its end as it applies its writes (`redo.rs`), and
    /// [`Journal::append_recorded`] appends it, so the payload is not copied into the record.
    pub(crate) fn record(&mut self) -> &mut Vec<u8> {
        self.buf.clear();
        self.buf.resize(HEADER, 0);
        &mut self.buf
    }

    /// [`Journal::append`] of the payload put after the header's room in [`Journal::record`]'s
    /// buffer.
    ///
    /// # Errors
    /// As [`Journal::append`].
    pub(crate) fn append_recorded(&mut self, sync: bool) -> Result<u64, AppendError> {
        let payload_len = u32::try_from(self.buf.len() - HEADER)
            .ok()
            .filter(|l| *l <= PAYLOAD_MAX)
            .ok_or_else(|| {
                AppendError::Failed(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "journal record too large",
                ))
            })?;
        let seq = self.next_seq;
        let sum = crc(payload_len, seq, self.epoch, &self.buf[HEADER..]);
        self.buf[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        self.buf[4..8].copy_from_slice(&payload_len.to_le_bytes());
        self.buf[8..16].copy_from_slice(&seq.to_le_bytes());
        self.buf[16..20].copy_from_slice(&sum.to_le_bytes());
        self.buf[20..24].copy_from_slice(&self.epoch.to_le_bytes());
        let at = self.end;
        let end = at + self.buf.len() as u64;
        self.fill_to(end).map_err(AppendError::Failed)?;
        let written = self
            .file
            .write(at, &self.buf)
            .and_then(|()| if sync { self.file.sync_data() } else { Ok(()) });
        if let Err(e) = written {
            // Part of the record may reach the disk later all the same; the commit is reported
            // failed, so it must never be replayed.
            return Err(match self.unwrite(at) {
                Ok(()) => AppendError::Failed(e),
                Err(_) => AppendError::Unvoided,
            });
        }
        self.end = end;
        self.next_seq += 1;
        self.since_durable += 1;
        Ok(at)
    }

    /// Overwrites the header of a record whose append failed and syncs that.
    ///
    /// # Errors
    /// The write's or the sync's: the record may be replayed by the next open.
    fn unwrite(&mut self, at: u64) -> io::Result<()> {
        self.file.write(at, &[0u8; HEADER])?;
        self.file.sync_data()
    }

    /// Writes zeros from what is filled up to at least `end`, a step at a time, so the record's own
    /// write lands in blocks that exist.
    fn fill_to(&mut self, end: u64) -> io::Result<()> {
        if end <= self.filled {
            return Ok(());
        }
        let target = end.div_ceil(FILL_STEP) * FILL_STEP;
        let mut at = self.filled;
        while at < target {
            let chunk = (target - at).min(ZEROS.len() as u64) as usize;
            self.file.write(at, &ZEROS[..chunk])?;
            at += chunk as u64;
        }
        self.filled = target;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // Tests: a panic is the failure report.

    use super::*;
    use crate::SimDisk;

    fn journal(disk: &SimDisk, next: u64) -> Journal {
        Journal::new(Box::new(disk.clone()), next, 7).unwrap()
    }

    #[test]
    fn records_read_back_in_order_after_what_a_durable_commit_holds() {
        let disk = SimDisk::new();
        let mut j = journal(&disk, 1);
        for i in 1..=5u8 {
            j.append(&[i; 100], true).unwrap();
        }
        let all = scan(&disk, 0, 7).unwrap();
        assert_eq!(
            all.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert_eq!(all[2].payload, vec![3u8; 100]);
        let tail = scan(&disk, 3, 7).unwrap();
        assert_eq!(tail.iter().map(|r| r.seq).collect::<Vec<_>>(), [4, 5]);
        assert!(scan(&disk, 5, 7).unwrap().is_empty());
        // Another open's epoch: none of them.
        assert!(scan(&disk, 0, 8).unwrap().is_empty());
    }

    #[test]
    fn a_restarted_journal_ends_where_its_new_records_end() {
        let disk = SimDisk::new();
        let mut j = journal(&disk, 1);
        for i in 1..=4u8 {
            j.append(&[i; 300], true).unwrap();
        }
        // A durable commit holds 1..=4; one shorter record follows from the start.
        j.restart();
        j.append(&[9; 10], true).unwrap();
        let tail = scan(&disk, 4, 7).unwrap();
        assert_eq!(tail.len(), 1);
        assert_eq!((tail[0].seq, tail[0].payload.clone()), (5, vec![9u8; 10]));
        // Records of the same length: the old ones after the new are skipped, not taken.
        let disk = SimDisk::new();
        let mut j = journal(&disk, 1);
        for i in 1..=3u8 {
            j.append(&[i; 50], true).unwrap();
        }
        j.restart();
        j.append(&[7; 50], true).unwrap();
        let tail = scan(&disk, 3, 7).unwrap();
        assert_eq!(tail.iter().map(|r| r.seq).collect::<Vec<_>>(), [4]);
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_journal() {
        let disk = SimDisk::new();
        let mut j = journal(&disk, 1);
        let first = j.append(&[1; 64], true).unwrap();
        let second = j.append(&[2; 64], true).unwrap();
        j.append(&[3; 64], true).unwrap();
        assert_eq!(first, 0);
        // One byte of the second record's payload changed: the journal ends after the first.
        disk.write(second + HEADER as u64 + 10, &[0xff]).unwrap();
        assert_eq!(scan(&disk, 0, 7).unwrap().len(), 1);
        // A record that never reached the disk: the crash keeps only what was synced.
        let disk = SimDisk::new();
        let mut j = journal(&disk, 1);
        j.append(&[1; 64], true).unwrap();
        disk.fail_next_syncs(1);
        assert!(j.append(&[2; 64], true).is_err());
        let after = disk.crash();
        assert_eq!(scan(&after, 0, 7).unwrap().len(), 1);
    }

    #[test]
    fn the_file_is_filled_ahead_so_a_record_does_not_grow_it() {
        let disk = SimDisk::new();
        let mut j = journal(&disk, 1);
        j.append(&[1; 10], true).unwrap();
        assert_eq!(disk.len().unwrap(), FILL_STEP);
        for _ in 0..100 {
            j.append(&[1; 1000], true).unwrap();
        }
        assert_eq!(disk.len().unwrap(), FILL_STEP);
        assert!(j.durable_due(), "100 records are past the count");
        j.restart();
        assert!(!j.durable_due() && !j.pending());
    }
}
