//! The table's rules, one test each, then a property test over random command sequences.

use std::net::SocketAddr;

use conclave_lock_api::{LockMode, LockName, MemberId, ServiceName};

use super::*;

fn member(name: &str, generation: u64) -> MemberId {
    let addr = SocketAddr::from(([127, 0, 0, 1], 7800));
    MemberId::new((0xabcd_u128 << 64) | u128::from(generation), name, addr).unwrap()
}

fn key(name: &str) -> LockKey {
    (None, LockName::new(name).unwrap())
}

fn lock_cmd(m: &MemberId, request: u64, name: &str, mode: LockMode, wait: bool) -> Command {
    Command::Lock {
        member: m.clone(),
        request,
        done_below: 0,
        key: key(name),
        owner: request,
        mode,
        wait,
        lease_ms: None,
    }
}

fn x(m: &MemberId, request: u64, name: &str) -> Command {
    lock_cmd(m, request, name, LockMode::Exclusive, true)
}

fn s(m: &MemberId, request: u64, name: &str) -> Command {
    lock_cmd(m, request, name, LockMode::Shared, true)
}

fn unlock(m: &MemberId, request: u64) -> Command {
    Command::Unlock {
        member: m.clone(),
        request,
    }
}

fn cancel(m: &MemberId, request: u64) -> Command {
    Command::Cancel {
        member: m.clone(),
        request,
    }
}

/// `a1` for the member `a` of generation 1.
fn tag(m: &MemberId) -> String {
    format!("{}{}", m.name(), m.generation())
}

/// `@index.k`.
fn tok(token: FencingToken) -> String {
    format!(
        "@{}.{}",
        token.0 >> TOKEN_GRANT_BITS,
        token.0 & ((1 << TOKEN_GRANT_BITS) - 1)
    )
}

/// An outcome in a line, to compare sequences at a glance.
fn describe(applied: &Applied) -> String {
    match applied {
        Applied::Granted {
            member,
            request,
            key,
            token,
            adopted,
            ..
        } => {
            let adopted = if *adopted { " adopted" } else { "" };
            format!(
                "granted {}:{request} {} {}{adopted}",
                tag(member),
                key.1,
                tok(*token)
            )
        }
        Applied::Queued {
            member,
            request,
            key,
            position,
            ..
        } => format!("queued {}:{request} {} #{position}", tag(member), key.1),
        Applied::Busy {
            member,
            request,
            key,
        } => format!("busy {}:{request} {}", tag(member), key.1),
        Applied::Released {
            member,
            request,
            key,
            token,
            ..
        } => format!(
            "released {}:{request} {} {}",
            tag(member),
            key.1,
            tok(*token)
        ),
        Applied::Withdrawn {
            member,
            request,
            key,
            ..
        } => format!("withdrawn {}:{request} {}", tag(member), key.1),
        Applied::Lost {
            member,
            request,
            key,
            token,
            reason,
            ..
        } => {
            let what = token.map_or_else(|| "waiting".to_owned(), tok);
            format!("lost {}:{request} {} {what} {reason:?}", tag(member), key.1)
        }
        Applied::Extended {
            member,
            request,
            key,
            token,
            lease_ms,
        } => format!(
            "extended {}:{request} {} {} {lease_ms}",
            tag(member),
            key.1,
            tok(*token)
        ),
    }
}

/// A table and the index of the next entry.
struct Log {
    table: Table,
    index: u64,
}

impl Log {
    fn new() -> Self {
        Self {
            table: Table::new(),
            index: 0,
        }
    }

    fn raw(&mut self, command: &Command) -> Vec<Applied> {
        self.index += 1;
        let mut out = Vec::new();
        self.table.apply(self.index, command, &mut out);
        out
    }

    fn apply(&mut self, command: &Command) -> Vec<String> {
        self.raw(command).iter().map(describe).collect()
    }
}

#[test]
fn exclusive_requests_are_granted_in_fifo_order() {
    let (a, b, c) = (member("a", 1), member("b", 1), member("c", 1));
    let mut log = Log::new();
    assert_eq!(log.apply(&x(&a, 1, "k")), ["granted a1:1 k @1.0"]);
    assert_eq!(log.apply(&x(&b, 1, "k")), ["queued b1:1 k #1"]);
    assert_eq!(log.apply(&x(&c, 1, "k")), ["queued c1:1 k #2"]);
    assert_eq!(
        log.apply(&unlock(&a, 1)),
        ["released a1:1 k @1.0", "granted b1:1 k @4.0"]
    );
    assert_eq!(
        log.apply(&unlock(&b, 1)),
        ["released b1:1 k @4.0", "granted c1:1 k @5.0"]
    );
    assert_eq!(log.apply(&unlock(&c, 1)), ["released c1:1 k @5.0"]);
    assert!(log.table.locks.is_empty());
}

#[test]
fn a_grant_names_owner_mode_and_lease() {
    let a = member("a", 1);
    let mut log = Log::new();
    let command = Command::Lock {
        member: a.clone(),
        request: 7,
        done_below: 0,
        key: key("k"),
        owner: 42,
        mode: LockMode::Shared,
        wait: false,
        lease_ms: Some(500),
    };
    let out = log.raw(&command);
    assert_eq!(
        out,
        [Applied::Granted {
            member: a.clone(),
            request: 7,
            key: key("k"),
            owner: OwnerId {
                member: a,
                local: 42
            },
            mode: LockMode::Shared,
            token: token_at(1, 0),
            lease_ms: Some(500),
            adopted: false,
        }]
    );
}

#[test]
fn shared_holders_share_and_exclude_writers() {
    let (a, b, c) = (member("a", 1), member("b", 1), member("c", 1));
    let mut log = Log::new();
    assert_eq!(log.apply(&s(&a, 1, "k")), ["granted a1:1 k @1.0"]);
    assert_eq!(log.apply(&s(&b, 1, "k")), ["granted b1:1 k @2.0"]);
    assert_eq!(log.apply(&x(&c, 1, "k")), ["queued c1:1 k #1"]);
    assert_eq!(log.apply(&unlock(&a, 1)), ["released a1:1 k @1.0"]);
    assert_eq!(
        log.apply(&unlock(&b, 1)),
        ["released b1:1 k @2.0", "granted c1:1 k @5.0"]
    );
}

#[test]
fn a_queued_writer_holds_back_later_readers_which_are_then_granted_together() {
    let (a, b, c, d) = (
        member("a", 1),
        member("b", 1),
        member("c", 1),
        member("d", 1),
    );
    let mut log = Log::new();
    log.apply(&s(&a, 1, "k"));
    assert_eq!(log.apply(&x(&b, 1, "k")), ["queued b1:1 k #1"]);
    assert_eq!(log.apply(&s(&c, 1, "k")), ["queued c1:1 k #2"]);
    assert_eq!(log.apply(&s(&d, 1, "k")), ["queued d1:1 k #3"]);
    assert_eq!(
        log.apply(&unlock(&a, 1)),
        ["released a1:1 k @1.0", "granted b1:1 k @5.0"]
    );
    assert_eq!(
        log.apply(&unlock(&b, 1)),
        [
            "released b1:1 k @5.0",
            "granted c1:1 k @6.0",
            "granted d1:1 k @6.1"
        ]
    );
}

#[test]
fn a_shared_run_stops_at_the_next_writer() {
    let (a, b, c, d) = (
        member("a", 1),
        member("b", 1),
        member("c", 1),
        member("d", 1),
    );
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&s(&b, 1, "k"));
    log.apply(&x(&c, 1, "k"));
    log.apply(&s(&d, 1, "k"));
    assert_eq!(
        log.apply(&unlock(&a, 1)),
        ["released a1:1 k @1.0", "granted b1:1 k @5.0"]
    );
    let (locks, _) = log.table.locks(None, 10);
    let waiters: Vec<_> = locks[0]
        .waiters
        .iter()
        .map(|w| w.owner.member.name())
        .collect();
    assert_eq!(waiters, ["c", "d"]);
}

#[test]
fn a_try_lock_is_refused_when_held_or_when_it_would_pass_a_waiter() {
    let (a, b, c) = (member("a", 1), member("b", 1), member("c", 1));
    let mut log = Log::new();
    log.apply(&s(&a, 1, "k"));
    assert_eq!(
        log.apply(&lock_cmd(&b, 1, "k", LockMode::Exclusive, false)),
        ["busy b1:1 k"]
    );
    assert_eq!(
        log.apply(&lock_cmd(&b, 2, "k", LockMode::Shared, false)),
        ["granted b1:2 k @3.0"]
    );
    log.apply(&x(&c, 1, "k"));
    assert_eq!(
        log.apply(&lock_cmd(&b, 3, "k", LockMode::Shared, false)),
        ["busy b1:3 k"]
    );
    assert_eq!(
        log.table.requests_of(&b).len(),
        1,
        "a refusal leaves no trace"
    );
    assert_eq!(
        log.apply(&lock_cmd(&c, 2, "other", LockMode::Exclusive, false)),
        ["granted c1:2 other @6.0"]
    );
}

#[test]
fn the_same_owner_asking_again_queues_behind_itself() {
    let a = member("a", 1);
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    assert_eq!(log.apply(&x(&a, 2, "k")), ["queued a1:2 k #1"]);
}

#[test]
fn cancelling_a_waiter_withdraws_it_and_lets_readers_behind_a_writer_in() {
    let (a, b, c) = (member("a", 1), member("b", 1), member("c", 1));
    let mut log = Log::new();
    log.apply(&s(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    log.apply(&s(&c, 1, "k"));
    assert_eq!(
        log.apply(&cancel(&b, 1)),
        ["withdrawn b1:1 k", "granted c1:1 k @4.0"]
    );
    assert_eq!(log.apply(&cancel(&b, 1)), Vec::<String>::new());
}

#[test]
fn cancelling_a_hold_releases_it() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    assert_eq!(
        log.apply(&cancel(&a, 1)),
        ["released a1:1 k @1.0", "granted b1:1 k @3.0"]
    );
    assert_eq!(log.apply(&cancel(&a, 9)), Vec::<String>::new());
}

#[test]
fn unlock_of_a_waiter_or_an_unknown_request_does_nothing() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    assert!(log.apply(&unlock(&b, 1)).is_empty());
    assert!(log.apply(&unlock(&b, 2)).is_empty());
    assert!(log.apply(&unlock(&member("z", 1), 1)).is_empty());
    assert_eq!(log.table.requests_of(&b), [(1, key("k"), None)]);
}

#[test]
fn a_lock_request_applied_twice_is_applied_once() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    assert!(log.apply(&x(&a, 1, "k")).is_empty(), "still held");
    log.apply(&x(&b, 1, "k"));
    assert!(log.apply(&x(&b, 1, "k")).is_empty(), "still queued");
    log.apply(&unlock(&a, 1));
    assert!(log.apply(&x(&a, 1, "k")).is_empty(), "finished");
    log.apply(&x(&a, 2, "j"));
    assert_eq!(
        log.apply(&lock_cmd(&b, 2, "j", LockMode::Exclusive, false)),
        ["busy b1:2 j"]
    );
    assert!(
        log.apply(&lock_cmd(&b, 2, "j", LockMode::Exclusive, false))
            .is_empty(),
        "a refusal is an application too"
    );
}

#[test]
fn requests_below_done_below_are_forgotten_and_never_applied_again() {
    let a = member("a", 1);
    let mut log = Log::new();
    for request in 1..=5 {
        log.apply(&x(&a, request, &format!("k{request}")));
        log.apply(&unlock(&a, request));
    }
    assert_eq!(log.table.clients.seen_len(&a), 5);
    let mut next = x(&a, 6, "k6");
    if let Command::Lock { done_below, .. } = &mut next {
        *done_below = 4;
    }
    assert_eq!(log.apply(&next), ["granted a1:6 k6 @11.0"]);
    assert_eq!(log.table.clients.seen_len(&a), 3, "4, 5 and 6 remain");
    assert!(log.apply(&x(&a, 2, "k2")).is_empty(), "below done_below");
    assert!(log.apply(&x(&a, 5, "k5")).is_empty(), "remembered");
    assert_eq!(log.apply(&x(&a, 7, "k7")), ["granted a1:7 k7 @14.0"]);
}

#[test]
fn extend_replaces_the_lease_of_a_hold_only() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    let extend = |m: &MemberId, request| Command::Extend {
        member: m.clone(),
        request,
        lease_ms: 750,
    };
    assert_eq!(log.apply(&extend(&a, 1)), ["extended a1:1 k @1.0 750"]);
    assert!(log.apply(&extend(&b, 1)).is_empty());
    assert!(log.apply(&extend(&a, 2)).is_empty());
    assert_eq!(log.table.leased_holds(), [(key("k"), token_at(1, 0), 750)]);
    let (locks, _) = log.table.locks(None, 10);
    assert_eq!(locks[0].holders[0].lease_ms, Some(750));
}

#[test]
fn expire_ends_the_hold_of_that_token_only() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    let expire = |token| Command::Expire {
        key: key("k"),
        token,
    };
    assert!(log.apply(&expire(token_at(2, 0))).is_empty(), "stale token");
    assert!(
        log.apply(&Command::Expire {
            key: key("j"),
            token: token_at(1, 0)
        })
        .is_empty(),
        "another lock"
    );
    assert_eq!(
        log.apply(&expire(token_at(1, 0))),
        ["lost a1:1 k @1.0 LeaseExpired", "granted b1:1 k @5.0"]
    );
    assert!(
        log.apply(&expire(token_at(1, 0))).is_empty(),
        "applied twice"
    );
}

#[test]
fn expire_member_ends_every_incarnation_of_the_name_by_key() {
    let (a1, a2, b) = (member("a", 1), member("a", 2), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a1, 1, "k"));
    log.apply(&Command::Join { member: a2.clone() });
    log.apply(&x(&b, 1, "k"));
    log.apply(&x(&a2, 1, "j"));
    log.apply(&x(&b, 2, "j"));
    log.apply(&s(&a2, 2, "k"));
    log.apply(&x(&b, 3, "m"));
    log.apply(&s(&a2, 3, "m"));
    let out = log.apply(&Command::ExpireMember {
        name: "a".to_owned(),
    });
    assert_eq!(
        out,
        [
            "lost a2:1 j @4.0 Minority",
            "lost a1:1 k @1.0 Minority",
            "lost a2:2 k waiting Minority",
            "lost a2:3 m waiting Minority",
            "granted b1:2 j @9.0",
            "granted b1:1 k @9.1"
        ]
    );
    assert!(log.table.recovered_holds("a").is_empty());
    assert_eq!(log.table.member_names(), BTreeSet::from(["b".to_owned()]));
    assert_eq!(
        log.apply(&x(&a2, 4, "n")),
        ["granted a2:4 n @10.0"],
        "the incarnation may go on"
    );
}

#[test]
fn leave_ends_the_incarnation_and_its_late_requests() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    log.apply(&x(&a, 2, "k"));
    assert_eq!(
        log.apply(&Command::Leave { member: a.clone() }),
        [
            "lost a1:1 k @1.0 Shutdown",
            "lost a1:2 k waiting Shutdown",
            "granted b1:1 k @4.0"
        ]
    );
    assert!(log.apply(&x(&a, 3, "j")).is_empty(), "gone");
    assert!(log.apply(&Command::Join { member: a.clone() }).is_empty());
    assert!(log.apply(&x(&a, 4, "j")).is_empty(), "still gone");
    let a2 = member("a", 2);
    log.apply(&Command::Join { member: a2.clone() });
    assert_eq!(log.apply(&x(&a2, 1, "j")), ["granted a2:1 j @9.0"]);
}

#[test]
fn join_withdraws_older_waits_and_keeps_older_holds_as_recovered() {
    let (a1, a2, b) = (member("a", 1), member("a", 2), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&b, 1, "k"));
    log.apply(&x(&a1, 1, "k"));
    log.apply(&s(&b, 2, "k"));
    log.apply(&x(&a1, 2, "j"));
    assert_eq!(
        log.apply(&Command::Join { member: a2.clone() }),
        ["withdrawn a1:1 k"]
    );
    assert_eq!(
        log.table.recovered_holds("a"),
        [(
            key("j"),
            OwnerId {
                member: a1.clone(),
                local: 2
            },
            LockMode::Exclusive,
            token_at(4, 0)
        )]
    );
    assert_eq!(
        log.table.requests_of(&a1),
        [(2, key("j"), Some(token_at(4, 0)))]
    );
    assert!(log.apply(&x(&a1, 3, "m")).is_empty(), "a1 is gone");
    assert!(
        log.apply(&Command::Join { member: a1.clone() }).is_empty(),
        "an older join is stale"
    );
    assert_eq!(log.table.recovered_holds("a").len(), 1);
    assert_eq!(
        log.apply(&unlock(&b, 1)),
        ["released b1:1 k @1.0", "granted b1:2 k @8.0"],
        "the withdrawn writer no longer holds the reader back"
    );
}

#[test]
fn join_promotes_where_a_withdrawn_writer_held_readers_back() {
    let (a1, a2, b, c) = (
        member("a", 1),
        member("a", 2),
        member("b", 1),
        member("c", 1),
    );
    let mut log = Log::new();
    log.apply(&s(&b, 1, "k"));
    log.apply(&x(&a1, 1, "k"));
    log.apply(&s(&c, 1, "k"));
    assert_eq!(
        log.apply(&Command::Join { member: a2 }),
        ["withdrawn a1:1 k", "granted c1:1 k @4.0"]
    );
}

#[test]
fn a_new_incarnation_adopts_a_recovered_hold_of_the_same_mode() {
    let (a1, a2, b) = (member("a", 1), member("a", 2), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a1, 1, "k"));
    log.apply(&s(&a1, 2, "j"));
    log.apply(&x(&b, 1, "k"));
    log.apply(&Command::Join { member: a2.clone() });
    assert_eq!(
        log.apply(&x(&a2, 1, "k")),
        ["granted a2:1 k @5.0 adopted"],
        "ahead of the queue, with a new token"
    );
    assert_eq!(
        log.apply(&x(&a2, 2, "j")),
        ["queued a2:2 j #1"],
        "another mode: a holder like any other"
    );
    assert_eq!(
        log.table.requests_of(&a1),
        [(2, key("j"), Some(token_at(2, 0)))]
    );
    assert_eq!(log.table.requests_of(&a2).len(), 2);
    assert_eq!(
        log.table.recovered_holds("a"),
        [(
            key("j"),
            OwnerId {
                member: a1.clone(),
                local: 2
            },
            LockMode::Shared,
            token_at(2, 0)
        )]
    );
    assert_eq!(
        log.apply(&unlock(&a2, 1)),
        ["released a2:1 k @5.0", "granted b1:1 k @7.0"]
    );
    assert_eq!(
        log.apply(&s(&a2, 3, "j")),
        ["granted a2:3 j @8.0 adopted"],
        "adoption passes the queue"
    );
    assert_eq!(log.table.locks(None, 10).0[0].waiters.len(), 1);
}

#[test]
fn adoption_takes_the_request_lease_and_recovered_holds_count_as_holders() {
    let (a1, a2, b) = (member("a", 1), member("a", 2), member("b", 1));
    let mut log = Log::new();
    log.apply(&s(&a1, 1, "k"));
    log.apply(&Command::Join { member: a2.clone() });
    assert_eq!(log.apply(&x(&b, 1, "k")), ["queued b1:1 k #1"]);
    let adopt = Command::Lock {
        member: a2.clone(),
        request: 1,
        done_below: 0,
        key: key("k"),
        owner: 9,
        mode: LockMode::Shared,
        wait: false,
        lease_ms: Some(300),
    };
    assert_eq!(log.apply(&adopt), ["granted a2:1 k @4.0 adopted"]);
    assert_eq!(log.table.leased_holds(), [(key("k"), token_at(4, 0), 300)]);
    let (locks, _) = log.table.locks(None, 1);
    assert_eq!(locks[0].holders[0].owner.local, 9);
}

#[test]
fn drop_recovered_ends_the_unadopted_holds_and_promotes() {
    let (a1, a2, b) = (member("a", 1), member("a", 2), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a1, 1, "k"));
    log.apply(&x(&a1, 2, "j"));
    log.apply(&x(&b, 1, "j"));
    log.apply(&Command::Join { member: a2.clone() });
    log.apply(&x(&a2, 1, "k"));
    assert!(
        log.apply(&Command::DropRecovered { member: a1.clone() })
            .is_empty(),
        "a1 has no earlier incarnation"
    );
    assert_eq!(
        log.apply(&Command::DropRecovered { member: a2.clone() }),
        ["lost a1:2 j @2.0 Shutdown", "granted b1:1 j @7.0"]
    );
    assert!(log.table.recovered_holds("a").is_empty());
    assert!(log.table.requests_of(&a1).is_empty());
    assert_eq!(
        log.table.requests_of(&a2),
        [(1, key("k"), Some(token_at(5, 0)))]
    );
}

#[test]
fn tokens_increase_per_lock_across_entries() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    let mut last = FencingToken(0);
    for round in 0..20 {
        for out in [
            log.raw(&s(&a, 2 * round + 1, "k")),
            log.raw(&s(&b, 2 * round + 1, "k")),
            log.raw(&x(&a, 2 * round + 2, "k")),
            log.raw(&unlock(&a, 2 * round + 1)),
            log.raw(&unlock(&b, 2 * round + 1)),
            log.raw(&unlock(&a, 2 * round + 2)),
        ] {
            for applied in out {
                if let Applied::Granted { token, .. } = applied {
                    assert!(token > last);
                    last = token;
                }
            }
        }
    }
    assert_eq!(log.index, 120);
}

#[test]
fn an_entry_out_of_grants_leaves_the_rest_to_the_next_entry() {
    let (a, b, c, d) = (
        member("a", 1),
        member("b", 1),
        member("c", 1),
        member("d", 1),
    );
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&s(&b, 1, "k"));
    log.apply(&s(&c, 1, "k"));
    let k = key("k");
    let entry = log.table.locks.get_mut(&k).unwrap();
    assert!(entry.remove_hold(&a, 1).is_some());
    log.table.requests.remove(&(a.clone(), 1));
    let mut grants = Grants {
        index: 4,
        next: GRANTS_PER_ENTRY_MAX - 1,
    };
    let mut out = Vec::new();
    log.table.promote(&k, &mut grants, &mut out);
    log.index = 4;
    let last = format!("@4.{}", GRANTS_PER_ENTRY_MAX - 1);
    assert_eq!(
        out.iter().map(describe).collect::<Vec<_>>(),
        [format!("granted b1:1 k {last}")]
    );
    assert_eq!(log.table.stalled, BTreeSet::from([k.clone()]));
    let mut out = Vec::new();
    log.table.on_lock(
        &Request {
            member: &d,
            request: 1,
            done_below: 0,
            key: &key("j"),
            owner: 1,
            mode: LockMode::Exclusive,
            wait: true,
            lease_ms: None,
        },
        &mut grants,
        &mut out,
    );
    assert_eq!(
        out.iter().map(describe).collect::<Vec<_>>(),
        ["busy d1:1 j"]
    );
    assert!(!log.table.locks.contains_key(&key("j")));
    assert_eq!(
        log.apply(&x(&d, 2, "j")),
        ["granted c1:1 k @5.0", "granted d1:2 j @5.1"]
    );
    assert!(log.table.stalled.is_empty());
}

#[test]
fn a_full_queue_refuses_more_waiters() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    let entry = log.table.locks.get_mut(&key("k")).unwrap();
    for request in 0..QUEUE_MAX as u64 {
        entry.queue.push_back(Wait {
            member: b.clone(),
            request: 1000 + request,
            owner: 1,
            mode: LockMode::Exclusive,
            lease_ms: None,
        });
        log.table
            .requests
            .insert((b.clone(), 1000 + request), key("k"));
    }
    assert_eq!(log.apply(&x(&b, 1, "k")), ["busy b1:1 k"]);
    log.table.locks.get_mut(&key("k")).unwrap().queue.pop_back();
    log.table
        .requests
        .remove(&(b.clone(), 1000 + QUEUE_MAX as u64 - 1));
    assert_eq!(log.apply(&x(&b, 2, "k")), ["queued b1:2 k #65536"]);
}

#[test]
fn an_unused_lock_is_dropped() {
    let (a, b) = (member("a", 1), member("b", 1));
    let mut log = Log::new();
    log.apply(&x(&a, 1, "k"));
    log.apply(&x(&b, 1, "k"));
    log.apply(&cancel(&b, 1));
    log.apply(&unlock(&a, 1));
    assert!(log.table.locks.is_empty());
    assert!(log.table.requests.is_empty());
    assert_eq!(log.table.locks(None, 10), (Vec::new(), false));
}

#[test]
fn old_entries_are_ignored_and_skip_moves_the_index() {
    let a = member("a", 1);
    let mut table = Table::new();
    let mut out = Vec::new();
    table.apply(5, &x(&a, 1, "k"), &mut out);
    table.apply(5, &x(&a, 2, "j"), &mut out);
    table.apply(3, &x(&a, 3, "m"), &mut out);
    assert_eq!(out.len(), 1);
    table.skip(9);
    table.skip(7);
    assert_eq!(table.applied_index(), 9);
    table.apply(10, &x(&a, 4, "m"), &mut out);
    assert_eq!(describe(out.last().unwrap()), "granted a1:4 m @10.0");
}

#[test]
fn the_wire_table_is_by_service_in_name_order_and_bounded() {
    let a = member("a", 1);
    let svc = ServiceName::new("svc").unwrap();
    let mut log = Log::new();
    for (request, name) in [(1, "c"), (2, "a"), (3, "b")] {
        log.apply(&x(&a, request, name));
    }
    log.apply(&Command::Lock {
        member: a.clone(),
        request: 4,
        done_below: 0,
        key: (Some(svc.clone()), LockName::new("a").unwrap()),
        owner: 4,
        mode: LockMode::Shared,
        wait: true,
        lease_ms: Some(100),
    });
    log.apply(&x(&a, 5, "a"));
    let (locks, truncated) = log.table.locks(None, 10);
    assert!(!truncated);
    let names: Vec<_> = locks.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    assert_eq!(locks[0].holders[0].token, token_at(2, 0));
    assert_eq!(locks[0].waiters[0].owner.local, 5);
    assert!(log.table.locks(None, 2).1);
    assert!(!log.table.locks(None, 3).1);
    let (locks, _) = log.table.locks(Some(&svc), 10);
    assert_eq!(locks.len(), 1);
    assert_eq!(locks[0].holders[0].lease_ms, Some(100));
    assert_eq!(log.table.member_names(), BTreeSet::from(["a".to_owned()]));
}

#[test]
fn a_snapshot_restores_an_equal_table_that_goes_on_identically() {
    let (a1, a2, b) = (member("a", 1), member("a", 2), member("b", 1));
    let svc = ServiceName::new("svc").unwrap();
    let mut log = Log::new();
    log.apply(&x(&a1, 1, "k"));
    log.apply(&s(&a1, 2, "j"));
    log.apply(&x(&b, 1, "k"));
    log.apply(&Command::Lock {
        member: b.clone(),
        request: 2,
        done_below: 1,
        key: (Some(svc), LockName::new("k").unwrap()),
        owner: 2,
        mode: LockMode::Exclusive,
        wait: true,
        lease_ms: Some(1000),
    });
    log.apply(&Command::Join { member: a2.clone() });
    let bytes = log.table.to_bytes();
    let restored = Table::from_bytes(&bytes).unwrap();
    assert_eq!(restored, log.table);
    assert_eq!(Table::from_bytes(&bytes[..bytes.len() - 1]), None);
    assert_eq!(Table::from_bytes(b""), None);
    let rest = [
        x(&a2, 1, "k"),
        x(&b, 2, "k"),
        x(&b, 3, "j"),
        Command::DropRecovered { member: a2.clone() },
        unlock(&a2, 1),
        Command::ExpireMember {
            name: "b".to_owned(),
        },
    ];
    let mut copy = Log {
        table: restored,
        index: log.index,
    };
    for command in &rest {
        assert_eq!(copy.raw(command), log.raw(command));
    }
    assert_eq!(copy.table, log.table);
}

mod props;
