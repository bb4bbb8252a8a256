//! Mutual exclusion and FIFO service on a slow network: every datagram is delayed, so
//! datagrams overtake each other and the reliable layer reorders them.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{cluster, within, WAIT};
use conclave::memory::MemoryNetwork;

#[test]
fn mutual_exclusion_holds_on_a_delayed_network() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "delay", 3).await;
        network.set_delay(Duration::from_millis(3));
        let counter = Arc::new(AtomicU64::new(0));
        let inside = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for node in &nodes {
            let mutex = node.mutex("slow").unwrap();
            for _ in 0..2 {
                let (mutex, counter, inside) = (mutex.clone(), counter.clone(), inside.clone());
                tasks.push(smol::spawn(async move {
                    for _ in 0..5 {
                        let guard = mutex.lock().await.unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        counter.fetch_add(1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        guard.unlock().await.unwrap();
                    }
                }));
            }
        }
        within(
            WAIT * 2,
            "increments on a slow network",
            futures::future::join_all(tasks),
        )
        .await;
        assert_eq!(counter.load(Ordering::SeqCst), 3 * 2 * 5);
        network.set_delay(Duration::ZERO);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}
