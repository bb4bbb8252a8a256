//! Encoding and decoding of packets and messages.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::compact;
use super::envelope::{
    ClusterId, Header, WireVersion, HEADER_LEN, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use super::message::{Frame, Message, Packet};
use crate::ids::MemberId;

/// The largest datagram accepted for decoding, in bytes. Larger inputs are refused before
/// any parsing, so decoding allocates at most a small multiple of this.
pub const MAX_PACKET_LEN: usize = 65_535;

/// The largest reassembled [`Message`] accepted, in bytes (16 MiB).
pub const MAX_MESSAGE_LEN: usize = 16 << 20;

/// An upper bound on what a [`Packet`] carrying a data segment adds to its payload: header,
/// sender id (with the longest name) and segment fields, in either version (version 4 adds
/// less). The reliable layer cuts messages into
/// fragments of at most `max_datagram - PACKET_OVERHEAD_MAX` bytes.
pub const PACKET_OVERHEAD_MAX: usize = 384;

/// An upper bound on what each segment after the first adds to a [`Packet`] carrying a
/// bundle of segments, besides its payload.
pub const BUNDLED_SEGMENT_OVERHEAD_MAX: usize = 192;

/// Nesting depth allowed while decoding; our messages nest a handful of levels.
const RECURSION_LIMIT: usize = 32;

/// The first byte of a [`Message`] in the compact form of version 4, before the body. A
/// message of version 3 never starts with it (it is a CBOR map, or a text string for a unit
/// variant), so [`decode_message`] tells the two apart without being told.
const MESSAGE_V4: u8 = 4;

/// Why bytes could not be decoded. Every variant means the input was dropped, nothing else.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Shorter than the fixed header.
    #[error("datagram of {len} bytes is shorter than the header")]
    Truncated {
        /// Length of the input.
        len: usize,
    },
    /// Does not start with the Conclave magic: not our protocol.
    #[error("not a Conclave datagram (bad magic)")]
    BadMagic,
    /// A protocol version this build does not speak.
    #[error(
        "unsupported protocol version {version} \
         (this build speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION})"
    )]
    UnsupportedVersion {
        /// The version found.
        version: u8,
    },
    /// A datagram of another cluster.
    #[error("datagram of a foreign cluster {cluster:?}")]
    ForeignCluster {
        /// The cluster id found.
        cluster: ClusterId,
    },
    /// Larger than the decoder accepts.
    #[error("input of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Length of the input.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The body is not a valid encoding of the expected type (of its version).
    #[error("malformed body: {0}")]
    Malformed(String),
}

/// A value could not be encoded (in practice only when it exceeds a size limit).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The encoding is larger than the limit.
    #[error("encoding of {len} bytes exceeds the limit of {max}")]
    TooLarge {
        /// Length of the encoding.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The serializer failed.
    #[error("serialization failed: {0}")]
    Serialize(String),
}

/// A decoded datagram, with what its header and body say of the sender's versions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Datagram {
    /// The packet.
    pub packet: Packet,
    /// The version it was encoded in.
    pub version: WireVersion,
    /// The newest version the sender and this build both speak, as far as the datagram tells:
    /// its own version, or a newer one the sender named in a version-3 body
    /// ([`encode_packet_as`]).
    pub common: WireVersion,
}

/// Encodes `packet` for `cluster` at version 3, exactly as members of version 3 encode it:
/// header, then CBOR with field and variant names. Every member decodes it; a member that
/// knows its peer's version uses [`encode_packet_as`].
///
/// # Errors
/// [`EncodeError::TooLarge`] if the datagram would exceed [`MAX_PACKET_LEN`].
pub fn encode_packet(cluster: ClusterId, packet: &Packet) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(128);
    Header::write_version(cluster, WireVersion::V3, &mut out);
    encode_into(packet, &mut out, MAX_PACKET_LEN)?;
    Ok(out)
}

/// Encodes `packet` for `cluster` at `version`, as this build sends it. At version 3 the body
/// also says that the sender speaks [`WireVersion::NEWEST`] (an entry `speaks` that members of
/// version 3 skip as an unknown field), so the receiver may answer in it; at version 4 it is
/// the compact form.
///
/// ```
/// use conclave_lock_api::wire::{self, ClusterId, Discovery, Frame, Packet, WireVersion};
/// use conclave_lock_api::MemberId;
///
/// let cluster = ClusterId::from_name("orders");
/// let sender = MemberId::new(7, "a", "127.0.0.1:7800".parse()?)?;
/// let packet = Packet { sender, frame: Frame::Discovery(Discovery::Ping) };
/// let old = wire::encode_packet_as(cluster, &packet, WireVersion::V3)?;
/// let new = wire::encode_packet_as(cluster, &packet, WireVersion::V4)?;
/// assert!(new.len() < old.len());
/// let heard = wire::decode_datagram(cluster, &old)?;
/// assert_eq!((heard.version, heard.common), (WireVersion::V3, WireVersion::V4));
/// assert_eq!(wire::decode_packet(cluster, &new)?, packet);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`EncodeError::TooLarge`] if the datagram would exceed [`MAX_PACKET_LEN`].
pub fn encode_packet_as(
    cluster: ClusterId,
    packet: &Packet,
    version: WireVersion,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(128);
    Header::write_version(cluster, version, &mut out);
    let body = PacketOut {
        sender: &packet.sender,
        frame: &packet.frame,
        speaks: (version < WireVersion::NEWEST).then_some(PROTOCOL_VERSION),
    };
    match version {
        WireVersion::V3 => encode_into(&body, &mut out, MAX_PACKET_LEN)?,
        WireVersion::V4 => encode_compact(&body, &mut out, MAX_PACKET_LEN)?,
    }
    Ok(out)
}

/// Decodes a datagram of `cluster`, of any version this build speaks.
///
/// # Errors
/// A [`DecodeError`] saying why the bytes were refused; never panics.
pub fn decode_packet(cluster: ClusterId, bytes: &[u8]) -> Result<Packet, DecodeError> {
    decode_datagram(cluster, bytes).map(|datagram| datagram.packet)
}

/// Decodes a datagram of `cluster`, of any version this build speaks, and tells its version
/// and the newest version its sender and this build both speak.
///
/// # Errors
/// A [`DecodeError`] saying why the bytes were refused; never panics.
pub fn decode_datagram(cluster: ClusterId, bytes: &[u8]) -> Result<Datagram, DecodeError> {
    if bytes.len() > MAX_PACKET_LEN {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_PACKET_LEN,
        });
    }
    let header = Header::read(bytes)?;
    let version =
        WireVersion::from_byte(header.version).ok_or(DecodeError::UnsupportedVersion {
            version: header.version,
        })?;
    if header.cluster != cluster {
        return Err(DecodeError::ForeignCluster {
            cluster: header.cluster,
        });
    }
    let body = &bytes[HEADER_LEN..];
    let PacketIn {
        sender,
        frame,
        speaks,
    } = match version {
        WireVersion::V3 => decode_body(body)?,
        WireVersion::V4 => decode_compact(body)?,
    };
    // A sender newer than this build names a version this build does not speak: the newest
    // both speak is then this build's newest.
    let common = WireVersion::from_byte(speaks.min(PROTOCOL_VERSION))
        .map_or(version, |said| said.max(version));
    Ok(Datagram {
        packet: Packet { sender, frame },
        version,
        common,
    })
}

/// Encodes a reliable-layer message at version 3 (no header: it travels inside segments).
///
/// # Errors
/// [`EncodeError::TooLarge`] above [`MAX_MESSAGE_LEN`].
pub fn encode_message(message: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    encode_into(message, &mut out, MAX_MESSAGE_LEN)?;
    Ok(out)
}

/// Encodes a reliable-layer message at `version`: at version 4 the byte `4`, then the compact
/// form. [`decode_message`] reads either.
///
/// # Errors
/// [`EncodeError::TooLarge`] above [`MAX_MESSAGE_LEN`].
pub fn encode_message_as(message: &Message, version: WireVersion) -> Result<Vec<u8>, EncodeError> {
    match version {
        WireVersion::V3 => encode_message(message),
        WireVersion::V4 => {
            let mut out = Vec::with_capacity(48);
            out.push(MESSAGE_V4);
            encode_compact(message, &mut out, MAX_MESSAGE_LEN)?;
            Ok(out)
        }
    }
}

/// Decodes a reassembled reliable-layer message of either version: one that starts with the
/// byte `4` is of version 4, any other of version 3.
///
/// # Errors
/// [`DecodeError::TooLarge`] above [`MAX_MESSAGE_LEN`], [`DecodeError::Malformed`] otherwise.
pub fn decode_message(bytes: &[u8]) -> Result<Message, DecodeError> {
    if bytes.len() > MAX_MESSAGE_LEN {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_MESSAGE_LEN,
        });
    }
    match bytes.split_first() {
        Some((&MESSAGE_V4, body)) => decode_compact(body),
        _ => decode_body(bytes),
    }
}

/// A [`Packet`] as this build encodes it: at version 3 with the newest version it speaks.
#[derive(Serialize)]
#[serde(rename = "Packet")]
struct PacketOut<'a> {
    sender: &'a MemberId,
    frame: &'a Frame,
    #[serde(skip_serializing_if = "Option::is_none")]
    speaks: Option<u8>,
}

/// A [`Packet`] as it is decoded, with the version the sender says it speaks (0: not said).
#[derive(Deserialize)]
#[serde(rename = "Packet")]
struct PacketIn {
    sender: MemberId,
    frame: Frame,
    #[serde(default)]
    speaks: u8,
}

fn encode_compact<T: Serialize>(
    value: &T,
    out: &mut Vec<u8>,
    max: usize,
) -> Result<(), EncodeError> {
    compact::encode(value, out).map_err(|e| EncodeError::Serialize(e.to_string()))?;
    if out.len() > max {
        return Err(EncodeError::TooLarge {
            len: out.len(),
            max,
        });
    }
    Ok(())
}

fn decode_compact<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    compact::decode(body, RECURSION_LIMIT).map_err(|e| DecodeError::Malformed(e.to_string()))
}

fn encode_into<T: Serialize>(value: &T, out: &mut Vec<u8>, max: usize) -> Result<(), EncodeError> {
    *out = cbor4ii::serde::to_vec(std::mem::take(out), value)
        .map_err(|e| EncodeError::Serialize(e.to_string()))?;
    if out.len() > max {
        return Err(EncodeError::TooLarge {
            len: out.len(),
            max,
        });
    }
    Ok(())
}

fn decode_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, DecodeError> {
    let mut deserializer = cbor4ii::serde::Deserializer::new(Body {
        rest: body,
        depth_left: RECURSION_LIMIT,
    });
    let value =
        T::deserialize(&mut deserializer).map_err(|e| DecodeError::Malformed(e.to_string()))?;
    let rest = deserializer.into_inner().rest;
    if !rest.is_empty() {
        return Err(DecodeError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok(value)
}

/// The bytes a body is decoded from, with what nesting it has left ([`RECURSION_LIMIT`]).
struct Body<'a> {
    rest: &'a [u8],
    depth_left: usize,
}

impl<'de> cbor4ii::core::dec::Read<'de> for Body<'de> {
    type Error = std::convert::Infallible;

    fn fill<'short>(
        &'short mut self,
        want: usize,
    ) -> Result<cbor4ii::core::dec::Reference<'de, 'short>, Self::Error> {
        let len = self.rest.len().min(want);
        Ok(cbor4ii::core::dec::Reference::Long(&self.rest[..len]))
    }

    fn advance(&mut self, n: usize) {
        self.rest = &self.rest[self.rest.len().min(n)..];
    }

    fn step_in(&mut self) -> bool {
        match self.depth_left.checked_sub(1) {
            Some(left) => {
                self.depth_left = left;
                true
            }
            None => false,
        }
    }

    fn step_out(&mut self) {
        self.depth_left += 1;
    }
}
