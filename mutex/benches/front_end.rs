//! Lock + unlock through the front end and driver on the in-memory transport, next to the
//! same through the protocol core alone and a raw cross-thread ping-pong (the cost of one
//! round trip between two threads, which a remote grant needs at least).
//!
//! Run: `cargo bench -p conclave-locks --bench front_end`

use std::hint::black_box;
use std::time::Duration;

use conclave::memory::MemoryNetwork;
use conclave::protocol::gms::ViewOrigin;
use conclave::protocol::locking::{LockConfig, LockMachine, LockNotice, LockRequest};
use conclave::protocol::Instant;
use conclave::{EndpointConfig, LockName, MemberId, Node, View};
use criterion::Criterion;
use futures::executor::block_on;

fn join(network: &MemoryNetwork, name: &str) -> Node {
    block_on(
        Node::builder("bench")
            .name(name)
            .transport(network.transport())
            .config(EndpointConfig::local())
            .join(),
    )
    .expect("join")
}

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("lock+unlock");
    group.measurement_time(Duration::from_secs(3));

    // The protocol core alone: a grantor serving its own client.
    let me = MemberId::new(1, "core", "127.0.0.1:1".parse().expect("addr")).expect("member");
    let mut core = LockMachine::new(me.clone(), LockConfig::default());
    core.handle_view(
        Instant::ZERO,
        &View::new(1, vec![me]).expect("view"),
        ViewOrigin::Founded,
    );
    let name = LockName::new("bench").expect("name");
    group.bench_function("core, local grantor", |b| {
        b.iter(|| {
            let request = core.lock(Instant::ZERO, LockRequest::exclusive(1, name.clone()));
            while let Some(notice) = core.poll_notice() {
                black_box(&notice);
                if matches!(notice, LockNotice::Granted { .. }) {
                    core.unlock(Instant::ZERO, request).expect("held");
                }
            }
            while core.poll_notice().is_some() {}
        })
    });

    // The front end on the grantor's own node: no thread hop.
    let network = MemoryNetwork::new();
    let grantor = join(&network, "grantor");
    let local = grantor.mutex("bench").expect("name");
    group.bench_function("front end, local grantor (drop)", |b| {
        b.iter(|| block_on(async { drop(local.lock().await.expect("lock")) }))
    });

    // The front end on another node: request and grant cross two driver threads.
    let client = join(&network, "client");
    let remote = client.mutex("bench").expect("name");
    group.bench_function("front end, remote grantor (lock, unlock acked)", |b| {
        b.iter(|| {
            block_on(async {
                let guard = remote.lock().await.expect("lock");
                guard.unlock().await.expect("unlock");
            })
        })
    });

    // Two round trips between threads, for scale: the floor of the remote case.
    let (to_echo, echo_in) = async_channel::bounded::<u64>(1);
    let (echo_out, from_echo) = async_channel::bounded::<u64>(1);
    let echo = std::thread::spawn(move || {
        while let Ok(v) = echo_in.recv_blocking() {
            if echo_out.send_blocking(v).is_err() {
                break;
            }
        }
    });
    group.bench_function("raw cross-thread ping-pong x2", |b| {
        b.iter(|| {
            block_on(async {
                for i in 0..2 {
                    to_echo.send(i).await.expect("send");
                    black_box(from_echo.recv().await.expect("recv"));
                }
            })
        })
    });
    group.finish();
    drop(to_echo);
    let _ = echo.join();
    drop((client, grantor));
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    benches(&mut criterion);
    criterion.final_summary();
}
