//! FIFO order of waiters, pending requests at shutdown, and no thread left behind. (The
//! coordinator crash runs under every runtime in `scenarios.rs`.)

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::{cluster, thread_names, within, WAIT};
use conclave::memory::MemoryNetwork;
use conclave::{LockError, LockEvent, LockLostReason, LockStatus};
use futures::StreamExt;

/// Waiters are served in the order they asked: requests of one member reach the grantor in
/// order (reliable FIFO delivery), so the order of first polls is the order of the queue.
/// Checked with the waiters on another member than the grantor, and on the grantor itself.
#[test]
fn waiters_are_served_in_fifo_order() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "fifo", 3).await;
        let view = nodes[0].view().unwrap();
        let grantor = nodes
            .iter()
            .position(|n| n.member_id() == view.coordinator())
            .unwrap();
        let other = (grantor + 1) % nodes.len();
        let holder_node = (grantor + 2) % nodes.len();
        for waiting_node in [other, grantor] {
            let holder = within(WAIT, "lock", nodes[holder_node].mutex("q").unwrap().lock())
                .await
                .unwrap();
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut waiters = Vec::new();
            for i in 0..6 {
                let mutex = nodes[waiting_node].mutex("q").unwrap();
                let order = order.clone();
                let mut waiter = Box::pin(async move {
                    let guard = mutex.lock().await.unwrap();
                    order.lock().unwrap().push(i);
                    drop(guard);
                });
                assert!(futures::poll!(waiter.as_mut()).is_pending());
                waiters.push(waiter);
            }
            assert_eq!(nodes[waiting_node].pending_requests(), 6);
            drop(holder);
            within(WAIT, "all waiters", futures::future::join_all(waiters)).await;
            assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4, 5]);
        }
    });
}

/// Leaving the node fails its pending requests with `Shutdown`, tells the owners of its held
/// locks and the handlers, and ends its thread.
#[test]
fn shutdown_fails_pending_and_leaves_no_thread() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut nodes = cluster(&network, "shut", 2).await;
        let b = nodes.pop().unwrap();
        let a = nodes.pop().unwrap();
        let told = Arc::new(Mutex::new(Vec::new()));
        let sink = told.clone();
        b.on_lock_lost(move |lost| {
            sink.lock()
                .unwrap()
                .push((lost.name.to_string(), lost.reason))
        });
        let mut events = b.lock_events();

        let held_by_a = within(WAIT, "a locks p", a.mutex("p").unwrap().lock())
            .await
            .unwrap();
        let held_by_b = within(WAIT, "b locks h", b.mutex("h").unwrap().lock())
            .await
            .unwrap();
        let b_p = b.mutex("p").unwrap();
        let mut pending = Box::pin(b_p.lock());
        assert!(futures::poll!(pending.as_mut()).is_pending());

        assert!(thread_names().iter().any(|n| n == "conclave-shut-1"));
        within(WAIT, "leave", b.leave()).await;
        assert!(
            !thread_names().iter().any(|n| n == "conclave-shut-1"),
            "thread left behind"
        );

        assert_eq!(
            within(WAIT, "pending", pending).await.unwrap_err(),
            LockError::Shutdown
        );
        assert_eq!(held_by_b.status(), LockStatus::Lost);
        assert_eq!(
            within(WAIT, "lost", held_by_b.lost()).await,
            LockLostReason::Shutdown
        );
        assert_eq!(
            *told.lock().unwrap(),
            vec![("h".to_owned(), LockLostReason::Shutdown)]
        );
        let seen: Vec<LockEvent> = within(WAIT, "events end", events.by_ref().collect()).await;
        assert!(seen.iter().any(|e| matches!(e, LockEvent::Locked { .. })));
        assert!(seen.iter().any(|e| matches!(
            e,
            LockEvent::Lost {
                reason: LockLostReason::Shutdown,
                ..
            }
        )));
        assert_eq!(b_p.try_lock().await.unwrap_err(), LockError::Shutdown);

        drop((held_by_a, held_by_b));
        // A plain drop shuts down too, without blocking: the thread ends in the background
        // once it has left (no event marks a thread's end, so this polls, bounded).
        drop(a);
        within(WAIT, "the dropped node's thread ends", async {
            while thread_names().iter().any(|n| n == "conclave-shut-0") {
                smol::Timer::after(std::time::Duration::from_millis(10)).await;
            }
        })
        .await;
    });
}
