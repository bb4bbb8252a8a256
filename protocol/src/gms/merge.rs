//! What a coordinator hears of other coordinators: who announced, which views could be merged
//! into its own, and the merge view's members and epoch.

use std::collections::BTreeMap;
use std::time::Duration;

use conclave_lock_api::{MemberId, View};

use crate::time::Instant;

use super::types::MAX_REMEMBERED;

/// A view another coordinator announced.
#[derive(Debug)]
struct Candidate {
    view: View,
    /// When it was last heard.
    seen: Instant,
    /// Whether the announcement said it had heard this member's (a merge needs both).
    hears_us: bool,
}

/// A coordinator's knowledge of the other coordinators announcing on the discovery channel.
#[derive(Debug, Default)]
pub(super) struct Merging {
    /// Other coordinators heard announcing, with their view.
    candidates: BTreeMap<MemberId, Candidate>,
    /// The other coordinators heard announcing (by incarnation), and when.
    announcers: BTreeMap<u128, Instant>,
}

impl Merging {
    /// Forgets everything (this member no longer coordinates).
    pub(super) fn clear(&mut self) {
        self.candidates.clear();
        self.announcers.clear();
    }

    /// The coordinator with incarnation `incarnation` announced at `now`.
    pub(super) fn heard_announcer(&mut self, incarnation: u128, now: Instant) {
        if self.announcers.len() < MAX_REMEMBERED || self.announcers.contains_key(&incarnation) {
            self.announcers.insert(incarnation, now);
        }
    }

    /// The coordinator `from` announced `view`, another than ours, at `now`; `hears_us` if
    /// the announcement said it had heard ours.
    pub(super) fn heard_view(&mut self, from: &MemberId, view: View, now: Instant, hears_us: bool) {
        if self.candidates.len() < MAX_REMEMBERED || self.candidates.contains_key(from) {
            self.candidates.insert(
                from.clone(),
                Candidate {
                    view,
                    seen: now,
                    hears_us,
                },
            );
        }
    }

    /// The coordinators heard announcing within `horizon` of `now` (older ones are
    /// forgotten), by incarnation: what this coordinator's own announcement says it heard.
    pub(super) fn announcers(&mut self, now: Instant, horizon: Duration) -> Vec<u128> {
        self.announcers
            .retain(|_, seen| now.saturating_duration_since(*seen) <= horizon);
        self.announcers.keys().copied().collect()
    }

    /// Forgets the views not heard within `horizon` of `now`; then whether this coordinator,
    /// `local`, leads a merge: some coordinator that hears us announced another view, and
    /// no such coordinator has a lower id (it would lead).
    pub(super) fn leads_merge(
        &mut self,
        local: &MemberId,
        now: Instant,
        horizon: Duration,
    ) -> bool {
        self.candidates
            .retain(|_, c| now.saturating_duration_since(c.seen) <= horizon);
        // Only coordinators that heard this one's announcements: a merge view sent over a
        // link that is cut our way would never arrive, and the views it leads to (the merged
        // members suspected, excluded, merged again) would climb epoch after epoch.
        if !self.candidates.values().any(|c| c.hears_us) {
            return false;
        }
        if self
            .candidates
            .iter()
            .any(|(c, candidate)| candidate.hears_us && c < local)
        {
            tracing::trace!(member = %local, "a lower coordinator will lead the merge");
            return false;
        }
        true
    }

    /// Takes the views to merge (those of coordinators that hear us; the rest are
    /// forgotten too) and adds their members after `members`. Returns the epoch the merge
    /// view needs (above each of them, and at least `epoch`), the highest merged epoch
    /// instead when `reuse_epoch` (sabotage), and how many views were merged.
    pub(super) fn take_into(
        &mut self,
        members: &mut Vec<MemberId>,
        mut epoch: u64,
        ours: &View,
        reuse_epoch: bool,
    ) -> (u64, usize) {
        let mut candidates = std::mem::take(&mut self.candidates);
        candidates.retain(|_, c| c.hears_us);
        for other in candidates.values() {
            epoch = epoch.max(other.view.epoch().saturating_add(1));
            for member in other.view.members() {
                if !members.contains(member) {
                    members.push(member.clone());
                }
            }
        }
        if reuse_epoch {
            epoch = candidates
                .values()
                .map(|c| c.view.epoch())
                .chain([ours.epoch()])
                .max()
                .unwrap_or(epoch);
        }
        (epoch, candidates.len())
    }
}
