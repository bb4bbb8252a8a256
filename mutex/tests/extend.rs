//! Renewing a hold's own lease while it is held (`extend` on every guard kind): a renewed
//! hold outlives its first lease, and a renewal that cannot reach the grantor ends in the
//! lost signal.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use async_io::Timer;
use common::{cluster, within, WAIT};
use conclave::memory::MemoryNetwork;
use conclave::{LockError, LockLostReason, LockStatus, Node};

/// The holds' own lease in these tests.
const LEASE: Duration = Duration::from_millis(300);

/// Keeps renewing through `extend` every third of [`LEASE`] for four leases, checking after
/// each renewal that the hold is still held; then the lock is still busy at `other`.
async fn renew_for_four_leases(
    extend: &dyn Fn() -> Result<(), LockError>,
    status: &dyn Fn() -> LockStatus,
) {
    let until = Instant::now() + LEASE * 4;
    while Instant::now() < until {
        extend().unwrap();
        Timer::after(LEASE / 3).await;
        assert_eq!(status(), LockStatus::Held, "a renewed hold stays held");
    }
}

async fn busy_at(other: &Node, lock: &str) {
    let again = other.mutex(lock).unwrap().try_lock().await;
    assert_eq!(
        again.err(),
        Some(LockError::WouldBlock),
        "{lock}: still held"
    );
}

/// A leased hold renewed in time is held well past its first lease, for every guard kind
/// (mutex, write and read locks, reentrant lock), and the grantor keeps it: another member
/// is refused it until it is released, then gets it.
#[test]
fn a_renewed_hold_outlives_its_first_lease() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "extend", 3).await;
        within(WAIT, "serving", nodes[2].wait_until_serving()).await;
        let (holder, other) = (&nodes[2], &nodes[1]);

        let mutex = holder.mutex("m").unwrap();
        let guard = within(WAIT, "mutex", mutex.lock_with_lease(LEASE))
            .await
            .unwrap();
        renew_for_four_leases(&|| guard.extend(LEASE), &|| guard.status()).await;
        busy_at(other, "m").await;
        let token = guard.fencing_token();
        drop(guard);
        let next = within(WAIT, "after the release", other.mutex("m").unwrap().lock())
            .await
            .unwrap();
        assert!(next.fencing_token() > token);

        let rw = holder.rw_lock("w").unwrap();
        let write = within(WAIT, "write", rw.write().lease(LEASE))
            .await
            .unwrap();
        renew_for_four_leases(&|| write.extend(LEASE), &|| write.status()).await;
        busy_at(other, "w").await;
        drop(write);
        let read = within(WAIT, "read", rw.read().lease(LEASE)).await.unwrap();
        renew_for_four_leases(&|| read.extend(LEASE), &|| read.status()).await;
        busy_at(other, "w").await;
        drop(read);

        let reentrant = holder.reentrant_lock("r").unwrap();
        let outer = within(WAIT, "reentrant", reentrant.lock_with_lease(LEASE))
            .await
            .unwrap();
        let inner = within(WAIT, "nested", reentrant.lock()).await.unwrap();
        renew_for_four_leases(&|| inner.extend(LEASE), &|| outer.status()).await;
        busy_at(other, "r").await;
        drop(inner);
        drop(outer);
    });
}

/// A hold without a lease of its own has nothing to renew: `extend` is `Ok` and changes
/// nothing; on a lost hold it reports the loss.
#[test]
fn extend_on_a_hold_without_a_lease_and_on_a_lost_hold() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "extend-plain", 3).await;
        within(WAIT, "serving", nodes[2].wait_until_serving()).await;
        let guard = within(WAIT, "lock", nodes[2].mutex("p").unwrap().lock())
            .await
            .unwrap();
        guard.extend(LEASE).unwrap();
        Timer::after(LEASE * 2).await;
        assert_eq!(guard.status(), LockStatus::Held, "no lease to run out");
        drop(guard);

        let short = Duration::from_millis(100);
        let guard = within(
            WAIT,
            "leased",
            nodes[2].mutex("q").unwrap().lock_with_lease(short),
        )
        .await
        .unwrap();
        let reason = within(WAIT, "the lease runs out", guard.lost()).await;
        assert_eq!(reason, LockLostReason::LeaseExpired);
        assert_eq!(
            guard.extend(LEASE),
            Err(LockError::Lost(LockLostReason::LeaseExpired))
        );
    });
}

/// A renewal that cannot reach the grantor (the holder's member is cut off from everyone)
/// is never silent: the old deadline stands, and when it passes the hold is lost with
/// `LeaseExpired`: `lost()` resolves, the status reads `Lost`.
#[test]
fn a_renewal_that_cannot_reach_the_grantor_ends_in_lost() {
    smol::block_on(async {
        let network = MemoryNetwork::new();
        let nodes = cluster(&network, "extend-cut", 3).await;
        within(WAIT, "serving", nodes[2].wait_until_serving()).await;
        let holder = &nodes[2];
        let guard = within(
            WAIT,
            "lock",
            holder.mutex("c").unwrap().lock_with_lease(LEASE),
        )
        .await
        .unwrap();
        network.isolate(holder.member_id().addr());
        guard.extend(Duration::from_secs(60)).unwrap();
        let reason = within(WAIT, "the old lease runs out", guard.lost()).await;
        assert_eq!(reason, LockLostReason::LeaseExpired);
        assert_eq!(guard.status(), LockStatus::Lost);
    });
}
