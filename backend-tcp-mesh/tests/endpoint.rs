//! Whole protocol endpoints over the TCP mesh on loopback: a cluster forms from a seed, a
//! foreign cluster seeded to the same member stays apart, and a lock is granted. Every wait is
//! bounded.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::time::{Duration, Instant as StdInstant};

use async_io::{block_on, Timer};
use conclave_lock_api::{MemberId, Transport};
use conclave_protocol::{Destination, Endpoint, EndpointConfig, Instant};
use conclave_tcp::TcpMesh;
use futures::future::{select, Either};

async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> Option<T> {
    match select(pin!(f), pin!(Timer::after(limit))).await {
        Either::Left((value, _)) => Some(value),
        Either::Right(_) => None,
    }
}

/// Runs endpoints over their transports until `done` or the deadline; returns whether done.
/// Each transport's `recv` runs in 1 ms slices (and is dropped between them), which is also
/// what drives its connects and queued writes.
fn drive(
    nodes: &mut [(Endpoint, TcpMesh)],
    origin: StdInstant,
    limit: Duration,
    mut done: impl FnMut(&[(Endpoint, TcpMesh)]) -> bool,
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

fn endpoint(cluster: &str, name: &str, transport: &TcpMesh, seed: u128) -> Endpoint {
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

/// Binds one mesh per `(cluster, name)`, all seeded with the first one's address.
fn cluster(members: &[(&str, &str)], origin: StdInstant) -> Vec<(Endpoint, TcpMesh)> {
    let mut nodes: Vec<(Endpoint, TcpMesh)> = Vec::new();
    let mut seed: Option<SocketAddr> = None;
    for (i, (cluster, name)) in members.iter().enumerate() {
        let transport = TcpMesh::loopback(seed).expect("bind");
        seed.get_or_insert(transport.local_addr());
        let mut e = endpoint(cluster, name, &transport, i as u128 + 1);
        e.join(Instant::from_duration(origin.elapsed()));
        nodes.push((e, transport));
    }
    nodes
}

#[test]
fn endpoints_form_one_view_over_tcp_and_another_cluster_on_the_same_seed_stays_apart() {
    let origin = StdInstant::now();
    let mut nodes = cluster(
        &[
            ("orders", "a"),
            ("orders", "b"),
            ("orders", "c"),
            ("billing", "x"),
        ],
        origin,
    );
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
        "a foreign cluster on the same seed never joins: {billing}"
    );
    assert!(
        nodes[3].0.stats().dropped_foreign > 0,
        "its datagrams were seen and dropped"
    );
    for (_, transport) in &nodes {
        assert_eq!(transport.stats().violations, 0);
    }
}

#[test]
fn a_lock_granted_over_tcp() {
    use conclave_lock_api::LockName;
    use conclave_protocol::locking::LockRequest;

    let origin = StdInstant::now();
    let mut nodes = cluster(&[("locks", "n0"), ("locks", "n1")], origin);
    assert!(drive(&mut nodes, origin, Duration::from_secs(20), |n| {
        n.iter()
            .all(|(e, _)| e.view().is_some_and(|v| v.len() == 2))
    }));
    let now = Instant::from_duration(origin.elapsed());
    let request = nodes[1].0.lock(
        now,
        LockRequest::exclusive(1, LockName::new("over-tcp").unwrap()),
    );
    let held = drive(&mut nodes, origin, Duration::from_secs(10), |n| {
        n[1].0
            .lock_status(Instant::from_duration(origin.elapsed()), request)
            .is_some()
    });
    assert!(held, "the lock was granted over TCP within 10 s");
    let now = Instant::from_duration(origin.elapsed());
    let holds = nodes[1].0.holds(now);
    assert_eq!(holds.len(), 1);
    assert_eq!(holds[0].name.as_str(), "over-tcp");
    assert_eq!(
        &holds[0].granted_by,
        nodes[0].0.local(),
        "granted by the coordinator"
    );
}
