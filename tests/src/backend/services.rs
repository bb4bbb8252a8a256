//! The scenario of named lock services ([`conclave::LockService`]).

use std::sync::{Arc, Mutex};

use conclave::{
    LockError, LockEvent, LockEvents, LockLost, LockLostReason, LockService, LockStatus, Node,
    UnlockError,
};
use futures::StreamExt;

use super::{at, leave_all, next_matching, queued};
use crate::{within, WAIT};

/// The lock name every service of the scenario uses.
const NAME: &str = "x";

/// The name of the next lock granted or grantor change on `events`.
async fn next_locked(events: &mut LockEvents, what: &str) -> String {
    next_matching(events, what, |e| match e {
        LockEvent::Locked { name, .. } => Some(name.as_str().to_owned()),
        LockEvent::GrantorChanged { grantor } => Some(format!("grantor {grantor:?}")),
        _ => None,
    })
    .await
}

/// The names of the locks in `service`'s table (the default service's with `None`), asked
/// from `node`.
async fn table_names(node: &Node, service: Option<&LockService>) -> Vec<String> {
    let table = match service {
        Some(service) => within(WAIT, "a service's table", service.lock_table()).await,
        None => within(WAIT, "the default table", node.lock_table()).await,
    };
    let mut names: Vec<String> = table
        .unwrap()
        .locks
        .iter()
        .map(|l| l.name.as_str().to_owned())
        .collect();
    names.sort();
    names
}

/// Named services are independent namespaces: the same lock name in the default service,
/// "billing" and "shipping" is three locks; within a service exclusion holds across members;
/// each service's table and events show only its own locks; each service's grantor moves on
/// its own. Destroying a service on a member ends its waiting requests there with
/// `ServiceDestroyed`, releases its holds at the grantor (lost with `ServiceDestroyed`, told
/// to the guard, the handlers and the listeners, whose stream then ends) and leaves the other
/// services alone; the name opens afresh, and its lock is free again.
pub async fn named_services(nodes: Vec<Node>) {
    services_scenario(nodes, Grantors::PerService).await;
}

/// [`named_services`] on a backend whose services share one grantor: the Raft engine keeps
/// every service in one replicated log, so `become_grantor` on any service moves the leader
/// of them all (a difference by design; everything else is the same).
pub async fn named_services_one_log(nodes: Vec<Node>) {
    services_scenario(nodes, Grantors::Shared).await;
}

/// Whether each service has a grantor of its own.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grantors {
    PerService,
    Shared,
}

async fn services_scenario(nodes: Vec<Node>, grantors: Grantors) {
    let (a, b) = (at(&nodes, 0), at(&nodes, 1));
    let open = |node: &Node, name: &str| node.lock_service(name).unwrap();
    let (billing_a, shipping_a) = (open(a, "billing"), open(a, "shipping"));
    let (billing_b, shipping_b) = (open(b, "billing"), open(b, "shipping"));
    for service in [&billing_a, &shipping_a, &billing_b, &shipping_b] {
        let grantor = within(WAIT, "a serving grantor", service.wait_until_serving()).await;
        assert!(a
            .view()
            .unwrap()
            .contains(&grantor.expect("the service runs")));
    }
    let told = Arc::new(Mutex::new(Vec::<LockLost>::new()));
    let record = told.clone();
    billing_a.on_lock_lost(move |lost| record.lock().unwrap().push(lost.clone()));
    let mut billing_events = billing_a.lock_events();

    // One name, three locks; exclusion within a service, across members.
    let lock = |service: &LockService, name: &str| service.mutex(name).unwrap().lock();
    let held = within(WAIT, "billing/x", lock(&billing_a, NAME))
        .await
        .unwrap();
    let try_in = |mutex: conclave::DistributedMutex| async move {
        within(WAIT, "try_lock", mutex.try_lock()).await
    };
    let in_shipping = try_in(shipping_b.mutex(NAME).unwrap()).await.unwrap();
    let in_default = try_in(b.mutex(NAME).unwrap()).await.unwrap();
    assert_eq!(
        try_in(billing_b.mutex(NAME).unwrap()).await.unwrap_err(),
        LockError::WouldBlock,
        "billing/x is held in billing, from every member"
    );

    // Each service's events are its own.
    let mut shipping_events = shipping_a.lock_events();
    let mut default_events = a.lock_events();
    let in_billing_a = within(WAIT, "billing/z", lock(&billing_a, "z"))
        .await
        .unwrap();
    let in_shipping_a = within(WAIT, "shipping/y", lock(&shipping_a, "y"))
        .await
        .unwrap();
    let in_default_a = within(WAIT, "marker", a.mutex("marker").unwrap().lock())
        .await
        .unwrap();
    assert_eq!(
        next_locked(&mut billing_events, "billing's grant").await,
        "x"
    );
    assert_eq!(
        next_locked(&mut billing_events, "billing's grant").await,
        "z"
    );
    assert_eq!(
        next_locked(&mut shipping_events, "shipping's grant").await,
        "y"
    );
    assert_eq!(
        next_locked(&mut default_events, "a default grant").await,
        "marker"
    );

    // Each service's table is its own.
    for node in [a, b] {
        let service = |name| node.lock_service(name).unwrap();
        let billing = table_names(node, Some(&service("billing"))).await;
        assert_eq!(billing, ["x", "z"]);
        let shipping = table_names(node, Some(&service("shipping"))).await;
        assert_eq!(shipping, ["x", "y"]);
        assert_eq!(table_names(node, None).await, ["marker", "x"]);
    }

    // Each service's grantor moves on its own.
    if nodes.len() > 1 {
        let default_grantor = a.grantor();
        let shipping_grantor = shipping_a.grantor();
        let billing_grantor = billing_a.grantor();
        assert_eq!(
            billing_a.grantor(),
            default_grantor,
            "the coordinator grants"
        );
        within(WAIT, "billing's grantor moves", billing_b.become_grantor())
            .await
            .unwrap();
        assert_eq!(billing_b.grantor().as_ref(), Some(b.member_id()));
        if billing_grantor.as_ref() != Some(b.member_id()) {
            next_matching(&mut billing_events, "billing's new grantor", |e| {
                matches!(e, LockEvent::GrantorChanged { grantor: Some(g) } if g == b.member_id())
                    .then_some(())
            })
            .await;
        }
        assert_eq!(billing_a.grantor().as_ref(), Some(b.member_id()));
        for (node, shipping) in [(a, &shipping_a), (b, &shipping_b)] {
            if grantors == Grantors::PerService {
                assert_eq!(node.grantor(), default_grantor);
                assert_eq!(shipping.grantor(), shipping_grantor);
            } else {
                assert_eq!(node.grantor().as_ref(), Some(b.member_id()));
                assert_eq!(shipping.grantor().as_ref(), Some(b.member_id()));
            }
        }
        // No grantor change reached the default service's listeners (with one grantor for
        // every service, they were told of it).
        if grantors == Grantors::Shared && billing_grantor.as_ref() != Some(b.member_id()) {
            next_matching(&mut default_events, "the default service's new grantor", |e| {
                matches!(e, LockEvent::GrantorChanged { grantor: Some(g) } if g == b.member_id())
                    .then_some(())
            })
            .await;
        }
        let after = a.mutex("after").unwrap();
        let guard = within(WAIT, "after", after.lock()).await.unwrap();
        assert_eq!(
            next_locked(&mut default_events, "a default grant").await,
            "after"
        );
        drop(guard);
        assert_eq!(
            held.status(),
            LockStatus::Held,
            "the hold moved with billing's table"
        );
    }

    // Destroying a service ends the waits there.
    let mut waiting_events = billing_b.lock_events();
    let stale = billing_b.mutex(NAME).unwrap();
    let mut waiting = Box::pin(stale.lock());
    assert!(futures::poll!(waiting.as_mut()).is_pending());
    queued(&mut waiting_events, NAME).await;
    within(WAIT, "destroy billing on b", billing_b.destroy()).await;
    assert!(billing_b.is_destroyed());
    assert_eq!(
        within(WAIT, "the waiting request", waiting)
            .await
            .unwrap_err(),
        LockError::ServiceDestroyed
    );
    assert_eq!(
        within(WAIT, "a request after destroy", stale.try_lock())
            .await
            .unwrap_err(),
        LockError::ServiceDestroyed
    );
    assert_eq!(
        within(
            WAIT,
            "become_grantor after destroy",
            billing_b.become_grantor()
        )
        .await,
        Err(LockError::ServiceDestroyed)
    );
    assert_eq!(
        within(WAIT, "lock_table after destroy", billing_b.lock_table())
            .await
            .unwrap_err(),
        LockError::ServiceDestroyed
    );
    if nodes.len() > 1 {
        assert_eq!(held.status(), LockStatus::Held, "a's billing is its own");
    }

    // ... and releases the holds, told as losses.
    let token = held.fencing_token();
    within(WAIT, "destroy billing on a", billing_a.destroy()).await;
    assert_eq!(held.status(), LockStatus::Lost);
    let lost = within(WAIT, "lost()", held.lost()).await;
    assert_eq!(lost, LockLostReason::ServiceDestroyed);
    let mut reported: Vec<(String, LockLostReason)> = told
        .lock()
        .unwrap()
        .iter()
        .map(|l| (l.name.as_str().to_owned(), l.reason))
        .collect();
    reported.sort_by(|x, y| x.0.cmp(&y.0));
    let destroyed = LockLostReason::ServiceDestroyed;
    assert_eq!(
        reported,
        [("x".to_owned(), destroyed), ("z".to_owned(), destroyed)]
    );
    let lost_events = within(WAIT, "billing's event stream ends", async {
        let mut lost = Vec::new();
        while let Some(event) = billing_events.next().await {
            match event {
                LockEvent::Lost { name, reason, .. } => {
                    lost.push((name.as_str().to_owned(), reason))
                }
                LockEvent::Locked { name, .. } => panic!("another service's grant of {name}"),
                _ => {}
            }
        }
        lost.sort_by(|x, y| x.0.cmp(&y.0));
        lost
    })
    .await;
    assert_eq!(lost_events, reported);
    assert_eq!(
        within(WAIT, "unlock of a destroyed hold", held.unlock()).await,
        Err(UnlockError::Lost(LockLostReason::ServiceDestroyed))
    );
    assert_eq!(in_billing_a.status(), LockStatus::Lost);
    for guard in [&in_shipping, &in_default, &in_shipping_a, &in_default_a] {
        assert_eq!(
            guard.status(),
            LockStatus::Held,
            "other services are untouched"
        );
    }

    // The name opens afresh, and the lock was released at the grantor.
    let billing = b.lock_service("billing").unwrap();
    assert!(!billing.is_destroyed());
    let again = within(WAIT, "billing/x again", lock(&billing, NAME))
        .await
        .unwrap();
    assert!(again.fencing_token() > token);
    within(WAIT, "unlock", again.unlock()).await.unwrap();
    drop((
        in_shipping,
        in_default,
        in_shipping_a,
        in_default_a,
        in_billing_a,
    ));
    leave_all(nodes).await;
    assert_eq!(
        within(
            WAIT,
            "after shutdown",
            shipping_a.mutex("late").unwrap().try_lock()
        )
        .await
        .unwrap_err(),
        LockError::Shutdown
    );
}
