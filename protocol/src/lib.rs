//! Conclave's protocol core: sans-IO state machines.
//!
//! Nothing here opens a socket, reads a clock, sleeps, spawns a thread or draws global
//! randomness: time comes in as an [`Instant`] argument and randomness as seeds. The driver of
//! the `conclave` crate and the deterministic simulator (`sim`, feature `sim`) run the same
//! code, so every race the simulator finds is a real one.
//!
//! - [`reliable`]: per-peer reliable, ordered, fragmenting delivery over lossy datagrams.
//! - [`gms`]: group membership: discovery, join, leave, failure detection, takeover, merge.
//! - [`locking`]: the grantor's lock table, clients, reconciliation, duplicate locks, fencing
//!   tokens and partition policies.
//! - [`Endpoint`]: one member's stack on the wire, datagrams in and out.
//! - `raft` (feature `raft`): the Raft engine, a lock table replicated by TiKV's raft-rs.
//! - `sim` (feature `sim`): the deterministic cluster simulator.

mod endpoint;
pub mod gms;
pub mod locking;
#[cfg(feature = "raft")]
pub mod raft;
pub mod reliable;
#[cfg(feature = "sim")]
pub mod sim;
#[cfg(test)]
mod test_support;
mod time;

pub use endpoint::{
    shared_settings, Destination, Endpoint, EndpointConfig, EndpointEvent, EndpointStats,
    ServiceTransferError, TooManyServices, Transmit, MAX_SERVICES,
};
pub use time::Instant;
