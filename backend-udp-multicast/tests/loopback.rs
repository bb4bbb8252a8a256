//! UDP-specific behaviour on loopback, multicast with TTL 0 on 127.0.0.1: group isolation and
//! the blocking receive's timeout. The shared transport contract (datagrams, discovery,
//! cancel safety, size limit, interrupt, close, bursts, whole endpoints) is checked by the
//! conformance suite of `conclave-tests` (`tests/tests/transport.rs`). Every wait is bounded.

use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::pin;
use std::time::{Duration, Instant as StdInstant};

use async_io::{block_on, Timer};
use conclave_lock_api::Transport;
use conclave_udp::{UdpConfig, UdpMulticast};
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
