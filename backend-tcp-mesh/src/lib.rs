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
//! (`send_discovery`) goes to every seed and every member with a connection, once per
//! connection and never to ourselves; a seed answers with its view and the protocol then writes
//! to the members by address, which connects them. Outbound connections are made from the IP of
//! the listen address, so that they come from the IP the member is known by.
//!
//! A member may be dialled under another address than the one it listens on: a seed behind a
//! DNS alias or a port forward. The connection's hello then names the member's listen address,
//! and the connection is registered under both: the listen address is the member's identity
//! (the `from` of its frames), the dialled one an alias, and frames to either go on that one
//! connection.
//!
//! # Frames and the handshake
//! Every frame is a 4-byte big-endian payload length, then the payload (at most
//! [`TcpConfig::max_frame`] bytes). Each side's first frame on every connection, in both
//! directions, is a hello: `b"CNCL"`, version byte `1`, an 8-byte random instance id, then the
//! sender's listen address — `4`, 4 address bytes, 2 port bytes; or `6`, 16 address bytes, 2
//! port bytes, 4 scope-id bytes (all big-endian). A first frame that is not such a hello, an
//! unknown version, or a length prefix above the limit closes the connection at once, before
//! anything of the announced size is allocated; a connection without a hello within
//! [`TcpConfig::handshake_timeout`] is closed too. So is a hello naming an address no member
//! can listen on (an unspecified, multicast or broadcast IP, or port 0), our own address, or,
//! on an inbound connection, another IP than the one the connection comes from (see
//! [Trust](#trust)). What follows the hello is delivered as is: foreign bytes on a valid
//! connection are the protocol's to reject.
//!
//! With a cluster key (the node builder passes its keyring to the mesh through
//! [`Transport::use_keyring`](conclave_lock_api::Transport::use_keyring)) the hello is version
//! `2`: the same fields, then the 8-byte cluster id, the 4-byte id of the sender's primary key
//! and 16 fresh random bytes, a challenge drawn for this connection. Once a side has both
//! hellos it sends a **proof** frame: `b"CNCA"`, a key id and a 16-byte tag of
//! [`Keyring::prove`](conclave_lock_api::seal::Keyring::prove) over the transcript — the
//! dialler's hello payload ‖ the accepter's hello payload ‖ one byte naming the prover (`0`
//! the dialler, `1` the accepter). The tag is HKDF-SHA256-Expand of the cluster key (HMAC-SHA256
//! under the extracted key) with info `"conclave tcp hello v1"` ‖ transcript, truncated to 16
//! bytes: only a holder of the key makes it, and the other side's fresh challenge makes it
//! worthless on any other connection. The peer's proof must be the next frame and must verify
//! with an installed key ([`Keyring::verify`](conclave_lock_api::seal::Keyring::verify),
//! compared in constant time); until it does, the connection is not registered under the
//! hello's address, delivers nothing, and neither displaces nor blocks any other connection,
//! and our own data frames wait behind our proof. A connection whose peer sends a version-1
//! hello (it has no key), another cluster's hello, a proof that fails, or none within
//! [`TcpConfig::handshake_timeout`] is closed, counted in [`TcpStats::auth_failures`] and
//! logged at most every 5 s (`TCP peer X failed authentication (key id N)`). A mesh without a
//! key refuses a version-2 hello alike. When the peer holds another key, or none (or we do
//! not), the mesh also delivers a rejection notice of the seal layer
//! ([`Notice`](conclave_lock_api::seal::Notice), `from` the peer's hello address; at most 64
//! wait) so the node's join fails with an authentication error naming both key ids. A
//! refused connection gets FIN after our hello and proof, and is read (and dropped) to the
//! peer's FIN, for at most 64 KiB and `close_timeout`, so the peer reads why before the close.
//!
//! # Connections
//! - One connection per member pair, with `TCP_NODELAY` and TCP keepalive (first probe after
//!   10 s idle, then every 5 s, reset after 3 unanswered, where the system lets us set those;
//!   on Linux also a 25 s `TCP_USER_TIMEOUT` for data never acknowledged), so a peer that
//!   vanished without FIN or reset is noticed.
//! - When a connection's hello names a member that already has a connection, one of the two
//!   stays and the other goes:
//!   - if the old one is gone (the peer's FIN, reset or an error is waiting on it, even unread
//!     yet, or it is closing), the new one replaces it: a member that restarted (a new instance
//!     id) or reconnected ([`TcpStats::replaced`]);
//!   - if both are the same instance's and each end dialled one, it is a simultaneous connect:
//!     both ends keep the connection dialled by the lower listen address
//!     ([`TcpStats::duplicates_resolved`]);
//!   - otherwise the established, live connection stays ([`TcpStats::duplicates_refused`]): a
//!     newcomer of the same instance (a second connection, a second dial under an alias) is
//!     wound down, its addresses joining the old one; a newcomer of another instance is
//!     closed at once, unread.
//!
//!   The connection that goes is wound down gracefully: frames not yet written on it move to
//!   the one that stays, the rest is flushed, FIN is sent and it is read to its end (frames
//!   read meanwhile are delivered), within [`TcpConfig::close_timeout`]. This converges to one
//!   connection: both ends decide a simultaneous connect alike; in the rare case they see two
//!   other connections complete in opposite orders, each winds down the one the other keeps,
//!   both close, and the next send dials one anew.
//! - What a wind-down can lose, always counted: frames the remaining connection's queue has no
//!   room for ([`TcpStats::dropped_queue_full`]); frames still queued on a connection whose
//!   wind-down outlasts `close_timeout`, or on a connection the peer winds down while this end
//!   kept it ([`TcpStats::dropped_in_flight`]). No frame is delivered twice.
//! - A failed connect puts the address in backoff: 50 ms, doubling per consecutive failure up
//!   to 1 s (configurable), reset by a successful handshake (ours, or the peer's when it dials
//!   us). A member that comes back is dialled again within that cap of its return, as long
//!   as the protocol keeps sending to it.
//! - [`TcpConfig::max_connections`] bounds the inbound connections and, counted separately,
//!   the outbound ones, so connections other hosts open never use up the slots of our own
//!   dials. An inbound connection that delivers no frame for [`TcpConfig::idle_timeout`]
//!   (default 60 s; members send to each other far more often) is closed; the member dials
//!   again when it next sends.
//! - Memory is bounded: per connection, one receive buffer of at most `max_frame + 4` bytes,
//!   its hello and proof (at most 96 bytes) and a send queue of at most
//!   [`TcpConfig::send_queue_bytes`]; over all connections together, the send queues hold at
//!   most [`TcpConfig::max_queued_bytes`] (see [Slow peers](#slow-peers)).
//!
//! # Trust
//! With a cluster key, every connection is authenticated by its handshake (above): a
//! connection is registered in a member's name, delivers frames, and competes with other
//! connections only after its peer proved it holds a key of the cluster, and every frame it
//! then carries is sealed as well. A process that cannot prove the key gets nowhere, even from
//! the member's own IP: it cannot hold a member's connection slot, so it cannot cut the
//! member off. What remains is what no key prevents: anyone on the path can drop, delay or cut
//! the traffic, and anyone can open connections (each closed within the handshake timeout,
//! within [`TcpConfig::max_connections`]).
//!
//! Without a key, the mesh does not authenticate members: a hello is taken at its word, as a
//! UDP backend takes a datagram's source address. Whoever can open a TCP connection to a
//! member can send it frames under any listen address at its own IP, and the protocol treats
//! them as it treats any other frames. Give the cluster a key, run the mesh on a network you
//! trust, or between hosts joined by a secure tunnel (WireGuard, IPsec).
//!
//! With or without a key, two checks keep one host from taking over another's traffic. An inbound connection's hello
//! must name the IP the connection comes from (only the IP: the connection comes from an
//! ephemeral port), and a live, established connection is never displaced by a newcomer
//! claiming its member under another instance id (only the simultaneous-connect rule above
//! lets a newcomer of the same instance win, and the id travels only on that member's own
//! connections). So a host cannot divert to itself the frames meant for a member at another IP
//! without spoofing that IP, which TCP's handshake makes hard off the path.
//!
//! Without a key, the checks do not stop a process on the same host, or behind the same NAT
//! address, from claiming a member at that IP — one that has no live connection, or, by
//! connecting first, one that is about to connect (which is then refused: cut off) — nor
//! anyone on the path from reading or altering frames. An outbound connection goes where
//! we dialled, so its hello is not checked against the IP dialled (a port forward to a seed
//! works); the alias so learned never displaces a live connection of another instance. Members
//! behind source NAT fail the check, their connections coming from another IP than the one
//! they listen on: they must reach each other directly.
//!
//! # Slow peers
//! Sending never blocks on a member: a frame is written if the kernel takes it, queued
//! otherwise, and **dropped** when the member's queue would exceed `send_queue_bytes`, when
//! the bytes queued over all members together would exceed [`TcpConfig::max_queued_bytes`]
//! (default 64 MiB), or when its address is in reconnect backoff (counted in [`TcpStats`]:
//! `dropped_queue_full`, `dropped_budget`, `dropped_unreachable`). `send_to` still returns
//! `Ok`: the protocol treats every send as possibly lost and retransmits.
//!
//! The total ([`TcpStats::queued_bytes`]) counts the data frames queued and not yet written on
//! every connection (prefixes included, hellos not) and the frames sent to ourselves not yet
//! received. It grows when a frame is queued (only the part the kernel did not take at once)
//! and shrinks as queued bytes are written, when a connection closes with frames still queued,
//! and when frames move off a duplicate connection (they count again on the one they move to,
//! within the budget). The budget is checked for a whole frame before it is written, since
//! the rest of a partly written frame must be queued: while slow members use it up, frames to
//! every member are dropped until their queues drain or their connections close. So however
//! many connections are open, the mesh holds at most `max_queued_bytes` of frames plus, per
//! connection, one receive buffer (`max_frame + 4` bytes) and its hello.
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
//!   (connect, handshake, idle or wind-down timeout, paused accepts). The reactor is not
//!   involved: the kernel wakes the thread directly. `try_recv` runs the drive step; if that
//!   finds no frame, it polls the sockets without waiting and, if any is ready, runs the drive
//!   step once more. It may run on any thread, even while another blocks in `recv_blocking`.
//!   `interrupt` rings the doorbell.
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
//!     b.send_discovery(b"hello")?;
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
#[cfg(fuzzing)]
pub mod fuzzing;
mod mesh;
mod peer;
mod queue;
mod state;
mod stats;
mod wake;

pub use config::{TcpConfig, TcpConfigError, MAX_DURATION, MAX_QUEUED_BYTES, MIN_FRAME};
pub use mesh::TcpMesh;
pub use stats::TcpStats;
