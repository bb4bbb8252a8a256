//! Errors of the front end, one enum per family of operations.
//!
//! Lock requests fail with [`conclave_lock_api::LockError`] (re-exported as
//! [`crate::LockError`]), explicit unlocks with [`conclave_lock_api::UnlockError`]; invalid
//! lock names with [`conclave_lock_api::LockNameError`]; opening a named lock service with
//! [`ServiceError`].

use std::time::Duration;

use conclave_lock_api::seal::{KeyError, Rejection};
use conclave_lock_api::{
    ClusterNameError, DiscoveryReport, LockError, LockNameError, MemberId, MemberNameError,
};
use conclave_protocol::gms::GmsConfigError;
use conclave_protocol::locking::LockConfigError;
use conclave_protocol::reliable::ConfigError;
use thiserror::Error;

/// [`crate::NodeBuilder::join`] failed; no node is running (its thread, if started, was
/// stopped).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The member name is not valid.
    #[error("invalid member name: {0}")]
    InvalidName(#[from] MemberNameError),
    /// The cluster name is not valid (empty, longer than 64 bytes, or with a control
    /// character).
    #[error("invalid cluster name: {0}")]
    InvalidClusterName(#[from] ClusterNameError),
    /// No transport was given to the builder.
    #[error("no transport was given to the node builder")]
    NoTransport,
    /// The membership settings are not valid.
    #[error("invalid membership settings: {0}")]
    Membership(#[from] GmsConfigError),
    /// The lock settings are not valid.
    #[error("invalid lock settings: {0}")]
    Locks(#[from] LockConfigError),
    /// The reliable-delivery settings are not valid.
    #[error("invalid reliable-delivery settings: {0}")]
    Reliable(#[from] ConfigError),
    /// No view was installed in time.
    #[error("no view was installed within {0:?}")]
    JoinTimeout(Duration),
    /// The data directory could not be opened, or its promised-term file is unreadable.
    #[error("the data directory cannot be used: {0}")]
    DataDir(#[source] std::io::Error),
    /// The driver thread could not be started.
    #[error("could not start the driver thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The cluster key could not be read (a key file, or the environment).
    #[error("no usable cluster key: {0}")]
    Key(#[from] KeyError),
    /// The members this node found cannot open its packets, or it theirs: it holds another
    /// cluster key than they do, or only one side has a key. The node is stopped again.
    #[error("{}", authentication_message(.0))]
    Authentication(Rejection),
    /// The node shut down while joining.
    #[error("the node shut down while joining")]
    Shutdown,
    /// The Raft engine's settings are not usable (feature `raft`), e.g. this member's name is
    /// not among the peers, or no data directory was given.
    #[error("the Raft engine cannot start: {0}")]
    Raft(String),
    /// Nobody answered within the join timeout: no member of the cluster (and no other joiner
    /// to found one with) was heard at any place the transport looks, and this node may not
    /// found a cluster alone
    /// ([`crate::NodeBuilder::founding`]). `places` says what happened at each (an
    /// unreachable seed, a seed of another cluster, a multicast group nobody answers on).
    /// The node is stopped again.
    #[error("{}", no_cluster_message(cluster, places))]
    NoCluster {
        /// The cluster name the node looked for.
        cluster: String,
        /// Every place the transport looked, and what happened there.
        places: Vec<DiscoveryReport>,
    },
    /// The cluster's coordinator refused this member: a setting every member must share (the
    /// partition policy and cluster size, the lease settings, the protocol version; see
    /// [`conclave_protocol::shared_settings`]) differs. The node is stopped again.
    #[error(
        "the coordinator {coordinator} refused this member: {setting} is {cluster_value} in the \
         cluster and {our_value} here; every member must use the same"
    )]
    SettingMismatch {
        /// The coordinator that refused.
        coordinator: MemberId,
        /// The setting's name, e.g. `partition_policy`.
        setting: String,
        /// The cluster's value (its coordinator's).
        cluster_value: String,
        /// This member's value.
        our_value: String,
    },
    /// Two builder calls set one setting to different values (e.g. a
    /// [`crate::NodeBuilder::config`] whose policy is not the default and a
    /// [`crate::NodeBuilder::partition_policy`] with another).
    #[error("{setting} was set twice, to {first} and to {second}; set it once")]
    ConflictingSettings {
        /// The setting.
        setting: &'static str,
        /// One value, and where it was given.
        first: String,
        /// The other value, and where it was given.
        second: String,
    },
}

fn no_cluster_message(cluster: &str, places: &[DiscoveryReport]) -> String {
    let mut message = format!(
        "no member of cluster {cluster:?} answered, and this node may not found it alone \
         (NodeBuilder::founding)"
    );
    if places.is_empty() {
        message.push_str("; the transport has nowhere to look");
    }
    for (i, place) in places.iter().enumerate() {
        message.push_str(if i == 0 { ": " } else { "; " });
        message.push_str(&place.to_string());
    }
    message
}

fn authentication_message(r: &Rejection) -> String {
    let key = |k: Option<conclave_lock_api::seal::KeyId>| {
        k.map_or_else(|| "no key".to_string(), |k| format!("key id {k}"))
    };
    format!(
        "authentication failed: {} and this member cannot open each other's packets \
         (this member uses {}, {} uses {}): check the cluster key",
        r.peer,
        key(r.ours),
        r.peer,
        key(r.theirs)
    )
}

/// [`crate::Node::lock_service`] failed; no service was opened.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The service name is empty or longer than
    /// [`ServiceName::MAX_LEN`](conclave_lock_api::ServiceName::MAX_LEN) bytes.
    #[error("invalid lock service name: {0}")]
    InvalidName(#[from] LockNameError),
    /// The node runs the most named services it may already
    /// ([`MAX_SERVICES`](conclave_protocol::MAX_SERVICES), 256, counting those other members
    /// opened), or its backend runs no named services.
    #[error("too many lock services on this node")]
    TooManyServices,
    /// The node has shut down.
    #[error("the node has shut down")]
    Shutdown,
    /// The backend refused for another reason (a backend of another crate).
    #[error("the backend refused the lock service: {0}")]
    Refused(LockError),
}

impl From<LockError> for ServiceError {
    fn from(error: LockError) -> Self {
        match error {
            LockError::TooManyServices => Self::TooManyServices,
            LockError::Shutdown => Self::Shutdown,
            other => Self::Refused(other),
        }
    }
}
