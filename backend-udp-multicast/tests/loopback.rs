//! UDP-specific behaviour on loopback, multicast with TTL 0 on 127.0.0.1: group isolation,
//! the blocking receive's timeout, the discovery report and bind errors. The shared transport contract (datagrams, discovery,
//! cancel safety, size limit, interrupt, close, bursts, whole endpoints) is checked by the
//! conformance suite of `conclave-tests` (`tests/tests/transport.rs`). Every wait is bounded.

use std::future::Future;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::time::{Duration, Instant as StdInstant};

use async_io::{block_on, Timer};
use conclave_lock_api::wire::{ClusterId, Header};
use conclave_lock_api::{DiscoveryOutcome, DiscoveryPlace, DiscoveryReport, Transport};
use conclave_udp::{UdpConfig, UdpConfigError, UdpMulticast};
use futures::future::{select, Either};

/// A discovery port and group of this test alone, so parallel tests and test runs of other
/// checkouts on the same host do not hear each other.
fn config(test: u16) -> UdpConfig {
    let port = 20_000 + (std::process::id() % 20_000) as u16 + test * 7;
    UdpConfig {
        group: Ipv4Addr::new(239, 255, 67, 100 + test as u8),
        port,
        ..UdpConfig::loopback()
    }
}

async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> Option<T> {
    match select(pin!(f), pin!(Timer::after(limit))).await {
        Either::Left((value, _)) => Some(value),
        Either::Right(_) => None,
    }
}

#[test]
fn discovery_stays_within_its_group() {
    block_on(async {
        let a = UdpMulticast::bind(&config(2)).unwrap();
        let b = UdpMulticast::bind(&config(2)).unwrap();
        let other = UdpMulticast::bind(&config(3)).unwrap();
        a.send_discovery(b"ping").unwrap();
        let got = within(Duration::from_secs(5), b.recv())
            .await
            .expect("heard")
            .unwrap();
        assert_eq!((got.from, &got.bytes[..]), (a.local_addr(), &b"ping"[..]));
        // Another group and port hears nothing (bounded wait: a negative result needs one).
        assert!(within(Duration::from_millis(300), other.recv())
            .await
            .is_none());
    });
}

#[test]
fn the_blocking_receive_gets_both_sockets_datagrams_and_times_out() {
    let a = UdpMulticast::bind(&config(9)).unwrap();
    let b = UdpMulticast::bind(&config(9)).unwrap();
    let blocking = b
        .blocking()
        .expect("the UDP backend has a blocking receive");

    // A unicast datagram and a discovery datagram both arrive.
    a.send_to(b.local_addr(), b"direct").unwrap();
    a.send_discovery(b"group").unwrap();
    let mut got = Vec::new();
    let deadline = StdInstant::now() + Duration::from_secs(5);
    while got.len() < 2 && StdInstant::now() < deadline {
        if let Some(datagram) = blocking
            .recv_blocking(Some(Duration::from_millis(100)))
            .unwrap()
        {
            got.push(datagram.bytes);
        }
    }
    got.sort();
    assert_eq!(got, [b"direct".to_vec(), b"group".to_vec()]);

    // Nothing more: the timeout bounds the wait.
    let start = StdInstant::now();
    assert_eq!(
        blocking
            .recv_blocking(Some(Duration::from_millis(20)))
            .unwrap(),
        None
    );
    assert!(start.elapsed() >= Duration::from_millis(20));
}

#[test]
fn try_recv_ready_drains_the_burst_a_wait_found() {
    const LIMIT: Duration = Duration::from_secs(5);
    let a = UdpMulticast::bind(&config(11)).unwrap();
    let b = UdpMulticast::bind(&config(11)).unwrap();
    let receiver = b
        .blocking()
        .expect("the UDP backend has a blocking receive");
    for payload in [&b"one"[..], b"two", b"three"] {
        a.send_to(b.local_addr(), payload).unwrap();
    }
    let first = receiver
        .recv_blocking(Some(LIMIT))
        .unwrap()
        .expect("a datagram");
    assert_eq!(
        (first.from, &first.bytes[..]),
        (a.local_addr(), &b"one"[..])
    );
    for expected in [&b"two"[..], b"three"] {
        let got = receiver
            .try_recv_ready()
            .unwrap()
            .expect("the rest of the burst");
        assert_eq!((got.from, &got.bytes[..]), (a.local_addr(), expected));
    }
    assert_eq!(receiver.try_recv_ready().unwrap(), None);

    // A datagram that arrives after the wait: whatever `try_recv_ready` says of it, it is not
    // lost, and it is not delivered twice.
    a.send_to(b.local_addr(), b"later").unwrap();
    let mut got = Vec::new();
    let deadline = StdInstant::now() + LIMIT;
    while got.is_empty() && StdInstant::now() < deadline {
        if let Some(d) = receiver.try_recv_ready().unwrap() {
            got.push(d.bytes);
        } else if let Some(d) = receiver.recv_blocking(Some(LIMIT)).unwrap() {
            got.push(d.bytes);
        }
    }
    assert_eq!(got, vec![b"later".to_vec()]);
    assert_eq!(receiver.try_recv_ready().unwrap(), None);
    assert_eq!(receiver.try_recv().unwrap(), None);
}

/// A datagram of `cluster` as the protocol would send it: the wire header, then a body.
fn datagram(cluster: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Header::write(ClusterId(cluster), &mut out);
    out.extend_from_slice(b"discovery");
    out
}

#[test]
fn the_report_names_the_group_and_answers_only_for_our_cluster() {
    let config = config(12);
    let a = UdpMulticast::bind(&config).unwrap();
    let stranger = UdpMulticast::bind(&config).unwrap();
    let peer = UdpMulticast::bind(&config).unwrap();
    let report = |outcome| {
        vec![DiscoveryReport {
            place: DiscoveryPlace::Multicast {
                group: SocketAddr::from((config.group, config.port)),
                interface: IpAddr::V4(Ipv4Addr::LOCALHOST),
            },
            outcome,
        }]
    };
    assert_eq!(a.discovery_report(), report(DiscoveryOutcome::NoAnswer));
    block_on(async {
        // A datagram of another cluster, heard before `a` sent anything, does not count;
        // neither does `a`'s own discovery, which the multicast loop brings back.
        stranger.send_discovery(&datagram(2)).unwrap();
        let got = within(Duration::from_secs(5), a.recv())
            .await
            .expect("heard");
        assert_eq!(got.unwrap().from, stranger.local_addr());
        a.send_discovery(&datagram(1)).unwrap();
        stranger.send_to(a.local_addr(), &datagram(2)).unwrap();
        let got = within(Duration::from_secs(5), a.recv())
            .await
            .expect("heard");
        assert_eq!(got.unwrap().from, stranger.local_addr());
        assert_eq!(a.discovery_report(), report(DiscoveryOutcome::NoAnswer));
        // A member of the cluster answers.
        peer.send_to(a.local_addr(), &datagram(1)).unwrap();
        let got = within(Duration::from_secs(5), a.recv())
            .await
            .expect("heard");
        assert_eq!(got.unwrap().from, peer.local_addr());
        assert_eq!(a.discovery_report(), report(DiscoveryOutcome::Answered));
    });
}

#[test]
fn an_answer_heard_before_our_first_send_counts_once_we_send() {
    let config = config(13);
    let a = UdpMulticast::bind(&config).unwrap();
    let peer = UdpMulticast::bind(&config).unwrap();
    block_on(async {
        peer.send_to(a.local_addr(), &datagram(1)).unwrap();
        within(Duration::from_secs(5), a.recv())
            .await
            .expect("heard")
            .unwrap();
    });
    assert_eq!(a.discovery_report()[0].outcome, DiscoveryOutcome::NoAnswer);
    a.send_to(peer.local_addr(), &datagram(1)).unwrap();
    assert_eq!(a.discovery_report()[0].outcome, DiscoveryOutcome::Answered);
}

#[test]
fn an_unspecified_address_is_never_advertised() {
    let bind: SocketAddr = "0.0.0.0:0".parse().unwrap();
    let error = UdpMulticast::bind(&UdpConfig { bind, ..config(14) }).expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    let inner = error
        .get_ref()
        .and_then(|e| e.downcast_ref::<UdpConfigError>())
        .expect("a UdpConfigError inside");
    assert_eq!(*inner, UdpConfigError::UnspecifiedBind(bind));
    assert!(
        error.to_string().contains("UdpConfig::bind 0.0.0.0:0"),
        "{error}"
    );
}

#[test]
fn bind_errors_name_the_setting_and_the_address() {
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let error = UdpMulticast::bind(&UdpConfig {
        bind: addr,
        ..config(15)
    })
    .expect_err("the port is taken");
    assert_eq!(error.kind(), ErrorKind::AddrInUse);
    let text = error.to_string();
    assert!(
        text.starts_with(&format!(
            "binding the UDP socket (UdpConfig::bind) to {addr}: "
        )),
        "{text}"
    );
    assert!(text.contains("os error"), "{text}");
}
