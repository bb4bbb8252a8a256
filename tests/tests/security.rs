//! The security suite: keyed clusters attacked over UDP and over TCP, as
//! `security::<transport>::<attack>`. Every attacker here is an outsider on loopback without
//! the cluster key, except where it replays what it recorded off the wire.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conclave::seal::{ClusterKey, Keyring, SealStats};
use conclave::tcp::TcpMesh;
use conclave::udp::UdpMulticast;
use conclave::{EndpointConfig, LockError, LockStatus, Node, NodeError};
use conclave_tests::attacker::{sealed_hello, Direction, Outsider, Tap};
use conclave_tests::fixtures::{agree, udp_config};
use conclave_tests::{within, WAIT};

/// Which transport a scenario runs over.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Udp,
    Tcp,
}

/// Starts members of one cluster over one transport, every one tapped.
struct Cluster {
    kind: Kind,
    name: String,
    seed: Option<SocketAddr>,
}

fn key(byte: u8) -> ClusterKey {
    ClusterKey::from_bytes([byte; 32])
}

impl Cluster {
    fn new(kind: Kind, test: &str) -> Self {
        Self {
            kind,
            name: format!("security-{test}-{kind:?}-{}", std::process::id()),
            seed: None,
        }
    }

    fn outsider(&self) -> Outsider {
        match self.kind {
            Kind::Udp => Outsider::udp().unwrap(),
            Kind::Tcp => Outsider::tcp(),
        }
    }

    /// Gets `packets` to the member tapped by `to`, as from `from`, the way an attacker
    /// can: over UDP an outsider sends them; over TCP the mesh closes an outsider's connection
    /// at the handshake (it cannot prove the key), so they are also put into the member's
    /// receive path, as an attacker on the path of a member's authenticated connection would
    /// inject them. Returns how many reach the sealing layer.
    fn deliver(&self, to: &Tap, from: SocketAddr, packets: &[&[u8]]) -> usize {
        let each: Vec<(SocketAddr, &[u8])> = packets.iter().map(|p| (from, *p)).collect();
        self.deliver_each(to, &each)
    }

    /// As [`Cluster::deliver`], each packet as from its own address.
    fn deliver_each(&self, to: &Tap, packets: &[(SocketAddr, &[u8])]) -> usize {
        let sent = self
            .outsider()
            .send_all(
                conclave::api::Transport::local_addr(to),
                packets.iter().map(|(_, p)| *p),
            )
            .unwrap();
        match self.kind {
            Kind::Udp => sent,
            Kind::Tcp => packets
                .iter()
                .map(|(from, packet)| to.inject(*from, [*packet]))
                .sum(),
        }
    }

    /// A member with `keys` (none: no key), joined or refused.
    async fn try_join(
        &mut self,
        name: &str,
        keys: Option<Keyring>,
    ) -> (Result<Node, NodeError>, Tap) {
        let tap = match self.kind {
            Kind::Udp => Tap::new(UdpMulticast::bind(&udp_config()).unwrap()),
            Kind::Tcp => {
                let mesh = TcpMesh::loopback(self.seed).unwrap();
                self.seed
                    .get_or_insert(conclave::api::Transport::local_addr(&mesh));
                Tap::new(mesh)
            }
        };
        let mut builder = Node::builder(&self.name)
            .name(name)
            .transport(tap.clone())
            .config(EndpointConfig::local())
            .founding(conclave::Founding::Alone)
            .join_timeout(WAIT);
        if let Some(keys) = keys {
            builder = builder.keyring(keys);
        }
        (within(WAIT, "join", builder.join()).await, tap)
    }

    async fn join(&mut self, name: &str, keys: Option<Keyring>) -> (Node, Tap) {
        let (node, tap) = self.try_join(name, keys).await;
        (node.unwrap(), tap)
    }

    /// `n` members sharing `keys`, in one view.
    async fn start(&mut self, n: usize, keys: &Keyring) -> Vec<(Node, Tap)> {
        let mut members = Vec::new();
        for i in 0..n {
            members.push(self.join(&format!("m{i}"), Some(keys.clone())).await);
        }
        let nodes: Vec<&Node> = members.iter().map(|(n, _)| n).collect();
        agree_refs(&nodes).await;
        members
    }
}

async fn agree_refs(nodes: &[&Node]) {
    // `agree` takes owned nodes' slice; the views of references are the same streams.
    let wanted: BTreeSet<_> = nodes.iter().map(|n| n.member_id().clone()).collect();
    within(WAIT, "view agreement", async {
        loop {
            let views: Vec<_> = nodes.iter().map(|n| n.view()).collect();
            let same = views.iter().all(|v| v == &views[0]);
            let members: Option<BTreeSet<_>> = views[0]
                .as_ref()
                .map(|v| v.members().iter().cloned().collect());
            if same && members.as_ref() == Some(&wanted) {
                return;
            }
            async_io::Timer::after(Duration::from_millis(5)).await;
        }
    })
    .await;
}

fn stats(node: &Node) -> SealStats {
    node.seal_stats().unwrap()
}

/// Waits until `check` holds for `node`'s counters.
async fn counted(node: &Node, what: &str, check: impl Fn(&SealStats) -> bool) -> SealStats {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let s = stats(node);
        if check(&s) {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}: {s:?}"
        );
        async_io::Timer::after(Duration::from_millis(5)).await;
    }
}

/// Asserts that `node` cannot join: its join fails with an authentication error naming the
/// key ids of both sides.
fn assert_refused(
    result: Result<Node, NodeError>,
    ours: Option<conclave::seal::KeyId>,
    theirs: Option<conclave::seal::KeyId>,
) {
    match result {
        Err(NodeError::Authentication(rejection)) => {
            assert_eq!(rejection.ours, ours, "{rejection:?}");
            assert_eq!(rejection.theirs, theirs, "{rejection:?}");
            let text = NodeError::Authentication(rejection).to_string();
            assert!(text.contains("authentication failed"), "{text}");
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(node) => panic!("joined a keyed cluster it should not: {:?}", node.view()),
    }
}

/// A member without the key cannot join: its join fails with a clear error, the cluster's
/// view never counts it, and the members count its packets as mismatched.
async fn outsider_without_key_cannot_join(kind: Kind) {
    let mut cluster = Cluster::new(kind, "outsider");
    let ring = Keyring::new(key(1));
    let members = cluster.start(2, &ring).await;
    let (result, _) = cluster.try_join("outsider", None).await;
    assert_refused(result, None, Some(key(1).id()));
    let view = members[0].0.view().unwrap();
    assert_eq!(view.len(), 2, "{view:?}");
    match kind {
        Kind::Udp => assert!(members.iter().any(|(n, _)| stats(n).key_mismatch > 0)),
        // The mesh refused the outsider's hello (version 1: no key) and told its member.
        Kind::Tcp => {
            counted(&members[0].0, "the handshake's notice", |s| {
                s.notices_received > 0
            })
            .await;
        }
    }
    for (node, _) in members {
        assert_eq!(stats(&node).failed_authentication, 0);
        node.leave().await;
    }
}

/// A member with another key cannot join, and the error names both keys' ids; the members log
/// and count its packets as failing authentication.
async fn wrong_key_cannot_join(kind: Kind) {
    let mut cluster = Cluster::new(kind, "wrong-key");
    let ring = Keyring::new(key(1));
    let members = cluster.start(2, &ring).await;
    let (result, _) = cluster
        .try_join("intruder", Some(Keyring::new(key(2))))
        .await;
    assert_refused(result, Some(key(2).id()), Some(key(1).id()));
    assert_eq!(members[0].0.view().unwrap().len(), 2);
    match kind {
        Kind::Udp => assert!(members
            .iter()
            .any(|(n, _)| stats(n).failed_authentication > 0)),
        // The mesh refused the intruder's proof (another key) and told its member.
        Kind::Tcp => {
            counted(&members[0].0, "the handshake's notice", |s| {
                s.notices_received > 0
            })
            .await;
        }
    }
    // The members still lock among themselves.
    let guard = members[1].0.mutex("after").unwrap().lock().await.unwrap();
    guard.unlock().await.unwrap();
    for (node, _) in members {
        node.leave().await;
    }
}

/// A member with a key cannot join a cluster without one (the key is not silently ignored).
async fn keyed_member_cannot_join_an_open_cluster(kind: Kind) {
    let mut cluster = Cluster::new(kind, "open");
    let (open, _) = cluster.join("open", None).await;
    let (result, _) = cluster.try_join("keyed", Some(Keyring::new(key(3)))).await;
    assert_refused(result, Some(key(3).id()), None);
    assert_eq!(open.view().unwrap().len(), 1);
    open.leave().await;
}

/// Forged packets — a holder's captured packets with a byte changed (an outsider's attempt at
/// an unlock in its name), cut short, or made up — are dropped before the protocol sees them:
/// the lock stays held by its holder, and the grantor counts every one.
async fn forged_unlocks_are_dropped(kind: Kind) {
    let mut cluster = Cluster::new(kind, "forged");
    let ring = Keyring::new(key(4));
    let members = cluster.start(3, &ring).await;
    let (grantor, grantor_tap) = &members[0];
    let (holder, holder_tap) = &members[1];
    let (other, _) = &members[2];
    let mutex = holder.mutex("forged").unwrap();
    let guard = mutex.lock().await.unwrap();
    let token = guard.fencing_token();
    // Unlock and lock again so the tap holds real unlocks of this lock.
    guard.unlock().await.unwrap();
    let guard = mutex.lock().await.unwrap();
    let to_grantor: Vec<Vec<u8>> = holder_tap
        .seen()
        .into_iter()
        .filter(|t| t.direction == Direction::Sent && t.peer == Some(grantor.member_id().addr()))
        .map(|t| t.bytes)
        .collect();
    assert!(!to_grantor.is_empty());
    let mut forged = Vec::new();
    for (i, packet) in to_grantor.iter().enumerate().take(150) {
        // A captured unlock made new: a counter the holder has not used yet (so it is no
        // replay), and on every other one a byte of the ciphertext or tag changed too. The rest
        // of the header is kept, so the packet is judged by the key, not dismissed as foreign.
        let mut bent = packet.clone();
        bent[33..41].copy_from_slice(&(u64::MAX - i as u64).to_be_bytes());
        if i % 2 == 1 {
            let body = packet.len() - conclave::seal::SEALED_HEADER_LEN;
            bent[conclave::seal::SEALED_HEADER_LEN + (i * 7) % body] ^= 0x20;
        }
        forged.push(bent);
    }
    let before = stats(grantor);
    let forged: Vec<&[u8]> = forged.iter().map(Vec::as_slice).collect();
    let sent = cluster.deliver(grantor_tap, holder.member_id().addr(), &forged);
    counted(grantor, "forged packets counted", |s| {
        s.failed_authentication >= before.failed_authentication + sent as u64
    })
    .await;
    // Made-up and cut-short packets too.
    let junk: Vec<Vec<u8>> = vec![
        vec![0; 200],
        b"CNCS".to_vec(),
        to_grantor[0][..40].to_vec(),
        b"CNCL\x03garbage-garbage".to_vec(),
    ];
    let junk: Vec<&[u8]> = junk.iter().map(Vec::as_slice).collect();
    cluster.deliver(grantor_tap, holder.member_id().addr(), &junk);
    // The lock is still the holder's.
    assert_eq!(guard.status(), LockStatus::Held);
    assert!(matches!(
        other.mutex("forged").unwrap().try_lock().await,
        Err(LockError::WouldBlock)
    ));
    let table = holder.lock_table().await.unwrap();
    let held = table
        .locks
        .iter()
        .find(|l| l.name.as_str() == "forged")
        .unwrap();
    assert_eq!(held.holders.len(), 1);
    assert_eq!(held.holders[0].owner, guard.owner());
    assert!(guard.fencing_token() > token);
    guard.unlock().await.unwrap();
    let g = other.mutex("forged").unwrap().lock().await.unwrap();
    g.unlock().await.unwrap();
    for (node, _) in members {
        node.leave().await;
    }
}

/// Replayed packets — every grant, unlock and heartbeat a member sent and received, recorded
/// off the wire and sent again by an outsider — are dropped as replays: the lock's new holder
/// keeps it, the old one cannot take it, and nothing fails authentication.
async fn replayed_grants_and_unlocks_are_dropped(kind: Kind) {
    let mut cluster = Cluster::new(kind, "replay");
    let ring = Keyring::new(key(5));
    let members = cluster.start(3, &ring).await;
    let (grantor, grantor_tap) = &members[0];
    let (old, old_tap) = &members[1];
    let (new, _) = &members[2];
    for _ in 0..2 {
        let g = old.mutex("replayed").unwrap().lock().await.unwrap();
        g.unlock().await.unwrap();
    }
    let guard = new.mutex("replayed").unwrap().lock().await.unwrap();
    let recorded = old_tap.seen();
    let sent: Vec<&[u8]> = recorded
        .iter()
        .filter(|t| t.direction == Direction::Sent && t.peer == Some(grantor.member_id().addr()))
        .map(|t| t.bytes.as_slice())
        .collect();
    // What the old holder received from its own cluster's members (the multicast group is
    // shared with the other tests of this binary: their packets are foreign, not replays).
    let member_addrs: Vec<SocketAddr> = members.iter().map(|(m, _)| m.member_id().addr()).collect();
    let received: Vec<(SocketAddr, &[u8])> = recorded
        .iter()
        .filter(|t| t.direction == Direction::Received)
        .filter_map(|t| Some((t.peer?, t.bytes.as_slice())))
        .filter(|(peer, _)| member_addrs.contains(peer))
        .collect();
    assert!(!sent.is_empty() && !received.is_empty());
    let (grantor_before, old_before) = (stats(grantor), stats(old));
    let to_grantor = cluster.deliver(grantor_tap, old.member_id().addr(), &sent) as u64;
    let to_old = cluster.deliver_each(old_tap, &received) as u64;
    let replays = |s: &SealStats| s.replayed + s.stale_session;
    counted(grantor, "replays at the grantor", |s| {
        replays(s) >= replays(&grantor_before) + to_grantor
    })
    .await;
    counted(old, "replays at the old holder", |s| {
        replays(s) >= replays(&old_before) + to_old
    })
    .await;
    for (node, _) in &members {
        assert_eq!(stats(node).failed_authentication, 0);
    }
    assert_eq!(guard.status(), LockStatus::Held);
    assert!(matches!(
        old.mutex("replayed").unwrap().try_lock().await,
        Err(LockError::WouldBlock)
    ));
    guard.unlock().await.unwrap();
    for (node, _) in members {
        node.leave().await;
    }
}

/// Keys rotate while every member keeps taking one lock: install the new key everywhere, make
/// it primary everywhere, remove the old one everywhere. No lock request fails, no hold is
/// lost, exclusion holds throughout, nothing fails authentication; afterwards the old key
/// alone no longer joins and the new one does.
async fn keys_rotate_while_locks_are_taken(kind: Kind) {
    let mut cluster = Cluster::new(kind, "rotation");
    let (old_key, new_key) = (key(6), key(7));
    let rings: Vec<Keyring> = (0..3).map(|_| Keyring::new(old_key.clone())).collect();
    let mut members = Vec::new();
    for (i, ring) in rings.iter().enumerate() {
        members.push(cluster.join(&format!("r{i}"), Some(ring.clone())).await.0);
    }
    agree(&members).await;
    let lost = Arc::new(AtomicU64::new(0));
    for node in &members {
        let lost = lost.clone();
        node.on_lock_lost(move |_| {
            lost.fetch_add(1, Ordering::Relaxed);
        });
    }
    let inside = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = members
        .iter()
        .map(|node| {
            let mutex = node.mutex("rotating").unwrap();
            let (inside, cycles, stop) = (inside.clone(), cycles.clone(), stop.clone());
            smol::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let guard = mutex.lock().await.expect("lock during rotation");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    async_io::Timer::after(Duration::from_micros(200)).await;
                    inside.store(false, Ordering::SeqCst);
                    guard.unlock().await.expect("unlock during rotation");
                    cycles.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let progress = |n: u64| {
        let cycles = cycles.clone();
        async move {
            let start = cycles.load(Ordering::Relaxed);
            within(WAIT, "lock cycles during rotation", async {
                while cycles.load(Ordering::Relaxed) < start + n {
                    async_io::Timer::after(Duration::from_millis(2)).await;
                }
            })
            .await;
        }
    };
    progress(20).await;
    for ring in &rings {
        ring.install(new_key.clone()).unwrap();
        progress(3).await;
    }
    progress(20).await;
    for ring in &rings {
        ring.use_key(new_key.id()).unwrap();
        progress(3).await;
    }
    progress(20).await;
    for ring in &rings {
        ring.remove(old_key.id()).unwrap();
        progress(3).await;
    }
    progress(20).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        within(WAIT, "workers stop", worker).await;
    }
    assert_eq!(
        lost.load(Ordering::Relaxed),
        0,
        "holds lost during rotation"
    );
    for node in &members {
        let s = stats(node);
        assert_eq!(s.failed_authentication, 0, "{s:?}");
        assert_eq!(node.keyring().unwrap().ids(), vec![new_key.id()]);
    }
    let (result, _) = cluster
        .try_join("stale", Some(Keyring::new(old_key.clone())))
        .await;
    assert_refused(result, Some(old_key.id()), Some(new_key.id()));
    let (late, _) = cluster
        .join("late", Some(Keyring::new(new_key.clone())))
        .await;
    members.push(late);
    agree(&members).await;
    for node in members {
        node.leave().await;
    }
}

/// A process on a member's IP connects first in the name of a member about to join, with a
/// well-formed hello, and holds the connection: without the key it cannot prove it, so the
/// mesh never registers the connection, and the real member connects and joins beside it.
/// (Without a key the mesh takes such a hello at its word: the residual the guide names.)
async fn a_squatter_cannot_hold_a_members_connection(kind: Kind) {
    assert!(matches!(kind, Kind::Tcp), "an attack on the TCP mesh");
    let mut cluster = Cluster::new(kind, "squatter");
    let ring = Keyring::new(key(8));
    let (first, _) = cluster.join("m0", Some(ring.clone())).await;
    let seed = first.member_id().addr();
    // The second member's address is known (it is in the seed list, say) before it starts.
    let mesh = TcpMesh::loopback([seed]).unwrap();
    let claimed = conclave::api::Transport::local_addr(&mesh);
    let cluster_id = conclave::api::wire::ClusterId::from_name(&cluster.name);
    let mut squatters = Vec::new();
    for hello in [
        sealed_hello(claimed, cluster_id, ring.primary()),
        conclave_tests::attacker::hello(claimed),
    ] {
        let mut squatter = std::net::TcpStream::connect(seed).unwrap();
        squatter.write_all(&hello).unwrap();
        squatters.push(squatter);
    }
    // The squatter that spoke first waits for the mesh's hello: its connection is up.
    let mut greeting = [0u8; 9];
    squatters[0].read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting[4..], b"CNCL\x02");

    let second = Node::builder(&cluster.name)
        .name("m1")
        .transport(Tap::new(mesh))
        .config(EndpointConfig::local())
        .founding(conclave::Founding::Alone)
        .join_timeout(WAIT)
        .keyring(ring.clone())
        .join();
    let second = within(WAIT, "join beside the squatter", second)
        .await
        .unwrap();
    agree_refs(&[&first, &second]).await;
    let guard = second.mutex("squatted").unwrap().lock().await.unwrap();
    assert!(matches!(
        first.mutex("squatted").unwrap().try_lock().await,
        Err(LockError::WouldBlock)
    ));
    guard.unlock().await.unwrap();
    drop(squatters);
    second.leave().await;
    first.leave().await;
}

fn run<F: std::future::Future<Output = ()>>(test: &str, scenario: F) {
    smol::block_on(within(Duration::from_secs(120), test, scenario));
}

macro_rules! security {
    ($($kind:ident => $variant:ident $([$($only:ident),*])?),*) => {
        mod security {
            $(
                mod $kind {
                    security!(@attacks $variant: outsider_without_key_cannot_join,
                        wrong_key_cannot_join, keyed_member_cannot_join_an_open_cluster,
                        forged_unlocks_are_dropped, replayed_grants_and_unlocks_are_dropped,
                        keys_rotate_while_locks_are_taken);
                    $(security!(@attacks $variant: $($only),*);)?
                }
            )*
        }
    };
    (@attacks $variant:ident: $($attack:ident),*) => {
        $(
            #[test]
            fn $attack() {
                super::super::run(stringify!($attack), super::super::$attack(super::super::Kind::$variant));
            }
        )*
    };
}

// The attacks every transport meets, then (in brackets) those of one transport alone.
security!(udp => Udp, tcp => Tcp [a_squatter_cannot_hold_a_members_connection]);
