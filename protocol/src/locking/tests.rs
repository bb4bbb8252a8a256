//! Unit tests of the locking layer over a perfect network, one scenario per rule.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

use crate::test_support::member;

fn lock_name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

struct Cluster {
    nodes: BTreeMap<MemberId, LockService>,
    notices: BTreeMap<MemberId, Vec<LockNotice>>,
    now: Instant,
    /// Directed links that drop everything (heartbeats and messages).
    cut: std::collections::BTreeSet<(MemberId, MemberId)>,
}

impl Cluster {
    fn new(members: &[u8], config: LockConfig) -> Self {
        let nodes = members
            .iter()
            .map(|n| (member(*n), LockService::new(member(*n), config.clone())))
            .collect();
        Self {
            nodes,
            notices: BTreeMap::new(),
            now: Instant::ZERO,
            cut: std::collections::BTreeSet::new(),
        }
    }

    fn node(&mut self, n: u8) -> &mut LockService {
        self.nodes.get_mut(&member(n)).unwrap()
    }

    /// Installs a view at every live member in it, then delivers until quiet.
    fn install(&mut self, epoch: u64, members: &[u8], origin: ViewOrigin) {
        let view = View::new(epoch, members.iter().map(|n| member(*n)).collect()).unwrap();
        for n in members {
            let origin = if member(*n) == *view.coordinator() {
                origin
            } else {
                ViewOrigin::Received
            };
            if let Some(node) = self.nodes.get_mut(&member(*n)) {
                node.handle_view(self.now, &view, origin);
            }
        }
        self.deliver();
    }

    /// Delivers every message until none is left (dead members' messages are dropped).
    fn deliver(&mut self) {
        for _ in 0..10_000 {
            let mut moved = false;
            let ids: Vec<MemberId> = self.nodes.keys().cloned().collect();
            for from in &ids {
                while let Some((to, message)) = self.nodes.get_mut(from).unwrap().poll_transmit() {
                    moved = true;
                    if self.cut.contains(&(from.clone(), to.clone())) {
                        continue;
                    }
                    if let Some(node) = self.nodes.get_mut(&to) {
                        node.handle_message(self.now, from, message);
                    }
                }
                let node = self.nodes.get_mut(from).unwrap();
                let notices: Vec<LockNotice> = std::iter::from_fn(|| node.poll_notice()).collect();
                self.notices
                    .entry(from.clone())
                    .or_default()
                    .extend(notices);
            }
            if !moved {
                return;
            }
        }
        panic!("messages never settled");
    }

    /// Advances time in heartbeat rounds of 50 ms; the live members heard each other in each
    /// (heartbeats, with their lease probes and echoes), unless the link is cut.
    fn advance(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            let step = Duration::from_millis(50).min(end - self.now);
            self.now += step;
            self.heartbeats();
            let now = self.now;
            for node in self.nodes.values_mut() {
                node.handle_timeout(now);
            }
            self.deliver();
        }
    }

    /// One heartbeat from every live member to every other, over the links not cut.
    fn heartbeats(&mut self) {
        let now = self.now;
        let live: Vec<MemberId> = self.nodes.keys().cloned().collect();
        for from in &live {
            for to in &live {
                if from == to || self.cut.contains(&(from.clone(), to.clone())) {
                    continue;
                }
                let beat = self.nodes.get_mut(from).unwrap().lease_beat(now, to);
                let node = self.nodes.get_mut(to).unwrap();
                node.note_alive(now, from);
                if let Some(beat) = beat {
                    node.handle_lease_beat(now, from, beat);
                }
            }
        }
    }

    /// Advances until a new `Majority` grantor may grant: a new process's wait before it
    /// supports anyone, the old promises, then the grace period.
    fn settle(&mut self) {
        let c = self.nodes.values().next().unwrap().config().clone();
        let wait = c.support_lease * 2 + c.lease + c.lease_margin + Duration::from_millis(300);
        self.advance(wait);
    }

    fn kill(&mut self, n: u8) {
        self.nodes.remove(&member(n));
    }

    fn take_notices(&mut self, n: u8) -> Vec<LockNotice> {
        self.notices.remove(&member(n)).unwrap_or_default()
    }

    fn lock(&mut self, n: u8, owner: u64, name: &str, mode: LockMode, wait: bool) -> RequestId {
        let now = self.now;
        let request = LockRequest {
            owner,
            name: lock_name(name),
            mode,
            wait,
            timeout: None,
        };
        let id = self.node(n).lock(now, request);
        self.deliver();
        id
    }

    fn granted(&mut self, n: u8, request: RequestId) -> Option<FencingToken> {
        self.notices.get(&member(n))?.iter().find_map(|x| match x {
            LockNotice::Granted {
                request: r, token, ..
            } if *r == request => Some(*token),
            _ => None,
        })
    }

    fn unlock(&mut self, n: u8, request: RequestId) {
        let now = self.now;
        self.node(n).unlock(now, request).unwrap();
        self.deliver();
    }
}

#[test]
fn lock_try_lock_fifo_and_release() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let a = c.lock(2, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(2, a).is_some());
    let t = c.lock(3, 1, "x", LockMode::Exclusive, false);
    assert!(c.take_notices(3).iter().any(|n| matches!(n, LockNotice::Refused { request, reason: Refusal::WouldBlock, .. } if *request == t)));
    let w1 = c.lock(3, 2, "x", LockMode::Exclusive, true);
    let w2 = c.lock(1, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(3, w1).is_none());
    c.unlock(2, a);
    assert!(c
        .take_notices(2)
        .contains(&LockNotice::Released { request: a }));
    let t1 = c.granted(3, w1).expect("first waiter granted first");
    assert!(c.granted(1, w2).is_none());
    c.unlock(3, w1);
    let t2 = c.granted(1, w2).expect("second waiter granted next");
    assert!(t2 > t1);
}

#[test]
fn a_queued_writer_holds_back_later_readers() {
    let mut c = Cluster::new(&[1, 2], LockConfig::local());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let r1 = c.lock(1, 1, "x", LockMode::Shared, true);
    let r2 = c.lock(2, 1, "x", LockMode::Shared, true);
    assert!(
        c.granted(1, r1).is_some() && c.granted(2, r2).is_some(),
        "readers share"
    );
    let w = c.lock(2, 2, "x", LockMode::Exclusive, true);
    let r3 = c.lock(1, 2, "x", LockMode::Shared, true);
    assert!(c.granted(2, w).is_none());
    assert!(
        c.granted(1, r3).is_none(),
        "a reader may not overtake a queued writer"
    );
    c.unlock(1, r1);
    c.unlock(2, r2);
    assert!(c.granted(2, w).is_some());
    c.unlock(2, w);
    assert!(c.granted(1, r3).is_some());
}

#[test]
fn cancelling_a_waiter_withdraws_it_and_a_timeout_refuses() {
    let mut c = Cluster::new(&[1, 2], LockConfig::local());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let held = c.lock(1, 1, "x", LockMode::Exclusive, true);
    let w = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let now = c.now;
    c.node(2).cancel(now, w);
    c.deliver();
    let timed = {
        let request = LockRequest {
            timeout: Some(Duration::from_millis(100)),
            ..LockRequest::exclusive(2, lock_name("x"))
        };
        let now = c.now;
        let id = c.node(2).lock(now, request);
        c.deliver();
        id
    };
    c.advance(Duration::from_millis(150));
    assert!(c.take_notices(2).iter().any(|n| matches!(n, LockNotice::Refused { request, reason: Refusal::Timeout, .. } if *request == timed)));
    c.unlock(1, held);
    assert!(
        c.granted(2, w).is_none(),
        "a cancelled waiter is never granted"
    );
    assert!(
        c.node(1).grantor_holds().is_empty(),
        "nothing stays held or queued"
    );
    assert!(c.node(2).pending_requests().is_empty());
}

#[test]
fn a_cancel_that_races_the_grant_releases_the_lock() {
    let mut c = Cluster::new(&[1, 2], LockConfig::local());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let now = c.now;
    let w = c
        .node(2)
        .lock(now, LockRequest::exclusive(1, lock_name("x")));
    // The grant is on its way (delivered to the grantor, answer not yet read) when the caller
    // gives up.
    let (to, message) = c.node(2).poll_transmit().unwrap();
    c.nodes
        .get_mut(&to)
        .unwrap()
        .handle_message(now, &member(2), message);
    c.node(2).cancel(now, w);
    c.deliver();
    assert!(c.granted(2, w).is_none());
    assert!(
        c.node(1).grantor_holds().is_empty(),
        "the grantor released the raced grant"
    );
    assert!(c.node(2).holds(now).is_empty());
}

#[test]
fn a_new_grantor_rebuilds_the_table_and_serves_the_dead_grantors_waiters() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let b = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let dead = c.lock(1, 1, "y", LockMode::Exclusive, true);
    let w = c.lock(3, 1, "x", LockMode::Exclusive, true);
    let tb = c.granted(2, b).unwrap();
    assert!(c.granted(1, dead).is_some());
    c.kill(1);
    c.install(2, &[2, 3], ViewOrigin::TookOver);
    assert!(c.node(2).is_serving());
    let holds = c.node(2).grantor_holds();
    assert_eq!(
        holds.len(),
        1,
        "the survivor's lock is kept, the dead grantor's is gone: {holds:?}"
    );
    let y = c.lock(3, 2, "y", LockMode::Exclusive, false);
    assert!(c.granted(3, y).is_some(), "the dead member's lock is free");
    c.unlock(2, b);
    let tw = c
        .granted(3, w)
        .expect("the waiter reported in reconciliation is served");
    assert!(tw > tb, "tokens increase across grantors: {tw} after {tb}");
}

#[test]
fn a_release_sent_to_a_dying_grantor_is_not_lost() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let b = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let w = c.lock(3, 1, "x", LockMode::Exclusive, true);
    c.kill(1);
    c.unlock(2, b); // goes to the dead grantor (JGRP-2234)
    assert_eq!(c.node(2).pending_releases(), 1);
    c.install(2, &[2, 3], ViewOrigin::TookOver);
    assert!(
        c.granted(3, w).is_some(),
        "the release reached the new grantor"
    );
    assert_eq!(c.node(2).pending_releases(), 0);
}

#[test]
fn requests_during_reconciliation_wait_and_then_succeed() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.kill(1);
    let view = View::new(2, vec![member(2), member(3)]).unwrap();
    let now = c.now;
    c.node(2).handle_view(now, &view, ViewOrigin::TookOver);
    assert!(c.node(2).is_reconciling());
    // Member 3 has not installed the view yet: its report is missing, the grantor waits.
    let r = c
        .node(2)
        .lock(now, LockRequest::exclusive(1, lock_name("x")));
    let mut out = Vec::new();
    while let Some(m) = c.node(2).poll_transmit() {
        out.push(m);
    }
    assert!(
        c.node(2).holds(now).is_empty(),
        "no grant while reconciling"
    );
    c.node(3).handle_view(now, &view, ViewOrigin::Received);
    for (to, message) in out {
        c.nodes
            .get_mut(&to)
            .unwrap()
            .handle_message(now, &member(2), message);
    }
    c.deliver();
    assert!(c.granted(2, r).is_some());
}

#[test]
fn duplicate_holders_after_a_merge_keep_the_highest_token_and_tell_the_other() {
    let mut c = Cluster::new(&[1, 2], LockConfig::local());
    // Two partitions, each its own grantor.
    c.install(3, &[1], ViewOrigin::Founded);
    c.install(5, &[2], ViewOrigin::Founded);
    let a = c.lock(1, 1, "x", LockMode::Exclusive, true);
    let b = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let (ta, tb) = (c.granted(1, a).unwrap(), c.granted(2, b).unwrap());
    assert!(tb > ta);
    c.install(6, &[1, 2], ViewOrigin::Merged);
    let lost = c.take_notices(1);
    assert!(lost.iter().any(|n| matches!(n, LockNotice::Lost { request, reason: LockLostReason::Duplicate, .. } if *request == a)), "{lost:?}");
    let now = c.now;
    assert!(c.node(1).holds(now).is_empty());
    assert_eq!(
        c.node(2).holds(now).len(),
        1,
        "the holder with the highest token keeps it"
    );
    assert_eq!(c.node(1).grantor_holds().len(), 1);
}

fn majority(cluster_size: usize) -> LockConfig {
    LockConfig {
        policy: PartitionPolicy::Majority { cluster_size },
        ..LockConfig::local()
    }
}

#[test]
fn majority_a_minority_loses_its_locks_and_grants_nothing() {
    let mut c = Cluster::new(&[1, 2, 3], majority(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.settle();
    let a = c.lock(3, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(3, a).is_some());
    c.install(2, &[3], ViewOrigin::TookOver);
    assert!(c.take_notices(3).iter().any(|n| matches!(
        n,
        LockNotice::Lost {
            reason: LockLostReason::Minority,
            ..
        }
    )));
    let t = c.lock(3, 2, "y", LockMode::Exclusive, false);
    assert!(c.granted(3, t).is_none(), "a minority grants nothing");
}

#[test]
fn majority_a_holder_that_stops_hearing_its_grantor_is_suspended_then_lost() {
    let mut c = Cluster::new(&[1, 2, 3], majority(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let config = c.node(1).config().clone();
    c.settle();
    let a = c.lock(2, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(2, a).is_some());
    // Everyone else goes silent for member 2.
    c.kill(1);
    c.kill(3);
    let start = c.now;
    c.advance(config.suspend_after + Duration::from_millis(1));
    let now = c.now;
    assert_eq!(c.node(2).status(now, a), Some(HoldStatus::Suspended));
    for _ in 0..20 {
        c.advance(config.lease_margin);
    }
    assert!(c.now > start + config.lease);
    assert!(c.take_notices(2).iter().any(|n| matches!(
        n,
        LockNotice::Lost {
            reason: LockLostReason::LeaseExpired,
            ..
        }
    )));
    let now = c.now;
    assert_eq!(c.node(2).status(now, a), None);
}

#[test]
fn majority_a_new_grantor_waits_out_the_lease_before_granting() {
    let mut c = Cluster::new(&[1, 2, 3], majority(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let config = c.node(1).config().clone();
    c.settle();
    c.kill(1);
    c.install(2, &[2, 3], ViewOrigin::TookOver);
    let r = c.lock(3, 1, "x", LockMode::Exclusive, true);
    assert!(
        c.granted(3, r).is_none(),
        "the dead grantor's holders may still run their lease"
    );
    // Member 3's promise to the dead grantor binds it for the support lease; the new term
    // is supported only after that, and grants only a lease and margin later.
    c.advance(config.lease + config.lease_margin);
    assert!(
        c.granted(3, r).is_none(),
        "no grant before the old promises ran out and the grace passed"
    );
    c.advance(config.support_lease + Duration::from_millis(200));
    assert!(c.granted(3, r).is_some());
}

#[test]
fn unlock_all_releases_every_lock_and_request_of_one_owner() {
    let mut c = Cluster::new(&[1, 2], LockConfig::local());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let a = c.lock(2, 7, "a", LockMode::Exclusive, true);
    let b = c.lock(2, 7, "b", LockMode::Shared, true);
    let other = c.lock(2, 8, "c", LockMode::Exclusive, true);
    let blocker = c.lock(1, 1, "d", LockMode::Exclusive, true);
    let waiting = c.lock(2, 7, "d", LockMode::Exclusive, true);
    assert!(
        c.granted(2, a).is_some() && c.granted(2, b).is_some() && c.granted(1, blocker).is_some()
    );
    let now = c.now;
    assert_eq!(c.node(2).unlock_all(now, 7), 2);
    c.deliver();
    let holds: Vec<RequestId> = c.node(2).holds(now).iter().map(|h| h.request).collect();
    assert_eq!(holds, vec![other], "only the other owner's lock remains");
    c.unlock(1, blocker);
    assert!(
        c.granted(2, waiting).is_none(),
        "the owner's pending request was withdrawn"
    );
    assert_eq!(c.node(1).grantor_holds().len(), 1);
}

#[test]
fn cancelling_a_request_whose_grant_already_arrived_releases_it() {
    let mut c = Cluster::new(&[1, 2], LockConfig::local());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let r = c.lock(2, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(2, r).is_some());
    let now = c.now;
    c.node(2).cancel(now, r);
    c.deliver();
    assert!(c.node(2).holds(now).is_empty());
    assert!(
        c.node(1).grantor_holds().is_empty(),
        "the grantor released it"
    );
}
