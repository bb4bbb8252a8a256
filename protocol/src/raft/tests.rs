//! A small deterministic harness of whole Raft lock clusters in memory.

use std::collections::VecDeque;
use std::time::Duration;

use conclave_lock_api::{LockMode, LockName, MemberId};

use super::persist::Recovered;
use super::{RaftEvent, RaftNode, RaftSettings};
use crate::Instant;

pub(crate) struct Cluster {
    pub(crate) now: Instant,
    pub(crate) nodes: Vec<RaftNode>,
    pub(crate) events: Vec<Vec<RaftEvent>>,
    wire: VecDeque<(usize, super::wire::RaftPacket)>,
    /// Paused nodes get no input; what is sent to them waits (as in a socket buffer).
    pub(crate) paused: Vec<bool>,
    held: VecDeque<(usize, super::wire::RaftPacket)>,
}

pub(crate) fn settings(n: usize) -> RaftSettings {
    RaftSettings {
        peers: (0..n).map(|i| format!("m{i}")).collect(),
        ..RaftSettings::default()
    }
}

impl Cluster {
    pub(crate) fn new(n: usize, seed: u64) -> Cluster {
        let nodes = (0..n)
            .map(|i| {
                let me = MemberId::new(
                    (u128::from(seed) << 64) | 1,
                    &format!("m{i}"),
                    format!("127.0.0.1:{}", 7000 + i).parse().unwrap(),
                )
                .unwrap();
                RaftNode::new(me, settings(n), &Recovered::default(), seed).unwrap()
            })
            .collect();
        Cluster {
            now: Instant::ZERO,
            nodes,
            events: vec![Vec::new(); n],
            wire: VecDeque::new(),
            paused: vec![false; n],
            held: VecDeque::new(),
        }
    }

    /// Delivers everything and persists at once, then moves time by `step`.
    pub(crate) fn step(&mut self, step: Duration) {
        for i in 0..self.nodes.len() {
            if !self.paused[i] {
                self.nodes[i].handle_timeout(self.now);
            }
        }
        let held = std::mem::take(&mut self.held);
        for (to, packet) in held {
            if self.paused[to] {
                self.held.push_back((to, packet));
            } else {
                self.wire.push_back((to, packet));
            }
        }
        for _ in 0..100 {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                if self.paused[i] {
                    continue;
                }
                while let Some(batch) = self.nodes[i].poll_persist() {
                    moved = true;
                    self.nodes[i].persisted(self.now, batch.seq);
                }
                while let Some((to, packet)) = self.nodes[i].poll_transmit() {
                    moved = true;
                    // Every message but a snapshot fits one packet of every transport.
                    let super::wire::RaftBody::Raft(wire) = &packet.body;
                    if wire.snapshot.is_none() {
                        let cluster = super::wire::raft_cluster_id("sim");
                        let len = super::wire::encode_packet(cluster, &packet).len();
                        assert!(len <= 32 << 10, "a {len}-byte Raft packet");
                    }
                    let to = self
                        .nodes
                        .iter()
                        .position(|n| n.member().name() == to)
                        .unwrap();
                    self.wire.push_back((to, packet));
                }
                while let Some(e) = self.nodes[i].poll_event() {
                    self.events[i].push(e);
                }
            }
            while let Some((to, packet)) = self.wire.pop_front() {
                moved = true;
                if self.paused[to] {
                    self.held.push_back((to, packet));
                } else {
                    self.nodes[to].handle_packet(self.now, packet);
                }
            }
            if !moved {
                break;
            }
        }
        self.now += step;
    }

    pub(crate) fn run(&mut self, d: Duration) {
        let steps = d.as_millis() / 10;
        for _ in 0..steps {
            self.step(Duration::from_millis(10));
        }
    }
}

#[test]
fn three_members_elect_a_leader_and_join() {
    let mut c = Cluster::new(3, 7);
    c.run(Duration::from_secs(2));
    let leaders = c.nodes.iter().filter(|n| n.is_leader()).count();
    assert_eq!(leaders, 1);
    for n in &c.nodes {
        assert!(n.has_joined(), "{n:?}");
        assert_eq!(n.members().len(), 3);
    }
}

#[test]
fn a_lock_is_granted_and_the_next_waits() {
    let mut c = Cluster::new(3, 9);
    c.run(Duration::from_secs(2));
    let key = (None, LockName::new("x").unwrap());
    let now = c.now;
    c.nodes[0].lock(now, 1, key.clone(), 1, LockMode::Exclusive, true, None);
    c.nodes[1].lock(now, 1, key.clone(), 1, LockMode::Exclusive, true, None);
    c.run(Duration::from_millis(200));
    let granted = |c: &Cluster, i: usize| {
        c.events[i]
            .iter()
            .any(|e| matches!(e, RaftEvent::Granted { request: 1, .. }))
    };
    let (first, second) = if granted(&c, 0) { (0, 1) } else { (1, 0) };
    assert!(granted(&c, first), "{:?}", c.events);
    assert!(!granted(&c, second), "{:?}", c.events);
    assert!(c.events[second].iter().any(|e| matches!(
        e,
        RaftEvent::Queued {
            request: 1,
            position: 1
        }
    )));
    let now = c.now;
    c.nodes[first].unlock(now, 1);
    c.run(Duration::from_millis(200));
    assert!(c.events[first]
        .iter()
        .any(|e| matches!(e, RaftEvent::Released { request: 1 })));
    assert!(granted(&c, second), "{:?}", c.events);
}

#[test]
fn renewals_keep_a_hold_for_many_session_timeouts() {
    let mut c = Cluster::new(3, 11);
    c.run(Duration::from_secs(2));
    for i in 0..3 {
        let now = c.now;
        c.nodes[i].lock(
            now,
            1,
            (None, LockName::new(format!("k{i}")).unwrap()),
            1,
            LockMode::Exclusive,
            true,
            None,
        );
    }
    c.run(Duration::from_secs(20));
    for i in 0..3 {
        assert!(
            !c.events[i]
                .iter()
                .any(|e| matches!(e, RaftEvent::Lost { .. })),
            "member {i}: {:?}",
            c.events[i]
        );
        assert!(!c.nodes[i].is_resigned());
    }
}

#[test]
fn a_paused_leader_resigns_then_regains_contact() {
    let mut c = Cluster::new(3, 13);
    c.run(Duration::from_secs(2));
    let leader = c.nodes.iter().position(RaftNode::is_leader).unwrap();
    let now = c.now;
    let key = (None, LockName::new("x").unwrap());
    c.nodes[leader].lock(now, 1, key.clone(), 1, LockMode::Exclusive, true, None);
    c.run(Duration::from_millis(300));
    assert!(c.nodes[leader].believes(c.now, 1));
    c.paused[leader] = true;
    c.run(Duration::from_secs(9));
    assert!(
        !c.nodes[leader].believes(c.now, 1),
        "a paused holder's belief ends with its session"
    );
    let other = (leader + 1) % 3;
    let now = c.now;
    c.nodes[other].lock(now, 1, key.clone(), 1, LockMode::Exclusive, true, None);
    c.run(Duration::from_millis(500));
    assert!(
        c.events[other]
            .iter()
            .any(|e| matches!(e, RaftEvent::Granted { request: 1, .. })),
        "{:?}",
        c.events[other]
    );
    c.paused[leader] = false;
    c.run(Duration::from_secs(3));
    assert!(
        c.events[leader]
            .iter()
            .any(|e| matches!(e, RaftEvent::Lost { request: 1, .. })),
        "{:?}",
        c.events[leader]
    );
    assert!(!c.nodes[leader].is_resigned(), "contact proved again");
    let now = c.now;
    let y = (None, LockName::new("y").unwrap());
    c.nodes[leader].lock(now, 2, y, 2, LockMode::Exclusive, true, None);
    c.run(Duration::from_millis(500));
    assert!(
        c.events[leader]
            .iter()
            .any(|e| matches!(e, RaftEvent::Granted { request: 2, .. })),
        "{:?}",
        c.events[leader]
    );
}

#[test]
fn snapshots_compact_the_log_and_a_lagging_member_catches_up() {
    let mut c = Cluster::new(3, 17);
    for n in &mut c.nodes {
        n.set_snapshot_every(100);
    }
    c.run(Duration::from_secs(2));
    let leader = c.nodes.iter().position(RaftNode::is_leader).unwrap();
    let lagging = (leader + 1) % 3;
    let worker = (leader + 2) % 3;
    c.paused[lagging] = true;
    let key = (None, LockName::new("x").unwrap());
    for r in 1..=700u64 {
        let now = c.now;
        c.nodes[worker].lock(now, r, key.clone(), 1, LockMode::Exclusive, true, None);
        c.step(Duration::from_millis(10));
        let now = c.now;
        c.nodes[worker].unlock(now, r);
        c.step(Duration::from_millis(10));
    }
    c.run(Duration::from_millis(500));
    let granted = c.events[worker]
        .iter()
        .filter(|e| matches!(e, RaftEvent::Granted { .. }))
        .count();
    assert_eq!(granted, 700);
    assert!(c.events[worker]
        .iter()
        .any(|e| matches!(e, RaftEvent::Compact(_))));
    // The lagging member is more than the kept entries behind: it gets the snapshot.
    c.paused[lagging] = false;
    c.run(Duration::from_secs(3));
    assert_eq!(
        c.nodes[lagging].applied_index(),
        c.nodes[leader].applied_index(),
        "{:?}",
        c.events[lagging]
            .iter()
            .filter(|e| matches!(e, RaftEvent::Installed(_)))
            .count()
    );
    assert_eq!(c.nodes[lagging].table(), c.nodes[leader].table());
    assert!(c.events[lagging]
        .iter()
        .any(|e| matches!(e, RaftEvent::Installed(_))));
}
