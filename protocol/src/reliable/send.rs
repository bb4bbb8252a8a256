//! The send stream to one peer: queue, fragmentation, window, acknowledgement, retransmission.
//!
//! Sequence numbers are assigned when a message is queued (one per fragment, consecutive), so
//! the queue and the in-flight window are one list of messages cut in three by `base` (lowest
//! unacknowledged), `next_seq` (lowest never transmitted) and `end_seq` (one past the last
//! assigned). Messages are kept whole; a fragment is copied out of its message when it is
//! transmitted, which the owned [`Segment`] of the wire format requires anyway.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use conclave_lock_api::wire::{Payload, Segment};

/// Segments resent at most when the retransmission timer fires: the oldest unacknowledged
/// ones. Later holes are filled one per round trip by partial acknowledgements.
pub(crate) const TIMEOUT_BURST: u64 = 16;

/// Duplicate acknowledgements that trigger a fast retransmission of the oldest segment.
const DUPACK_THRESHOLD: u32 = 3;

/// A queued or unacknowledged message.
#[derive(Debug)]
struct OutMessage {
    /// Sequence number of fragment 0.
    first_seq: u64,
    /// Number of fragments, at least 1.
    fragments: u32,
    /// The whole message.
    data: Vec<u8>,
}

impl OutMessage {
    fn end_seq(&self) -> u64 {
        self.first_seq + u64::from(self.fragments)
    }
}

/// What an acknowledgement did to the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AckOutcome {
    /// `base` advanced.
    Progress,
    /// Acknowledged exactly `base` again.
    Duplicate,
    /// Below `base`: an old acknowledgement overtaken by a newer one.
    Stale,
    /// Acknowledges a sequence number never transmitted: a confused or hostile peer.
    Invalid,
}

/// The send half of a peer's state.
#[derive(Debug)]
pub(crate) struct SendStream {
    stream: u64,
    base: u64,
    next_seq: u64,
    end_seq: u64,
    messages: VecDeque<OutMessage>,
    bytes: usize,
    rto: Duration,
    /// Retransmissions still to hand out (clamped to `base..next_seq` when used).
    resend: Range<u64>,
    /// One past the highest sequence number ever retransmitted.
    resent_hi: u64,
    /// In loss recovery until `base` reaches this (`next_seq` when recovery started).
    recover: Option<u64>,
    dupacks: u32,
}

impl SendStream {
    /// A new stream numbered `stream`; its first sequence number is 1.
    pub(crate) fn new(stream: u64, rto: Duration) -> Self {
        Self {
            stream,
            base: 1,
            next_seq: 1,
            end_seq: 1,
            messages: VecDeque::new(),
            bytes: 0,
            rto,
            resend: 1..1,
            resent_hi: 1,
            recover: None,
            dupacks: 0,
        }
    }

    /// The stream number.
    pub(crate) fn stream(&self) -> u64 {
        self.stream
    }

    /// Payload bytes of queued and unacknowledged messages.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.bytes
    }

    /// Whether anything is queued or in flight.
    pub(crate) fn has_unacked(&self) -> bool {
        self.base < self.end_seq
    }

    /// Segments transmitted and not acknowledged.
    pub(crate) fn in_flight(&self) -> u64 {
        self.next_seq - self.base
    }

    /// The current retransmission timeout (with backoff).
    pub(crate) fn rto(&self) -> Duration {
        self.rto
    }

    /// Queues `data` cut into fragments of `fragment_len` bytes (at least one fragment, so an
    /// empty message is one empty segment). The caller checked the length; returns the number
    /// of fragments.
    pub(crate) fn push(&mut self, data: Vec<u8>, fragment_len: usize) -> u32 {
        let fragment_len = fragment_len.max(1);
        let fragments = data.len().div_ceil(fragment_len).max(1);
        let fragments = u32::try_from(fragments).unwrap_or(u32::MAX);
        self.bytes += data.len();
        self.messages.push_back(OutMessage {
            first_seq: self.end_seq,
            fragments,
            data,
        });
        self.end_seq += u64::from(fragments);
        fragments
    }

    /// Whether [`SendStream::next_segment`] has something to hand out.
    pub(crate) fn has_transmit(&self, window: u32) -> bool {
        !self.pending_resend().is_empty() || self.can_send_new(window)
    }

    /// The next segment to transmit, and whether it is a retransmission: pending
    /// retransmissions first, then new segments while the window allows.
    pub(crate) fn next_segment(
        &mut self,
        to: u128,
        window: u32,
        fragment_len: usize,
    ) -> Option<(Segment, bool)> {
        let resend = self.pending_resend();
        if !resend.is_empty() {
            let seq = resend.start;
            self.resend.start = seq + 1;
            self.resent_hi = self.resent_hi.max(seq + 1);
            return self.segment(to, seq, fragment_len).map(|s| (s, true));
        }
        if self.can_send_new(window) {
            let seq = self.next_seq;
            self.next_seq += 1;
            return self.segment(to, seq, fragment_len).map(|s| (s, false));
        }
        None
    }

    /// Applies an acknowledgement: everything below `next_expected` was received.
    /// `initial_rto` is what the backoff resets to on progress.
    pub(crate) fn on_ack(&mut self, next_expected: u64, initial_rto: Duration) -> AckOutcome {
        if next_expected > self.next_seq {
            return AckOutcome::Invalid;
        }
        if next_expected < self.base {
            return AckOutcome::Stale;
        }
        if next_expected == self.base {
            if self.in_flight() > 0 {
                self.dupacks += 1;
                if self.dupacks == DUPACK_THRESHOLD && self.recover.is_none() {
                    self.resend = self.base..self.base + 1;
                    self.recover = Some(self.next_seq);
                }
            }
            return AckOutcome::Duplicate;
        }
        self.base = next_expected;
        while let Some(front) = self.messages.front() {
            if front.end_seq() > self.base {
                break;
            }
            self.bytes -= front.data.len();
            self.messages.pop_front();
        }
        self.rto = initial_rto;
        self.dupacks = 0;
        if let Some(recover) = self.recover {
            if self.base >= recover {
                self.recover = None;
            } else if self.base >= self.resent_hi && self.pending_resend().is_empty() {
                // A partial acknowledgement during recovery points at the next hole; resend it
                // unless it was just retransmitted.
                self.resend = self.base..self.base + 1;
            }
        }
        AckOutcome::Progress
    }

    /// The retransmission timer fired. Schedules the oldest in-flight segments (at most
    /// [`TIMEOUT_BURST`]) for retransmission and doubles the timeout up to `max_rto`. Returns
    /// false, changing nothing, when nothing is in flight.
    pub(crate) fn on_timeout(&mut self, max_rto: Duration) -> bool {
        if self.in_flight() == 0 {
            return false;
        }
        let end = self.next_seq.min(self.base + TIMEOUT_BURST);
        self.resend = self.base..end;
        self.recover = Some(self.next_seq);
        self.dupacks = 0;
        self.rto = self.rto.saturating_mul(2).min(max_rto);
        true
    }

    fn pending_resend(&self) -> Range<u64> {
        self.resend.start.max(self.base)..self.resend.end.min(self.next_seq)
    }

    fn can_send_new(&self, window: u32) -> bool {
        self.next_seq < self.end_seq && self.in_flight() < u64::from(window)
    }

    /// The payload length of the segment [`SendStream::next_segment`] would hand out.
    pub(crate) fn next_len(&self, window: u32, fragment_len: usize) -> Option<usize> {
        let resend = self.pending_resend();
        let seq = if !resend.is_empty() {
            resend.start
        } else if self.can_send_new(window) {
            self.next_seq
        } else {
            return None;
        };
        self.locate(seq, fragment_len)
            .map(|(_, _, bytes)| bytes.len())
    }

    /// The message of sequence number `seq`, the fragment's index in it and its bytes.
    fn locate(&self, seq: u64, fragment_len: usize) -> Option<(&OutMessage, u32, &[u8])> {
        let index = self.messages.partition_point(|m| m.end_seq() <= seq);
        let message = self.messages.get(index)?;
        let fragment = u32::try_from(seq.checked_sub(message.first_seq)?).ok()?;
        let start = (fragment as usize).saturating_mul(fragment_len);
        let end = start.saturating_add(fragment_len).min(message.data.len());
        let bytes = message.data.get(start..end).unwrap_or_default();
        Some((message, fragment, bytes))
    }

    /// Builds the segment of sequence number `seq` (which must be unacknowledged).
    fn segment(&self, to: u128, seq: u64, fragment_len: usize) -> Option<Segment> {
        let (message, fragment, bytes) = self.locate(seq, fragment_len)?;
        Some(Segment {
            to,
            stream: self.stream,
            base: self.base,
            seq,
            fragment,
            fragments: message.fragments,
            payload: Payload(bytes.to_vec()),
            ack: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTO: Duration = Duration::from_millis(100);

    fn drain(s: &mut SendStream, window: u32, frag: usize) -> Vec<(Segment, bool)> {
        std::iter::from_fn(|| s.next_segment(9, window, frag)).collect()
    }

    #[test]
    fn fragments_have_consecutive_seqs_and_cover_the_message() {
        let mut s = SendStream::new(3, RTO);
        let data: Vec<u8> = (0..=255).collect();
        assert_eq!(s.push(data.clone(), 100), 3);
        assert_eq!(s.push(Vec::new(), 100), 1);
        let segs = drain(&mut s, 256, 100);
        assert_eq!(segs.len(), 4);
        let mut joined = Vec::new();
        for (i, (seg, resent)) in segs.iter().enumerate().take(3) {
            assert!(!resent);
            assert_eq!(seg.seq, i as u64 + 1);
            assert_eq!(seg.fragment, i as u32);
            assert_eq!(seg.fragments, 3);
            assert_eq!((seg.to, seg.stream, seg.base), (9, 3, 1));
            joined.extend_from_slice(&seg.payload.0);
        }
        assert_eq!(joined, data);
        assert_eq!(segs[3].0.fragments, 1);
        assert!(segs[3].0.payload.0.is_empty());
        assert_eq!(s.queued_bytes(), 256);
    }

    #[test]
    fn window_limits_segments_in_flight() {
        let mut s = SendStream::new(1, RTO);
        for _ in 0..10 {
            s.push(vec![1], 10);
        }
        assert_eq!(drain(&mut s, 4, 10).len(), 4);
        assert_eq!(s.in_flight(), 4);
        assert!(!s.has_transmit(4));
        assert_eq!(s.on_ack(3, RTO), AckOutcome::Progress);
        let segs = drain(&mut s, 4, 10);
        assert_eq!(segs.iter().map(|(s, _)| s.seq).collect::<Vec<_>>(), [5, 6]);
        assert_eq!(segs[0].0.base, 3);
        assert_eq!(s.queued_bytes(), 8);
    }

    #[test]
    fn acks_are_classified() {
        let mut s = SendStream::new(1, RTO);
        s.push(vec![0; 30], 10);
        assert_eq!(drain(&mut s, 8, 10).len(), 3);
        assert_eq!(s.on_ack(5, RTO), AckOutcome::Invalid);
        assert_eq!(s.on_ack(2, RTO), AckOutcome::Progress);
        // A partly acknowledged message still counts whole.
        assert_eq!(s.queued_bytes(), 30);
        assert_eq!(s.on_ack(1, RTO), AckOutcome::Stale);
        assert_eq!(s.on_ack(2, RTO), AckOutcome::Duplicate);
        assert_eq!(s.on_ack(4, RTO), AckOutcome::Progress);
        assert!(!s.has_unacked());
        assert_eq!(s.queued_bytes(), 0);
    }

    #[test]
    fn timeout_resends_oldest_and_backs_off_to_the_cap() {
        let mut s = SendStream::new(1, RTO);
        for _ in 0..40 {
            s.push(vec![7], 10);
        }
        assert_eq!(drain(&mut s, 64, 10).len(), 40);
        assert!(s.on_timeout(Duration::from_millis(300)));
        assert_eq!(s.rto(), Duration::from_millis(200));
        let resent = drain(&mut s, 64, 10);
        assert_eq!(resent.len() as u64, TIMEOUT_BURST);
        assert!(resent.iter().all(|(_, r)| *r));
        assert_eq!(resent[0].0.seq, 1);
        assert!(s.on_timeout(Duration::from_millis(300)));
        assert_eq!(s.rto(), Duration::from_millis(300));
        assert_eq!(s.on_ack(41, RTO), AckOutcome::Progress);
        assert_eq!(s.rto(), RTO);
        // Pending retransmissions of acknowledged segments are skipped.
        assert!(drain(&mut s, 64, 10).is_empty());
        assert!(!s.on_timeout(Duration::from_millis(300)));
    }

    #[test]
    fn partial_ack_in_recovery_resends_the_next_hole() {
        let mut s = SendStream::new(1, RTO);
        for _ in 0..40 {
            s.push(vec![7], 10);
        }
        drain(&mut s, 64, 10);
        s.on_timeout(Duration::from_secs(1));
        drain(&mut s, 64, 10); // resends 1..=16
        s.on_ack(10, RTO); // 10 was just resent: wait
        assert!(!s.has_transmit(64));
        s.on_ack(20, RTO); // 20 was not: resend it now
        let segs = drain(&mut s, 64, 10);
        assert_eq!(segs.len(), 1);
        assert_eq!((segs[0].0.seq, segs[0].1), (20, true));
        s.on_ack(41, RTO);
        assert!(!s.has_unacked());
    }

    #[test]
    fn third_duplicate_ack_fast_retransmits() {
        let mut s = SendStream::new(1, RTO);
        for _ in 0..5 {
            s.push(vec![7], 10);
        }
        drain(&mut s, 64, 10);
        s.on_ack(2, RTO);
        s.on_ack(2, RTO);
        s.on_ack(2, RTO);
        assert!(!s.has_transmit(64));
        s.on_ack(2, RTO);
        let segs = drain(&mut s, 64, 10);
        assert_eq!(segs.len(), 1);
        assert_eq!(segs[0].0.seq, 2);
    }
}
