//! Node clocks: each incarnation reads its own monotonic clock, which may run a little fast or
//! slow against the simulator's global time, from an arbitrary origin.
//!
//! `local = offset + rate × (global − start)`. With rate 1 and offset 0 (the gentle profile) a
//! node's clock is the global clock. Every time the simulator hands an endpoint (`now`, a
//! deadline it compares) is local; the endpoint's timers, which are local, are converted back
//! to global time to be scheduled.

use crate::time::Instant;

/// One incarnation's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NodeClock {
    /// Local nanoseconds per global nanosecond.
    rate: f64,
    /// The local reading at `start`.
    offset: u64,
    /// The global instant the clock was started.
    start: Instant,
}

impl NodeClock {
    /// The global clock itself, read from `start`.
    pub(crate) fn exact(start: Instant) -> Self {
        Self {
            rate: 1.0,
            offset: start.as_nanos(),
            start,
        }
    }

    /// A clock running at `rate`, reading `offset` at global `start`.
    pub(crate) fn drifting(start: Instant, rate: f64, offset: u64) -> Self {
        Self {
            rate,
            offset,
            start,
        }
    }

    /// The local reading at global instant `global` (never before `start`).
    pub(crate) fn local(&self, global: Instant) -> Instant {
        let elapsed = global.as_nanos().saturating_sub(self.start.as_nanos());
        if self.rate == 1.0 {
            return Instant::from_nanos(self.offset.saturating_add(elapsed));
        }
        let scaled = (elapsed as f64 * self.rate) as u64;
        Instant::from_nanos(self.offset.saturating_add(scaled))
    }

    /// The earliest global instant at which the local clock reads at least `local`.
    pub(crate) fn global(&self, local: Instant) -> Instant {
        let ahead = local.as_nanos().saturating_sub(self.offset);
        if self.rate == 1.0 {
            return Instant::from_nanos(self.start.as_nanos().saturating_add(ahead));
        }
        let mut global = Instant::from_nanos(
            self.start
                .as_nanos()
                .saturating_add((ahead as f64 / self.rate) as u64),
        );
        // Rounding: step forward until the local clock has really reached `local`.
        for _ in 0..4 {
            if self.local(global) >= local {
                break;
            }
            global = Instant::from_nanos(global.as_nanos().saturating_add(1));
        }
        global
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_is_the_global_clock_and_drift_round_trips() {
        let exact = NodeClock::exact(Instant::from_nanos(500));
        assert_eq!(
            exact.local(Instant::from_nanos(900)),
            Instant::from_nanos(900)
        );
        let fast = NodeClock::drifting(Instant::from_nanos(1_000), 1.02, 7_000_000);
        for g in [1_000u64, 1_001, 5_000_000, 3_000_000_000] {
            let local = fast.local(Instant::from_nanos(g));
            let back = fast.global(local);
            assert!(back.as_nanos() <= g && fast.local(back) >= local);
        }
        assert!(
            fast.local(Instant::from_nanos(2_000_001_000))
                > Instant::from_nanos(7_000_000 + 2_000_000_000)
        );
    }
}
