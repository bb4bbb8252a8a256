//! The types the locking sub-machines share: what an owner asks and is told, the outbox, a
//! view's id on the wire, and the limits of request ids and terms.

use std::collections::VecDeque;
use std::time::Duration;

use conclave_lock_api::wire::LockMessage;
use conclave_lock_api::{
    FencingToken, GrantorTable, LockLostReason, LockMode, LockName, MemberId, RequestId,
    UnexpectedGrant, View,
};
use thiserror::Error;

#[cfg(doc)]
use super::LockMachine;
use crate::time::Instant;

/// The shortest lease of a hold (`LockRequest::lease`).
pub(crate) const MIN_LEASE: Duration = Duration::from_millis(1);

/// The highest grantor term: terms are the high 32 bits of fencing tokens.
pub(crate) const MAX_TERM: u64 = u32::MAX as u64;

/// Request ids and table queries of a member's lock service `index` are `index << SERVICE_SHIFT`
/// and up, so an id names the service it belongs to (see [`service_index`]).
pub const SERVICE_SHIFT: u32 = 40;

/// The index of the lock service a request id or table query of this member belongs to (0:
/// the default service).
pub fn service_index(id: u64) -> u64 {
    id >> SERVICE_SHIFT
}

/// `Majority`, named services: the right to grant of the member's default service, lent to
/// its named services (see [`LockMachine::for_service`]). Under `Majority` the right to grant
/// is a majority's promise to the view's coordinator, a property of the member, not of a
/// namespace: every service of the coordinator grants under the one term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Authority {
    /// The term of the default service's active grantor (`None`: it does not grant).
    pub(crate) term: Option<u64>,
    /// Until when that term's support is a majority.
    pub(crate) quorum_until: Option<Instant>,
    /// When the term's grace period ends (`None` before a majority supported it).
    pub(crate) grace_end: Option<Instant>,
    /// The highest term the member has heard of.
    pub(crate) max_term: u64,
}

/// Messages to send, with their receiver (possibly this member itself).
pub(crate) type Outbox = VecDeque<(MemberId, LockMessage)>;

/// A lock request of a local owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockRequest {
    /// The owner, a number unique on this member (a reentrant handle keeps one).
    pub owner: u64,
    /// The lock.
    pub name: LockName,
    /// Exclusive or shared.
    pub mode: LockMode,
    /// Wait in the queue (`lock`) or answer at once (`try_lock`).
    pub wait: bool,
    /// Give up after this long (the request is withdrawn at the grantor).
    pub timeout: Option<Duration>,
    /// The hold's own lease: the grantor frees the lock this long after it grants it, unless
    /// it is released first; the holder counts it lost earlier (see
    /// [`LockMachine::lock`]). `None`: held until released. Leased requests bypass node
    /// caching.
    pub lease: Option<Duration>,
}

impl LockRequest {
    /// An exclusive request that waits without a timeout.
    pub fn exclusive(owner: u64, name: LockName) -> Self {
        Self {
            owner,
            name,
            mode: LockMode::Exclusive,
            wait: true,
            timeout: None,
            lease: None,
        }
    }
}

/// Why a request ended without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A try-lock found the lock busy.
    WouldBlock,
    /// A try-lock found the grantor unable to grant anything at that moment (a new grantor
    /// rebuilding its table or waiting out earlier leases, or one without a majority's
    /// support); the lock itself was free.
    Unavailable,
    /// The request's timeout passed; it was withdrawn.
    Timeout,
    /// The member is leaving the cluster; the request was withdrawn.
    Shutdown,
    /// `Majority`: this member is in a view without a majority of the cluster, so nothing can
    /// be granted to it: a try-lock is refused at once, a waiting request once the member has
    /// been outside a majority for `lease` (as jgroups-raft resigns the waits of a member cut
    /// off in a minority). The request was withdrawn.
    NoQuorum,
    /// The named lock service was destroyed on this member; the request was withdrawn.
    Destroyed,
}

/// What a held lock's owner should believe about it right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldStatus {
    /// Held, and the grantor was heard from recently.
    Held,
    /// The grantor has been silent for a while: ownership is unknown until it is heard again
    /// (or, under `Majority`, until the lease runs out and the lock is lost).
    Suspended,
    /// Not held any more.
    Lost,
}

/// Something the owner of a request or lock must know.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockNotice {
    /// The request was granted.
    Granted {
        /// The request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The local owner.
        owner: u64,
        /// The mode granted.
        mode: LockMode,
        /// Its fencing token.
        token: FencingToken,
    },
    /// The grantor queued the request behind another owner (never for an immediate grant).
    Queued {
        /// The request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// Its place in the queue when it was queued, from 1.
        position: u32,
    },
    /// The request ended without a grant.
    Refused {
        /// The request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// Why.
        reason: Refusal,
    },
    /// The grantor acknowledged the release of the lock acquired by `request`.
    Released {
        /// The request that had acquired the lock.
        request: RequestId,
    },
    /// A grant reached this member that its owner did not expect; it was resolved safely
    /// (given back, or released by the owner's cancel) and is reported for the record.
    Unexpected {
        /// The request it was granted to.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The local owner of the request, if this member still knows it.
        owner: Option<u64>,
        /// The grant's fencing token.
        token: FencingToken,
        /// What was unexpected about it.
        reason: UnexpectedGrant,
    },
    /// The grantor this member knows to be serving changed: `Some` once the view's
    /// coordinator announced that it serves, `None` when that knowledge ended (a new
    /// coordinator, a minority view under `Majority`, or the grantor answered "unavailable").
    GrantorServing {
        /// The serving grantor, if one is known.
        grantor: Option<MemberId>,
    },
    /// The answer to [`LockMachine::query_table`]: the grantor's lock table, or `None` if no
    /// grantor could answer (none serving, or the grantor changed before it answered).
    Table {
        /// The query.
        query: u64,
        /// The table.
        table: Option<GrantorTable>,
    },
    /// A held lock was lost without its owner releasing it.
    Lost {
        /// The request that had acquired it.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The local owner.
        owner: u64,
        /// Its fencing token.
        token: FencingToken,
        /// Why.
        reason: LockLostReason,
    },
}

/// [`LockMachine::become_grantor`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TransferRefused {
    /// Under `Majority` the right to grant comes from a majority's promise to the view's
    /// coordinator (its term): the role does not move to another member.
    #[error("the grantor role cannot be transferred under the Majority partition policy")]
    Majority,
}

/// `unlock` of a request that does not hold a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[error("request {0} holds no lock on this member")]
pub struct NotHeld(pub RequestId);

/// A lock held on this member, with its status now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldInfo {
    /// The request that acquired it.
    pub request: RequestId,
    /// The lock.
    pub name: LockName,
    /// The local owner.
    pub owner: u64,
    /// The mode held.
    pub mode: LockMode,
    /// Its fencing token.
    pub token: FencingToken,
    /// Epoch of this member's view when the grant arrived.
    pub granted_in: u64,
    /// The grantor that granted it.
    pub granted_by: MemberId,
    /// Held, suspended or (about to be reported) lost.
    pub status: HoldStatus,
}

/// Test-only ways to break the locking protocol, proving the simulator's checkers can fail.
#[cfg(feature = "sim")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LockSabotage {
    /// Serve requests while reconciling, from the half-built table, without waiting for the
    /// lease of departed holders to run out.
    pub grant_while_reconciling: bool,
    /// Promote waiters without re-checking that their member is still in the view.
    pub skip_liveness_recheck: bool,
    /// Neither report nor resend unacknowledged releases to a new grantor.
    pub forget_pending_releases: bool,
    /// Hand out the previous fencing token again.
    pub reuse_fencing_token: bool,
    /// `Majority`: run a hold's lease from when a grant or renewal *arrived*, not from when
    /// the stamp it answers was sent (the bug a late, buffered or paused delivery exposes).
    pub anchor_leases_at_receipt: bool,
    /// `Majority`: support every grantor that probes, at once, coordinator of our view or not:
    /// no promise, no term order (the bug two coordinators behind a link cut expose).
    pub promise_anyone: bool,
    /// `Majority`: let waiting requests wait on in a minority view instead of refusing them
    /// after a lease (the jgroups-raft rule that a cut-off member resigns its waits).
    pub keep_waits_in_minority: bool,
    /// Node caching: keep granting local requests from a node grant after returning it.
    pub cache_after_return: bool,
    /// Node caching: every local grant from a node grant carries the block's first token (the
    /// token checker catches it only if it sees local grants).
    pub cache_repeat_token: bool,
    /// Read delegations: grant a writer over read delegations without revoking them first.
    pub grant_over_delegations: bool,
    /// Leases per acquisition: the holder counts its lease, whole, from when the grant
    /// arrived (not from a send time before the grant, shortened by the clock-rate margin).
    pub lease_from_receipt: bool,
    /// Grantor transfer: keep serving from the table after handing it over.
    pub serve_after_handoff: bool,
    /// Named services under `Majority`: grant without the member's term (as if every named
    /// service's grantor had a majority's support and no grace period to wait).
    pub service_without_term: bool,
    /// One-hop handoff: the holder passes the lock on and keeps holding it.
    pub pass_keeps_hold: bool,
    /// One-hop handoff: a member takes a passed lock for a request it no longer waits for
    /// (a designation used after it was withdrawn, or twice).
    pub pass_to_any: bool,
    /// One-hop handoff, `Majority`: a successor that left the view is dropped without fencing
    /// its lock for the lease the passed grant could have.
    pub pass_without_fence: bool,
}

/// A view's id on the wire: its epoch and its coordinator's incarnation. A coordinator numbers
/// its views increasingly, so the pair is unique across coordinators where an epoch alone is
/// not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ViewKey {
    pub(crate) epoch: u64,
    pub(crate) coordinator: u128,
}

impl ViewKey {
    pub(crate) fn of(view: &View) -> Self {
        Self {
            epoch: view.epoch(),
            coordinator: view.coordinator().incarnation(),
        }
    }
}

/// The view a transfer message names.
pub(crate) fn transfer_view(message: &LockMessage) -> Option<ViewKey> {
    match message {
        LockMessage::TransferRequest { epoch, coordinator }
        | LockMessage::Handoff {
            epoch, coordinator, ..
        }
        | LockMessage::Transferred {
            epoch, coordinator, ..
        }
        | LockMessage::NotGrantor {
            epoch, coordinator, ..
        } => Some(ViewKey {
            epoch: *epoch,
            coordinator: *coordinator,
        }),
        _ => None,
    }
}
