//! The counters [`Node::stats`] returns: one [`NodeStats`] snapshot, and the types of its
//! layers' counters.

use std::sync::Arc;

pub use conclave_lock_api::seal::SealStats;
use conclave_lock_api::{MemberId, View};
pub use conclave_protocol::gms::GmsStats;
pub use conclave_protocol::locking::{CacheStats, GrantorStats};
pub use conclave_protocol::reliable::Stats as ReliableStats;
pub use conclave_protocol::EndpointStats;

use crate::node::Node;
use crate::shared::Inner;

/// What [`Node::stats`] returns: this member, its view, its holds and waits, and the
/// counters of every layer (each counter only grows while the node runs).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct NodeStats {
    /// This member.
    pub member: MemberId,
    /// The view it is in (`None` once it left).
    pub view: Option<View>,
    /// Its holds in the default lock service.
    pub held_locks: usize,
    /// Its requests in the default lock service waiting for a grant.
    pub pending_requests: usize,
    /// The protocol's counters: membership (`gms`), reliable delivery (`reliable`), the
    /// grantor role (`grantor`), node caching (`cache`) and dropped datagrams. `None` on a
    /// backend other than the group backend (`Node::local`, `Node::with_backend`).
    pub protocol: Option<EndpointStats>,
    /// The sealing layer's counters (`None` off the group backend), as [`Node::seal_stats`].
    pub seal: Option<SealStats>,
}

/// Reads the group backend's protocol counters.
pub(crate) type ProtocolStats = Arc<dyn Fn() -> EndpointStats + Send + Sync>;

/// The protocol counters of the group backend running on `inner`.
pub(crate) fn protocol_stats(inner: &Arc<Inner>) -> ProtocolStats {
    let inner = Arc::downgrade(inner);
    Arc::new(move || {
        inner
            .upgrade()
            .map(|inner| inner.lock().endpoint.stats())
            .unwrap_or_default()
    })
}

impl Node {
    /// One snapshot of what this node knows: its view, its holds and waits, and the counters of
    /// the membership, reliable-delivery, locking, caching and sealing layers. Cheap enough to
    /// call every few seconds for a dashboard (the feature `metrics` publishes the same
    /// counters by itself).
    ///
    /// ```
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let node = Node::builder("stats")
    ///         .transport(network.transport())
    ///         .config(EndpointConfig::local())
    ///         .join()
    ///         .await?;
    ///     let guard = node.mutex("job")?.lock().await?;
    ///     let stats = node.stats();
    ///     assert_eq!(stats.held_locks, 1);
    ///     let protocol = stats.protocol.expect("the group backend counts");
    ///     assert!(protocol.grantor.grants >= 1); // this member is the only one: the grantor
    ///     drop(guard);
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub fn stats(&self) -> NodeStats {
        let backend = self.backend();
        NodeStats {
            member: backend.member().clone(),
            view: backend.view(),
            held_locks: backend.holds().len(),
            pending_requests: backend.pending_requests(),
            protocol: self.protocol_stats.as_ref().map(|read| read()),
            seal: self.seal_stats(),
        }
    }
}
