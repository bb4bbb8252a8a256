//! Raw sockets playing broken, hostile or slow peers against a mesh on loopback: the mesh
//! closes what breaks the format, counts it, never blocks on a slow member, and keeps serving
//! the others. Every wait is bounded.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use conclave_tcp::TcpConfig;

use common::{eventually, frame, hello, read_until_closed, Pump, LIMIT};

/// A member claimed by raw clients (nobody listens there; the mesh never dials it here).
fn claimed() -> SocketAddr {
    "127.0.0.1:9".parse().expect("address")
}

/// Connects to `mesh`, writes `bytes`, and returns whether the mesh then closed the connection.
fn closed_after(mesh: SocketAddr, bytes: &[u8]) -> bool {
    let mut stream = TcpStream::connect(mesh).expect("connect");
    stream.write_all(bytes).expect("write");
    read_until_closed(&mut stream, LIMIT).is_some()
}

/// `b` reaches `a` and back: the mesh still serves well-behaved members.
fn still_serving(a: &Pump, b: &Pump, tag: &str) {
    b.send(a.addr(), tag.as_bytes());
    let got = a.recv(LIMIT).expect("a still receives");
    assert_eq!((got.from, &got.bytes[..]), (b.addr(), tag.as_bytes()));
    a.send(b.addr(), tag.as_bytes());
    assert_eq!(b.recv(LIMIT).expect("a still sends").bytes, tag.as_bytes());
}

#[test]
fn oversized_length_prefixes_close_only_that_connection() {
    let a = Pump::loopback(&[]);
    let b = Pump::loopback(&[]);
    still_serving(&a, &b, "before");

    // 4 GiB announced after a valid hello: closed without allocating it (the process lives).
    let mut bytes = hello(1, 42, claimed());
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    assert!(
        closed_after(a.addr(), &bytes),
        "closed after a 4 GiB prefix"
    );

    // One byte over max_frame after a valid hello.
    let mut bytes = hello(1, 43, claimed());
    bytes.extend_from_slice(&65_536u32.to_be_bytes());
    bytes.extend_from_slice(&[0; 100]);
    assert!(closed_after(a.addr(), &bytes), "closed after max_frame + 1");

    // 4 GiB announced as the very first frame.
    assert!(
        closed_after(a.addr(), &[0xff; 8]),
        "closed on a huge first frame"
    );

    assert!(
        eventually(LIMIT, || a.stats().violations == 3),
        "{:?}",
        a.stats()
    );
    still_serving(&a, &b, "after");
    // A frame of exactly max_frame is fine.
    b.send(a.addr(), &vec![7; 65_535]);
    assert_eq!(a.recv(LIMIT).expect("max frame").bytes.len(), 65_535);
    assert!(eventually(LIMIT, || a.stats().connections == 1));
}

#[test]
fn bad_handshakes_are_closed_and_counted() {
    let a = Pump::bind(&TcpConfig {
        handshake_timeout: Duration::from_millis(300),
        ..TcpConfig::loopback()
    });
    let b = Pump::loopback(&[]);

    // A hello-sized frame of garbage: bad magic.
    assert!(closed_after(a.addr(), &frame(&[b'x'; 20])));
    // Random bytes: "GET " reads as a length far above a hello's.
    assert!(closed_after(a.addr(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
    // A version we do not speak.
    assert!(closed_after(a.addr(), &hello(3, 44, claimed())));
    // A hello claiming to be the mesh itself.
    assert!(closed_after(a.addr(), &hello(1, 45, a.addr())));
    assert!(
        eventually(LIMIT, || a.stats().violations == 4),
        "{:?}",
        a.stats()
    );

    // Connect and hang up at once.
    drop(TcpStream::connect(a.addr()).expect("connect"));
    // Connect and never speak: closed at the handshake timeout.
    let mut silent = TcpStream::connect(a.addr()).expect("connect");
    let heard = read_until_closed(&mut silent, LIMIT).expect("closed by the handshake timeout");
    assert_eq!(&heard[4..8], b"CNCL", "the mesh greeted first");
    assert!(
        eventually(LIMIT, || a.stats().handshake_failures == 2),
        "{:?}",
        a.stats()
    );

    still_serving(&a, &b, "still here");
    assert!(
        eventually(LIMIT, || a.stats().connections == 1),
        "{:?}",
        a.stats()
    );
    assert_eq!(a.stats().violations, 4);
}

#[test]
fn a_slow_peer_never_blocks_sends_and_its_queue_stays_bounded() {
    let bound = 256 * 1024;
    let a = Pump::bind(&TcpConfig {
        send_queue_bytes: bound,
        ..TcpConfig::loopback()
    });
    let b = Pump::loopback(&[]);

    // A peer that greets, then never reads, until told to go.
    let slow = TcpListener::bind("127.0.0.1:0").unwrap();
    let slow_addr = slow.local_addr().unwrap();
    let (release, released) = mpsc::channel::<()>();
    let peer = thread::spawn(move || {
        let (mut stream, _) = slow.accept().expect("accept");
        stream.write_all(&hello(1, 46, slow_addr)).expect("hello");
        let _ = released.recv_timeout(LIMIT);
    });

    let frame = vec![0x5a; 60_000];
    for _ in 0..800 {
        // Each send completes promptly (bounded by `run`): never waits for the peer.
        a.send(slow_addr, &frame);
    }
    let stats = a.stats();
    assert!(
        stats.dropped_queue_full > 0,
        "frames dropped at the bound: {stats:?}"
    );
    assert!(
        stats.peak_queue_bytes <= bound,
        "queue within its bound: {stats:?}"
    );
    assert!(stats.queued_bytes <= bound, "{stats:?}");

    // Meanwhile everyone else is served.
    still_serving(&a, &b, "not stuck");

    release.send(()).unwrap();
    peer.join().unwrap();
}

#[test]
fn connections_beyond_the_limit_are_refused() {
    let a = Pump::bind(&TcpConfig {
        max_connections: 1,
        ..TcpConfig::loopback()
    });
    let b = Pump::loopback(&[]);
    // `b` dials: the one inbound connection allowed.
    still_serving(&a, &b, "the one allowed");
    let mut extra = TcpStream::connect(a.addr()).expect("connect");
    assert!(read_until_closed(&mut extra, LIMIT).is_some(), "refused");
    assert!(
        eventually(LIMIT, || a.stats().rejected == 1),
        "{:?}",
        a.stats()
    );
    // Our own dials are counted apart: one goes out ...
    let c = Pump::loopback(&[]);
    a.send(c.addr(), b"our dial");
    assert_eq!(c.recv(LIMIT).expect("a's one dial").from, a.addr());
    // ... and sends needing a second are dropped, not queued.
    a.send(common::closed_port(), b"no room");
    assert_eq!(a.stats().dropped_unreachable, 1);
    still_serving(&a, &b, "still the one");
    assert_eq!(a.stats().connections, 2, "{:?}", a.stats());
}

#[test]
fn inbound_connections_never_take_the_slots_of_our_dials() {
    let a = Pump::bind(&TcpConfig {
        max_connections: 2,
        ..TcpConfig::loopback()
    });
    let b = Pump::loopback(&[]);
    // Two peers fill every inbound slot with greeted, silent connections.
    let held: Vec<TcpStream> = (0..2u64)
        .map(|i| {
            let claimed = common::closed_port();
            let mut stream = TcpStream::connect(a.addr()).expect("connect");
            let mut bytes = hello(1, 100 + i, claimed);
            bytes.extend_from_slice(&frame(b"here"));
            stream.write_all(&bytes).expect("write");
            assert_eq!(a.recv(LIMIT).expect("greeted").from, claimed);
            stream
        })
        .collect();
    let mut extra = TcpStream::connect(a.addr()).expect("connect");
    assert!(
        read_until_closed(&mut extra, LIMIT).is_some(),
        "inbound full"
    );
    assert!(eventually(LIMIT, || a.stats().rejected == 1));

    // Our own dial still goes out, and the member answers on it.
    a.send(b.addr(), b"out");
    let got = b.recv(LIMIT).expect("a's dial was not refused");
    assert_eq!((got.from, &got.bytes[..]), (a.addr(), &b"out"[..]));
    b.send(a.addr(), b"in");
    assert_eq!(a.recv(LIMIT).expect("answer").bytes, b"in");
    assert_eq!(a.stats().dropped_unreachable, 0, "{:?}", a.stats());
    drop(held);
}

#[test]
fn idle_inbound_connections_are_closed_and_busy_ones_are_not() {
    let idle = Duration::from_millis(500);
    let a = Pump::bind(&TcpConfig {
        idle_timeout: idle,
        ..TcpConfig::loopback()
    });
    // An outbound connection, idle as long as the others: never reaped.
    let b = Pump::loopback(&[]);
    a.send(b.addr(), b"outbound");
    assert_eq!(b.recv(LIMIT).expect("outbound").bytes, b"outbound");

    let member = common::closed_port();
    let mut stream = TcpStream::connect(a.addr()).expect("connect");
    let mut bytes = hello(1, 9, member);
    bytes.extend_from_slice(&frame(b"first"));
    stream.write_all(&bytes).expect("write");
    assert_eq!(a.recv(LIMIT).expect("first").bytes, b"first");
    // Frames keep it open past the idle timeout (the sleeps only pace the frames).
    let mut last = Instant::now();
    for i in 0..8 {
        thread::sleep(idle / 5);
        last = Instant::now();
        stream
            .write_all(&frame(format!("beat {i}").as_bytes()))
            .expect("write");
        assert_eq!(
            a.recv(LIMIT).expect("beat").bytes,
            format!("beat {i}").as_bytes()
        );
    }
    assert_eq!(a.stats().idle_closed, 0, "{:?}", a.stats());
    // Silent, it is closed once idle.
    let heard = read_until_closed(&mut stream, LIMIT).expect("closed when idle");
    assert!(last.elapsed() >= idle, "closed after {:?}", last.elapsed());
    assert_eq!(
        common::frames(&heard).len(),
        1,
        "the mesh's hello, then FIN"
    );
    assert!(
        eventually(LIMIT, || a.stats().idle_closed == 1),
        "{:?}",
        a.stats()
    );

    // The outbound connection, idle since before the beats, is still there.
    let stats = a.stats();
    assert_eq!((stats.connections, stats.idle_closed), (1, 1), "{stats:?}");
    a.send(b.addr(), b"still here");
    assert_eq!(b.recv(LIMIT).expect("outbound").bytes, b"still here");
    assert_eq!(a.stats().connect_attempts, 1, "{:?}", a.stats());
}

#[test]
fn durations_beyond_an_hour_are_refused() {
    let long = Duration::from_secs(3601);
    let configs = [
        TcpConfig {
            connect_timeout: long,
            ..TcpConfig::loopback()
        },
        TcpConfig {
            reconnect_backoff_min: long,
            reconnect_backoff_max: long,
            ..TcpConfig::loopback()
        },
        TcpConfig {
            reconnect_backoff_max: long,
            ..TcpConfig::loopback()
        },
        TcpConfig {
            handshake_timeout: long,
            ..TcpConfig::loopback()
        },
        TcpConfig {
            idle_timeout: long,
            ..TcpConfig::loopback()
        },
        TcpConfig {
            close_timeout: Duration::MAX,
            ..TcpConfig::loopback()
        },
    ];
    for config in configs {
        let error = conclave_tcp::TcpMesh::bind(&config).expect_err("refused");
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidInput, "{config:?}");
    }
}
