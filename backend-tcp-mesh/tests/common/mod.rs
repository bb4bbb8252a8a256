//! Helpers shared by the integration tests: bounded waits, a thread that keeps a mesh's
//! `recv` pending, and raw-socket tools for playing a hostile or slow peer.

#![allow(dead_code)]

use std::future::Future;
use std::io::{ErrorKind, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use async_io::{block_on, Timer};
use conclave_lock_api::{Datagram, Transport};
use conclave_tcp::{TcpConfig, TcpMesh, TcpStats};
use futures::future::{select, Either};

/// The bound on every wait that should succeed.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// `f`'s output, or `None` after `limit`.
pub(crate) async fn within<T>(limit: Duration, f: impl Future<Output = T>) -> Option<T> {
    match select(pin!(f), pin!(Timer::after(limit))).await {
        Either::Left((value, _)) => Some(value),
        Either::Right(_) => None,
    }
}

/// Runs `f` to completion on this thread; panics if it takes longer than `limit`.
pub(crate) fn run<T>(limit: Duration, what: &str, f: impl Future<Output = T>) -> T {
    block_on(within(limit, f)).unwrap_or_else(|| panic!("{what}: not done within {limit:?}"))
}

/// Checks `condition` every few milliseconds until it holds (true) or `limit` passes (false).
/// For states no event announces, such as counters.
pub(crate) fn eventually(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

/// A mesh whose `recv` a thread of its own keeps pending, as a node's driver does; received
/// datagrams come out of [`Pump::recv`]. Sends run on the test's thread.
pub(crate) struct Pump {
    pub(crate) mesh: Arc<TcpMesh>,
    received: mpsc::Receiver<Datagram>,
    stop: Option<smol::channel::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    pub(crate) fn new(mesh: TcpMesh) -> Self {
        let mesh = Arc::new(mesh);
        let (tx, received) = mpsc::channel();
        let (stop, stopped) = smol::channel::bounded::<()>(1);
        let driven = Arc::clone(&mesh);
        let thread = thread::spawn(move || {
            block_on(async move {
                loop {
                    let stop = pin!(stopped.recv());
                    match select(driven.recv(), stop).await {
                        Either::Left((Ok(datagram), _)) => {
                            if tx.send(datagram).is_err() {
                                break;
                            }
                        }
                        Either::Left((Err(_), _)) | Either::Right(_) => break,
                    }
                }
            });
        });
        Self {
            mesh,
            received,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    pub(crate) fn bind(config: &TcpConfig) -> Self {
        Self::new(TcpMesh::bind(config).expect("bind"))
    }

    pub(crate) fn loopback(seeds: &[SocketAddr]) -> Self {
        Self::new(TcpMesh::loopback(seeds.iter().copied()).expect("bind"))
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.mesh.local_addr()
    }

    pub(crate) fn stats(&self) -> TcpStats {
        self.mesh.stats()
    }

    /// Sends; panics if the send fails or takes longer than [`LIMIT`].
    pub(crate) fn send(&self, to: SocketAddr, bytes: &[u8]) {
        self.mesh.send_to(to, bytes).expect("send_to");
    }

    pub(crate) fn discover(&self, bytes: &[u8]) {
        self.mesh.send_discovery(bytes).expect("send_discovery");
    }

    /// The next datagram received, waiting at most `limit`.
    pub(crate) fn recv(&self, limit: Duration) -> Option<Datagram> {
        self.received.recv_timeout(limit).ok()
    }

    /// Closes the mesh (bounded) and stops the thread.
    pub(crate) fn close(mut self) {
        run(LIMIT, "close", self.mesh.close());
        self.halt();
    }

    fn halt(&mut self) {
        // Closing the channel ends the thread's loop at its next poll.
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("receive thread");
        }
    }
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.halt();
    }
}

/// A frame as on the wire.
pub(crate) fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// A hello frame, built from the format the crate documents.
pub(crate) fn hello(version: u8, instance: u64, addr: SocketAddr) -> Vec<u8> {
    let mut payload = b"CNCL".to_vec();
    payload.push(version);
    payload.extend_from_slice(&instance.to_be_bytes());
    match addr {
        SocketAddr::V4(a) => {
            payload.push(4);
            payload.extend_from_slice(&a.ip().octets());
            payload.extend_from_slice(&a.port().to_be_bytes());
        }
        SocketAddr::V6(a) => {
            payload.push(6);
            payload.extend_from_slice(&a.ip().octets());
            payload.extend_from_slice(&a.port().to_be_bytes());
            payload.extend_from_slice(&a.scope_id().to_be_bytes());
        }
    }
    frame(&payload)
}

/// Reads until the peer closes (EOF or reset): `Some(bytes read)`, or `None` if it did not
/// close within `limit`.
pub(crate) fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let deadline = Instant::now() + limit;
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        match stream.read(&mut buf) {
            Ok(0) => return Some(all),
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Some(all),
        }
    }
}

/// Splits a byte stream into frame payloads (a trailing partial frame is ignored).
pub(crate) fn frames(mut bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    while bytes.len() >= 4 {
        let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if bytes.len() < 4 + len {
            break;
        }
        out.push(bytes[4..4 + len].to_vec());
        bytes = &bytes[4 + len..];
    }
    out
}

/// A loopback address on which nothing listens (bound, then released).
pub(crate) fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// Reads from `stream` until `count` whole frames arrived (`Some`, with any more that came
/// along), or the peer closed or `limit` passed first (`None`).
pub(crate) fn read_frames(
    stream: &mut TcpStream,
    count: usize,
    limit: Duration,
) -> Option<Vec<Vec<u8>>> {
    let deadline = Instant::now() + limit;
    let mut all = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let got = frames(&all);
        if got.len() >= count {
            return Some(got);
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .expect("read timeout");
        match stream.read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// A TCP port forward on loopback: another address for a member (as a DNS alias, a port
/// forward or a load balancer in front of a seed would give it). Each accepted connection is
/// joined to a new one to the target, bytes copied both ways until either side closes.
pub(crate) struct Forward {
    addr: SocketAddr,
    forwarded: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Forward {
    pub(crate) fn to(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let forwarded = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (forwarded, stop) = (Arc::clone(&forwarded), Arc::clone(&stop));
            thread::spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let (Ok(client), Ok(server)) = (client, TcpStream::connect(target)) else {
                        continue;
                    };
                    forwarded.fetch_add(1, Ordering::SeqCst);
                    for (from, to) in [(&client, &server), (&server, &client)] {
                        let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
                            continue;
                        };
                        // Ends when either side closes (the meshes close theirs at the latest
                        // when the test drops them).
                        thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(Shutdown::Write);
                        });
                    }
                }
            })
        };
        Self {
            addr,
            forwarded,
            stop,
            thread: Some(thread),
        }
    }

    /// The alias: connections here reach the target.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections forwarded so far.
    pub(crate) fn forwarded(&self) -> usize {
        self.forwarded.load(Ordering::SeqCst)
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
