//! The receive stream from one peer: validation, window, in-order delivery, reassembly.
//!
//! Out-of-order segments wait in a ring of `recv_window` slots indexed by
//! `seq - next_expected`; in-order segments feed the reassembly of the current message, and a
//! complete message goes to the caller's `deliver` callback. A single-fragment message is
//! delivered as the very `Vec` the segment brought.

use std::collections::VecDeque;

use conclave_lock_api::wire::{Segment, MAX_PACKET_LEN};
use conclave_lock_api::MemberId;
use tracing::{debug, warn};

/// Bytes reserved up front for a message being reassembled, at most; it grows as fragments
/// arrive, so a lying fragment count cannot make us allocate much.
const REASSEMBLY_PREALLOC_MAX: usize = 1 << 20;

/// Checks the fields of a segment from the network, before it touches any state.
///
/// # Errors
/// A short description of what is wrong; the segment must be dropped.
pub(crate) fn check(segment: &Segment, max_message_len: usize) -> Result<(), &'static str> {
    if segment.fragments == 0 {
        return Err("zero fragments");
    }
    if segment.fragment >= segment.fragments {
        return Err("fragment index not below the fragment count");
    }
    // Every fragment carries at least one byte, except the only fragment of an empty message.
    if segment.fragments as usize > max_message_len.max(1) {
        return Err("fragment count exceeds the message size limit");
    }
    // Lenient: the sender's datagrams may be larger than ours, but no larger than any datagram
    // the wire format decodes. This bounds what the receive window holds.
    if segment.payload.0.len() > max_message_len.min(MAX_PACKET_LEN) {
        return Err("payload exceeds the segment size limit");
    }
    if segment.base > segment.seq {
        return Err("base above the sequence number");
    }
    if segment.seq == u64::MAX {
        return Err("sequence number at its maximum");
    }
    Ok(())
}

/// What [`RecvStream::receive`] did with a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RecvOutcome {
    /// New: delivered, buffered or fed to reassembly.
    Accepted,
    /// Received before (below `next_expected` or already buffered).
    Duplicate,
    /// At or beyond `next_expected + recv_window`.
    OutOfWindow,
}

/// A segment waiting for its predecessors.
#[derive(Debug)]
struct Pending {
    fragment: u32,
    fragments: u32,
    payload: Vec<u8>,
}

/// A message whose first fragments arrived in order.
#[derive(Debug)]
struct Reassembly {
    fragments: u32,
    next_fragment: u32,
    data: Vec<u8>,
}

/// The receive half of a peer's state.
#[derive(Debug)]
pub(crate) struct RecvStream {
    stream: u64,
    next_expected: u64,
    /// Slot `i` holds segment `next_expected + i` if it arrived; never longer than the window.
    window: VecDeque<Option<Pending>>,
    buffered: usize,
    partial: Option<Reassembly>,
}

impl RecvStream {
    /// A receive state for `stream` expecting `base` next: everything below was delivered by
    /// an earlier state of ours (or by nobody, on a stream we never saw from its start).
    pub(crate) fn new(stream: u64, base: u64) -> Self {
        Self {
            stream,
            next_expected: base,
            window: VecDeque::new(),
            buffered: 0,
            partial: None,
        }
    }

    /// The stream number.
    pub(crate) fn stream(&self) -> u64 {
        self.stream
    }

    /// Every segment below this was received.
    pub(crate) fn next_expected(&self) -> u64 {
        self.next_expected
    }

    /// Whether nothing is buffered or being reassembled.
    pub(crate) fn is_idle(&self) -> bool {
        self.buffered == 0 && self.partial.is_none()
    }

    /// Out-of-order segments held.
    pub(crate) fn buffered(&self) -> usize {
        self.buffered
    }

    /// Takes a segment of this stream that passed [`check`], and hands every message it
    /// completes to `deliver`, in order. `from` is for logs only.
    pub(crate) fn receive(
        &mut self,
        from: &MemberId,
        segment: Segment,
        recv_window: u32,
        max_message_len: usize,
        deliver: &mut impl FnMut(Vec<u8>),
    ) -> RecvOutcome {
        if segment.base > self.next_expected {
            // The sender saw everything below `base` acknowledged, by an earlier state of ours
            // (an acknowledgement that overtook this state's creation): skip ahead.
            self.skip_to(from, segment.base);
            self.drain(from, max_message_len, deliver);
        }
        let Some(offset) = segment.seq.checked_sub(self.next_expected) else {
            return RecvOutcome::Duplicate;
        };
        if offset >= u64::from(recv_window) {
            return RecvOutcome::OutOfWindow;
        }
        let pending = Pending {
            fragment: segment.fragment,
            fragments: segment.fragments,
            payload: segment.payload.0,
        };
        if offset == 0 {
            self.window.pop_front();
            self.next_expected += 1;
            self.accept(from, pending, max_message_len, deliver);
            self.drain(from, max_message_len, deliver);
            return RecvOutcome::Accepted;
        }
        // The offset is below the window, itself at most `MAX_WINDOW`.
        let index = offset as usize;
        if self.window.len() <= index {
            self.window.resize_with(index + 1, || None);
        }
        match self.window.get_mut(index) {
            Some(slot @ None) => {
                *slot = Some(pending);
                self.buffered += 1;
                RecvOutcome::Accepted
            }
            _ => RecvOutcome::Duplicate,
        }
    }

    /// Drops everything below `base`, which the sender knows was delivered.
    fn skip_to(&mut self, from: &MemberId, base: u64) {
        debug!(peer = %from, stream = self.stream, from_seq = self.next_expected, to_seq = base,
            "receive state skips ahead to the sender's base");
        let skip = base - self.next_expected;
        if skip >= self.window.len() as u64 {
            self.window.clear();
        } else {
            // Below the window length, which fits a usize.
            self.window.drain(..skip as usize);
        }
        self.buffered = self.window.iter().filter(|s| s.is_some()).count();
        self.next_expected = base;
        self.partial = None;
    }

    /// Delivers the buffered segments that are now in order.
    fn drain(&mut self, from: &MemberId, max_len: usize, deliver: &mut impl FnMut(Vec<u8>)) {
        while let Some(Some(_)) = self.window.front() {
            let Some(Some(pending)) = self.window.pop_front() else {
                break;
            };
            self.buffered -= 1;
            self.next_expected += 1;
            self.accept(from, pending, max_len, deliver);
        }
    }

    /// Feeds the in-order segment to reassembly.
    fn accept(
        &mut self,
        from: &MemberId,
        pending: Pending,
        max_len: usize,
        deliver: &mut impl FnMut(Vec<u8>),
    ) {
        let Some(mut partial) = self.partial.take() else {
            if pending.fragment != 0 {
                // The message began before this receive state did and was delivered by an
                // earlier one, or lost with it.
                debug!(peer = %from, stream = self.stream, fragment = pending.fragment,
                    "skipping a fragment of a message begun before this receive state");
                return;
            }
            if pending.fragments == 1 {
                deliver(pending.payload);
                return;
            }
            let mut data = pending.payload;
            let target = (data.len().saturating_mul(pending.fragments as usize))
                .min(max_len)
                .min(REASSEMBLY_PREALLOC_MAX);
            data.reserve(target.saturating_sub(data.len()));
            self.partial = Some(Reassembly {
                fragments: pending.fragments,
                next_fragment: 1,
                data,
            });
            return;
        };
        if pending.fragment != partial.next_fragment || pending.fragments != partial.fragments {
            warn!(peer = %from, stream = self.stream, expected_fragment = partial.next_fragment,
                expected_count = partial.fragments, fragment = pending.fragment,
                count = pending.fragments, "inconsistent fragments; message dropped");
            if pending.fragment == 0 {
                self.accept(from, pending, max_len, deliver);
            }
            return;
        }
        if partial.data.len() + pending.payload.len() > max_len {
            warn!(peer = %from, stream = self.stream, max_len,
                "reassembled message exceeds the size limit; dropped");
            return;
        }
        partial.data.extend_from_slice(&pending.payload);
        partial.next_fragment += 1;
        if partial.next_fragment == partial.fragments {
            deliver(partial.data);
        } else {
            self.partial = Some(partial);
        }
    }
}

#[cfg(test)]
mod tests {
    use conclave_lock_api::wire::Payload;

    use super::*;

    fn peer() -> MemberId {
        MemberId::new(5, "p", "127.0.0.1:5".parse().unwrap()).unwrap()
    }

    fn seg(seq: u64, fragment: u32, fragments: u32, payload: &[u8]) -> Segment {
        Segment {
            to: 1,
            stream: 1,
            base: 1,
            seq,
            fragment,
            fragments,
            payload: Payload(payload.to_vec()),
            ack: None,
        }
    }

    fn feed(r: &mut RecvStream, s: Segment) -> (RecvOutcome, Vec<Vec<u8>>) {
        let mut out = Vec::new();
        let outcome = r.receive(&peer(), s, 8, 1000, &mut |m| out.push(m));
        (outcome, out)
    }

    #[test]
    fn check_rejects_malformed_segments() {
        assert!(check(&seg(1, 0, 1, b"x"), 10).is_ok());
        assert!(check(&seg(1, 0, 1, b""), 0).is_ok());
        assert!(check(&seg(1, 0, 0, b"x"), 10).is_err());
        assert!(check(&seg(1, 1, 1, b"x"), 10).is_err());
        assert!(check(&seg(1, 0, 11, b"x"), 10).is_err());
        assert!(check(&seg(1, 0, 1, &[0; 11]), 10).is_err());
        assert!(check(&seg(1, 0, 1, &[0; MAX_PACKET_LEN]), 1 << 20).is_ok());
        assert!(check(&seg(1, 0, 1, &[0; MAX_PACKET_LEN + 1]), 1 << 20).is_err());
        assert!(check(&seg(u64::MAX, 0, 1, b"x"), 10).is_err());
        let mut s = seg(3, 0, 1, b"x");
        s.base = 4;
        assert!(check(&s, 10).is_err());
    }

    #[test]
    fn in_order_reordered_and_duplicate_segments() {
        let mut r = RecvStream::new(1, 1);
        assert_eq!(
            feed(&mut r, seg(2, 0, 1, b"b")),
            (RecvOutcome::Accepted, vec![])
        );
        assert_eq!(feed(&mut r, seg(2, 0, 1, b"b")).0, RecvOutcome::Duplicate);
        assert_eq!(r.buffered(), 1);
        let (outcome, out) = feed(&mut r, seg(1, 0, 1, b"a"));
        assert_eq!(outcome, RecvOutcome::Accepted);
        assert_eq!(out, [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(r.next_expected(), 3);
        assert_eq!(feed(&mut r, seg(1, 0, 1, b"a")).0, RecvOutcome::Duplicate);
        assert_eq!(
            feed(&mut r, seg(11, 0, 1, b"z")).0,
            RecvOutcome::OutOfWindow
        );
        assert!(r.is_idle());
    }

    #[test]
    fn fragments_are_reassembled_in_any_arrival_order() {
        let mut r = RecvStream::new(1, 1);
        assert!(feed(&mut r, seg(3, 2, 3, b"ef")).1.is_empty());
        assert!(feed(&mut r, seg(1, 0, 3, b"ab")).1.is_empty());
        assert!(!r.is_idle());
        assert_eq!(feed(&mut r, seg(2, 1, 3, b"cd")).1, [b"abcdef".to_vec()]);
        assert!(r.is_idle());
    }

    #[test]
    fn inconsistent_fragments_drop_the_message_but_not_the_stream() {
        let mut r = RecvStream::new(1, 1);
        feed(&mut r, seg(1, 0, 3, b"ab"));
        // Wrong count for the second fragment: the message is dropped.
        assert!(feed(&mut r, seg(2, 1, 4, b"cd")).1.is_empty());
        assert!(feed(&mut r, seg(3, 2, 3, b"ef")).1.is_empty());
        // A fragment 0 while a message is open restarts reassembly.
        feed(&mut r, seg(4, 0, 2, b"gh"));
        assert_eq!(feed(&mut r, seg(5, 0, 1, b"i")).1, [b"i".to_vec()]);
        assert_eq!(r.next_expected(), 6);
        assert!(r.is_idle());
    }

    #[test]
    fn oversized_reassembly_is_dropped() {
        let mut r = RecvStream::new(1, 1);
        let mut out = Vec::new();
        let big = vec![0u8; 6];
        for seq in 1..=3 {
            let s = seg(seq, seq as u32 - 1, 3, &big);
            r.receive(&peer(), s, 8, 10, &mut |m| out.push(m));
        }
        assert!(out.is_empty());
        assert!(r.is_idle());
    }

    #[test]
    fn fresh_state_in_mid_message_skips_to_the_next_message() {
        let mut r = RecvStream::new(1, 5);
        let mut s = seg(5, 2, 3, b"tail");
        s.base = 5;
        assert!(feed(&mut r, s).1.is_empty());
        let mut s = seg(6, 0, 1, b"next");
        s.base = 5;
        assert_eq!(feed(&mut r, s).1, [b"next".to_vec()]);
    }

    #[test]
    fn base_above_next_expected_skips_ahead() {
        let mut r = RecvStream::new(1, 1);
        feed(&mut r, seg(3, 0, 1, b"c"));
        feed(&mut r, seg(5, 0, 1, b"e"));
        let mut s = seg(4, 0, 1, b"d");
        s.base = 3;
        // 1 and 2 were acknowledged by an earlier state: 3, 4 and 5 are delivered.
        assert_eq!(
            feed(&mut r, s).1,
            [b"c".to_vec(), b"d".to_vec(), b"e".to_vec()]
        );
        assert_eq!(r.next_expected(), 6);
        assert!(r.is_idle());
    }
}
