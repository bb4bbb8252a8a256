//! [`SimConfig`]: the shape of a simulated run, its presets and environment knobs, and the
//! command that replays a seed under it.

use std::time::Duration;

use crate::endpoint::EndpointConfig;
use crate::gms::Sabotage;
use crate::locking::{LockSabotage, PartitionPolicy};

use super::faults::HarshFaults;
use super::workload::Workload;

/// The shape of a simulated run.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Node slots (each runs one incarnation at a time). Default 5.
    pub nodes: usize,
    /// Virtual duration of the fault phase. Default 20 s.
    pub chaos: Duration,
    /// Bound on the calm phase: all live members must agree on one view within it. Default 20 s.
    pub calm: Duration,
    /// Mean virtual time between two faults. Default 1.5 s.
    pub fault_interval: Duration,
    /// Highest datagram loss rate the chaos phase sets. Default 0.1.
    pub max_loss: f64,
    /// Highest duplication rate the chaos phase sets. Default 0.05.
    pub max_duplicate: f64,
    /// Shortest one-way delay. Default 100 µs.
    pub min_delay: Duration,
    /// Longest one-way delay; the spread reorders datagrams. Default 15 ms.
    pub max_delay: Duration,
    /// Largest datagram the simulated transport carries (larger messages fragment). Default 1400.
    pub max_datagram: usize,
    /// Protocol configuration of every node. Default [`EndpointConfig::local`].
    pub endpoint: EndpointConfig,
    /// Deliberate membership bugs, to prove the checkers fire. Default none.
    pub sabotage: Sabotage,
    /// Simulated lock users; `None` runs membership alone. Default `None`.
    pub workload: Option<Workload>,
    /// Deliberate locking bugs, to prove the lock checkers fire. Default none.
    pub lock_sabotage: LockSabotage,
    /// At most this many nodes are down (crashed or leaving) at once. Default unlimited (one
    /// node always stays up).
    /// `Majority` runs keep a majority up: fencing tokens can only keep increasing if some
    /// member of the last granting view lives on to hand its epoch to the next one.
    pub max_down: usize,
    /// Hard bound on steps, so no run can loop forever. Default 3,000,000.
    pub max_steps: u64,
    /// The harsh profile's extra faults (link cuts, process pauses, long reorderings, clock
    /// drift); `None` is the gentle profile. Default `None`.
    pub harsh: Option<HarshFaults>,
    /// Share of partitions, and of the harsh profile's link cuts, that cut one way only: in a
    /// one-way partition the side picked is heard by the others but hears none of them. Default 0 (the
    /// gentle profile draws nothing for it, so its seeds replay as before); 0.5 in the harsh
    /// profile; `CONCLAVE_SIM_ONE_WAY` sets it.
    pub one_way: f64,
    /// Whether nodes keep their promised term on a disk that survives restarts
    /// ([`crate::Endpoint::poll_durable_term`]); with it, `Majority` fencing tokens never go
    /// back (no amnesia is excused), without it a restart may make them.
    pub durable_terms: bool,
    /// A late driver (the driving contract allows late timers): during the chaos phase, each
    /// time a node's timers are due, with probability `late_timer_share`, its driver runs
    /// nothing for up to this long (timers wait, datagrams wait in its buffer) while its lock
    /// users keep calling in; then it reads the buffer and runs its timers. `None` (the
    /// default): timers run when due.
    pub late_timers: Option<Duration>,
    /// See `late_timers`. Default 0.002.
    pub late_timer_share: f64,
    /// Share of graceful leaves that pick the coordinator of a view of two or more members
    /// (the grantor) rather than any live member. Default 0 (nothing is drawn for it, so
    /// seeds replay as before the knob); `CONCLAVE_SIM_GRANTOR_LEAVES` sets it.
    pub grantor_leaves: f64,
    /// The chaos phase's only faults are graceful leaves, one node down at a time and only
    /// while every node is in a view of all of them (each leaver restarts later as a new
    /// incarnation), on a network that loses and duplicates
    /// nothing: with `grantor_leaves` 1, a rolling restart of the grantor. Default false;
    /// `CONCLAVE_SIM_ONLY_LEAVES=1` sets it.
    pub only_leaves: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: 5,
            chaos: Duration::from_secs(20),
            calm: Duration::from_secs(20),
            fault_interval: Duration::from_millis(1500),
            max_loss: 0.1,
            max_duplicate: 0.05,
            min_delay: Duration::from_micros(100),
            max_delay: Duration::from_millis(15),
            max_datagram: 1400,
            endpoint: EndpointConfig::local(),
            sabotage: Sabotage::default(),
            workload: None,
            lock_sabotage: LockSabotage::default(),
            max_down: usize::MAX,
            max_steps: 3_000_000,
            harsh: None,
            one_way: 0.0,
            durable_terms: true,
            late_timers: None,
            late_timer_share: 0.002,
            grantor_leaves: 0.0,
            only_leaves: false,
        }
    }
}

impl SimConfig {
    /// A locking run: the default faults, lock users on every node, and `policy` (for
    /// `Majority`, the cluster size is the number of nodes).
    pub fn locking(policy: PartitionPolicy) -> Self {
        let mut config = SimConfig {
            workload: Some(Workload::default()),
            calm: Duration::from_secs(30),
            ..SimConfig::default()
        };
        config.endpoint.locks.policy = match policy {
            PartitionPolicy::Majority { .. } => {
                config.max_down = (config.nodes - 1) / 2;
                PartitionPolicy::Majority {
                    cluster_size: config.nodes,
                }
            }
            PartitionPolicy::Available => PartitionPolicy::Available,
        };
        config
    }
}

impl SimConfig {
    /// The harsh profile for membership runs: the gentle faults with loss up to 30%,
    /// duplication up to 10%, and [`HarshFaults::default`].
    pub fn harsh() -> Self {
        SimConfig {
            max_loss: 0.3,
            max_duplicate: 0.1,
            harsh: Some(HarshFaults::default()),
            one_way: 0.5,
            ..SimConfig::default()
        }
    }

    /// The harsh profile with lock users under `policy`.
    pub fn locking_harsh(policy: PartitionPolicy) -> Self {
        SimConfig {
            max_loss: 0.3,
            max_duplicate: 0.1,
            harsh: Some(HarshFaults::default()),
            one_way: 0.5,
            ..SimConfig::locking(policy)
        }
    }

    /// The profile named by `CONCLAVE_SIM_FAULTS` (`harsh`, or anything else for gentle), with
    /// `CONCLAVE_SIM_NODES` nodes and the fault knobs ([`SimConfig::with_env_knobs`]) if set.
    ///
    /// # Panics
    /// If a knob is set to something that is not a number.
    pub fn from_env_profile(policy: Option<PartitionPolicy>) -> Self {
        let harsh = std::env::var("CONCLAVE_SIM_FAULTS").is_ok_and(|v| v == "harsh");
        let config = match (policy, harsh) {
            (None, false) => SimConfig::default(),
            (None, true) => SimConfig::harsh(),
            (Some(p), false) => SimConfig::locking(p),
            (Some(p), true) => SimConfig::locking_harsh(p),
        }
        .with_env_knobs();
        match std::env::var("CONCLAVE_SIM_NODES")
            .ok()
            .and_then(|n| n.parse().ok())
        {
            Some(nodes) => config.with_nodes(nodes),
            None => config,
        }
    }

    /// The same profile with the fault knobs set in the environment: `CONCLAVE_SIM_ONE_WAY`
    /// ([`SimConfig::one_way`]), `CONCLAVE_SIM_GRANTOR_LEAVES` ([`SimConfig::grantor_leaves`]),
    /// `CONCLAVE_SIM_ONLY_LEAVES` ([`SimConfig::only_leaves`]) and, in the harsh profile, `CONCLAVE_SIM_MAX_REORDER_MS`,
    /// `CONCLAVE_SIM_DRIFT`, `CONCLAVE_SIM_CLOCK_PINNED` and `CONCLAVE_SIM_CLOCK_FLIPPING`
    /// ([`HarshFaults`]). The bands apply them, and a violation's replay line names each one
    /// that differs from the profile's default.
    ///
    /// # Panics
    /// If a knob is set to something that is not a number.
    pub fn with_env_knobs(mut self) -> Self {
        if let Some(share) = super::faults::env_number("CONCLAVE_SIM_ONE_WAY") {
            self.one_way = share;
        }
        if let Some(share) = super::faults::env_number("CONCLAVE_SIM_GRANTOR_LEAVES") {
            self.grantor_leaves = share;
        }
        if let Some(only) = super::faults::env_number::<u8>("CONCLAVE_SIM_ONLY_LEAVES") {
            self.only_leaves = only == 1;
        }
        if let Some(harsh) = self.harsh.as_mut() {
            harsh.apply_env();
        }
        self
    }

    /// The same profile with `nodes` node slots (under `Majority`, the cluster size follows,
    /// and a majority stays up).
    pub fn with_nodes(mut self, nodes: usize) -> Self {
        self.nodes = nodes.max(1);
        if self.endpoint.locks.policy.is_majority() {
            self.endpoint.locks.policy = PartitionPolicy::Majority {
                cluster_size: self.nodes,
            };
            self.max_down = (self.nodes - 1) / 2;
        }
        self
    }
}

/// The command that replays `seed` under `config`'s preset (add `CONCLAVE_SIM_TRACE=1` to
/// print every event).
pub(super) fn replay_command(seed: u64, config: &SimConfig) -> String {
    let test = if config.workload.is_some() {
        let policy = if config.endpoint.locks.policy.is_majority() {
            "majority"
        } else {
            "available"
        };
        format!("CONCLAVE_SIM_POLICY={policy} cargo test -p conclave-protocol --features sim --release --test locking_simulation")
    } else {
        "cargo test -p conclave-protocol --features sim --release --test simulation".to_owned()
    };
    let mut profile = match &config.harsh {
        Some(harsh) => format!("CONCLAVE_SIM_FAULTS=harsh {}", harsh.replay_vars()),
        None => String::new(),
    };
    let one_way_default = if config.harsh.is_some() {
        SimConfig::harsh().one_way
    } else {
        SimConfig::default().one_way
    };
    if config.one_way != one_way_default {
        profile.push_str(&format!("CONCLAVE_SIM_ONE_WAY={} ", config.one_way));
    }
    if config.grantor_leaves > 0.0 {
        profile.push_str(&format!(
            "CONCLAVE_SIM_GRANTOR_LEAVES={} ",
            config.grantor_leaves
        ));
    }
    if config.only_leaves {
        profile.push_str("CONCLAVE_SIM_ONLY_LEAVES=1 ");
    }
    if config.endpoint.locks.node_cache.enabled {
        profile.push_str("CONCLAVE_SIM_CACHE=1 ");
    }
    if config.endpoint.locks.one_hop_handoff {
        profile.push_str("CONCLAVE_SIM_HANDOFF=1 ");
    }
    if let Some(w) = &config.workload {
        if w.leased > 0.0 {
            profile.push_str(&format!("CONCLAVE_SIM_LEASED={} ", w.leased));
        }
        if w.transfer > 0.0 {
            profile.push_str(&format!("CONCLAVE_SIM_TRANSFER={} ", w.transfer));
        }
        if w.services > 0 {
            profile.push_str(&format!("CONCLAVE_SIM_SERVICES={} ", w.services));
        }
        if w.quiet > 0.0 {
            profile.push_str(&format!("CONCLAVE_SIM_QUIET={} ", w.quiet));
        }
        if w.dropped > 0.0 {
            profile.push_str(&format!("CONCLAVE_SIM_DROPPED={} ", w.dropped));
        }
    }
    let nodes = if config.nodes == SimConfig::default().nodes {
        String::new()
    } else {
        format!("CONCLAVE_SIM_NODES={} ", config.nodes)
    };
    format!("{profile}{nodes}CONCLAVE_SIM_SEED={seed} {test} replay -- --nocapture")
}
