//! The fixed binary header in front of every datagram.

use std::fmt;

use super::codec::DecodeError;

/// The first four bytes of every Conclave datagram.
pub const MAGIC: [u8; 4] = *b"CNCL";

/// The newest protocol version this build speaks: [`WireVersion::NEWEST`]. Datagrams of a
/// version outside [`MIN_PROTOCOL_VERSION`]`..=PROTOCOL_VERSION` are rejected with
/// [`DecodeError::UnsupportedVersion`].
pub const PROTOCOL_VERSION: u8 = 4;

/// The oldest protocol version this build speaks: [`WireVersion::OLDEST`]. It decodes every
/// version from this one to [`PROTOCOL_VERSION`], and sends this one to a member until it
/// knows that member speaks a newer one (see `docs/protocol.md`, "Wire versions and rolling
/// upgrades").
pub const MIN_PROTOCOL_VERSION: u8 = 3;

/// A protocol version this build speaks: the byte after the magic, and the form of the body.
///
/// ```
/// use conclave_lock_api::wire::{WireVersion, PROTOCOL_VERSION};
///
/// assert_eq!(WireVersion::from_byte(3), Some(WireVersion::V3));
/// assert_eq!(WireVersion::NEWEST.byte(), PROTOCOL_VERSION);
/// assert_eq!(WireVersion::from_byte(2), None);
/// assert!(WireVersion::V3 < WireVersion::V4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum WireVersion {
    /// Version 3: the body is CBOR in cbor4ii's serde mapping, structs as maps keyed by field
    /// name and enum variants by name. Every build since version 3 decodes it.
    V3,
    /// Version 4, the compact form: the same values with structs keyed by field index and enum
    /// variants by index (see `docs/protocol.md`, "Datagram format").
    V4,
}

impl WireVersion {
    /// The oldest version this build speaks ([`MIN_PROTOCOL_VERSION`]).
    pub const OLDEST: Self = Self::V3;
    /// The newest version this build speaks ([`PROTOCOL_VERSION`]).
    pub const NEWEST: Self = Self::V4;

    /// The version of the byte `version`, if this build speaks it.
    pub fn from_byte(version: u8) -> Option<Self> {
        match version {
            3 => Some(Self::V3),
            4 => Some(Self::V4),
            _ => None,
        }
    }

    /// The version's byte in the header.
    pub fn byte(self) -> u8 {
        match self {
            Self::V3 => 3,
            Self::V4 => 4,
        }
    }
}

/// The newest version, [`WireVersion::NEWEST`].
impl Default for WireVersion {
    fn default() -> Self {
        Self::NEWEST
    }
}

/// Length of the fixed header in bytes: magic (4), version (1), cluster id (8).
pub const HEADER_LEN: usize = 13;

/// Identifies a cluster on the wire: a stable 64-bit hash (FNV-1a) of the cluster name.
///
/// Two clusters sharing a multicast group or port ignore each other's datagrams because their
/// ids differ. The hash is stable across processes, platforms and Rust versions.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId(pub u64);

impl ClusterId {
    /// The id of the cluster called `name`.
    pub fn from_name(name: &str) -> Self {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let hash = name
            .bytes()
            .fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME));
        Self(hash)
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterId({:016x})", self.0)
    }
}

/// The decoded fixed header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Protocol version of the sender.
    pub version: u8,
    /// Cluster of the sender.
    pub cluster: ClusterId,
}

impl Header {
    /// Writes the header for `cluster` at the newest protocol version ([`PROTOCOL_VERSION`]).
    pub fn write(cluster: ClusterId, out: &mut Vec<u8>) {
        Self::write_version(cluster, WireVersion::NEWEST, out);
    }

    /// Writes the header for `cluster` at `version`.
    pub fn write_version(cluster: ClusterId, version: WireVersion, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(version.byte());
        out.extend_from_slice(&cluster.0.to_be_bytes());
    }

    /// Reads a header from the front of `bytes` without checking version or cluster.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] if `bytes` is shorter than [`HEADER_LEN`],
    /// [`DecodeError::BadMagic`] if it does not start with [`MAGIC`].
    pub fn read(bytes: &[u8]) -> Result<Self, DecodeError> {
        let header = bytes
            .get(..HEADER_LEN)
            .ok_or(DecodeError::Truncated { len: bytes.len() })?;
        if header[..4] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let mut cluster = [0u8; 8];
        cluster.copy_from_slice(&header[5..13]);
        Ok(Self {
            version: header[4],
            cluster: ClusterId(u64::from_be_bytes(cluster)),
        })
    }
}

/// What the first 13 bytes of a datagram say of its sender, without decoding (or opening) it:
/// how a transport tells a member of its own cluster from a stranger in its discovery report
/// ([`crate::Transport::discovery_report`]). Plain datagrams, sealed packets and the seal
/// layer's rejection notices all start with a 4-byte magic, a version byte and the 8-byte
/// cluster id. Nothing here is authenticated: a sealed packet of our cluster may still fail to
/// open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatagramKind {
    /// A plain datagram ([`MAGIC`]): its protocol version and cluster.
    Plain {
        /// The sender's protocol version.
        version: u8,
        /// The sender's cluster.
        cluster: ClusterId,
    },
    /// A sealed packet (magic `b"CNCS"`, see `seal`) of this cluster.
    Sealed {
        /// The sender's cluster.
        cluster: ClusterId,
    },
    /// A rejection notice of the seal layer (magic `b"CNCR"`): a member of this cluster could
    /// not open the packets it received from us (it holds another cluster key, or none).
    Notice {
        /// The rejecting member's cluster.
        cluster: ClusterId,
    },
}

impl DatagramKind {
    /// Reads the kind of `bytes`; `None` if they start with no Conclave magic or are shorter
    /// than [`HEADER_LEN`].
    ///
    /// ```
    /// use conclave_lock_api::wire::{ClusterId, DatagramKind, Header, PROTOCOL_VERSION};
    ///
    /// let mut bytes = Vec::new();
    /// Header::write(ClusterId(7), &mut bytes);
    /// let kind = DatagramKind::peek(&bytes);
    /// assert_eq!(kind, Some(DatagramKind::Plain { version: PROTOCOL_VERSION, cluster: ClusterId(7) }));
    /// assert_eq!(kind.map(DatagramKind::cluster), Some(ClusterId(7)));
    /// assert_eq!(DatagramKind::peek(b"GET / HTTP/1.1\r\n"), None);
    /// ```
    pub fn peek(bytes: &[u8]) -> Option<Self> {
        let header = bytes.get(..HEADER_LEN)?;
        let mut cluster = [0u8; 8];
        cluster.copy_from_slice(&header[5..13]);
        let cluster = ClusterId(u64::from_be_bytes(cluster));
        match &header[..4] {
            magic if magic == MAGIC => Some(Self::Plain {
                version: header[4],
                cluster,
            }),
            b"CNCS" => Some(Self::Sealed { cluster }),
            b"CNCR" => Some(Self::Notice { cluster }),
            _ => None,
        }
    }

    /// The cluster the datagram names.
    pub fn cluster(self) -> ClusterId {
        match self {
            Self::Plain { cluster, .. } | Self::Sealed { cluster } | Self::Notice { cluster } => {
                cluster
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_are_stable_and_distinct() {
        // FNV-1a of the empty string is the offset basis; pinned so the hash never changes.
        assert_eq!(ClusterId::from_name("").0, 0xcbf2_9ce4_8422_2325);
        assert_eq!(ClusterId::from_name("a").0, 0xaf63_dc4c_8601_ec8c);
        assert_ne!(
            ClusterId::from_name("orders"),
            ClusterId::from_name("billing")
        );
    }

    #[test]
    fn header_round_trips() {
        let mut out = Vec::new();
        Header::write(ClusterId(42), &mut out);
        assert_eq!(out.len(), HEADER_LEN);
        let h = Header::read(&out).unwrap();
        assert_eq!(h.version, PROTOCOL_VERSION);
        assert_eq!(h.cluster, ClusterId(42));
    }

    #[test]
    fn kinds_are_peeked_from_the_magic() {
        let mut plain = Vec::new();
        Header::write(ClusterId(42), &mut plain);
        let mut sealed = plain.clone();
        sealed[..4].copy_from_slice(b"CNCS");
        let mut notice = plain.clone();
        notice[..4].copy_from_slice(b"CNCR");
        let cluster = ClusterId(42);
        assert_eq!(
            DatagramKind::peek(&plain),
            Some(DatagramKind::Plain {
                version: PROTOCOL_VERSION,
                cluster
            })
        );
        assert_eq!(
            DatagramKind::peek(&sealed),
            Some(DatagramKind::Sealed { cluster })
        );
        assert_eq!(
            DatagramKind::peek(&notice),
            Some(DatagramKind::Notice { cluster })
        );
        assert_eq!(DatagramKind::peek(&plain[..HEADER_LEN - 1]), None);
        assert_eq!(DatagramKind::peek(&[0u8; 20]), None);
    }

    #[cfg(feature = "seal")]
    #[test]
    fn the_seal_magics_are_the_seal_layers() {
        assert_eq!(*b"CNCS", crate::seal::SEALED_MAGIC);
        assert_eq!(*b"CNCR", crate::seal::NOTICE_MAGIC);
    }

    #[test]
    fn short_or_foreign_headers_are_rejected() {
        assert_eq!(Header::read(b"CNC"), Err(DecodeError::Truncated { len: 3 }));
        assert_eq!(Header::read(&[0u8; 20]), Err(DecodeError::BadMagic));
    }
}
