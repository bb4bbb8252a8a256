//! Meshes talking to meshes on loopback: datagrams, discovery, simultaneous connects, restarts,
//! backoff, close and cancel safety. Every wait is bounded.

mod common;

use std::collections::HashSet;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use async_io::{block_on, Timer};
use conclave_lock_api::Transport;
use conclave_tcp::{TcpConfig, TcpMesh};

use common::{closed_port, eventually, frames, read_until_closed, run, within, Pump, LIMIT};

#[test]
fn mesh_is_send_sync_and_debug() {
    fn check<T: Send + Sync + std::fmt::Debug + 'static>() {}
    check::<TcpMesh>();
    check::<conclave_tcp::TcpStats>();
    check::<conclave_tcp::TcpConfigError>();
    let mesh = TcpMesh::loopback([]).unwrap();
    assert!(format!("{mesh:?}").contains("TcpMesh"));
}

#[test]
fn datagrams_flow_both_ways_with_the_senders_listen_address() {
    let a = Pump::loopback(&[]);
    let b = Pump::loopback(&[]);
    assert!(a.addr().ip().is_loopback());
    assert_ne!(a.addr().port(), 0, "local_addr has the real port");
    assert_eq!(a.mesh.max_datagram_size(), 65_535);

    a.send(b.addr(), b"a to b");
    let got = b.recv(LIMIT).expect("b received");
    assert_eq!((got.from, &got.bytes[..]), (a.addr(), &b"a to b"[..]));

    b.send(a.addr(), b"b to a");
    let got = a.recv(LIMIT).expect("a received");
    assert_eq!((got.from, &got.bytes[..]), (b.addr(), &b"b to a"[..]));

    // Every size up to the limit arrives whole and in order on one connection.
    let sizes = [0, 1, 1000, 20_000, 65_535];
    for (i, size) in sizes.iter().enumerate() {
        a.send(b.addr(), &vec![i as u8; *size]);
    }
    for (i, size) in sizes.iter().enumerate() {
        let got = b.recv(LIMIT).expect("frame");
        assert_eq!(got.bytes, vec![i as u8; *size]);
        assert_eq!(got.from, a.addr());
    }

    let too_big = vec![0; 65_536];
    let error = a.mesh.send_to(b.addr(), &too_big).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidInput);

    assert!(eventually(LIMIT, || {
        let (sa, sb) = (a.stats(), b.stats());
        sa.connections == 1 && sb.connections == 1 && sa.peers == 1 && sb.peers == 1
    }));
}

#[test]
fn a_frame_to_ourselves_comes_back() {
    let a = Pump::loopback(&[]);
    a.send(a.addr(), b"me");
    let got = a.recv(LIMIT).expect("own frame");
    assert_eq!((got.from, &got.bytes[..]), (a.addr(), &b"me"[..]));
    assert_eq!(a.stats().connections, 0);
}

#[test]
fn discovery_reaches_seeds_then_known_members() {
    let a = Pump::loopback(&[]);
    let c = Pump::loopback(&[a.addr()]);
    c.discover(b"ping from c");
    let got = a.recv(LIMIT).expect("the seed heard c");
    assert_eq!((got.from, &got.bytes[..]), (c.addr(), &b"ping from c"[..]));

    a.send(c.addr(), b"view");
    assert_eq!(c.recv(LIMIT).expect("c heard a").bytes, b"view");
    a.discover(b"announce from a");
    let got = c.recv(LIMIT).expect("a's discovery reached c");
    assert_eq!(
        (got.from, &got.bytes[..]),
        (a.addr(), &b"announce from a"[..])
    );

    // Our own address among the seeds is skipped.
    let own = closed_port();
    let e = Pump::bind(&TcpConfig {
        bind: own,
        seeds: vec![own, a.addr()],
        ..TcpConfig::loopback()
    });
    let before = e.stats().frames_sent;
    e.discover(b"ping from e");
    assert_eq!(a.recv(LIMIT).expect("a heard e").from, e.addr());
    assert_eq!(
        e.stats().frames_sent - before,
        1,
        "one frame: to a, not to ourselves"
    );
    assert!(
        e.recv(Duration::from_millis(200)).is_none(),
        "no discovery to ourselves"
    );
}

/// Receives until every payload of `expected` arrived; fails on a duplicate or a foreign
/// payload, or if `LIMIT` passes.
fn collect(
    pump: &Pump,
    from: SocketAddr,
    expected: &HashSet<Vec<u8>>,
    seen: &mut HashSet<Vec<u8>>,
) {
    let deadline = Instant::now() + LIMIT;
    while !expected.is_subset(seen) {
        let left = deadline.saturating_duration_since(Instant::now());
        let got = pump.recv(left).unwrap_or_else(|| {
            let missing = expected.difference(seen).count();
            panic!("{missing} frames never arrived")
        });
        assert_eq!(got.from, from);
        assert!(
            seen.insert(got.bytes.clone()),
            "delivered twice: {:?}",
            String::from_utf8_lossy(&got.bytes)
        );
    }
}

#[test]
fn simultaneous_connects_leave_one_connection_and_lose_nothing() {
    let mut resolved = 0;
    for round in 0..12 {
        let (a, b) = if round % 2 == 0 {
            // Both dial before either mesh runs: each has an outbound and an inbound
            // connection to the other when it starts.
            let a = TcpMesh::loopback([]).unwrap();
            let b = TcpMesh::loopback([]).unwrap();
            a.send_to(b.local_addr(), format!("{round} a 0").as_bytes())
                .unwrap();
            b.send_to(a.local_addr(), format!("{round} b 0").as_bytes())
                .unwrap();
            (Pump::new(a), Pump::new(b))
        } else {
            // Both running; the sends race.
            let a = Pump::loopback(&[]);
            let b = Pump::loopback(&[]);
            a.send(b.addr(), format!("{round} a 0").as_bytes());
            b.send(a.addr(), format!("{round} b 0").as_bytes());
            (a, b)
        };
        let mut next = 1;
        let mut to_b = HashSet::from([format!("{round} a 0").into_bytes()]);
        let mut to_a = HashSet::from([format!("{round} b 0").into_bytes()]);
        // Keep sending both ways until each side has exactly one connection to the other.
        let converged = eventually(LIMIT, || {
            let (sa, sb) = (a.stats(), b.stats());
            if sa.connections == 1 && sb.connections == 1 && sa.peers == 1 && sb.peers == 1 {
                return true;
            }
            a.send(b.addr(), format!("{round} a {next}").as_bytes());
            b.send(a.addr(), format!("{round} b {next}").as_bytes());
            to_b.insert(format!("{round} a {next}").into_bytes());
            to_a.insert(format!("{round} b {next}").into_bytes());
            next += 1;
            false
        });
        assert!(
            converged,
            "round {round}: one connection each: {:?} {:?}",
            a.stats(),
            b.stats()
        );
        // From here on every frame arrives, exactly once.
        let (mut seen_a, mut seen_b) = (HashSet::new(), HashSet::new());
        let first_after = next;
        for i in first_after..first_after + 50 {
            a.send(b.addr(), format!("{round} a {i}").as_bytes());
            b.send(a.addr(), format!("{round} b {i}").as_bytes());
        }
        let after_b: HashSet<Vec<u8>> = (first_after..first_after + 50)
            .map(|i| format!("{round} a {i}").into_bytes())
            .collect();
        let after_a: HashSet<Vec<u8>> = (first_after..first_after + 50)
            .map(|i| format!("{round} b {i}").into_bytes())
            .collect();
        collect(&b, a.addr(), &after_b, &mut seen_b);
        collect(&a, b.addr(), &after_a, &mut seen_a);
        // Nothing was lost while the duplicates were resolved either: the frames sent during
        // resolution (on either connection) all arrive too.
        collect(&b, a.addr(), &to_b, &mut seen_b);
        collect(&a, b.addr(), &to_a, &mut seen_a);
        resolved += a.stats().duplicates_resolved + b.stats().duplicates_resolved;
        assert_eq!(a.stats().violations + b.stats().violations, 0);
    }
    assert!(
        resolved > 0,
        "the forced rounds produced duplicates to resolve"
    );
}

#[test]
fn a_restarted_peer_is_reached_again() {
    let a = Pump::loopback(&[]);
    let b = Pump::loopback(&[]);
    let b_addr = b.addr();
    a.send(b_addr, b"first life");
    assert_eq!(b.recv(LIMIT).expect("first life").bytes, b"first life");
    b.close();

    let b = Pump::bind(&TcpConfig {
        bind: b_addr,
        ..TcpConfig::loopback()
    });
    // Retry as the protocol would until the new member hears us.
    let deadline = Instant::now() + LIMIT;
    let mut reached = false;
    for i in 0..500 {
        if Instant::now() >= deadline {
            break;
        }
        a.send(b_addr, format!("second life {i}").as_bytes());
        if let Some(got) = b.recv(Duration::from_millis(20)) {
            assert_eq!(got.from, a.addr());
            assert!(got.bytes.starts_with(b"second life"));
            reached = true;
            break;
        }
    }
    assert!(reached, "the restarted member was reached: {:?}", a.stats());
    // And it answers over the new connection.
    b.send(a.addr(), b"back");
    let got = a.recv(LIMIT).expect("answer");
    assert_eq!((got.from, &got.bytes[..]), (b_addr, &b"back"[..]));
}

/// A member unreachable for long (its listener closed, every dial refused) is dialled again
/// promptly once it is back: the backoff stops growing at `reconnect_backoff_max` (1 s by
/// default), so a sender that keeps sending, as the protocol's heartbeats do, reaches it
/// within about that long, not after the multi-second waits an uncapped doubling reaches.
#[test]
fn a_member_back_after_a_long_absence_is_reached_within_the_backoff_cap() {
    /// The stated bound: the default cap, plus a connect and a loaded machine's slack.
    const BOUND: Duration = Duration::from_millis(1500);
    let a = Pump::loopback(&[]);
    let b = Pump::loopback(&[]);
    let b_addr = b.addr();
    a.send(b_addr, b"first life");
    assert_eq!(b.recv(LIMIT).expect("first life").bytes, b"first life");
    b.close();
    // Long enough for an uncapped doubling from 50 ms to pass 3 s between attempts.
    let away = Instant::now() + Duration::from_millis(3500);
    while Instant::now() < away {
        a.send(b_addr, b"anyone?");
        // Pacing only: a heartbeat every 20 ms.
        block_on(Timer::after(Duration::from_millis(20)));
    }
    assert!(a.stats().connect_attempts >= 5, "{:?}", a.stats());
    let b = Pump::bind(&TcpConfig {
        bind: b_addr,
        ..TcpConfig::loopback()
    });
    let back = Instant::now();
    let reached = loop {
        a.send(b_addr, b"back?");
        if let Some(got) = b.recv(Duration::from_millis(20)) {
            assert_eq!(got.from, a.addr());
            break back.elapsed();
        }
        assert!(back.elapsed() < LIMIT, "never reached: {:?}", a.stats());
    };
    assert!(
        reached <= BOUND,
        "reached {reached:?} after it was back: {:?}",
        a.stats()
    );
}

#[test]
fn a_peer_that_restarts_unnoticed_replaces_its_old_connection() {
    // The old incarnation vanishes without a FIN being processed by `a` first: the new
    // incarnation's hello (another instance id) replaces the old connection.
    let a = Pump::loopback(&[]);
    let b = TcpMesh::loopback([]).unwrap();
    let b_addr = b.local_addr();
    let b = Pump::new(b);
    b.send(a.addr(), b"old");
    assert_eq!(a.recv(LIMIT).expect("old").bytes, b"old");
    drop(b);
    let b = Pump::bind(&TcpConfig {
        bind: b_addr,
        ..TcpConfig::loopback()
    });
    b.send(a.addr(), b"new");
    let got = a.recv(LIMIT).expect("new incarnation heard");
    assert_eq!((got.from, &got.bytes[..]), (b_addr, &b"new"[..]));
    a.send(b_addr, b"hello again");
    assert_eq!(b.recv(LIMIT).expect("reply").bytes, b"hello again");
}

#[test]
fn sending_to_a_closed_port_backs_off() {
    let a = Pump::loopback(&[]);
    let nobody = closed_port();
    let sends = 100;
    for _ in 0..sends {
        a.send(nobody, b"anyone?");
        // Pacing only: about half a second of sends at a steady rate.
        block_on(Timer::after(Duration::from_millis(5)));
    }
    let stats = a.stats();
    assert!(stats.connect_attempts >= 1, "{stats:?}");
    // 50 ms doubling: a handful of attempts, not one per send.
    assert!(
        stats.connect_attempts <= 12,
        "attempts bounded by the backoff: {stats:?}"
    );
    assert!(
        stats.dropped_unreachable >= sends - 12 - stats.connect_attempts,
        "{stats:?}"
    );
    assert_eq!(
        stats.frames_sent + stats.dropped_unreachable,
        sends,
        "{stats:?}"
    );
}

#[test]
fn close_flushes_queued_frames_then_sends_eof() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = listener.local_addr().unwrap();
    let (accepted, incoming) = mpsc::channel();
    thread::spawn(move || {
        let _ = accepted.send(listener.accept().map(|(stream, _)| stream));
    });

    let a = TcpMesh::loopback([]).unwrap();
    // Nothing drives `a` yet, so the connect is pending and the frame waits in the queue.
    a.send_to(peer, b"last words").unwrap();
    assert!(a.stats().queued_bytes > 0, "{:?}", a.stats());
    run(LIMIT, "close", a.close());

    let mut stream = incoming.recv_timeout(LIMIT).expect("accepted").unwrap();
    let bytes = read_until_closed(&mut stream, LIMIT).expect("EOF after the frames");
    let got = frames(&bytes);
    assert_eq!(got.len(), 2, "hello and the frame: {got:?}");
    assert_eq!(&got[0][..5], b"CNCL\x01");
    assert_eq!(got[1], b"last words");
    assert_eq!(a.stats().dropped_in_flight, 0);

    let error = a.send_to(peer, b"too late").unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotConnected);
    let error = run(LIMIT, "recv", a.recv()).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotConnected);
}

#[test]
fn recv_is_cancel_safe() {
    let a = TcpMesh::loopback([]).unwrap();
    let b = Pump::loopback(&[]);
    let count = 40usize;
    for i in 0..count {
        b.send(a.local_addr(), &vec![i as u8; 60_000]);
    }
    // Poll `a.recv()` in very short slices, dropping it each time.
    let mut got = Vec::new();
    let deadline = Instant::now() + LIMIT;
    block_on(async {
        while got.len() < count && Instant::now() < deadline {
            if let Some(datagram) = within(Duration::from_micros(200), a.recv()).await {
                got.push(datagram.unwrap());
            }
        }
    });
    assert_eq!(got.len(), count, "all frames despite cancelled receives");
    for (i, datagram) in got.iter().enumerate() {
        assert_eq!(datagram.from, b.addr());
        assert_eq!(
            datagram.bytes,
            vec![i as u8; 60_000],
            "frame {i} whole and in order"
        );
    }
}

#[test]
fn two_concurrent_receivers_miss_no_wake_up() {
    // The trait promises one receiver at a time; a second must still not starve the first.
    let a = Arc::new(TcpMesh::loopback([]).unwrap());
    let b = Pump::loopback(&[]);
    let receivers: Vec<_> = (0..2)
        .map(|_| {
            let a = Arc::clone(&a);
            thread::spawn(move || block_on(within(LIMIT, a.recv())))
        })
        .collect();
    b.send(a.local_addr(), b"one");
    b.send(a.local_addr(), b"two");
    let mut got: Vec<Vec<u8>> = receivers
        .into_iter()
        .map(|r| {
            r.join()
                .unwrap()
                .expect("each receiver got a frame")
                .unwrap()
                .bytes
        })
        .collect();
    got.sort();
    assert_eq!(got, [b"one".to_vec(), b"two".to_vec()]);
}

#[test]
fn ipv6_loopback_meshes_talk() {
    let config = TcpConfig {
        bind: "[::1]:0".parse().unwrap(),
        ..TcpConfig::loopback()
    };
    let Ok(a) = TcpMesh::bind(&config) else {
        eprintln!("no IPv6 loopback here; skipped");
        return;
    };
    let a = Pump::new(a);
    let b = Pump::bind(&config);
    assert!(a.addr().is_ipv6());
    a.send(b.addr(), b"over v6");
    let got = b.recv(LIMIT).expect("v6 datagram");
    assert_eq!((got.from, &got.bytes[..]), (a.addr(), &b"over v6"[..]));
    b.send(a.addr(), b"back over v6");
    assert_eq!(a.recv(LIMIT).expect("reply").from, b.addr());
}
