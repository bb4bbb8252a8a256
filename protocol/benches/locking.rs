//! Benchmarks of the locking core alone, no IO: a grantor serving its own client (the
//! messages loop back inside `LockMachine`), and a new grantor rebuilding its table.
//!
//! Run: `cargo bench -p conclave-protocol --bench locking`

use std::hint::black_box;
use std::net::SocketAddr;

use conclave_lock_api::wire::{LockMessage, ReportedHold};
use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, OwnerId, RequestId, View};
use conclave_protocol::gms::ViewOrigin;
use conclave_protocol::locking::{LockConfig, LockMachine, LockNotice, LockRequest};
use conclave_protocol::Instant;
use criterion::{BatchSize, Criterion, Throughput};

fn member(n: u32) -> MemberId {
    MemberId::new(
        u128::from(n) << 64 | 1,
        &format!("m{n}"),
        SocketAddr::from(([127, 0, 0, 1], 1 + (n % 60_000) as u16)),
    )
    .expect("valid member")
}

/// A member that is the grantor of a view of one, reconciled and serving.
fn solo_grantor() -> LockMachine {
    let me = member(0);
    let mut locks = LockMachine::new(me.clone(), LockConfig::default());
    let view = View::new(1, vec![me]).expect("valid view");
    locks.handle_view(Instant::ZERO, &view, ViewOrigin::Founded);
    assert!(locks.is_serving());
    locks
}

/// One lock and one unlock, both answered.
fn pair(locks: &mut LockMachine, name: &LockName, owner: u64) {
    let now = Instant::ZERO;
    let request = locks.lock(now, LockRequest::exclusive(owner, name.clone()));
    let mut granted = false;
    while let Some(notice) = locks.poll_notice() {
        granted |= matches!(notice, LockNotice::Granted { .. });
    }
    assert!(granted);
    locks.unlock(now, request).expect("held");
    while locks.poll_notice().is_some() {}
}

fn lock_unlock_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("grantor/lock_unlock_pair");
    group.throughput(Throughput::Elements(1));
    let names: Vec<LockName> = (0..10_000)
        .map(|i| LockName::new(format!("lock-{i}")).expect("valid"))
        .collect();
    group.bench_function("10000_distinct_locks", |b| {
        let mut locks = solo_grantor();
        let mut i = 0usize;
        b.iter(|| {
            pair(&mut locks, &names[i % names.len()], i as u64);
            i += 1;
        });
    });
    group.bench_function("one_hot_lock", |b| {
        let mut locks = solo_grantor();
        let hot = LockName::new("hot").expect("valid");
        let mut i = 0u64;
        b.iter(|| {
            pair(&mut locks, &hot, i);
            i += 1;
        });
    });
    group.finish();
}

fn reconciliation(c: &mut Criterion) {
    let mut group = c.benchmark_group("grantor/reconcile");
    group.sample_size(20);
    let members: Vec<MemberId> = (0..=100).map(member).collect();
    let view = View::new(7, members.clone()).expect("valid view");
    // 100 members, 100 locks each: 10,000 held locks to rebuild.
    let reports: Vec<(MemberId, LockMessage)> = members[1..]
        .iter()
        .enumerate()
        .map(|(m, id)| {
            let held = (0..100)
                .map(|l| ReportedHold {
                    request: RequestId(l),
                    name: LockName::new(format!("lock-{m}-{l}")).expect("valid"),
                    owner: OwnerId {
                        member: id.clone(),
                        local: l,
                    },
                    mode: LockMode::Exclusive,
                    token: FencingToken::new(6, (m * 100) as u32 + l as u32),
                    lease_ms: None,
                })
                .collect();
            let report = LockMessage::LockInfoResponse {
                epoch: 7,
                held,
                pending: Vec::new(),
                releases: Vec::new(),
            };
            (id.clone(), report)
        })
        .collect();
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("100_members_10000_locks", |b| {
        b.iter_batched(
            || {
                (
                    LockMachine::new(members[0].clone(), LockConfig::default()),
                    reports.clone(),
                )
            },
            |(mut locks, reports)| {
                locks.handle_view(Instant::ZERO, &view, ViewOrigin::TookOver);
                for (from, report) in reports {
                    locks.handle_message(Instant::ZERO, &from, report);
                }
                assert!(locks.is_serving());
                black_box(locks.grantor_holds().len())
            },
            BatchSize::LargeInput,
        );
    });
    group.finish();
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    lock_unlock_pairs(&mut criterion);
    reconciliation(&mut criterion);
    criterion.final_summary();
}
