//! Schedules from the adversarial review of issue 30's changes (views named by epoch and
//! coordinator; which side's fencing tokens rank higher under `Available`).

use super::*;

fn view_of(epoch: u64, members: &[u8]) -> View {
    View::new(epoch, members.iter().map(|n| member(*n)).collect()).unwrap()
}

/// A member keeps the early `Transferred` of its next view although an early `Transferred` of
/// another view (another coordinator, a higher epoch) arrives too: it follows its own view's
/// transferred grantor. (It used to keep only the newest, follow the coordinator that had
/// handed over, be told `NotGrantor`, and wait for an announcement it had dropped.)
fn early_transfer_case(with_foreign: bool) -> Option<FencingToken> {
    let mut c = Cluster::new(&[1, 2, 3], LockConfig::local());
    c.install(5, &[1, 2, 3], ViewOrigin::Changed);
    c.advance(Duration::from_secs(2));
    // View 7 reaches 1 and 3, not yet 2.
    let v7 = view_of(7, &[1, 2, 3]);
    let now = c.now;
    c.node(1).handle_view(now, &v7, ViewOrigin::Changed);
    c.node(3).handle_view(now, &v7, ViewOrigin::Received);
    c.deliver();
    c.advance(Duration::from_secs(1));
    // 3 takes the role in view 7; its `Transferred` reaches 2 early (2 is still in view 5).
    let now = c.now;
    c.node(3).become_grantor(now).unwrap();
    c.deliver();
    c.advance(Duration::from_millis(200));
    assert_eq!(c.node(3).serving_grantor(), Some(&member(3)), "3 serves");
    if with_foreign {
        // The grantor of another coordinator's view (8, C=4) that also lists 2 (2 never
        // installs it) announces its transfer too.
        let foreign = LockMessage::Transferred {
            epoch: 8,
            coordinator: member(4).incarnation(),
            generation: 1,
        };
        let now = c.now;
        c.node(2).handle_message(now, &member(5), foreign);
    }
    // View 7 reaches 2 at last.
    let now = c.now;
    c.node(2).handle_view(now, &v7, ViewOrigin::Received);
    c.deliver();
    let r = c.lock(2, 1, "x", LockMode::Exclusive, true);
    c.advance(Duration::from_secs(30));
    c.granted(2, r)
}

#[test]
fn an_early_transfer_announcement_is_applied() {
    assert!(early_transfer_case(false).is_some());
}

#[test]
fn an_early_transfer_of_another_view_does_not_displace_ours() {
    assert!(
        early_transfer_case(true).is_some(),
        "member 2 never granted: it dropped its own view's early Transferred"
    );
}

/// Issue 30, finding 6, at the tokens: under `Available`, after a cut of one member the side that
/// kept the coordinator installs a view that only removes it (two epochs on, no reconciliation)
/// and the cut-off member takes over (one epoch on, reconciled). The four's tokens follow their
/// view's epoch and outrank the lone member's for the whole cut. (They used to keep the
/// reconciled epoch, below the lone member's.)
#[test]
fn the_side_that_kept_the_view_outranks_a_lone_member_in_fencing() {
    let mut c = Cluster::new(&[1, 2, 3, 4, 5], LockConfig::local());
    c.install(5, &[1, 2, 3, 4, 5], ViewOrigin::Changed);
    c.advance(Duration::from_secs(2));
    for a in [1u8, 2, 3, 4] {
        c.cut_both(a, 5);
    }
    // The four: the coordinator removes 5 (two on: it kept a majority). The lone member takes
    // over (one on), as `Gms` numbers them.
    c.install(7, &[1, 2, 3, 4], ViewOrigin::Changed);
    c.install(6, &[5], ViewOrigin::TookOver);
    c.advance(Duration::from_secs(2));
    let r_major = c.lock(2, 1, "x", LockMode::Exclusive, true);
    let r_lone = c.lock(5, 1, "x", LockMode::Exclusive, true);
    c.advance(Duration::from_secs(1));
    let major = c.granted(2, r_major).expect("the four grant");
    let lone = c.granted(5, r_lone).expect("the lone member grants");
    assert!(
        major > lone,
        "the four's {major} is below the lone member's {lone}"
    );
}
