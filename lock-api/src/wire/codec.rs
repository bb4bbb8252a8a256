//! Encoding and decoding of packets and messages.

use serde::de::DeserializeOwned;
use serde::Serialize;
use thiserror::Error;

use super::envelope::{ClusterId, Header, HEADER_LEN, PROTOCOL_VERSION};
use super::message::{Message, Packet};

/// The largest datagram accepted for decoding, in bytes. Larger inputs are refused before
/// any parsing, so decoding allocates at most a small multiple of this.
pub const MAX_PACKET_LEN: usize = 65_535;

/// The largest reassembled [`Message`] accepted, in bytes (16 MiB).
pub const MAX_MESSAGE_LEN: usize = 16 << 20;

/// An upper bound on what a [`Packet`] carrying a data segment adds to its payload: header,
/// sender id (with the longest name) and segment fields. The reliable layer cuts messages into
/// fragments of at most `max_datagram - PACKET_OVERHEAD_MAX` bytes.
pub const PACKET_OVERHEAD_MAX: usize = 384;

/// An upper bound on what each segment after the first adds to a [`Packet`] carrying a
/// bundle of segments, besides its payload.
pub const BUNDLED_SEGMENT_OVERHEAD_MAX: usize = 192;

/// Nesting depth allowed while decoding; our messages nest a handful of levels.
const RECURSION_LIMIT: usize = 32;

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
    #[error("unsupported protocol version {version} (this build speaks {PROTOCOL_VERSION})")]
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
    /// The body is not a valid CBOR encoding of the expected type.
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

/// Encodes `packet` for `cluster`: header, then CBOR.
///
/// # Errors
/// [`EncodeError::TooLarge`] if the datagram would exceed [`MAX_PACKET_LEN`].
pub fn encode_packet(cluster: ClusterId, packet: &Packet) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(128);
    Header::write(cluster, &mut out);
    encode_into(packet, &mut out, MAX_PACKET_LEN)?;
    Ok(out)
}

/// Decodes a datagram of `cluster`.
///
/// # Errors
/// A [`DecodeError`] saying why the bytes were refused; never panics.
pub fn decode_packet(cluster: ClusterId, bytes: &[u8]) -> Result<Packet, DecodeError> {
    if bytes.len() > MAX_PACKET_LEN {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            max: MAX_PACKET_LEN,
        });
    }
    let header = Header::read(bytes)?;
    if header.version != PROTOCOL_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            version: header.version,
        });
    }
    if header.cluster != cluster {
        return Err(DecodeError::ForeignCluster {
            cluster: header.cluster,
        });
    }
    decode_body(&bytes[HEADER_LEN..])
}

/// Encodes a reliable-layer message (no header: it travels inside segments).
///
/// # Errors
/// [`EncodeError::TooLarge`] above [`MAX_MESSAGE_LEN`].
pub fn encode_message(message: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    encode_into(message, &mut out, MAX_MESSAGE_LEN)?;
    Ok(out)
}

/// Decodes a reassembled reliable-layer message.
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
    decode_body(bytes)
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
