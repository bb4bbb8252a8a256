//! Which wire version to send each member: the rolling-upgrade rule.
//!
//! A member sends a peer the oldest version it speaks ([`WireVersion::OLDEST`], version 3)
//! until it has received from that peer — that incarnation — a datagram of a newer version or
//! one that names a newer version it speaks; from then on it sends the newest both speak, up to
//! its own configured [`EndpointConfig::wire`](super::EndpointConfig::wire). A datagram for the
//! discovery channel, or in answer to a ping, goes in the oldest version: it may reach members
//! of any version. Each datagram of the oldest version names the newest version the member
//! speaks (so peers learn it from the first datagram), unless the member is held at the oldest.
//!
//! A restarted process is a new incarnation, so a member rolled back to an older build starts
//! from the oldest version again; what was learnt of an incarnation is never unlearnt.

use std::collections::BTreeMap;

use conclave_lock_api::wire::WireVersion;
use conclave_lock_api::MemberId;

/// The most peers whose versions are remembered; further ones get the oldest version (always
/// understood) until an entry is forgotten.
const MAX_PEERS: usize = 4096;

/// What this member knows of its peers' wire versions.
#[derive(Debug)]
pub(super) struct PeerVersions {
    /// The newest version this member sends (its configuration).
    newest: WireVersion,
    /// The newest version each peer and this member both speak, where newer than the oldest.
    newer: BTreeMap<MemberId, WireVersion>,
}

impl PeerVersions {
    pub(super) fn new(newest: WireVersion) -> Self {
        Self {
            newest,
            newer: BTreeMap::new(),
        }
    }

    /// The newest version this member sends anyone.
    pub(super) fn newest(&self) -> WireVersion {
        self.newest
    }

    /// A datagram from `from` said that it speaks `common` (the newest version both speak).
    pub(super) fn heard(&mut self, from: &MemberId, common: WireVersion) {
        if common <= WireVersion::OLDEST {
            return;
        }
        if let Some(known) = self.newer.get_mut(from) {
            *known = (*known).max(common);
        } else if self.newer.len() < MAX_PEERS {
            self.newer.insert(from.clone(), common);
        }
    }

    /// The version to send `to` in.
    pub(super) fn for_member(&self, to: &MemberId) -> WireVersion {
        self.newer
            .get(to)
            .map_or(WireVersion::OLDEST, |known| (*known).min(self.newest))
    }

    /// `member` is gone for good.
    pub(super) fn forget(&mut self, member: &MemberId) {
        self.newer.remove(member);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(incarnation: u128) -> MemberId {
        MemberId::new(incarnation, "m", "127.0.0.1:1".parse().expect("addr")).expect("valid")
    }

    #[test]
    fn the_oldest_until_a_peer_says_more() {
        let mut versions = PeerVersions::new(WireVersion::NEWEST);
        let (a, b) = (member(1), member(2));
        assert_eq!(versions.for_member(&a), WireVersion::V3);
        versions.heard(&a, WireVersion::V3);
        assert_eq!(versions.for_member(&a), WireVersion::V3);
        versions.heard(&a, WireVersion::V4);
        assert_eq!(versions.for_member(&a), WireVersion::V4);
        // Never unlearnt (a late datagram of the oldest version says nothing new).
        versions.heard(&a, WireVersion::V3);
        assert_eq!(versions.for_member(&a), WireVersion::V4);
        // Per incarnation: a restart at the same address starts over.
        assert_eq!(versions.for_member(&b), WireVersion::V3);
        versions.forget(&a);
        assert_eq!(versions.for_member(&a), WireVersion::V3);
    }

    #[test]
    fn a_member_held_at_the_oldest_sends_the_oldest() {
        let mut versions = PeerVersions::new(WireVersion::V3);
        let a = member(1);
        versions.heard(&a, WireVersion::V4);
        assert_eq!(versions.for_member(&a), WireVersion::V3);
    }

    #[test]
    fn memory_is_bounded() {
        let mut versions = PeerVersions::new(WireVersion::NEWEST);
        for i in 0..(MAX_PEERS as u128 + 10) {
            versions.heard(&member(i + 1), WireVersion::V4);
        }
        assert_eq!(versions.newer.len(), MAX_PEERS);
        let late = member(MAX_PEERS as u128 + 5);
        assert_eq!(versions.for_member(&late), WireVersion::V3);
    }
}
