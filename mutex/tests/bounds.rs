//! What a lock call hands out and how long a wait for the cluster lasts: a grant lost before
//! its caller polled is never handed out as a guard, and an unlock (or any other wait for the
//! grantor) ends within the node's answer bound, at once in a minority.

#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::{agree, within, WAIT};
use conclave::memory::MemoryNetwork;
use conclave::{
    DistributedMutex, EndpointConfig, HeldLock, LockError, LockStatus, Node, PartitionPolicy,
    UnlockError,
};

/// A lock call's outcome, read the moment it completes: the status of the guard it handed
/// out, or its error.
type Acquire = Pin<Box<dyn Future<Output = Result<LockStatus, LockError>> + Send>>;

/// One waiting call of the lost-grant test: its lock, who blocks it first, where its holds
/// are listed, and the call.
type Case<'a> = (
    &'a str,
    Option<DistributedMutex>,
    &'a dyn Fn() -> Vec<HeldLock>,
    Acquire,
);

/// The lease of the holds in these tests: long enough that a promptly polled grant is held.
const LEASE: Duration = Duration::from_millis(600);

/// The answer bound of `EndpointConfig::local()`: `suspect_timeout + reconcile_timeout`.
const ANSWER_BOUND: Duration = Duration::from_millis(800);

/// Slack for a loaded test machine on top of a stated bound.
const SLACK: Duration = Duration::from_millis(1500);

async fn nodes(network: &MemoryNetwork, cluster: &str, policy: PartitionPolicy) -> Vec<Node> {
    let mut nodes = Vec::new();
    for i in 0..3 {
        let node = Node::builder(cluster)
            .name(format!("{cluster}-{i}"))
            .transport(network.transport())
            .config(EndpointConfig::local())
            .partition_policy(policy)
            .join();
        nodes.push(within(WAIT, "join", node).await.unwrap());
    }
    agree(&nodes.iter().collect::<Vec<_>>()).await;
    within(WAIT, "serving", nodes[2].wait_until_serving()).await;
    nodes
}

/// Polls `fut` once, without a task to wake: it registers its request.
fn poll_once(fut: &mut Acquire) -> Poll<Result<LockStatus, LockError>> {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    fut.as_mut().poll(&mut cx)
}

/// Waits (bounded) until `holds` lists `lock` as `held` says: any hold (`held`), or none but
/// lost ones (a lease that ran out shows `Lost`, then ends the hold).
async fn until(holds: &dyn Fn() -> Vec<HeldLock>, lock: &str, held: bool) {
    let what = if held {
        "the grant reaches the caller's node"
    } else {
        "its lease runs out unpolled"
    };
    within(WAIT, what, async {
        loop {
            let holds = holds();
            let mine = holds.iter().filter(|h| h.name.as_str() == lock);
            let done = if held {
                mine.count() > 0
            } else {
                mine.into_iter().all(|h| h.status == LockStatus::Lost)
            };
            if done {
                return;
            }
            async_io::Timer::after(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// `acquire` asks for `lock` while `blocker` holds it (or it is free); its grant reaches the
/// caller's node (whose holds `holds` lists) and its lease runs out there before the call is
/// polled again. Returns the call's outcome when it is polled then.
async fn grant_lost_before_the_poll(
    blocker: Option<DistributedMutex>,
    holds: &dyn Fn() -> Vec<HeldLock>,
    lock: &str,
    mut acquire: Acquire,
) -> Result<LockStatus, LockError> {
    let held = match &blocker {
        Some(blocker) => Some(within(WAIT, "blocker", blocker.lock()).await.unwrap()),
        None => None,
    };
    let first = poll_once(&mut acquire);
    assert!(first.is_pending(), "{lock}: asked, not answered: {first:?}");
    drop(held);
    until(holds, lock, true).await;
    until(holds, lock, false).await;
    within(WAIT, "the call completes", acquire).await
}

/// A lock call never hands out a guard that is already lost. The grant of a waiting call
/// (every kind of lock: mutex, read and write, reentrant, a named service's) reaches the node
/// but the caller does not poll until the hold's lease has run out (a paused process): the
/// call asks again and hands out a fresh, held guard. A `try_` call cannot wait: it fails
/// with `LockError::Lost`.
#[test]
fn a_grant_lost_before_the_caller_polls_is_never_handed_out() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = nodes(&network, "lost-grant", PartitionPolicy::Available).await;
        // No answer can beat the first poll.
        network.set_delay(Duration::from_millis(20));
        let node = &nodes[2];
        let service = node.lock_service("jobs").unwrap();
        let other_service = nodes[1].lock_service("jobs").unwrap();
        let node_holds = || node.held_locks();
        let service_holds = || service.held_locks();
        let blocker = |lock: &str| Some(nodes[1].mutex(lock).unwrap());
        let waiting: Vec<Case<'_>> = vec![
            ("mutex", blocker("mutex"), &node_holds, {
                let m = node.mutex("mutex").unwrap();
                Box::pin(async move {
                    m.lock_timeout_with_lease(WAIT, LEASE)
                        .await
                        .map(|g| g.status())
                })
            }),
            ("mutex-forever", blocker("mutex-forever"), &node_holds, {
                let m = node.mutex("mutex-forever").unwrap();
                Box::pin(async move { m.lock_with_lease(LEASE).await.map(|g| g.status()) })
            }),
            ("write", None, &node_holds, {
                let l = node.rw_lock("write").unwrap();
                Box::pin(async move { l.write().lease(LEASE).await.map(|g| g.status()) })
            }),
            ("read", None, &node_holds, {
                let l = node.rw_lock("read").unwrap();
                Box::pin(async move { l.read_timeout(WAIT).lease(LEASE).await.map(|g| g.status()) })
            }),
            ("reentrant", blocker("reentrant"), &node_holds, {
                let l = node.reentrant_lock("reentrant").unwrap();
                Box::pin(async move { l.lock_with_lease(LEASE).await.map(|g| g.status()) })
            }),
            (
                "service",
                Some(other_service.mutex("service").unwrap()),
                &service_holds,
                {
                    let m = service.mutex("service").unwrap();
                    Box::pin(async move {
                        m.lock_timeout_with_lease(WAIT, LEASE)
                            .await
                            .map(|g| g.status())
                    })
                },
            ),
        ];
        for (lock, blocker, holds, acquire) in waiting {
            let outcome = grant_lost_before_the_poll(blocker, holds, lock, acquire).await;
            assert_eq!(
                outcome,
                Ok(LockStatus::Held),
                "{lock}: a fresh guard, never a lost one"
            );
        }
        let trying: Vec<(&str, Acquire)> = vec![
            ("try-mutex", {
                let m = node.mutex("try-mutex").unwrap();
                Box::pin(async move { m.try_lock_with_lease(LEASE).await.map(|g| g.status()) })
            }),
            ("try-write", {
                let l = node.rw_lock("try-write").unwrap();
                Box::pin(async move { l.try_write().lease(LEASE).await.map(|g| g.status()) })
            }),
            ("try-reentrant", {
                let l = node.reentrant_lock("try-reentrant").unwrap();
                Box::pin(async move { l.try_lock_with_lease(LEASE).await.map(|g| g.status()) })
            }),
        ];
        for (lock, acquire) in trying {
            // Free: granted at once, but polled only after the lease.
            let outcome = grant_lost_before_the_poll(None, &node_holds, lock, acquire).await;
            assert!(
                matches!(outcome, Err(LockError::Lost(_))),
                "{lock}: a try call cannot wait again: {outcome:?}"
            );
        }
        drop((service, other_service));
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// An unlock whose release the grantor cannot acknowledge ends within the node's bound. Under
/// `Majority`, a holder cut off from the others unlocks before the membership notices: the
/// release is sent into the partition; once its minority view is installed the unlock ends
/// at once with `UnlockError::Unacknowledged` (as a lock there ends with `NotMember`), and
/// never later than the answer bound. The majority grants the lock again after the lease.
#[test]
fn an_unlock_cut_off_from_the_grantor_ends_within_the_bound() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = nodes(
            &network,
            "unlock-minority",
            PartitionPolicy::Majority { cluster_size: 3 },
        )
        .await;
        let held = within(WAIT, "lock", nodes[2].mutex("k").unwrap().lock())
            .await
            .unwrap();
        let addrs: Vec<_> = nodes.iter().map(|n| n.member_id().addr()).collect();
        network.partition(&[&addrs[..2], &addrs[2..]]);
        let started = Instant::now();
        let unlocked = within(WAIT, "unlock in a minority", held.unlock()).await;
        let took = started.elapsed();
        assert_eq!(unlocked, Err(UnlockError::Unacknowledged));
        assert!(took <= ANSWER_BOUND + SLACK, "the unlock took {took:?}");
        // The table query from the minority is bounded too.
        let started = Instant::now();
        let table = within(WAIT, "table in a minority", nodes[2].lock_table()).await;
        assert!(table.is_err(), "{table:?}");
        assert!(started.elapsed() <= ANSWER_BOUND + SLACK);
        let again = within(
            WAIT,
            "the majority grants again",
            nodes[0].mutex("k").unwrap().lock_timeout(WAIT),
        )
        .await;
        assert!(again.is_ok(), "{again:?}");
        drop(again);
        network.heal();
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Under `Available`, a member unlocking while its grantor is cut off waits at most the
/// answer bound: the release is acknowledged by the grantor that replaces it, or the unlock
/// ends with `UnlockError::Unacknowledged`. The lock is released here either way.
#[test]
fn an_unlock_while_the_grantor_is_cut_off_ends_within_the_bound() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = nodes(&network, "unlock-cut-off", PartitionPolicy::Available).await;
        let mutex = nodes[2].mutex("k").unwrap();
        let held = within(WAIT, "lock", mutex.lock()).await.unwrap();
        network.isolate(nodes[0].member_id().addr());
        let started = Instant::now();
        let unlocked = within(WAIT, "unlock", held.unlock()).await;
        let took = started.elapsed();
        assert!(
            matches!(unlocked, Ok(()) | Err(UnlockError::Unacknowledged)),
            "{unlocked:?}"
        );
        assert!(took <= ANSWER_BOUND + SLACK, "the unlock took {took:?}");
        assert!(nodes[2].held_locks().is_empty(), "released here");
        network.heal();
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}
