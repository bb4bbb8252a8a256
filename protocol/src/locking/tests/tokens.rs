//! Fencing tokens of node grants and of a term's end: a cached local grant never hands out a
//! token from a node grant whose lease ran out, and a term's counter never spills into the
//! next term.

use conclave_lock_api::wire::NODE_GRANT_TOKENS;

use super::*;

/// `Majority` with node caching on at every member, a node grant asked on the first `lock()`.
fn majority_caching(cluster_size: usize) -> LockConfig {
    let mut config = majority(cluster_size);
    config.node_cache.enabled = true;
    config.node_cache.after = 1;
    config
}

fn notices_of(c: &mut Cluster, n: u8) -> Vec<LockNotice> {
    let node = c.node(n);
    std::iter::from_fn(|| node.poll_notice()).collect()
}

fn grant_of(notices: &[LockNotice], request: RequestId) -> Option<FencingToken> {
    notices.iter().find_map(|x| match x {
        LockNotice::Granted {
            request: r, token, ..
        } if *r == request => Some(*token),
        _ => None,
    })
}

/// Member 2 holds `x` through a node grant of grantor 1, then stops running its timers (a
/// driver may run them late) while the others remove it from their view and member 3 is
/// granted `x`. Returns member 3's token and a local hold of member 2 still taken from the
/// node grant (`None` if `hold` is false).
fn node_grant_outlived(c: &mut Cluster, hold: bool) -> (FencingToken, Option<RequestId>) {
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.settle();
    let first = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let block = c.granted(2, first).expect("granted from a node grant");
    assert_eq!(
        c.node(2).cache_stats().hits,
        1,
        "served from the node grant"
    );
    let kept = if hold {
        Some(first)
    } else {
        c.unlock(2, first);
        None
    };
    // Member 2 runs nothing from now on (no timers, no renewals); the others carry on
    // without it.
    c.stall(2);
    c.install(2, &[1, 3], ViewOrigin::Changed);
    let config = c.node(1).config().clone();
    let r3 = c.lock(3, 1, "x", LockMode::Exclusive, true);
    c.advance(config.lease + config.lease_margin * 2);
    let t3 = c
        .granted(3, r3)
        .expect("the grantor grants x again once the fence ran out");
    assert!(
        t3.0 >= block.0 + NODE_GRANT_TOKENS,
        "{t3} after the block of {block}"
    );
    (t3, kept)
}

/// Finding 4 of the review: a local `lock()` at a `now` past the node grant's lease, before
/// the driver ran the overdue lease timer, must not be granted from the node grant's block
/// (its token would be below the one the grantor has since granted elsewhere).
#[test]
fn a_cached_lock_after_the_node_grants_lease_ran_out_is_not_granted_from_the_block() {
    let mut c = Cluster::new(&[1, 2, 3], majority_caching(3));
    let (t3, _) = node_grant_outlived(&mut c, false);
    let now = c.now;
    let late = c.node(2).lock(now, request(2, "x"));
    let notices = notices_of(&mut c, 2);
    if let Some(token) = grant_of(&notices, late) {
        panic!("granted {token} from a lapsed node grant, after the grantor granted {t3}");
    }
    assert_eq!(
        c.node(2).status(now, late),
        None,
        "nothing held: the request went to the grantor"
    );
    assert!(
        c.node(2).member_holds().is_empty(),
        "the node grant was lost as the lease timer would have: {notices:?}"
    );
    assert!(
        notices
            .iter()
            .all(|n| !matches!(n, LockNotice::Lost { request, .. } if *request != late)
                || matches!(n, LockNotice::Lost { owner, .. } if *owner != conclave_lock_api::wire::NODE_OWNER)),
        "the node grant's own notices stay with the cache: {notices:?}"
    );
}

/// The same at a local release: the next local waiter is not served from the lapsed block.
#[test]
fn a_local_waiter_is_not_served_from_a_node_grant_whose_lease_ran_out() {
    let mut c = Cluster::new(&[1, 2, 3], majority_caching(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.settle();
    let now = c.now;
    let first = c.node(2).lock(now, request(1, "x"));
    let waiter = c.node(2).lock(now, request(2, "x"));
    c.deliver();
    assert!(c.granted(2, first).is_some() && c.granted(2, waiter).is_none());
    c.stall(2);
    c.install(2, &[1, 3], ViewOrigin::Changed);
    let config = c.node(1).config().clone();
    let r3 = c.lock(3, 1, "x", LockMode::Exclusive, true);
    c.advance(config.lease + config.lease_margin * 2);
    let t3 = c.granted(3, r3).expect("granted again");
    c.take_notices(2);
    let now = c.now;
    // The holder releases before its driver ran the overdue timers.
    let _ = c.node(2).unlock(now, first);
    let notices = notices_of(&mut c, 2);
    if let Some(token) = grant_of(&notices, waiter) {
        panic!("waiter granted {token} from a lapsed node grant, after {t3}");
    }
}

/// A test hook: the grantor of member `n` has issued tokens up to `counter` in its term.
fn spend_tokens(c: &mut Cluster, n: u8, counter: u32) -> u64 {
    let node = c.node(n);
    let term = node.grantor.table.last_token().epoch();
    node.grantor
        .table
        .observe_token(FencingToken::new(term, counter));
    term
}

/// Finding 5, `Majority`: once a term's counter is used up, no token of the next term number
/// is issued in it; the grantor begins a new term (reconciliation, grace) and grants there.
#[test]
fn majority_a_used_up_term_gives_way_to_a_new_term() {
    let mut c = Cluster::new(&[1, 2, 3], majority(3));
    c.install(1, &[1, 2, 3], ViewOrigin::Founded);
    c.settle();
    let first = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let t0 = c.granted(2, first).expect("granted");
    c.unlock(2, first);
    let term = spend_tokens(&mut c, 1, u32::MAX - 2);
    assert_eq!(term, t0.epoch());
    let r = c.lock(3, 1, "x", LockMode::Exclusive, true);
    let token = granted_within(&mut c, 3, r);
    let now_term = c.node(1).majority.term.as_ref().map(|t| t.term);
    assert!(
        token.epoch() > term && Some(token.epoch()) == now_term,
        "token {token} (term {term} used up) is of the grantor's new term {now_term:?}"
    );
    assert!(token.counter() < NODE_GRANT_TOKENS as u32, "{token}");
}

/// Finding 5, `Available`: the grantor's reconciled epoch is the tokens' high half; once its
/// counter is used up it grants nothing (a try is refused as unavailable, a wait waits) until
/// the next view, which it reconciles.
#[test]
fn available_a_used_up_epoch_grants_nothing_until_the_next_view() {
    let mut c = Cluster::new(&[1, 2], caching());
    c.install(1, &[1, 2], ViewOrigin::Founded);
    let first = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let t0 = c.granted(2, first).expect("granted");
    c.unlock(2, first);
    // Room for a plain grant, not for a node grant's block: the epoch is used up.
    let epoch = spend_tokens(&mut c, 1, u32::MAX - 100);
    assert_eq!(epoch, t0.epoch());
    let try_lock = c.lock(2, 2, "y", LockMode::Exclusive, false);
    let notices = c.take_notices(2);
    assert!(grant_of(&notices, try_lock).is_none(), "{notices:?}");
    assert!(
        notices.iter().any(|n| matches!(
            n,
            LockNotice::Refused { request, reason: Refusal::Unavailable, .. } if *request == try_lock
        )),
        "{notices:?}"
    );
    let waiting = c.lock(2, 3, "y", LockMode::Exclusive, true);
    assert!(c.granted(2, waiting).is_none(), "waits for the next view");
    // The coordinator asks its endpoint for that view (`Gms::renew_view`); a member that
    // does not grant asks for nothing.
    assert!(c.node(1).needs_new_view().is_some());
    assert!(c.node(2).needs_new_view().is_none());
    c.install(2, &[1, 2], ViewOrigin::Changed);
    let token = c.granted(2, waiting).expect("granted in the next view");
    assert_eq!(token.epoch(), 2, "{token}");
    assert!(c.node(1).needs_new_view().is_none());
}
