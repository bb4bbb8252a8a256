//! The write-ahead log: segments `wal/<sequence>.log` of records (see the module above for the
//! format), appended to the newest and removed from the oldest.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use conclave_protocol::raft::persist::{HardState, LogEntry};
use tracing::{debug, warn};

use super::error::{io_at, DiskError};
use super::record::{self, Decoded, ENTRIES, HARD_STATE, TRUNCATE};

/// One segment file.
#[derive(Debug)]
struct Segment {
    /// Its sequence number (its name), from 1, increasing.
    seq: u64,
    /// Its size.
    bytes: u64,
    /// The highest entry index written in it (0: none).
    max_index: u64,
}

/// The log's segments, the newest open for appending.
#[derive(Debug)]
pub(super) struct Wal {
    /// `wal/`.
    dir: PathBuf,
    /// Whether appends are synced.
    sync: bool,
    /// The size past which the next append starts a new segment.
    segment_bytes: u64,
    /// Oldest first; never empty: the last one is the active one.
    segments: Vec<Segment>,
    /// The active segment, opened for appending.
    active: File,
    /// The segment holding the last hard state record, if any.
    hard_state_seq: Option<u64>,
}

/// What replaying the log found.
#[derive(Debug, Default)]
pub(super) struct Replay {
    /// The log: contiguous and ascending, starting wherever the oldest record left it (the
    /// caller joins it to the snapshot).
    pub(super) entries: Vec<LogEntry>,
    /// The last hard state.
    pub(super) hard_state: HardState,
    /// Bytes of the records from the first one holding an entry above the snapshot's index.
    pub(super) bytes_above_snapshot: u64,
}

impl Wal {
    /// Opens the log in `dir` (which exists) and replays it. A record that is cut short or
    /// fails its checksum ends the log: the segment is truncated there, provided no later
    /// segment holds anything (a segment is only started once the one before it is synced,
    /// so a bad record followed by more segments is damage, not a torn write).
    ///
    /// # Errors
    /// [`DiskError::Corrupt`] for damage before the tail, a record that checks but does not
    /// decode, or an unknown kind; [`DiskError::Io`] if a file cannot be read or truncated.
    pub(super) fn recover(
        dir: PathBuf,
        sync: bool,
        segment_bytes: u64,
        snapshot_index: u64,
    ) -> Result<(Self, Replay), DiskError> {
        let seqs = list(&dir)?;
        let mut replay = Replay::default();
        let mut counting = false;
        let mut hard_state_seq = None;
        let mut segments = Vec::with_capacity(seqs.len());
        for (position, &seq) in seqs.iter().enumerate() {
            let path = segment_path(&dir, seq);
            let bytes = fs::read(&path).map_err(io_at("reading", &path))?;
            let mut segment = Segment {
                seq,
                bytes: 0,
                max_index: 0,
            };
            let mut offset = 0;
            loop {
                let (kind, body, size) = match record::decode(&bytes[offset..]) {
                    Decoded::Record { kind, body, size } => (kind, body, size),
                    Decoded::End => break,
                    Decoded::Bad(why) => {
                        truncate_tail(&dir, &seqs[position..], offset, why, sync)?;
                        break;
                    }
                };
                let last = replay.apply(kind, body, &path)?;
                if kind == HARD_STATE {
                    hard_state_seq = Some(seq);
                }
                segment.max_index = segment.max_index.max(last);
                counting |= last > snapshot_index;
                if counting {
                    replay.bytes_above_snapshot += size as u64;
                }
                offset += size;
            }
            segment.bytes = offset as u64;
            let torn = offset < bytes.len();
            segments.push(segment);
            if torn {
                break;
            }
        }
        if segments.is_empty() {
            create_segment(&dir, 1, sync)?;
            segments.push(Segment {
                seq: 1,
                bytes: 0,
                max_index: 0,
            });
        }
        let seq = segments.last().map_or(1, |s| s.seq);
        let path = segment_path(&dir, seq);
        let active = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io_at("opening", &path))?;
        let wal = Wal {
            dir,
            sync,
            segment_bytes,
            segments,
            active,
            hard_state_seq,
        };
        Ok((wal, replay))
    }

    /// Appends `records` to the active segment (starting a new one first if it is full), then
    /// syncs it. `max_index` is the highest entry index among them (0: none), `hard_state`
    /// whether they hold a hard state.
    pub(super) fn append(
        &mut self,
        records: &[u8],
        max_index: u64,
        hard_state: bool,
    ) -> Result<(), DiskError> {
        if self.active().bytes >= self.segment_bytes {
            self.roll()?;
        }
        let path = segment_path(&self.dir, self.active().seq);
        self.active
            .write_all(records)
            .map_err(io_at("appending to", &path))?;
        if self.sync {
            self.active.sync_data().map_err(io_at("syncing", &path))?;
        }
        let active = self.active_mut();
        active.bytes += records.len() as u64;
        active.max_index = active.max_index.max(max_index);
        let seq = active.seq;
        if hard_state {
            self.hard_state_seq = Some(seq);
        }
        Ok(())
    }

    /// How many of the oldest segments, never the active one, hold no entry at `threshold`
    /// or above; removing them leaves a log that replays the same above `threshold`.
    pub(super) fn removable(&self, threshold: u64) -> usize {
        let closed = &self.segments[..self.segments.len() - 1];
        closed
            .iter()
            .take_while(|s| s.max_index < threshold)
            .count()
    }

    /// Whether the last hard state record is in the oldest `count` segments.
    pub(super) fn hard_state_among(&self, count: usize) -> bool {
        match (self.hard_state_seq, count.checked_sub(1)) {
            (Some(seq), Some(last)) => self.segments.get(last).is_some_and(|s| seq <= s.seq),
            _ => false,
        }
    }

    /// Removes the oldest `count` segments (at most [`Wal::removable`]), oldest first.
    pub(super) fn remove_oldest(&mut self, count: usize) -> Result<(), DiskError> {
        for _ in 0..count.min(self.segments.len() - 1) {
            let path = segment_path(&self.dir, self.segments[0].seq);
            fs::remove_file(&path).map_err(io_at("removing", &path))?;
            self.segments.remove(0);
            debug!(path = %path.display(), "removed a raft log segment below the snapshot");
        }
        if self.sync {
            record::sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The number of segment files.
    pub(super) fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// The segment appended to.
    fn active(&self) -> &Segment {
        &self.segments[self.segments.len() - 1]
    }

    /// The segment appended to.
    fn active_mut(&mut self) -> &mut Segment {
        let last = self.segments.len() - 1;
        &mut self.segments[last]
    }

    /// Starts the next segment; the directory is synced so the new file survives a crash.
    fn roll(&mut self) -> Result<(), DiskError> {
        let seq = self.active().seq + 1;
        self.active = create_segment(&self.dir, seq, self.sync)?;
        self.segments.push(Segment {
            seq,
            bytes: 0,
            max_index: 0,
        });
        debug!(seq, "started a raft log segment");
        Ok(())
    }
}

impl Replay {
    /// Applies one record; returns the highest entry index it holds (0: none).
    fn apply(&mut self, kind: u8, body: &[u8], path: &Path) -> Result<u64, DiskError> {
        match kind {
            ENTRIES => {
                let entries: Vec<LogEntry> = cbor4ii::serde::from_slice(body)
                    .map_err(|e| record::undecodable(path, "entries", e))?;
                let Some(first) = entries.first().map(|e| e.index) else {
                    return Err(DiskError::Corrupt(format!(
                        "{}: an empty entries record",
                        path.display()
                    )));
                };
                let contiguous = first > 0
                    && entries
                        .iter()
                        .zip(first..)
                        .all(|(entry, index)| entry.index == index);
                if !contiguous {
                    return Err(DiskError::Corrupt(format!(
                        "{}: an entries record that is not contiguous",
                        path.display()
                    )));
                }
                let last = first + entries.len() as u64 - 1;
                self.truncate_from(first);
                if self.entries.last().is_some_and(|e| e.index + 1 != first) {
                    // A gap: a snapshot received beyond the log covers what lies between.
                    self.entries.clear();
                }
                self.entries.extend(entries);
                Ok(last)
            }
            HARD_STATE => {
                self.hard_state = cbor4ii::serde::from_slice(body)
                    .map_err(|e| record::undecodable(path, "hard state", e))?;
                Ok(0)
            }
            TRUNCATE => {
                let from: u64 = cbor4ii::serde::from_slice(body)
                    .map_err(|e| record::undecodable(path, "truncate", e))?;
                self.truncate_from(from);
                Ok(0)
            }
            other => Err(DiskError::Corrupt(format!(
                "{}: a record of unknown kind {other}",
                path.display()
            ))),
        }
    }

    /// Drops every entry at `from` or above.
    fn truncate_from(&mut self, from: u64) {
        let Some(start) = self.entries.first().map(|e| e.index) else {
            return;
        };
        let keep = usize::try_from(from.saturating_sub(start)).unwrap_or(usize::MAX);
        self.entries.truncate(keep);
    }
}

/// Handles a bad record at `offset` of the first of `seqs` (the rest are the later segments):
/// truncates the segment there and removes the later ones if they are all empty; otherwise
/// the log is damaged before its tail.
fn truncate_tail(
    dir: &Path,
    seqs: &[u64],
    offset: usize,
    why: &str,
    sync: bool,
) -> Result<(), DiskError> {
    let path = segment_path(dir, seqs[0]);
    for &later in &seqs[1..] {
        let later = segment_path(dir, later);
        let size = fs::metadata(&later)
            .map_err(io_at("reading", &later))?
            .len();
        if size > 0 {
            return Err(DiskError::Corrupt(format!(
                "{}: {why} at byte {offset}, before the end of the log ({} follows)",
                path.display(),
                later.display()
            )));
        }
    }
    warn!(
        path = %path.display(),
        offset,
        why,
        "raft log ends in a torn or damaged record (a write cut by a crash); truncating it there"
    );
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(io_at("opening", &path))?;
    file.set_len(offset as u64)
        .map_err(io_at("truncating", &path))?;
    if sync {
        file.sync_all().map_err(io_at("syncing", &path))?;
    }
    for &later in &seqs[1..] {
        let later = segment_path(dir, later);
        fs::remove_file(&later).map_err(io_at("removing", &later))?;
    }
    if sync && seqs.len() > 1 {
        record::sync_dir(dir)?;
    }
    Ok(())
}

/// Creates segment `seq` (which must not exist) for appending.
fn create_segment(dir: &Path, seq: u64, sync: bool) -> Result<File, DiskError> {
    let path = segment_path(dir, seq);
    let file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(&path)
        .map_err(io_at("creating", &path))?;
    if sync {
        record::sync_dir(dir)?;
    }
    Ok(file)
}

/// The path of segment `seq`.
fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.log"))
}

/// The sequence numbers of the segments in `dir`, ascending.
fn list(dir: &Path) -> Result<Vec<u64>, DiskError> {
    let mut seqs = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_at("listing", dir))? {
        let name = entry.map_err(io_at("listing", dir))?.file_name();
        let seq = name
            .to_str()
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        seqs.extend(seq);
    }
    seqs.sort_unstable();
    Ok(seqs)
}
