//! Node clocks: each incarnation reads its own monotonic clock, which may run a little fast or
//! slow against the simulator's global time, from an arbitrary origin.
//!
//! `local = offset + rate × (global − start)`, where the rate is constant or changes at given
//! instants (a [`RateCycle`]: rates that flip within the drift bound during a run). The local
//! clock is continuous and monotonic across a change: each piece starts where the previous one
//! ended. With rate 1 and offset 0 (the gentle profile) a node's clock is the global clock.
//! Every time the simulator hands an endpoint (`now`, a deadline it compares) is local; the
//! endpoint's timers, which are local, are converted back to global time to be scheduled.

use crate::time::Instant;

/// The most pieces of a [`RateCycle`].
pub(crate) const MAX_PIECES: usize = 16;

/// Rates that change at set instants: piece `i` runs at `rates[i]` for `lengths[i]` global
/// nanoseconds, and the pieces repeat from the first once all have run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct RateCycle {
    /// Global nanoseconds of each piece (each at least 1 µs).
    lengths: [u64; MAX_PIECES],
    /// Local nanoseconds per global nanosecond during each piece.
    rates: [f64; MAX_PIECES],
    /// Local nanoseconds each whole piece advances the clock.
    advances: [u64; MAX_PIECES],
    /// Pieces in use.
    len: usize,
    /// Global and local length of one whole cycle.
    cycle_global: u64,
    cycle_local: u64,
}

impl RateCycle {
    /// A cycle of `pieces`, each `(global nanoseconds, rate)`; at most [`MAX_PIECES`] are
    /// kept, lengths below 1 µs are raised to it, and rates must be positive.
    pub(crate) fn new(pieces: &[(u64, f64)]) -> Self {
        let mut cycle = Self {
            lengths: [0; MAX_PIECES],
            rates: [1.0; MAX_PIECES],
            advances: [0; MAX_PIECES],
            len: 0,
            cycle_global: 0,
            cycle_local: 0,
        };
        for &(length, rate) in pieces.iter().take(MAX_PIECES) {
            debug_assert!(rate > 0.0);
            let length = length.max(1_000);
            let i = cycle.len;
            cycle.lengths[i] = length;
            cycle.rates[i] = rate;
            // The reading the piece's own formula gives at its end: the next piece starts there.
            cycle.advances[i] = (length as f64 * rate) as u64;
            cycle.cycle_global += length;
            cycle.cycle_local += cycle.advances[i];
            cycle.len += 1;
        }
        cycle
    }

    /// Local nanoseconds elapsed after `elapsed` global nanoseconds.
    fn local(&self, elapsed: u64) -> u64 {
        if self.len == 0 {
            return elapsed;
        }
        let cycles = elapsed / self.cycle_global;
        let mut rest = elapsed % self.cycle_global;
        let mut local = cycles.saturating_mul(self.cycle_local);
        for i in 0..self.len {
            if rest < self.lengths[i] {
                return local.saturating_add((rest as f64 * self.rates[i]) as u64);
            }
            rest -= self.lengths[i];
            local += self.advances[i];
        }
        local
    }

    /// About the global nanoseconds after which `ahead` local nanoseconds have elapsed (the
    /// caller corrects the rounding).
    fn global(&self, ahead: u64) -> u64 {
        if self.len == 0 || self.cycle_local == 0 {
            return ahead;
        }
        let cycles = ahead / self.cycle_local;
        let mut rest = ahead % self.cycle_local;
        let mut global = cycles.saturating_mul(self.cycle_global);
        for i in 0..self.len {
            if rest < self.advances[i] {
                return global.saturating_add((rest as f64 / self.rates[i]) as u64);
            }
            rest -= self.advances[i];
            global += self.lengths[i];
        }
        global
    }
}

/// How a clock's rate behaves.
// One clock per node slot, copied rarely: a few hundred bytes inline keep it `Copy`.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq)]
enum Rate {
    /// One rate for the whole incarnation.
    Constant(f64),
    /// Rates that change during the incarnation.
    Changing(RateCycle),
}

/// One incarnation's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct NodeClock {
    rate: Rate,
    /// The local reading at `start`.
    offset: u64,
    /// The global instant the clock was started.
    start: Instant,
}

impl NodeClock {
    /// The global clock itself, read from `start`.
    pub(crate) fn exact(start: Instant) -> Self {
        Self {
            rate: Rate::Constant(1.0),
            offset: start.as_nanos(),
            start,
        }
    }

    /// A clock running at `rate`, reading `offset` at global `start`.
    pub(crate) fn drifting(start: Instant, rate: f64, offset: u64) -> Self {
        Self {
            rate: Rate::Constant(rate),
            offset,
            start,
        }
    }

    /// A clock whose rate follows `cycle` from global `start`, reading `offset` there.
    pub(crate) fn changing(start: Instant, cycle: RateCycle, offset: u64) -> Self {
        Self {
            rate: Rate::Changing(cycle),
            offset,
            start,
        }
    }

    /// The local reading at global instant `global` (never before `start`).
    pub(crate) fn local(&self, global: Instant) -> Instant {
        let elapsed = global.as_nanos().saturating_sub(self.start.as_nanos());
        let local = match &self.rate {
            Rate::Constant(rate) if *rate == 1.0 => elapsed,
            Rate::Constant(rate) => (elapsed as f64 * rate) as u64,
            Rate::Changing(cycle) => cycle.local(elapsed),
        };
        Instant::from_nanos(self.offset.saturating_add(local))
    }

    /// The earliest global instant at which the local clock reads at least `local`.
    pub(crate) fn global(&self, local: Instant) -> Instant {
        let ahead = local.as_nanos().saturating_sub(self.offset);
        let elapsed = match &self.rate {
            Rate::Constant(rate) if *rate == 1.0 => {
                return Instant::from_nanos(self.start.as_nanos().saturating_add(ahead));
            }
            Rate::Constant(rate) => (ahead as f64 / rate) as u64,
            Rate::Changing(cycle) => cycle.global(ahead),
        };
        let mut global = Instant::from_nanos(self.start.as_nanos().saturating_add(elapsed));
        // Rounding: step back while the instant before still reads `local`, then forward until
        // the local clock has really reached it.
        for _ in 0..4 {
            let before = Instant::from_nanos(global.as_nanos().saturating_sub(1));
            if before < self.start || before == global || self.local(before) < local {
                break;
            }
            global = before;
        }
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

    /// A clock whose rate flips between 1.02 and 0.98: continuous and monotonic at every
    /// flip and across the cycle's repetition, each piece at its own rate, and `global` the
    /// earliest instant reaching a reading.
    #[test]
    fn flipping_rates_keep_the_clock_continuous_and_monotonic() {
        let cycle = RateCycle::new(&[(30_000_000, 1.02), (7_000_001, 0.98), (500_000, 1.02)]);
        let start = Instant::from_nanos(1_000_000);
        let clock = NodeClock::changing(start, cycle, 42_000_000_000);
        let period = 37_500_001u64;
        let flips: Vec<u64> = (0..4u64)
            .flat_map(|k| [0, 30_000_000, 37_000_001].map(|f| 1_000_000 + k * period + f))
            .collect();
        for &flip in &flips {
            for g in flip.saturating_sub(3)..flip + 3 {
                let (a, b) = (Instant::from_nanos(g), Instant::from_nanos(g + 1));
                let step = clock.local(b).as_nanos() - clock.local(a).as_nanos();
                assert!(step <= 2, "a jump of {step} ns at {g}");
                assert!(clock.local(b) >= clock.local(a));
            }
        }
        // The second piece runs slow, the first fast.
        let reading = |g: u64| clock.local(Instant::from_nanos(g)).as_nanos();
        let fast = reading(1_000_000 + 20_000_000) - reading(1_000_000 + 10_000_000);
        let slow = reading(1_000_000 + 36_000_000) - reading(1_000_000 + 31_000_000);
        assert!(fast > 10_150_000 && slow < 4_950_000, "{fast} {slow}");
        let mut previous = clock.local(start);
        for g in (1_000_000..1_000_000 + 5 * period).step_by(99_991) {
            let local = clock.local(Instant::from_nanos(g));
            assert!(local >= previous);
            previous = local;
            let back = clock.global(local);
            assert!(back.as_nanos() <= g, "{g}: {back:?}");
            assert!(clock.local(back) >= local);
            let before = Instant::from_nanos(back.as_nanos() - 1);
            assert!(back == start || clock.local(before) < local);
        }
    }
}
