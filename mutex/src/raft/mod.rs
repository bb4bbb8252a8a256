//! The Raft engine (feature `raft`): the lock table replicated by Raft, durable on every
//! member's disk, behind the same `DistributedMutex` / `ReentrantLock` / `RwLock` API.
//!
//! Choose it where the lock state must survive every member restarting (a job scheduler, a
//! leader lease that outlives a full restart) or must be linearizable: a lock is granted when
//! its command commits in the replicated log, every member applies the same log, fencing tokens
//! come from the log index (they never go back, across any number of full restarts), and
//! listeners fire as entries apply. It costs a commit per acquisition (a round trip to a
//! majority and an fsync), where the group backend's grantor answers from memory.
//!
//! The members are fixed: every member is started with the same list of peers ([`RaftConfig`])
//! and its own data directory ([`crate::NodeBuilder::data_dir`]).
//!
//! ```no_run
//! # #[cfg(feature = "tcp-mesh")]
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use conclave::raft::{RaftConfig, RaftPeer};
//! use conclave::tcp::{TcpConfig, TcpMesh};
//! use conclave::Node;
//!
//! let peers = vec![
//!     RaftPeer::new("a", "10.0.0.1:7800".parse()?),
//!     RaftPeer::new("b", "10.0.0.2:7800".parse()?),
//!     RaftPeer::new("c", "10.0.0.3:7800".parse()?),
//! ];
//! let node = Node::builder("jobs")
//!     .name("a")
//!     .transport(TcpMesh::bind(&TcpConfig {
//!         bind: "10.0.0.1:7800".parse()?,
//!         ..TcpConfig::default()
//!     })?)
//!     .data_dir("/var/lib/jobs/conclave")
//!     .raft(RaftConfig::new(peers))
//!     .join()
//!     .await?;
//! let guard = node.mutex("nightly-report")?.lock().await?;
//! // ... the token survives any restart of the whole cluster:
//! let token = guard.fencing_token();
//! # let _ = token;
//! # Ok(())
//! # }
//! ```

mod backend;
mod disk;
mod driver;
mod state;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant as StdInstant};

use conclave_lock_api::seal::{Keyring, SealedTransport, Sealer};
use conclave_lock_api::{MemberId, Transport};
use conclave_protocol::raft::wire::raft_cluster_id;
use conclave_protocol::raft::{EngineTiming, RaftNode, RaftSettings};

pub use backend::RaftBackend;

use crate::error::NodeError;
use crate::incarnation::incarnation;
use crate::node::Node;
use state::{Shared, State};

/// One member of a Raft lock cluster: its name and where it listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftPeer {
    /// The member's name (its `NodeBuilder::name`).
    pub name: String,
    /// Its transport's address.
    pub addr: SocketAddr,
}

impl RaftPeer {
    /// A peer called `name` at `addr`.
    pub fn new(name: impl Into<String>, addr: SocketAddr) -> Self {
        RaftPeer {
            name: name.into(),
            addr,
        }
    }
}

/// The settings of the Raft engine. Every member must be given the same peers, in the same
/// order, and the same timings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RaftConfig {
    /// Every member, this one included (a member's Raft id is its place in this list).
    pub peers: Vec<RaftPeer>,
    /// One Raft tick (default 20 ms).
    pub tick: Duration,
    /// Ticks between a leader's heartbeats (default 3).
    pub heartbeat_ticks: usize,
    /// Ticks without a leader before a member stands for election, randomized up to twice
    /// this (default 15: 300–600 ms).
    pub election_ticks: usize,
    /// How long a member may go without proving contact with a leader before it resigns
    /// (its holds lost with `Minority`, its waits failed); the leader releases a silent
    /// member's holds a tenth of this later (default 3 s).
    pub session_timeout: Duration,
    /// How long the holds of a restarted member's earlier incarnation wait for it to take
    /// them over with a `lock()` of the same lock and mode (default 30 s).
    pub recovered_hold_grace: Duration,
    /// Applied entries between snapshots (default 10,000).
    pub snapshot_every: u64,
    /// `fsync` every write of the log (default `true`). `false` is for tests on throwaway
    /// directories: a power loss can then lose acknowledged grants and let tokens repeat.
    pub sync: bool,
}

impl RaftConfig {
    /// The default settings for these peers.
    pub fn new(peers: Vec<RaftPeer>) -> Self {
        let timing = EngineTiming::default();
        let settings = RaftSettings::default();
        RaftConfig {
            peers,
            tick: timing.tick,
            heartbeat_ticks: timing.heartbeat_ticks,
            election_ticks: timing.election_ticks,
            session_timeout: settings.session_timeout,
            recovered_hold_grace: settings.recovered_hold_grace,
            snapshot_every: settings.snapshot_every,
            sync: true,
        }
    }

    /// Short timings for tests on loopback (10 ms ticks, 1 s sessions, no fsync).
    pub fn local(peers: Vec<RaftPeer>) -> Self {
        RaftConfig {
            tick: Duration::from_millis(10),
            session_timeout: Duration::from_secs(1),
            recovered_hold_grace: Duration::from_secs(10),
            sync: false,
            ..RaftConfig::new(peers)
        }
    }

    fn settings(&self) -> RaftSettings {
        RaftSettings {
            peers: self.peers.iter().map(|p| p.name.clone()).collect(),
            timing: EngineTiming {
                tick: self.tick,
                heartbeat_ticks: self.heartbeat_ticks,
                election_ticks: self.election_ticks,
            },
            session_timeout: self.session_timeout,
            recovered_hold_grace: self.recovered_hold_grace,
            snapshot_every: self.snapshot_every,
        }
    }
}

/// What the builder hands the Raft engine.
pub(crate) struct RaftPlan {
    pub(crate) cluster: String,
    pub(crate) name: String,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) keys: Option<Keyring>,
    pub(crate) data_dir: Option<PathBuf>,
    pub(crate) join_timeout: Duration,
    pub(crate) config: RaftConfig,
}

/// Starts a Raft member and waits until the cluster applied its arrival (a majority of the
/// peers must be running).
pub(crate) async fn start(plan: RaftPlan) -> Result<Node, NodeError> {
    let RaftPlan {
        cluster,
        name,
        transport,
        keys,
        data_dir,
        join_timeout,
        config,
    } = plan;
    let Some(dir) = data_dir else {
        return Err(NodeError::Raft(
            "the Raft engine needs a data directory (NodeBuilder::data_dir)".into(),
        ));
    };
    let settings = config.settings();
    if !settings.peers.contains(&name) {
        return Err(NodeError::Raft(format!(
            "this member's name {name:?} is not among the peers {:?}",
            settings.peers
        )));
    }
    let cluster_id = raft_cluster_id(&cluster);
    let sealer = Arc::new(Sealer::new(
        cluster_id,
        keys.clone(),
        transport.local_addr(),
    )?);
    if let Some(keys) = &keys {
        transport.use_keyring(cluster_id, keys, sealer.session());
    }
    let transport: Arc<dyn Transport> = Arc::new(SealedTransport::new(transport, sealer.clone()));
    let (disk, recovered) = disk::RaftDisk::open(&dir, &cluster, &name, config.sync)
        .map_err(|e| NodeError::Raft(format!("data directory {}: {e}", dir.display())))?;
    // Random high bits above the data directory's start count: every start of this member
    // is a newer incarnation than the ones before, whatever the clock says.
    let incarnation = (incarnation() & !u128::from(u64::MAX)) | u128::from(disk.generation());
    let member = MemberId::new(incarnation, &name, transport.local_addr())?;
    let seed = incarnation as u64 ^ (incarnation >> 64) as u64;
    let node = RaftNode::new(member.clone(), settings, &recovered, seed)
        .map_err(|e| NodeError::Raft(e.to_string()))?;
    let (ring, rung) = async_channel::bounded(1);
    let peers: BTreeMap<String, SocketAddr> = config
        .peers
        .iter()
        .map(|p| (p.name.clone(), p.addr))
        .collect();
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            node,
            peers,
            base: StdInstant::now(),
            records: BTreeMap::new(),
            next_request: 0,
            next_query: 0,
            reads: BTreeMap::new(),
            listeners: BTreeMap::new(),
            views: Vec::new(),
            view: None,
            leader: None,
            leader_wakers: Vec::new(),
            closed: false,
            stopped: false,
            closed_wakers: Vec::new(),
            losses: Vec::new(),
            services: BTreeMap::new(),
            destroyed_listeners: Vec::new(),
        }),
        ring,
        next_owner: AtomicU64::new(0),
        member,
    });
    let driver = driver::Driver {
        shared: shared.clone(),
        transport,
        disk,
        cluster: cluster_id,
        ring: rung,
    };
    std::thread::Builder::new()
        .name(format!("conclave-raft-{name}"))
        .spawn(move || driver.run())
        .map_err(NodeError::Spawn)?;
    shared.ring();
    let backend = Arc::new(RaftBackend::new(shared.clone(), None));
    let node = Node::with_backend_sealed(backend.clone(), sealer);
    let joined = futures::future::poll_fn(|cx| {
        let mut state = shared.lock();
        if state.closed {
            return std::task::Poll::Ready(Err(NodeError::Shutdown));
        }
        if state.node.has_joined() {
            return std::task::Poll::Ready(Ok(()));
        }
        state.leader_wakers.push(cx.waker().clone());
        std::task::Poll::Pending
    });
    let timeout = async {
        async_io::Timer::after(join_timeout).await;
        Err(NodeError::JoinTimeout(join_timeout))
    };
    futures::pin_mut!(joined, timeout);
    match futures::future::select(joined, timeout).await {
        futures::future::Either::Left((Ok(()), _)) => Ok(node),
        futures::future::Either::Left((Err(e), _))
        | futures::future::Either::Right((Err(e), _)) => {
            conclave_lock_api::ClusterBackend::shutdown(&*backend);
            Err(e)
        }
        futures::future::Either::Right((Ok(()), _)) => unreachable!("the timeout only fails"),
    }
}
