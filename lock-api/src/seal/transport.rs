//! A [`Transport`] that seals what it sends and opens what it receives.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::sealer::{Opened, Sealer};
use crate::transport::{BlockingRecv, Datagram, Transport};

/// How many dropped datagrams one non-blocking receive reads past before it reports that
/// nothing is waiting (the next receive goes on): a flood cannot keep the caller in one call.
const DROPS_PER_TRY: usize = 64;

/// Wraps any [`Transport`] so that every datagram it carries is sealed with the cluster key:
/// see [the module docs](super).
///
/// The node builder wraps its transport in one whenever it is given a key (and, without a
/// key, in one that passes datagrams unchanged but recognises sealed packets, so a member
/// without the key can tell why it is refused). Its datagrams are [`super::SEAL_OVERHEAD`]
/// bytes shorter than the inner transport's.
pub struct SealedTransport {
    inner: Arc<dyn Transport>,
    sealer: Arc<Sealer>,
}

impl SealedTransport {
    /// `inner`, sealed by `sealer` (made for `inner`'s local address).
    pub fn new(inner: Arc<dyn Transport>, sealer: Arc<Sealer>) -> Self {
        Self { inner, sealer }
    }

    /// The sealer: its counters, its keyring and the first rejection met.
    pub fn sealer(&self) -> &Arc<Sealer> {
        &self.sealer
    }

    /// Judges one received datagram: `Some` to deliver, `None` when dropped (a notice, if
    /// any, is sent back; its failure is only logged).
    fn accept(&self, datagram: Datagram) -> Option<Datagram> {
        match self
            .sealer
            .open(Instant::now(), datagram.from, &datagram.bytes)
        {
            Opened::Datagram(bytes) => Some(Datagram {
                from: datagram.from,
                bytes,
            }),
            Opened::Dropped { notice } => {
                if let Some(notice) = notice {
                    if let Err(error) = self.inner.send_to(datagram.from, &notice) {
                        tracing::debug!(to = %datagram.from, %error, "rejection notice not sent");
                    }
                }
                None
            }
        }
    }
}

impl std::fmt::Debug for SealedTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedTransport")
            .field("local_addr", &self.inner.local_addr())
            .field("sealer", &self.sealer)
            .finish()
    }
}

#[async_trait]
impl Transport for SealedTransport {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn max_datagram_size(&self) -> usize {
        self.inner
            .max_datagram_size()
            .saturating_sub(self.sealer.overhead())
    }

    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > self.max_datagram_size() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        if self.sealer.keyring().is_none() {
            return self.inner.send_to(to, bytes);
        }
        self.inner.send_to(to, &self.sealer.seal(Some(to), bytes)?)
    }

    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        if bytes.len() > self.max_datagram_size() {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        if self.sealer.keyring().is_none() {
            return self.inner.send_discovery(bytes);
        }
        self.inner.send_discovery(&self.sealer.seal(None, bytes)?)
    }

    fn discovery_report(&self) -> Vec<crate::DiscoveryReport> {
        self.inner.discovery_report()
    }

    async fn recv(&self) -> io::Result<Datagram> {
        loop {
            let datagram = self.inner.recv().await?;
            if let Some(datagram) = self.accept(datagram) {
                return Ok(datagram);
            }
        }
    }

    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        self.inner.blocking().map(|_| self as &dyn BlockingRecv)
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    fn use_keyring(
        &self,
        cluster: crate::wire::ClusterId,
        keys: &super::Keyring,
        session: [u8; 16],
    ) {
        self.inner.use_keyring(cluster, keys, session);
    }
}

impl SealedTransport {
    /// Takes datagrams from the inner transport with `take` until one is accepted, at most
    /// [`DROPS_PER_TRY`] of them.
    fn try_recv_with(
        &self,
        take: impl Fn(&dyn BlockingRecv) -> io::Result<Option<Datagram>>,
    ) -> io::Result<Option<Datagram>> {
        let Some(inner) = self.inner.blocking() else {
            return Ok(None);
        };
        for _ in 0..DROPS_PER_TRY {
            match take(inner)? {
                Some(datagram) => {
                    if let Some(datagram) = self.accept(datagram) {
                        return Ok(Some(datagram));
                    }
                }
                None => return Ok(None),
            }
        }
        Ok(None)
    }
}

impl BlockingRecv for SealedTransport {
    fn recv_blocking(&self, timeout: Option<Duration>) -> io::Result<Option<Datagram>> {
        let Some(inner) = self.inner.blocking() else {
            return Ok(None);
        };
        // A dropped datagram ends the call early with `Ok(None)`, which callers loop on.
        Ok(inner.recv_blocking(timeout)?.and_then(|d| self.accept(d)))
    }

    fn try_recv(&self) -> io::Result<Option<Datagram>> {
        self.try_recv_with(|inner| inner.try_recv())
    }

    fn try_recv_ready(&self) -> io::Result<Option<Datagram>> {
        self.try_recv_with(|inner| inner.try_recv_ready())
    }

    fn interrupt(&self) {
        if let Some(inner) = self.inner.blocking() {
            inner.interrupt();
        }
    }
}
