//! Unit tests of duplicate resolution.

use std::net::SocketAddr;

use conclave_lock_api::FencingToken;

use super::*;

fn holder(member: u8, token: u64, mode: LockMode) -> Holder {
    Holder {
        lease_until: None,
        owner: OwnerId {
            member: MemberId::new(
                u128::from(member),
                "m",
                SocketAddr::from(([127, 0, 0, 1], 1)),
            )
            .unwrap(),
            local: 1,
        },
        mode,
        token: FencingToken(token),
        request: RequestId(1),
    }
}

#[test]
fn highest_token_wins_whatever_the_report_order() {
    let a = holder(1, 10, LockMode::Exclusive);
    let b = holder(2, 30, LockMode::Exclusive);
    let c = holder(3, 20, LockMode::Exclusive);
    for order in [
        vec![a.clone(), b.clone(), c.clone()],
        vec![c.clone(), a.clone(), b.clone()],
    ] {
        let (kept, dropped) = resolve_duplicates(order);
        assert_eq!(kept, vec![b.clone()]);
        assert_eq!(dropped.len(), 2);
    }
}

#[test]
fn ties_go_to_the_lowest_owner() {
    let a = holder(5, 10, LockMode::Exclusive);
    let b = holder(2, 10, LockMode::Exclusive);
    let (kept, _) = resolve_duplicates(vec![a, b.clone()]);
    assert_eq!(kept, vec![b]);
}

#[test]
fn shared_winner_keeps_all_readers() {
    let r1 = holder(1, 40, LockMode::Shared);
    let r2 = holder(2, 5, LockMode::Shared);
    let w = holder(3, 30, LockMode::Exclusive);
    let (kept, dropped) = resolve_duplicates(vec![w.clone(), r2.clone(), r1.clone()]);
    assert_eq!(kept, vec![r1, r2]);
    assert_eq!(dropped, vec![w]);
}
