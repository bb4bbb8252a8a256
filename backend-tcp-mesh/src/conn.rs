//! One TCP connection: its socket (or the connect in progress), its buffers and its state.
//!
//! Every operation here is non-blocking. When a socket would block and the caller passes a
//! [`Context`], the operation registers the connection's own waker with the reactor
//! (`poll_readable` / `poll_writable`) before it returns, so the mesh's
//! [`Doorbell`](crate::wake::Doorbell) hears when to come back. Without one (the blocking
//! receive), nothing is registered: the caller polls the socket itself, for what
//! [`Conn::waits_for`] says.
//!
//! Every socket has TCP keepalive ([`keep_alive`]), so a peer that vanished without FIN or
//! reset is noticed even on a connection nothing is sent on.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use async_io::Async;
use socket2::{Domain, Protocol, SockRef, Socket, TcpKeepalive, Type};
use tracing::debug;

use crate::frame::{self, FrameReader, Parsed, HEADER_LEN, MAX_HELLO};
use crate::queue::{SendQueue, Total};

/// Reads and writes attempted per call before yielding to other connections.
const IO_BUDGET: usize = 64;
/// The most bytes read and dropped from a connection closed for failing authentication
/// before it is reset (a peer that follows the handshake sends a few dozen).
const REJECTED_READ_MAX: usize = 64 * 1024;

/// Idle time before the first keepalive probe.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
/// Time between keepalive probes, where the system lets us set it.
#[cfg_attr(
    not(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "illumos",
        target_os = "ios",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
        target_os = "windows",
    )),
    allow(dead_code)
)]
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// Unanswered keepalive probes before the connection is reset, where the system lets us set it.
#[cfg_attr(
    not(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "illumos",
        target_os = "ios",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
    )),
    allow(dead_code)
)]
const KEEPALIVE_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the connection is reset (Linux's
/// `TCP_USER_TIMEOUT`; keepalive alone does not probe while data is outstanding): as long as
/// the keepalive probes take to give up.
#[cfg_attr(not(any(target_os = "android", target_os = "linux")), allow(dead_code))]
const USER_TIMEOUT: Duration = Duration::from_secs(
    KEEPALIVE_IDLE.as_secs() + KEEPALIVE_INTERVAL.as_secs() * KEEPALIVE_RETRIES as u64,
);

/// The socket, connecting or connected. Shared (`Arc`) only so that a thread blocked in
/// `poll(2)` keeps the descriptor it polls open, even if the connection is dropped meanwhile.
enum Link {
    /// A non-blocking connect is in progress.
    Dialing(Arc<Async<TcpStream>>),
    Up(Arc<Async<TcpStream>>),
}

/// What [`Conn::send`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sent {
    /// The kernel took the whole frame.
    Written,
    /// Queued (in whole or in part) behind nothing: someone must flush it.
    QueuedFirst,
    /// Queued behind other frames, whose flushing is already arranged.
    Queued,
    /// The queue bound would be exceeded: dropped.
    Full,
    /// The mesh-wide bound on queued bytes would be exceeded: dropped.
    OverBudget,
}

/// What [`Conn::read_frame`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// One whole frame's payload; more may follow at once.
    Frame(Vec<u8>),
    /// Nothing more now; the reactor will ring (or the caller's `poll` say so).
    Blocked,
    /// The read budget is spent and bytes are still coming: serve the connection again soon.
    /// Nothing else announces it: the bytes may all be in the buffer already.
    Again,
    /// The peer closed its side.
    Eof,
    /// A prefix announced this many bytes, above the limit.
    TooLong(u64),
}

/// Where a keyed connection's handshake stands (until the peer's proof is verified).
#[derive(Debug)]
pub(crate) struct Handshake {
    /// Our hello's payload, as sent.
    pub(crate) ours: Vec<u8>,
    /// The peer's hello, parsed and as received, once in.
    pub(crate) theirs: Option<(frame::Hello, Vec<u8>)>,
}

impl Handshake {
    /// The transcript a proof by the initiator (`initiator_proves`) or the responder covers:
    /// the initiator's hello, the responder's hello, then the prover's role (`0` for the
    /// initiator, `1` for the responder). `None` before the peer's hello.
    pub(crate) fn transcript(&self, outbound: bool, initiator_proves: bool) -> Option<Vec<u8>> {
        let (_, theirs) = self.theirs.as_ref()?;
        let (initiator, responder) = if outbound {
            (&self.ours, theirs)
        } else {
            (theirs, &self.ours)
        };
        let mut transcript = Vec::with_capacity(initiator.len() + responder.len() + 1);
        transcript.extend_from_slice(initiator);
        transcript.extend_from_slice(responder);
        transcript.push(u8::from(!initiator_proves));
        Some(transcript)
    }
}

/// One connection of the mesh.
pub(crate) struct Conn {
    link: Link,
    /// The waker that rings this connection's token.
    pub(crate) waker: Waker,
    /// Whether we dialled it.
    pub(crate) outbound: bool,
    /// The address we dialled (outbound connections only): its backoff is the one a failure
    /// counts against.
    pub(crate) dialled: Option<SocketAddr>,
    /// The IP at the other end of the socket: the one dialled, or the one accepted from.
    pub(crate) peer_ip: IpAddr,
    /// The member addresses whose frames go on this connection (see `Peer::conn`): the
    /// address dialled, the hello's, or both when they differ (the dialled one is an alias).
    pub(crate) keys: Vec<SocketAddr>,
    /// The peer's listen address and instance, from its hello; on a keyed mesh, set only once
    /// the peer proved the key.
    pub(crate) hello: Option<frame::Hello>,
    /// The handshake of a keyed connection not yet authenticated (`None` on a mesh without a
    /// key, and once the peer's proof is verified).
    pub(crate) handshake: Option<Handshake>,
    /// When the peer's hello or last frame arrived (the idle timeout counts from it).
    pub(crate) last_rx: Option<Instant>,
    /// A duplicate (or a member's connection at close): flush, send FIN, read to EOF, drop.
    pub(crate) draining: bool,
    /// Closed for failing authentication: FIN sent, what comes is read and dropped until the
    /// peer's FIN (so the peer reads our proof before the close, and no reset cuts it off).
    pub(crate) rejected: bool,
    /// Bytes dropped since the rejection.
    discarded: usize,
    /// We sent FIN.
    pub(crate) write_shut: bool,
    /// The peer sent FIN.
    pub(crate) read_eof: bool,
    /// When the current step (dial, hello, idleness of an inbound connection, winding down)
    /// times out.
    pub(crate) deadline: Option<Instant>,
    /// Whether the token is in the mesh's work list.
    pub(crate) scheduled: bool,
    reader: FrameReader,
    pub(crate) queue: SendQueue,
}

impl fmt::Debug for Conn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Conn")
            .field("dialing", &self.is_dialing())
            .field("outbound", &self.outbound)
            .field("dialled", &self.dialled)
            .field("peer_ip", &self.peer_ip)
            .field("keys", &self.keys)
            .field("hello", &self.hello)
            .field("draining", &self.draining)
            .field("queued_bytes", &self.queue.bytes())
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// A connection to `addr` from the IP of `local` (our listen address, so that the peer
    /// sees the connection come from the IP our hello names), its non-blocking connect
    /// started; `hello` is queued. [`Conn::poll_dial`] completes the connect. Its queued data
    /// bytes count in `total`.
    ///
    /// # Errors
    /// The socket could not be made, or the connect failed at once (refused, unreachable).
    pub(crate) fn dial(
        addr: SocketAddr,
        local: SocketAddr,
        waker: Waker,
        hello: Vec<u8>,
        deadline: Option<Instant>,
        total: Total,
    ) -> io::Result<Self> {
        // Close-on-exec (and no SIGPIPE where the system has the option) from socket2.
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_nonblocking(true)?;
        keep_alive(SockRef::from(&socket));
        if local.is_ipv4() == addr.is_ipv4() {
            let mut from = local;
            from.set_port(0);
            socket.bind(&from.into())?;
        }
        match socket.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if connect_in_progress(&e) => {}
            Err(e) => return Err(e),
        }
        let stream = Async::new_nonblocking(TcpStream::from(socket))?;
        let link = Link::Dialing(Arc::new(stream));
        let mut conn = Self::new(link, addr.ip(), waker, hello, deadline, total);
        conn.outbound = true;
        conn.dialled = Some(addr);
        conn.keys.push(addr);
        Ok(conn)
    }

    /// An accepted connection from `peer`; `hello` is queued. Turns keepalive on. Its queued
    /// data bytes count in `total`.
    pub(crate) fn accepted(
        stream: Async<TcpStream>,
        peer: SocketAddr,
        waker: Waker,
        hello: Vec<u8>,
        deadline: Option<Instant>,
        total: Total,
    ) -> Self {
        keep_alive(SockRef::from(stream.get_ref()));
        Self::new(
            Link::Up(Arc::new(stream)),
            peer.ip(),
            waker,
            hello,
            deadline,
            total,
        )
    }

    fn new(
        link: Link,
        peer_ip: IpAddr,
        waker: Waker,
        hello: Vec<u8>,
        deadline: Option<Instant>,
        total: Total,
    ) -> Self {
        let mut queue = SendQueue::new(total);
        queue.push_hello(hello);
        Self {
            link,
            waker,
            outbound: false,
            dialled: None,
            peer_ip,
            keys: Vec::new(),
            hello: None,
            handshake: None,
            last_rx: None,
            draining: false,
            rejected: false,
            discarded: 0,
            write_shut: false,
            read_eof: false,
            deadline,
            scheduled: false,
            reader: FrameReader::default(),
            queue,
        }
    }

    /// The member this connection belongs to, as far as known: the hello's address, or the
    /// address dialled.
    pub(crate) fn member(&self) -> Option<SocketAddr> {
        self.hello.map(|h| h.addr).or(self.dialled)
    }

    /// Whether the connection can still carry frames both ways, as far as can be told without
    /// reading: not winding down, not closed by us, and no FIN, reset or error from the peer
    /// waiting on the socket (even if the mesh has not read up to it yet). A connect in
    /// progress counts as live.
    pub(crate) fn is_live(&self) -> bool {
        if self.draining || self.write_shut || self.read_eof {
            return false;
        }
        match &self.link {
            Link::Dialing(_) => true,
            Link::Up(stream) => !peer_gone(stream),
        }
    }

    /// Whether the connect is still in progress.
    pub(crate) fn is_dialing(&self) -> bool {
        matches!(self.link, Link::Dialing(_))
    }

    /// The socket, connecting or connected.
    #[cfg(unix)]
    pub(crate) fn socket(&self) -> &Arc<Async<TcpStream>> {
        match &self.link {
            Link::Dialing(stream) | Link::Up(stream) => stream,
        }
    }

    /// What the socket must be ready for before serving the connection again can make
    /// progress: `(readable, writable)`. Writable while connecting (the connect is over) or
    /// while bytes are queued; readable once connected, until the peer's FIN.
    #[cfg(unix)]
    pub(crate) fn waits_for(&self) -> (bool, bool) {
        match &self.link {
            Link::Dialing(_) => (false, true),
            Link::Up(_) => (!self.read_eof, !self.write_shut && self.queue.is_writable()),
        }
    }

    /// Checks on the connect; `Ready(Ok)` once the socket is up (at once if it already was).
    /// With `cx`, a connect still in progress registers writability with the reactor; without
    /// (the blocking receive), a `poll` that does not wait tells whether it is over.
    ///
    /// A socket that is ready (writable, or hung up) but neither connected nor failed counts
    /// as failed, in both modes: otherwise a blocking receive would be woken for it again and
    /// again until the connect timeout.
    pub(crate) fn poll_dial(&mut self, cx: Option<&mut Context<'_>>) -> Poll<io::Result<()>> {
        let Link::Dialing(stream) = &self.link else {
            return Poll::Ready(Ok(()));
        };
        let stream = Arc::clone(stream);
        let status = match connect_status(stream.get_ref()) {
            Poll::Pending => {
                let over = match cx {
                    Some(cx) => match stream.poll_writable(cx) {
                        Poll::Pending => false,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Ready(Ok(())) => true,
                    },
                    None => match connect_over(&stream) {
                        Ok(over) => over,
                        Err(e) => return Poll::Ready(Err(e)),
                    },
                };
                if !over {
                    return Poll::Pending;
                }
                // Ready: the connect is over, one way or the other.
                match connect_status(stream.get_ref()) {
                    Poll::Pending => Poll::Ready(Err(io::Error::new(
                        ErrorKind::NotConnected,
                        "connect ended without a connection",
                    ))),
                    ready => ready,
                }
            }
            ready => ready,
        };
        match status {
            Poll::Ready(Ok(())) => {
                stream.get_ref().set_nodelay(true)?;
                self.link = Link::Up(stream);
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }

    /// Writes or queues one frame carrying `payload`, unless the queue would then hold more
    /// than `bound` bytes ([`Sent::Full`]) or the mesh's total of queued data bytes more than
    /// `budget` ([`Sent::OverBudget`]). Never blocks.
    ///
    /// The budget is checked for the whole frame before any write: once part of a frame is
    /// written, the rest must be queued whatever the total, so a frame the budget has no room
    /// for is not started even on an idle socket.
    ///
    /// # Errors
    /// The socket failed; the connection is broken.
    pub(crate) fn send(&mut self, payload: &[u8], bound: usize, budget: usize) -> io::Result<Sent> {
        let len = HEADER_LEN + payload.len();
        if self.queue.bytes() + len > bound {
            return Ok(Sent::Full);
        }
        if !self.queue.total().fits(len, budget) {
            return Ok(Sent::OverBudget);
        }
        let frame = frame::encode(payload);
        let was_empty = self.queue.is_empty();
        let written = match &self.link {
            Link::Up(stream) if was_empty && !self.write_shut && !self.queue.is_held() => {
                match stream.get_ref().write(&frame) {
                    Ok(n) if n == frame.len() => return Ok(Sent::Written),
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => 0,
                    Err(e) => return Err(e),
                }
            }
            _ => 0,
        };
        self.queue.push(frame, written);
        Ok(
            if was_empty && !self.is_dialing() && !self.queue.is_held() {
                Sent::QueuedFirst
            } else {
                Sent::Queued
            },
        )
    }

    /// Queues a whole encoded frame moved from a duplicate connection (and already taken out
    /// of the mesh's total), unless the queue would then hold more than `bound` bytes
    /// ([`Sent::Full`]) or the total more than `budget` ([`Sent::OverBudget`]).
    pub(crate) fn requeue(&mut self, frame: Vec<u8>, bound: usize, budget: usize) -> Sent {
        if self.queue.bytes() + frame.len() > bound {
            return Sent::Full;
        }
        if !self.queue.total().fits(frame.len(), budget) {
            return Sent::OverBudget;
        }
        self.queue.push(frame, 0);
        Sent::Queued
    }

    /// Writes queued bytes until the queue is empty (`Ok(true)`) or the socket is full
    /// (`Ok(false)`, writability registered if there is `cx`). A dialling connection writes
    /// nothing; nor is a held data frame written (`Ok(false)`, nothing registered: the proof
    /// that releases it schedules the connection).
    ///
    /// # Errors
    /// The socket failed; the connection is broken.
    pub(crate) fn flush(&mut self, mut cx: Option<&mut Context<'_>>) -> io::Result<bool> {
        let Link::Up(stream) = &self.link else {
            return Ok(self.queue.is_empty());
        };
        for _ in 0..IO_BUDGET {
            let Some(bytes) = self.queue.front() else {
                return Ok(self.queue.is_empty());
            };
            match stream.get_ref().write(bytes) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => self.queue.advance(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    match cx.as_deref_mut().map(|cx| stream.poll_writable(cx)) {
                        Some(Poll::Ready(Ok(()))) => {}
                        Some(Poll::Ready(Err(e))) => return Err(e),
                        Some(Poll::Pending) | None => return Ok(false),
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        // Budget spent with the socket still taking bytes: come back soon (a caller that
        // polls the socket itself sees it writable).
        if let Some(cx) = cx {
            cx.waker().wake_by_ref();
        }
        Ok(self.queue.is_empty())
    }

    /// Sends FIN once (after the queue is flushed: the caller checks).
    pub(crate) fn shutdown_write(&mut self) {
        if let Link::Up(stream) = &self.link {
            if !self.write_shut {
                // The peer may be gone already; there is nothing to do about it.
                let _ = stream.get_ref().shutdown(Shutdown::Write);
            }
        }
        self.write_shut = true;
    }

    /// Returns the next whole frame, reading as needed; registers readability when the
    /// socket has nothing more (if there is `cx`). Before the hello the limit is the hello's
    /// size, after it `max_frame`. If the I/O budget runs out before a whole frame is in, it
    /// reports [`Received::Again`]: the caller serves the connection again after the others.
    ///
    /// # Errors
    /// The socket failed; the connection is broken.
    pub(crate) fn read_frame(
        &mut self,
        mut cx: Option<&mut Context<'_>>,
        max_frame: usize,
    ) -> io::Result<Received> {
        let limit = if self.hello.is_some() {
            max_frame
        } else {
            MAX_HELLO
        };
        let Link::Up(stream) = &self.link else {
            return Ok(Received::Blocked);
        };
        if self.read_eof {
            return Ok(Received::Eof);
        }
        let received = read_some(
            &mut self.reader,
            stream.get_ref(),
            limit,
            IO_BUDGET,
            || match cx.as_deref_mut().map(|cx| stream.poll_readable(cx)) {
                Some(Poll::Ready(Ok(()))) => Ok(true),
                Some(Poll::Ready(Err(e))) => Err(e),
                Some(Poll::Pending) | None => Ok(false),
            },
        )?;
        if received == Received::Eof {
            self.read_eof = true;
        }
        Ok(received)
    }

    /// Reads and drops what the peer sends, registering readability (if there is `cx`) when
    /// nothing more is waiting. Returns whether to close now: the stream ended (the peer's
    /// FIN, or an error) or more than [`REJECTED_READ_MAX`] bytes came.
    pub(crate) fn discard_until_eof(&mut self, mut cx: Option<&mut Context<'_>>) -> bool {
        let Link::Up(stream) = &self.link else {
            return true;
        };
        let mut scratch = [0u8; 4096];
        for _ in 0..IO_BUDGET {
            match stream.get_ref().read(&mut scratch) {
                Ok(0) => {
                    self.read_eof = true;
                    return true;
                }
                Ok(n) => {
                    self.discarded += n;
                    if self.discarded > REJECTED_READ_MAX {
                        return true;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    match cx.as_deref_mut().map(|cx| stream.poll_readable(cx)) {
                        Some(Poll::Ready(Ok(()))) => {}
                        Some(Poll::Ready(Err(_))) => return true,
                        Some(Poll::Pending) | None => return false,
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return true,
            }
        }
        if let Some(cx) = cx {
            cx.waker().wake_by_ref();
        }
        false
    }

    /// Reads and drops whatever the peer sent that is waiting, so closing the socket sends FIN
    /// rather than RST. Bounded; never blocks.
    pub(crate) fn discard_input(&mut self) {
        let Link::Up(stream) = &self.link else {
            return;
        };
        let mut scratch = [0u8; 4096];
        for _ in 0..IO_BUDGET {
            match stream.get_ref().read(&mut scratch) {
                Ok(n) if n > 0 => {}
                _ => return,
            }
        }
    }
}

/// Parses and reads `source` alternately, at most `budget` reads: the next whole frame, or
/// why there is none. On `WouldBlock`, `blocked` says whether to try again (the reactor says
/// the socket became readable meanwhile) or to report [`Received::Blocked`].
fn read_some(
    reader: &mut FrameReader,
    mut source: impl Read,
    limit: usize,
    budget: usize,
    mut blocked: impl FnMut() -> io::Result<bool>,
) -> io::Result<Received> {
    for _ in 0..budget {
        match reader.parse(limit) {
            Parsed::Frame(payload) => return Ok(Received::Frame(payload)),
            Parsed::TooLong(len) => return Ok(Received::TooLong(len)),
            Parsed::Incomplete => {}
        }
        match reader.read_from(&mut source, limit) {
            Ok(0) => return Ok(Received::Eof),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if !blocked()? {
                    return Ok(Received::Blocked);
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    // The last read may have completed a frame: take it now. A socket with nothing more to
    // read would never announce it (the blocking receive polls the socket, not the buffer).
    Ok(match reader.parse(limit) {
        Parsed::Frame(payload) => Received::Frame(payload),
        Parsed::TooLong(len) => Received::TooLong(len),
        Parsed::Incomplete => Received::Again,
    })
}

/// Turns on TCP keepalive: first probe after [`KEEPALIVE_IDLE`], then every
/// [`KEEPALIVE_INTERVAL`], reset after [`KEEPALIVE_RETRIES`] unanswered ones (where the system
/// lets us set those), and on Linux a [`USER_TIMEOUT`] for data never acknowledged. A failure
/// is logged, not fatal: the idle timeout and the protocol's failure detection remain.
pub(crate) fn keep_alive(socket: SockRef<'_>) {
    let params = TcpKeepalive::new().with_time(KEEPALIVE_IDLE);
    #[cfg(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "illumos",
        target_os = "ios",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
        target_os = "windows",
    ))]
    let params = params.with_interval(KEEPALIVE_INTERVAL);
    #[cfg(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "illumos",
        target_os = "ios",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
    ))]
    let params = params.with_retries(KEEPALIVE_RETRIES);
    if let Err(error) = socket.set_tcp_keepalive(&params) {
        debug!(%error, "could not turn TCP keepalive on");
    }
    #[cfg(any(target_os = "android", target_os = "linux"))]
    if let Err(error) = socket.set_tcp_user_timeout(Some(USER_TIMEOUT)) {
        debug!(%error, "could not set the TCP user timeout");
    }
}

/// Whether the peer closed or broke the connection: a FIN, reset or error is waiting on the
/// socket. Reads nothing.
#[cfg(any(target_os = "android", target_os = "linux"))]
fn peer_gone(stream: &Async<TcpStream>) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};

    let mut fds = [PollFd::new(stream, PollFlags::RDHUP)];
    match poll(&mut fds, Some(&Timespec::default())) {
        Ok(_) => fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL),
        Err(_) => false,
    }
}

/// Whether the peer closed or broke the connection: a FIN, reset or error is waiting on the
/// socket. Reads nothing; a FIN behind data not yet read goes unnoticed here.
#[cfg(not(any(target_os = "android", target_os = "linux")))]
fn peer_gone(stream: &Async<TcpStream>) -> bool {
    match stream.get_ref().peek(&mut [0u8; 1]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    }
}

/// Whether a connect in progress is over (the socket is writable, hung up or failed), by a
/// `poll` that does not wait.
#[cfg(unix)]
fn connect_over(stream: &Async<TcpStream>) -> io::Result<bool> {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};

    let mut fds = [PollFd::new(stream, PollFlags::OUT)];
    match poll(&mut fds, Some(&Timespec::default())) {
        Ok(_) => Ok(!fds[0].revents().is_empty()),
        Err(rustix::io::Errno::INTR) => Ok(false),
        Err(errno) => Err(errno.into()),
    }
}

/// Without `poll(2)` there is no blocking receive, and nothing to tell: the connect is over
/// when the reactor says so, or at its timeout.
#[cfg(not(unix))]
fn connect_over(_: &Async<TcpStream>) -> io::Result<bool> {
    Ok(false)
}

/// Whether a non-blocking connect's error only says it goes on in the background.
fn connect_in_progress(error: &io::Error) -> bool {
    #[cfg(unix)]
    if rustix::io::Errno::from_io_error(error) == Some(rustix::io::Errno::INPROGRESS) {
        return true;
    }
    // Windows says "would block"; on Unix that (EAGAIN) means no local port was free.
    (cfg!(not(unix)) && error.kind() == ErrorKind::WouldBlock)
        || error.kind() == ErrorKind::Interrupted
}

/// Where a non-blocking connect stands: `Pending` while in progress, then connected or failed.
fn connect_status(stream: &TcpStream) -> Poll<io::Result<()>> {
    match stream.peer_addr() {
        Ok(_) => Poll::Ready(Ok(())),
        // Not connected (yet): in progress, unless the connect failed.
        Err(e) if e.kind() == ErrorKind::NotConnected => match stream.take_error() {
            Ok(None) => Poll::Pending,
            Ok(Some(error)) | Err(error) => Poll::Ready(Err(error)),
        },
        Err(e) => Poll::Ready(Err(e)),
    }
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    use std::net::TcpListener;

    use super::*;
    use crate::frame::encode;
    #[cfg(unix)]
    use crate::frame::Hello;

    /// A source handing out its bytes one at a time, never blocking.
    struct Trickle<'a>(&'a [u8]);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let Some((first, rest)) = self.0.split_first() else {
                return Err(ErrorKind::WouldBlock.into());
            };
            buf[0] = *first;
            self.0 = rest;
            Ok(1)
        }
    }

    fn no_reactor() -> io::Result<bool> {
        Ok(false)
    }

    #[test]
    fn a_frame_completed_by_the_last_read_of_the_budget_is_returned() {
        // 14 bytes, one per read: the 14th read, the last of a budget of 14, completes it.
        // Nothing else would announce it: the source has nothing more.
        let bytes = encode(b"ten bytes!");
        let mut reader = FrameReader::default();
        let got = read_some(&mut reader, Trickle(&bytes), 100, bytes.len(), no_reactor);
        assert_eq!(got.unwrap(), Received::Frame(b"ten bytes!".to_vec()));
    }

    #[test]
    fn a_spent_budget_asks_to_be_served_again() {
        let bytes = encode(b"ten bytes!");
        let mut reader = FrameReader::default();
        let mut source = Trickle(&bytes);
        let got = read_some(&mut reader, &mut source, 100, 5, no_reactor);
        assert_eq!(got.unwrap(), Received::Again);
        let got = read_some(&mut reader, &mut source, 100, 64, no_reactor);
        assert_eq!(got.unwrap(), Received::Frame(b"ten bytes!".to_vec()));
        let got = read_some(&mut reader, &mut source, 100, 64, no_reactor);
        assert_eq!(got.unwrap(), Received::Blocked);
    }

    #[cfg(unix)]
    fn hello() -> Vec<u8> {
        Hello {
            instance: 1,
            addr: "127.0.0.1:7800".parse().unwrap(),
            seal: None,
        }
        .encode()
    }

    /// A socket that polls ready (writable and hung up: it never connected) but is neither
    /// connected nor failed, as a connect whose error was already taken leaves it.
    #[cfg(unix)]
    #[test]
    fn a_ready_socket_that_never_connected_fails_the_dial_in_blocking_mode() {
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket.set_nonblocking(true).unwrap();
        let stream = Async::new_nonblocking(TcpStream::from(socket)).unwrap();
        let link = Link::Dialing(Arc::new(stream));
        let ip = "127.0.0.1".parse().unwrap();
        let mut conn = Conn::new(
            link,
            ip,
            futures::task::noop_waker(),
            hello(),
            None,
            Total::default(),
        );
        let Poll::Ready(Err(error)) = conn.poll_dial(None) else {
            panic!("a ready socket without a connection is a failed connect");
        };
        assert_eq!(error.kind(), ErrorKind::NotConnected);
    }

    #[cfg(unix)]
    #[test]
    fn a_connect_in_progress_stays_pending_in_blocking_mode() {
        // 192.0.2.0/24 is reserved for documentation: nothing answers, so the connect stays
        // in progress (or fails at once where there is no route; then there is nothing to
        // check).
        let Ok(mut conn) = Conn::dial(
            "192.0.2.1:9".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
            futures::task::noop_waker(),
            hello(),
            None,
            Total::default(),
        ) else {
            return;
        };
        match conn.poll_dial(None) {
            Poll::Pending => {}
            // Unreachable from here: failed, not stuck.
            Poll::Ready(Err(_)) => {}
            Poll::Ready(Ok(())) => panic!("connected to a documentation address"),
        }
    }

    #[cfg(unix)]
    #[test]
    fn every_connection_has_keepalive() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let local = "127.0.0.1:0".parse().unwrap();
        let waker = futures::task::noop_waker();
        let dialled =
            Conn::dial(addr, local, waker.clone(), hello(), None, Total::default()).unwrap();
        let (stream, peer) = listener.accept().unwrap();
        let accepted = Conn::accepted(
            Async::new(stream).unwrap(),
            peer,
            waker,
            hello(),
            None,
            Total::default(),
        );
        for conn in [&dialled, &accepted] {
            let socket = SockRef::from(conn.socket().get_ref());
            assert!(socket.keepalive().unwrap());
            #[cfg(any(target_os = "android", target_os = "linux"))]
            {
                assert_eq!(socket.keepalive_time().unwrap(), KEEPALIVE_IDLE);
                assert_eq!(socket.keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
                assert_eq!(socket.keepalive_retries().unwrap(), KEEPALIVE_RETRIES);
                assert_eq!(socket.tcp_user_timeout().unwrap(), Some(USER_TIMEOUT));
            }
        }
        // The dial went out from the listen IP.
        assert_eq!(dialled.peer_ip, addr.ip());
        assert_eq!(accepted.peer_ip, peer.ip());
    }
}
