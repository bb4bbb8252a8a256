//! Fault injection for any transport: isolate a node, split the cluster, heal.
//!
//! [`Faults`] is a shared table of which node may hear which. The in-memory network consults
//! one directly; [`Faults::wrap`] puts one in front of any other [`Transport`] (real UDP
//! sockets, say), dropping on receive every datagram its node may not hear. Tests and demos
//! use it to make a coordinator vanish or a partition appear on real sockets.
//!
//! ```
//! use conclave::faults::Faults;
//! use conclave::memory::MemoryNetwork;
//! use conclave::api::Transport;
//!
//! let network = MemoryNetwork::new();
//! let faults = Faults::new();
//! let a = faults.wrap(network.transport());
//! let b = faults.wrap(network.transport());
//! faults.isolate(b.local_addr());
//! assert!(!faults.reachable(a.local_addr(), b.local_addr()));
//! faults.heal();
//! assert!(faults.reachable(a.local_addr(), b.local_addr()));
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use conclave_lock_api::{Datagram, Transport};
use tracing::trace;

/// Who may hear whom: isolated nodes and partition groups.
#[derive(Debug, Default)]
pub(crate) struct Reachability {
    /// Nodes whose traffic, in and out, is dropped.
    isolated: BTreeSet<SocketAddr>,
    /// While partitioned: the group of each node; nodes in different groups (or in none) do
    /// not hear each other.
    groups: Option<BTreeMap<SocketAddr, usize>>,
}

impl Reachability {
    pub(crate) fn reachable(&self, from: SocketAddr, to: SocketAddr) -> bool {
        if self.isolated.contains(&from) || self.isolated.contains(&to) {
            return false;
        }
        match &self.groups {
            None => true,
            Some(groups) => match (groups.get(&from), groups.get(&to)) {
                (Some(a), Some(b)) => a == b,
                _ => false,
            },
        }
    }

    pub(crate) fn isolate(&mut self, addr: SocketAddr) {
        self.isolated.insert(addr);
    }

    pub(crate) fn restore(&mut self, addr: SocketAddr) {
        self.isolated.remove(&addr);
    }

    pub(crate) fn partition(&mut self, groups: &[&[SocketAddr]]) {
        let map = groups
            .iter()
            .enumerate()
            .flat_map(|(i, group)| group.iter().map(move |addr| (*addr, i)))
            .collect();
        self.groups = Some(map);
    }

    pub(crate) fn heal(&mut self) {
        self.groups = None;
        self.isolated.clear();
    }
}

/// A shared fault table; clones are handles to the same table.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    table: Arc<Mutex<Reachability>>,
}

impl Faults {
    /// No faults yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts this fault table in front of `transport`.
    pub fn wrap<T: Transport>(&self, transport: T) -> Faulty<T> {
        Faulty {
            inner: transport,
            faults: self.clone(),
        }
    }

    /// Drops everything sent to or by `addr` until [`Faults::restore`] or [`Faults::heal`]:
    /// to the others the node looks crashed.
    pub fn isolate(&self, addr: SocketAddr) {
        self.table().isolate(addr);
    }

    /// Lets the traffic of an isolated node through again.
    pub fn restore(&self, addr: SocketAddr) {
        self.table().restore(addr);
    }

    /// Splits the cluster: nodes hear only the nodes of their own group; nodes in no group
    /// hear nobody.
    pub fn partition(&self, groups: &[&[SocketAddr]]) {
        self.table().partition(groups);
    }

    /// Ends every partition and isolation.
    pub fn heal(&self) {
        self.table().heal();
    }

    /// Whether a datagram from `from` reaches `to` now.
    pub fn reachable(&self, from: SocketAddr, to: SocketAddr) -> bool {
        self.table().reachable(from, to)
    }

    fn table(&self) -> MutexGuard<'_, Reachability> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A transport behind a [`Faults`] table (see [`Faults::wrap`]).
#[derive(Debug)]
pub struct Faulty<T> {
    inner: T,
    faults: Faults,
}

#[async_trait]
impl<T: Transport> Transport for Faulty<T> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }

    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        if self.faults.reachable(self.local_addr(), to) {
            self.inner.send_to(to, bytes)
        } else {
            Ok(())
        }
    }

    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        // Receivers filter discovery by sender; an isolated node's is dropped here already.
        if self.faults.table().isolated.contains(&self.local_addr()) {
            return Ok(());
        }
        self.inner.send_discovery(bytes)
    }

    fn discovery_report(&self) -> Vec<conclave_lock_api::DiscoveryReport> {
        self.inner.discovery_report()
    }

    async fn recv(&self) -> io::Result<Datagram> {
        loop {
            let datagram = self.inner.recv().await?;
            if self.faults.reachable(datagram.from, self.local_addr()) {
                return Ok(datagram);
            }
            trace!(from = %datagram.from, to = %self.local_addr(), "fault table: datagram dropped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryNetwork;

    #[test]
    fn a_partition_drops_datagrams_between_groups_until_healed() {
        let network = MemoryNetwork::new();
        let faults = Faults::new();
        let (a, b, c) = (
            faults.wrap(network.transport()),
            faults.wrap(network.transport()),
            faults.wrap(network.transport()),
        );
        faults.partition(&[&[a.local_addr()], &[b.local_addr(), c.local_addr()]]);
        smol::block_on(async {
            a.send_to(b.local_addr(), b"cut").unwrap();
            c.send_to(b.local_addr(), b"same side").unwrap();
            assert_eq!(b.recv().await.unwrap().bytes, b"same side");
            faults.heal();
            a.send_to(b.local_addr(), b"healed").unwrap();
            assert_eq!(b.recv().await.unwrap().bytes, b"healed");
            faults.isolate(a.local_addr());
            a.send_discovery(b"gone").unwrap();
            c.send_discovery(b"here").unwrap();
            let got = b.recv().await.unwrap();
            assert_eq!((got.from, &got.bytes[..]), (c.local_addr(), &b"here"[..]));
        });
    }
}
