//! A graceful leave of the coordinator (the grantor) at the endpoint, on a lossless network of
//! three members whose links can hold datagrams back: the successor serves at once from the
//! leaver's table (`Available`) and never waits out its reconciliation timeout for a member
//! whose report request overtook the view (both policies), and the leaver grants nothing after
//! it left. The simulator's `graceful_grantor_leaves_never_stall` band runs leaves of the
//! grantor in whole clusters.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use conclave_lock_api::{FencingToken, LockName, MemberId, RequestId};
use conclave_protocol::locking::{LockNotice, LockRequest, PartitionPolicy};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, EndpointEvent, Instant};

/// A few endpoints on a network that delivers everything at once, in order, except on links
/// held back (their datagrams wait, in order, until released).
struct Cluster {
    nodes: Vec<Endpoint>,
    now: Instant,
    notices: Vec<Vec<LockNotice>>,
    /// Directed links (from, to) whose datagrams wait.
    held_links: BTreeSet<(usize, usize)>,
    held: Vec<(usize, usize, Vec<u8>)>,
}

impl Cluster {
    /// Three members in one view, member 0 its coordinator and member 1 next in line.
    fn new(policy: PartitionPolicy) -> Self {
        let mut config = EndpointConfig::local();
        config.locks.policy = policy;
        let nodes = (0..3u8)
            .map(|i| {
                let me = MemberId::new(
                    u128::from(i + 1) << 100,
                    &format!("m{i}"),
                    ([127, 0, 0, 1], 7200 + u16::from(i)).into(),
                )
                .expect("valid member");
                Endpoint::new("leave", me, config.clone(), 1400)
            })
            .collect();
        let mut cluster = Self {
            nodes,
            now: Instant::ZERO,
            notices: vec![Vec::new(); 3],
            held_links: BTreeSet::new(),
            held: Vec::new(),
        };
        // One after the other: the first founds, the others join it in order.
        for i in 0..3 {
            let now = cluster.now;
            cluster.nodes[i].join(now);
            let joined = cluster.run_until(Duration::from_secs(5), |c| {
                c.nodes[i].view().is_some_and(|v| v.len() == i + 1)
            });
            assert!(joined, "member {i} joins");
        }
        let first = cluster.nodes[0].local().clone();
        let formed = cluster.run_until(Duration::from_secs(5), |c| {
            c.nodes.iter().all(|e| {
                e.view()
                    .is_some_and(|v| v.len() == 3 && v.coordinator() == &first)
            })
        });
        assert!(formed, "the members agree on one view");
        cluster
    }

    /// Delivers every datagram (but those of held links) and event until nothing moves.
    fn settle(&mut self) {
        let mut queue = VecDeque::new();
        loop {
            for (from, node) in self.nodes.iter_mut().enumerate() {
                while let Some(transmit) = node.poll_transmit() {
                    queue.push_back((from, transmit));
                }
                while let Some(event) = node.poll_event() {
                    if let EndpointEvent::Lock(notice) = event {
                        self.notices[from].push(notice);
                    }
                }
            }
            if queue.is_empty() {
                return;
            }
            while let Some((from, transmit)) = queue.pop_front() {
                for to in 0..self.nodes.len() {
                    let addressed = match transmit.destination {
                        Destination::Member(addr) => self.nodes[to].local().addr() == addr,
                        Destination::Discovery => to != from,
                    };
                    if !addressed {
                        continue;
                    }
                    if self.held_links.contains(&(from, to)) {
                        self.held.push((from, to, transmit.bytes.clone()));
                    } else {
                        let now = self.now;
                        self.nodes[to].handle_datagram(now, &transmit.bytes);
                    }
                }
            }
        }
    }

    fn hold(&mut self, from: usize, to: usize) {
        self.held_links.insert((from, to));
    }

    /// Delivers what the link held back, in order, and opens it.
    fn release(&mut self, from: usize, to: usize) {
        self.held_links.remove(&(from, to));
        let now = self.now;
        for (f, t, bytes) in std::mem::take(&mut self.held) {
            if (f, t) == (from, to) {
                self.nodes[to].handle_datagram(now, &bytes);
            } else {
                self.held.push((f, t, bytes));
            }
        }
        self.settle();
    }

    /// Advances time in 1 ms steps (running every due timer) until `done` or `limit`.
    fn run_until(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            self.settle();
            if done(self) {
                return true;
            }
            if self.now >= end {
                return false;
            }
            self.now += Duration::from_millis(1);
            let now = self.now;
            for node in &mut self.nodes {
                if node.poll_timeout().is_some_and(|t| t <= now) {
                    node.handle_timeout(now);
                }
            }
        }
    }

    fn lock(&mut self, node: usize, name: &str) -> RequestId {
        let request = LockRequest::exclusive(1, LockName::new(name).expect("valid lock name"));
        let now = self.now;
        let id = self.nodes[node].lock(now, request);
        self.settle();
        id
    }

    fn token(&self, node: usize, request: RequestId) -> Option<FencingToken> {
        self.notices[node].iter().find_map(|n| match n {
            LockNotice::Granted {
                request: r, token, ..
            } if *r == request => Some(*token),
            _ => None,
        })
    }

    fn granted(&self, node: usize, request: RequestId) -> bool {
        self.token(node, request).is_some()
    }

    fn leave(&mut self, node: usize) {
        let now = self.now;
        self.nodes[node].leave(now);
        self.settle();
    }

    /// Whether `node` installed a view without member 0.
    fn moved_on(&self, node: usize) -> bool {
        let leaver = self.nodes[0].local();
        self.nodes[node]
            .view()
            .is_some_and(|v| !v.contains(leaver) && v.len() == 2)
    }
}

const MAJORITY: PartitionPolicy = PartitionPolicy::Majority { cluster_size: 3 };

/// A bound well below the reconciliation timeout (400 ms in `EndpointConfig::local`).
const PROMPTLY: Duration = Duration::from_millis(50);

#[test]
fn the_successor_of_a_leaving_grantor_serves_its_table_at_once() {
    let mut c = Cluster::new(PartitionPolicy::Available);
    let held = c.lock(2, "a");
    assert!(c.run_until(Duration::from_secs(1), |c| c.granted(2, held)));
    let held_token = c.token(2, held).expect("granted");
    // Member 2 cannot answer member 1 for now: its report would not arrive.
    c.hold(2, 1);
    c.leave(0);
    assert!(c.moved_on(1) && c.moved_on(2), "the view was handed over");
    // Member 1 grants a free lock at once, without waiting for member 2's report...
    let free = c.lock(1, "b");
    assert!(
        c.run_until(PROMPTLY, |c| c.granted(1, free)),
        "the successor waited for a report: {:?}",
        c.nodes[1].stats().grantor
    );
    // ... and knows from the leaver's table that member 2 holds "a".
    let wanted = c.lock(1, "a");
    c.run_until(PROMPTLY, |_| false);
    assert!(!c.granted(1, wanted), "\"a\" is held by member 2");
    let grantor = c.nodes[1].stats().grantor;
    assert_eq!((grantor.leave_handoffs, grantor.reconcile_timeouts), (1, 0));
    // Once member 2 is heard again and releases "a", member 1 has it, above member 2's token.
    c.release(2, 1);
    let now = c.now;
    c.nodes[2].unlock(now, held).expect("held");
    assert!(c.run_until(Duration::from_secs(1), |c| c.granted(1, wanted)));
    assert!(c.token(1, wanted).expect("granted") > held_token);
    assert_eq!(c.nodes[1].stats().grantor.reconcile_timeouts, 0);
}

/// The view reaches member 2 from the leaver, member 1's report request on another stream:
/// the request comes first.
fn report_request_overtakes_the_view(policy: PartitionPolicy) {
    let mut c = Cluster::new(policy);
    let warm = c.lock(2, "a");
    assert!(c.run_until(Duration::from_secs(5), |c| c.granted(2, warm)));
    c.hold(0, 2);
    c.leave(0);
    assert!(c.moved_on(1) && !c.moved_on(2));
    c.release(0, 2);
    assert!(c.moved_on(2));
    let reconciled = c.run_until(PROMPTLY, |c| {
        !c.nodes[1].locks().is_reconciling() && c.nodes[1].view().is_some()
    });
    let grantor = c.nodes[1].stats().grantor;
    assert!(reconciled, "still reconciling: {grantor:?}");
    assert_eq!(grantor.reconcile_timeouts, 0, "{grantor:?}");
    // Member 2's hold is in the new grantor's table.
    assert_eq!(c.nodes[1].locks().grantor_holds().len(), 1);
}

#[test]
fn a_report_request_that_overtakes_the_handover_view_is_answered_available() {
    report_request_overtakes_the_view(PartitionPolicy::Available);
}

#[test]
fn a_report_request_that_overtakes_the_handover_view_is_answered_majority() {
    report_request_overtakes_the_view(MAJORITY);
}

#[test]
fn a_grantor_that_left_grants_nothing() {
    let mut c = Cluster::new(PartitionPolicy::Available);
    let grants_before = c.nodes[0].stats().grantor.grants;
    // Member 2 does not hear of the leave yet: it asks the leaver, its grantor, for "c".
    c.hold(0, 2);
    c.leave(0);
    let asked_leaver = c.lock(2, "c");
    c.run_until(PROMPTLY, |_| false);
    // Member 1, the new grantor, grants "c" to itself: it never heard of member 2's request.
    let successor = c.lock(1, "c");
    assert!(c.run_until(PROMPTLY, |c| c.granted(1, successor)));
    c.release(0, 2);
    c.run_until(PROMPTLY, |_| false);
    // (A grant it made would reach member 2 after the view, on the same stream, and be given
    // back; it makes none.)
    assert!(!c.granted(2, asked_leaver), "two holders of \"c\"");
    assert_eq!(
        c.nodes[0].stats().grantor.grants,
        grants_before,
        "the leaver granted after it left"
    );
    // Member 2's request went to member 1 with the view: it waits there.
    let now = c.now;
    c.nodes[1].unlock(now, successor).expect("held");
    assert!(c.run_until(Duration::from_secs(1), |c| c.granted(2, asked_leaver)));
}
