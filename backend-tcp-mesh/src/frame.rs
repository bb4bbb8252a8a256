//! The byte format on a connection: length-prefixed frames, the first of which is a hello.
//!
//! A frame is a 4-byte big-endian payload length followed by the payload. The hello payload
//! is `b"CNCL"`, the version byte [`VERSION`], this process's 8-byte instance id (big-endian),
//! then the sender's listen address: family byte `4` with 4 address bytes and a 2-byte port
//! (20 bytes), or family byte `6` with 16 address bytes, a 2-byte port and a 4-byte scope id
//! (36 bytes). The address must be one a member can be dialled at: not unspecified, not
//! multicast or broadcast, and not port 0.
//!
//! A mesh with a cluster key speaks version [`VERSION_SEALED`]: the same hello, then the
//! 8-byte cluster id, the 4-byte id of the sender's primary key and a fresh 16-byte random
//! challenge (28 bytes more). After the hellos each side sends one proof frame: `b"CNCA"`, the
//! 4-byte key id and the 16-byte tag of a [`HandshakeProof`] (24 bytes).

use std::io::{self, Read};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use conclave_lock_api::seal::{HandshakeProof, KeyId, PROOF_TAG_LEN};
use conclave_lock_api::wire::ClusterId;
use thiserror::Error;

/// The length prefix of every frame, in bytes.
pub(crate) const HEADER_LEN: usize = 4;
/// The first bytes of every hello payload.
pub(crate) const MAGIC: [u8; 4] = *b"CNCL";
/// The version of the connection format a mesh without a cluster key speaks.
pub(crate) const VERSION: u8 = 1;
/// The version of the connection format a mesh with a cluster key speaks.
pub(crate) const VERSION_SEALED: u8 = 2;
/// Hello payload length with an IPv4 listen address.
const HELLO_V4_LEN: usize = 4 + 1 + 8 + 1 + 4 + 2;
/// Hello payload length with an IPv6 listen address.
const HELLO_V6_LEN: usize = 4 + 1 + 8 + 1 + 16 + 2 + 4;
/// What a sealed hello adds: cluster id, key id, challenge.
const SEAL_LEN: usize = 8 + 4 + CHALLENGE_LEN;
/// The length of a sealed hello's random challenge.
pub(crate) const CHALLENGE_LEN: usize = 16;
/// The first bytes of a proof frame's payload.
pub(crate) const PROOF_MAGIC: [u8; 4] = *b"CNCA";
/// A proof frame's payload length.
const PROOF_LEN: usize = 4 + 4 + PROOF_TAG_LEN;
/// The longest hello payload: a first frame announcing more is rejected unread. It is also the
/// limit of every frame before the handshake is over (a proof is shorter).
pub(crate) const MAX_HELLO: usize = HELLO_V6_LEN + SEAL_LEN;
/// The longest hello frame, prefix included.
pub(crate) const MAX_HELLO_FRAME: usize = HEADER_LEN + MAX_HELLO;
/// The most handshake bytes a connection queues ahead of its data: the longest hello frame
/// and, on a keyed mesh, the proof frame.
pub(crate) const MAX_HANDSHAKE_BYTES: usize = MAX_HELLO_FRAME + HEADER_LEN + PROOF_LEN;
/// The least a read asks the kernel for once the hello is in, so small frames arrive in batches.
const READ_CHUNK: usize = 16 * 1024;

/// Encodes one frame: the length prefix, then `payload`.
///
/// The caller has checked `payload.len()` against the frame limit, which fits in a `u32`.
pub(crate) fn encode(payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut frame = Vec::with_capacity(HEADER_LEN + payload.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// The first frame on every connection, in both directions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    /// A random id of the sending process: a different one at the same address is a restart.
    pub(crate) instance: u64,
    /// The sender's listen address.
    pub(crate) addr: SocketAddr,
    /// What a mesh with a cluster key adds (version [`VERSION_SEALED`]).
    pub(crate) seal: Option<HelloSeal>,
}

/// The part of a hello only a mesh with a cluster key sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HelloSeal {
    /// The sender's cluster.
    pub(crate) cluster: ClusterId,
    /// The sender's primary key id (public, as in every sealed packet).
    pub(crate) key: KeyId,
    /// Fresh random bytes: the proof the sender expects covers them.
    pub(crate) challenge: [u8; CHALLENGE_LEN],
}

/// Why a hello was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub(crate) enum HelloError {
    /// The payload does not start with [`MAGIC`]: not a Conclave TCP peer.
    #[error("bad magic")]
    Magic,
    /// A version this crate does not speak.
    #[error("unknown version {0}")]
    Version(u8),
    /// The length or address family is wrong.
    #[error("malformed hello")]
    Malformed,
    /// The listen address cannot be dialled: unspecified, multicast or broadcast IP, or port 0.
    #[error("hello names {0}, which cannot be dialled")]
    Address(SocketAddr),
}

impl Hello {
    /// The hello as a whole frame, prefix included.
    pub(crate) fn encode(&self) -> Vec<u8> {
        encode(&self.payload())
    }

    /// The hello's payload, without its prefix: what a handshake's transcript holds.
    pub(crate) fn payload(&self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(MAX_HELLO);
        payload.extend_from_slice(&MAGIC);
        payload.push(if self.seal.is_some() {
            VERSION_SEALED
        } else {
            VERSION
        });
        payload.extend_from_slice(&self.instance.to_be_bytes());
        match self.addr {
            SocketAddr::V4(a) => {
                payload.push(4);
                payload.extend_from_slice(&a.ip().octets());
                payload.extend_from_slice(&a.port().to_be_bytes());
            }
            SocketAddr::V6(a) => {
                payload.push(6);
                payload.extend_from_slice(&a.ip().octets());
                payload.extend_from_slice(&a.port().to_be_bytes());
                payload.extend_from_slice(&a.scope_id().to_be_bytes());
            }
        }
        if let Some(seal) = &self.seal {
            payload.extend_from_slice(&seal.cluster.0.to_be_bytes());
            payload.extend_from_slice(&seal.key.0.to_be_bytes());
            payload.extend_from_slice(&seal.challenge);
        }
        payload
    }

    /// Parses a hello payload (without its prefix).
    pub(crate) fn decode(payload: &[u8]) -> Result<Self, HelloError> {
        if payload.len() < 5 || payload[..4] != MAGIC {
            return Err(HelloError::Magic);
        }
        let (payload, seal) = match payload[4] {
            VERSION => (payload, None),
            VERSION_SEALED => {
                let at = payload
                    .len()
                    .checked_sub(SEAL_LEN)
                    .ok_or(HelloError::Malformed)?;
                let (payload, seal) = payload.split_at(at);
                let (cluster, rest) = split::<8>(seal).ok_or(HelloError::Malformed)?;
                let (key, rest) = split::<4>(rest).ok_or(HelloError::Malformed)?;
                let (challenge, _) = split::<CHALLENGE_LEN>(rest).ok_or(HelloError::Malformed)?;
                let seal = HelloSeal {
                    cluster: ClusterId(u64::from_be_bytes(cluster)),
                    key: KeyId(u32::from_be_bytes(key)),
                    challenge,
                };
                (payload, Some(seal))
            }
            other => return Err(HelloError::Version(other)),
        };
        // A sealed hello shorter than its seal leaves less than the magic and version here.
        let after_version = payload.get(5..).ok_or(HelloError::Malformed)?;
        let (instance, rest) = split::<8>(after_version).ok_or(HelloError::Malformed)?;
        let instance = u64::from_be_bytes(instance);
        let addr = match (payload.len(), rest.first()) {
            (HELLO_V4_LEN, Some(4)) => {
                let (ip, rest) = split::<4>(&rest[1..]).ok_or(HelloError::Malformed)?;
                let (port, _) = split::<2>(rest).ok_or(HelloError::Malformed)?;
                SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(ip),
                    u16::from_be_bytes(port),
                ))
            }
            (HELLO_V6_LEN, Some(6)) => {
                let (ip, rest) = split::<16>(&rest[1..]).ok_or(HelloError::Malformed)?;
                let (port, rest) = split::<2>(rest).ok_or(HelloError::Malformed)?;
                let (scope, _) = split::<4>(rest).ok_or(HelloError::Malformed)?;
                SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(ip),
                    u16::from_be_bytes(port),
                    0,
                    u32::from_be_bytes(scope),
                ))
            }
            _ => return Err(HelloError::Malformed),
        };
        if !dialable(addr) {
            return Err(HelloError::Address(addr));
        }
        Ok(Self {
            instance,
            addr,
            seal,
        })
    }
}

/// A proof frame, prefix included.
pub(crate) fn encode_proof(proof: &HandshakeProof) -> Vec<u8> {
    let mut payload = Vec::with_capacity(PROOF_LEN);
    payload.extend_from_slice(&PROOF_MAGIC);
    payload.extend_from_slice(&proof.key.0.to_be_bytes());
    payload.extend_from_slice(&proof.tag);
    encode(&payload)
}

/// Parses a proof frame's payload; `None` if it is not one.
pub(crate) fn decode_proof(payload: &[u8]) -> Option<HandshakeProof> {
    if payload.len() != PROOF_LEN || payload[..4] != PROOF_MAGIC {
        return None;
    }
    let (key, rest) = split::<4>(&payload[4..])?;
    let (tag, _) = split::<PROOF_TAG_LEN>(rest)?;
    Some(HandshakeProof {
        key: KeyId(u32::from_be_bytes(key)),
        tag,
    })
}

/// Whether `addr` can be a member's listen address: a unicast IP that is not unspecified, and
/// a port other than 0.
fn dialable(addr: SocketAddr) -> bool {
    let ip = addr.ip().to_canonical();
    let broadcast = matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
    addr.port() != 0 && !ip.is_unspecified() && !ip.is_multicast() && !broadcast
}

/// The first `N` bytes as an array, and the rest.
fn split<const N: usize>(bytes: &[u8]) -> Option<([u8; N], &[u8])> {
    let head = bytes.get(..N)?.try_into().ok()?;
    Some((head, &bytes[N..]))
}

/// What [`FrameReader::parse`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// One whole frame's payload.
    Frame(Vec<u8>),
    /// The next frame is not complete yet.
    Incomplete,
    /// The next frame announces more than the limit: the connection must be closed.
    TooLong(u64),
}

/// The receive side of one connection: bytes read but not yet returned as frames.
///
/// Its buffer never exceeds `limit + 4` bytes (it reads ahead up to 16 KiB when frames are
/// small), and nothing a prefix announces is allocated before the announced length has been
/// checked against the limit.
#[derive(Debug, Default)]
pub(crate) struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl FrameReader {
    /// Takes the next whole frame out of the buffer, if it is there and within `limit`.
    pub(crate) fn parse(&mut self, limit: usize) -> Parsed {
        let Some(len) = self.announced() else {
            return Parsed::Incomplete;
        };
        if len > limit as u64 {
            return Parsed::TooLong(len);
        }
        let total = HEADER_LEN + len as usize;
        if self.end - self.start < total {
            return Parsed::Incomplete;
        }
        let payload = self.buf[self.start + HEADER_LEN..self.start + total].to_vec();
        self.start += total;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        Parsed::Frame(payload)
    }

    /// Reads once from `source` into the buffer, making room for the frame in progress (whose
    /// announced length [`FrameReader::parse`] has checked against `limit`). Returns what
    /// `read` returned: 0 is the end of the stream.
    pub(crate) fn read_from(&mut self, mut source: impl Read, limit: usize) -> io::Result<usize> {
        let needed = HEADER_LEN + self.announced().map_or(0, |len| len as usize);
        let chunk = if limit <= MAX_HELLO {
            MAX_HELLO_FRAME
        } else {
            READ_CHUNK
        };
        let size = needed.max(chunk.min(HEADER_LEN + limit));
        let free_tail = self.buf.len() - self.end;
        if self.start + needed > self.buf.len() || (self.start > 0 && free_tail < size / 4) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < size {
            // Exactly what is needed: `resize` alone may double the capacity, past the
            // documented bound of one frame and its prefix.
            self.buf.reserve_exact(size - self.buf.len());
            self.buf.resize(size, 0);
        }
        debug_assert!(self.end < self.buf.len(), "a read needs room");
        let n = source.read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// Bytes buffered and not yet returned.
    #[cfg(test)]
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Bytes allocated for the buffer.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn allocated(&self) -> usize {
        self.buf.capacity()
    }

    /// The payload length the next frame's prefix announces, once the prefix is in.
    fn announced(&self) -> Option<u64> {
        if self.end - self.start < HEADER_LEN {
            return None;
        }
        let prefix: [u8; HEADER_LEN] = self.buf[self.start..self.start + HEADER_LEN]
            .try_into()
            .ok()?;
        Some(u64::from(u32::from_be_bytes(prefix)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source handing out its bytes a few at a time.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.0.len().min(self.1).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_sealed_hello_shorter_than_its_seal_is_malformed_not_a_panic() {
        // Found by the tcp_frames fuzz target: version 2 with fewer bytes than the seal.
        let payload = [
            b'C', b'N', b'C', b'L', 2, 0, 5, 0, 0, 0, 20, 67, 78, 67, 76, 1, 1, 2,
        ];
        assert_eq!(Hello::decode(&payload), Err(HelloError::Malformed));
        for len in 5..60 {
            let mut p = vec![7u8; len];
            p[..4].copy_from_slice(&MAGIC);
            p[4] = VERSION_SEALED;
            let _ = Hello::decode(&p);
        }
    }

    #[test]
    fn hellos_round_trip_for_both_families_and_versions() {
        let seal = HelloSeal {
            cluster: ClusterId(0x1122_3344_5566_7788),
            key: KeyId(0xdead_beef),
            challenge: [9; CHALLENGE_LEN],
        };
        for (addr, seal) in ["127.0.0.1:7800", "[::1]:7801", "[fe80::1%3]:9"]
            .into_iter()
            .flat_map(|a| [(a, None), (a, Some(seal))])
        {
            let hello = Hello {
                instance: 0x0102_0304_0506_0708,
                addr: addr.parse().unwrap(),
                seal,
            };
            let frame = hello.encode();
            assert!(frame.len() <= MAX_HELLO_FRAME);
            let mut reader = FrameReader::default();
            reader.read_from(&frame[..], MAX_HELLO).unwrap();
            let Parsed::Frame(payload) = reader.parse(MAX_HELLO) else {
                panic!("a whole hello");
            };
            assert_eq!(Hello::decode(&payload), Ok(hello));
        }
    }

    #[test]
    fn bad_hellos_are_named() {
        let hello = Hello {
            instance: 7,
            addr: "127.0.0.1:1".parse().unwrap(),
            seal: None,
        };
        let payload = hello.encode()[HEADER_LEN..].to_vec();
        let mut bad = payload.clone();
        bad[0] = b'X';
        assert_eq!(Hello::decode(&bad), Err(HelloError::Magic));
        let mut bad = payload.clone();
        bad[4] = 9;
        assert_eq!(Hello::decode(&bad), Err(HelloError::Version(9)));
        let mut bad = payload.clone();
        bad[13] = 6;
        assert_eq!(Hello::decode(&bad), Err(HelloError::Malformed));
        assert_eq!(
            Hello::decode(&payload[..payload.len() - 1]),
            Err(HelloError::Malformed)
        );
        assert_eq!(Hello::decode(b"GET "), Err(HelloError::Magic));
    }

    #[test]
    fn hellos_must_name_a_dialable_address() {
        for addr in [
            "127.0.0.1:0",
            "0.0.0.0:7800",
            "224.0.0.1:7800",
            "255.255.255.255:7800",
            "[::]:7800",
            "[ff02::1]:7800",
            "[::ffff:0.0.0.0]:7800",
            "[::ffff:239.1.2.3]:7800",
        ] {
            let addr: SocketAddr = addr.parse().unwrap();
            let payload = Hello {
                instance: 1,
                addr,
                seal: None,
            }
            .encode()[HEADER_LEN..]
                .to_vec();
            assert_eq!(
                Hello::decode(&payload),
                Err(HelloError::Address(addr)),
                "{addr}"
            );
        }
    }

    #[test]
    fn proofs_round_trip_and_fit_before_the_handshake() {
        let proof = HandshakeProof {
            key: KeyId(7),
            tag: [3; PROOF_TAG_LEN],
        };
        let frame = encode_proof(&proof);
        assert!(frame.len() - HEADER_LEN <= MAX_HELLO);
        assert_eq!(decode_proof(&frame[HEADER_LEN..]), Some(proof));
        assert_eq!(decode_proof(&frame[HEADER_LEN + 1..]), None);
        let hello = Hello {
            instance: 1,
            addr: "127.0.0.1:1".parse().unwrap(),
            seal: None,
        };
        assert_eq!(decode_proof(&hello.payload()), None);
    }

    #[test]
    fn frames_arrive_whole_from_any_split() {
        let mut stream = Vec::new();
        for len in [0, 1, 5, 300, 20_000, 65_535] {
            stream.extend(encode(&vec![len as u8; len]));
        }
        for step in [1, 3, 4, 7, 1000, usize::MAX] {
            let mut source = Trickle(&stream, step);
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            for _ in 0..1_000_000 {
                match reader.parse(65_535) {
                    Parsed::Frame(f) => got.push(f),
                    Parsed::TooLong(len) => panic!("too long: {len}"),
                    Parsed::Incomplete => {
                        if reader.read_from(&mut source, 65_535).unwrap() == 0 {
                            break;
                        }
                    }
                }
            }
            let lens: Vec<usize> = got.iter().map(Vec::len).collect();
            assert_eq!(lens, [0, 1, 5, 300, 20_000, 65_535], "step {step}");
            assert!(got.iter().all(|f| f.iter().all(|b| *b == f.len() as u8)));
            assert_eq!(reader.buffered(), 0);
            assert!(reader.allocated() <= HEADER_LEN + 65_535);
        }
    }

    #[test]
    fn an_oversized_prefix_is_refused_before_allocating() {
        let mut reader = FrameReader::default();
        let announced = [0xff, 0xff, 0xff, 0xff, 1, 2, 3];
        reader.read_from(&announced[..], 65_535).unwrap();
        assert_eq!(reader.parse(65_535), Parsed::TooLong(u64::from(u32::MAX)));
        assert!(reader.allocated() <= READ_CHUNK);

        // Before the hello the limit is the hello's size.
        let mut reader = FrameReader::default();
        reader.read_from(&encode(&[0; 100])[..], MAX_HELLO).unwrap();
        assert_eq!(reader.parse(MAX_HELLO), Parsed::TooLong(100));
        assert!(reader.allocated() <= MAX_HELLO_FRAME);
    }
}
