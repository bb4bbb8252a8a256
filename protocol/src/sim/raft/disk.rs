//! A member's model disk: what survives its crashes. It holds exactly the persistence batches
//! whose write completed (the engine is told `persisted(seq)` only after that) and the
//! snapshots the member made, with the rules of the front end's store (`mutex/src/raft/disk.rs`):
//! a batch's snapshot replaces the log, its entries replace any entry at their index or
//! above, its hard state replaces the last one; a local snapshot drops the entries it covers.

use crate::raft::persist::{HardState, LogEntry, PersistBatch, Recovered, SnapshotRecord};

/// One member's durable state.
#[derive(Clone, Debug, Default)]
pub(super) struct ModelDisk {
    snapshot: Option<SnapshotRecord>,
    /// Contiguous and ascending, after the snapshot.
    entries: Vec<LogEntry>,
    hard_state: HardState,
    /// The number of starts from this disk (the low half of each incarnation's id).
    pub(super) generation: u64,
    /// The committed entries up to this index were handed to the log checker.
    pub(super) harvested: u64,
}

impl ModelDisk {
    /// Writes a batch: its snapshot (when newer than the one kept), its entries, its hard
    /// state. A batch the front end's store would refuse (entries not contiguous, at or below
    /// the snapshot, or leaving a gap) is an error, and nothing is written.
    pub(super) fn write(&mut self, batch: &PersistBatch) -> Result<(), String> {
        let newer_snapshot = batch
            .snapshot
            .as_ref()
            .filter(|s| s.index > self.snapshot_index());
        let (snapshot_index, last) = match newer_snapshot {
            Some(s) => (s.index, s.index),
            None => (self.snapshot_index(), self.last_index()),
        };
        if let Some(first) = batch.entries.first() {
            if batch
                .entries
                .windows(2)
                .any(|w| w[1].index != w[0].index + 1)
            {
                return Err(format!(
                    "entries not contiguous: {:?}",
                    batch.entries.iter().map(|e| e.index).collect::<Vec<_>>()
                ));
            }
            if first.index <= snapshot_index {
                return Err(format!(
                    "entries from {} at or below the snapshot at {snapshot_index}",
                    first.index
                ));
            }
            if first.index > last + 1 {
                return Err(format!(
                    "entries from {} leave a gap after the last at {last}",
                    first.index
                ));
            }
        }
        if let Some(snapshot) = newer_snapshot {
            self.snapshot = Some(snapshot.clone());
            self.entries.clear();
        }
        if let Some(first) = batch.entries.first() {
            self.entries.retain(|e| e.index < first.index);
            self.entries.extend(batch.entries.iter().cloned());
        }
        if let Some(hs) = batch.hard_state {
            self.hard_state = hs;
        }
        Ok(())
    }

    /// Keeps a snapshot the member made of its applied state and drops the entries it covers
    /// (ignored unless newer than the one kept).
    pub(super) fn compact(&mut self, record: &SnapshotRecord) {
        if record.index > self.snapshot_index() {
            self.entries.retain(|e| e.index > record.index);
            self.snapshot = Some(record.clone());
        }
    }

    /// What a restart finds: the snapshot, the entries after it, the hard state (its commit
    /// raised to the snapshot's index: a snapshot holds only committed entries).
    pub(super) fn recovered(&self) -> Recovered {
        let mut hard_state = self.hard_state;
        hard_state.commit = hard_state.commit.max(self.snapshot_index());
        Recovered {
            hard_state,
            snapshot: self.snapshot.clone(),
            entries: self.entries.clone(),
        }
    }

    /// The index known committed here.
    pub(super) fn commit(&self) -> u64 {
        self.hard_state.commit.max(self.snapshot_index())
    }

    /// The entries known committed here above `after`.
    pub(super) fn committed_after(&self, after: u64) -> impl Iterator<Item = &LogEntry> {
        let commit = self.hard_state.commit;
        self.entries
            .iter()
            .filter(move |e| e.index > after && e.index <= commit)
    }

    fn snapshot_index(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |s| s.index)
    }

    fn last_index(&self) -> u64 {
        self.entries
            .last()
            .map_or(self.snapshot_index(), |e| e.index)
    }

    /// The kept snapshot's index (0: none) and the number of entries after it.
    pub(super) fn shape(&self) -> (u64, usize) {
        (self.snapshot_index(), self.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> LogEntry {
        LogEntry {
            index,
            term,
            kind: 0,
            data: vec![index as u8],
            context: Vec::new(),
        }
    }

    fn batch(entries: Vec<LogEntry>, commit: Option<u64>) -> PersistBatch {
        PersistBatch {
            seq: 1,
            snapshot: None,
            entries,
            hard_state: commit.map(|commit| HardState {
                term: 1,
                vote: 1,
                commit,
            }),
        }
    }

    #[test]
    fn entries_replace_a_suffix_and_snapshots_cut_the_log() {
        let mut disk = ModelDisk::default();
        disk.write(&batch(vec![entry(1, 1), entry(2, 1), entry(3, 1)], Some(1)))
            .unwrap();
        disk.write(&batch(vec![entry(2, 2)], Some(2))).unwrap();
        assert_eq!(disk.recovered().entries, vec![entry(1, 1), entry(2, 2)]);
        assert_eq!(disk.committed_after(0).count(), 2);
        assert!(disk.write(&batch(vec![entry(4, 2)], None)).is_err());
        disk.compact(&SnapshotRecord {
            index: 1,
            term: 1,
            ..SnapshotRecord::default()
        });
        let recovered = disk.recovered();
        assert_eq!(recovered.entries, vec![entry(2, 2)]);
        assert_eq!(recovered.hard_state.commit, 2);
        assert!(disk.write(&batch(vec![entry(1, 2)], None)).is_err());
        let mut received = batch(vec![entry(11, 3)], Some(10));
        received.snapshot = Some(SnapshotRecord {
            index: 10,
            term: 3,
            ..SnapshotRecord::default()
        });
        disk.write(&received).unwrap();
        assert_eq!(disk.shape(), (10, 1));
        assert_eq!(disk.commit(), 10);
    }
}
