//! Counters of the mesh, for tests, logs and dashboards.

/// A snapshot of a [`TcpMesh`](crate::TcpMesh)'s connections and counters, from
/// [`TcpMesh::stats`](crate::TcpMesh::stats). Counters only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpStats {
    /// Connections open now, in any state (dialling, greeting, established, winding down).
    pub connections: usize,
    /// Members with an established connection now: their hello arrived, and it is the one
    /// connection frames to them go on.
    pub peers: usize,
    /// Bytes queued now, over all connections.
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
    /// Frames dropped because their member was in reconnect backoff, could not be dialled, or
    /// `max_connections` was reached.
    pub dropped_unreachable: u64,
    /// Queued frames lost with their connection (it failed, or close timed out).
    pub dropped_in_flight: u64,
    /// Outbound connection attempts.
    pub connect_attempts: u64,
    /// Outbound connection attempts that failed or timed out before the handshake.
    pub connect_failures: u64,
    /// Connections closed before a hello arrived: the peer hung up, or said nothing within the
    /// handshake timeout.
    pub handshake_failures: u64,
    /// Connections closed for breaking the format: a bad hello, an unknown version, a length
    /// prefix above the limit.
    pub violations: u64,
    /// Duplicate connections of one member pair wound down after a simultaneous connect.
    pub duplicates_resolved: u64,
    /// Connections replaced by a newer one from the same member (it restarted or reconnected).
    pub replaced: u64,
    /// Inbound connections refused because `max_connections` was reached.
    pub rejected: u64,
}
