//! Hellos, proofs and duplicates: authenticating a connection (on a mesh with a cluster key),
//! registering it under its member's listen address (and, for a connection we dialled under
//! another address, under that alias too), and keeping one connection per member pair.

use std::net::SocketAddr;
use std::time::Instant;

use conclave_lock_api::seal::{KeyId, Notice, ProofError};
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::Datagram;
use tracing::{debug, warn};

use super::State;
use crate::conn::Sent;
use crate::frame::{self, Hello};
use crate::wake::Token;

/// A peer that holds another key, or none: what the member is told (see
/// [`State::auth_failed`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct Rejected {
    /// The peer's listen address, from its hello: the notice's `from`.
    pub(super) from: SocketAddr,
    /// The cluster the notice is encoded for.
    pub(super) cluster: ClusterId,
    /// The notice: our key (rejected), the peer's key.
    pub(super) notice: Notice,
}

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
        conn.last_rx = Some(now);
        let peer = hello.addr;
        match (self.credentials.auth(), hello.seal) {
            (None, None) => self.greeted(token, hello, now),
            (None, Some(seal)) => {
                let rejected = Rejected {
                    from: peer,
                    cluster: seal.cluster,
                    notice: Notice {
                        rejected: None,
                        theirs: Some(seal.key),
                        session: [0; 16],
                    },
                };
                let what = "it has a cluster key, this member none";
                self.auth_failed(token, now, what, Some(rejected));
            }
            (Some(auth), None) => {
                let rejected = Rejected {
                    from: peer,
                    cluster: auth.cluster,
                    notice: Notice {
                        rejected: Some(auth.keys.primary()),
                        theirs: None,
                        session: auth.session,
                    },
                };
                let what = "it has no cluster key (hello version 1)";
                self.auth_failed(token, now, what, Some(rejected));
            }
            (Some(auth), Some(seal)) if seal.cluster != auth.cluster => {
                self.auth_failed(token, now, "its hello is another cluster's", None);
            }
            (Some(auth), Some(_)) => {
                // Our proof goes out now, ahead of any data frame; theirs must come next, and
                // our data frames wait for it.
                let keys = auth.keys.clone();
                let Some(conn) = self.conns.get_mut(&token) else {
                    return;
                };
                let outbound = conn.outbound;
                let Some(handshake) = conn.handshake.as_mut() else {
                    return;
                };
                handshake.theirs = Some((hello, payload.to_vec()));
                let Some(transcript) = handshake.transcript(outbound, outbound) else {
                    return;
                };
                conn.queue
                    .push_control(frame::encode_proof(&keys.prove(&transcript)));
                debug!(%peer, outbound, "hello received; proving the cluster key");
                self.schedule(token);
            }
        }
    }

    /// Handles a keyed connection's second frame: the peer's proof of the cluster key over
    /// both hellos. Only a valid proof lets the connection be registered (or displace or
    /// block another) and its frames be delivered.
    pub(super) fn authenticate(&mut self, token: Token, payload: &[u8], now: Instant) {
        let (Some(auth), Some(conn)) = (self.credentials.auth(), self.conns.get_mut(&token)) else {
            return;
        };
        let outbound = conn.outbound;
        let Some(handshake) = conn.handshake.as_ref() else {
            return;
        };
        let (Some((hello, _)), Some(transcript)) = (
            handshake.theirs.as_ref(),
            handshake.transcript(outbound, !outbound),
        ) else {
            return;
        };
        let hello = *hello;
        let Some(proof) = frame::decode_proof(payload) else {
            self.auth_failed(token, now, "the frame after its hello is not a proof", None);
            return;
        };
        match auth.keys.verify(&transcript, &proof) {
            Ok(()) => {
                conn.handshake = None;
                conn.last_rx = Some(now);
                conn.queue.release();
                self.schedule(token);
                self.greeted(token, hello, now);
            }
            Err(ProofError::UnknownKey(theirs)) => {
                let rejected = Rejected {
                    from: hello.addr,
                    cluster: auth.cluster,
                    notice: Notice {
                        rejected: Some(auth.keys.primary()),
                        theirs: Some(theirs),
                        session: auth.session,
                    },
                };
                let what = "it proved another cluster key";
                self.auth_failed(token, now, what, Some(rejected));
            }
            Err(_) => {
                self.auth_failed(token, now, "invalid proof of the cluster key", None);
            }
        }
    }

    /// Closes a connection whose peer did not prove the cluster key: counted, logged at most
    /// every few seconds (`TCP peer X failed authentication (key id N)`), the address it was
    /// dialled at put in backoff. With `rejected`, its notice is delivered as a datagram from
    /// the peer's listen address (at most `MAX_NOTICES` wait), so the member learns that
    /// the peer holds another key (or none).
    pub(super) fn auth_failed(
        &mut self,
        token: Token,
        now: Instant,
        what: &str,
        rejected: Option<Rejected>,
    ) {
        // Its queued frames count as lost here; it only lingers to close cleanly.
        let Some(mut conn) = self.remove(token) else {
            return;
        };
        self.stats.auth_failures += 1;
        let hello = conn
            .handshake
            .as_ref()
            .and_then(|h| h.theirs.as_ref())
            .map(|(hello, _)| *hello);
        let peer: Option<SocketAddr> = rejected
            .map(|r| r.from)
            .or(hello.map(|h| h.addr))
            .or(conn.member());
        let key: Option<KeyId> = match rejected {
            Some(r) => r.notice.theirs,
            None => hello.and_then(|h| h.seal).map(|s| s.key),
        };
        let key = key.map_or_else(|| "none".to_string(), |k| k.to_string());
        if let Some(suppressed) = self.credentials.auth_log(now) {
            let shown = peer.map_or_else(|| conn.peer_ip.to_string(), |p| p.to_string());
            warn!(peer = %shown, ip = %conn.peer_ip, key_id = %key, what, suppressed,
                "TCP peer {shown} failed authentication (key id {key}): {what}; connection closed");
        }
        // A seed dialled under an alias, or one that dialled us.
        for addr in conn
            .dialled
            .into_iter()
            .chain(peer.filter(|p| Some(*p) != conn.dialled))
        {
            self.discovery.refused(addr, what, false, now);
        }
        if let Some(addr) = conn.dialled {
            self.backoff(addr, now);
        }
        // FIN now (our proof, if any, went out before it), then read to the peer's FIN, within
        // close_timeout and 64 KiB: closing with its bytes unread would reset the connection,
        // and the peer could lose our proof, and with it the reason. A peer that sends more
        // (one that follows the handshake holds its data until our proof verifies) is reset.
        let _ = conn.queue.take_unsent();
        // Our hello and proof: a few dozen bytes the kernel takes (an error shows later).
        let _ = conn.flush(None);
        conn.keys.clear();
        conn.handshake = None;
        conn.shutdown_write();
        conn.draining = true;
        conn.rejected = true;
        conn.scheduled = false;
        conn.deadline = now.checked_add(self.config.close_timeout);
        self.note_deadline(conn.deadline);
        self.conns.insert(token, conn);
        self.schedule(token);
        if let Some(rejected) = rejected {
            let notice = Datagram {
                from: rejected.from,
                bytes: rejected.notice.encode(rejected.cluster),
            };
            if self.credentials.push_notice(notice) {
                self.bell.notify();
            }
        }
    }

    /// The peer said hello (and, on a keyed mesh, proved the key): registers the connection
    /// under its member's address, resolving a duplicate.
    fn greeted(&mut self, token: Token, hello: Hello, now: Instant) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        conn.hello = Some(hello);
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
        self.discovery.greeted(hello.addr);
        if let Some(dialled) = dialled {
            self.discovery.greeted(dialled);
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
