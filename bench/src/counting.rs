//! A transport wrapper that shows every datagram it sends to a counter: how the benchmark
//! measures a member's traffic from outside the library.

use std::net::SocketAddr;

use conclave::api::{BlockingRecv, Datagram, DiscoveryReport, Transport};

/// What a [`Counting`] transport tells of each datagram it sends.
pub(crate) trait SendCounter: Send + Sync + 'static {
    /// Called with each datagram before it is sent; `discovery` when it goes to the discovery
    /// channel rather than to one member.
    fn count(&self, bytes: &[u8], discovery: bool);
}

/// A transport that passes everything on to `inner` and shows each datagram it sends to
/// `counter`.
pub(crate) struct Counting<T, C> {
    pub(crate) inner: T,
    pub(crate) counter: C,
}

#[async_trait::async_trait]
impl<T: Transport, C: SendCounter> Transport for Counting<T, C> {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }
    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> std::io::Result<()> {
        self.counter.count(bytes, false);
        self.inner.send_to(to, bytes)
    }
    fn send_discovery(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.counter.count(bytes, true);
        self.inner.send_discovery(bytes)
    }
    fn discovery_report(&self) -> Vec<DiscoveryReport> {
        self.inner.discovery_report()
    }
    async fn recv(&self) -> std::io::Result<Datagram> {
        self.inner.recv().await
    }
    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        self.inner.blocking()
    }
    async fn close(&self) {
        self.inner.close().await;
    }
}
