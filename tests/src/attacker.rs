//! What the security suite attacks with: a tap that records a member's raw traffic, and an
//! outsider that sends raw bytes at a member over UDP or TCP.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use conclave::api::{BlockingRecv, Datagram, Transport};

/// Which way a tapped datagram went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Sent by the tapped member (to the address recorded).
    Sent,
    /// Received by the tapped member (from the address recorded).
    Received,
}

/// One datagram a tap saw, as it crossed the network (sealed, when the member has a key).
#[derive(Clone, Debug)]
pub struct Tapped {
    /// Sent or received.
    pub direction: Direction,
    /// The other end: the destination of a sent datagram (`None` for discovery), the source
    /// of a received one.
    pub peer: Option<SocketAddr>,
    /// The bytes on the wire.
    pub bytes: Vec<u8>,
}

/// The most datagrams a tap keeps (the oldest are dropped).
const TAP_MAX: usize = 100_000;

/// A transport that records every datagram its member sends and receives, as they are on the
/// wire, the way an eavesdropper on the network would: give it to the node builder in place
/// of the transport it wraps.
#[derive(Clone)]
pub struct Tap {
    inner: Arc<dyn Transport>,
    seen: Arc<Mutex<Vec<Tapped>>>,
    injected: Arc<Mutex<VecDeque<Datagram>>>,
}

impl Tap {
    /// Taps `inner`.
    pub fn new(inner: impl Transport) -> Self {
        Self {
            inner: Arc::new(inner),
            seen: Arc::default(),
            injected: Arc::default(),
        }
    }

    /// Puts `datagrams` in the member's receive path as if they had come from `from`: what
    /// an attacker on the path of an authenticated TCP connection can do (the mesh's
    /// handshake keeps anyone without the key from sending frames at all). Returns how many.
    /// Wakes a blocking receive; an async one sees them with the next datagram.
    pub fn inject<'a>(
        &self,
        from: SocketAddr,
        datagrams: impl IntoIterator<Item = &'a [u8]>,
    ) -> usize {
        let mut injected = self.injected.lock().unwrap_or_else(PoisonError::into_inner);
        let before = injected.len();
        injected.extend(datagrams.into_iter().map(|bytes| Datagram {
            from,
            bytes: bytes.to_vec(),
        }));
        let count = injected.len() - before;
        drop(injected);
        if let Some(blocking) = self.inner.blocking() {
            blocking.interrupt();
        }
        count
    }

    fn take_injected(&self) -> Option<Datagram> {
        self.injected
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
    }

    /// Everything seen so far.
    pub fn seen(&self) -> Vec<Tapped> {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn record(&self, direction: Direction, peer: Option<SocketAddr>, bytes: &[u8]) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.len() < TAP_MAX {
            seen.push(Tapped {
                direction,
                peer,
                bytes: bytes.to_vec(),
            });
        }
    }
}

#[async_trait]
impl Transport for Tap {
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }

    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.record(Direction::Sent, Some(to), bytes);
        self.inner.send_to(to, bytes)
    }

    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        self.record(Direction::Sent, None, bytes);
        self.inner.send_discovery(bytes)
    }

    fn discovery_report(&self) -> Vec<conclave::api::DiscoveryReport> {
        self.inner.discovery_report()
    }

    async fn recv(&self) -> io::Result<Datagram> {
        if let Some(datagram) = self.take_injected() {
            return Ok(datagram);
        }
        let datagram = self.inner.recv().await?;
        self.record(Direction::Received, Some(datagram.from), &datagram.bytes);
        Ok(datagram)
    }

    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        self.inner.blocking().map(|_| self as &dyn BlockingRecv)
    }

    async fn close(&self) {
        self.inner.close().await;
    }

    fn use_keyring(
        &self,
        cluster: conclave::api::wire::ClusterId,
        keys: &conclave::seal::Keyring,
        session: [u8; 16],
    ) {
        self.inner.use_keyring(cluster, keys, session);
    }
}

impl Tap {
    /// An injected datagram, or one taken from the inner transport with `take` and recorded.
    fn try_recv_with(
        &self,
        take: impl Fn(&dyn BlockingRecv) -> io::Result<Option<Datagram>>,
    ) -> io::Result<Option<Datagram>> {
        if let Some(datagram) = self.take_injected() {
            return Ok(Some(datagram));
        }
        let Some(inner) = self.inner.blocking() else {
            return Ok(None);
        };
        let datagram = take(inner)?;
        if let Some(d) = &datagram {
            self.record(Direction::Received, Some(d.from), &d.bytes);
        }
        Ok(datagram)
    }
}

impl BlockingRecv for Tap {
    fn recv_blocking(&self, timeout: Option<Duration>) -> io::Result<Option<Datagram>> {
        if let Some(datagram) = self.take_injected() {
            return Ok(Some(datagram));
        }
        let Some(inner) = self.inner.blocking() else {
            return Ok(None);
        };
        let datagram = inner.recv_blocking(timeout)?;
        if let Some(d) = &datagram {
            self.record(Direction::Received, Some(d.from), &d.bytes);
        }
        Ok(datagram)
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

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap")
            .field("local_addr", &self.inner.local_addr())
            .finish_non_exhaustive()
    }
}

/// An outsider on loopback sending raw bytes at members, as the backend `kind` carries them.
#[derive(Debug)]
pub enum Outsider {
    /// Datagrams from a UDP socket of its own.
    Udp(UdpSocket),
    /// Frames on TCP connections it opens, each after a well-formed version-1 hello naming
    /// its own address. A mesh without a key takes them; a keyed mesh closes the connection
    /// at the hello (no proof of the key), so none reaches the member.
    Tcp,
}

impl Outsider {
    /// An outsider speaking UDP from 127.0.0.1.
    pub fn udp() -> io::Result<Self> {
        Ok(Self::Udp(UdpSocket::bind("127.0.0.1:0")?))
    }

    /// An outsider speaking the TCP mesh's framing.
    pub fn tcp() -> Self {
        Self::Tcp
    }

    /// Sends every datagram of `datagrams` to `to`; returns how many went out.
    pub fn send_all<'a>(
        &self,
        to: SocketAddr,
        datagrams: impl IntoIterator<Item = &'a [u8]>,
    ) -> io::Result<usize> {
        match self {
            Self::Udp(socket) => {
                let mut sent = 0;
                for d in datagrams {
                    // A full socket buffer loses a datagram, as the network may.
                    if socket.send_to(d, to).is_ok() {
                        sent += 1;
                    }
                }
                Ok(sent)
            }
            Self::Tcp => {
                let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
                stream.set_nodelay(true)?;
                let mut out = hello(stream.local_addr()?);
                let mut sent = 0;
                for d in datagrams {
                    out.extend_from_slice(&u32::try_from(d.len()).unwrap_or(0).to_be_bytes());
                    out.extend_from_slice(d);
                    sent += 1;
                }
                stream.write_all(&out)?;
                stream.flush()?;
                // Close gracefully and drain what the member sends back (rejection notices):
                // closing with unread bytes would reset the connection and discard frames the
                // member has not read yet.
                stream.shutdown(std::net::Shutdown::Write)?;
                stream.set_read_timeout(Some(Duration::from_secs(5)))?;
                let _ = std::io::copy(&mut stream, &mut std::io::sink());
                Ok(sent)
            }
        }
    }
}

/// The TCP mesh's hello frame naming `addr` (format in `conclave-tcp`'s docs).
pub fn hello(addr: SocketAddr) -> Vec<u8> {
    let mut payload = b"CNCL".to_vec();
    payload.push(1);
    payload.extend_from_slice(&0x0bad_0bad_u64.to_be_bytes());
    match addr {
        SocketAddr::V4(a) => {
            payload.push(4);
            payload.extend_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            payload.push(6);
            payload.extend_from_slice(&a.ip().octets());
        }
    }
    payload.extend_from_slice(&addr.port().to_be_bytes());
    if addr.is_ipv6() {
        payload.extend_from_slice(&0u32.to_be_bytes());
    }
    let mut frame = u32::try_from(payload.len())
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    frame.extend_from_slice(&payload);
    frame
}

/// The hello of a TCP mesh with a cluster key (version 2) naming `addr` in `cluster` and
/// `key`'s id, with a challenge: well-formed, though whoever sends it cannot prove the key.
pub fn sealed_hello(
    addr: SocketAddr,
    cluster: conclave::api::wire::ClusterId,
    key: conclave::seal::KeyId,
) -> Vec<u8> {
    let mut payload = hello(addr).split_off(4);
    payload[4] = 2;
    payload.extend_from_slice(&cluster.0.to_be_bytes());
    payload.extend_from_slice(&key.0.to_be_bytes());
    payload.extend_from_slice(&[0x5a; 16]);
    let mut frame = u32::try_from(payload.len())
        .unwrap_or(0)
        .to_be_bytes()
        .to_vec();
    frame.extend_from_slice(&payload);
    frame
}
