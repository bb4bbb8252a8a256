//! Conformance suites for Conclave: what every backend and every transport must do, written
//! once and run against each implementation.
//!
//! - [`backend`]: the scenarios of the backend seam ([`conclave::LockBackend`]) as a user meets
//!   them through [`conclave::Node`] — exclusion, FIFO, try and timeout, cancellation,
//!   reentrancy, read/write, fencing tokens, events, lost holds, shutdown, leases, grantor
//!   transfer, named lock services. The test binary `backends` runs them as
//!   `conformance::<backend>::<scenario>` against the local backend and the group backend over
//!   memory, UDP and TCP, and over UDP and TCP with a cluster key.
//! - [`fixtures`]: how each backend's members are started for a scenario.
//! - the test binary `transport` runs one set of scenarios of the `Transport` contract against
//!   every transport (the in-memory one, UDP multicast, the TCP mesh), as
//!   `<transport>::<scenario>`.
//! - the test binary `multiprocess` runs clusters of `conclave-node` processes (this crate's
//!   binary) over UDP and TCP: `kill -9`, restarts, pauses, hostile datagrams.
//!
//! - the test binary `security` attacks keyed clusters over UDP and TCP ([`attacker`]): outsiders,
//!   wrong keys, forged and replayed packets, key rotation, as `security::<transport>::<attack>`.
//!
//! - [`nemesis`] (Linux): the real-process fault harness `conclave-nemesis` and what the
//!   `conclave-node` processes it drives run (`docs/reliability.md`).
//!
//! Whoever writes a new backend adds a [`fixtures::Start`] for it and one line to the
//! `conformance!` list in `tests/backends.rs`; the suite then tells them what the trait means.

#![allow(clippy::unwrap_used)]

pub mod attacker;
pub mod backend;
pub mod fixtures;
#[cfg(target_os = "linux")]
pub mod nemesis;

use std::future::Future;
use std::time::Duration;

use async_io::Timer;
use futures::future::{select, Either};

/// The bound on any single wait in the suites.
pub const WAIT: Duration = Duration::from_secs(20);

/// `fut`, or a panic naming `what` if it takes longer than `limit`. Uses async-io's timer, so
/// it works under any runtime.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    let fut = std::pin::pin!(fut);
    match select(fut, Timer::after(limit)).await {
        Either::Left((value, _)) => value,
        Either::Right(_) => panic!("timed out after {limit:?}: {what}"),
    }
}
