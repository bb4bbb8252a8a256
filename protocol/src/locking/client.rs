//! The client role of every member: its pending requests, held locks and pending releases.
//!
//! The client talks to the grantor of its current view (the coordinator). It accepts grants
//! only from that grantor, so a late answer of a former grantor cannot make it hold a lock the
//! new grantor does not know about. Every release is kept until the grantor acknowledges it
//! and is resent to, and reported to, a new grantor (JGroups lost unlocks here: JGRP-2234).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::{HeldLock, LockMessage, PendingRelease, PendingRequest};
use conclave_lock_api::{
    FencingToken, LockLostReason, LockMode, LockName, MemberId, OwnerId, RequestId,
    UnexpectedGrant, View,
};
use tracing::debug;

use super::{LockNotice, Outbox, Refusal};
use crate::time::Instant;

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
    pub(crate) fn unlock(&mut self, request: RequestId, lazy: bool, out: &mut Outbox) -> bool {
        let Some(held) = self.held.remove(&request) else {
            return false;
        };
        let release = Release {
            name: held.name,
            owner: held.owner,
            token: held.table_token,
            lazy,
        };
        if let Some(grantor) = &self.grantor {
            out.push_back((grantor.clone(), self.unlock_message(request, &release)));
        }
        self.releases.insert(request, release);
        true
    }

    fn unlock_message(&self, request: RequestId, r: &Release) -> LockMessage {
        LockMessage::Unlock {
            request,
            name: r.name.clone(),
            owner: self.owner(r.owner),
            token: r.token,
            lazy: r.lazy,
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
                out.push_back((asker, self.report(now, epoch)));
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
            // (regression seed 46160): tell it what we hold and wait for, after the resends.
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
            LockMessage::Granted {
                request,
                name,
                token,
                stamp,
                cached,
                lease_ms,
                view: _,
            } => {
                if let Some(pending) = self.pending.get_mut(&request) {
                    if pending.given_back.get(from).is_some_and(|t| token <= *t) {
                        // A copy of a grant already given back (the grantor answered a resend
                        // of the request before the give-back reached it).
                        return;
                    }
                }
                let same_grant = self
                    .held
                    .get(&request)
                    .is_some_and(|h| token == h.token || token == h.table_token);
                if same_grant && !from_grantor {
                    // A copy of a grant we hold, from the grantor that made it, arriving after
                    // we moved to another grantor: the hold is ours (the new grantor learns it
                    // from our report); giving it back would free it under us.
                    return;
                }
                if !from_grantor && self.turn_grantors.contains(from) {
                    // A grant of an earlier turn of this view, made before that grantor handed
                    // its table over: the table, this grant in it, went to our grantor, and
                    // the former grantor applies nothing now (a give-back sent there would be
                    // lost, the hold left in our grantor's table: regression seed 499 of the
                    // named-services band). A request still pending or cancelled is settled
                    // with our grantor by its resend; anything else is given back there.
                    notices.push_back(self.unexpected(
                        request,
                        &name,
                        token,
                        UnexpectedGrant::NotGrantor,
                    ));
                    let settled = self.pending.contains_key(&request)
                        || self.cancelled.contains_key(&request);
                    if let (false, Some(grantor)) = (settled, self.grantor.clone()) {
                        out.push_back((grantor, self.give_back(request, name, token)));
                    }
                    return;
                }
                if !from_grantor {
                    // A grant of a member that is not our grantor (any more): give it back,
                    // or it stays in that member's table for ever. The request, if still
                    // pending, waits for our grantor.
                    debug!(%from, %request, "grant from a member that is not our grantor; releasing it there");
                    notices.push_back(self.unexpected(
                        request,
                        &name,
                        token,
                        UnexpectedGrant::NotGrantor,
                    ));
                    self.note_given_back(from, request, token);
                    out.push_back((from.clone(), self.give_back(request, name, token)));
                    return;
                }
                if let Some(held) = self.held.get_mut(&request) {
                    // A resend of a grant we have, or a new grant of the same request by our
                    // grantor (it rebuilt its table meanwhile, or a copy of the request that
                    // predates a split reached it): its table holds the request under this
                    // token, which the release must name. Not the higher of the two: after a
                    // split the hold may come from another lineage with higher tokens, and a
                    // release naming that token would leave this grant in the table for
                    // ever (regression seed 42087, harsh, `Available`).
                    held.table_token = token;
                    return;
                }
                if self.cancelled.contains_key(&request) {
                    // A grant our cancel will release.
                    notices.push_back(self.unexpected(
                        request,
                        &name,
                        token,
                        UnexpectedGrant::Withdrawn,
                    ));
                    return;
                }
                if !self.pending.contains_key(&request) {
                    // A request we finished long ago, delivered again (a stale copy after a
                    // partition): give the grant back so the grantor's table does not keep it.
                    debug!(%request, lock = %name, "grant of a finished request; releasing it");
                    notices.push_back(self.unexpected(
                        request,
                        &name,
                        token,
                        UnexpectedGrant::Stale,
                    ));
                    out.push_back((from.clone(), self.give_back(request, name, token)));
                    return;
                }
                let leased_from = match self.lease {
                    None => now,
                    Some(_) if self.anchor_at_receipt => now,
                    Some(lease) => match self.stamp_time(stamp) {
                        Some(sent) if now < sent + lease => sent,
                        _ => {
                            // The grant's lease ran out before it arrived (the grantor or
                            // this member stalled): holding it would be unsafe.
                            debug!(%request, lock = %name, "grant arrived after its lease; asking again");
                            self.give_back_and_ask_again(
                                now, from, request, name, token, out, notices,
                            );
                            return;
                        }
                    },
                };
                // The lease left when the grantor sent this (a grant sent again has less than
                // the whole lease); a grantor that does not say gave the whole lease.
                let lease = self
                    .pending
                    .get(&request)
                    .and_then(|p| p.lease)
                    .map(|d| lease_ms.map_or(d, |ms| d.min(Duration::from_millis(ms))));
                let lease_until = match lease {
                    None => None,
                    Some(d) if self.lease_from_receipt => Some(now + d),
                    Some(d) => match self.stamp_time(stamp) {
                        Some(sent) if now < sent + self.holder_share(d) => {
                            Some(sent + self.holder_share(d))
                        }
                        _ => {
                            // The hold's own lease ran out before its grant arrived (or its
                            // start is unknown).
                            debug!(%request, lock = %name, "grant arrived after its own lease; asking again");
                            self.give_back_and_ask_again(
                                now, from, request, name, token, out, notices,
                            );
                            return;
                        }
                    },
                };
                let Some(pending) = self.pending.remove(&request) else {
                    return;
                };
                self.held.insert(
                    request,
                    Held {
                        name: name.clone(),
                        owner: pending.owner,
                        mode: pending.mode,
                        token,
                        granted_in: self.epoch,
                        granted_by: from.clone(),
                        table_token: token,
                        leased_from,
                        cached,
                        lease_until,
                        extending: None,
                    },
                );
                notices.push_back(LockNotice::Granted {
                    request,
                    name,
                    owner: pending.owner,
                    mode: pending.mode,
                    token,
                });
            }
            LockMessage::Queued { request, position } => {
                if !from_grantor {
                    return;
                }
                if let Some(pending) = self.pending.get_mut(&request) {
                    if !pending.told_queued {
                        pending.told_queued = true;
                        notices.push_back(LockNotice::Queued {
                            request,
                            name: pending.name.clone(),
                            position,
                        });
                    }
                }
            }
            LockMessage::Renewed { stamp, held } => {
                // Any grantor's confirmation is evidence: it had the hold in its table and a
                // valid term when it answered, after the stamp was sent.
                let Some(sent) = self.stamp_time(stamp) else {
                    return;
                };
                let sent = if self.anchor_at_receipt { now } else { sent };
                for request in held {
                    let Some(h) = self.held.get_mut(&request) else {
                        continue;
                    };
                    h.leased_from = h.leased_from.max(sent);
                    if let Some((ext_stamp, lease)) = h.extending {
                        if ext_stamp == stamp {
                            h.extending = None;
                            let until =
                                sent + super::lease::scale(lease, self.drift.0, self.drift.1);
                            h.lease_until = h.lease_until.map(|t| t.max(until));
                        }
                    }
                }
            }
            LockMessage::Denied {
                request,
                name,
                unavailable,
            } => {
                if !from_grantor {
                    return;
                }
                if self.cancelled.remove(&request).is_some() {
                    return;
                }
                if self.pending.remove(&request).is_some() {
                    notices.push_back(LockNotice::Refused {
                        request,
                        name,
                        reason: if unavailable {
                            Refusal::Unavailable
                        } else {
                            Refusal::WouldBlock
                        },
                    });
                }
            }
            LockMessage::UnlockAck { request } => {
                if self.releases.remove(&request).is_some() {
                    notices.push_back(LockNotice::Released { request });
                }
            }
            LockMessage::DuplicateLock { name, owner, token } => {
                if !from_grantor || owner.member != self.local {
                    return;
                }
                let lost: Vec<RequestId> = self
                    .held
                    .iter()
                    .filter(|(_, h)| {
                        h.name == name
                            && h.owner == owner.local
                            && (h.token == token || h.table_token == token)
                    })
                    .map(|(r, _)| *r)
                    .collect();
                for request in lost {
                    if let Some(held) = self.held.remove(&request) {
                        debug!(lock = %name, %request, "duplicate lock: another holder was kept");
                        notices.push_back(LockNotice::Lost {
                            request,
                            name: held.name,
                            owner: held.owner,
                            token: held.token,
                            reason: LockLostReason::Duplicate,
                        });
                    }
                }
            }
            LockMessage::LockInfoRequest { epoch } => {
                // Answer only the grantor of the view we are in: the answer certifies that we
                // installed that view, which a `Majority` grantor needs from a majority before
                // its epoch may appear in fencing tokens.
                if from_grantor && epoch == self.epoch {
                    out.push_back((from.clone(), self.report(now, epoch)));
                } else if epoch > self.epoch
                    && self.early_report.as_ref().is_none_or(|(_, e)| epoch >= *e)
                {
                    // The request overtook its view: a coordinator that leaves sends the view
                    // to every member itself, and its successor's request comes on another
                    // stream. Answered once this member installs that view, if it does:
                    // dropped, the successor would wait out its reconciliation timeout.
                    self.early_report = Some((from.clone(), epoch));
                }
            }
            LockMessage::Lock { .. }
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
            | LockMessage::Revoke { .. } => {}
        }
    }

    /// A grant whose lease ran out before it arrived: reported, given back to `from`, and the
    /// request (still pending) asked again.
    #[allow(clippy::too_many_arguments)]
    fn give_back_and_ask_again(
        &mut self,
        now: Instant,
        from: &MemberId,
        request: RequestId,
        name: LockName,
        token: FencingToken,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        notices.push_back(self.unexpected(request, &name, token, UnexpectedGrant::LeaseRanOut));
        self.note_given_back(from, request, token);
        out.push_back((from.clone(), self.give_back(request, name, token)));
        if let Some(pending) = self.pending.get(&request).cloned() {
            let message = self.lock_message(now, request, &pending);
            out.push_back((from.clone(), message));
        }
    }

    fn note_given_back(&mut self, grantor: &MemberId, request: RequestId, token: FencingToken) {
        if let Some(pending) = self.pending.get_mut(&request) {
            let highest = pending.given_back.entry(grantor.clone()).or_insert(token);
            *highest = (*highest).max(token);
        }
    }

    /// The release of a grant this member does not want.
    /// The notice of a grant that reached this member unexpectedly, resolved for `reason`.
    fn unexpected(
        &self,
        request: RequestId,
        name: &LockName,
        token: FencingToken,
        reason: UnexpectedGrant,
    ) -> LockNotice {
        let owner = self
            .pending
            .get(&request)
            .map(|p| p.owner)
            .or_else(|| self.held.get(&request).map(|h| h.owner));
        LockNotice::Unexpected {
            request,
            name: name.clone(),
            owner,
            token,
            reason,
        }
    }

    fn give_back(&self, request: RequestId, name: LockName, token: FencingToken) -> LockMessage {
        LockMessage::Unlock {
            request,
            name,
            owner: self.owner(0),
            token,
            lazy: false,
        }
    }

    /// What this member holds, as a report names it (each lease as what is left of it).
    pub(crate) fn held_locks(&self, now: Instant) -> Vec<HeldLock> {
        self.held
            .iter()
            .map(|(request, h)| HeldLock {
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
