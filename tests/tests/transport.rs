//! The transport conformance suite: one set of scenarios of the `Transport` contract, written
//! once and run against every transport: `memory::<scenario>`, `udp::<scenario>`,
//! `tcp::<scenario>`.
//!
//! Everything stays on this host: the memory network has no sockets; UDP binds port 0 on
//! 127.0.0.1 and uses a multicast group of its own on interface 127.0.0.1 with TTL 0; the TCP
//! mesh listens on port 0 of 127.0.0.1. Every wait is bounded.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io::{self, ErrorKind};
use std::net::Ipv4Addr;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Wake, Waker};
use std::time::{Duration, Instant as StdInstant};

use async_io::{block_on, Timer};
use conclave::api::{Datagram, LockName, MemberId, Transport};
use conclave::memory::{MemoryNetwork, MemoryTransport};
use conclave::protocol::locking::LockRequest;
use conclave::protocol::{Destination, Endpoint, EndpointConfig, Instant};
use conclave::tcp::{TcpConfig, TcpMesh};
use conclave::udp::{UdpConfig, UdpMulticast};
use futures::future::{select, select_all, Either};

/// The bound on every wait that should succeed.
const LIMIT: Duration = Duration::from_secs(10);

/// The wait that shows nothing more arrives (a negative result needs a bound).
const QUIET: Duration = Duration::from_millis(300);

/// One kind of transport: how to make members of one network, and what the kind promises
/// where the contract leaves a choice.
trait Kind {
    /// The transport.
    type T: Transport;

    /// Binds `n` members that reach each other and share one discovery channel.
    fn bind(n: usize) -> Vec<Self::T>;

    /// Whether a burst to a member that does not read arrives entire (no bound, no loss).
    const LOSSLESS: bool;

    /// Checks the backend's own bound after a burst from `sender` (its statistics).
    fn assert_bounded(_sender: &Self::T) {}
}

/// The in-memory network of `conclave::memory`.
struct Memory;

impl Kind for Memory {
    type T = MemoryTransport;
    const LOSSLESS: bool = true;

    fn bind(n: usize) -> Vec<MemoryTransport> {
        let network = MemoryNetwork::new();
        (0..n).map(|_| network.transport()).collect()
    }
}

/// UDP: unicast on 127.0.0.1 port 0, multicast on interface 127.0.0.1 with TTL 0.
struct Udp;

impl Kind for Udp {
    type T = UdpMulticast;
    const LOSSLESS: bool = false;

    fn bind(n: usize) -> Vec<UdpMulticast> {
        // A group and port of this network alone, so parallel tests (and runs of other
        // checkouts on this host) do not hear each other. The group's port cannot be 0: every
        // member must know it.
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let network = NEXT.fetch_add(1, Ordering::Relaxed);
        let config = UdpConfig {
            group: Ipv4Addr::new(239, 255, 68, 1 + (network % 250) as u8),
            port: 30_000 + (std::process::id() % 10_000) as u16 + network * 3,
            ..UdpConfig::loopback()
        };
        assert!(config.bind.ip().is_loopback() && config.interface.is_loopback());
        assert_eq!((config.bind.port(), config.ttl), (0, 0));
        (0..n)
            .map(|_| UdpMulticast::bind(&config).expect("bind"))
            .collect()
    }
}

/// The TCP mesh, every member seeded with the first.
struct Tcp;

/// The per-member send queue of the TCP meshes of the suite: small, so a burst fills it.
const TCP_SEND_QUEUE: usize = 256 << 10;

impl Kind for Tcp {
    type T = TcpMesh;
    const LOSSLESS: bool = false;

    fn bind(n: usize) -> Vec<TcpMesh> {
        let mut members: Vec<TcpMesh> = Vec::new();
        for _ in 0..n {
            let config = TcpConfig {
                seeds: members
                    .first()
                    .map(Transport::local_addr)
                    .into_iter()
                    .collect(),
                send_queue_bytes: TCP_SEND_QUEUE,
                ..TcpConfig::loopback()
            };
            assert!(config.bind.ip().is_loopback() && config.bind.port() == 0);
            members.push(TcpMesh::bind(&config).expect("bind"));
        }
        members
    }

    fn assert_bounded(sender: &TcpMesh) {
        let stats = sender.stats();
        assert!(stats.peak_queue_bytes <= TCP_SEND_QUEUE, "{stats:?}");
        assert!(
            stats.dropped_queue_full + stats.dropped_budget > 0,
            "the burst overflowed the queue, which dropped: {stats:?}"
        );
    }
}

/// Members of one network, and the datagrams received while waiting for another member.
struct Net<T> {
    nodes: Vec<Arc<T>>,
    /// Datagrams a member received while the test waited on another one.
    stash: RefCell<Vec<VecDeque<Datagram>>>,
    /// Members whose receive failed (closed): no longer driven.
    dead: RefCell<Vec<bool>>,
}

impl<T: Transport> Net<T> {
    /// `n` members that have exchanged a datagram with each other: every connection a
    /// backend needs is up.
    fn connected<K: Kind<T = T>>(n: usize) -> Self {
        let net = Net {
            nodes: K::bind(n).into_iter().map(Arc::new).collect(),
            stash: RefCell::new(vec![VecDeque::new(); n]),
            dead: RefCell::new(vec![false; n]),
        };
        for (i, from) in net.nodes.iter().enumerate() {
            for (j, to) in net.nodes.iter().enumerate() {
                if i != j {
                    from.send_to(to.local_addr(), b"warm-up").expect("send");
                }
            }
        }
        block_on(async {
            for who in 0..n {
                for _ in 1..n {
                    let got = net.recv(who, LIMIT).await.expect("warm-up").expect("recv");
                    assert_eq!(got.bytes, b"warm-up");
                }
            }
        });
        net
    }

    fn addr(&self, who: usize) -> std::net::SocketAddr {
        self.nodes[who].local_addr()
    }

    /// The next datagram of member `who` within `limit` (`None` if none came), while every
    /// other member is driven too (a mesh connects and flushes inside its receive); what they
    /// receive meanwhile is kept for them.
    async fn recv(&self, who: usize, limit: Duration) -> Option<io::Result<Datagram>> {
        if let Some(datagram) = self.stash.borrow_mut()[who].pop_front() {
            return Some(Ok(datagram));
        }
        let others = async {
            loop {
                let live: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| i != who && !self.dead.borrow()[i])
                    .collect();
                if live.is_empty() {
                    futures::future::pending::<()>().await;
                }
                let receives = live.into_iter().map(|i| {
                    Box::pin(async move { (i, self.nodes[i].recv().await) })
                        as Pin<Box<dyn Future<Output = (usize, io::Result<Datagram>)> + '_>>
                });
                let ((i, result), _, _) = select_all(receives).await;
                match result {
                    Ok(datagram) => self.stash.borrow_mut()[i].push_back(datagram),
                    Err(_) => self.dead.borrow_mut()[i] = true,
                }
            }
        };
        let own = self.nodes[who].recv();
        within(limit, async {
            match select(pin!(own), pin!(others)).await {
                Either::Left((result, _)) => result,
                Either::Right(((), _)) => unreachable!("the others' loop never ends"),
            }
        })
        .await
    }

    /// The next datagram of `who`; panics if none arrives within [`LIMIT`] or on an error.
    fn expect(&self, who: usize) -> Datagram {
        block_on(self.recv(who, LIMIT))
            .unwrap_or_else(|| panic!("member {who} received nothing within {LIMIT:?}"))
            .expect("recv")
    }

    /// Whether `who` receives nothing within [`QUIET`].
    fn quiet(&self, who: usize) -> bool {
        block_on(self.recv(who, QUIET)).is_none()
    }
}

/// `f`'s output, or `None` after `limit`.
async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> Option<T> {
    match select(pin!(f), pin!(Timer::after(limit))).await {
        Either::Left((value, _)) => Some(value),
        Either::Right(_) => None,
    }
}

/// A waker that reports its wake-ups on a channel.
struct Signal(std::sync::Mutex<mpsc::Sender<()>>);

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.0.lock().map(|sender| sender.send(()));
    }
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

/// A datagram sent to a member arrives whole, with the sender's address as `from`.
fn a_datagram_arrives_whole_with_its_sender<K: Kind>() {
    let net = Net::<K::T>::connected::<K>(2);
    let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    net.nodes[0].send_to(net.addr(1), &bytes).expect("send");
    let got = net.expect(1);
    assert_eq!(got.from, net.addr(0));
    assert_eq!(got.bytes, bytes);
    net.nodes[1].send_to(net.addr(0), b"back").expect("send");
    let got = net.expect(0);
    assert_eq!((got.from, &got.bytes[..]), (net.addr(1), &b"back"[..]));
}

/// A discovery datagram reaches every other member, not the sender.
fn discovery_reaches_everyone_but_the_sender<K: Kind>() {
    let net = Net::<K::T>::connected::<K>(3);
    net.nodes[0].send_discovery(b"who is there").expect("send");
    for who in [1, 2] {
        let got = net.expect(who);
        assert_eq!(
            (got.from, &got.bytes[..]),
            (net.addr(0), &b"who is there"[..])
        );
    }
    // The sender hears only what is sent to it afterwards, then nothing.
    net.nodes[1].send_to(net.addr(0), b"marker").expect("send");
    assert_eq!(net.expect(0).bytes, b"marker");
    assert!(net.quiet(0), "the sender heard its own discovery");
}

/// A receive dropped before it completes loses nothing: the next one returns the datagram.
fn no_datagram_lost_when_a_receive_is_dropped<K: Kind>() {
    let net = Net::<K::T>::connected::<K>(2);
    let receiver = &net.nodes[1];

    // Polled once (nothing waiting), then two datagrams arrive and wake it; it is dropped
    // without being polled again.
    let (tx, woken) = mpsc::channel();
    let waker = Waker::from(Arc::new(Signal(std::sync::Mutex::new(tx))));
    {
        let mut recv = receiver.recv();
        assert!(recv
            .as_mut()
            .poll(&mut Context::from_waker(&waker))
            .is_pending());
        net.nodes[0].send_to(net.addr(1), b"first").expect("send");
        net.nodes[0].send_to(net.addr(1), b"second").expect("send");
        woken
            .recv_timeout(LIMIT)
            .expect("the pending receive is woken by the datagrams");
    }
    let got = net.expect(1);
    assert_eq!((got.from, &got.bytes[..]), (net.addr(0), &b"first"[..]));
    assert_eq!(net.expect(1).bytes, b"second");

    // Dropped while bounded by a timer that fires first: still nothing lost.
    assert!(block_on(within(Duration::from_millis(1), receiver.recv())).is_none());
    net.nodes[0].send_to(net.addr(1), b"third").expect("send");
    assert_eq!(net.expect(1).bytes, b"third");
}

/// A datagram of exactly `max_datagram_size` arrives whole; every backend refuses a larger
/// one with `InvalidInput`, and nothing of it arrives.
fn the_size_limit_is_kept<K: Kind>() {
    let net = Net::<K::T>::connected::<K>(2);
    let max = net.nodes[0].max_datagram_size();
    assert!(max >= 512, "max_datagram_size {max} is implausibly small");
    let largest: Vec<u8> = (0..max).map(|i| (i % 251) as u8).collect();
    net.nodes[0].send_to(net.addr(1), &largest).expect("send");
    let got = net.expect(1);
    assert_eq!(got.bytes.len(), max);
    assert!(got.bytes == largest, "the largest datagram arrived altered");

    let too_large = vec![7u8; max + 1];
    let error = net.nodes[0]
        .send_to(net.addr(1), &too_large)
        .expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let error = net.nodes[0]
        .send_discovery(&too_large)
        .expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    net.nodes[0].send_to(net.addr(1), b"after").expect("send");
    assert_eq!(net.expect(1).bytes, b"after", "nothing of the refused one");
}

/// `BlockingRecv::interrupt` makes a blocking receive without a timeout return promptly, and
/// a blocking receive gets datagrams; skipped for transports without one.
fn interrupt_ends_a_blocking_receive<K: Kind>() {
    let net = Net::<K::T>::connected::<K>(2);
    if net.nodes[1].blocking().is_none() {
        eprintln!("skipped: this transport has no blocking receive");
        return;
    }
    let receiver = Arc::clone(&net.nodes[1]);
    let (tx, done) = mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let blocking = receiver.blocking().expect("blocking");
        // Without a limit: only the interrupt (or a spurious wake-up) ends it.
        let _ = tx.send(blocking.recv_blocking(None).map(|d| d.map(|d| d.bytes)));
    });
    net.nodes[1].blocking().expect("blocking").interrupt();
    let result = done
        .recv_timeout(LIMIT)
        .expect("the interrupt ended the blocking receive");
    assert_eq!(result.expect("no error"), None, "nothing was sent");
    waiter.join().expect("thread");

    // A datagram sent meanwhile comes out of a blocking receive.
    net.nodes[0]
        .send_to(net.addr(1), b"blocking")
        .expect("send");
    let blocking = net.nodes[1].blocking().expect("blocking");
    let deadline = StdInstant::now() + LIMIT;
    let mut got = None;
    while got.is_none() && StdInstant::now() < deadline {
        // The sender's own driving is not needed: the connection is up, the frame written.
        got = blocking
            .recv_blocking(Some(Duration::from_millis(100)))
            .expect("recv_blocking");
    }
    let got = got.expect("the datagram arrived through the blocking receive");
    assert_eq!((got.from, &got.bytes[..]), (net.addr(0), &b"blocking"[..]));
}

/// After `close`, sends fail or are dropped, a pending receive ends and later ones fail.
fn close_ends_receives_and_sends<K: Kind>() {
    let net = Net::<K::T>::connected::<K>(2);
    let closing = &net.nodes[0];
    block_on(async {
        let pending = async {
            within(LIMIT, closing.recv())
                .await
                .expect("the pending receive ended")
        };
        // `join` polls the receive first: it is pending when `close` starts.
        let close = async {
            within(LIMIT, closing.close()).await.expect("close ended");
        };
        let (result, ()) = futures::future::join(pending, close).await;
        assert!(result.is_err(), "the pending receive ended with an error");
    });
    let later = block_on(within(LIMIT, closing.recv())).expect("a later receive ends");
    assert!(later.is_err());
    // A send fails, or is dropped: nothing arrives.
    if closing.send_to(net.addr(1), b"too late").is_ok() {
        assert!(net.quiet(1), "a send after close arrived");
    }
    if closing.send_discovery(b"too late").is_ok() {
        assert!(net.quiet(1), "a discovery after close arrived");
    }
}

/// A burst of 10,000 sends to a member that does not read never blocks: it completes at
/// once, every send either taken or dropped with `WouldBlock` (or counted), within the
/// backend's bound; the member then still receives whole datagrams.
fn a_burst_to_a_member_that_does_not_read_never_blocks<K: Kind>() {
    const BURST: usize = 10_000;
    const SIZE: usize = 4096;
    let net = Net::<K::T>::connected::<K>(2);
    let started = StdInstant::now();
    let mut dropped = 0;
    for i in 0..BURST {
        let mut bytes = vec![(i % 251) as u8; SIZE];
        bytes[..4].copy_from_slice(&(i as u32).to_be_bytes());
        match net.nodes[0].send_to(net.addr(1), &bytes) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::WouldBlock => dropped += 1,
            Err(error) => panic!("send {i} failed: {error}"),
        }
    }
    let took = started.elapsed();
    assert!(took < LIMIT, "the burst took {took:?}: a send blocked");
    K::assert_bounded(&net.nodes[0]);
    if K::LOSSLESS {
        assert_eq!(dropped, 0);
    }
    let whole = |datagram: &Datagram| -> usize {
        assert_eq!(datagram.bytes.len(), SIZE);
        let i = u32::from_be_bytes(datagram.bytes[..4].try_into().expect("4 bytes")) as usize;
        assert!(datagram.bytes[4..].iter().all(|&b| b == (i % 251) as u8));
        i
    };
    if K::LOSSLESS {
        for i in 0..BURST {
            assert_eq!(whole(&net.expect(1)), i, "in order, none lost");
        }
    } else {
        let first = whole(&net.expect(1));
        assert!(first < BURST);
    }
}

/// Whole protocol endpoints over the transport: three members of one cluster form one view
/// and grant a lock; a foreign cluster on the same discovery channel stays apart.
fn endpoints_form_a_view_grant_a_lock_and_ignore_a_foreign_cluster<K: Kind>() {
    let origin = StdInstant::now();
    let now = || Instant::from_duration(origin.elapsed());
    let transports = K::bind(4);
    let mut nodes: Vec<(Endpoint, K::T)> = transports
        .into_iter()
        .zip([
            ("orders", "a"),
            ("orders", "b"),
            ("orders", "c"),
            ("billing", "x"),
        ])
        .enumerate()
        .map(|(i, (transport, (cluster, name)))| {
            let id = MemberId::new(
                (i as u128 + 1) << 64 | u128::from(std::process::id()),
                name,
                transport.local_addr(),
            )
            .expect("valid member");
            let mut endpoint = Endpoint::new(
                cluster,
                id,
                EndpointConfig::local(),
                transport.max_datagram_size(),
            );
            endpoint.join(now());
            (endpoint, transport)
        })
        .collect();
    let formed = drive(&mut nodes, &now, |nodes| {
        let orders: Vec<_> = nodes[..3].iter().filter_map(|(e, _)| e.view()).collect();
        orders.len() == 3
            && orders.iter().all(|v| *v == orders[0] && v.len() == 3)
            && nodes[3].0.view().is_some()
    });
    assert!(formed, "the three members agree on a view within {LIMIT:?}");
    let billing = nodes[3].0.view().expect("view");
    assert_eq!(
        billing.len(),
        1,
        "the foreign cluster never joins: {billing}"
    );
    assert!(
        nodes[3].0.stats().dropped_foreign > 0,
        "its datagrams were dropped"
    );

    let request = nodes[1].0.lock(
        now(),
        LockRequest::exclusive(1, LockName::new("conformance").expect("name")),
    );
    let held = drive(&mut nodes, &now, |n| {
        n[1].0.lock_status(now(), request).is_some()
    });
    assert!(held, "the lock was granted within {LIMIT:?}");
    let holds = nodes[1].0.holds(now());
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].name.as_str(), "conformance");
}

/// Runs endpoints over their transports until `done` or [`LIMIT`]; returns whether done.
/// Each `recv` runs in 1 ms slices and is dropped between them (it is cancel-safe).
fn drive<T: Transport>(
    nodes: &mut [(Endpoint, T)],
    now: &impl Fn() -> Instant,
    mut done: impl FnMut(&[(Endpoint, T)]) -> bool,
) -> bool {
    let deadline = StdInstant::now() + LIMIT;
    block_on(async {
        while StdInstant::now() < deadline {
            for (endpoint, transport) in nodes.iter_mut() {
                while let Some(t) = endpoint.poll_transmit() {
                    // A failed send is lost; the protocol retransmits.
                    let _ = match t.destination {
                        Destination::Member(addr) => transport.send_to(addr, &t.bytes),
                        Destination::Discovery => transport.send_discovery(&t.bytes),
                    };
                }
                while endpoint.poll_event().is_some() {}
                while let Some(Ok(d)) = within(Duration::from_millis(1), transport.recv()).await {
                    endpoint.handle_datagram(now(), &d.bytes);
                }
                endpoint.handle_timeout(now());
            }
            if done(nodes) {
                return true;
            }
        }
        false
    })
}

// ---------------------------------------------------------------------------------------------
// Every scenario against every transport: `<transport>::<scenario>`.

/// A module `$module` with one test per scenario, run against `$kind`.
macro_rules! suite {
    ($module:ident, $kind:ty, [$($scenario:ident),* $(,)?]) => {
        mod $module {
            $(
                #[test]
                fn $scenario() {
                    super::$scenario::<$kind>();
                }
            )*
        }
    };
}

/// Instantiates every scenario for every transport.
macro_rules! suites {
    ($scenarios:tt) => {
        suite!(memory, super::Memory, $scenarios);
        suite!(udp, super::Udp, $scenarios);
        suite!(tcp, super::Tcp, $scenarios);
    };
}

suites!([
    a_datagram_arrives_whole_with_its_sender,
    discovery_reaches_everyone_but_the_sender,
    no_datagram_lost_when_a_receive_is_dropped,
    the_size_limit_is_kept,
    interrupt_ends_a_blocking_receive,
    close_ends_receives_and_sends,
    a_burst_to_a_member_that_does_not_read_never_blocks,
    endpoints_form_a_view_grant_a_lock_and_ignore_a_foreign_cluster,
]);
