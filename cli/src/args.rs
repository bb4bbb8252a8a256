//! The command line: subcommands, and the member settings every subcommand shares.
//!
//! Every member setting is an `Option`: a flag, else its `CONCLAVE_*` environment variable
//! (clap reads both), else the config file, else the default ([`crate::settings`] merges them).

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

use crate::duration::HumanDuration;

/// `conclave`: join a Conclave cluster as a member to run a command under a distributed lock,
/// show or watch the cluster, or serve as a long-running member.
#[derive(Debug, Parser)]
#[command(name = "conclave", version, about, max_term_width = 100)]
pub(crate) struct Cli {
    /// The member settings.
    #[command(flatten)]
    pub(crate) member: MemberArgs,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Acquire a lock, run a command while holding it, release it when the command exits.
    Run(RunArgs),
    /// Print the view, the coordinator, the grantors and the grantor's lock table.
    Status(StatusArgs),
    /// Print view changes, grantor changes and lock events as they happen.
    Watch(WatchArgs),
    /// Run as a long-running member until SIGINT or SIGTERM, then leave gracefully.
    Serve,
}

/// `conclave run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The lock to hold while the command runs.
    #[arg(long, short = 'l', value_name = "NAME")]
    pub(crate) lock: String,
    /// The named lock service the lock belongs to (default: the node's default service).
    #[arg(long, value_name = "NAME")]
    pub(crate) service: Option<String>,
    /// Give up after waiting this long for the lock (exit 75); `0` tries once. Default: wait.
    #[arg(long, short = 'w', value_name = "DURATION")]
    pub(crate) timeout: Option<HumanDuration>,
    /// Take a shared (read) lock of the reader-writer lock NAME instead of the mutex NAME.
    #[arg(long, short = 's')]
    pub(crate) shared: bool,
    /// Hold the lock at most this long: the grantor frees it after the lease, and the
    /// command is killed as for a lost lock.
    #[arg(long, value_name = "DURATION")]
    pub(crate) lease: Option<HumanDuration>,
    /// After the lock is lost, how long the command has between SIGTERM and SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub(crate) kill_grace: HumanDuration,
    /// The command and its arguments.
    #[arg(required = true, last = true, value_name = "COMMAND")]
    pub(crate) command: Vec<OsString>,
}

/// `conclave status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// A named lock service to report as well as the default one (repeatable).
    #[arg(long = "service", value_name = "NAME")]
    pub(crate) services: Vec<String>,
}

/// `conclave watch`.
#[derive(Debug, Args)]
pub(crate) struct WatchArgs {
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// Stop after this many events.
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Stop after this long.
    #[arg(long = "for", value_name = "DURATION")]
    pub(crate) duration: Option<HumanDuration>,
    /// How often to read the grantor's lock table for lock events of other members.
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub(crate) interval: HumanDuration,
}

/// The settings of the member a subcommand runs as. See the guide's "The command-line tool".
#[derive(Debug, Default, Args)]
pub(crate) struct MemberArgs {
    /// A TOML config file.
    #[arg(
        long,
        short = 'c',
        env = "CONCLAVE_CONFIG",
        global = true,
        value_name = "FILE"
    )]
    pub(crate) config: Option<PathBuf>,
    /// The cluster's name (required: here, in the environment or in the file).
    #[arg(long, env = "CONCLAVE_CLUSTER", global = true, value_name = "NAME")]
    pub(crate) cluster: Option<String>,
    /// This member's name (default: the subcommand and the process id).
    #[arg(long, env = "CONCLAVE_NAME", global = true, value_name = "NAME")]
    pub(crate) name: Option<String>,
    /// The transport (default: udp).
    #[arg(long, env = "CONCLAVE_TRANSPORT", global = true)]
    pub(crate) transport: Option<TransportKind>,
    /// The member's own address (default: 127.0.0.1:0, any port).
    #[arg(long, env = "CONCLAVE_BIND", global = true, value_name = "ADDR")]
    pub(crate) bind: Option<SocketAddr>,
    /// UDP: the multicast group of discovery (default: 239.255.67.76).
    #[arg(
        long,
        env = "CONCLAVE_MULTICAST_GROUP",
        global = true,
        value_name = "IP"
    )]
    pub(crate) multicast_group: Option<Ipv4Addr>,
    /// UDP: the discovery port every member shares (default: 45588).
    #[arg(
        long,
        env = "CONCLAVE_MULTICAST_PORT",
        global = true,
        value_name = "PORT"
    )]
    pub(crate) multicast_port: Option<u16>,
    /// UDP: the interface of multicast (default: 127.0.0.1).
    #[arg(
        long,
        env = "CONCLAVE_MULTICAST_INTERFACE",
        global = true,
        value_name = "IP"
    )]
    pub(crate) multicast_interface: Option<Ipv4Addr>,
    /// UDP: the multicast TTL, 0 for this host only (default: 0).
    #[arg(
        long,
        env = "CONCLAVE_MULTICAST_TTL",
        global = true,
        value_name = "TTL"
    )]
    pub(crate) multicast_ttl: Option<u32>,
    /// TCP: the seed members' addresses, comma-separated.
    #[arg(
        long,
        env = "CONCLAVE_SEEDS",
        global = true,
        value_delimiter = ',',
        value_name = "ADDR,..."
    )]
    pub(crate) seeds: Option<Vec<SocketAddr>>,
    /// A file holding the cluster key (64 hex digits) that seals all traffic. Without one,
    /// the key is read from CONCLAVE_CLUSTER_KEY if set.
    #[arg(
        long,
        env = "CONCLAVE_CLUSTER_KEY_FILE",
        global = true,
        value_name = "FILE"
    )]
    pub(crate) key_file: Option<PathBuf>,
    /// The member's data directory (keeps fencing tokens increasing across restarts).
    #[arg(long, env = "CONCLAVE_DATA_DIR", global = true, value_name = "DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    /// The partition policy, the same on every member (default: available).
    #[arg(long, env = "CONCLAVE_POLICY", global = true)]
    pub(crate) policy: Option<PolicyKind>,
    /// The cluster size of the majority policy.
    #[arg(long, env = "CONCLAVE_CLUSTER_SIZE", global = true, value_name = "N")]
    pub(crate) cluster_size: Option<usize>,
    /// The majority policy's lease of every hold (`locks.lease`), the same on every member.
    #[arg(
        long,
        env = "CONCLAVE_LOCKS_LEASE",
        global = true,
        value_name = "DURATION"
    )]
    pub(crate) locks_lease: Option<HumanDuration>,
    /// When this member may found a cluster (default: alone for serve, else with-others).
    #[arg(long, env = "CONCLAVE_FOUNDING", global = true)]
    pub(crate) founding: Option<FoundingKind>,
    /// The protocol's timing preset (default: lan).
    #[arg(long, env = "CONCLAVE_TIMINGS", global = true)]
    pub(crate) timings: Option<Timings>,
    /// How long joining may take (default: 10s).
    #[arg(
        long,
        env = "CONCLAVE_JOIN_TIMEOUT",
        global = true,
        value_name = "DURATION"
    )]
    pub(crate) join_timeout: Option<HumanDuration>,
}

/// Which transport a member uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum TransportKind {
    /// UDP multicast discovery and unicast datagrams.
    Udp,
    /// A TCP mesh found from seeds.
    Tcp,
}

/// The partition policy, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum PolicyKind {
    /// Every side of a partition keeps granting.
    Available,
    /// Only a majority of `cluster_size` grants.
    Majority,
}

/// When a member may found a cluster (`conclave::Founding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FoundingKind {
    /// Hearing nobody, found a cluster of one.
    Alone,
    /// Found only together with other joiners.
    WithOthers,
    /// Never found; only join.
    Never,
}

/// The protocol's timing preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Timings {
    /// `EndpointConfig::default()`: LAN timings.
    Lan,
    /// `EndpointConfig::local()`: fast timings for members on one host.
    Local,
}
