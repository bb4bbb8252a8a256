//! View deltas: a view sent as its change from a view the receiver already has.
//!
//! Every view a coordinator installs is its previous view with some members removed (in the
//! previous order) and new members appended: a change, a takeover, a merge. So the new view
//! is `base − left + joined`, and [`GmsMessage::InstallViewDelta`] carries only `left` (as
//! incarnations) and `joined`, with digests ([`View::digest`]) of the base and of the result.
//! A receiver rebuilds the view from the base it remembers and installs it only if the digest
//! matches; anything else ([`DeltaError`]) installs nothing.

use std::collections::{BTreeSet, VecDeque};

use conclave_lock_api::wire::GmsMessage;
use conclave_lock_api::{MemberId, View};

/// How many recent views a member remembers as bases for deltas (its installed views and the
/// views it received). One or two are enough in practice; a few more cover views received
/// from two coordinators in turn during a merge.
pub(super) const BASES: usize = 4;

/// The most members a delta may name (left plus joined); a larger delta is dropped.
pub(super) const MAX_DELTA_MEMBERS: usize = 4096;

/// Why a delta could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeltaError {
    /// No remembered view has the base's digest: ask for the full view.
    NoBase,
    /// The rebuilt view is not the one the coordinator meant (a base member named in `left`
    /// is missing, a joiner is already there, or the digest differs): ask for the full view.
    Mismatch,
    /// Sizes no coordinator sends: dropped.
    Absurd,
}

/// The recent views a member can rebuild deltas from, newest last, with their digests.
#[derive(Debug, Default)]
pub(super) struct Bases {
    views: VecDeque<(u64, View)>,
}

impl Bases {
    /// Remembers `view` (once), forgetting the oldest beyond [`BASES`].
    pub(super) fn remember(&mut self, view: &View) {
        let digest = view.digest();
        if let Some(i) = self
            .views
            .iter()
            .position(|(d, v)| *d == digest && v == view)
        {
            if let Some(entry) = self.views.remove(i) {
                self.views.push_back(entry);
            }
            return;
        }
        if self.views.len() >= BASES {
            self.views.pop_front();
        }
        self.views.push_back((digest, view.clone()));
    }

    /// Rebuilds the view a delta describes.
    pub(super) fn rebuild(
        &self,
        epoch: u64,
        base_epoch: u64,
        base_digest: u64,
        left: &[u128],
        joined: &[MemberId],
        digest: u64,
    ) -> Result<View, DeltaError> {
        if left.len() + joined.len() > MAX_DELTA_MEMBERS {
            return Err(DeltaError::Absurd);
        }
        let base = self
            .views
            .iter()
            .rev()
            .find(|(d, v)| *d == base_digest && v.epoch() == base_epoch)
            .map(|(_, v)| v)
            .ok_or(DeltaError::NoBase)?;
        let left: BTreeSet<u128> = left.iter().copied().collect();
        let mut members: Vec<MemberId> = Vec::with_capacity(base.len() + joined.len());
        let mut removed = 0;
        for member in base.members() {
            if left.contains(&member.incarnation()) {
                removed += 1;
            } else {
                members.push(member.clone());
            }
        }
        if removed != left.len() {
            return Err(DeltaError::Mismatch);
        }
        members.extend(joined.iter().cloned());
        let view = View::new(epoch, members).map_err(|_| DeltaError::Mismatch)?;
        if view.digest() != digest {
            return Err(DeltaError::Mismatch);
        }
        Ok(view)
    }
}

/// The delta that rebuilds `next` from `base`, if `next` is `base`'s members that stay, in
/// `base`'s order, then new members, and at least one member stays. Otherwise `None`: send
/// the full view.
pub(super) fn diff(base: &View, next: &View) -> Option<GmsMessage> {
    let stay: BTreeSet<u128> = next.members().iter().map(MemberId::incarnation).collect();
    let kept: Vec<&MemberId> = base
        .members()
        .iter()
        .filter(|m| stay.contains(&m.incarnation()))
        .collect();
    if kept.is_empty() || kept.len() > next.len() {
        return None;
    }
    if !kept.iter().zip(next.members()).all(|(k, n)| *k == n) {
        return None;
    }
    let left: Vec<u128> = base
        .members()
        .iter()
        .filter(|m| !stay.contains(&m.incarnation()))
        .map(MemberId::incarnation)
        .collect();
    let joined = next.members()[kept.len()..].to_vec();
    if left.len() + joined.len() > MAX_DELTA_MEMBERS {
        return None;
    }
    Some(GmsMessage::InstallViewDelta {
        epoch: next.epoch(),
        base_epoch: base.epoch(),
        base_digest: base.digest(),
        left,
        joined,
        digest: next.digest(),
    })
}

/// The messages that send `view` to its other members (all but `local`): a delta from `base`
/// (the view this member was in) to the members of `base`, which received it or installed it
/// before, and the full view to the others (joiners, merged members) and when there is no
/// delta.
pub(super) fn view_messages(
    view: &View,
    base: Option<&View>,
    local: &MemberId,
) -> Vec<(MemberId, GmsMessage)> {
    let delta = base.and_then(|base| diff(base, view).map(|d| (base, d)));
    view.members()
        .iter()
        .filter(|member| *member != local)
        .map(|member| {
            let message = match &delta {
                Some((base, delta)) if base.contains(member) => delta.clone(),
                _ => GmsMessage::InstallView { view: view.clone() },
            };
            (member.clone(), message)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::member;

    /// The fields of an `InstallViewDelta`: epoch, base epoch, base digest, who left, who
    /// joined, digest.
    type Fields = (u64, u64, u64, Vec<u128>, Vec<MemberId>, u64);

    fn fields(message: GmsMessage) -> Fields {
        let GmsMessage::InstallViewDelta {
            epoch,
            base_epoch,
            base_digest,
            left,
            joined,
            digest,
        } = message
        else {
            panic!("not a delta: {message:?}");
        };
        (epoch, base_epoch, base_digest, left, joined, digest)
    }

    fn rebuild(bases: &Bases, message: &GmsMessage) -> Result<View, DeltaError> {
        let (epoch, base_epoch, base_digest, left, joined, digest) = fields(message.clone());
        bases.rebuild(epoch, base_epoch, base_digest, &left, &joined, digest)
    }

    #[test]
    fn a_delta_rebuilds_changes_takeovers_and_merges_exactly() {
        let base = View::new(3, (1..=6).map(member).collect()).unwrap();
        let mut bases = Bases::default();
        bases.remember(&base);
        let nexts = [
            // A change: one excluded, two joined.
            vec![1, 2, 4, 5, 6, 7, 8],
            // A takeover: the first two gone.
            vec![3, 4, 5, 6],
            // A merge: another view's members appended.
            vec![1, 2, 3, 4, 5, 6, 9, 10, 11],
        ];
        for next in nexts {
            let next = View::new(4, next.into_iter().map(member).collect()).unwrap();
            let delta = diff(&base, &next).expect("an append-only change has a delta");
            assert_eq!(rebuild(&bases, &delta), Ok(next));
        }
    }

    #[test]
    fn reordered_or_disjoint_views_have_no_delta() {
        let base = View::new(3, vec![member(1), member(2), member(3)]).unwrap();
        let reordered = View::new(4, vec![member(2), member(1)]).unwrap();
        assert_eq!(diff(&base, &reordered), None);
        let disjoint = View::new(4, vec![member(7), member(8)]).unwrap();
        assert_eq!(diff(&base, &disjoint), None);
    }

    #[test]
    fn unknown_base_wrong_digest_and_absurd_sizes_install_nothing() {
        let base = View::new(3, vec![member(1), member(2), member(3)]).unwrap();
        let next = View::new(4, vec![member(1), member(3)]).unwrap();
        let delta = diff(&base, &next).unwrap();
        assert_eq!(rebuild(&Bases::default(), &delta), Err(DeltaError::NoBase));
        let mut bases = Bases::default();
        bases.remember(&base);
        let (epoch, base_epoch, base_digest, left, joined, digest) = fields(delta);
        let wrong = bases.rebuild(epoch, base_epoch, base_digest, &left, &joined, digest ^ 1);
        assert_eq!(wrong, Err(DeltaError::Mismatch));
        let unknown_leaver = bases.rebuild(epoch, base_epoch, base_digest, &[99], &[], digest);
        assert_eq!(unknown_leaver, Err(DeltaError::Mismatch));
        let duplicate = bases.rebuild(epoch, base_epoch, base_digest, &[], &[member(1)], digest);
        assert_eq!(duplicate, Err(DeltaError::Mismatch));
        let huge = vec![7_u128; MAX_DELTA_MEMBERS + 1];
        let absurd = bases.rebuild(epoch, base_epoch, base_digest, &huge, &[], digest);
        assert_eq!(absurd, Err(DeltaError::Absurd));
    }

    #[test]
    fn bases_are_bounded() {
        let mut bases = Bases::default();
        for epoch in 0..10 {
            bases.remember(&View::new(epoch, vec![member(1)]).unwrap());
        }
        assert_eq!(bases.views.len(), BASES);
    }
}
