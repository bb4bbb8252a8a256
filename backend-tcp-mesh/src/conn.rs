//! One TCP connection: its socket (or the connect in progress), its buffers and its state.
//!
//! Every operation here is non-blocking. When a socket would block and the caller passes a
//! [`Context`], the operation registers the connection's own waker with the reactor
//! (`poll_readable` / `poll_writable`) before it returns, so the mesh's
//! [`Doorbell`](crate::wake::Doorbell) hears when to come back. Without one (the blocking
//! receive), nothing is registered: the caller polls the socket itself, for what
//! [`Conn::waits_for`] says.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use async_io::Async;
use socket2::{Domain, Protocol, Socket, Type};

use crate::frame::{self, FrameReader, Parsed, HEADER_LEN, MAX_HELLO};
use crate::queue::SendQueue;

/// Reads and writes attempted per call before yielding to other connections.
const IO_BUDGET: usize = 64;

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
}

/// What [`Conn::read_frame`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Received {
    /// One whole frame's payload; more may follow at once.
    Frame(Vec<u8>),
    /// Nothing more now; the reactor will ring (or the caller's `poll` say so).
    Blocked,
    /// The peer closed its side.
    Eof,
    /// A prefix announced this many bytes, above the limit.
    TooLong(u64),
}

/// One connection of the mesh.
pub(crate) struct Conn {
    link: Link,
    /// The waker that rings this connection's token.
    pub(crate) waker: Waker,
    /// Whether we dialled it.
    pub(crate) outbound: bool,
    /// The member address it is registered under: the address dialled, or the hello's.
    pub(crate) key: Option<SocketAddr>,
    /// The peer's listen address and instance, from its hello.
    pub(crate) hello: Option<frame::Hello>,
    /// A duplicate (or a member's connection at close): flush, send FIN, read to EOF, drop.
    pub(crate) draining: bool,
    /// We sent FIN.
    pub(crate) write_shut: bool,
    /// The peer sent FIN.
    pub(crate) read_eof: bool,
    /// When the current step (dial, hello, winding down) times out.
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
            .field("key", &self.key)
            .field("hello", &self.hello)
            .field("draining", &self.draining)
            .field("queued_bytes", &self.queue.bytes())
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// A connection to `addr`, its non-blocking connect started; `hello` is queued.
    /// [`Conn::poll_dial`] completes the connect.
    ///
    /// # Errors
    /// The socket could not be made, or the connect failed at once (refused, unreachable).
    pub(crate) fn dial(
        addr: SocketAddr,
        waker: Waker,
        hello: Vec<u8>,
        deadline: Instant,
    ) -> io::Result<Self> {
        // Close-on-exec (and no SIGPIPE where the system has the option) from socket2.
        let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        socket.set_nonblocking(true)?;
        match socket.connect(&addr.into()) {
            Ok(()) => {}
            Err(e) if connect_in_progress(&e) => {}
            Err(e) => return Err(e),
        }
        let stream = Async::new_nonblocking(TcpStream::from(socket))?;
        let mut conn = Self::new(Link::Dialing(Arc::new(stream)), waker, hello, deadline);
        conn.outbound = true;
        conn.key = Some(addr);
        Ok(conn)
    }

    /// An accepted connection; `hello` is queued.
    pub(crate) fn accepted(
        stream: Async<TcpStream>,
        waker: Waker,
        hello: Vec<u8>,
        deadline: Instant,
    ) -> Self {
        Self::new(Link::Up(Arc::new(stream)), waker, hello, deadline)
    }

    fn new(link: Link, waker: Waker, hello: Vec<u8>, deadline: Instant) -> Self {
        let mut queue = SendQueue::default();
        queue.push_hello(hello);
        Self {
            link,
            waker,
            outbound: false,
            key: None,
            hello: None,
            draining: false,
            write_shut: false,
            read_eof: false,
            deadline: Some(deadline),
            scheduled: false,
            reader: FrameReader::default(),
            queue,
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
            Link::Up(_) => (!self.read_eof, !self.write_shut && !self.queue.is_empty()),
        }
    }

    /// Checks on the connect; `Ready(Ok)` once the socket is up (at once if it already was).
    /// With `cx`, a connect still in progress registers writability with the reactor.
    pub(crate) fn poll_dial(&mut self, cx: Option<&mut Context<'_>>) -> Poll<io::Result<()>> {
        let Link::Dialing(stream) = &self.link else {
            return Poll::Ready(Ok(()));
        };
        let stream = Arc::clone(stream);
        let status = match (connect_status(stream.get_ref()), cx) {
            (Poll::Pending, Some(cx)) => match stream.poll_writable(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // Writable: the connect is over, one way or the other.
                Poll::Ready(Ok(())) => match connect_status(stream.get_ref()) {
                    Poll::Pending => Poll::Ready(Err(io::Error::new(
                        ErrorKind::NotConnected,
                        "connect ended without a connection",
                    ))),
                    ready => ready,
                },
            },
            (status, _) => status,
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
    /// than `bound` bytes. Never blocks.
    ///
    /// # Errors
    /// The socket failed; the connection is broken.
    pub(crate) fn send(&mut self, payload: &[u8], bound: usize) -> io::Result<Sent> {
        if self.queue.bytes() + HEADER_LEN + payload.len() > bound {
            return Ok(Sent::Full);
        }
        let frame = frame::encode(payload);
        let was_empty = self.queue.is_empty();
        let written = match &self.link {
            Link::Up(stream) if was_empty && !self.write_shut => {
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
        Ok(if was_empty && !self.is_dialing() {
            Sent::QueuedFirst
        } else {
            Sent::Queued
        })
    }

    /// Queues a whole encoded frame moved from a duplicate connection, unless the queue would
    /// then hold more than `bound` bytes. Returns whether it was queued.
    pub(crate) fn requeue(&mut self, frame: Vec<u8>, bound: usize) -> bool {
        if self.queue.bytes() + frame.len() > bound {
            return false;
        }
        self.queue.push(frame, 0);
        true
    }

    /// Writes queued bytes until the queue is empty (`Ok(true)`) or the socket is full
    /// (`Ok(false)`, writability registered if there is `cx`). A dialling connection writes
    /// nothing.
    ///
    /// # Errors
    /// The socket failed; the connection is broken.
    pub(crate) fn flush(&mut self, mut cx: Option<&mut Context<'_>>) -> io::Result<bool> {
        let Link::Up(stream) = &self.link else {
            return Ok(self.queue.is_empty());
        };
        for _ in 0..IO_BUDGET {
            let Some(bytes) = self.queue.front() else {
                return Ok(true);
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
    /// size, after it `max_frame`. If the I/O budget runs out the connection rings itself
    /// (with `cx`; without, the socket stays readable for the caller's poll) and reports
    /// [`Received::Blocked`].
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
        for _ in 0..IO_BUDGET {
            match self.reader.parse(limit) {
                Parsed::Frame(payload) => return Ok(Received::Frame(payload)),
                Parsed::TooLong(len) => return Ok(Received::TooLong(len)),
                Parsed::Incomplete => {}
            }
            match self.reader.read_from(stream.get_ref(), limit) {
                Ok(0) => {
                    self.read_eof = true;
                    return Ok(Received::Eof);
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    match cx.as_deref_mut().map(|cx| stream.poll_readable(cx)) {
                        Some(Poll::Ready(Ok(()))) => {}
                        Some(Poll::Ready(Err(e))) => return Err(e),
                        Some(Poll::Pending) | None => return Ok(Received::Blocked),
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(cx) = cx {
            cx.waker().wake_by_ref();
        }
        Ok(Received::Blocked)
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
