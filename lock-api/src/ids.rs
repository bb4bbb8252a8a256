//! Identities: members, lock owners and requests.

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{ClusterNameError, MemberNameError};
use crate::wire::ClusterId;

/// The name of a cluster: non-empty UTF-8 of at most [`ClusterName::MAX_LEN`] bytes, without
/// control characters. Only members with the same cluster name hear each other: every datagram
/// carries its hash ([`ClusterName::id`]).
///
/// "Parse, don't validate": a `ClusterName` is valid by construction. Cloning one is cheap.
///
/// ```
/// use conclave_lock_api::{ClusterName, ClusterNameError};
///
/// let name = ClusterName::new("billing-prod")?;
/// assert_eq!(name.as_str(), "billing-prod");
/// assert_eq!(ClusterName::new(""), Err(ClusterNameError::Empty));
/// assert_eq!(ClusterName::new("a\nb"), Err(ClusterNameError::ControlCharacter));
/// assert_eq!(
///     ClusterName::new("c".repeat(65)),
///     Err(ClusterNameError::TooLong { len: 65, max: 64 })
/// );
/// # Ok::<(), ClusterNameError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterName(Arc<str>);

impl ClusterName {
    /// The longest cluster name accepted, in bytes.
    pub const MAX_LEN: usize = 64;

    /// Validates `name` and wraps it.
    ///
    /// # Errors
    /// [`ClusterNameError::Empty`] for an empty name, [`ClusterNameError::TooLong`] above
    /// [`ClusterName::MAX_LEN`] bytes, [`ClusterNameError::ControlCharacter`] for a name with a
    /// control character (newline, tab, escape, ...).
    pub fn new(name: impl Into<String>) -> Result<Self, ClusterNameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(ClusterNameError::Empty);
        }
        if name.len() > Self::MAX_LEN {
            return Err(ClusterNameError::TooLong {
                len: name.len(),
                max: Self::MAX_LEN,
            });
        }
        if name.chars().any(char::is_control) {
            return Err(ClusterNameError::ControlCharacter);
        }
        Ok(Self(name.into()))
    }

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The cluster's id on the wire: [`ClusterId::from_name`] of the name.
    pub fn id(&self) -> ClusterId {
        ClusterId::from_name(&self.0)
    }
}

impl TryFrom<String> for ClusterName {
    type Error = ClusterNameError;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl TryFrom<&str> for ClusterName {
    type Error = ClusterNameError;

    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl fmt::Display for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ClusterName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

/// The identity of one member: one process incarnation in the cluster.
///
/// A `MemberId` is made of a 128-bit incarnation id, a human-readable name and the transport
/// address the member receives on. A process that restarts draws a new incarnation id and is
/// therefore a new member, even with the same name and address.
///
/// The incarnation id is 64 random bits above a 64-bit *generation*
/// ([`MemberId::generation`]): when the incarnation started (the front end uses the wall clock
/// in nanoseconds since the Unix epoch). Generations order the incarnations of one address: of
/// two ids at the same address, the one with the higher generation (ties broken by the whole
/// id) is the newer ([`MemberId::is_newer_incarnation_than`]), and nothing from the older one
/// can displace it.
///
/// Members are ordered by incarnation id first; this order is arbitrary (the random bits come
/// first) but the same at every member, which is what deterministic tie-breaks (merge leaders,
/// duplicate-lock winners) need.
///
/// ```
/// use conclave_lock_api::MemberId;
///
/// let id = MemberId::new(0x1a2b_3c4d_0000_0000_0000_0000_0000_0001, "worker-1", "127.0.0.1:7800".parse()?)?;
/// assert_eq!(id.to_string(), "worker-1#1a2b3c4d");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId(Arc<Parts>);

/// What a [`MemberId`] is made of, shared by its clones (an id is cloned into most messages
/// and table entries; sharing makes that a reference count, and keeps messages small). The
/// field order is the ids' order.
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Parts {
    incarnation: u128,
    name: Box<str>,
    addr: SocketAddr,
}

impl MemberId {
    /// The longest member name accepted, in bytes.
    pub const MAX_NAME_LEN: usize = 64;

    /// Creates a member id from its parts.
    ///
    /// `incarnation` should be drawn once per process start: random high 64 bits (the protocol
    /// relies on the id being unique in the cluster) above a low 64-bit generation that a later
    /// start at the same address exceeds (see [`MemberId::generation`]).
    ///
    /// An IPv6 address keeps its scope id (needed for link-local addresses) but loses its flow
    /// label, which says nothing about who the member is.
    ///
    /// # Errors
    /// [`MemberNameError`] if `name` is longer than [`MemberId::MAX_NAME_LEN`] bytes or contains
    /// control characters. Names decoded from the network are checked the same way.
    pub fn new(
        incarnation: u128,
        name: &str,
        mut addr: SocketAddr,
    ) -> Result<Self, MemberNameError> {
        if let SocketAddr::V6(v6) = &mut addr {
            v6.set_flowinfo(0);
        }
        if name.len() > Self::MAX_NAME_LEN {
            return Err(MemberNameError::TooLong {
                len: name.len(),
                max: Self::MAX_NAME_LEN,
            });
        }
        if name.chars().any(char::is_control) {
            return Err(MemberNameError::ControlCharacter);
        }
        Ok(Self(Arc::new(Parts {
            incarnation,
            name: name.into(),
            addr,
        })))
    }

    /// The id of this process incarnation: random high 64 bits above the generation.
    pub fn incarnation(&self) -> u128 {
        self.0.incarnation
    }

    /// The generation of this incarnation: the low 64 bits of its id, when it started. A
    /// process that restarts at the same address starts with a higher generation.
    ///
    /// ```
    /// use conclave_lock_api::MemberId;
    ///
    /// let addr = "127.0.0.1:7800".parse()?;
    /// let before = MemberId::new(0xffff_0000_0000_0000_0000_0000_0000_0005, "w", addr)?;
    /// let after = MemberId::new(0x0001_0000_0000_0000_0000_0000_0000_0009, "w", addr)?;
    /// assert_eq!(after.generation(), 9);
    /// assert!(after.is_newer_incarnation_than(&before));
    /// assert!(!before.is_newer_incarnation_than(&after));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn generation(&self) -> u64 {
        generation(self.0.incarnation)
    }

    /// Whether this incarnation started after `other`'s: a higher generation, or on a tie the
    /// higher incarnation id (so of two distinct ids exactly one is the newer). Meaningful for
    /// two incarnations of one address, the only ones that can replace each other.
    pub fn is_newer_incarnation_than(&self, other: &MemberId) -> bool {
        incarnation_is_newer(self.incarnation(), other.incarnation())
    }

    /// The human-readable name given at start.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The transport address this member receives on.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }
}

/// The generation (low 64 bits) of an incarnation id.
fn generation(incarnation: u128) -> u64 {
    // Truncation is the point: the generation is the low half.
    #[allow(clippy::cast_possible_truncation)]
    let low = incarnation as u64;
    low
}

/// Whether incarnation id `a` is newer than `b`: a higher generation, ties broken by the whole
/// id. See [`MemberId::is_newer_incarnation_than`].
fn incarnation_is_newer(a: u128, b: u128) -> bool {
    (generation(a), a) > (generation(b), b)
}

impl fmt::Display for MemberId {
    /// `name#xxxxxxxx`: the name and the first 8 hex digits of the incarnation id.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}#{:08x}",
            self.name(),
            (self.incarnation() >> 96) as u32
        )
    }
}

impl fmt::Debug for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}@{}", self.addr())
    }
}

/// The wire form of a [`MemberId`], as it is encoded: carrying the IPv6 scope id that serde's
/// compact `SocketAddr` encoding leaves out. Borrows the name, so encoding allocates nothing.
#[derive(Serialize)]
#[serde(rename = "RawMemberId")]
struct RawMemberIdOut<'a> {
    incarnation: u128,
    name: &'a str,
    addr: SocketAddr,
    #[serde(skip_serializing_if = "is_zero")]
    scope: u32,
}

/// The wire form of a [`MemberId`], as it is decoded (and then validated): the name borrowed
/// from the input where the decoder can, so decoding copies it once, into the id.
#[derive(Deserialize)]
#[serde(rename = "RawMemberId")]
struct RawMemberIdIn<'a> {
    incarnation: u128,
    #[serde(borrow)]
    name: Cow<'a, str>,
    addr: SocketAddr,
    #[serde(default)]
    scope: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

impl Serialize for MemberId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let addr = self.addr();
        let scope = match addr {
            SocketAddr::V6(v6) => v6.scope_id(),
            SocketAddr::V4(_) => 0,
        };
        RawMemberIdOut {
            incarnation: self.incarnation(),
            name: self.name(),
            addr,
            scope,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for MemberId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = RawMemberIdIn::deserialize(deserializer)?;
        let mut addr = raw.addr;
        if let SocketAddr::V6(v6) = &mut addr {
            v6.set_scope_id(raw.scope);
        }
        MemberId::new(raw.incarnation, &raw.name, addr).map_err(serde::de::Error::custom)
    }
}

/// The owner of a lock: a member and an owner number local to that member.
///
/// An owner is never a thread: each `DistributedMutex::lock()` call is its own owner, and a
/// reentrant lock handle with its clones is one owner.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OwnerId {
    /// The member the owner lives on.
    pub member: MemberId,
    /// A number unique among the owners of that member.
    pub local: u64,
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.member, self.local)
    }
}

/// Identifies one lock or unlock request of one member; unique per member incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7800))
    }

    #[test]
    fn display_is_short_and_names_the_incarnation() {
        let id = MemberId::new(0xdead_beef << 96, "a", addr()).unwrap();
        assert_eq!(id.to_string(), "a#deadbeef");
    }

    #[test]
    fn names_are_validated() {
        let long = "x".repeat(65);
        assert_eq!(
            MemberId::new(1, &long, addr()),
            Err(MemberNameError::TooLong { len: 65, max: 64 })
        );
        assert_eq!(
            MemberId::new(1, "a\nb", addr()),
            Err(MemberNameError::ControlCharacter)
        );
        assert!(MemberId::new(1, "", addr()).is_ok());
    }

    #[test]
    fn cluster_names_are_validated() {
        assert_eq!(ClusterName::new(""), Err(ClusterNameError::Empty));
        assert_eq!(
            ClusterName::new("c".repeat(65)),
            Err(ClusterNameError::TooLong { len: 65, max: 64 })
        );
        assert!(ClusterName::new("c".repeat(64)).is_ok());
        for name in ["a\nb", "\t", "\u{1b}[0m", "nul\0", "\u{7f}"] {
            assert_eq!(
                ClusterName::new(name),
                Err(ClusterNameError::ControlCharacter),
                "{name:?}"
            );
        }
        let name = ClusterName::try_from("orders eu-west/1").expect("valid");
        assert_eq!(name.to_string(), "orders eu-west/1");
        assert_eq!(format!("{name:?}"), "\"orders eu-west/1\"");
        assert_eq!(name.id(), ClusterId::from_name("orders eu-west/1"));
    }

    #[test]
    fn restart_is_a_new_member() {
        let a = MemberId::new(1, "a", addr()).unwrap();
        let b = MemberId::new(2, "a", addr()).unwrap();
        assert_ne!(a, b);
        assert!(a < b);
    }
}
