//! How each backend's members are started for a scenario.
//!
//! A fixture starts the members of one scenario's cluster and returns once they are ready:
//! every member in one view made of all of them. A backend of one process (the local backend)
//! returns one node; scenarios address members modulo the number returned, so "another
//! member" is then another owner on the same node.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use conclave::memory::MemoryNetwork;
use conclave::seal::ClusterKey;
use conclave::tcp::TcpMesh;
use conclave::udp::{UdpConfig, UdpMulticast};
use conclave::{EndpointConfig, Founding, Node, View};
use futures::future::BoxFuture;
use futures::StreamExt;

use crate::{within, WAIT};

/// Starts the members of a scenario's cluster, named after `cluster` (unique per test).
pub type Start = fn(cluster: String) -> BoxFuture<'static, Vec<Node>>;

/// How many members a cluster fixture starts.
pub const MEMBERS: usize = 3;

/// The local backend: one node, no network.
pub fn local(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(async move { vec![Node::local(&cluster).unwrap()] })
}

/// The group backend over the in-memory transport: [`MEMBERS`] nodes.
pub fn memory(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(memory_members(cluster, EndpointConfig::local()))
}

/// The group backend over the in-memory transport with node-level caching on at every member
/// (a node grant asked on the first `lock()`): [`MEMBERS`] nodes.
pub fn memory_cached(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    let mut config = EndpointConfig::local();
    config.locks.node_cache.enabled = true;
    config.locks.node_cache.after = 1;
    config.locks.node_cache.delegate_reads = true;
    Box::pin(memory_members(cluster, config))
}

/// The group backend over the in-memory transport, node-level caching and read delegations on
/// at every other member only (the first on): [`MEMBERS`] nodes of one cluster, with and
/// without the features.
pub fn memory_mixed(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    let mut config = EndpointConfig::local();
    config.locks.node_cache.enabled = true;
    config.locks.node_cache.after = 1;
    config.locks.node_cache.delegate_reads = true;
    Box::pin(memory_members_with(cluster, move |i| {
        if i % 2 == 0 {
            config.clone()
        } else {
            EndpointConfig::local()
        }
    }))
}

async fn memory_members(cluster: String, config: EndpointConfig) -> Vec<Node> {
    memory_members_with(cluster, move |_| config.clone()).await
}

async fn memory_members_with(
    cluster: String,
    config: impl Fn(usize) -> EndpointConfig,
) -> Vec<Node> {
    let network = MemoryNetwork::new();
    let mut nodes = Vec::new();
    for i in 0..MEMBERS {
        let node = Node::builder(&cluster)
            .name(format!("m{i}"))
            .transport(network.transport())
            .config(config(i));
        nodes.push(within(WAIT, "join", node.join()).await.unwrap());
    }
    agree(&nodes).await;
    nodes
}

/// The multicast group and port of this test process (TTL 0, interface 127.0.0.1): tests of
/// one process share them and are told apart by cluster name.
pub fn udp_config() -> UdpConfig {
    UdpConfig {
        group: Ipv4Addr::new(239, 255, 67, 211),
        port: 30_000 + u16::try_from(std::process::id() % 20_000).unwrap_or(0),
        ..UdpConfig::loopback()
    }
}

/// The group backend over UDP on loopback: [`MEMBERS`] nodes.
pub fn udp(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(udp_members(cluster, None))
}

/// The group backend over UDP on loopback with a cluster key: [`MEMBERS`] nodes, every
/// datagram sealed.
pub fn udp_sealed(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(udp_members(cluster, Some(test_key())))
}

/// The key of the sealed fixtures (a test's key: never use a fixed key in a deployment).
pub fn test_key() -> ClusterKey {
    ClusterKey::from_bytes([0x5e; 32])
}

async fn udp_members(cluster: String, key: Option<ClusterKey>) -> Vec<Node> {
    let mut nodes = Vec::new();
    for i in 0..MEMBERS {
        let mut node = Node::builder(&cluster)
            .name(format!("u{i}"))
            .transport(UdpMulticast::bind(&udp_config()).unwrap())
            .config(EndpointConfig::local());
        if i == 0 {
            // The first founds the cluster; the others must find it (the default).
            node = node.founding(Founding::Alone);
        }
        if let Some(key) = &key {
            node = node.cluster_key(key.clone());
        }
        nodes.push(within(WAIT, "join", node.join()).await.unwrap());
    }
    agree(&nodes).await;
    nodes
}

/// The group backend over a TCP mesh on loopback: [`MEMBERS`] nodes, the first one the seed
/// of the others.
pub fn tcp(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(tcp_members(cluster, None))
}

/// The group backend over a TCP mesh on loopback with a cluster key: [`MEMBERS`] nodes, every
/// frame sealed.
pub fn tcp_sealed(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(tcp_members(cluster, Some(test_key())))
}

async fn tcp_members(cluster: String, key: Option<ClusterKey>) -> Vec<Node> {
    let mut nodes: Vec<Node> = Vec::new();
    let mut seed = None;
    for i in 0..MEMBERS {
        let mesh = TcpMesh::loopback(seed).unwrap();
        let addr = {
            use conclave::api::Transport;
            mesh.local_addr()
        };
        seed.get_or_insert(addr);
        let mut node = Node::builder(&cluster)
            .name(format!("t{i}"))
            .transport(mesh)
            .config(EndpointConfig::local());
        if let Some(key) = &key {
            node = node.cluster_key(key.clone());
        }
        nodes.push(within(WAIT, "join", node.join()).await.unwrap());
    }
    agree(&nodes).await;
    nodes
}

/// Waits until every node has installed the same view, made of exactly them.
pub async fn agree(nodes: &[Node]) -> View {
    let wanted: BTreeSet<_> = nodes.iter().map(|n| n.member_id().clone()).collect();
    let mut streams: Vec<_> = nodes.iter().map(Node::views).collect();
    within(WAIT, "view agreement", async {
        let mut latest: Vec<Option<View>> = vec![None; nodes.len()];
        loop {
            let (view, i, _) =
                futures::future::select_all(streams.iter_mut().map(|s| Box::pin(s.next()))).await;
            latest[i] = view;
            if let Some(Some(first)) = latest.first() {
                let same = latest.iter().all(|v| v.as_ref() == Some(first));
                let members: BTreeSet<_> = first.members().iter().cloned().collect();
                if same && members == wanted {
                    return first.clone();
                }
            }
        }
    })
    .await
}

/// The transports a Raft fixture runs on.
#[derive(Clone, Copy, Debug)]
enum RaftOver {
    Memory,
    Udp,
    Tcp,
}

/// The Raft engine over a TCP mesh on loopback: [`MEMBERS`] members, each with a fresh data
/// directory, started together (a member's `join` waits for a majority).
pub fn raft(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(raft_members(cluster, RaftOver::Tcp, None))
}

/// The Raft engine over UDP on loopback (unicast between the members).
pub fn raft_udp(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(raft_members(cluster, RaftOver::Udp, None))
}

/// The Raft engine over the in-memory transport.
pub fn raft_memory(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(raft_members(cluster, RaftOver::Memory, None))
}

/// The Raft engine over a TCP mesh on loopback with a cluster key: every frame sealed.
pub fn raft_sealed(cluster: String) -> BoxFuture<'static, Vec<Node>> {
    Box::pin(raft_members(cluster, RaftOver::Tcp, Some(test_key())))
}

/// A fresh data directory for member `i` of `cluster` (removed first if a run left one).
pub fn raft_data_dir(cluster: &str, i: usize) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("conclave-raft-{cluster}-{i}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

async fn raft_members(cluster: String, over: RaftOver, key: Option<ClusterKey>) -> Vec<Node> {
    use conclave::api::Transport;
    use conclave::raft::{RaftConfig, RaftPeer};
    let network = MemoryNetwork::new();
    let mut builders = Vec::new();
    let mut peers = Vec::new();
    for i in 0..MEMBERS {
        let name = format!("r{i}");
        let builder = Node::builder(&cluster).name(&name);
        let (builder, addr) = match over {
            RaftOver::Memory => {
                let t = network.transport();
                let addr = t.local_addr();
                (builder.transport(t), addr)
            }
            RaftOver::Udp => {
                let t = UdpMulticast::bind(&udp_config()).unwrap();
                let addr = t.local_addr();
                (builder.transport(t), addr)
            }
            RaftOver::Tcp => {
                let t = TcpMesh::loopback(None).unwrap();
                let addr = t.local_addr();
                (builder.transport(t), addr)
            }
        };
        let builder = match &key {
            Some(key) => builder.cluster_key(key.clone()),
            None => builder,
        };
        peers.push(RaftPeer::new(name, addr));
        builders.push(builder.data_dir(raft_data_dir(&cluster, i)));
    }
    let config = RaftConfig::local(peers);
    let joins = builders.into_iter().map(|b| b.raft(config.clone()).join());
    let nodes = within(WAIT, "raft join", futures::future::try_join_all(joins))
        .await
        .unwrap();
    agree(&nodes).await;
    nodes
}
