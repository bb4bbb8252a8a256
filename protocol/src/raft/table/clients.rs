//! The requesters: which lock requests each incarnation already had applied (so a request
//! proposed twice is applied once), and which incarnations are gone (so a request of theirs
//! applied late is not granted to nobody).

use std::collections::{BTreeMap, BTreeSet};

use conclave_lock_api::MemberId;
use serde::{Deserialize, Serialize};

/// What the table knows of the incarnations that made requests.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Clients {
    /// Per live incarnation, the lock requests already applied.
    #[serde(with = "super::pairs")]
    seen: BTreeMap<MemberId, Seen>,
    /// Per member name, its newest known incarnation (by `Join` or `Leave`).
    names: BTreeMap<String, Newest>,
}

/// The lock requests of one incarnation already applied.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Seen {
    /// Every request below it is finished: applied or never to be.
    done_below: u64,
    /// The requests at or above `done_below` applied.
    requests: BTreeSet<u64>,
}

/// The newest known incarnation of a member name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Newest {
    /// The incarnation.
    member: MemberId,
    /// It left (`Leave`).
    left: bool,
}

impl Clients {
    /// Whether `member` can make no more requests: a newer incarnation of its name joined or
    /// left, or it left itself.
    pub(super) fn is_gone(&self, member: &MemberId) -> bool {
        self.names.get(member.name()).is_some_and(|newest| {
            newest.member.is_newer_incarnation_than(member)
                || (newest.member == *member && newest.left)
        })
    }

    /// Records the lock request `request` of `member` (which says every request below
    /// `done_below` is finished); whether it is to be applied: `false` for a request of a gone
    /// incarnation, or one already applied or finished.
    pub(super) fn first_application(
        &mut self,
        member: &MemberId,
        request: u64,
        done_below: u64,
    ) -> bool {
        if self.is_gone(member) {
            return false;
        }
        let seen = self.seen.entry(member.clone()).or_default();
        let fresh = request >= seen.done_below && !seen.requests.contains(&request);
        if done_below > seen.done_below {
            seen.done_below = done_below;
            seen.requests = seen.requests.split_off(&done_below);
        }
        if fresh && request >= seen.done_below {
            seen.requests.insert(request);
        }
        fresh
    }

    /// Whether the lock request `request` of `member` was applied already, or never will be
    /// (the incarnation is gone, or the request is below its `done_below`).
    pub(super) fn was_applied(&self, member: &MemberId, request: u64) -> bool {
        self.is_gone(member)
            || self
                .seen
                .get(member)
                .is_some_and(|s| request < s.done_below || s.requests.contains(&request))
    }

    /// Records that `member` joined; `false` if it is gone already (a newer incarnation of its
    /// name joined or left, or it left), and then nothing changes. The older incarnations of
    /// its name are gone from now on.
    pub(super) fn join(&mut self, member: &MemberId) -> bool {
        if self.is_gone(member) {
            return false;
        }
        self.seen
            .retain(|m, _| m.name() != member.name() || !member.is_newer_incarnation_than(m));
        self.names.insert(
            member.name().to_owned(),
            Newest {
                member: member.clone(),
                left: false,
            },
        );
        true
    }

    /// Records that `member` left: it and its older incarnations are gone.
    pub(super) fn leave(&mut self, member: &MemberId) {
        let newer_known = self
            .names
            .get(member.name())
            .is_some_and(|newest| newest.member.is_newer_incarnation_than(member));
        if !newer_known {
            self.names.insert(
                member.name().to_owned(),
                Newest {
                    member: member.clone(),
                    left: true,
                },
            );
        }
        self.seen
            .retain(|m, _| m.name() != member.name() || m.is_newer_incarnation_than(member));
    }

    /// How many request numbers are kept for `member` (a bound the tests check).
    #[cfg(test)]
    pub(super) fn seen_len(&self, member: &MemberId) -> usize {
        self.seen.get(member).map_or(0, |s| s.requests.len())
    }
}
