//! The front end over real UDP sockets on loopback (multicast on 127.0.0.1, TTL 0) with
//! faults: seeded loss and duplication of received datagrams by a shim between the socket and
//! the protocol, and a reconciliation report large enough to need fragmentation.
//!
//! The loss seed is printed; set `CONCLAVE_LOSS_SEED` to replay a pattern of drops and
//! duplicates (the interleaving of threads is not replayed).

#![allow(clippy::unwrap_used)]

mod common;

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_io::Timer;
use async_trait::async_trait;
use common::{agree, within};
use conclave::api::wire;
use conclave::api::{Datagram, RequestId, Transport};
use conclave::faults::Faults;
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, FencingToken, LockError, LockStatus, Node};
use futures::future::join_all;

/// The bound on the longer waits of these tests.
const LONG: Duration = Duration::from_secs(90);

/// Received datagrams dropped, in percent.
const DROP_PERCENT: u64 = 15;
/// Received datagrams delivered twice, in percent.
const DUPLICATE_PERCENT: u64 = 8;

#[test]
fn locks_stay_exclusive_under_loss_and_duplication() {
    const NODES: usize = 3;
    const TASKS_PER_NODE: usize = 2;
    const ROUNDS: u64 = 25;
    let seed = std::env::var("CONCLAVE_LOSS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) * 0x9e37_79b9);
    println!("loss seed {seed} (replay the pattern with CONCLAVE_LOSS_SEED={seed})");
    let stats = Arc::new(LossStats::default());
    let mut config = EndpointConfig::local();
    // Loss must not look like a crash: a member is suspected only after 2 s of silence.
    config.gms.suspect_timeout = Duration::from_secs(2);
    config.reliable = conclave::ReliableConfig::local();

    smol::block_on(async {
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let transport = Lossy {
                inner: UdpMulticast::bind(&udp_config(0)).unwrap(),
                state: Mutex::new(LossState {
                    rng: seed.wrapping_add(i as u64),
                    again: None,
                }),
                stats: stats.clone(),
            };
            let node = within(
                LONG,
                "join",
                Node::builder(cluster_name("loss"))
                    .name(format!("lossy-{i}"))
                    .transport(transport)
                    .config(config.clone())
                    .founding(conclave::Founding::Alone)
                    .join(),
            )
            .await
            .unwrap();
            nodes.push(node);
        }
        agree(&nodes.iter().collect::<Vec<_>>()).await;

        let section = Arc::new(Section::default());
        let mut tasks = Vec::new();
        for node in &nodes {
            let mutex = node.mutex("counter").unwrap();
            for _ in 0..TASKS_PER_NODE {
                let (mutex, section) = (mutex.clone(), section.clone());
                tasks.push(smol::spawn(async move {
                    for round in 0..ROUNDS {
                        let guard = mutex.lock().await.map_err(|e| format!("lock: {e}"))?;
                        section.run(guard.fencing_token()).await;
                        if round % 2 == 0 {
                            drop(guard);
                        } else {
                            guard.unlock().await.map_err(|e| format!("unlock: {e}"))?;
                        }
                    }
                    Ok::<(), String>(())
                }));
            }
        }
        for task in tasks {
            within(LONG, "lock rounds", task).await.unwrap();
        }

        let total = ROUNDS * (NODES * TASKS_PER_NODE) as u64;
        let violations = section.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "exclusion violated: {violations:#?}");
        assert_eq!(section.counter.load(Ordering::SeqCst), total);
        let (received, dropped, duplicated) = (
            stats.received.load(Ordering::Relaxed),
            stats.dropped.load(Ordering::Relaxed),
            stats.duplicated.load(Ordering::Relaxed),
        );
        println!(
            "{total} critical sections; {received} datagrams received, \
             {dropped} dropped, {duplicated} duplicated"
        );
        assert!(dropped > 0 && duplicated > 0, "no faults were injected");
        join_all(nodes.into_iter().map(|n| within(LONG, "leave", n.leave()))).await;
    });
}

#[test]
fn a_new_grantor_rebuilds_thousands_of_holds_from_fragmented_reports() {
    const LOCKS: usize = 3_000;
    let faults = Faults::new();
    let udp = UdpConfig {
        max_datagram: 1400,
        ..udp_config(1)
    };
    let mut config = EndpointConfig::local();
    // The new grantor waits for every report (they are large) rather than rebuilding its
    // table from part of them; and bursts of thousands of requests must not look like a crash.
    config.locks.reconcile_timeout = Duration::from_secs(20);
    config.gms.suspect_timeout = Duration::from_millis(1500);

    smol::block_on(async {
        let mut nodes = Vec::new();
        for name in ["first", "second", "third", "fourth"] {
            let node = within(
                LONG,
                "join",
                Node::builder(cluster_name("fragments"))
                    .name(name)
                    .transport(faults.wrap(UdpMulticast::bind(&udp).unwrap()))
                    .config(config.clone())
                    .founding(conclave::Founding::Alone)
                    .join(),
            )
            .await
            .unwrap();
            nodes.push(node);
        }
        let view = agree(&nodes.iter().collect::<Vec<_>>()).await;
        // Roles by seniority: the coordinator (grantor) vanishes, the next becomes grantor and
        // must rebuild the table from the holder's report, which the checker then probes.
        let role = |rank: usize| {
            nodes
                .iter()
                .position(|n| n.member_id() == &view.members()[rank])
                .unwrap()
        };
        let (coordinator, successor, holder, checker) = (role(0), role(1), role(2), role(3));

        let mutexes: Vec<_> = (0..LOCKS)
            .map(|i| nodes[holder].mutex(format!("l-{i}")).unwrap())
            .collect();
        let mut guards: Vec<_> = within(
            LONG,
            "taking the locks",
            join_all(mutexes.iter().map(|m| m.lock())),
        )
        .await
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap();
        assert_eq!(nodes[holder].held_locks().len(), LOCKS);
        let report = report_len(&nodes[holder]);
        assert!(
            report > 20 * udp.max_datagram,
            "the holder's report ({report} bytes) would not need fragmentation"
        );

        faults.isolate(nodes[coordinator].member_id().addr());
        let survivors = [&nodes[successor], &nodes[holder], &nodes[checker]];
        let new_view = agree(&survivors).await;
        assert_eq!(new_view.coordinator(), nodes[successor].member_id());

        // The new grantor answers once it has rebuilt its table.
        let probe = nodes[checker].mutex("probe").unwrap();
        let deadline = Instant::now() + LONG;
        loop {
            match within(LONG, "probe", probe.try_lock()).await {
                Ok(guard) => {
                    within(LONG, "unlock probe", guard.unlock()).await.unwrap();
                    break;
                }
                Err(LockError::WouldBlock | LockError::Unavailable)
                    if Instant::now() < deadline =>
                {
                    Timer::after(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("the new grantor does not serve: {e}"),
            }
        }

        // Every one of the holds was rebuilt: nobody else can take any of them.
        let tries: Vec<_> = (0..LOCKS)
            .map(|i| nodes[checker].mutex(format!("l-{i}")).unwrap())
            .collect();
        let results = within(
            LONG,
            "probing the holds",
            join_all(tries.iter().map(|m| m.try_lock())),
        )
        .await;
        let wrong: Vec<String> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| !matches!(r, Err(LockError::WouldBlock)))
            .map(|(i, r)| format!("l-{i}: {:?}", r.as_ref().map(|g| g.fencing_token())))
            .take(10)
            .collect();
        assert!(wrong.is_empty(), "holds lost in the rebuild: {wrong:?}");
        drop(results);

        // The holder still holds them all (possibly suspended for a moment by the failover).
        let deadline = Instant::now() + LONG;
        while guards.iter().any(|g| g.status() == LockStatus::Suspended)
            && Instant::now() < deadline
        {
            Timer::after(Duration::from_millis(50)).await;
        }
        assert!(guards.iter().all(|g| g.status() == LockStatus::Held));
        assert_eq!(nodes[holder].held_locks().len(), LOCKS);

        // A released one is free again.
        let released = guards.swap_remove(7);
        assert_eq!(released.name().as_str(), "l-7");
        within(LONG, "unlock", released.unlock()).await.unwrap();
        let again = within(
            LONG,
            "relock",
            nodes[checker].mutex("l-7").unwrap().try_lock(),
        )
        .await
        .unwrap();
        assert!(again.fencing_token() > FencingToken(0));
        drop(again);

        drop(guards);
        join_all(nodes.into_iter().map(|n| within(LONG, "leave", n.leave()))).await;
    });
}

/// The encoded size of the reconciliation report `node` sends a new grantor for its holds.
fn report_len(node: &Node) -> usize {
    let held = node
        .held_locks()
        .into_iter()
        .enumerate()
        .map(|(i, h)| wire::ReportedHold {
            request: RequestId(i as u64),
            name: h.name,
            owner: h.owner,
            mode: h.mode,
            token: h.token,
            lease_ms: None,
        })
        .collect();
    let report = wire::Message::Lock(wire::LockMessage::LockInfoResponse {
        epoch: 1,
        held,
        pending: Vec::new(),
        releases: Vec::new(),
    });
    wire::encode_message(&report).unwrap().len()
}

/// The critical section of the loss test: a read-modify-write of a counter spread over an
/// await, watched for overlap and for fencing tokens that do not increase.
#[derive(Default)]
struct Section {
    counter: AtomicU64,
    inside: AtomicUsize,
    last_token: Mutex<Option<FencingToken>>,
    violations: Mutex<Vec<String>>,
}

impl Section {
    async fn run(&self, token: FencingToken) {
        let others = self.inside.fetch_add(1, Ordering::SeqCst);
        if others != 0 {
            self.violation(format!("{others} other owner(s) inside with token {token}"));
        }
        {
            let mut last = self.last_token.lock().unwrap();
            if last.is_some_and(|last| last >= token) {
                self.violation(format!("token {token} after {last:?}"));
            }
            *last = Some(token);
        }
        let seen = self.counter.load(Ordering::SeqCst);
        Timer::after(Duration::from_micros(200)).await;
        self.counter.store(seen + 1, Ordering::SeqCst);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }
}

/// A transport that drops a seeded share of the datagrams it receives and delivers another
/// share twice.
struct Lossy<T> {
    inner: T,
    state: Mutex<LossState>,
    stats: Arc<LossStats>,
}

struct LossState {
    rng: u64,
    /// A datagram to deliver again on the next receive.
    again: Option<Datagram>,
}

#[derive(Default)]
struct LossStats {
    received: AtomicU64,
    dropped: AtomicU64,
    duplicated: AtomicU64,
}

#[async_trait]
impl<T: Transport> Transport for Lossy<T> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }

    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.inner.send_to(to, bytes)
    }

    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        self.inner.send_discovery(bytes)
    }

    fn discovery_report(&self) -> Vec<conclave::api::DiscoveryReport> {
        self.inner.discovery_report()
    }

    async fn recv(&self) -> io::Result<Datagram> {
        if let Some(datagram) = self.state.lock().unwrap().again.take() {
            return Ok(datagram);
        }
        loop {
            let datagram = self.inner.recv().await?;
            self.stats.received.fetch_add(1, Ordering::Relaxed);
            let mut state = self.state.lock().unwrap();
            let roll = splitmix(&mut state.rng) % 100;
            if roll < DROP_PERCENT {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if roll < DROP_PERCENT + DUPLICATE_PERCENT {
                self.stats.duplicated.fetch_add(1, Ordering::Relaxed);
                state.again = Some(datagram.clone());
            }
            return Ok(datagram);
        }
    }
}

/// SplitMix64: a small, good enough generator for a fault pattern.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Loopback UDP with a discovery group and port of this test process and test `index` alone.
fn udp_config(index: u8) -> UdpConfig {
    let pid = std::process::id();
    UdpConfig {
        group: Ipv4Addr::new(239, 210 + index, (pid >> 8) as u8, pid as u8),
        port: 20_000 + (pid % 5_000) as u16 * 8 + 4 + u16::from(index),
        ..UdpConfig::loopback()
    }
}

fn cluster_name(test: &str) -> String {
    format!("conclave-udp-faults-{test}-{}", std::process::id())
}
