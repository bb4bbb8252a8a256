//! The mesh-wide budget of queued bytes (`TcpConfig::max_queued_bytes`): raw sockets that greet
//! and then stop reading play slow members; the total stays within the budget at every step,
//! frames beyond it are dropped and counted, and a closed or drained connection gives its
//! bytes back. Every wait is bounded.

mod common;

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use conclave_tcp::{TcpConfig, TcpConfigError, TcpMesh};

use common::{eventually, frames, hello, read_until_closed, Pump, LIMIT};

/// What a [`SlowPeer`] does once told.
enum Then {
    /// Reads everything until the mesh closes the connection.
    Drain,
    /// Closes its socket with the mesh's bytes unread (a reset).
    Close,
}

/// A member that accepts one connection, greets, then reads nothing until told what to do.
struct SlowPeer {
    addr: SocketAddr,
    tell: mpsc::Sender<Then>,
    /// The payloads it read (the mesh's hello first), if it was told to drain.
    thread: JoinHandle<Option<Vec<Vec<u8>>>>,
}

impl SlowPeer {
    fn start(instance: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tell, told) = mpsc::channel();
        let thread = thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            stream.write_all(&hello(1, instance, addr)).expect("hello");
            match told.recv_timeout(4 * LIMIT) {
                Ok(Then::Drain) => {
                    let bytes = read_until_closed(&mut stream, LIMIT).expect("closed in time");
                    Some(frames(&bytes))
                }
                Ok(Then::Close) | Err(_) => None,
            }
        });
        Self { addr, tell, thread }
    }

    /// Tells it what to do and waits until it is done (bounded: its reads are).
    fn then(self, what: Then) -> Option<Vec<Vec<u8>>> {
        self.tell.send(what).expect("peer thread alive");
        self.thread.join().expect("peer thread")
    }
}

fn budgeted(budget: usize) -> Pump {
    Pump::bind(&TcpConfig {
        max_queued_bytes: budget,
        ..TcpConfig::loopback()
    })
}

/// The largest payload, so the budget holds only a few frames.
fn max_frame() -> usize {
    TcpConfig::loopback().max_frame
}

#[test]
fn the_total_stays_within_the_budget_and_returns_to_zero() {
    let budget = 3 * max_frame();
    let a = budgeted(budget);
    let slow = [SlowPeer::start(61), SlowPeer::start(62)];
    let payload = vec![0x5a; max_frame()];

    let rounds = 400;
    let mut peak = 0;
    for _ in 0..rounds {
        for peer in &slow {
            // Bounded by `run`: a send completes at its first poll, never waiting for a peer.
            a.send(peer.addr, &payload);
            let stats = a.stats();
            assert!(stats.queued_bytes <= budget, "{stats:?}");
            peak = peak.max(stats.queued_bytes);
        }
    }
    let stats = a.stats();
    assert!(
        stats.dropped_budget > 0,
        "frames dropped at the budget: {stats:?}"
    );
    assert!(
        peak > max_frame(),
        "the budget was used: peak {peak}, {stats:?}"
    );
    // The per-member queues (4 MiB) never filled: the budget is what dropped frames.
    assert_eq!(stats.dropped_queue_full, 0, "{stats:?}");
    assert_eq!(stats.dropped_unreachable, 0, "{stats:?}");
    assert_eq!(
        stats.frames_sent + stats.dropped_budget,
        2 * rounds,
        "every frame sent or dropped: {stats:?}"
    );

    // Once the peers read, every queue drains and the total comes back to exactly zero.
    let (done, drained) = mpsc::channel();
    let readers: Vec<_> = slow
        .into_iter()
        .map(|peer| {
            let done = done.clone();
            thread::spawn(move || {
                let _ = done.send(peer.then(Then::Drain));
            })
        })
        .collect();
    assert!(
        eventually(LIMIT, || a.stats().queued_bytes == 0),
        "{:?}",
        a.stats()
    );
    let sent = a.stats().frames_sent;
    a.close();
    let mut delivered = 0;
    for _ in 0..2 {
        let got = drained
            .recv_timeout(LIMIT)
            .expect("peer done in time")
            .expect("peer drained");
        // The mesh's hello, then only whole, intact frames.
        assert!(got.len() > 1);
        assert!(got[1..].iter().all(|f| *f == payload));
        delivered += got.len() as u64 - 1;
    }
    for reader in readers {
        reader.join().expect("reader");
    }
    assert_eq!(delivered, sent, "no queued frame was lost or doubled");
}

#[test]
fn a_closed_slow_connection_gives_its_bytes_back() {
    let budget = 3 * max_frame();
    let a = budgeted(budget);
    let b = Pump::loopback(&[]);
    // Connected and greeted both ways before the budget is used up.
    a.send(b.addr(), b"warm up");
    assert_eq!(b.recv(LIMIT).expect("b receives").bytes, b"warm up");

    let slow = SlowPeer::start(63);
    let filler = vec![0x5a; max_frame()];
    let blocked = vec![0x01; max_frame()];
    // Fill the budget with frames to the slow peer until one is dropped, then check that a
    // frame to b is dropped as well: the budget is shared. (The kernel could take a little
    // more of the slow peer's queue in between; then try again.)
    let mut b_dropped = false;
    for _ in 0..1000 {
        let before = a.stats().dropped_budget;
        a.send(slow.addr, &filler);
        if a.stats().dropped_budget == before {
            continue;
        }
        a.send(b.addr(), &blocked);
        let stats = a.stats();
        assert!(stats.queued_bytes <= budget, "{stats:?}");
        if stats.dropped_budget == before + 2 {
            b_dropped = true;
            break;
        }
    }
    assert!(
        b_dropped,
        "the slow peer used up the budget: {:?}",
        a.stats()
    );
    assert!(a.stats().queued_bytes > 0);

    // The slow peer goes away with the bytes unread: its connection closes, and its queue
    // leaves the total.
    assert_eq!(slow.then(Then::Close), None);
    assert!(
        eventually(LIMIT, || a.stats().queued_bytes == 0),
        "{:?}",
        a.stats()
    );

    // A whole frame to b now fits and arrives.
    let dropped = a.stats().dropped_budget;
    let fits = vec![0x02; max_frame()];
    a.send(b.addr(), &fits);
    assert_eq!(a.stats().dropped_budget, dropped, "{:?}", a.stats());
    loop {
        // Skip any earlier frame to b that the budget let through after all.
        let got = b.recv(LIMIT).expect("b receives the frame in time");
        assert_eq!(got.from, a.addr());
        if got.bytes[0] == 0x02 {
            assert_eq!(got.bytes, fits);
            break;
        }
        assert_eq!(got.bytes, blocked);
    }
    a.close();
    b.close();
}

#[test]
fn a_budget_that_cannot_hold_a_frame_is_refused() {
    let config = TcpConfig {
        max_queued_bytes: max_frame(),
        ..TcpConfig::loopback()
    };
    assert!(matches!(
        config.validate(),
        Err(TcpConfigError::QueuedBytes { .. })
    ));
    let error = TcpMesh::bind(&config).expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let config = TcpConfig {
        max_queued_bytes: config.min_send_queue_bytes(),
        ..config
    };
    assert_eq!(config.validate(), Ok(()));
}
