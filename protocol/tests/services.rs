//! Named lock services at the endpoint, on a lossless network of a few members: the same
//! lock name in two services is two locks, each service's grantor moves on its own, destroy
//! releases at the grantor, and under `Majority` a service opened in a running cluster serves
//! after one reconciliation (it grants under the member's term: no grace period of its own).
//! The simulator's `service_seeds_run_clean` band runs services under every fault.

use std::collections::VecDeque;
use std::time::Duration;

use conclave_lock_api::{LockLostReason, LockName, MemberId, RequestId, ServiceName};
use conclave_protocol::locking::{LockNotice, LockRequest, PartitionPolicy, Refusal};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, EndpointEvent, Instant};

/// A few endpoints on a network that delivers everything at once, in order.
struct Cluster {
    nodes: Vec<Endpoint>,
    now: Instant,
    /// Lock notices per node, with the service they came from (`None`: the default one).
    notices: Vec<Vec<(Option<ServiceName>, LockNotice)>>,
}

impl Cluster {
    /// `n` members that have formed one view.
    fn new(n: u8, policy: PartitionPolicy) -> Self {
        let mut config = EndpointConfig::local();
        config.locks.policy = policy;
        let nodes = (0..n)
            .map(|i| {
                let me = MemberId::new(
                    u128::from(i + 1) << 100,
                    &format!("m{i}"),
                    ([127, 0, 0, 1], 7100 + u16::from(i)).into(),
                )
                .expect("valid member");
                Endpoint::new("services", me, config.clone(), 1400)
            })
            .collect();
        let mut cluster = Self {
            nodes,
            now: Instant::ZERO,
            notices: vec![Vec::new(); usize::from(n)],
        };
        for i in 0..cluster.nodes.len() {
            let now = cluster.now;
            cluster.nodes[i].join(now);
            cluster.settle();
        }
        let formed = cluster.run_until(Duration::from_secs(10), |c| {
            c.nodes
                .iter()
                .all(|e| e.view().is_some_and(|v| v.len() == usize::from(n)))
        });
        assert!(formed, "the members agree on one view");
        cluster
    }

    /// Delivers every datagram and event until nothing moves.
    fn settle(&mut self) {
        let mut queue = VecDeque::new();
        loop {
            for (from, node) in self.nodes.iter_mut().enumerate() {
                while let Some(transmit) = node.poll_transmit() {
                    queue.push_back((from, transmit));
                }
                while let Some(event) = node.poll_event() {
                    match event {
                        EndpointEvent::Lock(notice) => self.notices[from].push((None, notice)),
                        EndpointEvent::ServiceLock { service, notice } => {
                            self.notices[from].push((Some(service), notice));
                        }
                        _ => {}
                    }
                }
            }
            if queue.is_empty() {
                return;
            }
            while let Some((from, transmit)) = queue.pop_front() {
                let now = self.now;
                for (to, node) in self.nodes.iter_mut().enumerate() {
                    let addressed = match transmit.destination {
                        Destination::Member(addr) => node.local().addr() == addr,
                        Destination::Discovery => to != from,
                    };
                    if addressed {
                        node.handle_datagram(now, &transmit.bytes);
                    }
                }
            }
        }
    }

    /// Advances time in 1 ms steps (running every due timer) until `done` or `limit`.
    fn run_until(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let end = self.now + limit;
        while self.now < end {
            if done(self) {
                return true;
            }
            self.now += Duration::from_millis(1);
            let now = self.now;
            for node in &mut self.nodes {
                if node.poll_timeout().is_some_and(|t| t <= now) {
                    node.handle_timeout(now);
                }
            }
            self.settle();
        }
        done(self)
    }

    fn granted(&self, node: usize, request: RequestId) -> bool {
        self.notices[node]
            .iter()
            .any(|(_, n)| matches!(n, LockNotice::Granted { request: r, .. } if *r == request))
    }

    fn lock(&mut self, node: usize, service: Option<&ServiceName>, name: &str) -> RequestId {
        self.ask(node, service, name, true)
    }

    fn try_lock(&mut self, node: usize, service: Option<&ServiceName>, name: &str) -> RequestId {
        self.ask(node, service, name, false)
    }

    /// An exclusive request for `name` in `service` at `node`, waiting or not.
    fn ask(
        &mut self,
        node: usize,
        service: Option<&ServiceName>,
        name: &str,
        wait: bool,
    ) -> RequestId {
        let request = LockRequest {
            wait,
            ..LockRequest::exclusive(1, LockName::new(name).expect("valid lock name"))
        };
        let now = self.now;
        let id = match service {
            None => self.nodes[node].lock(now, request),
            Some(service) => self.nodes[node]
                .lock_in(now, service, request)
                .expect("the service opens"),
        };
        self.settle();
        id
    }

    fn refused(&self, node: usize, request: RequestId) -> Option<Refusal> {
        self.notices[node].iter().find_map(|(_, n)| match n {
            LockNotice::Refused {
                request: r, reason, ..
            } if *r == request => Some(*reason),
            _ => None,
        })
    }
}

fn service(name: &str) -> ServiceName {
    ServiceName::new(name).expect("valid service name")
}

#[test]
fn the_same_name_in_two_services_is_two_locks() {
    let mut c = Cluster::new(3, PartitionPolicy::Available);
    let billing = service("billing");
    let default_hold = c.lock(1, None, "x");
    let billing_hold = c.lock(2, Some(&billing), "x");
    assert!(
        c.run_until(Duration::from_secs(2), |c| c.granted(1, default_hold)
            && c.granted(2, billing_hold))
    );
    // Within each service, "x" is held: a try-lock from another member is refused.
    let busy_default = c.try_lock(0, None, "x");
    let busy_billing = c.try_lock(0, Some(&billing), "x");
    assert!(c.run_until(Duration::from_secs(2), |c| c
        .refused(0, busy_default)
        .is_some()
        && c.refused(0, busy_billing).is_some()));
    assert_eq!(c.refused(0, busy_default), Some(Refusal::WouldBlock));
    assert_eq!(c.refused(0, busy_billing), Some(Refusal::WouldBlock));
    // The notices of each request came from its own service.
    let from_billing = c.notices[2].iter().any(|(s, n)| {
        s.as_ref() == Some(&billing)
            && matches!(n, LockNotice::Granted { request, .. } if *request == billing_hold)
    });
    assert!(from_billing);
    // Member 0 (the coordinator) grants billing although it never opened it before the
    // others used it; every member now runs it.
    let coordinator = c.nodes[0].local().clone();
    for node in &c.nodes {
        let runs = node.service(&billing).expect("every member takes part");
        assert_eq!(runs.serving_grantor(), Some(&coordinator));
    }
}

#[test]
fn each_service_moves_its_grantor_on_its_own() {
    let mut c = Cluster::new(3, PartitionPolicy::Available);
    let billing = service("billing");
    let shipping = service("shipping");
    let held = c.lock(0, Some(&billing), "x");
    let _ = c.lock(0, Some(&shipping), "y");
    assert!(c.run_until(Duration::from_secs(2), |c| c.granted(0, held)));
    let now = c.now;
    c.nodes[2]
        .become_grantor_in(now, &billing)
        .expect("Available allows transfers");
    c.settle();
    let (coordinator, asker) = (c.nodes[0].local().clone(), c.nodes[2].local().clone());
    let moved = c.run_until(Duration::from_secs(2), |c| {
        c.nodes
            .iter()
            .all(|n| n.service(&billing).unwrap().serving_grantor() == Some(&asker))
    });
    assert!(moved, "every member follows billing's new grantor");
    for node in &c.nodes {
        assert_eq!(node.locks().serving_grantor(), Some(&coordinator));
        assert_eq!(
            node.service(&shipping).unwrap().serving_grantor(),
            Some(&coordinator)
        );
    }
    // The hold moved with billing's table: still exclusive there.
    assert_eq!(
        c.nodes[2].service(&billing).unwrap().grantor_holds().len(),
        1
    );
    let busy = c.try_lock(1, Some(&billing), "x");
    assert!(c.run_until(Duration::from_secs(2), |c| c.refused(1, busy).is_some()));
    assert_eq!(c.refused(1, busy), Some(Refusal::WouldBlock));
}

#[test]
fn destroying_a_service_refuses_its_waits_and_releases_its_holds() {
    let mut c = Cluster::new(3, PartitionPolicy::Available);
    let billing = service("billing");
    let held = c.lock(1, Some(&billing), "x");
    assert!(c.run_until(Duration::from_secs(2), |c| c.granted(1, held)));
    let waiting = c.lock(2, Some(&billing), "x");
    // Member 2 destroys its use of billing: its wait is refused.
    let now = c.now;
    c.nodes[2].destroy_service(now, &billing);
    c.settle();
    assert_eq!(c.refused(2, waiting), Some(Refusal::Destroyed));
    // Member 0 waits for "x"; member 1 destroys billing: its hold is lost and released at
    // the grantor, so member 0 is granted.
    let next = c.lock(0, Some(&billing), "x");
    let now = c.now;
    c.nodes[1].destroy_service(now, &billing);
    c.settle();
    let lost = c.notices[1].iter().any(|(s, n)| {
        s.as_ref() == Some(&billing)
            && matches!(n, LockNotice::Lost { request, reason: LockLostReason::ServiceDestroyed, .. } if *request == held)
    });
    assert!(lost, "the holder is told its lock is lost");
    assert!(c.run_until(Duration::from_secs(2), |c| c.granted(0, next)));
}

#[test]
fn under_majority_a_new_service_serves_without_a_grace_period_of_its_own() {
    let config = EndpointConfig::local().locks;
    let grace = config.lease + config.lease_margin;
    let mut c = Cluster::new(3, PartitionPolicy::Majority { cluster_size: 3 });
    // The default service serves once its term is supported and its grace period is over.
    let first = c.lock(1, None, "warm-up");
    assert!(c.run_until(Duration::from_secs(10), |c| c.granted(1, first)));
    // A service nobody used before: granted within a reconciliation, far less than a grace
    // period, and its token is in the member's term (above the default service's epoch 0).
    let billing = service("billing");
    let asked = c.now;
    let request = c.lock(1, Some(&billing), "x");
    assert!(c.run_until(grace, |c| c.granted(1, request)));
    let waited = c.now.saturating_duration_since(asked);
    assert!(
        waited < grace / 2,
        "a named service waited {waited:?}, like a new grantor's grace ({grace:?})"
    );
    let token = c.notices[1]
        .iter()
        .find_map(|(_, n)| match n {
            LockNotice::Granted {
                request: r, token, ..
            } if *r == request => Some(*token),
            _ => None,
        })
        .expect("granted");
    assert!(
        token.epoch() >= 1,
        "tokens carry the member's term: {token}"
    );
}
