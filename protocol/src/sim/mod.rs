//! A deterministic cluster simulator (feature `sim`).
//!
//! [`run`] simulates a cluster of [`Endpoint`]s from a seed: a virtual clock, a network that
//! loses, duplicates, delays and reorders datagrams, partitions that split and heal, members
//! that crash, restart as new incarnations and leave. A chaos phase injects faults; then the
//! network heals, crashed nodes restart, and a calm phase must reach one agreed view within a
//! bound. Checkers run after every step:
//!
//! - no panic;
//! - at every member, each installed view has a higher epoch than the previous one and
//!   contains the member;
//! - a crashed member is excluded from every live member's view within the suspect timeout
//!   plus a bound (checked for crashes isolated from other faults);
//! - once faults stop, all live members install one identical view, holding exactly the live
//!   members, within [`SimConfig::calm`].
//!
//! The run is a function of the seed and the configuration alone: the same seed gives the same
//! [`Report`] (including its trace hash). A [`Violation`] names the seed and the command that
//! replays it.
//!
//! ```
//! use conclave_protocol::sim::{self, SimConfig};
//!
//! let report = sim::run(7, &SimConfig::default()).expect("no invariant is violated");
//! assert!(report.steps > 0);
//! assert_eq!(sim::run(7, &SimConfig::default()), Ok(report));
//! ```

mod clock;
mod config;
mod faults;
mod lock_check;
mod network;
#[cfg(feature = "raft")]
pub mod raft;
mod report;
mod rng;
pub mod scale;
mod slot;
mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use conclave_lock_api::{LockName, MemberId};

use crate::endpoint::{Destination, Endpoint, EndpointEvent};
use crate::gms::MembershipState;
use crate::time::Instant;
use clock::NodeClock;
use config::replay_command;
use network::{Conditions, Network};
use slot::{Crash, Slot, SlotState};

pub use config::SimConfig;
pub use faults::{FaultStats, HarshFaults};
pub use network::NetworkStats;
pub use report::{Report, Violation};
pub use rng::SimRng;
use workload::{Action, Actor};

pub use workload::{Workload, WorkloadStats};

/// The most datagrams a node takes in one go before the simulator flushes its answers (the
/// driver of `conclave` takes up to 32).
const DELIVERY_BATCH: usize = 8;

/// Runs one seed. `Ok` carries what was exercised; `Err` the first invariant broken.
///
/// # Errors
/// The first [`Violation`]; a panic inside the protocol is reported as one too.
pub fn run(seed: u64, config: &SimConfig) -> Result<Report, Violation> {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        Simulation::new(seed, config.clone()).run()
    }));
    outcome.unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "non-string panic".to_owned());
        Err(Violation {
            seed,
            step: 0,
            at: Instant::ZERO,
            invariant: "the protocol never panics",
            detail,
            replay: replay_command(seed, config),
        })
    })
}

/// Whose tokens must increase: (lock service, grantor incarnation or 0, lock).
type TokenKey = (Option<conclave_lock_api::ServiceName>, u128, LockName);

#[derive(Debug)]
struct Simulation {
    seed: u64,
    config: SimConfig,
    rng: SimRng,
    now: Instant,
    slots: Vec<Slot>,
    network: Network,
    next_fault: Instant,
    chaos_end: Instant,
    calm: bool,
    crashes: Vec<Crash>,
    fault_times: Vec<Instant>,
    /// The last grant any actor received (the availability figures).
    last_grant: Instant,
    /// Last fencing token granted per (lock service, grantor incarnation or 0 for
    /// cluster-wide, lock), with the granting incarnation and the number of node starts at
    /// that grant.
    last_tokens: BTreeMap<TokenKey, lock_check::LastToken>,
    /// Print every event (`CONCLAVE_SIM_TRACE=1`), for replaying a failing seed.
    trace: bool,
    /// Print every datagram delivered too (`CONCLAVE_SIM_TRACE=datagrams`).
    trace_datagrams: bool,
    report: Report,
}

impl Simulation {
    fn new(seed: u64, config: SimConfig) -> Self {
        let mut rng = SimRng::new(seed);
        let slots = (0..config.nodes)
            .map(|i| Slot {
                addr: SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16)),
                endpoint: None,
                state: SlotState::Down {
                    restart_at: Instant::from_nanos(rng.below(500_000_000)),
                },
                last_epoch: 0,
                last_view_len: 0,
                minority_since: None,
                timers_ran: None,
                timers_late_until: None,
                disk_term: 0,
                actors: Vec::new(),
                next_owner: 1,
                granted: BTreeSet::new(),
                clock: NodeClock::exact(Instant::ZERO),
                stalled_until: None,
                buffer: Vec::new(),
            })
            .collect();
        let conditions = Conditions {
            loss: 0.0,
            duplicate: 0.0,
            min_delay: config.min_delay,
            max_delay: config.max_delay,
            reorder: config.harsh.as_ref().map_or(0.0, |h| h.reorder),
            max_reorder_delay: config
                .harsh
                .as_ref()
                .map_or(Duration::ZERO, |h| h.reorder_ceiling(seed)),
        };
        let network = Network::new(config.nodes, conditions);
        let chaos_end = Instant::ZERO + config.chaos;
        let mut sim = Self {
            seed,
            rng,
            now: Instant::ZERO,
            slots,
            network,
            next_fault: Instant::ZERO,
            chaos_end,
            calm: false,
            crashes: Vec::new(),
            fault_times: Vec::new(),
            last_grant: Instant::ZERO,
            last_tokens: BTreeMap::new(),
            trace: std::env::var_os("CONCLAVE_SIM_TRACE").is_some(),
            trace_datagrams: std::env::var("CONCLAVE_SIM_TRACE").is_ok_and(|v| v == "datagrams"),
            report: Report {
                seed,
                ..Report::default()
            },
            config,
        };
        sim.next_fault = sim.draw_fault_time();
        sim
    }

    fn run(mut self) -> Result<Report, Violation> {
        let calm_end = self.chaos_end + self.config.calm;
        loop {
            if self.report.steps >= self.config.max_steps {
                return Err(self.violation(
                    "runs end within the step bound",
                    "step limit reached".into(),
                ));
            }
            self.report.steps += 1;
            let next = self.next_instant(calm_end);
            self.now = self.now.max(next);
            if !self.calm && self.now >= self.chaos_end {
                self.begin_calm();
            } else if self.now >= calm_end {
                return Err(self.no_convergence());
            } else if !self.calm && self.now >= self.next_fault {
                self.inject_fault();
                self.next_fault = self.draw_fault_time();
            } else if let Some(index) = self.due_wake() {
                self.wake(index);
            } else if let Some(datagram) = self.network.pop_due(self.now) {
                // Like a driver, the node takes what else is waiting for it before it
                // answers, so its answers to one member leave in one bundle.
                self.deliver(datagram.to, &datagram.bytes);
                for _ in 1..DELIVERY_BATCH {
                    match self.network.pop_due_to(self.now, datagram.to) {
                        Some(next) => self.deliver(next.to, &next.bytes),
                        None => break,
                    }
                }
            } else {
                self.run_timers();
            }
            self.flush()?;
            self.check_exclusions()?;
            if self.config.workload.is_some() {
                self.check_locks()?;
            }
            if self.calm && self.converged() {
                self.report.converged_after = self.now - self.chaos_end;
                return Ok(self.finish());
            }
        }
    }

    fn next_instant(&self, calm_end: Instant) -> Instant {
        let mut next = calm_end;
        if !self.calm {
            next = next.min(self.chaos_end).min(self.next_fault);
        }
        if let Some(t) = self.network.next_delivery() {
            next = next.min(t);
        }
        for slot in &self.slots {
            if let Some(until) = slot.stalled_until {
                next = next.min(until);
                continue;
            }
            match (&slot.state, &slot.endpoint) {
                (SlotState::Down { restart_at }, _) => next = next.min(*restart_at),
                (_, Some(endpoint)) => {
                    if let Some(t) = endpoint.poll_timeout() {
                        let late = slot.timers_late_until.filter(|_| !self.calm);
                        let t = slot.clock.global(t);
                        next = next.min(late.map_or(t, |late| t.max(late)));
                    }
                }
                _ => {}
            }
            if matches!(slot.state, SlotState::Up) {
                for actor in &slot.actors {
                    if self.calm && actor.is_idle() {
                        continue;
                    }
                    if let Some(t) = actor.next_timer() {
                        next = next.min(t);
                    }
                }
            }
        }
        next
    }

    /// A paused node whose pause is over.
    fn due_wake(&self) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.stalled_until.is_some_and(|t| t <= self.now))
    }

    fn draw_fault_time(&mut self) -> Instant {
        let mean = u64::try_from(self.config.fault_interval.as_nanos()).unwrap_or(u64::MAX);
        self.now + Duration::from_nanos(self.rng.between(mean / 4, mean.saturating_mul(7) / 4))
    }

    fn begin_calm(&mut self) {
        self.calm = true;
        if self.network.is_partitioned() {
            self.network.heal();
            self.report.partitions_healed += 1;
        }
        self.network.conditions.loss = 0.0;
        self.network.conditions.duplicate = 0.0;
        self.network.conditions.reorder = 0.0;
        self.network.restore_all();
        for slot in &mut self.slots {
            if let Some(until) = &mut slot.stalled_until {
                *until = (*until).min(self.now);
            }
            if let SlotState::Down { restart_at } = &mut slot.state {
                *restart_at = (*restart_at).min(self.now);
            }
        }
    }

    fn live_indices(&self) -> Vec<usize> {
        (0..self.slots.len())
            .filter(|i| matches!(self.slots[*i].state, SlotState::Up))
            .collect()
    }

    fn inject_fault(&mut self) {
        let live = self.live_indices();
        let n = self.slots.len();
        let may_take_down = n - live.len() < self.config.max_down;
        self.fault_times.push(self.now);
        if self.config.only_leaves {
            // Only members of a formed cluster leave: one that leaves while it joins may be
            // admitted after it left, and its missing report is not what this mode is about.
            let formed = live.len() == n
                && live.iter().all(|i| {
                    self.slots[*i]
                        .endpoint
                        .as_ref()
                        .is_some_and(|e| e.view().is_some_and(|v| v.len() == n))
                });
            if n >= 2 && formed {
                self.leave(&live);
            }
            return;
        }
        if let Some(harsh) = self.config.harsh.clone() {
            if self.inject_harsh_fault(&harsh) {
                return;
            }
        }
        match self.rng.below(10) {
            0..=2 if !self.network.is_partitioned() && n >= 2 => {
                let size = 1 + self.rng.below(n as u64 - 1) as usize;
                let mut all: Vec<usize> = (0..n).collect();
                let mut side = Vec::new();
                for _ in 0..size {
                    let pick = self.rng.below(all.len() as u64) as usize;
                    side.push(all.swap_remove(pick));
                }
                // No draw at share 0: the gentle profile's seeds replay as before.
                let one_way = self.config.one_way > 0.0 && self.rng.chance(self.config.one_way);
                self.network.partition(&side, one_way);
                self.report.partitions += 1;
                self.report.faults.one_way_partitions += u64::from(one_way);
            }
            0..=2 => {
                self.network.heal();
                self.report.partitions_healed += 1;
            }
            3..=5 if live.len() >= 2 && may_take_down => {
                let coordinators: Vec<usize> = live
                    .iter()
                    .copied()
                    .filter(|i| {
                        self.slots[*i].endpoint.as_ref().is_some_and(|e| {
                            e.is_coordinator() && e.view().is_some_and(|v| v.len() > 1)
                        })
                    })
                    .collect();
                let victim = if !coordinators.is_empty() && self.rng.chance(0.5) {
                    coordinators[self.rng.below(coordinators.len() as u64) as usize]
                } else {
                    live[self.rng.below(live.len() as u64) as usize]
                };
                self.crash(victim);
            }
            6 if live.len() >= 2 && may_take_down => self.leave(&live),
            _ => {
                self.network.conditions.loss = self.rng.unit() * self.config.max_loss;
                self.network.conditions.duplicate = self.rng.unit() * self.config.max_duplicate;
                self.report.link_changes += 1;
                let permille = (self.network.conditions.loss * 1000.0) as u64;
                self.report.faults.max_loss_permille =
                    self.report.faults.max_loss_permille.max(permille);
                // Loss and duplication rates change the timing only within the slack of the
                // exclusion bound: not a fault that excuses a crash from being checked.
                self.fault_times.pop();
            }
        }
    }

    /// A graceful leave of one of the `live` nodes: the coordinator (the grantor) with the
    /// share `grantor_leaves`, else any.
    fn leave(&mut self, live: &[usize]) {
        let coordinates = |slot: &Slot| {
            slot.endpoint
                .as_ref()
                .is_some_and(|e| e.is_coordinator() && e.view().is_some_and(|v| v.len() > 1))
        };
        // No draw at share 0: seeds replay as before the knob existed.
        let pick_grantor =
            self.config.grantor_leaves > 0.0 && self.rng.chance(self.config.grantor_leaves);
        let coordinator = live.iter().copied().find(|i| coordinates(&self.slots[*i]));
        let leaver = match coordinator.filter(|_| pick_grantor) {
            Some(coordinator) => coordinator,
            None => live[self.rng.below(live.len() as u64) as usize],
        };
        let local = self.local_now(leaver);
        let grantor = coordinates(&self.slots[leaver]);
        if let Some(endpoint) = self.slots[leaver].endpoint.as_mut() {
            endpoint.leave(local);
            self.slots[leaver].state = SlotState::Leaving { since: self.now };
            self.report.leaves += 1;
            self.report.grantor_leaves += u64::from(grantor);
        }
    }

    fn crash(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        let Some(endpoint) = slot.endpoint.take() else {
            return;
        };
        if endpoint.is_coordinator() && endpoint.view().is_some_and(|v| v.len() > 1) {
            self.report.coordinator_crashes += 1;
        }
        self.report.crashes += 1;
        let holds_locks = !endpoint.locks().grantor_holds().is_empty()
            || endpoint
                .services()
                .any(|(_, service)| !service.grantor_holds().is_empty());
        if holds_locks {
            self.report.grantor_crashes_with_locks += 1;
        }
        self.report.add_endpoint(&endpoint);
        slot.actors.clear();
        slot.stalled_until = None;
        slot.buffer.clear();
        // A crash while links are cut or nodes paused is not isolated from other faults.
        let isolated =
            self.network.cuts().is_empty() && self.slots.iter().all(|s| s.stalled_until.is_none());
        let slot = &mut self.slots[index];
        let gms = &self.config.endpoint.gms;
        // Suspicion, a takeover chain (a second suspect timeout), then delivery of the new
        // view over a lossy link: 3 s of retransmissions survive five losses in a row.
        let deadline = self.now
            + gms.suspect_timeout * 2
            + gms.heartbeat_interval * 2
            + Duration::from_secs(3);
        if isolated {
            self.crashes.push(Crash {
                member: endpoint.local().clone(),
                at: self.now,
                deadline,
            });
        }
        let downtime = Duration::from_millis(self.rng.between(200, 4_000));
        slot.state = SlotState::Down {
            restart_at: self.now + downtime,
        };
    }

    fn start(&mut self, index: usize) {
        // Random high half, generation low half (as the front end draws them): the simulation's
        // real time, so a restart at the same address is recognisably newer.
        let generation = u128::from(self.now.as_nanos().saturating_add(1));
        let incarnation = (self.rng.next_u128() & !u128::from(u64::MAX)) | generation;
        let clock = self.new_clock();
        self.slots[index].clock = clock;
        let local = clock.local(self.now);
        let slot = &mut self.slots[index];
        let member = match MemberId::new(incarnation, &format!("n{index}"), slot.addr) {
            Ok(member) => member,
            Err(e) => unreachable!("simulator member names are valid: {e}"),
        };
        let mut endpoint = Endpoint::new(
            "sim",
            member,
            self.config.endpoint.clone(),
            self.config.max_datagram,
        );
        endpoint.gms_mut().set_sabotage(self.config.sabotage);
        endpoint.set_lock_sabotage(self.config.lock_sabotage);
        if self.config.durable_terms {
            endpoint.restore_term(slot.disk_term);
        }
        endpoint.join(local);
        slot.endpoint = Some(endpoint);
        slot.state = SlotState::Up;
        slot.last_epoch = 0;
        slot.last_view_len = 0;
        slot.minority_since = None;
        slot.timers_ran = None;
        slot.granted.clear();
        slot.actors.clear();
        if let Some(workload) = &self.config.workload {
            for _ in 0..workload.actors_per_node {
                slot.actors
                    .push(Actor::new(&mut self.rng, self.now, workload));
            }
        }
        self.report.starts += 1;
    }

    fn deliver(&mut self, to: usize, bytes: &[u8]) {
        let late = self.slots[to]
            .timers_late_until
            .is_some_and(|t| t > self.now)
            && !self.calm;
        if (self.slots[to].stalled_until.is_some() || late) && self.slots[to].endpoint.is_some() {
            self.slots[to].buffer.push(bytes.to_vec());
            return;
        }
        let local = self.local_now(to);
        match self.slots[to].endpoint.as_mut() {
            Some(endpoint) => {
                self.network.stats.delivered += 1;
                if self.trace_datagrams {
                    let cluster = conclave_lock_api::wire::ClusterId::from_name("sim");
                    if let Ok(packet) = conclave_lock_api::wire::decode_packet(cluster, bytes) {
                        println!(
                            "{:?} node {to} <- {}: {:?}",
                            self.now, packet.sender, packet.frame
                        );
                    }
                }
                self.report.trace_hash = fnv(self.report.trace_hash, bytes);
                endpoint.handle_datagram(local, bytes);
            }
            None => self.network.stats.to_dead += 1,
        }
    }

    fn run_timers(&mut self) {
        for index in 0..self.slots.len() {
            if self.slots[index].stalled_until.is_some() {
                continue;
            }
            let local = self.local_now(index);
            match self.slots[index].state {
                SlotState::Down { restart_at } if restart_at <= self.now => self.start(index),
                SlotState::Leaving { since } => {
                    let done = self.slots[index]
                        .endpoint
                        .as_ref()
                        .is_none_or(Endpoint::is_drained);
                    let patience = self.config.endpoint.gms.leave_timeout * 4;
                    if done || self.now >= since + patience {
                        if let Some(endpoint) = self.slots[index].endpoint.take() {
                            self.report.add_endpoint(&endpoint);
                        }
                        self.slots[index].actors.clear();
                        let downtime = Duration::from_millis(self.rng.between(200, 2_000));
                        self.slots[index].state = SlotState::Down {
                            restart_at: self.now + downtime,
                        };
                    } else if let Some(endpoint) = self.slots[index].endpoint.as_mut() {
                        if endpoint.poll_timeout().is_some_and(|t| t <= local) {
                            endpoint.handle_timeout(local);
                        }
                    }
                }
                SlotState::Up => {
                    let late = self.timers_late(index, local);
                    if let Some(endpoint) = self.slots[index].endpoint.as_mut().filter(|_| !late) {
                        if endpoint.poll_timeout().is_some_and(|t| t <= local) {
                            endpoint.handle_timeout(local);
                            self.slots[index].timers_ran = Some(local);
                        }
                    }
                    self.run_actors(index);
                }
                SlotState::Down { .. } => {}
            }
        }
    }

    /// Whether node `index`'s due timers wait (`SimConfig::late_timers`, chaos phase only).
    fn timers_late(&mut self, index: usize, local: Instant) -> bool {
        let Some(max) = self.config.late_timers.filter(|_| !self.calm) else {
            if self.slots[index].timers_late_until.take().is_some() {
                for bytes in std::mem::take(&mut self.slots[index].buffer) {
                    self.deliver(index, &bytes);
                }
            }
            return false;
        };
        let due = self.slots[index]
            .endpoint
            .as_ref()
            .and_then(Endpoint::poll_timeout)
            .is_some_and(|t| t <= local);
        if !due {
            return false;
        }
        match self.slots[index].timers_late_until {
            Some(until) if until > self.now => true,
            Some(_) => {
                // The driver catches up: what arrived meanwhile first, then the timers.
                self.slots[index].timers_late_until = None;
                for bytes in std::mem::take(&mut self.slots[index].buffer) {
                    self.deliver(index, &bytes);
                }
                false
            }
            None if self.rng.unit() < self.config.late_timer_share => {
                let max = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(2);
                let delay = Duration::from_nanos(self.rng.between(1, max));
                self.slots[index].timers_late_until = Some(self.now + delay);
                // Like a pause: no crash around it counts as isolated.
                self.fault_times.push(self.now);
                self.fault_times.push(self.now + delay);
                true
            }
            None => false,
        }
    }

    /// Moves every node's datagrams into the network and checks every event.
    fn flush(&mut self) -> Result<(), Violation> {
        for index in 0..self.slots.len() {
            let mut transmits = Vec::new();
            let mut events = Vec::new();
            if let Some(endpoint) = self.slots[index].endpoint.as_mut() {
                // The driving contract: the promised term reaches the disk before anything
                // sent after it.
                if let Some(term) = endpoint.poll_durable_term() {
                    let slot = &mut self.slots[index];
                    slot.disk_term = slot.disk_term.max(term);
                }
            }
            if let Some(endpoint) = self.slots[index].endpoint.as_mut() {
                transmits.extend(std::iter::from_fn(|| endpoint.poll_transmit()));
                events.extend(std::iter::from_fn(|| endpoint.poll_event()));
            }
            for transmit in transmits {
                match transmit.destination {
                    Destination::Member(addr) => {
                        if let Some(to) = self.slots.iter().position(|s| s.addr == addr) {
                            self.network
                                .send(&mut self.rng, self.now, index, to, transmit.bytes);
                        }
                    }
                    Destination::Discovery => {
                        for to in (0..self.slots.len()).filter(|to| *to != index) {
                            self.network.send(
                                &mut self.rng,
                                self.now,
                                index,
                                to,
                                transmit.bytes.clone(),
                            );
                        }
                    }
                }
            }
            for event in events {
                self.check_event(index, event)?;
            }
        }
        Ok(())
    }

    fn run_actors(&mut self, index: usize) {
        let Some(workload) = self.config.workload.clone() else {
            return;
        };
        let local = self.local_now(index);
        for a in 0..self.slots[index].actors.len() {
            let owner = self.slots[index].next_owner;
            let issue = !self.calm;
            let action = self.slots[index].actors[a].tick(
                &mut self.rng,
                self.now,
                &workload,
                owner,
                issue,
                &mut self.report.workload,
            );
            let slot = &mut self.slots[index];
            let Some(endpoint) = slot.endpoint.as_mut() else {
                return;
            };
            match action {
                Some(Action::Lock(request, quiet)) => {
                    slot.next_owner += 1;
                    let service = workload.service_of(a);
                    let id = match (&service, quiet) {
                        (_, true) => endpoint.lock_quiet(local, service.as_ref(), request).ok(),
                        (None, false) => Some(endpoint.lock(local, request)),
                        (Some(service), false) => endpoint.lock_in(local, service, request).ok(),
                    };
                    if let Some(id) = id {
                        slot.actors[a].waiting(&mut self.rng, self.now, &workload, id);
                    }
                }
                Some(Action::Cancel(request)) => endpoint.cancel(local, request),
                Some(Action::BecomeGrantor) => match workload.service_of(a) {
                    None => {
                        let _ = endpoint.become_grantor(local);
                    }
                    Some(service) => {
                        let _ = endpoint.become_grantor_in(local, &service);
                    }
                },
                Some(Action::Extend(request, lease)) => {
                    let _ = endpoint.extend_lease(local, request, lease);
                }
                Some(Action::Unlock(request)) => {
                    // A lock lost meanwhile is no longer held: that is not an error here.
                    let _ = endpoint.unlock(local, request);
                }
                Some(Action::Drop(request)) => {
                    let _ = endpoint.unlock_lazy(local, request);
                }
                None => {}
            }
        }
    }

    fn check_event(&mut self, index: usize, event: EndpointEvent) -> Result<(), Violation> {
        if self.trace {
            println!("{:?} node {index}: {event:?}", self.now);
        }
        let view = match event {
            EndpointEvent::ViewInstalled { view, .. } => view,
            EndpointEvent::Lock(notice) | EndpointEvent::ServiceLock { notice, .. } => {
                return self.on_notice(index, notice)
            }
            EndpointEvent::Left | EndpointEvent::JoinProblem(_) => return Ok(()),
        };
        self.report.views_installed += 1;
        self.report.trace_hash = fnv(self.report.trace_hash, &view.epoch().to_le_bytes());
        let local_now = self.local_now(index);
        let policy = self.config.endpoint.locks.policy;
        let slot = &mut self.slots[index];
        let previous = slot.last_epoch;
        slot.last_epoch = view.epoch();
        slot.last_view_len = view.len();
        if policy.allows(view.len()) {
            slot.minority_since = None;
        } else if policy.is_majority() {
            slot.minority_since.get_or_insert(local_now);
        }
        if view.epoch() <= previous {
            return Err(self.violation(
                "view epochs strictly increase at each member",
                format!("node {index} installed {view} after epoch {previous}"),
            ));
        }
        let local = self.slots[index]
            .endpoint
            .as_ref()
            .map(|e| e.local().clone());
        if local.is_some_and(|l| !view.contains(&l)) {
            return Err(self.violation(
                "a member only installs views that contain it",
                format!("node {index} installed {view}"),
            ));
        }
        Ok(())
    }

    fn check_exclusions(&mut self) -> Result<(), Violation> {
        let now = self.now;
        let quiet_before = self.config.endpoint.gms.announce_interval * 3
            + self.config.endpoint.gms.suspect_timeout;
        let due: Vec<Crash> = {
            let (due, pending) = std::mem::take(&mut self.crashes)
                .into_iter()
                .partition(|c| c.deadline <= now);
            self.crashes = pending;
            due
        };
        for crash in due {
            let isolated = self
                .fault_times
                .iter()
                .all(|t| *t == crash.at || *t + quiet_before < crash.at || *t > crash.deadline);
            if !isolated {
                continue;
            }
            self.report.exclusions_checked += 1;
            for (index, slot) in self.slots.iter().enumerate() {
                let Some(endpoint) = &slot.endpoint else {
                    continue;
                };
                if endpoint.view().is_some_and(|v| v.contains(&crash.member)) {
                    return Err(self.violation(
                        "a crashed member is excluded within the suspect timeout plus a bound",
                        format!(
                            "node {index} still has {} (crashed at {:?}) in {}",
                            crash.member,
                            crash.at,
                            endpoint.view().map(ToString::to_string).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn converged(&self) -> bool {
        self.views_converged() && (self.config.workload.is_none() || self.locks_settled())
    }

    /// Whether every node is up and all share one view holding exactly them.
    fn views_converged(&self) -> bool {
        let mut live = Vec::new();
        for slot in &self.slots {
            match (&slot.state, &slot.endpoint) {
                (SlotState::Up, Some(endpoint)) if endpoint.state() == MembershipState::Member => {
                    live.push(endpoint);
                }
                _ => return false,
            }
        }
        let Some(first) = live.first().and_then(|e| e.view()) else {
            return false;
        };
        live.len() == first.len()
            && live
                .iter()
                .all(|e| e.view() == Some(first) && first.contains(e.local()))
    }

    fn no_convergence(&self) -> Violation {
        let views: Vec<String> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| match &s.endpoint {
                Some(e) => format!(
                    "node {i} {:?} {} (pending {:?}, releases {}, holds {}, table {:?}, reconciling {})",
                    e.state(),
                    e.view().map(ToString::to_string).unwrap_or_default(),
                    e.locks().pending_requests(),
                    e.locks().pending_releases(),
                    e.holds(s.clock.local(self.now)).len(),
                    e.locks().grantor_holds(),
                    e.locks().is_reconciling(),
                ),
                None => format!("node {i} down"),
            })
            .collect();
        self.violation(
            "once faults stop, all live members install one identical view and every lock request is answered within the calm bound",
            views.join("; "),
        )
    }

    fn finish(mut self) -> Report {
        for slot in &self.slots {
            if let Some(endpoint) = &slot.endpoint {
                self.report.add_endpoint(endpoint);
            }
        }
        self.report.virtual_time = self.now - Instant::ZERO;
        self.report.network = self.network.stats;
        self.report.faults.record_hold_backs(&self.network);
        self.report
    }

    fn violation(&self, invariant: &'static str, detail: String) -> Violation {
        Violation {
            seed: self.seed,
            step: self.report.steps,
            at: self.now,
            invariant,
            detail,
            replay: replay_command(self.seed, &self.config),
        }
    }
}

fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    if hash == 0 {
        hash = 0xcbf2_9ce4_8422_2325;
    }
    for b in bytes {
        hash = (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
