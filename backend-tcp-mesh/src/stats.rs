//! Counters of the mesh, for tests, logs and dashboards.

/// A snapshot of a [`TcpMesh`](crate::TcpMesh)'s connections and counters, from
/// [`TcpMesh::stats`](crate::TcpMesh::stats). Counters only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// Connections open now, in any state (dialling, greeting, established, winding down).
    pub connections: usize,
    /// Members with an established connection now: their hello arrived, and it is the one
    /// connection frames to them go on (a member also known under an alias counts once).
    pub peers: usize,
    /// Bytes queued now and not yet written, over all connections: data frames with their
    /// 4-byte prefixes (hellos excluded), plus frames sent to ourselves and not yet received.
    /// Frames the kernel took at once never count. This is the total
    /// [`TcpConfig::max_queued_bytes`](crate::TcpConfig::max_queued_bytes) bounds: never above
    /// it.
    pub queued_bytes: usize,
    /// The most bytes ever queued for one connection; never above
    /// [`TcpConfig::send_queue_bytes`](crate::TcpConfig::send_queue_bytes).
    pub peak_queue_bytes: usize,
    /// Frames handed to a connection (written or queued), or to ourselves.
    pub frames_sent: u64,
    /// Frames received and returned by `recv`.
    pub frames_received: u64,
    /// Frames dropped because their member's send queue was full.
    pub dropped_queue_full: u64,
    /// Frames dropped because queuing them would have taken [`TcpStats::queued_bytes`] above
    /// [`TcpConfig::max_queued_bytes`](crate::TcpConfig::max_queued_bytes), though their
    /// member's own queue had room (frames moved off a duplicate connection included).
    pub dropped_budget: u64,
    /// Frames dropped because their member was in reconnect backoff, could not be dialled, or
    /// `max_connections` outbound connections were open.
    pub dropped_unreachable: u64,
    /// Queued frames lost with their connection: it failed, was closed (idle, a duplicate
    /// whose wind-down ran out of time, a peer that broke the format), or close timed out.
    pub dropped_in_flight: u64,
    /// Outbound connection attempts.
    pub connect_attempts: u64,
    /// Outbound connection attempts whose TCP connect failed: refused, unreachable, or not
    /// done within `connect_timeout`. A connection that comes up but closes before the peer's
    /// hello counts in `handshake_failures` instead.
    pub connect_failures: u64,
    /// Connections closed before a hello arrived: the peer hung up, or said nothing within the
    /// handshake timeout.
    pub handshake_failures: u64,
    /// Connections closed for breaking the format: a bad hello (unknown magic or version, an
    /// address that cannot be dialled, our own address, on an inbound connection an IP other
    /// than the one it comes from), a length prefix above the limit.
    pub violations: u64,
    /// Connections closed because the peer did not prove the cluster key (a mesh with a key
    /// only, or a keyed peer met by a mesh without one): a proof that failed, made with
    /// another key, or not sent within the handshake timeout; a hello of the other version
    /// (one side has a key, the other none) or of another cluster.
    pub auth_failures: u64,
    /// Duplicate connections of one member pair wound down after a simultaneous connect.
    pub duplicates_resolved: u64,
    /// New connections claiming a member whose connection is live, not part of a
    /// simultaneous connect: the established connection stays, the new one is wound down
    /// (same instance) or closed (another instance).
    pub duplicates_refused: u64,
    /// Connections replaced by a newer one for the same member because they were gone: the
    /// peer closed or reset them (it restarted or reconnected) before the mesh read that.
    pub replaced: u64,
    /// Inbound connections refused because `max_connections` inbound connections were open.
    pub rejected: u64,
    /// Inbound connections closed after delivering no frame for `idle_timeout`.
    pub idle_closed: u64,
}
