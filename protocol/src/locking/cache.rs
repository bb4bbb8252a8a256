//! Node-level caching of exclusive locks (the caching lock service, seed `004_…`).
//!
//! A member that keeps taking one lock asks the grantor for a **node grant**: a grant to its
//! node owner ([`NODE_OWNER`]) that reserves [`NODE_GRANT_TOKENS`] fencing tokens. While the
//! node grant is held and not revoked, local owners take the lock from it without a message:
//! the first free local `lock()` is granted at once with the next token of the block, others
//! queue at the node in FIFO order. When another owner asks the grantor for the lock, the
//! grantor sends [`LockMessage::Revoke`]; from then on local requests go to the grantor (behind
//! the asker: a busy node cannot keep a lock), and the node grant is released as soon as its
//! local holder releases. A node grant unused for [`NodeCacheConfig::idle`] is returned unasked.
//!
//! To the grantor and to every other part of the protocol, the node grant is an ordinary hold:
//! it is renewed under `Majority`, reported in reconciliation, resolved as a duplicate after a
//! merge, lost with the member. When it is lost, so is the local hold taken from it.
//!
//! **Evidence of local reuse.** A member asks for a node grant of a lock only after
//! [`NodeCacheConfig::after`] local `lock()` calls of it, each within `idle` of the previous
//! one, and not within `backoff` of a revoke of it: a lock that moves between members on
//! every acquisition is asked back at most once per `backoff`.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::{NODE_GRANT_TOKENS, NODE_OWNER};
use conclave_lock_api::{FencingToken, LockLostReason, LockMode, LockName, RequestId};

use super::types::{HoldInfo, LockNotice, LockRequest, Refusal};
use super::LockMachine;
use crate::time::Instant;

/// Settings of node-level caching. Off by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeCacheConfig {
    /// Whether this member asks for node grants. (A grantor always honours them.) Default
    /// false.
    pub enabled: bool,
    /// How many local `lock()` calls of one lock, each within `idle` of the previous, make the
    /// member ask for a node grant of it. Default 2.
    pub after: u32,
    /// A node grant unused this long is returned; also the window of `after`. Default 1 s.
    pub idle: Duration,
    /// After a revoke of a lock, how long the member asks for it plainly. Default 1 s.
    pub backoff: Duration,
    /// Read delegations (CTDB's read-only locks): shared requests get node grants too, so
    /// local `read()` under one costs no message. Needs `enabled`. Default false.
    pub delegate_reads: bool,
    /// Grantor: after a lock was granted for writing, how long shared node grants of it are
    /// granted plainly (not as delegations), so the writer's next turn is not held up by new
    /// delegations to revoke. Default 1 s.
    pub delegation_grace: Duration,
}

impl Default for NodeCacheConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            after: 2,
            idle: Duration::from_secs(1),
            backoff: Duration::from_secs(1),
            delegate_reads: false,
            delegation_grace: Duration::from_secs(1),
        }
    }
}

/// Counters of node-level caching on one member.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Local acquisitions served from a node grant, without a message.
    pub hits: u64,
    /// Node grants asked for.
    pub node_grants_asked: u64,
    /// Revokes received for a node grant held.
    pub revokes: u64,
    /// Node grants returned (revoked, idle, or their token block used up).
    pub returned: u64,
}

impl std::ops::AddAssign for CacheStats {
    /// Adds the counters of another lock service of the member.
    fn add_assign(&mut self, other: Self) {
        self.hits += other.hits;
        self.node_grants_asked += other.node_grants_asked;
        self.revokes += other.revokes;
        self.returned += other.returned;
    }
}

/// A request queued at the node behind a local holder (or a node grant on its way).
#[derive(Clone, Debug)]
struct Queued {
    request: RequestId,
    owner: u64,
    deadline: Option<Instant>,
}

/// One lock cached (or being cached) at this node.
#[derive(Debug)]
struct Entry {
    /// The node grant's request.
    grant: RequestId,
    /// Exclusive (a cached lock) or shared (a read delegation).
    mode: LockMode,
    /// Once granted: the block's first token and how many of it were used.
    block: Option<(FencingToken, u64)>,
    /// The local requests holding the lock now (at most one when exclusive).
    holders: Vec<RequestId>,
    queue: VecDeque<Queued>,
    /// Asked back (or the block used up): serve no more, return once free.
    revoking: bool,
    /// The grantor queued the node grant behind other owners: new local requests go to the
    /// grantor (in its FIFO order) until it is granted.
    behind_others: bool,
    /// Since when nobody holds it here.
    idle_since: Instant,
}

impl Entry {
    /// A node grant asked for (request `grant`), with local requests waiting for it.
    fn asked(grant: RequestId, mode: LockMode, queue: VecDeque<Queued>, now: Instant) -> Self {
        Self {
            grant,
            mode,
            block: None,
            holders: Vec::new(),
            queue,
            revoking: false,
            behind_others: false,
            idle_since: now,
        }
    }
}

/// A local hold taken from a node grant.
#[derive(Clone, Debug)]
struct LocalHold {
    name: LockName,
    mode: LockMode,
    owner: u64,
    token: FencingToken,
    grant: RequestId,
}

/// The cache layer's state on one member.
#[derive(Debug, Default)]
pub(crate) struct NodeCache {
    entries: BTreeMap<LockName, Entry>,
    local: BTreeMap<RequestId, LocalHold>,
    /// Every node-grant request not finished at the client, and its lock: their notices are
    /// the cache's, never an owner's.
    grants: BTreeMap<RequestId, LockName>,
    /// Per lock: when it was last asked for here, and how many times in a row within `idle`.
    evidence: BTreeMap<LockName, (Instant, u32)>,
    /// Per lock: no node grant asked before this instant (it was revoked).
    backoff: BTreeMap<LockName, Instant>,
    pub(crate) stats: CacheStats,
    /// Sabotage: keep serving local requests from a node grant after returning it.
    pub(crate) serve_after_return: bool,
    /// Sabotage: every local grant from a node grant carries the block's first token.
    pub(crate) repeat_token: bool,
    /// Local grants made from node grants since the simulator last took them.
    #[cfg(feature = "sim")]
    pub(crate) grant_log: Vec<CachedGrant>,
}

/// A local grant made from a node grant, for the simulator's token checker.
#[cfg(feature = "sim")]
#[derive(Clone, Debug)]
pub struct CachedGrant {
    /// How many grants this member's grantor had made before (orders the two logs).
    pub after: u64,
    /// The lock.
    pub name: LockName,
    /// Its token, from the node grant's block.
    pub token: FencingToken,
    /// Exclusive (a cached lock) or shared (a read delegation).
    pub mode: LockMode,
    /// The grantor of the node grant.
    pub granted_by: conclave_lock_api::MemberId,
    /// The epoch of this member's view when the node grant arrived.
    pub granted_in: u64,
}

/// The most locks whose evidence or backoff is remembered.
const EVIDENCE_MAX: usize = 4096;

/// Whether a node grant's token block (base, used) is used up.
fn used_up(block: Option<(FencingToken, u64)>) -> bool {
    block.is_some_and(|(_, used)| used >= NODE_GRANT_TOKENS)
}

impl LockMachine {
    /// The cache's answer to a local request: `Some(id)` if it took the request (granted at
    /// once, queued at the node, refused, or asked a node grant for it), `None` to send it to
    /// the grantor as usual.
    pub(super) fn cache_lock(&mut self, now: Instant, request: &LockRequest) -> Option<RequestId> {
        let config = self.config.node_cache;
        let mode_ok = request.mode == LockMode::Exclusive || config.delegate_reads;
        if !config.enabled || !mode_ok || request.owner == NODE_OWNER {
            return None;
        }
        let name = request.name.clone();
        self.cache_expire_lapsed(now, &name);
        if let Some(entry) = self.cache.entries.get(&name) {
            // Being revoked, cached in the other mode, or queued at the grantor behind other
            // owners: ask the grantor (in its FIFO order). Still on its way and not queued, or
            // going back only because its token block is used up (it is renewed at once, see
            // `cache_return`): wait here, so that this member's owners do not queue at the
            // grantor behind their own node grant (which would make it revoke the grant).
            let backing_off = self.cache.backoff.get(&name).is_some_and(|t| now < *t);
            let renewing = entry.revoking && !backing_off && used_up(entry.block);
            if entry.mode != request.mode
                || (entry.revoking && !(renewing && request.wait))
                || (entry.block.is_none() && entry.behind_others)
            {
                return None;
            }
            let id = self.client.next_id();
            let entry = self.cache.entries.get_mut(&name)?;
            let free = entry.mode == LockMode::Shared || entry.holders.is_empty();
            if free && entry.queue.is_empty() && entry.block.is_some() && !entry.revoking {
                self.cache_grant_local(&name, id, request.owner);
            } else if request.wait {
                entry.queue.push_back(Queued {
                    request: id,
                    owner: request.owner,
                    deadline: request.timeout.map(|t| now + t),
                });
                let position = u32::try_from(entry.queue.len()).unwrap_or(u32::MAX);
                self.notices.push_back(LockNotice::Queued {
                    request: id,
                    name,
                    position,
                });
            } else {
                self.notices.push_back(LockNotice::Refused {
                    request: id,
                    name,
                    reason: Refusal::WouldBlock,
                });
            }
            return Some(id);
        }
        // Evidence of local reuse, and no recent revoke.
        let (last, count) = self.cache.evidence.get(&name).copied().unwrap_or((now, 0));
        let count = if count == 0 || now.saturating_duration_since(last) <= config.idle {
            count + 1
        } else {
            1
        };
        if self.cache.evidence.len() >= EVIDENCE_MAX {
            self.cache.evidence.clear();
        }
        self.cache.evidence.insert(name.clone(), (now, count));
        let backing_off = self.cache.backoff.get(&name).is_some_and(|t| now < *t);
        if count < config.after || backing_off || !request.wait {
            return None;
        }
        let grant = self.ask_node_grant(now, &name, request.mode);
        let id = self.client.next_id();
        let queue = VecDeque::from([Queued {
            request: id,
            owner: request.owner,
            deadline: request.timeout.map(|t| now + t),
        }]);
        self.cache
            .entries
            .insert(name, Entry::asked(grant, request.mode, queue, now));
        Some(id)
    }

    /// Whether `name`'s node grant is held and its lease (under `Majority`, the hold lease;
    /// also an acquisition lease, if any) ran out at `now`: the lease timers are due, whether
    /// or not the driver has run them yet (the driving contract allows late timers). Such a
    /// node grant hands out no token: a grantor may already have granted the lock again.
    fn cache_lapsed(&self, now: Instant, name: &LockName) -> bool {
        let Some(entry) = self.cache.entries.get(name) else {
            return false;
        };
        self.client.held_lock(entry.grant).is_some_and(|h| {
            h.lease_until.is_some_and(|t| now >= t)
                || (self.config.policy.is_majority() && now >= h.leased_from + self.config.lease)
        })
    }

    /// A local request at `now` finds `name`'s node grant as the lease timers would have left
    /// it: if its lease ran out, they run now (the node grant is lost, with its local holds,
    /// and the local waiters go to the grantor), before anything is served from it.
    fn cache_expire_lapsed(&mut self, now: Instant, name: &LockName) {
        if !self.cache_lapsed(now, name) {
            return;
        }
        self.check_leases(now);
        self.acquisition_leases_expired +=
            self.client
                .expire_acquisition_leases(now, &mut self.outbox, &mut self.notices);
        self.cache_absorb(now);
    }

    /// Grants `name` from its node grant to the local request `id`.
    fn cache_grant_local(&mut self, name: &LockName, id: RequestId, owner: u64) {
        let Some(entry) = self.cache.entries.get_mut(name) else {
            return;
        };
        let Some((base, used)) = &mut entry.block else {
            return;
        };
        let token = if self.cache.repeat_token {
            *base
        } else {
            FencingToken(base.0.saturating_add(*used))
        };
        *used += 1;
        if *used >= NODE_GRANT_TOKENS {
            // The block is used up: return the grant after this hold, and ask again.
            entry.revoking = true;
        }
        entry.holders.push(id);
        let (grant, mode) = (entry.grant, entry.mode);
        self.cache.local.insert(
            id,
            LocalHold {
                name: name.clone(),
                mode,
                owner,
                token,
                grant,
            },
        );
        self.cache.stats.hits += 1;
        #[cfg(feature = "sim")]
        if let Some(held) = self.client.held_lock(grant) {
            self.cache.grant_log.push(CachedGrant {
                after: self.grantor.stats.grants,
                name: name.clone(),
                token,
                mode,
                granted_by: held.granted_by.clone(),
                granted_in: held.granted_in,
            });
        }
        self.notices.push_back(LockNotice::Granted {
            request: id,
            name: name.clone(),
            owner,
            mode,
            token,
        });
    }

    /// Serves the next local waiter of `name`, or returns the node grant if it is being
    /// revoked and nobody holds it here.
    fn cache_serve(&mut self, now: Instant, name: &LockName) {
        loop {
            let Some(entry) = self.cache.entries.get_mut(name) else {
                return;
            };
            if entry.block.is_none() {
                return;
            }
            if entry.revoking {
                if !entry.holders.is_empty() {
                    return;
                }
                self.cache_return(name);
                if !self.cache.serve_after_return {
                    return;
                }
                continue;
            }
            if entry.mode == LockMode::Exclusive && !entry.holders.is_empty() {
                return;
            }
            if self.cache_lapsed(now, name) {
                // The lease timers lose the node grant at the end of this input (`pump`) and
                // send the local waiters to the grantor.
                return;
            }
            let Some(entry) = self.cache.entries.get_mut(name) else {
                return;
            };
            let Some(next) = entry.queue.pop_front() else {
                return;
            };
            if next.deadline.is_some_and(|d| now >= d) {
                self.notices.push_back(LockNotice::Refused {
                    request: next.request,
                    name: name.clone(),
                    reason: Refusal::Timeout,
                });
                continue;
            }
            self.cache_grant_local(name, next.request, next.owner);
            // Readers go all at once; a writer alone (the loop stops at the check above).
        }
    }

    /// Releases `name`'s node grant at the grantor and sends its local waiters there.
    fn cache_return(&mut self, name: &LockName) {
        let Some(entry) = self.cache.entries.get(name) else {
            return;
        };
        if self.cache.serve_after_return {
            // Sabotage: the grant goes back, the entry stays and keeps serving.
            let grant = entry.grant;
            self.client.unlock(grant, false, None, &mut self.outbox);
            if let Some(entry) = self.cache.entries.get_mut(name) {
                entry.revoking = false;
            }
            return;
        }
        let Some(entry) = self.cache.entries.remove(name) else {
            return;
        };
        self.cache.stats.returned += 1;
        if entry.block.is_some() {
            self.client
                .unlock(entry.grant, false, None, &mut self.outbox);
        } else {
            self.client.cancel(entry.grant, &mut self.outbox);
        }
        let now = self.last_now;
        let backing_off = self.cache.backoff.get(name).is_some_and(|t| now < *t);
        if used_up(entry.block) && !backing_off && !entry.queue.is_empty() {
            self.cache_renew(now, name, entry.mode, entry.queue);
        } else {
            self.cache_reroute(name, entry.mode, entry.queue);
        }
    }

    /// A node grant whose token block is used up went back while local requests wait: they
    /// keep waiting here, behind a new node grant asked for at once (after the release, in
    /// FIFO order at the grantor), instead of going to the grantor one by one.
    fn cache_renew(
        &mut self,
        now: Instant,
        name: &LockName,
        mode: LockMode,
        queue: VecDeque<Queued>,
    ) {
        let grant = self.ask_node_grant(now, name, mode);
        self.cache
            .entries
            .insert(name.clone(), Entry::asked(grant, mode, queue, now));
    }

    /// Asks the grantor for a node grant of `name` (a waiting request of the node owner).
    fn ask_node_grant(&mut self, now: Instant, name: &LockName, mode: LockMode) -> RequestId {
        let grant = self.client.lock(
            now,
            NODE_OWNER,
            name.clone(),
            mode,
            true,
            None,
            None,
            false,
            &mut self.outbox,
        );
        self.cache.stats.node_grants_asked += 1;
        self.cache.grants.insert(grant, name.clone());
        grant
    }

    /// Sends requests that waited at the node to the grantor, under their own ids.
    fn cache_reroute(&mut self, name: &LockName, mode: LockMode, queue: VecDeque<Queued>) {
        let now = self.last_now;
        for q in queue {
            let timeout = q.deadline.map(|d| d.saturating_duration_since(now));
            if timeout.is_some_and(|t| t.is_zero()) {
                self.notices.push_back(LockNotice::Refused {
                    request: q.request,
                    name: name.clone(),
                    reason: Refusal::Timeout,
                });
                continue;
            }
            self.client.lock_with_id(
                now,
                q.request,
                q.owner,
                name.clone(),
                mode,
                true,
                timeout,
                None,
                false,
                &mut self.outbox,
            );
        }
    }

    /// Unlock of a local hold taken from a node grant: `None` if `request` is not one.
    pub(super) fn cache_unlock(&mut self, now: Instant, request: RequestId) -> Option<()> {
        let hold = self.cache.local.remove(&request)?;
        self.notices.push_back(LockNotice::Released { request });
        if let Some(entry) = self.cache.entries.get_mut(&hold.name) {
            entry.holders.retain(|h| *h != request);
            if entry.holders.is_empty() {
                entry.idle_since = now;
            }
        }
        self.cache_serve(now, &hold.name);
        Some(())
    }

    /// Cancel of a request queued at the node: whether it was one.
    pub(super) fn cache_cancel(&mut self, now: Instant, request: RequestId) -> bool {
        if self.cache.local.contains_key(&request) {
            return self.cache_unlock(now, request).is_some();
        }
        let mut found = None;
        for (name, entry) in &mut self.cache.entries {
            if let Some(i) = entry.queue.iter().position(|q| q.request == request) {
                entry.queue.remove(i);
                found = Some(name.clone());
                break;
            }
        }
        let Some(name) = found else {
            return false;
        };
        self.cache_abandon(&name);
        true
    }

    /// A node grant still on its way that nobody here waits for any more is withdrawn.
    fn cache_abandon(&mut self, name: &LockName) {
        let abandoned = self
            .cache
            .entries
            .get(name)
            .is_some_and(|e| e.block.is_none() && e.holders.is_empty() && e.queue.is_empty());
        if abandoned {
            self.cache_return(name);
        }
    }

    /// Every local hold and queued request of `owner` ends (UNLOCK_ALL); returns how many
    /// holds were released.
    pub(super) fn cache_unlock_all(&mut self, now: Instant, owner: u64) -> usize {
        for entry in self.cache.entries.values_mut() {
            entry.queue.retain(|q| q.owner != owner);
        }
        let names: Vec<LockName> = self.cache.entries.keys().cloned().collect();
        for name in names {
            self.cache_abandon(&name);
        }
        let held: Vec<RequestId> = self
            .cache
            .local
            .iter()
            .filter(|(_, h)| h.owner == owner)
            .map(|(r, _)| *r)
            .collect();
        for request in &held {
            self.cache_unlock(now, *request);
        }
        held.len()
    }

    /// The member leaves: local holds are lost, queued requests refused, node grants go with
    /// the client's holds.
    pub(super) fn cache_shutdown(&mut self, lost: LockLostReason, refusal: Refusal) {
        for (request, hold) in std::mem::take(&mut self.cache.local) {
            self.notices.push_back(LockNotice::Lost {
                request,
                name: hold.name,
                owner: hold.owner,
                token: hold.token,
                reason: lost,
            });
        }
        for (name, entry) in std::mem::take(&mut self.cache.entries) {
            for q in entry.queue {
                self.notices.push_back(LockNotice::Refused {
                    request: q.request,
                    name: name.clone(),
                    reason: refusal,
                });
            }
        }
    }

    /// The grantor asks a node grant back.
    pub(super) fn cache_revoke(&mut self, now: Instant, request: RequestId, token: FencingToken) {
        let Some(name) = self.cache.grants.get(&request).cloned() else {
            return;
        };
        let current = self
            .client
            .held_lock(request)
            .is_some_and(|h| h.table_token == token || h.token == token);
        let Some(entry) = self.cache.entries.get_mut(&name) else {
            return;
        };
        if entry.grant != request || !current || entry.revoking {
            return;
        }
        entry.revoking = true;
        self.cache.stats.revokes += 1;
        if self.cache.backoff.len() >= EVIDENCE_MAX {
            self.cache.backoff.retain(|_, t| *t > now);
        }
        self.cache
            .backoff
            .insert(name.clone(), now + self.config.node_cache.backoff);
        self.cache_serve(now, &name);
    }

    /// Takes the client's notices about node grants and acts on them; the owners' notices
    /// stay.
    pub(super) fn cache_absorb(&mut self, now: Instant) {
        if self.cache.grants.is_empty() {
            return;
        }
        let notices = std::mem::take(&mut self.notices);
        for notice in notices {
            let request = match &notice {
                LockNotice::Granted { request, .. }
                | LockNotice::Queued { request, .. }
                | LockNotice::Refused { request, .. }
                | LockNotice::Released { request }
                | LockNotice::Unexpected { request, .. }
                | LockNotice::Lost { request, .. } => Some(*request),
                _ => None,
            };
            let Some((grant, name)) =
                request.and_then(|r| self.cache.grants.get(&r).cloned().map(|n| (r, n)))
            else {
                self.notices.push_back(notice);
                continue;
            };
            let ours = self
                .cache
                .entries
                .get(&name)
                .is_some_and(|e| e.grant == grant);
            match notice {
                LockNotice::Granted { token, .. } if ours => {
                    let cached = self.client.held_lock(grant).is_some_and(|h| h.cached);
                    if let Some(entry) = self.cache.entries.get_mut(&name) {
                        entry.block = Some((token, 0));
                        // A grantor without node grants reserved no block: one use only.
                        entry.revoking |= !cached;
                        entry.idle_since = now;
                    }
                    if !cached {
                        // Serve the first waiter even though the grant is being returned.
                        if let Some(next) = self
                            .cache
                            .entries
                            .get_mut(&name)
                            .and_then(|e| e.queue.pop_front())
                        {
                            self.cache_grant_local(&name, next.request, next.owner);
                        }
                    }
                    self.cache_serve(now, &name);
                }
                LockNotice::Granted { .. } => {
                    // A node grant nobody here wants any more: return it.
                    self.client.unlock(grant, false, None, &mut self.outbox);
                }
                LockNotice::Queued { position, .. } if ours => {
                    if let Some(entry) = self.cache.entries.get_mut(&name) {
                        entry.behind_others = true;
                    }
                    // The node grant waits at the grantor: so does the first local waiter.
                    if let Some(head) = self.cache.entries.get(&name).and_then(|e| e.queue.front())
                    {
                        self.notices.push_back(LockNotice::Queued {
                            request: head.request,
                            name: name.clone(),
                            position,
                        });
                    }
                }
                LockNotice::Refused { reason, .. } => {
                    self.cache.grants.remove(&grant);
                    if ours {
                        if let Some(entry) = self.cache.entries.remove(&name) {
                            for q in entry.queue {
                                self.notices.push_back(LockNotice::Refused {
                                    request: q.request,
                                    name: name.clone(),
                                    reason,
                                });
                            }
                        }
                    }
                }
                LockNotice::Lost { reason, .. } => {
                    self.cache.grants.remove(&grant);
                    if ours {
                        if let Some(entry) = self.cache.entries.remove(&name) {
                            for holder in entry.holders {
                                if let Some(hold) = self.cache.local.remove(&holder) {
                                    self.notices.push_back(LockNotice::Lost {
                                        request: holder,
                                        name: name.clone(),
                                        owner: hold.owner,
                                        token: hold.token,
                                        reason,
                                    });
                                }
                            }
                            self.cache_reroute(&name, entry.mode, entry.queue);
                        }
                    }
                }
                LockNotice::Released { .. } => {
                    self.cache.grants.remove(&grant);
                }
                _ => {}
            }
        }
    }

    /// Timers of the cache: queued requests' deadlines, and idle node grants to return.
    pub(super) fn cache_timeout(&mut self, now: Instant) {
        let idle = self.config.node_cache.idle;
        let names: Vec<LockName> = self.cache.entries.keys().cloned().collect();
        for name in names {
            let Some(entry) = self.cache.entries.get_mut(&name) else {
                continue;
            };
            let mut expired = Vec::new();
            entry.queue.retain(|q| {
                let keep = q.deadline.is_none_or(|d| now < d);
                if !keep {
                    expired.push(q.request);
                }
                keep
            });
            let any_expired = !expired.is_empty();
            for request in expired {
                self.notices.push_back(LockNotice::Refused {
                    request,
                    name: name.clone(),
                    reason: Refusal::Timeout,
                });
            }
            if any_expired {
                self.cache_abandon(&name);
            }
            let Some(entry) = self.cache.entries.get(&name) else {
                continue;
            };
            let unused =
                entry.holders.is_empty() && entry.queue.is_empty() && entry.block.is_some();
            if unused && now >= entry.idle_since + idle {
                if let Some(entry) = self.cache.entries.get_mut(&name) {
                    entry.revoking = true;
                }
                self.cache_return(&name);
            }
        }
    }

    /// The earliest cache timer.
    pub(super) fn cache_next_timeout(&self) -> Option<Instant> {
        let idle = self.config.node_cache.idle;
        self.cache
            .entries
            .values()
            .flat_map(|e| {
                let unused = e.holders.is_empty() && e.queue.is_empty() && e.block.is_some();
                let deadlines = e.queue.iter().filter_map(|q| q.deadline);
                deadlines.chain(unused.then_some(e.idle_since + idle))
            })
            .min()
    }

    /// The status of a local hold taken from a node grant: that of the node grant.
    pub(super) fn cache_status(
        &self,
        now: Instant,
        request: RequestId,
    ) -> Option<super::HoldStatus> {
        let hold = self.cache.local.get(&request)?;
        Some(
            self.client
                .held_lock(hold.grant)
                .map_or(super::HoldStatus::Lost, |h| self.hold_status(now, h)),
        )
    }

    /// Local holds taken from node grants, as the owners see them.
    pub(super) fn cache_holds(&self, now: Instant) -> Vec<HoldInfo> {
        self.cache
            .local
            .iter()
            .filter_map(|(request, hold)| {
                let grant = self.client.held_lock(hold.grant)?;
                Some(HoldInfo {
                    request: *request,
                    name: hold.name.clone(),
                    owner: hold.owner,
                    mode: hold.mode,
                    token: hold.token,
                    granted_in: grant.granted_in,
                    granted_by: grant.granted_by.clone(),
                    status: self.hold_status(now, grant),
                })
            })
            .collect()
    }

    /// Local holds whose node grant this member no longer holds (the simulator's check that no
    /// cached grant is used after it went back).
    pub fn cache_orphans(&self) -> Vec<RequestId> {
        self.cache
            .local
            .iter()
            .filter(|(_, h)| self.client.held_lock(h.grant).is_none())
            .map(|(r, _)| *r)
            .collect()
    }

    /// Requests queued at this member for a cached lock.
    pub(super) fn cache_queued(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.cache
            .entries
            .values()
            .flat_map(|e| e.queue.iter().map(|q| q.request))
    }

    /// Counters of node-level caching.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats
    }
}
