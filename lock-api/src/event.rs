//! Lock events, as listeners see them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{MemberId, OwnerId};
use crate::lock::{FencingToken, LockMode, LockName};

/// Why a held lock was lost without its owner releasing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum LockLostReason {
    /// After a partition healed, another owner was kept as the holder (duplicate-lock rule).
    Duplicate,
    /// The member found itself in a minority partition (`Majority` policy).
    Minority,
    /// The hold's lease ran out (`Majority` policy): no grantor confirmed the hold within the
    /// lease, counted from the moment this member sent its newest confirmed renewal.
    LeaseExpired,
    /// The member was excluded from the view.
    Expelled,
    /// The node shut down or left the cluster.
    Shutdown,
    /// The lock service the lock belonged to was destroyed on this node
    /// (`LockService::destroy`); the lock was released at its grantor.
    ServiceDestroyed,
}

impl fmt::Display for LockLostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LockLostReason::Duplicate => "another holder was kept after a merge",
            LockLostReason::Minority => "the member is in a minority partition",
            LockLostReason::LeaseExpired => "the lock lease expired",
            LockLostReason::Expelled => "the member was excluded from the view",
            LockLostReason::Shutdown => "the node shut down",
            LockLostReason::ServiceDestroyed => "the lock service was destroyed",
        })
    }
}

/// What was unexpected about a grant that reached a member: see
/// [`UnexpectedLock`](crate::UnexpectedLock). In every case the member resolved it safely, and
/// the owner holds nothing because of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum UnexpectedGrant {
    /// The owner had given up the request (cancelled, timed out, or its future dropped) before
    /// the grant arrived; the grant was released.
    Withdrawn,
    /// The grant came from a member that is not (or no longer) this member's grantor, e.g. a
    /// former grantor after a failover or a partition; it was given back there, and the
    /// request, if still wanted, waits for the current grantor.
    NotGrantor,
    /// A copy of a grant of a request that had ended long before (a stale message after a
    /// partition); it was given back.
    Stale,
    /// Under `Majority`, the grant's lease ran out before it arrived (the grantor or this
    /// member stalled); holding it would have been unsafe. It was given back and the request
    /// asked again.
    LeaseRanOut,
}

impl fmt::Display for UnexpectedGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnexpectedGrant::Withdrawn => "the owner had given up the request",
            UnexpectedGrant::NotGrantor => "it came from a member that is not the grantor",
            UnexpectedGrant::Stale => "it was a stale copy of an ended request",
            UnexpectedGrant::LeaseRanOut => "its lease ran out before it arrived",
        })
    }
}

/// Something that happened to a lock, as seen by one member.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// A handle for a lock name was created on this member.
    Created {
        /// The lock.
        name: LockName,
    },
    /// The grantor queued an owner's request behind another owner: it waits. Never sent for a
    /// request granted at once (so it is no false alarm), at most once per request, and before
    /// that request's `Locked`. Waiters are granted in queue order: a request told `position`
    /// is granted after the `position − 1` requests queued ahead of it (of any member) unless
    /// they give up, and before any request queued later.
    ///
    /// Reported for requests made while the events were being listened to: a request made
    /// when nobody listened may not be told it was queued (the node then saves the grantor
    /// that message), so a listener that subscribes while it waits sees its `Locked` without
    /// a `Waiting` before it.
    Waiting {
        /// The lock.
        name: LockName,
        /// The waiting owner.
        owner: OwnerId,
        /// The mode asked for.
        mode: LockMode,
        /// Its place in the queue when it was queued, from 1.
        position: u32,
    },
    /// An owner on this member was granted a lock.
    Locked {
        /// The lock.
        name: LockName,
        /// The new holder.
        owner: OwnerId,
        /// The mode granted.
        mode: LockMode,
        /// The fencing token of the grant.
        token: FencingToken,
    },
    /// An owner on this member released a lock.
    Unlocked {
        /// The lock.
        name: LockName,
        /// The former holder.
        owner: OwnerId,
    },
    /// An owner on this member lost a lock it held.
    Lost {
        /// The lock.
        name: LockName,
        /// The former holder.
        owner: OwnerId,
        /// Why.
        reason: LockLostReason,
    },
    /// The grantor this member knows to serve changed: `Some` once a grantor announced that
    /// it serves (after a failover's reconciliation, or a transfer with `become_grantor`),
    /// `None` while none is known (a failover or a transfer is under way).
    GrantorChanged {
        /// The serving grantor, if one is known.
        grantor: Option<MemberId>,
    },
}
