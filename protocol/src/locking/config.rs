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
    /// `Majority` only: a holder that has not heard from its grantor (or from a majority of
    /// the cluster) for this long reports its locks lost; a grantor re-grants a departed or
    /// silent member's locks only after `lease + lease_margin`. Must exceed the membership
    /// layer's suspect timeout, or every coordinator failover loses all locks. Default 8 s.
    pub lease: Duration,
    /// `Majority` only: extra wait of a grantor beyond `lease`, covering message delay and
    /// clock rate differences. Default 1 s.
    pub lease_margin: Duration,
    /// A holder that has not heard from its grantor for this long shows its locks as
    /// suspended (ownership unknown) until it hears again. Default 1.5 s.
    pub suspend_after: Duration,
}

impl Default for LockConfig {
    fn default() -> Self {
        Self {
            policy: PartitionPolicy::Available,
            reconcile_timeout: Duration::from_secs(2),
            lease: Duration::from_secs(8),
            lease_margin: Duration::from_secs(1),
            suspend_after: Duration::from_millis(1500),
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
            suspend_after: Duration::from_millis(200),
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
