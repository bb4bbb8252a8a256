//! Conclave: distributed lock primitives for async Rust.
//!
//! A service running on many machines writes `let guard = mutex.lock().await?` and knows that
//! no other process of the cluster holds that lock until the guard drops. This crate is the
//! front end: [`Node`] and its named lock services ([`LockService`]), [`DistributedMutex`],
//! [`ReentrantLock`], [`RwLock`], their guards, and the driver that runs [`conclave_protocol`]
//! over a membership backend ([`api::Transport`]): the in-memory [`memory`] transport, always
//! available, `udp` (feature `udp-multicast`, the default) or `tcp` (feature `tcp-mesh`).
//!
//! ```
//! use std::time::Duration;
//! use conclave::memory::MemoryNetwork;
//! use conclave::{EndpointConfig, LockError, Node};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Two members in one process, over the in-memory transport.
//! let network = MemoryNetwork::new();
//! smol::block_on(async {
//!     let a = Node::builder("orders-cluster")
//!         .name("worker-1")
//!         .transport(network.transport())
//!         .config(EndpointConfig::local())
//!         .join()
//!         .await?;
//!     let b = Node::builder("orders-cluster")
//!         .name("worker-2")
//!         .transport(network.transport())
//!         .config(EndpointConfig::local())
//!         .join()
//!         .await?;
//!
//!     let guard = a.mutex("invoice-42")?.lock().await?; // waits; Err on shutdown
//!     let _token = guard.fencing_token();               // pass it to the resource you protect
//!     let on_b = b.mutex("invoice-42")?;
//!     assert!(matches!(on_b.try_lock().await, Err(LockError::WouldBlock)));
//!     assert!(matches!(
//!         on_b.lock_timeout(Duration::from_millis(50)).await,
//!         Err(LockError::Timeout)
//!     ));
//!     drop(guard);                                       // releases without blocking
//!     let guard = on_b.lock().await?;
//!     guard.unlock().await?;                             // releases, waits for the grantor
//!
//!     b.leave().await;
//!     a.leave().await;
//!     Ok(())
//! })
//! # }
//! ```
//!
//! # The backend seam
//! The front end (handles, guards, futures, events, handlers) is written once on
//! [`LockBackend`], the trait every backend implements (see its documentation for the
//! contract, and the conformance suite in the repository's `tests/` for its proof):
//!
//! - the **group backend**, which [`Node::builder`] starts: the cluster protocol over a
//!   transport, described below;
//! - the **local backend** ([`Node::local`], [`local`]): one process, no network, the same
//!   semantics — what a unit test of code that takes Conclave locks runs on;
//! - any other implementation, through [`Node::with_backend`].
//!
//! # How it runs
//! Each [`Node`] of the group backend owns one thread, `conclave-<name>`, that receives
//! datagrams, fires the protocol's timers and answers the grantor's messages. The public
//! futures are woken through the standard [`Waker`](std::task::Waker), so the same API works
//! under tokio, smol, async-std or a plain `block_on`; the crate depends on no runtime.
//!
//! A lock request is registered in the protocol core on the future's first poll, from the
//! caller's own task, which also sends the request datagram. The driver thread of the node
//! completes the waiting future directly when the grant arrives. Thread hops per request:
//!
//! - this member is the grantor and the lock is free: none, the grant happens inside the
//!   first poll;
//! - the grantor is another member: three, as for any request and reply over a network
//!   (caller → grantor's driver → this node's driver → caller's task);
//! - dropping a guard: none for the caller (the release is sent from the dropping thread);
//!   [`MutexGuard::unlock`] waits for the acknowledgement, three hops again.
//!
//! # Failure semantics
//! A guard tells what its member believes: [`MutexGuard::status`] is held, suspended (the
//! grantor has been silent; ownership unknown) or lost, and [`MutexGuard::lost`] resolves
//! when the lock is lost without being released. [`Node::on_lock_lost`] registers handlers
//! called at that moment, and [`Node::lock_events`] streams every lock event. What a
//! partition may do is the [`PartitionPolicy`]: `Available` keeps granting on every side and
//! resolves duplicates at the merge (the loser is told), `Majority` grants only in a majority
//! and makes a minority's holders give their locks up. Fencing tokens strictly increase per
//! lock across grantor changes: pass them to the resource you protect.

mod builder;
mod contention;
mod driver;
mod durable;
mod duty;
mod effects;
mod error;
pub mod faults;
mod front;
pub mod futures;
mod group;
mod handles;
mod hold;
mod incarnation;
mod inner;
mod join;
pub mod local;
pub mod memory;
#[cfg(feature = "metrics")]
mod metrics;
mod mutex;
mod node;
#[cfg(feature = "raft")]
pub mod raft;
mod reentrant;
mod rwlock;
mod service;
mod shared;
mod slot;
mod spin;
pub mod stats;
mod streams;

/// The repository's documents (`docs/*.md`): the user guide, the design, the protocol and the
/// benchmarks, rendered by rustdoc so that `cargo doc` checks their links to the API. The
/// crate's `docs/` holds symbolic links to them, which `cargo package` replaces with the files,
/// so the published crate carries one copy and the repository keeps one source. Built for
/// documentation only, and not as doctests: their snippets are fragments.
#[cfg(all(doc, not(doctest)))]
pub mod docs {
    #[doc = include_str!("../docs/guide.md")]
    pub mod guide {}
    #[doc = include_str!("../docs/design.md")]
    pub mod design {}
    #[doc = include_str!("../docs/protocol.md")]
    pub mod protocol {}
    #[doc = include_str!("../docs/benchmarks.md")]
    pub mod benchmarks {}
}

pub use conclave_lock_api as api;
pub use conclave_lock_api::seal;
pub use conclave_lock_api::wire::SharedSetting;
pub use conclave_lock_api::{
    ClusterName, ClusterNameError, DiscoveryOutcome, DiscoveryPlace, DiscoveryReport, FencingToken,
    GrantorTable, HeldLock, LockBackend, LockError, LockEvent, LockLost, LockLostReason, LockMode,
    LockName, LockNameError, LockStatus, MemberId, OwnerId, ServiceName, UnexpectedGrant,
    UnexpectedLock, UnlockError, View,
};
/// The protocol crate (sans-IO state machines and the simulator), for those who drive the
/// protocol themselves. Not part of this crate's API: what a user of nodes and locks needs
/// of it is re-exported at the top level.
#[doc(hidden)]
pub use conclave_protocol as protocol;
pub use conclave_protocol::gms::{Founding, GmsConfig, GmsConfigError};
pub use conclave_protocol::locking::{
    LockConfig, LockConfigError, NodeCacheConfig, PartitionPolicy,
};
pub use conclave_protocol::reliable::{ConfigError as ReliableConfigError, ReliableConfig};
pub use conclave_protocol::{shared_settings, EndpointConfig, MAX_SERVICES};

/// The UDP multicast backend (feature `udp-multicast`): multicast discovery, unicast
/// datagrams, on loopback with TTL 0 unless configured otherwise.
#[cfg(feature = "udp-multicast")]
pub use conclave_udp as udp;

/// The TCP mesh backend (feature `tcp-mesh`): members find each other from a seed list and
/// keep one connection per pair; for networks without multicast. See [`tcp::TcpMesh`].
#[cfg(feature = "tcp-mesh")]
pub use conclave_tcp as tcp;
pub use error::{NodeError, ServiceError};
pub use mutex::{DistributedMutex, MutexGuard};
pub use node::{LockEvents, Node, NodeBuilder, Views, DEFAULT_JOIN_TIMEOUT, DEFAULT_SPIN_WAIT};
pub use reentrant::{ReentrantGuard, ReentrantLock};
pub use rwlock::{RwLock, RwLockGuard};
pub use service::LockService;
pub use stats::NodeStats;

// The futures by their earlier paths, for code written before the `futures` module.
#[doc(hidden)]
pub use futures::{Lock, Lost, Read, Unlock, Write};
/// The future of [`ReentrantLock::lock`], by its earlier name.
#[deprecated(since = "0.1.0", note = "renamed `conclave::futures::LockReentrant`")]
pub type ReentrantLockFuture = futures::LockReentrant;
