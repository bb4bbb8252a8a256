//! API hygiene and the smaller features: auto traits, typed errors, read/write locks, event
//! streams, guard status.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{cluster, within, WAIT};
use conclave::futures::{Lock, LockReentrant, Lost, Read, Unlock, Write};
use conclave::memory::MemoryNetwork;
use conclave::{
    DistributedMutex, LockError, LockEvent, LockLostReason, LockMode, LockNameError, LockService,
    LockStatus, MutexGuard, Node, NodeError, ReentrantGuard, ReentrantLock, RwLock, RwLockGuard,
    ServiceError,
};
use futures::StreamExt;

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}

#[test]
fn public_types_are_send_and_sync() {
    send_sync::<Node>();
    send_sync::<DistributedMutex>();
    send_sync::<RwLock>();
    send_sync::<MutexGuard>();
    send_sync::<RwLockGuard>();
    send_sync::<ReentrantLock>();
    send_sync::<ReentrantGuard>();
    send_sync::<NodeError>();
    send_sync::<LockError>();
    send_sync::<LockService>();
    send_sync::<ServiceError>();
    send::<Lock>();
    send::<Read>();
    send::<Write>();
    send::<Unlock>();
    send::<LockReentrant>();
    send::<Lost>();
}

#[test]
fn lock_service_mistakes_are_typed_errors() {
    smol::block_on(async {
        for node in [
            Node::local("services").unwrap(),
            common::node(&MemoryNetwork::new(), "services", "a").await,
        ] {
            assert_eq!(
                node.lock_service("").unwrap_err(),
                ServiceError::InvalidName(LockNameError::Empty)
            );
            assert!(matches!(
                node.lock_service("s".repeat(65)),
                Err(ServiceError::InvalidName(LockNameError::TooLong {
                    len: 65,
                    max: 64
                }))
            ));
            let service = node.lock_service("s".repeat(64)).unwrap();
            assert_eq!(service.name().as_str(), "s".repeat(64));
            let backend = node.backend().clone();
            node.leave().await;
            let after = Node::with_backend(backend);
            assert_eq!(
                after.lock_service("late").unwrap_err(),
                ServiceError::Shutdown
            );
            assert!(service.is_destroyed(), "the node's shutdown closed it");
        }
        // The local backend has the group backend's cap.
        let node = Node::local("many").unwrap();
        for i in 0..conclave::protocol::MAX_SERVICES {
            node.lock_service(format!("s{i}")).unwrap();
        }
        assert_eq!(
            node.lock_service("one-more").unwrap_err(),
            ServiceError::TooManyServices
        );
        assert!(
            node.lock_service("s0").is_ok(),
            "an open service opens again"
        );
        node.leave().await;
    });
}

/// `LockService::destroy` destroys at its first poll: dropping the future then only stops
/// waiting for the grantor's acknowledgements.
#[test]
fn destroy_is_done_at_the_first_poll() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "destroy", 2).await;
        let service = nodes[1].lock_service("billing").unwrap();
        within(WAIT, "serving", service.wait_until_serving()).await;
        let mutex = service.mutex("a").unwrap();
        let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
        let mut destroy = Box::pin(service.destroy());
        let _ = futures::poll!(destroy.as_mut());
        drop(destroy);
        assert_eq!(
            within(WAIT, "lost", guard.lost()).await,
            LockLostReason::ServiceDestroyed
        );
        assert_eq!(
            within(WAIT, "try_lock", mutex.try_lock())
                .await
                .unwrap_err(),
            LockError::ServiceDestroyed
        );
        assert_eq!(service.held_locks(), Vec::new());
        // The release reached the grantor: the lock is free in the service at the other member.
        let elsewhere = nodes[0].lock_service("billing").unwrap();
        let guard = within(WAIT, "lock elsewhere", elsewhere.mutex("a").unwrap().lock()).await;
        drop(guard.unwrap());
        for node in nodes {
            node.leave().await;
        }
    });
}

#[test]
fn caller_mistakes_are_typed_errors() {
    smol::block_on(async {
        let error = Node::builder("c").join().await.unwrap_err();
        assert!(matches!(error, NodeError::NoTransport), "{error}");
        let network = MemoryNetwork::new();
        let error = Node::builder("c")
            .name("bad\nname")
            .transport(network.transport())
            .join()
            .await
            .unwrap_err();
        assert!(matches!(error, NodeError::InvalidName(_)), "{error}");
        let node = common::node(&network, "c", "ok").await;
        assert_eq!(node.mutex("").unwrap_err(), LockNameError::Empty);
        assert!(matches!(
            node.rw_lock("x".repeat(300)),
            Err(LockNameError::TooLong { .. })
        ));
        node.leave().await;
    });
}

#[test]
fn readers_share_and_writers_exclude_across_nodes() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "rw", 2).await;
        let (a, b) = (
            nodes[0].rw_lock("doc").unwrap(),
            nodes[1].rw_lock("doc").unwrap(),
        );
        let r1 = within(WAIT, "read a", a.read()).await.unwrap();
        let r2 = within(WAIT, "read b", b.try_read()).await.unwrap();
        assert_eq!(r2.mode(), LockMode::Shared);
        assert_eq!(
            within(WAIT, "try_write", b.try_write()).await.unwrap_err(),
            LockError::WouldBlock
        );
        let mut writer = Box::pin(b.write());
        assert!(futures::poll!(writer.as_mut()).is_pending());
        drop(r1);
        assert!(
            futures::poll!(writer.as_mut()).is_pending(),
            "one reader still holds it"
        );
        drop(r2);
        let w = within(WAIT, "write", writer).await.unwrap();
        assert_eq!(w.mode(), LockMode::Exclusive);
        assert_ne!(w.status(), LockStatus::Lost);
        assert_eq!(
            within(WAIT, "try_read", a.try_read()).await.unwrap_err(),
            LockError::WouldBlock
        );
        within(WAIT, "unlock", w.unlock()).await.unwrap();
        for node in nodes {
            node.leave().await;
        }
    });
}

#[test]
fn lock_events_and_views_are_streamed() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let first = common::node(&network, "ev", "ev-0").await;
        let mut views = first.views();
        let initial = within(WAIT, "current view", views.next()).await.unwrap();
        assert_eq!(initial.len(), 1);
        let mut events = first.lock_events();
        let second = common::node(&network, "ev", "ev-1").await;
        let grown = within(WAIT, "next view", views.next()).await.unwrap();
        assert!(grown.epoch() > initial.epoch() && grown.contains(second.member_id()));

        // An immediate grant: no `Waiting` (it would be a false alarm).
        let mutex = first.mutex("e").unwrap();
        let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
        let mut kinds = Vec::new();
        while kinds.len() < 2 {
            let event = within(WAIT, "event", events.next()).await.unwrap();
            kinds.push(kind(&event));
        }
        assert_eq!(kinds, ["created", "locked"]);
        // A second owner on this member is queued behind it: `Waiting`, position 1, then
        // `Locked` once the first releases.
        let second_owner = first.mutex("e").unwrap();
        let mut queued = Box::pin(second_owner.lock());
        let waiting = within(WAIT, "waiting event", async {
            loop {
                let _ = futures::poll!(queued.as_mut());
                match events.next().await {
                    Some(LockEvent::Waiting { position, .. }) => return position,
                    Some(LockEvent::Created { .. }) => continue,
                    Some(other) => panic!("{other:?} before the waiter was queued"),
                    None => return 0,
                }
            }
        })
        .await;
        assert_eq!(waiting, 1, "queued first, behind the holder");
        within(WAIT, "unlock", guard.unlock()).await.unwrap();
        let later = within(WAIT, "second granted", queued).await.unwrap();
        within(WAIT, "unlock", later.unlock()).await.unwrap();
        let mut kinds = Vec::new();
        while kinds.len() < 3 {
            let event = within(WAIT, "event", events.next()).await.unwrap();
            kinds.push(kind(&event));
        }
        assert_eq!(kinds, ["unlocked", "locked", "unlocked"]);
        second.leave().await;
        first.leave().await;
        assert!(
            within(WAIT, "views end", views.collect::<Vec<_>>())
                .await
                .len()
                <= 2
        );
    });
}

fn kind(event: &LockEvent) -> &'static str {
    match event {
        LockEvent::Created { .. } => "created",
        LockEvent::Waiting { .. } => "waiting",
        LockEvent::Locked { .. } => "locked",
        LockEvent::Unlocked { .. } => "unlocked",
        _ => "other",
    }
}

/// `unlock()` releases even when its future is dropped unpolled, or after one poll.
#[test]
fn dropped_unlock_futures_still_release() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "unlock-drop", 2).await;
        let mutex = nodes[1].mutex("u").unwrap();
        let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
        drop(guard.unlock());
        assert!(nodes[1].held_locks().is_empty());
        let guard = within(WAIT, "lock again", mutex.lock()).await.unwrap();
        let mut unlock = Box::pin(guard.unlock());
        let _ = futures::poll!(unlock.as_mut());
        drop(unlock);
        assert!(nodes[1].held_locks().is_empty());
        let other = within(
            WAIT,
            "free",
            nodes[0].mutex("u").unwrap().lock_timeout(WAIT),
        )
        .await;
        assert!(other.is_ok());
        drop(other);
        for node in nodes {
            node.leave().await;
        }
    });
}

/// Waiting futures busy-poll for `spin_wait`, then sleep until woken: with no spin, with the
/// default, and with a spin longer than the wait, a waiter on a remote grantor is answered
/// once the holder releases, and its acknowledged unlock completes.
#[test]
fn waiters_are_answered_whatever_their_spin() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let grantor = common::node(&network, "spin", "grantor").await;
        for (i, spin) in [
            Duration::ZERO,
            conclave::DEFAULT_SPIN_WAIT,
            Duration::from_secs(60),
        ]
        .into_iter()
        .enumerate()
        {
            let waiter = within(
                WAIT,
                "join",
                Node::builder("spin")
                    .name(format!("waiter-{i}"))
                    .transport(network.transport())
                    .config(conclave::EndpointConfig::local())
                    .spin_wait(spin)
                    .join(),
            )
            .await
            .unwrap();
            common::agree(&[&grantor, &waiter]).await;
            let held = within(WAIT, "grantor locks", grantor.mutex("s").unwrap().lock())
                .await
                .unwrap();
            let mutex = waiter.mutex("s").unwrap();
            let mut wait = Box::pin(mutex.lock());
            assert!(futures::poll!(wait.as_mut()).is_pending());
            drop(held);
            let guard = within(WAIT, "waiter granted", wait).await.unwrap();
            within(WAIT, "acknowledged unlock", guard.unlock())
                .await
                .unwrap();
            waiter.leave().await;
        }
        grantor.leave().await;
    });
}

/// Counts the wake-ups it is asked for.
#[derive(Default)]
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Polls `fut` once with a counting waker; returns whether it is pending and how many times
/// the poll woke its own task (a busy-polling wait asks to be polled again at once).
fn poll_counting<F: std::future::Future + Unpin>(fut: &mut F) -> (bool, usize) {
    let counter = std::sync::Arc::new(CountingWaker::default());
    let waker = std::task::Waker::from(counter.clone());
    let mut cx = std::task::Context::from_waker(&waker);
    let pending = std::pin::Pin::new(fut).poll(&mut cx).is_pending();
    (pending, counter.0.load(std::sync::atomic::Ordering::SeqCst))
}

/// A waiter the grantor queued behind another owner stops busy-polling and sleeps until its
/// grant wakes it, even with a spin longer than the wait; and a later request of that lock,
/// contended here, sleeps from its first poll. (On a small machine spinning waiters take the
/// CPU the grantor and the next holder need: `docs/benchmarks.md`, issue 16.) A request of a
/// lock nobody else holds still spins, and each waiter is granted in turn.
#[test]
fn a_queued_waiter_sleeps_instead_of_spinning() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let grantor = common::node(&network, "quiet", "grantor").await;
        let waiter = within(
            WAIT,
            "join",
            Node::builder("quiet")
                .name("waiter")
                .transport(network.transport())
                .config(conclave::EndpointConfig::local())
                .spin_wait(Duration::from_secs(60))
                .join(),
        )
        .await
        .unwrap();
        common::agree(&[&grantor, &waiter]).await;
        let mut events = waiter.lock_events();
        let mutex = waiter.mutex("hot").unwrap();

        // Uncontended: the wait spins (it wakes itself) until its grant.
        let mut free = Box::pin(mutex.lock());
        let (pending, self_wakes) = poll_counting(&mut free);
        assert!(!pending || self_wakes > 0, "a free lock's wait spins");
        // A spin can last until the grant: then the first poll handed out the guard (and
        // `poll_counting` dropped it), and the finished future must not be awaited again.
        if pending {
            drop(within(WAIT, "free lock", free).await.unwrap());
        }

        let held = within(WAIT, "grantor locks", grantor.mutex("hot").unwrap().lock())
            .await
            .unwrap();
        let mut queued = Box::pin(mutex.lock());
        within(WAIT, "queued", async {
            loop {
                let _ = futures::poll!(queued.as_mut());
                if let Some(LockEvent::Waiting { .. }) = events.next().await {
                    return;
                }
            }
        })
        .await;
        assert_eq!(
            poll_counting(&mut queued),
            (true, 0),
            "a queued waiter sleeps: its poll does not wake its own task"
        );
        // Another owner of this member, on the same lock, now known to be contended.
        let mut next = Box::pin(mutex.lock());
        assert_eq!(
            poll_counting(&mut next),
            (true, 0),
            "a request of a contended lock does not spin"
        );
        drop(held);
        let first = within(WAIT, "queued waiter granted", queued).await.unwrap();
        drop(first);
        let second = within(WAIT, "next waiter granted", next).await.unwrap();
        within(WAIT, "unlock", second.unlock()).await.unwrap();
        waiter.leave().await;
        grantor.leave().await;
    });
}

/// Dropping a node never blocks: it starts the leave and returns; the driver thread finishes
/// the leave in the background. Here the leave cannot complete quickly (the node is cut off, so
/// it waits for its leave timeout), yet `drop` returns before the node has stopped: its view
/// stream is still open right after the drop, and ends later.
#[test]
fn dropping_a_node_does_not_block() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "drop", 2).await;
        let addrs: Vec<_> = nodes.iter().map(|n| n.member_id().addr()).collect();
        let mut nodes = nodes.into_iter();
        let (kept, dropped) = (nodes.next().unwrap(), nodes.next().unwrap());
        network.partition(&[&addrs[..1], &addrs[1..]]);
        let mut views = dropped.views();
        let _current = within(WAIT, "current view", views.next()).await;
        drop(dropped);
        assert!(
            futures::poll!(views.next()).is_pending(),
            "drop returned before the node finished leaving"
        );
        within(WAIT, "the node stops in the background", async {
            while views.next().await.is_some() {}
        })
        .await;
        network.heal();
        kept.leave().await;
    });
}

/// A grant that arrives after its owner gave the request up is released and reported to the
/// unexpected-lock handlers, once, with the reason; the lock is free again afterwards.
#[test]
fn a_grant_after_the_owner_gave_up_is_reported_and_released() {
    use conclave::UnexpectedGrant;

    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "unexpected", 2).await;
        let (grantor, member) = (&nodes[0], &nodes[1]);
        let (reports, reported) = async_channel::unbounded();
        member.on_unexpected_lock(move |report| {
            let _ = reports.try_send(report.clone());
        });
        let held = within(WAIT, "lock", grantor.mutex("late").unwrap().lock())
            .await
            .unwrap();
        let mut events = member.lock_events();
        let mut request = Box::pin(member.mutex("late").unwrap().lock());
        assert!(futures::poll!(request.as_mut()).is_pending());
        within(WAIT, "queued", async {
            while !matches!(events.next().await, Some(LockEvent::Waiting { .. })) {}
        })
        .await;
        // From now on every datagram takes a while: the grant the release makes is on its way
        // to the member when the member gives the request up.
        network.set_delay(Duration::from_millis(20));
        within(WAIT, "unlock", held.unlock()).await.unwrap();
        drop(request);
        let report = within(WAIT, "the report", reported.recv()).await.unwrap();
        assert_eq!(report.reason, UnexpectedGrant::Withdrawn);
        assert_eq!(report.name.as_str(), "late");
        assert!(member.held_locks().is_empty(), "the member holds nothing");
        let again = within(WAIT, "the lock is free again", async {
            grantor.mutex("late").unwrap().lock_timeout(WAIT).await
        })
        .await
        .unwrap();
        assert!(again.fencing_token() > report.token);
        assert!(reported.try_recv().is_err(), "reported once");
        drop(again);
    });
}
