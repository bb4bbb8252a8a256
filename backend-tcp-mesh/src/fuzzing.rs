//! The connection format's parsers, for the fuzz targets in `fuzz/`.
//!
//! **Not part of the API.** Compiled only under `--cfg fuzzing` (which cargo-fuzz passes), so no
//! feature of the published crate exposes it; hidden from the docs, and free to change or disappear in any release. It wraps the crate-private frame reader and
//! hello codec of the connection format (see the crate docs) without changing them.

#![doc(hidden)]

use std::io::{self, Read};
use std::net::SocketAddr;

use crate::frame;

/// The length prefix of every frame, in bytes.
pub const HEADER_LEN: usize = frame::HEADER_LEN;
/// The frame limit before the hello: the longest hello payload.
pub const MAX_HELLO: usize = frame::MAX_HELLO;
/// The longest hello frame, prefix included.
pub const MAX_HELLO_FRAME: usize = frame::MAX_HELLO_FRAME;

/// Encodes one frame: the 4-byte big-endian length, then `payload` (at most `u32::MAX` bytes).
pub fn encode_frame(payload: &[u8]) -> Vec<u8> {
    frame::encode(payload)
}

/// The hello frame (prefix included) of a mesh without a key announcing `instance` listening
/// at `addr`.
pub fn encode_hello(instance: u64, addr: SocketAddr) -> Vec<u8> {
    frame::Hello {
        instance,
        addr,
        seal: None,
    }
    .encode()
}

/// A decoded hello (of either version).
#[derive(Debug)]
pub struct DecodedHello(frame::Hello);

impl DecodedHello {
    /// The sender's instance id.
    pub fn instance(&self) -> u64 {
        self.0.instance
    }

    /// The sender's listen address.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }

    /// The hello as a frame again, prefix included.
    pub fn encode(&self) -> Vec<u8> {
        self.0.encode()
    }
}

/// Parses a hello payload (without its prefix).
///
/// # Errors
/// Why the hello was rejected, as the connection would log it.
pub fn decode_hello(payload: &[u8]) -> Result<DecodedHello, String> {
    frame::Hello::decode(payload)
        .map(DecodedHello)
        .map_err(|error| error.to_string())
}

/// What [`FrameReader::parse`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// One whole frame's payload.
    Frame(Vec<u8>),
    /// The next frame is not complete yet.
    Incomplete,
    /// The next frame announces more than the limit: a connection closes here.
    TooLong(u64),
}

/// The receive side of one connection, as a connection drives it: [`FrameReader::parse`]
/// until it is not a frame, then (unless it was too long) [`FrameReader::read_from`].
#[derive(Debug, Default)]
pub struct FrameReader(frame::FrameReader);

impl FrameReader {
    /// Takes the next whole frame out of the buffer, if it is there and within `limit`.
    pub fn parse(&mut self, limit: usize) -> Parsed {
        match self.0.parse(limit) {
            frame::Parsed::Frame(payload) => Parsed::Frame(payload),
            frame::Parsed::Incomplete => Parsed::Incomplete,
            frame::Parsed::TooLong(len) => Parsed::TooLong(len),
        }
    }

    /// Reads once from `source` into the buffer; 0 is the end of the stream. Call it only
    /// after [`FrameReader::parse`] said [`Parsed::Incomplete`] with the same `limit`.
    ///
    /// # Errors
    /// What `source` returned.
    pub fn read_from(&mut self, source: impl Read, limit: usize) -> io::Result<usize> {
        self.0.read_from(source, limit)
    }

    /// Bytes allocated for the buffer.
    pub fn allocated(&self) -> usize {
        self.0.allocated()
    }
}
