//! `conclave-tcp`: a Conclave membership backend over a full TCP mesh.
//!
//! For networks without multicast (most clouds): members find each other from a seed list and
//! keep one TCP connection per pair, carrying length-prefixed frames. The backend only moves
//! bytes; views, failure detection, reliability and locking live in `conclave-protocol`, which
//! cuts messages to [`Transport::max_datagram_size`](conclave_lock_api::Transport::max_datagram_size).
//!
//! # Addresses and discovery
//! A member is known by its listen address ([`TcpConfig::bind`], with the real port once
//! bound): that is its [`Transport::local_addr`](conclave_lock_api::Transport::local_addr),
//! the address `send_to` dials, and the `from` of every datagram it sends. Discovery
//! (`send_discovery`) goes to every seed and every member with a connection, never to
//! ourselves; a seed answers with its view and the protocol then writes to the members by
//! address, which connects them.
//!
//! # Frames and the handshake
//! Every frame is a 4-byte big-endian payload length, then the payload (at most
//! [`TcpConfig::max_frame`] bytes). Each side's first frame on every connection, in both
//! directions, is a hello: `b"CNCL"`, version byte `1`, an 8-byte random instance id, then the
//! sender's listen address — `4`, 4 address bytes, 2 port bytes; or `6`, 16 address bytes, 2
//! port bytes, 4 scope-id bytes (all big-endian). A first frame that is not such a hello, an
//! unknown version, or a length prefix above the limit closes the connection at once, before
//! anything of the announced size is allocated; a connection without a hello within
//! [`TcpConfig::handshake_timeout`] is closed too. What follows the hello is delivered as is:
//! foreign bytes on a valid connection are the protocol's to reject.
//!
//! # Connections
//! - One connection per member pair, with `TCP_NODELAY`. When two members dial each other at
//!   once, both keep the connection dialled by the lower listen address; the other is wound
//!   down gracefully — frames not yet written move over, the rest is flushed, FIN is sent and
//!   it is read to its end — so no frame is lost or delivered twice.
//! - A new inbound connection from a member that restarted (a new instance id) or that opened
//!   a second connection (it gave up its first) replaces the old one.
//! - A failed connect puts the address in backoff: 50 ms, doubling per consecutive failure up
//!   to 5 s (configurable), reset by a successful handshake.
//! - Memory per connection is bounded: one receive buffer of at most `max_frame + 4` bytes
//!   and the send queue ([`TcpConfig::send_queue_bytes`]).
//!
//! # Slow peers
//! Sending never blocks on a member: a frame is written if the kernel takes it, queued
//! otherwise, and **dropped** when the member's queue would exceed `send_queue_bytes` or its
//! address is in reconnect backoff (counted in [`TcpStats`]). `send_to` still returns `Ok`:
//! the protocol treats every send as possibly lost and retransmits.
//!
//! # Driving
//! There is no background thread: whoever receives drives the mesh. It accepts, completes
//! connects, flushes queues, enforces timeouts and reads frames itself, so a frame goes from
//! the socket to the caller without a thread hop. It does so in one of two modes:
//! - **Async**: the task awaiting [`Transport::recv`](conclave_lock_api::Transport::recv)
//!   waits on `async-io`'s reactor, which names the sockets with work. Keep one `recv` pending
//!   (the node's driver does).
//! - **Blocking** (Unix): [`Transport::blocking`](conclave_lock_api::Transport::blocking)
//!   returns the mesh as a [`BlockingRecv`](conclave_lock_api::BlockingRecv). `recv_blocking`
//!   runs the same drive step, then waits in `poll(2)` on the listener, every connection that
//!   can make progress (readable once connected; writable while connecting or with bytes
//!   queued) and a pipe, the doorbell; its timeout is capped at the mesh's next deadline
//!   (connect, handshake or wind-down timeout, paused accepts). The reactor is not involved:
//!   the kernel wakes the thread directly. `try_recv` runs the drive step once after a `poll`
//!   that does not wait; it may run on any thread, even while another blocks in
//!   `recv_blocking`. `interrupt` rings the doorbell.
//!
//! In both modes `send_to` may run on other threads meanwhile; one that leaves work behind
//! (bytes queued, a connect started) wakes the receiver: a pending `recv` through an event, a
//! thread blocked in `poll` through the doorbell, rung only when that thread's `poll` does not
//! cover the new work already (so a frame the kernel takes at once costs no wake-up). The
//! modes may be mixed on one mesh, though each then also wakes for the other's work.
//! [`Transport::close`](conclave_lock_api::Transport::close) flushes for up to
//! [`TcpConfig::close_timeout`], then closes every connection with FIN.
//!
//! # Example
//! Two members on loopback; each `recv` drives its own mesh, so the sender's runs too.
//!
//! ```
//! use std::time::Duration;
//!
//! use async_io::{block_on, Timer};
//! use conclave_lock_api::Transport;
//! use conclave_tcp::TcpMesh;
//! use futures::future::{select, Either};
//!
//! # fn main() -> std::io::Result<()> {
//! let a = TcpMesh::loopback([])?;
//! let b = TcpMesh::loopback([a.local_addr()])?;
//! block_on(async {
//!     b.send_discovery(b"hello").await?;
//!     // `a` receives while `b` drives its connect and flush; bounded by a timer.
//!     let both = select(a.recv(), b.recv());
//!     match select(both, Timer::after(Duration::from_secs(5))).await {
//!         Either::Left((Either::Left((got, _)), _)) => {
//!             let got = got?;
//!             assert_eq!((got.from, &got.bytes[..]), (b.local_addr(), &b"hello"[..]));
//!         }
//!         Either::Left((Either::Right(_), _)) => unreachable!("nothing was sent to b"),
//!         Either::Right(_) => panic!("no datagram within 5 s"),
//!     }
//!     a.close().await;
//!     b.close().await;
//!     Ok(())
//! })
//! # }
//! ```

mod config;
mod conn;
mod frame;
mod mesh;
mod peer;
mod queue;
mod state;
mod stats;
mod wake;

pub use config::{TcpConfig, TcpConfigError, MIN_FRAME};
pub use mesh::TcpMesh;
pub use stats::TcpStats;
