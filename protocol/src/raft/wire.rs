//! Raft traffic on our wire: a serde mirror of raft-rs's messages, so its protobuf types
//! never reach the network (we never parse protobuf), in packets of their own cluster id.
//!
//! A packet is our 13-byte header (magic, protocol version, cluster id) and a CBOR
//! [`RaftPacket`]. Its body did not change with protocol version 4: it is sent as version 3,
//! which every build reads, and read as either. The cluster id is [`raft_cluster_id`]: the cluster name's id mixed with a
//! tag, so a group-backend member of the same cluster name drops Raft packets as foreign, and
//! the other way round. Sealing with the cluster key happens below, in the transport, as for
//! every datagram.

// raft-rs's protobuf messages are built field by field, as its own code does.
#![allow(clippy::field_reassign_with_default)]

use conclave_lock_api::wire::{ClusterId, Header, WireVersion, HEADER_LEN};
use conclave_lock_api::MemberId;
use raft::eraftpb;
use serde::{Deserialize, Serialize};

use super::persist::serde_bytes_compat as bytes;

/// The largest Raft packet accepted, in bytes (a snapshot travels in one message).
pub const MAX_RAFT_PACKET_LEN: usize = 16 << 20;

/// The cluster id of the Raft engine's packets in the cluster `name`.
pub fn raft_cluster_id(name: &str) -> ClusterId {
    ClusterId::from_name(&format!("{name}\u{0}raft"))
}

/// One datagram of Raft traffic between two members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaftPacket {
    /// The sender's incarnation (its name says which configured peer it is).
    pub from: MemberId,
    /// What it carries.
    pub body: RaftBody,
}

/// What a Raft packet carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RaftBody {
    /// A message of the Raft protocol.
    Raft(RaftWire),
}

/// A Raft message, field for field raft-rs's `eraftpb::Message`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct RaftWire {
    pub msg_type: i32,
    pub to: u64,
    pub from: u64,
    pub term: u64,
    pub log_term: u64,
    pub index: u64,
    pub entries: Vec<WireEntry>,
    pub commit: u64,
    pub commit_term: u64,
    pub snapshot: Option<WireSnapshot>,
    pub request_snapshot: u64,
    pub reject: bool,
    pub reject_hint: u64,
    #[serde(with = "bytes")]
    pub context: Vec<u8>,
    pub priority: i64,
}

/// A log entry in a Raft message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct WireEntry {
    pub entry_type: i32,
    pub term: u64,
    pub index: u64,
    #[serde(with = "bytes")]
    pub data: Vec<u8>,
    #[serde(with = "bytes")]
    pub context: Vec<u8>,
}

/// A snapshot in a Raft message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct WireSnapshot {
    #[serde(with = "bytes")]
    pub data: Vec<u8>,
    pub index: u64,
    pub term: u64,
    pub voters: Vec<u64>,
    pub learners: Vec<u64>,
    pub voters_outgoing: Vec<u64>,
    pub learners_next: Vec<u64>,
    pub auto_leave: bool,
}

/// Why a Raft message from the network was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RaftWireError {
    /// A message or entry type this build does not know.
    #[error("unknown {what} type {value}")]
    UnknownType {
        /// Message or entry.
        what: &'static str,
        /// The value.
        value: i32,
    },
    /// Not a Raft packet of this cluster.
    #[error("not a Raft packet of this cluster: {0}")]
    Undecodable(String),
}

impl From<&eraftpb::Message> for RaftWire {
    fn from(m: &eraftpb::Message) -> Self {
        RaftWire {
            msg_type: m.msg_type as i32,
            to: m.to,
            from: m.from,
            term: m.term,
            log_term: m.log_term,
            index: m.index,
            entries: m.entries.iter().map(WireEntry::from).collect(),
            commit: m.commit,
            commit_term: m.commit_term,
            snapshot: m.snapshot.as_ref().map(WireSnapshot::from),
            request_snapshot: m.request_snapshot,
            reject: m.reject,
            reject_hint: m.reject_hint,
            context: m.context.to_vec(),
            priority: m.priority,
        }
    }
}

impl From<&eraftpb::Entry> for WireEntry {
    fn from(e: &eraftpb::Entry) -> Self {
        WireEntry {
            entry_type: e.entry_type as i32,
            term: e.term,
            index: e.index,
            data: e.data.to_vec(),
            context: e.context.to_vec(),
        }
    }
}

impl From<&eraftpb::Snapshot> for WireSnapshot {
    fn from(s: &eraftpb::Snapshot) -> Self {
        let meta = s.metadata.as_ref();
        let conf = meta.and_then(|m| m.conf_state.as_ref());
        WireSnapshot {
            data: s.data.to_vec(),
            index: meta.map_or(0, |m| m.index),
            term: meta.map_or(0, |m| m.term),
            voters: conf.map(|c| c.voters.clone()).unwrap_or_default(),
            learners: conf.map(|c| c.learners.clone()).unwrap_or_default(),
            voters_outgoing: conf.map(|c| c.voters_outgoing.clone()).unwrap_or_default(),
            learners_next: conf.map(|c| c.learners_next.clone()).unwrap_or_default(),
            auto_leave: conf.is_some_and(|c| c.auto_leave),
        }
    }
}

/// raft-rs's message type from its number.
fn message_type(value: i32) -> Result<eraftpb::MessageType, RaftWireError> {
    use eraftpb::MessageType::*;
    Ok(match value {
        0 => MsgHup,
        1 => MsgBeat,
        2 => MsgPropose,
        3 => MsgAppend,
        4 => MsgAppendResponse,
        5 => MsgRequestVote,
        6 => MsgRequestVoteResponse,
        7 => MsgSnapshot,
        8 => MsgHeartbeat,
        9 => MsgHeartbeatResponse,
        10 => MsgUnreachable,
        11 => MsgSnapStatus,
        12 => MsgCheckQuorum,
        13 => MsgTransferLeader,
        14 => MsgTimeoutNow,
        15 => MsgReadIndex,
        16 => MsgReadIndexResp,
        17 => MsgRequestPreVote,
        18 => MsgRequestPreVoteResponse,
        _ => {
            return Err(RaftWireError::UnknownType {
                what: "message",
                value,
            })
        }
    })
}

/// raft-rs's entry type from its number.
pub(crate) fn entry_type(value: i32) -> Result<eraftpb::EntryType, RaftWireError> {
    Ok(match value {
        0 => eraftpb::EntryType::EntryNormal,
        1 => eraftpb::EntryType::EntryConfChange,
        2 => eraftpb::EntryType::EntryConfChangeV2,
        _ => {
            return Err(RaftWireError::UnknownType {
                what: "entry",
                value,
            })
        }
    })
}

impl WireEntry {
    /// The raft-rs entry.
    pub fn to_raft(&self) -> Result<eraftpb::Entry, RaftWireError> {
        let mut e = eraftpb::Entry::default();
        e.entry_type = entry_type(self.entry_type)?;
        e.term = self.term;
        e.index = self.index;
        e.data = self.data.clone().into();
        e.context = self.context.clone().into();
        Ok(e)
    }
}

impl WireSnapshot {
    /// The raft-rs snapshot.
    pub fn to_raft(&self) -> eraftpb::Snapshot {
        let mut conf = eraftpb::ConfState::default();
        conf.voters = self.voters.clone();
        conf.learners = self.learners.clone();
        conf.voters_outgoing = self.voters_outgoing.clone();
        conf.learners_next = self.learners_next.clone();
        conf.auto_leave = self.auto_leave;
        let mut meta = eraftpb::SnapshotMetadata::default();
        meta.index = self.index;
        meta.term = self.term;
        meta.set_conf_state(conf);
        let mut s = eraftpb::Snapshot::default();
        s.data = self.data.clone().into();
        s.set_metadata(meta);
        s
    }
}

impl RaftWire {
    /// The raft-rs message; refuses unknown types (never a panic on input from the network).
    pub fn to_raft(&self) -> Result<eraftpb::Message, RaftWireError> {
        let mut m = eraftpb::Message::default();
        m.msg_type = message_type(self.msg_type)?;
        m.to = self.to;
        m.from = self.from;
        m.term = self.term;
        m.log_term = self.log_term;
        m.index = self.index;
        m.entries = self
            .entries
            .iter()
            .map(WireEntry::to_raft)
            .collect::<Result<Vec<_>, _>>()?
            .into();
        m.commit = self.commit;
        m.commit_term = self.commit_term;
        if let Some(s) = &self.snapshot {
            m.set_snapshot(s.to_raft());
        }
        m.request_snapshot = self.request_snapshot;
        m.reject = self.reject;
        m.reject_hint = self.reject_hint;
        m.context = self.context.clone().into();
        m.priority = self.priority;
        Ok(m)
    }
}

/// Encodes a packet for `cluster` (see [`raft_cluster_id`]).
pub fn encode_packet(cluster: ClusterId, packet: &RaftPacket) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    Header::write_version(cluster, WireVersion::V3, &mut out);
    cbor4ii::serde::to_writer(&mut out, packet).expect("a packet always encodes");
    out
}

/// Decodes a packet of `cluster`; anything else (garbage, truncated, foreign, too large, of
/// another version) is an error, never a panic.
pub fn decode_packet(cluster: ClusterId, bytes: &[u8]) -> Result<RaftPacket, RaftWireError> {
    if bytes.len() > MAX_RAFT_PACKET_LEN {
        return Err(RaftWireError::Undecodable(format!(
            "{} bytes is above the limit",
            bytes.len()
        )));
    }
    let header = Header::read(bytes).map_err(|e| RaftWireError::Undecodable(e.to_string()))?;
    if WireVersion::from_byte(header.version).is_none() || header.cluster != cluster {
        return Err(RaftWireError::Undecodable(
            "another cluster or version".into(),
        ));
    }
    cbor4ii::serde::from_slice(&bytes[HEADER_LEN..])
        .map_err(|e| RaftWireError::Undecodable(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member() -> MemberId {
        MemberId::new(7, "a", "127.0.0.1:1".parse().unwrap()).unwrap()
    }

    #[test]
    fn a_message_survives_the_wire() {
        let mut m = eraftpb::Message::default();
        m.msg_type = eraftpb::MessageType::MsgAppend;
        m.to = 2;
        m.from = 1;
        m.term = 5;
        m.index = 9;
        let mut e = eraftpb::Entry::default();
        e.index = 10;
        e.term = 5;
        e.data = vec![1, 2, 3].into();
        m.entries = vec![e].into();
        let wire = RaftWire::from(&m);
        let cluster = raft_cluster_id("c");
        let packet = RaftPacket {
            from: member(),
            body: RaftBody::Raft(wire.clone()),
        };
        let bytes = encode_packet(cluster, &packet);
        let back = decode_packet(cluster, &bytes).unwrap();
        assert_eq!(back, packet);
        let RaftBody::Raft(w) = back.body;
        assert_eq!(w.to_raft().unwrap(), m);
    }

    #[test]
    fn garbage_foreign_and_unknown_types_are_refused() {
        let cluster = raft_cluster_id("c");
        assert!(decode_packet(cluster, b"garbage").is_err());
        let packet = RaftPacket {
            from: member(),
            body: RaftBody::Raft(RaftWire::default()),
        };
        let bytes = encode_packet(cluster, &packet);
        assert!(decode_packet(raft_cluster_id("d"), &bytes).is_err());
        assert!(decode_packet(ClusterId::from_name("c"), &bytes).is_err());
        for cut in 0..bytes.len() {
            let _ = decode_packet(cluster, &bytes[..cut]);
        }
        let odd = RaftWire {
            msg_type: 99,
            ..RaftWire::default()
        };
        assert!(odd.to_raft().is_err());
    }
}
