//! Frames a mesh sends to its own address: queued in memory, never on a socket.

use std::collections::VecDeque;

use crate::queue::Total;

/// Why a frame to ourselves was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// The queue to ourselves holds `send_queue_bytes` already.
    Full,
    /// The mesh-wide `max_queued_bytes` would be exceeded.
    OverBudget,
}

/// The frames sent to our own address, and their bytes (counted in the mesh's [`Total`] too).
#[derive(Debug, Default)]
pub(super) struct Loopback {
    frames: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl Loopback {
    /// Queues `payload`, within `bound` bytes for this queue and `budget` for the mesh's
    /// `total`.
    pub(super) fn push(
        &mut self,
        payload: &[u8],
        bound: usize,
        budget: usize,
        total: &Total,
    ) -> Result<(), Refused> {
        if self.bytes + payload.len() > bound {
            return Err(Refused::Full);
        }
        if !total.fits(payload.len(), budget) {
            return Err(Refused::OverBudget);
        }
        self.bytes += payload.len();
        total.add(payload.len());
        self.frames.push_back(payload.to_vec());
        Ok(())
    }

    /// The oldest frame, taken off the queue and the mesh's `total`.
    pub(super) fn pop(&mut self, total: &Total) -> Option<Vec<u8>> {
        let bytes = self.frames.pop_front()?;
        self.bytes -= bytes.len();
        total.sub(bytes.len());
        Some(bytes)
    }

    /// Drops every frame, taking them off the mesh's `total`.
    pub(super) fn clear(&mut self, total: &Total) {
        self.frames.clear();
        total.sub(self.bytes);
        self.bytes = 0;
    }

    /// Whether no frame waits.
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(super) fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The bytes queued.
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}
