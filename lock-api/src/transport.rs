//! What a membership backend provides: moving datagrams and reaching the discovery channel.

use std::io;
use std::net::SocketAddr;

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

    /// Closes the transport once the member has left: flushes what is queued (within a short
    /// bound) and closes connections cleanly. Sends after `close` may fail. The default does
    /// nothing, which suits datagram sockets.
    async fn close(&self) {}
}
