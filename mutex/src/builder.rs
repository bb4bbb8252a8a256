//! [`NodeBuilder`]: the settings of a [`Node`] before it starts.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use conclave_lock_api::seal::{ClusterKey, Keyring};
use conclave_lock_api::{ClusterName, Transport};
use conclave_protocol::gms::Founding;
use conclave_protocol::locking::{NodeCacheConfig, PartitionPolicy};
use conclave_protocol::EndpointConfig;

use crate::error::NodeError;
use crate::join::{self, JoinPlan};
use crate::node::Node;

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
    #[cfg(feature = "raft")]
    raft: Option<crate::raft::RaftConfig>,
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
    /// A builder with every setting at its default; see [`Node::builder`].
    pub(crate) fn new(cluster: String) -> Self {
        NodeBuilder {
            cluster,
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
            #[cfg(feature = "raft")]
            raft: None,
        }
    }

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

    /// Runs this member on the Raft engine (feature `raft`) instead of the group backend: the
    /// lock table is replicated by Raft among `config.peers` and kept on disk in the
    /// [data directory](NodeBuilder::data_dir), which it needs. [`NodeBuilder::join`] then
    /// returns once the cluster's leader applied this member's arrival (a majority of the
    /// peers must be running). The group backend's settings (`config`, `partition_policy`,
    /// `node_cache`, `founding`, `spin_wait`) do not apply to it. See [`crate::raft`].
    #[cfg(feature = "raft")]
    pub fn raft(mut self, config: crate::raft::RaftConfig) -> Self {
        self.raft = Some(config);
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
        #[cfg(feature = "raft")]
        if let Some(config) = self.raft {
            let keys = match self.key {
                KeySource::None => None,
                KeySource::Keyring(ring) => Some(ring),
                KeySource::File(path) => Some(Keyring::new(ClusterKey::from_file(path)?)),
                KeySource::Env => ClusterKey::from_env()?.map(Keyring::new),
            };
            return crate::raft::start(crate::raft::RaftPlan {
                cluster: self.cluster,
                name: self.name,
                transport: self.transport.ok_or(NodeError::NoTransport)?,
                keys,
                data_dir: self.data_dir,
                join_timeout: self.join_timeout,
                config,
            })
            .await;
        }
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
        join::start(JoinPlan {
            cluster: self.cluster,
            name: self.name,
            transport,
            config,
            founding,
            keys,
            data_dir: self.data_dir,
            spin_wait: self.spin_wait,
            join_timeout: self.join_timeout,
        })
        .await
    }
}
