//! The endpoint's public types: its configuration, what it sends and tells, its counters,
//! and the settings every member of a cluster must share.

use std::net::SocketAddr;

use conclave_lock_api::wire::{SharedSetting, WireVersion, MIN_PROTOCOL_VERSION};
use conclave_lock_api::{ServiceName, View};

#[cfg(doc)]
use super::Endpoint;
use crate::gms::{GmsConfig, GmsStats, JoinProblem, ViewOrigin};
use crate::locking::{GrantorStats, LockConfig, LockNotice};
use crate::reliable;

/// The configuration of every layer of an [`Endpoint`].
#[derive(Clone, Debug, Default)]
pub struct EndpointConfig {
    /// Membership timing.
    pub gms: GmsConfig,
    /// Reliable delivery: windows, retransmission, memory bounds.
    pub reliable: reliable::ReliableConfig,
    /// Locking: partition policy, reconciliation, leases.
    pub locks: LockConfig,
    /// The newest wire version this member sends (default [`WireVersion::NEWEST`]). It sends
    /// each peer the newest version both speak once it has heard that peer speak it, and the
    /// oldest before (see `docs/protocol.md`, "Wire versions and rolling upgrades"), so a
    /// cluster upgrades itself one member at a time. [`WireVersion::V3`] holds this member
    /// at version 3 (it still reads version 4, and does not ask for it): for a cluster that
    /// must stay readable by version-3 tools that listen in.
    pub wire: WireVersion,
}

impl EndpointConfig {
    /// Fast timings for tests on one host (see [`GmsConfig::local`]).
    pub fn local() -> Self {
        Self {
            gms: GmsConfig::local(),
            reliable: reliable::ReliableConfig::default(),
            locks: LockConfig::local(),
            wire: WireVersion::NEWEST,
        }
    }
}

/// The most named lock services one member runs (opened here or by messages of other members).
/// Messages for a further service are dropped.
pub const MAX_SERVICES: usize = 256;

/// [`Endpoint::open_service`]: the member already runs [`MAX_SERVICES`] named services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this member already runs the most named lock services ({MAX_SERVICES})")]
pub struct TooManyServices;

/// [`Endpoint::become_grantor_in`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceTransferError {
    /// The service is not open and cannot be opened.
    #[error(transparent)]
    TooManyServices(#[from] TooManyServices),
    /// The transfer itself was refused.
    #[error(transparent)]
    Refused(#[from] crate::locking::TransferRefused),
}

/// Where a datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// One member, at its transport address.
    Member(SocketAddr),
    /// The discovery channel (multicast group or seed list).
    Discovery,
}

/// A datagram to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub destination: Destination,
    /// The encoded datagram, header included.
    pub bytes: Vec<u8>,
}

/// Something the application should know about.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointEvent {
    /// A new view was installed at this member.
    ViewInstalled {
        /// The view.
        view: View,
        /// How it came to be.
        origin: ViewOrigin,
    },
    /// This member has left the cluster.
    Left,
    /// This joiner cannot join (yet): nobody answered and it may not found a cluster alone, or
    /// a coordinator refused it for a setting. It keeps looking.
    JoinProblem(JoinProblem),
    /// A lock request was answered or a held lock changed, in the default lock service.
    Lock(LockNotice),
    /// The same, in a named lock service.
    ServiceLock {
        /// The service.
        service: ServiceName,
        /// What happened.
        notice: LockNotice,
    },
}

/// The settings of `config` that every member of a cluster must share, by name and value:
/// `protocol_version` (the oldest wire version the member speaks, so members of different
/// builds that share a version agree: `3` for builds that speak versions 3 and 4), `partition_policy` (with the cluster size under `Majority`), `lease`,
/// and under `Majority` also `lease_margin` and `support_lease`, which its mutual exclusion
/// rests on. A coordinator refuses a joiner, and does not merge with a view, whose value of
/// one of them differs (the timings of membership and caching may differ between members).
///
/// ```
/// use conclave_protocol::locking::{LockConfig, PartitionPolicy};
///
/// let config = LockConfig { policy: PartitionPolicy::Majority { cluster_size: 3 }, ..LockConfig::default() };
/// let settings = conclave_protocol::shared_settings(&config);
/// let policy = settings.iter().find(|s| s.name == "partition_policy").unwrap();
/// assert_eq!(policy.value, "Majority { cluster_size: 3 }");
/// ```
pub fn shared_settings(config: &LockConfig) -> Vec<SharedSetting> {
    let setting = |name: &str, value: String| SharedSetting {
        name: name.to_owned(),
        value,
    };
    let mut settings = vec![
        setting("protocol_version", MIN_PROTOCOL_VERSION.to_string()),
        setting("partition_policy", format!("{:?}", config.policy)),
        setting("lease", format!("{:?}", config.lease)),
    ];
    if config.policy.is_majority() {
        settings.push(setting(
            "lease_margin",
            format!("{:?}", config.lease_margin),
        ));
        settings.push(setting(
            "support_lease",
            format!("{:?}", config.support_lease),
        ));
    }
    settings
}

/// Counters of the endpoint and its layers.
#[derive(Clone, Debug, Default)]
pub struct EndpointStats {
    /// Membership counters.
    pub gms: GmsStats,
    /// Reliable-delivery counters.
    pub reliable: reliable::Stats,
    /// Grantor counters.
    pub grantor: GrantorStats,
    /// Node-level caching counters.
    pub cache: crate::locking::CacheStats,
    /// Holds of this member lost because their own lease (`lock_with_lease`) ran out.
    pub leases_expired: u64,
    /// Datagrams dropped because they belong to another cluster.
    pub dropped_foreign: u64,
    /// Datagrams dropped because of an unsupported protocol version.
    pub dropped_version: u64,
    /// Datagrams or messages dropped as malformed (bad magic, truncated, bad CBOR, too large).
    pub dropped_malformed: u64,
}
