//! The harsh fault profile: what real networks and operating systems do that the gentle
//! profile does not — single link cuts (symmetric and one-way), process pauses with buffered
//! delivery, loss up to 30%, duplication, long reorderings and clock-rate drift.

use std::time::Duration;

use super::clock::NodeClock;
use super::{Simulation, SlotState};
use crate::time::Instant;

/// The extra faults of the harsh profile ([`super::SimConfig::harsh`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HarshFaults {
    /// Cut single links, both ways or one way, and restore them. Default on.
    pub link_cuts: bool,
    /// Shortest process pause. Default 5 ms.
    pub min_stall: Duration,
    /// Longest process pause (drawn log-uniformly between the two; several lease lengths).
    /// Default 4 s.
    pub max_stall: Duration,
    /// Share of datagrams held back far beyond the delay spread. Default 0.02.
    pub reorder: f64,
    /// Longest extra delay of a held-back datagram. Default 300 ms.
    pub max_reorder_delay: Duration,
    /// Each incarnation's clock runs at a rate drawn from `[1 − ρ, 1 + ρ]` of real time.
    /// Default 0.02 (the protocol's `LockConfig::local` bound is about 0.059).
    pub clock_drift: f64,
}

impl Default for HarshFaults {
    fn default() -> Self {
        Self {
            link_cuts: true,
            min_stall: Duration::from_millis(5),
            max_stall: Duration::from_secs(4),
            reorder: 0.02,
            max_reorder_delay: Duration::from_millis(300),
            clock_drift: 0.02,
        }
    }
}

/// Counters of the harsh faults injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Links cut both ways.
    pub link_cuts: u64,
    /// Links cut one way.
    pub one_way_cuts: u64,
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
}

impl FaultStats {
    pub(crate) fn accumulate(&mut self, o: &FaultStats) {
        self.link_cuts += o.link_cuts;
        self.one_way_cuts += o.one_way_cuts;
        self.stalls += o.stalls;
        self.stall_time += o.stall_time;
        self.longest_stall = self.longest_stall.max(o.longest_stall);
        self.max_loss_permille = self.max_loss_permille.max(o.max_loss_permille);
        self.max_drift_ppm = self.max_drift_ppm.max(o.max_drift_ppm);
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
                if self.rng.chance(0.5) {
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

    /// The clock of a new incarnation: exact in the gentle profile, drifting in the harsh one.
    pub(super) fn new_clock(&mut self) -> NodeClock {
        match self.config.harsh.as_ref().map(|h| h.clock_drift) {
            Some(rho) if rho > 0.0 => {
                let rate = 1.0 - rho + 2.0 * rho * self.rng.unit();
                let offset = self.rng.below(1 << 40);
                let ppm = ((rate - 1.0).abs() * 1e6) as u64;
                self.report.faults.max_drift_ppm = self.report.faults.max_drift_ppm.max(ppm);
                NodeClock::drifting(self.now, rate, offset)
            }
            _ => NodeClock::exact(self.now),
        }
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
