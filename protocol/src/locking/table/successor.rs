//! One-hop handoff in the table: the waiter granted in advance to follow the sole holder
//! (see `docs/protocol.md`, "One-hop handoff").

use conclave_lock_api::wire::{GrantView, NODE_OWNER};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, RequestId};

use super::{is_node_grant, same, Designated, Holder, LockTable};
use crate::time::Instant;

impl LockTable {
    /// Grants `name` in advance to the head of its queue, to take effect at the release of
    /// its sole holder: only when one plain hold is all there is, the head is a plain
    /// exclusive request, `accepts` accepts the members of both (live, and able to take a
    /// handoff), nothing is fenced and no successor stands already. Takes the grant's token and returns the holder it follows and the
    /// successor; `None` (nothing changed) otherwise.
    pub(crate) fn designate(
        &mut self,
        name: &LockName,
        (epoch, view): (u64, GrantView),
        now: Instant,
        accepts: impl Fn(&MemberId) -> bool,
    ) -> Option<(Holder, Designated)> {
        let entry = self.locks.get(name)?;
        let [holder] = entry.holders.as_slice() else {
            return None;
        };
        let head = entry.queue.front()?;
        let eligible = entry.successor.is_none()
            && entry.not_before.is_none_or(|t| t <= now)
            && !is_node_grant(holder)
            && head.owner.local != NODE_OWNER
            && head.mode == LockMode::Exclusive
            && accepts(&holder.owner.member)
            && accepts(&head.owner.member);
        if !eligible {
            return None;
        }
        let holder = holder.clone();
        let token = self.next_token(epoch, 1)?;
        let entry = self.locks.get_mut(name)?;
        let waiter = entry.queue.pop_front()?;
        let designated = Designated {
            after: (holder.owner.member.clone(), holder.request),
            waiter,
            token,
            view,
        };
        entry.successor = Some(designated.clone());
        Some((holder, designated))
    }

    /// The successor standing for `name`, if any.
    pub(crate) fn successor(&self, name: &LockName) -> Option<&Designated> {
        self.locks.get(name)?.successor.as_ref()
    }

    /// Completes the handoff of `name` to its successor, if it is `member`'s `request` with
    /// `token`: the holder it follows is released, the successor holds with its lease from
    /// `now`. Returns the new holder.
    pub(crate) fn complete_pass(
        &mut self,
        name: &LockName,
        member: &MemberId,
        request: RequestId,
        token: FencingToken,
        now: Instant,
    ) -> Option<Holder> {
        let entry = self.locks.get_mut(name)?;
        let d = entry.successor.take_if(|d| {
            same(&d.waiter.owner, d.waiter.request, member, request) && d.token == token
        })?;
        let (after_member, after_request) = &d.after;
        entry
            .holders
            .retain(|h| !same(&h.owner, h.request, after_member, *after_request));
        let holder = d.waiter.hold(d.token, now);
        entry.holders.push(holder.clone());
        Some(holder)
    }

    /// The lock whose successor is `member`'s `request`, with the successor's token.
    pub(crate) fn successor_of(
        &self,
        member: &MemberId,
        request: RequestId,
    ) -> Option<(LockName, FencingToken)> {
        self.locks.iter().find_map(|(name, e)| {
            e.successor
                .as_ref()
                .filter(|d| same(&d.waiter.owner, d.waiter.request, member, request))
                .map(|d| (name.clone(), d.token))
        })
    }

    /// Drops every successor whose member `keep` rejects (it left the view). The holder may
    /// still pass the lock on to it, and the departed member may take it: its lock is then
    /// granted to nobody else before `not_before(member)`, the end of any lease that grant
    /// could have. Returns each lock with the holder that was told of the successor.
    pub(crate) fn drop_successors(
        &mut self,
        keep: impl Fn(&MemberId) -> bool,
        not_before: impl Fn(&MemberId) -> Option<Instant>,
    ) -> Vec<(LockName, (MemberId, RequestId))> {
        let mut dropped = Vec::new();
        for (name, entry) in &mut self.locks {
            let Some(d) = entry.successor.take_if(|d| !keep(&d.waiter.owner.member)) else {
                continue;
            };
            if let Some(t) = not_before(&d.waiter.owner.member) {
                entry.not_before = Some(entry.not_before.map_or(t, |old| old.max(t)));
            }
            dropped.push((name.clone(), d.after));
        }
        dropped
    }
}
