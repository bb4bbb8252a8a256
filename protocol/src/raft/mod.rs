//! The Raft engine: the lock table as a state machine replicated by TiKV's raft-rs
//! (feature `raft`).
//!
//! - [`command`]: the log's commands and what applying one did.
//! - [`table`]: the replicated lock table (pure; the same on every member).
//! - [`persist`]: what a member keeps on disk, in our own types.
//! - [`wire`]: Raft traffic on our wire.
//! - [`RaftNode`]: one member, sans-IO.
//!
//! # Sessions (docs/protocol.md, "The Raft engine")
//! A member proves it is in touch with a leader by a ReadIndex round every quarter of the
//! session timeout: when the round is confirmed, a leader heard from the member after the
//! round was sent, and no newer leader existed then. The leader counts a member silent from
//! the last message it received from it (any message; a new leader counts everyone from its
//! takeover) and proposes [`command::Command::ExpireMember`] once a member was silent for the session
//! timeout plus a margin. The member resigns (every hold lost with
//! [`LockLostReason::Minority`](conclave_lock_api::LockLostReason::Minority), every wait failed) at the send time of its last confirmed
//! round, or of its last granted request, plus the session timeout minus the margin: before
//! any leader can expire it, with clocks whose rates differ by less than the margin allows.

pub mod command;
mod engine;
mod node;
pub mod persist;
mod store;
pub mod table;
pub mod wire;

pub use engine::{EngineError, EngineTiming};
pub use node::{RaftEvent, RaftNode, RaftSettings};
#[cfg(test)]
mod schedules;
#[cfg(test)]
mod tests;
