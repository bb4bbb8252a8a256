//! Locking: the grantor's lock table, every member's client state, reconciliation when the
//! grantor changes, duplicate locks after a merge, fencing tokens and partition policies.
//!
//! [`LockMachine`] is a sans-IO state machine, one per member. The membership layer tells it
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
//! use conclave_protocol::locking::{LockConfig, LockNotice, LockRequest, LockMachine};
//! use conclave_protocol::Instant;
//!
//! let me = MemberId::new(1, "solo", "127.0.0.1:7800".parse()?)?;
//! let mut locks = LockMachine::new(me.clone(), LockConfig::local());
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
mod granting;
mod grantor;
mod holds;
mod lazy_ack;
mod lease;
mod majority;
mod queries;
#[cfg(feature = "sim")]
mod sabotage;
mod services;
mod serving;
mod table;
mod timers;
mod transfer;
mod types;
mod view;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::LockMessage;
use conclave_lock_api::{MemberId, RequestId, View};

use crate::time::Instant;
use client::Client;
use grantor::Grantor;
use majority::Majority;
use queries::Queries;
use timers::{Timer, TimerTable};
use transfer::Transfer;
use types::{Outbox, MIN_LEASE};

#[cfg(feature = "sim")]
pub use cache::CachedGrant;
pub use cache::{CacheStats, NodeCacheConfig};
pub use config::{LockConfig, LockConfigError, PartitionPolicy};
pub use grantor::GrantorStats;
pub use lazy_ack::LAZY_ACK_DELAY;
pub(crate) use types::Authority;
#[cfg(feature = "sim")]
pub use types::LockSabotage;
pub use types::{
    service_index, HoldInfo, HoldStatus, LockNotice, LockRequest, NotHeld, Refusal,
    TransferRefused, SERVICE_SHIFT,
};

/// The locking state machine of one member: client of the grantor, and grantor when it
/// coordinates. See the [module docs](self).
#[derive(Debug)]
pub struct LockMachine {
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
    /// Every deadline of the machine; [`LockMachine::poll_timeout`] is the earliest.
    timers: TimerTable,
    /// The latest time seen in any input.
    last_now: Instant,
    /// The highest view epoch this member has heard of (from the membership layer).
    known_epoch: u64,
    /// `Majority`: the term, the support and the minority rules.
    majority: Majority,
    /// Grantor: the (view epoch, term) it last announced serving for.
    announced: Option<(u64, Option<u64>)>,
    /// Client: the grantor known to serve (from its announcement).
    serving_grantor: Option<MemberId>,
    /// Client: the newest announcement heard (it may arrive before its view is installed).
    announcement: Option<(MemberId, u64)>,
    /// Table queries waiting for their answer.
    queries: Queries,
    /// Holds this member lost because their own lease ran out.
    acquisition_leases_expired: u64,
    /// Grantor transfer and the handover of a leaving coordinator's table.
    transfer: Transfer,
}

/// The lock service state machine by its earlier name (the front crate's `LockService` is the
/// handle users hold; this is the protocol's machine behind it).
#[deprecated(since = "0.1.0", note = "renamed `LockMachine`")]
pub type LockService = LockMachine;

impl LockMachine {
    /// A member's locking state; it does nothing until the first view.
    pub fn new(local: MemberId, config: LockConfig) -> Self {
        let lease = config.policy.is_majority().then_some(config.lease);
        let mut client = Client::new(local.clone(), lease);
        client.drift = (config.lease, config.lease + config.lease_margin);
        let mut service = Self {
            client,
            grantor: {
                let mut grantor = Grantor::new(local.clone());
                grantor.delegation_grace = config.node_cache.delegation_grace;
                grantor.one_hop = config.one_hop_handoff;
                grantor
            },
            cache: cache::NodeCache::default(),
            local,
            config,
            view: None,
            last_heard: BTreeMap::new(),
            outbox: Outbox::new(),
            notices: VecDeque::new(),
            timers: TimerTable::default(),
            last_now: Instant::ZERO,
            known_epoch: 0,
            majority: Majority::default(),
            announced: None,
            serving_grantor: None,
            announcement: None,
            queries: Queries::default(),
            acquisition_leases_expired: 0,
            transfer: Transfer::default(),
        };
        service.arm_timers();
        service
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
    /// ([`LockLostReason::LeaseExpired`](conclave_lock_api::LockLostReason::LeaseExpired)) strictly before that: at `s + d × lease / (lease +
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

    /// Asks for a lock like [`LockMachine::lock`], but asks the grantor not to say that the
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
        let refuse_at_once = self.majority.minority_since.is_some_and(|since| {
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
            self.client
                .unlock(request, true, Some(now), &mut self.outbox);
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
    /// acknowledgement (a guard dropped rather than unlocked): as [`LockMachine::unlock`], but
    /// the release is sent *lazy*, and the grantor may hold its acknowledgement back for up to
    /// [`LAZY_ACK_DELAY`] to send it with its next message to this member instead of in a
    /// datagram of its own. [`LockNotice::Released`] still comes, that much later at most.
    ///
    /// # Errors
    /// [`NotHeld`] if `request` holds nothing here (never granted, already released or lost).
    pub fn unlock_lazy(&mut self, now: Instant, request: RequestId) -> Result<(), NotHeld> {
        self.release(now, request, true)
    }

    /// [`LockMachine::unlock`] (`lazy` false) or [`LockMachine::unlock_lazy`] (true).
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
        if !self
            .client
            .unlock(request, lazy, Some(now), &mut self.outbox)
        {
            self.arm_timers();
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
            self.arm_timers();
            return Err(NotHeld(request));
        }
        self.pump(now);
        Ok(())
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

    /// Handles a lock message delivered reliably from `from`.
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
        if self.timers.is_expired(Timer::Renewal, now) {
            self.client.renew(now, &mut self.outbox);
            self.timers.stop(Timer::Renewal);
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

    /// When [`LockMachine::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_timeout()
    }

    /// Brings the timer table up to date with the sub-machines' deadlines (the lease check
    /// and the renewal are set where they are decided). Every input ends here, so the table
    /// is the machine's one source of deadlines.
    fn arm_timers(&mut self) {
        let majority = self.config.policy.is_majority();
        let deadlines = [
            (Timer::RequestTimeout, self.client.next_deadline()),
            (Timer::Grantor, self.grantor.poll_timeout(self.last_now)),
            (
                Timer::HoldLease,
                majority
                    .then(|| self.client.next_expiry(self.config.lease))
                    .flatten(),
            ),
            (
                Timer::GraceEnd,
                self.grace_end().filter(|t| *t > self.last_now),
            ),
            (
                Timer::MinorityWaits,
                self.majority
                    .minority_since
                    .filter(|_| self.client.pending_requests().next().is_some())
                    .map(|since| since + self.config.lease),
            ),
            (Timer::NodeCache, self.cache_next_timeout()),
            (
                Timer::AcquisitionLease,
                self.client.next_acquisition_expiry(),
            ),
            (Timer::LazyAck, self.grantor.lazy_acks.next_due()),
        ];
        for (timer, deadline) in deadlines {
            self.timers.set(timer, deadline);
        }
    }

    fn dispatch(&mut self, now: Instant, from: &MemberId, message: LockMessage) {
        match message {
            LockMessage::TableRequest { query } => {
                let answer = self.table_answer(query);
                self.outbox.push_back((from.clone(), answer));
            }
            answer @ LockMessage::Table { .. } => self.on_table(from, answer),
            LockMessage::Serving { epoch } => self.on_serving(from, epoch),
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
                self.refer_to_new_grantor(from);
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
            LockMessage::Designate { request, next, .. } => {
                self.client.on_designate(from, request, next)
            }
            LockMessage::Passed {
                grantor,
                name,
                grant,
            } => {
                // Under both policies: a grant passed on is taken only in the view it was made
                // in (a grantor that reconciled since, even the same member in a new term,
                // rebuilt its table from reports that did not include it).
                let of_our_view = self
                    .view
                    .as_deref()
                    .is_some_and(|v| grantor::grant_view(v) == grant.view);
                self.client.on_passed(
                    now,
                    &grantor,
                    of_our_view,
                    name,
                    grant,
                    &mut self.outbox,
                    &mut self.notices,
                );
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
        self.arm_timers();
    }
}

#[cfg(test)]
mod tests;
