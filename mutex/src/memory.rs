//! An in-memory [`Transport`]: many nodes in one process, no sockets, with fault injection.
//!
//! A [`MemoryNetwork`] hands out [`MemoryTransport`]s with fake loopback addresses
//! (`127.0.0.1:<n>`). Datagrams travel over unbounded [`async_channel`]s; the discovery channel
//! reaches every other transport of the network. Tests use the hooks to make a node vanish
//! ([`MemoryNetwork::isolate`]), split the cluster ([`MemoryNetwork::partition`]), slow every
//! datagram down ([`MemoryNetwork::set_delay`]) and [`MemoryNetwork::heal`] it again.
//!
//! ```
//! use conclave::memory::MemoryNetwork;
//! use conclave::api::Transport;
//!
//! let network = MemoryNetwork::new();
//! let a = network.transport();
//! let b = network.transport();
//! smol::block_on(async {
//!     a.send_to(b.local_addr(), b"hello").await?;
//!     let datagram = b.recv().await?;
//!     assert_eq!((datagram.from, &datagram.bytes[..]), (a.local_addr(), &b"hello"[..]));
//!     Ok::<(), std::io::Error>(())
//! })?;
//! # Ok::<(), std::io::Error>(())
//! ```

use std::collections::BTreeMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_channel::{Receiver, Sender};
use async_trait::async_trait;
use conclave_lock_api::{Datagram, Transport};
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
    inboxes: BTreeMap<SocketAddr, Sender<Datagram>>,
    reach: Reachability,
    /// One-way delay of every datagram (reachability is judged when it arrives).
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
            if inbox.try_send(datagram).is_ok() {
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
        let (sender, inbox) = async_channel::unbounded();
        let mut state = self.lock();
        let port = FIRST_PORT + state.next_port;
        state.next_port += 1;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        state.inboxes.insert(addr, sender);
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

    /// Delays every datagram sent from now on by `delay` (zero: deliver at once). Datagrams
    /// sent close together may arrive out of order; the protocol copes.
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
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

/// One node's attachment to a [`MemoryNetwork`]. Dropping it detaches the address.
#[derive(Debug)]
pub struct MemoryTransport {
    addr: SocketAddr,
    inbox: Receiver<Datagram>,
    network: MemoryNetwork,
}

#[async_trait]
impl Transport for MemoryTransport {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn max_datagram_size(&self) -> usize {
        MAX_DATAGRAM
    }

    async fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.network.wait_delay().await;
        self.network.lock().deliver(self.addr, to, bytes);
        Ok(())
    }

    async fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        self.network.wait_delay().await;
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
        self.inbox
            .recv()
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::NotConnected, "memory network closed"))
    }
}

impl MemoryNetwork {
    /// Waits out the configured delay, if any (the state lock is not held meanwhile).
    async fn wait_delay(&self) {
        let delay = self.lock().delay;
        if !delay.is_zero() {
            async_io::Timer::after(delay).await;
        }
    }
}

impl Drop for MemoryTransport {
    fn drop(&mut self) {
        self.network.lock().inboxes.remove(&self.addr);
    }
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
            a.send_discovery(b"x").await.unwrap();
            b.send_to(c.local_addr(), b"y").await.unwrap();
            assert_eq!(c.recv().await.unwrap().bytes, b"y");
            assert!(b.inbox.is_empty() && c.inbox.is_empty());
            net.heal();
            net.isolate(c.local_addr());
            a.send_discovery(b"z").await.unwrap();
            assert_eq!(b.recv().await.unwrap().bytes, b"z");
            assert!(c.inbox.is_empty());
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
            a.send_to(b.local_addr(), b"late").await.unwrap();
            assert_eq!(b.recv().await.unwrap().bytes, b"late");
            // A lower bound only: the datagram cannot arrive before its delay.
            assert!(sent.elapsed() >= Duration::from_millis(30));
        });
        net.set_delay(Duration::ZERO);
    }
}
