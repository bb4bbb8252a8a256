//! The client role of every member: its pending requests, held locks and pending releases.
//!
//! The client talks to the grantor of its current view (the coordinator). It accepts grants
//! only from that grantor, so a late answer of a former grantor cannot make it hold a lock the
//! new grantor does not know about. Every release is kept until the grantor acknowledges it
//! and is resent to, and reported to, a new grantor (JGroups lost unlocks here: JGRP-2234).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::{
    LockMessage, PendingRelease, PendingRequest, ReportedHold, Successor,
};
use conclave_lock_api::{
    FencingToken, LockLostReason, LockMode, LockName, MemberId, OwnerId, RequestId, View,
};
use tracing::debug;

use super::types::{LockNotice, Outbox, Refusal};
use crate::time::Instant;

mod answers;

/// A request waiting for the grantor's answer.
#[derive(Clone, Debug)]
struct Pending {
    name: LockName,
    owner: u64,
    mode: LockMode,
    wait: bool,
    deadline: Option<Instant>,
    sent: bool,
    /// Per grantor, the highest token of a grant of this request that was given back to it
    /// (it came from a former grantor, or after its lease). Copies of it, or of older grants
    /// of that grantor, are ignored: the grantor frees it when the give-back arrives.
    given_back: BTreeMap<MemberId, FencingToken>,
    /// The owner was told the request is queued (at most once).
    told_queued: bool,
    /// The hold's own lease (`lock_with_lease`).
    lease: Option<Duration>,
    /// Ask the grantor not to send `Queued` (see [`LockMessage::Lock`]).
    quiet: bool,
}

/// A lock this member holds.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) name: LockName,
    pub(crate) owner: u64,
    pub(crate) mode: LockMode,
    pub(crate) token: FencingToken,
    /// Epoch of this member's view when the grant arrived.
    pub(crate) granted_in: u64,
    /// The grantor that granted it.
    pub(crate) granted_by: MemberId,
    /// The newest token a grantor gave this request: a new grantor that rebuilt its table
    /// from a report listing the request as pending grants it again, with a higher token,
    /// while the first grant is on its way. Releases and reports name this one, so they
    /// match the table. (The owner keeps `token`, the one it was told.)
    pub(crate) table_token: FencingToken,
    /// `Majority`: the lease runs from this instant (the send time of the newest stamp a
    /// grantor confirmed this hold with).
    pub(crate) leased_from: Instant,
    /// A node grant whose grantor reserved its token block (see `cache`).
    pub(crate) cached: bool,
    /// The hold's own lease runs out then on this member's clock: before the grantor's
    /// deadline, which runs from the grant (later than the send time this one runs from) and
    /// is not shortened by the clock-rate margin. `None`: held until released.
    pub(crate) lease_until: Option<Instant>,
    /// A lease extension sent and not yet confirmed: its stamp and the lease asked for.
    extending: Option<(u64, Duration)>,
    /// One-hop handoff: the grant the grantor made in advance to the next waiter, with that
    /// grantor, to deliver at release ([`LockMessage::Designate`]).
    pub(crate) successor: Option<(MemberId, Successor)>,
}

/// A release not yet acknowledged.
#[derive(Clone, Debug)]
struct Release {
    name: LockName,
    owner: u64,
    token: FencingToken,
    /// Nobody waits for the acknowledgement: the grantor may send it late, with its next
    /// message to this member ([`LockMessage::Unlock`]'s `lazy`).
    lazy: bool,
    /// The successor this release passed the lock to (one-hop handoff), named again in every
    /// resend of the release.
    passed_to: Option<(RequestId, FencingToken)>,
}

/// The client state of one member.
#[derive(Debug)]
pub(crate) struct Client {
    local: MemberId,
    next_request: u64,
    pending: BTreeMap<RequestId, Pending>,
    /// Cancelled requests whose withdrawal the grantor has not confirmed.
    cancelled: BTreeMap<RequestId, LockName>,
    held: BTreeMap<RequestId, Held>,
    releases: BTreeMap<RequestId, Release>,
    grantor: Option<MemberId>,
    /// Every member this client followed as grantor in the current view (its coordinator,
    /// then each member the role was transferred to): their tables went, by handoffs, to the
    /// grantor of the latest turn.
    turn_grantors: std::collections::BTreeSet<MemberId>,
    epoch: u64,
    /// A report request for a view not installed here yet (its asker and epoch), answered
    /// once that view is, if the asker coordinates it.
    early_report: Option<(MemberId, u64)>,
    /// Send stamps of recent lock requests and renewals, with when they were sent.
    stamps: VecDeque<(u64, Instant)>,
    next_stamp: u64,
    /// `Majority`: the hold lease; grants whose lease has already run out are refused.
    lease: Option<std::time::Duration>,
    /// Sabotage: neither resend nor report pending releases to a new grantor.
    pub(crate) forget_releases: bool,
    /// Sabotage: leases run from receipt, not from the stamp's send time.
    pub(crate) anchor_at_receipt: bool,
    /// Per-acquisition leases: a lease of `d` lasts `d × .0 / .1` on this member's clock
    /// (`lease / (lease + lease_margin)`: the clock-rate margin).
    pub(crate) drift: (Duration, Duration),
    /// Sabotage: a hold's own lease runs, whole, from the grant's arrival.
    pub(crate) lease_from_receipt: bool,
    /// Sabotage (one-hop handoff): pass the lock on and keep holding it.
    pub(crate) pass_keeps_hold: bool,
    /// Sabotage (one-hop handoff): take a passed lock for any request, even one no longer
    /// waited for.
    pub(crate) pass_to_any: bool,
    /// One-hop handoff: the first stamp sent after this member's latest report. A grantor
    /// that asked for the report rebuilds its table from reports, which name no designation:
    /// a grant designated before it (its stamp is older) is void, even in the same view (a
    /// `Majority` grantor begins a new term in the view it is in).
    reported_stamp: u64,
}

/// Stamps remembered at most (older ones are past any lease anyway).
const MAX_STAMPS: usize = 4096;

impl Client {
    pub(crate) fn new(local: MemberId, lease: Option<std::time::Duration>) -> Self {
        Self {
            stamps: VecDeque::new(),
            next_stamp: 1,
            lease,
            local,
            next_request: 1,
            pending: BTreeMap::new(),
            cancelled: BTreeMap::new(),
            held: BTreeMap::new(),
            releases: BTreeMap::new(),
            grantor: None,
            turn_grantors: std::collections::BTreeSet::new(),
            epoch: 0,
            early_report: None,
            forget_releases: false,
            anchor_at_receipt: false,
            drift: (Duration::from_secs(1), Duration::from_secs(1)),
            lease_from_receipt: false,
            pass_keeps_hold: false,
            pass_to_any: false,
            reported_stamp: 0,
        }
    }

    /// A new send stamp, remembered with its send time.
    fn stamp(&mut self, now: Instant) -> u64 {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        if let Some(lease) = self.lease {
            while self
                .stamps
                .front()
                .is_some_and(|(_, at)| now.saturating_duration_since(*at) > lease)
            {
                self.stamps.pop_front();
            }
        }
        if self.stamps.len() >= MAX_STAMPS {
            self.stamps.pop_front();
        }
        self.stamps.push_back((stamp, now));
        stamp
    }

    /// When `stamp` was sent, if it is recent.
    fn stamp_time(&self, stamp: u64) -> Option<Instant> {
        let index = self.stamps.binary_search_by_key(&stamp, |(s, _)| *s).ok()?;
        Some(self.stamps[index].1)
    }

    fn owner(&self, local: u64) -> OwnerId {
        OwnerId {
            member: self.local.clone(),
            local,
        }
    }

    pub(crate) fn grantor(&self) -> Option<&MemberId> {
        self.grantor.as_ref()
    }

    pub(crate) fn held(&self) -> impl Iterator<Item = (&RequestId, &Held)> {
        self.held.iter()
    }

    pub(crate) fn held_lock(&self, request: RequestId) -> Option<&Held> {
        self.held.get(&request)
    }

    pub(crate) fn has_held(&self) -> bool {
        !self.held.is_empty()
    }

    pub(crate) fn pending_requests(&self) -> impl Iterator<Item = &RequestId> {
        self.pending.keys()
    }

    pub(crate) fn pending_owner(&self, request: RequestId) -> Option<u64> {
        self.pending.get(&request).map(|p| p.owner)
    }

    pub(crate) fn pending_name(&self, request: RequestId) -> Option<LockName> {
        self.pending.get(&request).map(|p| p.name.clone())
    }

    pub(crate) fn pending_releases(&self) -> usize {
        self.releases.len()
    }

    /// Makes this client's request ids start at `first` (each lock service of a member has its
    /// own range, so a request id names its service).
    pub(crate) fn start_ids_at(&mut self, first: u64) {
        self.next_request = first;
    }

    /// A new request id, unique on this member.
    pub(crate) fn next_id(&mut self) -> RequestId {
        let request = RequestId(self.next_request);
        self.next_request += 1;
        request
    }

    /// Registers a request and sends it if a grantor is known.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lock(
        &mut self,
        now: Instant,
        owner: u64,
        name: LockName,
        mode: LockMode,
        wait: bool,
        timeout: Option<std::time::Duration>,
        lease: Option<Duration>,
        quiet: bool,
        out: &mut Outbox,
    ) -> RequestId {
        let request = self.next_id();
        self.lock_with_id(
            now, request, owner, name, mode, wait, timeout, lease, quiet, out,
        );
        request
    }

    /// Registers a request under an id from [`Client::next_id`] and sends it if a grantor is
    /// known.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lock_with_id(
        &mut self,
        now: Instant,
        request: RequestId,
        owner: u64,
        name: LockName,
        mode: LockMode,
        wait: bool,
        timeout: Option<std::time::Duration>,
        lease: Option<Duration>,
        quiet: bool,
        out: &mut Outbox,
    ) {
        let mut pending = Pending {
            name,
            owner,
            mode,
            wait,
            deadline: timeout.map(|t| now + t),
            sent: false,
            given_back: BTreeMap::new(),
            told_queued: false,
            lease,
            quiet,
        };
        if let Some(grantor) = self.grantor.clone() {
            let message = self.lock_message(now, request, &pending);
            out.push_back((grantor, message));
            pending.sent = true;
        }
        self.pending.insert(request, pending);
    }

    fn lock_message(&mut self, now: Instant, request: RequestId, p: &Pending) -> LockMessage {
        LockMessage::Lock {
            request,
            name: p.name.clone(),
            owner: self.owner(p.owner),
            mode: p.mode,
            wait: p.wait,
            stamp: self.stamp(now),
            lease_ms: p.lease.map(millis_up),
            quiet: p.quiet,
            // This build takes one-hop handoffs (whether its grantor designates is the
            // grantor's setting).
            passes: true,
        }
    }

    /// `Majority`: asks the grantor to renew the leases of every hold, if there is anything
    /// to renew or a grant to wait for (a grant's lease runs from the newest stamp the
    /// grantor has: renewals keep it fresh for a request that waits in the queue).
    pub(crate) fn renew(&mut self, now: Instant, out: &mut Outbox) {
        let Some(grantor) = self.grantor.clone() else {
            return;
        };
        if self.held.is_empty() && self.pending.is_empty() {
            return;
        }
        let stamp = self.stamp(now);
        out.push_back((
            grantor,
            LockMessage::Renew {
                stamp,
                held: self.held.keys().copied().collect(),
            },
        ));
    }

    /// Whether there is anything to renew.
    pub(crate) fn wants_renewal(&self) -> bool {
        !self.held.is_empty() || !self.pending.is_empty()
    }

    /// Whether a request with a lease of its own waits: its grant's lease will run from the
    /// newest stamp the grantor has, so renewals keep that stamp recent under any policy.
    pub(crate) fn has_leased_pending(&self) -> bool {
        self.pending.values().any(|p| p.lease.is_some())
    }

    /// A hold's own lease, `d` on the grantor's clock, as this member counts it.
    fn holder_share(&self, d: Duration) -> Duration {
        super::lease::scale(d, self.drift.0, self.drift.1)
    }

    /// Loses every hold whose own lease ran out at `now` (reported, and released at the
    /// grantor like an unlock).
    pub(crate) fn expire_acquisition_leases(
        &mut self,
        now: Instant,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) -> u64 {
        let expired: Vec<RequestId> = self
            .held
            .iter()
            .filter(|(_, h)| h.lease_until.is_some_and(|t| now >= t))
            .map(|(r, _)| *r)
            .collect();
        for request in &expired {
            self.lose(*request, LockLostReason::LeaseExpired, out, notices);
        }
        expired.len() as u64
    }

    /// The earliest instant a hold's own lease runs out.
    pub(crate) fn next_acquisition_expiry(&self) -> Option<Instant> {
        self.held.values().filter_map(|h| h.lease_until).min()
    }

    /// A reentrant re-lock with a lease: the hold's lease becomes `max(remaining, lease)`.
    /// Asks the grantor when `lease` reaches past the current deadline; the deadline moves
    /// once the grantor confirms. A hold without a lease keeps none. Returns whether the hold
    /// exists.
    pub(crate) fn extend_lease(
        &mut self,
        now: Instant,
        request: RequestId,
        lease: Duration,
        out: &mut Outbox,
    ) -> bool {
        let Some(h) = self.held.get(&request) else {
            return false;
        };
        let Some(until) = h.lease_until else {
            return true;
        };
        if now + self.holder_share(lease) <= until {
            return true;
        }
        let name = h.name.clone();
        let stamp = self.stamp(now);
        if let Some(h) = self.held.get_mut(&request) {
            let asked = h.extending.map_or(lease, |(_, d)| d.max(lease));
            h.extending = Some((stamp, asked));
            if let Some(grantor) = self.grantor.clone() {
                out.push_back((
                    grantor,
                    LockMessage::ExtendLease {
                        request,
                        name,
                        lease_ms: millis_up(asked),
                        stamp,
                    },
                ));
            }
        }
        true
    }

    /// `Majority`: loses every hold whose lease ran out at `now` (reported, and released at
    /// the grantor like an unlock).
    pub(crate) fn expire_leases(
        &mut self,
        now: Instant,
        lease: std::time::Duration,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        let expired: Vec<RequestId> = self
            .held
            .iter()
            .filter(|(_, h)| now >= h.leased_from + lease)
            .map(|(r, _)| *r)
            .collect();
        for request in expired {
            self.lose(request, LockLostReason::LeaseExpired, out, notices);
        }
    }

    /// The earliest instant a hold's lease runs out.
    pub(crate) fn next_expiry(&self, lease: std::time::Duration) -> Option<Instant> {
        self.held.values().map(|h| h.leased_from + lease).min()
    }

    /// Withdraws a pending request (the caller gave up). Returns whether it was pending. The
    /// cancel is kept, and resent to every new grantor, until a grantor confirms it.
    pub(crate) fn cancel(&mut self, request: RequestId, out: &mut Outbox) -> bool {
        let Some(pending) = self.pending.remove(&request) else {
            return false;
        };
        if let Some(grantor) = &self.grantor {
            out.push_back((
                grantor.clone(),
                LockMessage::Cancel {
                    request,
                    name: pending.name.clone(),
                },
            ));
        }
        if pending.sent {
            self.cancelled.insert(request, pending.name);
        }
        true
    }

    /// Releases the lock acquired by `request`: at once for the caller, acknowledged later.
    /// `lazy`: nobody waits for the acknowledgement, so the grantor may hold it back.
    /// With `now` (a caller's release, not a cache's return), a hold with a designated
    /// successor passes the lock straight on to it (one-hop handoff) if the designation is of
    /// this member's grantor and the hold is still good at `now`; the release then says so.
    pub(crate) fn unlock(
        &mut self,
        request: RequestId,
        lazy: bool,
        now: Option<Instant>,
        out: &mut Outbox,
    ) -> bool {
        let Some(held) = self.held.remove(&request) else {
            return false;
        };
        let passed_to = now.and_then(|now| self.pass_on(now, &held, out));
        if passed_to.is_some() && self.pass_keeps_hold {
            self.held.insert(request, held.clone());
        }
        let release = Release {
            name: held.name,
            owner: held.owner,
            token: held.table_token,
            lazy,
            passed_to,
        };
        if let Some(grantor) = &self.grantor {
            out.push_back((grantor.clone(), self.unlock_message(request, &release)));
        }
        self.releases.insert(request, release);
        true
    }

    /// Sends the grant designated for `held`'s successor to it, if the designation is of this
    /// member's grantor and the hold is good at `now` (its lease has not run out here: a
    /// grantor that expired it has granted the successor itself). Returns the successor's
    /// request and the token passed.
    fn pass_on(
        &self,
        now: Instant,
        held: &Held,
        out: &mut Outbox,
    ) -> Option<(RequestId, FencingToken)> {
        let (grantor, successor) = held.successor.as_ref()?;
        let current = self.grantor.as_ref() == Some(grantor) && held.granted_by == *grantor;
        let leased = self
            .lease
            .is_none_or(|lease| now < held.leased_from + lease)
            && held.lease_until.is_none_or(|until| now < until);
        if !(current && leased) {
            return None;
        }
        out.push_back((
            successor.member.clone(),
            LockMessage::Passed {
                grantor: grantor.clone(),
                name: held.name.clone(),
                grant: successor.clone(),
            },
        ));
        Some((successor.request, successor.token))
    }

    /// DESIGNATE from our grantor: the successor of a hold (or none any more).
    pub(crate) fn on_designate(
        &mut self,
        from: &MemberId,
        request: RequestId,
        next: Option<Successor>,
    ) {
        if self.grantor.as_ref() != Some(from) {
            return;
        }
        if let Some(held) = self.held.get_mut(&request) {
            held.successor = next.map(|s| (from.clone(), s));
        }
    }

    fn unlock_message(&self, request: RequestId, r: &Release) -> LockMessage {
        LockMessage::Unlock {
            request,
            name: r.name.clone(),
            owner: self.owner(r.owner),
            token: r.token,
            lazy: r.lazy,
            passed_to: r.passed_to,
        }
    }

    /// A new view: follow its coordinator as grantor, and send it every pending request and
    /// release again. The grantor deduplicates by request id, so this is harmless, and it means
    /// nothing depends on a report reaching a reconciliation in time.
    pub(crate) fn on_view(&mut self, now: Instant, view: &View, out: &mut Outbox) {
        self.epoch = view.epoch();
        self.turn_grantors.clear();
        self.follow(now, view.coordinator().clone(), out);
        match self.early_report.take() {
            Some((asker, epoch)) if epoch == view.epoch() && asker == *view.coordinator() => {
                let report = self.report_to_grantor(now, epoch);
                out.push_back((asker, report));
            }
            Some(early) if early.1 > view.epoch() => self.early_report = Some(early),
            _ => {}
        }
    }

    /// Follows no grantor until the next [`Client::follow`]: requests, cancels and releases
    /// wait (they are all sent then), and no grant is accepted.
    pub(crate) fn unfollow(&mut self) {
        self.grantor = None;
    }

    /// Follows `grantor` (the view's coordinator, or the member the grantor role was
    /// transferred to): sends it every pending request, cancel and release again, and, if it
    /// is another grantor than before, what this member holds and waits for.
    pub(crate) fn follow(&mut self, now: Instant, grantor: MemberId, out: &mut Outbox) {
        let moved = self.grantor.as_ref() != Some(&grantor);
        self.turn_grantors.insert(grantor.clone());
        self.grantor = Some(grantor.clone());
        let pending: Vec<(RequestId, Pending)> =
            self.pending.iter().map(|(r, p)| (*r, p.clone())).collect();
        let messages: Vec<LockMessage> = pending
            .iter()
            .map(|(r, p)| self.lock_message(now, *r, p))
            .collect();
        for p in self.pending.values_mut() {
            p.sent = true;
        }
        out.extend(messages.into_iter().map(|m| (grantor.clone(), m)));
        // Cancels too: a copy of a cancelled request may still sit in some grantor's queue
        // (or its backlog); the cancel is idempotent and is answered by `Denied`.
        for (request, name) in &self.cancelled {
            out.push_back((
                grantor.clone(),
                LockMessage::Cancel {
                    request: *request,
                    name: name.clone(),
                },
            ));
        }
        if !self.forget_releases {
            for (request, release) in &self.releases {
                out.push_back((grantor.clone(), self.unlock_message(*request, release)));
            }
        }
        let extending: Vec<(RequestId, LockName, Duration)> = self
            .held
            .iter()
            .filter_map(|(r, h)| h.extending.map(|(_, d)| (*r, h.name.clone(), d)))
            .collect();
        for (request, name, lease) in extending {
            let stamp = self.stamp(now);
            if let Some(h) = self.held.get_mut(&request) {
                h.extending = Some((stamp, lease));
            }
            out.push_back((
                grantor.clone(),
                LockMessage::ExtendLease {
                    request,
                    name,
                    lease_ms: millis_up(lease),
                    stamp,
                },
            ));
        }
        if moved {
            // A grantor we come (back) to may still hold what we released elsewhere meanwhile
            // tell it what we hold and wait for, after the resends.
            out.push_back((
                grantor,
                LockMessage::Holding {
                    held: self.held.keys().copied().collect(),
                    pending: self.pending.keys().copied().collect(),
                    upto: Some(RequestId(self.next_request.saturating_sub(1))),
                },
            ));
        }
    }

    /// Marks every held lock lost (minority, lease expiry, shutdown). Each is also released at the
    /// grantor, like an unlock, so the grantor's table and this member agree again.
    pub(crate) fn lose_all(
        &mut self,
        reason: LockLostReason,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        for request in self.held.keys().copied().collect::<Vec<_>>() {
            self.lose(request, reason, out, notices);
        }
    }

    /// Marks one held lock lost, reports it and releases it at the grantor.
    fn lose(
        &mut self,
        request: RequestId,
        reason: LockLostReason,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        if let Some(held) = self.held.remove(&request) {
            debug!(lock = %held.name, %request, ?reason, "lock lost");
            let release = Release {
                name: held.name.clone(),
                owner: held.owner,
                token: held.table_token,
                lazy: false,
                passed_to: None,
            };
            if let Some(grantor) = &self.grantor {
                out.push_back((grantor.clone(), self.unlock_message(request, &release)));
            }
            self.releases.insert(request, release);
            notices.push_back(LockNotice::Lost {
                request,
                name: held.name,
                owner: held.owner,
                token: held.token,
                reason,
            });
        }
    }

    /// Times out pending requests whose deadline passed.
    pub(crate) fn expire_requests(
        &mut self,
        now: Instant,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        let expired: Vec<RequestId> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline.is_some_and(|d| d <= now))
            .map(|(r, _)| *r)
            .collect();
        for request in expired {
            if let Some(name) = self.pending.get(&request).map(|p| p.name.clone()) {
                self.cancel(request, out);
                notices.push_back(LockNotice::Refused {
                    request,
                    name,
                    reason: Refusal::Timeout,
                });
            }
        }
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.pending.values().filter_map(|p| p.deadline).min()
    }

    /// Handles an answer of a grantor. `of_our_view` is false for a grant made in another
    /// view than this member's: it is handled as one from a member that is not our grantor,
    /// whoever sent it.
    pub(crate) fn handle(
        &mut self,
        now: Instant,
        from: &MemberId,
        of_our_view: bool,
        message: LockMessage,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        let from_grantor = of_our_view && self.grantor.as_ref() == Some(from);
        match message {
            LockMessage::Granted { .. } => {
                self.on_granted(now, from, from_grantor, message, out, notices);
            }
            LockMessage::Queued { request, position } if from_grantor => {
                self.on_queued(request, position, notices);
            }
            LockMessage::Renewed { stamp, held } => self.on_renewed(now, stamp, held),
            LockMessage::Denied {
                request,
                name,
                unavailable,
            } if from_grantor => self.on_denied(request, name, unavailable, notices),
            LockMessage::UnlockAck { request } => self.on_unlock_ack(request, notices),
            LockMessage::DuplicateLock { name, owner, token } if from_grantor => {
                self.on_duplicate_lock(&name, &owner, token, notices);
            }
            LockMessage::LockInfoRequest { epoch } => {
                self.on_lock_info_request(now, from, from_grantor, epoch, out);
            }
            LockMessage::Queued { .. }
            | LockMessage::Denied { .. }
            | LockMessage::DuplicateLock { .. }
            | LockMessage::Lock { .. }
            | LockMessage::Cancel { .. }
            | LockMessage::Unlock { .. }
            | LockMessage::Renew { .. }
            | LockMessage::LockInfoResponse { .. }
            | LockMessage::Serving { .. }
            | LockMessage::TableRequest { .. }
            | LockMessage::Table { .. }
            | LockMessage::Holding { .. }
            | LockMessage::ExtendLease { .. }
            | LockMessage::TransferRequest { .. }
            | LockMessage::Handoff { .. }
            | LockMessage::Transferred { .. }
            | LockMessage::NotGrantor { .. }
            | LockMessage::Revoke { .. }
            | LockMessage::Designate { .. }
            | LockMessage::Passed { .. } => {}
        }
    }

    /// What this member holds, as a report names it (each lease as what is left of it).
    pub(crate) fn held_locks(&self, now: Instant) -> Vec<ReportedHold> {
        self.held
            .iter()
            .map(|(request, h)| ReportedHold {
                request: *request,
                name: h.name.clone(),
                owner: self.owner(h.owner),
                mode: h.mode,
                token: h.table_token,
                lease_ms: h
                    .lease_until
                    .map(|t| millis_up(t.saturating_duration_since(now))),
            })
            .collect()
    }

    /// The report answering a grantor's request: the grantor rebuilds its table from the
    /// reports, without the designations it made before (one-hop handoff): every designation
    /// held here is dropped (the holder releases plainly; the grantor grants the successor
    /// itself), and a grant passed on that was designated before this report is refused.
    pub(crate) fn report_to_grantor(&mut self, now: Instant, epoch: u64) -> LockMessage {
        for held in self.held.values_mut() {
            held.successor = None;
        }
        self.reported_stamp = self.next_stamp;
        self.report(now, epoch)
    }

    /// What this member holds, waits for and releases: its reconciliation report.
    pub(crate) fn report(&self, now: Instant, epoch: u64) -> LockMessage {
        LockMessage::LockInfoResponse {
            epoch,
            held: self.held_locks(now),
            pending: self
                .pending
                .iter()
                .map(|(request, p)| PendingRequest {
                    request: *request,
                    name: p.name.clone(),
                    owner: self.owner(p.owner),
                    mode: p.mode,
                    wait: p.wait,
                    lease_ms: p.lease.map(millis_up),
                })
                .collect(),
            releases: if self.forget_releases {
                Vec::new()
            } else {
                self.releases
                    .iter()
                    .map(|(request, r)| PendingRelease {
                        request: *request,
                        name: r.name.clone(),
                        owner: self.owner(r.owner),
                        token: r.token,
                    })
                    .collect()
            },
        }
    }
}

/// `d` in whole milliseconds, rounded up (a lease is never sent shorter than asked).
fn millis_up(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms).unwrap_or(u64::MAX)
}
