//! Failure detection: who heartbeats whom, when each watched member was last heard from, which
//! members follow another coordinator, and who is suspected.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use conclave_lock_api::{MemberId, View};

use crate::time::Instant;

use super::types::{GmsOutput, MAX_REMEMBERED};

/// How many ring successors a member other than the coordinator heartbeats (and so how many
/// ring predecessors it watches, besides the coordinator). A takeover needs the member to know
/// that everyone ranked before it is gone: with two, a crash of the coordinator together with
/// the next one or two members is taken over within the suspect timeout; larger crashes wait
/// one more suspect timeout.
pub const WATCHERS: usize = 2;

/// What a member's heartbeats said of the view it is in.
#[derive(Clone, Copy, Debug, Default)]
struct HeardView {
    /// The highest `view_epoch` heard: a view that only removes members exceeds those of its
    /// members, not every epoch heard (so a member cut off alone does not climb above the side
    /// that kept the cluster).
    epoch: u64,
    /// The coordinator (incarnation) the last heartbeat named: a member that follows another
    /// coordinator is in another lineage of views.
    coordinator: u128,
}

/// What one heartbeat says of its sender, for [`Liveness::heartbeat`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Heartbeat {
    /// The epoch of the sender's view.
    pub(super) view_epoch: u64,
    /// The incarnation of the sender's coordinator.
    pub(super) coordinator: u128,
}

/// The failure detector of one member: what it heard from the members of its view.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    /// What the heartbeats of each member of the view said of its own view.
    heard_views: BTreeMap<MemberId, HeardView>,
    /// When each member of the current view was last heard from.
    last_heard: BTreeMap<MemberId, Instant>,
    /// Members whose heartbeats show that they follow another coordinator than ours (another
    /// lineage of views), since when. Such a member is alive but not in our view in any sense
    /// that matters: after the suspect timeout it is suspected like a silent one.
    stray_since: BTreeMap<MemberId, Instant>,
    /// The members whose silence this member judges: everyone but itself as coordinator, else
    /// the coordinator and its [`WATCHERS`] ring predecessors.
    watched: BTreeSet<MemberId>,
}

impl Liveness {
    /// Records that `from` was heard from at `now`, if it is in the view.
    pub(super) fn note_alive(&mut self, now: Instant, from: &MemberId) {
        if let Some(at) = self.last_heard.get_mut(from) {
            *at = (*at).max(now);
        }
    }

    /// Whether `member` is in the view this detector follows.
    pub(super) fn knows(&self, member: &MemberId) -> bool {
        self.last_heard.contains_key(member)
    }

    /// Handles a heartbeat from `from` (a member of the view, see [`Liveness::knows`]) while
    /// this member is in `view` (`coordinates`: as its coordinator); `ignore_lineage` is the
    /// sabotage that counts every heartbeat.
    ///
    /// The heartbeat is a sign of life only if the sender follows our coordinator, or is in a
    /// newer view of another coordinator while it is not our coordinator (we are probably
    /// about to receive that view). Otherwise the sender lives in another lineage of views:
    /// our coordinator that moved on to someone else's view, or a member left behind in a
    /// view we abandoned. Such a member is suspected after the suspect timeout even though it
    /// keeps talking to us, so that two members cannot keep each other in stale views forever
    /// (one takes over and the views merge).
    ///
    /// A fellow member that follows our coordinator in another view than ours (one of us has
    /// not installed the latest view yet) is alive, but stray from its first such heartbeat
    /// until one of us installs a view or it heartbeats from ours; this matters only once our
    /// coordinator is suspected. Two members left behind in different views of one coordinator
    /// that excluded them, each ranking the other before itself, would otherwise each wait for
    /// the other to take over for ever. The coordinator's own heartbeats, and those a
    /// coordinator receives, are not judged by this: a view on its way is no sign of a stray
    /// member.
    pub(super) fn heartbeat(
        &mut self,
        now: Instant,
        from: &MemberId,
        beat: Heartbeat,
        view: Option<&View>,
        coordinates: bool,
        ignore_lineage: bool,
    ) {
        let heard = self.heard_views.entry(from.clone()).or_default();
        heard.epoch = heard.epoch.max(beat.view_epoch);
        heard.coordinator = beat.coordinator;
        let Some(view) = view else { return };
        let ours = view.coordinator();
        let follows = beat.coordinator == ours.incarnation()
            || (beat.view_epoch > view.epoch() && from != ours)
            || ignore_lineage;
        // A fellow member (not our coordinator, and we do not coordinate) in another view of
        // our coordinator: alive, but stray from now on until one of us installs a view. It
        // matters only once our coordinator is suspected (takeover).
        let left_behind = beat.coordinator == ours.incarnation()
            && beat.view_epoch != view.epoch()
            && from != ours
            && !coordinates;
        if ignore_lineage || (follows && !left_behind) {
            self.stray_since.remove(from);
        } else if self.stray_since.len() < MAX_REMEMBERED {
            self.stray_since.entry(from.clone()).or_insert(now);
        }
        if follows {
            self.note_alive(now, from);
        }
    }

    /// Whether `member` (other than `local`) has been silent (or stray) for longer than
    /// `timeout`.
    pub(super) fn silent_for(
        &self,
        local: &MemberId,
        now: Instant,
        member: &MemberId,
        timeout: Duration,
    ) -> bool {
        member != local
            && (self
                .last_heard
                .get(member)
                .is_none_or(|heard| now.saturating_duration_since(*heard) > timeout)
                || self
                    .stray_since
                    .get(member)
                    .is_some_and(|since| now.saturating_duration_since(*since) > timeout))
    }

    /// The members of `view` that `local` suspects at `now` (silent or stray for longer than
    /// `timeout`).
    pub(super) fn suspects(
        &self,
        local: &MemberId,
        view: &View,
        now: Instant,
        timeout: Duration,
    ) -> Vec<MemberId> {
        view.members()
            .iter()
            .filter(|m| self.silent_for(local, now, m, timeout))
            .cloned()
            .collect()
    }

    /// Whether `local`, a member of `view` other than its coordinator, takes over at `now`:
    /// if the coordinator and everyone ranked before it are gone, the members its takeover
    /// view leaves out; else `None`.
    pub(super) fn takeover(
        &self,
        local: &MemberId,
        view: &View,
        now: Instant,
        timeout: Duration,
    ) -> Option<Vec<MemberId>> {
        let rank = view.rank(local).filter(|rank| *rank > 0)?;
        let suspected = |m: &MemberId| self.silent_for(local, now, m, timeout);
        // A member ranked before us that we do not watch is presumed gone once the coordinator
        // has been suspected for a further suspect timeout: alive, it would have taken over.
        let coordinator_long_gone = self.silent_for(local, now, view.coordinator(), timeout * 2);
        let gone = |m: &MemberId| {
            if self.watched.contains(m) {
                suspected(m)
            } else {
                coordinator_long_gone
            }
        };
        if !view.members()[..rank].iter().all(gone) {
            return None;
        }
        // Everyone ranked before us goes (we must come first); after us, only the members we
        // watch and suspect (the others are watched from now on, and excluded if silent).
        let suspects = view
            .members()
            .iter()
            .enumerate()
            .filter(|(i, m)| *i < rank || (self.watched.contains(*m) && suspected(m)))
            .map(|(_, m)| m.clone())
            .collect();
        Some(suspects)
    }

    /// Starts following `view`, which `local` installed at `now`.
    pub(super) fn follow(&mut self, now: Instant, view: &View, local: &MemberId) {
        let watched = watched_members(view, local);
        let mut heard = BTreeMap::new();
        for member in view.members() {
            // A member new to our view, or newly watched by us, gets a full suspect timeout of
            // grace; the others keep their clocks, so frequent view changes cannot hide a dead
            // member.
            let at = match self.last_heard.get(member) {
                Some(at) if self.watched.contains(member) || !watched.contains(member) => *at,
                _ => now,
            };
            heard.insert(member.clone(), at);
        }
        self.last_heard = heard;
        self.watched = watched;
        // A new view starts every member's lineage check afresh: one that still follows
        // another coordinator shows it again with its next heartbeat.
        self.stray_since.clear();
        self.heard_views.retain(|m, _| view.members().contains(m));
    }

    /// Whether `member` was last heard following another coordinator than `ours` (an
    /// incarnation).
    pub(super) fn follows_another(&self, member: &MemberId, ours: u128) -> bool {
        self.heard_views
            .get(member)
            .is_some_and(|h| h.coordinator != ours)
    }

    /// The highest view epoch heard from any of `members`.
    pub(super) fn highest_epoch_of(&self, members: &[MemberId]) -> Option<u64> {
        members
            .iter()
            .filter_map(|m| self.heard_views.get(m).map(|h| h.epoch))
            .max()
    }
}

/// Whom a member of `view` heartbeats: the coordinator everyone; every other member the
/// coordinator and the next [`WATCHERS`] members after it (no wrap-around: the members ranked
/// first need no watchers to take over).
pub(super) fn heartbeat_targets<'a>(
    view: &'a View,
    local: &'a MemberId,
) -> impl Iterator<Item = &'a MemberId> + 'a {
    let members = view.members();
    let rank = view.rank(local);
    let (coordinator, ring) = match rank {
        Some(0) => (None, &members[1..]),
        Some(r) => {
            let end = members.len().min(r + 1 + WATCHERS);
            (members.first(), &members[r + 1..end])
        }
        None => (None, &members[..0]),
    };
    coordinator.into_iter().chain(ring.iter())
}

/// The heartbeats `local` sends in `view`, naming `epoch`, the highest it knows of.
pub(super) fn heartbeats(view: &View, local: &MemberId, epoch: u64) -> Vec<GmsOutput> {
    let (view_epoch, coordinator) = (view.epoch(), view.coordinator().incarnation());
    heartbeat_targets(view, local)
        .map(|member| GmsOutput::Heartbeat {
            to: member.clone(),
            epoch,
            view_epoch,
            coordinator,
        })
        .collect()
}

/// Whom a member of `view` watches (judges silent): the heartbeat targets read backwards.
pub(super) fn watched_members(view: &View, local: &MemberId) -> BTreeSet<MemberId> {
    let members = view.members();
    match view.rank(local) {
        Some(0) => members[1..].iter().cloned().collect(),
        Some(r) => {
            let start = r.saturating_sub(WATCHERS).max(1);
            members[..1]
                .iter()
                .chain(&members[start..r])
                .cloned()
                .collect()
        }
        None => BTreeSet::new(),
    }
}
