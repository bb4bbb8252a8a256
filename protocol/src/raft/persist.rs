//! What a member must keep on disk, in our own types (raft-rs's protobuf types stay inside
//! the engine): log entries, the hard state, snapshots. The front end writes a
//! [`PersistBatch`] durably (one fsync) before it tells the engine it is done, and hands a
//! [`Recovered`] back at start.

use serde::{Deserialize, Serialize};

/// One log entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// Its index, from 1.
    pub index: u64,
    /// The term it was appended in.
    pub term: u64,
    /// raft-rs's entry type (0 normal, 1 configuration change, 2 configuration change v2).
    pub kind: u8,
    /// The entry's data (a [`super::command::Command`] for normal entries).
    #[serde(with = "serde_bytes_compat")]
    pub data: Vec<u8>,
    /// The entry's context.
    #[serde(with = "serde_bytes_compat")]
    pub context: Vec<u8>,
}

/// Raft's hard state: what a member promised and knows committed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardState {
    /// The current term.
    pub term: u64,
    /// Whom this member voted for in that term (0: nobody).
    pub vote: u64,
    /// The highest index known committed.
    pub commit: u64,
}

/// A snapshot of the applied state up to `index`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// The last index it covers.
    pub index: u64,
    /// That entry's term.
    pub term: u64,
    /// The voters' raft ids.
    pub voters: Vec<u64>,
    /// The learners' raft ids.
    pub learners: Vec<u64>,
    /// The applied state (the lock table), encoded.
    #[serde(with = "serde_bytes_compat")]
    pub data: Vec<u8>,
}

/// One durable write: applied in this order — the snapshot (it replaces every entry at or
/// below its index), the entries (each one replaces any entry at its index or above), the hard
/// state. It is durable when the write of it returns (one fsync).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PersistBatch {
    /// Increases by one per batch; the engine is told it with `persisted(seq)`.
    pub seq: u64,
    /// A snapshot received from the leader.
    pub snapshot: Option<SnapshotRecord>,
    /// Entries to append (contiguous, ascending).
    pub entries: Vec<LogEntry>,
    /// A new hard state.
    pub hard_state: Option<HardState>,
}

impl PersistBatch {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none() && self.entries.is_empty() && self.hard_state.is_none()
    }
}

/// What a member found on disk at start: its last hard state, its newest snapshot and the
/// entries after it (contiguous, ascending).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// The hard state (all zero: a fresh member).
    pub hard_state: HardState,
    /// The newest snapshot, if any.
    pub snapshot: Option<SnapshotRecord>,
    /// The entries after the snapshot.
    pub entries: Vec<LogEntry>,
}

/// Byte strings as CBOR byte strings (not arrays of integers), without a serde_bytes crate.
pub(crate) mod serde_bytes_compat {
    use serde::{Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(bytes)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(out)
            }
        }
        d.deserialize_bytes(Visitor)
    }
}
