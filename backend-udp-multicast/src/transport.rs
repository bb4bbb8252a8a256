//! The UDP transport: one unicast socket, one multicast socket for discovery.

use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, PoisonError};

use async_io::Async;
use async_trait::async_trait;
#[cfg(unix)]
use std::time::Duration;

use conclave_lock_api::wire::{DatagramKind, WireVersion};
#[cfg(unix)]
use conclave_lock_api::{wake::WakePipe, BlockingRecv};
use conclave_lock_api::{Datagram, DiscoveryOutcome, DiscoveryPlace, DiscoveryReport, Transport};
use event_listener::Event;
use futures::future::{select, Either};
use socket2::{Domain, Protocol, Socket, Type};
use tracing::debug;

use crate::config::UdpConfig;

/// The largest datagram a UDP socket can receive.
const RECEIVE_BUFFER: usize = 65_536;
/// The most clusters remembered from datagrams heard before this member sent its first.
const MAX_EARLY: usize = 8;

/// A [`Transport`] over UDP: unicast datagrams between members, multicast for discovery.
///
/// Sockets are driven by `async-io`'s reactor, so the transport works under any async runtime.
///
/// # Sends
/// A send is one non-blocking `sendto(2)` on the unicast socket, from the caller's thread.
/// When the socket's send buffer is full the datagram is dropped and the send fails with
/// `WouldBlock`; the protocol retransmits. Datagrams longer than
/// [`UdpConfig::max_datagram`] are refused with `InvalidInput`.
///
/// # Discovery report
/// [`Transport::discovery_report`] has one entry, the group on [`UdpConfig::interface`]:
/// `Answered` once a datagram of this member's cluster came from another address (the
/// transport compares its header with that of the first datagram this member sent), else
/// `NoAnswer`. Datagrams of other clusters sharing the group do not count.
///
/// # Close
/// [`Transport::close`] marks the transport closed: sends then fail with `NotConnected` and
/// receives (pending ones included) end with `NotConnected`. The sockets themselves close
/// when the transport is dropped.
#[derive(Debug)]
pub struct UdpMulticast {
    unicast: Async<UdpSocket>,
    multicast: Async<UdpSocket>,
    group: SocketAddr,
    interface: IpAddr,
    local: SocketAddr,
    max_datagram: usize,
    /// A datagram of our cluster came from another member: the discovery report's answer.
    answered: AtomicBool,
    /// What the report needs until `answered`.
    heard: Mutex<Heard>,
    scratch: Mutex<Vec<u8>>,
    /// [`Transport::close`] was called.
    closed: AtomicBool,
    /// Notified by [`Transport::close`], to end a pending [`Transport::recv`].
    closing: Event,
    /// Wakes a thread blocked in [`BlockingRecv::recv_blocking`].
    #[cfg(unix)]
    doorbell: WakePipe,
    /// The sockets the last `poll(2)` of [`BlockingRecv::recv_blocking`] found readable and
    /// that have not been read empty since ([`UNICAST`], [`MULTICAST`]): what
    /// [`BlockingRecv::try_recv_ready`] reads, so that draining a burst costs no receive on a
    /// socket that had nothing.
    #[cfg(unix)]
    ready: AtomicU8,
}

/// What the discovery report needs to know until a member of our cluster answers.
#[derive(Debug, Default)]
struct Heard {
    /// What our own datagrams say, from the first one we sent.
    ours: Option<DatagramKind>,
    /// The clusters of datagrams heard before that (at most [`MAX_EARLY`]).
    early: Vec<DatagramKind>,
}

/// Whether a datagram of kind `theirs` is of our cluster, ours being of kind `ours`: plain
/// datagrams of any version this build speaks count (members of two builds during a rolling
/// upgrade).
fn same_cluster(ours: DatagramKind, theirs: DatagramKind) -> bool {
    match (ours, theirs) {
        (
            DatagramKind::Plain { cluster: a, .. },
            DatagramKind::Plain {
                cluster: b,
                version,
            },
        ) => a == b && WireVersion::from_byte(version).is_some(),
        (DatagramKind::Sealed { .. }, DatagramKind::Sealed { .. }) => ours == theirs,
        _ => false,
    }
}

/// [`UdpMulticast::ready`]: the unicast socket.
#[cfg(unix)]
const UNICAST: u8 = 1;
/// [`UdpMulticast::ready`]: the discovery socket.
#[cfg(unix)]
const MULTICAST: u8 = 2;

impl UdpMulticast {
    /// Binds the unicast socket and joins the discovery group as `config` says.
    ///
    /// # Errors
    /// `InvalidInput` if the configuration does not validate (the error inside is the
    /// [`UdpConfigError`](crate::UdpConfigError), naming the setting; an unspecified
    /// [`UdpConfig::bind`] is one); any error of the system calls (address in use, no such
    /// interface, ...), of the same kind, its message naming the setting and the address:
    /// `binding the UDP socket (UdpConfig::bind) to 127.0.0.1:7800: Address already in use
    /// (os error 98)`.
    pub fn bind(config: &UdpConfig) -> io::Result<Self> {
        config
            .validate()
            .map_err(|e| io::Error::new(ErrorKind::InvalidInput, e))?;
        let (bind, interface, group) = (config.bind, config.interface, config.group);
        let unicast =
            Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(context(
                format_args!("opening the UDP socket (UdpConfig::bind {bind})"),
            ))?;
        unicast.bind(&bind.into()).map_err(context(format_args!(
            "binding the UDP socket (UdpConfig::bind) to {bind}"
        )))?;
        unicast
            .set_multicast_if_v4(&interface)
            .map_err(context(format_args!(
                "sending multicast on interface {interface} (UdpConfig::interface)"
            )))?;
        unicast
            .set_multicast_ttl_v4(config.ttl)
            .map_err(context(format_args!(
                "setting UdpConfig::ttl {}",
                config.ttl
            )))?;
        unicast
            .set_multicast_loop_v4(config.multicast_loop)
            .map_err(context(format_args!("setting UdpConfig::multicast_loop")))?;

        let discovery = || {
            format!(
                "the discovery socket (UdpConfig::group, UdpConfig::port) {group}:{}",
                config.port
            )
        };
        let multicast = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP))
            .map_err(context(format_args!("opening {}", discovery())))?;
        multicast
            .set_reuse_address(true)
            .map_err(context(format_args!(
                "setting SO_REUSEADDR on {}",
                discovery()
            )))?;
        #[cfg(unix)]
        multicast
            .set_reuse_port(true)
            .map_err(context(format_args!(
                "setting SO_REUSEPORT on {}",
                discovery()
            )))?;
        // Binding to the group address (where the system allows it) keeps datagrams of other
        // groups on the same port out of this socket.
        let bind_ip = if cfg!(unix) {
            config.group
        } else {
            std::net::Ipv4Addr::UNSPECIFIED
        };
        let discovery_addr = SocketAddr::from((bind_ip, config.port));
        multicast
            .bind(&discovery_addr.into())
            .map_err(context(format_args!(
                "binding the discovery socket (UdpConfig::group, UdpConfig::port) to \
                 {discovery_addr}"
            )))?;
        multicast
            .join_multicast_v4(&group, &interface)
            .map_err(context(format_args!(
                "joining multicast group {group} (UdpConfig::group) on interface {interface} \
                 (UdpConfig::interface)"
            )))?;
        multicast
            .set_multicast_loop_v4(config.multicast_loop)
            .map_err(context(format_args!(
                "setting UdpConfig::multicast_loop on {}",
                discovery()
            )))?;

        let unicast = Async::new(UdpSocket::from(unicast))?;
        let multicast = Async::new(UdpSocket::from(multicast))?;
        let local = unicast.get_ref().local_addr()?;
        debug!(%local, group = %config.group, port = config.port, ttl = config.ttl, "UDP transport bound");
        Ok(Self {
            unicast,
            multicast,
            group: SocketAddr::from((config.group, config.port)),
            interface: IpAddr::V4(config.interface),
            local,
            max_datagram: config.max_datagram,
            answered: AtomicBool::new(false),
            heard: Mutex::new(Heard::default()),
            scratch: Mutex::new(vec![0; RECEIVE_BUFFER]),
            closed: AtomicBool::new(false),
            #[cfg(unix)]
            ready: AtomicU8::new(0),
            closing: Event::new(),
            #[cfg(unix)]
            doorbell: WakePipe::new()?,
        })
    }

    /// Binds with [`UdpConfig::loopback`]: this host only.
    ///
    /// # Errors
    /// As [`UdpMulticast::bind`].
    pub fn loopback() -> io::Result<Self> {
        Self::bind(&UdpConfig::loopback())
    }

    /// The discovery group and port.
    pub fn group(&self) -> SocketAddr {
        self.group
    }

    /// Sends one datagram without blocking: see [`UdpMulticast`]'s `# Sends`.
    fn send(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        if bytes.len() > self.max_datagram {
            return Err(io::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "datagram of {} bytes is above max_datagram {}",
                    bytes.len(),
                    self.max_datagram
                ),
            ));
        }
        if !self.answered.load(Ordering::Relaxed) {
            self.sending(bytes);
        }
        // The socket is non-blocking (async-io made it so): a full send buffer is
        // `WouldBlock`, and the datagram is dropped.
        self.unicast.get_ref().send_to(bytes, to).map(|_| ())
    }

    /// Takes one datagram from either socket if one is waiting. An empty datagram (no
    /// Conclave datagram is empty) and one of our own (discovery looped back) are consumed and
    /// reported as `Some(None)`.
    ///
    /// # Errors
    /// `NotConnected` once the transport is closed; an error of the sockets.
    fn try_recv_any(&self) -> io::Result<Option<Option<Datagram>>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        for socket in [&self.unicast, &self.multicast] {
            if let Some(datagram) = self.try_recv(socket)? {
                return Ok(Some(self.for_us(datagram)));
            }
        }
        Ok(None)
    }

    /// `datagram`, unless it is empty (no Conclave datagram is) or our own (the multicast
    /// loop brings our discovery datagrams back).
    fn for_us(&self, datagram: Datagram) -> Option<Datagram> {
        let ours = !datagram.bytes.is_empty() && datagram.from != self.local;
        if ours && !self.answered.load(Ordering::Relaxed) {
            self.heard(&datagram.bytes);
        }
        ours.then_some(datagram)
    }

    /// We send `bytes`: the first datagram tells our cluster (a notice does not).
    fn sending(&self, bytes: &[u8]) {
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        if heard.ours.is_some() {
            return;
        }
        heard.ours =
            DatagramKind::peek(bytes).filter(|kind| !matches!(kind, DatagramKind::Notice { .. }));
        if let Some(ours) = heard.ours {
            if heard.early.iter().any(|theirs| same_cluster(ours, *theirs)) {
                self.answered.store(true, Ordering::Relaxed);
            }
            heard.early = Vec::new();
        }
    }

    /// A datagram came from another address: of our cluster, an answer.
    fn heard(&self, bytes: &[u8]) {
        let Some(theirs) = DatagramKind::peek(bytes) else {
            return;
        };
        let mut heard = self.heard.lock().unwrap_or_else(PoisonError::into_inner);
        match heard.ours {
            Some(ours) if same_cluster(ours, theirs) => {
                self.answered.store(true, Ordering::Relaxed);
            }
            Some(_) => {}
            None if heard.early.len() < MAX_EARLY && !heard.early.contains(&theirs) => {
                heard.early.push(theirs);
            }
            None => {}
        }
    }

    /// Takes one datagram from the sockets marked in `ready` (unicast first), unmarking each
    /// found empty. `Some(None)` as in [`UdpMulticast::try_recv_any`].
    ///
    /// # Errors
    /// `NotConnected` once the transport is closed; an error of the sockets.
    #[cfg(unix)]
    fn try_recv_marked(&self) -> io::Result<Option<Option<Datagram>>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        for (bit, socket) in [(UNICAST, &self.unicast), (MULTICAST, &self.multicast)] {
            if self.ready.load(Ordering::Relaxed) & bit == 0 {
                continue;
            }
            match self.try_recv(socket)? {
                Some(datagram) => return Ok(Some(self.for_us(datagram))),
                None => {
                    self.ready.fetch_and(!bit, Ordering::Relaxed);
                }
            }
        }
        Ok(None)
    }

    /// Takes one datagram from `socket` if one is waiting.
    fn try_recv(&self, socket: &Async<UdpSocket>) -> io::Result<Option<Datagram>> {
        let mut buf = self
            .scratch
            .lock()
            .map_err(|_| io::Error::other("receive buffer poisoned"))?;
        match socket.get_ref().recv_from(&mut buf) {
            Ok((len, from)) => Ok(Some(Datagram {
                from,
                bytes: buf[..len].to_vec(),
            })),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(None),
            // An ICMP error about an earlier send to a member that is gone: not ours to fail.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionRefused | ErrorKind::ConnectionReset
                ) =>
            {
                debug!(error = %e, "ignored ICMP error on receive");
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl Transport for UdpMulticast {
    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn max_datagram_size(&self) -> usize {
        self.max_datagram
    }

    /// One non-blocking `sendto(2)`: see [`UdpMulticast`]'s `# Sends`.
    ///
    /// # Errors
    /// `WouldBlock` (dropped: the send buffer is full), `InvalidInput` (too long),
    /// `NotConnected` (closed), or another error of the system call.
    fn send_to(&self, to: SocketAddr, bytes: &[u8]) -> io::Result<()> {
        self.send(to, bytes)
    }

    /// One non-blocking `sendto(2)` to the group; the multicast loop brings it to the other
    /// members on this host, and this member's unicast socket never hears it.
    ///
    /// # Errors
    /// As [`Transport::send_to`].
    fn send_discovery(&self, bytes: &[u8]) -> io::Result<()> {
        self.send(self.group, bytes)
    }

    async fn recv(&self) -> io::Result<Datagram> {
        loop {
            // Listen first, then look: a close between the two is not missed.
            let closing = self.closing.listen();
            match self.try_recv_any()? {
                Some(Some(datagram)) => return Ok(datagram),
                Some(None) => continue,
                None => {}
            }
            let unicast = pin!(self.unicast.readable());
            let multicast = pin!(self.multicast.readable());
            match select(closing, select(unicast, multicast)).await {
                Either::Left(((), _)) => {}
                Either::Right((Either::Left((ready, _)) | Either::Right((ready, _)), _)) => ready?,
            }
        }
    }

    /// Marks the transport closed and wakes its receivers: see [`UdpMulticast`]'s `# Close`.
    async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.notify(usize::MAX);
        #[cfg(unix)]
        self.doorbell.ring();
        debug!(local = %self.local, "UDP transport closed");
    }

    #[cfg(unix)]
    fn blocking(&self) -> Option<&dyn BlockingRecv> {
        Some(self)
    }

    /// The group on its interface: see [`UdpMulticast`]'s `# Discovery report`.
    fn discovery_report(&self) -> Vec<DiscoveryReport> {
        vec![DiscoveryReport {
            place: DiscoveryPlace::Multicast {
                group: self.group,
                interface: self.interface,
            },
            outcome: if self.answered.load(Ordering::Relaxed) {
                DiscoveryOutcome::Answered
            } else {
                DiscoveryOutcome::NoAnswer
            },
        }]
    }
}

/// The driver's thread waits in `poll(2)` on both sockets, so the kernel wakes it directly
/// when a datagram arrives; a pipe (the doorbell) in the same poll interrupts it. It polls
/// first, without trying the sockets: its caller has just drained them
/// ([`BlockingRecv::try_recv_ready`]), and `poll(2)` returns at once for a datagram that came
/// since. After the poll it reads only the sockets the poll found readable.
#[cfg(unix)]
impl BlockingRecv for UdpMulticast {
    fn recv_blocking(&self, timeout: Option<Duration>) -> io::Result<Option<Datagram>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(closed());
        }
        // A timeout too long for a timespec waits without limit; callers loop anyway.
        let timeout = timeout.and_then(|t| rustix::event::Timespec::try_from(t).ok());
        let readable = rustix::event::PollFlags::IN;
        let mut fds = [
            rustix::event::PollFd::new(self.unicast.get_ref(), readable),
            rustix::event::PollFd::new(self.multicast.get_ref(), readable),
            rustix::event::PollFd::from_borrowed_fd(self.doorbell.read_end(), readable),
        ];
        match rustix::event::poll(&mut fds, timeout.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(errno.into()),
        }
        let mut ready = 0;
        for (bit, fd) in [(UNICAST, &fds[0]), (MULTICAST, &fds[1])] {
            if !fd.revents().is_empty() {
                ready |= bit;
            }
        }
        self.ready.store(ready, Ordering::Relaxed);
        if !fds[2].revents().is_empty() {
            self.doorbell.answer();
            return Ok(None);
        }
        Ok(self.try_recv_marked()?.flatten())
    }

    fn try_recv(&self) -> io::Result<Option<Datagram>> {
        Ok(self.try_recv_any()?.flatten())
    }

    /// Reads on only from the sockets the last wait found readable, until each is empty.
    fn try_recv_ready(&self) -> io::Result<Option<Datagram>> {
        Ok(self.try_recv_marked()?.flatten())
    }

    fn interrupt(&self) {
        self.doorbell.ring();
    }
}

/// Wraps an error of a system call in what was being done, naming the setting and the address
/// (the kind stays).
fn context(what: std::fmt::Arguments<'_>) -> impl FnOnce(io::Error) -> io::Error {
    let what = what.to_string();
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The error of sends and receives after [`Transport::close`].
fn closed() -> io::Error {
    io::Error::new(ErrorKind::NotConnected, "the UDP transport is closed")
}
