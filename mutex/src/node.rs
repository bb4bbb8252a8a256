//! [`Node`]: one member of a cluster, the handle its lock handles are made from.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;

use conclave_lock_api::seal::{Keyring, SealStats, Sealer};
use conclave_lock_api::{
    GrantorTable, HeldLock, LockBackend, LockError, LockLost, LockNameError, MemberId,
    MemberNameError, ServiceName, UnexpectedLock, View,
};
use futures::Stream;

use crate::error::ServiceError;
use crate::group::GroupBackend;
use crate::handles;
use crate::hold::Backend;
use crate::incarnation::incarnation;
use crate::inner::Inner;
use crate::local::LocalBackend;
use crate::mutex::DistributedMutex;
use crate::reentrant::ReentrantLock;
use crate::rwlock::RwLock;
use crate::service::LockService;

pub use crate::builder::{NodeBuilder, DEFAULT_JOIN_TIMEOUT, DEFAULT_SPIN_WAIT};
pub use crate::streams::{LockEvents, Views};

/// One member of a cluster, and the factory of lock handles: the front end over a
/// [`LockBackend`].
///
/// A node made by [`Node::builder`] runs the **group backend**: a driver thread running the
/// cluster protocol over a transport. [`Node::local`] runs the **local backend** (one process,
/// no network, the same semantics), for tests of code that takes Conclave locks;
/// [`Node::with_backend`] runs any other implementation of the trait. Every handle and guard
/// behaves the same on each.
///
/// Dropping the node shuts it down: its locks are released (their guards report them lost
/// with [`crate::LockLostReason::Shutdown`]), pending requests fail with
/// [`crate::LockError::Shutdown`], and it leaves the view in the background: dropping never
/// blocks (the driver thread finishes the leave, bounded by about twice the membership
/// `leave_timeout`, and ends). [`Node::leave`] does the same and waits for it, without
/// blocking the caller's thread; prefer it when the process is about to exit.
///
/// ```
/// use conclave::memory::MemoryNetwork;
/// use conclave::{EndpointConfig, Node};
///
/// let network = MemoryNetwork::new();
/// smol::block_on(async {
///     let node = Node::builder("docs")
///         .name("solo")
///         .transport(network.transport())
///         .config(EndpointConfig::local())
///         .join()
///         .await?;
///     assert_eq!(node.view().map(|v| v.len()), Some(1));
///     node.leave().await;
///     Ok::<(), conclave::NodeError>(())
/// })?;
/// # Ok::<(), conclave::NodeError>(())
/// ```
pub struct Node {
    backend: Backend,
    /// The sealing layer under the group backend's transport.
    sealer: Option<Arc<Sealer>>,
    /// The group backend's protocol counters ([`Node::stats`]).
    pub(crate) protocol_stats: Option<crate::stats::ProtocolStats>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("member", self.backend.member())
            .field("view", &self.view())
            .finish()
    }
}

impl Node {
    /// A builder for a member of the cluster called `cluster`. Only members with the same
    /// cluster name hear each other.
    pub fn builder(cluster: impl Into<String>) -> NodeBuilder {
        NodeBuilder::new(cluster.into())
    }

    /// A node of its own, on the local backend ([`crate::local`]): one process, no network,
    /// no thread, the same lock semantics as a cluster (FIFO, fencing tokens, reentrancy,
    /// read/write, events, cancel safety, holds lost at shutdown). What a unit test of code
    /// that takes Conclave locks runs on. Its view has this one member, whose address is
    /// `127.0.0.1:0`.
    ///
    /// ```
    /// use conclave::{LockError, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// smol::block_on(async {
    ///     let node = Node::local("unit-test")?;
    ///     let mutex = node.mutex("invoice-42")?;
    ///     let guard = mutex.lock().await?;
    ///     assert!(matches!(mutex.try_lock().await, Err(LockError::WouldBlock)));
    ///     guard.unlock().await?;
    ///     node.leave().await;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`MemberNameError`] if `name` is longer than 64 bytes or contains a control character.
    pub fn local(name: &str) -> Result<Node, MemberNameError> {
        let member = MemberId::new(incarnation(), name, ([127, 0, 0, 1], 0).into())?;
        Ok(Self::with_backend(Arc::new(LocalBackend::new(member))))
    }

    /// A node of the group backend running on `inner`, whose transport `sealer` seals.
    pub(crate) fn group(inner: &Arc<Inner>, sealer: Arc<Sealer>) -> Node {
        Node {
            backend: Arc::new(GroupBackend::new(inner.clone())),
            sealer: Some(sealer),
            protocol_stats: Some(crate::stats::protocol_stats(inner)),
        }
    }

    /// A node on `backend`: any implementation of the backend seam (see [`LockBackend`] for
    /// its contract, and the conformance suite in the repository's `tests/` for its proof).
    pub fn with_backend(backend: Arc<dyn LockBackend>) -> Node {
        Node {
            backend,
            sealer: None,
            protocol_stats: None,
        }
    }

    /// A node on `backend` whose datagrams `sealer` seals (the Raft engine).
    #[cfg(feature = "raft")]
    pub(crate) fn with_backend_sealed(
        backend: Arc<dyn LockBackend>,
        sealer: Arc<conclave_lock_api::seal::Sealer>,
    ) -> Node {
        Node {
            backend,
            sealer: Some(sealer),
            protocol_stats: None,
        }
    }

    /// The keyring sealing this member's datagrams, if it was given a key: install, switch
    /// and remove keys on it to rotate them while the node runs ([`Keyring`] shows how).
    pub fn keyring(&self) -> Option<&Keyring> {
        self.sealer.as_ref().and_then(|s| s.keyring())
    }

    /// The sealing layer's counters (packets sealed, opened, and dropped by cause), for a
    /// node of the group backend; `None` on other backends.
    pub fn seal_stats(&self) -> Option<SealStats> {
        self.sealer.as_ref().map(|s| s.stats())
    }

    /// The backend this node runs on.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// This member's id (unique per process incarnation).
    pub fn member_id(&self) -> &MemberId {
        self.backend.member()
    }

    /// The view this member is in now (`None` only after it left).
    pub fn view(&self) -> Option<View> {
        self.backend.view()
    }

    /// A stream of the views this member installs, starting with the current one. It ends
    /// when the node stops.
    pub fn views(&self) -> Views {
        Views::new(self.backend.views())
    }

    /// Waits until this member is in a view of at least `members` members, and returns that
    /// view; `None` if the node stops first. It is how a service waits for its cluster to form
    /// before it takes locks (under `Majority`, the first grant also waits for the grantor's
    /// grace period: a `try_lock` meanwhile fails with `LockError::Unavailable`).
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let join = |name: &'static str| {
    ///         Node::builder("ready")
    ///             .name(name)
    ///             .transport(network.transport())
    ///             .config(EndpointConfig::local())
    ///             .join()
    ///     };
    ///     let (a, b) = (join("a").await?, join("b").await?);
    ///     let view = a.wait_for_members(2).await.expect("the node runs");
    ///     assert!(view.contains(b.member_id()));
    ///     b.leave().await;
    ///     a.leave().await;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub async fn wait_for_members(&self, members: usize) -> Option<View> {
        let mut views = self.views();
        loop {
            let view = std::future::poll_fn(|cx| Pin::new(&mut views).poll_next(cx)).await?;
            if view.len() >= members {
                return Some(view);
            }
        }
    }

    /// The grantor this member knows to be serving: the view's coordinator, once it announced
    /// that it can grant (its table rebuilt, and under `Majority` its term supported by a
    /// majority and past its grace period). `None` while none is known: before the first
    /// announcement, during a failover, in a minority under `Majority`, or after the grantor
    /// answered that it cannot grant. It is this member's knowledge, not a guarantee: a grantor
    /// can stop serving (a partition) before the members hear of it; requests then wait, or
    /// `try_lock` answers `LockError::Unavailable`.
    pub fn grantor(&self) -> Option<MemberId> {
        self.backend.serving_grantor()
    }

    /// Waits until this member knows a serving grantor ([`Node::grantor`]) and returns it;
    /// `None` if the node stops first. With [`Node::wait_for_members`], it is how a service
    /// waits for its cluster to be ready before it takes locks: after it, a `try_lock` of a
    /// free lock succeeds (unless a failover starts meanwhile). It waits for a state of the
    /// cluster, not for an answer, so it has no bound of its own (a minority under `Majority`
    /// serves nothing until the partition heals): wrap it in a timeout of your runtime where
    /// the cluster may not come.
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node, PartitionPolicy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let join = |name: &'static str| {
    ///         Node::builder("ready-to-serve")
    ///             .name(name)
    ///             .transport(network.transport())
    ///             .config(EndpointConfig::local())
    ///             .partition_policy(PartitionPolicy::Majority { cluster_size: 3 })
    ///             .join()
    ///     };
    ///     let (a, b, c) = (join("a").await?, join("b").await?, join("c").await?);
    ///     let grantor = c.wait_until_serving().await.expect("the node runs");
    ///     assert_eq!(&grantor, a.member_id()); // the oldest member coordinates
    ///     let guard = c.mutex("job")?.try_lock().await?; // no Unavailable now
    ///     drop(guard);
    ///     drop((b, c));
    ///     a.leave().await;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub async fn wait_until_serving(&self) -> Option<MemberId> {
        handles::wait_until_serving(&self.backend).await
    }

    /// Makes this member the grantor of its view (Geode's `becomeLockGrantor`): the grantor
    /// hands its lock table over directly (no reconciliation), and from then on this member
    /// grants its own owners' locks without sending a message. Requests that reach the former
    /// grantor meanwhile are answered "not grantor" and resent here; of members that ask at
    /// once, the last one wins. Resolves once this member serves. The wish lasts: after a view
    /// change (which falls back to the new coordinator's reconciliation) this member asks the
    /// new grantor again, until another member takes the role by asking for it. Every
    /// member's [`LockEvent::GrantorChanged`](crate::LockEvent::GrantorChanged) events and
    /// [`Node::grantor`] show who grants.
    ///
    /// It waits at most the node's answer bound (`suspect_timeout + reconcile_timeout`, as
    /// [`MutexGuard::unlock`](crate::MutexGuard::unlock)).
    ///
    /// # Errors
    /// [`crate::LockError::TransferRefused`] under [`crate::PartitionPolicy::Majority`] (the
    /// right to grant comes from a majority's promise to the view's coordinator there);
    /// [`crate::LockError::Shutdown`] if the node stops first;
    /// [`crate::LockError::Unavailable`] if this member does not serve within the bound (the
    /// request for the role stands).
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting; the request for the role stands.
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let join = |name: &'static str| {
    ///         Node::builder("become-grantor")
    ///             .name(name)
    ///             .transport(network.transport())
    ///             .config(EndpointConfig::local())
    ///             .join()
    ///     };
    ///     let (a, b) = (join("a").await?, join("b").await?);
    ///     assert_eq!(b.wait_until_serving().await.as_ref(), Some(a.member_id()));
    ///     b.become_grantor().await?;
    ///     assert_eq!(b.grantor().as_ref(), Some(b.member_id()));
    ///     let guard = b.mutex("hot")?.lock().await?; // granted here, no message sent
    ///     drop(guard);
    ///     drop(b);
    ///     a.leave().await;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub async fn become_grantor(&self) -> Result<(), crate::LockError> {
        handles::become_grantor(&self.backend).await
    }

    /// The grantor's lock table, asked of the grantor from this member (any member can ask):
    /// for each lock with holders or waiters, its holders (owner, mode, fencing token) and
    /// its waiters in queue order, with the grantor and its view epoch. Its `Display` is a
    /// printable table, as JGroups prints its lock table and Geode's `dumpService` does.
    ///
    /// # Errors
    /// [`crate::LockError::Unavailable`] if no grantor could answer (none serves now, e.g.
    /// during a failover, or the grantor changed before it answered) or none answered within
    /// the node's answer bound (`suspect_timeout + reconcile_timeout`, as
    /// [`MutexGuard::unlock`](crate::MutexGuard::unlock)); retry shortly.
    /// [`crate::LockError::Shutdown`] if the node stopped.
    ///
    /// # Cancel safety
    /// Dropping the future forgets the question.
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let join = |name: &'static str| {
    ///         Node::builder("inspect")
    ///             .name(name)
    ///             .transport(network.transport())
    ///             .config(EndpointConfig::local())
    ///             .join()
    ///     };
    ///     let (a, b) = (join("a").await?, join("b").await?);
    ///     b.wait_until_serving().await;
    ///     let guard = a.mutex("invoice-42")?.lock().await?;
    ///     let table = b.lock_table().await?; // served by the grantor, `a`
    ///     assert_eq!(table.locks[0].name.as_str(), "invoice-42");
    ///     assert_eq!(table.locks[0].holders[0].token, guard.fencing_token());
    ///     println!("{table}");
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub async fn lock_table(&self) -> Result<GrantorTable, LockError> {
        handles::lock_table(&self.backend).await
    }

    /// A stream of the lock events of this member (handles created, owners waiting, locks
    /// granted, released and lost, the grantor changing) in its default lock service (each
    /// named service has its own: [`LockService::lock_events`]). It ends when the node stops.
    /// Events are buffered without bound: keep reading, or drop the stream.
    pub fn lock_events(&self) -> LockEvents {
        handles::lock_events(&self.backend)
    }

    /// Registers an unexpected-status handler: it is called, on whichever thread noticed, each
    /// time a lock held on this node is lost without its owner releasing it (duplicate after a
    /// merge, minority, lease expiry, expelled, node shut down), in the default lock service
    /// (named services have their own: [`LockService::on_lock_lost`]). Keep it short and do
    /// not call back into the node from it.
    pub fn on_lock_lost(&self, handler: impl Fn(&LockLost) + Send + Sync + 'static) {
        handles::on_lock_lost(&self.backend, handler);
    }

    /// Registers an unexpected-status handler for grants: it is called, on whichever thread
    /// noticed, when a grant reaches this node that its owner did not expect — the owner had
    /// given the request up (cancelled, timed out, dropped) before the grant arrived, the grant
    /// came from a member that is not the grantor any more, a stale copy of an ended request
    /// arrived, or (under `Majority`) the grant's lease ran out in flight. The node has resolved
    /// it safely before the call (released or given back, and asked again where the owner
    /// still waits): nobody holds anything because of it. Each grant is reported once. Keep it
    /// short and do not call back into the node from it.
    pub fn on_unexpected_lock(&self, handler: impl Fn(&UnexpectedLock) + Send + Sync + 'static) {
        handles::on_unexpected_lock(&self.backend, handler);
    }

    /// A distributed mutex for `name`. Each [`DistributedMutex::lock`] call is its own owner.
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty, longer than [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes, or contains a control character.
    pub fn mutex(&self, name: impl Into<String>) -> Result<DistributedMutex, LockNameError> {
        handles::mutex(&self.backend, name)
    }

    /// A distributed reader-writer lock for `name`.
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty, longer than [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes, or contains a control character.
    pub fn rw_lock(&self, name: impl Into<String>) -> Result<RwLock, LockNameError> {
        handles::rw_lock(&self.backend, name)
    }

    /// The locks of the default lock service held on this node now, by any owner, as the
    /// backend records them (a named service's: [`LockService::held_locks`]).
    pub fn held_locks(&self) -> Vec<HeldLock> {
        self.backend.holds()
    }

    /// How many lock requests of this node in the default lock service wait for an answer.
    pub fn pending_requests(&self) -> usize {
        self.backend.pending_requests()
    }

    /// A reentrant lock for `name`: this handle and its clones are one owner, which may lock
    /// again while holding. Each call makes a new owner.
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty, longer than [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes, or contains a control character.
    pub fn reentrant_lock(&self, name: impl Into<String>) -> Result<ReentrantLock, LockNameError> {
        handles::reentrant_lock(&self.backend, name)
    }

    /// The named lock service `name` of this node (Geode's named `DistributedLockService`),
    /// opened if it is not: an independent namespace of locks next to the node's default one
    /// (the same lock name in two services is two locks), with its own grantor (the view's
    /// coordinator unless transferred, transferred on its own with
    /// [`LockService::become_grantor`]), its own reconciliation, lock table, events and
    /// handlers. Every member takes part in a service once any member uses it. Calling this
    /// again with the same name gives the same service, until it is destroyed
    /// ([`LockService::destroy`]); after that, a fresh one.
    ///
    /// ```
    /// use conclave::{LockError, LockLostReason, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// smol::block_on(async {
    ///     let node = Node::local("shop")?;
    ///     let billing = node.lock_service("billing")?;
    ///     let shipping = node.lock_service("shipping")?;
    ///     let guard = billing.mutex("order-7")?.lock().await?;
    ///     // Another namespace: the same name is another lock.
    ///     let elsewhere = shipping.mutex("order-7")?.try_lock().await?;
    ///     let again = billing.mutex("order-7")?;
    ///     assert!(matches!(again.try_lock().await, Err(LockError::WouldBlock)));
    ///     // Destroying a service releases its locks; its handles refuse new requests.
    ///     billing.destroy().await;
    ///     assert_eq!(guard.lost().await, LockLostReason::ServiceDestroyed);
    ///     assert!(matches!(again.try_lock().await, Err(LockError::ServiceDestroyed)));
    ///     elsewhere.unlock().await?;
    ///     node.leave().await;
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ServiceError::InvalidName`] if the name is empty, has a control character, or is longer than
    /// [`ServiceName::MAX_LEN`](crate::ServiceName::MAX_LEN) bytes;
    /// [`ServiceError::TooManyServices`] if the node runs
    /// [`MAX_SERVICES`](conclave_protocol::MAX_SERVICES) named services already (those other
    /// members opened count too), or runs on a backend without named services;
    /// [`ServiceError::Shutdown`] if the node has stopped.
    pub fn lock_service(&self, name: impl Into<String>) -> Result<LockService, ServiceError> {
        let name = ServiceName::new(name)?;
        let backend = self.backend.service(&name)?;
        Ok(LockService::new(name, backend))
    }

    /// Leaves the cluster: releases this node's locks, fails its pending requests, leaves the
    /// view (waiting at most about twice the membership `leave_timeout` for the coordinator)
    /// and stops the driver thread.
    ///
    /// # Cancel safety
    /// Dropping the future drops the node, whose driver thread finishes the shutdown in the
    /// background.
    pub async fn leave(self) {
        self.backend.shutdown();
        std::future::poll_fn(|cx| self.backend.poll_closed(cx)).await;
    }
}

impl Drop for Node {
    /// Starts the shutdown and returns at once: the driver thread leaves the view in the
    /// background (bounded by about twice the membership `leave_timeout`) and then ends. Drop
    /// never blocks an executor thread; `leave().await` waits for the graceful leave.
    fn drop(&mut self) {
        self.backend.shutdown();
    }
}
