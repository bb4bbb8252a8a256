//! Unit tests of the locking layer over a perfect network, one scenario per rule.

use std::collections::BTreeMap;
use std::time::Duration;

use conclave_lock_api::wire::LeaseBeat;
use conclave_lock_api::{FencingToken, LockLostReason, LockMode, LockName, OwnerId};

use super::*;
use crate::gms::ViewOrigin;
use crate::test_support::member;

fn lock_name(s: &str) -> LockName {
    LockName::new(s).unwrap()
}

struct Cluster {
    nodes: BTreeMap<MemberId, LockMachine>,
    notices: BTreeMap<MemberId, Vec<LockNotice>>,
    now: Instant,
    /// Directed links that drop everything (heartbeats and messages).
    cut: std::collections::BTreeSet<(MemberId, MemberId)>,
    /// Directed links whose messages (not heartbeats) are held back until released.
    slow: std::collections::BTreeSet<(MemberId, MemberId)>,
    held_back: Vec<(MemberId, MemberId, LockMessage)>,
    /// Stalled members: they run nothing; what reaches them waits in their buffer.
    stalled: BTreeMap<MemberId, Vec<(MemberId, Input)>>,
    /// Members that play a build older than the one-hop handoff: their requests do not say
    /// they take handoffs, and what they cannot decode (a designation, a passed grant) is
    /// dropped on its way to them.
    older: std::collections::BTreeSet<MemberId>,
}

/// What a stalled member finds in its buffer when it wakes.
enum Input {
    Beat(LeaseBeat),
    Message(LockMessage),
}

impl Cluster {
    fn new(members: &[u8], config: LockConfig) -> Self {
        let nodes = members
            .iter()
            .map(|n| (member(*n), LockMachine::new(member(*n), config.clone())))
            .collect();
        Self {
            nodes,
            notices: BTreeMap::new(),
            now: Instant::ZERO,
            cut: std::collections::BTreeSet::new(),
            slow: std::collections::BTreeSet::new(),
            held_back: Vec::new(),
            stalled: BTreeMap::new(),
            older: std::collections::BTreeSet::new(),
        }
    }

    fn node(&mut self, n: u8) -> &mut LockMachine {
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
                if self.stalled.contains_key(from) {
                    continue;
                }
                while let Some((to, mut message)) =
                    self.nodes.get_mut(from).unwrap().poll_transmit()
                {
                    moved = true;
                    if self.older.contains(from) {
                        if let LockMessage::Lock { passes, .. } = &mut message {
                            *passes = false;
                        }
                    }
                    if self.older.contains(&to)
                        && matches!(
                            message,
                            LockMessage::Designate { .. } | LockMessage::Passed { .. }
                        )
                    {
                        continue;
                    }
                    let link = (from.clone(), to.clone());
                    if self.cut.contains(&link) {
                        continue;
                    }
                    if self.slow.contains(&link) {
                        self.held_back.push((from.clone(), to, message));
                        continue;
                    }
                    if let Some(buffer) = self.stalled.get_mut(&to) {
                        buffer.push((from.clone(), Input::Message(message)));
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
            for (id, node) in &mut self.nodes {
                if !self.stalled.contains_key(id) {
                    node.handle_timeout(now);
                }
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
                if from == to
                    || self.cut.contains(&(from.clone(), to.clone()))
                    || self.stalled.contains_key(from)
                {
                    continue;
                }
                let beat = self.nodes.get_mut(from).unwrap().lease_beat(now, to);
                if let (Some(buffer), Some(beat)) = (self.stalled.get_mut(to), beat) {
                    buffer.push((from.clone(), Input::Beat(beat)));
                    continue;
                }
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

    /// Cuts the link between `a` and `b` both ways.
    fn cut_both(&mut self, a: u8, b: u8) {
        self.cut.insert((member(a), member(b)));
        self.cut.insert((member(b), member(a)));
    }

    /// Holds back messages from `a` to `b` (heartbeats still pass) until `release_slow`.
    fn slow_link(&mut self, a: u8, b: u8) {
        self.slow.insert((member(a), member(b)));
    }

    /// Cuts the directed link `a → b`, or heals it if it is cut.
    fn toggle_cut(&mut self, a: u8, b: u8) {
        let link = (member(a), member(b));
        if !self.cut.remove(&link) {
            self.cut.insert(link);
        }
    }

    /// Holds back the messages of `a → b`, or delivers what was held back (late) and stops.
    fn toggle_slow(&mut self, a: u8, b: u8) {
        let link = (member(a), member(b));
        if self.slow.remove(&link) {
            self.release_held_back(&link);
        } else {
            self.slow.insert(link);
        }
    }

    /// Delivers every message held back, late.
    fn release_slow(&mut self) {
        self.slow.clear();
        for link in self
            .held_back
            .iter()
            .map(|(f, t, _)| (f.clone(), t.clone()))
            .collect::<Vec<_>>()
        {
            self.release_held_back(&link);
        }
        self.deliver();
    }

    /// Delivers the messages held back on one link, late and in order (to a stalled member's
    /// buffer if it is paused).
    fn release_held_back(&mut self, link: &(MemberId, MemberId)) {
        let now = self.now;
        let (due, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held_back)
            .into_iter()
            .partition(|(f, t, _)| (f, t) == (&link.0, &link.1));
        self.held_back = kept;
        for (from, to, message) in due {
            if let Some(buffer) = self.stalled.get_mut(&to) {
                buffer.push((from, Input::Message(message)));
            } else if let Some(node) = self.nodes.get_mut(&to) {
                node.handle_message(now, &from, message);
            }
        }
        self.deliver();
    }

    /// `n` stops running: a pause of the process (its clock goes on).
    fn stall(&mut self, n: u8) {
        self.stalled.insert(member(n), Vec::new());
    }

    /// `n` runs again and finds everything that arrived meanwhile, stamped with now.
    fn wake(&mut self, n: u8) {
        let now = self.now;
        let buffer = self.stalled.remove(&member(n)).unwrap_or_default();
        let node = self.nodes.get_mut(&member(n)).unwrap();
        for (from, input) in buffer {
            match input {
                Input::Beat(beat) => node.handle_lease_beat(now, &from, beat),
                Input::Message(message) => node.handle_message(now, &from, message),
            }
        }
        node.handle_timeout(now);
        self.deliver();
    }

    /// Mutual exclusion as the simulator checks it: no two owners believe (held or suspended)
    /// they hold one lock exclusively at once.
    fn assert_exclusive(&self, context: &str) {
        let mut believed: BTreeMap<LockName, Vec<(MemberId, HoldInfo)>> = BTreeMap::new();
        for (id, node) in &self.nodes {
            for hold in node.holds(self.now) {
                if hold.status != HoldStatus::Lost {
                    believed
                        .entry(hold.name.clone())
                        .or_default()
                        .push((id.clone(), hold));
                }
            }
        }
        for (name, holders) in believed {
            assert!(
                holders.len() <= 1 || holders.iter().all(|(_, h)| h.mode == LockMode::Shared),
                "{context}: {name} held by {holders:?} at {:?}",
                self.now
            );
        }
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
            lease: None,
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
fn a_quiet_request_waits_in_the_queue_without_a_queued_message() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let a = c.lock(2, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(2, a).is_some());
    // What the grantor says to member 3 is held back, to be read.
    c.slow_link(1, 3);
    let now = c.now;
    let quiet = c
        .node(3)
        .lock_quiet(now, LockRequest::exclusive(1, lock_name("x")));
    let told = c
        .node(3)
        .lock(now, LockRequest::exclusive(2, lock_name("x")));
    c.deliver();
    let queued: Vec<RequestId> = c
        .held_back
        .iter()
        .filter_map(|(_, _, m)| match m {
            LockMessage::Queued { request, .. } => Some(*request),
            _ => None,
        })
        .collect();
    assert_eq!(queued, [told], "only the request that wants it is told");
    c.release_slow();
    let notices = c.take_notices(3);
    let queued_notices: Vec<RequestId> = notices
        .iter()
        .filter_map(|n| match n {
            LockNotice::Queued { request, .. } => Some(*request),
            _ => None,
        })
        .collect();
    assert_eq!(queued_notices, [told]);
    // The quiet request still waits its turn, first in the queue.
    c.unlock(2, a);
    let t1 = c
        .granted(3, quiet)
        .expect("the quiet request is granted first");
    assert!(c.granted(3, told).is_none());
    c.unlock(3, quiet);
    let t2 = c.granted(3, told).expect("then the other one");
    assert!(t2 > t1);
}

/// What the grantor sent member `to` and still holds back on a slow link, in order.
fn held_back_to(c: &Cluster, to: u8) -> Vec<LockMessage> {
    c.held_back
        .iter()
        .filter(|(_, t, _)| *t == member(to))
        .map(|(_, _, m)| m.clone())
        .collect()
}

#[test]
fn a_dropped_holds_release_is_acknowledged_with_the_next_message_or_after_the_delay() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let a = c.lock(2, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(2, a).is_some());
    let w = c.lock(3, 1, "x", LockMode::Exclusive, true);
    // What the grantor says to member 2 is held back, to be read.
    c.slow_link(1, 2);
    let now = c.now;
    c.node(2).cancel(now, a); // the guard dropped: a lazy release
    c.deliver();
    assert!(c.granted(3, w).is_some(), "the release took effect at once");
    assert!(
        held_back_to(&c, 2).is_empty(),
        "no datagram of its own for the acknowledgement"
    );
    assert_eq!(c.node(1).grantor_stats().lazy_acks, 1);

    // Member 2 asks again and is queued: the acknowledgement goes with the `Queued`.
    let b = c.lock(2, 2, "x", LockMode::Exclusive, true);
    assert!(matches!(
        held_back_to(&c, 2)[..],
        [LockMessage::Queued { request: q, .. }, LockMessage::UnlockAck { request: r }]
            if q == b && r == a
    ));

    // Nothing else for member 2: the acknowledgement of a second dropped hold (the front end's
    // `unlock_lazy` this time) leaves on its own once due.
    c.release_slow();
    c.unlock(3, w);
    assert!(c.granted(2, b).is_some());
    c.slow_link(1, 2);
    let now = c.now;
    c.node(2).unlock_lazy(now, b).expect("held");
    c.deliver();
    assert!(held_back_to(&c, 2).is_empty());
    let due = c
        .node(1)
        .poll_timeout()
        .expect("the grantor has a deadline");
    assert!(due <= now + LAZY_ACK_DELAY, "due within the delay");
    c.advance(LAZY_ACK_DELAY);
    assert!(matches!(
        held_back_to(&c, 2)[..],
        [LockMessage::UnlockAck { request: r }] if r == b
    ));
    c.release_slow();
    let released: Vec<RequestId> = c
        .take_notices(2)
        .iter()
        .filter_map(|n| match n {
            LockNotice::Released { request } => Some(*request),
            _ => None,
        })
        .collect();
    assert_eq!(released, [a, b]);
    assert_eq!(c.node(2).client.pending_releases(), 0);
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

/// Finding 1 of the safety review: a holder whose report reaches a new grantor late (its
/// messages are lost for a while, heartbeats pass) must have lost its lease before the new
/// grantor grants the lock to someone else; the late report then finds a newer holder and is
/// told it lost.
#[test]
fn majority_a_late_report_never_makes_two_holders() {
    let mut c = Cluster::new(&[1, 2, 3, 4, 5], majority(5));
    c.install(1, &[1, 2, 3, 4, 5], ViewOrigin::Founded);
    c.settle();
    let old = c.lock(3, 1, "x", LockMode::Exclusive, true);
    let old_token = c.granted(3, old).expect("granted");
    c.kill(1);
    // Everything member 3 sends to the new grantor (its report, renewals, releases) is late.
    c.slow_link(3, 2);
    c.install(2, &[2, 3, 4, 5], ViewOrigin::TookOver);
    let new = c.lock(2, 1, "x", LockMode::Exclusive, true);
    for _ in 0..100 {
        c.advance(Duration::from_millis(50));
        c.assert_exclusive("while the report is late");
    }
    let new_token = c
        .granted(2, new)
        .expect("the new grantor grants once the old lease is over");
    assert!(new_token > old_token, "{new_token} after {old_token}");
    assert!(c.take_notices(3).iter().any(|n| matches!(
        n,
        LockNotice::Lost { reason: LockLostReason::LeaseExpired, request, .. } if *request == old
    )));
    c.release_slow();
    c.advance(Duration::from_millis(200));
    c.assert_exclusive("after the late report");
    let table = c.node(2).grantor_holds();
    assert_eq!(
        table.len(),
        1,
        "only the new holder is in the table: {table:?}"
    );
    assert_eq!(table[0].1.member, member(2));
}

/// Findings 2 and 3: two members that cannot hear each other both coordinate, and the others
/// bounce between their views. At most one of them may grant at any time, tokens never go
/// back, and no grant stays in a table its owner does not believe in.
#[test]
fn majority_two_coordinators_with_members_bouncing_never_both_grant() {
    let mut c = Cluster::new(&[1, 2, 3, 4, 5], majority(5));
    c.install(1, &[1, 2, 3, 4, 5], ViewOrigin::Founded);
    c.settle();
    c.cut_both(1, 2);
    let mut epoch = 2;
    let mut tokens: Vec<FencingToken> = Vec::new();
    let mut requests = Vec::new();
    let mut owner = 10;
    for round in 0..12 {
        // The others follow 2, then 1, then 2 again...
        let coordinator = if round % 2 == 0 { 2 } else { 1 };
        let origin = if round < 2 {
            ViewOrigin::TookOver
        } else {
            ViewOrigin::Changed
        };
        c.install(epoch, &[coordinator, 3, 4, 5], origin);
        epoch += 1;
        for n in [3, 4, 5] {
            owner += 1;
            requests.push((n, c.lock(n, owner, "x", LockMode::Exclusive, true)));
        }
        // Short stays (the views change faster than a new term can serve) and long ones.
        let steps = if round % 3 == 2 { 50 } else { 14 };
        for _ in 0..steps {
            c.advance(Duration::from_millis(50));
            c.assert_exclusive("two coordinators");
            for (n, r) in &requests {
                let now = c.now;
                if c.node(*n).status(now, *r).is_some() {
                    let token = c.granted(*n, *r).unwrap();
                    if !tokens.contains(&token) {
                        tokens.push(token);
                    }
                    c.unlock(*n, *r);
                }
            }
        }
    }
    assert!(tokens.len() >= 2, "grants happened: {tokens:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens increase in grant order: {tokens:?}"
    );
    // Heal: one view again; every table entry is believed by its owner.
    c.cut.clear();
    c.install(epoch, &[1, 2, 3, 4, 5], ViewOrigin::Merged);
    c.settle();
    let now = c.now;
    for n in [3, 4, 5] {
        for r in c.node(n).pending_requests() {
            c.node(n).cancel(now, r);
        }
        for h in c.node(n).holds(now) {
            c.node(n).unlock(now, h.request).unwrap();
        }
    }
    c.deliver();
    c.advance(Duration::from_millis(500));
    assert!(
        c.node(1).grantor_holds().is_empty(),
        "no ghost hold: {:?}",
        c.node(1).grantor_holds()
    );
}

/// Finding 3: a grant from a member that is not (any more) this member's grantor is given
/// back to its sender at once, so it does not stay in that table for ever.
#[test]
fn a_grant_from_a_former_grantor_is_given_back() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let blocker = c.lock(1, 1, "x", LockMode::Exclusive, true);
    let waiting = c.lock(3, 1, "x", LockMode::Exclusive, true);
    assert!(c.granted(3, waiting).is_none());
    // Member 3 moves to member 2's view; member 1 has not heard and still grants to it.
    let view = View::new(2, vec![member(2), member(3)]).unwrap();
    let now = c.now;
    c.node(3).handle_view(now, &view, ViewOrigin::Received);
    while c.node(3).poll_transmit().is_some() {}
    c.unlock(1, blocker);
    assert!(
        c.granted(3, waiting).is_none(),
        "not accepted from a former grantor"
    );
    assert!(
        c.node(1).grantor_holds().is_empty(),
        "the former grantor's table does not keep the grant: {:?}",
        c.node(1).grantor_holds()
    );
}

/// Finding 5: a grantor that stalls (a pause of the process) for longer than the leases and
/// wakes up to buffered heartbeats must not count them as fresh support: members have moved
/// on to a new grantor, and the old one grants nothing.
#[test]
fn majority_a_grantor_that_wakes_from_a_stall_grants_nothing() {
    let mut c = Cluster::new(&[1, 2, 3], majority(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.settle();
    let held = c.lock(2, 1, "y", LockMode::Exclusive, true);
    assert!(c.granted(2, held).is_some());
    let grants_before = c.node(1).grantor_stats().grants;
    // A process pause, and (as its own view still holds everyone) a stale request in its
    // buffer when it wakes up.
    c.stall(1);
    // The others suspect it and carry on without it; member 3 asks for the lock there.
    c.install(2, &[2, 3], ViewOrigin::TookOver);
    let r = c.lock(3, 1, "x", LockMode::Exclusive, true);
    for _ in 0..80 {
        c.advance(Duration::from_millis(50));
        c.assert_exclusive("during the stall");
    }
    assert!(c.granted(3, r).is_some(), "the new grantor serves");
    // Member 3 also asked the stalled grantor, whose view it left long ago.
    let stale = LockMessage::Lock {
        request: RequestId(999),
        name: lock_name("z"),
        owner: OwnerId {
            member: member(3),
            local: 9,
        },
        mode: LockMode::Exclusive,
        wait: true,
        stamp: 0,
        lease_ms: None,
        quiet: false,
        passes: true,
    };
    c.stalled
        .get_mut(&member(1))
        .unwrap()
        .push((member(3), Input::Message(stale)));
    c.wake(1);
    for _ in 0..20 {
        c.advance(Duration::from_millis(50));
        c.assert_exclusive("after the stall");
    }
    assert_eq!(
        c.node(1).grantor_stats().grants,
        grants_before,
        "a grantor whose support ran out during a stall grants nothing"
    );
}

/// Bounded exhaustive exploration of fault schedules (a child module: it uses the harness).
mod explore;
mod explore_available;
mod leases;
mod tokens;
mod views;

// ---- adversarial review ----

impl Cluster {
    /// A fresh process (a new incarnation, as after a crash and restart) enters the harness.
    fn add(&mut self, n: u8, config: LockConfig) {
        self.nodes
            .insert(member(n), LockMachine::new(member(n), config));
    }

    /// Cuts every link between the two groups, both ways.
    fn split(&mut self, a: &[u8], b: &[u8]) {
        for x in a {
            for y in b {
                self.cut_both(*x, *y);
            }
        }
    }

    /// Every hold believed (held or suspended) now, with its member.
    fn believed(&self, name: &str) -> Vec<(MemberId, FencingToken)> {
        let mut out = Vec::new();
        for (id, node) in &self.nodes {
            for h in node.holds(self.now) {
                if h.status != HoldStatus::Lost && h.name == lock_name(name) {
                    out.push((id.clone(), h.token));
                }
            }
        }
        out
    }
}

/// Review finding A1 (amnesia regains a lapsed term without a new grace period).
///
/// Grantor 1 (term t1) loses its majority when members 3 and 5 move to member 2's view;
/// member 2 begins term t2 (supported by 2, 3, 5), waits its grace and grants `x` to
/// member 5. Member 3, the only member of both majorities, crashes; its new incarnation
/// (member 6) joins member 1's view (1's view stays majority-sized all along, so no new term
/// is begun) and, after its restart wait (support_lease × 9/8, far below `lease`), echoes
/// term t1. Member 1's term is supported again; its `quorum_at` is from long ago, so there is no
/// grace, and it grants `x` to member 4 while member 5's lease (confirmed by member 2 a moment
/// before member 3 crashed) still runs. Also a token regression: t1 < t2.
#[test]
fn review_a_lapsed_term_regained_through_a_restarted_member_grants_under_a_live_lease() {
    let config = majority(5);
    let mut c = Cluster::new(&[1, 2, 3, 4, 5], config.clone());
    c.install(1, &[1, 2, 3, 4, 5], ViewOrigin::Founded);
    c.settle();
    // Partition {1, 4} | {2, 5}; member 3 hears everyone but follows member 2.
    c.split(&[1, 4], &[2, 5]);
    c.install(2, &[2, 3, 5], ViewOrigin::TookOver);
    let r5 = c.lock(5, 1, "x", LockMode::Exclusive, true);
    c.settle();
    let t5 = c
        .granted(5, r5)
        .expect("member 2's term grants x to member 5");
    // Member 3 crashes; a new incarnation joins member 1's (still majority-sized) view.
    c.kill(3);
    c.add(6, config);
    c.split(&[6], &[2, 5]);
    c.install(3, &[1, 4, 6], ViewOrigin::Changed);
    let r4 = c.lock(4, 1, "x", LockMode::Exclusive, true);
    for _ in 0..40 {
        c.advance(Duration::from_millis(50));
        let holders = c.believed("x");
        if let Some(t4) = c.granted(4, r4) {
            assert!(
                holders.len() <= 1,
                "two owners believe they hold x at {:?}: {holders:?} (member 4's token {t4} \
                 after member 5's {t5})",
                c.now
            );
        }
    }
}

/// Simulator seeds 10586 and 11456 (gentle profile): a grant delayed past its lease is given
/// back and asked for again; the grantor had meanwhile answered a resend of the request with a
/// copy of the same grant and a fresh stamp. That copy must not be accepted: the give-back frees
/// the grant at the grantor, which then grants the lock to someone else.
#[test]
fn majority_a_copy_of_a_grant_given_back_is_not_accepted() {
    let mut c = Cluster::new(&[1, 2, 3], majority(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.settle();
    // The grantor's answers to member 2 are late.
    c.slow_link(1, 2);
    let r = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let config = c.node(1).config().clone();
    c.advance(config.lease + Duration::from_millis(100));
    // A view change makes member 2 resend its request; the grantor answers with the grant
    // again (fresh stamp), also late.
    c.install(2, &[1, 2, 3], ViewOrigin::Changed);
    let waiter = c.lock(3, 1, "x", LockMode::Exclusive, true);
    c.release_slow();
    for _ in 0..40 {
        c.advance(Duration::from_millis(50));
        c.assert_exclusive("after the late grants");
        let now = c.now;
        if c.node(2).status(now, r).is_some() {
            c.unlock(2, r);
        }
        if c.node(3).status(now, waiter).is_some() {
            c.unlock(3, waiter);
        }
    }
    assert!(c.granted(3, waiter).is_some(), "the waiter is served");
}

/// Runs `c` until `n`'s `request` is granted (a fresh cluster waits out the born wait, the
/// quorum and the grace period first); its token.
fn granted_within(c: &mut Cluster, n: u8, request: RequestId) -> FencingToken {
    for _ in 0..400 {
        if let Some(token) = c.granted(n, request) {
            return token;
        }
        c.advance(Duration::from_millis(25));
    }
    panic!("not granted within 10 s of cluster time");
}

/// The term each member promised last, as a driver would have written it to disk.
fn disk_terms(c: &mut Cluster, members: &[u8]) -> Vec<u64> {
    members
        .iter()
        .map(|n| c.node(*n).poll_durable_term().unwrap_or(0))
        .collect()
}

/// After the whole cluster restarts, fencing tokens keep increasing if the members restore
/// the terms they promised; without them, the new grantor's tokens start low again.
#[test]
fn majority_tokens_never_go_back_across_a_whole_cluster_restart() {
    let run = |restore: bool| {
        let mut c = Cluster::new(&[1, 2, 3], majority(3));
        c.install(1, &[1, 2, 3], ViewOrigin::Founded);
        let r = c.lock(2, 1, "x", LockMode::Exclusive, true);
        let before = granted_within(&mut c, 2, r);
        let disks = disk_terms(&mut c, &[1, 2, 3]);
        assert!(
            disks.iter().filter(|t| **t >= before.0 >> 32).count() >= 2,
            "a majority wrote the term: {disks:?}"
        );
        // Every process dies; new incarnations start on the same disks.
        let mut c = Cluster::new(&[4, 5, 6], majority(3));
        if restore {
            for (n, term) in [4, 5, 6].into_iter().zip(disks) {
                c.node(n).restore_term(term);
            }
        }
        c.install(1, &[4, 5, 6], ViewOrigin::Founded);
        let r = c.lock(5, 1, "x", LockMode::Exclusive, true);
        (before, granted_within(&mut c, 5, r))
    };
    let (before, after) = run(true);
    assert!(after > before, "{after:?} after {before:?}");
    let (before, forgetful) = run(false);
    assert!(
        forgetful <= before,
        "without the disks the tokens go back: {forgetful:?} after {before:?}"
    );
}

/// Node caching on at every member, a node grant asked on the first `lock()`.
fn caching() -> LockConfig {
    let mut config = LockConfig::local();
    config.node_cache.enabled = true;
    config.node_cache.after = 1;
    config
}

fn request(owner: u64, name: &str) -> LockRequest {
    LockRequest {
        owner,
        name: lock_name(name),
        mode: LockMode::Exclusive,
        wait: true,
        timeout: None,
        lease: None,
    }
}

/// Local owners that ask while their node grant is still on its way wait at the node behind
/// it: they do not queue at the grantor behind their own node grant, which would make the
/// grantor revoke it (and the member take the lock plainly, one round trip per handoff, for
/// the whole backoff).
#[test]
fn local_requests_wait_at_the_node_for_a_node_grant_on_its_way() {
    let mut c = Cluster::new(&[1, 2], caching());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let now = c.now;
    let first = c.node(2).lock(now, request(1, "hot"));
    let second = c.node(2).lock(now, request(2, "hot"));
    let third = c.node(2).lock(now, request(3, "hot"));
    c.deliver();
    assert!(c.granted(2, first).is_some());
    for (held, next) in [(first, second), (second, third)] {
        assert!(c.granted(2, next).is_none(), "one holder at a time");
        c.unlock(2, held);
        assert!(c.granted(2, next).is_some(), "the next local waiter");
    }
    let stats = c.node(2).cache_stats();
    assert_eq!((stats.hits, stats.revokes), (3, 0), "{stats:?}");
    c.assert_exclusive("local handoffs");
}

/// When a node grant's token block is used up while local owners wait, they keep waiting at
/// the node behind a new node grant, asked for at once: every local acquisition is still
/// served from a node grant, none from a plain grant of the grantor.
#[test]
fn local_waiters_stay_at_the_node_across_a_used_up_token_block() {
    let mut c = Cluster::new(&[1, 2], caching());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let mut held = c.lock(2, 1, "hot", LockMode::Exclusive, true);
    let mut last = c.granted(2, held).expect("granted");
    let rounds = conclave_lock_api::wire::NODE_GRANT_TOKENS + 10;
    for i in 0..rounds {
        let next = c.lock(2, 2 + i % 2, "hot", LockMode::Exclusive, true);
        assert!(c.granted(2, next).is_none(), "queued behind the holder");
        c.unlock(2, held);
        let token = c.granted(2, next).expect("the waiter is served");
        assert!(token > last, "tokens increase: {token:?} after {last:?}");
        c.take_notices(2);
        (held, last) = (next, token);
    }
    let stats = c.node(2).cache_stats();
    assert_eq!(
        stats.hits,
        rounds + 1,
        "every acquisition from a node grant: {stats:?}"
    );
    assert_eq!(
        (stats.node_grants_asked, stats.revokes),
        (2, 0),
        "{stats:?}"
    );
}

/// Seed 1200060 of the harsh node-cache band (issue 30, finding 3): a member cut off from the
/// others leads a view of its own and grants itself a lock there; then it is admitted back as
/// a joiner (a stale join request did it in the seed), the coordinator staying grantor. The
/// view that admits it is reconciled, so the grantor learns the hold, and another owner queues
/// behind it.
#[test]
fn a_member_back_from_a_partition_it_led_is_reconciled_with() {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    let kept = member_3_leads_a_view_of_its_own_and_locks(&mut c, &[1, 2]);
    c.install(3, &[1, 2, 3], ViewOrigin::Changed);
    assert_grantor_knows_and_member_2_queues(&mut c, kept);
}

/// The same, with the member's messages to the grantor slow and the view changing again (the
/// grantor staying) while they are on their way: a report overtaken by the next view is not
/// lost (found by review of an earlier fix attempt).
#[test]
fn a_report_overtaken_by_the_next_view_is_still_taken() {
    let mut c = Cluster::new(&[1, 2, 3, 4], LockConfig::local());
    c.install(1, &[1, 2, 3, 4], ViewOrigin::Founded);
    let kept = member_3_leads_a_view_of_its_own_and_locks(&mut c, &[1, 2, 4]);
    // Member 3's messages to the grantor are slow: its Holding, then its report.
    c.slow_link(3, 1);
    c.install(3, &[1, 2, 3, 4], ViewOrigin::Changed);
    // What member 3 sent so far arrives; its report is held back.
    c.release_held_back(&(member(3), member(1)));
    c.kill(4);
    c.install(4, &[1, 2, 3], ViewOrigin::Changed);
    c.release_slow();
    c.advance(Duration::from_millis(500));
    assert_grantor_knows_and_member_2_queues(&mut c, kept);
}

/// Cuts member 3 off from `others` (member 1 their coordinator, in the next view), lets it
/// take over a view of its own and grant itself lock `x`, then heals the cut. Returns the
/// request of member 3's hold.
fn member_3_leads_a_view_of_its_own_and_locks(c: &mut Cluster, others: &[u8]) -> RequestId {
    for n in others {
        c.cut_both(*n, 3);
    }
    c.install(2, others, ViewOrigin::Changed);
    c.install(2, &[3], ViewOrigin::TookOver);
    let kept = c.lock(3, 1, "x", LockMode::Exclusive, true);
    assert!(
        c.granted(3, kept).is_some(),
        "member 3 grants itself the lock"
    );
    c.cut.clear();
    kept
}

/// The grantor (member 1) has member 3's hold `kept` of `x` in its table, and member 2 asking
/// for `x` queues behind it.
fn assert_grantor_knows_and_member_2_queues(c: &mut Cluster, kept: RequestId) {
    let table = c.node(1).grantor_holds();
    assert!(
        table
            .iter()
            .any(|(_, owner, request, _)| owner.member == member(3) && *request == kept),
        "the grantor learned member 3's hold: {table:?}"
    );
    let other = c.lock(2, 1, "x", LockMode::Exclusive, true);
    c.advance(Duration::from_millis(500));
    assert!(c.granted(2, other).is_none(), "member 2 queues behind it");
    c.assert_exclusive("after member 3 is back");
}

/// One-hop handoff (review): request ids are per member, and a release names the successor it
/// passed the lock to by its request alone. A successor that withdraws (here: cancels) is
/// replaced by the next waiter; if that waiter's request has the same number, the holder's
/// release of the withdrawn designation must not complete a handoff to the new successor,
/// which was never told (it would wait for ever while the table says it holds).
#[test]
fn handoff_a_release_naming_a_withdrawn_successor_does_not_complete_another_with_its_number() {
    let config = LockConfig {
        one_hop_handoff: true,
        ..majority(4)
    };
    let mut c = Cluster::new(&[1, 2, 3, 4], config);
    c.install(1, &[1, 2, 3, 4], ViewOrigin::Founded);
    c.settle();
    let h = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let h_token = granted_within(&mut c, 2, h);
    // Member 3 waits and is designated to follow member 2 (member 2 is told).
    let s1 = c.lock(3, 1, "x", LockMode::Exclusive, true);
    // Member 4 waits with a request of the same number.
    let s2 = c.lock(4, 1, "x", LockMode::Exclusive, true);
    assert_eq!(s1, s2, "request ids are per member");
    assert_eq!(c.node(1).grantor_stats().designations, 1);
    // Member 2 hears nothing more from the grantor for a while; member 3 gives up: member 4
    // is designated instead (its designation is on its way to member 2).
    c.slow_link(1, 2);
    let now = c.now;
    c.node(3).cancel(now, s1);
    c.deliver();
    assert_eq!(c.node(1).grantor_stats().designations, 2);
    // Member 2 releases with the designation it has: the lock is passed to member 3, which
    // no longer waits for it.
    c.unlock(2, h);
    c.release_slow();
    c.advance(Duration::from_millis(200));
    let t = c.granted(4, s2).expect("member 4 is granted the lock");
    assert!(t > h_token);
    let now = c.now;
    let table: Vec<_> = c.node(1).grantor_holds();
    assert_eq!(table.len(), 1, "{table:?}");
    assert_eq!(c.node(4).holds(now).len(), 1);
    assert!(c.node(3).holds(now).is_empty());
}

/// One-hop handoff in a cluster with a member of an older build (whose requests do not say it
/// takes handoffs, and which drops the messages it adds): the grantor designates only between
/// members that said they take them, so the older member is granted by the grantor, as
/// before, whether it holds or waits.
#[test]
fn handoff_never_involves_a_member_that_did_not_say_it_takes_handoffs() {
    for (older, designated) in [(None, true), (Some(2), false), (Some(3), false)] {
        let config = LockConfig {
            one_hop_handoff: true,
            ..majority(3)
        };
        let mut c = Cluster::new(&[1, 2, 3], config);
        c.older.extend(older.map(member));
        c.install(1, &[1, 2, 3], ViewOrigin::Founded);
        c.settle();
        let h = c.lock(2, 1, "x", LockMode::Exclusive, true);
        let h_token = granted_within(&mut c, 2, h);
        let w = c.lock(3, 1, "x", LockMode::Exclusive, true);
        c.advance(Duration::from_millis(100));
        let stats = c.node(1).grantor_stats();
        assert_eq!(
            stats.designations > 0,
            designated,
            "older member {older:?}: {stats:?}"
        );
        c.unlock(2, h);
        c.advance(Duration::from_millis(200));
        let t = c.granted(3, w).expect("the waiter is granted the lock");
        assert!(t > h_token);
        c.assert_exclusive("after the handoff");
        assert_eq!(
            c.node(1).grantor_stats().passes > 0,
            designated,
            "older member {older:?}"
        );
    }
}
