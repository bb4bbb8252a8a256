//! The faults of a Raft run: partitions (symmetric and one way), link cuts, loss and
//! duplication, crashes (the leader's too) and full-cluster restarts, process pauses, graceful
//! leaves, leadership transfers, compactions; and each incarnation's clock.

use std::time::Duration;

use crate::sim::clock::{NodeClock, RateCycle, MAX_PIECES};
use crate::time::Instant;

use super::{Sim, SlotState};

impl Sim {
    /// Draws the next fault's instant.
    pub(super) fn draw_fault_time(&mut self) -> Instant {
        let mean = u64::try_from(self.config.fault_interval.as_nanos()).unwrap_or(u64::MAX);
        self.now + Duration::from_nanos(self.rng.between(mean / 4, mean.saturating_mul(7) / 4))
    }

    /// One fault, drawn from the profile's menu.
    pub(super) fn inject_fault(&mut self) {
        let n = self.slots.len();
        match self.rng.below(20) {
            0..=2 if n >= 2 => self.partition_or_heal(),
            3..=6 => self.crash_fault(),
            7..=9 if self.config.link_cuts && n >= 2 => self.cut_or_restore(),
            10..=12 if self.config.max_pause > Duration::ZERO => self.pause(),
            13 => self.leave_fault(),
            14 => {
                if let Some(i) = self.pick_running() {
                    let local = self.local(i);
                    self.trace(format_args!("node {i} asks to lead"));
                    self.report.faults.transfers += 1;
                    if let Some(node) = self.slots[i].node.as_mut() {
                        node.become_leader(local);
                    }
                }
            }
            15 => {
                if let Some(i) = self.pick_running() {
                    self.report.faults.compactions_asked += 1;
                    if let Some(node) = self.slots[i].node.as_mut() {
                        node.compact_now();
                    }
                }
            }
            _ => {
                let c = &mut self.network.conditions;
                c.loss = self.rng.unit() * self.config.max_loss;
                c.duplicate = self.rng.unit() * self.config.max_duplicate;
                let permille = (c.loss * 1000.0) as u64;
                self.trace(format_args!("loss {permille}‰"));
                let f = &mut self.report.faults;
                f.link_changes += 1;
                f.max_loss_permille = f.max_loss_permille.max(permille);
            }
        }
    }

    fn partition_or_heal(&mut self) {
        let n = self.slots.len();
        if self.network.is_partitioned() {
            self.network.heal();
            self.trace(format_args!("partition healed"));
            return;
        }
        // Half the partitions cut a member that holds a lock off from everyone else: its
        // session must end before the others' leader can expire it and grant the lock again.
        let holders: Vec<usize> = (0..n)
            .filter(|i| !self.slots[*i].beliefs.is_empty())
            .collect();
        let side = if !holders.is_empty() && self.rng.chance(0.5) {
            vec![holders[self.rng.below(holders.len() as u64) as usize]]
        } else {
            let size = 1 + self.rng.below(n as u64 - 1) as usize;
            let mut all: Vec<usize> = (0..n).collect();
            let mut side = Vec::new();
            for _ in 0..size {
                let pick = self.rng.below(all.len() as u64) as usize;
                side.push(all.swap_remove(pick));
            }
            side
        };
        let one_way = self.config.one_way > 0.0 && self.rng.chance(self.config.one_way);
        self.network.partition(&side, one_way);
        self.trace(format_args!("partition {side:?} (one way: {one_way})"));
        self.report.faults.partitions += 1;
        self.report.faults.one_way_partitions += u64::from(one_way);
    }

    fn cut_or_restore(&mut self) {
        let n = self.slots.len();
        let cuts = self.network.cuts();
        if !cuts.is_empty() && self.rng.chance(0.4) {
            let (a, b) = cuts[self.rng.below(cuts.len() as u64) as usize];
            self.network.restore(a, b);
            self.network.restore(b, a);
            self.trace(format_args!("link {a}-{b} restored"));
            return;
        }
        let a = self.rng.below(n as u64) as usize;
        let b = (a + 1 + self.rng.below(n as u64 - 1) as usize) % n;
        if self.rng.chance(self.config.one_way) {
            self.network.cut(a, b);
            self.report.faults.one_way_cuts += 1;
            self.trace(format_args!("link {a}->{b} cut"));
        } else {
            self.network.cut(a, b);
            self.network.cut(b, a);
            self.report.faults.link_cuts += 1;
            self.trace(format_args!("link {a}-{b} cut"));
        }
    }

    fn crash_fault(&mut self) {
        if self.rng.chance(self.config.full_restart) {
            self.report.faults.full_restarts += 1;
            self.trace(format_args!("every member crashes"));
            for i in 0..self.slots.len() {
                let downtime = Duration::from_millis(self.rng.between(300, 3_000));
                self.crash(i, downtime);
            }
            return;
        }
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.slots[*i].node.is_some())
            .collect();
        if running.is_empty() {
            return;
        }
        let leader = running
            .iter()
            .copied()
            .find(|i| self.slots[*i].node.as_ref().is_some_and(|n| n.is_leader()));
        let victim = match leader {
            Some(leader) if self.rng.chance(0.5) => leader,
            _ => running[self.rng.below(running.len() as u64) as usize],
        };
        if Some(victim) == leader {
            self.report.faults.leader_crashes += 1;
        }
        let downtime = Duration::from_millis(self.rng.between(200, 4_000));
        self.crash(victim, downtime);
    }

    fn pause(&mut self) {
        let Some(victim) = self.pick_running() else {
            return;
        };
        let lo = 0.005_f64;
        let hi = self.config.max_pause.as_secs_f64().max(lo);
        let length = Duration::from_secs_f64(lo * (hi / lo).powf(self.rng.unit()));
        self.trace(format_args!("node {victim} pauses for {length:?}"));
        self.slots[victim].paused_until = Some(self.now + length);
        let f = &mut self.report.faults;
        f.pauses += 1;
        f.longest_pause = f.longest_pause.max(length);
    }

    fn leave_fault(&mut self) {
        let up = (0..self.slots.len())
            .filter(|i| {
                matches!(self.slots[*i].state, SlotState::Up)
                    && self.slots[*i].paused_until.is_none()
            })
            .count();
        if up < 2 {
            return;
        }
        if let Some(i) = self.pick_running() {
            self.leave(i);
        }
    }

    /// A running member (up, not paused, not leaving), if any.
    pub(super) fn pick_running(&mut self) -> Option<usize> {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|i| {
                let slot = &self.slots[*i];
                matches!(slot.state, SlotState::Up)
                    && slot.node.is_some()
                    && slot.paused_until.is_none()
            })
            .collect();
        (!running.is_empty()).then(|| running[self.rng.below(running.len() as u64) as usize])
    }

    /// The clock of a new incarnation of slot `index`: exact without drift; with drift ρ
    /// pinned at `1 ± ρ` (a quarter), flipping between the two (a quarter) or at one rate
    /// drawn from the bound; the known-bad slow clock overrides it.
    pub(super) fn new_clock(&mut self, index: usize) -> NodeClock {
        let offset = self.rng.below(1 << 40);
        if let Some(slow) = self.config.slow_clock.filter(|s| s.node == index) {
            return NodeClock::drifting(self.now, slow.rate, offset);
        }
        let rho = self.config.clock_drift;
        if rho <= 0.0 {
            return NodeClock::exact(self.now);
        }
        let kind = self.rng.unit();
        let (clock, drift) = if kind < 0.25 {
            let sign = if self.rng.chance(0.5) { 1.0 } else { -1.0 };
            (NodeClock::drifting(self.now, 1.0 + sign * rho, offset), rho)
        } else if kind < 0.5 {
            let fast_first = self.rng.chance(0.5);
            let pieces: Vec<(u64, f64)> = (0..MAX_PIECES)
                .map(|i| {
                    let length = 0.01 * (400.0_f64).powf(self.rng.unit());
                    let fast = (i % 2 == 0) == fast_first;
                    (
                        (length * 1e9) as u64,
                        if fast { 1.0 + rho } else { 1.0 - rho },
                    )
                })
                .collect();
            (
                NodeClock::changing(self.now, RateCycle::new(&pieces), offset),
                rho,
            )
        } else {
            let rate = 1.0 - rho + 2.0 * rho * self.rng.unit();
            (
                NodeClock::drifting(self.now, rate, offset),
                (rate - 1.0).abs(),
            )
        };
        let ppm = (drift * 1e6).round() as u64;
        let f = &mut self.report.faults;
        f.max_drift_ppm = f.max_drift_ppm.max(ppm);
        clock
    }
}
