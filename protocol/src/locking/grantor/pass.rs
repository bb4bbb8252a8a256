//! The grantor's side of the one-hop handoff (see `docs/protocol.md`, "One-hop handoff"): it
//! grants the next waiter in advance and tells the holder, who passes the grant on at its
//! release; the grantor completes the handoff in its table when it hears of it.

use std::collections::BTreeMap;

use conclave_lock_api::wire::{LockMessage, Successor};
use conclave_lock_api::{FencingToken, LockName, MemberId, RequestId};
use tracing::debug;

use super::{grant_view, millis_down, Ctx, Grantor};
use crate::locking::types::Outbox;

impl Grantor {
    /// Grants `name` in advance to the head of its queue, if it can be (see
    /// `LockTable::designate`), and tells the holder.
    pub(super) fn designate(&mut self, ctx: &Ctx<'_>, name: &LockName, out: &mut Outbox) {
        if !self.one_hop || !self.may_grant(ctx) {
            return;
        }
        let view = grant_view(ctx.view);
        let takers = &self.handoff_takers;
        let Some((holder, d)) = self
            .table
            .designate(name, (self.epoch, view), ctx.now, |m| {
                ctx.view.contains(m) && takers.contains(m)
            })
        else {
            return;
        };
        let member = d.waiter.owner.member.clone();
        let stamp = self.stamp_of(&member);
        // The grant may be delivered as soon as the holder releases: vouch for it now, so a
        // departed successor's lock stays fenced for as long as that grant could last.
        self.vouch(&member, ctx.now);
        self.stats.designations += 1;
        out.push_back((
            holder.owner.member,
            LockMessage::Designate {
                request: holder.request,
                name: name.clone(),
                next: Some(Successor {
                    member,
                    request: d.waiter.request,
                    token: d.token,
                    stamp,
                    lease_ms: d.waiter.lease.map(millis_down),
                    view,
                }),
            },
        ));
    }

    /// Records that `member`'s requests say it takes one-hop handoffs.
    pub(super) fn note_handoff_taker(&mut self, member: &MemberId) {
        if !self.handoff_takers.contains(member) {
            self.handoff_takers.insert(member.clone());
        }
    }

    /// Tells the holder of `name` (`after`) that its designation is withdrawn, unless a new
    /// one replaced it.
    pub(super) fn undesignate(
        &self,
        name: &LockName,
        after: (MemberId, RequestId),
        out: &mut Outbox,
    ) {
        if self.table.successor(name).is_some_and(|d| d.after == after) {
            return;
        }
        out.push_back((
            after.0,
            LockMessage::Designate {
                request: after.1,
                name: name.clone(),
                next: None,
            },
        ));
    }

    /// The release of `from`'s `request` (with `token`) passed `name` on to `passed_to` (the
    /// successor's request and the token of the grant passed): completes the handoff if that
    /// very designation stands (a designation of an earlier table, say before a
    /// reconciliation, names another token) and the release is of the hold it follows.
    /// Returns whether it did.
    pub(super) fn complete_pass(
        &mut self,
        ctx: &Ctx<'_>,
        name: &LockName,
        (from, request, token): (&MemberId, RequestId, FencingToken),
        (passed_to, passed_token): (RequestId, FencingToken),
        out: &mut Outbox,
    ) -> bool {
        let Some(d) = self.table.successor(name) else {
            return false;
        };
        let follows = d.after.0 == *from
            && d.after.1 == request
            && d.waiter.request == passed_to
            && d.token == passed_token;
        let released = self
            .table
            .holder(name, from, request)
            .is_some_and(|h| h.token == token);
        if !(follows && released) {
            return false;
        }
        let (member, successor_token, view) = (d.waiter.owner.member.clone(), d.token, d.view);
        self.finish_pass(ctx, name, &member, (passed_to, successor_token), view, out)
    }

    /// The successor itself releases (or gives back) its request with the designated token:
    /// the holder passed the lock on, whether or not its release arrived. Completes that
    /// handoff, so that the release applies to it. (Only the designated token counts: a late
    /// copy of an older release of the same request, given back and asked again, is none.)
    pub(super) fn pass_evidenced(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        request: RequestId,
        token: FencingToken,
        out: &mut Outbox,
    ) {
        if !self.one_hop {
            return;
        }
        let Some((name, designated)) = self.table.successor_of(from, request) else {
            return;
        };
        let view = self.table.successor(&name).map(|d| d.view);
        if let (true, Some(view)) = (designated == token, view) {
            self.finish_pass(ctx, &name, from, (request, token), view, out);
        }
    }

    /// The successor `member`'s `request` holds `name` now with `token`.
    fn finish_pass(
        &mut self,
        ctx: &Ctx<'_>,
        name: &LockName,
        member: &MemberId,
        (request, token): (RequestId, FencingToken),
        view: conclave_lock_api::wire::GrantView,
        out: &mut Outbox,
    ) -> bool {
        let Some(holder) = self
            .table
            .complete_pass(name, member, request, token, ctx.now)
        else {
            return false;
        };
        self.stats.passes += 1;
        // The grant counts from here (the token checker sees it in this order: nothing else
        // of this lock was granted since the designation took its token).
        self.log_grant(name, token, &holder.owner, holder.mode);
        if view != grant_view(ctx.view) {
            // Made in an earlier view: the successor, in this one, may have refused it (and
            // given it back, which frees it again). Sent again for this view.
            self.vouch(member, ctx.now);
            out.push_back((
                member.clone(),
                LockMessage::Granted {
                    request,
                    name: name.clone(),
                    token,
                    stamp: self.stamp_of(member),
                    cached: false,
                    lease_ms: holder
                        .lease_until
                        .map(|t| millis_down(t.saturating_duration_since(ctx.now))),
                    view: Some(grant_view(ctx.view)),
                },
            ));
        }
        debug!(lock = %name, %member, %request, "handoff completed");
        true
    }

    /// Drops the successors of members that left the view. The holder may still pass the
    /// lock on, and the departed member take it: under `Majority` the lock is fenced until
    /// the lease of that grant would end (it was vouched for when made); the holder is told
    /// the designation is withdrawn.
    pub(super) fn drop_departed_successors(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        let fences: BTreeMap<MemberId, Option<crate::time::Instant>> = self
            .table
            .waiters()
            .map(|(_, w)| w.owner.member.clone())
            .filter(|m| !ctx.view.contains(m))
            .map(|m| {
                let fence = if self.sabotage.pass_without_fence {
                    None
                } else {
                    self.fenced_until(ctx, &m)
                };
                (m, fence)
            })
            .collect();
        if fences.is_empty() {
            return;
        }
        let dropped = self.table.drop_successors(
            |m| ctx.view.contains(m),
            |m| fences.get(m).copied().flatten(),
        );
        for (name, after) in dropped {
            debug!(lock = %name, "successor left the view; designation withdrawn");
            if ctx.view.contains(&after.0) {
                self.undesignate(&name, after, out);
            }
        }
    }
}
