//! What a cluster costs as it grows: a fault-free, deterministic measurement of startup, idle
//! traffic, a coordinator crash and one lock grant, at any number of members.
//!
//! [`measure`] runs `members` endpoints over a lossless network with a fixed one-way delay,
//! starting one member every [`ScaleConfig::start_spacing`]. It counts datagrams and bytes, not
//! wall-clock time, so its figures can be asserted in tests (heartbeats per member do not grow
//! with the cluster; startup installs a handful of views).
//!
//! ```
//! use conclave_protocol::sim::scale::{self, ScaleConfig};
//!
//! let figures = scale::measure(&ScaleConfig::new(4)).expect("four members agree");
//! assert_eq!(figures.members, 4);
//! assert!(figures.startup_views_distinct <= 3);
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use conclave_lock_api::wire::{self, ClusterId, Frame};
use conclave_lock_api::{LockName, MemberId};

use crate::endpoint::{Destination, Endpoint, EndpointConfig, EndpointEvent};
use crate::locking::{LockNotice, LockRequest};
use crate::time::Instant;

use super::SimRng;

/// The shape of a measurement.
#[derive(Clone, Debug)]
pub struct ScaleConfig {
    /// Cluster size.
    pub members: usize,
    /// Time between two members' starts. Default 2 ms.
    pub start_spacing: Duration,
    /// One-way delay of every datagram. Default 1 ms.
    pub delay: Duration,
    /// Protocol configuration. Default [`EndpointConfig::local`].
    pub endpoint: EndpointConfig,
    /// How long idle traffic is counted. Default 2 s.
    pub idle: Duration,
    /// Seed of the members' incarnation ids. Default 1.
    pub seed: u64,
}

impl ScaleConfig {
    /// `members` members with the defaults above.
    pub fn new(members: usize) -> Self {
        Self {
            members,
            start_spacing: Duration::from_millis(2),
            delay: Duration::from_millis(1),
            endpoint: EndpointConfig::local(),
            idle: Duration::from_secs(2),
            seed: 1,
        }
    }
}

/// What a measurement counted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScaleFigures {
    /// Cluster size.
    pub members: usize,
    /// Views installed during startup, summed over members.
    pub startup_installs: u64,
    /// Distinct views (epochs) installed during startup.
    pub startup_views_distinct: u64,
    /// Bytes of every datagram sent until all members agreed on one view.
    pub startup_bytes: u64,
    /// Time from the last member's start to agreement on one view of every member.
    pub agreed_after_last_start: Duration,
    /// Heartbeat datagrams per second, whole cluster, while idle.
    pub heartbeats_per_sec: f64,
    /// The most heartbeat datagrams any one member sent per second while idle.
    pub max_member_heartbeats_per_sec: f64,
    /// The most heartbeat datagrams any one member other than the coordinator sent per second.
    pub max_other_heartbeats_per_sec: f64,
    /// Every datagram per second, whole cluster, while idle.
    pub idle_datagrams_per_sec: f64,
    /// Bytes per second, whole cluster, while idle.
    pub idle_bytes_per_sec: f64,
    /// Datagrams other than heartbeats from one uncontended lock by a member other than the
    /// coordinator until it is granted, released, and every reliable stream is acknowledged.
    pub lock_grant_datagrams: u64,
    /// Datagrams other than heartbeats from the coordinator's crash until every survivor
    /// installed one view without it.
    pub crash_datagrams: u64,
    /// Bytes of the datagrams other than heartbeats from the coordinator's crash until every
    /// survivor installed one view without it: the cost of one view change (a takeover).
    pub crash_bytes: u64,
    /// Time from the coordinator's crash until every survivor agreed on a view without it.
    pub crash_agreed_after: Duration,
    /// Datagrams other than heartbeats from a graceful leave of a member other than the
    /// coordinator (after the crash) until every remaining member installed one view without it.
    pub leave_datagrams: u64,
    /// Bytes of those datagrams: the cost of one view change installed by a coordinator.
    pub leave_bytes: u64,
}

/// Runs the measurement.
///
/// # Errors
/// A description of the phase that did not finish within its bound (30 s virtual each).
pub fn measure(config: &ScaleConfig) -> Result<ScaleFigures, String> {
    let mut run = Run::new(config);
    run.measure()
}

struct Run {
    config: ScaleConfig,
    now: Instant,
    nodes: Vec<Option<Endpoint>>,
    addrs: BTreeMap<SocketAddr, usize>,
    ids: Vec<MemberId>,
    queue: BTreeMap<(Instant, u64), (usize, Vec<u8>)>,
    seq: u64,
    cluster: ClusterId,
    /// Counters of the current phase.
    datagrams: u64,
    bytes: u64,
    heartbeats: u64,
    heartbeat_bytes: u64,
    heartbeats_by: Vec<u64>,
    installs: u64,
    epochs: BTreeSet<u64>,
    granted: bool,
}

const BOUND: Duration = Duration::from_secs(30);

impl Run {
    fn new(config: &ScaleConfig) -> Self {
        let mut rng = SimRng::new(config.seed);
        let mut addrs = BTreeMap::new();
        let mut ids = Vec::new();
        for i in 0..config.members {
            let addr = SocketAddr::from(([127, 0, 0, 1], 10_000 + i as u16));
            addrs.insert(addr, i);
            let id = MemberId::new(rng.next_u128(), &format!("n{i}"), addr);
            ids.push(id.unwrap_or_else(|e| unreachable!("valid member names: {e}")));
        }
        Self {
            config: config.clone(),
            now: Instant::ZERO,
            nodes: (0..config.members).map(|_| None).collect(),
            addrs,
            ids,
            queue: BTreeMap::new(),
            seq: 0,
            cluster: ClusterId::from_name("scale"),
            datagrams: 0,
            bytes: 0,
            heartbeats: 0,
            heartbeat_bytes: 0,
            heartbeats_by: vec![0; config.members],
            installs: 0,
            epochs: BTreeSet::new(),
            granted: false,
        }
    }

    fn reset_counters(&mut self) {
        self.datagrams = 0;
        self.bytes = 0;
        self.heartbeats = 0;
        self.heartbeat_bytes = 0;
        self.heartbeats_by = vec![0; self.config.members];
        self.installs = 0;
        self.epochs.clear();
    }

    fn measure(&mut self) -> Result<ScaleFigures, String> {
        let n = self.config.members;
        let mut figures = ScaleFigures {
            members: n,
            ..ScaleFigures::default()
        };
        // Startup.
        let starts: Vec<Instant> = (0..n)
            .map(|i| Instant::ZERO + self.config.start_spacing * i as u32)
            .collect();
        let last_start = starts.last().copied().unwrap_or(Instant::ZERO);
        let mut next_start = 0;
        loop {
            let due = starts.get(next_start).copied();
            if let Some(at) = due.filter(|at| *at <= self.next_instant()) {
                self.now = self.now.max(at);
                let mut endpoint = Endpoint::new(
                    "scale",
                    self.ids[next_start].clone(),
                    self.config.endpoint.clone(),
                    1400,
                );
                endpoint.join(self.now);
                self.nodes[next_start] = Some(endpoint);
                self.flush(next_start);
                next_start += 1;
                continue;
            }
            if next_start == n && self.agreed(&[]) {
                break;
            }
            if self.now > last_start + BOUND {
                return Err(format!("{n} members did not agree on one view"));
            }
            self.step();
        }
        figures.startup_installs = self.installs;
        figures.startup_views_distinct = self.epochs.len() as u64;
        figures.startup_bytes = self.bytes;
        figures.agreed_after_last_start = self.now - last_start;
        // Idle: let the startup's reliable traffic and lock reconciliation settle, then count.
        self.run_for(Duration::from_secs(2));
        self.reset_counters();
        self.run_for(self.config.idle);
        let secs = self.config.idle.as_secs_f64();
        figures.heartbeats_per_sec = self.heartbeats as f64 / secs;
        let coordinator = self.coordinator();
        let max_by = |skip: Option<usize>| {
            self.heartbeats_by
                .iter()
                .enumerate()
                .filter(|(i, _)| Some(*i) != skip)
                .map(|(_, c)| *c)
                .max()
                .unwrap_or(0) as f64
                / secs
        };
        figures.max_member_heartbeats_per_sec = max_by(None);
        figures.max_other_heartbeats_per_sec = max_by(coordinator);
        figures.idle_datagrams_per_sec = self.datagrams as f64 / secs;
        figures.idle_bytes_per_sec = self.bytes as f64 / secs;
        // One uncontended lock from the last member.
        self.reset_counters();
        let asker = (0..n).rev().find(|i| Some(*i) != coordinator).unwrap_or(0);
        let name = LockName::new("scale").map_err(|e| e.to_string())?;
        let mut request = None;
        if let Some(endpoint) = self.nodes[asker].as_mut() {
            request = Some(endpoint.lock(self.now, LockRequest::exclusive(1, name)));
        }
        self.granted = false;
        self.flush(asker);
        let deadline = self.now + BOUND;
        while !self.granted {
            if self.now > deadline {
                return Err("the lock was not granted".into());
            }
            self.step();
        }
        if let (Some(endpoint), Some(request)) = (self.nodes[asker].as_mut(), request) {
            endpoint
                .unlock(self.now, request)
                .map_err(|e| format!("unlock: {e:?}"))?;
        }
        self.flush(asker);
        let deadline = self.now + BOUND;
        while !self.nodes.iter().flatten().all(Endpoint::is_quiescent) {
            if self.now > deadline {
                return Err("the release was not acknowledged".into());
            }
            self.step();
        }
        figures.lock_grant_datagrams = self.datagrams - self.heartbeats;
        self.run_for(Duration::from_secs(1));
        // Crash the coordinator.
        let Some(coordinator) = self.coordinator() else {
            return Err("no coordinator".into());
        };
        self.nodes[coordinator] = None;
        self.reset_counters();
        let crashed_at = self.now;
        let deadline = self.now + BOUND;
        while !self.agreed(&[coordinator]) {
            if self.now > deadline {
                return Err("the survivors did not agree on a view".into());
            }
            self.step();
        }
        figures.crash_datagrams = self.datagrams - self.heartbeats;
        figures.crash_bytes = self.bytes - self.heartbeat_bytes;
        figures.crash_agreed_after = self.now - crashed_at;
        // Let the takeover's reliable traffic and lock reconciliation settle, then one member
        // other than the (new) coordinator leaves gracefully.
        self.run_for(Duration::from_secs(1));
        let new_coordinator = self.coordinator();
        let Some(leaver) = (0..n)
            .rev()
            .find(|i| *i != coordinator && Some(*i) != new_coordinator)
        else {
            return Ok(figures); // too few members for a leave
        };
        self.reset_counters();
        if let Some(endpoint) = self.nodes[leaver].as_mut() {
            endpoint.leave(self.now);
        }
        self.flush(leaver);
        let deadline = self.now + BOUND;
        while !self.agreed(&[coordinator, leaver]) {
            if self.now > deadline {
                return Err("the remaining members did not agree on a view".into());
            }
            self.step();
        }
        figures.leave_datagrams = self.datagrams - self.heartbeats;
        figures.leave_bytes = self.bytes - self.heartbeat_bytes;
        Ok(figures)
    }

    fn coordinator(&self) -> Option<usize> {
        self.nodes
            .iter()
            .position(|e| e.as_ref().is_some_and(Endpoint::is_coordinator))
    }

    /// Whether every member not in `without` is in one view of exactly those members (the
    /// members in `without` are down or leaving).
    fn agreed(&self, without: &[usize]) -> bool {
        let live = self.config.members - without.len();
        let mut first = None;
        for (i, endpoint) in self.nodes.iter().enumerate() {
            let Some(endpoint) = endpoint.as_ref().filter(|_| !without.contains(&i)) else {
                continue;
            };
            let Some(view) = endpoint.view() else {
                return false;
            };
            if view.len() != live
                || without.iter().any(|w| view.contains(&self.ids[*w]))
                || first.is_some_and(|e| e != view.epoch())
            {
                return false;
            }
            first = Some(view.epoch());
        }
        true
    }

    fn next_instant(&self) -> Instant {
        let mut next = self.now + BOUND * 4;
        if let Some(((at, _), _)) = self.queue.first_key_value() {
            next = next.min(*at);
        }
        for endpoint in self.nodes.iter().flatten() {
            if let Some(t) = endpoint.poll_timeout() {
                next = next.min(t);
            }
        }
        next.max(self.now)
    }

    fn run_for(&mut self, duration: Duration) {
        let end = self.now + duration;
        while self.next_instant() <= end {
            self.step();
        }
        self.now = end;
    }

    fn step(&mut self) {
        self.now = self.next_instant();
        if let Some(entry) = self.queue.first_entry() {
            if entry.key().0 <= self.now {
                let (to, bytes) = entry.remove();
                if let Some(endpoint) = self.nodes[to].as_mut() {
                    endpoint.handle_datagram(self.now, &bytes);
                    self.flush(to);
                }
                return;
            }
        }
        for index in 0..self.nodes.len() {
            let due = self.nodes[index]
                .as_ref()
                .and_then(Endpoint::poll_timeout)
                .is_some_and(|t| t <= self.now);
            if due {
                if let Some(endpoint) = self.nodes[index].as_mut() {
                    endpoint.handle_timeout(self.now);
                }
                self.flush(index);
            }
        }
    }

    fn flush(&mut self, index: usize) {
        let Some(endpoint) = self.nodes[index].as_mut() else {
            return;
        };
        let transmits: Vec<_> = std::iter::from_fn(|| endpoint.poll_transmit()).collect();
        let events: Vec<_> = std::iter::from_fn(|| endpoint.poll_event()).collect();
        for event in events {
            match event {
                EndpointEvent::ViewInstalled { view, .. } => {
                    self.installs += 1;
                    self.epochs.insert(view.epoch());
                }
                EndpointEvent::Lock(LockNotice::Granted { .. }) => self.granted = true,
                _ => {}
            }
        }
        let at = self.now + self.config.delay;
        for transmit in transmits {
            let heartbeat = matches!(
                wire::decode_packet(self.cluster, &transmit.bytes),
                Ok(packet) if matches!(packet.frame, Frame::Heartbeat { .. })
            );
            let targets: Vec<usize> = match transmit.destination {
                Destination::Member(addr) => self.addrs.get(&addr).copied().into_iter().collect(),
                Destination::Discovery => (0..self.nodes.len()).filter(|i| *i != index).collect(),
            };
            // A multicast datagram is sent once.
            self.datagrams += 1;
            self.bytes += transmit.bytes.len() as u64;
            if heartbeat {
                self.heartbeats += 1;
                self.heartbeat_bytes += transmit.bytes.len() as u64;
                self.heartbeats_by[index] += 1;
            }
            for to in targets {
                self.seq += 1;
                self.queue
                    .insert((at, self.seq), (to, transmit.bytes.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_clusters_measure() {
        let figures = measure(&ScaleConfig::new(3)).expect("three members agree");
        assert!(figures.heartbeats_per_sec > 0.0);
        assert!(figures.lock_grant_datagrams > 0);
        assert!(figures.crash_datagrams > 0);
        assert!(figures.crash_bytes > 0);
        assert!(figures.leave_bytes > 0);
    }
}
