//! The load beside a measurement, and what the floor says about the machine.
//!
//! This machine has two shared vCPUs, and a lock's figures change with what else runs: a
//! process spinning on one core leaves the benchmark's processes one core between them, which
//! is what a busy neighbour (a build, another service) does. A mode that measures in both
//! [`Regime`]s starts a [`Neighbour`] for the second: a child process of this program that
//! busy-loops for a bounded time and is killed by its PID when the measurement ends or fails.
//!
//! The raw loopback ping-pong floor is bimodal here (see `docs/benchmarks.md`): 12–17 µs when
//! both processes run on one vCPU (each wake-up a local context switch), 45–80 µs when they
//! run on different vCPUs (each wake-up an inter-processor interrupt). [`FloorKind`] names
//! which one a run measured, so that figures are compared within one kind.

use std::fmt;
use std::time::{Duration, Instant};

use super::{expect, micros, Error, Proc};

/// The longest a neighbour spins if nobody kills it (a benchmark that died without killing
/// its children leaves no process spinning for long).
const NEIGHBOUR_BOUND: Duration = Duration::from_secs(600);

/// A floor p50 below this is the fast (same-vCPU) kind.
const FAST_BELOW: Duration = Duration::from_micros(20);
/// A floor p50 above this is the slow (cross-vCPU) kind.
const SLOW_ABOVE: Duration = Duration::from_micros(40);

/// What runs beside a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Regime {
    /// Nothing of this benchmark's own.
    Quiet,
    /// A child process spinning on one core.
    Neighbour,
}

impl Regime {
    /// Both, in the order a round measures them.
    pub(crate) const ALL: [Regime; 2] = [Regime::Quiet, Regime::Neighbour];

    /// The regimes `CONCLAVE_BENCH_REGIMES` names (`quiet`, `neighbour`, or both separated
    /// by a comma); both if it is not set.
    pub(crate) fn from_env() -> Result<Vec<Regime>, Error> {
        let Ok(words) = std::env::var("CONCLAVE_BENCH_REGIMES") else {
            return Ok(Self::ALL.to_vec());
        };
        words
            .split(',')
            .map(|word| match word.trim() {
                "quiet" => Ok(Regime::Quiet),
                "neighbour" => Ok(Regime::Neighbour),
                other => Err(format!(
                    "unknown regime {other:?} in CONCLAVE_BENCH_REGIMES; use `quiet`, `neighbour` or both"
                )
                .into()),
            })
            .collect()
    }

    /// Its name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Regime::Quiet => "quiet",
            Regime::Neighbour => "spinning neighbour",
        }
    }

    /// What its chart files' names end with (before `.svg`).
    pub(crate) fn chart_suffix(self) -> &'static str {
        match self {
            Regime::Quiet => "",
            Regime::Neighbour => "-neighbour",
        }
    }

    /// Starts what the regime runs beside the measurement: nothing, or a [`Neighbour`].
    pub(crate) fn start(self) -> Result<Option<Neighbour>, Error> {
        match self {
            Regime::Quiet => Ok(None),
            Regime::Neighbour => Neighbour::start().map(Some),
        }
    }
}

/// A child process spinning on one core; killed by its PID when dropped (also on an error).
pub(crate) struct Neighbour {
    _child: Proc,
}

impl Neighbour {
    /// Starts the spinning child and waits until it spins.
    pub(crate) fn start() -> Result<Self, Error> {
        let mut proc = Proc::spawn(&["spin", &NEIGHBOUR_BOUND.as_millis().to_string()])?;
        expect(&mut proc, "SPINNING")?;
        Ok(Self { _child: proc })
    }
}

/// The child role `spin <ms>`: says SPINNING, then busy-loops for `ms` at most.
pub(crate) fn spin(ms: &str) -> Result<(), Error> {
    let bound = Duration::from_millis(ms.parse()?);
    let start = Instant::now();
    println!("SPINNING");
    let mut turns = 0u64;
    while start.elapsed() < bound {
        turns = std::hint::black_box(turns.wrapping_add(1));
    }
    Ok(())
}

/// Which of the machine's two floors a measurement saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloorKind {
    /// Below [`FAST_BELOW`]: the ping-pong's two processes shared a vCPU.
    Fast,
    /// Between the two: rounds of both kinds, or neither.
    Mixed,
    /// Above [`SLOW_ABOVE`]: every wake-up crossed vCPUs.
    Slow,
}

impl FloorKind {
    /// The kind of a floor whose p50 is `p50`.
    pub(crate) fn of(p50: Duration) -> Self {
        if p50 < FAST_BELOW {
            FloorKind::Fast
        } else if p50 > SLOW_ABOVE {
            FloorKind::Slow
        } else {
            FloorKind::Mixed
        }
    }
}

impl fmt::Display for FloorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (word, bound) = match self {
            FloorKind::Fast => ("fast", format!("< {:.0} µs", micros(FAST_BELOW))),
            FloorKind::Mixed => (
                "mixed",
                format!("{:.0}–{:.0} µs", micros(FAST_BELOW), micros(SLOW_ABOVE)),
            ),
            FloorKind::Slow => ("slow", format!("> {:.0} µs", micros(SLOW_ABOVE))),
        };
        write!(f, "{word} ({bound})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_are_classified_by_their_p50() {
        let us = Duration::from_micros;
        assert_eq!(FloorKind::of(us(14)), FloorKind::Fast);
        assert_eq!(FloorKind::of(us(20)), FloorKind::Mixed);
        assert_eq!(FloorKind::of(us(40)), FloorKind::Mixed);
        assert_eq!(FloorKind::of(us(55)), FloorKind::Slow);
        assert_eq!(FloorKind::Fast.to_string(), "fast (< 20 µs)");
    }
}
