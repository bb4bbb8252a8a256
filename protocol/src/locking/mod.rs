//! Locking: the grantor's lock table, every member's client state, reconciliation when the
//! grantor changes, duplicate locks after a merge, fencing tokens and partition policies.
//!
//! [`LockService`] is a sans-IO state machine, one per member. The membership layer tells it
//! each new view; the coordinator of the view is the *grantor*. Every member is a *client* of
//! the grantor: it sends LOCK / TRY_LOCK (`wait: false`) / CANCEL / UNLOCK and receives
//! GRANTED / DENIED / UNLOCK-ACK / DUPLICATE-LOCK. A new grantor first *reconciles*: it asks
//! every member for its held locks, pending requests and pending releases (LOCK-INFO), waits
//! for all reports or [`LockConfig::reconcile_timeout`], rebuilds its table, resolves duplicate
//! holders, and only then grants. See `docs/protocol.md` for the full rules and what each
//! [`PartitionPolicy`] guarantees.
//!
//! ```
//! use std::time::Duration;
//! use conclave_lock_api::{LockMode, LockName, MemberId, View};
//! use conclave_protocol::gms::ViewOrigin;
//! use conclave_protocol::locking::{LockConfig, LockNotice, LockRequest, LockService};
//! use conclave_protocol::Instant;
//!
//! let me = MemberId::new(1, "solo", "127.0.0.1:7800".parse()?)?;
//! let mut locks = LockService::new(me.clone(), LockConfig::local());
//! let now = Instant::ZERO;
//! // A view of one: this member is the grantor and reconciles with itself at once.
//! locks.handle_view(now, &View::new(1, vec![me])?, ViewOrigin::Founded);
//! let request = locks.lock(now, LockRequest::exclusive(7, LockName::new("invoice-42")?));
//! let granted = std::iter::from_fn(|| locks.poll_notice())
//!     .any(|n| matches!(n, LockNotice::Granted { request: r, .. } if r == request));
//! assert!(granted);
//! locks.unlock(now, request)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cache;
mod client;
mod config;
mod grantor;
mod lazy_ack;
mod lease;
mod table;

use std::cmp::Reverse;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::{LeaseBeat, LockMessage, NODE_OWNER};
use conclave_lock_api::{
    FencingToken, GrantorTable, LockLostReason, LockMode, LockName, MemberId, OwnerId, RequestId,
    UnexpectedGrant, View,
};
use thiserror::Error;
use tracing::{debug, info};

use crate::gms::ViewOrigin;
use crate::time::Instant;
use client::Client;
use grantor::{Ctx, Grantor};
use lease::{scale, Support, Term};

#[cfg(feature = "sim")]
pub use cache::CachedGrant;
pub use cache::{CacheStats, NodeCacheConfig};
pub use config::{LockConfig, LockConfigError, PartitionPolicy};
pub use grantor::GrantorStats;
pub use lazy_ack::LAZY_ACK_DELAY;

/// The shortest lease of a hold (`LockRequest::lease`).
const MIN_LEASE: Duration = Duration::from_millis(1);

/// The highest grantor term: terms are the high 32 bits of fencing tokens.
const MAX_TERM: u64 = u32::MAX as u64;

/// Request ids and table queries of a member's lock service `index` are `index << SERVICE_SHIFT`
/// and up, so an id names the service it belongs to (see [`service_index`]).
pub const SERVICE_SHIFT: u32 = 40;

/// The index of the lock service a request id or table query of this member belongs to (0:
/// the default service).
pub fn service_index(id: u64) -> u64 {
    id >> SERVICE_SHIFT
}

/// `Majority`, named services: the right to grant of the member's default service, lent to
/// its named services (see [`LockService::for_service`]). Under `Majority` the right to grant
/// is a majority's promise to the view's coordinator, a property of the member, not of a
/// namespace: every service of the coordinator grants under the one term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Authority {
    /// The term of the default service's active grantor (`None`: it does not grant).
    term: Option<u64>,
    /// Until when that term's support is a majority.
    quorum_until: Option<Instant>,
    /// When the term's grace period ends (`None` before a majority supported it).
    grace_end: Option<Instant>,
    /// The highest term the member has heard of.
    max_term: u64,
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
    /// [`LockService::lock`]). `None`: held until released. Leased requests bypass node
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
    /// The answer to [`LockService::query_table`]: the grantor's lock table, or `None` if no
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

/// [`LockService::become_grantor`] was refused.
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
}

/// The locking state machine of one member: client of the grantor, and grantor when it
/// coordinates. See the [module docs](self).
#[derive(Debug)]
pub struct LockService {
    local: MemberId,
    config: LockConfig,
    /// The current view, shared (cloned on every input that needs it by value).
    view: Option<std::sync::Arc<View>>,
    /// When each member of the view was last heard from (for leases and quorum).
    last_heard: BTreeMap<MemberId, Instant>,
    client: Client,
    grantor: Grantor,
    /// Node-level caching of exclusive locks.
    cache: cache::NodeCache,
    outbox: Outbox,
    notices: VecDeque<LockNotice>,
    next_check: Option<Instant>,
    /// The latest time seen in any input.
    last_now: Instant,
    /// The highest view epoch this member has heard of (from the membership layer).
    known_epoch: u64,
    /// `Majority`: what this member promised to which grantor.
    support: Support,
    /// `Majority`: this member's term while it is the grantor.
    term: Option<Term>,
    /// `Majority`: when holders renew their leases next.
    next_renew: Option<Instant>,
    /// `Majority`: since when this member's view has been a minority.
    minority_since: Option<Instant>,
    /// Sabotage: waits in a minority are never refused.
    keep_waits_in_minority: bool,
    /// Grantor: the (view epoch, term) it last announced serving for.
    announced: Option<(u64, Option<u64>)>,
    /// Client: the grantor known to serve (from its announcement).
    serving_grantor: Option<MemberId>,
    /// Client: the newest announcement heard (it may arrive before its view is installed).
    announcement: Option<(MemberId, u64)>,
    /// Table queries waiting for their answer, and the grantor asked.
    queries: BTreeMap<u64, MemberId>,
    next_query: u64,
    /// Holds this member lost because their own lease ran out.
    acquisition_leases_expired: u64,
    /// `become_grantor` was called: ask every new grantor of later views for the role too,
    /// until another member takes it over (the last asker wins).
    wants_grantor: bool,
    /// The grantor last asked for the role, in which view (asked once per grantor and view).
    asked: Option<(MemberId, ViewKey)>,
    /// This member handed its table over to that member in that view.
    transferred: Option<(ViewKey, MemberId)>,
    /// The member that asked this grantor for the role last (the last asker wins); handed
    /// the table once this member serves.
    pending_transfer: Option<MemberId>,
    /// The turn, in this view, of the grantor this member follows or waits for (0: the
    /// coordinator's); announcements of earlier turns are stale.
    generation: u64,
    /// The coordinator of the previous view, which handed this view to this member on
    /// leaving, with this view: its table handoff, if it comes, ends the reconciliation.
    handover_from: Option<(ViewKey, MemberId)>,
    /// Transfer announcements for views not installed here yet, newest turn per view (at
    /// most [`EARLY_TRANSFERS_MAX`]): one of another coordinator's view that shares members
    /// must not displace the one of the view this member installs next.
    early_transfers: Vec<(ViewKey, u64, MemberId)>,
    /// A named service: the default service's right to grant, lent to this one (`Majority`).
    borrowed: Option<Authority>,
    /// A named service: the borrowed term its grantor last started (reconciled) in.
    started_term: Option<u64>,
    /// Sabotage ([`LockSabotage::service_without_term`]).
    sabotage_service_without_term: bool,
}

impl LockService {
    /// A member's locking state; it does nothing until the first view.
    pub fn new(local: MemberId, config: LockConfig) -> Self {
        let lease = config.policy.is_majority().then_some(config.lease);
        let mut client = Client::new(local.clone(), lease);
        client.drift = (config.lease, config.lease + config.lease_margin);
        Self {
            client,
            grantor: {
                let mut grantor = Grantor::new(local.clone());
                grantor.delegation_grace = config.node_cache.delegation_grace;
                grantor
            },
            cache: cache::NodeCache::default(),
            local,
            config,
            view: None,
            last_heard: BTreeMap::new(),
            outbox: Outbox::new(),
            notices: VecDeque::new(),
            next_check: None,
            last_now: Instant::ZERO,
            known_epoch: 0,
            support: Support::default(),
            term: None,
            next_renew: None,
            minority_since: None,
            keep_waits_in_minority: false,
            announced: None,
            serving_grantor: None,
            announcement: None,
            queries: BTreeMap::new(),
            next_query: 1,
            acquisition_leases_expired: 0,
            wants_grantor: false,
            asked: None,
            transferred: None,
            pending_transfer: None,
            generation: 0,
            handover_from: None,
            early_transfers: Vec::new(),
            borrowed: None,
            started_term: None,
            sabotage_service_without_term: false,
        }
    }

    /// The member's named lock service number `index` (from 1; 0 is the default service that
    /// [`LockService::new`] makes). Its request ids and table queries start at
    /// `index << SERVICE_SHIFT`; under `Majority` it grants under the default service's term,
    /// which the owner passes in before every input (the endpoint does).
    pub fn for_service(local: MemberId, config: LockConfig, index: u64) -> Self {
        let mut service = Self::new(local, config);
        let first = (index << SERVICE_SHIFT) + 1;
        service.client.start_ids_at(first);
        service.next_query = first;
        service.borrowed = (index != 0).then(Authority::default);
        service
    }

    /// The default service's right to grant, to lend to named services (`Majority`).
    pub(crate) fn authority(&mut self, now: Instant) -> Authority {
        self.enter(now);
        // A term that lapsed just now began a new one: its reconciliation asks this member
        // too, and a message to itself goes nowhere unless it is handled here (regression
        // seed 19 of the named-services band, Majority: the grantor lost its own waits).
        self.pump(now);
        let (window, size) = (self.support_window(), self.cluster_size());
        let term = self.term.as_ref().filter(|_| self.grantor.is_active());
        Authority {
            term: term.map(|t| t.term),
            quorum_until: term
                .zip(size)
                .and_then(|(t, size)| t.quorum_until(window, size)),
            grace_end: term.and(self.grace_end()),
            max_term: self.support.max_term,
        }
    }

    /// A named service: takes the default service's right to grant as of `now`. If the term
    /// changed while this service grants, its grantor starts again (reconciles) in the new
    /// term, as the default service's did. `quiet` only records it (a view follows, which
    /// decides).
    pub(crate) fn lend_authority(&mut self, now: Instant, authority: Authority, quiet: bool) {
        if self.borrowed.is_none() || !self.config.policy.is_majority() {
            return;
        }
        self.borrowed = Some(authority);
        if quiet {
            return;
        }
        self.enter(now);
        let restart = self.grantor.is_active() && authority.term != self.started_term;
        if let (true, Some(view)) = (restart, self.view.clone()) {
            if authority.term.is_some() {
                info!(member = %self.local, "the member's grantor term changed; the service reconciles again");
                self.begin_term(now, &view);
            } else {
                self.grantor.stop();
            }
        }
        self.tick_grantor(now);
        self.pump(now);
    }

    /// A service opened in the member's current view takes over since when the member has
    /// been in views without a majority (its waits are refused a lease after that, not a
    /// lease after the service opened: regression seed 869 of the named-services band).
    pub(crate) fn inherit_minority_since(&mut self, other: &LockService) {
        if self.minority_since.is_some() {
            self.minority_since = other.minority_since.or(self.minority_since);
        }
    }

    /// Whether this service grants under a term lent by the default service.
    fn borrows(&self) -> bool {
        self.borrowed.is_some() && self.config.policy.is_majority()
    }

    /// Breaks the protocol on purpose (simulator tests of the checkers only).
    #[cfg(feature = "sim")]
    pub fn set_sabotage(&mut self, sabotage: LockSabotage) {
        self.grantor.sabotage.grant_while_reconciling = sabotage.grant_while_reconciling;
        self.grantor.sabotage.skip_liveness_recheck = sabotage.skip_liveness_recheck;
        self.grantor.table.reuse_tokens = sabotage.reuse_fencing_token;
        self.client.forget_releases = sabotage.forget_pending_releases;
        self.client.anchor_at_receipt = sabotage.anchor_leases_at_receipt;
        self.support.promise_anyone = sabotage.promise_anyone;
        self.keep_waits_in_minority = sabotage.keep_waits_in_minority;
        self.cache.serve_after_return = sabotage.cache_after_return;
        self.cache.repeat_token = sabotage.cache_repeat_token;
        self.sabotage_service_without_term = sabotage.service_without_term;
        self.grantor.table.grant_over_delegations = sabotage.grant_over_delegations;
        self.client.lease_from_receipt = sabotage.lease_from_receipt;
        self.grantor.sabotage.serve_after_handoff = sabotage.serve_after_handoff;
    }

    /// The configuration.
    pub fn config(&self) -> &LockConfig {
        &self.config
    }

    /// Asks for a lock. The request is registered before anything is sent, so it can be
    /// cancelled at once; the answer comes as a [`LockNotice`].
    ///
    /// With [`LockRequest::lease`] `d`, the grantor frees the lock `d` after it grants it on
    /// its clock, and this member reports the hold [`LockNotice::Lost`]
    /// ([`LockLostReason::LeaseExpired`]) strictly before that: at `s + d × lease / (lease +
    /// lease_margin)` on its own clock, where `s` is when it sent the newest message the
    /// grantor had received when it granted (while the request waits, renewals every
    /// `suspend_after / 2` keep `s` recent). Only clock *rates* matter, within the margin of
    /// [`LockConfig::lease_margin`].
    ///
    /// Leases are counted in whole milliseconds: a shorter one (zero included) is one
    /// millisecond.
    pub fn lock(&mut self, now: Instant, request: LockRequest) -> RequestId {
        self.ask(now, request, false)
    }

    /// Asks for a lock like [`LockService::lock`], but asks the grantor not to say that the
    /// request was queued: the grantor queues it as any other, in order, and answers only
    /// with the grant or refusal.
    ///
    /// Each `Queued` costs the grantor a datagram and this member a wake-up in the middle of
    /// every contended handoff. A caller that knows the lock is contended and has no use for
    /// the queue position saves both. A [`LockNotice::Queued`] may still come for it: from a
    /// grantor that predates the flag, from a new grantor that rebuilt its table from this
    /// member's report after a failover (the report does not carry the flag), and through
    /// node caching (a request waiting here behind the node's own grant).
    pub fn lock_quiet(&mut self, now: Instant, request: LockRequest) -> RequestId {
        self.ask(now, request, true)
    }

    fn ask(&mut self, now: Instant, mut request: LockRequest, quiet: bool) -> RequestId {
        // A lease the holder could not hold for a moment would be given back and asked for
        // again without end (found by the `endpoint_input` fuzz smoke: a zero lease at a
        // member that is its own grantor never settled).
        request.lease = request.lease.map(|d| d.max(MIN_LEASE));
        self.enter(now);
        let refuse_at_once = self.minority_since.is_some_and(|since| {
            !request.wait || now.saturating_duration_since(since) >= self.config.lease
        });
        if !refuse_at_once && request.lease.is_none() {
            if let Some(id) = self.cache_lock(now, &request) {
                self.arm_renewal(now);
                self.pump(now);
                return id;
            }
        }
        let id = self.client.lock(
            now,
            request.owner,
            request.name,
            request.mode,
            request.wait,
            request.timeout,
            request.lease,
            quiet,
            &mut self.outbox,
        );
        if refuse_at_once {
            self.refuse_no_quorum(id);
        }
        self.arm_renewal(now);
        self.pump(now);
        id
    }

    /// Withdraws a pending request: this member cannot be granted anything (minority).
    fn refuse_no_quorum(&mut self, request: RequestId) {
        if let Some(name) = self.client.pending_name(request) {
            self.client.cancel(request, &mut self.outbox);
            self.notices.push_back(LockNotice::Refused {
                request,
                name,
                reason: Refusal::NoQuorum,
            });
        }
    }

    /// `Majority`: refuses every waiting request once the member has been in a minority view
    /// for a lease.
    fn refuse_waits_in_minority(&mut self, now: Instant) {
        if self.keep_waits_in_minority {
            return;
        }
        let expired = self
            .minority_since
            .is_some_and(|since| now.saturating_duration_since(since) >= self.config.lease);
        if expired {
            for request in self.client.pending_requests().copied().collect::<Vec<_>>() {
                self.refuse_no_quorum(request);
            }
        }
    }

    /// Withdraws a request (the caller's future was dropped). If the grant races the
    /// cancellation (in flight, or already arrived but not yet seen by the caller), the lock is
    /// released: nothing stays held or queued. A held lock is released the same way (a guard
    /// dropped): the release is sent *lazy*, since nobody waits for its acknowledgement, and
    /// the grantor may hold that back for up to [`LAZY_ACK_DELAY`] to send it with its next
    /// message to this member.
    pub fn cancel(&mut self, now: Instant, request: RequestId) {
        self.enter(now);
        if self.cache_cancel(now, request) {
            self.pump(now);
            return;
        }
        if !self.client.cancel(request, &mut self.outbox) {
            // Cancelling a hold releases it, and nobody waits for the acknowledgement.
            self.client.unlock(request, true, &mut self.outbox);
        }
        self.pump(now);
    }

    /// Releases the lock acquired by `request`. Returns at once; the release is resent to a
    /// new grantor until acknowledged ([`LockNotice::Released`]).
    ///
    /// # Errors
    /// [`NotHeld`] if `request` holds nothing here (never granted, already released or lost).
    pub fn unlock(&mut self, now: Instant, request: RequestId) -> Result<(), NotHeld> {
        self.release(now, request, false)
    }

    /// Releases the lock acquired by `request` for a caller that will not wait for the
    /// acknowledgement (a guard dropped rather than unlocked): as [`LockService::unlock`], but
    /// the release is sent *lazy*, and the grantor may hold its acknowledgement back for up to
    /// [`LAZY_ACK_DELAY`] to send it with its next message to this member instead of in a
    /// datagram of its own. [`LockNotice::Released`] still comes, that much later at most.
    ///
    /// # Errors
    /// [`NotHeld`] if `request` holds nothing here (never granted, already released or lost).
    pub fn unlock_lazy(&mut self, now: Instant, request: RequestId) -> Result<(), NotHeld> {
        self.release(now, request, true)
    }

    /// [`LockService::unlock`] (`lazy` false) or [`LockService::unlock_lazy`] (true).
    pub(crate) fn release(
        &mut self,
        now: Instant,
        request: RequestId,
        lazy: bool,
    ) -> Result<(), NotHeld> {
        self.enter(now);
        if self.cache_unlock(now, request).is_some() {
            self.pump(now);
            return Ok(());
        }
        if !self.client.unlock(request, lazy, &mut self.outbox) {
            return Err(NotHeld(request));
        }
        self.pump(now);
        Ok(())
    }

    /// A reentrant re-lock with a lease: the lease of the hold of `request` becomes
    /// `max(remaining, lease)` (a hold without a lease keeps none). When `lease` reaches past
    /// the current deadline the grantor is asked, and this member's deadline moves once it
    /// confirms (to `s + lease × lease / (lease + lease_margin)`, `s` the send time of the
    /// ask), so the grantor's deadline is always the later one.
    ///
    /// # Errors
    /// [`NotHeld`] if `request` holds nothing here.
    pub fn extend_lease(
        &mut self,
        now: Instant,
        request: RequestId,
        lease: Duration,
    ) -> Result<(), NotHeld> {
        self.enter(now);
        if !self
            .client
            .extend_lease(now, request, lease, &mut self.outbox)
        {
            return Err(NotHeld(request));
        }
        self.pump(now);
        Ok(())
    }

    /// Asks for the grantor role of this member's view (Geode's `becomeLockGrantor`): the
    /// grantor hands its table over directly, with no reconciliation, and this member then
    /// grants its own owners' requests without a message. Requests that reach the former
    /// grantor meanwhile are answered "not grantor, ask X" and resent here. Of concurrent
    /// askers the last one wins. The wish outlives view changes: a view change falls back to
    /// the new coordinator's reconciliation, and this member asks the new grantor again, until
    /// another member takes the role by asking for it. Done once
    /// [`LockService::serving_grantor`] is this member ([`LockNotice::GrantorServing`]).
    ///
    /// # Errors
    /// [`TransferRefused::Majority`] under `Majority`.
    pub fn become_grantor(&mut self, now: Instant) -> Result<(), TransferRefused> {
        if self.config.policy.is_majority() {
            return Err(TransferRefused::Majority);
        }
        self.enter(now);
        self.wants_grantor = true;
        self.asked = None;
        self.ask_for_grantor();
        self.pump(now);
        Ok(())
    }

    /// Whether `become_grantor` was asked and no other member took the role since.
    pub fn wants_grantor(&self) -> bool {
        self.wants_grantor
    }

    /// Sends the current grantor a transfer request if this member wants the role and has
    /// not asked that grantor in this view yet.
    fn ask_for_grantor(&mut self) {
        if !self.wants_grantor {
            return;
        }
        let (Some(view), Some(grantor)) = (self.view.as_ref(), self.client.grantor()) else {
            return;
        };
        if *grantor == self.local {
            return;
        }
        let key = (grantor.clone(), ViewKey::of(view));
        if self.asked.as_ref() == Some(&key) {
            return;
        }
        let request = LockMessage::TransferRequest {
            epoch: view.epoch(),
            coordinator: view.coordinator().incarnation(),
        };
        self.asked = Some(key);
        self.outbox.push_back((grantor.clone(), request));
    }

    /// The grantor side of a transfer: hands the table to the last asker once serving.
    fn try_transfer(&mut self, now: Instant) {
        let Some(to) = self.pending_transfer.clone() else {
            return;
        };
        let Some(view) = self.view.clone() else {
            return;
        };
        if !view.contains(&to) || to == self.local {
            self.pending_transfer = None;
            return;
        }
        if !self.grantor.is_serving() {
            return;
        }
        let ctx = self.ctx(now, &view);
        let Some(handoff) = self.grantor.hand_off(&ctx) else {
            return;
        };
        self.pending_transfer = None;
        self.wants_grantor = false;
        self.transferred = Some((ViewKey::of(&view), to.clone()));
        self.outbox.push_back((to, handoff));
        self.set_serving_grantor(None);
        // Follow the new grantor only once it announces itself: what it sent before that
        // (grants of an earlier turn of its, in this view) is stale, and only its own
        // announcement is ordered after all of it.
        self.client.unfollow();
        self.drop_stale_queries();
        let _ = now;
    }

    /// A transfer request, a handoff, an announcement of a transfer or a "not grantor".
    fn on_transfer(&mut self, now: Instant, from: &MemberId, message: LockMessage) {
        if let LockMessage::Transferred {
            epoch,
            coordinator,
            generation,
        } = &message
        {
            let installed = self.view.as_deref().map(View::epoch);
            if installed.is_none_or(|installed| *epoch > installed) {
                // Before its view is installed here (the new grantor may even be new to the
                // view; this member may have no view yet, a joiner: regression seed 264 of
                // the named-services band, harsh): applied when that very view is.
                let key = ViewKey {
                    epoch: *epoch,
                    coordinator: *coordinator,
                };
                match self.early_transfers.iter_mut().find(|(k, _, _)| *k == key) {
                    Some(known) if known.1 >= *generation => {}
                    Some(known) => *known = (key, *generation, from.clone()),
                    None => {
                        self.early_transfers.push((key, *generation, from.clone()));
                        if self.early_transfers.len() > EARLY_TRANSFERS_MAX {
                            // The lowest epoch is the least likely to be installed next.
                            self.early_transfers
                                .sort_by_key(|(k, _, _)| Reverse(k.epoch));
                            self.early_transfers.truncate(EARLY_TRANSFERS_MAX);
                        }
                    }
                }
                return;
            }
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        if self.config.policy.is_majority() || !view.contains(from) || from == &self.local {
            return;
        }
        // Every transfer message names its view by epoch and coordinator: views of different
        // coordinators may share an epoch and members (issue 30, finding 2).
        let this_view = ViewKey::of(&view);
        if transfer_view(&message) != Some(this_view) {
            debug!(%from, "transfer message of another view dropped");
            return;
        }
        let coordinator = this_view.coordinator;
        match message {
            LockMessage::TransferRequest { epoch, .. } => {
                match (&self.transferred, self.client.grantor()) {
                    (Some((k, to)), _) if *k == this_view => {
                        let reply = LockMessage::NotGrantor {
                            epoch,
                            coordinator,
                            grantor: to.clone(),
                            generation: self.grantor.generation + 1,
                        };
                        self.outbox.push_back((from.clone(), reply));
                    }
                    (_, Some(g)) if *g == self.local => {
                        debug!(member = %self.local, asker = %from, "grantor role asked for");
                        self.pending_transfer = Some(from.clone());
                        self.try_transfer(now);
                    }
                    (_, Some(g)) => {
                        let reply = LockMessage::NotGrantor {
                            epoch,
                            coordinator,
                            grantor: g.clone(),
                            generation: self.generation,
                        };
                        self.outbox.push_back((from.clone(), reply));
                    }
                    (_, None) => {}
                }
            }
            LockMessage::Handoff {
                epoch, generation, ..
            } if !self.grantor.is_active() && generation > self.generation => {
                // From the one member that served in this view (whoever this member follows
                // now: an announcement may have overtaken the handoff).
                let ctx = self.ctx(now, &view);
                self.grantor.adopt(&ctx, message, &mut self.outbox);
                self.generation = generation;
                self.transferred = None;
                self.client
                    .follow(now, self.local.clone(), &mut self.outbox);
                self.report_holds_to(now, self.local.clone(), epoch);
                for member in view.members().iter().filter(|m| **m != self.local) {
                    let announce = LockMessage::Transferred {
                        epoch,
                        coordinator,
                        generation,
                    };
                    self.outbox.push_back((member.clone(), announce));
                }
                self.set_serving_grantor(Some(self.local.clone()));
                self.drop_stale_queries();
            }
            LockMessage::Handoff { .. } => {
                debug!(%from, "lock table handoff for another view or grantor; dropped (the next reconciliation rebuilds the table)");
            }
            LockMessage::Transferred {
                epoch, generation, ..
            } if generation > self.generation => {
                self.generation = generation;
                if self.grantor.is_active() {
                    // Handed over meanwhile (or never asked to): the announcement is stale
                    // for us, our own handoff tells who serves.
                    return;
                }
                // Also when already following it: what was sent before it served (after a
                // "not grantor" pointed here) was dropped, so everything is sent again.
                self.client.follow(now, from.clone(), &mut self.outbox);
                self.report_holds_to(now, from.clone(), epoch);
                if self.wants_grantor && self.transferred.is_some() {
                    // We handed the role to someone else since asking: the last asker won.
                    self.wants_grantor = false;
                }
                self.set_serving_grantor(Some(from.clone()));
                self.drop_stale_queries();
            }
            LockMessage::NotGrantor { generation, .. }
                if self.client.grantor() == Some(from) && generation > self.generation =>
            {
                // Wait for the new grantor's own announcement before following it (see
                // `try_transfer`): our requests go there then.
                self.client.unfollow();
                self.set_serving_grantor(None);
                self.drop_stale_queries();
            }
            _ => {}
        }
    }

    /// UNLOCK_ALL for one local owner: releases every lock it holds and withdraws every
    /// request it has pending. Each release is acknowledged and retried like an `unlock`.
    /// Returns how many locks were released.
    pub fn unlock_all(&mut self, now: Instant, owner: u64) -> usize {
        self.enter(now);
        let cached = self.cache_unlock_all(now, owner);
        let held: Vec<RequestId> = self
            .client
            .held()
            .filter(|(_, h)| h.owner == owner)
            .map(|(r, _)| *r)
            .collect();
        for request in &held {
            self.client.unlock(*request, false, &mut self.outbox);
        }
        let pending: Vec<RequestId> = self
            .client
            .pending_requests()
            .copied()
            .filter(|r| self.client.pending_owner(*r) == Some(owner))
            .collect();
        for request in pending {
            self.client.cancel(request, &mut self.outbox);
        }
        self.pump(now);
        held.len() + cached
    }

    /// The member is leaving: every held lock is reported lost ([`LockLostReason::Shutdown`])
    /// and released at the grantor, and every pending request is withdrawn
    /// ([`Refusal::Shutdown`]). Call it before the membership layer leaves, so no lock is held
    /// by a member the grantor no longer counts.
    pub fn shutdown(&mut self, now: Instant) {
        self.give_up(now, LockLostReason::Shutdown, Refusal::Shutdown);
    }

    /// A named service destroyed on this member: every held lock is released and reported
    /// lost ([`LockLostReason::ServiceDestroyed`]), every pending request withdrawn and refused
    /// ([`Refusal::Destroyed`]). The service keeps its part in the cluster (as grantor, if it
    /// is, and in reconciliations), holding nothing for this member.
    pub fn destroy(&mut self, now: Instant) {
        self.give_up(now, LockLostReason::ServiceDestroyed, Refusal::Destroyed);
    }

    /// The member leaves its view (call it after [`LockService::shutdown`]): it grants nothing
    /// more, whatever reaches it. A coordinator that hands its view to the next member
    /// (`next`: [`crate::gms::Gms::handover`]) hands its lock table over with it under
    /// `Available`, to the coordinator of `next`, which then serves at once instead of waiting
    /// for every member's report. The endpoint sends the handoff after the view, on the same
    /// stream, so the successor has installed the view when it arrives. (Under `Majority` the
    /// successor begins a term of its own, with its reconciliation and grace period.)
    pub fn leave(&mut self, now: Instant, next: Option<&View>) {
        self.enter(now);
        let handing = self.view.clone().zip(next).filter(|(view, next)| {
            !self.config.policy.is_majority()
                && view.coordinator() == &self.local
                && self.grantor.is_serving()
                && !self.handed_over()
                && !next.contains(&self.local)
        });
        if let Some((view, next)) = handing {
            let ctx = self.ctx(now, &view);
            if let Some(handoff) = self.grantor.hand_off_in(&ctx, next, 0) {
                debug!(member = %self.local, successor = %next.coordinator(), "leaving: lock table handed to the successor");
                self.outbox.push_back((next.coordinator().clone(), handoff));
            }
        }
        self.grantor.stop();
        self.pending_transfer = None;
        self.wants_grantor = false;
        self.set_serving_grantor(None);
        self.pump(now);
    }

    fn give_up(&mut self, now: Instant, lost: LockLostReason, refusal: Refusal) {
        self.enter(now);
        self.cache_shutdown(lost, refusal);
        self.client
            .lose_all(lost, &mut self.outbox, &mut self.notices);
        for request in self.client.pending_requests().copied().collect::<Vec<_>>() {
            if let Some(name) = self.client.pending_name(request) {
                self.client.cancel(request, &mut self.outbox);
                self.notices.push_back(LockNotice::Refused {
                    request,
                    name,
                    reason: refusal,
                });
            }
        }
        self.pump(now);
    }

    /// Records a heartbeat from `from`. Only heartbeats should be fed here: members send them
    /// only to the members of their view, so hearing one from the grantor means it still
    /// counts us in (acknowledgements of the reliable layer do not mean that).
    pub fn note_alive(&mut self, now: Instant, from: &MemberId) {
        if let Some(at) = self.last_heard.get_mut(from) {
            *at = (*at).max(now);
        }
    }

    /// Tells the lock layer the highest view epoch this member has heard of (the simulator's
    /// token checker uses it to tell a protocol bug from a cluster that lost its memory).
    pub fn observe_epoch(&mut self, now: Instant, epoch: u64) {
        let _ = now;
        self.known_epoch = self.known_epoch.max(epoch);
    }

    /// A new view was installed at this member.
    pub fn handle_view(&mut self, now: Instant, view: &View, origin: ViewOrigin) {
        self.enter(now);
        self.grantor.lazy_acks.keep_members_of(view);
        // A transfer lasts for its view: a view change falls back to the coordinator's
        // reconciliation (and a member that wants the role asks the new grantor again).
        self.transferred = None;
        self.pending_transfer = None;
        self.asked = None;
        self.generation = 0;
        let previous_grantor = self.client.grantor().cloned();
        // A view handed to this member by its coordinator on leaving: that coordinator's
        // table may follow it (`LockService::leave`).
        self.handover_from = self
            .view
            .as_ref()
            .map(|previous| previous.coordinator())
            .filter(|previous| {
                origin == ViewOrigin::Received
                    && view.coordinator() == &self.local
                    && !view.contains(previous)
            })
            .map(|previous| (ViewKey::of(view), previous.clone()));
        // Under `Available`, a member that comes into the view may hold locks of another
        // lineage: one admitted as a joiner may have led a partition of its own and granted
        // there (a join request of its, sent long before and delivered after the partition
        // healed, did that: regression seed 1200060 of the harsh node-cache band), and what a
        // join request says of its sender is only true when it was sent. So the coordinator
        // reconciles every view that admits members, as after a merge: the admitted member's
        // holds meet the others' in a view of their own, through the duplicate rule. (Under
        // `Majority` a member outside every majority holds nothing, and `gained_majority`
        // covers the rest.)
        let admits_members = !self.config.policy.is_majority()
            && self
                .view
                .as_ref()
                .is_some_and(|previous| view.members().iter().any(|m| !previous.contains(m)));
        let could_grant = self
            .view
            .as_ref()
            .is_some_and(|v| self.config.policy.allows(v.len()));
        let mut heard = BTreeMap::new();
        for member in view.members() {
            heard.insert(
                member.clone(),
                self.last_heard.get(member).copied().unwrap_or(now),
            );
        }
        self.last_heard = heard;
        self.view = Some(std::sync::Arc::new(view.clone()));
        self.client.on_view(now, view, &mut self.outbox);
        let announced = self
            .announcement
            .as_ref()
            .is_some_and(|(by, epoch)| by == view.coordinator() && *epoch >= view.epoch());
        let still_serving = self.serving_grantor.as_ref() == Some(view.coordinator());
        self.drop_stale_queries();
        if self.config.policy.allows(view.len()) && (announced || still_serving) {
            self.set_serving_grantor(Some(view.coordinator().clone()));
        } else {
            self.set_serving_grantor(None);
        }
        if previous_grantor.as_ref() != Some(view.coordinator()) {
            self.support.forget_echo();
        }
        if self.config.policy.allows(view.len()) {
            self.minority_since = None;
        } else if self.config.policy.is_majority() {
            self.minority_since.get_or_insert(now);
        }
        if !self.config.policy.allows(view.len()) && self.client.has_held() {
            debug!(member = %self.local, view = %view, "minority view: locks lost");
            self.client.lose_all(
                LockLostReason::Minority,
                &mut self.outbox,
                &mut self.notices,
            );
        }
        let coordinator = view.coordinator() == &self.local;
        // Gaining a majority is like becoming grantor: members that just joined may hold
        // locks of another lineage, and their leases must run out first.
        let gained_majority = self.config.policy.is_majority()
            && !could_grant
            && self.config.policy.allows(view.len());
        let became = previous_grantor.as_ref() != Some(&self.local)
            || !self.grantor.is_active()
            || gained_majority
            || (self.borrows() && self.borrowed.and_then(|a| a.term) != self.started_term);
        // A grantor whose tokens ran out starts again at the new view's epoch (`Available`).
        let exhausted = self.grantor.exhausted();
        if coordinator && (became || origin == ViewOrigin::Merged || admits_members || exhausted) {
            self.begin_term(now, view);
        } else if coordinator {
            self.keep_term(now, view);
        } else {
            self.grantor.stop();
            self.term = None;
            self.started_term = None;
        }
        let this_view = ViewKey::of(view);
        let early = std::mem::take(&mut self.early_transfers);
        let (ours, later): (Vec<_>, Vec<_>) = early
            .into_iter()
            .filter(|(key, _, _)| *key == this_view || key.epoch > view.epoch())
            .partition(|(key, _, _)| *key == this_view);
        self.early_transfers = later;
        for (key, generation, grantor) in ours {
            let announce = LockMessage::Transferred {
                epoch: key.epoch,
                coordinator: key.coordinator,
                generation,
            };
            self.on_transfer(now, &grantor, announce);
        }
        self.pump(now);
    }

    /// Becomes the grantor afresh: under `Majority` a new term above every term heard of (its
    /// tokens exceed every earlier grantor's), then reconciliation.
    fn begin_term(&mut self, now: Instant, view: &View) {
        if self.borrows() {
            self.started_term = self.borrowed.and_then(|a| a.term);
        } else if self.config.policy.is_majority() {
            // Above every term heard of, and every token's term seen (a term whose tokens
            // ran out gives way to a higher one).
            let seen = self.grantor.table.last_token().epoch();
            let term = self.support.max_term.max(seen).saturating_add(1);
            self.support.observe_term(term);
            self.term = Some(Term::new(term));
            self.refresh_own_support(now);
        }
        let ctx = self.ctx(now, view);
        self.grantor.start(&ctx, &mut self.outbox);
        if self.borrows() {
            // A named service starts in the member's current term: every hold of the
            // service that no grantor of this term granted or renewed was last confirmed
            // while an earlier term had support, which ended before this term's quorum, so it
            // ran out by the term's grace end. It waits for that, not a grace of its own.
            let grace_end = self.borrowed.and_then(|a| a.grace_end);
            self.grantor.set_grace(grace_end);
        }
    }

    /// A view change that keeps this member grantor (members removed or admitted, no merge,
    /// no majority gained): the term goes on, and so do its tokens. A new term fences a
    /// previous grantor, and there is none. Removed members' holds are dropped and their
    /// locks fenced (`Grantor::view_changed`); their support no longer counts (it would still
    /// be sound, since a promise binds its member whatever its view, but the term then rests
    /// on members of its view only); admitted members count once they echo a probe of this
    /// term, like any member. A term left without a majority lapses as always.
    fn keep_term(&mut self, now: Instant, view: &View) {
        let (window, size) = (self.support_window(), self.cluster_size());
        if let (Some(term), Some(size)) = (self.term.as_mut(), size) {
            term.keep_supporters(view, window, size);
        }
        if self.term.as_ref().is_some_and(|t| t.lapsed(now)) {
            info!(member = %self.local, "grantor term lost its majority with the view; starting a new term");
            self.begin_term(now, view);
            return;
        }
        let ctx = self.ctx(now, view);
        self.grantor.view_changed(&ctx, &mut self.outbox);
    }

    /// `Majority`: the lease fields of a heartbeat to `to`: a probe of our term if we are the
    /// grantor, the echo of our grantor's newest probe if `to` is our grantor. `None` under
    /// `Available`. The endpoint calls it for every heartbeat it sends.
    pub fn lease_beat(&mut self, now: Instant, to: &MemberId) -> Option<LeaseBeat> {
        if !self.config.policy.is_majority() || self.borrows() {
            return None;
        }
        self.enter(now);
        self.refresh_own_support(now);
        let probe = match self.term.as_mut() {
            Some(term) if self.grantor.is_active() => Some(term.probe(now)),
            _ => None,
        };
        let to_grantor = self.view.as_ref().is_some_and(|v| v.coordinator() == to)
            || self.support.promise_anyone;
        let (mut echo, mut refused) = (None, None);
        if to_grantor {
            refused = self
                .support
                .owed_term(to)
                .and_then(|term| self.support.refuses(to, term));
            let (born_wait, duration) = (self.born_wait(), self.config.support_lease);
            echo = self.support.echo_for(now, to, born_wait, duration);
        }
        Some(LeaseBeat {
            max_term: self.support.max_term,
            probe,
            echo,
            refused,
        })
    }

    /// `Majority`: the lease fields of a heartbeat from `from`.
    pub fn handle_lease_beat(&mut self, now: Instant, from: &MemberId, beat: LeaseBeat) {
        if !self.config.policy.is_majority() || self.borrows() {
            return;
        }
        let terms = [
            Some(beat.max_term),
            beat.probe.map(|p| p.term),
            beat.echo.map(|p| p.term),
            beat.refused,
        ];
        if terms.into_iter().flatten().any(|t| t > MAX_TERM) {
            // Terms are the high half of fencing tokens; a member only ever adds one at a
            // time. Such a value is forged or corrupt.
            debug!(%from, "lease beat with an impossible term; dropped");
            return;
        }
        self.enter(now);
        self.support.observe_term(beat.max_term);
        if let Some(probe) = beat.probe {
            let ours = self.view.as_ref().is_some_and(|v| v.coordinator() == from);
            if ours || self.support.promise_anyone {
                self.support.probed(from, probe);
            } else {
                self.support.observe_term(probe.term);
            }
        }
        // Support counts from members of our view only (a removed member's stopped counting
        // when it was removed; `keep_term`).
        let member = self.view.as_ref().is_some_and(|v| v.contains(from));
        if let (Some(echo), Some(term), true) = (beat.echo, self.term.as_mut(), member) {
            term.echoed(from, echo);
        }
        if let Some(promised) = beat.refused {
            // The term is unusable: `from` promised an equal term to another grantor.
            self.support.observe_term(promised);
        }
        // Only a refusal makes our term unusable; merely hearing of a higher term does not
        // (two coordinators that cannot hear each other would otherwise outbid each other
        // through the members for ever). And only a term that no majority supports yet: a
        // refusal is for liveness (a term some members can never support may never reach a
        // majority), never for safety, which rests on the support counted. A term a majority
        // supports keeps serving while it does (a member that restarted and refuses the term
        // it promised in its past life then stops nothing); once that support lapses the
        // grantor begins a term above every refused one anyway.
        let superseded = self.grantor.is_active()
            && self.term.as_ref().is_some_and(|t| {
                t.quorum_at.is_none() && beat.refused.is_some_and(|p| p >= t.term)
            });
        if superseded {
            // Another grantor began a higher term: members that promised it will not support
            // ours. Begin a higher one, with a fresh reconciliation (that grantor may have
            // granted meanwhile).
            if let Some(view) = self.view.clone() {
                info!(member = %self.local, "a higher grantor term exists; starting a new term");
                self.begin_term(now, &view);
            }
        }
        self.note_quorum(now);
        self.tick_grantor(now);
        self.pump(now);
    }

    /// Handles a lock message delivered reliably from `from`.    /// Handles a lock message delivered reliably from `from`.
    pub fn handle_message(&mut self, now: Instant, from: &MemberId, message: LockMessage) {
        self.enter(now);
        self.dispatch(now, from, message);
        self.pump(now);
    }

    /// Advances timers: request timeouts, leases, reconciliation, fenced locks.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.enter(now);
        self.client
            .expire_requests(now, &mut self.outbox, &mut self.notices);
        self.refuse_waits_in_minority(now);
        self.refresh_own_support(now);
        self.tick_grantor(now);
        if self.next_renew.is_some_and(|t| now >= t) {
            self.client.renew(now, &mut self.outbox);
            self.next_renew = None;
            self.arm_renewal(now);
        }
        self.check_leases(now);
        self.acquisition_leases_expired +=
            self.client
                .expire_acquisition_leases(now, &mut self.outbox, &mut self.notices);
        self.arm_renewal(now);
        self.cache_timeout(now);
        self.pump(now);
    }

    fn tick_grantor(&mut self, now: Instant) {
        if let Some(view) = self.view.clone() {
            let ctx = self.ctx(now, &view);
            self.grantor.handle_timeout(&ctx, &mut self.outbox);
        }
    }

    /// `Majority`: schedules the next renewal if there is anything to renew.
    fn arm_renewal(&mut self, now: Instant) {
        let wanted = if self.config.policy.is_majority() {
            self.client.wants_renewal()
        } else {
            self.client.has_leased_pending()
        };
        if !wanted {
            self.next_renew = None;
        } else if self.next_renew.is_none() {
            let interval = (self.config.suspend_after / 2).max(Duration::from_millis(1));
            self.next_renew = Some(now + interval);
        }
    }

    /// `Majority`: a grantor supports its own term while it may (it counts towards the
    /// majority like any member).
    fn refresh_own_support(&mut self, now: Instant) {
        if self.borrows() {
            return;
        }
        let (born_wait, duration) = (self.born_wait(), self.config.support_lease);
        let Some(term) = self.term.as_mut() else {
            return;
        };
        if !self.grantor.is_active() {
            return;
        }
        if self
            .support
            .promise_self(now, &self.local, term.term, born_wait, duration)
        {
            term.supported(&self.local, now);
        }
        self.note_quorum(now);
    }

    /// Records when the term's support first reached a majority (the grace period runs from
    /// then: every earlier grantor's support had ended by then) and until when it lasts.
    fn note_quorum(&mut self, now: Instant) {
        let (window, size) = (self.support_window(), self.cluster_size());
        if let (Some(term), Some(size)) = (self.term.as_mut(), size) {
            let first = term.quorum_at.is_none();
            if term.update(now, window, size) && first {
                debug!(member = %self.local, term = term.term, "grantor term supported by a majority");
            }
        }
    }

    /// Every input starts here: the process's birth, and whether this grantor's term lost its
    /// majority since the last input. A term that lapsed never serves again: while it lacked
    /// support, a later term may have served (a member in both majorities can restart and
    /// forget its promise), so the grantor begins a new term, with a new reconciliation and
    /// a new grace period.
    ///
    /// A term whose tokens ran out (`Grantor::exhausted`) also gives way to a new term: its
    /// number is higher, so its tokens exceed every token of the old one.
    fn enter(&mut self, now: Instant) {
        self.support.touch(now);
        let lapsed = self.grantor.is_active() && self.term.as_ref().is_some_and(|t| t.lapsed(now));
        let exhausted =
            self.config.policy.is_majority() && !self.borrows() && self.grantor.exhausted();
        if lapsed || exhausted {
            if let Some(view) = self.view.clone() {
                if lapsed {
                    info!(member = %self.local, "grantor term lost its majority; starting a new term");
                } else {
                    info!(member = %self.local, "grantor term used up its fencing tokens; starting a new term");
                }
                self.begin_term(now, &view);
            }
        }
    }

    /// How long a grantor counts a member's support from the send time of the probe echoed.
    fn support_window(&self) -> Duration {
        scale(
            self.config.support_lease,
            self.config.lease,
            self.config.lease + self.config.lease_margin,
        )
    }

    /// How long a new process waits before it supports anyone (it may have promised in a
    /// past life, on a clock that may run slower than ours).
    fn born_wait(&self) -> Duration {
        scale(
            self.config.support_lease,
            self.config.lease + self.config.lease_margin,
            self.config.lease,
        )
    }

    fn cluster_size(&self) -> Option<usize> {
        match self.config.policy {
            PartitionPolicy::Majority { cluster_size } => Some(cluster_size),
            PartitionPolicy::Available => None,
        }
    }

    /// Whether the grantor may vouch for holds now.
    fn lease_ok(&self, now: Instant) -> bool {
        let Some(size) = self.cluster_size() else {
            return true;
        };
        if let Some(lent) = self.borrowed {
            if self.sabotage_service_without_term {
                return true;
            }
            return lent.term.is_some()
                && lent.term == self.started_term
                && lent.quorum_until.is_some_and(|until| now < until);
        }
        self.term
            .as_ref()
            .is_some_and(|t| t.has_quorum(now, self.support_window(), size))
    }

    /// `Majority`: when the new term's grace period ends (`None` before a majority supported
    /// it).
    fn grace_end(&self) -> Option<Instant> {
        if let Some(lent) = self.borrowed.filter(|_| self.config.policy.is_majority()) {
            if self.sabotage_service_without_term {
                return Some(Instant::ZERO);
            }
            return lent.grace_end;
        }
        let fence = self.config.lease + self.config.lease_margin;
        self.term.as_ref()?.quorum_at.map(|q| q + fence)
    }

    /// The next message to send (never to this member itself).
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<(MemberId, LockMessage)> {
        self.outbox.pop_front()
    }

    /// The next notice for an owner.
    #[must_use]
    pub fn poll_notice(&mut self) -> Option<LockNotice> {
        self.notices.pop_front()
    }

    /// When [`LockService::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let majority = self.config.policy.is_majority();
        [
            self.client.next_deadline(),
            self.grantor.poll_timeout(self.last_now),
            self.next_check,
            self.next_renew,
            majority
                .then(|| self.client.next_expiry(self.config.lease))
                .flatten(),
            self.grace_end().filter(|t| *t > self.last_now),
            self.minority_since
                .filter(|_| self.client.pending_requests().next().is_some())
                .map(|since| since + self.config.lease),
            self.cache_next_timeout(),
            self.client.next_acquisition_expiry(),
            self.grantor.lazy_acks.next_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The status of the lock acquired by `request`, if this member holds it.
    pub fn status(&self, now: Instant, request: RequestId) -> Option<HoldStatus> {
        self.cache_status(now, request).or_else(|| {
            self.client
                .held_lock(request)
                .filter(|h| h.owner != NODE_OWNER)
                .map(|h| self.hold_status(now, h))
        })
    }

    /// Every lock held on this member, with its status at `now`.
    pub fn holds(&self, now: Instant) -> Vec<HoldInfo> {
        let mut holds = self.cache_holds(now);
        holds.extend(
            self.client
                .held()
                .filter(|(_, h)| h.owner != NODE_OWNER)
                .map(|(request, h)| HoldInfo {
                    request: *request,
                    name: h.name.clone(),
                    owner: h.owner,
                    mode: h.mode,
                    token: h.token,
                    granted_in: h.granted_in,
                    granted_by: h.granted_by.clone(),
                    status: self.hold_status(now, h),
                }),
        );
        holds
    }

    /// The requests whose grants this member holds at the protocol level: node grants
    /// included, the local holds taken from them not (what the grantor's table lists).
    pub fn member_holds(&self) -> Vec<RequestId> {
        self.client.held().map(|(r, _)| *r).collect()
    }

    /// Requests of this member's owners still waiting for an answer: at the grantor, or
    /// queued at this member behind a local holder of a cached lock.
    pub fn pending_requests(&self) -> Vec<RequestId> {
        let mut pending: Vec<RequestId> = self
            .client
            .pending_requests()
            .copied()
            .filter(|r| self.client.pending_owner(*r) != Some(NODE_OWNER))
            .collect();
        pending.extend(self.cache_queued());
        pending
    }

    /// Releases of this member not yet acknowledged.
    pub fn pending_releases(&self) -> usize {
        self.client.pending_releases()
    }

    /// Whether this member is the grantor and serving (not reconciling).
    pub fn is_serving(&self) -> bool {
        self.grantor.is_serving()
    }

    /// Whether this member is the grantor and reconciling.
    pub fn is_reconciling(&self) -> bool {
        self.grantor.is_reconciling()
    }

    /// The grantor's table (empty unless this member is the grantor): lock, owner, request,
    /// mode of every hold.
    pub fn grantor_holds(&self) -> Vec<(LockName, OwnerId, RequestId, LockMode)> {
        self.grantor
            .holds()
            .map(|(n, o, r, m)| (n.clone(), o.clone(), r, m))
            .collect()
    }

    /// Counters of the grantor role.
    pub fn grantor_stats(&self) -> GrantorStats {
        self.grantor.stats
    }

    /// How many holds of this member were lost because their own lease
    /// ([`LockRequest::lease`]) ran out.
    pub fn leases_expired(&self) -> u64 {
        self.acquisition_leases_expired
    }

    /// Takes the grants made since the last call, in order, with the highest epoch this
    /// member knew of at each (simulator token checker), and each grant's number (see
    /// [`CachedGrant::after`]).
    #[cfg(feature = "sim")]
    pub fn take_grant_log(&mut self) -> Vec<(u64, LockName, FencingToken, u64, LockMode)> {
        let known = self.known_for_tokens();
        std::mem::take(&mut self.grantor.grant_log)
            .into_iter()
            .map(|(seq, name, token, mode)| (seq, name, token, known, mode))
            .collect()
    }

    /// The highest epoch (`Available`) or term (`Majority`) this member knows of.
    #[cfg(feature = "sim")]
    fn known_for_tokens(&self) -> u64 {
        if let Some(lent) = self.borrowed.filter(|_| self.config.policy.is_majority()) {
            lent.max_term
        } else if self.config.policy.is_majority() {
            self.support.max_term
        } else {
            self.known_epoch
        }
    }

    /// Takes the local grants made from node grants since the last call, in order, with the
    /// highest epoch (or term) this member knew of at each (simulator token checker).
    #[cfg(feature = "sim")]
    pub fn take_cached_grant_log(&mut self) -> Vec<(CachedGrant, u64)> {
        let known = self.known_for_tokens();
        std::mem::take(&mut self.cache.grant_log)
            .into_iter()
            .map(|grant| (grant, known))
            .collect()
    }

    fn ctx<'a>(&self, now: Instant, view: &'a View) -> Ctx<'a> {
        Ctx {
            now,
            view,
            policy_ok: self.config.policy.allows(view.len())
                && self.lease_ok(now)
                && (!self.config.policy.is_majority()
                    || self.grantor.sabotage.grant_while_reconciling
                    || self.grace_end().is_some_and(|t| now >= t)),
            lease_ok: self.lease_ok(now),
            term: if self.borrows() {
                self.started_term
            } else {
                self.term.as_ref().map(|t| t.term)
            },
            quorum: match self.config.policy {
                PartitionPolicy::Majority { cluster_size } => Some(cluster_size),
                PartitionPolicy::Available => None,
            },
            fence: self
                .config
                .policy
                .is_majority()
                .then(|| self.config.lease + self.config.lease_margin),
            grace_end: self
                .config
                .policy
                .is_majority()
                .then(|| self.grace_end())
                .flatten(),
            reconcile_timeout: self.config.reconcile_timeout,
            drift: (
                self.config.lease + self.config.lease_margin,
                self.config.lease,
            ),
        }
    }

    fn grantor_silence(&self, now: Instant) -> Option<Duration> {
        let grantor = self.client.grantor()?;
        if *grantor == self.local {
            return Some(Duration::ZERO);
        }
        self.last_heard
            .get(grantor)
            .map(|t| now.saturating_duration_since(*t))
    }

    /// What the owner of a hold leased from `leased_from` should believe at `now`.
    ///
    /// `Majority`: held while the lease was renewed within `suspend_after`, suspended until the
    /// lease runs out, then lost; lost at once in a minority view. `Available`: held while the
    /// grantor was heard within `suspend_after`, suspended after.
    fn hold_status(&self, now: Instant, hold: &client::Held) -> HoldStatus {
        if hold.lease_until.is_some_and(|t| now >= t) {
            return HoldStatus::Lost;
        }
        let leased_from = hold.leased_from;
        if self.config.policy.is_majority() {
            let majority_view = self
                .view
                .as_ref()
                .is_some_and(|v| self.config.policy.allows(v.len()));
            let age = now.saturating_duration_since(leased_from);
            return if !majority_view || now >= leased_from + self.config.lease {
                HoldStatus::Lost
            } else if age > self.config.suspend_after {
                HoldStatus::Suspended
            } else {
                HoldStatus::Held
            };
        }
        match self.grantor_silence(now) {
            Some(silence) if silence <= self.config.suspend_after => HoldStatus::Held,
            _ => HoldStatus::Suspended,
        }
    }

    /// `Majority`: reports held locks lost once their lease ran out, and keeps a periodic
    /// check armed while locks are held or this member is the grantor.
    fn check_leases(&mut self, now: Instant) {
        if !self.config.policy.is_majority() {
            self.next_check = None;
            return;
        }
        self.client
            .expire_leases(now, self.config.lease, &mut self.outbox, &mut self.notices);
        self.arm_renewal(now);
        let active = self.client.has_held() || self.grantor.is_active();
        self.next_check =
            active.then(|| now + self.config.lease_margin.max(Duration::from_millis(1)) / 2);
    }

    /// Records the grantor known to serve, telling the owner when it changes.
    fn set_serving_grantor(&mut self, grantor: Option<MemberId>) {
        if self.serving_grantor != grantor {
            self.serving_grantor = grantor.clone();
            self.notices
                .push_back(LockNotice::GrantorServing { grantor });
        }
        if self.serving_grantor.is_some() {
            self.ask_for_grantor();
        }
    }

    /// `Majority`: restores the highest term this member promised before it restarted, read
    /// from stable storage. It never supports that term or a lower one again, so every
    /// grantor's later term, and every fencing token issued in it, exceeds the tokens issued
    /// before the restart (see `docs/protocol.md`, "Tokens across restarts").
    pub fn restore_term(&mut self, term: u64) {
        // A named service promises nothing of its own (it borrows the default service's term)
        // but keeps the floor too, for its own table of terms heard of.
        self.support.restore(term);
    }

    /// `Majority`: a term this member must write to stable storage before it sends what it
    /// produced since the last call (it just promised it; see [`LockService::restore_term`]).
    #[must_use]
    pub fn poll_durable_term(&mut self) -> Option<u64> {
        self.support.take_unsaved()
    }

    /// The number [`LockService::query_table`] will return next (so a caller can register
    /// for the answer before it asks: the answer may come within the call).
    pub fn next_query(&self) -> u64 {
        self.next_query
    }

    /// Asks the grantor for its lock table; the answer comes as [`LockNotice::Table`] with
    /// the returned query number (at once if this member is the grantor, or if there is none).
    pub fn query_table(&mut self, now: Instant) -> u64 {
        self.enter(now);
        let query = self.next_query;
        self.next_query += 1;
        match self.view.as_ref().and(self.client.grantor().cloned()) {
            Some(grantor) if grantor == self.local => {
                let table = self.table_answer(query);
                self.on_table(&grantor, table);
            }
            Some(grantor) => {
                self.queries.insert(query, grantor.clone());
                self.outbox
                    .push_back((grantor, LockMessage::TableRequest { query }));
            }
            None => self
                .notices
                .push_back(LockNotice::Table { query, table: None }),
        }
        self.pump(now);
        query
    }

    /// This member's answer, as grantor, to table query `query`.
    fn table_answer(&self, query: u64) -> LockMessage {
        let epoch = self.view.as_deref().map_or(0, View::epoch);
        if !self.grantor.is_serving() {
            return LockMessage::Table {
                query,
                epoch,
                unavailable: true,
                truncated: false,
                locks: Vec::new(),
            };
        }
        let (locks, truncated) = self
            .grantor
            .table
            .snapshot(conclave_lock_api::wire::TABLE_LOCKS_MAX, self.last_now);
        LockMessage::Table {
            query,
            epoch,
            unavailable: false,
            truncated,
            locks,
        }
    }

    /// A table answer from `from` (or from this member itself).
    fn on_table(&mut self, from: &MemberId, answer: LockMessage) {
        let LockMessage::Table {
            query,
            epoch,
            unavailable,
            truncated,
            locks,
        } = answer
        else {
            return;
        };
        if from != &self.local && self.queries.remove(&query).is_none() {
            return; // not ours, or answered already
        }
        let table =
            (!unavailable).then(|| GrantorTable::new(from.clone(), epoch, locks, truncated));
        self.notices.push_back(LockNotice::Table { query, table });
    }

    /// Tells a grantor the role was transferred to what this member holds, as a late report
    /// of the view `epoch`: the reconciliation of the view may have finished without this
    /// member's report (it timed out) and its report then reached a grantor that had handed
    /// the table over, which applies nothing (regression seed 94 of the named-services band,
    /// harsh). The new grantor merges what it does not know through the duplicate rule, like
    /// any late report; what it knows already is left as it is.
    fn report_holds_to(&mut self, now: Instant, grantor: MemberId, epoch: u64) {
        if !self.client.has_held() {
            return;
        }
        let report = LockMessage::LockInfoResponse {
            epoch,
            held: self.client.held_locks(now),
            pending: Vec::new(),
            releases: Vec::new(),
        };
        self.outbox.push_back((grantor, report));
    }

    /// Answers, with `None`, every table query whose grantor is not the view's coordinator.
    fn drop_stale_queries(&mut self) {
        let grantor = self.client.grantor().cloned();
        let stale: Vec<u64> = self
            .queries
            .iter()
            .filter(|(_, asked)| Some(*asked) != grantor.as_ref())
            .map(|(q, _)| *q)
            .collect();
        for query in stale {
            self.queries.remove(&query);
            self.notices
                .push_back(LockNotice::Table { query, table: None });
        }
    }

    /// The grantor this member knows to be serving (see [`LockNotice::GrantorServing`]).
    pub fn serving_grantor(&self) -> Option<&MemberId> {
        self.serving_grantor.as_ref()
    }

    /// Grantor: announces to its view that it serves, once per view and term, as soon as it
    /// can grant.
    fn announce_serving(&mut self, now: Instant) {
        let Some(view) = self.view.clone() else {
            return;
        };
        if view.coordinator() != &self.local || !self.grantor.is_serving() {
            return;
        }
        if !self.ctx(now, &view).policy_ok {
            return;
        }
        let key = (
            view.epoch(),
            self.term.as_ref().map(|t| t.term).or(self.started_term),
        );
        if self.announced == Some(key) {
            return;
        }
        self.announced = Some(key);
        for member in view.members().iter().filter(|m| **m != self.local) {
            self.outbox.push_back((
                member.clone(),
                LockMessage::Serving {
                    epoch: view.epoch(),
                },
            ));
        }
        self.set_serving_grantor(Some(self.local.clone()));
    }

    fn dispatch(&mut self, now: Instant, from: &MemberId, message: LockMessage) {
        match message {
            LockMessage::TableRequest { query } => {
                let answer = self.table_answer(query);
                self.outbox.push_back((from.clone(), answer));
            }
            answer @ LockMessage::Table { .. } => self.on_table(from, answer),
            LockMessage::Serving { epoch } => {
                let newer = self.announcement.as_ref().is_none_or(|(_, e)| epoch >= *e);
                if newer {
                    self.announcement = Some((from.clone(), epoch));
                }
                let from_coordinator = self
                    .view
                    .as_ref()
                    .is_some_and(|v| v.coordinator() == from && epoch >= v.epoch());
                if from_coordinator {
                    self.set_serving_grantor(Some(from.clone()));
                }
            }
            LockMessage::Denied {
                unavailable: true, ..
            } if self.serving_grantor.as_ref() == Some(from) => {
                self.set_serving_grantor(None);
                self.client.handle(
                    now,
                    from,
                    true,
                    message,
                    &mut self.outbox,
                    &mut self.notices,
                );
            }
            LockMessage::Handoff { .. } if self.is_handover_from(from, &message) => {
                self.on_handover(now, message);
            }
            LockMessage::TransferRequest { .. }
            | LockMessage::Handoff { .. }
            | LockMessage::Transferred { .. }
            | LockMessage::NotGrantor { .. } => self.on_transfer(now, from, message),
            LockMessage::Lock { .. }
            | LockMessage::Holding { .. }
            | LockMessage::Cancel { .. }
            | LockMessage::Unlock { .. }
            | LockMessage::Renew { .. }
            | LockMessage::ExtendLease { .. }
                if self.handed_over() =>
            {
                // Handed over: the sender must ask the new grantor (nothing is applied here,
                // not even a release: the new grantor's table has the lock).
                if let (Some(view), Some((_, to))) = (self.view.as_ref(), self.transferred.as_ref())
                {
                    let reply = LockMessage::NotGrantor {
                        epoch: view.epoch(),
                        coordinator: view.coordinator().incarnation(),
                        grantor: to.clone(),
                        generation: self.grantor.generation + 1,
                    };
                    self.outbox.push_back((from.clone(), reply));
                }
            }
            LockMessage::Lock { .. }
            | LockMessage::Holding { .. }
            | LockMessage::Cancel { .. }
            | LockMessage::Unlock { .. }
            | LockMessage::Renew { .. }
            | LockMessage::ExtendLease { .. }
            | LockMessage::LockInfoResponse { .. } => {
                if let Some(view) = self.view.clone() {
                    let ctx = self.ctx(now, &view);
                    self.grantor.handle(&ctx, from, message, &mut self.outbox);
                }
            }
            LockMessage::Revoke { request, token, .. } => {
                if self.grantor_is(from) {
                    self.cache_revoke(now, request, token);
                }
            }
            LockMessage::Granted { .. }
            | LockMessage::Denied { .. }
            | LockMessage::UnlockAck { .. }
            | LockMessage::Queued { .. }
            | LockMessage::Renewed { .. }
            | LockMessage::DuplicateLock { .. }
            | LockMessage::LockInfoRequest { .. } => {
                let of_our_view = self.of_our_view(&message);
                self.client.handle(
                    now,
                    from,
                    of_our_view,
                    message,
                    &mut self.outbox,
                    &mut self.notices,
                );
            }
        }
    }

    /// Delivers messages addressed to this member itself (the grantor talking to its own
    /// client) until none is left; the rest stay in the outbox for the transport.
    fn pump(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        let mut rounds = 0usize;
        // In order; what the dispatches add joins the end. The outbox keeps its allocation.
        let mut next = 0;
        while next < self.outbox.len() {
            if self.outbox[next].0 != self.local {
                next += 1;
                continue;
            }
            let Some((local, message)) = self.outbox.remove(next) else {
                break;
            };
            rounds += 1;
            self.dispatch(now, &local, message);
            debug_assert!(rounds < 10_000_000, "local message loop does not settle");
        }
        self.check_leases(now);
        self.announce_serving(now);
        self.try_transfer(now);
        self.cache_absorb(now);
        if !self.outbox.iter().all(|(to, _)| *to != self.local) {
            // The cache released or asked at this member's own grantor.
            self.pump(now);
            return;
        }
        self.grantor.lazy_acks.flush(now, &mut self.outbox);
    }

    /// Under `Available`: this member grants, and its fencing tokens ran out for their epoch.
    /// It grants nothing until a view with a higher epoch, at least the one returned, which
    /// the endpoint then asks the membership layer for ([`crate::gms::Gms::renew_view`]).
    pub fn needs_new_view(&self) -> Option<u64> {
        (!self.config.policy.is_majority() && self.grantor.exhausted())
            .then(|| self.grantor.table.last_token().epoch().saturating_add(1))
    }

    /// False for a grant made in another view than ours, under `Available`: our grantor moved
    /// to another lineage of views and granted there, to the member it lists there (seed
    /// 6004172 of the transfer band: two holders in our view). Such a grant is not ours to
    /// keep: the client gives it back; the request, if pending, goes to our view's grantor.
    fn of_our_view(&self, message: &LockMessage) -> bool {
        let LockMessage::Granted {
            view: Some(granted_in),
            ..
        } = message
        else {
            return true;
        };
        self.config.policy.is_majority()
            || self
                .view
                .as_deref()
                .is_some_and(|v| grantor::grant_view(v) == *granted_in)
    }

    /// Whether `message` is the table handoff of the coordinator that handed this member its
    /// current view on leaving (`from`), for that view and turn 0.
    fn is_handover_from(&self, from: &MemberId, message: &LockMessage) -> bool {
        let Some((key, previous)) = &self.handover_from else {
            return false;
        };
        previous == from
            && transfer_view(message) == Some(*key)
            && matches!(message, LockMessage::Handoff { generation: 0, .. })
    }

    /// The table of the coordinator that left and handed this member the view: served at
    /// once, ending the reconciliation (`Available` only; see [`LockService::leave`]).
    fn on_handover(&mut self, now: Instant, handoff: LockMessage) {
        self.handover_from = None;
        let Some(view) = self.view.clone() else {
            return;
        };
        if self.config.policy.is_majority() {
            return;
        }
        let ctx = self.ctx(now, &view);
        if !self
            .grantor
            .take_over_on_leave(&ctx, handoff, &mut self.outbox)
        {
            debug!(member = %self.local, "lock table of the coordinator that left came after the reconciliation; dropped");
        }
    }

    /// Whether this member handed the grantor role of its current view to another member.
    fn handed_over(&self) -> bool {
        !self.grantor.is_active()
            && self
                .transferred
                .as_ref()
                .zip(self.view.as_ref())
                .is_some_and(|((key, _), view)| *key == ViewKey::of(view))
    }

    /// Whether `member` is this member's grantor (the coordinator of its view, or the member
    /// the role was transferred to).
    fn grantor_is(&self, member: &MemberId) -> bool {
        self.client.grantor() == Some(member)
    }
}

/// How many transfer announcements of views not installed yet a member keeps.
const EARLY_TRANSFERS_MAX: usize = 8;

/// A view's id on the wire: its epoch and its coordinator's incarnation. A coordinator numbers
/// its views increasingly, so the pair is unique across coordinators where an epoch alone is
/// not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ViewKey {
    epoch: u64,
    coordinator: u128,
}

impl ViewKey {
    fn of(view: &View) -> Self {
        Self {
            epoch: view.epoch(),
            coordinator: view.coordinator().incarnation(),
        }
    }
}

/// The view a transfer message names.
fn transfer_view(message: &LockMessage) -> Option<ViewKey> {
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

#[cfg(test)]
mod tests;
