//! An in-memory [`Transport`]: many nodes in one process, no sockets, with fault injection.
//!
//! A [`MemoryNetwork`] hands out [`MemoryTransport`]s with fake loopback addresses
//! (`127.0.0.1:<n>`). A send delivers the datagram at once into the receiver's inbox (an
//! unbounded queue: sends never block and never fail for lack of room); the discovery channel
//! reaches every other transport of the network. Tests use the hooks to make a node vanish
//! ([`MemoryNetwork::isolate`]), split the cluster ([`MemoryNetwork::partition`]), slow every
//! datagram down ([`MemoryNetwork::set_delay`]) and [`MemoryNetwork::heal`] it again, or
//! crash a node outright ([`MemoryNetwork::crash`]: it stops as a killed process would).
//!
//! ```
//! use conclave::memory::MemoryNetwork;
//! use conclave::api::Transport;
//!
//! let network = MemoryNetwork::new();
//! let a = network.transport();
//! let b = network.transport();
//! a.send_to(b.local_addr(), b"hello")?;
//! smol::block_on(async {
//!     let datagram = b.recv().await?;
//!     assert_eq!((datagram.from, &datagram.bytes[..]), (a.local_addr(), &b"hello"[..]));
//!     Ok::<(), std::io::Error>(())
//! })?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_io::Timer;
use async_trait::async_trait;
use conclave_lock_api::{Datagram, Transport};
use event_listener::Event;
use futures::future::select;
use tracing::trace;

use crate::faults::Reachability;

/// The largest datagram a [`MemoryTransport`] carries whole, in bytes.
pub const MAX_DATAGRAM: usize = 65_000;

/// The first port handed out by a [`MemoryNetwork`].
const FIRST_PORT: u16 = 40_000;

/// A simulated network connecting [`MemoryTransport`]s. Cloning it gives another handle to
/// the same network.
#[derive(Clone, Debug, Default)]
pub struct MemoryNetwork {
    state: Arc<Mutex<NetState>>,
}

#[derive(Debug, Default)]
struct NetState {
    next_port: u16,
    inboxes: BTreeMap<SocketAddr, Arc<Inbox>>,
    reach: Reachability,
    /// One-way delay of every datagram (reachability is judged when it is sent).
    delay: Duration,
    delivered: u64,
    dropped: u64,
}

impl NetState {
    fn deliver(&mut self, from: SocketAddr, to: SocketAddr, bytes: &[u8]) {
        if !self.reach.reachable(from, to) {
            self.dropped += 1;
            trace!(%from, %to, "memory network: datagram dropped");
            return;
        }
        if let Some(inbox) = self.inboxes.get(&to) {
            let datagram = Datagram {
                from,
                bytes: bytes.to_vec(),
            };
            let due = (!self.delay.is_zero()).then(|| Instant::now() + self.delay);
            if inbox.push(due, datagram) {
                self.delivered += 1;
            }
        }
    }
}

impl MemoryNetwork {
    /// An empty network.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new transport on this network, at the next free fake address `127.0.0.1:<n>`.
    pub fn transport(&self) -> MemoryTransport {
        let inbox = Arc::new(Inbox::default());
        let mut state = self.lock();
        let port = FIRST_PORT + state.next_port;
        state.next_port += 1;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        state.inboxes.insert(addr, Arc::clone(&inbox));
        MemoryTransport {
            addr,
            inbox,
            network: self.clone(),
        }
    }

    /// Drops every datagram sent to or by `addr` until [`MemoryNetwork::restore`] or
    /// [`MemoryNetwork::heal`]: to the others the node looks crashed.
    pub fn isolate(&self, addr: SocketAddr) {
        self.lock().reach.isolate(addr);
    }

    /// Lets the traffic of an isolated node through again.
    pub fn restore(&self, addr: SocketAddr) {
        self.lock().reach.restore(addr);
    }

    /// Splits the network: nodes hear only the nodes of their own group. Nodes not listed in
    /// any group hear nobody.
    pub fn partition(&self, groups: &[&[SocketAddr]]) {
        self.lock().reach.partition(groups);
    }

    /// Delays every datagram sent from now on by `delay` (zero: deliver at once). The send
    /// itself does not wait: the datagram enters the receiver's inbox stamped with the time it
    /// is due, and the receiver does not return it earlier. Each inbox stays in sending order
    /// (after the delay is lowered, a datagram waits for the older ones ahead of it).
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Crashes the node whose transport is at `addr`, as `kill -9` would: from now on nothing
    /// it sends leaves and nothing reaches it, and its receive fails with
    /// [`io::ErrorKind::ConnectionAborted`], which makes its node stop at once — without
    /// leaving the view, releasing its locks or calling its own handlers (a dead process tells
    /// nobody). In this process, its pending requests fail with `LockError::Shutdown` and its
    /// guards turn `Lost` (`lost()` resolves with `Shutdown`), but no handler is called and no
    /// `Lost` event is emitted. The other members find out as they
    /// would about a dead process: by suspicion, then a view without it, and (under
    /// `Majority`) the crashed holder's leases running out. Unlike [`MemoryNetwork::isolate`],
    /// it cannot be undone; start a new node for a restart.
    ///
    /// ```
    /// use std::time::Duration;
    /// use conclave::memory::MemoryNetwork;
    /// use conclave::{EndpointConfig, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let network = MemoryNetwork::new();
    /// smol::block_on(async {
    ///     let join = |name: &'static str| {
    ///         Node::builder("crash-docs")
    ///             .name(name)
    ///             .transport(network.transport())
    ///             .config(EndpointConfig::local())
    ///             .join()
    ///     };
    ///     let (a, b) = (join("a").await?, join("b").await?);
    ///     a.wait_for_members(2).await;
    ///     let guard = b.mutex("job")?.lock().await?;
    ///     network.crash(b.member_id().addr());
    ///     // The survivor gets the lock once it has found `b` dead.
    ///     let taken = a.mutex("job")?.lock_timeout(Duration::from_secs(10)).await?;
    ///     assert!(taken.fencing_token() > guard.fencing_token());
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub fn crash(&self, addr: SocketAddr) {
        let inbox = self.lock().inboxes.remove(&addr);
        if let Some(inbox) = inbox {
            {
                let mut queue = inbox.lock();
                queue.crashed = true;
                queue.datagrams.clear();
            }
            inbox.arrived.notify(usize::MAX);
        }
    }

    /// Ends every partition and isolation (a delay stays until set back to zero).
    pub fn heal(&self) {
        self.lock().reach.heal();
    }

    /// Datagrams delivered and dropped so far.
    pub fn counters(&self) -> (u64, u64) {
        let state = self.lock();
        (state.delivered, state.dropped)
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        // The state stays consistent at every step, so a panic elsewhere cannot corrupt it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One node's attachment to a [`MemoryNetwork`]. Dropping or closing it detaches the address.
///
/// Sends deliver directly into the receiver's inbox, which has no bound; datagrams to an
/// address nobody holds are dropped. After [`Transport::close`] sends fail with
/// `NotConnected`, and receives (pending ones included) end with `NotConnected`.
#[derive(Debug)]
pub struct MemoryTransport {
    addr: SocketAddr,
    inbox: Arc<Inbox>,
    network: MemoryNetwork,
}

impl MemoryTransport {
    /// Whether a send may go out: `Ok(false)` after a crash (the datagram vanishes).
    fn check_send(&self, bytes: &[u8]) -> io::Result<bool> {
        let queue = self.inbox.lock();
        if queue.crashed {
            return Ok(false);
        }
        if queue.closed {
            return Err(closed());
        }
        drop(queue);
        if bytes.len() > MAX_DATAGRAM {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("datagram of {} bytes is above {MAX_DATAGRAM}", bytes.len()),
            ));
        }
        Ok(true)
    }
}

#[async_trait]
impl Transport for MemoryTransport {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn max_datagram_size(&self) -> usize {
        MAX_DATAGRAM
    }

    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        if self.check_send(bytes)? {
            self.network.lock().deliver(self.addr, to, bytes);
        }
        Ok(())
    }

    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        if !self.check_send(bytes)? {
            return Ok(());
        }
        let mut state = self.network.lock();
        let others: Vec<SocketAddr> = state
            .inboxes
            .keys()
            .copied()
            .filter(|a| *a != self.addr)
            .collect();
        for to in others {
            state.deliver(self.addr, to, bytes);
        }
        Ok(())
    }

    async fn recv(&self) -> io::Result<Datagram> {
        loop {
            // Listen first, then look: a datagram pushed between the two is not missed.
            let listener = self.inbox.arrived.listen();
            let due = {
                let mut queue = self.inbox.lock();
                if queue.crashed {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "memory transport crashed",
                    ));
                }
                if queue.closed {
                    return Err(closed());
                }
                match queue.datagrams.pop_front() {
                    Some((Some(at), datagram)) if at > Instant::now() => {
                        // Not due yet: it stays first in line.
                        queue.datagrams.push_front((Some(at), datagram));
                        Some(at)
                    }
                    Some((_, datagram)) => return Ok(datagram),
                    None => None,
                }
            };
            match due {
                Some(at) => {
                    select(listener, Timer::at(at)).await;
                }
                None => listener.await,
            }
        }
    }

    /// Detaches the address (datagrams sent to it from now on are dropped), fails later sends
    /// and ends every receive.
    async fn close(&self) {
        self.network.lock().inboxes.remove(&self.addr);
        self.inbox.lock().closed = true;
        self.inbox.arrived.notify(usize::MAX);
    }
}

impl Drop for MemoryTransport {
    fn drop(&mut self) {
        self.network.lock().inboxes.remove(&self.addr);
    }
}

/// A transport's queue of received datagrams, each with the time it is due (`None`: at once).
#[derive(Debug, Default)]
struct Inbox {
    queue: Mutex<Queue>,
    /// Notified when a datagram is pushed and when the transport closes.
    arrived: Event,
}

#[derive(Debug, Default)]
struct Queue {
    datagrams: VecDeque<(Option<Instant>, Datagram)>,
    closed: bool,
    /// [`MemoryNetwork::crash`]ed: sends vanish, receives fail with `ConnectionAborted`.
    crashed: bool,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `datagram`; false if the transport is closed.
    fn push(&self, due: Option<Instant>, datagram: Datagram) -> bool {
        {
            let mut queue = self.lock();
            if queue.closed || queue.crashed {
                return false;
            }
            queue.datagrams.push_back((due, datagram));
        }
        self.arrived.notify(1);
        true
    }
}

/// The error of sends and receives after [`Transport::close`].
fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "memory transport closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_and_isolation_drop_traffic_until_healed() {
        let net = MemoryNetwork::new();
        let (a, b, c) = (net.transport(), net.transport(), net.transport());
        smol::block_on(async {
            net.partition(&[&[a.local_addr()], &[b.local_addr(), c.local_addr()]]);
            a.send_discovery(b"x").unwrap();
            b.send_to(c.local_addr(), b"y").unwrap();
            assert_eq!(c.recv().await.unwrap().bytes, b"y");
            assert!(b.inbox.lock().datagrams.is_empty() && c.inbox.lock().datagrams.is_empty());
            net.heal();
            net.isolate(c.local_addr());
            a.send_discovery(b"z").unwrap();
            assert_eq!(b.recv().await.unwrap().bytes, b"z");
            assert!(c.inbox.lock().datagrams.is_empty());
            assert_eq!(net.counters(), (2, 3));
        });
    }

    #[test]
    fn a_delay_holds_datagrams_back_but_delivers_them() {
        let net = MemoryNetwork::new();
        let (a, b) = (net.transport(), net.transport());
        net.set_delay(Duration::from_millis(30));
        smol::block_on(async {
            let sent = std::time::Instant::now();
            a.send_to(b.local_addr(), b"late").unwrap();
            assert_eq!(b.recv().await.unwrap().bytes, b"late");
            // A lower bound only: the datagram cannot arrive before its delay.
            assert!(sent.elapsed() >= Duration::from_millis(30));
        });
        net.set_delay(Duration::ZERO);
    }
}
