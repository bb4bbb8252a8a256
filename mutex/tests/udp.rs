//! The front end over real UDP sockets on loopback (multicast with TTL 0 on 127.0.0.1), with a
//! discovery group and port of this test run alone.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::Ipv4Addr;

use common::{agree, within, WAIT};
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, LockError, Node};

fn config() -> UdpConfig {
    UdpConfig {
        group: Ipv4Addr::new(239, 255, 67, 201),
        port: 40_000 + (std::process::id() % 20_000) as u16,
        ..UdpConfig::loopback()
    }
}

#[test]
fn two_nodes_exclude_each_other_over_udp() {
    smol::block_on(async {
        let mut nodes = Vec::new();
        for name in ["udp-a", "udp-b"] {
            let transport = UdpMulticast::bind(&config()).unwrap();
            let node = within(
                WAIT,
                "join",
                Node::builder("conclave-front-end-udp-test")
                    .name(name)
                    .transport(transport)
                    .config(EndpointConfig::local())
                    .founding(conclave::Founding::Alone)
                    .join(),
            )
            .await
            .unwrap();
            nodes.push(node);
        }
        agree(&[&nodes[0], &nodes[1]]).await;
        let (a, b) = (nodes[0].mutex("m").unwrap(), nodes[1].mutex("m").unwrap());
        let guard = within(WAIT, "lock", b.lock()).await.unwrap();
        assert_eq!(
            within(WAIT, "try_lock", a.try_lock()).await.unwrap_err(),
            LockError::WouldBlock
        );
        let mut waiting = Box::pin(a.lock());
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        within(WAIT, "unlock", guard.unlock()).await.unwrap();
        let guard = within(WAIT, "the waiter is served", waiting).await.unwrap();
        drop(guard);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Two nodes over UDP in this process, `spin` for the second (never the grantor: it joins
/// after the first founded the cluster).
async fn grantor_and_client(cluster: &str, spin: std::time::Duration) -> (Node, Node) {
    let mut nodes = Vec::new();
    for (name, spin) in [("grantor", conclave::DEFAULT_SPIN_WAIT), ("client", spin)] {
        let node = within(
            WAIT,
            "join",
            Node::builder(cluster)
                .name(name)
                .transport(UdpMulticast::bind(&config()).unwrap())
                .config(EndpointConfig::local())
                .founding(conclave::Founding::Alone)
                .spin_wait(spin)
                .join(),
        )
        .await
        .unwrap();
        nodes.push(node);
    }
    agree(&[&nodes[0], &nodes[1]]).await;
    let client = nodes.pop().unwrap();
    (nodes.pop().unwrap(), client)
}

/// A task spinning for its answer reads the transport itself; if it stops being polled, the
/// node's other requests are still served once its spin is over.
#[test]
fn a_spinning_task_that_is_not_polled_holds_nothing_up() {
    smol::block_on(async {
        let spin = std::time::Duration::from_millis(30);
        let (grantor, client) = grantor_and_client("conclave-udp-unpolled-spinner", spin).await;
        let held = within(WAIT, "grantor locks", grantor.mutex("held").unwrap().lock())
            .await
            .unwrap();
        let blocked = client.mutex("held").unwrap();
        let mut stalled = Box::pin(blocked.lock());
        // One poll: the request is sent and the task spins, taking the receive duty; then it
        // is never polled again while the other request runs.
        assert!(futures::poll!(stalled.as_mut()).is_pending());
        let free = client.mutex("free").unwrap();
        let guard = within(WAIT, "the other request is served", free.lock())
            .await
            .unwrap();
        within(WAIT, "unlock", guard.unlock()).await.unwrap();
        drop(held);
        let guard = within(WAIT, "the stalled request is served", stalled)
            .await
            .unwrap();
        drop(guard);
        within(WAIT, "leave", client.leave()).await;
        within(WAIT, "leave", grantor.leave()).await;
    });
}

/// Many tasks on a member that is not the grantor, all spinning and taking turns at reading
/// the transport: every lock is granted, and the critical sections never overlap.
#[test]
fn concurrent_spinning_tasks_exclude_each_other_over_udp() {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    const TASKS: usize = 8;
    const ROUNDS: usize = 25;
    let (grantor, client) = smol::block_on(grantor_and_client(
        "conclave-udp-spinning-tasks",
        std::time::Duration::from_millis(1),
    ));
    let client = Arc::new(client);
    let inside = Arc::new(AtomicU32::new(0));
    let executor = smol::Executor::new();
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, inside) = (client.clone(), inside.clone());
            executor.spawn(async move {
                let mutex = client.mutex("shared").unwrap();
                for _ in 0..ROUNDS {
                    let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "overlap");
                    smol::future::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                }
            })
        })
        .collect();
    // Two threads run the tasks, so spinning tasks really race for the duty.
    std::thread::scope(|scope| {
        let (stop, done) = smol::channel::bounded::<()>(1);
        let executor = &executor;
        scope.spawn(move || smol::block_on(executor.run(done.recv())));
        smol::block_on(executor.run(async {
            for task in tasks {
                task.await;
            }
        }));
        drop(stop);
    });
    let client = Arc::into_inner(client).unwrap();
    smol::block_on(async {
        within(WAIT, "leave", client.leave()).await;
        within(WAIT, "leave", grantor.leave()).await;
    });
}
