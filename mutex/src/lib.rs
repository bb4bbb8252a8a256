//! Conclave: distributed lock primitives for async Rust.
//!
//! A service running on many machines writes `let guard = mutex.lock().await?` and knows that
//! no other process of the cluster holds that lock until the guard drops. This crate is the
//! front end: `Node`, `DistributedMutex`, `ReentrantLock`, `RwLock`, their guards, and the driver
//! that runs [`conclave_protocol`] over a membership backend.
//!
//! Status: the front end lands with its own issue. Today this crate re-exports the contract
//! ([`conclave_lock_api`]) and the protocol core ([`conclave_protocol`]).

pub use conclave_lock_api as api;
pub use conclave_protocol as protocol;
