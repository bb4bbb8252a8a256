//! How long a wait busy-polls before it sleeps: adaptive spinning within
//! [`crate::NodeBuilder::spin_wait`].
//!
//! A wait for an answer from another process spins because waking a sleeping thread costs about
//! as much as a loopback round trip ([`crate::duty`]). The spin pays only if the answer comes
//! while it lasts. One fixed length does not fit every case:
//! - shorter than the round trip, it burns a core and then pays the wake-up anyway; a round trip
//!   just over it (a busier machine, a bigger cluster) costs a whole wake-up more;
//! - where the spinning thread holds the CPU the answer needs (the grantor on the same core,
//!   on a small machine), every spin delays the answer by its own length.
//!
//! So each node learns, starting from the bound. It times every uncontended round trip that
//! could spin (a lock request answered without being queued, a release acknowledged), from the
//! send to the answer's arrival, and compares it with the spin that wait had:
//! - caught by the spin: the next waits spin about twice that round trip, at once if that is
//!   longer than now, slowly (an eighth of the gap per answer) if shorter;
//! - arrived after the spin: while most answers still come within their spins (a streak of
//!   slow round trips, which passes), nothing changes; once most do not (a moving average
//!   over about the last eight), each such answer shrinks the spin by an eighth, towards none
//!   at all;
//! - every [`PROBE_EVERY`]th wait spins for the whole bound (a probe), so a node that stopped
//!   spinning finds out when spinning pays again. A probe that the answer missed doubles the
//!   gap to the next, up to [`MAX_PROBE_GAP`] waits; one that caught it resets the gap. So where
//!   spinning does not pay, probes cost one wait in 256 its spin.
//!
//! One budget serves the whole node: where named services have grantors at very different
//! distances, it follows the round trips of the busiest.
//!
//! Nothing here reads a clock: the caller passes the durations.

use std::time::Duration;

/// One wait in this many spins for the whole bound, whatever the current spin, while such
/// probes catch their answers.
pub(crate) const PROBE_EVERY: u32 = 64;

/// The longest gap between two probes, reached while probes keep missing their answers.
pub(crate) const MAX_PROBE_GAP: u32 = 256;

/// The longest spin whatever the bound (a bound such as `Duration::MAX` is too long for the
/// clock to add).
pub(crate) const LONGEST_SPIN: Duration = Duration::from_secs(3600);

/// [`SpinBudget::caught`] when every recent answer came within its spin.
const ALL_CAUGHT: u32 = 256;

/// A node's current spin and what it learns from its round trips.
#[derive(Debug, Clone)]
pub(crate) struct SpinBudget {
    /// The longest spin ([`crate::NodeBuilder::spin_wait`]); zero never spins.
    bound: Duration,
    /// How long a wait spins now.
    current: Duration,
    /// Waits that could spin since the last probe.
    since_probe: u32,
    /// Waits from one probe to the next.
    probe_gap: u32,
    /// How many recent answers came within their spins, in 256ths: a moving average that
    /// weighs each answer an eighth.
    caught: u32,
}

impl SpinBudget {
    /// A budget that never spins longer than `bound` (nor than [`LONGEST_SPIN`]).
    pub(crate) fn new(bound: Duration) -> Self {
        let bound = bound.min(LONGEST_SPIN);
        Self {
            bound,
            current: bound,
            since_probe: 0,
            probe_gap: PROBE_EVERY,
            caught: ALL_CAUGHT,
        }
    }

    /// Whether waits may spin at all (the bound is not zero).
    pub(crate) fn enabled(&self) -> bool {
        !self.bound.is_zero()
    }

    /// The spin of a wait that starts now: the current one, or the whole bound for a probe.
    pub(crate) fn next(&mut self) -> Duration {
        if !self.enabled() {
            return Duration::ZERO;
        }
        self.since_probe += 1;
        if self.since_probe >= self.probe_gap {
            self.since_probe = 0;
            return self.bound;
        }
        self.current
    }

    /// Learns from a wait that had `spun` to spin and was answered `round_trip` after it
    /// started.
    pub(crate) fn answered(&mut self, spun: Duration, round_trip: Duration) {
        if !self.enabled() {
            return;
        }
        let caught = !spun.is_zero() && round_trip <= spun;
        if spun >= self.bound {
            self.probe_gap = if caught {
                PROBE_EVERY
            } else {
                self.probe_gap.saturating_mul(2).min(MAX_PROBE_GAP)
            };
        }
        self.caught = self.caught - self.caught / 8 + if caught { ALL_CAUGHT / 8 } else { 0 };
        if caught {
            let target = round_trip.saturating_mul(2).min(self.bound);
            if target > self.current {
                self.current = target;
            } else {
                self.current -= (self.current - target) / 8;
            }
        } else if self.caught < ALL_CAUGHT / 2 {
            self.current -= self.current / 8;
        }
    }

    /// How long a wait spins now, probes aside.
    #[cfg(test)]
    pub(crate) fn current(&self) -> Duration {
        self.current
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUND: Duration = Duration::from_micros(200);

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// Runs `n` waits answered after `round_trip` each; returns the spins they had.
    fn waits(budget: &mut SpinBudget, n: usize, round_trip: Duration) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let spun = budget.next();
                budget.answered(spun, round_trip);
                spun
            })
            .collect()
    }

    #[test]
    fn a_zero_bound_never_spins() {
        let mut budget = SpinBudget::new(Duration::ZERO);
        assert!(!budget.enabled());
        assert!(waits(&mut budget, 40, us(10)).iter().all(|s| s.is_zero()));
    }

    /// Whether `d` is within a microsecond of `target`.
    fn near(d: Duration, target: Duration) -> bool {
        d.abs_diff(target) <= us(1)
    }

    /// The first wait spins for the whole bound; caught answers then bring the spin down,
    /// an eighth of the way at a time, to twice their round trip.
    #[test]
    fn it_starts_at_the_bound_and_settles_at_twice_the_round_trip() {
        let mut budget = SpinBudget::new(BOUND);
        assert_eq!(budget.current(), BOUND);
        let spins = waits(&mut budget, 60, us(40));
        assert_eq!(spins[0], BOUND);
        assert_eq!(spins[1], BOUND - (BOUND - us(80)) / 8);
        assert!(
            spins.windows(2).all(|w| w[1] <= w[0] || w[1] == BOUND),
            "{spins:?}"
        );
        assert!(near(budget.current(), us(80)), "{:?}", budget.current());
    }

    /// A round trip a little longer than the spin is caught by a probe, and from then on by
    /// every wait: the cliff of a fixed spin (one thread wake-up more) is gone.
    #[test]
    fn round_trips_beyond_the_spin_make_it_grow_after_a_probe() {
        let mut budget = SpinBudget::new(BOUND);
        waits(&mut budget, 60, us(20));
        assert!(near(budget.current(), us(40)));
        let spins = waits(&mut budget, 3 * PROBE_EVERY as usize, us(70));
        let probe = spins.iter().position(|s| *s == BOUND).expect("a probe");
        assert!(probe < PROBE_EVERY as usize);
        assert!(spins[probe + 1..].iter().all(|s| *s >= us(70)), "{spins:?}");
        assert_eq!(budget.current(), us(140));
    }

    /// Round trips shorter than the spin shrink it, slowly, towards twice their length.
    #[test]
    fn short_round_trips_shrink_the_spin_towards_twice_their_length() {
        let mut budget = SpinBudget::new(BOUND);
        waits(&mut budget, 60, us(90));
        assert!(near(budget.current(), us(180)));
        let before = budget.current();
        waits(&mut budget, 1, us(30));
        assert!(budget.current() < before && budget.current() > us(160));
        waits(&mut budget, 200, us(30));
        assert!(near(budget.current(), us(60)), "{:?}", budget.current());
    }

    /// Where the answer comes only once the spin is over (the spinning thread holds the CPU the
    /// grantor needs), the spin dwindles instead of chasing its own delay, and probes, which
    /// miss too, grow rare: one wait in MAX_PROBE_GAP. A probe that catches its answer brings
    /// the spin back, and probes come every PROBE_EVERY waits again.
    #[test]
    fn answers_after_the_spin_make_it_dwindle() {
        let mut budget = SpinBudget::new(BOUND);
        let mut probes = Vec::new();
        for i in 0..6000 {
            let spun = budget.next();
            if i >= 100 && spun == BOUND {
                probes.push(i);
            }
            budget.answered(spun, spun + us(40));
        }
        assert!(budget.current() < us(1), "{:?}", budget.current());
        assert!(probes.len() >= 20, "probes at {probes:?}");
        assert!(
            probes
                .windows(2)
                .all(|w| w[1] - w[0] == MAX_PROBE_GAP as usize),
            "probes at {probes:?}"
        );

        let spins = waits(&mut budget, 2 * MAX_PROBE_GAP as usize, us(60));
        let probes: Vec<usize> = (0..spins.len()).filter(|i| spins[*i] == BOUND).collect();
        assert!(
            spins[probes[0] + 1..].iter().all(|s| *s >= us(60)),
            "{spins:?}"
        );
        assert!(near(budget.current(), us(120)), "{:?}", budget.current());
        assert!(probes.len() > 2, "{probes:?}");
        assert!(
            probes
                .windows(2)
                .all(|w| w[1] - w[0] == PROBE_EVERY as usize),
            "{probes:?}"
        );
    }

    /// Probes that miss double the gap to the next one, up to the longest.
    #[test]
    fn missed_probes_double_the_gap() {
        let mut budget = SpinBudget::new(BOUND);
        waits(&mut budget, 60, us(40));
        let mut probes = Vec::new();
        for i in 0..3000 {
            let spun = budget.next();
            if spun == BOUND {
                probes.push(i);
                budget.answered(spun, BOUND + us(1));
            } else {
                budget.answered(spun, us(40));
            }
        }
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        let expected: Vec<usize> = (0..gaps.len())
            .map(|i| ((2 * PROBE_EVERY as usize) << i).min(MAX_PROBE_GAP as usize))
            .collect();
        assert!(gaps.len() >= 4, "probes at {probes:?}");
        assert_eq!(gaps, expected, "probes at {probes:?}");
        assert!(
            near(budget.current(), us(80)),
            "the spin itself still catches"
        );
    }

    /// A few slow round trips among caught ones leave the spin alone; a run of them long
    /// enough that most recent answers missed their spins shrinks it.
    #[test]
    fn a_streak_of_slow_round_trips_shrinks_the_spin_only_once_most_answers_miss() {
        let mut budget = SpinBudget::new(BOUND);
        waits(&mut budget, 60, us(60));
        let settled = budget.current();
        assert!(near(settled, us(120)));
        waits(&mut budget, 4, us(300));
        assert_eq!(budget.current(), settled, "four misses after many catches");
        waits(&mut budget, 20, us(60));
        waits(&mut budget, 12, us(300));
        assert!(budget.current() < us(100), "{:?}", budget.current());
    }

    /// A spin never exceeds the bound, however long the round trips it catches, nor an hour.
    #[test]
    fn the_bound_holds() {
        let mut budget = SpinBudget::new(us(100));
        for spun in waits(&mut budget, 100, us(99)) {
            assert!(spun <= us(100));
        }
        assert_eq!(budget.current(), us(100));
        assert_eq!(SpinBudget::new(Duration::MAX).next(), LONGEST_SPIN);
    }
}
