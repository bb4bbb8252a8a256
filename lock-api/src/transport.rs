//! What a membership backend provides: moving datagrams and reaching the discovery channel.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
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

/// A place where a transport looks for its cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiscoveryPlace {
    /// A seed of a TCP mesh (or any unicast address given to look at).
    Seed(SocketAddr),
    /// A multicast group, joined on an interface.
    Multicast {
        /// The group's address and port.
        group: SocketAddr,
        /// The interface's address.
        interface: IpAddr,
    },
}

impl fmt::Display for DiscoveryPlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoveryPlace::Seed(addr) => write!(f, "seed {addr}"),
            DiscoveryPlace::Multicast { group, interface } => {
                write!(f, "multicast group {group} on interface {interface}")
            }
        }
    }
}

/// What happened at a [`DiscoveryPlace`] so far.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiscoveryOutcome {
    /// Reachable as far as the transport can tell, but no member of the cluster answered
    /// there (for a multicast group: nothing was heard on it).
    NoAnswer,
    /// Could not be reached; the last error, in words.
    Unreachable(String),
    /// Reached, but what answered is not a member of this cluster (another cluster, another
    /// key, or a failed handshake); why, in words.
    Refused(String),
    /// Reached: a member of the cluster answered there.
    Answered,
}

impl fmt::Display for DiscoveryOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiscoveryOutcome::NoAnswer => f.write_str("no answer"),
            DiscoveryOutcome::Unreachable(why) => write!(f, "unreachable: {why}"),
            DiscoveryOutcome::Refused(why) => write!(f, "refused: {why}"),
            DiscoveryOutcome::Answered => f.write_str("answered"),
        }
    }
}

/// One place a transport looks for its cluster and what happened there, as
/// [`Transport::discovery_report`] tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryReport {
    /// Where the transport looked.
    pub place: DiscoveryPlace,
    /// What happened there.
    pub outcome: DiscoveryOutcome,
}

impl fmt::Display for DiscoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.place, self.outcome)
    }
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
///
/// # Send contract
/// [`Transport::send_to`] and [`Transport::send_discovery`] are plain functions: they never
/// block the calling thread and never wait for anything (not for the network, not for a
/// receiver, not for another caller beyond a short critical section). When one returns, the
/// datagram has been
/// - handed to the kernel (a datagram socket's send buffer, a connected stream), or
/// - put in a bounded queue of the backend, which its receive side (or `close`) drains, or
/// - dropped.
///
/// A backend that drops a datagram says so: by an error (`WouldBlock` when a buffer or queue
/// is full now, `NotConnected` after [`Transport::close`]) or, where its documentation says
/// so, by a counter in its statistics with `Ok(())`. Dropping is allowed because the protocol
/// above treats every send as possibly lost and retransmits; callers log the error and move
/// on, they never retry in a loop. A datagram longer than [`Transport::max_datagram_size`]
/// is refused with `InvalidInput` and nothing is sent.
///
/// Sends may be called from any thread, concurrently, including from inside a user's async
/// task (they never stall its executor) and from `Drop` (they never block or spawn).
///
/// # Receive contract
/// Datagrams come out of [`Transport::recv`] (async, cancel-safe: a call dropped before it
/// completes loses nothing) and, where the backend has one, the blocking receive of
/// [`Transport::blocking`]. The node's driver is the only receiver; it keeps a receive
/// pending at all times, which also drives backends that do their work inside the receive
/// (connects, queued writes). [`Transport::close`] ends the member's use of the transport:
/// receives then end with an error, sends fail or are dropped. A receive error is transient
/// (the driver logs it and receives again after a short pause), except
/// `ConnectionAborted`, which says the transport is gone for good as if its process had been
/// killed: the node then stops at once, without leaving the view, releasing its locks or
/// calling its own handlers (the in-memory transport's `crash` uses it).
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// The address other members reach this one at; it becomes part of the [`crate::MemberId`].
    fn local_addr(&self) -> SocketAddr;

    /// The largest datagram, in bytes, that [`Transport::send_to`] carries whole. The reliable
    /// layer fragments messages above it; the backends refuse larger datagrams with
    /// `InvalidInput`.
    fn max_datagram_size(&self) -> usize;

    /// Sends one datagram to one member, without blocking or waiting: see the
    /// [send contract](Transport#send-contract).
    ///
    /// # Errors
    /// `InvalidInput` if `bytes` is longer than [`Transport::max_datagram_size`];
    /// `WouldBlock` if the datagram was dropped because the kernel or the backend could not
    /// take it now; `NotConnected` after [`Transport::close`]; any other error of the system
    /// call. The datagram is not sent in any of these cases, and the caller does not retry:
    /// the protocol retransmits.
    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()>;

    /// Sends one datagram to the discovery channel (the multicast group, or every seed and
    /// known member of a TCP mesh), without blocking or waiting: see the
    /// [send contract](Transport#send-contract). Never delivered back to the sender.
    ///
    /// # Errors
    /// As [`Transport::send_to`].
    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()>;

    /// Waits for the next datagram addressed to this member or to the discovery channel.
    ///
    /// The node's driver is the only caller, one call at a time; a call may be dropped before
    /// it completes (the driver also waits on timers and commands), so it must not lose a
    /// datagram it has not returned.
    ///
    /// # Cancel safety
    /// Cancel-safe, as said above: required of every implementation.
    ///
    /// # Errors
    /// An error of the sockets; `NotConnected` once the transport is closed (or its network
    /// is gone).
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
    /// bound) and closes connections cleanly. Sends after `close` fail or are dropped; a
    /// pending or later [`Transport::recv`] ends (with an error) where the backend can tell.
    /// The default does nothing, which suits datagram sockets: the member's leave is the
    /// protocol's business, and the socket closes when the transport is dropped.
    async fn close(&self) {}

    /// Every place this transport looks for its cluster (the seeds of a TCP mesh, the
    /// multicast group of UDP) and what happened at each so far. A node whose join found
    /// nobody names them in its error. Empty (the default) means the transport has nowhere
    /// to look: a TCP mesh without seeds, the in-memory network. Such a node, unless told
    /// otherwise, founds a cluster of its own when nobody answers; a node with places to look
    /// does not (see `conclave::Founding`).
    fn discovery_report(&self) -> Vec<DiscoveryReport> {
        Vec::new()
    }

    /// Gives the transport the cluster's keys (feature `seal`), before its first send or
    /// receive: a transport with connections of its own (the TCP mesh) then makes every peer
    /// prove a key of the keyring before it trusts the connection, and reports a peer that
    /// proves another key to the member (a [`crate::seal::Notice`] for `cluster`, delivered as
    /// a datagram, naming the member's sealing `session` as a notice about its own packets
    /// does). The node builder calls it when it is given a key. The default does nothing,
    /// which suits datagram transports: the sealing layer above authenticates every datagram.
    #[cfg(feature = "seal")]
    fn use_keyring(
        &self,
        cluster: crate::wire::ClusterId,
        keys: &crate::seal::Keyring,
        session: [u8; 16],
    ) {
        let _ = (cluster, keys, session);
    }
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

    /// The next datagram if one is waiting, without blocking. A task spinning for its answer
    /// reads the transport with it ([`BlockingRecv::try_recv_ready`] is the driver's).
    ///
    /// # Errors
    /// As [`BlockingRecv::recv_blocking`].
    fn try_recv(&self) -> io::Result<Option<Datagram>> {
        self.recv_blocking(Some(Duration::ZERO))
    }

    /// The next datagram this transport already knows is waiting: one it has buffered, or one
    /// on a socket its last wait found readable. Unlike [`BlockingRecv::try_recv`] it need not
    /// ask the kernel about every socket, so it may return `Ok(None)` while datagrams wait
    /// elsewhere; the next [`BlockingRecv::recv_blocking`] returns those at once. The driver
    /// answers the datagram a wait returned, then reads the rest of what that wait found with
    /// it before it waits again; a transport with many sockets (the TCP mesh) saves a scan of
    /// all of them on every wake-up. Defaults to `try_recv`.
    ///
    /// # Errors
    /// As [`BlockingRecv::recv_blocking`].
    fn try_recv_ready(&self) -> io::Result<Option<Datagram>> {
        self.try_recv()
    }

    /// Makes the current call of [`BlockingRecv::recv_blocking`], or the next one if none is
    /// in progress, return promptly. Never blocks.
    fn interrupt(&self);
}
