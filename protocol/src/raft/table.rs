//! The replicated lock table: the state machine every member applies the log to.
//!
//! [`Table::apply`] is a pure function of the table and one log entry: no clock, no
//! randomness, only ordered maps. Every member applies the same entries in the same order, so
//! every member computes the same grants, queues, fencing tokens and outcomes ([`Applied`]),
//! and the table itself is the snapshot's data ([`Table::to_bytes`]).
//!
//! # Queueing
//! The rules of the one-process table (`conclave`'s local backend): each lock has holders
//! (one exclusive, or any number of shared) and a FIFO queue. A request is granted at once
//! only if it is compatible with the holders and nobody waits, so a queued exclusive request
//! holds back later shared ones (writers are not starved). When a hold ends, the head of the
//! queue is granted while it is compatible with the holders: one exclusive, or the run of
//! shared requests at the head together.
//!
//! # Incarnations
//! Requests are named by the incarnation that made them ([`MemberId`]) and a number. A member
//! restarted from its data directory is a new incarnation of the same name: its
//! [`Command::Join`] withdraws the waits of the older incarnations and keeps their holds as
//! *recovered holds*, which the new incarnation adopts (a lock request of the same lock and
//! mode takes such a hold over, with a new token) or drops ([`Command::DropRecovered`]). From its
//! `Join` on, the older incarnations are gone, as is an incarnation after its
//! [`Command::Leave`]: a lock request of theirs applied late is ignored (nobody would release
//! what it got). Their unlocks and cancels still apply.
//!
//! # Bounds
//! Memory follows what is in use: a lock with no holders and no waiters is dropped, and the
//! lock requests remembered per incarnation (to apply each once) are those at or above the
//! `done_below` of its latest request, until it is gone. Two limits keep the arithmetic sound:
//! - a queue holds at most [`QUEUE_MAX`] waiters; a request that would queue behind them is
//!   refused ([`Applied::Busy`]);
//! - one entry grants at most [`GRANTS_PER_ENTRY_MAX`] times (the low bits of a token,
//!   [`token_at`]). Promotions beyond it wait for the next entry applied, which makes them
//!   before its own command; a lock request that finds the grants of its entry used up is
//!   refused ([`Applied::Busy`]).
//!
//! ```
//! use conclave_lock_api::{LockMode, LockName, MemberId};
//! use conclave_protocol::raft::command::{Applied, Command};
//! use conclave_protocol::raft::table::Table;
//!
//! let member = MemberId::new(1, "a", "127.0.0.1:7800".parse()?)?;
//! let key = (None, LockName::new("orders")?);
//! let lock = |request| Command::Lock {
//!     member: member.clone(),
//!     request,
//!     done_below: 0,
//!     key: key.clone(),
//!     owner: 1,
//!     mode: LockMode::Exclusive,
//!     wait: true,
//!     lease_ms: None,
//! };
//! let mut table = Table::new();
//! let mut out = Vec::new();
//! table.apply(1, &lock(1), &mut out);
//! table.apply(2, &lock(2), &mut out);
//! assert!(matches!(out[0], Applied::Granted { request: 1, .. }));
//! assert!(matches!(out[1], Applied::Queued { request: 2, position: 1, .. }));
//! assert_eq!(table.applied_index(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod clients;
mod entry;
mod pairs;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use conclave_lock_api::wire::TableLock;
use conclave_lock_api::{FencingToken, LockLostReason, LockMode, MemberId, OwnerId, ServiceName};
use serde::{Deserialize, Serialize};

use self::clients::Clients;
use self::entry::{Hold, LockEntry, Wait};
use super::command::{token_at, Applied, Command, LockKey, TOKEN_GRANT_BITS};

/// The most waiters one lock's queue holds; a request that would queue behind them is refused
/// with [`Applied::Busy`].
pub const QUEUE_MAX: usize = 65_536;

/// The most grants one log entry makes (the grant counter of [`token_at`] has
/// [`TOKEN_GRANT_BITS`] bits); the rest are made by the next entry applied.
pub const GRANTS_PER_ENTRY_MAX: u32 = 1 << TOKEN_GRANT_BITS;

/// The replicated lock table: see the [module documentation](self).
///
/// It serializes as the snapshot's data (also through [`Table::to_bytes`] and
/// [`Table::from_bytes`]); a table read back applies later entries exactly as the original.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "TableData")]
pub struct Table {
    /// The index of the last entry applied.
    applied: u64,
    /// The locks in use.
    #[serde(with = "pairs")]
    locks: BTreeMap<LockKey, LockEntry>,
    /// Who requested: requests applied, incarnations gone.
    clients: Clients,
    /// Locks whose head could not be granted because an entry ran out of grants.
    stalled: BTreeSet<LockKey>,
    /// Where each live request is (holding or waiting): derived from `locks`.
    #[serde(skip)]
    requests: BTreeMap<(MemberId, u64), LockKey>,
}

impl Table {
    /// An empty table, before the first entry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies the command of the log entry at `index` and appends what it did to `out`, in
    /// the order it happened. Indexes increase across calls; an entry at or below
    /// [`Table::applied_index`] was applied already and is ignored.
    pub fn apply(&mut self, index: u64, command: &Command, out: &mut Vec<Applied>) {
        if index <= self.applied {
            return;
        }
        self.applied = index;
        let mut grants = Grants::new(index);
        for key in std::mem::take(&mut self.stalled) {
            self.promote(&key, &mut grants, out);
        }
        match command {
            Command::Join { member } => self.on_join(member, &mut grants, out),
            Command::Lock {
                member,
                request,
                done_below,
                key,
                owner,
                mode,
                wait,
                lease_ms,
            } => {
                let request = Request {
                    member,
                    request: *request,
                    done_below: *done_below,
                    key,
                    owner: *owner,
                    mode: *mode,
                    wait: *wait,
                    lease_ms: *lease_ms,
                };
                self.on_lock(&request, &mut grants, out);
            }
            Command::Cancel { member, request } => {
                self.on_cancel(member, *request, &mut grants, out);
            }
            Command::Unlock { member, request } => {
                self.on_unlock(member, *request, &mut grants, out);
            }
            Command::Extend {
                member,
                request,
                lease_ms,
            } => self.on_extend(member, *request, *lease_ms, out),
            Command::Expire { key, token } => self.on_expire(key, *token, &mut grants, out),
            Command::ExpireMember { name } => self.end_requests(
                |m| m.name() == name,
                LockLostReason::Minority,
                &mut grants,
                out,
            ),
            Command::Leave { member } => {
                self.clients.leave(member);
                // Its older incarnations are gone too: their requests end with it (its `Join`,
                // which withdraws their waits, may be applied after its `Leave`, and then does
                // nothing).
                let gone = |m: &MemberId| {
                    m.name() == member.name() && !m.is_newer_incarnation_than(member)
                };
                self.end_requests(gone, LockLostReason::Shutdown, &mut grants, out);
            }
            Command::DropRecovered { member } => self.on_drop_recovered(member, &mut grants, out),
        }
    }

    /// Records that the log entry at `index` holds no command for the table (an empty entry a
    /// new leader appends, a configuration change, bytes [`decode`](super::command::decode)
    /// refuses), so that [`Table::applied_index`] covers it. Ignored at or below it.
    pub fn skip(&mut self, index: u64) {
        self.applied = self.applied.max(index);
    }

    /// The index of the last entry applied (0: none).
    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    /// The locks of one service (`None`: the default service) as the grantor-table wire type,
    /// in name order, at most `max` of them: `(locks, truncated)`, `truncated` when more
    /// exist. A holder's `lease_ms` is its lease as granted or last extended (what is left of
    /// it is the asking member's to compute).
    pub fn locks(&self, service: Option<&ServiceName>, max: usize) -> (Vec<TableLock>, bool) {
        let mut locks = Vec::new();
        for ((s, name), entry) in &self.locks {
            if s.as_ref() != service {
                continue;
            }
            if locks.len() == max {
                return (locks, true);
            }
            locks.push(entry.to_table_lock(name));
        }
        (locks, false)
    }

    /// Every hold with a lease of its own, by key: `(key, token, lease_ms)`. A leader arms its
    /// expiry timers from these when it takes over.
    pub fn leased_holds(&self) -> Vec<(LockKey, FencingToken, u64)> {
        self.locks
            .iter()
            .flat_map(|(key, entry)| {
                entry
                    .holders
                    .iter()
                    .filter_map(move |h| h.lease_ms.map(|lease| (key.clone(), h.token, lease)))
            })
            .collect()
    }

    /// The recovered holds of the member named `name`: holds of its earlier incarnations that
    /// a later one has not adopted, by key: `(key, owner, mode, token)`.
    pub fn recovered_holds(&self, name: &str) -> Vec<(LockKey, OwnerId, LockMode, FencingToken)> {
        self.locks
            .iter()
            .flat_map(|(key, entry)| {
                entry
                    .holders
                    .iter()
                    .filter(|h| h.recovered && h.member.name() == name)
                    .map(move |h| (key.clone(), h.owner_id(), h.mode, h.token))
            })
            .collect()
    }

    /// Every request of the incarnation `member` still waiting or holding, by request number:
    /// `(request, key, token)`, `token` the grant's if it holds.
    pub fn requests_of(&self, member: &MemberId) -> Vec<(u64, LockKey, Option<FencingToken>)> {
        let range = (member.clone(), 0)..=(member.clone(), u64::MAX);
        self.requests
            .range(range)
            .map(|((_, request), key)| {
                let token = self.locks.get(key).and_then(|entry| {
                    entry
                        .holders
                        .iter()
                        .find(|h| h.request == *request && h.member == *member)
                        .map(|h| h.token)
                });
                (*request, key.clone(), token)
            })
            .collect()
    }

    /// Whether the lock request `request` of `member` was applied already, or never will be
    /// (a copy of it applied later is ignored).
    pub fn was_applied(&self, member: &MemberId, request: u64) -> bool {
        self.clients.was_applied(member, request)
    }

    /// The names of the members with a hold (recovered ones too) or a wait in the table.
    pub fn member_names(&self) -> BTreeSet<String> {
        self.requests
            .keys()
            .map(|(member, _)| member.name().to_owned())
            .collect()
    }

    /// The table encoded for a snapshot (CBOR).
    pub fn to_bytes(&self) -> Vec<u8> {
        cbor4ii::serde::to_vec(Vec::new(), self).expect("a table always encodes")
    }

    /// A table decoded from [`Table::to_bytes`]; `None` for bytes that are not one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Table> {
        cbor4ii::serde::from_slice(bytes).ok()
    }

    fn on_lock(&mut self, r: &Request<'_>, grants: &mut Grants, out: &mut Vec<Applied>) {
        let live = self.requests.contains_key(&(r.member.clone(), r.request));
        let fresh = self
            .clients
            .first_application(r.member, r.request, r.done_below);
        if live || !fresh {
            return;
        }
        let key = r.key;
        let entry = self.locks.entry(key.clone()).or_default();
        let wait = Wait {
            member: r.member.clone(),
            request: r.request,
            owner: r.owner,
            mode: r.mode,
            lease_ms: r.lease_ms,
        };
        let adoptable = entry.holders.iter_mut().find(|h| {
            h.recovered
                && h.mode == r.mode
                && h.member.name() == r.member.name()
                && r.member.is_newer_incarnation_than(&h.member)
        });
        let placed = if let Some(hold) = adoptable {
            // The hold never left this member, but it gets a new token: a fencing register then
            // refuses whatever the dead process may still have in flight.
            if let Some(token) = grants.next() {
                self.requests.remove(&(hold.member.clone(), hold.request));
                *hold = wait.into_hold(token);
                out.push(hold.granted(key, true));
                true
            } else {
                out.push(wait.busy(key));
                false
            }
        } else if entry.queue.is_empty() && entry.compatible(r.mode) {
            if let Some(token) = grants.next() {
                let hold = wait.into_hold(token);
                out.push(hold.granted(key, false));
                entry.holders.push(hold);
                true
            } else {
                out.push(wait.busy(key));
                false
            }
        } else if r.wait && entry.queue.len() < QUEUE_MAX {
            let position = u32::try_from(entry.queue.len() + 1).unwrap_or(u32::MAX);
            out.push(wait.queued(key, position));
            entry.queue.push_back(wait);
            true
        } else {
            out.push(wait.busy(key));
            false
        };
        if placed {
            self.requests
                .insert((r.member.clone(), r.request), key.clone());
        }
        self.forget_if_unused(key);
    }

    fn on_cancel(
        &mut self,
        member: &MemberId,
        request: u64,
        grants: &mut Grants,
        out: &mut Vec<Applied>,
    ) {
        let Some(key) = self.requests.get(&(member.clone(), request)).cloned() else {
            // Cancelled before its Lock was applied (the Lock's proposal was lost and is
            // retried later): the Lock must not be applied after this.
            self.clients.first_application(member, request, 0);
            return;
        };
        let waited = self
            .locks
            .get_mut(&key)
            .and_then(|entry| entry.remove_wait(member, request));
        match waited {
            Some(wait) => {
                self.requests.remove(&(member.clone(), request));
                out.push(wait.withdrawn(&key));
                self.promote(&key, grants, out);
            }
            None => self.on_unlock(member, request, grants, out),
        }
    }

    fn on_unlock(
        &mut self,
        member: &MemberId,
        request: u64,
        grants: &mut Grants,
        out: &mut Vec<Applied>,
    ) {
        let Some(key) = self.requests.get(&(member.clone(), request)).cloned() else {
            return;
        };
        let held = self
            .locks
            .get_mut(&key)
            .and_then(|entry| entry.remove_hold(member, request));
        if let Some(hold) = held {
            self.requests.remove(&(member.clone(), request));
            out.push(hold.released(&key));
            self.promote(&key, grants, out);
        }
    }

    fn on_extend(
        &mut self,
        member: &MemberId,
        request: u64,
        lease_ms: u64,
        out: &mut Vec<Applied>,
    ) {
        let Some(key) = self.requests.get(&(member.clone(), request)) else {
            return;
        };
        let Some(hold) = self
            .locks
            .get_mut(key)
            .and_then(|entry| entry.hold_mut(member, request))
        else {
            return;
        };
        hold.lease_ms = Some(lease_ms);
        out.push(Applied::Extended {
            member: member.clone(),
            request,
            key: key.clone(),
            token: hold.token,
            lease_ms,
        });
    }

    fn on_expire(
        &mut self,
        key: &LockKey,
        token: FencingToken,
        grants: &mut Grants,
        out: &mut Vec<Applied>,
    ) {
        let taken = self
            .locks
            .get_mut(key)
            .map(|entry| entry.take_holds(|h| h.token == token))
            .unwrap_or_default();
        if taken.is_empty() {
            return;
        }
        for hold in taken {
            self.requests.remove(&(hold.member.clone(), hold.request));
            out.push(hold.lost(key, LockLostReason::LeaseExpired));
        }
        self.promote(key, grants, out);
    }

    fn on_join(&mut self, member: &MemberId, grants: &mut Grants, out: &mut Vec<Applied>) {
        if !self.clients.join(member) {
            return;
        }
        let older = |m: &MemberId| m.name() == member.name() && member.is_newer_incarnation_than(m);
        let keys = self.keys_of(older);
        for key in &keys {
            let Some(entry) = self.locks.get_mut(key) else {
                continue;
            };
            for hold in entry.holders.iter_mut().filter(|h| older(&h.member)) {
                hold.recovered = true;
            }
            for wait in entry.take_waits(|w| older(&w.member)) {
                self.requests.remove(&(wait.member.clone(), wait.request));
                out.push(wait.withdrawn(key));
            }
        }
        for key in &keys {
            self.promote(key, grants, out);
        }
    }

    fn on_drop_recovered(
        &mut self,
        member: &MemberId,
        grants: &mut Grants,
        out: &mut Vec<Applied>,
    ) {
        let dropped = |h: &Hold| {
            h.recovered
                && h.member.name() == member.name()
                && member.is_newer_incarnation_than(&h.member)
        };
        let keys: Vec<LockKey> = self
            .locks
            .iter()
            .filter(|(_, entry)| entry.holders.iter().any(dropped))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &keys {
            let Some(entry) = self.locks.get_mut(key) else {
                continue;
            };
            for hold in entry.take_holds(dropped) {
                self.requests.remove(&(hold.member.clone(), hold.request));
                out.push(hold.lost(key, LockLostReason::Shutdown));
            }
        }
        for key in &keys {
            self.promote(key, grants, out);
        }
    }

    /// Ends every hold and wait of the incarnations `of` selects (`Lost` with `reason`), by
    /// key, then promotes the waiters of those locks, by key.
    fn end_requests(
        &mut self,
        of: impl Fn(&MemberId) -> bool,
        reason: LockLostReason,
        grants: &mut Grants,
        out: &mut Vec<Applied>,
    ) {
        let keys = self.keys_of(&of);
        for key in &keys {
            let Some(entry) = self.locks.get_mut(key) else {
                continue;
            };
            for hold in entry.take_holds(|h| of(&h.member)) {
                self.requests.remove(&(hold.member.clone(), hold.request));
                out.push(hold.lost(key, reason));
            }
            for wait in entry.take_waits(|w| of(&w.member)) {
                self.requests.remove(&(wait.member.clone(), wait.request));
                out.push(wait.lost(key, reason));
            }
        }
        for key in &keys {
            self.promote(key, grants, out);
        }
    }

    /// The locks where an incarnation `of` selects holds or waits.
    fn keys_of(&self, of: impl Fn(&MemberId) -> bool) -> BTreeSet<LockKey> {
        self.requests
            .iter()
            .filter(|((member, _), _)| of(member))
            .map(|(_, key)| key.clone())
            .collect()
    }

    /// Grants from the head of `key`'s queue while the head is compatible with the holders;
    /// a lock the entry's grants do not suffice for is finished by the next entry.
    fn promote(&mut self, key: &LockKey, grants: &mut Grants, out: &mut Vec<Applied>) {
        if let Some(entry) = self.locks.get_mut(key) {
            while entry.head_grantable() {
                let Some(token) = grants.next() else {
                    self.stalled.insert(key.clone());
                    break;
                };
                if let Some(hold) = entry.grant_head(token) {
                    out.push(hold.granted(key, false));
                }
            }
        }
        self.forget_if_unused(key);
    }

    /// Drops `key`'s lock once nothing holds or waits for it.
    fn forget_if_unused(&mut self, key: &LockKey) {
        if self.locks.get(key).is_some_and(LockEntry::is_unused) {
            self.locks.remove(key);
        }
    }
}

/// A [`Command::Lock`], borrowed.
struct Request<'a> {
    member: &'a MemberId,
    request: u64,
    done_below: u64,
    key: &'a LockKey,
    owner: u64,
    mode: LockMode,
    wait: bool,
    lease_ms: Option<u64>,
}

/// The fencing tokens one entry hands out, in grant order: `token_at(index, k)` for `k` from 0
/// up to [`GRANTS_PER_ENTRY_MAX`] (excluded).
struct Grants {
    index: u64,
    next: u32,
}

impl Grants {
    fn new(index: u64) -> Self {
        Self { index, next: 0 }
    }

    /// The next token; `None` once the entry made all the grants it may.
    fn next(&mut self) -> Option<FencingToken> {
        if self.next >= GRANTS_PER_ENTRY_MAX {
            return None;
        }
        let token = token_at(self.index, self.next);
        self.next += 1;
        Some(token)
    }
}

/// A [`Table`] as read from a snapshot, before its request index is rebuilt.
#[derive(Deserialize)]
struct TableData {
    applied: u64,
    #[serde(with = "pairs")]
    locks: BTreeMap<LockKey, LockEntry>,
    clients: Clients,
    stalled: BTreeSet<LockKey>,
}

impl From<TableData> for Table {
    fn from(data: TableData) -> Self {
        let mut requests = BTreeMap::new();
        for (key, entry) in &data.locks {
            let holds = entry.holders.iter().map(|h| (&h.member, h.request));
            let waits = entry.queue.iter().map(|w| (&w.member, w.request));
            for (member, request) in holds.chain(waits) {
                requests.insert((member.clone(), request), key.clone());
            }
        }
        Self {
            applied: data.applied,
            locks: data.locks,
            clients: data.clients,
            stalled: data.stalled,
            requests,
        }
    }
}
