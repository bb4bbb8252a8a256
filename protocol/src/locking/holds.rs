//! Held locks seen by their owners: status, lease checks and renewals of the client side.

use std::time::Duration;

use conclave_lock_api::wire::NODE_OWNER;
use conclave_lock_api::RequestId;

use super::client::Held;
use super::timers::Timer;
use super::types::{HoldInfo, HoldStatus};
use super::LockService;
use crate::time::Instant;

impl LockService {
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
    /// ([`LockRequest::lease`]) ran out.
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
}
