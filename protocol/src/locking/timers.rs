//! The lock service's timer table: every deadline the machine has, by kind. The service's
//! next wake-up is the earliest of them; a timer that fires early or late is harmless, since
//! every handler checks its own condition against the time.

use crate::time::Instant;

/// A kind of deadline of the lock service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// The earliest timeout of a pending request.
    RequestTimeout,
    /// The grantor role: the end of its reconciliation, its grace period, fenced locks and
    /// the leases of holds in its table.
    Grantor,
    /// `Majority`: the periodic check of held locks' leases.
    LeaseCheck,
    /// The next renewal of held locks' leases (and of leased waits).
    Renewal,
    /// `Majority`: the earliest end of a held lock's lease.
    HoldLease,
    /// `Majority`: the end of the grantor term's grace period.
    GraceEnd,
    /// `Majority`: when the waits of a member in a minority view are refused.
    MinorityWaits,
    /// Node caching: idle node grants and local request timeouts.
    NodeCache,
    /// The earliest end of a hold's own lease ([`super::LockRequest::lease`]).
    AcquisitionLease,
    /// The earliest release acknowledgement held back to travel with a later message.
    LazyAck,
}

impl Timer {
    /// Every kind, in the order the table keeps them.
    const ALL: [Timer; 10] = [
        Timer::RequestTimeout,
        Timer::Grantor,
        Timer::LeaseCheck,
        Timer::Renewal,
        Timer::HoldLease,
        Timer::GraceEnd,
        Timer::MinorityWaits,
        Timer::NodeCache,
        Timer::AcquisitionLease,
        Timer::LazyAck,
    ];
}

/// One optional deadline per [`Timer`] kind.
#[derive(Clone, Debug, Default)]
pub(crate) struct TimerTable {
    deadlines: [Option<Instant>; Timer::ALL.len()],
}

impl TimerTable {
    /// Sets (`Some`) or stops (`None`) the deadline of `timer`.
    pub(crate) fn set(&mut self, timer: Timer, deadline: Option<Instant>) {
        self.deadlines[timer as usize] = deadline;
    }

    /// Stops `timer`.
    pub(crate) fn stop(&mut self, timer: Timer) {
        self.set(timer, None);
    }

    /// The deadline of `timer`, if set.
    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.deadlines[timer as usize]
    }

    /// Whether `timer` is set and due at `now`.
    pub(crate) fn is_expired(&self, timer: Timer, now: Instant) -> bool {
        self.get(timer).is_some_and(|t| now >= t)
    }

    /// The earliest deadline of any timer.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.deadlines.iter().flatten().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_next_timeout_is_the_earliest_set_deadline() {
        let mut table = TimerTable::default();
        assert_eq!(table.next_timeout(), None);
        let t = Instant::ZERO + Duration::from_millis(5);
        table.set(Timer::Renewal, Some(t + Duration::from_millis(3)));
        table.set(Timer::LazyAck, Some(t));
        assert_eq!(table.next_timeout(), Some(t));
        table.stop(Timer::LazyAck);
        assert_eq!(table.next_timeout(), Some(t + Duration::from_millis(3)));
        assert!(!table.is_expired(Timer::Renewal, t));
        assert!(table.is_expired(Timer::Renewal, t + Duration::from_millis(3)));
        assert_eq!(
            Timer::ALL
                .iter()
                .filter(|k| table.get(**k).is_some())
                .count(),
            1
        );
    }
}
