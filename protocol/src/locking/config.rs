//! Configuration of the locking layer: partition policy, reconciliation, leases.

use std::time::Duration;

use thiserror::Error;

/// What a partition may do with locks. Set per node; every member should use the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartitionPolicy {
    /// JGroups semantics: every partition keeps granting; when partitions merge, duplicate
    /// holders are resolved (one kept, the others told). Mutual exclusion holds within one view
    /// with one grantor, not across a partition.
    Available,
    /// Only a view holding a strict majority of `cluster_size` members grants, and holders
    /// give their locks up when they are in a minority or have not heard from their grantor
    /// for a lease. Mutual exclusion holds across partitions (see `docs/protocol.md` for the
    /// assumptions).
    Majority {
        /// The number of members the cluster is configured to have.
        cluster_size: usize,
    },
}

impl PartitionPolicy {
    /// Whether a view of `members` members may grant locks under this policy.
    pub fn allows(&self, members: usize) -> bool {
        match self {
            PartitionPolicy::Available => true,
            PartitionPolicy::Majority { cluster_size } => members * 2 > *cluster_size,
        }
    }

    /// Whether this is the majority policy.
    pub fn is_majority(&self) -> bool {
        matches!(self, PartitionPolicy::Majority { .. })
    }
}

/// Locking-layer settings.
///
/// ```
/// use conclave_protocol::locking::{LockConfig, PartitionPolicy};
///
/// let config = LockConfig {
///     policy: PartitionPolicy::Majority { cluster_size: 5 },
///     ..LockConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockConfig {
    /// The partition policy. Default [`PartitionPolicy::Available`].
    pub policy: PartitionPolicy,
    /// How long a new grantor waits for every member's lock report before it rebuilds its
    /// table from the reports it has. Reports arriving later are still merged in. Default 2 s.
    pub reconcile_timeout: Duration,
    /// `Majority` only: a hold's lease. It runs from the moment the holder *sent* the newest
    /// message (lock request or renewal) that a grantor answered while that grantor had the
    /// hold in its table and a valid term; when it runs out on the holder's clock the hold is
    /// lost. A grantor re-grants a departed member's locks, and a new grantor grants anything,
    /// only `lease + lease_margin` after it could last have renewed such a lease. Must exceed
    /// `support_lease` plus a few round trips, or every grantor failover loses all locks.
    /// Default 8 s.
    pub lease: Duration,
    /// `Majority` only: the grantor's extra wait beyond `lease`. It covers clock *rate*
    /// differences only (never message delay): safety needs every clock's rate within ±ρ of
    /// real time, where `(1 + ρ) / (1 − ρ) ≤ (lease + lease_margin) / lease`, about
    /// `ρ ≤ lease_margin / (2 × lease)`: 6% with the defaults. Default 1 s.
    pub lease_margin: Duration,
    /// `Majority` only: how long a member's support of a grantor binds it. A member that
    /// echoes a grantor's probe promises not to support another grantor for this long; a
    /// grantor counts that support for `support_lease × lease / (lease + lease_margin)` from
    /// the moment it sent the probe. A new grantor can serve only once a majority's promises
    /// to the old one have run out, so failover takes at least this long (plus `lease +
    /// lease_margin` before the first new grant). Default 3 s.
    pub support_lease: Duration,
    /// A holder that has not heard from its grantor for this long shows its locks as
    /// suspended (ownership unknown) until it hears again (under `Majority`: whose lease was
    /// last renewed this long ago). Holders renew every `suspend_after / 2`. Default 1.5 s.
    pub suspend_after: Duration,
    /// Node-level caching of exclusive locks: off by default (see
    /// [`NodeCacheConfig`](super::NodeCacheConfig)).
    pub node_cache: super::NodeCacheConfig,
    /// One-hop handoff: the grantor grants the next waiter of a held lock in advance and
    /// tells the holder, whose release then goes straight to that waiter as its grant (one
    /// message on the handoff's path instead of two), the grantor told in the same send. The
    /// grantor stays the authority: it takes the tokens, completes the handoff in its table,
    /// and grants the waiter itself whenever the holder releases otherwise, expires or leaves.
    /// Only for a plain exclusive hold with a plain exclusive waiter next (no node grants); both
    /// policies. It is the grantor's setting, and a grantor designates only between members
    /// whose requests said they take handoffs (every build that knows it says so), so a
    /// cluster with older members in it can turn it on: their locks are granted as before.
    /// Default off: it shortens a contended handoff's path but costs each handoff one more
    /// message, which a CPU-bound host pays for (see `docs/benchmarks.md`).
    pub one_hop_handoff: bool,
}

impl Default for LockConfig {
    fn default() -> Self {
        Self {
            policy: PartitionPolicy::Available,
            reconcile_timeout: Duration::from_secs(2),
            lease: Duration::from_secs(8),
            lease_margin: Duration::from_secs(1),
            support_lease: Duration::from_secs(3),
            suspend_after: Duration::from_millis(1500),
            node_cache: super::NodeCacheConfig::default(),
            one_hop_handoff: false,
        }
    }
}

impl LockConfig {
    /// Timings for one host, matching [`crate::gms::GmsConfig::local`].
    pub fn local() -> Self {
        Self {
            policy: PartitionPolicy::Available,
            reconcile_timeout: Duration::from_millis(400),
            lease: Duration::from_millis(1200),
            lease_margin: Duration::from_millis(150),
            support_lease: Duration::from_millis(400),
            suspend_after: Duration::from_millis(200),
            node_cache: super::NodeCacheConfig {
                idle: Duration::from_millis(200),
                backoff: Duration::from_millis(200),
                delegation_grace: Duration::from_millis(200),
                ..super::NodeCacheConfig::default()
            },
            one_hop_handoff: false,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`LockConfigError`] naming what is wrong.
    pub fn validate(&self) -> Result<(), LockConfigError> {
        if self.reconcile_timeout.is_zero() {
            return Err(LockConfigError::Zero("reconcile_timeout"));
        }
        if self.lease.is_zero() {
            return Err(LockConfigError::Zero("lease"));
        }
        if self.support_lease.is_zero() {
            return Err(LockConfigError::Zero("support_lease"));
        }
        if self.suspend_after >= self.lease {
            return Err(LockConfigError::SuspendAfterLease);
        }
        if let PartitionPolicy::Majority { cluster_size: 0 } = self.policy {
            return Err(LockConfigError::EmptyCluster);
        }
        Ok(())
    }
}

/// A [`LockConfig`] was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LockConfigError {
    /// A duration is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// Locks would show as suspended only after they are lost.
    #[error("suspend_after must be shorter than lease")]
    SuspendAfterLease,
    /// `Majority { cluster_size: 0 }`.
    #[error("the majority policy needs a cluster size of at least 1")]
    EmptyCluster,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn majority_is_strict() {
        let p = PartitionPolicy::Majority { cluster_size: 4 };
        assert!(!p.allows(2));
        assert!(p.allows(3));
        assert!(PartitionPolicy::Available.allows(1));
    }

    #[test]
    fn presets_validate_and_bad_values_are_named() {
        assert_eq!(LockConfig::default().validate(), Ok(()));
        assert_eq!(LockConfig::local().validate(), Ok(()));
        let bad = LockConfig {
            suspend_after: Duration::from_secs(9),
            ..LockConfig::default()
        };
        assert_eq!(bad.validate(), Err(LockConfigError::SuspendAfterLease));
        let bad = LockConfig {
            policy: PartitionPolicy::Majority { cluster_size: 0 },
            ..LockConfig::default()
        };
        assert_eq!(bad.validate(), Err(LockConfigError::EmptyCluster));
    }
}
