//! The grantor serving requests: one handler per message kind, and the promotion of waiters
//! (see `docs/protocol.md`, "Grantor" and "Node grants").

use std::collections::BTreeSet;
use std::time::Duration;

use conclave_lock_api::wire::{LockMessage, NODE_OWNER};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId};
use tracing::debug;

use super::{grant_view, millis_down, Ctx, Grantor, LAST_WRITES_MAX, REVOKED_MAX};
use crate::locking::table::{Verdict, Waiter};
use crate::locking::types::Outbox;
use crate::time::Instant;

impl Grantor {
    /// Handles LOCK, HOLDING, EXTEND-LEASE, CANCEL and UNLOCK.
    pub(super) fn serve(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        message: LockMessage,
        out: &mut Outbox,
    ) {
        match message {
            LockMessage::Lock { .. } => self.on_lock(ctx, from, message, out),
            // Only a serving table can hold leftovers of this member; a reconciling one is
            // rebuilt from the member's report anyway.
            LockMessage::Holding {
                held,
                pending,
                upto,
            } if self.is_serving() => self.on_holding(ctx, from, held, pending, upto, out),
            LockMessage::ExtendLease {
                request,
                lease_ms,
                stamp,
                ..
            } => self.on_extend_lease(ctx, from, request, lease_ms, stamp, out),
            LockMessage::Cancel { request, name } => self.on_cancel(ctx, from, request, name, out),
            LockMessage::Unlock { .. } => self.on_unlock(ctx, from, message, out),
            _ => {}
        }
    }

    /// LOCK: granted at once, queued, or denied; a resend of a granted request is answered
    /// with its grant again (if the grantor may vouch for it now).
    fn on_lock(&mut self, ctx: &Ctx<'_>, from: &MemberId, message: LockMessage, out: &mut Outbox) {
        let LockMessage::Lock {
            request,
            name,
            owner,
            mode,
            wait,
            lease_ms,
            quiet,
            passes,
            ..
        } = message
        else {
            return;
        };
        if owner.member != *from {
            return;
        }
        if passes && ctx.view.contains(from) {
            self.note_handoff_taker(from);
        }
        let cached = self.cacheable(&name, &owner, mode, ctx.now);
        let (token, lease_until) = if let Some(h) = self.table.holder(&name, from, request) {
            if !ctx.lease_ok {
                return;
            }
            (h.token, h.lease_until)
        } else if self.table.is_queued(&name, from, request) {
            return;
        } else {
            let waiter = Waiter {
                owner,
                mode,
                request,
                lease: lease_ms.map(Duration::from_millis),
            };
            match self.grant_new(ctx, from, &name, waiter, (wait, quiet), out) {
                Some(grant) => grant,
                None => return,
            }
        };
        let lease_ms = lease_until.map(|t| millis_down(t.saturating_duration_since(ctx.now)));
        let stamp = self.stamp_of(from);
        if cached {
            self.stats.node_grants += 1;
            if mode == LockMode::Shared {
                self.stats.delegations += 1;
            }
        }
        self.vouch(from, ctx.now);
        out.push_back((
            from.clone(),
            LockMessage::Granted {
                request,
                name,
                token,
                stamp,
                cached,
                lease_ms,
                view: Some(grant_view(ctx.view)),
            },
        ));
    }

    /// A new request: granted now (its token and lease end), or queued or denied (`None`).
    fn grant_new(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        name: &LockName,
        waiter: Waiter,
        (wait, quiet): (bool, bool),
        out: &mut Outbox,
    ) -> Option<(FencingToken, Option<Instant>)> {
        let (request, mode) = (waiter.request, waiter.mode);
        let free = self.table.can_grant_now(name, mode, ctx.now);
        if !(self.may_grant(ctx) && free) {
            // A node grant in the way goes back as soon as its node is done.
            self.revoke_node_grants(name, Some(&waiter.owner), out);
            if wait {
                let position = self.table.enqueue(name, waiter);
                self.designate(ctx, name, out);
                // Queued behind another owner: tell the client, unless it asked not to be
                // told. (A request that waits only for the grantor to be able to grant is
                // not.)
                if !free {
                    if quiet {
                        self.stats.quiet_waits += 1;
                    } else {
                        out.push_back((from.clone(), LockMessage::Queued { request, position }));
                    }
                }
            } else {
                out.push_back((
                    from.clone(),
                    LockMessage::Denied {
                        request,
                        name: name.clone(),
                        unavailable: free,
                    },
                ));
            }
            return None;
        }
        let lease_until = waiter.lease.map(|d| ctx.now + d);
        let owner = waiter.owner.clone();
        // `may_grant` keeps a node grant's block in reserve, so a token is always left.
        let token = self.table.grant(name, waiter, self.epoch, ctx.now)?;
        self.log_grant(name, token, &owner, mode);
        self.note_write(name, mode, ctx.now);
        Some((token, lease_until))
    }

    /// HOLDING: what the member still holds and waits for; the rest of its entries go.
    fn on_holding(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        held: Vec<RequestId>,
        pending: Vec<RequestId>,
        upto: Option<RequestId>,
        out: &mut Outbox,
    ) {
        let keep: BTreeSet<RequestId> = held.into_iter().chain(pending).collect();
        // Requests made after the statement was sent are not spoken for: it may come
        // late (from before the member left this grantor and came back).
        let touched = self
            .table
            .retain_member(from, |r| keep.contains(&r) || upto.is_some_and(|u| r > u));
        for name in touched {
            debug!(%from, lock = %name, "a hold or wait the member no longer has; dropped");
            self.promote(ctx, &name, out);
            self.table.forget_if_unused(&name, ctx.now);
        }
    }

    /// EXTEND-LEASE: a hold's lease reaches further.
    fn on_extend_lease(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        request: RequestId,
        lease_ms: u64,
        stamp: u64,
        out: &mut Outbox,
    ) {
        let lease = Duration::from_millis(lease_ms);
        if self.table.extend_lease(from, request, ctx.now, lease) && ctx.lease_ok {
            self.vouch(from, ctx.now);
            out.push_back((
                from.clone(),
                LockMessage::Renewed {
                    stamp,
                    held: vec![request],
                },
            ));
        }
    }

    /// CANCEL: a wait withdrawn, or a hold released (the grant raced the cancel).
    fn on_cancel(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        request: RequestId,
        name: LockName,
        out: &mut Outbox,
    ) {
        let successor_of = self
            .table
            .successor(&name)
            .filter(|d| d.waiter.owner.member == *from && d.waiter.request == request)
            .map(|d| d.after.clone());
        let was_holder = self.table.withdraw(&name, from, request).is_none()
            && self.table.release(&name, from, request).is_some();
        out.push_back((
            from.clone(),
            LockMessage::Denied {
                request,
                name: name.clone(),
                unavailable: false,
            },
        ));
        if was_holder {
            self.promote(ctx, &name, out);
        }
        if let Some(after) = successor_of {
            // The successor withdrew (it refuses the grant from now on): the next waiter, if
            // any, is designated instead; otherwise the holder is told.
            self.designate(ctx, &name, out);
            self.undesignate(&name, after, out);
        }
        self.table.forget_if_unused(&name, ctx.now);
    }

    /// UNLOCK: the grant named by its token is released and acknowledged.
    fn on_unlock(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        message: LockMessage,
        out: &mut Outbox,
    ) {
        let LockMessage::Unlock {
            request,
            name,
            token,
            lazy,
            passed_to,
            ..
        } = message
        else {
            return;
        };
        let passed = passed_to
            .is_some_and(|next| self.complete_pass(ctx, &name, (from, request, token), next, out));
        if !passed {
            // The successor's own release (or give-back) of the designated grant before the
            // holder's news: the holder passed it on.
            self.pass_evidenced(ctx, from, request, token, out);
        }
        // Only the grant named by its token: a request given back (its grant arrived
        // after its lease) asks again under the same id, and a late copy of the old
        // release must not free the new grant or withdraw the new wait.
        let freed = !passed
            && self
                .table
                .release_grant(&name, from, request, token)
                .is_some();
        if lazy && *from != self.local {
            self.stats.lazy_acks += 1;
            self.lazy_acks.hold(ctx.now, from, request, out);
        } else {
            out.push_back((from.clone(), LockMessage::UnlockAck { request }));
        }
        if freed || passed {
            self.promote(ctx, &name, out);
        }
        self.table.forget_if_unused(&name, ctx.now);
    }

    pub(super) fn promote_all(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        for name in self.table.names_with_waiters() {
            self.promote(ctx, &name, out);
        }
    }

    /// Grants queued requests of `name` that can go now, re-checking at this moment that each
    /// waiter's member is still in the view (etcd 3.4.3 granted to dead waiters).
    pub(super) fn promote(&mut self, ctx: &Ctx<'_>, name: &LockName, out: &mut Outbox) {
        if !self.may_grant(ctx) {
            return;
        }
        let skip_check = self.sabotage.skip_liveness_recheck;
        let granted = self
            .table
            .promote(name, ctx.now, self.epoch, |owner: &OwnerId| {
                if skip_check || ctx.view.contains(&owner.member) {
                    Verdict::Grant
                } else {
                    Verdict::Drop
                }
            });
        for holder in granted {
            self.stats.contended_grants += 1;
            self.log_grant(name, holder.token, &holder.owner, holder.mode);
            let stamp = self.stamp_of(&holder.owner.member);
            let cached = self.cacheable(name, &holder.owner, holder.mode, ctx.now);
            self.note_write(name, holder.mode, ctx.now);
            self.vouch(&holder.owner.member, ctx.now);
            out.push_back((
                holder.owner.member.clone(),
                LockMessage::Granted {
                    request: holder.request,
                    name: name.clone(),
                    token: holder.token,
                    stamp,
                    cached,
                    lease_ms: holder
                        .lease_until
                        .map(|t| millis_down(t.saturating_duration_since(ctx.now))),
                    view: Some(grant_view(ctx.view)),
                },
            ));
            if cached {
                self.stats.node_grants += 1;
                if holder.mode == LockMode::Shared {
                    self.stats.delegations += 1;
                }
            }
        }
        // A node grant made while others still wait is asked back at once.
        if self.table.has_waiters(name) {
            self.revoke_node_grants(name, None, out);
        }
        self.designate(ctx, name, out);
    }

    /// Whether a grant of `mode` to `owner` is a node grant its member may cache: exclusive
    /// always; shared (a read delegation) unless the lock was granted for writing less than
    /// `delegation_grace` ago (CTDB defers new delegations after a write).
    pub(super) fn cacheable(
        &self,
        name: &LockName,
        owner: &OwnerId,
        mode: LockMode,
        now: Instant,
    ) -> bool {
        owner.local == NODE_OWNER
            && (mode == LockMode::Exclusive
                || self
                    .last_write
                    .get(name)
                    .is_none_or(|t| now >= *t + self.delegation_grace))
    }

    /// Remembers when `name` was last granted for writing.
    pub(super) fn note_write(&mut self, name: &LockName, mode: LockMode, now: Instant) {
        if mode != LockMode::Exclusive {
            return;
        }
        if self.last_write.len() >= LAST_WRITES_MAX {
            let grace = self.delegation_grace;
            self.last_write.retain(|_, t| now < *t + grace);
        }
        self.last_write.insert(name.clone(), now);
    }

    /// After a reconciliation, every read delegation the table learned of is asked back (as
    /// CTDB's recovery drops delegations): members fall back to asking.
    pub(super) fn revoke_delegations(&mut self, out: &mut Outbox) {
        let delegated: Vec<LockName> = self
            .table
            .holders()
            .filter(|(_, h)| h.owner.local == NODE_OWNER && h.mode == LockMode::Shared)
            .map(|(n, _)| n.clone())
            .collect();
        for name in delegated {
            self.revoke_node_grants(&name, None, out);
        }
    }

    /// Asks every node grant of `name` held by another owner than `asker` back, once per
    /// grant (a new grantor asks again: its table learned the grant from a report).
    pub(super) fn revoke_node_grants(
        &mut self,
        name: &LockName,
        asker: Option<&OwnerId>,
        out: &mut Outbox,
    ) {
        for holder in self.table.node_grants(name) {
            if asker == Some(&holder.owner) {
                continue;
            }
            let key = (holder.owner.member.clone(), holder.request, holder.token);
            if !self.revoked.insert(key) {
                continue;
            }
            self.stats.revokes += 1;
            if holder.mode == LockMode::Shared {
                self.stats.delegation_revocations += 1;
            }
            out.push_back((
                holder.owner.member.clone(),
                LockMessage::Revoke {
                    request: holder.request,
                    name: name.clone(),
                    token: holder.token,
                },
            ));
        }
        if self.revoked.len() > REVOKED_MAX {
            // Revokes of grants long gone; a grant still held is asked again, harmlessly.
            self.revoked.clear();
        }
    }

    /// The newest send stamp of `member` (0 if none).
    pub(super) fn stamp_of(&self, member: &MemberId) -> u64 {
        self.stamps.get(member).copied().unwrap_or(0)
    }

    /// Counts a grant; the simulator's token checker sees it, unless it is a node grant (its
    /// member's local grants from it are logged there, with the tokens owners are given).
    pub(super) fn log_grant(
        &mut self,
        _name: &LockName,
        _token: FencingToken,
        _owner: &OwnerId,
        _mode: LockMode,
    ) {
        self.stats.grants += 1;
        #[cfg(feature = "sim")]
        if _owner.local != NODE_OWNER {
            self.grant_log
                .push((self.stats.grants, _name.clone(), _token, _mode));
        }
    }
}
