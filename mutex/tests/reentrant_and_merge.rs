//! Reentrant locks, and a partition that heals with two holders of one lock.

#![allow(clippy::unwrap_used)]

mod common;

use common::{agree, cluster, within, WAIT};
use conclave::memory::MemoryNetwork;
use conclave::{LockError, LockLostReason, LockStatus};
use futures::future::{select, Either};

#[test]
fn one_owner_reenters_and_releases_at_zero() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "reentrant", 2).await;
        let lock = nodes[0].reentrant_lock("r").unwrap();
        let clone = lock.clone();
        let first = within(WAIT, "lock", lock.lock()).await.unwrap();
        let second = within(WAIT, "clone re-locks", clone.try_lock())
            .await
            .unwrap();
        assert_eq!(first.fencing_token(), second.fencing_token());
        assert_eq!(lock.hold_count(), 2);

        // Other owners wait: another handle on the same node, and another node.
        let same_node = nodes[0].reentrant_lock("r").unwrap();
        assert_eq!(
            within(WAIT, "other handle", same_node.try_lock())
                .await
                .unwrap_err(),
            LockError::WouldBlock
        );
        let remote = nodes[1].reentrant_lock("r").unwrap();
        let mut remote_waits = Box::pin(remote.lock());
        assert!(futures::poll!(remote_waits.as_mut()).is_pending());

        drop(first);
        assert_eq!(lock.hold_count(), 1);
        assert_ne!(second.status(), LockStatus::Lost);
        assert!(
            futures::poll!(remote_waits.as_mut()).is_pending(),
            "still held once"
        );
        drop(second);
        let remote_guard = within(WAIT, "remote gets it at zero", remote_waits)
            .await
            .unwrap();
        assert_eq!(lock.hold_count(), 0);
        drop(remote_guard);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Every guard has the same surface: a reentrant guard's `unlock()` ends a nested hold at once
/// and releases (acknowledged by the grantor) with the last one; `lost()` is an owned future
/// that outlives the guard and does not resolve after a normal release.
#[test]
fn reentrant_guards_unlock_and_watch_like_every_guard() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "surface", 2).await;
        let lock = nodes[0].reentrant_lock("s").unwrap();
        let outer = within(WAIT, "lock", lock.lock()).await.unwrap();
        let inner = within(WAIT, "nested", lock.lock()).await.unwrap();
        let mut watch = Box::pin(outer.lost());
        within(WAIT, "nested unlock", inner.unlock()).await.unwrap();
        assert_eq!(lock.hold_count(), 1);
        assert!(futures::poll!(watch.as_mut()).is_pending());
        within(WAIT, "last unlock", outer.unlock()).await.unwrap();
        assert_eq!(lock.hold_count(), 0);
        // Released at the grantor: another node takes it at once.
        let other = within(WAIT, "other node", nodes[1].mutex("s").unwrap().try_lock()).await;
        assert!(other.is_ok(), "{other:?}");
        assert!(
            futures::poll!(watch.as_mut()).is_pending(),
            "a released hold is not lost"
        );
        // A mutex guard's `lost()` is owned too: watched while the guard is released.
        let guard = within(WAIT, "mutex", nodes[0].mutex("m").unwrap().lock())
            .await
            .unwrap();
        let mut watch = Box::pin(guard.lost());
        within(WAIT, "unlock", guard.unlock()).await.unwrap();
        assert!(futures::poll!(watch.as_mut()).is_pending());
        drop(other);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Clones of one handle asking at the same time make one request; dropping the clone whose
/// request is in flight hands the acquisition to the other.
#[test]
fn clones_acquiring_together_share_one_request() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "reentrant-race", 2).await;
        let blocker = within(WAIT, "block", nodes[1].mutex("r").unwrap().lock())
            .await
            .unwrap();
        let lock = nodes[0].reentrant_lock("r").unwrap();
        let mut first = Box::pin(lock.lock());
        let mut second = Box::pin(lock.clone().lock());
        assert!(futures::poll!(first.as_mut()).is_pending());
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert_eq!(nodes[0].pending_requests(), 1);
        drop(first);
        assert!(futures::poll!(second.as_mut()).is_pending());
        assert_eq!(
            nodes[0].pending_requests(),
            1,
            "the clone asked in its place"
        );
        drop(blocker);
        let guard = within(WAIT, "second", second).await.unwrap();
        assert_eq!(lock.hold_count(), 1);
        drop(guard);
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Under the `Available` policy both sides of a partition grant the same lock; when the
/// partition heals and the views merge, one holder is kept and the other is told, through
/// its guard and the unexpected-status handler.
#[test]
fn merge_resolves_duplicate_holders_and_tells_the_loser() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "merge", 3).await;
        let (tell, told) = async_channel::unbounded();
        for node in &nodes {
            let tell = tell.clone();
            let me = node.member_id().clone();
            node.on_lock_lost(move |lost| {
                let _ = tell.try_send((me.clone(), lost.reason));
            });
        }
        let addrs: Vec<_> = nodes.iter().map(|n| n.member_id().addr()).collect();
        network.partition(&[&addrs[..1], &addrs[1..]]);
        agree(&[&nodes[0]]).await;
        agree(&[&nodes[1], &nodes[2]]).await;

        let left = within(WAIT, "left side locks", nodes[0].mutex("d").unwrap().lock())
            .await
            .unwrap();
        let right = within(
            WAIT,
            "right side locks",
            nodes[1].mutex("d").unwrap().lock(),
        )
        .await
        .unwrap();

        network.heal();
        agree(&[&nodes[0], &nodes[1], &nodes[2]]).await;
        let reason = within(WAIT, "one duplicate lost", async {
            match select(left.lost(), right.lost()).await {
                Either::Left((reason, _)) | Either::Right((reason, _)) => reason,
            }
        })
        .await;
        assert_eq!(reason, LockLostReason::Duplicate);
        let statuses = [left.status(), right.status()];
        assert_eq!(
            statuses.iter().filter(|s| **s == LockStatus::Lost).count(),
            1,
            "{statuses:?}"
        );
        let (loser, reason) = within(WAIT, "handler", told.recv()).await.unwrap();
        assert_eq!(reason, LockLostReason::Duplicate);
        assert!(loser == *nodes[0].member_id() || loser == *nodes[1].member_id());
        drop((left, right));
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Under `Majority`, a member cut off into a minority reports its lock lost (to the guard and
/// the handler); the majority side grants the lock again, with a higher fencing token. A
/// reentrant hold that was lost is never entered again: the nested call fails with
/// `LockError::Lost` and the hold count stays. The minority's requests end with
/// `LockError::NotMember`.
#[test]
fn minority_loses_its_locks_under_majority() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut nodes = Vec::new();
        for i in 0..3 {
            let node = within(
                WAIT,
                "join",
                conclave::Node::builder("majority")
                    .name(format!("majority-{i}"))
                    .transport(network.transport())
                    .config(conclave::EndpointConfig::local())
                    .partition_policy(conclave::PartitionPolicy::Majority { cluster_size: 3 })
                    .join(),
            )
            .await
            .unwrap();
            nodes.push(node);
        }
        agree(&nodes.iter().collect::<Vec<_>>()).await;
        let (tell, told) = async_channel::unbounded();
        nodes[2].on_lock_lost(move |lost| {
            let _ = tell.try_send(lost.reason);
        });
        let held = within(WAIT, "lock", nodes[2].mutex("k").unwrap().lock())
            .await
            .unwrap();
        let reentrant = nodes[2].reentrant_lock("r").unwrap();
        let outer = within(WAIT, "reentrant lock", reentrant.lock())
            .await
            .unwrap();
        let addrs: Vec<_> = nodes.iter().map(|n| n.member_id().addr()).collect();
        network.partition(&[&addrs[..2], &addrs[2..]]);
        let reason = within(WAIT, "minority loses", held.lost()).await;
        assert!(
            matches!(
                reason,
                LockLostReason::Minority | LockLostReason::LeaseExpired
            ),
            "{reason:?}"
        );
        assert_eq!(held.status(), LockStatus::Lost);
        assert_eq!(within(WAIT, "handler", told.recv()).await.unwrap(), reason);
        let outer_lost = within(WAIT, "reentrant hold lost", async {
            while outer.status() != LockStatus::Lost {
                smol::Timer::after(std::time::Duration::from_millis(10)).await;
            }
        });
        outer_lost.await;
        assert!(matches!(
            within(WAIT, "reentrant lost()", outer.lost()).await,
            LockLostReason::Minority | LockLostReason::LeaseExpired
        ));
        assert_eq!(reentrant.hold_count(), 1);
        for nested in [reentrant.try_lock(), reentrant.lock()] {
            let nested = within(WAIT, "nested lock", nested).await;
            assert!(
                matches!(nested, Err(LockError::Lost(_))),
                "a lost hold is not entered again: {nested:?}"
            );
        }
        assert_eq!(reentrant.hold_count(), 1, "the count did not grow");
        // Cut off in a minority, the node is told it cannot be granted anything: a try-lock at
        // once, a waiting lock once it has been outside a majority for the lease.
        let free = nodes[2].mutex("free-elsewhere").unwrap();
        assert!(matches!(
            within(WAIT, "try in a minority", free.try_lock()).await,
            Err(LockError::NotMember)
        ));
        assert!(matches!(
            within(WAIT, "wait in a minority", free.lock()).await,
            Err(LockError::NotMember)
        ));
        drop(outer);
        assert_eq!(reentrant.hold_count(), 0);
        let again = within(
            WAIT,
            "majority re-grants",
            nodes[0].mutex("k").unwrap().lock_timeout(WAIT),
        )
        .await
        .unwrap();
        assert!(again.fencing_token() > held.fencing_token());
        drop((held, again));
        network.heal();
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}

/// Under `Majority`, after the grantor is cut off, the new grantor cannot grant anything until
/// the old grantor's support and its holders' leases have run out: a try-lock of a free lock
/// meanwhile says so (`LockError::Unavailable`), never `WouldBlock` ("held by someone else"),
/// and succeeds once the new grantor serves.
#[test]
fn a_try_lock_during_failover_says_unavailable_not_would_block() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let mut nodes = Vec::new();
        for i in 0..3 {
            let node = within(
                WAIT,
                "join",
                conclave::Node::builder("grace")
                    .name(format!("grace-{i}"))
                    .transport(network.transport())
                    .config(conclave::EndpointConfig::local())
                    .partition_policy(conclave::PartitionPolicy::Majority { cluster_size: 3 })
                    .join(),
            )
            .await
            .unwrap();
            nodes.push(node);
        }
        agree(&nodes.iter().collect::<Vec<_>>()).await;
        // The cluster serves: a first lock is granted.
        let first = within(WAIT, "first lock", nodes[1].mutex("g").unwrap().lock())
            .await
            .unwrap();
        drop(first);
        let view = nodes[0].view().unwrap();
        let grantor = nodes
            .iter()
            .position(|n| n.member_id() == view.coordinator())
            .unwrap();
        let asker = (grantor + 1) % 3;
        let addrs: Vec<_> = nodes.iter().map(|n| n.member_id().addr()).collect();
        let rest: Vec<_> = (0..3).filter(|i| *i != grantor).map(|i| addrs[i]).collect();
        network.partition(&[&[addrs[grantor]], &rest]);
        let free = nodes[asker].mutex("free").unwrap();
        let (mut unavailable, mut would_block) = (0, 0);
        let outcome = within(WAIT, "the new grantor serves", async {
            loop {
                match free.try_lock().await {
                    Ok(guard) => return guard,
                    Err(LockError::Unavailable) => unavailable += 1,
                    Err(LockError::WouldBlock) => would_block += 1,
                    Err(LockError::NotMember) => {}
                    Err(other) => panic!("{other:?}"),
                }
                smol::Timer::after(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(unavailable > 0, "the grace period was seen as Unavailable");
        assert_eq!(would_block, 0, "a free lock is never WouldBlock");
        drop(outcome);
        network.heal();
        for node in nodes {
            within(WAIT, "leave", node.leave()).await;
        }
    });
}
