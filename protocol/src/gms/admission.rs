//! A coordinator's pending membership changes: the joins and leaves asked for, and when the
//! batch of joins is admitted.

use std::collections::BTreeSet;
use std::time::Duration;

use conclave_lock_api::{MemberId, View};

use crate::time::Instant;

use super::types::MAX_REMEMBERED;

/// The joins and leaves a coordinator has yet to install in a view.
#[derive(Debug, Default)]
pub(super) struct Admission {
    /// When the join requests collected so far are admitted.
    admit_at: Option<Instant>,
    joins: Vec<MemberId>,
    leaves: BTreeSet<MemberId>,
}

/// The changes a new view makes, taken from [`Admission`].
#[derive(Debug)]
pub(super) struct Changes {
    /// Members of the view that asked to leave.
    pub(super) leavers: Vec<MemberId>,
    /// Members not in the view that asked to join.
    pub(super) joiners: Vec<MemberId>,
}

impl Changes {
    /// Whether there is no change.
    pub(super) fn is_empty(&self) -> bool {
        self.leavers.is_empty() && self.joiners.is_empty()
    }

    /// The members of `view` after these changes and the exclusion of `suspects`: the
    /// members that stay, in their order, then the joiners.
    pub(super) fn members_after(&self, view: &View, suspects: &[MemberId]) -> Vec<MemberId> {
        let mut members: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| !suspects.contains(m) && !self.leavers.contains(m))
            .cloned()
            .collect();
        members.extend(self.joiners.iter().cloned());
        members
    }
}

impl Admission {
    /// Forgets everything (this member no longer coordinates).
    pub(super) fn clear(&mut self) {
        self.admit_at = None;
        self.joins.clear();
        self.leaves.clear();
    }

    /// When the batch of joins is due.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.admit_at
    }

    /// Whether the batch of joins is due at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.admit_at.is_some_and(|t| now >= t)
    }

    /// Stops the batch timer (the changes are being installed, or there is nothing to admit).
    pub(super) fn disarm(&mut self) {
        self.admit_at = None;
    }

    /// `from` asked to join at `now`. Joins that arrive within `batch` of the first are
    /// admitted together: one view, not one per joiner. Returns whether the batch is due.
    pub(super) fn join(&mut self, from: &MemberId, now: Instant, batch: Duration) -> bool {
        if !self.joins.contains(from) && self.joins.len() < MAX_REMEMBERED {
            self.joins.push(from.clone());
        }
        let admit_at = *self.admit_at.get_or_insert(now + batch);
        now >= admit_at
    }

    /// `from`, a member of the view, asked to leave.
    pub(super) fn leave(&mut self, from: &MemberId) {
        self.leaves.insert(from.clone());
    }

    /// Takes the pending changes to `view`.
    pub(super) fn take(&mut self, view: &View) -> Changes {
        let leavers: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| self.leaves.contains(*m))
            .cloned()
            .collect();
        let joiners: Vec<MemberId> = std::mem::take(&mut self.joins)
            .into_iter()
            .filter(|j| !view.contains(j))
            .collect();
        self.leaves.clear();
        Changes { leavers, joiners }
    }
}
