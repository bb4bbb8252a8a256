//! [`RaftSimConfig`]: the shape of a simulated Raft run, its two profiles (gentle and harsh),
//! the environment knobs, and the command that replays a seed.

use std::time::Duration;

use super::workload::RaftWorkload;

/// A node whose clock runs outside the drift bound the engine assumes: a deliberately broken
/// run, to prove the exclusion checker fires (see `RaftSimConfig::slow_clock`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlowClock {
    /// The node slot, from 0.
    pub node: usize,
    /// Its clock's rate against true time (0.7: 30 % slow).
    pub rate: f64,
}

/// The shape of a simulated Raft run. A run is a function of the seed and this alone.
#[derive(Clone, Debug)]
pub struct RaftSimConfig {
    /// Members of the cluster (3 or 5; any number from 1 works). `None` (the default) draws
    /// it from the seed: 3 for odd seeds, 5 for even ones.
    pub nodes: Option<usize>,
    /// Virtual duration of the fault phase. Default 12 s.
    pub chaos: Duration,
    /// The liveness bound: once faults stop (every node up, the network whole), every
    /// outstanding wait is answered, a new lock on every key succeeds and every member holds
    /// the same table, all within this. Default 10 s.
    pub calm: Duration,
    /// Mean virtual time between two faults (each drawn between a quarter and 7/4 of it).
    /// Default 700 ms.
    pub fault_interval: Duration,
    /// Highest packet loss rate a fault sets. Gentle 0.1, harsh 0.3.
    pub max_loss: f64,
    /// Highest duplication rate a fault sets. Gentle 0.05, harsh 0.1.
    pub max_duplicate: f64,
    /// Shortest one-way delay. Default 0.
    pub min_delay: Duration,
    /// Longest one-way delay; the spread reorders packets. Gentle 15 ms, harsh 50 ms.
    pub max_delay: Duration,
    /// Share of packets held back far beyond `max_delay` (overtaken by later ones). Gentle 0,
    /// harsh 0.02.
    pub reorder: f64,
    /// Longest delay of a held-back packet. Default 1 s.
    pub max_reorder_delay: Duration,
    /// Share of partitions and link cuts that cut one way only. Gentle 0, harsh 0.5.
    pub one_way: f64,
    /// Whether single links are cut and restored. Gentle no, harsh yes.
    pub link_cuts: bool,
    /// Longest process pause (no input at all, then the node resumes with its clock jumped);
    /// zero turns pauses off. Gentle zero, harsh 2 s.
    pub max_pause: Duration,
    /// The drift bound ρ: each incarnation's clock rate is within `[1 − ρ, 1 + ρ]` of true
    /// time (a quarter pinned at either end, a quarter flipping between them, the rest drawn
    /// uniformly). The engine's margin (a tenth of the session timeout) allows rates that
    /// differ by about 20 %; gentle 0, harsh 0.02.
    pub clock_drift: f64,
    /// Share of crash faults that crash every member at once (each restarts from its disk a
    /// little later). Default 0.15.
    pub full_restart: f64,
    /// Longest time a persistence batch takes to reach the disk; a crash before it did loses
    /// it. Default 4 ms.
    pub max_fsync: Duration,
    /// Applied entries between two snapshots. `None` (the default) draws it from the seed:
    /// half the runs snapshot every 20 to 80 entries (compaction and snapshot installs), the
    /// others every 10,000.
    pub snapshot_every: Option<u64>,
    /// The engine's session timeout. Default 3 s (the engine's default).
    pub session_timeout: Duration,
    /// How long a restarted member's earlier holds wait to be adopted. Default 2 s (the
    /// engine's default is 30 s: long beside the liveness bound).
    pub recovered_hold_grace: Duration,
    /// The lock users.
    pub workload: RaftWorkload,
    /// A deliberately broken clock (known-bad runs only). Default `None`.
    pub slow_clock: Option<SlowClock>,
    /// Hard bound on steps. Default 2,000,000.
    pub max_steps: u64,
}

impl Default for RaftSimConfig {
    /// The gentle profile.
    fn default() -> Self {
        RaftSimConfig {
            nodes: None,
            chaos: Duration::from_secs(12),
            calm: Duration::from_secs(10),
            fault_interval: Duration::from_millis(700),
            max_loss: 0.1,
            max_duplicate: 0.05,
            min_delay: Duration::ZERO,
            max_delay: Duration::from_millis(15),
            reorder: 0.0,
            max_reorder_delay: Duration::from_secs(1),
            one_way: 0.0,
            link_cuts: false,
            max_pause: Duration::ZERO,
            clock_drift: 0.0,
            full_restart: 0.15,
            max_fsync: Duration::from_millis(4),
            snapshot_every: None,
            session_timeout: Duration::from_secs(3),
            recovered_hold_grace: Duration::from_secs(2),
            workload: RaftWorkload::default(),
            slow_clock: None,
            max_steps: 2_000_000,
        }
    }
}

impl RaftSimConfig {
    /// The gentle profile: loss up to 10 %, duplication, delays up to 15 ms, symmetric
    /// partitions, crashes and full-cluster restarts, exact clocks.
    pub fn gentle() -> Self {
        Self::default()
    }

    /// The harsh profile: loss up to 30 %, duplication up to 10 %, delays up to 50 ms and
    /// hold-backs up to 1 s, one-way partitions and link cuts, process pauses up to 2 s, clock
    /// rates within ±2 %, besides the gentle profile's faults.
    pub fn harsh() -> Self {
        RaftSimConfig {
            max_loss: 0.3,
            max_duplicate: 0.1,
            max_delay: Duration::from_millis(50),
            reorder: 0.02,
            one_way: 0.5,
            link_cuts: true,
            max_pause: Duration::from_secs(2),
            clock_drift: 0.02,
            ..Self::default()
        }
    }

    /// Whether this is the harsh profile (its replay line says so).
    pub fn is_harsh(&self) -> bool {
        self.max_pause > Duration::ZERO || self.link_cuts
    }

    /// The profile `CONCLAVE_SIM_FAULTS` names (`harsh`, or anything else for gentle), with
    /// the knobs of [`RaftSimConfig::with_env_knobs`].
    ///
    /// # Panics
    /// If a knob is set to something that does not parse.
    pub fn from_env() -> Self {
        let harsh = std::env::var("CONCLAVE_SIM_FAULTS").is_ok_and(|v| v == "harsh");
        let config = if harsh { Self::harsh() } else { Self::gentle() };
        config.with_env_knobs()
    }

    /// The same profile with the knobs set in the environment: `CONCLAVE_RAFT_NODES`
    /// ([`RaftSimConfig::nodes`]), `CONCLAVE_RAFT_SNAPSHOT_EVERY`
    /// ([`RaftSimConfig::snapshot_every`]), `CONCLAVE_RAFT_SLOW_CLOCK` (the rate of node 0's
    /// clock, [`RaftSimConfig::slow_clock`]) and `CONCLAVE_RAFT_LONG_HOLDS`
    /// ([`RaftWorkload::long_hold`]).
    ///
    /// # Panics
    /// If a knob is set to something that does not parse.
    pub fn with_env_knobs(mut self) -> Self {
        if let Some(nodes) = env_number("CONCLAVE_RAFT_NODES") {
            self.nodes = Some(nodes);
        }
        if let Some(every) = env_number("CONCLAVE_RAFT_SNAPSHOT_EVERY") {
            self.snapshot_every = Some(every);
        }
        if let Some(rate) = env_number("CONCLAVE_RAFT_SLOW_CLOCK") {
            self.slow_clock = Some(SlowClock { node: 0, rate });
        }
        if let Some(share) = env_number("CONCLAVE_RAFT_LONG_HOLDS") {
            self.workload.long_hold = share;
        }
        self
    }

    /// The members of run `seed`.
    pub fn nodes_of(&self, seed: u64) -> usize {
        self.nodes
            .unwrap_or(if seed % 2 == 1 { 3 } else { 5 })
            .max(1)
    }

    /// The command that replays `seed` under this configuration (add `CONCLAVE_SIM_TRACE=1`
    /// to print every fault and event).
    pub fn replay_command(&self, seed: u64) -> String {
        let mut vars = String::new();
        if self.is_harsh() {
            vars.push_str("CONCLAVE_SIM_FAULTS=harsh ");
        }
        if let Some(nodes) = self.nodes {
            vars.push_str(&format!("CONCLAVE_RAFT_NODES={nodes} "));
        }
        if let Some(every) = self.snapshot_every {
            vars.push_str(&format!("CONCLAVE_RAFT_SNAPSHOT_EVERY={every} "));
        }
        if let Some(slow) = self.slow_clock {
            vars.push_str(&format!("CONCLAVE_RAFT_SLOW_CLOCK={} ", slow.rate));
        }
        if self.workload.long_hold != RaftWorkload::default().long_hold {
            vars.push_str(&format!(
                "CONCLAVE_RAFT_LONG_HOLDS={} ",
                self.workload.long_hold
            ));
        }
        format!(
            "{vars}CONCLAVE_SIM_SEED={seed} cargo test -p conclave-protocol --features sim,raft --release --test raft_simulation replay -- --nocapture"
        )
    }
}

/// The value of environment variable `var`, if set.
///
/// # Panics
/// If it is set to something that does not parse.
fn env_number<T: std::str::FromStr>(var: &str) -> Option<T> {
    let value = std::env::var(var).ok()?;
    match value.parse() {
        Ok(v) => Some(v),
        Err(_) => panic!("{var}={value} is not a number"),
    }
}
