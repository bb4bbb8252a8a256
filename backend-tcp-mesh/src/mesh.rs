//! The TCP mesh transport: a listener, one connection per member, driven by `recv` (or, on
//! Unix, by the blocking receive of `blocking`).

#[cfg(unix)]
mod blocking;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, TcpListener};
#[cfg(unix)]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use async_io::{Async, Timer};
use async_trait::async_trait;
use conclave_lock_api::seal::Keyring;
use conclave_lock_api::wire::ClusterId;
#[cfg(unix)]
use conclave_lock_api::BlockingRecv;
use conclave_lock_api::{Datagram, DiscoveryReport, Transport};
use futures::future::select;
use socket2::{Domain, Protocol, Socket, Type};
use tracing::debug;

use crate::config::TcpConfig;
use crate::state::{closed, Mode, State, Step};
use crate::stats::TcpStats;
use crate::wake::Doorbell;

/// Pending connections the kernel keeps for the listener.
const BACKLOG: i32 = 1024;

/// A [`Transport`] over a full TCP mesh: one connection per member pair, seed-list discovery.
///
/// Built by [`TcpMesh::bind`]. Sockets are driven by `async-io`'s reactor, so the mesh works
/// under any async runtime. There is no background thread: a send writes straight to the
/// socket when it can, and everything else (accepts, connects, queued writes, reads,
/// timeouts) happens inside [`Transport::recv`] and [`Transport::close`]. Keep one `recv`
/// pending at all times, as the node's driver does, or connects, queued frames and accepts
/// wait. Sends may come from other threads meanwhile; one that leaves work behind wakes the
/// pending `recv`.
///
/// On Unix the mesh also has a blocking receive ([`Transport::blocking`], [`BlockingRecv`]):
/// the same work, done by a thread that waits in `poll(2)` on the mesh's sockets instead of
/// in the reactor. Keep a thread in `recv_blocking` (or calling `try_recv` often) in that
/// mode, as you would keep a `recv` pending in the other.
///
/// # Receivers
/// The trait expects one caller of `recv` at a time. A second concurrent call is safe (every
/// socket event wakes every waiting call, so none misses one, and they share the work) but
/// pointless. The same holds of `recv_blocking`; `try_recv` may be called from any thread at
/// any time, next to either. The two modes may even be mixed on one mesh, though each then
/// wakes for work the other does.
///
/// # Dropping
/// Dropping the mesh closes every socket at once, without the flush of [`Transport::close`].
pub struct TcpMesh {
    state: Mutex<State>,
    bell: Arc<Doorbell>,
    /// [`BlockingRecv::interrupt`] was called and no `recv_blocking` has returned for it yet.
    #[cfg(unix)]
    interrupted: AtomicBool,
    local: SocketAddr,
    max_frame: usize,
    close_timeout: Duration,
}

impl fmt::Debug for TcpMesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpMesh")
            .field("local", &self.local)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl TcpMesh {
    /// Listens as `config` says. Nothing is dialled until the first send.
    ///
    /// # Errors
    /// `InvalidInput` if the configuration does not validate (the error inside is the
    /// [`TcpConfigError`](crate::TcpConfigError), naming the setting; an unspecified
    /// [`TcpConfig::bind`] is one); any error of the system calls (address in use, address not
    /// available, ...), of the same kind, its message naming the setting and the address:
    /// `binding the TCP listener (TcpConfig::bind) to 127.0.0.1:7800: Address already in use
    /// (os error 98)`.
    pub fn bind(config: &TcpConfig) -> io::Result<Self> {
        config
            .validate()
            .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        let bind = config.bind;
        // Each error names the setting and the address.
        let failed = |what: &'static str| {
            move |e: io::Error| {
                io::Error::new(e.kind(), format!("{what} (TcpConfig::bind {bind}): {e}"))
            }
        };
        let socket = Socket::new(Domain::for_address(bind), Type::STREAM, Some(Protocol::TCP))
            .map_err(failed("opening the TCP listener's socket"))?;
        if bind.is_ipv6() {
            socket
                .set_only_v6(true)
                .map_err(failed("setting IPV6_V6ONLY on the TCP listener"))?;
        }
        // Lets a restarted member listen on its old port while old connections linger in
        // TIME_WAIT (on Windows the option means something else, and is not needed).
        #[cfg(unix)]
        socket
            .set_reuse_address(true)
            .map_err(failed("setting SO_REUSEADDR on the TCP listener"))?;
        socket.bind(&bind.into()).map_err(|e| {
            let what = format!("binding the TCP listener (TcpConfig::bind) to {bind}");
            io::Error::new(e.kind(), format!("{what}: {e}"))
        })?;
        socket
            .listen(BACKLOG)
            .map_err(failed("listening on the TCP listener"))?;
        let listener = Async::new(TcpListener::from(socket))?;
        let local = listener.get_ref().local_addr()?;
        let bell = Arc::new(Doorbell::new()?);
        let state = State::new(
            config.clone(),
            listener,
            local,
            instance_id(local),
            Arc::clone(&bell),
        );
        debug!(%local, seeds = ?config.seeds, "TCP mesh listening");
        Ok(Self {
            state: Mutex::new(state),
            bell,
            #[cfg(unix)]
            interrupted: AtomicBool::new(false),
            local,
            max_frame: config.max_frame,
            close_timeout: config.close_timeout,
        })
    }

    /// Binds with [`TcpConfig::loopback`] and these seeds: this host only.
    ///
    /// # Errors
    /// As [`TcpMesh::bind`].
    pub fn loopback(seeds: impl IntoIterator<Item = SocketAddr>) -> io::Result<Self> {
        Self::bind(&TcpConfig {
            seeds: seeds.into_iter().collect(),
            ..TcpConfig::loopback()
        })
    }

    /// A snapshot of the connections and counters.
    pub fn stats(&self) -> TcpStats {
        self.lock().stats()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every step leaves the state consistent, so a panic elsewhere cannot corrupt it.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl Transport for TcpMesh {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn max_datagram_size(&self) -> usize {
        self.max_frame
    }

    /// Sends one frame to the member listening at `to`, dialling it if needed. Never blocks
    /// and never waits (see the trait's send contract): the frame is written if the socket
    /// takes it, put in the member's bounded queue otherwise (which the receive side, or
    /// `close`, flushes), and dropped (with `Ok`, counted in [`TcpStats`])
    /// if the member's queue is full, the mesh's budget of queued bytes
    /// ([`TcpConfig::max_queued_bytes`](crate::TcpConfig::max_queued_bytes)) would be
    /// exceeded, or the member's address is in reconnect backoff.
    ///
    /// # Errors
    /// `InvalidInput` if `bytes` is longer than `max_frame`; `NotConnected` after `close`.
    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.lock().send(to, bytes, Instant::now())
    }

    /// Sends one frame to every seed and every member with a connection, never to ourselves;
    /// each as [`Transport::send_to`] does.
    ///
    /// # Errors
    /// As [`Transport::send_to`].
    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        self.lock().send_discovery(bytes, Instant::now())
    }

    /// Drives the mesh (accepts, connects, flushes, reads, timeouts) until a frame arrives.
    ///
    /// # Cancel safety
    /// Cancel-safe: bytes read but not returned stay in the connection's buffer for the next
    /// call.
    ///
    /// # Errors
    /// `NotConnected` once the mesh is closed.
    async fn recv(&self) -> io::Result<Datagram> {
        loop {
            // Listen first, then look: a ring between the two is not missed.
            let listener = self.bell.listen();
            let step = self.lock().drive(Instant::now(), Mode::Async);
            match step {
                Step::Datagram(datagram) => return Ok(datagram),
                Step::Closed => return Err(closed()),
                Step::Idle(None) => listener.await,
                Step::Idle(Some(at)) => {
                    select(listener, Timer::at(at)).await;
                }
            }
        }
    }

    /// The blocking receive: see [`BlockingRecv`] for [`TcpMesh`].
    #[cfg(unix)]
    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        Some(self)
    }

    /// Stops accepting, sending and receiving, flushes queued frames (completing connects in
    /// progress) for up to `close_timeout`, then sends FIN on every connection and closes it.
    ///
    /// # Cancel safety
    /// Dropped midway, the mesh stays closed to sends and receives; its connections close
    /// when the mesh is dropped (or when `close` is called again).
    async fn close(&self) {
        // Past the end of the clock: flush without a deadline.
        let deadline = Instant::now().checked_add(self.close_timeout);
        if self.lock().begin_close() {
            loop {
                let listener = self.bell.listen();
                let late = deadline.is_some_and(|deadline| Instant::now() >= deadline);
                if self.lock().flush_for_close() || late {
                    break;
                }
                match deadline {
                    Some(deadline) => {
                        select(listener, Timer::at(deadline)).await;
                    }
                    None => listener.await,
                }
            }
        }
        self.lock().finish_close();
        debug!(local = %self.local, "TCP mesh closed");
    }

    /// One report per seed ([`TcpConfig::seeds`](crate::TcpConfig::seeds), but not this
    /// member's own address), in address order:
    /// - `Unreachable` with the last connect error (the system's text, such as
    ///   `Connection refused (os error 111)`, or the `connect_timeout` that passed);
    /// - `Refused` when a connection was made but its handshake failed (another cluster key,
    ///   or none; not a Conclave TCP mesh; no hello in time) or the seed's frames name another
    ///   cluster, protocol version or sealing;
    /// - `Answered` once a frame of this member's cluster came from the seed (with a cluster
    ///   key: once the handshake proved the key);
    /// - `NoAnswer` when never tried, or connected with nothing heard yet.
    ///
    /// Without a cluster key a hello names no cluster, so the mesh compares the header of the
    /// seed's frames with that of the first frame this member sent
    /// ([`DatagramKind`](conclave_lock_api::wire::DatagramKind)). A seed that fails to connect
    /// is also logged at WARN (`cannot connect to seed ...`), at most every 10 s per seed
    /// unless its error changes.
    fn discovery_report(&self) -> Vec<DiscoveryReport> {
        self.lock().discovery_report()
    }

    /// Makes every connection prove a key of `keys` before it is trusted: see
    /// [Trust](crate#trust). Call it before the first send or receive (the node builder
    /// does); connections already open are closed. Keep using the keyring handle to rotate
    /// keys: the mesh reads it on every handshake.
    fn use_keyring(&self, cluster: ClusterId, keys: &Keyring, session: [u8; 16]) {
        self.lock().use_keyring(cluster, keys.clone(), session);
        self.bell.notify();
    }
}

/// A random id of this mesh instance, so peers tell a restart at the same address apart.
fn instance_id(local: SocketAddr) -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    if let Ok(since) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        hasher.write_u128(since.as_nanos());
    }
    hasher.write(local.to_string().as_bytes());
    hasher.finish()
}
