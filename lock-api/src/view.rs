//! Views: the agreed membership of the cluster at one moment.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ids::MemberId;

/// Identifies a view: a monotonic epoch and the coordinator that installed it.
///
/// Every member installs views in strictly increasing epoch order. Views are ordered by epoch,
/// then by coordinator, so two views installed concurrently in separate partitions still have a
/// total order.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ViewId {
    /// Increases with every view a coordinator installs; a merge view exceeds all merged epochs.
    pub epoch: u64,
    /// The member that installed the view, its first member.
    pub coordinator: MemberId,
}

impl fmt::Display for ViewId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.epoch, self.coordinator)
    }
}

/// A view was malformed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ViewError {
    /// A view needs at least one member, its coordinator.
    #[error("a view has no members")]
    Empty,
    /// A member appears twice.
    #[error("member {0} appears twice in the view")]
    DuplicateMember(MemberId),
}

/// The ordered list of members the cluster agrees on, with the id of the view.
///
/// The first member is the coordinator: the oldest member, which installs the next views and,
/// by default, grants locks.
///
/// ```
/// use conclave_lock_api::{MemberId, View};
///
/// let a = MemberId::new(1, "a", "127.0.0.1:1".parse()?)?;
/// let b = MemberId::new(2, "b", "127.0.0.1:2".parse()?)?;
/// let view = View::new(7, vec![a.clone(), b.clone()])?;
/// assert_eq!(view.coordinator(), &a);
/// assert!(view.contains(&b));
/// assert_eq!(view.id().epoch, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawView", into = "RawView")]
pub struct View {
    id: ViewId,
    members: Vec<MemberId>,
}

impl View {
    /// Creates the view with `epoch` whose coordinator is `members[0]`.
    ///
    /// # Errors
    /// [`ViewError::Empty`] without members, [`ViewError::DuplicateMember`] if one repeats.
    pub fn new(epoch: u64, members: Vec<MemberId>) -> Result<Self, ViewError> {
        let coordinator = members.first().ok_or(ViewError::Empty)?.clone();
        let mut sorted: Vec<&MemberId> = members.iter().collect();
        sorted.sort_unstable();
        if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(ViewError::DuplicateMember(pair[0].clone()));
        }
        Ok(Self {
            id: ViewId { epoch, coordinator },
            members,
        })
    }

    /// The view's id.
    pub fn id(&self) -> &ViewId {
        &self.id
    }

    /// The view's epoch; shorthand for `id().epoch`.
    pub fn epoch(&self) -> u64 {
        self.id.epoch
    }

    /// The coordinator, the first member.
    pub fn coordinator(&self) -> &MemberId {
        &self.id.coordinator
    }

    /// The members, coordinator first, then in order of joining.
    pub fn members(&self) -> &[MemberId] {
        &self.members
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a view has at least its coordinator. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Whether `member` is in the view.
    pub fn contains(&self, member: &MemberId) -> bool {
        self.members.contains(member)
    }

    /// The position of `member` in the view (0 is the coordinator).
    pub fn rank(&self, member: &MemberId) -> Option<usize> {
        self.members.iter().position(|m| m == member)
    }

    /// A 64-bit digest of the epoch and the ordered members (incarnation, name, address):
    /// FNV-1a over a fixed layout, the same on every platform and release. It names a view in
    /// a [`GmsMessage::InstallViewDelta`](crate::wire::GmsMessage::InstallViewDelta) and
    /// checks the view a receiver rebuilds from it; it is not a cryptographic hash.
    ///
    /// ```
    /// use conclave_lock_api::{MemberId, View};
    ///
    /// let a = MemberId::new(1, "a", "127.0.0.1:1".parse()?)?;
    /// let b = MemberId::new(2, "b", "127.0.0.1:2".parse()?)?;
    /// let ab = View::new(7, vec![a.clone(), b.clone()])?;
    /// assert_eq!(ab.digest(), View::new(7, vec![a.clone(), b.clone()])?.digest());
    /// assert_ne!(ab.digest(), View::new(7, vec![b, a])?.digest());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn digest(&self) -> u64 {
        let mut hash = Fnv1a::default();
        hash.write(&self.id.epoch.to_le_bytes());
        hash.write(&(self.members.len() as u64).to_le_bytes());
        for member in &self.members {
            hash.write(&member.incarnation().to_le_bytes());
            hash.write(&(member.name().len() as u64).to_le_bytes());
            hash.write(member.name().as_bytes());
            match member.addr() {
                std::net::SocketAddr::V4(v4) => {
                    hash.write(&[4]);
                    hash.write(&v4.ip().octets());
                    hash.write(&v4.port().to_le_bytes());
                }
                std::net::SocketAddr::V6(v6) => {
                    hash.write(&[6]);
                    hash.write(&v6.ip().octets());
                    hash.write(&v6.port().to_le_bytes());
                    hash.write(&v6.scope_id().to_le_bytes());
                }
            }
        }
        hash.0
    }
}

/// The 64-bit FNV-1a hash, written out so that digests never change with the toolchain.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

impl fmt::Display for View {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}|", self.id.epoch)?;
        for (i, m) in self.members.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{m}")?;
        }
        f.write_str("]")
    }
}

/// The wire form of a view; validated into a [`View`] on decode.
#[derive(Serialize, Deserialize)]
struct RawView {
    epoch: u64,
    members: Vec<MemberId>,
}

impl TryFrom<RawView> for View {
    type Error = ViewError;

    fn try_from(raw: RawView) -> Result<Self, Self::Error> {
        View::new(raw.epoch, raw.members)
    }
}

impl From<View> for RawView {
    fn from(view: View) -> Self {
        RawView {
            epoch: view.id.epoch,
            members: view.members,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(n: u128) -> MemberId {
        MemberId::new(n, "m", SocketAddr::from(([127, 0, 0, 1], n as u16))).unwrap()
    }
    use std::net::SocketAddr;

    #[test]
    fn rejects_empty_and_duplicates() {
        assert_eq!(View::new(1, vec![]), Err(ViewError::Empty));
        assert_eq!(
            View::new(1, vec![member(1), member(2), member(1)]),
            Err(ViewError::DuplicateMember(member(1)))
        );
    }

    #[test]
    fn coordinator_is_first_and_rank_follows_order() {
        let v = View::new(3, vec![member(5), member(2)]).unwrap();
        assert_eq!(v.coordinator(), &member(5));
        assert_eq!(v.rank(&member(2)), Some(1));
        assert_eq!(v.rank(&member(9)), None);
        assert_eq!(v.len(), 2);
        assert!(!v.is_empty());
    }

    #[test]
    fn view_ids_order_by_epoch_first() {
        let a = ViewId {
            epoch: 2,
            coordinator: member(9),
        };
        let b = ViewId {
            epoch: 3,
            coordinator: member(1),
        };
        assert!(a < b);
    }

    #[test]
    fn digest_is_fixed_and_sees_epoch_order_and_identity() {
        let v = View::new(3, vec![member(5), member(2)]).unwrap();
        // Fixed across platforms and releases: deltas name views by it.
        assert_eq!(v.digest(), 0xcd55_e113_688d_bfd4);
        assert_eq!(
            v.digest(),
            View::new(3, vec![member(5), member(2)]).unwrap().digest()
        );
        assert_ne!(
            v.digest(),
            View::new(4, vec![member(5), member(2)]).unwrap().digest()
        );
        assert_ne!(
            v.digest(),
            View::new(3, vec![member(2), member(5)]).unwrap().digest()
        );
        let renamed = MemberId::new(2, "x", SocketAddr::from(([127, 0, 0, 1], 2))).unwrap();
        assert_ne!(
            v.digest(),
            View::new(3, vec![member(5), renamed]).unwrap().digest()
        );
    }
}
