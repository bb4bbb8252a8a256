//! The member's settings, merged from flags, environment, config file and defaults (in that
//! order of precedence), and joining the cluster with them.

use std::path::PathBuf;
use std::time::Duration;

use conclave::tcp::{TcpConfig, TcpMesh};
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, Founding, Node, NodeError, PartitionPolicy};

use crate::args::{FoundingKind, MemberArgs, PolicyKind, Timings, TransportKind};
use crate::config_file::ConfigFile;
use crate::duration::HumanDuration;
use crate::exit::CliError;

/// Everything a member is started with.
#[derive(Debug)]
pub(crate) struct Settings {
    /// The cluster's name.
    pub(crate) cluster: String,
    /// This member's name.
    pub(crate) name: String,
    /// The transport and its settings.
    pub(crate) transport: TransportSettings,
    /// The protocol's settings.
    pub(crate) config: EndpointConfig,
    /// When the member may found a cluster.
    pub(crate) founding: Founding,
    /// Where the cluster key comes from.
    pub(crate) key: KeySource,
    /// The data directory.
    pub(crate) data_dir: Option<PathBuf>,
    /// How long joining may take.
    pub(crate) join_timeout: Duration,
}

/// The transport's settings.
#[derive(Debug)]
pub(crate) enum TransportSettings {
    /// UDP multicast.
    Udp(UdpConfig),
    /// A TCP mesh.
    Tcp(TcpConfig),
}

/// Where the cluster key comes from.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeySource {
    /// No key: traffic is not sealed.
    None,
    /// A key file.
    File(PathBuf),
    /// The library's `CONCLAVE_CLUSTER_KEY` variable (the key itself, never a flag).
    Env,
}

/// What the member is for; it picks the defaults that differ between subcommands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// `conclave serve`: may be the first member of a cluster.
    Serve,
    /// `run`, `status`, `watch`: members that come and go.
    Client(&'static str),
}

impl Settings {
    /// Merges `flags` (flags and environment, already merged by clap) over the config file
    /// they name (if any) over the defaults.
    ///
    /// # Errors
    /// [`CliError::Config`] if the file cannot be read or parsed, or a setting is missing or
    /// contradicts another.
    pub(crate) fn resolve(flags: &MemberArgs, role: Role) -> Result<Self, CliError> {
        let file = match &flags.config {
            Some(path) => ConfigFile::load(path)?,
            None => ConfigFile::default(),
        };
        let cluster = flags.cluster.clone().or(file.cluster).ok_or_else(|| {
            CliError::Config(
                "no cluster name: give --cluster, CONCLAVE_CLUSTER or `cluster` in the config \
                 file"
                    .into(),
            )
        })?;
        let name = flags.name.clone().or(file.name).unwrap_or_else(|| {
            let what = match role {
                Role::Serve => "serve",
                Role::Client(what) => what,
            };
            format!("{what}-{}", std::process::id())
        });
        let bind = flags.bind.or(file.bind);
        let transport = match flags.transport.or(file.transport) {
            Some(TransportKind::Udp) | None => {
                let udp = &file.udp;
                let interface = flags.multicast_interface.or(udp.interface);
                // A real interface means a LAN: its address for the socket, TTL 1 and
                // Ethernet-sized datagrams unless set otherwise.
                let defaults = match interface {
                    Some(ip) if !ip.is_loopback() => UdpConfig::lan(ip),
                    _ => UdpConfig::loopback(),
                };
                TransportSettings::Udp(UdpConfig {
                    bind: bind.unwrap_or(defaults.bind),
                    group: flags
                        .multicast_group
                        .or(udp.group)
                        .unwrap_or(defaults.group),
                    port: flags.multicast_port.or(udp.port).unwrap_or(defaults.port),
                    interface: interface.unwrap_or(defaults.interface),
                    ttl: flags.multicast_ttl.or(udp.ttl).unwrap_or(defaults.ttl),
                    max_datagram: udp.max_datagram.unwrap_or(defaults.max_datagram),
                    ..defaults
                })
            }
            Some(TransportKind::Tcp) => {
                let defaults = TcpConfig::loopback();
                let tcp = file.tcp;
                TransportSettings::Tcp(TcpConfig {
                    bind: bind.unwrap_or(defaults.bind),
                    seeds: flags.seeds.clone().or(tcp.seeds).unwrap_or_default(),
                    max_connections: tcp.max_connections.unwrap_or(defaults.max_connections),
                    connect_timeout: duration_or(tcp.connect_timeout, defaults.connect_timeout),
                    idle_timeout: duration_or(tcp.idle_timeout, defaults.idle_timeout),
                    ..defaults
                })
            }
        };
        let mut config = match flags.timings.or(file.timings).unwrap_or(Timings::Lan) {
            Timings::Lan => EndpointConfig::default(),
            Timings::Local => EndpointConfig::local(),
        };
        let gms = &mut config.gms;
        let g = &file.gms;
        set(&mut gms.heartbeat_interval, g.heartbeat_interval);
        set(&mut gms.suspect_timeout, g.suspect_timeout);
        set(&mut gms.discovery_timeout, g.discovery_timeout);
        set(&mut gms.announce_interval, g.announce_interval);
        set(&mut gms.leave_timeout, g.leave_timeout);
        set(&mut gms.join_batch, g.join_batch);
        let locks = &mut config.locks;
        let l = &file.locks;
        set(&mut locks.lease, flags.locks_lease.or(l.lease));
        set(&mut locks.lease_margin, l.lease_margin);
        set(&mut locks.support_lease, l.support_lease);
        set(&mut locks.suspend_after, l.suspend_after);
        set(&mut locks.reconcile_timeout, l.reconcile_timeout);
        let cluster_size = flags.cluster_size.or(file.cluster_size);
        locks.policy = match (flags.policy.or(file.policy), cluster_size) {
            (None | Some(PolicyKind::Available), None) => PartitionPolicy::Available,
            (None | Some(PolicyKind::Available), Some(_)) => {
                return Err(CliError::Config(
                    "cluster_size is a setting of the majority policy: set policy = majority"
                        .into(),
                ))
            }
            (Some(PolicyKind::Majority), Some(cluster_size)) => {
                PartitionPolicy::Majority { cluster_size }
            }
            (Some(PolicyKind::Majority), None) => {
                return Err(CliError::Config(
                    "the majority policy needs the cluster size: --cluster-size, \
                     CONCLAVE_CLUSTER_SIZE or `cluster_size` in the config file"
                        .into(),
                ))
            }
        };
        let founding = match flags.founding.or(file.founding) {
            Some(FoundingKind::Alone) => Founding::Alone,
            Some(FoundingKind::WithOthers) => Founding::WithOthers,
            Some(FoundingKind::Never) => Founding::Never,
            None if role == Role::Serve => Founding::Alone,
            None => Founding::WithOthers,
        };
        Ok(Self {
            cluster,
            name,
            transport,
            config,
            founding,
            key: match (&flags.key_file, file.key_file) {
                (Some(path), _) => KeySource::File(path.clone()),
                (None, _) if std::env::var_os(conclave::seal::KEY_ENV).is_some() => KeySource::Env,
                (None, Some(path)) => KeySource::File(path),
                (None, None) => KeySource::None,
            },
            data_dir: flags.data_dir.clone().or(file.data_dir),
            join_timeout: duration_or(
                flags.join_timeout.or(file.join_timeout),
                conclave::DEFAULT_JOIN_TIMEOUT,
            ),
        })
    }

    /// Binds the transport and joins the cluster.
    ///
    /// # Errors
    /// [`CliError::Config`] for a setting the library refuses; [`CliError::Unavailable`] if
    /// the transport cannot bind or the cluster cannot be joined.
    pub(crate) async fn join(self) -> Result<Node, CliError> {
        let mut builder = Node::builder(self.cluster)
            .name(self.name)
            .config(self.config)
            .founding(self.founding)
            .join_timeout(self.join_timeout);
        builder = match &self.transport {
            TransportSettings::Udp(udp) => {
                udp.validate()
                    .map_err(|e| CliError::Config(e.to_string()))?;
                builder.transport(UdpMulticast::bind(udp).map_err(|e| {
                    CliError::Unavailable(format!("binding UDP to {}: {e}", udp.bind))
                })?)
            }
            TransportSettings::Tcp(tcp) => {
                tcp.validate()
                    .map_err(|e| CliError::Config(e.to_string()))?;
                builder.transport(TcpMesh::bind(tcp).map_err(|e| {
                    CliError::Unavailable(format!("binding TCP to {}: {e}", tcp.bind))
                })?)
            }
        };
        builder = match self.key {
            KeySource::None => builder,
            KeySource::File(path) => builder.cluster_key_file(path),
            KeySource::Env => builder.cluster_key_from_env(),
        };
        if let Some(dir) = self.data_dir {
            builder = builder.data_dir(dir);
        }
        builder.join().await.map_err(join_error)
    }
}

/// Sorts a failed join into a configuration error or an unavailable cluster.
fn join_error(error: NodeError) -> CliError {
    match error {
        NodeError::JoinTimeout(_)
        | NodeError::NoCluster { .. }
        | NodeError::Authentication(_)
        | NodeError::SettingMismatch { .. }
        | NodeError::Shutdown
        | NodeError::Spawn(_) => CliError::Unavailable(format!("cannot join: {error}")),
        other => CliError::Config(other.to_string()),
    }
}

fn set(field: &mut Duration, value: Option<HumanDuration>) {
    if let Some(value) = value {
        *field = value.0;
    }
}

fn duration_or(value: Option<HumanDuration>, default: Duration) -> Duration {
    value.map_or(default, |d| d.0)
}
