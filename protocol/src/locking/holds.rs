//! The locks of local owners: their status, lease checks and renewals, and giving them up.

use std::time::Duration;

use conclave_lock_api::wire::NODE_OWNER;
use conclave_lock_api::{LockLostReason, RequestId};

use super::client::Held;
use super::timers::Timer;
use super::types::{HoldInfo, HoldStatus, LockNotice, Refusal};
use super::LockMachine;
use crate::time::Instant;

impl LockMachine {
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

    /// How many holds of this member were lost because their own lease
    /// ([`LockRequest::lease`](super::LockRequest::lease)) ran out.
    pub fn leases_expired(&self) -> u64 {
        self.acquisition_leases_expired
    }

    /// What the owner of a hold leased from `leased_from` should believe at `now`.
    ///
    /// `Majority`: held while the lease was renewed within `suspend_after`, suspended until the
    /// lease runs out, then lost; lost at once in a minority view. `Available`: held while the
    /// grantor was heard within `suspend_after`, suspended after.
    pub(super) fn hold_status(&self, now: Instant, hold: &Held) -> HoldStatus {
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

    pub(super) fn grantor_silence(&self, now: Instant) -> Option<Duration> {
        let grantor = self.client.grantor()?;
        if *grantor == self.local {
            return Some(Duration::ZERO);
        }
        self.last_heard
            .get(grantor)
            .map(|t| now.saturating_duration_since(*t))
    }

    /// `Majority`: reports held locks lost once their lease ran out, and keeps a periodic
    /// check armed while locks are held or this member is the grantor.
    pub(super) fn check_leases(&mut self, now: Instant) {
        if !self.config.policy.is_majority() {
            self.timers.stop(Timer::LeaseCheck);
            return;
        }
        self.client
            .expire_leases(now, self.config.lease, &mut self.outbox, &mut self.notices);
        self.arm_renewal(now);
        let active = self.client.has_held() || self.grantor.is_active();
        let next = active.then(|| now + self.config.lease_margin.max(Duration::from_millis(1)) / 2);
        self.timers.set(Timer::LeaseCheck, next);
    }

    /// `Majority`: schedules the next renewal if there is anything to renew.
    pub(super) fn arm_renewal(&mut self, now: Instant) {
        let wanted = if self.config.policy.is_majority() {
            self.client.wants_renewal()
        } else {
            self.client.has_leased_pending()
        };
        if !wanted {
            self.timers.stop(Timer::Renewal);
        } else if self.timers.get(Timer::Renewal).is_none() {
            let interval = (self.config.suspend_after / 2).max(Duration::from_millis(1));
            self.timers.set(Timer::Renewal, Some(now + interval));
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
            self.client.unlock(*request, false, None, &mut self.outbox);
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

    pub(super) fn give_up(&mut self, now: Instant, lost: LockLostReason, refusal: Refusal) {
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
}
