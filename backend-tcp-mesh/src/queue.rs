//! The send side of one connection: whole frames waiting for the socket to take them.

use std::collections::VecDeque;

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
}

impl SendQueue {
    /// Whether nothing waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes waiting.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Frames waiting other than the hello.
    pub(crate) fn data_frames(&self) -> usize {
        self.frames.iter().filter(|f| !f.hello).count()
    }

    /// Appends the connection's hello.
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
        self.bytes += frame.len() - written;
        if self.frames.is_empty() {
            self.head = written;
        }
        self.frames.push_back(Outgoing {
            bytes: frame,
            hello: false,
        });
    }

    /// The bytes to write next.
    pub(crate) fn front(&self) -> Option<&[u8]> {
        self.frames.front().map(|f| &f.bytes[self.head..])
    }

    /// Notes that `n` bytes of [`SendQueue::front`] were written.
    pub(crate) fn advance(&mut self, n: usize) {
        let Some(front) = self.frames.front() else {
            return;
        };
        let n = n.min(front.bytes.len() - self.head);
        self.head += n;
        self.bytes -= n;
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
}
