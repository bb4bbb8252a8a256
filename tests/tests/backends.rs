//! The backend conformance suite: every scenario of [`conclave_tests::backend`] against every
//! backend, as `conformance::<backend>::<scenario>`: the local backend; the group backend over
//! memory, UDP and TCP; over memory with node-level caching and read delegations at every
//! member (`memory_cached`) or at every other member (`memory_mixed`); and over UDP and TCP
//! with a cluster key (`udp_sealed`, `tcp_sealed`); and the Raft engine over a TCP mesh
//! (`raft`), UDP (`raft_udp`), memory (`raft_memory`) and a sealed TCP mesh (`raft_sealed`).

use conclave_tests::backend;
use conclave_tests::fixtures::{self, Start};

/// Runs `scenario` on the members `start` makes for a cluster named after the test, within a
/// bound, on smol's executor (the front end works under any runtime).
fn run<F>(start: Start, test: &str, scenario: fn(Vec<conclave::Node>) -> F)
where
    F: std::future::Future<Output = ()>,
{
    let cluster = format!("conformance-{test}-{}", std::process::id());
    smol::block_on(conclave_tests::within(
        std::time::Duration::from_secs(120),
        test,
        async move { scenario(start(cluster).await).await },
    ));
}

macro_rules! conformance {
    ($($backend:ident),* $(,)? ; raft: $($raft:ident),* $(,)?) => {
        mod conformance {
            $(
                mod $backend {
                    conformance!(@scenarios $backend:
                        readiness, exclusion, fifo, try_and_timeout, cancellation, reentrancy,
                        read_write, fencing_tokens, events, inspection, lost_holds, shutdown, leases,
                        grantor_transfer, named_services);
                }
            )*
            // The Raft engine keeps every service in one log with one leader: its services
            // share the grantor (`named_services_one_log`), by design.
            $(
                mod $raft {
                    conformance!(@scenarios $raft:
                        readiness, exclusion, fifo, try_and_timeout, cancellation, reentrancy,
                        read_write, fencing_tokens, events, inspection, lost_holds, shutdown, leases,
                        grantor_transfer, named_services_one_log);
                }
            )*
        }
    };
    (@scenarios $backend:ident: $($scenario:ident),*) => {
        $(
            #[test]
            fn $scenario() {
                super::super::run(
                    super::super::fixtures::$backend,
                    concat!(stringify!($backend), "-", stringify!($scenario)),
                    super::super::backend::$scenario,
                );
            }
        )*
    };
}

conformance!(
    local,
    memory,
    memory_cached,
    memory_mixed,
    udp,
    tcp,
    udp_sealed,
    tcp_sealed;
    raft: raft,
    raft_udp,
    raft_memory,
    raft_sealed,
);
