//! The Raft member's driver thread: datagrams in, the node's timers, its persistence (one
//! fsync per batch, before what depends on it is sent), packets out.
//!
//! What may leave before a batch is durable (a leader's appends to its followers) leaves
//! before the batch is written, so the followers' fsyncs overlap the leader's; the batch is
//! written without the member's state lock, so the member's tasks are not held up by a disk.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use async_channel::Receiver;
use async_io::Timer;
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::{LockError, Transport};
use conclave_protocol::raft::persist::PersistBatch;
use conclave_protocol::raft::wire::{decode_packet, encode_packet};
use conclave_protocol::raft::RaftEvent;
use futures::future::{select, Either};
use futures::FutureExt;

use super::disk::RaftDisk;
use super::state::Shared;

/// How long a leaving member waits for its `Leave` to be applied.
pub(super) const LEAVE_BOUND: Duration = Duration::from_secs(3);

/// Bytes of log since the last snapshot past which a snapshot is taken, whatever the count of
/// entries.
const COMPACT_LOG_BYTES: u64 = 8 << 20;

/// What one turn of the driver must send and write, and whether it is done.
struct Turn {
    sends: Vec<(String, SocketAddr, Vec<u8>)>,
    /// Batches to make durable, in order, once `sends` are sent.
    batches: Vec<PersistBatch>,
    next: Option<StdInstant>,
    done: bool,
}

pub(super) struct Driver {
    pub(super) shared: Arc<Shared>,
    pub(super) transport: Arc<dyn Transport>,
    pub(super) disk: RaftDisk,
    pub(super) cluster: ClusterId,
    pub(super) ring: Receiver<()>,
}

impl Driver {
    /// Runs until the node has left (or the leave bound passed), or its code panicked.
    pub(super) fn run(mut self) {
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve()));
        if run.is_err() {
            // A bug, not an input: the member stops, and says so to every waiting task.
            tracing::error!("raft: the driver panicked; the member stops");
            let mut state = self.shared.lock();
            state.close_ending_requests();
            for waker in state.leader_wakers.drain(..) {
                waker.wake();
            }
            for read in state.reads.values_mut() {
                if let Some(waker) = read.waker.take() {
                    waker.wake();
                }
            }
            drop(state);
            self.shared.report_losses();
        }
        self.stop();
    }

    /// The loop: until the node has left (or the leave bound passed).
    fn serve(&mut self) {
        let mut left_by: Option<StdInstant> = None;
        let mut left = false;
        let mut disk_failed = false;
        loop {
            let turn = self.turn(&mut left_by, &mut left);
            let mut unreachable = Vec::new();
            for (name, to, bytes) in &turn.sends {
                if let Err(error) = self.transport.send_to(*to, bytes) {
                    tracing::debug!(%to, %error, "raft: packet not sent");
                    unreachable.push(name);
                }
            }
            if !unreachable.is_empty() {
                // raft-rs stops streaming to them and probes again.
                let mut state = self.shared.lock();
                for name in unreachable {
                    state.node.report_unreachable(name);
                }
            }
            let wrote = !turn.batches.is_empty();
            // A member that left still makes durable what it already decided (its votes and
            // acknowledgements stay held back until then); only a failed disk stops writing.
            if wrote && !disk_failed && !self.persist(turn.batches) {
                disk_failed = true;
                left = true;
            }
            self.shared.report_losses();
            if turn.done {
                break;
            }
            if !wrote {
                self.wait(turn.next);
            }
            // Otherwise what the batches held back goes out in the next turn, at once.
        }
    }

    /// Writes `batches` in order, each durable before the node hears it is (the state lock is
    /// taken only to tell it). Returns `false` if the log could not be written: the member
    /// then stops, ending every request.
    fn persist(&mut self, batches: Vec<PersistBatch>) -> bool {
        for batch in batches {
            if let Err(error) = self.disk.write(&batch) {
                // Without its log on disk this member must not answer as if it had it.
                tracing::error!(%error, "raft: the log could not be written; the member stops");
                self.shared.lock().close_ending_requests();
                return false;
            }
            let mut state = self.shared.lock();
            let now = state.now();
            state.node.persisted(now, batch.seq);
            if self.disk.log_bytes() > COMPACT_LOG_BYTES {
                state.node.compact_now();
            }
        }
        true
    }

    /// Closes the transport and ends the streams; the node is stopped.
    fn stop(&mut self) {
        async_io::block_on(self.transport.close());
        let wakers = {
            let mut state = self.shared.lock();
            state.stopped = true;
            state.views.clear();
            for listeners in state.listeners.values_mut() {
                listeners.events.clear();
            }
            std::mem::take(&mut state.closed_wakers)
        };
        for waker in wakers {
            waker.wake();
        }
    }

    /// Feeds the node its timers, applies its events; returns what to send and to write.
    fn turn(&mut self, left_by: &mut Option<StdInstant>, left: &mut bool) -> Turn {
        let mut state = self.shared.lock();
        let now = state.now();
        if state.node.poll_timeout().is_none_or(|t| t <= now) {
            state.node.handle_timeout(now);
        }
        let mut sends = Vec::new();
        let mut batches = Vec::new();
        loop {
            let mut progress = false;
            while let Some(batch) = state.node.poll_persist() {
                progress = true;
                batches.push(batch);
            }
            while let Some(event) = state.node.poll_event() {
                progress = true;
                match event {
                    RaftEvent::Compact(record) => {
                        if let Err(error) = self.disk.compact(&record) {
                            tracing::warn!(%error, "raft: snapshot not kept");
                        }
                    }
                    RaftEvent::Left => *left = true,
                    other => state.take(other),
                }
            }
            while let Some((to, packet)) = state.node.poll_transmit() {
                progress = true;
                if let Some(addr) = state.peers.get(&to) {
                    sends.push((to, *addr, encode_packet(self.cluster, &packet)));
                }
            }
            if !progress {
                break;
            }
        }
        // Timeouts of waiting requests.
        let std_now = StdInstant::now();
        let expired: Vec<_> = state
            .records
            .iter()
            .filter(|(_, r)| r.deadline.is_some_and(|d| d <= std_now))
            .map(|(id, _)| *id)
            .collect();
        for request in expired {
            state.fail(request, LockError::Timeout);
            if let Some(record) = state.records.get_mut(&request) {
                record.deadline = None;
            }
            let now = state.now();
            state.node.cancel(now, request.0);
        }
        if state.closed && left_by.is_none() {
            *left_by = Some(std_now + LEAVE_BOUND);
        }
        let done = state.closed && (*left || left_by.is_some_and(|t| std_now >= t));
        let base = state.base;
        let mut next = state
            .node
            .poll_timeout()
            .map(|t| base + Duration::from_nanos(t.as_nanos()));
        for d in state.records.values().filter_map(|r| r.deadline) {
            next = Some(next.map_or(d, |n| n.min(d)));
        }
        if let Some(t) = *left_by {
            next = Some(next.map_or(t, |n| n.min(t)));
        }
        Turn {
            sends,
            batches,
            next,
            done,
        }
    }

    /// Waits for a datagram, the next deadline or a ring; takes in what arrived.
    fn wait(&mut self, next: Option<StdInstant>) {
        let deadline = next.unwrap_or_else(|| StdInstant::now() + Duration::from_secs(1));
        let received = async_io::block_on(async {
            let recv = self.transport.recv().fuse();
            let timer = Timer::at(deadline);
            let ring = self.ring.recv();
            futures::pin_mut!(recv, ring);
            match select(recv, select(timer, ring)).await {
                Either::Left((datagram, _)) => Some(datagram),
                Either::Right(_) => None,
            }
        });
        while self.ring.try_recv().is_ok() {}
        match received {
            Some(Ok(datagram)) => {
                let packet = match decode_packet(self.cluster, &datagram.bytes) {
                    Ok(packet) => packet,
                    Err(error) => {
                        tracing::debug!(from = %datagram.from, %error, "raft: datagram dropped");
                        return;
                    }
                };
                let mut state = self.shared.lock();
                let now = state.now();
                state.node.handle_packet(now, packet);
            }
            Some(Err(error)) => {
                tracing::debug!(%error, "raft: receive failed");
                std::thread::sleep(Duration::from_millis(10));
            }
            None => {}
        }
    }
}
