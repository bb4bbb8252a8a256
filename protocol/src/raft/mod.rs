//! The Raft engine: the lock table as a state machine replicated by TiKV's raft-rs
//! (feature `raft`).
//!
//! - [`command`]: the log's commands and what applying one did.
//! - [`table`]: the replicated lock table (pure; the same on every member).
//! - [`persist`]: what a member keeps on disk, in our own types.

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
mod tests;
