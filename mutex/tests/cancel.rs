//! Cancel safety: a dropped lock future withdraws its request, also when the grant races the
//! drop. Checked with `tokio::time::timeout`, `futures::select!` and a plain drop after one
//! poll, many times over; afterwards nothing is held or queued anywhere.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{cluster, within, WAIT};
use conclave::memory::MemoryNetwork;
use conclave::{DistributedMutex, LockEvent, Node};
use futures::FutureExt;

const ROUNDS: usize = 40;

/// Nothing held or waiting on any node, and the lock can be taken from `probe`.
async fn assert_clean(nodes: &[Node], probe: &DistributedMutex) {
    let guard = within(
        WAIT,
        "lock after the cancellations",
        probe.lock_timeout(WAIT),
    )
    .await
    .expect("nothing stays held");
    for node in nodes {
        assert_eq!(
            node.pending_requests(),
            0,
            "{} has a queued request",
            node.member_id()
        );
        let held = node.held_locks();
        assert!(
            held.iter().all(|h| h.owner == guard.owner()),
            "{} still holds {held:?}",
            node.member_id()
        );
    }
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_timeout_withdraws_the_request() {
    let network = MemoryNetwork::new();
    let nodes = cluster(&network, "cancel-timeout", 3).await;
    let holder = nodes[0].mutex("m").unwrap();
    let waiter = nodes[1].mutex("m").unwrap();
    let guard = within(WAIT, "lock", holder.lock()).await.unwrap();
    for _ in 0..ROUNDS {
        let result = tokio::time::timeout(Duration::from_millis(1), waiter.lock()).await;
        assert!(result.is_err(), "the lock is held elsewhere");
    }
    drop(guard);
    assert_clean(&nodes, &nodes[2].mutex("m").unwrap()).await;
}

#[test]
fn select_drops_the_losing_lock_future() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "cancel-select", 3).await;
        let holder = nodes[2].mutex("m").unwrap();
        let waiter = nodes[1].mutex("m").unwrap();
        let guard = within(WAIT, "lock", holder.lock()).await.unwrap();
        for round in 0..ROUNDS {
            let mut lock = waiter.lock().fuse();
            let mut other = async_io::Timer::after(Duration::from_micros(50 * round as u64)).fuse();
            futures::select! {
                _ = lock => panic!("granted while held elsewhere"),
                _ = other => {}
            }
        }
        drop(guard);
        assert_clean(&nodes, &nodes[0].mutex("m").unwrap()).await;
    });
}

/// The race: the holder releases while the waiter's future, registered by one poll, is
/// dropped. Whether the grant or the cancel wins, the lock ends up free.
#[test]
fn drop_after_one_poll_races_the_grant() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "cancel-race", 3).await;
        for (holder, waiter) in [(0, 1), (1, 2), (2, 1), (1, 0)] {
            let holder = nodes[holder].mutex("m").unwrap();
            let waiter = nodes[waiter].mutex("m").unwrap();
            for round in 0..ROUNDS {
                let guard = within(WAIT, "lock", holder.lock()).await.unwrap();
                let mut pending = Box::pin(waiter.lock());
                assert!(futures::poll!(pending.as_mut()).is_pending());
                drop(guard);
                // Let the release travel for a varying time before the drop.
                for _ in 0..round % 4 {
                    smol::future::yield_now().await;
                }
                if round % 5 == 0 {
                    async_io::Timer::after(Duration::from_micros(100 * round as u64)).await;
                }
                drop(pending);
            }
            assert_clean(&nodes, &nodes[0].mutex("m").unwrap()).await;
        }
    });
}

/// The grant reached the waiter's node (its event says so) but the future, not polled again,
/// is dropped: the lock it was granted is released at once.
#[test]
fn drop_after_the_grant_arrived_releases_it() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "cancel-granted", 3).await;
        let holder = nodes[0].mutex("m").unwrap();
        let waiter = nodes[1].mutex("m").unwrap();
        let mut events = nodes[1].lock_events();
        for _ in 0..ROUNDS / 4 {
            let guard = within(WAIT, "lock", holder.lock()).await.unwrap();
            let mut pending = Box::pin(waiter.lock());
            assert!(futures::poll!(pending.as_mut()).is_pending());
            drop(guard);
            within(WAIT, "grant arrives", async {
                while let Some(event) = futures::StreamExt::next(&mut events).await {
                    if matches!(event, LockEvent::Locked { .. }) {
                        return;
                    }
                }
            })
            .await;
            assert_eq!(nodes[1].held_locks().len(), 1);
            drop(pending);
            assert!(nodes[1].held_locks().is_empty(), "released in Drop");
        }
        assert_clean(&nodes, &nodes[2].mutex("m").unwrap()).await;
    });
}

/// A future dropped before its first poll registers nothing.
#[test]
fn unpolled_future_registers_nothing() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "cancel-unpolled", 1).await;
        let mutex = nodes[0].mutex("m").unwrap();
        for _ in 0..ROUNDS {
            drop(mutex.lock());
        }
        assert_eq!(nodes[0].pending_requests(), 0);
        assert_clean(&nodes, &mutex).await;
    });
}
