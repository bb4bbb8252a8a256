//! Settings of the TCP mesh.

use std::net::SocketAddr;
use std::time::Duration;

use conclave_lock_api::wire::MAX_PACKET_LEN;
use thiserror::Error;

use crate::frame::{HEADER_LEN, MAX_HELLO_FRAME};

/// The smallest [`TcpConfig::max_frame`] accepted, in bytes.
pub const MIN_FRAME: usize = 512;

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
/// address is in reconnect backoff gets every frame dropped until the backoff ends. The
/// reliable layer of `conclave-protocol` retransmits what matters.
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
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// The listen address: members reach this one here, and it is this member's transport
    /// address ([`Transport::local_addr`](conclave_lock_api::Transport::local_addr)). IPv4 or
    /// IPv6; the port may be 0 (the system picks one); the IP must not be unspecified.
    /// Default `127.0.0.1:0`.
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
    /// it are dropped. At least `max_frame + 64`; default 4 MiB. Larger rides out longer stalls
    /// of a slow member at the cost of memory.
    pub send_queue_bytes: usize,
    /// How long a connection attempt may take before it counts as failed. Must not be zero;
    /// default 2 s.
    pub connect_timeout: Duration,
    /// The wait after the first failed connection attempt to an address; it doubles with every
    /// further consecutive failure up to [`TcpConfig::reconnect_backoff_max`] and resets once a
    /// handshake succeeds. Frames to the address are dropped meanwhile. Must not be zero;
    /// default 50 ms.
    pub reconnect_backoff_min: Duration,
    /// The longest wait between connection attempts to one address. At least
    /// `reconnect_backoff_min`; default 5 s.
    pub reconnect_backoff_max: Duration,
    /// The most connections open at once, inbound and outbound, in any state. Inbound
    /// connections beyond it are closed at once; frames that would need another outbound one
    /// are dropped. At least 1; default 1,024.
    pub max_connections: usize,
    /// How long a connection may stay without a valid hello from its peer before it is closed.
    /// Must not be zero; default 5 s.
    pub handshake_timeout: Duration,
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
            connect_timeout: Duration::from_secs(2),
            reconnect_backoff_min: Duration::from_millis(50),
            reconnect_backoff_max: Duration::from_secs(5),
            max_connections: 1024,
            handshake_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(1),
        }
    }

    /// The smallest [`TcpConfig::send_queue_bytes`] allowed with this `max_frame`: one whole
    /// frame behind a hello always fits.
    pub fn min_send_queue_bytes(&self) -> usize {
        self.max_frame
            .saturating_add(HEADER_LEN)
            .saturating_add(MAX_HELLO_FRAME)
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
        for (name, value) in [
            ("connect_timeout", self.connect_timeout),
            ("reconnect_backoff_min", self.reconnect_backoff_min),
            ("handshake_timeout", self.handshake_timeout),
        ] {
            if value.is_zero() {
                return Err(TcpConfigError::ZeroDuration(name));
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
    #[error("bind address {0} is unspecified; listen on the address other members dial")]
    UnspecifiedBind(SocketAddr),
    /// A seed has an unspecified IP or port 0.
    #[error("seed {0} is not an address one can connect to")]
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
    /// A duration that must be positive is zero.
    #[error("{0} must not be zero")]
    ZeroDuration(&'static str),
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
            ..base
        };
        assert_eq!(c.validate(), Err(TcpConfigError::NoConnections));
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
