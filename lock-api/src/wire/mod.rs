//! The wire format: what crosses the network, and how it is encoded.
//!
//! A datagram is a fixed 13-byte [`Header`] (magic, protocol version, cluster id)
//! followed by a CBOR-encoded [`Packet`]: the sender and one [`Frame`]. Version 3 writes
//! CBOR with field and variant names, version 4 ([`WireVersion`]) the same values in a compact
//! form keyed by index; a build reads both and sends each peer the newest it is known to
//! speak ([`encode_packet_as`], [`decode_datagram`]). Frames are either
//! unreliable (discovery, heartbeats) or part of the reliable layer (data segments and acks).
//! A data segment carries a fragment of an encoded [`Message`]: a membership or lock message.
//!
//! Decoding never panics, refuses inputs above a fixed size before touching them, and reports a
//! typed [`DecodeError`]; a foreign cluster and an unknown protocol version have their own
//! variants so a receiver can log them distinctly.
//!
//! ```
//! use conclave_lock_api::wire::{self, ClusterId, Frame, Packet, Discovery};
//! use conclave_lock_api::MemberId;
//!
//! let cluster = ClusterId::from_name("orders");
//! let sender = MemberId::new(7, "a", "127.0.0.1:7800".parse()?)?;
//! let packet = Packet { sender, frame: Frame::Discovery(Discovery::Ping) };
//! let bytes = wire::encode_packet(cluster, &packet)?;
//! assert_eq!(wire::decode_packet(cluster, &bytes)?, packet);
//! assert!(matches!(
//!     wire::decode_packet(ClusterId::from_name("billing"), &bytes),
//!     Err(wire::DecodeError::ForeignCluster { .. })
//! ));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod codec;
mod compact;
mod envelope;
mod message;
mod payload;

pub use codec::{
    decode_datagram, decode_message, decode_packet, encode_message, encode_message_as,
    encode_packet, encode_packet_as, Datagram, DecodeError, EncodeError,
    BUNDLED_SEGMENT_OVERHEAD_MAX, MAX_MESSAGE_LEN, MAX_PACKET_LEN, PACKET_OVERHEAD_MAX,
};
pub use envelope::{
    ClusterId, DatagramKind, Header, WireVersion, HEADER_LEN, MAGIC, MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
};
#[allow(deprecated)]
pub use message::HeldLock;
pub use message::{
    first_setting_mismatch, Ack, Discovery, Frame, GmsMessage, GrantView, LeaseBeat, LockMessage,
    Message, Packet, PendingRelease, PendingRequest, Probe, ReportedHold, Segment, SharedSetting,
    StreamAck, Successor, TableHolder, TableLock, TableWaiter, MAX_BUNDLE, NODE_GRANT_TOKENS,
    NODE_OWNER, SHARED_SETTINGS_MAX, TABLE_LOCKS_MAX,
};
pub use payload::Payload;
