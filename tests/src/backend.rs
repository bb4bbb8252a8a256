//! The backend conformance scenarios: what every backend of the seam must do, through the
//! public API only.
//!
//! Each scenario takes the members a fixture started ([`crate::fixtures`]) and addresses
//! them as `at(nodes, i)` (modulo their number), so on a one-node backend "another member" is
//! another owner on the same node.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conclave::{
    LockError, LockEvent, LockEvents, LockLost, LockLostReason, LockMode, LockName, LockStatus,
    Node, OwnerId, UnlockError,
};
use futures::StreamExt;

use crate::{within, WAIT};

mod services;

pub use services::{named_services, named_services_one_log};

/// A short wait that must run out (a timeout that is expected to fire).
const SHORT: Duration = Duration::from_millis(150);

/// Member `i` of the cluster (modulo its size).
fn at(nodes: &[Node], i: usize) -> &Node {
    &nodes[i % nodes.len()]
}

/// The next event on `events` that `pick` accepts (what it returns), within [`WAIT`].
async fn next_matching<T>(
    events: &mut LockEvents,
    what: &str,
    mut pick: impl FnMut(&LockEvent) -> Option<T>,
) -> T {
    within(WAIT, what, async {
        loop {
            let event = events.next().await.expect("the event stream ended");
            if let Some(found) = pick(&event) {
                return found;
            }
        }
    })
    .await
}

/// Waits until `owner`'s request for `name` was queued on this member, and returns its place.
async fn queued(events: &mut LockEvents, name: &str) -> (OwnerId, u32) {
    next_matching(events, "a Waiting event", |e| match e {
        LockEvent::Waiting {
            name: n,
            owner,
            position,
            ..
        } if n.as_str() == name => Some((owner.clone(), *position)),
        _ => None,
    })
    .await
}

/// Leaves every node, each within [`WAIT`].
async fn leave_all(nodes: Vec<Node>) {
    for node in nodes {
        within(WAIT, "leave", node.leave()).await;
    }
}

/// Every member learns which grantor serves; once it knows, a `try_lock` of a free lock
/// succeeds there (never `Unavailable`), and the grantor is a member of its view.
pub async fn readiness(nodes: Vec<Node>) {
    for (i, node) in nodes.iter().enumerate() {
        let grantor = within(WAIT, "a serving grantor", node.wait_until_serving())
            .await
            .expect("the node runs");
        assert_eq!(node.grantor().as_ref(), Some(&grantor));
        assert!(node.view().unwrap().contains(&grantor));
        let mutex = node.mutex(format!("ready-{i}")).unwrap();
        let guard = within(WAIT, "try_lock once serving", mutex.try_lock())
            .await
            .unwrap();
        drop(guard);
    }
    let last = nodes.last().unwrap().mutex("ready-after").unwrap();
    leave_all(nodes).await;
    assert_eq!(
        within(WAIT, "after shutdown", last.try_lock())
            .await
            .unwrap_err(),
        LockError::Shutdown
    );
}

/// Any member can read the grantor's lock table: each lock's holders (owner, mode, token) and
/// its waiters in queue order; its printable form names them.
pub async fn inspection(nodes: Vec<Node>) {
    const NAME: &str = "inspect";
    let guard = within(WAIT, "lock", at(&nodes, 0).mutex(NAME).unwrap().lock())
        .await
        .unwrap();
    let mut waiting = Vec::new();
    let mut queued_owners = Vec::new();
    for i in 1..=2 {
        let node = at(&nodes, i);
        let mut events = node.lock_events();
        let mut request = Box::pin(node.rw_lock(NAME).unwrap().read());
        assert!(futures::poll!(request.as_mut()).is_pending());
        queued_owners.push(queued(&mut events, NAME).await.0);
        waiting.push(request);
    }
    for node in &nodes {
        let table = within(WAIT, "the lock table", node.lock_table())
            .await
            .unwrap();
        assert!(node.view().unwrap().contains(&table.grantor));
        let lock = table
            .locks
            .iter()
            .find(|l| l.name.as_str() == NAME)
            .expect("the lock is in the table");
        assert_eq!(lock.holders.len(), 1);
        let holder = &lock.holders[0];
        // A lock cached at its holder's member shows as held by that member's node owner,
        // with the token of the node grant (the guard's token is at or above it).
        let node_owner = OwnerId {
            member: guard.owner().member,
            local: conclave::api::wire::NODE_OWNER,
        };
        if holder.owner == node_owner {
            assert!(holder.token <= guard.fencing_token());
        } else {
            assert_eq!(holder.owner, guard.owner());
            assert_eq!(holder.token, guard.fencing_token());
        }
        assert_eq!(holder.mode, LockMode::Exclusive);
        // A read waiting for a delegation to its member shows as its member's node owner.
        assert_eq!(
            lock.waiters.len(),
            queued_owners.len(),
            "every waiter listed"
        );
        let waiters: Vec<OwnerId> = lock
            .waiters
            .iter()
            .zip(&queued_owners)
            .map(|(w, expected)| {
                if w.owner.local == conclave::api::wire::NODE_OWNER
                    && w.owner.member == expected.member
                {
                    expected.clone()
                } else {
                    w.owner.clone()
                }
            })
            .collect();
        assert_eq!(waiters, queued_owners, "waiters in queue order");
        assert!(lock.waiters.iter().all(|w| w.mode == LockMode::Shared));
        let printed = table.to_string();
        assert!(
            printed.contains(NAME) && printed.contains("waiting"),
            "{printed}"
        );
    }
    within(WAIT, "unlock", guard.unlock()).await.unwrap();
    for request in waiting {
        drop(within(WAIT, "a reader", request).await.unwrap());
    }
    leave_all(nodes).await;
}

/// An exclusive hold excludes every other owner, on any member, until it is released; then a
/// waiter is served with a higher token.
pub async fn exclusion(nodes: Vec<Node>) {
    let a = at(&nodes, 0).mutex("exclusion").unwrap();
    let b = at(&nodes, 1).mutex("exclusion").unwrap();
    let held = within(WAIT, "lock", a.lock()).await.unwrap();
    assert_eq!(held.status(), LockStatus::Held);
    assert_eq!(held.owner().member, *at(&nodes, 0).member_id());
    assert_eq!(
        within(WAIT, "try_lock", b.try_lock()).await.unwrap_err(),
        LockError::WouldBlock
    );
    assert_eq!(
        within(WAIT, "try_lock, same handle", a.try_lock())
            .await
            .unwrap_err(),
        LockError::WouldBlock,
        "each lock() call is its own owner"
    );
    let mut waiting = Box::pin(b.lock());
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    let first = held.fencing_token();
    within(WAIT, "unlock", held.unlock()).await.unwrap();
    let next = within(WAIT, "the waiter is served", waiting).await.unwrap();
    assert!(next.fencing_token() > first);
    assert_eq!(next.status(), LockStatus::Held);
    drop(next);
    leave_all(nodes).await;
}

/// Waiters are served in the order they were queued, whatever member they are on, and each is
/// told its place.
pub async fn fifo(nodes: Vec<Node>) {
    const NAME: &str = "fifo";
    let holder = within(WAIT, "lock", at(&nodes, 0).mutex(NAME).unwrap().lock())
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 1..=4usize {
        let node = at(&nodes, i);
        let mut events = node.lock_events();
        let mutex = node.mutex(NAME).unwrap();
        let order = order.clone();
        tasks.push(smol::spawn(async move {
            let guard = mutex.lock().await.unwrap();
            order.lock().unwrap().push(i);
            async_io::Timer::after(Duration::from_millis(5)).await;
            guard.unlock().await.unwrap();
        }));
        // The next waiter starts only once this one is queued at the grantor.
        let (_, position) = queued(&mut events, NAME).await;
        assert_eq!(
            usize::try_from(position).unwrap(),
            i,
            "its place in the queue"
        );
    }
    within(WAIT, "unlock", holder.unlock()).await.unwrap();
    for task in tasks {
        within(WAIT, "a waiter", task).await;
    }
    assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 4]);
    leave_all(nodes).await;
}

/// `try_lock` never queues; a timed-out request is withdrawn and holds nothing afterwards.
pub async fn try_and_timeout(nodes: Vec<Node>) {
    let a = at(&nodes, 0).mutex("try").unwrap();
    let b = at(&nodes, 1).mutex("try").unwrap();
    let held = within(WAIT, "try_lock of a free lock", a.try_lock())
        .await
        .unwrap();
    assert_eq!(
        within(WAIT, "try_lock", b.try_lock()).await.unwrap_err(),
        LockError::WouldBlock
    );
    assert_eq!(at(&nodes, 1).pending_requests(), 0, "try_lock never queues");
    assert_eq!(
        within(WAIT, "lock_timeout", b.lock_timeout(SHORT))
            .await
            .unwrap_err(),
        LockError::Timeout
    );
    assert_eq!(
        at(&nodes, 1).pending_requests(),
        0,
        "the request was withdrawn"
    );
    within(WAIT, "unlock", held.unlock()).await.unwrap();
    // The timed-out request did not linger at the grantor: the lock is free now.
    let again = within(WAIT, "try_lock after the release", b.try_lock())
        .await
        .unwrap();
    assert!(at(&nodes, 1)
        .held_locks()
        .iter()
        .any(|h| h.name.as_str() == "try" && h.token == again.fencing_token()));
    let granted = within(WAIT, "lock_timeout that is served", async {
        let waiting = a.lock_timeout(WAIT);
        drop(again);
        waiting.await
    })
    .await;
    assert!(granted.is_ok(), "{granted:?}");
    leave_all(nodes).await;
}

/// A dropped request is withdrawn (also when its grant races the drop): it never holds the
/// lock, and the next owner is served.
pub async fn cancellation(nodes: Vec<Node>) {
    let a = at(&nodes, 0).mutex("cancel").unwrap();
    let b = at(&nodes, 1).mutex("cancel").unwrap();
    let c = at(&nodes, 2).mutex("cancel").unwrap();
    let held = within(WAIT, "lock", a.lock()).await.unwrap();
    let mut events = at(&nodes, 1).lock_events();
    let mut waiting = Box::pin(b.lock());
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    queued(&mut events, "cancel").await;
    drop(waiting);
    assert_eq!(at(&nodes, 1).pending_requests(), 0);
    within(WAIT, "unlock", held.unlock()).await.unwrap();
    let next = within(WAIT, "the next owner", c.lock_timeout(WAIT))
        .await
        .unwrap();
    assert!(
        at(&nodes, 1)
            .held_locks()
            .iter()
            .all(|h| h.name.as_str() != "cancel" || h.owner == next.owner()),
        "the cancelled request holds nothing"
    );
    within(WAIT, "unlock", next.unlock()).await.unwrap();
    // A request dropped right after its first poll, whose grant may already be on its way.
    for _ in 0..5 {
        let mut racing = Box::pin(b.lock());
        let _ = futures::poll!(racing.as_mut());
        drop(racing);
    }
    let last = within(WAIT, "after racing drops", c.lock_timeout(WAIT))
        .await
        .unwrap();
    drop(last);
    leave_all(nodes).await;
}

/// One reentrant handle (and its clones) is one owner: it enters again at once with the same
/// token; the lock is released when its last guard goes.
pub async fn reentrancy(nodes: Vec<Node>) {
    let lock = at(&nodes, 0).reentrant_lock("reentrant").unwrap();
    let other = at(&nodes, 1).reentrant_lock("reentrant").unwrap();
    let outer = within(WAIT, "lock", lock.lock()).await.unwrap();
    let inner = within(WAIT, "lock again", lock.clone().try_lock())
        .await
        .unwrap();
    assert_eq!(lock.hold_count(), 2);
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(
        within(WAIT, "another owner", other.try_lock())
            .await
            .unwrap_err(),
        LockError::WouldBlock
    );
    within(WAIT, "nested unlock", inner.unlock()).await.unwrap();
    assert_eq!(lock.hold_count(), 1);
    assert_eq!(
        outer.status(),
        LockStatus::Held,
        "a nested unlock keeps the hold"
    );
    assert_eq!(
        within(WAIT, "another owner", other.try_lock())
            .await
            .unwrap_err(),
        LockError::WouldBlock
    );
    let token = outer.fencing_token();
    within(WAIT, "last unlock", outer.unlock()).await.unwrap();
    assert_eq!(lock.hold_count(), 0);
    let theirs = within(WAIT, "the other owner", other.try_lock())
        .await
        .unwrap();
    assert!(theirs.fencing_token() > token);
    drop(theirs);
    leave_all(nodes).await;
}

/// Readers share; a writer excludes them; a queued writer holds back later readers.
pub async fn read_write(nodes: Vec<Node>) {
    const NAME: &str = "rw";
    let (r0, r1, w2) = (
        at(&nodes, 0).rw_lock(NAME).unwrap(),
        at(&nodes, 1).rw_lock(NAME).unwrap(),
        at(&nodes, 2).rw_lock(NAME).unwrap(),
    );
    let first = within(WAIT, "read", r0.read()).await.unwrap();
    let second = within(WAIT, "read beside a reader", r1.try_read())
        .await
        .unwrap();
    assert_eq!(first.mode(), LockMode::Shared);
    assert_eq!(
        within(WAIT, "try_write", w2.try_write()).await.unwrap_err(),
        LockError::WouldBlock
    );
    let mut events = at(&nodes, 2).lock_events();
    let mut writer = Box::pin(w2.write());
    assert!(futures::poll!(writer.as_mut()).is_pending());
    queued(&mut events, NAME).await;
    assert_eq!(
        within(WAIT, "a reader behind a queued writer", r1.try_read())
            .await
            .unwrap_err(),
        LockError::WouldBlock,
        "a queued writer holds back later readers"
    );
    drop(first);
    assert!(
        futures::poll!(writer.as_mut()).is_pending(),
        "a reader still holds"
    );
    drop(second);
    let written = within(WAIT, "the writer", writer).await.unwrap();
    assert_eq!(written.mode(), LockMode::Exclusive);
    assert_eq!(
        within(WAIT, "try_read beside a writer", r0.try_read())
            .await
            .unwrap_err(),
        LockError::WouldBlock
    );
    let token = written.fencing_token();
    within(WAIT, "unlock", written.unlock()).await.unwrap();
    let read = within(WAIT, "read after the writer", r0.read())
        .await
        .unwrap();
    assert!(read.fencing_token() > token);
    drop(read);
    leave_all(nodes).await;
}

/// Fencing tokens strictly increase with every grant of a lock, whoever is granted.
pub async fn fencing_tokens(nodes: Vec<Node>) {
    let mut last = None;
    for i in 0..8 {
        let mutex = at(&nodes, i).mutex("tokens").unwrap();
        let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
        let token = guard.fencing_token();
        if let Some(last) = last {
            assert!(token > last, "{token:?} after {last:?}");
        }
        last = Some(token);
        within(WAIT, "unlock", guard.unlock()).await.unwrap();
    }
    leave_all(nodes).await;
}

/// A member's listeners see `Created` for a handle, `Locked` for a grant (with no `Waiting`
/// before an immediate grant), `Waiting` with the place in the queue before a queued request's
/// `Locked`, and `Unlocked` for a release.
pub async fn events(nodes: Vec<Node>) {
    const NAME: &str = "events";
    let node = at(&nodes, 0);
    let mut events = node.lock_events();
    let mutex = node.mutex(NAME).unwrap();
    let name = LockName::new(NAME).unwrap();
    assert_eq!(
        within(WAIT, "Created", events.next()).await,
        Some(LockEvent::Created { name: name.clone() })
    );
    let guard = within(WAIT, "lock", mutex.lock()).await.unwrap();
    let owner = guard.owner();
    assert_eq!(
        within(WAIT, "Locked", events.next()).await,
        Some(LockEvent::Locked {
            name: name.clone(),
            owner: owner.clone(),
            mode: LockMode::Exclusive,
            token: guard.fencing_token(),
        }),
        "an immediate grant: Locked, with no Waiting before it"
    );
    within(WAIT, "unlock", guard.unlock()).await.unwrap();
    assert_eq!(
        within(WAIT, "Unlocked", events.next()).await,
        Some(LockEvent::Unlocked {
            name: name.clone(),
            owner
        })
    );
    // A request queued behind another owner (on another member where there is one).
    let holder = within(WAIT, "lock", at(&nodes, 1).mutex(NAME).unwrap().lock())
        .await
        .unwrap();
    let mut waiting = Box::pin(mutex.lock());
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    let (waiter, position) = queued(&mut events, NAME).await;
    assert_eq!(position, 1);
    drop(holder);
    let served = within(WAIT, "the waiter", waiting).await.unwrap();
    assert_eq!(served.owner(), waiter);
    let token = next_matching(&mut events, "the waiter's Locked", |e| match e {
        LockEvent::Locked { owner, token, .. } if *owner == waiter => Some(*token),
        LockEvent::Waiting { owner, .. } if *owner == waiter => {
            panic!("one Waiting per request")
        }
        _ => None,
    })
    .await;
    assert_eq!(token, served.fencing_token());
    drop(served);
    leave_all(nodes).await;
}

/// A hold that ends because its member shuts down is lost, not released: its guard's `lost()`
/// resolves with `Shutdown`, its status is `Lost`, the handlers and listeners are told, and an
/// explicit unlock reports it. The lock is free for the other members.
pub async fn lost_holds(mut nodes: Vec<Node>) {
    let node = nodes.pop().unwrap();
    let told = Arc::new(Mutex::new(Vec::<LockLost>::new()));
    let record = told.clone();
    node.on_lock_lost(move |lost| record.lock().unwrap().push(lost.clone()));
    let mut events = node.lock_events();
    let guard = within(WAIT, "lock", node.mutex("lost").unwrap().lock())
        .await
        .unwrap();
    let lost = guard.lost();
    let (owner, token) = (guard.owner(), guard.fencing_token());
    within(WAIT, "leave", node.leave()).await;
    assert_eq!(within(WAIT, "lost()", lost).await, LockLostReason::Shutdown);
    assert_eq!(guard.status(), LockStatus::Lost);
    let reported = told.lock().unwrap().clone();
    assert_eq!(
        reported.len(),
        1,
        "the handler is called once: {reported:?}"
    );
    assert_eq!(reported[0].reason, LockLostReason::Shutdown);
    assert_eq!(reported[0].token, token);
    assert_eq!(reported[0].owner, owner);
    let lost_event = next_matching(&mut events, "the Lost event", |e| match e {
        LockEvent::Lost {
            owner: o, reason, ..
        } if *o == owner => Some(*reason),
        _ => None,
    })
    .await;
    assert_eq!(lost_event, LockLostReason::Shutdown);
    assert_eq!(
        within(WAIT, "unlock of a lost hold", guard.unlock()).await,
        Err(UnlockError::Lost(LockLostReason::Shutdown))
    );
    if let Some(other) = nodes.first() {
        let mutex = other.mutex("lost").unwrap();
        let guard = within(WAIT, "the lock is free again", mutex.lock_timeout(WAIT))
            .await
            .unwrap();
        assert!(guard.fencing_token() > token);
    }
    leave_all(nodes).await;
}

/// At shutdown, waiting requests fail with `Shutdown`, and so does every later request; the
/// streams end.
pub async fn shutdown(mut nodes: Vec<Node>) {
    let node = nodes.pop().unwrap();
    let holder_node = nodes.first().unwrap_or(&node);
    let held = within(WAIT, "lock", holder_node.mutex("down").unwrap().lock())
        .await
        .unwrap();
    let mutex = node.mutex("down").unwrap();
    let mut views = node.views();
    let mut events = node.lock_events();
    let mut waiting = Box::pin(mutex.lock());
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    within(WAIT, "leave", node.leave()).await;
    assert_eq!(
        within(WAIT, "the waiting request", waiting)
            .await
            .unwrap_err(),
        LockError::Shutdown
    );
    assert_eq!(
        within(WAIT, "a request after shutdown", mutex.lock())
            .await
            .unwrap_err(),
        LockError::Shutdown
    );
    within(WAIT, "the view stream ends", async {
        while views.next().await.is_some() {}
    })
    .await;
    within(WAIT, "the event stream ends", async {
        while events.next().await.is_some() {}
    })
    .await;
    drop(held);
    leave_all(nodes).await;
}

/// A hold with a lease of its own: its owner is told it is lost (`LeaseExpired`) no later
/// than the lock goes to the next waiter; `unlock` afterwards reports the loss; the table
/// shows what is left of a lease; a reentrant re-lock with a longer lease extends it.
pub async fn leases(nodes: Vec<Node>) {
    let holder = at(&nodes, 0).mutex("leased").unwrap();
    let other = at(&nodes, 1).mutex("leased").unwrap();
    let lease = Duration::from_millis(400);
    let guard = within(WAIT, "leased lock", holder.lock_with_lease(lease))
        .await
        .unwrap();
    assert_eq!(guard.status(), LockStatus::Held);
    let table = within(WAIT, "table", at(&nodes, 2).lock_table())
        .await
        .unwrap();
    let entry = table
        .locks
        .iter()
        .find(|l| l.name.as_str() == "leased")
        .expect("the leased lock is in the table");
    let left = entry.holders[0]
        .lease_ms
        .expect("the table shows the lease");
    assert!(left <= 400, "{left} ms left of a 400 ms lease");
    // The holder never releases: the lease frees the lock for the waiter.
    let lost = guard.lost();
    let (told, granted) = within(
        WAIT,
        "lease expiry and the next grant",
        futures::future::join(async { (lost.await, std::time::Instant::now()) }, async {
            (other.lock().await, std::time::Instant::now())
        }),
    )
    .await;
    assert_eq!(told.0, LockLostReason::LeaseExpired);
    let next = granted
        .0
        .expect("the waiter is granted once the lease ran out");
    assert!(
        told.1 <= granted.1,
        "the holder was told after the next grant"
    );
    assert!(next.fencing_token() > guard.fencing_token());
    assert_eq!(guard.status(), LockStatus::Lost);
    assert_eq!(
        within(WAIT, "unlock after expiry", guard.unlock()).await,
        Err(UnlockError::Lost(LockLostReason::LeaseExpired))
    );
    drop(next);

    // A reentrant re-lock with a longer lease extends the hold's lease.
    let lock = at(&nodes, 0).reentrant_lock("leased-reentrant").unwrap();
    let rival = at(&nodes, 1).reentrant_lock("leased-reentrant").unwrap();
    let outer = within(WAIT, "leased lock", lock.lock_with_lease(lease))
        .await
        .unwrap();
    let inner = within(WAIT, "re-lock", lock.lock_with_lease(WAIT * 2))
        .await
        .unwrap();
    // Let the first lease run out (time passing is what is tested here).
    within(WAIT, "pause", async_io::Timer::after(lease * 2)).await;
    assert_eq!(
        outer.status(),
        LockStatus::Held,
        "the re-lock extended the lease"
    );
    assert_eq!(
        within(WAIT, "another owner", rival.try_lock())
            .await
            .unwrap_err(),
        LockError::WouldBlock
    );
    drop((inner, outer));
    let theirs = within(WAIT, "the other owner", rival.lock()).await.unwrap();
    drop(theirs);
    leave_all(nodes).await;
}

/// `become_grantor`: the role moves to the asker with the table (a hold taken before the
/// transfer stays held and excludes others, tokens keep increasing), every member learns who
/// grants, requests from any member are served by the new grantor, and the table is asked of
/// it.
pub async fn grantor_transfer(nodes: Vec<Node>) {
    let (old, new) = (at(&nodes, 0), at(&nodes, 1));
    let mut events: Vec<LockEvents> = nodes.iter().map(Node::lock_events).collect();
    let before = within(
        WAIT,
        "a lock before the transfer",
        old.mutex("moved").unwrap().lock(),
    )
    .await
    .unwrap();
    within(WAIT, "become grantor", new.become_grantor())
        .await
        .unwrap();
    assert_eq!(new.grantor().as_ref(), Some(new.member_id()));
    // Every member learns who grants (a one-member backend is its own grantor already).
    for (node, events) in nodes.iter().zip(&mut events) {
        if node.grantor().as_ref() != Some(new.member_id()) {
            next_matching(events, "a GrantorChanged event naming the new grantor", |e| {
                matches!(e, LockEvent::GrantorChanged { grantor: Some(g) } if g == new.member_id())
                    .then_some(())
            })
            .await;
        }
        assert_eq!(node.grantor().as_ref(), Some(new.member_id()));
    }
    assert_eq!(
        before.status(),
        LockStatus::Held,
        "the hold moved with the table"
    );
    let mutex = new.mutex("moved").unwrap();
    assert_eq!(
        within(WAIT, "try while held", mutex.try_lock())
            .await
            .unwrap_err(),
        LockError::WouldBlock
    );
    let token = before.fencing_token();
    within(WAIT, "unlock", before.unlock()).await.unwrap();
    let after = within(WAIT, "lock at the new grantor", mutex.lock())
        .await
        .unwrap();
    assert!(after.fencing_token() > token);
    drop(after);
    let elsewhere = within(
        WAIT,
        "lock from another member",
        old.mutex("moved").unwrap().lock(),
    )
    .await
    .unwrap();
    drop(elsewhere);
    let table = within(WAIT, "table", old.lock_table()).await.unwrap();
    assert_eq!(&table.grantor, new.member_id());
    leave_all(nodes).await;
}
