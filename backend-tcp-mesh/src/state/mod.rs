//! The mesh's state and the steps on it: accepting, dialling, sending, reading, timeouts. The
//! handshake and duplicate resolution live in `handshake`, closing in `close`, what happened at
//! each seed in `discovery`.
//!
//! All of it is synchronous and non-blocking, called with the mesh's lock held: by
//! `send_to`/`send_discovery` for sends, by `recv` ([`State::drive`]) for everything else, and
//! by `close`. In [`Mode::Async`], a socket that would block is registered with the reactor
//! under its own waker, whose ring ([`Doorbell`]) tells the next `drive` which sockets to
//! serve. In [`Mode::Blocking`] (Unix), nothing is registered: the blocking receive polls the
//! sockets itself and schedules the ready ones (see `watch`).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use async_io::Async;
use conclave_lock_api::seal::Keyring;
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::{Datagram, DiscoveryReport};
use tracing::{debug, trace, warn};

use crate::config::TcpConfig;
use crate::conn::{Conn, Handshake, Received, Sent};
use crate::peer::Peer;
use crate::queue::Total;
use crate::stats::TcpStats;
use crate::wake::{Doorbell, Token, LISTENER};
use credentials::{Auth, Credentials};
use discovery::Discovery;
use listener::{Accepted, Listener};
use loopback::{Loopback, Refused};

mod close;
mod credentials;
mod discovery;
mod handshake;
mod listener;
mod loopback;
#[cfg(unix)]
mod watch;

#[cfg(unix)]
use rustix::event::PollFlags;
#[cfg(unix)]
pub(crate) use watch::Handle;
#[cfg(unix)]
use watch::Sleepers;

/// Who waits for the sockets a drive leaves blocked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The async-io reactor: a socket that would block registers its waker (`Transport::recv`).
    Async,
    /// The caller's own `poll(2)`: nothing is registered (`BlockingRecv`).
    #[cfg_attr(not(unix), allow(dead_code))]
    Blocking,
}

/// What one [`State::drive`] came to.
#[derive(Debug)]
pub(crate) enum Step {
    /// A frame for the caller.
    Datagram(Datagram),
    /// Nothing now; drive again when the doorbell rings or at this deadline.
    Idle(Option<Instant>),
    /// The mesh is closed.
    Closed,
}

/// Everything behind the mesh's lock.
#[derive(Debug)]
pub(crate) struct State {
    config: TcpConfig,
    local: SocketAddr,
    /// Our hello and keys, and what failed handshakes left to deliver.
    credentials: Credentials,
    /// What happened at each seed.
    discovery: Discovery,
    bell: Arc<Doorbell>,
    listener: Listener,
    conns: BTreeMap<Token, Conn>,
    peers: HashMap<SocketAddr, Peer>,
    /// Sockets to serve, each at most once (see [`Conn::scheduled`]).
    work: VecDeque<Token>,
    next_token: Token,
    /// The earliest deadline of any connection or of the accept pause (may be stale-early).
    next_deadline: Option<Instant>,
    /// Frames sent to our own address (counted in `total` too).
    to_self: Loopback,
    /// Data bytes queued and not yet written over every connection, plus those to ourselves:
    /// what `max_queued_bytes` bounds. Each connection's queue keeps its share up to date
    /// (see [`Total`]), and so does `to_self`.
    total: Total,
    closing: bool,
    /// A blocking drive served sockets without registering them with the reactor: the next
    /// async drive serves every socket once, which registers those still blocked.
    unarmed: bool,
    /// The threads blocked in `poll(2)`, and what they watch.
    #[cfg(unix)]
    sleepers: Sleepers,
    stats: TcpStats,
}

impl State {
    /// The state of a mesh listening on `listener` at `local`.
    pub(crate) fn new(
        config: TcpConfig,
        listener: Async<TcpListener>,
        local: SocketAddr,
        instance: u64,
        bell: Arc<Doorbell>,
    ) -> Self {
        Self {
            discovery: Discovery::new(&config.seeds, local),
            config,
            local,
            credentials: Credentials::new(local, instance),
            listener: Listener::new(listener, bell.waker(LISTENER)),
            bell,
            conns: BTreeMap::new(),
            peers: HashMap::new(),
            work: VecDeque::from([LISTENER]),
            next_token: LISTENER + 1,
            next_deadline: None,
            to_self: Loopback::default(),
            total: Total::default(),
            closing: false,
            unarmed: false,
            #[cfg(unix)]
            sleepers: Sleepers::default(),
            stats: TcpStats::default(),
        }
    }

    /// Makes every connection from now on prove a key of `keys` (see
    /// `Transport::use_keyring`). Connections already open were made without: they are closed.
    pub(crate) fn use_keyring(&mut self, cluster: ClusterId, keys: Keyring, session: [u8; 16]) {
        self.discovery.keyed(cluster);
        self.credentials.set_auth(Auth {
            cluster,
            keys,
            session,
        });
        let tokens: Vec<Token> = self.conns.keys().copied().collect();
        for token in tokens {
            self.close_now(token);
        }
    }

    /// Takes `conn` in, its handshake (if keyed) started: data frames wait for our proof.
    fn insert(&mut self, token: Token, mut conn: Conn, handshake: Option<Handshake>) {
        if handshake.is_some() {
            conn.queue.hold();
        }
        conn.handshake = handshake;
        self.conns.insert(token, conn);
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> TcpStats {
        TcpStats {
            connections: self.conns.len(),
            // A connection registered under an alias too is one member.
            peers: self
                .peers
                .values()
                .filter_map(|p| p.conn)
                .collect::<BTreeSet<Token>>()
                .into_iter()
                .filter_map(|token| self.conns.get(&token))
                .filter(|c| c.hello.is_some() && !c.draining)
                .count(),
            queued_bytes: self.queued_bytes(),
            ..self.stats
        }
    }

    /// Every seed and what happened there (see `Transport::discovery_report`).
    pub(crate) fn discovery_report(&self) -> Vec<DiscoveryReport> {
        self.discovery.report()
    }

    /// The mesh-wide total of queued bytes (see [`State::total`]).
    fn queued_bytes(&self) -> usize {
        let total = self.total.get();
        debug_assert_eq!(
            total,
            self.conns
                .values()
                .map(|c| c.queue.data_bytes())
                .sum::<usize>()
                + self.to_self.bytes(),
            "the running total matches the queues"
        );
        total
    }

    /// Sends one frame to the member listening at `to` (see `Transport::send_to`).
    ///
    /// # Errors
    /// `InvalidInput` if `payload` is longer than `max_frame`; `NotConnected` once closing.
    pub(crate) fn send(&mut self, to: SocketAddr, payload: &[u8], now: Instant) -> io::Result<()> {
        let result = self.send_one(to, payload, now);
        self.alert_sleepers();
        result
    }

    fn send_one(&mut self, to: SocketAddr, payload: &[u8], now: Instant) -> io::Result<()> {
        if payload.len() > self.config.max_frame {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "frame of {} bytes exceeds max_frame {}",
                    payload.len(),
                    self.config.max_frame
                ),
            ));
        }
        if self.closing {
            return Err(closed());
        }
        self.discovery.sending(payload);
        if to == self.local {
            self.send_to_self(payload);
            return Ok(());
        }
        let token = match self.peers.get(&to).and_then(|p| p.conn) {
            Some(token) => token,
            None => match self.dial(to, now) {
                Some(token) => token,
                None => {
                    self.stats.dropped_unreachable += 1;
                    trace!(%to, "frame dropped: member unreachable or in backoff");
                    return Ok(());
                }
            },
        };
        let (bound, budget) = (self.config.send_queue_bytes, self.config.max_queued_bytes);
        let Some(conn) = self.conns.get_mut(&token) else {
            return Ok(());
        };
        match conn.send(payload, bound, budget) {
            Ok(Sent::Full) => {
                self.stats.dropped_queue_full += 1;
                trace!(%to, "frame dropped: send queue full");
            }
            Ok(Sent::OverBudget) => {
                self.stats.dropped_budget += 1;
                trace!(%to, "frame dropped: max_queued_bytes queued over all members");
            }
            Ok(sent) => {
                self.stats.frames_sent += 1;
                self.stats.peak_queue_bytes = self.stats.peak_queue_bytes.max(conn.queue.bytes());
                if sent == Sent::QueuedFirst {
                    // Only a driver flushes: tell it there is something to flush.
                    self.bell.ring(token);
                }
            }
            Err(error) => {
                self.stats.dropped_in_flight += 1;
                self.lost(token, now, &error);
            }
        }
        Ok(())
    }

    /// Sends one frame to every seed and every member with a connection, but not to us, and
    /// once per connection (a seed may be an alias of a member connected under its own
    /// address).
    ///
    /// # Errors
    /// As [`State::send`].
    pub(crate) fn send_discovery(&mut self, payload: &[u8], now: Instant) -> io::Result<()> {
        let mut targets: BTreeSet<SocketAddr> = self.config.seeds.iter().copied().collect();
        targets.extend(
            self.peers
                .iter()
                .filter(|(_, p)| p.conn.is_some())
                .map(|(addr, _)| *addr),
        );
        targets.remove(&self.local);
        let mut reached = BTreeSet::new();
        let result =
            targets
                .into_iter()
                .try_for_each(|to| match self.peers.get(&to).and_then(|p| p.conn) {
                    Some(token) if !reached.insert(token) => Ok(()),
                    _ => self.send_one(to, payload, now),
                });
        self.alert_sleepers();
        result
    }

    /// Does all the I/O that is ready: accepts, completes connects, flushes, reads, enforces
    /// deadlines; returns the first whole frame. Frames not returned stay in their
    /// connection's buffer, so dropping the caller between two drives loses nothing.
    ///
    /// Serves the sockets the doorbell names and those already scheduled (by an earlier drive,
    /// or by the blocking receive's `poll`). `mode` says who waits for the sockets left
    /// blocked.
    pub(crate) fn drive(&mut self, now: Instant, mode: Mode) -> Step {
        let step = self.drive_once(now, mode);
        self.alert_sleepers();
        step
    }

    fn drive_once(&mut self, now: Instant, mode: Mode) -> Step {
        if self.closing {
            return Step::Closed;
        }
        match mode {
            Mode::Async if self.unarmed => {
                self.unarmed = false;
                self.schedule(LISTENER);
                let tokens: Vec<Token> = self.conns.keys().copied().collect();
                for token in tokens {
                    self.schedule(token);
                }
            }
            Mode::Blocking if !self.unarmed => {
                self.unarmed = true;
                // An async receive waiting meanwhile re-registers what this drive consumes.
                self.bell.notify();
            }
            Mode::Async | Mode::Blocking => {}
        }
        if let Some(notice) = self.credentials.pop_notice() {
            return Step::Datagram(notice);
        }
        if let Some(bytes) = self.to_self.pop(&self.total) {
            self.stats.frames_received += 1;
            return Step::Datagram(Datagram {
                from: self.local,
                bytes,
            });
        }
        for token in self.bell.take() {
            self.schedule(token);
        }
        if self.next_deadline.is_some_and(|at| at <= now) {
            self.expire(now);
        }
        while let Some(token) = self.work.pop_front() {
            if token == LISTENER {
                self.listener.unschedule();
                self.accept(now, mode);
                continue;
            }
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            conn.scheduled = false;
            if let Some(datagram) = self.serve(token, now, mode) {
                return Step::Datagram(datagram);
            }
        }
        // A handshake that failed in this drive may have left a notice.
        if let Some(notice) = self.credentials.pop_notice() {
            return Step::Datagram(notice);
        }
        Step::Idle(self.next_deadline)
    }

    fn send_to_self(&mut self, payload: &[u8]) {
        let (bound, budget) = (self.config.send_queue_bytes, self.config.max_queued_bytes);
        match self.to_self.push(payload, bound, budget, &self.total) {
            Ok(()) => {
                self.stats.frames_sent += 1;
                self.bell.notify();
            }
            Err(Refused::Full) => self.stats.dropped_queue_full += 1,
            Err(Refused::OverBudget) => self.stats.dropped_budget += 1,
        }
    }

    /// Without `poll(2)` there is no thread to alert.
    #[cfg(not(unix))]
    fn alert_sleepers(&mut self) {}

    /// For a thread about to block in `poll` until `wake_at` (`None`: no limit): the sockets
    /// to poll, appended to `out`. The thread counts as a sleeper until [`State::woke`].
    #[cfg(unix)]
    pub(crate) fn sleep(
        &mut self,
        wake_at: Option<Instant>,
        out: &mut Vec<(Token, Handle, PollFlags)>,
    ) {
        let watched = watch::watch_list(self.listener.polled(), &self.conns);
        self.sleepers.sleep(watched, wake_at, out);
    }

    /// For a thread back from `poll`: it no longer sleeps; the sockets it found `ready` are
    /// served by the next drive.
    #[cfg(unix)]
    pub(crate) fn woke(&mut self, ready: impl IntoIterator<Item = Token>) {
        self.sleepers.woke();
        for token in ready {
            self.schedule(token);
        }
    }

    /// Polls every watched socket without waiting and schedules the ready ones (for
    /// `try_recv`, which does not block). Returns whether any was ready.
    ///
    /// # Errors
    /// Any error of `poll` but an interrupted call.
    #[cfg(unix)]
    pub(crate) fn poll_now(&mut self) -> io::Result<bool> {
        let ready = watch::poll_ready(watch::watch_list(self.listener.polled(), &self.conns))?;
        for token in &ready {
            self.schedule(*token);
        }
        Ok(!ready.is_empty())
    }

    /// Rings the doorbell's pipe if a thread blocked in `poll` must wake to keep the mesh
    /// moving (see `watch`). Called at the end of every step that changes the state.
    #[cfg(unix)]
    fn alert_sleepers(&mut self) {
        let busy = self.closing || !self.to_self.is_empty() || !self.work.is_empty();
        let watched = watch::watch_list(self.listener.polled(), &self.conns);
        if self.sleepers.alert(busy, self.next_deadline, watched) {
            self.bell.wake_blocked();
        }
    }

    /// How many connections are open in one direction (winding down included).
    fn count(&self, outbound: bool) -> usize {
        self.conns
            .values()
            .filter(|c| c.outbound == outbound)
            .count()
    }

    /// Opens a connection to `addr` and registers it, unless the address is in backoff or
    /// `max_connections` of our own dials are open (inbound connections do not count).
    fn dial(&mut self, addr: SocketAddr, now: Instant) -> Option<Token> {
        if self.peers.len() > 4 * self.config.max_connections {
            let max = self.config.reconnect_backoff_max;
            self.peers.retain(|_, p| !p.is_stale(now, max));
        }
        if self.peers.get(&addr).is_some_and(|p| p.in_backoff(now)) {
            return None;
        }
        if self.count(true) >= self.config.max_connections {
            debug!(%addr, "not dialling: max_connections outbound connections open");
            return None;
        }
        let token = self.token();
        // Past the end of the clock (a configuration that was not validated): no deadline.
        let deadline = now.checked_add(self.config.connect_timeout);
        self.stats.connect_attempts += 1;
        let waker = self.bell.waker(token);
        let dialled = self.credentials.new_hello().and_then(|(hello, handshake)| {
            let conn = Conn::dial(addr, self.local, waker, hello, deadline, self.total.clone())?;
            Ok((conn, handshake))
        });
        let (conn, handshake) = match dialled {
            Ok(pair) => pair,
            Err(error) => {
                debug!(%addr, %error, "connect failed");
                self.discovery.connect_failed(addr, &error, now);
                self.stats.connect_failures += 1;
                self.backoff(addr, now);
                return None;
            }
        };
        debug!(%addr, "dialling");
        self.note_deadline(deadline);
        self.insert(token, conn, handshake);
        self.peers.entry(addr).or_default().conn = Some(token);
        // The next drive, whichever its mode, checks on the connect and arranges to hear when
        // it completes (the reactor, or the blocking receive's poll).
        self.bell.ring(token);
        Some(token)
    }

    /// Accepts waiting connections until the listener would block.
    fn accept(&mut self, now: Instant, mode: Mode) {
        if !self.listener.may_accept(now) {
            return;
        }
        for _ in 0..64 {
            match self.listener.accept(now, mode) {
                Accepted::Stream(stream, from) => self.admit(stream, from, now),
                Accepted::Again => {}
                Accepted::Blocked => return,
                Accepted::Paused(until) => {
                    self.note_deadline(Some(until));
                    return;
                }
            }
        }
        // More may wait: serve the others first.
        self.schedule(LISTENER);
    }

    /// Takes an accepted connection in, or refuses it when `max_connections` inbound
    /// connections are open (our own dials do not count).
    fn admit(&mut self, stream: TcpStream, from: SocketAddr, now: Instant) {
        if self.count(false) >= self.config.max_connections {
            self.stats.rejected += 1;
            debug!(%from, "inbound connection refused: max_connections reached");
            return;
        }
        let stream = match stream.set_nodelay(true).and_then(|()| Async::new(stream)) {
            Ok(stream) => stream,
            Err(error) => {
                debug!(%from, %error, "inbound connection dropped");
                return;
            }
        };
        let (hello, handshake) = match self.credentials.new_hello() {
            Ok(hello) => hello,
            Err(error) => {
                debug!(%from, %error, "inbound connection dropped");
                return;
            }
        };
        let token = self.token();
        let deadline = now.checked_add(self.config.handshake_timeout);
        let waker = self.bell.waker(token);
        let conn = Conn::accepted(stream, from, waker, hello, deadline, self.total.clone());
        trace!(%from, token, "accepted");
        self.note_deadline(deadline);
        self.insert(token, conn, handshake);
        self.schedule(token);
    }

    /// Serves one connection: completes its connect, flushes, reads one frame.
    fn serve(&mut self, token: Token, now: Instant, mode: Mode) -> Option<Datagram> {
        let max_frame = self.config.max_frame;
        let conn = self.conns.get_mut(&token)?;
        let waker = (mode == Mode::Async).then(|| conn.waker.clone());
        let mut cx = waker.as_ref().map(Context::from_waker);
        if conn.rejected {
            if conn.discard_until_eof(cx.as_mut()) {
                trace!(token, "unauthenticated connection closed");
                self.conns.remove(&token);
            }
            return None;
        }
        if conn.is_dialing() {
            match conn.poll_dial(cx.as_mut()) {
                Poll::Pending => return None,
                Poll::Ready(Err(_)) if conn.draining => {
                    self.conns.remove(&token);
                    return None;
                }
                Poll::Ready(Err(error)) => {
                    self.dial_failed(token, now, &error);
                    return None;
                }
                Poll::Ready(Ok(())) if conn.draining => {}
                Poll::Ready(Ok(())) => {
                    let deadline = now.checked_add(self.config.handshake_timeout);
                    conn.deadline = deadline;
                    if let Some(dialled) = conn.dialled {
                        self.discovery.connected(dialled);
                    }
                    self.note_deadline(deadline);
                }
            }
        }
        let conn = self.conns.get_mut(&token)?;
        match conn.flush(cx.as_mut()) {
            Ok(true) if conn.draining && !conn.queue.is_held() => conn.shutdown_write(),
            Ok(_) => {}
            Err(error) => {
                self.lost(token, now, &error);
                return None;
            }
        }
        loop {
            let conn = self.conns.get_mut(&token)?;
            if conn.rejected {
                // Failed authentication just now: only read to its end from here on.
                self.schedule(token);
                return None;
            }
            match conn.read_frame(cx.as_mut(), max_frame) {
                Ok(Received::Frame(payload)) => match conn.hello {
                    Some(hello) => {
                        conn.last_rx = Some(now);
                        if let Some(dialled) = conn.dialled.filter(|d| *d != hello.addr) {
                            self.discovery.heard(dialled, &payload);
                        }
                        self.discovery.heard(hello.addr, &payload);
                        self.stats.frames_received += 1;
                        self.schedule(token);
                        return Some(Datagram {
                            from: hello.addr,
                            bytes: payload,
                        });
                    }
                    None if conn.handshake.as_ref().is_some_and(|h| h.theirs.is_some()) => {
                        self.authenticate(token, &payload, now);
                    }
                    None => self.greet(token, &payload, now),
                },
                Ok(Received::Blocked) => return None,
                Ok(Received::Again) => {
                    // Bytes keep coming: back to it after the others, in this drive.
                    self.schedule(token);
                    return None;
                }
                Ok(Received::Eof) if conn.draining => {
                    if conn.write_shut {
                        trace!(token, "duplicate connection wound down");
                        self.conns.remove(&token);
                    }
                    return None;
                }
                Ok(Received::Eof) => {
                    let error = io::Error::from(ErrorKind::UnexpectedEof);
                    self.lost(token, now, &error);
                    return None;
                }
                Ok(Received::TooLong(len)) => {
                    self.violation(token, now, &format!("length prefix of {len} bytes"));
                    return None;
                }
                Err(error) => {
                    self.lost(token, now, &error);
                    return None;
                }
            }
        }
    }

    /// A connect failed: the address goes into backoff.
    fn dial_failed(&mut self, token: Token, now: Instant, error: &io::Error) {
        let Some(conn) = self.remove(token) else {
            return;
        };
        self.stats.connect_failures += 1;
        if let Some(addr) = conn.dialled {
            debug!(%addr, %error, "connect failed");
            self.discovery.connect_failed(addr, error, now);
            self.backoff(addr, now);
        }
    }

    /// A connection broke or the peer hung up.
    fn lost(&mut self, token: Token, now: Instant, error: &io::Error) {
        let Some(conn) = self.remove(token) else {
            return;
        };
        if conn.hello.is_some() {
            debug!(peer = ?conn.member(), %error, "connection closed");
            return;
        }
        self.stats.handshake_failures += 1;
        debug!(peer = ?conn.member(), %error, "connection closed before its hello");
        if let Some(addr) = conn.dialled {
            let why = format!("the connection closed before its hello: {error}");
            self.discovery.refused(addr, why, true, now);
            self.backoff(addr, now);
        }
    }

    /// A peer broke the format: its connection is closed at once.
    fn violation(&mut self, token: Token, now: Instant, what: &str) {
        let Some(conn) = self.remove(token) else {
            return;
        };
        self.stats.violations += 1;
        warn!(peer = ?conn.member(), ip = %conn.peer_ip, what, "protocol violation; connection closed");
        if let Some(addr) = conn.dialled {
            let why = format!("it broke the mesh's format ({what}): is it a Conclave TCP mesh?");
            self.discovery.refused(addr, why, false, now);
            self.backoff(addr, now);
        }
    }

    /// Closes a connection at once (FIN, unless the peer's bytes are still unread), outside
    /// the graceful wind-down of a duplicate. Returns it.
    fn close_now(&mut self, token: Token) -> Option<Conn> {
        let mut conn = self.remove(token)?;
        conn.shutdown_write();
        conn.discard_input();
        Some(conn)
    }

    fn backoff(&mut self, addr: SocketAddr, now: Instant) {
        let (min, max) = (
            self.config.reconnect_backoff_min,
            self.config.reconnect_backoff_max,
        );
        self.peers.entry(addr).or_default().failed(now, min, max);
    }

    /// Closes connections past their deadline (a connect, a hello or a wind-down that took
    /// too long; an inbound connection idle for `idle_timeout`) and recomputes the next
    /// deadline.
    fn expire(&mut self, now: Instant) {
        let due: Vec<Token> = self
            .conns
            .iter()
            .filter(|(_, c)| c.deadline.is_some_and(|at| at <= now))
            .map(|(token, _)| *token)
            .collect();
        for token in due {
            let Some(conn) = self.conns.get(&token) else {
                continue;
            };
            if conn.draining {
                trace!(token, "duplicate connection closed at its deadline");
                self.remove(token);
            } else if conn.is_dialing() {
                let error = io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "no connection within connect_timeout ({:?})",
                        self.config.connect_timeout
                    ),
                );
                self.dial_failed(token, now, &error);
            } else if conn.handshake.as_ref().is_some_and(|h| h.theirs.is_some()) {
                self.auth_failed(token, now, "no proof of the cluster key in time", None);
            } else if conn.hello.is_none() {
                let error = io::Error::new(
                    ErrorKind::TimedOut,
                    format!(
                        "no hello within handshake_timeout ({:?})",
                        self.config.handshake_timeout
                    ),
                );
                self.lost(token, now, &error);
            } else if conn.outbound {
                if let Some(conn) = self.conns.get_mut(&token) {
                    conn.deadline = None;
                }
            } else {
                // Inbound and greeted: idle since its last frame?
                let idle_until = conn
                    .last_rx
                    .and_then(|at| at.checked_add(self.config.idle_timeout));
                if idle_until.is_some_and(|until| until <= now) {
                    self.stats.idle_closed += 1;
                    debug!(peer = ?conn.member(), "idle inbound connection closed");
                    self.close_now(token);
                } else if let Some(conn) = self.conns.get_mut(&token) {
                    conn.deadline = idle_until;
                }
            }
        }
        if self.listener.resumes_by(now) {
            self.schedule(LISTENER);
        }
        self.next_deadline = self
            .conns
            .values()
            .filter_map(|c| c.deadline)
            .chain(self.listener.paused_until())
            .min();
    }

    /// Removes a connection (closing its socket once dropped), unregistering it from every
    /// address it is registered under; its queued frames count as lost.
    fn remove(&mut self, token: Token) -> Option<Conn> {
        let conn = self.conns.remove(&token)?;
        for key in &conn.keys {
            if let Some(peer) = self.peers.get_mut(key) {
                if peer.conn == Some(token) {
                    peer.conn = None;
                }
                if peer.is_idle() {
                    self.peers.remove(key);
                }
            }
        }
        self.stats.dropped_in_flight += conn.queue.data_frames() as u64;
        Some(conn)
    }

    /// Registers a connection under a member address: frames to `addr` go on it.
    fn register(&mut self, token: Token, addr: SocketAddr) {
        let Some(conn) = self.conns.get_mut(&token) else {
            return;
        };
        if !conn.keys.contains(&addr) {
            conn.keys.push(addr);
        }
        self.peers.entry(addr).or_default().conn = Some(token);
    }

    fn schedule(&mut self, token: Token) {
        if token == LISTENER {
            if self.listener.schedule() {
                self.work.push_back(LISTENER);
            }
        } else if let Some(conn) = self.conns.get_mut(&token) {
            if !conn.scheduled {
                conn.scheduled = true;
                self.work.push_back(token);
            }
        }
    }

    fn note_deadline(&mut self, at: Option<Instant>) {
        if let Some(at) = at {
            self.next_deadline = Some(self.next_deadline.map_or(at, |d| d.min(at)));
        }
    }

    fn token(&mut self) -> Token {
        let token = self.next_token;
        self.next_token += 1;
        token
    }
}

/// The error of operations on a closed mesh.
pub(crate) fn closed() -> io::Error {
    io::Error::new(ErrorKind::NotConnected, "the TCP mesh is closed")
}

#[cfg(all(test, unix))]
mod tests {
    use std::time::Duration;

    use super::*;

    fn state(config: TcpConfig, instance: u64) -> State {
        let listener = Async::<TcpListener>::bind(config.bind).expect("bind");
        let local = listener.get_ref().local_addr().expect("addr");
        let bell = Arc::new(Doorbell::new().expect("doorbell"));
        State::new(config, listener, local, instance, bell)
    }

    /// Drives `state` as `try_recv` does; returns a datagram if one came.
    fn step(state: &mut State) -> Option<Datagram> {
        for _ in 0..2 {
            match state.drive(Instant::now(), Mode::Blocking) {
                Step::Datagram(datagram) => return Some(datagram),
                Step::Idle(_) => {}
                Step::Closed => panic!("closed"),
            }
            state.poll_now().expect("poll");
        }
        None
    }

    #[test]
    fn an_unvalidated_config_with_huge_durations_does_not_panic() {
        // `TcpMesh::bind` refuses such a configuration; the state copes with it anyway.
        let config = TcpConfig {
            connect_timeout: Duration::MAX,
            reconnect_backoff_min: Duration::MAX,
            reconnect_backoff_max: Duration::MAX,
            handshake_timeout: Duration::MAX,
            idle_timeout: Duration::MAX,
            close_timeout: Duration::MAX,
            ..TcpConfig::loopback()
        };
        let mut a = state(config.clone(), 1);
        let mut b = state(config, 2);
        let now = Instant::now();
        // Both dial before either drives: a simultaneous connect, so one connection is
        // wound down (with the close timeout) on each side.
        a.send(b.local, b"to b", now).unwrap();
        b.send(a.local, b"to a", now).unwrap();
        let (mut to_a, mut to_b) = (false, false);
        let deadline = now + Duration::from_secs(10);
        while !(to_a && to_b) {
            assert!(Instant::now() < deadline, "{:?} {:?}", a.stats(), b.stats());
            to_a |= step(&mut a).is_some_and(|d| d.bytes == b"to a");
            to_b |= step(&mut b).is_some_and(|d| d.bytes == b"to b");
            std::thread::yield_now();
        }
        assert_eq!(
            a.stats().duplicates_resolved + b.stats().duplicates_resolved,
            2
        );
        // A failed dial goes into (a huge) backoff.
        let nobody = {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        a.send(nobody, b"anyone?", Instant::now()).unwrap();
        while a.stats().connect_failures == 0 {
            assert!(Instant::now() < deadline, "{:?}", a.stats());
            step(&mut a);
            std::thread::yield_now();
        }
        a.send(nobody, b"anyone?", Instant::now()).unwrap();
        assert_eq!(a.stats().dropped_unreachable, 1, "{:?}", a.stats());
        a.begin_close();
        a.finish_close();
    }
}
