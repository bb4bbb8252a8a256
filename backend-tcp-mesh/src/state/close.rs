//! Closing the mesh: stop, flush within the bound, FIN everything.

use std::task::{Context, Poll};

use tracing::debug;

use super::State;
use crate::wake::Token;

impl State {
    /// Starts closing: no more accepts, sends or receives. Returns whether any frame waits.
    pub(crate) fn begin_close(&mut self) -> bool {
        self.closing = true;
        self.listener.close();
        self.to_self.clear(&self.total);
        self.bell.notify();
        self.alert_sleepers();
        self.conns
            .values()
            .any(|c| c.queue.data_frames() > 0 && !c.queue.is_held())
    }

    /// Flushes what it can during close (completing connects too). Returns whether every
    /// queued frame is written.
    pub(crate) fn flush_for_close(&mut self) -> bool {
        self.bell.take();
        let pending: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.queue.data_frames() > 0 && !c.queue.is_held())
            .map(|(token, _)| *token)
            .collect();
        for token in pending {
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            let waker = conn.waker.clone();
            let mut cx = Context::from_waker(&waker);
            let result = match conn.poll_dial(Some(&mut cx)) {
                Poll::Pending => continue,
                Poll::Ready(Ok(())) => conn.flush(Some(&mut cx)).map(|_| ()),
                Poll::Ready(Err(e)) => Err(e),
            };
            if let Err(error) = result {
                debug!(%error, "connection failed while flushing at close");
                self.remove(token);
            }
        }
        // Frames held behind a handshake that will not finish now are not waited for.
        self.conns
            .values()
            .all(|c| c.queue.data_frames() == 0 || c.queue.is_held())
    }

    /// Ends close: FIN on every connection, then drops them all.
    pub(crate) fn finish_close(&mut self) {
        for (_, mut conn) in std::mem::take(&mut self.conns) {
            self.stats.dropped_in_flight += conn.queue.data_frames() as u64;
            conn.shutdown_write();
            conn.discard_input();
        }
        self.peers.clear();
        self.work.clear();
        self.next_deadline = None;
        self.bell.notify();
        self.alert_sleepers();
    }
}
