//! What a membership backend provides: moving datagrams and reaching the discovery channel.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use async_trait::async_trait;

/// A datagram received from the network.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Datagram {
    /// The transport address it came from (as the backend knows it).
    pub from: SocketAddr,
    /// The raw bytes, header included.
    pub bytes: Vec<u8>,
}

/// A membership backend: moves opaque datagrams between members and to the discovery channel.
///
/// Backends are thin: they know nothing of views or locks. Reliability, ordering,
/// fragmentation and failure detection live in `conclave-protocol`. A backend may lose,
/// duplicate or reorder datagrams; the protocol copes.
///
/// Implementations: `conclave-udp` (multicast discovery, unicast datagrams), `conclave-tcp`
/// (seed-list discovery, one connection per member pair) and the in-memory transport of
/// `conclave` for tests.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// The address other members reach this one at; it becomes part of the [`crate::MemberId`].
    fn local_addr(&self) -> SocketAddr;

    /// The largest datagram, in bytes, that [`Transport::send_to`] carries whole. The reliable
    /// layer fragments messages above it.
    fn max_datagram_size(&self) -> usize;

    /// Sends one datagram to one member. Errors are reported, but the protocol treats every
    /// send as possibly lost, so a transient error may also be swallowed by the backend.
    async fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()>;

    /// Sends one datagram to the discovery channel: the multicast group, or every seed and
    /// known member of a TCP mesh.
    async fn send_discovery(&self, bytes: &[u8]) -> io::Result<()>;

    /// Waits for the next datagram addressed to this member or to the discovery channel.
    ///
    /// The node's driver is the only caller, one call at a time; a call may be dropped before
    /// it completes (the driver also waits on timers and commands), so it must not lose a
    /// datagram it has not returned.
    async fn recv(&self) -> io::Result<Datagram>;

    /// A receive that blocks the calling thread, if the backend has one; `None` (the default)
    /// otherwise.
    ///
    /// With it, the node's driver waits for datagrams on its own thread, which the kernel
    /// wakes directly when one arrives. Without it, the driver awaits [`Transport::recv`] on
    /// the async-io reactor, where the wake-up may pass through the reactor's thread first:
    /// one more thread hop on the path of every lock request.
    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        None
    }

    /// Closes the transport once the member has left: flushes what is queued (within a short
    /// bound) and closes connections cleanly. Sends after `close` may fail. The default does
    /// nothing, which suits datagram sockets.
    async fn close(&self) {}
}

/// A receive that blocks its thread: see [`Transport::blocking`].
pub trait BlockingRecv: Send + Sync {
    /// Waits up to `timeout` (`None`: without limit) for the next datagram addressed to this
    /// member or to the discovery channel. `Ok(None)` when the timeout passed, when
    /// [`BlockingRecv::interrupt`] was called, or spuriously; callers loop.
    ///
    /// # Errors
    /// An error of the sockets, other than an interrupted system call.
    fn recv_blocking(&self, timeout: Option<Duration>) -> io::Result<Option<Datagram>>;

    /// The next datagram if one is waiting, without blocking. The driver takes every waiting
    /// datagram before it answers, so answers to one member leave together.
    ///
    /// # Errors
    /// As [`BlockingRecv::recv_blocking`].
    fn try_recv(&self) -> io::Result<Option<Datagram>> {
        self.recv_blocking(Some(Duration::ZERO))
    }

    /// Makes the current call of [`BlockingRecv::recv_blocking`], or the next one if none is
    /// in progress, return promptly. Never blocks.
    fn interrupt(&self);
}
