//! A property test: random command sequences over 3 member names × 2 incarnations × 3 locks.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// A command with its members and locks as small numbers. `Cancel`, `Unlock` and `Extend`
/// pick a live request of the member, `Expire` a hold of the lock (or, past the last one,
/// a request or token that is not there) when they are applied.
#[derive(Clone, Debug)]
enum Op {
    Join(usize),
    Lock {
        member: usize,
        request: u64,
        done_below: u64,
        key: usize,
        owner: u64,
        shared: bool,
        wait: bool,
        lease_ms: Option<u64>,
    },
    /// A lock request by the second incarnation of the name `name`, of the lock and mode
    /// of a recovered hold of that name (`pick` chooses which; lock 0 if there is none).
    Adopt {
        name: usize,
        request: u64,
        pick: usize,
    },
    Cancel(usize, usize),
    Unlock(usize, usize),
    Extend(usize, usize),
    Expire(usize, usize),
    ExpireMember(usize),
    Leave(usize),
    DropRecovered(usize),
}

fn members() -> Vec<MemberId> {
    ["a", "b", "c"]
        .iter()
        .flat_map(|name| [member(name, 1), member(name, 2)])
        .collect()
}

fn keys() -> Vec<LockKey> {
    let svc = ServiceName::new("svc").unwrap();
    vec![key("x"), key("y"), (Some(svc), LockName::new("x").unwrap())]
}

fn op() -> impl Strategy<Value = Op> {
    let lock = (
        0..6usize,
        0..12u64,
        0..12u64,
        0..3usize,
        0..3u64,
        any::<bool>(),
        prop::bool::weighted(0.8),
        prop::option::of(1..5u64),
    )
        .prop_map(
            |(member, request, below, key, owner, shared, wait, lease_ms)| Op::Lock {
                member,
                request,
                done_below: below.min(request),
                key,
                owner,
                shared,
                wait,
                lease_ms,
            },
        );
    prop_oneof![
        1 => (0..3usize).prop_map(|name| Op::Join(2 * name)),
        2 => (0..3usize).prop_map(|name| Op::Join(2 * name + 1)),
        8 => lock,
        2 => (0..3usize, 0..12u64, 0..3usize)
            .prop_map(|(name, request, pick)| Op::Adopt { name, request, pick }),
        2 => (0..6usize, 0..4usize).prop_map(|(m, pick)| Op::Cancel(m, pick)),
        3 => (0..6usize, 0..4usize).prop_map(|(m, pick)| Op::Unlock(m, pick)),
        1 => (0..6usize, 0..4usize).prop_map(|(m, pick)| Op::Extend(m, pick)),
        1 => (0..3usize, 0..3usize).prop_map(|(k, pick)| Op::Expire(k, pick)),
        1 => (0..3usize).prop_map(Op::ExpireMember),
        1 => (0..6usize).prop_map(Op::Leave),
        1 => (0..6usize).prop_map(Op::DropRecovered),
    ]
}

/// The command `op` stands for, given the table it is applied to.
fn command(op: &Op, table: &Table) -> Command {
    let (members, keys) = (members(), keys());
    let pick = |m: usize, pick: usize| {
        let live = table.requests_of(&members[m]);
        live.get(pick).map_or(99, |(request, _, _)| *request)
    };
    match *op {
        Op::Join(m) => Command::Join {
            member: members[m].clone(),
        },
        Op::Lock {
            member,
            request,
            done_below,
            key,
            owner,
            shared,
            wait,
            lease_ms,
        } => Command::Lock {
            member: members[member].clone(),
            request,
            done_below,
            key: keys[key].clone(),
            owner,
            mode: if shared {
                LockMode::Shared
            } else {
                LockMode::Exclusive
            },
            wait,
            lease_ms,
        },
        Op::Adopt {
            name,
            request,
            pick,
        } => {
            let member = 2 * name + 1;
            let recovered = table.recovered_holds(members[member].name());
            let (key, mode) = recovered
                .get(pick % recovered.len().max(1))
                .map_or((keys[0].clone(), LockMode::Shared), |(key, _, mode, _)| {
                    (key.clone(), *mode)
                });
            Command::Lock {
                member: members[member].clone(),
                request,
                done_below: 0,
                key,
                owner: 7,
                mode,
                wait: true,
                lease_ms: None,
            }
        }
        Op::Cancel(m, n) => Command::Cancel {
            member: members[m].clone(),
            request: pick(m, n),
        },
        Op::Unlock(m, n) => Command::Unlock {
            member: members[m].clone(),
            request: pick(m, n),
        },
        Op::Extend(m, n) => Command::Extend {
            member: members[m].clone(),
            request: pick(m, n),
            lease_ms: 9,
        },
        Op::Expire(k, pick) => {
            let tokens: Vec<FencingToken> = table
                .locks
                .get(&keys[k])
                .map(|e| e.holders.iter().map(|h| h.token).collect())
                .unwrap_or_default();
            Command::Expire {
                key: keys[k].clone(),
                token: tokens.get(pick).copied().unwrap_or(token_at(1, 0)),
            }
        }
        Op::ExpireMember(name) => Command::ExpireMember {
            name: ["a", "b", "c"][name].to_owned(),
        },
        Op::Leave(m) => Command::Leave {
            member: members[m].clone(),
        },
        Op::DropRecovered(m) => Command::DropRecovered {
            member: members[m].clone(),
        },
    }
}

type Live = BTreeMap<(MemberId, u64), (LockKey, Option<FencingToken>)>;

/// Where every request of the table is, and whether it is in one place only (d).
fn live_requests(table: &Table) -> Live {
    let mut live = Live::new();
    for (key, entry) in &table.locks {
        assert!(!entry.is_unused(), "an unused lock is dropped");
        assert!(
            !entry.head_grantable() || table.stalled.contains(key),
            "nobody waits for a lock it could have"
        );
        // (a) one exclusive holder, or only shared ones.
        if entry.holders.len() > 1 {
            assert!(entry.holders.iter().all(|h| h.mode == LockMode::Shared));
        }
        for h in &entry.holders {
            let place = (key.clone(), Some(h.token));
            assert!(live.insert((h.member.clone(), h.request), place).is_none());
        }
        for w in &entry.queue {
            let place = (key.clone(), None);
            assert!(live.insert((w.member.clone(), w.request), place).is_none());
        }
    }
    let index: BTreeMap<_, _> = live
        .iter()
        .map(|(r, (k, _))| (r.clone(), k.clone()))
        .collect();
    assert_eq!(index, table.requests, "the request index matches the locks");
    live
}

/// Follows the outcomes of one entry: where every request is, by what the members are
/// told, and the tokens of each lock (b).
fn follow(
    table: &Table,
    out: &[Applied],
    index: u64,
    told: &mut Live,
    last_token: &mut BTreeMap<LockKey, FencingToken>,
) {
    for applied in out {
        match applied {
            Applied::Granted {
                member,
                request,
                key,
                token,
                adopted,
                ..
            } => {
                if *adopted {
                    // It takes over a hold of an earlier incarnation of its member on this
                    // lock (one held before this entry), with a new token.
                    let old: Vec<_> = told
                        .iter()
                        .filter(|((m, r), (k, t))| {
                            k == key
                                && t.is_some()
                                && m.name() == member.name()
                                && m != member
                                && !table.requests.contains_key(&(m.clone(), *r))
                        })
                        .map(|(r, _)| r.clone())
                        .collect();
                    assert!(!old.is_empty(), "adopts a hold of the lock");
                    told.remove(&old[0]);
                }
                assert_eq!(token.0 >> TOKEN_GRANT_BITS, index);
                let last = last_token.insert(key.clone(), *token);
                assert!(last < Some(*token), "tokens of a lock increase");
                let was = told.insert((member.clone(), *request), (key.clone(), Some(*token)));
                assert!(*adopted || was == Some((key.clone(), None)) || was.is_none());
            }
            Applied::Queued {
                member,
                request,
                key,
                ..
            } => {
                let was = told.insert((member.clone(), *request), (key.clone(), None));
                assert_eq!(was, None);
            }
            Applied::Busy {
                member, request, ..
            } => assert!(!told.contains_key(&(member.clone(), *request))),
            Applied::Released {
                member,
                request,
                key,
                token,
                ..
            } => {
                let was = told.remove(&(member.clone(), *request));
                assert_eq!(was, Some((key.clone(), Some(*token))));
            }
            Applied::Withdrawn {
                member,
                request,
                key,
                ..
            } => {
                let was = told.remove(&(member.clone(), *request));
                assert_eq!(was, Some((key.clone(), None)));
            }
            Applied::Lost {
                member,
                request,
                key,
                token,
                ..
            } => {
                let was = told.remove(&(member.clone(), *request));
                assert_eq!(was, Some((key.clone(), *token)));
            }
            Applied::Extended {
                member,
                request,
                key,
                token,
                ..
            } => {
                let was = told.get(&(member.clone(), *request));
                assert_eq!(was, Some(&(key.clone(), Some(*token))));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_commands_keep_the_table_sound(
        ops in prop::collection::vec((op(), 1..3u64), 1..80),
        cut in any::<prop::sample::Index>(),
    ) {
        let cut = cut.index(ops.len() + 1);
        let mut table = Table::new();
        let mut told = Live::new();
        let mut last_token = BTreeMap::new();
        let mut index = 0;
        let mut entries = Vec::new();
        let mut snapshot = (cut == 0).then(|| table.to_bytes());
        for (n, (op, gap)) in ops.iter().enumerate() {
            index += gap;
            let command = command(op, &table);
            let mut out = Vec::new();
            table.apply(index, &command, &mut out);
            follow(&table, &out, index, &mut told, &mut last_token);
            if let (Command::Lock { member, request, key, .. }, Some(Applied::Queued { position, .. }))
                = (&command, out.last())
            {
                let queue = &table.locks[key].queue;
                let at = queue.iter().position(|w| w.member == *member && w.request == *request);
                prop_assert_eq!(at.map(|at| at + 1), Some(*position as usize));
            }
            prop_assert_eq!(&live_requests(&table), &told);
            entries.push((index, command, out));
            if n + 1 == cut {
                snapshot = Some(table.to_bytes());
            }
        }
        // (c) a snapshot at `cut`, then the rest, gives the same outcomes and table.
        let mut restored = Table::from_bytes(&snapshot.unwrap()).unwrap();
        for (index, command, out) in &entries[cut..] {
            let mut again = Vec::new();
            restored.apply(*index, command, &mut again);
            prop_assert_eq!(&again, out);
        }
        prop_assert_eq!(&restored, &table);
    }
}
