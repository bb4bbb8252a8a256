//! Hellos and duplicates: registering a connection under its member's listen address (and, for
//! a connection we dialled under another address, under that alias too), and keeping one
//! connection per member pair.

use std::time::Instant;

use tracing::debug;

use super::State;
use crate::conn::Sent;
use crate::frame::Hello;
use crate::wake::Token;

/// How two connections to one member were resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// The old connection is gone (closed, reset, winding down): the new one replaces it.
    Replaced,
    /// Both ends dialled at once: the connection dialled by the lower listen address stays
    /// (`true`: the new one).
    Simultaneous(bool),
    /// The old connection is live and was not part of a simultaneous connect: it stays.
    Refused,
}

impl State {
    /// Handles the first frame of a connection: it must be a valid hello, naming a dialable
    /// address other than ours and, on an inbound connection, the IP the connection comes from.
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
        // Ports differ (an inbound connection comes from an ephemeral one); the IP must not.
        // An outbound connection goes where we dialled: its hello may name another address
        // (the dialled one is then an alias, such as a port forward to a seed).
        if !conn.outbound && hello.addr.ip().to_canonical() != conn.peer_ip.to_canonical() {
            let what = format!("hello claims {} from {}", hello.addr, conn.peer_ip);
            self.violation(token, now, &what);
            return;
        }
        conn.hello = Some(hello);
        conn.last_rx = Some(now);
        if conn.draining {
            // Resolved as a duplicate before its hello: it only winds down, by its deadline.
            return;
        }
        conn.deadline = if conn.outbound {
            None
        } else {
            now.checked_add(self.config.idle_timeout)
        };
        let (deadline, outbound, dialled) = (conn.deadline, conn.outbound, conn.dialled);
        self.note_deadline(deadline);
        if let Some(dialled) = dialled {
            self.peers.entry(dialled).or_default().succeeded();
            if dialled != hello.addr {
                debug!(%dialled, member = %hello.addr, "member dialled under an alias");
            }
        }
        match self
            .peers
            .get(&hello.addr)
            .and_then(|p| p.conn)
            .filter(|old| *old != token)
        {
            None => {
                self.register(token, hello.addr);
                self.peers.entry(hello.addr).or_default().succeeded();
                debug!(peer = %hello.addr, outbound, "connected");
            }
            Some(old) => self.resolve(old, token, hello, now),
        }
    }

    /// Two connections to one member: keeps one, and winds the other down or closes it.
    ///
    /// - The old one is gone (the peer's FIN, reset or an error is waiting on it, or it is
    ///   closing): the new one replaces it, whatever its instance.
    /// - Both are the same instance's, and each end dialled one: a simultaneous connect. Both
    ///   ends keep the one dialled by the lower listen address, so they agree.
    /// - Otherwise the old, live one stays. A newcomer of the same instance (a second
    ///   connection, or our second dial under an alias) is wound down, its addresses joining
    ///   the old one. A newcomer of another instance claims a member that is connected and
    ///   alive: it is closed at once, its frames unread, and an alias it was dialled under
    ///   goes into backoff.
    fn resolve(&mut self, old: Token, new: Token, hello: Hello, now: Instant) {
        let (Some(old_conn), Some(new_conn)) = (self.conns.get(&old), self.conns.get(&new)) else {
            self.register(new, hello.addr);
            return;
        };
        let same_member = old_conn.hello.is_none_or(|h| h.instance == hello.instance);
        let outcome = if !old_conn.is_live() {
            Outcome::Replaced
        } else if same_member && old_conn.outbound != new_conn.outbound {
            let new_dialled_by_lower = if new_conn.outbound {
                self.local < hello.addr
            } else {
                hello.addr < self.local
            };
            Outcome::Simultaneous(new_dialled_by_lower)
        } else {
            Outcome::Refused
        };
        debug!(peer = %hello.addr, ?outcome, same_member, "duplicate connection resolved");
        let keep_new = match outcome {
            Outcome::Replaced => {
                self.stats.replaced += 1;
                true
            }
            Outcome::Simultaneous(keep_new) => {
                self.stats.duplicates_resolved += 1;
                keep_new
            }
            Outcome::Refused => {
                self.stats.duplicates_refused += 1;
                false
            }
        };
        if !keep_new && !same_member {
            if let Some(dialled) = self.close_now(new).and_then(|conn| conn.dialled) {
                self.backoff(dialled, now);
            }
            return;
        }
        let (winner, loser) = if keep_new { (new, old) } else { (old, new) };
        // One member: the winner takes every address the loser was registered under.
        let keys = self
            .conns
            .get_mut(&loser)
            .map(|conn| std::mem::take(&mut conn.keys))
            .unwrap_or_default();
        for key in keys {
            self.register(winner, key);
        }
        self.register(winner, hello.addr);
        if keep_new {
            self.peers.entry(hello.addr).or_default().succeeded();
        }
        self.retire(loser, winner, now);
    }

    /// Winds a duplicate down: its untouched frames move to `winner`; it flushes the rest,
    /// sends FIN and is read to the end (frames read meanwhile are delivered), within
    /// `close_timeout`. What it still holds then is lost and counted.
    fn retire(&mut self, loser: Token, winner: Token, now: Instant) {
        let Some(mut conn) = self.conns.remove(&loser) else {
            return;
        };
        let moved = conn.queue.take_unsent();
        // Even a connect still in progress completes and says hello, so the peer sees a
        // duplicate to wind down rather than a connection that hangs up unannounced.
        let deadline = now.checked_add(self.config.close_timeout);
        conn.draining = true;
        conn.deadline = deadline;
        conn.scheduled = false;
        self.note_deadline(deadline);
        self.conns.insert(loser, conn);
        self.schedule(loser);
        let (bound, budget) = (self.config.send_queue_bytes, self.config.max_queued_bytes);
        if let Some(target) = self.conns.get_mut(&winner) {
            for frame in moved {
                match target.requeue(frame, bound, budget) {
                    Sent::Full => self.stats.dropped_queue_full += 1,
                    Sent::OverBudget => self.stats.dropped_budget += 1,
                    Sent::Written | Sent::Queued | Sent::QueuedFirst => {}
                }
            }
            self.stats.peak_queue_bytes = self.stats.peak_queue_bytes.max(target.queue.bytes());
        }
        self.schedule(winner);
    }
}
