//! Settings of the TCP mesh.

use std::net::SocketAddr;
use std::time::Duration;

use conclave_lock_api::wire::MAX_PACKET_LEN;
use thiserror::Error;

use crate::frame::{HEADER_LEN, MAX_HANDSHAKE_BYTES};

/// The smallest [`TcpConfig::max_frame`] accepted, in bytes.
pub const MIN_FRAME: usize = 512;

/// The largest [`TcpConfig::max_queued_bytes`] accepted: 2 GiB.
pub const MAX_QUEUED_BYTES: usize = 1 << 31;

/// The longest duration any setting of [`TcpConfig`] may have: one hour.
pub const MAX_DURATION: Duration = Duration::from_secs(3600);

/// Where the TCP mesh listens, whom it asks first, and how much it buffers per member.
///
/// The defaults ([`TcpConfig::loopback`]) keep everything on this host: the listener on
/// `127.0.0.1` with an ephemeral port, no seeds. To span machines, set [`TcpConfig::bind`] to
/// the address other members dial (it becomes part of this member's identity, so it must be a
/// concrete address, not `0.0.0.0`) and list a few long-lived members in [`TcpConfig::seeds`].
///
/// # Slow peers
/// Sending never waits for a member. A frame is written straight to the socket when the
/// kernel takes it, otherwise queued; a member whose queue would exceed
/// [`TcpConfig::send_queue_bytes`] gets the new frame dropped (counted in
/// [`TcpStats::dropped_queue_full`](crate::TcpStats::dropped_queue_full)), and a member whose
/// address is in reconnect backoff gets every frame dropped until the backoff ends. On top of
/// that, [`TcpConfig::max_queued_bytes`] bounds the bytes queued over all members together:
/// a frame that would take the total
/// ([`TcpStats::queued_bytes`](crate::TcpStats::queued_bytes)) above it is dropped too
/// ([`TcpStats::dropped_budget`](crate::TcpStats::dropped_budget)), so the mesh's memory is
/// bounded by `max_queued_bytes` plus one receive buffer (at most `max_frame + 4` bytes) and
/// one hello and proof (at most 96 bytes) per connection, however many connections are open. The
/// reliable layer of `conclave-protocol` retransmits what matters.
///
/// # Connection limits and idle connections
/// [`TcpConfig::max_connections`] bounds the connections other hosts open to this member and,
/// counted separately, the ones it dials itself, so connections others open can never use up
/// the slots of its own dials. Every connection has TCP keepalive (and, on Linux, a TCP user
/// timeout), so a peer that vanished without a FIN or reset is noticed within about half a
/// minute. An inbound connection that delivers no frame for [`TcpConfig::idle_timeout`] is
/// closed: members send to each other far more often, and a closed connection is dialled again
/// on the next send.
///
/// ```
/// use std::time::Duration;
/// use conclave_tcp::TcpConfig;
///
/// let config = TcpConfig {
///     seeds: vec!["127.0.0.1:7800".parse().unwrap()],
///     connect_timeout: Duration::from_millis(500),
///     ..TcpConfig::loopback()
/// };
/// assert!(config.validate().is_ok());
/// // One whole frame and its prefix behind the longest hello and a proof.
/// assert_eq!(config.min_send_queue_bytes(), config.max_frame + 100);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// The listen address: members reach this one here, and it is this member's transport
    /// address ([`Transport::local_addr`](conclave_lock_api::Transport::local_addr)). IPv4 or
    /// IPv6; the port may be 0 (the system picks one); the IP must not be unspecified.
    /// Connections to other members are made from this IP too, since a member checks that a
    /// connection comes from the IP its hello names. Default `127.0.0.1:0`.
    pub bind: SocketAddr,
    /// Members contacted by discovery even before they are connected (as JGroups' TCPPING
    /// `initial_hosts`). Empty is fine for the first member of a cluster; our own listen
    /// address may be listed (it is skipped). Default empty.
    pub seeds: Vec<SocketAddr>,
    /// The largest frame payload, in bytes, reported as
    /// [`Transport::max_datagram_size`](conclave_lock_api::Transport::max_datagram_size). A
    /// peer announcing a longer frame is disconnected. Range 512..=65,535
    /// ([`MAX_PACKET_LEN`]); default 65,535. Every member of a cluster should use the same value.
    pub max_frame: usize,
    /// The bytes (frames and their 4-byte prefixes) queued for one member before new frames to
    /// it are dropped. At least [`TcpConfig::min_send_queue_bytes`], `max_frame + 100` (one
    /// frame and its prefix behind the longest hello); default 4 MiB. Larger rides out longer
    /// stalls of a slow member at the cost of memory; [`TcpConfig::max_queued_bytes`] bounds
    /// all queues together.
    pub send_queue_bytes: usize,
    /// The bytes (frames and their 4-byte prefixes, hellos excluded) queued over all members
    /// together, frames sent to ourselves included, before new frames to any member are
    /// dropped ([`TcpStats::dropped_budget`](crate::TcpStats::dropped_budget)). The budget is
    /// checked for a whole frame before it is written, so while it is used up even a member
    /// whose socket would take the frame at once gets it dropped. Range
    /// [`TcpConfig::min_send_queue_bytes`]`..=`[`MAX_QUEUED_BYTES`] (2 GiB); default 64 MiB.
    /// With the defaults it is what bounds memory: 1,024 connections each way with 4 MiB
    /// queues could otherwise hold 8 GiB.
    pub max_queued_bytes: usize,
    /// How long a connection attempt may take before it counts as failed. Must not be zero;
    /// default 2 s. Like every duration here, at most [`MAX_DURATION`] (one hour).
    pub connect_timeout: Duration,
    /// The wait after the first failed connection attempt to an address; it doubles with every
    /// further consecutive failure up to [`TcpConfig::reconnect_backoff_max`] and resets once a
    /// handshake succeeds. Frames to the address are dropped meanwhile. Must not be zero;
    /// default 50 ms.
    pub reconnect_backoff_min: Duration,
    /// The longest wait between connection attempts to one address. At least
    /// `reconnect_backoff_min`; default 1 s. It bounds how long a member that comes back (a
    /// partition heals, a process restarts on its address) stays unreached while the protocol
    /// keeps sending to it (heartbeats and discovery do, several times a second): the next
    /// attempt is at most this long after it is back, plus the connect itself (at most
    /// [`TcpConfig::connect_timeout`] if an attempt was already in flight into a network that
    /// dropped its packets). It costs a dead address one connection attempt per this period;
    /// raise it only if many dead addresses stay in the view for long.
    pub reconnect_backoff_max: Duration,
    /// The most inbound connections (accepted from other hosts) open at once, in any state,
    /// and separately the most outbound ones (dialled by this member): inbound connections
    /// never count against our dials, so at most twice this many sockets are open. An inbound
    /// connection beyond it is closed at once; a frame that would need another outbound one is
    /// dropped. At least 1; default 1,024.
    pub max_connections: usize,
    /// How long a connection may stay without a valid hello from its peer before it is closed.
    /// Must not be zero; default 5 s.
    pub handshake_timeout: Duration,
    /// How long an inbound connection may deliver no frame (after its hello) before it is
    /// closed. Members send to each other far more often (heartbeats), and a closed connection
    /// is dialled again on the next send, so this only reaps connections a peer holds open
    /// without using them. Outbound connections are not subject to it. Must not be zero;
    /// default 60 s.
    pub idle_timeout: Duration,
    /// How long [`Transport::close`](conclave_lock_api::Transport::close) spends flushing queued
    /// frames before it closes every connection anyway; also how long a duplicate connection
    /// may take to wind down. Zero closes at once; default 1 s.
    pub close_timeout: Duration,
}

impl Default for TcpConfig {
    fn default() -> Self {
        Self::loopback()
    }
}

impl TcpConfig {
    /// A listener on `127.0.0.1` with an ephemeral port and no seeds: this host only.
    pub fn loopback() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            seeds: Vec::new(),
            max_frame: MAX_PACKET_LEN,
            send_queue_bytes: 4 << 20,
            max_queued_bytes: 64 << 20,
            connect_timeout: Duration::from_secs(2),
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(1),
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            close_timeout: Duration::from_secs(1),
        }
    }

    /// The smallest [`TcpConfig::send_queue_bytes`] and [`TcpConfig::max_queued_bytes`]
    /// allowed with this `max_frame`: one whole frame behind a hello (and a proof) always fits.
    pub fn min_send_queue_bytes(&self) -> usize {
        self.max_frame
            .saturating_add(HEADER_LEN)
            .saturating_add(MAX_HANDSHAKE_BYTES)
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`TcpConfigError`] naming the first problem.
    pub fn validate(&self) -> Result<(), TcpConfigError> {
        if self.bind.ip().is_unspecified() {
            return Err(TcpConfigError::UnspecifiedBind(self.bind));
        }
        if let Some(seed) = self
            .seeds
            .iter()
            .find(|s| s.ip().is_unspecified() || s.port() == 0)
        {
            return Err(TcpConfigError::BadSeed(*seed));
        }
        if !(MIN_FRAME..=MAX_PACKET_LEN).contains(&self.max_frame) {
            return Err(TcpConfigError::FrameSize(self.max_frame));
        }
        if self.send_queue_bytes < self.min_send_queue_bytes() {
            return Err(TcpConfigError::SendQueue {
                bytes: self.send_queue_bytes,
                min: self.min_send_queue_bytes(),
            });
        }
        if !(self.min_send_queue_bytes()..=MAX_QUEUED_BYTES).contains(&self.max_queued_bytes) {
            return Err(TcpConfigError::QueuedBytes {
                bytes: self.max_queued_bytes,
                min: self.min_send_queue_bytes(),
                max: MAX_QUEUED_BYTES,
            });
        }
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("reconnect_backoff_min", self.reconnect_backoff_min),
            ("handshake_timeout", self.handshake_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if value.is_zero() {
                return Err(TcpConfigError::ZeroDuration(name));
            }
        }
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("reconnect_backoff_min", self.reconnect_backoff_min),
            ("reconnect_backoff_max", self.reconnect_backoff_max),
            ("handshake_timeout", self.handshake_timeout),
            ("idle_timeout", self.idle_timeout),
            ("close_timeout", self.close_timeout),
        ] {
            if value > MAX_DURATION {
                return Err(TcpConfigError::LongDuration(name));
            }
        }
        if self.reconnect_backoff_max < self.reconnect_backoff_min {
            return Err(TcpConfigError::Backoff {
                min: self.reconnect_backoff_min,
                max: self.reconnect_backoff_max,
            });
        }
        if self.max_connections == 0 {
            return Err(TcpConfigError::NoConnections);
        }
        Ok(())
    }
}

/// A [`TcpConfig`] was rejected.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum TcpConfigError {
    /// The listen address is `0.0.0.0` or `::`; members could not dial it back.
    #[error(
        "TcpConfig::bind {0} is unspecified (0.0.0.0 or ::): listen on the address other \
         members dial, which becomes part of this member's id"
    )]
    UnspecifiedBind(SocketAddr),
    /// A seed has an unspecified IP or port 0.
    #[error("TcpConfig::seeds: {0} is not an address one can connect to")]
    BadSeed(SocketAddr),
    /// The frame size is outside 512..=65,535 bytes.
    #[error("max_frame {0} is outside 512..=65535")]
    FrameSize(usize),
    /// The send queue cannot hold one whole frame.
    #[error("send_queue_bytes {bytes} is below the minimum {min} (one frame and a hello)")]
    SendQueue {
        /// The configured bound.
        bytes: usize,
        /// The least allowed with this `max_frame`.
        min: usize,
    },
    /// The budget of bytes queued over all members cannot hold one whole frame, or is above
    /// [`MAX_QUEUED_BYTES`].
    #[error("max_queued_bytes {bytes} is outside {min}..={max}")]
    QueuedBytes {
        /// The configured budget.
        bytes: usize,
        /// The least allowed with this `max_frame`.
        min: usize,
        /// [`MAX_QUEUED_BYTES`].
        max: usize,
    },
    /// A duration that must be positive is zero.
    #[error("{0} must not be zero")]
    ZeroDuration(&'static str),
    /// A duration is longer than [`MAX_DURATION`].
    #[error("{0} must not exceed one hour")]
    LongDuration(&'static str),
    /// The backoff's maximum is below its minimum.
    #[error("reconnect_backoff_max {max:?} is below reconnect_backoff_min {min:?}")]
    Backoff {
        /// The configured minimum.
        min: Duration,
        /// The configured maximum.
        max: Duration,
    },
    /// `max_connections` is zero.
    #[error("max_connections must be at least 1")]
    NoConnections,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_stay_on_this_host_and_validate() {
        let c = TcpConfig::default();
        assert!(c.bind.ip().is_loopback());
        assert!(c.seeds.is_empty());
        assert_eq!(c.max_frame, MAX_PACKET_LEN);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn bad_settings_are_named() {
        let base = TcpConfig::loopback();
        let c = TcpConfig {
            bind: "0.0.0.0:7800".parse().unwrap(),
            ..base.clone()
        };
        assert!(matches!(
            c.validate(),
            Err(TcpConfigError::UnspecifiedBind(_))
        ));
        let seed: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let c = TcpConfig {
            seeds: vec![seed],
            ..base.clone()
        };
        assert_eq!(c.validate(), Err(TcpConfigError::BadSeed(seed)));
        let c = TcpConfig {
            max_frame: MAX_PACKET_LEN + 1,
            ..base.clone()
        };
        assert_eq!(
            c.validate(),
            Err(TcpConfigError::FrameSize(MAX_PACKET_LEN + 1))
        );
        let c = TcpConfig {
            send_queue_bytes: 1000,
            ..base.clone()
        };
        assert!(matches!(
            c.validate(),
            Err(TcpConfigError::SendQueue { bytes: 1000, .. })
        ));
        let c = TcpConfig {
            handshake_timeout: Duration::ZERO,
            ..base.clone()
        };
        assert_eq!(
            c.validate(),
            Err(TcpConfigError::ZeroDuration("handshake_timeout"))
        );
        let c = TcpConfig {
            reconnect_backoff_max: Duration::from_millis(1),
            ..base.clone()
        };
        assert!(matches!(c.validate(), Err(TcpConfigError::Backoff { .. })));
        let c = TcpConfig {
            max_connections: 0,
            ..base.clone()
        };
        assert_eq!(c.validate(), Err(TcpConfigError::NoConnections));
        let c = TcpConfig {
            idle_timeout: Duration::ZERO,
            ..base.clone()
        };
        assert_eq!(
            c.validate(),
            Err(TcpConfigError::ZeroDuration("idle_timeout"))
        );
    }

    #[test]
    fn the_queued_bytes_budget_holds_a_frame_and_stays_sane() {
        let base = TcpConfig::loopback();
        assert_eq!(base.max_queued_bytes, 64 << 20);
        let min = base.min_send_queue_bytes();
        for bytes in [min, 3 * base.max_frame, 256 << 20, MAX_QUEUED_BYTES] {
            let c = TcpConfig {
                max_queued_bytes: bytes,
                ..base.clone()
            };
            assert_eq!(c.validate(), Ok(()), "{bytes}");
        }
        for bytes in [0, min - 1, MAX_QUEUED_BYTES + 1, usize::MAX] {
            let c = TcpConfig {
                max_queued_bytes: bytes,
                ..base.clone()
            };
            assert_eq!(
                c.validate(),
                Err(TcpConfigError::QueuedBytes {
                    bytes,
                    min,
                    max: MAX_QUEUED_BYTES
                }),
                "{bytes}"
            );
        }
        // The minimum follows max_frame; a budget below send_queue_bytes is fine.
        let c = TcpConfig {
            max_frame: MIN_FRAME,
            max_queued_bytes: MIN_FRAME + 100,
            ..base.clone()
        };
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn every_duration_is_bounded_by_an_hour() {
        let base = TcpConfig::loopback();
        let long = MAX_DURATION + Duration::from_nanos(1);
        type Set = fn(&mut TcpConfig, Duration);
        let cases: [(&str, Set); 6] = [
            ("connect_timeout", |c, d| c.connect_timeout = d),
            ("reconnect_backoff_min", |c, d| {
                c.reconnect_backoff_min = d;
                c.reconnect_backoff_max = d;
            }),
            ("reconnect_backoff_max", |c, d| c.reconnect_backoff_max = d),
            ("handshake_timeout", |c, d| c.handshake_timeout = d),
            ("idle_timeout", |c, d| c.idle_timeout = d),
            ("close_timeout", |c, d| c.close_timeout = d),
        ];
        for (name, set) in cases {
            let mut c = base.clone();
            set(&mut c, MAX_DURATION);
            assert_eq!(c.validate(), Ok(()), "{name} of exactly an hour");
            for value in [long, Duration::MAX] {
                let mut c = base.clone();
                set(&mut c, value);
                assert_eq!(c.validate(), Err(TcpConfigError::LongDuration(name)));
            }
        }
    }

    #[test]
    fn ipv6_listen_addresses_are_fine() {
        let c = TcpConfig {
            bind: "[::1]:0".parse().unwrap(),
            seeds: vec!["[::1]:7800".parse().unwrap()],
            ..TcpConfig::loopback()
        };
        assert_eq!(c.validate(), Ok(()));
    }
}
