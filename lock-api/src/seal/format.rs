//! The bytes of a sealed packet and of a rejection notice.
//!
//! A sealed packet is a 64-byte header, the ciphertext of the inner datagram (as long as the
//! datagram) and a 16-byte GCM tag:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"CNCS"` |
//! | 4 | seal version, `1` |
//! | 5..13 | cluster id (big-endian) |
//! | 13..17 | key id (big-endian) |
//! | 17..33 | the sender's session id |
//! | 33..41 | the sender's packet counter (big-endian): with four zero bytes in front, the AES-GCM nonce |
//! | 41..64 | the sender's address: family (`4` or `6`), 16 address bytes (an IPv4 address in the first 4, zeros after), port, scope id (big-endian) |
//!
//! The packet is sealed with AES-256-GCM under the sender's session key (derived from the
//! cluster key and the session id) and the whole header as associated data: none of it can be
//! changed without the packet failing to open.
//!
//! A rejection notice (unsealed, 21 bytes) tells a sender its packet did not open: magic
//! `b"CNCR"`, version `1`, cluster id, the key id the packet named (`0` for an unsealed one),
//! the rejecting member's primary key id (`0` when it has no key).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, Nonce, Tag};

use super::key::KeyId;
use crate::wire::ClusterId;

/// The first bytes of a sealed packet.
pub const SEALED_MAGIC: [u8; 4] = *b"CNCS";
/// The first bytes of a rejection notice.
pub const NOTICE_MAGIC: [u8; 4] = *b"CNCR";
/// The version of the sealed format this build speaks.
pub const SEAL_VERSION: u8 = 1;
/// The sealed header's length.
pub const SEALED_HEADER_LEN: usize = 64;
/// The authentication tag's length.
pub const TAG_LEN: usize = 16;
/// What sealing adds to a datagram: header and tag.
pub const SEAL_OVERHEAD: usize = SEALED_HEADER_LEN + TAG_LEN;
/// A rejection notice's length.
pub const NOTICE_LEN: usize = 21;

/// The authenticated header of a sealed packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SealedHeader {
    pub(crate) cluster: ClusterId,
    pub(crate) key: KeyId,
    pub(crate) session: [u8; 16],
    pub(crate) counter: u64,
    pub(crate) sender: SocketAddr,
}

/// Why bytes are not a sealed packet of ours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FormatError {
    /// Shorter than a header and a tag.
    Truncated,
    /// Another magic: not a sealed packet.
    NotSealed,
    /// A seal version this build does not speak.
    Version(u8),
    /// An address family byte that is neither 4 nor 6.
    Address,
}

impl SealedHeader {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&SEALED_MAGIC);
        out.push(SEAL_VERSION);
        out.extend_from_slice(&self.cluster.0.to_be_bytes());
        out.extend_from_slice(&self.key.0.to_be_bytes());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&self.counter.to_be_bytes());
        let (family, ip, scope) = match self.sender {
            SocketAddr::V4(v4) => {
                let mut ip = [0u8; 16];
                ip[..4].copy_from_slice(&v4.ip().octets());
                (4, ip, 0)
            }
            SocketAddr::V6(v6) => (6, v6.ip().octets(), v6.scope_id()),
        };
        out.push(family);
        out.extend_from_slice(&ip);
        out.extend_from_slice(&self.sender.port().to_be_bytes());
        out.extend_from_slice(&scope.to_be_bytes());
    }

    /// Reads the header of a sealed packet (not yet authenticated).
    pub(crate) fn read(bytes: &[u8]) -> Result<Self, FormatError> {
        if bytes.get(..4) != Some(&SEALED_MAGIC[..]) {
            return Err(FormatError::NotSealed);
        }
        if bytes.len() < SEAL_OVERHEAD {
            return Err(FormatError::Truncated);
        }
        if bytes[4] != SEAL_VERSION {
            return Err(FormatError::Version(bytes[4]));
        }
        let u32_at =
            |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let u64_at = |i: usize| (u64::from(u32_at(i)) << 32) | u64::from(u32_at(i + 4));
        let mut session = [0u8; 16];
        session.copy_from_slice(&bytes[17..33]);
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&bytes[42..58]);
        let port = u16::from_be_bytes([bytes[58], bytes[59]]);
        let sender = match bytes[41] {
            4 => SocketAddr::new(IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])), port),
            6 => SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(ip), port, 0, u32_at(60))),
            _ => return Err(FormatError::Address),
        };
        Ok(Self {
            cluster: ClusterId(u64_at(5)),
            key: KeyId(u32_at(13)),
            session,
            counter: u64_at(33),
            sender,
        })
    }

    fn nonce(&self) -> Nonce<aes_gcm::aead::consts::U12> {
        let mut nonce = Nonce::default();
        nonce[4..].copy_from_slice(&self.counter.to_be_bytes());
        nonce
    }
}

/// Seals `datagram` under `header` into a new packet.
pub(crate) fn seal(cipher: &Aes256Gcm, header: &SealedHeader, datagram: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SEAL_OVERHEAD + datagram.len());
    header.write(&mut out);
    out.extend_from_slice(datagram);
    let (aad, body) = out.split_at_mut(SEALED_HEADER_LEN);
    // Encryption fails only for messages beyond the cipher's limit (64 GiB): datagrams are
    // far below it, so the fallback (an unopenable zero tag) never goes out in practice.
    let tag = cipher
        .encrypt_in_place_detached(&header.nonce(), aad, body)
        .unwrap_or_default();
    out.extend_from_slice(&tag);
    out
}

/// Opens a sealed packet whose header was read as `header`: the inner datagram, or `None` if
/// the packet is not authentic (wrong key, or any byte changed).
pub(crate) fn open(cipher: &Aes256Gcm, header: &SealedHeader, packet: &[u8]) -> Option<Vec<u8>> {
    let (aad, rest) = packet.split_at(SEALED_HEADER_LEN);
    let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
    let mut datagram = body.to_vec();
    cipher
        .decrypt_in_place_detached(&header.nonce(), aad, &mut datagram, Tag::from_slice(tag))
        .ok()?;
    Some(datagram)
}

/// A rejection notice: a member could not open a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The key id the rejected packet named; `None` if it was not sealed.
    pub rejected: Option<KeyId>,
    /// The rejecting member's primary key id; `None` if it has no key.
    pub theirs: Option<KeyId>,
}

impl Notice {
    /// The notice as sent on the wire for `cluster` ([`NOTICE_LEN`] bytes, unsealed). A
    /// transport that learns of a rejection itself (the TCP mesh's handshake) delivers one of
    /// these as a datagram from the peer, so the member's [`super::Sealer`] records it.
    pub fn encode(&self, cluster: ClusterId) -> Vec<u8> {
        let mut out = Vec::with_capacity(NOTICE_LEN);
        out.extend_from_slice(&NOTICE_MAGIC);
        out.push(SEAL_VERSION);
        out.extend_from_slice(&cluster.0.to_be_bytes());
        out.extend_from_slice(&self.rejected.map_or(0, |k| k.0).to_be_bytes());
        out.extend_from_slice(&self.theirs.map_or(0, |k| k.0).to_be_bytes());
        out
    }

    /// Reads a notice of `cluster`; `None` for anything else.
    pub(crate) fn decode(cluster: ClusterId, bytes: &[u8]) -> Option<Self> {
        if bytes.len() != NOTICE_LEN || bytes[..4] != NOTICE_MAGIC || bytes[4] != SEAL_VERSION {
            return None;
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&bytes[5..13]);
        if u64::from_be_bytes(id) != cluster.0 {
            return None;
        }
        let key = |i: usize| {
            let k = u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
            (k != 0).then_some(KeyId(k))
        };
        Some(Self {
            rejected: key(13),
            theirs: key(17),
        })
    }
}

#[cfg(test)]
mod tests {
    use aes_gcm::aead::KeyInit;

    use super::*;

    fn header(sender: SocketAddr) -> SealedHeader {
        SealedHeader {
            cluster: ClusterId(7),
            key: KeyId(0xdead_beef),
            session: [3; 16],
            counter: 42,
            sender,
        }
    }

    #[test]
    fn a_sealed_packet_opens_with_its_key_only_and_not_when_changed() {
        let cipher = Aes256Gcm::new(&[9; 32].into());
        let other = Aes256Gcm::new(&[8; 32].into());
        for sender in ["127.0.0.1:7800", "[::1%3]:9"] {
            let h = header(sender.parse().unwrap());
            let packet = seal(&cipher, &h, b"hello");
            assert_eq!(packet.len(), 5 + SEAL_OVERHEAD);
            let read = SealedHeader::read(&packet).unwrap();
            assert_eq!(read, h);
            assert_eq!(open(&cipher, &read, &packet).unwrap(), b"hello");
            assert_eq!(open(&other, &read, &packet), None);
            for i in 0..packet.len() {
                let mut bent = packet.clone();
                bent[i] ^= 1;
                let opened = SealedHeader::read(&bent)
                    .ok()
                    .and_then(|h| open(&cipher, &h, &bent));
                assert_eq!(opened, None, "byte {i} changed and still opened");
            }
        }
        assert_eq!(SealedHeader::read(b"CNCL...."), Err(FormatError::NotSealed));
        assert_eq!(SealedHeader::read(b"CNCS"), Err(FormatError::Truncated));
    }

    #[test]
    fn notices_round_trip_for_their_cluster_only() {
        let n = Notice {
            rejected: Some(KeyId(5)),
            theirs: None,
        };
        let bytes = n.encode(ClusterId(1));
        assert_eq!(bytes.len(), NOTICE_LEN);
        assert_eq!(Notice::decode(ClusterId(1), &bytes), Some(n));
        assert_eq!(Notice::decode(ClusterId(2), &bytes), None);
        assert_eq!(Notice::decode(ClusterId(1), &bytes[1..]), None);
    }
}
