//! Timeouts and intervals of group membership.

use std::time::Duration;

use thiserror::Error;

/// Group membership timing. All durations are on the caller's monotonic clock.
///
/// The defaults suit a LAN or one host: a crashed member is suspected after
/// [`GmsConfig::suspect_timeout`] (3 s) and excluded at the next heartbeat tick; partitions that
/// heal are merged within about two [`GmsConfig::announce_interval`]s.
///
/// Heartbeats: the coordinator sends one to every member and every member one to the
/// coordinator; each other member also sends one to the next [`WATCHERS`](super::WATCHERS)
/// members of the view (a ring), so a member's heartbeat cost does not grow with the cluster
/// (the coordinator's grows linearly).
///
/// ```
/// use std::time::Duration;
/// use conclave_protocol::gms::GmsConfig;
///
/// let config = GmsConfig { suspect_timeout: Duration::from_secs(10), ..GmsConfig::default() };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GmsConfig {
    /// How often a member sends its heartbeats (the coordinator to every member, the others to
    /// the coordinator and their ring successors). Default 500 ms. Must be shorter than `suspect_timeout`; a third of it or less is wise.
    pub heartbeat_interval: Duration,
    /// A member not heard from (heartbeat or any other frame) for this long is suspected; the
    /// coordinator then excludes it, and if the coordinator is suspected the next member takes
    /// over. Default 3 s. Shorter detects crashes sooner but excludes slow members more often.
    pub suspect_timeout: Duration,
    /// How often a joining member multicasts a discovery ping. Default 250 ms.
    pub discovery_interval: Duration,
    /// How long a joiner looks for a coordinator before it founds a cluster of its own
    /// (the lowest-id joiner first; any joiner after twice this). Default 1 s.
    pub discovery_timeout: Duration,
    /// How long a joiner waits for the coordinator to answer its join request before it
    /// discovers again. Default 2 s.
    pub join_timeout: Duration,
    /// How often a coordinator announces its view on the discovery channel; coordinators that
    /// see each other's announcements merge. Default 1 s.
    pub announce_interval: Duration,
    /// How long a leaving member waits for the coordinator to confirm before it leaves anyway.
    /// Default 2 s.
    pub leave_timeout: Duration,
    /// How long a coordinator collects join requests before it admits them, all in one view
    /// (JGroups' view bundling). Default 50 ms. Longer admits bigger batches when many members
    /// start together (fewer views, each sent to every member) at the cost of join latency;
    /// zero admits every join in a view of its own. Must be shorter than `join_timeout`.
    pub join_batch: Duration,
}

impl Default for GmsConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(500),
            suspect_timeout: Duration::from_secs(3),
            discovery_interval: Duration::from_millis(250),
            discovery_timeout: Duration::from_secs(1),
            join_timeout: Duration::from_secs(2),
            announce_interval: Duration::from_secs(1),
            leave_timeout: Duration::from_secs(2),
            join_batch: Duration::from_millis(50),
        }
    }
}

impl GmsConfig {
    /// Fast timings for tests on one host: heartbeats every 50 ms, suspicion after 400 ms.
    pub fn local() -> Self {
        Self {
            heartbeat_interval: Duration::from_millis(50),
            suspect_timeout: Duration::from_millis(400),
            discovery_interval: Duration::from_millis(50),
            discovery_timeout: Duration::from_millis(300),
            join_timeout: Duration::from_millis(500),
            announce_interval: Duration::from_millis(250),
            leave_timeout: Duration::from_millis(500),
            join_batch: Duration::from_millis(20),
        }
    }

    /// Checks the relations between the timeouts.
    ///
    /// # Errors
    /// [`GmsConfigError`] naming the first field that is zero or out of proportion.
    pub fn validate(&self) -> Result<(), GmsConfigError> {
        let fields = [
            ("heartbeat_interval", self.heartbeat_interval),
            ("suspect_timeout", self.suspect_timeout),
            ("discovery_interval", self.discovery_interval),
            ("discovery_timeout", self.discovery_timeout),
            ("join_timeout", self.join_timeout),
            ("announce_interval", self.announce_interval),
            ("leave_timeout", self.leave_timeout),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, d)| d.is_zero()) {
            return Err(GmsConfigError::Zero(name));
        }
        if self.suspect_timeout < self.heartbeat_interval * 2 {
            return Err(GmsConfigError::SuspectTooShort);
        }
        if self.join_batch >= self.join_timeout {
            return Err(GmsConfigError::JoinBatchTooLong);
        }
        Ok(())
    }
}

/// When a joiner that finds no cluster may found one.
///
/// A joiner pings the discovery channel (the multicast group, or the seeds of a TCP mesh) and
/// joins the coordinator whose view it hears of. If for the discovery timeout it hears of no
/// view, the rule decides what it does. A joiner that founds where a cluster exists but could
/// not be reached (a wrong seed, a blocked port, a wrong interface) makes a second cluster:
/// under `Available` that is two grantors of every lock until the two meet and merge.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Founding {
    /// It may found a cluster alone, having heard nobody: the first member of a new cluster, a
    /// test. (The protocol's default; the node builder's depends on the transport.)
    #[default]
    Alone,
    /// It founds a cluster only with other joiners it heard on the discovery channel (the
    /// lowest id founds, the others join it), as members of a new cluster started together
    /// do. Having heard nobody, it reports [`crate::gms::JoinProblem::NobodyAnswered`] and
    /// keeps looking.
    WithOthers,
    /// It never founds: it joins an existing cluster or keeps looking (reporting
    /// [`crate::gms::JoinProblem::NobodyAnswered`] once it has heard nobody for the discovery
    /// timeout).
    Never,
}

/// A [`GmsConfig`] was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GmsConfigError {
    /// A duration is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// Suspicion would fire between two heartbeats.
    #[error("suspect_timeout must be at least twice heartbeat_interval")]
    SuspectTooShort,
    /// Joiners would give up before the coordinator admits them.
    #[error("join_batch must be shorter than join_timeout")]
    JoinBatchTooLong,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_validate() {
        assert_eq!(GmsConfig::default().validate(), Ok(()));
        assert_eq!(GmsConfig::local().validate(), Ok(()));
    }

    #[test]
    fn bad_configs_are_named() {
        let zero = GmsConfig {
            join_timeout: Duration::ZERO,
            ..GmsConfig::default()
        };
        assert_eq!(zero.validate(), Err(GmsConfigError::Zero("join_timeout")));
        let short = GmsConfig {
            suspect_timeout: Duration::from_millis(600),
            ..GmsConfig::default()
        };
        assert_eq!(short.validate(), Err(GmsConfigError::SuspectTooShort));
    }
}
