//! A rolling upgrade at the endpoint: members of version 4 and a member of version 3 in one
//! cluster, on a lossless network. The version-3 member is an endpoint held at version 3
//! (`EndpointConfig::wire`) behind the decoder of a version-3 build: whatever is addressed to
//! it must pass that decoder (the version check of version 3, then cbor4ii's serde mapping of
//! `Packet`, and of `Message` for the payload of every data segment) or it is dropped and
//! counted, as a version-3 build would drop it. The version-4 members must speak version 4
//! with each other, and version 3 with it, without being told which is which.

use std::collections::VecDeque;
use std::time::Duration;

use conclave_lock_api::wire::{self, ClusterId, Frame, Message, Packet, WireVersion, HEADER_LEN};
use conclave_lock_api::{LockName, MemberId, RequestId};
use conclave_protocol::locking::{LockNotice, LockRequest};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, EndpointEvent, Instant};

const CLUSTER: &str = "rolling";

/// What a build of version 3 makes of a datagram: the packet, or why it drops it.
fn version_three_decode(bytes: &[u8]) -> Result<Packet, String> {
    match bytes.get(4) {
        Some(3) => {}
        other => return Err(format!("unsupported protocol version {other:?}")),
    }
    let packet: Packet =
        cbor4ii::serde::from_slice(&bytes[HEADER_LEN..]).map_err(|e| e.to_string())?;
    let segments = match &packet.frame {
        Frame::Data(segment) => vec![segment],
        Frame::Bundle(segments) => segments.iter().collect(),
        _ => vec![],
    };
    for segment in segments.iter().filter(|s| s.fragments == 1) {
        cbor4ii::serde::from_slice::<Message>(&segment.payload.0)
            .map_err(|e| format!("undecodable message: {e}"))?;
    }
    Ok(packet)
}

/// Endpoints on a network that delivers everything at once, in order; `old` is the member of
/// version 3.
struct Cluster {
    nodes: Vec<Endpoint>,
    old: Option<usize>,
    now: Instant,
    notices: Vec<Vec<LockNotice>>,
    /// Datagrams by (from, to, version byte).
    sent: Vec<(usize, usize, u8)>,
    /// Datagrams the version-3 member's decoder refused.
    refused_by_old: Vec<String>,
}

impl Cluster {
    fn new(n: usize, old: Option<usize>) -> Self {
        let nodes = (0..n)
            .map(|i| {
                let mut config = EndpointConfig::local();
                if Some(i) == old {
                    config.wire = WireVersion::V3;
                }
                let me = MemberId::new(
                    (i as u128 + 1) << 100,
                    &format!("m{i}"),
                    ([127, 0, 0, 1], 7200 + i as u16).into(),
                )
                .expect("valid member");
                Endpoint::new(CLUSTER, me, config, 1400)
            })
            .collect();
        let mut cluster = Self {
            nodes,
            old,
            now: Instant::ZERO,
            notices: vec![Vec::new(); n],
            sent: Vec::new(),
            refused_by_old: Vec::new(),
        };
        for i in 0..n {
            let now = cluster.now;
            cluster.nodes[i].join(now);
            cluster.settle();
        }
        let formed = cluster.run_until(Duration::from_secs(10), |c| {
            c.nodes
                .iter()
                .all(|e| e.view().is_some_and(|v| v.len() == n))
        });
        assert!(formed, "the members agree on one view");
        cluster
    }

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
                let now = self.now;
                if Some(from) == self.old {
                    // The old member sends exactly what a version-3 build sends.
                    let packet =
                        wire::decode_packet(ClusterId::from_name(CLUSTER), &transmit.bytes)
                            .expect("it decodes");
                    let plain = wire::encode_packet(ClusterId::from_name(CLUSTER), &packet)
                        .expect("it encodes");
                    assert_eq!(plain, transmit.bytes, "a version-3 member's datagram");
                }
                for (to, node) in self.nodes.iter_mut().enumerate() {
                    let addressed = match transmit.destination {
                        Destination::Member(addr) => node.local().addr() == addr,
                        Destination::Discovery => to != from,
                    };
                    if !addressed {
                        continue;
                    }
                    self.sent.push((from, to, transmit.bytes[4]));
                    if Some(to) == self.old {
                        if let Err(why) = version_three_decode(&transmit.bytes) {
                            self.refused_by_old.push(why);
                            continue;
                        }
                    }
                    node.handle_datagram(now, &transmit.bytes);
                }
            }
        }
    }

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

    fn lock(&mut self, node: usize, name: &str) -> RequestId {
        let request = LockRequest::exclusive(1, LockName::new(name).expect("valid"));
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

    fn granted(&self, node: usize, request: RequestId) -> bool {
        self.notices[node]
            .iter()
            .any(|n| matches!(n, LockNotice::Granted { request: r, .. } if *r == request))
    }

    /// Locks are handed between every member in turn, the old one included.
    fn hand_a_lock_around(&mut self) {
        let holds: Vec<(usize, RequestId)> = (0..self.nodes.len())
            .map(|i| (i, self.lock(i, "x")))
            .collect();
        for (node, request) in holds {
            assert!(
                self.run_until(Duration::from_secs(5), |c| c.granted(node, request)),
                "member {node} gets the lock"
            );
            self.unlock(node, request);
        }
    }

    /// The version bytes of the datagrams from `from` to `to` since `since`.
    fn versions(&self, since: usize, from: usize, to: usize) -> Vec<u8> {
        self.sent[since..]
            .iter()
            .filter(|(f, t, _)| (*f, *t) == (from, to))
            .map(|(_, _, v)| *v)
            .collect()
    }
}

#[test]
fn a_version_three_member_and_version_four_members_share_a_cluster() {
    // Member 1 is the one not upgraded yet; member 0 coordinates and grants.
    let mut c = Cluster::new(3, Some(1));
    let mark = c.sent.len();
    c.hand_a_lock_around();
    assert_eq!(
        c.refused_by_old,
        Vec::<String>::new(),
        "the old member reads everything"
    );
    let between_new = [c.versions(mark, 0, 2), c.versions(mark, 2, 0)].concat();
    assert!(!between_new.is_empty());
    assert!(
        between_new.iter().all(|v| *v == 4),
        "the upgraded members speak version 4 with each other: {between_new:?}"
    );
    let with_old = [
        c.versions(mark, 0, 1),
        c.versions(mark, 1, 0),
        c.versions(mark, 2, 1),
    ]
    .concat();
    assert!(!with_old.is_empty());
    assert!(
        with_old.iter().all(|v| *v == 3),
        "and version 3 with the old one"
    );
}

#[test]
fn a_cluster_of_version_four_speaks_version_four() {
    let mut c = Cluster::new(3, None);
    let mark = c.sent.len();
    c.hand_a_lock_around();
    for (from, to) in [(0, 1), (1, 0), (0, 2), (2, 0)] {
        let versions = c.versions(mark, from, to);
        assert!(!versions.is_empty());
        assert!(
            versions.iter().all(|v| *v == 4),
            "{from} -> {to}: {versions:?}"
        );
    }
}

#[test]
fn the_old_member_being_upgraded_last_turns_the_cluster_to_version_four() {
    // The last member restarts on the new build: a new incarnation at the same address.
    let mut c = Cluster::new(2, Some(1));
    assert_eq!(c.refused_by_old, Vec::<String>::new());
    let now = c.now;
    c.nodes[1].leave(now);
    c.settle();
    assert!(
        c.run_until(Duration::from_secs(10), |c| c.nodes[1].is_drained()
            && c.nodes[0].view().is_some_and(|v| v.len() == 1))
    );
    let me = MemberId::new(9 << 100, "m1", ([127, 0, 0, 1], 7201).into()).expect("valid");
    c.nodes[1] = Endpoint::new(CLUSTER, me, EndpointConfig::local(), 1400);
    c.old = None;
    let now = c.now;
    c.nodes[1].join(now);
    assert!(c.run_until(Duration::from_secs(10), |c| c
        .nodes
        .iter()
        .all(|e| e.view().is_some_and(|v| v.len() == 2))));
    let mark = c.sent.len();
    c.hand_a_lock_around();
    let versions = [c.versions(mark, 0, 1), c.versions(mark, 1, 0)].concat();
    assert!(!versions.is_empty());
    assert!(versions.iter().all(|v| *v == 4), "{versions:?}");
}
