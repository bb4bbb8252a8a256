//! The checkers' memory of a Raft run, one part per invariant: the grants reported (tokens,
//! double grants), the committed log and the tables seen at each applied index (one applied
//! sequence), the incarnations that left or were replaced (no grant to them after), the table
//! reads in flight (linearizable reads), and the exclusion of believed holds.

use std::collections::{BTreeMap, BTreeSet};

use conclave_lock_api::{FencingToken, LockMode, MemberId};

use crate::raft::command::{self, Command, LockKey, TOKEN_GRANT_BITS};
use crate::raft::persist::LogEntry;
use crate::raft::RaftNode;
use crate::time::Instant;

use super::report::RaftCheckStats;

/// A broken invariant: its statement and what was seen.
pub(super) type Broken = (&'static str, String);

/// A hold a lock user believes it has (from its `Granted` until it unlocks, cancels, hears it
/// lost, leaves or crashes).
#[derive(Clone, Debug)]
pub(super) struct Belief {
    pub(super) key: LockKey,
    pub(super) mode: LockMode,
    pub(super) token: FencingToken,
    /// True time of the grant's report.
    pub(super) since: Instant,
}

/// Whether two holds of one lock exclude each other.
fn conflict(a: LockMode, b: LockMode) -> bool {
    a == LockMode::Exclusive || b == LockMode::Exclusive
}

/// The checkers' memory.
#[derive(Debug, Default)]
pub(super) struct Checks {
    /// Per lock, every grant reported, in report order: (true time, highest token so far).
    reported: BTreeMap<LockKey, Vec<(Instant, FencingToken)>>,
    /// Who holds each token of each lock (the adopter, once adopted).
    owners: BTreeMap<(LockKey, FencingToken), (MemberId, u64)>,
    /// Every (incarnation, request) granted.
    granted: BTreeSet<(u128, u64)>,
    /// The committed log: index -> (term, hash of the entry, the slot it was first seen at).
    committed: BTreeMap<u64, (u64, u64, usize)>,
    /// The tables seen: applied index -> (hash of the table, slot).
    tables: BTreeMap<u64, (u64, usize)>,
    /// Per member name, the committed `Join`s (false) and `Leave`s (true) with their index.
    gone: BTreeMap<String, Vec<(u64, MemberId, bool)>>,
    /// Table reads in flight: (slot, incarnation, query) -> the least applied index that
    /// answers them (everything committed anywhere when they were asked).
    reads: BTreeMap<(usize, u128, u64), u64>,
    pub(super) stats: RaftCheckStats,
}

impl Checks {
    /// A `Granted` report: no request is granted twice; a token names one grant of its lock;
    /// a grant's token exceeds every token of its lock reported before the request was made
    /// (adopted holds included: an adoption gets a new token).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_granted(
        &mut self,
        now: Instant,
        member: &MemberId,
        request: u64,
        key: &LockKey,
        asked_at: Instant,
        token: FencingToken,
        adopted: bool,
    ) -> Result<(), Broken> {
        if !self.granted.insert((member.incarnation(), request)) {
            return Err((
                "no request is granted twice",
                format!("{member} request {request} granted again with token {token:?}"),
            ));
        }
        let owner = (member.clone(), request);
        let slot = (key.clone(), token);
        if let Some(other) = self.owners.get(&slot) {
            return Err((
                "a fencing token names one grant of its lock",
                format!(
                    "{} {:?}: token {token:?} granted to {member} request {request} and to {} request {}",
                    key.1, key.0, other.0, other.1
                ),
            ));
        }
        self.owners.insert(slot, owner);
        let grants = self.reported.entry(key.clone()).or_default();
        let before = grants.partition_point(|(at, _)| *at < asked_at);
        self.stats.tokens_compared += 1;
        if let Some((_, bar)) = before.checked_sub(1).map(|i| grants[i]) {
            if token <= bar {
                return Err((
                    "fencing tokens increase: a grant's token exceeds every token of its lock granted before it was asked for",
                    format!(
                        "{member} request {request} on {} was granted {token:?} (index {}{}), but {bar:?} (index {}) was granted before it was asked for at {asked_at:?}",
                        key.1,
                        if adopted { ", adopted" } else { "" },
                        token.0 >> TOKEN_GRANT_BITS,
                        bar.0 >> TOKEN_GRANT_BITS
                    ),
                ));
            }
        }
        let highest = grants.last().map_or(token, |(_, t)| (*t).max(token));
        grants.push((now, highest));
        Ok(())
    }

    /// Committed entries found on slot `slot`'s disk: each index holds the same entry on every
    /// member. `Join` and `Leave` entries are remembered for [`Checks::check_gone`].
    pub(super) fn on_committed<'a>(
        &mut self,
        slot: usize,
        entries: impl Iterator<Item = &'a LogEntry>,
    ) -> Result<u64, Broken> {
        let mut last = 0;
        for entry in entries {
            last = entry.index;
            let hash = super::fnv(super::fnv(0, &entry.data), &[entry.kind]);
            match self.committed.get(&entry.index) {
                Some(&(term, h, first)) => {
                    self.stats.entries_compared += 1;
                    if term != entry.term || h != hash {
                        return Err((
                            "every member commits the same entry at each index",
                            format!(
                                "index {}: node {first} committed term {term} ({h:x}), node {slot} term {} ({hash:x}): {:?}",
                                entry.index,
                                entry.term,
                                command::decode(&entry.data)
                            ),
                        ));
                    }
                }
                None => {
                    self.committed.insert(entry.index, (entry.term, hash, slot));
                    match command::decode(&entry.data) {
                        Some(Command::Join { member }) => {
                            self.note_gone(entry.index, member, false)
                        }
                        Some(Command::Leave { member }) => {
                            self.note_gone(entry.index, member, true)
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(last)
    }

    fn note_gone(&mut self, index: u64, member: MemberId, leave: bool) {
        self.stats.gone_members += 1;
        self.gone
            .entry(member.name().to_owned())
            .or_default()
            .push((index, member, leave));
    }

    /// The highest index committed so far.
    pub(super) fn committed(&self) -> u64 {
        self.committed.keys().next_back().copied().unwrap_or(0)
    }

    /// The index from which `member` can be granted nothing: its `Leave` (or a later
    /// incarnation's), or the `Join` of a later incarnation.
    /// The entry from which `member` is gone: its index and what it was.
    fn gone_by(&self, member: &MemberId) -> Option<(u64, String)> {
        self.gone
            .get(member.name())?
            .iter()
            .filter(|(_, m, leave)| m.is_newer_incarnation_than(member) || (*leave && m == member))
            .min_by_key(|(i, _, _)| *i)
            .map(|(i, m, leave)| {
                (
                    *i,
                    format!("{} of {m}", if *leave { "Leave" } else { "Join" }),
                )
            })
    }

    /// The table of `node` (at `slot`), seen at its applied index: the same as every other
    /// member's at that index, and with no hold granted to (nor wait of) an incarnation after
    /// it left or was replaced.
    pub(super) fn check_table(&mut self, slot: usize, node: &RaftNode) -> Result<(), Broken> {
        let applied = node.applied_index();
        let table = node.table();
        if table.applied_index() != applied {
            return Err((
                "a member's table is at its applied index",
                format!(
                    "node {slot}: applied {applied}, table at {}",
                    table.applied_index()
                ),
            ));
        }
        let hash = super::fnv(0, &table.to_bytes());
        match self.tables.get(&applied) {
            Some(&(h, first)) => {
                self.stats.tables_compared += 1;
                if h != hash {
                    return Err((
                        "every member applies the same commands: equal tables at equal applied indexes",
                        format!("index {applied}: node {first} and node {slot} differ: {table:?}"),
                    ));
                }
            }
            None => {
                self.tables.insert(applied, (hash, slot));
            }
        }
        self.check_gone(slot, node)
    }

    /// No hold granted to, and no wait of, an incarnation after it left or was replaced.
    pub(super) fn check_gone(&self, slot: usize, node: &RaftNode) -> Result<(), Broken> {
        let applied = node.applied_index();
        let (locks, _) = node.locks(None, usize::MAX);
        for lock in locks {
            for holder in &lock.holders {
                let granted = holder.token.0 >> TOKEN_GRANT_BITS;
                if let Some((gone, by)) = self.gone_by(&holder.owner.member) {
                    if granted > gone {
                        return Err((
                            "no grant to a member that left or was replaced",
                            format!(
                                "node {slot} (applied {applied}): {} held by {} with {:?} granted at index {granted}, gone at {gone} ({by})",
                                lock.name, holder.owner, holder.token
                            ),
                        ));
                    }
                }
            }
            for waiter in &lock.waiters {
                if let Some((gone, by)) = self.gone_by(&waiter.owner.member) {
                    if applied >= gone {
                        return Err((
                            "no wait of a member that left or was replaced",
                            format!(
                                "node {slot} (applied {applied}): {} waited for by {}, gone at {gone} ({by})",
                                lock.name, waiter.owner
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// A table read asked now: it must be answered from a table at least at `floor`.
    pub(super) fn read_asked(&mut self, slot: usize, member: &MemberId, query: u64, floor: u64) {
        self.reads
            .insert((slot, member.incarnation(), query), floor);
    }

    /// A `TableReady`: the table answering it holds everything committed when it was asked.
    pub(super) fn read_ready(
        &mut self,
        slot: usize,
        member: &MemberId,
        query: u64,
        applied: u64,
    ) -> Result<(), Broken> {
        let Some(floor) = self.reads.remove(&(slot, member.incarnation(), query)) else {
            return Err((
                "a table read is answered once, and only if asked",
                format!("node {slot} ({member}): query {query}"),
            ));
        };
        if applied < floor {
            return Err((
                "table reads are linearizable: the table answering holds everything committed when the read was asked",
                format!(
                    "node {slot} ({member}): query {query} answered at applied index {applied}, but {floor} was committed when it was asked"
                ),
            ));
        }
        Ok(())
    }

    /// Forgets the reads of a crashed or stopped incarnation.
    pub(super) fn forget_reads(&mut self, slot: usize) {
        self.reads.retain(|(s, _, _), _| *s != slot);
    }

    /// Reads in flight at slot `slot`.
    pub(super) fn reads_pending(&self, slot: usize) -> usize {
        self.reads.keys().filter(|(s, _, _)| *s == slot).count()
    }

    /// Exclusion: of the holds believed now (`(slot, request, belief)`), no two of one lock
    /// conflict.
    pub(super) fn check_exclusion(
        &mut self,
        holds: &[(usize, u64, &Belief)],
    ) -> Result<(), Broken> {
        if holds.len() >= 2 {
            self.stats.concurrent_beliefs += 1;
        }
        for (i, (a_slot, a_request, a)) in holds.iter().enumerate() {
            for (b_slot, b_request, b) in &holds[i + 1..] {
                if a.key == b.key && conflict(a.mode, b.mode) {
                    return Err((
                        "mutual exclusion: no two members believe they hold one lock in conflicting modes at one instant",
                        format!(
                            "{}: node {a_slot} request {a_request} holds {:?} {:?} since {:?}, node {b_slot} request {b_request} holds {:?} {:?} since {:?}",
                            a.key.1, a.mode, a.token, a.since, b.mode, b.token, b.since
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}
