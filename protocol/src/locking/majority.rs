//! `Majority` terms and support, seen from the lock service: the grantor's term, the
//! member's promises, lease beats, and the refusal of requests in a minority view (see
//! `docs/protocol.md`, "Leases (`Majority`)" and "Partition policies"). The bookkeeping of a
//! term's support and of a member's promises is in `lease.rs`.

use std::time::Duration;

use conclave_lock_api::wire::LeaseBeat;
use conclave_lock_api::{MemberId, RequestId, View};
use tracing::{debug, info};

use super::config::PartitionPolicy;
use super::lease::{scale, Support, Term};
use super::types::{Authority, LockNotice, Refusal, MAX_TERM};
use super::LockMachine;
use crate::time::Instant;

/// The `Majority` state of a lock service: its term while it grants, its promises, and since
/// when its view has been a minority.
#[derive(Debug, Default)]
pub(super) struct Majority {
    /// What this member promised to which grantor.
    pub(super) support: Support,
    /// This member's term while it is the grantor.
    pub(super) term: Option<Term>,
    /// Since when this member's view has been a minority.
    pub(super) minority_since: Option<Instant>,
    /// A named service: the default service's right to grant, lent to this one.
    pub(super) borrowed: Option<Authority>,
    /// A named service: the borrowed term its grantor last started (reconciled) in.
    pub(super) started_term: Option<u64>,
    /// Sabotage: waits in a minority are never refused.
    pub(super) keep_waits_in_minority: bool,
    /// Sabotage ([`super::LockSabotage::service_without_term`]).
    pub(super) service_without_term: bool,
}

impl LockMachine {
    /// Every input starts here: the process's birth, and whether this grantor's term lost its
    /// majority since the last input. A term that lapsed never serves again: while it lacked
    /// support, a later term may have served (a member in both majorities can restart and
    /// forget its promise), so the grantor begins a new term, with a new reconciliation and
    /// a new grace period.
    ///
    /// A term whose tokens ran out (`Grantor::exhausted`) also gives way to a new term: its
    /// number is higher, so its tokens exceed every token of the old one.
    pub(super) fn enter(&mut self, now: Instant) {
        self.majority.support.touch(now);
        let lapsed =
            self.grantor.is_active() && self.majority.term.as_ref().is_some_and(|t| t.lapsed(now));
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

    /// Becomes the grantor afresh: under `Majority` a new term above every term heard of (its
    /// tokens exceed every earlier grantor's), then reconciliation.
    pub(super) fn begin_term(&mut self, now: Instant, view: &View) {
        if self.borrows() {
            self.majority.started_term = self.majority.borrowed.and_then(|a| a.term);
        } else if self.config.policy.is_majority() {
            // Above every term heard of, and every token's term seen (a term whose tokens
            // ran out gives way to a higher one).
            let seen = self.grantor.table.last_token().epoch();
            let term = self.majority.support.max_term.max(seen).saturating_add(1);
            self.majority.support.observe_term(term);
            self.majority.term = Some(Term::new(term));
            self.refresh_own_support(now);
        }
        let ctx = self.ctx(now, view);
        self.grantor.start(&ctx, &mut self.outbox);
        if self.borrows() {
            // A named service starts in the member's current term: every hold of the
            // service that no grantor of this term granted or renewed was last confirmed
            // while an earlier term had support, which ended before this term's quorum, so it
            // ran out by the term's grace end. It waits for that, not a grace of its own.
            let grace_end = self.majority.borrowed.and_then(|a| a.grace_end);
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
    pub(super) fn keep_term(&mut self, now: Instant, view: &View) {
        let (window, size) = (self.support_window(), self.cluster_size());
        if let (Some(term), Some(size)) = (self.majority.term.as_mut(), size) {
            term.keep_supporters(view, window, size);
        }
        if self.majority.term.as_ref().is_some_and(|t| t.lapsed(now)) {
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
        let probe = match self.majority.term.as_mut() {
            Some(term) if self.grantor.is_active() => Some(term.probe(now)),
            _ => None,
        };
        let to_grantor = self.view.as_ref().is_some_and(|v| v.coordinator() == to)
            || self.majority.support.promise_anyone;
        let (mut echo, mut refused) = (None, None);
        if to_grantor {
            refused = self
                .majority
                .support
                .owed_term(to)
                .and_then(|term| self.majority.support.refuses(to, term));
            let (born_wait, duration) = (self.born_wait(), self.config.support_lease);
            echo = self.majority.support.echo_for(now, to, born_wait, duration);
        }
        let beat = LeaseBeat {
            max_term: self.majority.support.max_term,
            probe,
            echo,
            refused,
        };
        self.arm_timers();
        Some(beat)
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
        self.majority.support.observe_term(beat.max_term);
        if let Some(probe) = beat.probe {
            let ours = self.view.as_ref().is_some_and(|v| v.coordinator() == from);
            if ours || self.majority.support.promise_anyone {
                self.majority.support.probed(from, probe);
            } else {
                self.majority.support.observe_term(probe.term);
            }
        }
        // Support counts from members of our view only (a removed member's stopped counting
        // when it was removed; `keep_term`).
        let member = self.view.as_ref().is_some_and(|v| v.contains(from));
        if let (Some(echo), Some(term), true) = (beat.echo, self.majority.term.as_mut(), member) {
            term.echoed(from, echo);
        }
        if let Some(promised) = beat.refused {
            // The term is unusable: `from` promised an equal term to another grantor.
            self.majority.support.observe_term(promised);
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
            && self.majority.term.as_ref().is_some_and(|t| {
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

    /// `Majority`: a grantor supports its own term while it may (it counts towards the
    /// majority like any member).
    pub(super) fn refresh_own_support(&mut self, now: Instant) {
        if self.borrows() {
            return;
        }
        let (born_wait, duration) = (self.born_wait(), self.config.support_lease);
        let Some(term) = self.majority.term.as_mut() else {
            return;
        };
        if !self.grantor.is_active() {
            return;
        }
        if self
            .majority
            .support
            .promise_self(now, &self.local, term.term, born_wait, duration)
        {
            term.supported(&self.local, now);
        }
        self.note_quorum(now);
    }

    /// Records when the term's support first reached a majority (the grace period runs from
    /// then: every earlier grantor's support had ended by then) and until when it lasts.
    pub(super) fn note_quorum(&mut self, now: Instant) {
        let (window, size) = (self.support_window(), self.cluster_size());
        if let (Some(term), Some(size)) = (self.majority.term.as_mut(), size) {
            let first = term.quorum_at.is_none();
            if term.update(now, window, size) && first {
                debug!(member = %self.local, term = term.term, "grantor term supported by a majority");
            }
        }
    }

    /// How long a grantor counts a member's support from the send time of the probe echoed.
    pub(super) fn support_window(&self) -> Duration {
        scale(
            self.config.support_lease,
            self.config.lease,
            self.config.lease + self.config.lease_margin,
        )
    }

    /// How long a new process waits before it supports anyone (it may have promised in a
    /// past life, on a clock that may run slower than ours).
    pub(super) fn born_wait(&self) -> Duration {
        scale(
            self.config.support_lease,
            self.config.lease + self.config.lease_margin,
            self.config.lease,
        )
    }

    pub(super) fn cluster_size(&self) -> Option<usize> {
        match self.config.policy {
            PartitionPolicy::Majority { cluster_size } => Some(cluster_size),
            PartitionPolicy::Available => None,
        }
    }

    /// Whether the grantor may vouch for holds now.
    pub(super) fn lease_ok(&self, now: Instant) -> bool {
        let Some(size) = self.cluster_size() else {
            return true;
        };
        if let Some(lent) = self.majority.borrowed {
            if self.majority.service_without_term {
                return true;
            }
            return lent.term.is_some()
                && lent.term == self.majority.started_term
                && lent.quorum_until.is_some_and(|until| now < until);
        }
        self.majority
            .term
            .as_ref()
            .is_some_and(|t| t.has_quorum(now, self.support_window(), size))
    }

    /// `Majority`: when the new term's grace period ends (`None` before a majority supported
    /// it).
    pub(super) fn grace_end(&self) -> Option<Instant> {
        if let Some(lent) = self
            .majority
            .borrowed
            .filter(|_| self.config.policy.is_majority())
        {
            if self.majority.service_without_term {
                return Some(Instant::ZERO);
            }
            return lent.grace_end;
        }
        let fence = self.config.lease + self.config.lease_margin;
        self.majority.term.as_ref()?.quorum_at.map(|q| q + fence)
    }

    /// `Majority`: restores the highest term this member promised before it restarted, read
    /// from stable storage. It never supports that term or a lower one again, so every
    /// grantor's later term, and every fencing token issued in it, exceeds the tokens issued
    /// before the restart (see `docs/protocol.md`, "Tokens across restarts").
    pub fn restore_term(&mut self, term: u64) {
        // A named service promises nothing of its own (it borrows the default service's term)
        // but keeps the floor too, for its own table of terms heard of.
        self.majority.support.restore(term);
    }

    /// `Majority`: a term this member must write to stable storage before it sends what it
    /// produced since the last call (it just promised it; see [`LockMachine::restore_term`]).
    #[must_use]
    pub fn poll_durable_term(&mut self) -> Option<u64> {
        self.majority.support.take_unsaved()
    }

    /// Withdraws a pending request: this member cannot be granted anything (minority).
    pub(super) fn refuse_no_quorum(&mut self, request: RequestId) {
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
    pub(super) fn refuse_waits_in_minority(&mut self, now: Instant) {
        if self.majority.keep_waits_in_minority {
            return;
        }
        let expired = self
            .majority
            .minority_since
            .is_some_and(|since| now.saturating_duration_since(since) >= self.config.lease);
        if expired {
            for request in self.client.pending_requests().copied().collect::<Vec<_>>() {
                self.refuse_no_quorum(request);
            }
        }
    }
}
