//! [`Node`]: one member of a cluster, and its builder.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use async_channel::Receiver;
use async_io::Timer;
use conclave_lock_api::{
    FencingToken, LockEvent, LockMode, LockName, LockNameError, MemberId, OwnerId, Transport, View,
};
use conclave_protocol::locking::{HoldStatus, PartitionPolicy};
use conclave_protocol::{Endpoint, EndpointConfig};
use futures::future::{select, Either};
use futures::Stream;
use tracing::debug;

use crate::driver;
use crate::error::NodeError;
use crate::hold::LockStatus;
use crate::mutex::DistributedMutex;
use crate::reentrant::ReentrantLock;
use crate::rwlock::RwLock;
use crate::shared::{Command, Inner, LockLost, Phase};

/// How long [`NodeBuilder::join`] waits for the first view unless told otherwise.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a waiting lock future busy-polls for its answer before it sleeps, unless told
/// otherwise ([`NodeBuilder::spin_wait`]): a round trip or two on loopback.
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_micros(50);

/// Configures and starts a [`Node`]. Made by [`Node::builder`].
pub struct NodeBuilder {
    cluster: String,
    name: String,
    transport: Option<Arc<dyn Transport>>,
    config: EndpointConfig,
    join_timeout: Duration,
    spin_wait: Duration,
}

impl fmt::Debug for NodeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeBuilder")
            .field("cluster", &self.cluster)
            .field("name", &self.name)
            .field(
                "transport",
                &self.transport.as_ref().map(|t| t.local_addr()),
            )
            .field("config", &self.config)
            .field("join_timeout", &self.join_timeout)
            .field("spin_wait", &self.spin_wait)
            .finish()
    }
}

impl NodeBuilder {
    /// The member's human-readable name (at most 64 bytes, no control characters). It names
    /// the driver thread (`conclave-<name>`) and appears in logs. Default: empty.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The membership backend to run over (required), e.g. a
    /// [`crate::memory::MemoryTransport`].
    pub fn transport(mut self, transport: impl Transport) -> Self {
        self.transport = Some(Arc::new(transport));
        self
    }

    /// Every protocol setting at once. Default: [`EndpointConfig::default`] (LAN timings);
    /// [`EndpointConfig::local`] has fast timings for one host.
    pub fn config(mut self, config: EndpointConfig) -> Self {
        self.config = config;
        self
    }

    /// What a partition may do with locks; every member must use the same. Default
    /// [`PartitionPolicy::Available`].
    pub fn partition_policy(mut self, policy: PartitionPolicy) -> Self {
        self.config.locks.policy = policy;
        self
    }

    /// How long [`NodeBuilder::join`] waits for the first view. Default
    /// [`DEFAULT_JOIN_TIMEOUT`] (10 s).
    pub fn join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// How long a future waiting for a lock (or for the acknowledgement of an unlock)
    /// busy-polls for the answer before it sleeps until woken. Default
    /// [`DEFAULT_SPIN_WAIT`] (50 µs); `Duration::ZERO` never spins.
    ///
    /// Waking a sleeping thread can cost as much as a loopback round trip, so a short spin
    /// makes an uncontended lock from another process cost about one round trip. The spin
    /// yields to the executor between polls (the task wakes itself), so other tasks keep
    /// running, but it keeps a core busy for up to this long per wait: set it to zero where
    /// CPU matters more than latency, or to about one round trip of your network.
    pub fn spin_wait(mut self, spin: Duration) -> Self {
        self.spin_wait = spin;
        self
    }

    /// Starts the node's driver thread and waits until the node is in a view: it joined the
    /// cluster's coordinator, or, finding none, founded the cluster.
    ///
    /// # Errors
    /// [`NodeError`]: an invalid name or setting, no transport, no view within the join
    /// timeout (the node is stopped again), or a thread that could not be spawned.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes stops the node again (leaving, joining its
    /// thread).
    pub async fn join(self) -> Result<Node, NodeError> {
        self.config.gms.validate()?;
        self.config.locks.validate()?;
        self.config.reliable.validate()?;
        let transport = self.transport.ok_or(NodeError::NoTransport)?;
        let member = MemberId::new(incarnation(), &self.name, transport.local_addr())?;
        let leave_bound = self.config.gms.leave_timeout * 2 + Duration::from_millis(200);
        let endpoint = Endpoint::new(
            &self.cluster,
            member,
            self.config,
            transport.max_datagram_size(),
        );
        let (commands, receiver) = async_channel::unbounded();
        let inner = Arc::new(Inner::new(endpoint, transport, commands, self.spin_wait));
        let thread =
            driver::spawn(inner.clone(), receiver, leave_bound).map_err(NodeError::Spawn)?;
        let node = Node {
            inner,
            thread: Some(thread),
        };
        let mut timer = Timer::after(self.join_timeout);
        loop {
            let listener = {
                let shared = node.inner.lock();
                if shared.phase != Phase::Running {
                    return Err(NodeError::Shutdown);
                }
                if shared.view.is_none() {
                    Some(node.inner.changed.listen())
                } else {
                    None
                }
            };
            let Some(listener) = listener else {
                debug!(member = %node.inner.member, "joined");
                return Ok(node);
            };
            if let Either::Right(_) = select(listener, &mut timer).await {
                return Err(NodeError::JoinTimeout(self.join_timeout));
            }
        }
    }
}

/// One member of a cluster: a driver thread running the protocol over a transport, and the
/// factory of lock handles.
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
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("member", &self.inner.member)
            .field("view", &self.view())
            .finish()
    }
}

impl Node {
    /// A builder for a member of the cluster called `cluster`. Only members with the same
    /// cluster name hear each other.
    pub fn builder(cluster: impl Into<String>) -> NodeBuilder {
        NodeBuilder {
            cluster: cluster.into(),
            name: String::new(),
            transport: None,
            config: EndpointConfig::default(),
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            spin_wait: DEFAULT_SPIN_WAIT,
        }
    }

    /// This member's id (unique per process incarnation).
    pub fn member_id(&self) -> &MemberId {
        &self.inner.member
    }

    /// The view this member is in now (`None` only after it left).
    pub fn view(&self) -> Option<View> {
        let shared = self.inner.lock();
        if shared.phase == Phase::Running {
            shared.view.clone()
        } else {
            None
        }
    }

    /// A stream of the views this member installs, starting with the current one. It ends
    /// when the node stops.
    pub fn views(&self) -> Views {
        Views {
            receiver: Box::pin(self.inner.lock().subscribe_views()),
        }
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

    /// A stream of the lock events of this member (handles created, owners waiting, locks
    /// granted, released and lost). It ends when the node stops. Events are buffered without
    /// bound: keep reading, or drop the stream.
    pub fn lock_events(&self) -> LockEvents {
        LockEvents {
            receiver: Box::pin(self.inner.lock().subscribe_events()),
        }
    }

    /// Registers an unexpected-status handler: it is called, on whichever thread noticed, each
    /// time a lock held on this node is lost without its owner releasing it (duplicate after a
    /// merge, minority, lease expiry, expelled, node shut down). Keep it short and do not call
    /// back into the node from it.
    pub fn on_lock_lost(&self, handler: impl Fn(&LockLost) + Send + Sync + 'static) {
        self.inner.lock().handlers.push(Arc::new(handler));
    }

    /// A distributed mutex for `name`. Each [`DistributedMutex::lock`] call is its own owner.
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty or longer than [`LockName::MAX_LEN`] bytes.
    pub fn mutex(&self, name: impl Into<String>) -> Result<DistributedMutex, LockNameError> {
        Ok(DistributedMutex::new(
            self.inner.clone(),
            self.created(name)?,
        ))
    }

    /// A distributed reader-writer lock for `name`.
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty or longer than [`LockName::MAX_LEN`] bytes.
    pub fn rw_lock(&self, name: impl Into<String>) -> Result<RwLock, LockNameError> {
        Ok(RwLock::new(self.inner.clone(), self.created(name)?))
    }

    /// The locks held on this node now, by any owner, as the protocol core records them.
    pub fn held_locks(&self) -> Vec<HeldLock> {
        let shared = self.inner.lock();
        let now = self.inner.now();
        shared
            .endpoint
            .holds(now)
            .into_iter()
            .map(|h| HeldLock {
                owner: shared.owner_id(h.owner),
                name: h.name,
                mode: h.mode,
                token: h.token,
                status: match h.status {
                    HoldStatus::Held => LockStatus::Held,
                    HoldStatus::Suspended => LockStatus::Suspended,
                    HoldStatus::Lost => LockStatus::Lost,
                },
            })
            .collect()
    }

    /// How many lock requests of this node wait for the grantor's answer.
    pub fn pending_requests(&self) -> usize {
        self.inner.lock().endpoint.locks().pending_requests().len()
    }

    /// A reentrant lock for `name`: this handle and its clones are one owner, which may lock
    /// again while holding. Each call makes a new owner.
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty or longer than [`LockName::MAX_LEN`] bytes.
    pub fn reentrant_lock(&self, name: impl Into<String>) -> Result<ReentrantLock, LockNameError> {
        let name = self.created(name)?;
        let owner = self.inner.lock().next_owner();
        Ok(ReentrantLock::new(self.inner.clone(), name, owner))
    }

    fn created(&self, name: impl Into<String>) -> Result<LockName, LockNameError> {
        let name = LockName::new(name)?;
        self.inner
            .lock()
            .emit(LockEvent::Created { name: name.clone() });
        Ok(name)
    }

    /// Leaves the cluster: releases this node's locks, fails its pending requests, leaves the
    /// view (waiting at most about twice the membership `leave_timeout` for the coordinator)
    /// and stops the driver thread.
    ///
    /// # Cancel safety
    /// Dropping the future drops the node, whose driver thread finishes the shutdown in the
    /// background.
    pub async fn leave(mut self) {
        self.inner.command(Command::Shutdown);
        loop {
            let listener = {
                // Listen while holding the state lock: the driver marks the node closed under
                // it and notifies after, so the wake-up cannot slip between check and listen.
                let shared = self.inner.lock();
                if shared.phase == Phase::Closed {
                    break;
                }
                self.inner.changed.listen()
            };
            listener.await;
        }
        self.join_thread();
    }

    fn join_thread(&mut self) {
        if let Some(thread) = self.thread.take() {
            if thread.thread().id() == std::thread::current().id() {
                return; // dropped by a handler running on the driver thread itself
            }
            if thread.join().is_err() {
                tracing::error!(member = %self.inner.member, "driver thread panicked");
            }
        }
    }
}

impl Drop for Node {
    /// Starts the shutdown and returns at once: the driver thread leaves the view in the
    /// background (bounded by about twice the membership `leave_timeout`) and then ends. Drop
    /// never blocks an executor thread; `leave().await` waits for the graceful leave.
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.inner.command(Command::Shutdown);
            drop(thread); // detached: it ends by itself once it has left
        }
    }
}

/// A lock held on a node; see [`Node::held_locks`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock.
    pub name: LockName,
    /// Its owner.
    pub owner: OwnerId,
    /// The mode held.
    pub mode: LockMode,
    /// The fencing token of the grant.
    pub token: FencingToken,
    /// Held or suspended (lost locks are not listed once their owner was told).
    pub status: LockStatus,
}

/// A stream of views; see [`Node::views`].
#[derive(Debug)]
pub struct Views {
    receiver: Pin<Box<Receiver<View>>>,
}

impl Stream for Views {
    type Item = View;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<View>> {
        self.receiver.as_mut().poll_next(cx)
    }
}

/// A stream of lock events; see [`Node::lock_events`].
#[derive(Debug)]
pub struct LockEvents {
    receiver: Pin<Box<Receiver<LockEvent>>>,
}

impl Stream for LockEvents {
    type Item = LockEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LockEvent>> {
        self.receiver.as_mut().poll_next(cx)
    }
}

/// A random 128-bit incarnation id, from std's randomly keyed hasher (no extra dependency).
fn incarnation() -> u128 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let half = |salt: u64| {
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u64(salt);
        hasher.write_u64(count);
        hasher.write_u32(std::process::id());
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        hasher.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}
