//! Durable storage of one member's Raft state: the log, the hard state and snapshots, under a
//! data directory (`docs/raft.md`, section 5.8). The engine hands over [`PersistBatch`]es;
//! [`RaftDisk::write`] returns once one is durable, and [`RaftDisk::open`] gives back the
//! [`Recovered`] state at start.
//!
//! # Layout
//! ```text
//! <dir>/LOCK                      the holder's "<pid> <start time>" (see below)
//! <dir>/meta                      [format, cluster, member], written once
//! <dir>/generation                the number of opens so far
//! <dir>/wal/<sequence>.log        log segments, 20-digit sequence numbers from 1
//! <dir>/snap/<index>-<term>.snap  snapshots, 20-digit numbers; the newest two are kept
//! ```
//!
//! # Records
//! Every file but `LOCK` is made of records:
//!
//! ```text
//! [len: u32 LE][crc: u32 LE][kind: u8][body: len - 1 bytes, CBOR]
//! ```
//!
//! `len` counts the kind and the body; `crc` is the CRC-32C (Castagnoli) of the same bytes.
//! The kinds:
//!
//! | kind | where | body |
//! |---|---|---|
//! | 1 `ENTRIES` | log | `[LogEntry]`, contiguous, ascending: each replaces any entry at its index or above |
//! | 2 `HARD_STATE` | log | `HardState`; the last one is the hard state |
//! | 3 `TRUNCATE` | log | `from`: every entry at `from` or above is dropped |
//! | 16 `META` | `meta` | `[format u32, cluster text, member text]`, format 1 |
//! | 17 `GENERATION` | `generation` | `u64` |
//! | 18 `SNAPSHOT` | a snapshot file | `SnapshotRecord` |
//!
//! (`LogEntry`, `HardState` and `SnapshotRecord` are the protocol's, as its serde derives
//! encode them: maps keyed by field name, byte strings for data.) `meta`, `generation` and
//! snapshots hold one record each and are replaced atomically: a `.tmp` file is written and
//! synced, renamed over the old one, and the directory synced.
//!
//! # Writing
//! A batch is written in the contract's order. A received snapshot that is newer than the
//! newest one is saved first; if the log holds an entry at its index with another term, the
//! entries above it belong to a history that can never commit, and a `TRUNCATE` record
//! dropping them is synced *before* the snapshot is saved, so that no crash leaves the new
//! snapshot under them. Then the entries and the hard state go to the active segment in one
//! write, followed by one `fdatasync`. The active segment gives way to a new one once it
//! exceeds 64 MiB; a new segment is only started after the previous one was synced, and the
//! directory is synced after creating it.
//!
//! # Recovery
//! The newest snapshot whose record checks is loaded (newer ones that do not check are
//! renamed `*.corrupt`). The segments are replayed in order. The first record cut short or
//! failing its checksum ends the log, which is truncated there: that is the write a crash
//! interrupted, never acknowledged. A bad record in a segment followed by a non-empty one
//! cannot be a torn write, so it is refused as corruption ([`DiskError::Corrupt`]), as is a
//! record whose checksum holds but whose body does not decode. The entries at or below the
//! snapshot's index are dropped, the rest must follow the snapshot without a gap, and the
//! hard state's commit index is raised to the snapshot's index if it is below (a snapshot
//! holds only committed entries; raft-rs refuses a commit index below its first index).
//!
//! # Compaction
//! [`RaftDisk::compact`] saves a snapshot the member made of its applied state. Segments
//! holding only entries below `snapshot index − 1024` are then removed, oldest first (the
//! hard state is written again first if its last record is among them).
//!
//! # Exclusion
//! `LOCK` keeps a second process, or a second store in this process, off the directory. It
//! records the holder's pid and start time and is removed on drop; a `LOCK` whose process is
//! gone (killed with `kill -9`, or a reused pid with another start time) is taken over.
//!
//! # Durability
//! With `sync: false` nothing is synced: a crash of the process loses nothing the kernel
//! received, but a power loss or kernel crash can lose acknowledged writes, which breaks
//! Raft's guarantees (fencing tokens included). Only for tests and tmpfs benchmarks.

mod crc;
mod error;
mod lock;
mod meta;
mod record;
mod snap;
mod wal;

use std::collections::VecDeque;
use std::fs;
use std::path::Path;

use conclave_protocol::raft::persist::{
    HardState, LogEntry, PersistBatch, Recovered, SnapshotRecord,
};
use tracing::{debug, info};

pub(crate) use error::DiskError;

use error::io_at;
use lock::DirLock;
use record::{ENTRIES, HARD_STATE, TRUNCATE};
use snap::Snapshots;
use wal::Wal;

/// The size past which the log starts a new segment.
const SEGMENT_BYTES: u64 = 64 << 20;

/// How many entries below a local snapshot's index the log keeps (slack for slow followers).
const KEEP: u64 = 1024;

/// The Raft state of one member on its local disk, under `dir` (created if missing).
///
/// The sequence: [`RaftDisk::open`], which hands back what was durable; then, for every
/// [`PersistBatch`] of the engine, [`RaftDisk::write`] before the engine is told the batch is
/// persisted; [`RaftDisk::compact`] with every snapshot the member makes of its applied
/// state. Dropping it releases the directory.
#[derive(Debug)]
pub(crate) struct RaftDisk {
    /// The log's segments.
    wal: Wal,
    /// The snapshot files.
    snapshots: Snapshots,
    /// The terms of the entries above the newest snapshot, which writes are checked against.
    log: Terms,
    /// The last hard state written.
    hard_state: HardState,
    /// This open's generation.
    generation: u64,
    /// Bytes of log written since the newest snapshot.
    unsnapshotted: u64,
    /// How many entries below a local snapshot are kept.
    keep: u64,
    /// Whether a write failed, after which the disk's state is unknown.
    failed: bool,
    /// The directory's lock; the last field, so it is released after the files are closed.
    _lock: DirLock,
}

/// What [`RaftDisk::open_with`] can tune beyond [`RaftDisk::open`]'s arguments.
#[derive(Clone, Copy, Debug)]
struct Options {
    /// Whether writes are synced.
    sync: bool,
    /// The size past which the log starts a new segment.
    segment_bytes: u64,
    /// How many entries below a local snapshot are kept.
    keep: u64,
}

impl RaftDisk {
    /// Opens (or creates) the store in `dir`, which belongs to member `member` of cluster
    /// `cluster`, and returns it with the recovered state: the newest valid snapshot, the
    /// entries after it and the last hard state (all empty for a new store). Every open
    /// increments the [generation](RaftDisk::generation). `sync: false` skips every fsync,
    /// which is unsafe against power loss (tests on tmpfs only).
    ///
    /// # Errors
    /// - [`DiskError::Locked`]: another live process, or another store of this process,
    ///   holds `dir`.
    /// - [`DiskError::Mismatch`]: `dir` belongs to another cluster or member.
    /// - [`DiskError::Corrupt`]: `meta`, `generation` or the log is damaged beyond a torn
    ///   tail, or the log does not join its snapshot.
    /// - [`DiskError::Io`]: a file could not be created, read or written.
    pub(crate) fn open(
        dir: &Path,
        cluster: &str,
        member: &str,
        sync: bool,
    ) -> Result<(RaftDisk, Recovered), DiskError> {
        let options = Options {
            sync,
            segment_bytes: SEGMENT_BYTES,
            keep: KEEP,
        };
        Self::open_with(dir, cluster, member, options)
    }

    /// Writes `batch` durably, in order: its snapshot (if newer than the newest saved; an
    /// older one is ignored), its entries (an entry at an index that already exists replaces
    /// it and every entry above it), its hard state; then one `fdatasync` of the log (when
    /// syncing). Returns once the batch is durable.
    ///
    /// # Errors
    /// [`DiskError::Io`] of kind `InvalidInput`, with nothing written, if the entries are not
    /// contiguous and ascending, start at or below the snapshot, or leave a gap after the
    /// log's last entry. [`DiskError::Io`] otherwise if a file operation failed: the batch
    /// may be partly on disk, and every later write fails too (reopen the store).
    pub(crate) fn write(&mut self, batch: &PersistBatch) -> Result<(), DiskError> {
        self.check_usable()?;
        if batch.is_empty() {
            return Ok(());
        }
        let plan = self.plan(batch)?;
        let result = self.write_planned(batch, plan);
        self.failed = result.is_err();
        result
    }

    /// Saves `snapshot`, made locally of the applied state, like a received one, and drops
    /// the entries at or below its index: from memory at once, from the disk when whole
    /// segments fall below `snapshot.index − 1024`. A snapshot no newer than the newest saved
    /// is ignored.
    ///
    /// # Errors
    /// [`DiskError::Io`] of kind `InvalidInput`, with nothing written, if the log has no
    /// entry at the snapshot's index with its term. [`DiskError::Io`] otherwise if a file
    /// operation failed; every later write fails too (reopen the store).
    pub(crate) fn compact(&mut self, snapshot: &SnapshotRecord) -> Result<(), DiskError> {
        self.check_usable()?;
        if !self.snapshots.is_newer(snapshot) {
            debug!(
                index = snapshot.index,
                "a snapshot no newer than the newest one ignored"
            );
            return Ok(());
        }
        if self.log.term(snapshot.index) != Some(snapshot.term) {
            return Err(DiskError::invalid(format!(
                "a local snapshot at index {} term {} is not of this log (last index {}, term there {:?})",
                snapshot.index,
                snapshot.term,
                self.log.last(),
                self.log.term(snapshot.index)
            )));
        }
        let result = self.compact_checked(snapshot);
        self.failed = result.is_err();
        result
    }

    /// Bytes of log written since the newest snapshot (at open: the records from the first
    /// one holding an entry above it), which is what the engine weighs to decide when to
    /// snapshot. The files are larger: they also hold the slack below the snapshot and the
    /// older part of the active segment, which [`RaftDisk::compact`] cannot remove at once.
    pub(crate) fn log_bytes(&self) -> u64 {
        self.unsnapshotted
    }

    /// This open's generation: 1 at the first open of the directory, one more at each later
    /// one (written durably before [`RaftDisk::open`] returns), so a restarted member
    /// presents a higher one than any earlier run.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// [`RaftDisk::open`] with every option.
    fn open_with(
        dir: &Path,
        cluster: &str,
        member: &str,
        options: Options,
    ) -> Result<(RaftDisk, Recovered), DiskError> {
        create_dir(dir, options.sync)?;
        let lock = DirLock::acquire(dir)?;
        record::remove_temporaries(dir)?;
        meta::claim(dir, cluster, member, options.sync)?;
        let generation = meta::next_generation(dir, options.sync)?;
        let (wal_dir, snap_dir) = (dir.join("wal"), dir.join("snap"));
        create_dir(&snap_dir, options.sync)?;
        create_dir(&wal_dir, options.sync)?;
        let (snapshots, snapshot) = Snapshots::recover(snap_dir, options.sync)?;
        let base = snapshots.index();
        let (wal, replay) = Wal::recover(wal_dir, options.sync, options.segment_bytes, base)?;
        let mut entries = replay.entries;
        let below = entries.iter().take_while(|e| e.index <= base).count();
        entries.drain(..below);
        if let Some(first) = entries.first().filter(|e| e.index != base + 1) {
            return Err(DiskError::Corrupt(format!(
                "{}: the log resumes at index {} after a snapshot ending at {base}",
                dir.display(),
                first.index
            )));
        }
        let last = entries.last().map_or(base, |e| e.index);
        let mut hard_state = replay.hard_state;
        hard_state.commit = hard_state.commit.max(base);
        if hard_state.commit > last {
            return Err(DiskError::Corrupt(format!(
                "{}: the hard state's commit index {} is above the last entry {last}",
                dir.display(),
                hard_state.commit
            )));
        }
        info!(
            dir = %dir.display(),
            generation,
            snapshot = base,
            entries = entries.len(),
            term = hard_state.term,
            commit = hard_state.commit,
            "opened the raft storage"
        );
        let disk = RaftDisk {
            wal,
            snapshots,
            log: Terms {
                first: base + 1,
                terms: entries.iter().map(|e| e.term).collect(),
            },
            hard_state,
            generation,
            unsnapshotted: replay.bytes_above_snapshot,
            keep: options.keep,
            failed: false,
            _lock: lock,
        };
        let recovered = Recovered {
            hard_state,
            snapshot,
            entries,
        };
        Ok((disk, recovered))
    }

    /// Refuses to write after a failed write.
    fn check_usable(&self) -> Result<(), DiskError> {
        if self.failed {
            return Err(DiskError::Io(std::io::Error::other(
                "an earlier write failed, so the disk's state is unknown: reopen the store",
            )));
        }
        Ok(())
    }

    /// Checks `batch` against the log, before anything is written.
    fn plan(&self, batch: &PersistBatch) -> Result<Plan, DiskError> {
        let mut plan = Plan::default();
        let mut floor = self.snapshots.index();
        let mut last = self.log.last();
        if let Some(snapshot) = &batch.snapshot {
            if self.snapshots.is_newer(snapshot) {
                plan.install = true;
                floor = snapshot.index;
                if self.log.term(snapshot.index) != Some(snapshot.term) {
                    if last > snapshot.index {
                        plan.truncate_from = Some(snapshot.index + 1);
                    }
                    last = snapshot.index;
                }
            } else {
                debug!(
                    index = snapshot.index,
                    "a received snapshot no newer than the newest one ignored"
                );
            }
        }
        if let Some(first) = batch.entries.first().map(|e| e.index) {
            let contiguous = batch
                .entries
                .iter()
                .zip(first..)
                .all(|(entry, index)| entry.index == index);
            if !contiguous || first <= floor || first > last + 1 {
                return Err(DiskError::invalid(format!(
                    "entries {first}..={} (contiguous: {contiguous}) do not fit a log of {}..={last}",
                    batch.entries.last().map_or(first, |e| e.index),
                    floor + 1
                )));
            }
        }
        Ok(plan)
    }

    /// Writes a batch [`RaftDisk::plan`] accepted.
    fn write_planned(&mut self, batch: &PersistBatch, plan: Plan) -> Result<(), DiskError> {
        if let Some(snapshot) = batch.snapshot.as_ref().filter(|_| plan.install) {
            if let Some(from) = plan.truncate_from {
                let mut record = Vec::new();
                let body =
                    cbor4ii::serde::to_vec(Vec::new(), &from).map_err(record::encode_failed)?;
                record::encode(TRUNCATE, &body, &mut record)?;
                self.wal.append(&record, 0, false)?;
                self.log.truncate_from(from);
                self.unsnapshotted += record.len() as u64;
            }
            self.snapshots.save(snapshot)?;
            self.log.compact_through(snapshot.index);
            self.unsnapshotted = 0;
        }
        let mut records = Vec::new();
        if !batch.entries.is_empty() {
            let body = cbor4ii::serde::to_vec(Vec::new(), &batch.entries)
                .map_err(record::encode_failed)?;
            record::encode(ENTRIES, &body, &mut records)?;
        }
        if let Some(hard_state) = &batch.hard_state {
            let body =
                cbor4ii::serde::to_vec(Vec::new(), hard_state).map_err(record::encode_failed)?;
            record::encode(HARD_STATE, &body, &mut records)?;
        }
        if records.is_empty() {
            return Ok(());
        }
        let max_index = batch.entries.last().map_or(0, |e| e.index);
        self.wal
            .append(&records, max_index, batch.hard_state.is_some())?;
        self.unsnapshotted += records.len() as u64;
        self.log.append(&batch.entries);
        if let Some(hard_state) = batch.hard_state {
            self.hard_state = hard_state;
        }
        Ok(())
    }

    /// Compacts at a snapshot [`RaftDisk::compact`] accepted.
    fn compact_checked(&mut self, snapshot: &SnapshotRecord) -> Result<(), DiskError> {
        self.snapshots.save(snapshot)?;
        self.log.compact_through(snapshot.index);
        self.unsnapshotted = 0;
        let removable = self.wal.removable(snapshot.index.saturating_sub(self.keep));
        if removable == 0 {
            return Ok(());
        }
        if self.wal.hard_state_among(removable) {
            let mut record = Vec::new();
            let body = cbor4ii::serde::to_vec(Vec::new(), &self.hard_state)
                .map_err(record::encode_failed)?;
            record::encode(HARD_STATE, &body, &mut record)?;
            self.wal.append(&record, 0, true)?;
            self.unsnapshotted += record.len() as u64;
        }
        self.wal.remove_oldest(removable)?;
        debug!(
            snapshot = snapshot.index,
            removed = removable,
            left = self.wal.segment_count(),
            "compacted the raft log"
        );
        Ok(())
    }
}

/// What a checked batch needs beyond its contents.
#[derive(Clone, Copy, Debug, Default)]
struct Plan {
    /// Whether its snapshot is newer than the newest saved (and so saved).
    install: bool,
    /// A `TRUNCATE` to sync before the snapshot: the entries above it are of another history.
    truncate_from: Option<u64>,
}

/// The terms of the log's entries from index `first` on.
#[derive(Debug)]
struct Terms {
    /// The index of the first term (the newest snapshot's index + 1).
    first: u64,
    /// The terms, in index order.
    terms: VecDeque<u64>,
}

impl Terms {
    /// The last entry's index (the snapshot's if there is no entry).
    fn last(&self) -> u64 {
        self.first + self.terms.len() as u64 - 1
    }

    /// The term of the entry at `index`, if the log holds it.
    fn term(&self, index: u64) -> Option<u64> {
        let offset = usize::try_from(index.checked_sub(self.first)?).ok()?;
        self.terms.get(offset).copied()
    }

    /// Drops every entry at `from` or above.
    fn truncate_from(&mut self, from: u64) {
        let keep = usize::try_from(from.saturating_sub(self.first)).unwrap_or(usize::MAX);
        self.terms.truncate(keep);
    }

    /// Appends `entries` (checked to follow the log), replacing those at their indexes and
    /// above.
    fn append(&mut self, entries: &[LogEntry]) {
        if let Some(first) = entries.first() {
            self.truncate_from(first.index);
            self.terms.extend(entries.iter().map(|e| e.term));
        }
    }

    /// Drops every entry at `index` or below: the log then starts after `index`.
    fn compact_through(&mut self, index: u64) {
        if index >= self.last() {
            self.terms.clear();
        } else {
            let drop = usize::try_from(index + 1 - self.first).unwrap_or(usize::MAX);
            self.terms.drain(..drop.min(self.terms.len()));
        }
        self.first = index + 1;
    }
}

/// Creates `dir` if it is missing, and syncs its parent so the new entry survives a crash.
fn create_dir(dir: &Path, sync: bool) -> Result<(), DiskError> {
    if dir.is_dir() {
        return Ok(());
    }
    fs::create_dir_all(dir).map_err(io_at("creating", dir))?;
    if sync {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            record::sync_dir(parent)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
