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
    /// An acknowledgement of `recv` is owed; it rides on the next data segment to the peer.
    pub(crate) ack_owed: bool,
    /// The owed acknowledgement may not wait for data any longer: send it on its own.
    pub(crate) ack_now: bool,
    /// Segments received since the last acknowledgement went out.
    pub(crate) unacked_received: u32,
    /// When the owed acknowledgement goes out on its own, mirrored in the timer table.
    pub(crate) ack_at: Option<Instant>,
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
            ack_now: false,
            unacked_received: 0,
            ack_at: None,
            ready: false,
            last_activity: now,
            retransmit_at: None,
        }
    }

    /// An acknowledgement of everything received went out (alone or on a segment). The
    /// caller cancels the `ack_at` timer.
    pub(crate) fn ack_sent(&mut self) {
        self.ack_owed = false;
        self.ack_now = false;
        self.unacked_received = 0;
    }

    /// Whether `poll_transmit` has a frame for this peer.
    pub(crate) fn has_transmit(&self, send_window: u32) -> bool {
        (self.ack_owed && self.ack_now)
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
