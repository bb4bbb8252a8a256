//! The main scenarios, each run under smol, async-std, tokio multi-thread and tokio
//! current-thread: mutual exclusion under contention, try-lock and timeouts, and a
//! coordinator crash.
//!
//! Every wait is bounded ([`common::within`]); nothing sleeps to synchronise.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{agree, cluster, within, Spawn, WAIT};
use conclave::memory::MemoryNetwork;
use conclave::{LockError, LockStatus, Node};

const NODES: usize = 3;
const TASKS_PER_NODE: usize = 4;
const ROUNDS: u64 = 8;

/// Three nodes form a view; many tasks on every node increment a shared counter under one
/// lock. The final value is exact and no two tasks are ever inside at once.
async fn mutual_exclusion(spawn: Spawn, prefix: &'static str) {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, prefix, NODES).await;
    assert_eq!(nodes[0].view().map(|v| v.len()), Some(NODES));
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for node in &nodes {
        let mutex = node.mutex("counter").expect("valid name");
        for _ in 0..TASKS_PER_NODE {
            let (mutex, counter, inside, tokens) = (
                mutex.clone(),
                counter.clone(),
                inside.clone(),
                tokens.clone(),
            );
            tasks.push(spawn(Box::pin(async move {
                for _ in 0..ROUNDS {
                    let guard = mutex.lock().await.expect("lock");
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let value = counter.load(Ordering::SeqCst);
                    async_io::Timer::after(Duration::from_micros(200)).await;
                    counter.store(value + 1, Ordering::SeqCst);
                    tokens.lock().unwrap().push(guard.fencing_token());
                    inside.store(false, Ordering::SeqCst);
                    drop(guard);
                }
            })));
        }
    }
    within(
        WAIT * 4,
        "contended increments",
        futures::future::join_all(tasks),
    )
    .await;
    let expected = (NODES * TASKS_PER_NODE) as u64 * ROUNDS;
    assert_eq!(counter.load(Ordering::SeqCst), expected);
    let tokens = tokens.lock().unwrap().clone();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens increase: {tokens:?}"
    );
    for node in &nodes {
        assert!(node.held_locks().is_empty());
        assert_eq!(node.pending_requests(), 0);
    }
    for node in nodes {
        within(WAIT, "leave", node.leave()).await;
    }
}

/// try_lock, timeouts and the guard's status across nodes.
async fn try_lock_and_timeout(_spawn: Spawn, prefix: &'static str) {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, prefix, 2).await;
    let (a, b) = (nodes[0].mutex("x").unwrap(), nodes[1].mutex("x").unwrap());
    let guard = within(WAIT, "lock", b.lock()).await.unwrap();
    // Held, or suspended if a heartbeat is late on a loaded machine: never lost here.
    assert_ne!(guard.status(), LockStatus::Lost);
    assert_eq!(
        within(WAIT, "try_lock", a.try_lock()).await.unwrap_err(),
        LockError::WouldBlock
    );
    assert_eq!(
        within(
            WAIT,
            "lock_timeout",
            a.lock_timeout(Duration::from_millis(100))
        )
        .await
        .unwrap_err(),
        LockError::Timeout
    );
    assert_eq!(
        nodes[0].pending_requests(),
        0,
        "a timed-out request is withdrawn"
    );
    within(WAIT, "unlock", guard.unlock()).await.unwrap();
    let guard = within(WAIT, "try_lock after unlock", a.try_lock())
        .await
        .unwrap();
    drop(guard);
    for node in nodes {
        within(WAIT, "leave", node.leave()).await;
    }
}

/// The coordinator's traffic is cut (it looks crashed): the survivors form a view, keep the
/// locks they hold, serve their waiters, and free the locks the dead member held, in the
/// default lock service and in a named one alike (each service reconciles on its own).
async fn coordinator_crash(_spawn: Spawn, prefix: &'static str) {
    {
        let network = MemoryNetwork::new();
        let mut nodes = cluster(&network, prefix, 3).await;
        let view = nodes[0].view().unwrap();
        let coordinator = nodes
            .iter()
            .position(|n| n.member_id() == view.coordinator())
            .unwrap();
        let victim = nodes.remove(coordinator);
        let (b, c) = (&nodes[0], &nodes[1]);
        // The default service (`None`) and a named one.
        let services = [None, Some("billing")];
        let mutex = |node: &Node, service: Option<&str>, name: &str| match service {
            None => node.mutex(name).unwrap(),
            Some(service) => node.lock_service(service).unwrap().mutex(name).unwrap(),
        };

        let mut before = Vec::new();
        for service in services {
            let held_by_b = within(WAIT, "b locks x", mutex(b, service, "x").lock())
                .await
                .unwrap();
            let held_by_dead = within(WAIT, "victim locks y", mutex(&victim, service, "y").lock())
                .await
                .unwrap();
            let mut c_waits = Box::pin(mutex(c, service, "x").lock());
            assert!(futures::poll!(c_waits.as_mut()).is_pending());
            before.push((service, held_by_b, held_by_dead, c_waits));
        }

        network.isolate(victim.member_id().addr());
        let survivors = agree(&[b, c]).await;
        assert!(!survivors.contains(victim.member_id()));
        for (service, held_by_b, held_by_dead, c_waits) in before {
            assert_ne!(held_by_b.status(), LockStatus::Lost, "b keeps its lock");
            // The dead member's lock is freed once the new grantor has rebuilt its table.
            let y = within(WAIT, "y after the crash", mutex(c, service, "y").lock())
                .await
                .unwrap();
            assert!(y.fencing_token() > held_by_dead.fencing_token());
            // The waiter is served when b releases.
            drop(held_by_b);
            let x = within(WAIT, "c's queued request for x", c_waits)
                .await
                .unwrap();
            drop((x, y, held_by_dead));
        }
        drop(victim); // its own shutdown is bounded even with no one to talk to
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    }
}

macro_rules! under_each_runtime {
    ($smol:ident, $async_std:ident, $tokio_multi:ident, $tokio_current:ident, $body:expr) => {
        #[test]
        fn $smol() {
            smol::block_on($body(common::smol_spawn as Spawn, stringify!($smol)));
        }

        #[test]
        fn $async_std() {
            async_std::task::block_on($body(
                common::async_std_spawn as Spawn,
                stringify!($async_std),
            ));
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $tokio_multi() {
            $body(common::tokio_spawn as Spawn, stringify!($tokio_multi)).await;
        }

        #[tokio::test(flavor = "current_thread")]
        async fn $tokio_current() {
            $body(common::tokio_spawn as Spawn, stringify!($tokio_current)).await;
        }
    };
}

under_each_runtime!(
    exclusion_smol,
    exclusion_async_std,
    exclusion_tokio_multi,
    exclusion_tokio_current,
    mutual_exclusion
);

under_each_runtime!(
    try_timeout_smol,
    try_timeout_async_std,
    try_timeout_tokio_multi,
    try_timeout_tokio_current,
    try_lock_and_timeout
);

under_each_runtime!(
    crash_smol,
    crash_async_std,
    crash_tokio_multi,
    crash_tokio_current,
    coordinator_crash
);
