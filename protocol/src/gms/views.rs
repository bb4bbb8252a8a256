//! The view a member is in, the epochs it has heard of, and the views it can rebuild deltas
//! from: what new views are numbered after and checked against.

use conclave_lock_api::{MemberId, View};
use tracing::trace;

use crate::time::Instant;

use super::delta::{Bases, DeltaError};

/// How often a dropped view delta is logged at most.
const DELTA_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// A member's views: the current one, and what it heard of the others.
#[derive(Debug, Default)]
pub(super) struct Views {
    current: Option<View>,
    /// Highest epoch seen anywhere; founding, join and merge views exceed it so that every
    /// member accepts them.
    max_epoch_seen: u64,
    /// The recent views (installed or received) that view deltas can be rebuilt from.
    bases: Bases,
    /// When a dropped delta was last logged (such logs are rate-limited).
    delta_logged: Option<Instant>,
}

impl Views {
    /// The current view, once joined.
    pub(super) fn current(&self) -> Option<&View> {
        self.current.as_ref()
    }

    /// Records that a view of `epoch` exists somewhere.
    pub(super) fn saw_epoch(&mut self, epoch: u64) {
        self.max_epoch_seen = self.max_epoch_seen.max(epoch);
    }

    /// The highest view epoch heard of, the current view's included.
    pub(super) fn max_epoch_seen(&self) -> u64 {
        self.max_epoch_seen
            .max(self.current.as_ref().map_or(0, View::epoch))
    }

    /// The epoch of a view above every epoch heard of.
    pub(super) fn next_epoch(&self) -> u64 {
        self.max_epoch_seen().saturating_add(1)
    }

    /// The epoch of a view of `members` that admits nobody (a takeover, or a change that only
    /// removes members), given the highest epoch `heard` from those members: above this
    /// member's view and the views its members were heard in, but not above every epoch heard
    /// anywhere, so epochs advance with the membership of the view's own side only. The step
    /// is 2 when the new view keeps a strict majority of this member's current view, 1
    /// otherwise: when a view splits, the side that kept most of it numbers its views above
    /// the others', and under `Available` (whose fencing tokens carry the epoch) a fenced
    /// resource follows that side, not a member cut off alone.
    pub(super) fn next_epoch_within(&self, members: &[MemberId], heard: Option<u64>) -> u64 {
        let base = heard
            .into_iter()
            .chain(self.current.as_ref().map(View::epoch))
            .max()
            .unwrap_or(0);
        let current = self.current.as_ref().map_or(0, View::len);
        let step = if 2 * members.len() > current { 2 } else { 1 };
        base.saturating_add(step)
    }

    /// The view a coordinator, `local`, hands to the next member as it leaves: the current
    /// view without it, above every epoch heard of. `None` if nobody is left.
    pub(super) fn handover(&self, local: &MemberId) -> Option<View> {
        let rest: Vec<MemberId> = self
            .current
            .as_ref()?
            .members()
            .iter()
            .filter(|m| *m != local)
            .cloned()
            .collect();
        if rest.is_empty() {
            return None;
        }
        View::new(self.next_epoch(), rest).ok()
    }

    /// Makes `view` the current view.
    pub(super) fn install(&mut self, view: &View) {
        self.saw_epoch(view.epoch());
        self.current = Some(view.clone());
        self.bases.remember(view);
    }

    /// Remembers `view`, received in full, as a base for deltas.
    pub(super) fn received(&mut self, view: &View) {
        self.bases.remember(view);
    }

    /// Rebuilds the view a delta describes (see [`GmsMessage::InstallViewDelta`](conclave_lock_api::wire::GmsMessage::InstallViewDelta)),
    /// and remembers it.
    pub(super) fn rebuild(
        &mut self,
        epoch: u64,
        base: (u64, u64),
        left: &[u128],
        joined: &[MemberId],
        digest: u64,
    ) -> Result<View, DeltaError> {
        self.saw_epoch(epoch);
        let (base_epoch, base_digest) = base;
        let view = self
            .bases
            .rebuild(epoch, base_epoch, base_digest, left, joined, digest)?;
        self.bases.remember(&view);
        Ok(view)
    }

    /// Whether a dropped delta may be logged now (they are rate-limited); if so, the log is
    /// counted as made.
    pub(super) fn drop_log_due(&mut self, now: Instant) -> bool {
        let due = self
            .delta_logged
            .is_none_or(|at| now.saturating_duration_since(at) >= DELTA_LOG_INTERVAL);
        if due {
            self.delta_logged = Some(now);
        }
        due
    }

    /// Whether `local` installs `view`, received from `from`: sent by its coordinator (or
    /// handed over by ours as it left), with `local` in it, and newer than the current view
    /// (unless `skip_epoch_check`, a sabotage).
    pub(super) fn accepts(
        &self,
        from: &MemberId,
        view: &View,
        local: &MemberId,
        skip_epoch_check: bool,
    ) -> bool {
        let handover = self
            .current
            .as_ref()
            .is_some_and(|current| current.coordinator() == from && !view.contains(from));
        if view.coordinator() != from && !handover {
            trace!(%from, view = %view, "view not installed by its coordinator; dropped");
            return false;
        }
        if !view.contains(local) {
            trace!(%from, view = %view, "view without us; ignored");
            return false;
        }
        let current_epoch = self.current.as_ref().map_or(0, View::epoch);
        if view.epoch() <= current_epoch && !skip_epoch_check {
            trace!(%from, view = %view, current_epoch, "stale view; ignored");
            return false;
        }
        true
    }
}
