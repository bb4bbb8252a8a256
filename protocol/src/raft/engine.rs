//! raft-rs driven sans-IO: ticks from `(now)`, messages in and out, persistence asked of the
//! caller and acknowledged, committed entries handed out only once they are durable here.
//!
//! raft-rs draws its randomized election timeout from a thread-local RNG. After every call
//! into it, if the call reset the election timer (`election_elapsed == 0`), we overwrite the
//! draw with one from our own seeded generator ([`Jitter`]), so a run replays from its seed
//! (docs/raft.md, "Making it deterministic").

use std::collections::VecDeque;
use std::time::Duration;

use raft::eraftpb::{Entry, Message, Snapshot};
use raft::{Config, RawNode, ReadOnlyOption, ReadState, StateRole};

use super::persist::{HardState, PersistBatch, Recovered, SnapshotRecord};
use super::store::{log_entry_of, record_of, Store};
use crate::Instant;

/// The most bytes of entries one append message carries (raft-rs always sends at least one).
pub(crate) const MAX_ENTRY_BYTES_PER_MESSAGE: u64 = 8 << 10;

/// The engine's timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineTiming {
    /// One Raft tick.
    pub tick: Duration,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Ticks without a leader before an election (randomized up to twice this).
    pub election_ticks: usize,
}

impl Default for EngineTiming {
    fn default() -> Self {
        EngineTiming {
            tick: Duration::from_millis(20),
            heartbeat_ticks: 3,
            election_ticks: 15,
        }
    }
}

impl EngineTiming {
    /// The longest an election can take to start (the top of the randomized range).
    pub fn election_timeout_max(&self) -> Duration {
        self.tick * u32::try_from(self.election_ticks * 2).unwrap_or(u32::MAX)
    }
}

/// A small seeded generator (SplitMix64): the election jitter's only source.
#[derive(Clone, Debug)]
pub(crate) struct Jitter(u64);

impl Jitter {
    pub(crate) fn new(seed: u64) -> Self {
        Jitter(seed)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `low..high` (`high > low`).
    pub(crate) fn range(&mut self, low: usize, high: usize) -> usize {
        let span = (high - low) as u64;
        low + usize::try_from(self.next() % span).unwrap_or(0)
    }
}

/// A slog drain into `tracing` (raft-rs logs through slog).
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record<'_>, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::warn!(target: "conclave::raft", "{}", record.msg())
            }
            slog::Level::Warning | slog::Level::Info => {
                tracing::debug!(target: "conclave::raft", "{}", record.msg())
            }
            _ => tracing::trace!(target: "conclave::raft", "{}", record.msg()),
        }
        Ok(())
    }
}

/// Why the engine could not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the Raft engine cannot start: {0}")]
pub struct EngineError(pub String);

/// One member's Raft node.
pub(crate) struct Engine {
    raw: RawNode<Store>,
    timing: EngineTiming,
    jitter: Jitter,
    next_tick: Option<Instant>,
    /// Batches not durable yet (by ready number), with the messages that wait for them.
    unpersisted: VecDeque<(u64, Vec<Message>)>,
    persists: VecDeque<PersistBatch>,
    /// Numbers of the readies whose batch was handed out and not reported durable yet.
    written: VecDeque<u64>,
    /// Snapshots installed from the leader and not durable yet: (ready number, index).
    snapshots: VecDeque<(u64, u64)>,
    transmits: VecDeque<Message>,
    committed: VecDeque<Entry>,
    read_states: VecDeque<ReadState>,
    /// A snapshot received from the leader and installed: the table must be replaced by it.
    installed: Option<SnapshotRecord>,
    leader: u64,
    role: StateRole,
}

impl Engine {
    /// The node `id` of the voters `voters` (the same list on every member), from what it
    /// found on disk.
    pub(crate) fn new(
        id: u64,
        voters: &[u64],
        recovered: &Recovered,
        timing: EngineTiming,
        seed: u64,
    ) -> Result<Engine, EngineError> {
        let store = Store::recover(recovered, voters);
        let config = Config {
            id,
            election_tick: timing.election_ticks,
            heartbeat_tick: timing.heartbeat_ticks,
            applied: recovered.snapshot.as_ref().map_or(0, |s| s.index),
            // Entries per append message, in bytes: with our encoding's overhead a message
            // stays well inside one packet (64 KiB) of every transport.
            max_size_per_msg: MAX_ENTRY_BYTES_PER_MESSAGE,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            read_only_option: ReadOnlyOption::Safe,
            ..Config::default()
        };
        config.validate().map_err(|e| EngineError(e.to_string()))?;
        let logger = slog::Logger::root(TracingDrain, slog::o!());
        let raw = RawNode::new(&config, store, &logger).map_err(|e| EngineError(e.to_string()))?;
        let mut engine = Engine {
            raw,
            timing,
            jitter: Jitter::new(seed ^ id.wrapping_mul(0x2545_f491_4f6c_dd1d)),
            next_tick: None,
            unpersisted: VecDeque::new(),
            persists: VecDeque::new(),
            written: VecDeque::new(),
            snapshots: VecDeque::new(),
            transmits: VecDeque::new(),
            committed: VecDeque::new(),
            read_states: VecDeque::new(),
            installed: None,
            leader: 0,
            role: StateRole::Follower,
        };
        engine.after_call();
        Ok(engine)
    }

    /// Overwrites raft-rs's own election draw with ours (see the module documentation), then
    /// takes whatever the call made ready.
    fn after_call(&mut self) {
        let (low, high) = (self.timing.election_ticks, self.timing.election_ticks * 2);
        let raft = &mut self.raw.raft;
        if raft.election_elapsed == 0 && high > low {
            let draw = self.jitter.range(low, high);
            raft.set_randomized_election_timeout(draw);
        }
        self.leader = raft.leader_id;
        self.role = raft.state;
        self.take_ready();
    }

    /// Takes every ready raft-rs has: messages to send now, entries and state to persist
    /// (readable from the store at once, durable once the caller says so), committed entries
    /// (raft-rs hands out only entries durable here), messages held back until the batch they
    /// depend on is durable.
    fn take_ready(&mut self) {
        while self.raw.has_ready() {
            let mut ready = self.raw.ready();
            self.transmits.extend(ready.take_messages());
            let mut batch = PersistBatch::default();
            if !ready.snapshot().is_empty() {
                let snapshot: Snapshot = ready.snapshot().clone();
                let record = record_of(&snapshot);
                self.raw.mut_store().install_snapshot(snapshot);
                batch.snapshot = Some(record.clone());
                self.installed = Some(record);
            }
            if !ready.entries().is_empty() {
                batch.entries = ready.entries().iter().map(log_entry_of).collect();
                let entries = ready.take_entries();
                self.raw.mut_store().append(&entries);
            }
            if let Some(hs) = ready.hs() {
                batch.hard_state = Some(HardState {
                    term: hs.term,
                    vote: hs.vote,
                    commit: hs.commit,
                });
                self.raw.mut_store().set_hard_state(hs.clone());
            }
            self.read_states.extend(ready.take_read_states());
            let committed = ready.take_committed_entries();
            let last_committed = committed.last().map(|e| e.index);
            self.committed.extend(committed);
            let held_back = ready.take_persisted_messages();
            let number = ready.number();
            self.raw.advance_append_async(ready);
            if let Some(index) = last_committed {
                self.raw.advance_apply_to(index);
            }
            if batch.is_empty() && self.unpersisted.is_empty() {
                self.raw.on_persist_ready(number);
                self.transmits.extend(held_back);
            } else if batch.is_empty() {
                // on_persist_ready is cumulative and these messages must not overtake those of
                // the earlier batches: wait behind them (nothing to write for this one).
                self.unpersisted.push_back((number, held_back));
            } else {
                batch.seq = number;
                if let Some(snapshot) = &batch.snapshot {
                    self.snapshots.push_back((number, snapshot.index));
                }
                self.written.push_back(number);
                self.persists.push_back(batch);
                self.unpersisted.push_back((number, held_back));
            }
        }
    }

    /// The caller made batch `seq` (and every one before it) durable: what waited for it
    /// goes on.
    pub(crate) fn persisted(&mut self, seq: u64) {
        self.written.retain(|w| *w > seq);
        let mut done = None;
        while let Some(&(n, _)) = self.unpersisted.front() {
            // Durable: the readies up to `seq`, then those with nothing to write up to the
            // next batch still being written.
            if n > seq && self.written.front().is_some_and(|w| *w <= n) {
                break;
            }
            let (n, held_back) = self.unpersisted.pop_front().expect("checked above");
            self.transmits.extend(held_back);
            done = Some(n);
        }
        if let Some(n) = done {
            self.raw.on_persist_ready(n);
            // The table was replaced by the snapshot: raft-rs counts it applied only when told,
            // and otherwise reads the log from its old applied index (which the snapshot
            // compacted away) when it campaigns.
            let mut installed = None;
            while self
                .snapshots
                .front()
                .is_some_and(|(number, _)| *number <= n)
            {
                installed = self.snapshots.pop_front().map(|(_, index)| index);
            }
            if let Some(index) = installed.filter(|i| *i > self.raw.raft.raft_log.applied()) {
                self.raw.advance_apply_to(index);
            }
            self.after_call();
        }
    }

    /// Ticks for every tick interval passed by `now` (at most an election's worth after a
    /// pause: a stalled process does not flood).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        let next = *self.next_tick.get_or_insert(now + self.timing.tick);
        if now < next {
            return;
        }
        let mut ticks = 0;
        let mut at = next;
        while at <= now && ticks < self.timing.election_ticks {
            self.raw.tick();
            self.after_call();
            ticks += 1;
            at += self.timing.tick;
        }
        self.next_tick = Some(if at <= now {
            now + self.timing.tick
        } else {
            at
        });
    }

    /// The next tick.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.next_tick
    }

    /// Starts the ticks at `now` (the first call of the driver).
    pub(crate) fn start(&mut self, now: Instant) {
        self.next_tick.get_or_insert(now + self.timing.tick);
    }

    /// A message from a peer.
    pub(crate) fn step(&mut self, message: Message) {
        if let Err(e) = self.raw.step(message) {
            tracing::trace!(%e, "raft: message not taken");
        }
        self.after_call();
    }

    /// Proposes a command; `false` when there is no leader to take it now.
    pub(crate) fn propose(&mut self, data: Vec<u8>) -> bool {
        let taken = self.raw.propose(vec![], data).is_ok();
        self.after_call();
        taken
    }

    /// Asks the leader to confirm it still leads; the answer comes as a read state with
    /// `context`.
    pub(crate) fn read_index(&mut self, context: Vec<u8>) {
        self.raw.read_index(context);
        self.after_call();
    }

    /// Asks the leader to hand leadership to `to`.
    pub(crate) fn transfer_leader(&mut self, to: u64) {
        self.raw.transfer_leader(to);
        self.after_call();
    }

    /// Tells raft-rs a peer could not be reached.
    pub(crate) fn report_unreachable(&mut self, id: u64) {
        self.raw.report_unreachable(id);
        self.after_call();
    }

    /// Tells raft-rs a snapshot went out to `id` (whether it arrives shows in the peer's
    /// answers: a lost one is sent again once the peer still needs it).
    pub(crate) fn report_snapshot_sent(&mut self, id: u64) {
        self.raw.report_snapshot(id, raft::SnapshotStatus::Finish);
        self.after_call();
    }

    /// Keeps a local snapshot of the applied state and compacts the log below it.
    pub(crate) fn compact(&mut self, data: Vec<u8>, index: u64) -> Option<SnapshotRecord> {
        let term = raft::Storage::term(self.raw.store(), index).ok()?;
        let conf = self.raw.store().conf_state();
        let record = SnapshotRecord {
            index,
            term,
            voters: conf.voters.clone(),
            learners: conf.learners.clone(),
            data,
        };
        self.raw.mut_store().compact(&record);
        Some(record)
    }

    pub(crate) fn poll_transmit(&mut self) -> Option<Message> {
        self.transmits.pop_front()
    }

    pub(crate) fn poll_persist(&mut self) -> Option<PersistBatch> {
        self.persists.pop_front()
    }

    pub(crate) fn poll_committed(&mut self) -> Option<Entry> {
        self.committed.pop_front()
    }

    pub(crate) fn poll_read_state(&mut self) -> Option<ReadState> {
        self.read_states.pop_front()
    }

    /// A snapshot installed from the leader since the last call.
    pub(crate) fn take_installed(&mut self) -> Option<SnapshotRecord> {
        self.installed.take()
    }

    /// The leader this node knows (0: none).
    pub(crate) fn leader(&self) -> u64 {
        self.leader
    }

    /// Whether this node leads.
    pub(crate) fn is_leader(&self) -> bool {
        self.role == StateRole::Leader
    }

    /// The current term.
    pub(crate) fn term(&self) -> u64 {
        self.raw.raft.term
    }
}
