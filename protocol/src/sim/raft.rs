//! A deterministic, hostile simulation of the Raft engine (features `sim` and `raft`).
//!
//! [`run`] simulates a cluster of 3 or 5 [`RaftNode`]s from a seed. Each incarnation reads
//! its own clock (rates within ±ρ of true time); a network loses, duplicates, delays and
//! reorders packets (every packet goes through the wire codec), partitions the cluster
//! (symmetric or one way) and cuts single links; members pause (no input at all, then they
//! resume with their clock jumped), crash and restart, alone or all at once, and leave.
//!
//! Persistence is a model disk per member (`disk`): a batch from `poll_persist` reaches it
//! after a write latency, and only then is the engine told `persisted(seq)`; a crash before
//! that loses the batch. A restart builds a new incarnation of the same name (the disk's
//! generation in the low 64 bits of its id) from what the disk kept: the newest snapshot
//! (made locally, `RaftEvent::Compact`, or received in a batch), the entries after it and
//! the last hard state.
//!
//! Lock users on every member lock (exclusive or shared, waiting or trying, some with a
//! lease, some with a timeout the harness enforces with `cancel`), hold, extend their lease,
//! unlock, and read the table. A chaos phase injects faults; then the network heals, every
//! member is restarted and resumed, and liveness must follow within
//! [`RaftSimConfig::calm`]. Checkers run after every step (one per invariant, see
//! `check`):
//!
//! 1. mutual exclusion of *believed* holds, by true time: a lock user believes it holds a
//!    lock from its `Granted` until it unlocks or cancels, hears `Lost`, leaves or crashes. A
//!    paused process is taken to act on nothing while it is stopped; when it resumes, its
//!    driver runs before its users do, as the front end's driver does;
//! 2. fencing tokens: a grant's token exceeds every token of its lock reported before the
//!    request was made, across the whole run and full restarts (adopted holds keep theirs);
//!    a token names one grant; no request is granted twice;
//! 3. one applied sequence: every member commits the same entry at each index (from the
//!    model disks), and tables at an equal applied index are equal (`Table::to_bytes`);
//! 4. no hold granted to, and no wait of, an incarnation after its `Leave` or a newer
//!    incarnation's `Join`; table reads are linearizable; and liveness: once calm, every wait
//!    and read is answered, a new exclusive lock on every lock name is granted, and every
//!    member reaches one table with no lock in it;
//! 5. no panic (each step runs under `catch_unwind`).
//!
//! A run is a function of the seed and the configuration: the same seed gives the same
//! [`RaftReport`] (with its trace hash), on any thread (raft-rs's own thread-local RNG does
//! not reach the outcome). A [`Violation`] names the seed and the command that replays it.
//!
//! ```
//! use std::time::Duration;
//! use conclave_protocol::sim::raft::{self, RaftSimConfig};
//!
//! let config = RaftSimConfig {
//!     nodes: Some(3),
//!     chaos: Duration::from_secs(3),
//!     ..RaftSimConfig::default()
//! };
//! let report = raft::run(7, &config).expect("no invariant is violated");
//! assert!(report.workload.granted > 0);
//! assert_eq!(raft::run(7, &config), Ok(report));
//! ```

mod check;
mod config;
mod disk;
mod drive;
mod faults;
mod report;
mod workload;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::{LockMode, LockName, MemberId};

use crate::raft::command::LockKey;
use crate::raft::persist::PersistBatch;
use crate::raft::wire::{decode_packet, raft_cluster_id};
use crate::raft::{EngineTiming, RaftNode, RaftSettings};
use crate::time::Instant;

use super::clock::NodeClock;
use super::network::{Conditions, Network};
use super::rng::SimRng;
use super::Violation;
use check::{Belief, Broken, Checks};
use disk::ModelDisk;
use workload::Actor;

pub use config::{RaftSimConfig, SlowClock};
pub use report::{RaftCheckStats, RaftEngineStats, RaftFaultStats, RaftReport, RaftWorkloadStats};
pub use workload::RaftWorkload;

/// How long after its last timer call a node whose next deadline is not in the future runs
/// again (a driver would spin on it).
const SPIN: Duration = Duration::from_millis(1);

/// How long a leaving member waits for its `Leave` to be applied (the front end's bound).
const LEAVE_PATIENCE: Duration = Duration::from_secs(3);

/// The most packets a node takes in one step before its answers are flushed.
const DELIVERY_BATCH: usize = 8;

/// Runs one seed. `Ok` carries what was exercised; `Err` the first invariant broken.
///
/// # Errors
/// The first [`Violation`]; a panic inside the engine is reported as one too.
pub fn run(seed: u64, config: &RaftSimConfig) -> Result<RaftReport, Violation> {
    let mut sim = match catch_unwind(AssertUnwindSafe(|| Sim::new(seed, config.clone()))) {
        Ok(sim) => sim,
        Err(panic) => return Err(panic_violation(seed, config, 0, Instant::ZERO, &*panic)),
    };
    loop {
        let (step, at) = (sim.report.steps, sim.now);
        match catch_unwind(AssertUnwindSafe(|| sim.step())) {
            Ok(Ok(true)) => return Ok(sim.finish()),
            Ok(Ok(false)) => {}
            Ok(Err(violation)) => return Err(violation),
            Err(panic) => return Err(panic_violation(seed, config, step, at, &*panic)),
        }
    }
}

fn panic_violation(
    seed: u64,
    config: &RaftSimConfig,
    step: u64,
    at: Instant,
    panic: &(dyn std::any::Any + Send),
) -> Violation {
    let detail = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "non-string panic".to_owned());
    Violation {
        seed,
        step,
        at,
        invariant: "the engine never panics",
        detail,
        replay: config.replay_command(seed),
    }
}

/// Whether a node slot runs.
#[derive(Debug)]
enum SlotState {
    /// Not running; restarts as a new incarnation at the instant.
    Down { restart_at: Instant },
    /// Running.
    Up,
    /// Leaving gracefully since the instant; stopped once its `Leave` applied.
    Leaving { since: Instant },
}

/// A lock request of the current incarnation.
#[derive(Debug)]
struct Asked {
    /// The actor that made it (`None`: a probe of the calm phase).
    actor: Option<usize>,
    key: LockKey,
    mode: LockMode,
    leased: bool,
    /// True time of the `lock` call.
    at: Instant,
}

/// One member: its current incarnation and what survives it.
struct Slot {
    name: String,
    addr: SocketAddr,
    state: SlotState,
    node: Option<RaftNode>,
    disk: ModelDisk,
    /// Batches polled, not on the disk yet: (true time the write completes, batch).
    fsync: VecDeque<(Instant, PersistBatch)>,
    clock: NodeClock,
    /// Paused until then (true time).
    paused_until: Option<Instant>,
    /// Packets that arrived while paused.
    buffer: Vec<Vec<u8>>,
    /// The node's timers wait until then (its last timer call left its deadline behind).
    spin_floor: Option<Instant>,
    actors: Vec<Actor>,
    next_request: u64,
    next_query: u64,
    requests: BTreeMap<u64, Asked>,
    beliefs: BTreeMap<u64, Belief>,
    /// The applied index the table checker last saw.
    applied_seen: u64,
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("name", &self.name)
            .field("state", &self.state)
            .field("node", &self.node)
            .field("paused_until", &self.paused_until)
            .field("actors", &self.actors)
            .field("beliefs", &self.beliefs)
            .finish_non_exhaustive()
    }
}

/// One probe of the calm phase: an exclusive lock on one name, asked again until granted (a
/// member that has not proved its session since it resigned refuses requests at once).
#[derive(Debug)]
struct Probe {
    slot: usize,
    /// The lock name's number.
    key: usize,
    /// The request asking now (`None`: to ask).
    request: Option<u64>,
    granted: bool,
}

/// The calm phase's final probes: one per lock name.
#[derive(Debug, Default)]
struct Probes {
    started: bool,
    probes: Vec<Probe>,
}

#[derive(Debug)]
struct Sim {
    seed: u64,
    config: RaftSimConfig,
    settings: RaftSettings,
    rng: SimRng,
    now: Instant,
    slots: Vec<Slot>,
    network: Network,
    cluster: ClusterId,
    keys: Vec<LockKey>,
    next_fault: Instant,
    chaos_end: Instant,
    calm: bool,
    probes: Probes,
    checks: Checks,
    /// A table changed or a member became gone since the last scan.
    rescan: bool,
    trace: bool,
    /// Print every packet delivered too (`CONCLAVE_SIM_TRACE=packets`).
    trace_packets: bool,
    report: RaftReport,
}

impl Sim {
    fn new(seed: u64, config: RaftSimConfig) -> Sim {
        let mut rng = SimRng::new(seed);
        let n = config.nodes_of(seed);
        let snapshot_every = config.snapshot_every.unwrap_or_else(|| {
            if rng.chance(0.5) {
                rng.between(20, 80)
            } else {
                10_000
            }
        });
        let settings = RaftSettings {
            peers: (0..n).map(|i| format!("n{i}")).collect(),
            timing: EngineTiming::default(),
            session_timeout: config.session_timeout,
            recovered_hold_grace: config.recovered_hold_grace,
            snapshot_every,
        };
        let slots = (0..n)
            .map(|i| Slot {
                name: format!("n{i}"),
                addr: SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16)),
                state: SlotState::Down {
                    restart_at: Instant::from_nanos(rng.below(300_000_000)),
                },
                node: None,
                disk: ModelDisk::default(),
                fsync: VecDeque::new(),
                clock: NodeClock::exact(Instant::ZERO),
                paused_until: None,
                buffer: Vec::new(),
                spin_floor: None,
                actors: Vec::new(),
                next_request: 1,
                next_query: 1,
                requests: BTreeMap::new(),
                beliefs: BTreeMap::new(),
                applied_seen: 0,
            })
            .collect();
        let conditions = Conditions {
            loss: 0.0,
            duplicate: 0.0,
            min_delay: config.min_delay,
            max_delay: config.max_delay,
            reorder: config.reorder,
            max_reorder_delay: config.max_reorder_delay,
        };
        let keys = (0..config.workload.locks.max(1))
            .map(|k| {
                let name = LockName::new(format!("lock-{k}"))
                    .unwrap_or_else(|e| unreachable!("simulator lock names are valid: {e}"));
                (None, name)
            })
            .collect();
        let mut sim = Sim {
            seed,
            settings,
            rng,
            now: Instant::ZERO,
            slots,
            network: Network::new(n, conditions),
            cluster: raft_cluster_id("sim"),
            keys,
            next_fault: Instant::ZERO,
            chaos_end: Instant::ZERO + config.chaos,
            calm: false,
            probes: Probes::default(),
            checks: Checks::default(),
            rescan: false,
            trace: std::env::var_os("CONCLAVE_SIM_TRACE").is_some(),
            trace_packets: std::env::var("CONCLAVE_SIM_TRACE").is_ok_and(|v| v == "packets"),
            report: RaftReport {
                seed,
                runs: 1,
                nodes: n,
                snapshot_every,
                ..RaftReport::default()
            },
            config,
        };
        sim.next_fault = sim.draw_fault_time();
        sim
    }

    /// One step: the next thing due, then the outputs it caused and every checker. `true`
    /// once liveness was shown.
    fn step(&mut self) -> Result<bool, Violation> {
        if self.report.steps >= self.config.max_steps {
            return Err(self.violation(
                "runs end within the step bound",
                "step limit reached".into(),
            ));
        }
        self.report.steps += 1;
        let calm_end = self.chaos_end + self.config.calm;
        self.now = self.now.max(self.next_instant(calm_end));
        if !self.calm && self.now >= self.chaos_end {
            self.begin_calm();
        } else if self.calm && self.now >= calm_end {
            return Err(self.no_liveness());
        } else if !self.calm && self.now >= self.next_fault {
            self.inject_fault();
            self.next_fault = self.draw_fault_time();
        } else if let Some(i) = self.due_wake() {
            self.wake(i);
        } else if let Some(i) = self.due_fsync() {
            self.complete_fsync(i)?;
        } else if let Some(packet) = self.network.pop_due(self.now) {
            let to = packet.to;
            self.deliver(to, &packet.bytes)?;
            for _ in 1..DELIVERY_BATCH {
                match self.network.pop_due_to(self.now, to) {
                    Some(next) => self.deliver(to, &next.bytes)?,
                    None => break,
                }
            }
        } else {
            self.run_timers()?;
        }
        self.flush()?;
        self.check_step()?;
        if self.calm {
            self.settle()
        } else {
            Ok(false)
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
            if let Some(until) = slot.paused_until {
                next = next.min(until);
                continue;
            }
            match slot.state {
                SlotState::Down { restart_at } => next = next.min(restart_at),
                SlotState::Leaving { since } => next = next.min(since + LEAVE_PATIENCE),
                SlotState::Up => {
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
            if let Some((due, _)) = slot.fsync.front() {
                next = next.min(*due);
            }
            if let Some(t) = Self::timer_due(slot) {
                next = next.min(t);
            }
        }
        next
    }

    /// When slot `slot`'s node wants its timers run (true time).
    fn timer_due(slot: &Slot) -> Option<Instant> {
        let t = slot.node.as_ref()?.poll_timeout()?;
        let due = slot.clock.global(t);
        Some(slot.spin_floor.map_or(due, |floor| due.max(floor)))
    }

    /// Node `index`'s clock now.
    fn local(&self, index: usize) -> Instant {
        self.slots[index].clock.local(self.now)
    }

    fn trace(&self, what: fmt::Arguments<'_>) {
        if self.trace {
            println!("{:?} {what}", self.now);
        }
    }

    fn due_wake(&self) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.paused_until.is_some_and(|t| t <= self.now))
    }

    fn due_fsync(&self) -> Option<usize> {
        self.slots.iter().position(|s| {
            s.paused_until.is_none() && s.fsync.front().is_some_and(|(due, _)| *due <= self.now)
        })
    }

    /// The write of slot `index`'s oldest batch completed: the disk keeps it, the log checker
    /// reads what it says committed, and the engine hears it is durable.
    fn complete_fsync(&mut self, index: usize) -> Result<(), Violation> {
        let Some((_, batch)) = self.slots[index].fsync.pop_front() else {
            return Ok(());
        };
        self.trace(format_args!("node {index}: batch {} written", batch.seq));
        if let Err(e) = self.slots[index].disk.write(&batch) {
            return Err(self.violation(
                "every persistence batch is one the store accepts",
                format!("node {index}: {e}"),
            ));
        }
        self.harvest(index)?;
        let local = self.local(index);
        if let Some(node) = self.slots[index].node.as_mut() {
            node.persisted(local, batch.seq);
        }
        Ok(())
    }

    /// Hands the entries slot `index`'s disk knows committed to the log checker.
    fn harvest(&mut self, index: usize) -> Result<(), Violation> {
        let disk = &self.slots[index].disk;
        let from = disk.harvested;
        if self.trace {
            for e in disk.committed_after(from) {
                if e.index > self.checks.committed() {
                    let command = crate::raft::command::decode(&e.data);
                    println!(
                        "{:?} committed {} (term {}): {command:?}",
                        self.now, e.index, e.term
                    );
                }
            }
        }
        match self.checks.on_committed(index, disk.committed_after(from)) {
            Ok(last) => {
                if last > from {
                    self.slots[index].disk.harvested = last;
                    self.rescan = true;
                }
                self.report.engine.committed = self.checks.committed();
                Ok(())
            }
            Err(broken) => Err(self.broken(broken)),
        }
    }

    fn deliver(&mut self, to: usize, bytes: &[u8]) -> Result<(), Violation> {
        let slot = &mut self.slots[to];
        if slot.node.is_none() {
            self.network.stats.to_dead += 1;
            return Ok(());
        }
        if slot.paused_until.is_some() {
            slot.buffer.push(bytes.to_vec());
            return Ok(());
        }
        let packet = match decode_packet(self.cluster, bytes) {
            Ok(packet) => packet,
            Err(e) => {
                return Err(self.violation(
                    "every packet survives the wire",
                    format!("to node {to}: {e}"),
                ))
            }
        };
        self.network.stats.delivered += 1;
        self.report.trace_hash = fnv(self.report.trace_hash, bytes);
        if self.trace_packets {
            let crate::raft::wire::RaftBody::Raft(m) = &packet.body;
            println!(
                "{:?} node {to} <- {}: type {} term {} index {} log_term {} commit {} entries {:?} reject {} hint {} snapshot {:?}",
                self.now,
                m.from,
                m.msg_type,
                m.term,
                m.index,
                m.log_term,
                m.commit,
                m.entries.first().zip(m.entries.last()).map(|(a, b)| (a.index, b.index)),
                m.reject,
                m.reject_hint,
                m.snapshot.as_ref().map(|s| s.index)
            );
        }
        let local = self.local(to);
        if let Some(node) = self.slots[to].node.as_mut() {
            node.handle_packet(local, packet);
        }
        Ok(())
    }

    /// Runs node `index`'s timers if due (a node whose next deadline stays behind its clock
    /// runs again [`SPIN`] later).
    fn run_node_timers(&mut self, index: usize) {
        let local = self.local(index);
        let slot = &mut self.slots[index];
        if slot.spin_floor.is_some_and(|t| t > self.now) {
            return;
        }
        let Some(node) = slot.node.as_mut() else {
            return;
        };
        if node.poll_timeout().is_none_or(|t| t > local) {
            return;
        }
        node.handle_timeout(local);
        if node.poll_timeout().is_some_and(|t| t <= local) {
            slot.spin_floor = Some(self.now + SPIN);
            self.report.engine.busy_timers += 1;
        } else {
            slot.spin_floor = None;
        }
    }

    fn run_timers(&mut self) -> Result<(), Violation> {
        for index in 0..self.slots.len() {
            if self.slots[index].paused_until.is_some() {
                continue;
            }
            match self.slots[index].state {
                SlotState::Down { restart_at } if restart_at <= self.now => self.start(index)?,
                SlotState::Down { .. } => {}
                SlotState::Leaving { since } if self.now >= since + LEAVE_PATIENCE => {
                    self.stop(index);
                }
                SlotState::Leaving { .. } => self.run_node_timers(index),
                SlotState::Up => {
                    self.run_node_timers(index);
                    self.run_actors(index);
                }
            }
        }
        Ok(())
    }

    /// Starts a new incarnation at slot `index` from what its disk kept.
    fn start(&mut self, index: usize) -> Result<(), Violation> {
        let clock = self.new_clock(index);
        let seed = self.rng.next_u64();
        let slot = &mut self.slots[index];
        slot.disk.generation += 1;
        let incarnation =
            (self.rng.next_u128() & !u128::from(u64::MAX)) | u128::from(slot.disk.generation);
        let member = match MemberId::new(incarnation, &slot.name, slot.addr) {
            Ok(member) => member,
            Err(e) => unreachable!("simulator member names are valid: {e}"),
        };
        let recovered = slot.disk.recovered();
        if recovered.snapshot.is_some() {
            self.report.faults.restarts_from_snapshot += 1;
        }
        let node = match RaftNode::new(member, self.settings.clone(), &recovered, seed) {
            Ok(node) => node,
            Err(e) => {
                return Err(self.violation(
                    "a member restarts from what its disk kept",
                    format!("node {index}: {e}"),
                ))
            }
        };
        self.report.faults.starts += 1;
        self.trace(format_args!(
            "node {index} starts as {} (disk {:?})",
            node.member(),
            self.slots[index].disk.shape()
        ));
        let slot = &mut self.slots[index];
        slot.clock = clock;
        slot.node = Some(node);
        slot.state = SlotState::Up;
        slot.next_request = 1;
        slot.next_query = 1;
        slot.applied_seen = u64::MAX;
        slot.spin_floor = None;
        let w = self.config.workload.clone();
        let actors = (0..w.actors_per_node)
            .map(|_| Actor::new(&mut self.rng, self.now, &w))
            .collect();
        self.slots[index].actors = actors;
        let local = self.local(index);
        if let Some(node) = self.slots[index].node.as_mut() {
            node.handle_timeout(local);
        }
        Ok(())
    }

    /// Crashes slot `index`'s incarnation: everything not on its disk is lost.
    fn crash(&mut self, index: usize, downtime: Duration) {
        if self.slots[index].node.is_none() {
            return;
        }
        let lost = self.slots[index].fsync.len();
        self.report.faults.crashes += 1;
        self.report.faults.batches_lost += lost as u64;
        self.trace(format_args!(
            "node {index} crashes ({lost} batches not on its disk)"
        ));
        self.clear(index);
        self.slots[index].state = SlotState::Down {
            restart_at: self.now + downtime,
        };
    }

    /// A leaving member stops (its last writes complete: a graceful exit).
    fn stop(&mut self, index: usize) {
        let batches: Vec<PersistBatch> =
            self.slots[index].fsync.drain(..).map(|(_, b)| b).collect();
        for batch in batches {
            // The store accepted every earlier batch; a refusal would have been reported.
            let _ = self.slots[index].disk.write(&batch);
        }
        self.trace(format_args!("node {index} stops"));
        self.clear(index);
        let downtime = Duration::from_millis(self.rng.between(200, 2_000));
        self.slots[index].state = SlotState::Down {
            restart_at: self.now + downtime,
        };
    }

    fn clear(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.node = None;
        slot.fsync.clear();
        slot.buffer.clear();
        slot.paused_until = None;
        slot.spin_floor = None;
        slot.actors.clear();
        slot.requests.clear();
        slot.beliefs.clear();
        self.checks.forget_reads(index);
    }

    /// Slot `index` leaves: its users stop believing at once; it stops once its `Leave` applied.
    fn leave(&mut self, index: usize) {
        let local = self.local(index);
        let slot = &mut self.slots[index];
        if let Some(node) = slot.node.as_mut() {
            node.leave(local);
            slot.actors.clear();
            slot.beliefs.clear();
            slot.state = SlotState::Leaving { since: self.now };
            self.report.faults.leaves += 1;
            self.trace(format_args!("node {index} leaves"));
        }
    }

    /// Ends a pause: the node takes what arrived meanwhile and runs its timers, in either
    /// order (a pause may fall anywhere in the driver's loop), with its clock jumped.
    fn wake(&mut self, index: usize) {
        self.slots[index].paused_until = None;
        let timers_first = self.rng.chance(0.5);
        if timers_first {
            self.run_node_timers(index);
        }
        for bytes in std::mem::take(&mut self.slots[index].buffer) {
            // A packet that does not decode is reported when delivered normally; here the
            // node just skips it.
            let _ = self.deliver(index, &bytes);
        }
        if !timers_first {
            self.run_node_timers(index);
        }
        self.trace(format_args!("node {index} resumes"));
    }

    fn begin_calm(&mut self) {
        self.calm = true;
        self.trace(format_args!("calm"));
        self.network.heal();
        self.network.restore_all();
        let c = &mut self.network.conditions;
        c.loss = 0.0;
        c.duplicate = 0.0;
        c.reorder = 0.0;
        for slot in &mut self.slots {
            if let Some(until) = &mut slot.paused_until {
                *until = (*until).min(self.now);
            }
            if let SlotState::Down { restart_at } = &mut slot.state {
                *restart_at = (*restart_at).min(self.now);
            }
        }
    }

    fn violation(&self, invariant: &'static str, detail: String) -> Violation {
        Violation {
            seed: self.seed,
            step: self.report.steps,
            at: self.now,
            invariant,
            detail,
            replay: self.config.replay_command(self.seed),
        }
    }

    fn broken(&self, (invariant, detail): Broken) -> Violation {
        self.violation(invariant, detail)
    }

    fn finish(mut self) -> RaftReport {
        self.report.virtual_time = self.now - Instant::ZERO;
        self.report.converged_after = self.now - self.chaos_end;
        self.report.network = self.network.stats;
        self.report.checks = self.checks.stats;
        self.report
    }
}

/// FNV-1a, continued from `hash` (0 starts it).
fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    if hash == 0 {
        hash = 0xcbf2_9ce4_8422_2325;
    }
    for b in bytes {
        hash = (hash ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
