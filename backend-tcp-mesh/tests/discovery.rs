//! The discovery report: what happened at each seed (unreachable, refused, silent, answered),
//! and bind errors that name the setting and the address.

mod common;

use std::io::{ErrorKind, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use conclave_lock_api::seal::{ClusterKey, Keyring};
use conclave_lock_api::wire::{ClusterId, Header};
use conclave_lock_api::{DiscoveryOutcome, DiscoveryPlace, Transport};
use conclave_tcp::{TcpConfig, TcpConfigError, TcpMesh};

use common::{closed_port, eventually, Pump, LIMIT};

/// A datagram of `cluster` as the protocol would send it: the wire header, then a body.
fn datagram(cluster: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Header::write(ClusterId(cluster), &mut out);
    out.extend_from_slice(b"discovery");
    out
}

/// What `pump` reports for `seed`.
fn outcome(pump: &Pump, seed: SocketAddr) -> DiscoveryOutcome {
    let report = pump.mesh.discovery_report();
    report
        .iter()
        .find(|r| r.place == DiscoveryPlace::Seed(seed))
        .unwrap_or_else(|| panic!("no report for {seed}: {report:?}"))
        .outcome
        .clone()
}

/// Sends discovery from `pump` until its report for `seed` satisfies `done` (its backoff
/// drops some of the sends); panics after [`LIMIT`].
fn discover_until(
    pump: &Pump,
    seed: SocketAddr,
    bytes: &[u8],
    done: impl Fn(&DiscoveryOutcome) -> bool,
) {
    let reached = eventually(LIMIT, || {
        pump.discover(bytes);
        std::thread::sleep(Duration::from_millis(20));
        done(&outcome(pump, seed))
    });
    assert!(reached, "seed {seed}: {:?}", outcome(pump, seed));
}

#[test]
fn one_report_per_seed_and_never_ourselves() {
    let nobody = closed_port();
    let mesh = TcpMesh::loopback([nobody]).expect("bind");
    let me = mesh.local_addr();
    drop(mesh);
    // A mesh at a fixed port that lists itself among its seeds.
    let mesh = TcpMesh::bind(&TcpConfig {
        bind: me,
        seeds: vec![me, nobody],
        ..TcpConfig::loopback()
    })
    .expect("bind");
    let report = mesh.discovery_report();
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0].place, DiscoveryPlace::Seed(nobody));
    assert_eq!(report[0].outcome, DiscoveryOutcome::NoAnswer, "never tried");
    assert!(TcpMesh::loopback([])
        .expect("bind")
        .discovery_report()
        .is_empty());
}

#[test]
fn a_seed_nobody_listens_on_is_unreachable_with_the_systems_error() {
    let nobody = closed_port();
    let a = Pump::loopback(&[nobody]);
    discover_until(&a, nobody, &datagram(1), |o| {
        matches!(o, DiscoveryOutcome::Unreachable(_))
    });
    let DiscoveryOutcome::Unreachable(why) = outcome(&a, nobody) else {
        unreachable!()
    };
    // The OS error text, as io::Error displays it: `Connection refused (os error 111)`.
    assert!(why.contains("os error"), "{why}");
    assert!(a.stats().connect_failures >= 1);
    a.close();
}

#[test]
fn a_seed_of_our_cluster_answers() {
    let b = Pump::loopback(&[]);
    let a = Pump::loopback(&[b.addr()]);
    let seed = b.addr();
    assert_eq!(outcome(&a, seed), DiscoveryOutcome::NoAnswer);
    a.discover(&datagram(1));
    let got = b.recv(LIMIT).expect("b hears a's discovery");
    // Connected, greeted, nothing of a cluster heard yet.
    assert_eq!(outcome(&a, seed), DiscoveryOutcome::NoAnswer);
    b.send(got.from, &datagram(1));
    assert!(a.recv(LIMIT).is_some(), "a hears b's answer");
    assert_eq!(outcome(&a, seed), DiscoveryOutcome::Answered);
    a.close();
    b.close();
}

/// A seed that is a member of another cluster: the mesh (without a key) connects and greets
/// it, since hellos name no cluster, so it reports `NoAnswer` while the seed stays silent,
/// and `Refused` once a frame of the other cluster comes from it.
#[test]
fn a_seed_of_another_cluster_is_silent_then_refused() {
    let b = Pump::loopback(&[]);
    let a = Pump::loopback(&[b.addr()]);
    let seed = b.addr();
    a.discover(&datagram(1));
    b.recv(LIMIT).expect("b hears a's discovery");
    assert_eq!(outcome(&a, seed), DiscoveryOutcome::NoAnswer);
    // b's own discovery goes to every member with a connection: a too.
    b.discover(&datagram(2));
    assert!(a.recv(LIMIT).is_some(), "a receives b's frame");
    let DiscoveryOutcome::Refused(why) = outcome(&a, seed) else {
        panic!("{:?}", outcome(&a, seed));
    };
    assert!(why.contains("another cluster"), "{why}");
    a.close();
    b.close();
}

#[test]
fn a_seed_with_another_key_is_refused() {
    let (ours, theirs) = (
        Keyring::new(ClusterKey::from_bytes([1; 32])),
        Keyring::new(ClusterKey::from_bytes([2; 32])),
    );
    let b = Pump::loopback(&[]);
    b.mesh.use_keyring(ClusterId(1), &theirs, [0; 16]);
    let a = Pump::loopback(&[b.addr()]);
    a.mesh.use_keyring(ClusterId(1), &ours, [0; 16]);
    discover_until(&a, b.addr(), b"sealed", |o| {
        matches!(o, DiscoveryOutcome::Refused(_))
    });
    let DiscoveryOutcome::Refused(why) = outcome(&a, b.addr()) else {
        unreachable!()
    };
    assert!(why.contains("key"), "{why}");
    // With the same key, the handshake alone is an answer of our cluster.
    let c = Pump::loopback(&[]);
    c.mesh.use_keyring(ClusterId(1), &ours, [0; 16]);
    let d = Pump::loopback(&[c.addr()]);
    d.mesh.use_keyring(ClusterId(1), &ours, [0; 16]);
    discover_until(&d, c.addr(), b"sealed", |o| {
        *o == DiscoveryOutcome::Answered
    });
    for pump in [a, b, c, d] {
        pump.close();
    }
}

#[test]
fn a_seed_that_is_not_a_mesh_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let seed = listener.local_addr().expect("addr");
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        // An HTTP server's greeting: a length prefix far beyond the limit.
        let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
        std::thread::sleep(Duration::from_millis(500));
    });
    let a = Pump::loopback(&[seed]);
    discover_until(&a, seed, &datagram(1), |o| {
        matches!(o, DiscoveryOutcome::Refused(_))
    });
    let DiscoveryOutcome::Refused(why) = outcome(&a, seed) else {
        unreachable!()
    };
    assert!(why.contains("Conclave TCP mesh"), "{why}");
    server.join().expect("server");
    a.close();
}

#[test]
fn bind_errors_name_the_setting_and_the_address() {
    let taken = TcpMesh::loopback([]).expect("bind");
    let addr = taken.local_addr();
    let error = TcpMesh::bind(&TcpConfig {
        bind: addr,
        ..TcpConfig::loopback()
    })
    .expect_err("the port is taken");
    assert_eq!(error.kind(), ErrorKind::AddrInUse);
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "binding the TCP listener (TcpConfig::bind) to {addr}: "
        )),
        "{text}"
    );
    assert!(text.contains("os error"), "{text}");

    // An unspecified address is never listened on: it would become the member's id.
    let error = TcpMesh::bind(&TcpConfig {
        bind: "0.0.0.0:0".parse().expect("addr"),
        ..TcpConfig::loopback()
    })
    .expect_err("unspecified");
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let inner = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<TcpConfigError>())
        .expect("a TcpConfigError inside");
    assert!(matches!(inner, TcpConfigError::UnspecifiedBind(_)));
    assert!(
        error.to_string().contains("TcpConfig::bind 0.0.0.0:0"),
        "{error}"
    );
}
