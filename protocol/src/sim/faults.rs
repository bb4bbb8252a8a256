//! The harsh fault profile: what real networks and operating systems do that the gentle
//! profile does not — single link cuts (symmetric and one-way), process pauses with buffered
//! delivery, loss up to 30%, duplication, reorderings of up to seconds and clock rates that
//! drift, sit at the bound or flip within it.

use std::time::Duration;

use super::clock::{NodeClock, RateCycle, MAX_PIECES};
use super::network::Network;
use super::rng::SimRng;
use super::slot::SlotState;
use super::Simulation;
use crate::time::Instant;

/// Shortest and longest stretch of a flipping clock at one rate (drawn log-uniformly): from
/// a few round trips to several lease lengths.
const FLIP_MIN: Duration = Duration::from_millis(10);
const FLIP_MAX: Duration = Duration::from_secs(4);

/// The extra faults of the harsh profile ([`super::SimConfig::harsh`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HarshFaults {
    /// Cut single links, both ways or one way (the share [`super::SimConfig::one_way`]), and
    /// restore them. Default on.
    pub link_cuts: bool,
    /// Shortest process pause. Default 5 ms.
    pub min_stall: Duration,
    /// Longest process pause (drawn log-uniformly between the two; several lease lengths).
    /// Default 4 s.
    pub max_stall: Duration,
    /// Share of datagrams held back far beyond the delay spread. Default 0.02.
    pub reorder: f64,
    /// Longest delay of a held-back datagram (its extra delay is uniform between the delay
    /// spread and this ceiling). Default 3 s; `CONCLAVE_SIM_MAX_REORDER_MS` sets it and turns
    /// [`HarshFaults::vary_reorder`] off.
    pub max_reorder_delay: Duration,
    /// Whether each run draws its own ceiling by its seed: seeds ≡ 0 (mod 3) use
    /// `max_reorder_delay`, seeds ≡ 1 a third of it, seeds ≡ 2 a tenth (3 s, 1 s and 300 ms
    /// with the default), so every three consecutive seeds cover all three. `false` holds every
    /// run's datagrams back up to `max_reorder_delay`. Default true.
    pub vary_reorder: bool,
    /// The drift bound ρ: each incarnation's clock runs at a rate within `[1 − ρ, 1 + ρ]` of
    /// real time. Default 0.02 (the protocol's `LockConfig::local` bound is about 0.059);
    /// `CONCLAVE_SIM_DRIFT` sets it.
    pub clock_drift: f64,
    /// Share of incarnations whose clock runs at exactly `1 − ρ` or `1 + ρ` (half each), where
    /// lease arithmetic is tightest. Default 0.25; `CONCLAVE_SIM_CLOCK_PINNED`.
    pub pinned_clocks: f64,
    /// Share of incarnations whose clock flips between `1 + ρ` and `1 − ρ` at random instants
    /// (10 ms to 4 s at one rate, log-uniform), continuous and monotonic throughout. Default
    /// 0.25; `CONCLAVE_SIM_CLOCK_FLIPPING`. The other incarnations draw one rate uniformly
    /// from the bound.
    pub flipping_clocks: f64,
}

impl Default for HarshFaults {
    fn default() -> Self {
        Self {
            link_cuts: true,
            min_stall: Duration::from_millis(5),
            max_stall: Duration::from_secs(4),
            reorder: 0.02,
            max_reorder_delay: Duration::from_secs(3),
            vary_reorder: true,
            clock_drift: 0.02,
            pinned_clocks: 0.25,
            flipping_clocks: 0.25,
        }
    }
}

impl HarshFaults {
    /// The longest hold-back of run `seed` ([`HarshFaults::vary_reorder`]).
    pub fn reorder_ceiling(&self, seed: u64) -> Duration {
        match (self.vary_reorder, seed % 3) {
            (false, _) | (true, 0) => self.max_reorder_delay,
            (true, 1) => self.max_reorder_delay / 3,
            (true, _) => self.max_reorder_delay / 10,
        }
    }

    /// Applies the knobs set in the environment: `CONCLAVE_SIM_MAX_REORDER_MS` (a fixed
    /// ceiling for every run), `CONCLAVE_SIM_DRIFT`, `CONCLAVE_SIM_CLOCK_PINNED`,
    /// `CONCLAVE_SIM_CLOCK_FLIPPING`.
    ///
    /// # Panics
    /// If a knob is set to something that is not a number.
    pub(crate) fn apply_env(&mut self) {
        if let Some(ms) = env_number::<u64>("CONCLAVE_SIM_MAX_REORDER_MS") {
            self.max_reorder_delay = Duration::from_millis(ms);
            self.vary_reorder = false;
        }
        for (var, value) in [
            ("CONCLAVE_SIM_DRIFT", &mut self.clock_drift),
            ("CONCLAVE_SIM_CLOCK_PINNED", &mut self.pinned_clocks),
            ("CONCLAVE_SIM_CLOCK_FLIPPING", &mut self.flipping_clocks),
        ] {
            if let Some(v) = env_number(var) {
                *value = v;
            }
        }
    }

    /// The variables that set every knob where it differs from the default, for a replay
    /// line (each followed by a space).
    pub(crate) fn replay_vars(&self) -> String {
        let default = Self::default();
        let mut vars = String::new();
        if self.vary_reorder != default.vary_reorder
            || self.max_reorder_delay != default.max_reorder_delay
        {
            vars.push_str(&format!(
                "CONCLAVE_SIM_MAX_REORDER_MS={} ",
                self.max_reorder_delay.as_millis()
            ));
        }
        for (var, value, default) in [
            ("CONCLAVE_SIM_DRIFT", self.clock_drift, default.clock_drift),
            (
                "CONCLAVE_SIM_CLOCK_PINNED",
                self.pinned_clocks,
                default.pinned_clocks,
            ),
            (
                "CONCLAVE_SIM_CLOCK_FLIPPING",
                self.flipping_clocks,
                default.flipping_clocks,
            ),
        ] {
            if value != default {
                vars.push_str(&format!("{var}={value} "));
            }
        }
        vars
    }
}

/// The value of environment variable `var`, if set.
///
/// # Panics
/// If it is set to something that does not parse.
pub(crate) fn env_number<T: std::str::FromStr>(var: &str) -> Option<T> {
    let value = std::env::var(var).ok()?;
    match value.parse() {
        Ok(v) => Some(v),
        Err(_) => panic!("{var}={value} is not a number"),
    }
}

/// Counters of the harsh faults injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Links cut both ways.
    pub link_cuts: u64,
    /// Links cut one way.
    pub one_way_cuts: u64,
    /// Partitions in which one side is heard by the other but hears nothing from it.
    pub one_way_partitions: u64,
    /// Process pauses.
    pub stalls: u64,
    /// Their total length.
    pub stall_time: Duration,
    /// The longest pause.
    pub longest_stall: Duration,
    /// The highest loss rate set, in per mille.
    pub max_loss_permille: u64,
    /// The largest clock-rate difference from real time drawn for a node, in parts per million.
    pub max_drift_ppm: u64,
    /// Incarnations whose clock ran at exactly `1 ± ρ`.
    pub pinned_clocks: u64,
    /// Incarnations whose clock rate flipped within the bound.
    pub flipping_clocks: u64,
    /// The longest delay of a datagram held back (reordered).
    pub longest_hold_back: Duration,
    /// Datagrams held back for a second or more.
    pub long_hold_backs: u64,
}

impl FaultStats {
    /// Why a harsh band with these counters did not exercise the clock faults `knobs` ask for
    /// (drift near ρ, clocks pinned at the bound, clocks flipping), or `None` if it did.
    pub fn missing_clock_faults(&self, knobs: &HarshFaults) -> Option<&'static str> {
        let rho_ppm = (knobs.clock_drift * 1e6).round() as u64;
        if self.max_drift_ppm < rho_ppm / 2 {
            return Some("no clock drift");
        }
        let pinned = knobs.pinned_clocks == 0.0 || self.pinned_clocks > 0;
        let flipping = knobs.flipping_clocks == 0.0 || self.flipping_clocks > 0;
        (rho_ppm > 0 && !(pinned && flipping)).then_some("no clock pinned at the bound or flipping")
    }

    pub(crate) fn accumulate(&mut self, o: &FaultStats) {
        self.link_cuts += o.link_cuts;
        self.one_way_cuts += o.one_way_cuts;
        self.one_way_partitions += o.one_way_partitions;
        self.stalls += o.stalls;
        self.stall_time += o.stall_time;
        self.longest_stall = self.longest_stall.max(o.longest_stall);
        self.max_loss_permille = self.max_loss_permille.max(o.max_loss_permille);
        self.max_drift_ppm = self.max_drift_ppm.max(o.max_drift_ppm);
        self.pinned_clocks += o.pinned_clocks;
        self.flipping_clocks += o.flipping_clocks;
        self.longest_hold_back = self.longest_hold_back.max(o.longest_hold_back);
        self.long_hold_backs += o.long_hold_backs;
    }

    /// Takes the network's record of held-back datagrams.
    pub(crate) fn record_hold_backs(&mut self, network: &Network) {
        let (longest, long) = network.hold_backs();
        self.longest_hold_back = self.longest_hold_back.max(longest);
        self.long_hold_backs += long;
    }
}

impl Simulation {
    /// A fault of the harsh profile. Returns `false` if it drew a fault of the gentle menu,
    /// which the caller then injects.
    pub(super) fn inject_harsh_fault(&mut self, harsh: &HarshFaults) -> bool {
        let n = self.slots.len();
        match self.rng.below(8) {
            0..=1 if harsh.link_cuts && n >= 2 => {
                let a = self.rng.below(n as u64) as usize;
                let b = (a + 1 + self.rng.below(n as u64 - 1) as usize) % n;
                if self.rng.chance(1.0 - self.config.one_way) {
                    self.network.cut(a, b);
                    self.network.cut(b, a);
                    self.report.faults.link_cuts += 1;
                } else {
                    self.network.cut(a, b);
                    self.report.faults.one_way_cuts += 1;
                }
                true
            }
            2 if harsh.link_cuts => {
                let cuts = self.network.cuts();
                if !cuts.is_empty() {
                    let (a, b) = cuts[self.rng.below(cuts.len() as u64) as usize];
                    self.network.restore(a, b);
                    self.network.restore(b, a);
                }
                true
            }
            3..=4 => {
                let candidates: Vec<usize> = (0..n)
                    .filter(|i| {
                        matches!(self.slots[*i].state, SlotState::Up)
                            && self.slots[*i].stalled_until.is_none()
                    })
                    .collect();
                if let Some(&victim) =
                    candidates.get(self.rng.below(candidates.len().max(1) as u64) as usize)
                {
                    let lo = harsh.min_stall.as_secs_f64().max(1e-6);
                    let hi = harsh.max_stall.as_secs_f64().max(lo);
                    let length = Duration::from_secs_f64(lo * (hi / lo).powf(self.rng.unit()));
                    self.slots[victim].stalled_until = Some(self.now + length);
                    self.report.faults.stalls += 1;
                    self.report.faults.stall_time += length;
                    self.report.faults.longest_stall = self.report.faults.longest_stall.max(length);
                }
                true
            }
            _ => false,
        }
    }

    /// The clock of a new incarnation: exact in the gentle profile; in the harsh one pinned
    /// at `1 ± ρ`, flipping between the two, or at one rate drawn from the bound.
    pub(super) fn new_clock(&mut self) -> NodeClock {
        let Some(harsh) = self.config.harsh.as_ref().filter(|h| h.clock_drift > 0.0) else {
            return NodeClock::exact(self.now);
        };
        let (rho, pinned, flipping) = (
            harsh.clock_drift,
            harsh.pinned_clocks,
            harsh.flipping_clocks,
        );
        let kind = self.rng.unit();
        let offset = self.rng.below(1 << 40);
        let faults = &mut self.report.faults;
        let (clock, drift) = if kind < pinned {
            faults.pinned_clocks += 1;
            let sign = if self.rng.chance(0.5) { 1.0 } else { -1.0 };
            (NodeClock::drifting(self.now, 1.0 + sign * rho, offset), rho)
        } else if kind < pinned + flipping {
            faults.flipping_clocks += 1;
            let cycle = flipping_cycle(&mut self.rng, rho);
            (NodeClock::changing(self.now, cycle, offset), rho)
        } else {
            let rate = 1.0 - rho + 2.0 * rho * self.rng.unit();
            (
                NodeClock::drifting(self.now, rate, offset),
                (rate - 1.0).abs(),
            )
        };
        let ppm = (drift * 1e6).round() as u64;
        faults.max_drift_ppm = faults.max_drift_ppm.max(ppm);
        clock
    }

    /// Wakes node `index` from a pause: it reads everything that arrived meanwhile, stamped
    /// with the wake-up time, then runs its timers.
    pub(super) fn wake(&mut self, index: usize) {
        self.slots[index].stalled_until = None;
        let buffered = std::mem::take(&mut self.slots[index].buffer);
        for bytes in buffered {
            self.deliver(index, &bytes);
        }
        let local = self.local_now(index);
        if let Some(endpoint) = self.slots[index].endpoint.as_mut() {
            if endpoint.poll_timeout().is_some_and(|t| t <= local) {
                endpoint.handle_timeout(local);
            }
        }
    }

    /// Node `index`'s clock now.
    pub(super) fn local_now(&self, index: usize) -> Instant {
        self.slots[index].clock.local(self.now)
    }
}

/// A rate cycle that flips between `1 + ρ` and `1 − ρ`, starting with either, each stretch
/// log-uniform between [`FLIP_MIN`] and [`FLIP_MAX`] (an even number of pieces, so the cycle's
/// repetition flips too).
fn flipping_cycle(rng: &mut SimRng, rho: f64) -> RateCycle {
    let fast_first = rng.chance(0.5);
    let (lo, hi) = (FLIP_MIN.as_secs_f64(), FLIP_MAX.as_secs_f64());
    let pieces: Vec<(u64, f64)> = (0..MAX_PIECES)
        .map(|i| {
            let length = lo * (hi / lo).powf(rng.unit());
            let fast = (i % 2 == 0) == fast_first;
            let rate = if fast { 1.0 + rho } else { 1.0 - rho };
            ((length * 1e9) as u64, rate)
        })
        .collect();
    RateCycle::new(&pieces)
}
