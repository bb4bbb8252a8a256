//! Error types of the contract.

use thiserror::Error;

use crate::event::LockLostReason;

/// A lock name was rejected; nothing was created.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LockNameError {
    /// The name is empty.
    #[error("lock name is empty")]
    Empty,
    /// The name is longer than allowed.
    #[error("lock name is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The name contains a control character (newline, tab, escape, ...), which would let it
    /// forge or garble log lines and terminal output.
    #[error("lock name contains a control character")]
    ControlCharacter,
}

/// A cluster name was rejected ([`crate::ClusterName::new`]); nothing was created.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ClusterNameError {
    /// The name is empty.
    #[error("cluster name is empty")]
    Empty,
    /// The name is longer than allowed.
    #[error("cluster name is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The name contains a control character (newline, tab, escape, ...).
    #[error("cluster name contains a control character")]
    ControlCharacter,
}

/// A member name was rejected; nothing was created.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MemberNameError {
    /// The name is longer than allowed.
    #[error("member name is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The name contains a control character (newline, tab, ...).
    #[error("member name contains a control character")]
    ControlCharacter,
}

/// Why a lock operation failed. In every case the caller does not hold the lock.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum LockError {
    /// `try_lock`: the lock is held elsewhere; no request stays queued.
    #[error("the lock is held by another owner")]
    WouldBlock,
    /// The deadline passed before the lock was granted; the request was withdrawn.
    #[error("timed out waiting for the lock")]
    Timeout,
    /// The request was cancelled before it was granted.
    #[error("the lock request was cancelled")]
    Cancelled,
    /// The node shut down or left the cluster; the request was dropped.
    #[error("the node has shut down")]
    Shutdown,
    /// Under the `Majority` policy, this node is in a view without a majority of the cluster,
    /// so nothing can be granted to it: `try_lock` answers it at once (not `WouldBlock`), and
    /// a waiting `lock` / `lock_timeout` ends with it once the node has been outside a majority
    /// for the lock lease. The request was withdrawn. "Held by someone else" is `WouldBlock`.
    #[error("the node is not a member of a granting view")]
    NotMember,
    /// `try_lock`: the lock was free, but the cluster cannot grant anything right now: a new
    /// grantor is rebuilding its table after a failover, or (under `Majority`) waiting out
    /// the earlier grantor's leases, or lacks a majority's support. Retry shortly; this is not
    /// `WouldBlock` ("held by someone else").
    #[error("no grantor can grant the lock right now")]
    Unavailable,
    /// The lock was lost while the request was in flight.
    #[error("the lock was lost: {0}")]
    Lost(LockLostReason),
    /// `become_grantor` under the `Majority` policy: there the right to grant comes from a
    /// majority's promise to the view's coordinator, and the role does not move.
    #[error("the grantor role cannot move under the Majority partition policy")]
    TransferRefused,
    /// The lock service was destroyed on this node (`LockService::destroy`): its pending
    /// requests end with this error, and its handles accept no new request.
    #[error("the lock service was destroyed")]
    ServiceDestroyed,
    /// The node already runs the most lock services it may
    /// (see `conclave_protocol::MAX_SERVICES`); this one was not opened.
    #[error("too many lock services on this node")]
    TooManyServices,
}

/// An explicit unlock (a guard's `unlock`) could not confirm the release. The lock
/// is not held by the caller any more in either case.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum UnlockError {
    /// The lock had already been lost before the unlock.
    #[error("the lock had been lost before the unlock: {0}")]
    Lost(LockLostReason),
    /// The node shut down before the grantor acknowledged the release.
    #[error("the node shut down before the release was acknowledged")]
    Shutdown,
    /// The lock is released on this member, but no grantor acknowledged the release within
    /// the unlock's bound: this member is in a view that cannot grant (a minority under the
    /// `Majority` policy), or the grantor did not answer in time (cut off, or failing over).
    /// Nothing here holds the lock any more; the release is resent to every grantor this
    /// member follows until one takes it, and until then other members may still be refused
    /// the lock (a grantor frees it when the release reaches it, at the reconciliation after
    /// a partition heals, or, under `Majority`, when the hold's lease runs out).
    #[error("released here; no grantor acknowledged the release in time")]
    Unacknowledged,
}
