//! The grantor's lock table: holders and FIFO waiters per lock, and fencing tokens.
//!
//! A pure data structure: it knows nothing of views, policies or messages. The grantor asks it
//! what can be granted and tells it what was.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::{
    GrantView, TableHolder, TableLock, TableWaiter, NODE_GRANT_TOKENS, NODE_OWNER,
};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId};

use crate::time::Instant;

mod successor;

/// A granted hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) owner: OwnerId,
    pub(crate) mode: LockMode,
    pub(crate) token: FencingToken,
    pub(crate) request: RequestId,
    /// The hold's own lease runs out then, on the grantor's clock (`None`: held until
    /// released).
    pub(crate) lease_until: Option<Instant>,
}

/// A queued request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Waiter {
    pub(crate) owner: OwnerId,
    pub(crate) mode: LockMode,
    pub(crate) request: RequestId,
    /// The lease the hold will have, from its grant.
    pub(crate) lease: Option<Duration>,
}

impl Waiter {
    /// The hold this request becomes when granted at `now` with `token`: its own lease, if
    /// it asked for one, runs from `now`.
    pub(crate) fn hold(self, token: FencingToken, now: Instant) -> Holder {
        Holder {
            owner: self.owner,
            mode: self.mode,
            token,
            request: self.request,
            lease_until: self.lease.map(|d| now + d),
        }
    }
}

/// What promotion may do with the waiter at the head of a queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Its member is live: grant if compatible.
    Grant,
    /// Its member is gone: drop the waiter.
    Drop,
}

#[derive(Debug, Default)]
struct Entry {
    holders: Vec<Holder>,
    queue: VecDeque<Waiter>,
    /// No grant before this instant (a departed holder's lease may still run).
    not_before: Option<Instant>,
    /// One-hop handoff: the waiter granted in advance, to take over at the sole holder's
    /// release (out of the queue; nobody else is granted while it stands).
    successor: Option<Designated>,
}

impl Entry {
    fn is_unused(&self, now: Instant) -> bool {
        self.holders.is_empty()
            && self.queue.is_empty()
            && self.successor.is_none()
            && self.not_before.is_none_or(|t| t <= now)
    }

    /// The waiters in order: the designated successor first.
    fn waiting(&self) -> impl Iterator<Item = &Waiter> {
        self.successor.iter().map(|d| &d.waiter).chain(&self.queue)
    }

    fn has_waiters(&self) -> bool {
        self.successor.is_some() || !self.queue.is_empty()
    }

    fn compatible(&self, mode: LockMode) -> bool {
        self.holders.iter().all(|h| h.mode.is_compatible_with(mode))
    }

    /// Sabotage: as if read delegations held nothing.
    fn compatible_over_delegations(&self, mode: LockMode) -> bool {
        self.holders
            .iter()
            .filter(|h| !(h.owner.local == NODE_OWNER && h.mode == LockMode::Shared))
            .all(|h| h.mode.is_compatible_with(mode))
    }
}

/// Locks, their holders and waiters, and the fencing-token counter.
#[derive(Debug, Default)]
pub(crate) struct LockTable {
    locks: BTreeMap<LockName, Entry>,
    last_token: FencingToken,
    /// Sabotage: hand out the last token again instead of a new one.
    pub(crate) reuse_tokens: bool,
    /// Sabotage: grant writers over read delegations without revoking them first.
    pub(crate) grant_over_delegations: bool,
}

/// Whether `holder` is a node grant: a hold of a member's node owner (exclusive: a cached lock;
/// shared: a read delegation), which takes a block of [`NODE_GRANT_TOKENS`] tokens for its
/// node's local acquisitions.
pub(crate) fn is_node_grant(holder: &Holder) -> bool {
    holder.owner.local == NODE_OWNER
}

/// The last token a hold may have handed out: its own, or the end of a node grant's block
/// (never past the end of its term: a block is made only where it fits).
fn block_end(holder: &Holder) -> FencingToken {
    if is_node_grant(holder) {
        let end_of_term = holder.token.0 | u64::from(u32::MAX);
        FencingToken(
            holder
                .token
                .0
                .saturating_add(NODE_GRANT_TOKENS - 1)
                .min(end_of_term),
        )
    } else {
        holder.token
    }
}

/// How many tokens a grant to `owner` takes: a node grant its whole block.
fn tokens_taken(owner: &OwnerId) -> u64 {
    if owner.local == NODE_OWNER {
        NODE_GRANT_TOKENS
    } else {
        1
    }
}

/// A grant made in advance to the waiter next in line, to take effect when the lock's sole
/// holder releases (one-hop handoff: the holder delivers it, see `docs/protocol.md`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Designated {
    /// The holder whose release it follows: its member and request.
    pub(crate) after: (MemberId, RequestId),
    /// The successor's request, out of the queue.
    pub(crate) waiter: Waiter,
    /// The token of the grant, taken when it was made.
    pub(crate) token: FencingToken,
    /// The view the grant was made in.
    pub(crate) view: GrantView,
}

fn same(owner: &OwnerId, request: RequestId, member: &MemberId, req: RequestId) -> bool {
    owner.member == *member && request == req
}

impl LockTable {
    /// Forgets every lock (the grantor rebuilds or stops), keeping the token counter.
    pub(crate) fn clear(&mut self) {
        self.locks.clear();
    }

    /// Makes every later token exceed `token`.
    pub(crate) fn observe_token(&mut self, token: FencingToken) {
        self.last_token = self.last_token.max(token);
    }

    /// The token the next grant at `epoch` would have, taking `count` tokens from it (a node
    /// grant's block), if they all fit in that token's term: above every token issued or
    /// observed, at least `epoch.0`, and never carried into the next term by the counter
    /// (`term << 32 | counter`; a token of term + 1 would be at or above what that term's
    /// grantor issues).
    fn peek_token(&self, epoch: u64, count: u64) -> Option<FencingToken> {
        let first = FencingToken::new(epoch, 0);
        let next = if self.last_token < first {
            first
        } else {
            FencingToken(self.last_token.0.checked_add(1)?)
        };
        let carried = self.last_token >= first && next.epoch() != self.last_token.epoch();
        let fits = u64::from(next.counter()) + count - 1 <= u64::from(u32::MAX);
        (!carried && fits).then_some(next)
    }

    /// Whether the counter of the current term (`epoch`, or a higher one observed) is used
    /// up: a node grant's block no longer fits in it. The grantor then grants nothing more in
    /// this term (see `Grantor::exhausted`); the rest of the term goes unused.
    pub(crate) fn exhausted(&self, epoch: u64) -> bool {
        !self.reuse_tokens && self.peek_token(epoch, NODE_GRANT_TOKENS).is_none()
    }

    /// A token above every token issued or observed, and at least `epoch.0`, taking `count`
    /// tokens; `None` if they do not fit in the term (nothing is taken then).
    fn next_token(&mut self, epoch: u64, count: u64) -> Option<FencingToken> {
        if self.reuse_tokens && self.last_token.0 > 0 {
            return Some(self.last_token);
        }
        let next = self.peek_token(epoch, count)?;
        self.last_token = next;
        Some(next)
    }

    pub(crate) fn holder(
        &self,
        name: &LockName,
        member: &MemberId,
        request: RequestId,
    ) -> Option<&Holder> {
        self.locks
            .get(name)?
            .holders
            .iter()
            .find(|h| same(&h.owner, h.request, member, request))
    }

    /// Whether `member`'s `request` holds some lock.
    pub(crate) fn holds_request(&self, member: &MemberId, request: RequestId) -> bool {
        self.locks.values().any(|e| {
            e.holders
                .iter()
                .any(|h| same(&h.owner, h.request, member, request))
        })
    }

    pub(crate) fn is_queued(&self, name: &LockName, member: &MemberId, request: RequestId) -> bool {
        self.locks.get(name).is_some_and(|e| {
            e.waiting()
                .any(|w| same(&w.owner, w.request, member, request))
        })
    }

    /// Whether `mode` could be granted at once: nobody waits ahead (FIFO, and a queued
    /// exclusive request holds back later shared ones), the holders are compatible, and no
    /// departed holder's lease may still run.
    pub(crate) fn can_grant_now(&self, name: &LockName, mode: LockMode, now: Instant) -> bool {
        let over = self.grant_over_delegations;
        self.locks.get(name).is_none_or(|e| {
            !e.has_waiters()
                && (e.compatible(mode) || over && e.compatible_over_delegations(mode))
                && e.not_before.is_none_or(|t| t <= now)
        })
    }

    /// Records a grant at `now` and returns its token; `None` (nothing recorded) if its
    /// tokens do not fit in the term (never while the term is not [`LockTable::exhausted`]).
    pub(crate) fn grant(
        &mut self,
        name: &LockName,
        waiter: Waiter,
        epoch: u64,
        now: Instant,
    ) -> Option<FencingToken> {
        let token = self.next_token(epoch, tokens_taken(&waiter.owner))?;
        self.insert_holder(name, waiter.hold(token, now));
        Some(token)
    }

    /// Extends the lease of `member`'s hold `request` to at least `now + lease`; whether the
    /// hold is in the table. A hold without a lease keeps none.
    pub(crate) fn extend_lease(
        &mut self,
        member: &MemberId,
        request: RequestId,
        now: Instant,
        lease: Duration,
    ) -> bool {
        for entry in self.locks.values_mut() {
            for h in &mut entry.holders {
                if same(&h.owner, h.request, member, request) {
                    if let Some(until) = &mut h.lease_until {
                        *until = (*until).max(now + lease);
                    }
                    return true;
                }
            }
        }
        false
    }

    /// Removes every hold whose own lease ran out at `now`; returns them by lock.
    pub(crate) fn expire_leases(&mut self, now: Instant) -> Vec<(LockName, Holder)> {
        let mut expired = Vec::new();
        for (name, entry) in &mut self.locks {
            entry.holders.retain(|h| {
                let over = h.lease_until.is_some_and(|t| t <= now);
                if over {
                    expired.push((name.clone(), h.clone()));
                }
                !over
            });
        }
        expired
    }

    /// The earliest instant a hold's own lease runs out.
    pub(crate) fn next_lease_expiry(&self) -> Option<Instant> {
        self.holders().filter_map(|(_, h)| h.lease_until).min()
    }

    /// Adds a holder as reported in reconciliation (its token is kept). A node grant's
    /// whole token block is taken: every later token exceeds it.
    pub(crate) fn insert_holder(&mut self, name: &LockName, holder: Holder) {
        self.observe_token(block_end(&holder));
        self.locks
            .entry(name.clone())
            .or_default()
            .holders
            .push(holder);
    }

    /// Queues `waiter`; returns its place in the queue, from 1.
    pub(crate) fn enqueue(&mut self, name: &LockName, waiter: Waiter) -> u32 {
        let queue = &mut self.locks.entry(name.clone()).or_default().queue;
        queue.push_back(waiter);
        u32::try_from(queue.len()).unwrap_or(u32::MAX)
    }

    /// Removes the hold granted to `request` of `member`.
    pub(crate) fn release(
        &mut self,
        name: &LockName,
        member: &MemberId,
        request: RequestId,
    ) -> Option<Holder> {
        let entry = self.locks.get_mut(name)?;
        let index = entry
            .holders
            .iter()
            .position(|h| same(&h.owner, h.request, member, request))?;
        Some(entry.holders.remove(index))
    }

    /// Removes the hold granted to `request` of `member` with `token`.
    pub(crate) fn release_grant(
        &mut self,
        name: &LockName,
        member: &MemberId,
        request: RequestId,
        token: FencingToken,
    ) -> Option<Holder> {
        let entry = self.locks.get_mut(name)?;
        let index = entry
            .holders
            .iter()
            .position(|h| same(&h.owner, h.request, member, request) && h.token == token)?;
        Some(entry.holders.remove(index))
    }

    /// Removes and returns every holder of `name`.
    pub(crate) fn take_holders(&mut self, name: &LockName) -> Vec<Holder> {
        self.locks
            .get_mut(name)
            .map(|e| std::mem::take(&mut e.holders))
            .unwrap_or_default()
    }

    /// Removes the queued `request` of `member`.
    pub(crate) fn withdraw(
        &mut self,
        name: &LockName,
        member: &MemberId,
        request: RequestId,
    ) -> Option<Waiter> {
        let entry = self.locks.get_mut(name)?;
        if let Some(d) = entry
            .successor
            .take_if(|d| same(&d.waiter.owner, d.waiter.request, member, request))
        {
            return Some(d.waiter);
        }
        let index = entry
            .queue
            .iter()
            .position(|w| same(&w.owner, w.request, member, request))?;
        entry.queue.remove(index)
    }

    /// Removes every hold of `member`; each lock it held may not be granted before
    /// `not_before` (if given). Returns the locks it held.
    pub(crate) fn remove_holders_of(
        &mut self,
        member: &MemberId,
        not_before: Option<Instant>,
    ) -> Vec<LockName> {
        let mut touched = Vec::new();
        for (name, entry) in &mut self.locks {
            let before = entry.holders.len();
            entry.holders.retain(|h| h.owner.member != *member);
            if entry.holders.len() != before {
                if let Some(t) = not_before {
                    entry.not_before = Some(entry.not_before.map_or(t, |old| old.max(t)));
                }
                touched.push(name.clone());
            }
        }
        touched
    }

    /// Removes every hold and wait of `member` whose request `keep` rejects. Returns the locks
    /// that lost a holder or a waiter.
    pub(crate) fn retain_member(
        &mut self,
        member: &MemberId,
        mut keep: impl FnMut(RequestId) -> bool,
    ) -> Vec<LockName> {
        let mut touched = Vec::new();
        for (name, entry) in &mut self.locks {
            let before = (entry.holders.len(), entry.queue.len());
            entry
                .holders
                .retain(|h| h.owner.member != *member || keep(h.request));
            entry
                .queue
                .retain(|w| w.owner.member != *member || keep(w.request));
            if entry
                .successor
                .as_ref()
                .is_some_and(|d| d.waiter.owner.member == *member && !keep(d.waiter.request))
            {
                // The member says it neither holds nor waits for it: it refused the handoff
                // or never had it, and refuses it from now on.
                entry.successor = None;
                touched.push(name.clone());
                continue;
            }
            if (entry.holders.len(), entry.queue.len()) != before {
                touched.push(name.clone());
            }
        }
        touched
    }

    /// Removes every waiter whose member `keep` rejects.
    pub(crate) fn remove_waiters(&mut self, mut keep: impl FnMut(&MemberId) -> bool) {
        for entry in self.locks.values_mut() {
            entry.queue.retain(|w| keep(&w.owner.member));
        }
    }

    /// Grants from the head of `name`'s queue while the head is compatible with the holders.
    /// `verdict` re-checks each waiter's liveness at this moment. Returns the new holders.
    pub(crate) fn promote(
        &mut self,
        name: &LockName,
        now: Instant,
        epoch: u64,
        mut verdict: impl FnMut(&OwnerId) -> Verdict,
    ) -> Vec<Holder> {
        let mut granted = Vec::new();
        while let Some(entry) = self.locks.get_mut(name) {
            if entry.not_before.is_some_and(|t| t > now) {
                break;
            }
            if entry.successor.is_some() {
                // The successor granted in advance goes first, with its token, once the
                // holder it follows is gone (released without passing it on, expired,
                // departed).
                if !entry.holders.is_empty() {
                    break;
                }
                let Some(d) = entry.successor.take() else {
                    break;
                };
                if verdict(&d.waiter.owner) == Verdict::Drop {
                    continue;
                }
                let holder = d.waiter.hold(d.token, now);
                entry.holders.push(holder.clone());
                granted.push(holder);
                continue;
            }
            let Some(head) = entry.queue.front() else {
                break;
            };
            if verdict(&head.owner) == Verdict::Drop {
                entry.queue.pop_front();
                continue;
            }
            let over = self.grant_over_delegations && entry.compatible_over_delegations(head.mode);
            if !(entry.compatible(head.mode) || over) {
                break;
            }
            let count = tokens_taken(&head.owner);
            if self.peek_token(epoch, count).is_none() && !self.reuse_tokens {
                // The term's tokens are used up: the waiters wait for the next term.
                break;
            }
            let Some(entry) = self.locks.get_mut(name) else {
                break;
            };
            let Some(waiter) = entry.queue.pop_front() else {
                break;
            };
            let Some(token) = self.next_token(epoch, count) else {
                break;
            };
            let holder = waiter.hold(token, now);
            self.observe_token(block_end(&holder));
            if let Some(entry) = self.locks.get_mut(name) {
                entry.holders.push(holder.clone());
            }
            granted.push(holder);
        }
        self.forget_if_unused(name, now);
        granted
    }

    /// Drops the entry of `name` if nothing is held, queued or pending on it.
    pub(crate) fn forget_if_unused(&mut self, name: &LockName, now: Instant) {
        if self.locks.get(name).is_some_and(|e| e.is_unused(now)) {
            self.locks.remove(name);
        }
    }

    /// The node grants of `name` (holds of a member's node owner).
    pub(crate) fn node_grants(&self, name: &LockName) -> Vec<Holder> {
        self.locks.get(name).map_or_else(Vec::new, |e| {
            e.holders
                .iter()
                .filter(|h| is_node_grant(h))
                .cloned()
                .collect()
        })
    }

    /// Whether `name` has waiters.
    pub(crate) fn has_waiters(&self, name: &LockName) -> bool {
        self.locks.get(name).is_some_and(Entry::has_waiters)
    }

    /// Names of locks with waiters.
    pub(crate) fn names_with_waiters(&self) -> Vec<LockName> {
        self.locks
            .iter()
            .filter(|(_, e)| e.has_waiters())
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The earliest `not_before` of a lock that has waiters.
    pub(crate) fn next_not_before(&self, now: Instant) -> Option<Instant> {
        self.locks
            .values()
            .filter(|e| e.has_waiters())
            .filter_map(|e| e.not_before)
            .filter(|t| *t > now)
            .min()
    }

    /// Every waiter, lock by lock, in queue order.
    pub(crate) fn waiters(&self) -> impl Iterator<Item = (&LockName, &Waiter)> {
        self.locks
            .iter()
            .flat_map(|(name, e)| e.waiting().map(move |w| (name, w)))
    }

    /// The highest token issued or observed.
    pub(crate) fn last_token(&self) -> FencingToken {
        self.last_token
    }

    /// Every hold, lock by lock.
    pub(crate) fn holders(&self) -> impl Iterator<Item = (&LockName, &Holder)> {
        self.locks
            .iter()
            .flat_map(|(name, e)| e.holders.iter().map(move |h| (name, h)))
    }

    /// The table for inspection: every lock with holders or waiters, by name, at most
    /// `limit` of them; and whether more exist.
    pub(crate) fn snapshot(&self, limit: usize, now: Instant) -> (Vec<TableLock>, bool) {
        let mut used = self
            .locks
            .iter()
            .filter(|(_, e)| !e.holders.is_empty() || e.has_waiters());
        let locks = used
            .by_ref()
            .take(limit)
            .map(|(name, e)| TableLock {
                name: name.clone(),
                holders: e
                    .holders
                    .iter()
                    .map(|h| TableHolder {
                        owner: h.owner.clone(),
                        mode: h.mode,
                        token: h.token,
                        lease_ms: h.lease_until.map(|t| {
                            let left = t.saturating_duration_since(now).as_millis();
                            u64::try_from(left).unwrap_or(u64::MAX)
                        }),
                    })
                    .collect(),
                waiters: e
                    .waiting()
                    .map(|w| TableWaiter {
                        owner: w.owner.clone(),
                        mode: w.mode,
                    })
                    .collect(),
            })
            .collect();
        (locks, used.next().is_some())
    }

    /// Number of queued requests.
    pub(crate) fn waiting(&self) -> usize {
        self.locks.values().map(|e| e.waiting().count()).sum()
    }

    /// Number of locks known (held, queued or fenced).
    pub(crate) fn len(&self) -> usize {
        self.locks.len()
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    fn owner(member: u8, local: u64) -> OwnerId {
        OwnerId {
            member: MemberId::new(
                u128::from(member),
                "m",
                SocketAddr::from(([127, 0, 0, 1], 1)),
            )
            .unwrap(),
            local,
        }
    }

    fn waiter(member: u8, req: u64, mode: LockMode) -> Waiter {
        Waiter {
            owner: owner(member, 1),
            mode,
            request: RequestId(req),
            lease: None,
        }
    }

    fn name() -> LockName {
        LockName::new("l").unwrap()
    }

    fn live(_: &OwnerId) -> Verdict {
        Verdict::Grant
    }

    #[test]
    fn exclusive_waits_for_shared_and_later_shared_queue_behind_it() {
        let mut t = LockTable::default();
        let now = Instant::ZERO;
        assert!(t.can_grant_now(&name(), LockMode::Shared, now));
        t.grant(&name(), waiter(1, 1, LockMode::Shared), 1, Instant::ZERO);
        assert!(t.can_grant_now(&name(), LockMode::Shared, now));
        t.grant(&name(), waiter(2, 1, LockMode::Shared), 1, Instant::ZERO);
        assert!(!t.can_grant_now(&name(), LockMode::Exclusive, now));
        t.enqueue(&name(), waiter(3, 1, LockMode::Exclusive));
        // A writer is queued: a new reader may not overtake it.
        assert!(!t.can_grant_now(&name(), LockMode::Shared, now));
        t.enqueue(&name(), waiter(4, 1, LockMode::Shared));
        t.release(&name(), &owner(1, 1).member, RequestId(1));
        assert!(
            t.promote(&name(), now, 1, live).is_empty(),
            "one reader still holds"
        );
        t.release(&name(), &owner(2, 1).member, RequestId(1));
        let granted = t.promote(&name(), now, 1, live);
        assert_eq!(granted.len(), 1);
        assert_eq!(granted[0].owner, owner(3, 1));
        t.release(&name(), &owner(3, 1).member, RequestId(1));
        let granted = t.promote(&name(), now, 1, live);
        assert_eq!(granted[0].owner, owner(4, 1));
    }

    #[test]
    fn consecutive_shared_waiters_are_granted_together() {
        let mut t = LockTable::default();
        let now = Instant::ZERO;
        t.grant(&name(), waiter(1, 1, LockMode::Exclusive), 1, Instant::ZERO);
        t.enqueue(&name(), waiter(2, 1, LockMode::Shared));
        t.enqueue(&name(), waiter(3, 1, LockMode::Shared));
        t.enqueue(&name(), waiter(4, 1, LockMode::Exclusive));
        t.release(&name(), &owner(1, 1).member, RequestId(1));
        let granted = t.promote(&name(), now, 1, live);
        assert_eq!(granted.len(), 2);
        assert_eq!(t.waiting(), 1);
    }

    #[test]
    fn tokens_increase_and_jump_to_the_epoch() {
        let mut t = LockTable::default();
        let a = t.next_token(3, 1);
        let b = t.next_token(3, 1);
        assert_eq!(a, Some(FencingToken::new(3, 0)));
        assert!(b > a);
        t.observe_token(FencingToken::new(9, 5));
        assert_eq!(t.next_token(4, 1), Some(FencingToken::new(9, 6)));
        assert_eq!(t.next_token(12, 1), Some(FencingToken::new(12, 0)));
    }

    fn node_waiter(member: u8, req: u64) -> Waiter {
        Waiter {
            owner: OwnerId {
                local: NODE_OWNER,
                ..owner(member, 0)
            },
            ..waiter(member, req, LockMode::Exclusive)
        }
    }

    /// A term's counter never carries into the next term: neither a grant nor a node grant's
    /// block crosses it, and the term is used up once a block no longer fits.
    #[test]
    fn no_token_crosses_its_term() {
        let mut t = LockTable::default();
        let now = Instant::ZERO;
        t.observe_token(FencingToken::new(3, u32::MAX - 2));
        assert!(t.exhausted(3), "a node grant's block no longer fits");
        // A node grant's block would cross: not made, nothing taken.
        assert_eq!(t.grant(&name(), node_waiter(1, 1), 3, now), None);
        assert_eq!(t.last_token(), FencingToken::new(3, u32::MAX - 2));
        // Plain grants use up the term to its last token, never one of term 4.
        let a = t.grant(&name(), waiter(1, 2, LockMode::Shared), 3, now);
        let b = t.grant(&name(), waiter(2, 3, LockMode::Shared), 3, now);
        assert_eq!(a, Some(FencingToken::new(3, u32::MAX - 1)));
        assert_eq!(b, Some(FencingToken::new(3, u32::MAX)));
        assert_eq!(
            t.grant(&name(), waiter(3, 4, LockMode::Shared), 3, now),
            None
        );
        // Waiters are not promoted into the next term either.
        let other = LockName::new("o").unwrap();
        t.grant(&other, waiter(1, 5, LockMode::Exclusive), 3, now);
        t.enqueue(&other, waiter(2, 6, LockMode::Exclusive));
        t.release(&other, &owner(1, 1).member, RequestId(5));
        assert!(t.promote(&other, now, 3, live).is_empty());
        assert!(t.holders().all(|(_, h)| h.token.epoch() == 3));
        // A reported node grant near the end reserves its block up to the term's end only.
        let mut r = LockTable::default();
        r.insert_holder(
            &name(),
            Holder {
                owner: node_waiter(1, 1).owner,
                mode: LockMode::Exclusive,
                token: FencingToken::new(5, u32::MAX - 10),
                request: RequestId(1),
                lease_until: None,
            },
        );
        assert_eq!(r.last_token(), FencingToken::new(5, u32::MAX));
        // The next term starts afresh.
        assert!(!t.exhausted(4));
        assert_eq!(
            t.grant(&name(), node_waiter(4, 7), 4, now),
            Some(FencingToken::new(4, 0))
        );
    }

    #[test]
    fn dead_waiters_are_dropped_at_promotion() {
        let mut t = LockTable::default();
        let now = Instant::ZERO;
        t.grant(&name(), waiter(1, 1, LockMode::Exclusive), 1, Instant::ZERO);
        t.enqueue(&name(), waiter(2, 1, LockMode::Exclusive));
        t.enqueue(&name(), waiter(3, 1, LockMode::Exclusive));
        t.release(&name(), &owner(1, 1).member, RequestId(1));
        let dead = owner(2, 1).member;
        let granted = t.promote(&name(), now, 1, |o| {
            if o.member == dead {
                Verdict::Drop
            } else {
                Verdict::Grant
            }
        });
        assert_eq!(granted.len(), 1);
        assert_eq!(granted[0].owner, owner(3, 1));
    }

    #[test]
    fn a_departed_holders_lock_waits_for_not_before() {
        let mut t = LockTable::default();
        t.grant(&name(), waiter(1, 1, LockMode::Exclusive), 1, Instant::ZERO);
        t.enqueue(&name(), waiter(2, 1, LockMode::Exclusive));
        let later = Instant::from_nanos(1_000);
        assert_eq!(
            t.remove_holders_of(&owner(1, 1).member, Some(later)),
            vec![name()]
        );
        assert!(t.promote(&name(), Instant::ZERO, 1, live).is_empty());
        assert_eq!(t.next_not_before(Instant::ZERO), Some(later));
        assert_eq!(t.promote(&name(), later, 1, live).len(), 1);
    }

    #[test]
    fn unused_entries_are_forgotten() {
        let mut t = LockTable::default();
        t.grant(&name(), waiter(1, 1, LockMode::Exclusive), 1, Instant::ZERO);
        assert_eq!(t.len(), 1);
        t.release(&name(), &owner(1, 1).member, RequestId(1));
        t.forget_if_unused(&name(), Instant::ZERO);
        assert_eq!(t.len(), 0);
    }
}
