//! This member as grantor, seen from the lock service: what its grantor role is told at
//! each input ([`Ctx`]), its timers, and its table for checkers and status queries.

use conclave_lock_api::{LockMode, LockName, OwnerId, RequestId, View};

use super::config::PartitionPolicy;
use super::grantor::{Ctx, GrantorStats};
use super::LockMachine;
use crate::time::Instant;

impl LockMachine {
    pub(super) fn tick_grantor(&mut self, now: Instant) {
        if let Some(view) = self.view.clone() {
            let ctx = self.ctx(now, &view);
            self.grantor.handle_timeout(&ctx, &mut self.outbox);
        }
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

    pub(super) fn ctx<'a>(&self, now: Instant, view: &'a View) -> Ctx<'a> {
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
                self.majority.started_term
            } else {
                self.majority.term.as_ref().map(|t| t.term)
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

    /// Under `Available`: this member grants, and its fencing tokens ran out for their epoch.
    /// It grants nothing until a view with a higher epoch, at least the one returned, which
    /// the endpoint then asks the membership layer for ([`crate::gms::Gms::renew_view`]).
    pub fn needs_new_view(&self) -> Option<u64> {
        (!self.config.policy.is_majority() && self.grantor.exhausted())
            .then(|| self.grantor.table.last_token().epoch().saturating_add(1))
    }
}
