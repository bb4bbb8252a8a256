//! The send side of one connection: whole frames waiting for the socket to take them, and the
//! mesh-wide total of queued bytes every queue keeps up to date.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The bytes of data frames queued and not yet written, over every connection of a mesh (and
/// the frames it sent to itself, which the mesh adds by hand): what
/// [`TcpConfig::max_queued_bytes`](crate::TcpConfig::max_queued_bytes) bounds. Hellos do not
/// count. Every [`SendQueue`] holds a handle and updates it as bytes are queued, written, moved
/// away or dropped with the queue, so no path that discards a connection can leak or
/// double-count bytes.
///
/// Only changed with the mesh's lock held: the atomic merely makes the handle `Send + Sync`.
#[derive(Clone, Debug, Default)]
pub(crate) struct Total(Arc<AtomicUsize>);

impl Total {
    /// The bytes counted now.
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }

    /// Whether `n` more bytes keep the total within `max`.
    pub(crate) fn fits(&self, n: usize, max: usize) -> bool {
        self.get().checked_add(n).is_some_and(|total| total <= max)
    }

    /// Counts `n` bytes more.
    pub(crate) fn add(&self, n: usize) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(n))
            });
    }

    /// Counts `n` bytes fewer; never below zero (a debug build asserts it never tries).
    pub(crate) fn sub(&self, n: usize) {
        let before = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(n))
            })
            .unwrap_or_default();
        debug_assert!(
            before >= n,
            "queued total {before} would go below zero by {n}"
        );
    }
}

/// One encoded frame, prefix included.
#[derive(Debug)]
struct Outgoing {
    bytes: Vec<u8>,
    /// The connection's own hello: never moved to another connection.
    hello: bool,
}

/// Frames not yet written, the first possibly in part, with their byte count.
#[derive(Debug, Default)]
pub(crate) struct SendQueue {
    frames: VecDeque<Outgoing>,
    /// Bytes of the first frame already written.
    head: usize,
    /// Bytes not yet written, over all frames.
    bytes: usize,
    /// Bytes not yet written, over the data frames (all but the hello): this queue's share of
    /// `total`.
    data: usize,
    /// The mesh's total, which `data` is part of.
    total: Total,
    /// Data frames wait for the handshake (a keyed connection before the peer's proof is
    /// verified): only the hello and our proof may be written.
    held: bool,
}

impl Drop for SendQueue {
    fn drop(&mut self) {
        // Whatever is still queued is discarded with the connection.
        self.total.sub(self.data);
    }
}

impl SendQueue {
    /// An empty queue whose data bytes count in `total`.
    pub(crate) fn new(total: Total) -> Self {
        Self {
            frames: VecDeque::new(),
            head: 0,
            bytes: 0,
            data: 0,
            total,
            held: false,
        }
    }

    /// Holds data frames back until [`SendQueue::release`]; handshake frames still go.
    pub(crate) fn hold(&mut self) {
        self.held = true;
    }

    /// Whether data frames are held back.
    pub(crate) fn is_held(&self) -> bool {
        self.held
    }

    /// Lets held data frames go.
    pub(crate) fn release(&mut self) {
        self.held = false;
    }

    /// Queues a handshake frame (the proof) after the hello and before every data frame. No
    /// data byte has been written: they are held.
    pub(crate) fn push_control(&mut self, frame: Vec<u8>) {
        debug_assert!(self.held, "only a held queue takes a handshake frame");
        let at = self
            .frames
            .iter()
            .position(|f| !f.hello)
            .unwrap_or(self.frames.len());
        self.bytes += frame.len();
        self.frames.insert(
            at,
            Outgoing {
                bytes: frame,
                hello: true,
            },
        );
    }

    /// Whether bytes can be written now (some are queued and not held back).
    pub(crate) fn is_writable(&self) -> bool {
        self.front().is_some()
    }

    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes waiting.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of data frames (all but the hello) waiting: this queue's share of the total.
    pub(crate) fn data_bytes(&self) -> usize {
        self.data
    }

    /// The mesh's total this queue counts in.
    pub(crate) fn total(&self) -> &Total {
        &self.total
    }

    /// Frames waiting other than the hello.
    pub(crate) fn data_frames(&self) -> usize {
        self.frames.iter().filter(|f| !f.hello).count()
    }

    /// Appends the connection's hello (or another handshake frame).
    pub(crate) fn push_hello(&mut self, frame: Vec<u8>) {
        self.bytes += frame.len();
        self.frames.push_back(Outgoing {
            bytes: frame,
            hello: true,
        });
    }

    /// Appends a frame of which the first `written` bytes already went out (only on an
    /// empty queue can that be more than 0).
    pub(crate) fn push(&mut self, frame: Vec<u8>, written: usize) {
        debug_assert!(written == 0 || self.is_empty());
        debug_assert!(written < frame.len());
        let unwritten = frame.len() - written;
        self.bytes += unwritten;
        self.data += unwritten;
        self.total.add(unwritten);
        if self.frames.is_empty() {
            self.head = written;
        }
        self.frames.push_back(Outgoing {
            bytes: frame,
            hello: false,
        });
    }

    /// The bytes to write next (none while only held data frames wait).
    pub(crate) fn front(&self) -> Option<&[u8]> {
        self.frames
            .front()
            .filter(|f| f.hello || !self.held)
            .map(|f| &f.bytes[self.head..])
    }

    /// Notes that `n` bytes of [`SendQueue::front`] were written.
    pub(crate) fn advance(&mut self, n: usize) {
        let Some(front) = self.frames.front() else {
            return;
        };
        let n = n.min(front.bytes.len() - self.head);
        self.head += n;
        self.bytes -= n;
        if !front.hello {
            self.data -= n;
            self.total.sub(n);
        }
        if self.head == front.bytes.len() {
            self.frames.pop_front();
            self.head = 0;
        }
    }

    /// Removes and returns the data frames no byte of which has been written, for another
    /// connection to the same member. A partly written frame and the hello stay.
    pub(crate) fn take_unsent(&mut self) -> Vec<Vec<u8>> {
        let keep_first = self.head > 0 || self.frames.front().is_some_and(|f| f.hello);
        let skip = usize::from(keep_first);
        let mut taken = Vec::new();
        let mut kept = VecDeque::new();
        for (i, frame) in self.frames.drain(..).enumerate() {
            if i < skip || frame.hello {
                kept.push_back(frame);
            } else {
                taken.push(frame.bytes);
            }
        }
        self.frames = kept;
        self.bytes = self
            .frames
            .iter()
            .map(|f| f.bytes.len())
            .sum::<usize>()
            .saturating_sub(self.head);
        let data = self
            .frames
            .iter()
            .filter(|f| !f.hello)
            .map(|f| f.bytes.len())
            .sum::<usize>()
            .saturating_sub(if self.frames.front().is_some_and(|f| !f.hello) {
                self.head
            } else {
                0
            });
        debug_assert_eq!(
            self.data.checked_sub(data),
            Some(taken.iter().map(Vec::len).sum::<usize>()),
            "moved frames are whole and unwritten"
        );
        self.total.sub(self.data.saturating_sub(data));
        self.data = data;
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_follow_pushes_and_writes() {
        let mut q = SendQueue::default();
        q.push_hello(vec![1; 24]);
        q.push(vec![2; 10], 0);
        q.push(vec![3; 5], 0);
        assert_eq!(q.bytes(), 39);
        assert_eq!(q.data_frames(), 2);
        q.advance(20);
        assert_eq!(q.front(), Some(&[1u8; 4][..]));
        q.advance(4);
        assert_eq!(q.front(), Some(&[2u8; 10][..]));
        assert_eq!(q.bytes(), 15);
        q.advance(10);
        q.advance(5);
        assert!(q.is_empty());
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn held_data_waits_behind_the_proof() {
        let mut q = SendQueue::default();
        q.hold();
        q.push_hello(vec![1; 4]);
        q.push(vec![2; 3], 0);
        q.advance(2);
        assert_eq!(q.front(), Some(&[1u8; 2][..]));
        q.advance(2);
        assert_eq!(q.front(), None, "data is held");
        assert!(!q.is_writable() && !q.is_empty());
        q.push_control(vec![9; 5]);
        assert_eq!(q.front(), Some(&[9u8; 5][..]));
        assert_eq!(q.data_frames(), 1);
        q.advance(5);
        assert_eq!(q.front(), None, "data waits for the peer's proof");
        q.release();
        assert_eq!(q.front(), Some(&[2u8; 3][..]));
        assert_eq!(q.bytes(), 3);
    }

    #[test]
    fn a_partial_first_write_is_remembered() {
        let mut q = SendQueue::default();
        q.push(vec![7; 10], 6);
        assert_eq!(q.bytes(), 4);
        assert_eq!(q.front(), Some(&[7u8; 4][..]));
    }

    #[test]
    fn only_untouched_data_frames_move() {
        let mut q = SendQueue::default();
        q.push_hello(vec![1; 24]);
        q.push(vec![2; 10], 0);
        q.push(vec![3; 5], 0);
        assert_eq!(q.take_unsent(), vec![vec![2; 10], vec![3; 5]]);
        assert_eq!(q.bytes(), 24);

        let mut q = SendQueue::default();
        q.push(vec![2; 10], 4);
        q.push(vec![3; 5], 0);
        assert_eq!(q.take_unsent(), vec![vec![3; 5]]);
        assert_eq!(q.bytes(), 6);
        assert_eq!(q.front(), Some(&[2u8; 6][..]));
    }

    #[test]
    fn the_total_counts_data_bytes_until_written_moved_or_dropped() {
        let total = Total::default();
        let mut a = SendQueue::new(total.clone());
        a.push_hello(vec![1; 24]);
        assert_eq!(total.get(), 0, "hellos do not count");
        a.push(vec![2; 10], 0);
        a.push(vec![3; 5], 0);
        assert_eq!((a.data_bytes(), total.get()), (15, 15));
        a.advance(20);
        assert_eq!(total.get(), 15, "writing the hello changes nothing");
        a.advance(4);
        a.advance(3);
        assert_eq!((a.data_bytes(), total.get()), (12, 12));
        let mut b = SendQueue::new(total.clone());
        b.push(vec![4; 8], 2);
        assert_eq!(
            total.get(),
            18,
            "a partial first write counts only the rest"
        );
        // The partly written frame stays, the untouched one moves out of the total.
        assert_eq!(a.take_unsent(), vec![vec![3; 5]]);
        assert_eq!((a.data_bytes(), total.get()), (7, 13));
        assert!(total.fits(7, 20) && !total.fits(8, 20) && !total.fits(usize::MAX, usize::MAX));
        drop(a);
        assert_eq!(total.get(), 6, "a dropped queue releases what it held");
        b.advance(6);
        assert!(b.is_empty());
        assert_eq!(total.get(), 0);
    }
}
