//! The bytes of a sealed packet and of a rejection notice.
//!
//! A sealed packet is a 73-byte header, the ciphertext of the inner datagram (as long as the
//! datagram) and a 16-byte GCM tag:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `b"CNCS"` |
//! | 4 | seal version, `2` |
//! | 5..13 | cluster id (big-endian) |
//! | 13..17 | key id (big-endian) |
//! | 17..33 | the sender's session id |
//! | 33..41 | the sender's packet counter (big-endian): with four zero bytes in front, the AES-GCM nonce |
//! | 41..49 | when the sender sealed it: its wall clock, milliseconds since the Unix epoch (big-endian) |
//! | 49..72 | the sender's address: family (`4` or `6`), 16 address bytes (an IPv4 address in the first 4, zeros after), port, scope id (big-endian) |
//! | 72 | destination: `0` one member (the receiver), `1` the discovery channel (any member) |
//!
//! The packet is sealed with AES-256-GCM under the sender's session key (derived from the
//! cluster key and the session id). The associated data is the whole header followed by the
//! destination's address in the same 23-byte form — the receiver's own address for a packet to
//! one member, zeros for discovery — which is not sent: a packet sealed for one member does not
//! open at another, and no header byte can be changed without the packet failing to open.
//!
//! A rejection notice (unsealed, 37 bytes) tells a sender its packet did not open: magic
//! `b"CNCR"`, version `2`, cluster id, the key id the packet named (`0` for an unsealed one),
//! the rejecting member's primary key id (`0` when it has no key), and the session id of the
//! rejected packet (zeros for an unsealed one), so that a sender counts only notices about its
//! own packets.

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
pub const SEAL_VERSION: u8 = 2;
/// The sealed header's length.
pub const SEALED_HEADER_LEN: usize = 73;
/// The authentication tag's length.
pub const TAG_LEN: usize = 16;
/// What sealing adds to a datagram: header and tag.
pub const SEAL_OVERHEAD: usize = SEALED_HEADER_LEN + TAG_LEN;
/// A rejection notice's length.
pub const NOTICE_LEN: usize = 37;
/// The length of an address in the header and the associated data.
const ADDR_LEN: usize = 23;

/// Where a sealed packet is going.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    /// One member, at this address.
    Member(SocketAddr),
    /// The discovery channel: any member may receive it.
    Discovery,
}

/// The header of a sealed packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SealedHeader {
    pub(crate) cluster: ClusterId,
    pub(crate) key: KeyId,
    pub(crate) session: [u8; 16],
    pub(crate) counter: u64,
    /// The sender's wall clock when it sealed the packet, in ms since the Unix epoch.
    pub(crate) sent_ms: u64,
    pub(crate) sender: SocketAddr,
    /// Sent to the discovery channel (not to one member).
    pub(crate) discovery: bool,
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
    /// An address family or destination byte out of range.
    Malformed,
}

fn write_addr(addr: Option<SocketAddr>, out: &mut Vec<u8>) {
    let (family, ip, port, scope) = match addr {
        Some(SocketAddr::V4(v4)) => {
            let mut ip = [0u8; 16];
            ip[..4].copy_from_slice(&v4.ip().octets());
            (4, ip, v4.port(), 0)
        }
        Some(SocketAddr::V6(v6)) => (6, v6.ip().octets(), v6.port(), v6.scope_id()),
        None => (0, [0u8; 16], 0, 0),
    };
    out.push(family);
    out.extend_from_slice(&ip);
    out.extend_from_slice(&port.to_be_bytes());
    out.extend_from_slice(&scope.to_be_bytes());
}

fn read_addr(bytes: &[u8]) -> Option<SocketAddr> {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&bytes[1..17]);
    let port = u16::from_be_bytes([bytes[17], bytes[18]]);
    let scope = u32::from_be_bytes([bytes[19], bytes[20], bytes[21], bytes[22]]);
    match bytes[0] {
        4 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3])),
            port,
        )),
        6 => Some(SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(ip),
            port,
            0,
            scope,
        ))),
        _ => None,
    }
}

fn u64_at(bytes: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[i..i + 8]);
    u64::from_be_bytes(b)
}

fn u32_at(bytes: &[u8], i: usize) -> u32 {
    u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]])
}

impl SealedHeader {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&SEALED_MAGIC);
        out.push(SEAL_VERSION);
        out.extend_from_slice(&self.cluster.0.to_be_bytes());
        out.extend_from_slice(&self.key.0.to_be_bytes());
        out.extend_from_slice(&self.session);
        out.extend_from_slice(&self.counter.to_be_bytes());
        out.extend_from_slice(&self.sent_ms.to_be_bytes());
        write_addr(Some(self.sender), out);
        out.push(u8::from(self.discovery));
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
        let mut session = [0u8; 16];
        session.copy_from_slice(&bytes[17..33]);
        let sender = read_addr(&bytes[49..72]).ok_or(FormatError::Malformed)?;
        let discovery = match bytes[72] {
            0 => false,
            1 => true,
            _ => return Err(FormatError::Malformed),
        };
        Ok(Self {
            cluster: ClusterId(u64_at(bytes, 5)),
            key: KeyId(u32_at(bytes, 13)),
            session,
            counter: u64_at(bytes, 33),
            sent_ms: u64_at(bytes, 41),
            sender,
            discovery,
        })
    }

    fn nonce(&self) -> Nonce<aes_gcm::aead::consts::U12> {
        let mut nonce = Nonce::default();
        nonce[4..].copy_from_slice(&self.counter.to_be_bytes());
        nonce
    }
}

/// The associated data: the header's bytes, then the destination's address.
fn associated(header: &[u8], to: Option<SocketAddr>) -> Vec<u8> {
    let mut aad = Vec::with_capacity(SEALED_HEADER_LEN + ADDR_LEN);
    aad.extend_from_slice(header);
    write_addr(to, &mut aad);
    aad
}

/// Seals `datagram` under `header` for `to` into a new packet.
pub(crate) fn seal(
    cipher: &Aes256Gcm,
    header: &SealedHeader,
    to: Destination,
    datagram: &[u8],
) -> Vec<u8> {
    debug_assert_eq!(header.discovery, to == Destination::Discovery);
    let mut out = Vec::with_capacity(SEAL_OVERHEAD + datagram.len());
    header.write(&mut out);
    let aad = associated(
        &out,
        match to {
            Destination::Member(addr) => Some(addr),
            Destination::Discovery => None,
        },
    );
    out.extend_from_slice(datagram);
    // Encryption fails only for messages beyond the cipher's limit (64 GiB): datagrams are
    // far below it, so the fallback (an unopenable zero tag) never goes out in practice.
    let tag = cipher
        .encrypt_in_place_detached(&header.nonce(), &aad, &mut out[SEALED_HEADER_LEN..])
        .unwrap_or_default();
    out.extend_from_slice(&tag);
    out
}

/// Opens a sealed packet whose header was read as `header`, received by the member at `me`:
/// the inner datagram, or `None` if the packet is not authentic (a wrong key, any byte
/// changed, or sealed for another member).
pub(crate) fn open(
    cipher: &Aes256Gcm,
    header: &SealedHeader,
    me: SocketAddr,
    packet: &[u8],
) -> Option<Vec<u8>> {
    let (head, rest) = packet.split_at(SEALED_HEADER_LEN);
    let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
    let aad = associated(head, (!header.discovery).then_some(me));
    let mut datagram = body.to_vec();
    cipher
        .decrypt_in_place_detached(&header.nonce(), &aad, &mut datagram, Tag::from_slice(tag))
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
    /// The session id of the rejected packet (zeros: it was not sealed).
    pub session: [u8; 16],
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
        out.extend_from_slice(&self.session);
        out
    }

    /// Reads a notice of `cluster`; `None` for anything else.
    pub fn decode(cluster: ClusterId, bytes: &[u8]) -> Option<Self> {
        if bytes.len() != NOTICE_LEN || bytes[..4] != NOTICE_MAGIC || bytes[4] != SEAL_VERSION {
            return None;
        }
        if u64_at(bytes, 5) != cluster.0 {
            return None;
        }
        let key = |i: usize| {
            let k = u32_at(bytes, i);
            (k != 0).then_some(KeyId(k))
        };
        let mut session = [0u8; 16];
        session.copy_from_slice(&bytes[21..37]);
        Some(Self {
            rejected: key(13),
            theirs: key(17),
            session,
        })
    }
}

#[cfg(test)]
mod tests {
    use aes_gcm::aead::KeyInit;

    use super::*;

    fn header(sender: SocketAddr, discovery: bool) -> SealedHeader {
        SealedHeader {
            cluster: ClusterId(7),
            key: KeyId(0xdead_beef),
            session: [3; 16],
            counter: 42,
            sent_ms: 1_700_000_000_000,
            sender,
            discovery,
        }
    }

    #[test]
    fn a_sealed_packet_opens_with_its_key_at_its_destination_only_and_not_when_changed() {
        let cipher = Aes256Gcm::new(&[9; 32].into());
        let other = Aes256Gcm::new(&[8; 32].into());
        let me: SocketAddr = "127.0.0.1:7801".parse().unwrap();
        let someone_else: SocketAddr = "127.0.0.1:7802".parse().unwrap();
        for sender in ["127.0.0.1:7800", "[::1%3]:9"] {
            let h = header(sender.parse().unwrap(), false);
            let packet = seal(&cipher, &h, Destination::Member(me), b"hello");
            assert_eq!(packet.len(), 5 + SEAL_OVERHEAD);
            let read = SealedHeader::read(&packet).unwrap();
            assert_eq!(read, h);
            assert_eq!(open(&cipher, &read, me, &packet).unwrap(), b"hello");
            assert_eq!(open(&other, &read, me, &packet), None);
            assert_eq!(open(&cipher, &read, someone_else, &packet), None);
            for i in 0..packet.len() {
                let mut bent = packet.clone();
                bent[i] ^= 1;
                let opened = SealedHeader::read(&bent)
                    .ok()
                    .and_then(|h| open(&cipher, &h, me, &bent));
                assert_eq!(opened, None, "byte {i} changed and still opened");
            }
            let h = header(sender.parse().unwrap(), true);
            let packet = seal(&cipher, &h, Destination::Discovery, b"ping");
            let read = SealedHeader::read(&packet).unwrap();
            assert!(read.discovery);
            assert_eq!(open(&cipher, &read, me, &packet).unwrap(), b"ping");
            assert_eq!(
                open(&cipher, &read, someone_else, &packet).unwrap(),
                b"ping"
            );
        }
        assert_eq!(SealedHeader::read(b"CNCL...."), Err(FormatError::NotSealed));
        assert_eq!(SealedHeader::read(b"CNCS"), Err(FormatError::Truncated));
    }

    #[test]
    fn notices_round_trip_for_their_cluster_only() {
        let n = Notice {
            rejected: Some(KeyId(5)),
            theirs: None,
            session: [9; 16],
        };
        let bytes = n.encode(ClusterId(1));
        assert_eq!(bytes.len(), NOTICE_LEN);
        assert_eq!(Notice::decode(ClusterId(1), &bytes), Some(n));
        assert_eq!(Notice::decode(ClusterId(2), &bytes), None);
        assert_eq!(Notice::decode(ClusterId(1), &bytes[1..]), None);
    }
}
