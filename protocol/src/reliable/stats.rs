//! Counters of the reliable layer.

/// Counters since the [`super::Reliable`] was created; each only increases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Data segments handed out by `poll_transmit`, retransmissions included.
    pub segments_sent: u64,
    /// Frames of more than one segment handed out by `poll_transmit`.
    pub bundles_sent: u64,
    /// Of `segments_sent`, the retransmissions.
    pub segments_retransmitted: u64,
    /// Data segments passed to `handle_segment`, whatever became of them.
    pub segments_received: u64,
    /// Segments received before (below the next expected sequence number or already buffered).
    pub duplicates_dropped: u64,
    /// Segments beyond the receive window.
    pub out_of_window_dropped: u64,
    /// Segments whose fields are invalid (hostile or corrupt input), and acknowledgements of
    /// segments never sent.
    pub malformed_dropped: u64,
    /// Segments and acknowledgements of the past: for a previous incarnation of this member,
    /// of an older stream, or from a peer incarnation that has since restarted.
    pub stale_dropped: u64,
    /// Segments from new peers dropped because `ReliableConfig::max_peers` peer states exist.
    pub peer_limit_dropped: u64,
    /// Acknowledgements handed out by `poll_transmit` as frames of their own.
    pub acks_sent: u64,
    /// Acknowledgements that rode on data segments handed out by `poll_transmit`.
    pub acks_piggybacked: u64,
    /// Acknowledgements received, on their own (`handle_ack`) or on data segments.
    pub acks_received: u64,
    /// Messages handed out by `poll_delivered` (or queued for it).
    pub messages_delivered: u64,
    /// Peer states forgotten after `ReliableConfig::idle_timeout` without traffic.
    pub peers_evicted: u64,
    /// Peer states dropped because the peer restarted (same address, new incarnation).
    pub peers_restarted: u64,
}
