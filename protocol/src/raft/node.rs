//! One member of a Raft lock cluster, sans-IO: the engine, the replicated table, this
//! member's requests, its session, and (while it leads) the leases and sessions of everyone.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::TableLock;
use conclave_lock_api::{FencingToken, LockLostReason, LockMode, MemberId, ServiceName};
use raft::eraftpb::MessageType;

use super::command::{self, Applied, Command, LockKey};
use super::engine::{Engine, EngineError, EngineTiming};
use super::persist::{PersistBatch, Recovered, SnapshotRecord};
use super::table::Table;
use super::wire::{RaftBody, RaftPacket, RaftWire};
use crate::Instant;

/// How a Raft lock cluster runs: the same on every member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftSettings {
    /// Every member's name, in the same order on every member: a member's Raft id is its place
    /// in this list, from 1.
    pub peers: Vec<String>,
    /// Ticks, heartbeats and elections.
    pub timing: EngineTiming,
    /// How long a member may go without proving it is in touch with a leader before its
    /// holds end (it resigns first; the leader expires it a margin later).
    pub session_timeout: Duration,
    /// How long the holds of a member's earlier incarnation wait to be taken over by its new
    /// incarnation (a `lock()` of the same lock and mode) before they are released.
    pub recovered_hold_grace: Duration,
    /// Applied entries between two snapshots (the log is compacted below a snapshot).
    pub snapshot_every: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            peers: Vec::new(),
            timing: EngineTiming::default(),
            session_timeout: Duration::from_secs(3),
            recovered_hold_grace: Duration::from_secs(30),
            snapshot_every: 10_000,
        }
    }
}

impl RaftSettings {
    /// The margin between a member's resignation and the leader's expiry of it: a tenth of
    /// the session timeout (clock rates may differ by up to 5 %).
    pub fn margin(&self) -> Duration {
        self.session_timeout / 10
    }

    /// How long a proposal waits to be applied before it is proposed again.
    pub fn retry(&self) -> Duration {
        self.timing.election_timeout_max()
    }
}

/// What a member's own requests came to, and what else its front end must know.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RaftEvent {
    /// The request holds its lock with this token (`adopted`: a hold of this member's earlier
    /// incarnation, taken over).
    Granted {
        /// The request.
        request: u64,
        /// Its token.
        token: FencingToken,
        /// Taken over from an earlier incarnation.
        adopted: bool,
    },
    /// The request waits, at this place.
    Queued {
        /// The request.
        request: u64,
        /// From 1.
        position: u32,
    },
    /// A try-lock found the lock taken.
    Busy {
        /// The request.
        request: u64,
    },
    /// The request's hold was released (its unlock or cancel applied).
    Released {
        /// The request.
        request: u64,
    },
    /// The request's wait was withdrawn (its cancel applied).
    Withdrawn {
        /// The request.
        request: u64,
    },
    /// The request's hold or wait ended without its owner: `held` says which.
    Lost {
        /// The request.
        request: u64,
        /// Whether it held (otherwise it waited).
        held: bool,
        /// Why.
        reason: LockLostReason,
    },
    /// The request failed because this member is cut off from the cluster: it resigned while
    /// the request waited, or no leader confirmed it within a session timeout since.
    CutOff {
        /// The request.
        request: u64,
    },
    /// The leader changed (`None`: none known).
    Leader(Option<MemberId>),
    /// The members this one knows changed (see [`RaftNode::members`]).
    Members,
    /// A table read asked with [`RaftNode::read_table`] can be answered now from the local
    /// table ([`RaftNode::table`]): it is at least as new as the leader's when the read was
    /// asked.
    TableReady {
        /// The query.
        query: u64,
    },
    /// A snapshot of the applied table, made here: keep it durably and compact the log.
    Compact(SnapshotRecord),
    /// A snapshot from the leader replaced the table.
    Installed(SnapshotRecord),
    /// This member's `Leave` was applied: it can go.
    Left,
}

/// A proposal not yet seen applied.
struct Pending {
    bytes: Vec<u8>,
    proposed: Option<Instant>,
}

/// Where one of this member's requests stands, here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Proposed; no outcome applied yet.
    Asked,
    /// Queued at the table.
    Waiting,
    /// Holds.
    Held,
    /// Ended here (lost, cancelled, released, refused): later outcomes are cleaned up.
    Over,
}

struct Mine {
    stage: Stage,
    /// When the request (or the last lease extension) was first sent: the lease counts from
    /// it, here.
    sent: Instant,
    lease: Option<Duration>,
    /// The cancel or unlock proposed for it.
    ending: bool,
    /// Extensions proposed and not applied yet: (when asked, lease).
    extending: Vec<(Instant, Duration)>,
}

/// What a snapshot holds: the table and who joined (the view is rebuilt from it).
#[derive(serde::Serialize, serde::Deserialize)]
struct SnapshotState {
    table: Table,
    joins: BTreeMap<String, (MemberId, u64)>,
}

impl SnapshotState {
    fn encode(table: &Table, joins: &BTreeMap<String, (MemberId, u64)>) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Borrowed<'a> {
            table: &'a Table,
            joins: &'a BTreeMap<String, (MemberId, u64)>,
        }
        cbor4ii::serde::to_vec(Vec::new(), &Borrowed { table, joins })
            .expect("a snapshot always encodes")
    }

    fn decode(bytes: &[u8]) -> Option<SnapshotState> {
        cbor4ii::serde::from_slice(bytes).ok()
    }
}

/// Marks the ReadIndex contexts of this node.
const READ_RENEW: u8 = 1;
const READ_TABLE: u8 = 2;

/// A ReadIndex context: its kind, this member's Raft id and a number. The leader keeps pending
/// reads by context, so contexts of different members must differ.
fn read_context(kind: u8, id: u64, n: u64) -> Vec<u8> {
    let mut ctx = vec![kind];
    ctx.extend_from_slice(&id.to_be_bytes());
    ctx.extend_from_slice(&n.to_be_bytes());
    ctx
}

/// The kind and number of one of this member's (`id`) contexts.
fn parse_context(ctx: &[u8], id: u64) -> Option<(u8, u64)> {
    let (&kind, rest) = ctx.split_first()?;
    let (owner, n) = rest.split_at_checked(8)?;
    if u64::from_be_bytes(owner.try_into().ok()?) != id {
        return None;
    }
    Some((kind, u64::from_be_bytes(n.try_into().ok()?)))
}

impl std::fmt::Debug for RaftNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftNode")
            .field("me", &self.me)
            .field("id", &self.id)
            .field("term", &self.engine.term())
            .field("leader", &self.engine.leader())
            .field("applied", &self.applied)
            .finish_non_exhaustive()
    }
}

/// One member of a Raft lock cluster: the engine, the replicated table, this member's requests,
/// its session, and (while it leads) the leases and sessions of everyone; see [`crate::raft`]
/// for how sessions keep exclusion.
pub struct RaftNode {
    me: MemberId,
    id: u64,
    settings: RaftSettings,
    engine: Engine,
    table: Table,
    applied: u64,
    applied_at_snapshot: u64,
    /// Members by Raft id, as last heard (incarnations).
    known: BTreeMap<u64, MemberId>,
    /// Every member's latest incarnation that joined, with the index of its `Join`.
    joins: BTreeMap<String, (MemberId, u64)>,
    mine: BTreeMap<u64, Mine>,
    pending: Vec<Pending>,
    events: VecDeque<RaftEvent>,
    started: Option<Instant>,
    // This member's session.
    stamps: BTreeMap<u64, Instant>,
    /// The latest confirmed renewal rounds: (send time, the leader's read index).
    confirmed: VecDeque<(Instant, u64)>,
    next_stamp: u64,
    next_renew: Option<Instant>,
    /// Until when this member may believe its holds (None: it never had a proof; it holds
    /// nothing then).
    session_until: Option<Instant>,
    resigned: bool,
    joined: bool,
    recovered_deadline: Option<Instant>,
    leaving: bool,
    // Table reads: query -> index to reach (None: not confirmed yet), last asked.
    reads: BTreeMap<u64, (Option<u64>, Instant)>,
    // Leader side.
    leading: bool,
    leader: u64,
    last_heard: BTreeMap<String, Instant>,
    lease_deadlines: BTreeMap<(LockKey, FencingToken), Instant>,
    expiring: BTreeMap<String, Instant>,
}

impl RaftNode {
    /// Member `me` (its name must be one of `settings.peers`), from what it found on disk,
    /// with the election jitter drawn from `seed`.
    pub fn new(
        me: MemberId,
        settings: RaftSettings,
        recovered: &Recovered,
        seed: u64,
    ) -> Result<RaftNode, EngineError> {
        let Some(place) = settings.peers.iter().position(|p| p == me.name()) else {
            return Err(EngineError(format!(
                "member {:?} is not among the peers {:?}",
                me.name(),
                settings.peers
            )));
        };
        let distinct: BTreeSet<&String> = settings.peers.iter().collect();
        if distinct.len() != settings.peers.len() {
            return Err(EngineError("two peers have the same name".into()));
        }
        let id = place as u64 + 1;
        let voters: Vec<u64> = (1..=settings.peers.len() as u64).collect();
        let engine = Engine::new(id, &voters, recovered, settings.timing, seed)?;
        let (table, joins) = match &recovered.snapshot {
            Some(s) => {
                let state = SnapshotState::decode(&s.data)
                    .ok_or_else(|| EngineError("the snapshot's table is unreadable".into()))?;
                (state.table, state.joins)
            }
            None => (Table::new(), BTreeMap::new()),
        };
        let applied = recovered.snapshot.as_ref().map_or(0, |s| s.index);
        let mut known = BTreeMap::new();
        known.insert(id, me.clone());
        Ok(RaftNode {
            me,
            id,
            settings,
            engine,
            table,
            applied,
            applied_at_snapshot: applied,
            known,
            joins,
            mine: BTreeMap::new(),
            pending: Vec::new(),
            events: VecDeque::new(),
            started: None,
            stamps: BTreeMap::new(),
            confirmed: VecDeque::new(),
            next_stamp: 1,
            next_renew: None,
            session_until: None,
            resigned: false,
            joined: false,
            recovered_deadline: None,
            leaving: false,
            reads: BTreeMap::new(),
            leading: false,
            leader: 0,
            last_heard: BTreeMap::new(),
            lease_deadlines: BTreeMap::new(),
            expiring: BTreeMap::new(),
        })
    }

    /// This member.
    pub fn member(&self) -> &MemberId {
        &self.me
    }

    /// This member's Raft id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The Raft id of the member called `name`.
    pub fn id_of(&self, name: &str) -> Option<u64> {
        self.settings
            .peers
            .iter()
            .position(|p| p == name)
            .map(|i| i as u64 + 1)
    }

    /// The replicated table as applied here.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// The table of one service, as applied here: (locks, truncated).
    pub fn locks(&self, service: Option<&ServiceName>, max: usize) -> (Vec<TableLock>, bool) {
        self.table.locks(service, max)
    }

    /// The leader, if known (with its incarnation once heard).
    pub fn leader(&self) -> Option<MemberId> {
        let id = self.engine.leader();
        let name = self
            .settings
            .peers
            .get(usize::try_from(id).ok()?.checked_sub(1)?)?;
        self.joins
            .get(name)
            .map(|(m, _)| m.clone())
            .or_else(|| self.known.get(&id).cloned())
    }

    /// Whether this member leads.
    pub fn is_leader(&self) -> bool {
        self.engine.is_leader()
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.engine.term()
    }

    /// The members that joined (their latest incarnations), in Raft id order: the same on
    /// every member that applied the same entries.
    pub fn members(&self) -> Vec<MemberId> {
        let mut members: Vec<(u64, MemberId)> = self
            .joins
            .values()
            .filter_map(|(m, _)| Some((self.id_of(m.name())?, m.clone())))
            .collect();
        members.sort();
        members.into_iter().map(|(_, m)| m).collect()
    }

    /// The log index of the latest `Join` applied: the epoch of the members' view.
    pub fn view_epoch(&self) -> u64 {
        self.joins.values().map(|(_, i)| *i).max().unwrap_or(0)
    }

    /// The index of the last entry applied here.
    pub fn applied_index(&self) -> u64 {
        self.applied
    }

    /// Whether this member may believe, at `now`, that `request` holds its lock: it was granted,
    /// and neither this member's session nor the hold's own lease has run out by `now` (even if
    /// the timers that end them have not run yet: a process that was paused must not read a
    /// stale `Held`).
    pub fn believes(&self, now: Instant, request: u64) -> bool {
        let Some(m) = self.mine.get(&request) else {
            return false;
        };
        m.stage == Stage::Held
            && self.session_until.is_some_and(|until| now < until)
            && m.lease.is_none_or(|lease| now < m.sent + lease)
    }

    /// Changes how many applied entries there are between snapshots (tests; the setting is
    /// otherwise fixed at start).
    #[cfg(test)]
    pub(crate) fn set_snapshot_every(&mut self, entries: u64) {
        self.settings.snapshot_every = entries;
    }

    /// Whether this incarnation's `Join` was applied here (it is a member of the cluster).
    pub fn has_joined(&self) -> bool {
        self.joined
    }

    /// Whether this member is cut off (it resigned and has not proved contact since).
    pub fn is_resigned(&self) -> bool {
        self.resigned
    }

    fn start(&mut self, now: Instant) {
        if self.started.is_none() {
            self.started = Some(now);
            self.engine.start(now);
            self.next_renew = Some(now);
            self.recovered_deadline = Some(now + self.settings.recovered_hold_grace);
            self.propose(
                now,
                Command::Join {
                    member: self.me.clone(),
                },
            );
        }
    }

    /// Asks for a lock: `request` is unique in this incarnation.
    #[allow(clippy::too_many_arguments)]
    pub fn lock(
        &mut self,
        now: Instant,
        request: u64,
        key: LockKey,
        owner: u64,
        mode: LockMode,
        wait: bool,
        lease: Option<Duration>,
    ) {
        self.start(now);
        if self.resigned && !wait {
            self.events.push_back(RaftEvent::CutOff { request });
            return;
        }
        // Requests applied already are deduplicated by the table's own record of live
        // requests; only those whose Lock may still be applied must stay at or above it.
        let done_below = self
            .mine
            .iter()
            .find(|(_, m)| m.stage == Stage::Asked)
            .map_or(request, |(r, _)| *r)
            .min(request);
        self.mine.insert(
            request,
            Mine {
                stage: Stage::Asked,
                sent: now,
                lease,
                ending: false,
                extending: Vec::new(),
            },
        );
        let lease_ms = lease.map(|l| u64::try_from(l.as_millis()).unwrap_or(u64::MAX));
        self.propose(
            now,
            Command::Lock {
                member: self.me.clone(),
                request,
                done_below,
                key,
                owner,
                mode,
                wait,
                lease_ms,
            },
        );
    }

    /// Withdraws a request (its wait, or its hold if it was granted meanwhile). Nothing more
    /// is told of it.
    pub fn cancel(&mut self, now: Instant, request: u64) {
        if let Some(m) = self.mine.get_mut(&request) {
            m.stage = Stage::Over;
            if !m.ending {
                m.ending = true;
                self.propose(
                    now,
                    Command::Cancel {
                        member: self.me.clone(),
                        request,
                    },
                );
            }
        }
    }

    /// Releases a hold; [`RaftEvent::Released`] follows once applied.
    pub fn unlock(&mut self, now: Instant, request: u64) {
        if let Some(m) = self.mine.get_mut(&request) {
            if !m.ending {
                m.ending = true;
                self.propose(
                    now,
                    Command::Unlock {
                        member: self.me.clone(),
                        request,
                    },
                );
            }
        }
    }

    /// Gives a hold a new lease, counted from now here (from its application at the leader).
    pub fn extend(&mut self, now: Instant, request: u64, lease: Duration) {
        if let Some(m) = self.mine.get_mut(&request) {
            if m.stage == Stage::Held {
                // The old deadline stands until the extension is applied.
                m.extending.push((now, lease));
                let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
                self.propose(
                    now,
                    Command::Extend {
                        member: self.me.clone(),
                        request,
                        lease_ms,
                    },
                );
            }
        }
    }

    /// Leaves: every hold and wait of this member ends (at once here, with
    /// [`LockLostReason::Shutdown`], and at the table once applied); [`RaftEvent::Left`]
    /// follows once the cluster applied it.
    pub fn leave(&mut self, now: Instant) {
        self.start(now);
        self.leaving = true;
        for m in self.mine.values_mut() {
            m.stage = Stage::Over;
        }
        self.propose(
            now,
            Command::Leave {
                member: self.me.clone(),
            },
        );
    }

    /// Asks for a linearizable read of the table: [`RaftEvent::TableReady`] follows.
    pub fn read_table(&mut self, now: Instant, query: u64) {
        self.start(now);
        self.reads.insert(query, (None, now));
        self.engine
            .read_index(read_context(READ_TABLE, self.id, query));
        self.pump(now);
    }

    /// Forgets a table read.
    pub fn cancel_read(&mut self, query: u64) {
        self.reads.remove(&query);
    }

    /// Asks the leader to hand leadership to this member.
    pub fn become_leader(&mut self, now: Instant) {
        self.start(now);
        self.engine.transfer_leader(self.id);
        self.pump(now);
    }

    fn propose(&mut self, now: Instant, command: Command) {
        let bytes = command::encode(&command);
        let taken = self.engine.propose(bytes.clone());
        self.pending.push(Pending {
            bytes,
            // Without a leader the proposal waits for one (or the retry interval): never a
            // busy loop of proposals raft-rs drops.
            proposed: Some(now),
        });
        if !taken {
            tracing::trace!("raft: no leader for a proposal yet");
        }
        self.pump(now);
    }

    /// A packet from a peer (already decoded and checked to be of this cluster).
    pub fn handle_packet(&mut self, now: Instant, packet: RaftPacket) {
        self.start(now);
        let Some(from_id) = self.id_of(packet.from.name()) else {
            tracing::debug!(from = %packet.from, "raft: a packet from a member outside the peers");
            return;
        };
        match self.known.get(&from_id) {
            Some(known) if known == &packet.from => {}
            Some(known) if known.is_newer_incarnation_than(&packet.from) => return,
            _ => {
                self.known.insert(from_id, packet.from.clone());
            }
        }
        if self.leading {
            self.last_heard.insert(packet.from.name().to_owned(), now);
        }
        match packet.body {
            RaftBody::Raft(wire) => self.handle_raft(now, from_id, &wire),
        }
    }

    fn handle_raft(&mut self, now: Instant, from_id: u64, wire: &RaftWire) {
        let message = match wire.to_raft() {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(%e, "raft: message dropped");
                return;
            }
        };
        if message.from != from_id || message.to != self.id {
            tracing::debug!("raft: message with ids that are not its sender's or ours");
            return;
        }
        let needs_entries = matches!(
            message.msg_type,
            MessageType::MsgPropose | MessageType::MsgReadIndex | MessageType::MsgReadIndexResp
        );
        if needs_entries && message.entries.is_empty() {
            tracing::debug!("raft: a proposal or read without entries dropped");
            return;
        }
        if message.msg_type == MessageType::MsgPropose && !self.engine.is_leader() {
            // Forwarded to a member that no longer leads: the proposer retries.
            return;
        }
        self.engine.step(message);
        self.pump(now);
    }

    /// Timers: ticks, renewals, retries, lease and session expiry.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.start(now);
        self.engine.handle_timeout(now);
        self.renew(now);
        self.retry(now);
        self.check_session(now);
        self.check_own_leases(now);
        if self.leading && self.engine.is_leader() {
            self.expire_as_leader(now);
        }
        if self.joined
            && self.recovered_deadline.is_some_and(|d| now >= d)
            && !self.table.recovered_holds(self.me.name()).is_empty()
        {
            self.recovered_deadline = Some(now + self.settings.recovered_hold_grace);
            self.propose(
                now,
                Command::DropRecovered {
                    member: self.me.clone(),
                },
            );
        }
        self.pump(now);
    }

    /// The next instant [`RaftNode::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let mut next = self.engine.poll_timeout();
        let mut take = |t: Option<Instant>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n: Instant| n.min(t)));
            }
        };
        take(self.next_renew);
        if self.mine.values().any(|m| m.stage == Stage::Held) {
            take(self.session_until);
        }
        take(
            self.mine
                .values()
                .filter(|m| m.stage == Stage::Held)
                .filter_map(|m| m.lease.map(|l| m.sent + l))
                .min(),
        );
        take(
            self.pending
                .iter()
                .map(|p| {
                    p.proposed.map_or_else(
                        || self.started.unwrap_or(Instant::ZERO),
                        |t| t + self.settings.retry(),
                    )
                })
                .min(),
        );
        next
    }

    /// A packet to send: (the peer's name, the packet).
    pub fn poll_transmit(&mut self) -> Option<(String, RaftPacket)> {
        let message = self.engine.poll_transmit()?;
        if message.msg_type == MessageType::MsgSnapshot {
            self.engine.report_snapshot_sent(message.to);
        }
        let to = self
            .settings
            .peers
            .get(usize::try_from(message.to).ok()?.checked_sub(1)?)?
            .clone();
        Some((
            to,
            RaftPacket {
                from: self.me.clone(),
                body: RaftBody::Raft(RaftWire::from(&message)),
            },
        ))
    }

    /// A batch to make durable; call [`RaftNode::persisted`] once it is.
    pub fn poll_persist(&mut self) -> Option<PersistBatch> {
        self.engine.poll_persist()
    }

    /// Batch `seq` is durable.
    pub fn persisted(&mut self, now: Instant, seq: u64) {
        self.engine.persisted(seq);
        self.pump(now);
    }

    /// What happened, in order.
    pub fn poll_event(&mut self) -> Option<RaftEvent> {
        self.events.pop_front()
    }

    /// A peer could not be reached.
    pub fn report_unreachable(&mut self, name: &str) {
        if let Some(id) = self.id_of(name) {
            self.engine.report_unreachable(id);
        }
    }

    /// Takes everything the engine made ready: applies committed entries, answers reads,
    /// follows leadership.
    fn pump(&mut self, now: Instant) {
        if let Some(record) = self.engine.take_installed() {
            self.install(now, record);
        }
        while let Some(entry) = self.engine.poll_committed() {
            if entry.index <= self.applied {
                continue;
            }
            self.applied = entry.index;
            match command::decode(&entry.data) {
                Some(command) => self.apply(now, entry.index, &command, &entry.data),
                None => self.table.skip(entry.index),
            }
        }
        while let Some(state) = self.engine.poll_read_state() {
            match parse_context(&state.request_ctx, self.id) {
                Some((READ_RENEW, stamp)) => {
                    if let Some(sent) = self.stamps.remove(&stamp) {
                        self.stamps.retain(|s, _| *s > stamp);
                        self.proved_contact(now, sent);
                        self.confirmed.push_back((sent, state.index));
                        if self.confirmed.len() > 8 {
                            self.confirmed.pop_front();
                        }
                    }
                }
                Some((READ_TABLE, query)) => {
                    if let Some(read) = self.reads.get_mut(&query) {
                        read.0 = Some(state.index);
                    }
                }
                _ => {}
            }
        }
        let ready: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, (index, _))| index.is_some_and(|i| i <= self.applied))
            .map(|(q, _)| *q)
            .collect();
        for query in ready {
            self.reads.remove(&query);
            self.events.push_back(RaftEvent::TableReady { query });
        }
        self.follow_leadership(now);
        if self.applied >= self.applied_at_snapshot + self.settings.snapshot_every {
            self.compact_now();
        }
    }

    /// Takes a snapshot of the applied table now ([`RaftEvent::Compact`] follows), e.g. when
    /// the log on disk grew large.
    pub fn compact_now(&mut self) {
        if self.applied <= self.applied_at_snapshot {
            return;
        }
        self.applied_at_snapshot = self.applied;
        let data = SnapshotState::encode(&self.table, &self.joins);
        if let Some(record) = self.engine.compact(data, self.applied) {
            self.events.push_back(RaftEvent::Compact(record));
        }
    }

    fn install(&mut self, now: Instant, record: SnapshotRecord) {
        let Some(state) = SnapshotState::decode(&record.data) else {
            tracing::warn!(
                index = record.index,
                "raft: a snapshot with an unreadable table"
            );
            return;
        };
        self.table = state.table;
        self.joins = state.joins;
        for (member, _) in self.joins.values() {
            if let Some(id) = self.id_of(member.name()) {
                self.known.insert(id, member.clone());
            }
        }
        self.events.push_back(RaftEvent::Members);
        self.applied = record.index;
        self.applied_at_snapshot = record.index;
        if self
            .joins
            .get(self.me.name())
            .is_some_and(|(m, _)| m == &self.me)
        {
            self.joined = true;
        }
        // What the table says of this member's requests now (the entries in between were not
        // applied here one by one).
        let live: BTreeMap<u64, Option<FencingToken>> = self
            .table
            .requests_of(&self.me)
            .into_iter()
            .map(|(r, _, t)| (r, t))
            .collect();
        let requests: Vec<u64> = self.mine.keys().copied().collect();
        for request in requests {
            let (stage, ending) = {
                let m = &self.mine[&request];
                (m.stage, m.ending)
            };
            match (stage, live.get(&request)) {
                (Stage::Asked | Stage::Waiting, Some(Some(token))) => {
                    self.granted(request, *token, false);
                }
                (Stage::Asked, Some(None)) => {
                    if let Some(m) = self.mine.get_mut(&request) {
                        m.stage = Stage::Waiting;
                    }
                }
                // Its unlock was applied in the entries the snapshot covers.
                (Stage::Held, None) if ending => {
                    self.mine.remove(&request);
                    self.events.push_back(RaftEvent::Released { request });
                }
                (Stage::Held, None) => {
                    self.lost(request, true, LockLostReason::Minority);
                }
                // Answered in the entries the snapshot covers (refused, or granted and ended
                // since): the request fails; the caller may ask again. A request whose Lock the
                // snapshot does not cover yet is still on its way: it waits.
                (Stage::Asked | Stage::Waiting, None)
                    if self.table.was_applied(&self.me, request) =>
                {
                    self.cut_off(request);
                }
                // Given up here (cancelled, cut off) but held or queued at the table, by entries
                // this member never applied one by one: give it back.
                (Stage::Over, Some(_)) => self.cancel_stray(now, request),
                _ => {}
            }
        }
        self.events.push_back(RaftEvent::Installed(record));
    }

    fn apply(&mut self, now: Instant, index: u64, command: &Command, bytes: &[u8]) {
        self.pending.retain(|p| p.bytes != bytes);
        if let Command::Join { member } = command {
            if member == &self.me {
                self.joined = true;
            }
            let newer = self
                .joins
                .get(member.name())
                .is_none_or(|(m, _)| member.is_newer_incarnation_than(m));
            if newer {
                self.joins
                    .insert(member.name().to_owned(), (member.clone(), index));
                if let Some(id) = self.id_of(member.name()) {
                    self.known.insert(id, member.clone());
                }
                self.events.push_back(RaftEvent::Members);
            }
        }
        if let Command::Leave { member } = command {
            if member == &self.me {
                self.events.push_back(RaftEvent::Left);
            }
        }
        if let Command::Expire { key, token } = command {
            // Applied, whatever it found: the leader stops proposing it.
            self.lease_deadlines.remove(&(key.clone(), *token));
        }
        let mut out = Vec::new();
        self.table.apply(index, command, &mut out);
        if let Command::Cancel { member, request } = command {
            // A cancel applied before its lock: nothing more comes for the request.
            let over = self
                .mine
                .get(request)
                .is_some_and(|m| m.stage == Stage::Over);
            if member == &self.me
                && over
                && !self
                    .table
                    .requests_of(&self.me)
                    .iter()
                    .any(|(r, _, _)| r == request)
            {
                self.mine.remove(request);
            }
        }
        for applied in out {
            self.note_leases(now, &applied);
            self.tell(now, index, applied);
        }
    }

    /// The leader keeps every leased hold's deadline, from the application here.
    fn note_leases(&mut self, now: Instant, applied: &Applied) {
        match applied {
            Applied::Granted {
                key,
                token,
                lease_ms: Some(ms),
                ..
            }
            | Applied::Extended {
                key,
                token,
                lease_ms: ms,
                ..
            } => {
                let deadline = now + Duration::from_millis(*ms) + self.settings.margin();
                self.lease_deadlines.insert((key.clone(), *token), deadline);
            }
            Applied::Granted {
                key,
                token,
                lease_ms: None,
                ..
            }
            | Applied::Released { key, token, .. }
            | Applied::Lost {
                key,
                token: Some(token),
                ..
            } => {
                self.lease_deadlines.remove(&(key.clone(), *token));
            }
            _ => {}
        }
    }

    /// Tells this member's front end what an outcome did to its requests.
    fn tell(&mut self, now: Instant, index: u64, applied: Applied) {
        match applied {
            Applied::Granted {
                member,
                request,
                token,
                adopted,
                ..
            } if member == self.me => {
                match self.mine.get(&request).map(|m| (m.stage, m.sent)) {
                    Some((Stage::Asked | Stage::Waiting, sent)) => {
                        // A leader received this member's proposal after it was sent.
                        self.proved_contact(now, sent);
                        // The leader counts a lease from its application of the grant, which
                        // came after every renewal round it confirmed with a lower read index:
                        // the latest such round's send time is a safe start here too.
                        let anchor = self
                            .confirmed
                            .iter()
                            .filter(|(_, read)| *read < index)
                            .map(|(at, _)| *at)
                            .max()
                            .map_or(sent, |at| at.max(sent));
                        if let Some(m) = self.mine.get_mut(&request) {
                            m.sent = anchor;
                        }
                        self.granted(request, token, adopted);
                    }
                    _ => {
                        // Cancelled meanwhile, or unknown (an old duplicate): give it back.
                        self.cancel_stray(now, request);
                    }
                }
            }
            Applied::Queued {
                member,
                request,
                position,
                ..
            } if member == self.me => match self.mine.get_mut(&request) {
                Some(m) if m.stage == Stage::Asked => {
                    m.stage = Stage::Waiting;
                    self.events
                        .push_back(RaftEvent::Queued { request, position });
                }
                Some(m) if m.stage == Stage::Over => {}
                _ => self.cancel_stray(now, request),
            },
            Applied::Busy {
                member, request, ..
            } if member == self.me => {
                if let Some(m) = self.mine.get_mut(&request) {
                    if m.stage == Stage::Asked {
                        m.stage = Stage::Over;
                        self.events.push_back(RaftEvent::Busy { request });
                    }
                }
                self.mine.remove(&request);
            }
            Applied::Released {
                member, request, ..
            } if member == self.me => {
                if let Some(m) = self.mine.remove(&request) {
                    if m.stage != Stage::Over || m.ending {
                        self.events.push_back(RaftEvent::Released { request });
                    }
                }
            }
            Applied::Extended {
                member,
                request,
                lease_ms,
                ..
            } if member == self.me => {
                if let Some(m) = self.mine.get_mut(&request) {
                    let lease = Duration::from_millis(lease_ms);
                    if let Some(at) = m.extending.iter().position(|(_, l)| *l == lease) {
                        let (asked, _) = m.extending[at];
                        m.extending.drain(..=at);
                        if m.stage == Stage::Held {
                            m.sent = asked;
                            m.lease = Some(lease);
                        }
                    }
                }
            }
            Applied::Withdrawn {
                member, request, ..
            } if member == self.me && self.mine.remove(&request).is_some() => {
                self.events.push_back(RaftEvent::Withdrawn { request });
            }
            Applied::Lost {
                member,
                request,
                token,
                reason,
                ..
            } if member == self.me => {
                if let Some(m) = self.mine.get(&request) {
                    if m.stage != Stage::Over {
                        self.lost(request, token.is_some(), reason);
                    }
                }
                self.mine.remove(&request);
            }
            _ => {}
        }
    }

    fn granted(&mut self, request: u64, token: FencingToken, adopted: bool) {
        if let Some(m) = self.mine.get_mut(&request) {
            m.stage = Stage::Held;
            self.events.push_back(RaftEvent::Granted {
                request,
                token,
                adopted,
            });
        }
    }

    fn lost(&mut self, request: u64, held: bool, reason: LockLostReason) {
        if let Some(m) = self.mine.get_mut(&request) {
            m.stage = Stage::Over;
            self.events.push_back(RaftEvent::Lost {
                request,
                held,
                reason,
            });
        }
    }

    /// A grant or queue entry for a request nobody waits for here: cancel it at the table.
    fn cancel_stray(&mut self, now: Instant, request: u64) {
        let already = self.mine.get(&request).is_some_and(|m| m.ending);
        if !already {
            if let Some(m) = self.mine.get_mut(&request) {
                m.ending = true;
            }
            self.propose(
                now,
                Command::Cancel {
                    member: self.me.clone(),
                    request,
                },
            );
        }
    }

    /// A leader heard from this member after `sent`: its session holds until `sent` plus the
    /// session timeout minus the margin.
    fn proved_contact(&mut self, now: Instant, sent: Instant) {
        // A proof that arrives after the session ran out does not bridge the gap: what was
        // believed is resigned first (a leader may have expired this member meanwhile).
        if !self.resigned && self.session_until.is_some_and(|until| now >= until) {
            self.check_session(now);
        }
        let until = sent + (self.settings.session_timeout - self.settings.margin());
        if self.session_until.is_none_or(|u| u < until) {
            self.session_until = Some(until);
        }
        self.resigned = false;
    }

    fn renew(&mut self, now: Instant) {
        if self.next_renew.is_some_and(|t| now >= t) {
            self.next_renew = Some(now + self.settings.session_timeout / 4);
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            self.stamps.insert(stamp, now);
            // Forget rounds that can no longer help.
            let horizon = self.settings.session_timeout;
            self.stamps.retain(|_, sent| *sent + horizon > now);
            self.engine
                .read_index(read_context(READ_RENEW, self.id, stamp));
        }
    }

    fn retry(&mut self, now: Instant) {
        let retry = self.settings.retry();
        let due: Vec<usize> = self
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.proposed.is_none_or(|t| now >= t + retry))
            .map(|(i, _)| i)
            .collect();
        for i in due {
            let bytes = self.pending[i].bytes.clone();
            self.engine.propose(bytes);
            self.pending[i].proposed = Some(now);
        }
        let reads: Vec<u64> = self
            .reads
            .iter()
            .filter(|(_, (index, asked))| index.is_none() && now >= *asked + retry)
            .map(|(q, _)| *q)
            .collect();
        for query in reads {
            self.reads.insert(query, (None, now));
            self.engine
                .read_index(read_context(READ_TABLE, self.id, query));
        }
    }

    /// Resigns when the session ran out: holds lost, waits failed, both given back at the
    /// table once it can be reached.
    fn check_session(&mut self, now: Instant) {
        let cut_off = match self.session_until {
            Some(until) => now >= until,
            None => self
                .started
                .is_some_and(|s| now >= s + self.settings.session_timeout),
        };
        // Once per cut-off: requests made after the resignation wait for contact again (a
        // grant proves it) for a session timeout.
        if self.resigned {
            self.expire_cut_off_requests(now);
            return;
        }
        if !cut_off {
            return;
        }
        let live: Vec<(u64, Stage)> = self
            .mine
            .iter()
            .filter(|(_, m)| m.stage != Stage::Over)
            .map(|(r, m)| (*r, m.stage))
            .collect();
        if live.is_empty() {
            return;
        }
        tracing::info!(member = %self.me, "raft: no leader confirmed this member in time; its holds and waits end");
        self.resigned = true;
        for (request, stage) in live {
            if stage == Stage::Held {
                self.lost(request, true, LockLostReason::Minority);
            } else {
                self.cut_off(request);
            }
            self.cancel_stray(now, request);
        }
    }

    /// Fails a waiting request: this member is cut off.
    fn cut_off(&mut self, request: u64) {
        if let Some(m) = self.mine.get_mut(&request) {
            m.stage = Stage::Over;
            self.events.push_back(RaftEvent::CutOff { request });
        }
    }

    /// While resigned, a request that found no leader within a session timeout fails.
    fn expire_cut_off_requests(&mut self, now: Instant) {
        let timeout = self.settings.session_timeout;
        let late: Vec<u64> = self
            .mine
            .iter()
            .filter(|(_, m)| matches!(m.stage, Stage::Asked | Stage::Waiting))
            .filter(|(_, m)| now >= m.sent + timeout)
            .map(|(r, _)| *r)
            .collect();
        for request in late {
            self.cut_off(request);
            self.cancel_stray(now, request);
        }
    }

    /// This member's own view of its leases: a hold whose lease ran out here is lost here
    /// (the leader expires it a margin later).
    fn check_own_leases(&mut self, now: Instant) {
        let expired: Vec<u64> = self
            .mine
            .iter()
            .filter(|(_, m)| m.stage == Stage::Held && m.lease.is_some_and(|l| now >= m.sent + l))
            .map(|(r, _)| *r)
            .collect();
        for request in expired {
            self.lost(request, true, LockLostReason::LeaseExpired);
        }
    }

    fn follow_leadership(&mut self, now: Instant) {
        let leader = self.engine.leader();
        if leader != self.leader {
            self.leader = leader;
            let named = self.known.get(&leader).cloned();
            self.events.push_back(RaftEvent::Leader(named));
            // Proposals go again now, to the new leader (they are idempotent).
            if leader != 0 {
                for p in &mut self.pending {
                    p.proposed = None;
                }
            }
        }
        let leading = self.engine.is_leader();
        if leading && !self.leading {
            // A new leader counts everyone from its takeover.
            self.last_heard = self
                .settings
                .peers
                .iter()
                .map(|p| (p.clone(), now))
                .collect();
            self.lease_deadlines = self
                .table
                .leased_holds()
                .into_iter()
                .map(|(key, token, ms)| {
                    (
                        (key, token),
                        now + Duration::from_millis(ms) + self.settings.margin(),
                    )
                })
                .collect();
            self.expiring.clear();
        }
        self.leading = leading;
    }

    fn expire_as_leader(&mut self, now: Instant) {
        self.last_heard.insert(self.me.name().to_owned(), now);
        let silent_after = self.settings.session_timeout + self.settings.margin();
        let retry = self.settings.retry();
        let names: Vec<String> = self
            .table
            .member_names()
            .into_iter()
            .filter(|name| {
                self.last_heard
                    .get(name)
                    .is_none_or(|heard| now >= *heard + silent_after)
            })
            .filter(|name| self.expiring.get(name).is_none_or(|t| now >= *t + retry))
            .collect();
        for name in names {
            tracing::info!(member = %name, "raft: a member was silent past its session; its holds end");
            self.expiring.insert(name.clone(), now);
            // Not through `pending`: a leader's decision must not be re-proposed later
            // through another leader; this leader decides again after `retry` if needed.
            self.engine
                .propose(command::encode(&Command::ExpireMember { name }));
        }
        let due: Vec<(LockKey, FencingToken)> = self
            .lease_deadlines
            .iter()
            .filter(|(_, d)| now >= **d)
            .map(|(k, _)| k.clone())
            .collect();
        for (key, token) in due {
            self.lease_deadlines
                .insert((key.clone(), token), now + retry);
            self.engine
                .propose(command::encode(&Command::Expire { key, token }));
        }
    }
}
