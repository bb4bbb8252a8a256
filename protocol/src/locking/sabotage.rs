//! Test-only sabotage and the grant logs the simulator's checkers read.

use conclave_lock_api::{FencingToken, LockMode, LockName};

use super::cache::CachedGrant;
use super::types::LockSabotage;
use super::LockMachine;

impl LockMachine {
    /// Breaks the protocol on purpose (simulator tests of the checkers only).
    #[cfg(feature = "sim")]
    pub fn set_sabotage(&mut self, sabotage: LockSabotage) {
        self.grantor.sabotage.grant_while_reconciling = sabotage.grant_while_reconciling;
        self.grantor.sabotage.skip_liveness_recheck = sabotage.skip_liveness_recheck;
        self.grantor.table.reuse_tokens = sabotage.reuse_fencing_token;
        self.client.forget_releases = sabotage.forget_pending_releases;
        self.client.anchor_at_receipt = sabotage.anchor_leases_at_receipt;
        self.majority.support.promise_anyone = sabotage.promise_anyone;
        self.majority.keep_waits_in_minority = sabotage.keep_waits_in_minority;
        self.cache.serve_after_return = sabotage.cache_after_return;
        self.cache.repeat_token = sabotage.cache_repeat_token;
        self.majority.service_without_term = sabotage.service_without_term;
        self.grantor.table.grant_over_delegations = sabotage.grant_over_delegations;
        self.client.lease_from_receipt = sabotage.lease_from_receipt;
        self.grantor.sabotage.serve_after_handoff = sabotage.serve_after_handoff;
        self.client.pass_keeps_hold = sabotage.pass_keeps_hold;
        self.client.pass_to_any = sabotage.pass_to_any;
        self.grantor.sabotage.pass_without_fence = sabotage.pass_without_fence;
        self.arm_timers();
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
    pub(super) fn known_for_tokens(&self) -> u64 {
        if let Some(lent) = self
            .majority
            .borrowed
            .filter(|_| self.config.policy.is_majority())
        {
            lent.max_term
        } else if self.config.policy.is_majority() {
            self.majority.support.max_term
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
}
