//! Hellos and duplicates: registering a connection under its member's listen address, and
//! keeping one connection per member pair.

use std::time::Instant;

use tracing::debug;

use super::State;
use crate::frame::Hello;
use crate::wake::Token;

impl State {
    /// Handles the first frame of a connection: it must be a valid hello.
    pub(super) fn greet(&mut self, token: Token, payload: &[u8], now: Instant) {
        let hello = match Hello::decode(payload) {
            Ok(hello) if hello.addr == self.local => {
                self.violation(token, now, "hello claims our own address");
                return;
            }
            Ok(hello) => hello,
            Err(error) => {
                self.violation(token, now, &error.to_string());
                return;
            }
        };
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.hello = Some(hello);
        if !conn.draining {
            conn.deadline = None;
        }
        if conn.outbound {
            let dialled = conn.key.unwrap_or(hello.addr);
            if hello.addr != dialled {
                debug!(%dialled, says = %hello.addr, "member listens under another address");
            }
            self.peers.entry(dialled).or_default().succeeded();
            debug!(peer = %hello.addr, "connected");
            return;
        }
        conn.key = Some(hello.addr);
        let peer = self.peers.entry(hello.addr).or_default();
        peer.succeeded();
        match peer.conn {
            None => {
                peer.conn = Some(token);
                debug!(peer = %hello.addr, "accepted");
            }
            Some(old) => self.resolve(old, token, hello, now),
        }
    }

    /// Two connections to one member: keeps one and winds the other down.
    ///
    /// A peer whose instance changed restarted, and a second inbound connection means the peer
    /// gave up the first: the newer connection wins. Otherwise this is a simultaneous connect,
    /// and both ends keep the connection dialled by the lower listen address.
    fn resolve(&mut self, old: Token, new: Token, hello: Hello, now: Instant) {
        let Some(old_conn) = self.conns.get(&old) else {
            self.peers.entry(hello.addr).or_default().conn = Some(new);
            return;
        };
        let restarted = old_conn.hello.is_some_and(|h| h.instance != hello.instance);
        let replaced = restarted || !old_conn.outbound;
        let keep_new = replaced || hello.addr < self.local;
        if replaced {
            self.stats.replaced += 1;
        } else {
            self.stats.duplicates_resolved += 1;
        }
        let (winner, loser) = if keep_new { (new, old) } else { (old, new) };
        debug!(peer = %hello.addr, restarted, kept_new = keep_new, "duplicate connection resolved");
        self.peers.entry(hello.addr).or_default().conn = Some(winner);
        self.retire(loser, winner, now);
    }

    /// Winds a duplicate down: its untouched frames move to `winner`; it flushes the rest,
    /// sends FIN and is read to the end, so nothing it already carries is lost.
    fn retire(&mut self, loser: Token, winner: Token, now: Instant) {
        let Some(mut conn) = self.conns.remove(&loser) else {
            return;
        };
        let moved = conn.queue.take_unsent();
        // Even a connect still in progress completes and says hello, so the peer sees a
        // duplicate to wind down rather than a connection that hangs up unannounced.
        let deadline = now + self.config.close_timeout;
        conn.draining = true;
        conn.deadline = Some(deadline);
        conn.scheduled = false;
        self.note_deadline(Some(deadline));
        self.conns.insert(loser, conn);
        self.schedule(loser);
        let bound = self.config.send_queue_bytes;
        if let Some(target) = self.conns.get_mut(&winner) {
            for frame in moved {
                if !target.requeue(frame, bound) {
                    self.stats.dropped_queue_full += 1;
                }
            }
            self.stats.peak_queue_bytes = self.stats.peak_queue_bytes.max(target.queue.bytes());
        }
        self.schedule(winner);
    }
}
