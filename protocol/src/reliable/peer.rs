//! The state kept for one peer: both stream halves and the bookkeeping around them.

use super::recv::RecvStream;
use super::send::SendStream;
use crate::Instant;

/// Both directions of the exchange with one peer.
#[derive(Debug)]
pub(crate) struct Peer {
    /// Our stream to the peer, created by the first send.
    pub(crate) send: Option<SendStream>,
    /// The peer's current stream to us, created by its first segment.
    pub(crate) recv: Option<RecvStream>,
    /// An acknowledgement of `recv` is owed (coalesced: one per batch of input).
    pub(crate) ack_owed: bool,
    /// Whether the peer is in the transmit round-robin.
    pub(crate) ready: bool,
    /// Last input from the peer or send to it.
    pub(crate) last_activity: Instant,
    /// The retransmission deadline, mirrored in the timer table.
    pub(crate) retransmit_at: Option<Instant>,
}

impl Peer {
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            send: None,
            recv: None,
            ack_owed: false,
            ready: false,
            last_activity: now,
            retransmit_at: None,
        }
    }

    /// Whether `poll_transmit` has a frame for this peer.
    pub(crate) fn has_transmit(&self, send_window: u32) -> bool {
        self.ack_owed
            || self
                .send
                .as_ref()
                .is_some_and(|s| s.has_transmit(send_window))
    }

    /// Whether anything is queued or in flight to the peer.
    pub(crate) fn has_unacked(&self) -> bool {
        self.send.as_ref().is_some_and(SendStream::has_unacked)
    }

    /// Whether forgetting the peer loses nothing: nothing queued, in flight, buffered,
    /// being reassembled or owed.
    pub(crate) fn is_idle(&self) -> bool {
        !self.ack_owed && !self.has_unacked() && self.recv.as_ref().is_none_or(RecvStream::is_idle)
    }
}
