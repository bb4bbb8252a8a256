//! The private timer table: every deadline of the layer, of which only the earliest is shown.

use std::collections::BTreeSet;

use conclave_lock_api::MemberId;

use crate::Instant;

/// What a deadline is for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum TimerKey {
    /// Look for idle peer states to forget.
    Sweep,
    /// Retransmit to this peer.
    Retransmit(MemberId),
    /// Send the acknowledgement owed to this peer, no data having come to carry it.
    Ack(MemberId),
}

/// Deadlines ordered by time, then key, so equal deadlines fire in a fixed order.
///
/// Each owner keeps its current deadline in an `Option<Instant>` slot, which lets an entry be
/// found and replaced exactly; no stale entry is ever left behind.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    entries: BTreeSet<(Instant, TimerKey)>,
}

impl Timers {
    /// The earliest deadline.
    pub(crate) fn earliest(&self) -> Option<Instant> {
        self.entries.first().map(|(at, _)| *at)
    }

    /// Moves the deadline of `key`, currently `*slot`, to `at` (`None` cancels it).
    pub(crate) fn set(&mut self, slot: &mut Option<Instant>, key: TimerKey, at: Option<Instant>) {
        if *slot == at {
            return;
        }
        let key = match slot.take() {
            Some(old) => {
                let probe = (old, key);
                self.entries.remove(&probe);
                probe.1
            }
            None => key,
        };
        if let Some(at) = at {
            self.entries.insert((at, key));
        }
        *slot = at;
    }

    /// Removes and returns the earliest entry due at `now`; its owner must clear its slot.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<TimerKey> {
        match self.entries.first() {
            Some((at, _)) if *at <= now => self.entries.pop_first().map(|(_, key)| key),
            _ => None,
        }
    }

    /// Number of deadlines.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn replacing_a_deadline_leaves_no_stale_entry() {
        let mut timers = Timers::default();
        let mut slot = None;
        timers.set(&mut slot, TimerKey::Sweep, Some(at(5)));
        timers.set(&mut slot, TimerKey::Sweep, Some(at(9)));
        assert_eq!(timers.len(), 1);
        assert_eq!(timers.earliest(), Some(at(9)));
        assert_eq!(timers.pop_due(at(8)), None);
        assert_eq!(timers.pop_due(at(9)), Some(TimerKey::Sweep));
        timers.set(&mut slot, TimerKey::Sweep, None);
        assert_eq!(timers.earliest(), None);
    }
}
