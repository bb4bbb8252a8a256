//! Adversarial schedules against the Raft engine, each a regression test of a found bug: a
//! harness with partitions, one-way cuts, stalled disks, pauses, restarts from what was durable,
//! staggered starts, packet-size tracking and per-node events.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId};

use super::persist::{PersistBatch, Recovered};
use super::wire::RaftPacket;
use super::{RaftEvent, RaftNode, RaftSettings};
use crate::Instant;

pub(crate) struct Net {
    pub(crate) now: Instant,
    pub(crate) nodes: Vec<RaftNode>,
    pub(crate) events: Vec<Vec<(Instant, RaftEvent)>>,
    wire: VecDeque<(usize, usize, RaftPacket)>,
    /// Directed links that drop everything.
    pub(crate) cut: BTreeSet<(usize, usize)>,
    /// Nodes whose batches are not persisted (they stay queued).
    pub(crate) stall_disk: BTreeSet<usize>,
    pub(crate) queued_batches: Vec<VecDeque<PersistBatch>>,
    /// Durable batches per node (what a crash keeps).
    pub(crate) durable: Vec<Vec<PersistBatch>>,
    /// Nodes whose handle_timeout is not called (paused process).
    pub(crate) paused: BTreeSet<usize>,
    /// Node i's first handle_timeout (its start) is at start_at[i].
    pub(crate) start_at: Vec<Instant>,
    /// The largest encoded packet sent (bytes, with our 13-byte header).
    pub(crate) max_packet: usize,
}

pub(crate) fn settings(n: usize) -> RaftSettings {
    RaftSettings {
        peers: (0..n).map(|i| format!("m{i}")).collect(),
        ..RaftSettings::default()
    }
}

pub(crate) fn member(i: usize, gen: u128) -> MemberId {
    MemberId::new(
        (gen << 64) | (i as u128 + 1),
        &format!("m{i}"),
        format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
    )
    .unwrap()
}

pub(crate) fn key(name: &str) -> super::command::LockKey {
    (None, LockName::new(name).unwrap())
}

impl Net {
    pub(crate) fn new(n: usize, seed: u64, settings: RaftSettings) -> Net {
        let nodes = (0..n)
            .map(|i| {
                RaftNode::new(member(i, 1), settings.clone(), &Recovered::default(), seed).unwrap()
            })
            .collect();
        Net {
            now: Instant::ZERO,
            nodes,
            events: vec![Vec::new(); n],
            wire: VecDeque::new(),
            cut: BTreeSet::new(),
            stall_disk: BTreeSet::new(),
            queued_batches: vec![VecDeque::new(); n],
            durable: vec![Vec::new(); n],
            paused: BTreeSet::new(),
            start_at: vec![Instant::ZERO; n],
            max_packet: 0,
        }
    }

    /// Starts node i at i * 100 ms (all before any election can happen), so that their
    /// renewal rounds are not sent at the same instants.
    pub(crate) fn staggered(n: usize, seed: u64, settings: RaftSettings) -> Net {
        let mut net = Net::new(n, seed, settings);
        net.start_at = (0..n)
            .map(|i| Instant::ZERO + Duration::from_millis(100 * i as u64))
            .collect();
        net
    }

    pub(crate) fn isolate(&mut self, i: usize) {
        for j in 0..self.nodes.len() {
            if j != i {
                self.cut.insert((i, j));
                self.cut.insert((j, i));
            }
        }
    }

    pub(crate) fn heal(&mut self) {
        self.cut.clear();
    }

    fn drain_node(&mut self, i: usize) -> bool {
        let mut moved = false;
        while let Some(batch) = self.nodes[i].poll_persist() {
            moved = true;
            self.queued_batches[i].push_back(batch);
        }
        if !self.stall_disk.contains(&i) {
            while let Some(batch) = self.queued_batches[i].pop_front() {
                moved = true;
                let seq = batch.seq;
                self.durable[i].push(batch);
                self.nodes[i].persisted(self.now, seq);
            }
        }
        while let Some((to, packet)) = self.nodes[i].poll_transmit() {
            moved = true;
            let to = self
                .nodes
                .iter()
                .position(|n| n.member().name() == to)
                .unwrap();
            let len = super::wire::encode_packet(super::wire::raft_cluster_id("c"), &packet).len();
            self.max_packet = self.max_packet.max(len);
            if !self.cut.contains(&(i, to)) {
                self.wire.push_back((i, to, packet));
            }
        }
        while let Some(e) = self.nodes[i].poll_event() {
            moved = true;
            self.events[i].push((self.now, e));
        }
        moved
    }

    pub(crate) fn settle(&mut self) {
        for _ in 0..1000 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                moved |= self.drain_node(i);
            }
            while let Some((from, to, packet)) = self.wire.pop_front() {
                if self.cut.contains(&(from, to)) {
                    continue;
                }
                moved = true;
                self.nodes[to].handle_packet(self.now, packet);
                self.drain_node(to);
            }
            if !moved {
                break;
            }
        }
    }

    pub(crate) fn step(&mut self, step: Duration) {
        for i in 0..self.nodes.len() {
            if !self.paused.contains(&i) && self.now >= self.start_at[i] {
                self.nodes[i].handle_timeout(self.now);
            }
        }
        self.settle();
        self.now += step;
    }

    pub(crate) fn run(&mut self, d: Duration) {
        let steps = d.as_millis() / 10;
        for _ in 0..steps {
            self.step(Duration::from_millis(10));
        }
    }

    /// What node i's disk holds (its durable batches, folded as the disk does).
    pub(crate) fn recovered(&self, i: usize) -> Recovered {
        let mut rec = Recovered::default();
        for b in &self.durable[i] {
            if let Some(s) = &b.snapshot {
                rec.entries.retain(|e| e.index > s.index);
                rec.snapshot = Some(s.clone());
            }
            if let Some(first) = b.entries.first() {
                rec.entries.retain(|e| e.index < first.index);
                rec.entries.extend(b.entries.iter().cloned());
            }
            if let Some(hs) = b.hard_state {
                rec.hard_state = hs;
            }
        }
        rec
    }

    /// Kills node i (what was not persisted is lost) and starts its next incarnation `gen`
    /// from its disk.
    pub(crate) fn restart(&mut self, i: usize, gen: u128, settings: RaftSettings, seed: u64) {
        let rec = self.recovered(i);
        self.queued_batches[i].clear();
        self.wire.retain(|(from, to, _)| *from != i && *to != i);
        self.nodes[i] = RaftNode::new(member(i, gen), settings, &rec, seed).unwrap();
        self.events[i].clear();
    }

    pub(crate) fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| n.is_leader())
    }

    /// Whether node `i` believes request `r` holds right now (its last event about it).
    pub(crate) fn holds(&self, i: usize, r: u64) -> Option<FencingToken> {
        let mut held = None;
        for (_, e) in &self.events[i] {
            match e {
                RaftEvent::Granted { request, token, .. } if *request == r => held = Some(*token),
                RaftEvent::Lost { request, .. }
                | RaftEvent::Released { request }
                | RaftEvent::Withdrawn { request }
                    if *request == r =>
                {
                    held = None
                }
                _ => {}
            }
        }
        held
    }

    pub(crate) fn events_of(&self, i: usize) -> Vec<&RaftEvent> {
        self.events[i].iter().map(|(_, e)| e).collect()
    }
}

// ---------------------------------------------------------------------------------------------
// F1: compaction with everything applied drops every entry from MemStorage, whose snapshot
// metadata compact() never updates: last_index() falls back to the previous snapshot's index.
// ---------------------------------------------------------------------------------------------
#[test]
fn compaction_keeps_the_log_index() {
    let mut s = settings(3);
    s.snapshot_every = 5;
    let mut net = Net::new(3, 11, s);
    net.run(Duration::from_secs(2));
    let l = net.leader().expect("a leader");
    let before = net.nodes[l].applied_index();
    let k = key("x");
    let mut last = None::<FencingToken>;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for r in 1..=20u64 {
            let now = net.now;
            net.nodes[l].lock(now, r, k.clone(), 1, LockMode::Exclusive, true, None);
            net.run(Duration::from_millis(100));
            let token = net
                .holds(l, r)
                .unwrap_or_else(|| panic!("request {r} not granted: {:?}", net.events_of(l)));
            if let Some(prev) = last {
                assert!(token > prev, "token went back: {prev:?} then {token:?}");
            }
            last = Some(token);
            let now = net.now;
            net.nodes[l].unlock(now, r);
            net.run(Duration::from_millis(100));
        }
    }));
    let after: Vec<u64> = net.nodes.iter().map(|n| n.applied_index()).collect();
    assert!(
        result.is_ok(),
        "panicked; applied before {before}, after {after:?}"
    );
}

fn followers(net: &Net) -> (usize, usize, usize) {
    let l = net.leader().expect("a leader");
    let f: Vec<usize> = (0..net.nodes.len()).filter(|i| *i != l).collect();
    (l, f[0], f[1])
}

// ---------------------------------------------------------------------------------------------
// F2: `extend` moves the holder's deadline at once, before the Extend is applied; the leader
// still expires the hold at its old deadline.
// ---------------------------------------------------------------------------------------------
#[test]
fn an_extension_not_applied_does_not_outlive_the_old_lease() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (_l, a, b) = followers(&net);
    let k = key("x");
    let now = net.now;
    net.nodes[a].lock(
        now,
        1,
        k.clone(),
        1,
        LockMode::Exclusive,
        true,
        Some(Duration::from_secs(1)),
    );
    net.run(Duration::from_millis(50));
    assert!(net.holds(a, 1).is_some(), "{:?}", net.events_of(a));
    let granted_at = net.now;
    let now = net.now;
    net.nodes[b].lock(now, 1, k.clone(), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(450));
    // The holder is cut off (its session is still good for ~2.7 s), then extends by 2 s.
    net.isolate(a);
    net.run(Duration::from_millis(400));
    let now = net.now;
    net.nodes[a].extend(now, 1, Duration::from_secs(2));
    // Run until 1.8 s after the grant and look for an instant where both believe they hold.
    while net.now < granted_at + Duration::from_millis(1800) {
        net.step(Duration::from_millis(10));
        if let (Some(ta), Some(tb)) = (net.holds(a, 1), net.holds(b, 1)) {
            panic!(
                "both hold x at {:?} (after grant +{:?}): a {ta:?}, b {tb:?}",
                net.now,
                net.now.saturating_duration_since(granted_at)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// F3: every member uses the same ReadIndex contexts ([READ_RENEW, stamp] with stamps from 1);
// raft-rs's ReadOnly::add_request drops a request whose context is already pending, so the
// renewals of members that renew at the same instants are never confirmed: their holds are lost
// (Minority) a session timeout after they were asked, though nothing failed.
// ---------------------------------------------------------------------------------------------
#[test]
fn a_connected_follower_keeps_its_hold() {
    let mut net = Net::new(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (_l, a, _b) = followers(&net);
    let now = net.now;
    net.nodes[a].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(100));
    assert!(net.holds(a, 1).is_some(), "{:?}", net.events_of(a));
    net.run(Duration::from_secs(6));
    assert!(
        net.holds(a, 1).is_some(),
        "a fully connected follower lost its hold: {:?}",
        net.events_of(a)
    );
}

// ---------------------------------------------------------------------------------------------
// F4: Engine::take_ready calls on_persist_ready(number) for a ready with nothing to persist,
// and releases its held-back messages at once. on_persist_ready is cumulative: it marks every
// earlier ready persisted too, and the released messages (an append response) overtake those
// of the earlier, still unpersisted batch. A follower then acks entries that are not durable.
// Here both followers never persist anything: nothing may commit, yet the lock is granted.
// ---------------------------------------------------------------------------------------------
#[test]
fn nothing_commits_while_no_follower_has_persisted() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, b) = followers(&net);
    net.stall_disk.insert(a);
    net.stall_disk.insert(b);
    let now = net.now;
    net.nodes[l].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(500));
    assert!(
        net.holds(l, 1).is_none(),
        "granted (committed) though only the leader has the entry on disk: {:?}; unpersisted batches a {} b {}",
        net.events_of(l),
        net.queued_batches[a].len(),
        net.queued_batches[b].len()
    );
}

// ---------------------------------------------------------------------------------------------
// F5: Cancel racing a Lock. The Lock's proposal is lost; the request is cancelled and the
// Cancel is applied first (it finds nothing); the Lock's retry is applied later and granted;
// the grant finds the request Over with `ending` set, so cancel_stray proposes nothing: the
// hold stays in the table for ever (its member is alive, so it never expires).
// ---------------------------------------------------------------------------------------------
#[test]
fn a_cancel_applied_before_its_lock_does_not_leak_the_hold() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, b) = followers(&net);
    // a's proposal is lost on the way to the leader.
    net.cut.insert((a, l));
    let now = net.now;
    net.nodes[a].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(50));
    net.heal();
    // The lock() future times out or is dropped: cancel.
    let now = net.now;
    net.nodes[a].cancel(now, 1);
    net.run(Duration::from_secs(2));
    // Someone else wants the lock.
    let now = net.now;
    net.nodes[b].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_secs(10));
    assert!(
        net.holds(b, 1).is_some(),
        "b never gets x: table {:?}\na {:?}\nb {:?}",
        net.nodes[l].locks(None, 10),
        net.events_of(a),
        net.events_of(b)
    );
}

// ---------------------------------------------------------------------------------------------
// F6: a leader-only decision (ExpireMember) kept in `pending` by a leader that lost leadership
// before it committed is re-proposed later, through the *next* leader, which commits it
// blindly: a member that is in contact with the current leader loses its holds, and another
// member is granted them while it still believes it holds (here it does not hear the new
// leader for a while: a one-way cut b -> a).
// ---------------------------------------------------------------------------------------------
#[test]
fn a_deposed_leaders_expiry_is_not_committed_by_its_successor() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, b) = followers(&net);
    let now = net.now;
    net.nodes[a].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(100));
    assert!(net.holds(a, 1).is_some());
    // l stops hearing a; 3.3 s later it decides to expire a, but it is cut off just before.
    net.cut.insert((a, l));
    net.run(Duration::from_millis(3100));
    net.isolate(l);
    net.run(Duration::from_millis(1500));
    net.cut.clear();
    net.isolate(l);
    // a and b elect a leader; make it b.
    net.run(Duration::from_secs(1));
    if net.leader() == Some(a) {
        let now = net.now;
        net.nodes[b].become_leader(now);
        net.run(Duration::from_millis(500));
    }
    assert_eq!(net.leader(), Some(b), "b leads");
    net.run(Duration::from_secs(1));
    let now = net.now;
    net.nodes[a].lock(now, 2, key("y"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(100));
    assert!(net.holds(a, 2).is_some(), "{:?}", net.events_of(a));
    let now = net.now;
    net.nodes[b].lock(now, 1, key("y"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(500));
    assert!(net.holds(a, 2).is_some() && net.holds(b, 1).is_none());
    // l comes back; b's messages to a are lost for a while.
    net.heal();
    net.cut.insert((b, a));
    let start = net.now;
    while net.now < start + Duration::from_secs(2) {
        net.step(Duration::from_millis(10));
        if let (Some(ta), Some(tb)) = (net.holds(a, 2), net.holds(b, 1)) {
            panic!(
                "both hold y at +{:?}: a {ta:?}, b {tb:?}; b's events {:?}; table at b {:?}; a resigned {}",
                net.now.saturating_duration_since(start),
                net.events_of(b),
                net.nodes[b].locks(None, 10),
                net.nodes[a].is_resigned()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// F7: max_size_per_msg is 64 KiB of entry data, but the driver sends each message as one
// datagram: the memory and UDP transports refuse anything above 65,000 bytes (1,400 with the
// routed UDP preset), and the refusal is only logged. A follower that fell behind by more than
// that (or needs a snapshot larger than that) is sent the same oversized message again and
// again and never catches up.
// ---------------------------------------------------------------------------------------------
#[test]
fn catch_up_messages_fit_a_datagram() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, _b) = followers(&net);
    net.isolate(a);
    for r in 1..=1000u64 {
        let now = net.now;
        net.nodes[l].lock(
            now,
            r,
            key(&format!("lock-{r}")),
            1,
            LockMode::Exclusive,
            true,
            None,
        );
        net.step(Duration::from_millis(10));
    }
    net.run(Duration::from_millis(200));
    net.max_packet = 0;
    net.heal();
    net.run(Duration::from_secs(1));
    assert!(
        net.max_packet <= 65_000,
        "a {}-byte packet: the memory and UDP transports refuse it (InvalidInput), for ever",
        net.max_packet
    );
}

// ---------------------------------------------------------------------------------------------
// F8: a peer's MsgReadIndex (or MsgPropose) without entries panics the leader inside raft-rs
// (`m.entries[0]`, `fatal!("stepped empty MsgProp")`); handle_raft only checks from/to.
// ---------------------------------------------------------------------------------------------
#[test]
fn a_malformed_peer_message_does_not_panic_the_leader() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, _b) = followers(&net);
    for msg_type in [15, 2] {
        let wire = super::wire::RaftWire {
            msg_type,
            from: net.nodes[a].id(),
            to: net.nodes[l].id(),
            term: net.nodes[l].term(),
            ..Default::default()
        };
        let packet = RaftPacket {
            from: net.nodes[a].member().clone(),
            body: super::wire::RaftBody::Raft(wire),
        };
        let now = net.now;
        let node = &mut net.nodes[l];
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            node.handle_packet(now, packet);
        }));
        assert!(
            result.is_ok(),
            "message type {msg_type} without entries panicked the leader"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// F9: a restarted member adopts its earlier incarnation's leased hold with a lock() without a
// lease. note_leases ignores a grant without a lease, so the leader keeps the old hold's
// deadline under the same (key, token) and expires the adopted hold, whose holder counts no
// lease at all: it learns only when it applies the Expire.
// ---------------------------------------------------------------------------------------------
#[test]
fn an_adopted_hold_without_a_lease_is_not_expired_by_the_old_lease() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, b) = followers(&net);
    let now = net.now;
    net.nodes[a].lock(
        now,
        1,
        key("x"),
        1,
        LockMode::Exclusive,
        true,
        Some(Duration::from_secs(4)),
    );
    net.run(Duration::from_millis(100));
    let token = net.holds(a, 1).expect("granted");
    let granted = net.now;
    // a restarts at once (new incarnation) and takes its hold back, without a lease.
    net.restart(a, 2, settings(3), 5);
    net.run(Duration::from_millis(500));
    let now = net.now;
    net.nodes[a].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(200));
    assert!(
        net.holds(a, 1).is_some_and(|t| t > token),
        "adopted: {:?}",
        net.events_of(a)
    );
    let now = net.now;
    net.nodes[b].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    // Just before the old lease's deadline at the leader, a stops hearing the leader.
    while net.now < granted + Duration::from_millis(4200) {
        net.step(Duration::from_millis(10));
    }
    net.cut.insert((l, a));
    while net.now < granted + Duration::from_millis(5500) {
        net.step(Duration::from_millis(10));
        if let (Some(ta), Some(tb)) = (net.holds(a, 1), net.holds(b, 1)) {
            panic!(
                "both hold x at grant +{:?}: a (adopted, no lease) {ta:?}, b {tb:?}",
                net.now.saturating_duration_since(granted)
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// F10: done_below is the lowest request of this incarnation not Over; one long-lived hold pins
// it, and the replicated table then remembers every later request number of that incarnation
// for as long as the hold lasts (in memory, in every snapshot).
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// F11: a waiter's own lease counts from its lock() call, not from its grant: a waiter that
// waited longer than its lease is told Granted and then Lost(LeaseExpired) at once, while the
// table keeps the lock for it (the leader counts the lease from the grant).
// ---------------------------------------------------------------------------------------------
#[test]
fn a_promoted_waiter_gets_its_whole_lease() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (_l, a, b) = followers(&net);
    let now = net.now;
    net.nodes[a].lock(now, 1, key("x"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(100));
    let now = net.now;
    net.nodes[b].lock(
        now,
        1,
        key("x"),
        1,
        LockMode::Exclusive,
        true,
        Some(Duration::from_secs(1)),
    );
    net.run(Duration::from_millis(1500));
    let now = net.now;
    net.nodes[a].unlock(now, 1);
    net.run(Duration::from_millis(100));
    let granted = net
        .events_of(b)
        .iter()
        .any(|e| matches!(e, RaftEvent::Granted { request: 1, .. }));
    assert!(granted, "{:?}", net.events_of(b));
    net.run(Duration::from_millis(100));
    assert!(
        net.holds(b, 1).is_some(),
        "granted with a 1 s lease, lost 100 ms later: {:?}",
        net.events_of(b)
    );
}

/// F10 through the node: what `RaftNode::lock` proposes as done_below.
#[test]
fn a_long_hold_does_not_make_the_replicated_table_grow() {
    let mut net = Net::staggered(3, 5, settings(3));
    net.run(Duration::from_secs(2));
    let (l, a, _b) = followers(&net);
    let now = net.now;
    net.nodes[a].lock(now, 1, key("leader"), 1, LockMode::Exclusive, true, None);
    net.run(Duration::from_millis(100));
    let base = net.nodes[l].table().to_bytes().len();
    for r in 2..=301u64 {
        let now = net.now;
        net.nodes[a].lock(now, r, key("work"), 1, LockMode::Exclusive, true, None);
        net.run(Duration::from_millis(20));
        let now = net.now;
        net.nodes[a].unlock(now, r);
        net.run(Duration::from_millis(20));
    }
    let after = net.nodes[l].table().to_bytes().len();
    assert!(
        after < base + 200,
        "the replicated table grew from {base} to {after} bytes"
    );
}
