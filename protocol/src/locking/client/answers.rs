//! The client's handlers of its grantor's answers, one per message kind.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::{LockMessage, Successor};
use conclave_lock_api::{
    FencingToken, LockLostReason, LockMode, LockName, MemberId, OwnerId, RequestId, UnexpectedGrant,
};
use tracing::debug;

use super::{Client, Held, Pending};
use crate::locking::lease::scale;
use crate::locking::types::{LockNotice, Outbox, Refusal};
use crate::time::Instant;

impl Client {
    /// GRANTED: held if it answers a pending request of ours from our grantor; otherwise
    /// reported and settled (given back, or left to a cancel or a resend).
    pub(super) fn on_granted(
        &mut self,
        now: Instant,
        from: &MemberId,
        from_grantor: bool,
        grant: LockMessage,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        let LockMessage::Granted {
            request,
            name,
            token,
            stamp,
            cached,
            lease_ms,
            view: _,
        } = grant
        else {
            return;
        };
        let grant = (request, &name, token);
        if self.settle_unexpected_grant(from, from_grantor, grant, out, notices) {
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
                    self.give_back_and_ask_again(now, from, request, name, token, out, notices);
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
                    self.give_back_and_ask_again(now, from, request, name, token, out, notices);
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
                successor: None,
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

    /// Settles a grant this member does not take as a new hold (a copy, a grant of another
    /// grantor, of a withdrawn or finished request); returns whether it did.
    fn settle_unexpected_grant(
        &mut self,
        from: &MemberId,
        from_grantor: bool,
        (request, name, token): (RequestId, &LockName, FencingToken),
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) -> bool {
        let name = name.clone();
        if let Some(pending) = self.pending.get_mut(&request) {
            if pending.given_back.get(from).is_some_and(|t| token <= *t) {
                // A copy of a grant already given back (the grantor answered a resend
                // of the request before the give-back reached it).
                return true;
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
            return true;
        }
        if !from_grantor && self.turn_grantors.contains(from) {
            // A grant of an earlier turn of this view, made before that grantor handed
            // its table over: the table, this grant in it, went to our grantor, and
            // the former grantor applies nothing now (a give-back sent there would be
            // lost, the hold left in our grantor's table). A request still pending or
            // cancelled is settled
            // with our grantor by its resend; anything else is given back there.
            notices.push_back(self.unexpected(request, &name, token, UnexpectedGrant::NotGrantor));
            let settled =
                self.pending.contains_key(&request) || self.cancelled.contains_key(&request);
            if let (false, Some(grantor)) = (settled, self.grantor.clone()) {
                out.push_back((grantor, self.give_back(request, name, token)));
            }
            return true;
        }
        if !from_grantor {
            // A grant of a member that is not our grantor (any more): give it back,
            // or it stays in that member's table for ever. The request, if still
            // pending, waits for our grantor.
            debug!(%from, %request, "grant from a member that is not our grantor; releasing it there");
            notices.push_back(self.unexpected(request, &name, token, UnexpectedGrant::NotGrantor));
            self.note_given_back(from, request, token);
            out.push_back((from.clone(), self.give_back(request, name, token)));
            return true;
        }
        if let Some(held) = self.held.get_mut(&request) {
            // A resend of a grant we have, or a new grant of the same request by our
            // grantor (it rebuilt its table meanwhile, or a copy of the request that
            // predates a split reached it): its table holds the request under this
            // token, which the release must name. Not the higher of the two: after a
            // split the hold may come from another lineage with higher tokens, and a
            // release naming that token would leave this grant in the table for
            // ever.
            held.table_token = token;
            return true;
        }
        if self.cancelled.contains_key(&request) {
            // A grant our cancel will release.
            notices.push_back(self.unexpected(request, &name, token, UnexpectedGrant::Withdrawn));
            return true;
        }
        if !self.pending.contains_key(&request) {
            // A request we finished long ago, delivered again (a stale copy after a
            // partition): give the grant back so the grantor's table does not keep it.
            debug!(%request, lock = %name, "grant of a finished request; releasing it");
            notices.push_back(self.unexpected(request, &name, token, UnexpectedGrant::Stale));
            out.push_back((from.clone(), self.give_back(request, name, token)));
            return true;
        }
        false
    }

    /// PASSED by a holder: the grant of `grantor` for one of our requests, taken as a GRANTED
    /// of that grantor (`of_our_view` as for one).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_passed(
        &mut self,
        now: Instant,
        grantor: &MemberId,
        of_our_view: bool,
        name: LockName,
        grant: Successor,
        out: &mut Outbox,
        notices: &mut VecDeque<LockNotice>,
    ) {
        if self.pass_to_any && !self.pending.contains_key(&grant.request) {
            // Sabotage: hold whatever is passed, waited for or not.
            self.pending.insert(
                grant.request,
                Pending {
                    name: name.clone(),
                    owner: 0,
                    mode: LockMode::Exclusive,
                    wait: true,
                    deadline: None,
                    sent: true,
                    given_back: BTreeMap::new(),
                    told_queued: true,
                    lease: grant.lease_ms.map(Duration::from_millis),
                    quiet: true,
                },
            );
        }
        if !self.pass_to_any && self.held.contains_key(&grant.request) {
            // A copy of a grant this request holds, or a stale designation of it (its grantor
            // rebuilt its table and granted the request itself since): the table holds the
            // request under the token of the hold, which the release must go on naming.
            return;
        }
        let ours = self.grantor.as_ref() == Some(grantor);
        // Designated before this member's latest report: the grantor rebuilt its table since
        // (even in this view: a new `Majority` term) and knows nothing of it.
        let before_report = !self.pass_to_any && grant.stamp < self.reported_stamp;
        if ours && (!of_our_view || before_report) && self.pending.contains_key(&grant.request) {
            // Our grantor's grant, made in a view we have left: the grantor completes the
            // handoff when the holder's release reaches it, so it is given back there, and
            // the request asked again after it (in that order, on one ordered channel).
            debug!(request = %grant.request, lock = %name, "passed grant of an earlier view; giving it back");
            self.give_back_then_ask(now, grantor, grant.request, name, grant.token, out);
            return;
        }
        let from_grantor = of_our_view && ours;
        let granted = LockMessage::Granted {
            request: grant.request,
            name,
            token: grant.token,
            stamp: grant.stamp,
            cached: false,
            lease_ms: grant.lease_ms,
            view: Some(grant.view),
        };
        self.on_granted(now, grantor, from_grantor, granted, out, notices);
    }

    /// QUEUED by our grantor: told once per request.
    pub(super) fn on_queued(
        &mut self,
        request: RequestId,
        position: u32,
        notices: &mut VecDeque<LockNotice>,
    ) {
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

    /// RENEWED: the grantor confirmed these holds after the stamp was sent.
    pub(super) fn on_renewed(&mut self, now: Instant, stamp: u64, held: Vec<RequestId>) {
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
                    let until = sent + scale(lease, self.drift.0, self.drift.1);
                    h.lease_until = h.lease_until.map(|t| t.max(until));
                }
            }
        }
    }

    /// DENIED by our grantor.
    pub(super) fn on_denied(
        &mut self,
        request: RequestId,
        name: LockName,
        unavailable: bool,
        notices: &mut VecDeque<LockNotice>,
    ) {
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

    /// UNLOCK-ACK: the release is done.
    pub(super) fn on_unlock_ack(&mut self, request: RequestId, notices: &mut VecDeque<LockNotice>) {
        if self.releases.remove(&request).is_some() {
            notices.push_back(LockNotice::Released { request });
        }
    }

    /// DUPLICATE-LOCK from our grantor: another holder of the lock was kept.
    pub(super) fn on_duplicate_lock(
        &mut self,
        name: &LockName,
        owner: &OwnerId,
        token: FencingToken,
        notices: &mut VecDeque<LockNotice>,
    ) {
        if owner.member != self.local {
            return;
        }
        let lost: Vec<RequestId> = self
            .held
            .iter()
            .filter(|(_, h)| {
                h.name == *name
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

    /// LOCK-INFO request: the report of this member, for a reconciliation.
    pub(super) fn on_lock_info_request(
        &mut self,
        now: Instant,
        from: &MemberId,
        from_grantor: bool,
        epoch: u64,
        out: &mut Outbox,
    ) {
        // Answer only the grantor of the view we are in: the answer certifies that we
        // installed that view, which a `Majority` grantor needs from a majority before
        // its epoch may appear in fencing tokens.
        if from_grantor && epoch == self.epoch {
            let report = self.report_to_grantor(now, epoch);
            out.push_back((from.clone(), report));
        } else if epoch > self.epoch && self.early_report.as_ref().is_none_or(|(_, e)| epoch >= *e)
        {
            // The request overtook its view: a coordinator that leaves sends the view
            // to every member itself, and its successor's request comes on another
            // stream. Answered once this member installs that view, if it does:
            // dropped, the successor would wait out its reconciliation timeout.
            self.early_report = Some((from.clone(), epoch));
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
        self.give_back_then_ask(now, from, request, name, token, out);
    }

    /// Gives the grant `token` of `request` back to `from` and, if the request still waits,
    /// asks `from` for it again after that (one ordered channel: the release arrives first).
    fn give_back_then_ask(
        &mut self,
        now: Instant,
        from: &MemberId,
        request: RequestId,
        name: LockName,
        token: FencingToken,
        out: &mut Outbox,
    ) {
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
            passed_to: None,
        }
    }
}
