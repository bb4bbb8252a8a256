//! Reliable, ordered, exactly-once delivery of messages between members over lossy datagrams.
//!
//! [`Reliable`] is a sans-IO state machine: it never touches a socket or a clock. The caller
//! feeds it what arrived ([`Reliable::handle_segment`], [`Reliable::handle_ack`]), what to send
//! ([`Reliable::send`]) and the passing of time ([`Reliable::handle_timeout`]), then drains its
//! outputs: frames to transmit ([`Reliable::poll_transmit`]), complete messages
//! ([`Reliable::poll_delivered`]) and the next deadline ([`Reliable::poll_timeout`]).
//!
//! # Protocol
//! - **Streams.** We keep one send stream per peer, numbered from a counter of this instance
//!   that only increases, so a stream created after [`Reliable::remove_peer`] or an idle
//!   eviction is always newer. Sequence numbers start at 1 in each stream; a message is cut
//!   into fragments with consecutive sequence numbers.
//! - **Segments** name the receiver's incarnation (`to`), the stream, and `base`: the lowest
//!   sequence number the sender has not seen acknowledged. A receiver drops segments for
//!   another incarnation of itself and of older streams; a newer stream replaces its receive
//!   state. A fresh receive state starts at `base`, since everything below was delivered by an
//!   earlier state: that is what makes forgetting idle peers safe.
//! - **Acknowledgements** are cumulative (`next_expected`) and owed after every data segment.
//!   One rides on the next data segment to the peer (a grant acknowledges its request); a
//!   lone [`Frame::Ack`] goes out only when no data came within [`ReliableConfig::ack_delay`], or at
//!   once on the fourth datagram received in order since the last acknowledgement
//!   ([`ACK_AT_ONCE_EVERY`]; a bundle is one), for a segment out of order or seen before, and
//!   for one that fills a gap.
//! - **Sending** keeps at most `send_window` segments in flight. One retransmission timer per
//!   peer resends the oldest unacknowledged segments with exponential backoff; a partial
//!   acknowledgement during recovery, or the third duplicate one, resends the next hole at
//!   once. The layer never gives up: the membership layer decides that a peer is dead.
//! - **Restarts.** Traffic from a member whose address is that of a known peer with another
//!   incarnation means the old one restarted: its state is dropped, and late datagrams of the
//!   old incarnation are ignored from then on. Incarnations of one address are ordered by their
//!   generation (`MemberId::generation`): input from an older incarnation than one known at its
//!   address is dropped, so a late datagram of a dead process never retires its successor.
//!
//! Exactly-once delivery holds for the life of a receive state. A state forgotten while its
//! last acknowledgements were still lost (see [`Reliable::remove_peer`] and
//! [`ReliableConfig::idle_timeout`]) restarts at the sender's `base` and may deliver those last
//! messages again; idle eviction only forgets a peer silent for `idle_timeout`, so this needs a
//! partition longer than that which the membership layer did not act on.
//!
//! Everything from the network is validated; hostile input is dropped with a warning and never
//! makes a peer hold more than about `recv_window` segments (each at most
//! [`MAX_PACKET_LEN`] bytes, what the wire decoder accepts) plus one message in reassembly.
//!
//! # Drive loop
//! ```
//! use conclave_lock_api::wire::{Frame, PACKET_OVERHEAD_MAX};
//! use conclave_lock_api::MemberId;
//! use conclave_protocol::reliable::{ReliableConfig, Reliable};
//! use conclave_protocol::Instant;
//!
//! let ids = [
//!     MemberId::new(1, "a", "127.0.0.1:7801".parse()?)?,
//!     MemberId::new(2, "b", "127.0.0.1:7802".parse()?)?,
//! ];
//! // Payload bytes per segment: the datagram size less the packet overhead.
//! let fragment_len = 1400 - PACKET_OVERHEAD_MAX;
//! let mut nodes = ids.clone().map(|id| Reliable::new(id, ReliableConfig::default(), fragment_len));
//!
//! let mut now = Instant::ZERO;
//! nodes[0].send(now, &ids[1], b"hello".to_vec())?;
//! nodes[0].send(now, &ids[1], vec![7; 5000])?; // cut into fragments
//!
//! let mut received = Vec::new();
//! loop {
//!     // Drain every output. A real driver encodes `Packet { sender, frame }` and sends it to
//!     // `to.addr()`; the receiving driver decodes it and calls `handle_segment`/`handle_ack`.
//!     let mut moved = false;
//!     for i in 0..2 {
//!         while let Some((to, frame)) = nodes[i].poll_transmit() {
//!             moved = true;
//!             let j = ids.iter().position(|id| *id == to).unwrap();
//!             match frame {
//!                 Frame::Data(segment) => nodes[j].handle_segment(now, &ids[i], segment),
//!                 Frame::Bundle(segments) => nodes[j].handle_bundle(now, &ids[i], segments),
//!                 Frame::Ack(ack) => nodes[j].handle_ack(now, &ids[i], ack),
//!                 _ => unreachable!("the reliable layer sends only data and acks"),
//!             }
//!         }
//!         while let Some((from, message)) = nodes[i].poll_delivered() {
//!             received.push((from, message));
//!         }
//!     }
//!     if moved {
//!         continue;
//!     }
//!     if nodes.iter().all(Reliable::is_quiescent) {
//!         break;
//!     }
//!     // Nothing to do until the next deadline: sleep until then, then tell the layer.
//!     now = nodes.iter().filter_map(Reliable::poll_timeout).min().unwrap();
//!     nodes.iter_mut().for_each(|n| n.handle_timeout(now));
//! }
//! assert_eq!(received.len(), 2);
//! assert_eq!(received[0], (ids[0].clone(), b"hello".to_vec()));
//! assert_eq!(received[1].1, vec![7; 5000]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod error;
mod peer;
mod recv;
mod send;
mod stats;
mod timers;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use conclave_lock_api::wire::{
    Ack, Frame, Segment, StreamAck, BUNDLED_SEGMENT_OVERHEAD_MAX, MAX_BUNDLE, MAX_PACKET_LEN,
    PACKET_OVERHEAD_MAX,
};
use conclave_lock_api::MemberId;
use tracing::{debug, trace, warn};

pub use config::{ConfigError, ReliableConfig, MAX_WINDOW};

/// The reliable layer's settings by their earlier name.
#[deprecated(since = "0.1.0", note = "renamed `ReliableConfig`")]
pub type Config = ReliableConfig;
pub use error::SendError;
pub use stats::Stats;

/// Datagrams received in order from one peer since the last acknowledgement to it, after
/// which the owed acknowledgement goes out at once instead of waiting for data to ride on (a
/// bundle counts as one). Four, not TCP's two: a member that releases a contended lock and
/// asks for it again sends two datagrams to the grantor, whose next grant to it carries the
/// acknowledgement a handoff or two later; acknowledging every second datagram cost the
/// grantor a lone one per handoff. With a `send_window` below four, the window is the count
/// instead (peers use the same windows), so a sender that has filled its window never waits
/// `ack_delay` for the acknowledgement.
pub const ACK_AT_ONCE_EVERY: u32 = 4;

use peer::Peer;
use recv::{RecvOutcome, RecvStream};
use send::{AckOutcome, SendStream};
use timers::{TimerKey, Timers};

use crate::Instant;

/// The largest payload per segment, in bytes: what fits the largest datagram the wire format
/// decodes ([`MAX_PACKET_LEN`]) after the packet overhead. `max_fragment_len` is clamped to it.
pub const MAX_FRAGMENT_LEN: usize = MAX_PACKET_LEN - PACKET_OVERHEAD_MAX;

/// Reliable, in-order, exactly-once delivery of messages to and from every peer of one member.
///
/// See the [module docs](self) for the protocol and the drive loop.
pub struct Reliable {
    local: MemberId,
    config: ReliableConfig,
    max_fragment_len: usize,
    /// The number of the next send stream; only increases.
    next_stream: u64,
    peers: BTreeMap<MemberId, Peer>,
    /// Known peers by address, to spot restarts.
    by_addr: BTreeMap<(SocketAddr, u128), MemberId>,
    /// Incarnations replaced by a restart, whose late datagrams are ignored; bounded FIFO.
    retired: BTreeSet<(SocketAddr, u128)>,
    retired_order: VecDeque<(SocketAddr, u128)>,
    /// Peers with a frame to transmit, served round-robin one frame at a time.
    ready: VecDeque<MemberId>,
    delivered: VecDeque<(MemberId, Vec<u8>)>,
    timers: Timers,
    sweep_at: Option<Instant>,
    stats: Stats,
}

impl Reliable {
    /// Creates the layer of member `local`.
    ///
    /// `max_fragment_len` is the payload bytes per segment: the largest datagram the transport
    /// carries less [`PACKET_OVERHEAD_MAX`]; it is clamped to `1..=`[`MAX_FRAGMENT_LEN`].
    /// An invalid `config` is clamped into range with a warning; check it first with
    /// [`ReliableConfig::validate`].
    pub fn new(local: MemberId, config: ReliableConfig, max_fragment_len: usize) -> Self {
        if let Err(error) = config.validate() {
            warn!(%error, "invalid reliable-layer configuration clamped into range");
        }
        Self {
            local,
            config: config.sanitized(),
            max_fragment_len: max_fragment_len.clamp(1, MAX_FRAGMENT_LEN),
            next_stream: 1,
            peers: BTreeMap::new(),
            by_addr: BTreeMap::new(),
            retired: BTreeSet::new(),
            retired_order: VecDeque::new(),
            ready: VecDeque::new(),
            delivered: VecDeque::new(),
            timers: Timers::default(),
            sweep_at: None,
            stats: Stats::default(),
        }
    }

    /// Queues `message` for reliable delivery to `to`, cutting it into fragments when it is
    /// longer than `max_fragment_len`. The segments go out through [`Reliable::poll_transmit`].
    ///
    /// # Errors
    /// Nothing is queued and no state changes when the message is longer than
    /// `ReliableConfig::max_message_len` ([`SendError::TooLarge`]), when the peer's queue holds
    /// `ReliableConfig::max_queued_bytes` already ([`SendError::QueueFull`]; a peer with an empty queue
    /// accepts any one message), when `to` is a new peer and the peer table is full
    /// ([`SendError::TooManyPeers`]), or when `to` is this member ([`SendError::ToSelf`]).
    pub fn send(&mut self, now: Instant, to: &MemberId, message: Vec<u8>) -> Result<(), SendError> {
        if to.incarnation() == self.local.incarnation() {
            return Err(SendError::ToSelf);
        }
        if message.len() > self.config.max_message_len {
            return Err(SendError::TooLarge {
                len: message.len(),
                max: self.config.max_message_len,
            });
        }
        if let Some(queued) = self.peers.get(to).and_then(|p| p.send.as_ref()) {
            let queued = queued.queued_bytes();
            if queued > 0 && queued.saturating_add(message.len()) > self.config.max_queued_bytes {
                return Err(SendError::QueueFull {
                    queued,
                    max: self.config.max_queued_bytes,
                });
            }
        }
        if !self.ensure_peer(now, to) {
            return Err(SendError::TooManyPeers {
                max: self.config.max_peers,
            });
        }
        let Some(peer) = self.peers.get_mut(to) else {
            return Err(SendError::TooManyPeers {
                max: self.config.max_peers,
            });
        };
        let stream = peer.send.get_or_insert_with(|| {
            let number = self.next_stream;
            self.next_stream += 1;
            debug!(peer = %to, stream = number, "new send stream");
            SendStream::new(number, self.config.retransmit_timeout)
        });
        let len = message.len();
        let fragments = stream.push(message, self.max_fragment_len);
        trace!(peer = %to, stream = stream.stream(), len, fragments, "message queued");
        let rto = stream.rto();
        peer.last_activity = now;
        if peer.retransmit_at.is_none() {
            let key = TimerKey::Retransmit(to.clone());
            self.timers
                .set(&mut peer.retransmit_at, key, Some(now + rto));
        }
        mark_ready(&mut self.ready, to, peer, self.config.send_window);
        Ok(())
    }

    /// Takes a data segment that `from` sent us: validates it, buffers or delivers it, and
    /// owes `from` an acknowledgement. Invalid, stale and excess segments are dropped.
    pub fn handle_segment(&mut self, now: Instant, from: &MemberId, segment: Segment) {
        self.receive(now, from, segment, true);
    }

    /// Takes the segments of a bundle (one datagram), in order, as
    /// [`Reliable::handle_segment`] each. The datagram counts once toward
    /// [`ACK_AT_ONCE_EVERY`]. A bundle of more than [`MAX_BUNDLE`] segments is dropped whole.
    pub fn handle_bundle(&mut self, now: Instant, from: &MemberId, segments: Vec<Segment>) {
        if segments.len() > MAX_BUNDLE {
            warn!(peer = %from, len = segments.len(), "oversized bundle dropped");
            self.stats.malformed_dropped += 1;
            return;
        }
        for (i, segment) in segments.into_iter().enumerate() {
            self.receive(now, from, segment, i == 0);
        }
    }

    /// One segment; `arrival` if it is the first of its datagram.
    fn receive(&mut self, now: Instant, from: &MemberId, segment: Segment, arrival: bool) {
        self.stats.segments_received += 1;
        if let Err(why) = recv::check(&segment, self.config.max_message_len) {
            warn!(peer = %from, why, seq = segment.seq, "malformed segment dropped");
            self.stats.malformed_dropped += 1;
            return;
        }
        if from.incarnation() == self.local.incarnation() {
            warn!(peer = %from, "segment claiming to come from this member dropped");
            self.stats.malformed_dropped += 1;
            return;
        }
        if segment.to != self.local.incarnation() {
            debug!(peer = %from, to = segment.to, "segment for another incarnation of this member dropped");
            self.stats.stale_dropped += 1;
            return;
        }
        if !self.admit(from) {
            return;
        }
        if !self.ensure_peer(now, from) {
            warn!(peer = %from, max = self.config.max_peers, "peer table full; segment from a new peer dropped");
            self.stats.peer_limit_dropped += 1;
            return;
        }
        if let Some(ack) = segment.ack {
            self.stats.acks_received += 1;
            self.apply_ack(now, from, ack.stream, ack.next_expected);
        }
        let Some(peer) = self.peers.get_mut(from) else {
            return;
        };
        peer.last_activity = now;
        let recv = match &mut peer.recv {
            Some(recv) if recv.stream() == segment.stream => recv,
            Some(recv) if recv.stream() > segment.stream => {
                trace!(peer = %from, stream = segment.stream, current = recv.stream(), "segment of an older stream dropped");
                self.stats.stale_dropped += 1;
                return;
            }
            slot => {
                if let Some(old) = slot {
                    debug!(peer = %from, old = old.stream(), new = segment.stream, base = segment.base,
                        "peer started a new stream; receive state replaced");
                } else {
                    debug!(peer = %from, stream = segment.stream, base = segment.base, "new receive state");
                }
                slot.insert(RecvStream::new(segment.stream, segment.base))
            }
        };
        // A segment that arrives in order with nothing buffered behind it may wait for data
        // to carry its acknowledgement; anything else tells the sender about a loss.
        let in_order = segment.seq == recv.next_expected() && recv.buffered() == 0;
        let delivered = &mut self.delivered;
        let stats = &mut self.stats;
        let outcome = recv.receive(
            from,
            segment,
            self.config.recv_window,
            self.config.max_message_len,
            &mut |message| {
                stats.messages_delivered += 1;
                delivered.push_back((from.clone(), message));
            },
        );
        match outcome {
            RecvOutcome::Accepted => {}
            RecvOutcome::Duplicate => self.stats.duplicates_dropped += 1,
            RecvOutcome::OutOfWindow => self.stats.out_of_window_dropped += 1,
        }
        peer.ack_owed = true;
        peer.unacked_received = peer.unacked_received.saturating_add(u32::from(arrival));
        let key = TimerKey::Ack(from.clone());
        if !in_order
            || outcome != RecvOutcome::Accepted
            || peer.unacked_received >= ACK_AT_ONCE_EVERY.min(self.config.send_window)
            || self.config.ack_delay.is_zero()
        {
            peer.ack_now = true;
            self.timers.set(&mut peer.ack_at, key, None);
        } else if peer.ack_at.is_none() && !peer.ack_now {
            let at = now + self.config.ack_delay;
            self.timers.set(&mut peer.ack_at, key, Some(at));
        }
        mark_ready(&mut self.ready, from, peer, self.config.send_window);
    }

    /// Takes an acknowledgement that `from` sent us: releases what it covers, resets the
    /// backoff and lets queued segments go out. Acknowledgements of unknown or older streams
    /// and for another incarnation of this member are ignored.
    pub fn handle_ack(&mut self, now: Instant, from: &MemberId, ack: Ack) {
        self.stats.acks_received += 1;
        if ack.to != self.local.incarnation() {
            debug!(peer = %from, to = ack.to, "ack for another incarnation of this member dropped");
            self.stats.stale_dropped += 1;
            return;
        }
        if !self.admit(from) {
            return;
        }
        self.apply_ack(now, from, ack.stream, ack.next_expected);
    }

    /// Releases what an acknowledgement of our stream `stream` to `from` covers, whether it
    /// came on its own or on a data segment. The caller checked the incarnation and restarts.
    fn apply_ack(&mut self, now: Instant, from: &MemberId, stream: u64, next_expected: u64) {
        let Some(peer) = self.peers.get_mut(from) else {
            trace!(peer = %from, "ack from an unknown peer ignored");
            self.stats.stale_dropped += 1;
            return;
        };
        let Some(send) = peer.send.as_mut().filter(|s| s.stream() == stream) else {
            trace!(peer = %from, stream, "ack of an unknown stream ignored");
            self.stats.stale_dropped += 1;
            return;
        };
        let stream = send;
        peer.last_activity = now;
        match stream.on_ack(next_expected, self.config.retransmit_timeout) {
            AckOutcome::Invalid => {
                warn!(peer = %from, next_expected, "ack of segments never sent dropped");
                self.stats.malformed_dropped += 1;
                return;
            }
            AckOutcome::Stale => return,
            AckOutcome::Duplicate => {}
            AckOutcome::Progress => {
                let at = stream.has_unacked().then(|| now + stream.rto());
                let key = TimerKey::Retransmit(from.clone());
                self.timers.set(&mut peer.retransmit_at, key, at);
            }
        }
        mark_ready(&mut self.ready, from, peer, self.config.send_window);
    }

    /// Fires every deadline due at `now`: retransmissions (with backoff) and the eviction of
    /// idle peers. Calling it early, late or repeatedly is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        while let Some(key) = self.timers.pop_due(now) {
            match key {
                TimerKey::Sweep => {
                    self.sweep_at = None;
                    self.sweep(now);
                }
                TimerKey::Retransmit(id) => self.retransmit(now, &id),
                TimerKey::Ack(id) => {
                    if let Some(peer) = self.peers.get_mut(&id) {
                        peer.ack_at = None;
                        peer.ack_now = true;
                        mark_ready(&mut self.ready, &id, peer, self.config.send_window);
                    }
                }
            }
        }
    }

    /// The next frame to send and the member to send it to: a [`Frame::Data`], a
    /// [`Frame::Bundle`] (segments ready for one peer that fit one datagram together) or a
    /// [`Frame::Ack`]. Peers are served round-robin; call until `None` after every input, or
    /// after a batch of inputs: what was queued meanwhile for one peer leaves together.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<(MemberId, Frame)> {
        let window = self.config.send_window;
        while let Some(id) = self.ready.pop_front() {
            let Some(peer) = self.peers.get_mut(&id) else {
                continue;
            };
            let mut frame = None;
            if let Some(stream) = &mut peer.send {
                if let Some((mut segment, resent)) =
                    stream.next_segment(id.incarnation(), window, self.max_fragment_len)
                {
                    self.stats.segments_sent += 1;
                    if resent {
                        self.stats.segments_retransmitted += 1;
                        trace!(peer = %id, seq = segment.seq, "segment retransmitted");
                    }
                    // Whatever else is ready for the peer and fits rides in the same datagram.
                    let mut bundle = Vec::new();
                    let mut used = segment.payload.0.len();
                    while bundle.len() + 1 < MAX_BUNDLE
                        && used + BUNDLED_SEGMENT_OVERHEAD_MAX < self.max_fragment_len
                    {
                        let Some(len) = stream.next_len(window, self.max_fragment_len) else {
                            break;
                        };
                        if used + BUNDLED_SEGMENT_OVERHEAD_MAX + len > self.max_fragment_len {
                            break;
                        }
                        let Some((next, resent)) =
                            stream.next_segment(id.incarnation(), window, self.max_fragment_len)
                        else {
                            break;
                        };
                        self.stats.segments_sent += 1;
                        self.stats.segments_retransmitted += u64::from(resent);
                        used += BUNDLED_SEGMENT_OVERHEAD_MAX + len;
                        bundle.push(next);
                    }
                    if !bundle.is_empty() {
                        self.stats.bundles_sent += 1;
                    }
                    if peer.ack_owed {
                        segment.ack = peer.recv.as_ref().map(|recv| StreamAck {
                            stream: recv.stream(),
                            next_expected: recv.next_expected(),
                        });
                        self.stats.acks_piggybacked += u64::from(segment.ack.is_some());
                        self.timers
                            .set(&mut peer.ack_at, TimerKey::Ack(id.clone()), None);
                        peer.ack_sent();
                    }
                    frame = Some(if bundle.is_empty() {
                        Frame::Data(segment)
                    } else {
                        bundle.insert(0, segment);
                        Frame::Bundle(bundle)
                    });
                }
            }
            if frame.is_none() && peer.ack_owed && peer.ack_now {
                if let Some(recv) = &peer.recv {
                    self.stats.acks_sent += 1;
                    frame = Some(Frame::Ack(Ack {
                        to: id.incarnation(),
                        stream: recv.stream(),
                        next_expected: recv.next_expected(),
                    }));
                }
                self.timers
                    .set(&mut peer.ack_at, TimerKey::Ack(id.clone()), None);
                peer.ack_sent();
            }
            if peer.has_transmit(window) {
                self.ready.push_back(id.clone());
            } else {
                peer.ready = false;
            }
            if let Some(frame) = frame {
                return Some((id, frame));
            }
        }
        None
    }

    /// The next complete message and its sender; in order per sender, each exactly once.
    #[must_use]
    pub fn poll_delivered(&mut self) -> Option<(MemberId, Vec<u8>)> {
        self.delivered.pop_front()
    }

    /// The earliest deadline: call [`Reliable::handle_timeout`] then. `None` when nothing is
    /// scheduled.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.earliest()
    }

    /// Forgets `peer` in both directions (it left the view): messages queued to it are
    /// dropped, and so is whatever it sent that was not complete. Messages from it already
    /// complete stay in [`Reliable::poll_delivered`].
    ///
    /// Should the same incarnation talk to us again on the stream it had, a fresh receive
    /// state starts at the stream's `base`: a message delivered before the removal whose
    /// acknowledgement never reached the peer is delivered again. Remove a peer only once it
    /// is out of the view on both sides (or restarted), as the membership layer does.
    pub fn remove_peer(&mut self, peer: &MemberId) {
        if self.drop_peer(peer) {
            debug!(%peer, "peer removed");
        }
    }

    /// Whether anything is queued or in flight to `peer`.
    pub fn has_unacked(&self, peer: &MemberId) -> bool {
        self.peers.get(peer).is_some_and(Peer::has_unacked)
    }

    /// Whether nothing is queued or in flight to any peer.
    pub fn is_quiescent(&self) -> bool {
        !self.peers.values().any(Peer::has_unacked)
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// This member.
    pub fn local(&self) -> &MemberId {
        &self.local
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &ReliableConfig {
        &self.config
    }

    /// Payload bytes per segment.
    pub fn max_fragment_len(&self) -> usize {
        self.max_fragment_len
    }

    /// Number of peer states kept.
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// Checks input from `from` against restarts. Returns false if `from` is an incarnation
    /// replaced by a restart (its input must be dropped): one retired before, or one older than
    /// an incarnation known at its address ([`MemberId::is_newer_incarnation_than`]: a late
    /// datagram of a dead process never displaces its successor). Drops the state of every
    /// older incarnation at the address of `from`, which must have restarted.
    fn admit(&mut self, from: &MemberId) -> bool {
        let addr = from.addr();
        if self.retired.contains(&(addr, from.incarnation())) {
            trace!(peer = %from, "input from a restarted incarnation dropped");
            self.stats.stale_dropped += 1;
            return false;
        }
        let mut older = Vec::new();
        for (_, known) in self.by_addr.range((addr, 0)..=(addr, u128::MAX)) {
            if known == from {
                continue;
            }
            if known.is_newer_incarnation_than(from) {
                // Dropped, not retired: should a host's clock have stepped back across a
                // restart, `from` is the live successor, and it is heard again once the
                // membership layer forgets the dead incarnation `known`.
                debug!(old = %from, new = %known, "input from an older incarnation dropped");
                self.stats.stale_dropped += 1;
                return false;
            }
            older.push(known.clone());
        }
        for id in older {
            debug!(old = %id, new = %from, "peer restarted; its old state dropped");
            self.drop_peer(&id);
            self.retire(addr, id.incarnation());
            self.stats.peers_restarted += 1;
        }
        true
    }

    fn retire(&mut self, addr: SocketAddr, incarnation: u128) {
        if self.retired.insert((addr, incarnation)) {
            self.retired_order.push_back((addr, incarnation));
        }
        while self.retired_order.len() > self.config.max_peers {
            if let Some(oldest) = self.retired_order.pop_front() {
                self.retired.remove(&oldest);
            }
        }
    }

    /// Makes sure a state exists for `id`; false if it is new and the table is full.
    fn ensure_peer(&mut self, now: Instant, id: &MemberId) -> bool {
        if self.peers.contains_key(id) {
            return true;
        }
        if self.peers.len() >= self.config.max_peers {
            return false;
        }
        self.peers.insert(id.clone(), Peer::new(now));
        self.by_addr
            .insert((id.addr(), id.incarnation()), id.clone());
        if self.sweep_at.is_none() {
            let at = now + self.config.idle_timeout;
            self.timers
                .set(&mut self.sweep_at, TimerKey::Sweep, Some(at));
        }
        true
    }

    /// Forgets `id` entirely; returns whether it was known.
    fn drop_peer(&mut self, id: &MemberId) -> bool {
        let Some(mut peer) = self.peers.remove(id) else {
            return false;
        };
        let key = TimerKey::Retransmit(id.clone());
        self.timers.set(&mut peer.retransmit_at, key, None);
        self.timers
            .set(&mut peer.ack_at, TimerKey::Ack(id.clone()), None);
        self.by_addr.remove(&(id.addr(), id.incarnation()));
        if peer.ready {
            self.ready.retain(|ready| ready != id);
        }
        if self.peers.is_empty() {
            self.timers.set(&mut self.sweep_at, TimerKey::Sweep, None);
        }
        true
    }

    /// The retransmission timer of `id` fired.
    fn retransmit(&mut self, now: Instant, id: &MemberId) {
        let Some(peer) = self.peers.get_mut(id) else {
            return;
        };
        peer.retransmit_at = None;
        let Some(stream) = peer.send.as_mut().filter(|s| s.has_unacked()) else {
            return;
        };
        if stream.on_timeout(self.config.max_retransmit_timeout) {
            debug!(peer = %id, stream = stream.stream(), in_flight = stream.in_flight(),
                next_timeout = ?stream.rto(), "retransmission timeout");
        }
        let at = now + stream.rto();
        let key = TimerKey::Retransmit(id.clone());
        self.timers.set(&mut peer.retransmit_at, key, Some(at));
        mark_ready(&mut self.ready, id, peer, self.config.send_window);
    }

    /// Forgets the idle peers and schedules the next sweep.
    fn sweep(&mut self, now: Instant) {
        let idle = self.config.idle_timeout;
        let evict: Vec<MemberId> = self
            .peers
            .iter()
            .filter(|(_, p)| p.is_idle() && now - p.last_activity >= idle)
            .map(|(id, _)| id.clone())
            .collect();
        for id in evict {
            debug!(peer = %id, "idle peer state evicted");
            self.drop_peer(&id);
            self.stats.peers_evicted += 1;
        }
        let earliest = self.peers.values().map(|p| p.last_activity + idle).min();
        if let Some(earliest) = earliest {
            let granularity = (idle / 8).max(Duration::from_micros(1));
            let at = earliest.max(now + granularity);
            self.timers
                .set(&mut self.sweep_at, TimerKey::Sweep, Some(at));
        }
    }
}

impl fmt::Debug for Reliable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reliable")
            .field("local", &self.local)
            .field("peers", &self.peers.len())
            .field("next_stream", &self.next_stream)
            .field("ready", &self.ready.len())
            .field("delivered", &self.delivered.len())
            .field("next_timeout", &self.timers.earliest())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Puts `peer` in the transmit round-robin if it has something to send and is not there yet.
fn mark_ready(ready: &mut VecDeque<MemberId>, id: &MemberId, peer: &mut Peer, window: u32) {
    if !peer.ready && peer.has_transmit(window) {
        peer.ready = true;
        ready.push_back(id.clone());
    }
}

#[cfg(test)]
mod tests;
