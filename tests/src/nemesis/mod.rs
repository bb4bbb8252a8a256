//! The nemesis: five real `conclave-node` processes in a private network namespace, each running
//! clients that write through a fencing register, while faults chosen by a seed hit them (kill -9
//! and restart, SIGSTOP/SIGCONT, packet loss and partitions with nftables, in-process delay and
//! reordering, garbage datagrams). Afterwards a checker reads only the logs. See
//! `docs/reliability.md` and the binary `conclave-nemesis`.
//!
//! - [`client`]: the fenced client loop the node runs (`fenced` command) and the register.
//! - [`delay`]: a transport wrapper that holds sends back (delay, jitter, so reordering).
//! - [`rng`]: the small deterministic generator the faults are drawn from.
//! - [`harness`] (the binary's whole run), [`cluster`] (the member processes), [`faults`],
//!   [`checker`], [`quorum`] (when a connected majority existed), [`plot`]: the harness side.

pub mod checker;
pub mod client;
pub mod cluster;
pub mod delay;
pub mod faults;
pub mod harness;
pub mod plot;
pub mod quorum;
pub mod rng;

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock time (CLOCK_REALTIME) in microseconds since the Unix epoch: every process of a run
/// shares this clock, so the checker can order their logs.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}
