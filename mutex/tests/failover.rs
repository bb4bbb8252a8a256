//! FIFO order of waiters, pending requests at shutdown, and no thread left behind. (The
//! coordinator crash runs under every runtime in `scenarios.rs`.)

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        // `leave` joined the thread; the kernel wakes a joiner before it removes the thread
        // from `/proc`, so the name may linger a moment (it did in about one run in ten).
        within(Duration::from_secs(1), "thread left behind", async {
            while thread_names().iter().any(|n| n == "conclave-shut-1") {
                smol::Timer::after(Duration::from_millis(1)).await;
            }
        })
        .await;

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
                smol::Timer::after(Duration::from_millis(10)).await;
            }
        })
        .await;
    });
}

/// A crashed member (the in-memory transport's `crash`, like `kill -9`) stops without a
/// goodbye: its own handlers are not called, its waiting request fails with `Shutdown`, and the
/// survivors find it dead, drop it from the view and grant its lock to the next owner.
#[test]
fn a_crashed_member_stops_without_a_goodbye() {
    use futures::FutureExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "crash", 3).await;
        let (a, c) = (&nodes[0], &nodes[2]);
        let handler_calls = Arc::new(AtomicUsize::new(0));
        let calls = handler_calls.clone();
        c.on_lock_lost(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
        });
        let mut events = c.lock_events();
        let held = within(WAIT, "lock", c.mutex("crash").unwrap().lock())
            .await
            .unwrap();
        let mut waiting = Box::pin(c.mutex("other").unwrap().lock());
        let blocker = within(WAIT, "lock", a.mutex("other").unwrap().lock())
            .await
            .unwrap();
        assert!(futures::poll!(waiting.as_mut()).is_pending());
        network.crash(c.member_id().addr());
        assert_eq!(
            within(WAIT, "the crashed member's waiting request", waiting)
                .await
                .unwrap_err(),
            LockError::Shutdown
        );
        assert_eq!(held.status(), LockStatus::Lost);
        // The survivors drop it from the view and grant its lock on.
        let taken = within(
            WAIT,
            "the survivor gets the crashed member's lock",
            a.mutex("crash").unwrap().lock_timeout(WAIT),
        )
        .await
        .unwrap();
        assert!(taken.fencing_token() > held.fencing_token());
        let view = a.view().unwrap();
        assert!(!view.contains(c.member_id()), "{view}");
        assert_eq!(
            handler_calls.load(Ordering::SeqCst),
            0,
            "a dead process tells nobody"
        );
        let after: Vec<LockEvent> =
            std::iter::from_fn(|| events.next().now_or_never().flatten()).collect();
        assert!(
            !after.iter().any(|e| matches!(e, LockEvent::Lost { .. })),
            "{after:?}"
        );
        drop((blocker, taken));
    });
}

/// The members know which grantor serves; after the grantor crashes they forget it, and learn
/// the next one once it has rebuilt the table.
#[test]
fn members_learn_the_serving_grantor_again_after_a_failover() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "serving", 3).await;
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        for node in &nodes {
            let grantor = within(WAIT, "serving", node.wait_until_serving()).await;
            assert_eq!(grantor.as_ref(), Some(a.member_id()));
        }
        let mut views = c.views();
        network.crash(a.member_id().addr());
        within(WAIT, "a view without the crashed grantor", async {
            while let Some(view) = views.next().await {
                if !view.contains(a.member_id()) {
                    break;
                }
            }
        })
        .await;
        let next = within(WAIT, "the next grantor serves", c.wait_until_serving()).await;
        assert_eq!(next.as_ref(), Some(b.member_id()));
        let guard = within(WAIT, "try_lock", c.mutex("after").unwrap().try_lock())
            .await
            .unwrap();
        drop(guard);
    });
}
