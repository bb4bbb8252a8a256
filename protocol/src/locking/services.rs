//! Named lock services: a service numbered from 1 borrows the default service's right to
//! grant under `Majority` (see `docs/protocol.md`, "Named lock services").

use conclave_lock_api::MemberId;
use tracing::info;

use super::config::LockConfig;
use super::types::{Authority, SERVICE_SHIFT};
use super::LockMachine;
use crate::time::Instant;

impl LockMachine {
    /// The member's named lock service number `index` (from 1; 0 is the default service that
    /// [`LockMachine::new`] makes). Its request ids and table queries start at
    /// `index << SERVICE_SHIFT`; under `Majority` it grants under the default service's term,
    /// which the owner passes in before every input (the endpoint does).
    pub fn for_service(local: MemberId, config: LockConfig, index: u64) -> Self {
        let mut service = Self::new(local, config);
        let first = (index << SERVICE_SHIFT) + 1;
        service.client.start_ids_at(first);
        service.queries.start_at(first);
        service.majority.borrowed = (index != 0).then(Authority::default);
        service
    }

    /// The default service's right to grant, to lend to named services (`Majority`).
    pub(crate) fn authority(&mut self, now: Instant) -> Authority {
        self.enter(now);
        // A term that lapsed just now began a new one: its reconciliation asks this member
        // too, and a message to itself goes nowhere unless it is handled here (else, under
        // `Majority`, the grantor loses its own waits).
        self.pump(now);
        let (window, size) = (self.support_window(), self.cluster_size());
        let term = self
            .majority
            .term
            .as_ref()
            .filter(|_| self.grantor.is_active());
        Authority {
            term: term.map(|t| t.term),
            quorum_until: term
                .zip(size)
                .and_then(|(t, size)| t.quorum_until(window, size)),
            grace_end: term.and(self.grace_end()),
            max_term: self.majority.support.max_term,
        }
    }

    /// A named service: takes the default service's right to grant as of `now`. If the term
    /// changed while this service grants, its grantor starts again (reconciles) in the new
    /// term, as the default service's did. `quiet` only records it (a view follows, which
    /// decides).
    pub(crate) fn lend_authority(&mut self, now: Instant, authority: Authority, quiet: bool) {
        if self.majority.borrowed.is_none() || !self.config.policy.is_majority() {
            return;
        }
        self.majority.borrowed = Some(authority);
        if quiet {
            self.arm_timers();
            return;
        }
        self.enter(now);
        let restart = self.grantor.is_active() && authority.term != self.majority.started_term;
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
    /// lease after the service opened).
    pub(crate) fn inherit_minority_since(&mut self, other: &LockMachine) {
        if self.majority.minority_since.is_some() {
            self.majority.minority_since = other
                .majority
                .minority_since
                .or(self.majority.minority_since);
        }
        self.arm_timers();
    }

    /// Whether this service grants under a term lent by the default service.
    pub(super) fn borrows(&self) -> bool {
        self.majority.borrowed.is_some() && self.config.policy.is_majority()
    }
}
