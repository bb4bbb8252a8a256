//! The UDP backend on loopback, multicast with TTL 0 on 127.0.0.1: datagrams, discovery, group
//! isolation, and whole protocol endpoints forming views over it. Every wait is bounded.

use std::future::Future;
use std::net::Ipv4Addr;
use std::pin::pin;
use std::time::{Duration, Instant as StdInstant};

use async_io::{block_on, Timer};
use conclave_lock_api::{MemberId, Transport};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, Instant};
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
fn unicast_datagrams_arrive_with_their_sender() {
    block_on(async {
        let a = UdpMulticast::bind(&config(1)).unwrap();
        let b = UdpMulticast::bind(&config(1)).unwrap();
        assert!(a.local_addr().ip().is_loopback());
        a.send_to(b.local_addr(), b"hello").unwrap();
        let got = within(Duration::from_secs(5), b.recv())
            .await
            .expect("received")
            .unwrap();
        assert_eq!(got.from, a.local_addr());
        assert_eq!(got.bytes, b"hello");
    });
}

#[test]
fn discovery_reaches_every_member_of_the_group_and_no_other_group() {
    block_on(async {
        let a = UdpMulticast::bind(&config(2)).unwrap();
        let b = UdpMulticast::bind(&config(2)).unwrap();
        let c = UdpMulticast::bind(&config(2)).unwrap();
        let other = UdpMulticast::bind(&config(3)).unwrap();
        a.send_discovery(b"ping").unwrap();
        for member in [&b, &c] {
            let got = within(Duration::from_secs(5), member.recv())
                .await
                .expect("heard")
                .unwrap();
            assert_eq!(got.bytes, b"ping");
            assert_eq!(got.from, a.local_addr());
        }
        // Another group and port hears nothing (bounded wait: a negative result needs one).
        assert!(within(Duration::from_millis(300), other.recv())
            .await
            .is_none());
    });
}

/// Runs endpoints over their transports until `done` or the deadline; returns whether done.
fn drive(
    nodes: &mut [(Endpoint, UdpMulticast)],
    origin: StdInstant,
    limit: Duration,
    mut done: impl FnMut(&[(Endpoint, UdpMulticast)]) -> bool,
) -> bool {
    let deadline = StdInstant::now() + limit;
    let now = || Instant::from_duration(origin.elapsed());
    block_on(async {
        while StdInstant::now() < deadline {
            for (endpoint, transport) in nodes.iter_mut() {
                while let Some(t) = endpoint.poll_transmit() {
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

fn endpoint(cluster: &str, name: &str, transport: &UdpMulticast, seed: u128) -> Endpoint {
    let id = MemberId::new(
        seed << 64 | u128::from(std::process::id()),
        name,
        transport.local_addr(),
    )
    .expect("valid member");
    Endpoint::new(
        cluster,
        id,
        EndpointConfig::local(),
        transport.max_datagram_size(),
    )
}

#[test]
fn endpoints_form_one_view_over_udp_and_another_cluster_on_the_same_group_stays_apart() {
    let origin = StdInstant::now();
    let mut nodes: Vec<(Endpoint, UdpMulticast)> = Vec::new();
    for (i, (cluster, name)) in [
        ("orders", "a"),
        ("orders", "b"),
        ("orders", "c"),
        ("billing", "x"),
    ]
    .iter()
    .enumerate()
    {
        let transport = UdpMulticast::bind(&config(4)).unwrap();
        let mut e = endpoint(cluster, name, &transport, i as u128 + 1);
        e.join(Instant::from_duration(origin.elapsed()));
        nodes.push((e, transport));
    }
    let formed = drive(&mut nodes, origin, Duration::from_secs(20), |nodes| {
        let orders: Vec<_> = nodes[..3].iter().filter_map(|(e, _)| e.view()).collect();
        orders.len() == 3
            && orders.iter().all(|v| *v == orders[0] && v.len() == 3)
            && nodes[3].0.view().is_some()
    });
    assert!(
        formed,
        "the three members of one cluster agree on a view within 20 s"
    );
    let billing = nodes[3].0.view().unwrap();
    assert_eq!(
        billing.len(),
        1,
        "a foreign cluster on the same group never joins: {billing}"
    );
    assert!(
        nodes[3].0.stats().dropped_foreign > 0,
        "its datagrams were seen and dropped"
    );
}

#[test]
fn a_lock_granted_over_udp() {
    use conclave_lock_api::LockName;
    use conclave_protocol::locking::LockRequest;

    let origin = StdInstant::now();
    let mut nodes: Vec<(Endpoint, UdpMulticast)> = Vec::new();
    for i in 0..2u128 {
        let transport = UdpMulticast::bind(&config(5)).unwrap();
        let mut e = endpoint("locks", &format!("n{i}"), &transport, i + 1);
        e.join(Instant::from_duration(origin.elapsed()));
        nodes.push((e, transport));
    }
    assert!(drive(&mut nodes, origin, Duration::from_secs(20), |n| {
        n.iter()
            .all(|(e, _)| e.view().is_some_and(|v| v.len() == 2))
    }));
    let now = Instant::from_duration(origin.elapsed());
    let request = nodes[1].0.lock(
        now,
        LockRequest::exclusive(1, LockName::new("over-udp").unwrap()),
    );
    let held = drive(&mut nodes, origin, Duration::from_secs(10), |n| {
        n[1].0
            .lock_status(Instant::from_duration(origin.elapsed()), request)
            .is_some()
    });
    assert!(held, "the lock was granted over UDP within 10 s");
    let now = Instant::from_duration(origin.elapsed());
    let holds = nodes[1].0.holds(now);
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].name.as_str(), "over-udp");
    assert_eq!(
        &holds[0].granted_by,
        nodes[0].0.local(),
        "granted by the coordinator"
    );
}

#[test]
fn the_blocking_receive_gets_datagrams_times_out_and_can_be_interrupted() {
    let a = UdpMulticast::bind(&config(9)).unwrap();
    let b = std::sync::Arc::new(UdpMulticast::bind(&config(9)).unwrap());
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

    // An interrupt from another thread ends a wait without limit, and is not delivered.
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || b.blocking().unwrap().recv_blocking(None))
    };
    std::thread::sleep(Duration::from_millis(20)); // let it block (the test passes either way)
    blocking.interrupt();
    let deadline = StdInstant::now() + Duration::from_secs(5);
    while !waiter.is_finished() {
        assert!(
            StdInstant::now() < deadline,
            "the interrupt did not wake the receive"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(waiter.join().unwrap().unwrap(), None);
}
