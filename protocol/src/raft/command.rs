//! What the replicated log holds: [`Command`]s, and what applying one did: [`Applied`].
//!
//! Every member applies the same commands in the same order to its own [`Table`]
//! (`super::table`), so every member computes the same grants, queues and fencing tokens; a
//! member tells its own owners what an entry did to their requests, in log order.
//!
//! Requests are named by the member incarnation that made them ([`MemberId`]) and a number
//! unique in that incarnation; members are told apart by name across incarnations (a member
//! restarted from its data directory keeps its name and gets a new incarnation).
//!
//! [`Table`]: super::table::Table

use conclave_lock_api::{
    FencingToken, LockLostReason, LockMode, LockName, MemberId, OwnerId, ServiceName,
};
use serde::{Deserialize, Serialize};

/// A lock's key in the replicated table: its service (`None`: the default service) and name.
pub type LockKey = (Option<ServiceName>, LockName);

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Command {
    /// A member's process started: a new incarnation of the member of that name. The waits of
    /// its earlier incarnations are withdrawn (their futures died with the process); their holds
    /// stay, as *recovered holds* the new incarnation may adopt (a [`Command::Lock`] of the same
    /// lock and mode by it takes the hold over, with a new token) until it gives them up with
    /// [`Command::DropRecovered`].
    Join {
        /// The new incarnation.
        member: MemberId,
    },
    /// A lock request (`wait = false`: a try-lock, never queued).
    Lock {
        /// The requesting incarnation.
        member: MemberId,
        /// Unique per incarnation; a request applied twice is applied once.
        request: u64,
        /// Every request number of this incarnation below this one is finished (the table may
        /// forget them).
        done_below: u64,
        /// The lock.
        key: LockKey,
        /// The owner on that member.
        owner: u64,
        /// Shared or exclusive.
        mode: LockMode,
        /// Queue when the lock is not free (`false`: refuse instead).
        wait: bool,
        /// The hold's own lease, if any.
        lease_ms: Option<u64>,
    },
    /// Withdraws a request: a waiter leaves its queue; a held request is released.
    Cancel {
        /// The requesting incarnation.
        member: MemberId,
        /// The request.
        request: u64,
    },
    /// Releases the hold of a request.
    Unlock {
        /// The holding incarnation.
        member: MemberId,
        /// The request that was granted.
        request: u64,
    },
    /// Gives a held request a new lease, counted from this entry's application.
    Extend {
        /// The holding incarnation.
        member: MemberId,
        /// The request that was granted.
        request: u64,
        /// The new lease.
        lease_ms: u64,
    },
    /// Proposed by the leader when a hold's lease ran out: releases the hold with that token if
    /// it is still there (a stale proposal does nothing).
    Expire {
        /// The lock.
        key: LockKey,
        /// The hold's token.
        token: FencingToken,
    },
    /// Proposed by the leader when no incarnation of the member `name` renewed its session in
    /// time: every hold and wait of every incarnation of that name ends
    /// ([`LockLostReason::Minority`]), recovered holds too.
    ExpireMember {
        /// The member's name.
        name: String,
    },
    /// A member leaves (its node shuts down): every hold and wait of that incarnation ends
    /// ([`LockLostReason::Shutdown`]).
    Leave {
        /// The leaving incarnation.
        member: MemberId,
    },
    /// The member gives up the recovered holds of its earlier incarnations it did not adopt.
    DropRecovered {
        /// The current incarnation.
        member: MemberId,
    },
}

/// What applying a command did to one request (or recovered hold). An entry yields zero or
/// more of these, in the order they happened.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Applied {
    /// The request holds the lock. `adopted`: it took over a recovered hold of an earlier
    /// incarnation of its member (the lock never left the member; the token is new).
    Granted {
        /// The requesting incarnation.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
        /// The owner.
        owner: OwnerId,
        /// The mode granted.
        mode: LockMode,
        /// Its fencing token.
        token: FencingToken,
        /// Its lease, if any.
        lease_ms: Option<u64>,
        /// A recovered hold taken over.
        adopted: bool,
    },
    /// The request was queued; `position` 1 is first in line.
    Queued {
        /// The requesting incarnation.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
        /// The owner.
        owner: OwnerId,
        /// The mode asked.
        mode: LockMode,
        /// Place in the queue, from 1.
        position: u32,
    },
    /// A try-lock found the lock taken (or a queued request ahead of it that it must not pass).
    Busy {
        /// The requesting incarnation.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
    },
    /// A hold ended by its owner's `Unlock` or `Cancel`.
    Released {
        /// The holding incarnation.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
        /// The owner.
        owner: OwnerId,
        /// The hold's token.
        token: FencingToken,
    },
    /// A waiting request left its queue (`Cancel`, or a `Join` of a newer incarnation).
    Withdrawn {
        /// The requesting incarnation.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
        /// The owner.
        owner: OwnerId,
    },
    /// A hold ended without its owner's release (`Expire`, `ExpireMember`, `Leave`,
    /// `DropRecovered`); for a waiter ended by `ExpireMember` or `Leave`, `token` is `None`.
    Lost {
        /// The incarnation that held or waited.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
        /// The owner.
        owner: OwnerId,
        /// The hold's token; `None` for a wait.
        token: Option<FencingToken>,
        /// Why.
        reason: LockLostReason,
    },
    /// A held request got a new lease (`Extend`).
    Extended {
        /// The holding incarnation.
        member: MemberId,
        /// The request.
        request: u64,
        /// The lock.
        key: LockKey,
        /// The hold's token.
        token: FencingToken,
        /// The new lease.
        lease_ms: u64,
    },
}

/// The fencing token of the `k`-th grant (from 0) made by applying the log entry at `index`:
/// `index << 20 | k`. Grants happen only when entries are applied, in log order on every
/// member, so tokens increase with every grant, across leaders and full restarts (the log
/// index never goes back; a snapshot keeps its index).
pub fn token_at(index: u64, k: u32) -> FencingToken {
    FencingToken((index << TOKEN_GRANT_BITS) | u64::from(k & ((1 << TOKEN_GRANT_BITS) - 1)))
}

/// How many low bits of a Raft token count the grants of one entry.
pub const TOKEN_GRANT_BITS: u32 = 20;

/// Encodes a command for the log (CBOR).
pub fn encode(command: &Command) -> Vec<u8> {
    cbor4ii::serde::to_vec(Vec::new(), command).expect("a command always encodes")
}

/// Decodes a log entry's command; `None` for bytes that are not one (an empty entry, which a
/// new leader appends, or a later version's command).
pub fn decode(bytes: &[u8]) -> Option<Command> {
    if bytes.is_empty() {
        return None;
    }
    cbor4ii::serde::from_slice(bytes).ok()
}
