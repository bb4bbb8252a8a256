//! The engine's in-memory view of its log: raft-rs's `MemStorage` for entries and hard state,
//! plus the snapshot with its data (the lock table), which `MemStorage` does not keep. The
//! front end makes it durable (`super::persist`); this is what raft-rs reads.

// raft-rs's protobuf messages are built field by field, as its own code does.
#![allow(clippy::field_reassign_with_default)]

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage};

use super::persist::{LogEntry, Recovered, SnapshotRecord};
use super::wire::entry_type;

/// Entries kept below a local snapshot (as on disk).
pub(crate) const KEEP_BEHIND_SNAPSHOT: u64 = 1024;

/// raft-rs's `Storage` for one member.
pub(crate) struct Store {
    mem: MemStorage,
    /// The newest snapshot, with its data (index 0: none).
    snapshot: Snapshot,
}

impl Store {
    /// A store rebuilt from what the member found on disk; a fresh member (nothing recovered)
    /// starts with `voters` as its configuration.
    pub(crate) fn recover(recovered: &Recovered, voters: &[u64]) -> Store {
        let mem = MemStorage::new();
        let mut snapshot = Snapshot::default();
        {
            let mut core = mem.wl();
            match &recovered.snapshot {
                Some(record) => {
                    snapshot = snapshot_of(record);
                    core.apply_snapshot(snapshot.clone())
                        .expect("an empty store takes any snapshot");
                }
                None => core.set_conf_state(ConfState::from((voters.to_vec(), vec![]))),
            }
            let entries: Vec<Entry> = recovered.entries.iter().filter_map(entry_of).collect();
            core.append(&entries)
                .expect("recovered entries follow the snapshot");
            let hs = &recovered.hard_state;
            let mut hard = HardState::default();
            hard.term = hs.term.max(core.hard_state().term);
            hard.vote = hs.vote;
            hard.commit = hs.commit.max(core.hard_state().commit);
            core.set_hardstate(hard);
        }
        Store { mem, snapshot }
    }

    /// Appends entries from a ready (replacing any conflicting suffix).
    pub(crate) fn append(&mut self, entries: &[Entry]) {
        if let Err(e) = self.mem.wl().append(entries) {
            tracing::error!(%e, "raft store: append refused");
        }
    }

    /// Records a hard state from a ready.
    pub(crate) fn set_hard_state(&mut self, hs: HardState) {
        self.mem.wl().set_hardstate(hs);
    }

    /// Installs a snapshot received from the leader (it replaces the log).
    pub(crate) fn install_snapshot(&mut self, snapshot: Snapshot) {
        if let Err(e) = self.mem.wl().apply_snapshot(snapshot.clone()) {
            tracing::warn!(%e, "raft store: snapshot refused");
            return;
        }
        self.snapshot = snapshot;
    }

    /// Keeps a snapshot made locally at `record.index` (applied) and drops the entries more
    /// than [`KEEP_BEHIND_SNAPSHOT`] below it (a follower a little behind catches up from the
    /// log, not from a snapshot).
    pub(crate) fn compact(&mut self, record: &SnapshotRecord) {
        let below = record.index.saturating_sub(KEEP_BEHIND_SNAPSHOT) + 1;
        if Storage::first_index(&self.mem).unwrap_or(0) < below {
            if let Err(e) = self.mem.wl().compact(below) {
                tracing::warn!(%e, "raft store: compaction refused");
                return;
            }
        }
        self.snapshot = snapshot_of(record);
    }

    /// The configuration currently in force.
    pub(crate) fn conf_state(&self) -> ConfState {
        self.mem
            .initial_state()
            .map(|state| state.conf_state)
            .unwrap_or_default()
    }
}

impl Storage for Store {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let index = self.snapshot.metadata.as_ref().map_or(0, |m| m.index);
        if index == 0 || index < request_index {
            return Err(raft::Error::Store(
                raft::StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

/// raft-rs's snapshot of one of ours.
pub(crate) fn snapshot_of(record: &SnapshotRecord) -> Snapshot {
    let mut snapshot = Snapshot::default();
    snapshot.data = record.data.clone().into();
    let meta = snapshot.mut_metadata();
    meta.index = record.index;
    meta.term = record.term;
    meta.set_conf_state(ConfState::from((
        record.voters.clone(),
        record.learners.clone(),
    )));
    snapshot
}

/// Ours of raft-rs's snapshot.
pub(crate) fn record_of(snapshot: &Snapshot) -> SnapshotRecord {
    let meta = snapshot.metadata.as_ref();
    let conf = meta.and_then(|m| m.conf_state.as_ref());
    SnapshotRecord {
        index: meta.map_or(0, |m| m.index),
        term: meta.map_or(0, |m| m.term),
        voters: conf.map(|c| c.voters.clone()).unwrap_or_default(),
        learners: conf.map(|c| c.learners.clone()).unwrap_or_default(),
        data: snapshot.data.to_vec(),
    }
}

/// raft-rs's entry of one of ours (`None` for an unknown entry type: skipped with a warning).
pub(crate) fn entry_of(entry: &LogEntry) -> Option<Entry> {
    let Ok(kind) = entry_type(i32::from(entry.kind)) else {
        tracing::warn!(
            index = entry.index,
            kind = entry.kind,
            "raft store: unknown entry type"
        );
        return None;
    };
    let mut e = Entry::default();
    e.entry_type = kind;
    e.term = entry.term;
    e.index = entry.index;
    e.data = entry.data.clone().into();
    e.context = entry.context.clone().into();
    Some(e)
}

/// Ours of raft-rs's entry.
pub(crate) fn log_entry_of(entry: &Entry) -> LogEntry {
    LogEntry {
        index: entry.index,
        term: entry.term,
        kind: entry.entry_type as u8,
        data: entry.data.to_vec(),
        context: entry.context.to_vec(),
    }
}
