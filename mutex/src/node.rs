//! [`Node`]: one member of a cluster, and its builder.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_io::Timer;
use conclave_lock_api::seal::{ClusterKey, Keyring, SealStats, SealedTransport, Sealer};
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::{
    ClusterName, GrantorTable, HeldLock, LockBackend, LockError, LockEvent, LockLost,
    LockNameError, MemberId, MemberNameError, ServiceName, Transport, UnexpectedLock, View,
};
use conclave_protocol::gms::{Founding, JoinProblem};
use conclave_protocol::locking::{NodeCacheConfig, PartitionPolicy};
use conclave_protocol::{Endpoint, EndpointConfig};
use futures::future::{select, Either};
use futures::stream::BoxStream;
use futures::Stream;
use tracing::debug;

use crate::driver;
use crate::durable::TermFile;
use crate::error::{NodeError, ServiceError};
use crate::group::GroupBackend;
use crate::handles;
use crate::hold::Backend;
use crate::local::LocalBackend;
use crate::mutex::DistributedMutex;
use crate::reentrant::ReentrantLock;
use crate::rwlock::RwLock;
use crate::service::LockService;
use crate::shared::{Inner, Phase};

/// How long [`NodeBuilder::join`] waits for the first view unless told otherwise.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest a waiting lock future busy-polls for its answer before it sleeps, unless told
/// otherwise ([`NodeBuilder::spin_wait`]): a few round trips on loopback, one or two on a
/// fast LAN. Within it, each node spins about twice as long as its answers take.
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_micros(200);

/// Configures and starts a [`Node`]. Made by [`Node::builder`].
pub struct NodeBuilder {
    cluster: String,
    name: String,
    transport: Option<Arc<dyn Transport>>,
    config: Option<EndpointConfig>,
    policy: Option<PartitionPolicy>,
    node_cache: Option<NodeCacheConfig>,
    founding: Option<Founding>,
    join_timeout: Duration,
    spin_wait: Duration,
    data_dir: Option<std::path::PathBuf>,
    key: KeySource,
}

/// Where a node's cluster key comes from (resolved when it joins).
#[derive(Debug, Clone)]
enum KeySource {
    None,
    Keyring(Keyring),
    File(std::path::PathBuf),
    Env,
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
            .field("policy", &self.policy)
            .field("node_cache", &self.node_cache)
            .field("founding", &self.founding)
            .field("join_timeout", &self.join_timeout)
            .field("spin_wait", &self.spin_wait)
            .field("data_dir", &self.data_dir)
            .field("key", &self.key)
            .finish()
    }
}

impl NodeBuilder {
    /// The configuration `join` runs with: [`NodeBuilder::config`] (or the default) with the
    /// settings of the builder's own methods in it.
    fn resolved_config(&self) -> Result<EndpointConfig, NodeError> {
        let given = self.config.is_some();
        let mut config = self.config.clone().unwrap_or_default();
        let defaults = EndpointConfig::default();
        if let Some(policy) = self.policy {
            if given
                && config.locks.policy != defaults.locks.policy
                && config.locks.policy != policy
            {
                return Err(NodeError::ConflictingSettings {
                    setting: "partition_policy",
                    first: format!("{:?} (in config)", config.locks.policy),
                    second: format!("{policy:?} (partition_policy)"),
                });
            }
            config.locks.policy = policy;
        }
        if let Some(cache) = &self.node_cache {
            let ours = &config.locks.node_cache;
            if given && ours.enabled && ours != cache {
                return Err(NodeError::ConflictingSettings {
                    setting: "node_cache",
                    first: format!("{ours:?} (in config)"),
                    second: format!("{cache:?} (node_cache)"),
                });
            }
            config.locks.node_cache = *cache;
        }
        Ok(config)
    }

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
    ///
    /// The builder's methods compose in any order: [`NodeBuilder::partition_policy`] and
    /// [`NodeBuilder::node_cache`] set their part of the configuration whether they are called
    /// before or after this. A method called twice keeps the last value. A configuration whose
    /// policy is not the default, or whose node cache is enabled, *and* differs from the one
    /// given by its own method is a contradiction: [`NodeBuilder::join`] refuses it
    /// ([`NodeError::ConflictingSettings`]).
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, LockError, Node, PartitionPolicy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let node = Node::builder("orders")
    ///         .transport(network.transport())
    ///         .partition_policy(PartitionPolicy::Majority { cluster_size: 3 })
    ///         .config(EndpointConfig::local()) // keeps the policy given above
    ///         .join()
    ///         .await?;
    ///     // One member of three is no majority: nothing is granted.
    ///     let mutex = node.mutex("invoice-7")?;
    ///     let attempt = mutex.try_lock().await;
    ///     assert!(matches!(attempt, Err(LockError::NotMember)), "{attempt:?}");
    ///     node.leave().await;
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn config(mut self, config: EndpointConfig) -> Self {
        self.config = Some(config);
        self
    }

    /// What a partition may do with locks; every member must use the same (a joiner with
    /// another policy or cluster size is refused: [`NodeError::SettingMismatch`]). Default
    /// [`PartitionPolicy::Available`]. Composes with [`NodeBuilder::config`] in either order.
    pub fn partition_policy(mut self, policy: PartitionPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// When this node may found a new cluster rather than join one (see [`Founding`]).
    ///
    /// Default: [`Founding::WithOthers`] on a transport with somewhere to look for the
    /// cluster (the multicast group of UDP, the seeds of a TCP mesh), so a node that reaches
    /// nobody fails to join ([`NodeError::NoCluster`], naming each place it looked and what
    /// happened there) instead of making a cluster of one; [`Founding::Alone`] on a
    /// transport with nowhere to look (a TCP mesh without seeds, the in-memory network),
    /// which can only be the first member. Give [`Founding::Alone`] to the first member of a
    /// new cluster (or to every member of a cluster whose members start one at a time).
    ///
    /// ```
    /// use std::time::Duration;
    /// use conclave::tcp::TcpMesh;
    /// use conclave::{EndpointConfig, Founding, Node, NodeError};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// smol::block_on(async {
    ///     // A seed nobody listens on: the join fails, naming the seed.
    ///     let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    ///     let error = Node::builder("orders")
    ///         .transport(TcpMesh::loopback([dead])?)
    ///         .config(EndpointConfig::local())
    ///         .join_timeout(Duration::from_secs(1))
    ///         .join()
    ///         .await
    ///         .unwrap_err();
    ///     assert!(matches!(error, NodeError::NoCluster { .. }));
    ///     assert!(error.to_string().contains(&dead.to_string()));
    ///     // The first member of a new cluster says it may found one.
    ///     let first = Node::builder("orders")
    ///         .transport(TcpMesh::loopback([dead])?)
    ///         .config(EndpointConfig::local())
    ///         .founding(Founding::Alone)
    ///         .join()
    ///         .await?;
    ///     assert_eq!(first.view().map(|v| v.len()), Some(1));
    ///     first.leave().await;
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn founding(mut self, founding: Founding) -> Self {
        self.founding = Some(founding);
        self
    }

    /// Node-level caching of exclusive locks (off by default): a lock this member keeps
    /// taking is cached here after the member asked for it [`NodeCacheConfig::after`] times in
    /// a row, and from then on `lock()` and `unlock()` of it cost no message until another
    /// member asks for it (the grantor then revokes it: it goes back as soon as its local
    /// holder releases). Members with and without caching work in one cluster. See the guide's
    /// section on caching for when it helps.
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node, NodeCacheConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let node = Node::builder("jobs")
    ///         .transport(network.transport())
    ///         .config(EndpointConfig::local())
    ///         .node_cache(NodeCacheConfig { enabled: true, ..NodeCacheConfig::default() })
    ///         .join()
    ///         .await?;
    ///     let mutex = node.mutex("queue-head")?;
    ///     for _ in 0..3 {
    ///         // The second asks the grantor to cache it here; the third costs no message.
    ///         mutex.lock().await?.unlock().await?;
    ///     }
    ///     node.leave().await;
    ///     Ok::<(), Box<dyn std::error::Error>>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn node_cache(mut self, cache: NodeCacheConfig) -> Self {
        self.node_cache = Some(cache);
        self
    }

    /// How long [`NodeBuilder::join`] waits for the first view. Default
    /// [`DEFAULT_JOIN_TIMEOUT`] (10 s).
    pub fn join_timeout(mut self, timeout: Duration) -> Self {
        self.join_timeout = timeout;
        self
    }

    /// The longest a future waiting for a lock (or for the acknowledgement of an unlock)
    /// busy-polls for the answer before it sleeps until woken. Default
    /// [`DEFAULT_SPIN_WAIT`] (200 µs); `Duration::ZERO` never spins.
    ///
    /// Waking a sleeping thread can cost as much as a loopback round trip, so a spin makes an
    /// uncontended lock from another process cost about one round trip. Within this bound the
    /// node adapts the spin to its round trips. It starts at the bound. An answer that a spin
    /// caught sets the spin to about twice that round trip (at once if longer, by an eighth
    /// of the difference if shorter). Once most recent answers came only after their spins,
    /// each such answer shortens the spin by an eighth, towards not spinning at all, which is
    /// what pays where the spinning thread holds the CPU the answer needs. Every 64th wait
    /// spins for the whole bound, to find out whether spinning pays again (while these probes
    /// miss, the gap doubles, up to 256 waits). One budget serves the whole node. Waits for a
    /// contended lock do not spin (see the guide). The spin yields to the executor between
    /// polls (the task wakes itself), so other tasks keep running, but it keeps a core busy
    /// for up to this long per wait: set it to zero where CPU matters more than latency.
    pub fn spin_wait(mut self, spin: Duration) -> Self {
        self.spin_wait = spin;
        self
    }

    /// The member's data directory (created if missing): under the `Majority` policy the member
    /// keeps there the highest grantor term it promised to support, written and synced before
    /// anything that follows the promise is sent, and reads it back when it starts again. With
    /// it, fencing tokens issued after any restart — of any members, the whole cluster
    /// included, `kill -9` or power loss — exceed every token issued before. Without it
    /// (the default), tokens can go back when the members that supported the last grantor all
    /// restart. Give each member process its own directory, on storage that survives the
    /// process, and keep it: deleting it is like never having had it. Not used under
    /// `Available` (its tokens carry the view epoch, which a restarted cluster starts again).
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node, PartitionPolicy};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let dir = std::env::temp_dir().join(format!("conclave-doc-{}", std::process::id()));
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let node = Node::builder("billing")
    ///         .transport(network.transport())
    ///         .config(EndpointConfig::local())
    ///         .partition_policy(PartitionPolicy::Majority { cluster_size: 1 })
    ///         .data_dir(&dir)
    ///         .join()
    ///         .await?;
    ///     node.wait_until_serving().await;
    ///     node.leave().await;
    ///     Ok::<(), conclave::NodeError>(())
    /// })?;
    /// assert!(dir.join("promised-term").exists());
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn data_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Seals every datagram and TCP frame with this cluster key (see [`crate::seal`]): only
    /// members holding the same key can join, be counted in a view or affect a lock. Every
    /// member of the cluster must be given the key. Replaces an earlier key or keyring.
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::seal::ClusterKey;
    /// use conclave::{EndpointConfig, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let key = ClusterKey::from_hex(&"5e".repeat(32))?; // in practice: from a key file
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let node = Node::builder("billing")
    ///         .transport(network.transport())
    ///         .config(EndpointConfig::local())
    ///         .cluster_key(key.clone())
    ///         .join()
    ///         .await?;
    ///     assert_eq!(node.keyring().map(|k| k.primary()), Some(key.id()));
    ///     node.leave().await;
    ///     Ok::<(), conclave::NodeError>(())
    /// })?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_key(self, key: ClusterKey) -> Self {
        self.keyring(Keyring::new(key))
    }

    /// Seals with the keys of `keyring`: its primary key seals, every installed key opens. Keep
    /// a clone of the keyring to rotate the running node's keys ([`Keyring`] shows how).
    pub fn keyring(mut self, keyring: Keyring) -> Self {
        self.key = KeySource::Keyring(keyring);
        self
    }

    /// Reads the cluster key from a file of 64 hex digits when the node joins (see
    /// [`ClusterKey::from_file`]). Replaces an earlier key or keyring.
    pub fn cluster_key_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.key = KeySource::File(path.into());
        self
    }

    /// Reads the cluster key from the environment when the node joins: `CONCLAVE_CLUSTER_KEY`
    /// (64 hex digits) or else `CONCLAVE_CLUSTER_KEY_FILE` (a key file's path); with neither
    /// set, the node runs without a key. A variable that is set but holds no valid key fails
    /// the join ([`NodeError::Key`]). Replaces an earlier key or keyring.
    pub fn cluster_key_from_env(mut self) -> Self {
        self.key = KeySource::Env;
        self
    }

    /// Starts the node's driver thread and waits until the node is in a view: it joined the
    /// cluster's coordinator, or, finding none, founded the cluster where its founding rule
    /// allows it ([`NodeBuilder::founding`]).
    ///
    /// # Errors
    /// Every error stops the node again.
    /// - [`NodeError::InvalidClusterName`]: the cluster name is empty, longer than
    ///   [`ClusterName::MAX_LEN`] bytes or has a control character.
    /// - [`NodeError::InvalidName`], [`NodeError::Membership`], [`NodeError::Locks`],
    ///   [`NodeError::Reliable`]: an invalid member name or setting;
    ///   [`NodeError::ConflictingSettings`]: one setting given two different values.
    /// - [`NodeError::NoTransport`]: no transport was given.
    /// - [`NodeError::Key`]: a key file or variable that cannot be read.
    /// - [`NodeError::DataDir`]: the data directory cannot be used.
    /// - [`NodeError::NoCluster`]: nobody answered within the join timeout and this node may
    ///   not found a cluster alone; it names every place the transport looked and what
    ///   happened there. (It keeps looking until the timeout: a lossy network or a cluster
    ///   still starting may answer late.)
    /// - [`NodeError::SettingMismatch`]: the coordinator refused this member because a
    ///   setting every member must share differs (the policy, the cluster size, the lease).
    /// - [`NodeError::Authentication`]: the members found answered only that they cannot open
    ///   this member's packets (a wrong key, or a key on one side only).
    /// - [`NodeError::JoinTimeout`]: no view within the join timeout (e.g. a coordinator that
    ///   does not answer, or under [`Founding::Never`] only other joiners).
    /// - [`NodeError::Spawn`]: the driver thread could not be started.
    /// - [`NodeError::Shutdown`]: the node was shut down while joining.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes stops the node again (leaving, joining its
    /// thread).
    pub async fn join(self) -> Result<Node, NodeError> {
        ClusterName::new(self.cluster.as_str())?;
        let config = self.resolved_config()?;
        config.gms.validate()?;
        config.locks.validate()?;
        config.reliable.validate()?;
        let transport = self.transport.ok_or(NodeError::NoTransport)?;
        let places = transport.discovery_report();
        let founding = self.founding.unwrap_or(if places.is_empty() {
            Founding::Alone
        } else {
            Founding::WithOthers
        });
        let keys = match self.key {
            KeySource::None => None,
            KeySource::Keyring(ring) => Some(ring),
            KeySource::File(path) => Some(Keyring::new(ClusterKey::from_file(path)?)),
            KeySource::Env => ClusterKey::from_env()?.map(Keyring::new),
        };
        let sealer = Arc::new(Sealer::new(
            ClusterId::from_name(&self.cluster),
            keys.clone(),
            transport.local_addr(),
        )?);
        if let Some(keys) = &keys {
            transport.use_keyring(ClusterId::from_name(&self.cluster), keys, sealer.session());
        }
        let transport: Arc<dyn Transport> =
            Arc::new(SealedTransport::new(transport, sealer.clone()));
        let member = MemberId::new(incarnation(), &self.name, transport.local_addr())?;
        let leave_bound = config.gms.leave_timeout * 2 + Duration::from_millis(200);
        // Within this, a reachable grantor answers, or the membership has replaced an
        // unreachable one and its successor has rebuilt its table.
        let answer_bound = config.gms.suspect_timeout + config.locks.reconcile_timeout;
        let durable = match &self.data_dir {
            Some(dir) => Some(TermFile::open(dir).map_err(NodeError::DataDir)?),
            None => None,
        };
        let mut endpoint =
            Endpoint::new(&self.cluster, member, config, transport.max_datagram_size());
        endpoint.set_founding(founding);
        if let Some(file) = &durable {
            endpoint.restore_term(file.saved());
        }
        let (commands, receiver) = async_channel::unbounded();
        let inner = Arc::new(Inner::new(
            endpoint,
            transport,
            commands,
            self.spin_wait,
            answer_bound,
        ));
        inner.lock().durable = durable;
        let thread = driver::spawn(inner.clone(), receiver, leave_bound, sealer.clone())
            .map_err(NodeError::Spawn)?;
        *inner
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(thread);
        // Dropped on every early return below: the node shuts down again.
        let node = Node {
            backend: Arc::new(GroupBackend::new(inner.clone())),
            sealer: Some(sealer.clone()),
            protocol_stats: Some(crate::stats::protocol_stats(&inner)),
        };
        let mut timer = Timer::after(self.join_timeout);
        loop {
            let listener = {
                let shared = inner.lock();
                if shared.phase != Phase::Running {
                    return Err(NodeError::Shutdown);
                }
                if shared.view.is_none() {
                    // A refusal is final; having heard nobody yet is not (a lossy network, a
                    // cluster still starting): that fails only at the join timeout.
                    if let Some(JoinProblem::SettingMismatch {
                        coordinator,
                        setting,
                        coordinator_value,
                        joiner_value,
                    }) = &shared.join_problem
                    {
                        return Err(NodeError::SettingMismatch {
                            coordinator: coordinator.clone(),
                            setting: setting.clone(),
                            cluster_value: coordinator_value.clone(),
                            our_value: joiner_value.clone(),
                        });
                    }
                    Some(inner.changed.listen())
                } else {
                    None
                }
            };
            let Some(listener) = listener else {
                let alone = node.view().is_some_and(|v| v.len() == 1);
                if let Some(rejection) = sealer.rejection().filter(|_| alone) {
                    return Err(NodeError::Authentication(rejection));
                }
                debug!(member = %inner.member, "joined");
                return Ok(node);
            };
            if let Either::Right(_) = select(listener, &mut timer).await {
                let nobody = inner.lock().join_problem == Some(JoinProblem::NobodyAnswered);
                if let Some(rejection) = sealer.rejection() {
                    return Err(NodeError::Authentication(rejection));
                }
                return Err(if nobody {
                    NodeError::NoCluster {
                        cluster: self.cluster.clone(),
                        places: inner.transport.discovery_report(),
                    }
                } else {
                    NodeError::JoinTimeout(self.join_timeout)
                });
            }
        }
    }
}

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
        NodeBuilder {
            cluster: cluster.into(),
            name: String::new(),
            transport: None,
            config: None,
            policy: None,
            node_cache: None,
            founding: None,
            join_timeout: DEFAULT_JOIN_TIMEOUT,
            spin_wait: DEFAULT_SPIN_WAIT,
            data_dir: None,
            key: KeySource::None,
        }
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

    /// A node on `backend`: any implementation of the backend seam (see [`LockBackend`] for
    /// its contract, and the conformance suite in the repository's `tests/` for its proof).
    pub fn with_backend(backend: Arc<dyn LockBackend>) -> Node {
        Node {
            backend,
            sealer: None,
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
        Views {
            stream: self.backend.views(),
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

/// A stream of views; see [`Node::views`].
pub struct Views {
    stream: BoxStream<'static, View>,
}

impl fmt::Debug for Views {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Views").finish_non_exhaustive()
    }
}

impl Stream for Views {
    type Item = View;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<View>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// A stream of lock events; see [`Node::lock_events`] and [`crate::LockService::lock_events`].
pub struct LockEvents {
    stream: BoxStream<'static, LockEvent>,
}

impl LockEvents {
    pub(crate) fn new(stream: BoxStream<'static, LockEvent>) -> Self {
        Self { stream }
    }
}

impl fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockEvents").finish_non_exhaustive()
    }
}

impl Stream for LockEvents {
    type Item = LockEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LockEvent>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// A new incarnation id: 64 random bits (from std's randomly keyed hasher, no extra dependency)
/// above the incarnation's *generation*, the wall-clock time of the start in nanoseconds since
/// the Unix epoch, made strictly increasing within the process. A restarted process therefore
/// carries a higher generation than every earlier incarnation at its address, so late datagrams
/// of its past can never be taken for its successor ([`MemberId::generation`]). It assumes only
/// that the wall clock does not step back across a restart by more than the restart took.
fn incarnation() -> u128 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static LAST_GENERATION: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let previous = LAST_GENERATION
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(nanos.max(last.saturating_add(1)))
        })
        .unwrap_or(0);
    let generation = nanos.max(previous.saturating_add(1));
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(count);
    hasher.write_u32(std::process::id());
    hasher.write_u64(nanos);
    (u128::from(hasher.finish()) << 64) | u128::from(generation)
}
