//! Under `Majority`, a view change that keeps the grantor keeps its term: a member that holds
//! nothing crashes, or one joins (a restart), and every free lock is still granted within a
//! round trip; only the locks the crashed member held wait out its lease. Five members at the
//! endpoint, on a lossless network that delivers at once; crashed members neither send nor
//! receive.

use std::collections::{BTreeSet, VecDeque};
use std::time::Duration;

use conclave_lock_api::{FencingToken, LockName, MemberId, RequestId};
use conclave_protocol::gms::Founding;
use conclave_protocol::locking::{HoldStatus, LockNotice, LockRequest, PartitionPolicy};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, EndpointEvent, Instant};

const SIZE: usize = 5;
const POLICY: PartitionPolicy = PartitionPolicy::Majority { cluster_size: SIZE };

/// How long a grant may take with a grantor that serves: a round trip and a little.
const PROMPTLY: Duration = Duration::from_millis(20);

struct Cluster {
    nodes: Vec<Endpoint>,
    alive: Vec<bool>,
    now: Instant,
    notices: Vec<Vec<(Instant, LockNotice)>>,
    config: EndpointConfig,
    incarnations: u128,
    /// The highest term each member slot wrote to its stable storage.
    disk: Vec<u64>,
    /// Directed links (from, to) that lose everything.
    cut: BTreeSet<(usize, usize)>,
}

impl Cluster {
    /// Five members in one view, member 0 its coordinator, its term supported and past grace.
    fn new() -> Self {
        let mut config = EndpointConfig::local();
        config.locks.policy = POLICY;
        let mut cluster = Self {
            nodes: Vec::new(),
            alive: Vec::new(),
            now: Instant::ZERO,
            notices: Vec::new(),
            config,
            incarnations: 0,
            disk: vec![0; SIZE],
            cut: BTreeSet::new(),
        };
        for i in 0..SIZE {
            let node = cluster.endpoint(i);
            cluster.nodes.push(node);
            cluster.alive.push(true);
            cluster.notices.push(Vec::new());
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
                    .is_some_and(|v| v.len() == SIZE && v.coordinator() == &first)
            })
        });
        assert!(formed, "the members agree on one view");
        // The term is supported and its grace is over once a lock is granted.
        let warm = cluster.lock(1, "warm-up");
        assert!(cluster.run_until(Duration::from_secs(10), |c| c.granted(1, warm)));
        cluster.unlock(1, warm);
        cluster
    }

    fn endpoint(&mut self, i: usize) -> Endpoint {
        self.incarnations += 1;
        let me = MemberId::new(
            (self.incarnations << 100) | i as u128,
            &format!("m{i}"),
            ([127, 0, 0, 1], 7300 + u16::try_from(i).expect("small")).into(),
        )
        .expect("valid member");
        Endpoint::new("majority-views", me, self.config.clone(), 1400)
    }

    /// Delivers every datagram between live members until nothing moves.
    fn settle(&mut self) {
        let mut queue = VecDeque::new();
        loop {
            for (from, node) in self.nodes.iter_mut().enumerate() {
                while let Some(term) = node.poll_durable_term() {
                    self.disk[from] = self.disk[from].max(term);
                }
                while let Some(transmit) = node.poll_transmit() {
                    if self.alive[from] {
                        queue.push_back((from, transmit));
                    }
                }
                while let Some(event) = node.poll_event() {
                    if let EndpointEvent::Lock(notice) = event {
                        self.notices[from].push((self.now, notice));
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
                    if addressed && self.alive[to] && !self.cut.contains(&(from, to)) {
                        let now = self.now;
                        self.nodes[to].handle_datagram(now, &transmit.bytes);
                    }
                }
            }
        }
    }

    /// One millisecond: every due timer of a live member.
    fn tick(&mut self) {
        self.now += Duration::from_millis(1);
        let now = self.now;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if self.alive[i] && node.poll_timeout().is_some_and(|t| t <= now) {
                node.handle_timeout(now);
            }
        }
        self.settle();
    }

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
            self.tick();
        }
    }

    fn run_for(&mut self, span: Duration) {
        let end = self.now + span;
        while self.now < end {
            self.tick();
        }
    }

    fn lock(&mut self, node: usize, name: &str) -> RequestId {
        let request = LockRequest::exclusive(1, LockName::new(name).expect("valid lock name"));
        let now = self.now;
        let id = self.nodes[node].lock(now, request);
        self.settle();
        id
    }

    fn unlock(&mut self, node: usize, request: RequestId) {
        let now = self.now;
        self.nodes[node].unlock(now, request).expect("held");
        self.settle();
    }

    fn grant(&self, node: usize, request: RequestId) -> Option<(Instant, FencingToken)> {
        self.notices[node].iter().find_map(|(at, n)| match n {
            LockNotice::Granted {
                request: r, token, ..
            } if *r == request => Some((*at, *token)),
            _ => None,
        })
    }

    fn granted(&self, node: usize, request: RequestId) -> bool {
        self.grant(node, request).is_some()
    }

    fn crash(&mut self, i: usize) {
        self.alive[i] = false;
    }

    /// A new process in place of member `i`, joining as the node builder's default does, with
    /// the term its predecessor wrote to stable storage.
    fn restart(&mut self, i: usize) {
        let mut node = self.endpoint(i);
        node.set_founding(Founding::WithOthers);
        node.restore_term(self.disk[i]);
        let now = self.now;
        node.join(now);
        self.nodes[i] = node;
        self.notices[i].clear();
        self.alive[i] = true;
        self.settle();
    }

    /// Whether every live member installed a view of exactly the live members.
    fn agreed(&self) -> bool {
        let live: Vec<&MemberId> = (0..SIZE)
            .filter(|i| self.alive[*i])
            .map(|i| self.nodes[i].local())
            .collect();
        (0..SIZE).filter(|i| self.alive[*i]).all(|i| {
            self.nodes[i]
                .view()
                .is_some_and(|v| v.len() == live.len() && live.iter().all(|m| v.contains(m)))
        })
    }

    /// Runs for `span` while the live members other than `skip` ask, every 20 ms in turn, for a
    /// fresh lock nobody holds (releasing each once granted). Returns the longest wait of any
    /// such request (one not granted by the end counts until then).
    fn longest_wait(&mut self, span: Duration, skip: &[usize]) -> Duration {
        let end = self.now + span;
        let mut open: Vec<(usize, RequestId, Instant)> = Vec::new();
        let mut longest = Duration::ZERO;
        let mut k = 0usize;
        let mut next_ask = self.now;
        while self.now < end {
            if self.now >= next_ask {
                let askers: Vec<usize> = (0..SIZE)
                    .filter(|i| self.alive[*i] && !skip.contains(i))
                    .filter(|i| self.nodes[*i].view().is_some_and(|v| v.len() >= 3))
                    .collect();
                if !askers.is_empty() {
                    let node = askers[k % askers.len()];
                    let id = self.lock(node, &format!("probe-{k}"));
                    open.push((node, id, self.now));
                    k += 1;
                }
                next_ask = self.now + Duration::from_millis(20);
            }
            let mut still = Vec::new();
            for (node, id, asked) in std::mem::take(&mut open) {
                if let Some((at, _)) = self.grant(node, id) {
                    longest = longest.max(at.saturating_duration_since(asked));
                    if self.alive[node] {
                        self.unlock(node, id);
                    }
                } else if self.alive[node] {
                    still.push((node, id, asked));
                }
            }
            open = still;
            self.tick();
        }
        for (_, _, asked) in open {
            longest = longest.max(self.now.saturating_duration_since(asked));
        }
        longest
    }
}

#[test]
fn a_member_that_holds_nothing_crashes_and_free_locks_are_granted_throughout() {
    let mut c = Cluster::new();
    c.crash(3);
    let longest = c.longest_wait(Duration::from_secs(4), &[]);
    assert!(
        c.agreed(),
        "the survivors installed a view without member 3"
    );
    eprintln!("crash of a member that holds nothing: longest wait {longest:?}");
    assert!(
        longest <= PROMPTLY,
        "a free lock waited {longest:?} after a member that held nothing crashed"
    );
}

#[test]
fn a_restarted_member_joins_and_free_locks_are_granted_throughout() {
    let mut c = Cluster::new();
    c.crash(3);
    assert!(c.run_until(Duration::from_secs(5), Cluster::agreed));
    c.restart(3);
    let longest = c.longest_wait(Duration::from_secs(4), &[3]);
    assert!(c.agreed(), "the restarted member joined");
    eprintln!("restarted member joins: longest wait {longest:?}");
    assert!(
        longest <= PROMPTLY,
        "a free lock waited {longest:?} while a restarted member joined"
    );
}

#[test]
fn a_crashed_holders_lock_waits_out_its_lease_and_no_longer() {
    let mut c = Cluster::new();
    let held = c.lock(3, "held");
    assert!(c.run_until(PROMPTLY, |c| c.granted(3, held)));
    let (_, old_token) = c.grant(3, held).expect("granted");
    // Member 3 renews its lease, then crashes; another member waits for its lock.
    c.run_for(Duration::from_millis(300));
    c.crash(3);
    let crashed_at = c.now;
    let waiter = c.lock(1, "held");
    let lease = c.config.locks.lease + c.config.locks.lease_margin;
    assert!(c.run_until(Duration::from_secs(10), |c| c.granted(1, waiter)));
    let (at, token) = c.grant(1, waiter).expect("granted");
    // The crashed holder's last renewal was at most `suspend_after / 2` before the crash:
    // the lock waits out the lease from that renewal, not from the view change (suspicion
    // comes on top of that).
    let renewal = c.config.locks.suspend_after / 2;
    let after = at.saturating_duration_since(crashed_at);
    assert!(
        after >= lease - renewal,
        "re-granted {after:?} after the crash, inside the crashed holder's lease"
    );
    assert!(
        after <= lease + PROMPTLY,
        "re-granted only {after:?} after the crash: the fence ran from the view change"
    );
    assert!(
        token > old_token,
        "tokens increase: {old_token} then {token}"
    );
    eprintln!(
        "crashed holder's lock re-granted {:?} after the crash",
        at.saturating_duration_since(crashed_at)
    );
}

#[test]
fn a_member_killed_and_restarted_at_once_stops_no_grant() {
    let mut c = Cluster::new();
    c.crash(3);
    c.run_for(Duration::from_millis(100));
    // Back before the survivors have removed its old incarnation.
    c.restart(3);
    let longest = c.longest_wait(Duration::from_secs(5), &[3]);
    assert!(c.agreed(), "the restarted member joined");
    eprintln!("member killed and restarted at once: longest wait {longest:?}");
    assert!(
        longest <= PROMPTLY,
        "a free lock waited {longest:?} after a member was killed and restarted"
    );
}

/// Cuts every link between `side` and the other members, both ways.
fn partition(c: &mut Cluster, side: &[usize]) {
    for a in side {
        for b in (0..SIZE).filter(|b| !side.contains(b)) {
            c.cut.insert((*a, b));
            c.cut.insert((b, *a));
        }
    }
}

/// A member cut off while it holds a lock, alive and believing it holds, is removed; the
/// grantor keeps its term (and a majority) and grants every free lock at once, and the cut-off
/// member's lock only once that member no longer believes it holds it.
fn cut_off_holder_is_fenced(cut: impl Fn(&mut Cluster)) {
    let mut c = Cluster::new();
    let held = c.lock(3, "held");
    assert!(c.run_until(PROMPTLY, |c| c.granted(3, held)));
    let (_, old_token) = c.grant(3, held).expect("granted");
    c.run_for(Duration::from_millis(130));
    cut(&mut c);
    let waiter = c.lock(1, "held");
    let end = c.now + Duration::from_secs(10);
    while !c.granted(1, waiter) && c.now < end {
        c.tick();
        if c.granted(1, waiter) {
            let status = c.nodes[3].lock_status(c.now, held);
            assert!(
                !matches!(status, Some(HoldStatus::Held | HoldStatus::Suspended)),
                "granted to member 1 while member 3 still holds: {status:?}"
            );
        }
    }
    let (_, token) = c.grant(1, waiter).expect("granted in the end");
    assert!(
        token > old_token,
        "tokens increase: {old_token} then {token}"
    );
    assert_eq!(
        token.epoch(),
        old_token.epoch(),
        "the grantor kept its term"
    );
    let longest = c.longest_wait(Duration::from_secs(2), &[3, 4]);
    assert!(longest <= PROMPTLY, "a free lock waited {longest:?}");
}

#[test]
fn a_holder_cut_off_with_a_minority_is_fenced_while_the_grantor_keeps_its_term() {
    cut_off_holder_is_fenced(|c| partition(c, &[3, 4]));
}

#[test]
fn a_holder_that_hears_the_grantor_but_is_not_heard_is_fenced() {
    // One-way: member 3 still receives everything, nothing it sends arrives.
    cut_off_holder_is_fenced(|c| {
        for to in 0..SIZE {
            c.cut.insert((3, to));
        }
    });
}
