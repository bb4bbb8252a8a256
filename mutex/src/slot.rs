//! The front end's records of its requests and table queries, from registration to answer.

use std::task::Waker;

use conclave_lock_api::{
    FencingToken, GrantorTable, LockError, LockLostReason, LockMode, LockName,
};

use crate::effects::Effects;
use crate::spin::SpinBudget;

/// A request of the front end, from registration until its guard is gone.
#[derive(Debug)]
pub(crate) struct Slot {
    /// Woken whenever anything below changes.
    wakers: Vec<Waker>,
    pub(crate) name: LockName,
    pub(crate) owner: u64,
    pub(crate) mode: LockMode,
    /// The answer to the request, until the future takes it.
    pub(crate) outcome: Option<Result<FencingToken, LockError>>,
    /// Why the lock was lost, once it was.
    pub(crate) lost: Option<LockLostReason>,
    /// An explicit release was started; the slot stays until it is acknowledged.
    pub(crate) releasing: bool,
    /// The grantor acknowledged the release.
    pub(crate) released: bool,
    /// Until when a wait for this slot busy-polls (see [`crate::NodeBuilder::spin_wait`]).
    pub(crate) spin_until: Option<std::time::Instant>,
    /// The round trip the wait is timing for [`SpinBudget`]: when its request (or release) was
    /// sent and how long it had to spin. Cleared when the grantor queues it.
    round_trip: Option<(std::time::Instant, std::time::Duration)>,
    /// The grantor queued the request behind another owner.
    queued: bool,
    /// The request asked not to be told that it was queued (see [`crate::contention`]).
    quiet: bool,
}

impl Slot {
    /// A request of `owner` for `name` in `mode`, not answered yet; `quiet` if it asked not to
    /// be told that it was queued.
    pub(crate) fn new(name: LockName, owner: u64, mode: LockMode, quiet: bool) -> Self {
        Slot {
            wakers: Vec::new(),
            name,
            owner,
            mode,
            outcome: None,
            lost: None,
            releasing: false,
            released: false,
            spin_until: None,
            round_trip: None,
            queued: false,
            quiet,
        }
    }

    /// Whether the grantor queued the request behind another owner.
    pub(crate) fn queued(&self) -> bool {
        self.queued
    }

    /// Whether the request asked not to be told that it was queued.
    pub(crate) fn quiet(&self) -> bool {
        self.quiet
    }

    /// The grantor queued the request behind another owner: its wait sleeps until the grant,
    /// and its round trip is not timed (its answer waits for other owners).
    pub(crate) fn mark_queued(&mut self) {
        self.queued = true;
        self.spin_until = None;
        self.round_trip = None;
    }

    /// Whether the wait's round trip is being timed.
    #[cfg(test)]
    pub(crate) fn timed(&self) -> bool {
        self.round_trip.is_some()
    }

    /// Times the wait from now and gives it the spin `spin` says (none if it says zero). Reads
    /// the clock only where waits may spin at all.
    pub(crate) fn begin_round_trip(&mut self, spin: &mut SpinBudget) {
        if !spin.enabled() {
            return;
        }
        let now = std::time::Instant::now();
        let spun = spin.next();
        self.round_trip = Some((now, spun));
        self.spin_until = (!spun.is_zero()).then(|| now + spun);
    }

    /// Tells `spin` how long the timed round trip took, now that its answer is here.
    pub(crate) fn end_round_trip(&mut self, spin: &mut SpinBudget) {
        if let Some((sent, spun)) = self.round_trip.take() {
            spin.answered(spun, sent.elapsed());
        }
    }

    /// Wakes every task waiting on this slot.
    pub(crate) fn wake(&mut self) {
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
    }

    /// Hands the tasks waiting on this slot to `effects`, to be woken once the state lock is
    /// released (a task woken under it would find it taken and sleep again at once).
    pub(crate) fn wake_later(&mut self, effects: &mut Effects) {
        effects.wakers.append(&mut self.wakers);
    }

    /// Has `waker` woken at the slot's next change.
    pub(crate) fn register(&mut self, waker: &Waker) {
        if !self.wakers.iter().any(|w| w.will_wake(waker)) {
            self.wakers.push(waker.clone());
        }
    }
}

/// A table query of the front end, from request to answer.
#[derive(Debug, Default)]
pub(crate) struct TableQuery {
    pub(crate) answer: Option<Result<GrantorTable, LockError>>,
    pub(crate) wakers: Vec<Waker>,
}
