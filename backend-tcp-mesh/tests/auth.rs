//! Meshes with a cluster key: a connection is trusted only once its peer proved the key over
//! the connection's two hellos. Peers without the key, with another key, or claiming a
//! member's address without being it are closed and counted, and never keep a member out.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use conclave_lock_api::seal::{ClusterKey, KeyId, Keyring, Notice};
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::Transport;
use conclave_tcp::TcpConfig;

use common::{eventually, frame, read_frames, read_until_closed, Pump, LIMIT};

const CLUSTER: ClusterId = ClusterId(0x0c0c_1a7e);

/// The sealing session every keyed member of these tests names in its notices.
const SESSION: [u8; 16] = [7; 16];

fn ring(byte: u8) -> Keyring {
    Keyring::new(ClusterKey::from_bytes([byte; 32]))
}

/// A mesh on loopback with `keys` (none: no key).
fn member(keys: Option<&Keyring>, config: &TcpConfig) -> Pump {
    let pump = Pump::bind(config);
    if let Some(keys) = keys {
        pump.mesh.use_keyring(CLUSTER, keys, SESSION);
    }
    pump
}

/// A version-2 hello as the crate documents it: a version-1 hello's fields, then the cluster
/// id, the key id and a 16-byte challenge.
fn sealed_hello(instance: u64, addr: SocketAddr, key: KeyId) -> Vec<u8> {
    let mut payload = b"CNCL".to_vec();
    payload.push(2);
    payload.extend_from_slice(&instance.to_be_bytes());
    let SocketAddr::V4(a) = addr else {
        panic!("IPv4 only here");
    };
    payload.push(4);
    payload.extend_from_slice(&a.ip().octets());
    payload.extend_from_slice(&a.port().to_be_bytes());
    payload.extend_from_slice(&CLUSTER.0.to_be_bytes());
    payload.extend_from_slice(&key.0.to_be_bytes());
    payload.extend_from_slice(&[0x5a; 16]);
    frame(&payload)
}

/// The next datagram `pump` receives, expected to be a rejection notice from `from`.
fn notice_from(pump: &Pump, from: SocketAddr, expected: Notice) {
    let got = pump
        .recv(LIMIT)
        .unwrap_or_else(|| panic!("a rejection notice: {:?}", pump.stats()));
    assert_eq!(got.from, from);
    assert_eq!(got.bytes, expected.encode(CLUSTER));
}

#[test]
fn a_keyed_pair_connects_and_carries_frames() {
    let keys = ring(1);
    let config = TcpConfig::loopback();
    let a = member(Some(&keys), &config);
    let b = member(Some(&keys), &config);
    for round in 0..3u8 {
        b.send(a.addr(), &[round; 100]);
        let got = a.recv(LIMIT).expect("a receives");
        assert_eq!((got.from, got.bytes), (b.addr(), vec![round; 100]));
        a.send(b.addr(), &[round; 7]);
        let got = b.recv(LIMIT).expect("b receives");
        assert_eq!((got.from, got.bytes), (a.addr(), vec![round; 7]));
    }
    // Frames sent before the handshake is over wait for it and arrive in order.
    let c = member(Some(&keys), &config);
    for i in 0..20u8 {
        c.send(a.addr(), &[i]);
    }
    for i in 0..20u8 {
        let got = a.recv(LIMIT).expect("queued frames");
        assert_eq!((got.from, got.bytes), (c.addr(), vec![i]));
    }
    for pump in [&a, &b, &c] {
        let stats = pump.stats();
        assert_eq!(stats.auth_failures, 0, "{stats:?}");
        assert_eq!(stats.violations, 0, "{stats:?}");
    }
    assert!(
        eventually(LIMIT, || a.stats().peers == 2),
        "{:?}",
        a.stats()
    );
    // A rotation: b moves to a new key both hold; new connections prove it.
    let new = ClusterKey::from_bytes([2; 32]);
    keys.install(new.clone()).unwrap();
    keys.use_key(new.id()).unwrap();
    let d = member(Some(&keys), &config);
    d.send(a.addr(), b"rotated");
    assert_eq!(a.recv(LIMIT).expect("after rotation").bytes, b"rotated");
    for pump in [a, b, c, d] {
        pump.close();
    }
}

#[test]
fn an_unkeyed_dialler_is_closed_and_counted_and_both_sides_hear_why() {
    let keys = ring(3);
    let config = TcpConfig::loopback();
    let a = member(Some(&keys), &config);
    let b = member(None, &config);
    b.send(a.addr(), b"let me in");
    // Each side refuses the other's hello, and tells its own member why.
    notice_from(
        &a,
        b.addr(),
        Notice {
            rejected: Some(keys.primary()),
            theirs: None,
            session: SESSION,
        },
    );
    notice_from(
        &b,
        a.addr(),
        Notice {
            rejected: None,
            theirs: Some(keys.primary()),
            session: [0; 16],
        },
    );
    assert!(eventually(LIMIT, || a.stats().auth_failures == 1));
    assert!(eventually(LIMIT, || b.stats().auth_failures == 1));
    assert_eq!(a.stats().frames_received, 0);
    assert!(eventually(LIMIT, || a.stats().connections == 0));
    // A raw version-1 hello is refused as well.
    let mut raw = TcpStream::connect(a.addr()).expect("connect");
    raw.write_all(&common::hello(1, 9, "127.0.0.1:9".parse().unwrap()))
        .expect("write");
    // Frames after it (within the 64 KiB a refused connection is read for) are read and
    // dropped until the peer's FIN: no reset.
    raw.write_all(&frame(&vec![7; 30_000])).expect("write");
    raw.shutdown(std::net::Shutdown::Write).expect("FIN");
    assert!(read_until_closed(&mut raw, LIMIT).is_some());
    assert!(eventually(LIMIT, || a.stats().auth_failures == 2));
    assert!(eventually(LIMIT, || a.stats().connections == 0));
    let stats = a.stats();
    assert_eq!(
        (stats.frames_received, stats.violations),
        (0, 0),
        "{stats:?}"
    );
    a.close();
    b.close();
}

#[test]
fn a_wrong_key_dialler_is_closed_and_counted() {
    let (ours, theirs) = (ring(4), ring(5));
    let config = TcpConfig::loopback();
    let a = member(Some(&ours), &config);
    let b = member(Some(&theirs), &config);
    b.send(a.addr(), b"let me in");
    notice_from(
        &a,
        b.addr(),
        Notice {
            rejected: Some(ours.primary()),
            theirs: Some(theirs.primary()),
            session: SESSION,
        },
    );
    notice_from(
        &b,
        a.addr(),
        Notice {
            rejected: Some(theirs.primary()),
            theirs: Some(ours.primary()),
            session: SESSION,
        },
    );
    assert!(eventually(LIMIT, || a.stats().auth_failures == 1
        && b.stats().auth_failures == 1));
    assert_eq!(a.stats().frames_received + b.stats().frames_received, 0);
    assert!(eventually(LIMIT, || a.stats().peers == 0 && b.stats().peers == 0));
    a.close();
    b.close();
}

#[test]
fn a_squatter_without_the_key_cannot_keep_a_member_out() {
    let keys = ring(6);
    let a = member(
        Some(&keys),
        &TcpConfig {
            handshake_timeout: Duration::from_secs(30),
            ..TcpConfig::loopback()
        },
    );
    let b = member(Some(&keys), &TcpConfig::loopback());

    // A process on b's IP connects first in b's name, with a valid hello, and stays.
    let mut squatter = TcpStream::connect(a.addr()).expect("connect");
    squatter
        .write_all(&sealed_hello(1, b.addr(), keys.primary()))
        .expect("write");
    let heard = read_frames(&mut squatter, 1, LIMIT).expect("a's hello");
    assert_eq!(&heard[0][..5], b"CNCL\x02");

    // b still gets through, and a hears from b, not from the squatter.
    b.send(a.addr(), b"the real b");
    let got = a.recv(Duration::from_secs(5)).expect("b connects");
    assert_eq!((got.from, got.bytes), (b.addr(), b"the real b".to_vec()));
    a.send(b.addr(), b"to the real b");
    assert_eq!(b.recv(LIMIT).expect("b hears a").bytes, b"to the real b");
    let stats = a.stats();
    assert_eq!((stats.connections, stats.peers), (2, 1), "{stats:?}");
    assert_eq!(stats.duplicates_refused + stats.replaced, 0, "{stats:?}");

    // A made-up proof closes the squatter at once.
    let mut forged = b"CNCA".to_vec();
    forged.extend_from_slice(&keys.primary().0.to_be_bytes());
    forged.extend_from_slice(&[0; 16]);
    squatter.write_all(&frame(&forged)).expect("write");
    assert!(read_until_closed(&mut squatter, LIMIT).is_some());
    assert!(eventually(LIMIT, || a.stats().auth_failures == 1));

    // One that says nothing more is closed at the handshake timeout (short here).
    let c = member(
        Some(&keys),
        &TcpConfig {
            handshake_timeout: Duration::from_millis(300),
            ..TcpConfig::loopback()
        },
    );
    let mut silent = TcpStream::connect(c.addr()).expect("connect");
    silent
        .write_all(&sealed_hello(2, b.addr(), keys.primary()))
        .expect("write");
    assert!(read_until_closed(&mut silent, LIMIT).is_some());
    assert!(eventually(LIMIT, || c.stats().auth_failures == 1));
    // Frames to b still flow.
    b.send(a.addr(), b"still here");
    assert_eq!(a.recv(LIMIT).expect("still").bytes, b"still here");
    for pump in [a, b, c] {
        pump.close();
    }
}
