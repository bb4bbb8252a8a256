//! Tuning of the reliable layer.

use std::time::Duration;

use conclave_lock_api::wire::MAX_MESSAGE_LEN;
use thiserror::Error;

/// The largest `send_window` and `recv_window` accepted, in segments.
///
/// A receive window is a ring of slots allocated up to its size on demand, so this also bounds
/// what a flooding peer can make us allocate for bookkeeping.
pub const MAX_WINDOW: u32 = 1 << 16;

/// Tuning of [`super::Reliable`]. Every field is public; [`ReliableConfig::validate`] says whether a
/// combination is usable.
///
/// ```
/// use std::time::Duration;
/// use conclave_protocol::reliable::ReliableConfig;
///
/// let config = ReliableConfig { retransmit_timeout: Duration::from_millis(50), ..ReliableConfig::lan() };
/// config.validate()?;
/// # Ok::<(), conclave_protocol::reliable::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReliableConfig {
    /// Time from the transmission of a segment to its first retransmission when no
    /// acknowledgement arrived. Range: above zero. Default: 100 ms.
    ///
    /// Set it a little above the round-trip time of the network: lower wastes bandwidth on
    /// spurious retransmissions, higher slows recovery from a loss.
    pub retransmit_timeout: Duration,
    /// Cap of the exponential backoff: every retransmission without progress doubles the
    /// timeout up to this. Range: at least `retransmit_timeout`. Default: 1 s.
    ///
    /// The layer never gives up on a peer: the membership layer decides that a peer is dead
    /// and calls [`super::Reliable::remove_peer`]. This cap bounds how long a healed
    /// partition waits for the next retransmission.
    pub max_retransmit_timeout: Duration,
    /// Segments in flight (sent and not acknowledged) per peer; the rest wait in the queue.
    /// Range: 1 to [`MAX_WINDOW`] and at most `recv_window`. Default: 256.
    ///
    /// Throughput per peer is about `send_window × segment size / round-trip time`.
    pub send_window: u32,
    /// Out-of-order segments buffered per peer: a segment with a sequence number at or above
    /// `next_expected + recv_window` is dropped. Range: `send_window` to [`MAX_WINDOW`].
    /// Default: 256.
    ///
    /// A peer can make us hold at most about `recv_window` segments plus one message being
    /// reassembled. Peers should use the same windows; a smaller receive window than the
    /// sender's send window costs retransmissions.
    pub recv_window: u32,
    /// Payload bytes queued or in flight per peer, in bytes. Range: above zero. Default: 8 MiB.
    ///
    /// [`super::Reliable::send`] refuses a message with [`super::SendError::QueueFull`] when
    /// it would take the peer above this; a peer with nothing queued accepts any one message
    /// up to `max_message_len`, so a large message is never refused forever.
    pub max_queued_bytes: usize,
    /// The longest message accepted, in bytes, for sending and for reassembly. Range: 0 to
    /// [`MAX_MESSAGE_LEN`]. Default: [`MAX_MESSAGE_LEN`] (16 MiB).
    pub max_message_len: usize,
    /// Peer states kept (one per member we talk to). Range: above zero. Default: 4096.
    ///
    /// Segments from new peers beyond it are dropped, and [`super::Reliable::send`] to a new
    /// peer fails with [`super::SendError::TooManyPeers`].
    pub max_peers: usize,
    /// A peer state with nothing queued, in flight, buffered or owed, and no traffic for this
    /// long is forgotten. Range: above zero. Default: 60 s.
    ///
    /// Forgetting is safe because a segment carries the lowest sequence number its sender has
    /// not seen acknowledged (`base`), where a fresh receive state starts. Keep it well above
    /// the failure-detection timeout of the membership layer and above any delay a datagram
    /// can suffer in the network: a receive state forgotten while its last acknowledgements
    /// were lost, or while datagrams older than this are still in flight, could deliver a
    /// message twice. Evictions happen up to an eighth of this late.
    pub idle_timeout: Duration,
    /// How long an acknowledgement may wait for a data segment to the same peer to ride on.
    /// Range: below `retransmit_timeout` (zero acknowledges every segment at once). Default:
    /// 10 ms.
    ///
    /// In a request/response exchange (a lock request and its grant) the answer carries the
    /// acknowledgement, so no datagram is spent on it. An acknowledgement is sent at once,
    /// whatever this says, on the fourth datagram received in order since the last one
    /// ([`super::ACK_AT_ONCE_EVERY`], or `send_window` if smaller), for a segment out of order or
    /// received before, and for one that fills a gap, so bulk transfers and loss recovery do
    /// not wait. Senders must allow for it: their `retransmit_timeout` should exceed the
    /// round-trip time plus this.
    pub ack_delay: Duration,
}

impl Default for ReliableConfig {
    fn default() -> Self {
        Self {
            retransmit_timeout: Duration::from_millis(100),
            max_retransmit_timeout: Duration::from_secs(1),
            send_window: 256,
            recv_window: 256,
            max_queued_bytes: 8 << 20,
            max_message_len: MAX_MESSAGE_LEN,
            max_peers: 4096,
            idle_timeout: Duration::from_secs(60),
            ack_delay: Duration::from_millis(10),
        }
    }
}

impl ReliableConfig {
    /// For a local-area network: the defaults.
    pub fn lan() -> Self {
        Self::default()
    }

    /// For members on one host (loopback, tests): retransmissions after 20 ms, backoff capped
    /// at 200 ms, acknowledgements delayed by at most 2 ms.
    pub fn local() -> Self {
        Self {
            retransmit_timeout: Duration::from_millis(20),
            max_retransmit_timeout: Duration::from_millis(200),
            ack_delay: Duration::from_millis(2),
            ..Self::default()
        }
    }

    /// Checks every field against its documented range.
    ///
    /// # Errors
    /// The first [`ConfigError`] found. [`super::Reliable::new`] clamps an invalid
    /// configuration into range (with a warning) rather than failing, so call this where the
    /// configuration is built.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.retransmit_timeout.is_zero() {
            return Err(ConfigError::ZeroRetransmitTimeout);
        }
        if self.max_retransmit_timeout < self.retransmit_timeout {
            return Err(ConfigError::BackoffCapBelowTimeout {
                cap: self.max_retransmit_timeout,
                timeout: self.retransmit_timeout,
            });
        }
        for (name, value) in [
            ("send_window", self.send_window),
            ("recv_window", self.recv_window),
        ] {
            if value == 0 || value > MAX_WINDOW {
                return Err(ConfigError::WindowOutOfRange {
                    name,
                    value,
                    max: MAX_WINDOW,
                });
            }
        }
        if self.send_window > self.recv_window {
            return Err(ConfigError::SendWindowAboveRecvWindow {
                send_window: self.send_window,
                recv_window: self.recv_window,
            });
        }
        if self.max_queued_bytes == 0 {
            return Err(ConfigError::ZeroQueue);
        }
        if self.max_message_len > MAX_MESSAGE_LEN {
            return Err(ConfigError::MessageLenAboveWireLimit {
                value: self.max_message_len,
                max: MAX_MESSAGE_LEN,
            });
        }
        if self.max_peers == 0 {
            return Err(ConfigError::ZeroMaxPeers);
        }
        if self.idle_timeout.is_zero() {
            return Err(ConfigError::ZeroIdleTimeout);
        }
        if self.ack_delay >= self.retransmit_timeout {
            return Err(ConfigError::AckDelayNotBelowTimeout {
                delay: self.ack_delay,
                timeout: self.retransmit_timeout,
            });
        }
        Ok(())
    }

    /// This configuration with every field clamped into its range.
    pub(crate) fn sanitized(mut self) -> Self {
        self.retransmit_timeout = self.retransmit_timeout.max(Duration::from_micros(1));
        self.max_retransmit_timeout = self.max_retransmit_timeout.max(self.retransmit_timeout);
        self.send_window = self.send_window.clamp(1, MAX_WINDOW);
        self.recv_window = self.recv_window.clamp(self.send_window, MAX_WINDOW);
        self.max_queued_bytes = self.max_queued_bytes.max(1);
        self.max_message_len = self.max_message_len.min(MAX_MESSAGE_LEN);
        self.max_peers = self.max_peers.max(1);
        self.idle_timeout = self.idle_timeout.max(Duration::from_micros(1));
        if self.ack_delay >= self.retransmit_timeout {
            self.ack_delay = self.retransmit_timeout / 2;
        }
        self
    }
}

/// A [`ReliableConfig`] field is out of its range.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `retransmit_timeout` is zero.
    #[error("retransmit_timeout must be above zero")]
    ZeroRetransmitTimeout,
    /// `max_retransmit_timeout` is below `retransmit_timeout`.
    #[error("max_retransmit_timeout {cap:?} is below retransmit_timeout {timeout:?}")]
    BackoffCapBelowTimeout {
        /// The configured cap.
        cap: Duration,
        /// The configured initial timeout.
        timeout: Duration,
    },
    /// A window is zero or above [`MAX_WINDOW`].
    #[error("{name} is {value}, must be 1 to {max}")]
    WindowOutOfRange {
        /// Which window.
        name: &'static str,
        /// The configured value.
        value: u32,
        /// The largest value accepted.
        max: u32,
    },
    /// `send_window` exceeds `recv_window`.
    #[error("send_window {send_window} exceeds recv_window {recv_window}")]
    SendWindowAboveRecvWindow {
        /// The configured send window.
        send_window: u32,
        /// The configured receive window.
        recv_window: u32,
    },
    /// `max_queued_bytes` is zero.
    #[error("max_queued_bytes must be above zero")]
    ZeroQueue,
    /// `max_message_len` exceeds what the wire format decodes.
    #[error("max_message_len {value} exceeds the wire limit {max}")]
    MessageLenAboveWireLimit {
        /// The configured value.
        value: usize,
        /// The wire limit, [`MAX_MESSAGE_LEN`].
        max: usize,
    },
    /// `max_peers` is zero.
    #[error("max_peers must be above zero")]
    ZeroMaxPeers,
    /// `idle_timeout` is zero.
    #[error("idle_timeout must be above zero")]
    ZeroIdleTimeout,
    /// `ack_delay` is not below `retransmit_timeout`: every segment would be retransmitted
    /// before its acknowledgement left.
    #[error("ack_delay {delay:?} must be below retransmit_timeout {timeout:?}")]
    AckDelayNotBelowTimeout {
        /// The configured delay.
        delay: Duration,
        /// The configured initial retransmission timeout.
        timeout: Duration,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_presets_are_valid() {
        ReliableConfig::default().validate().unwrap();
        ReliableConfig::lan().validate().unwrap();
        ReliableConfig::local().validate().unwrap();
        assert_eq!(ReliableConfig::default().max_message_len, MAX_MESSAGE_LEN);
    }

    #[test]
    fn invalid_fields_are_reported() {
        let bad = ReliableConfig {
            send_window: 300,
            recv_window: 256,
            ..ReliableConfig::default()
        };
        assert_eq!(
            bad.validate(),
            Err(ConfigError::SendWindowAboveRecvWindow {
                send_window: 300,
                recv_window: 256
            })
        );
        let bad = ReliableConfig {
            retransmit_timeout: Duration::ZERO,
            ..ReliableConfig::default()
        };
        assert_eq!(bad.validate(), Err(ConfigError::ZeroRetransmitTimeout));
        let bad = ReliableConfig {
            max_retransmit_timeout: Duration::from_millis(1),
            ..ReliableConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::BackoffCapBelowTimeout { .. })
        ));
        let bad = ReliableConfig {
            recv_window: 0,
            ..ReliableConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::WindowOutOfRange {
                name: "recv_window",
                ..
            })
        ));
        let bad = ReliableConfig {
            max_message_len: MAX_MESSAGE_LEN + 1,
            ..ReliableConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::MessageLenAboveWireLimit { .. })
        ));
        let bad = ReliableConfig {
            ack_delay: ReliableConfig::default().retransmit_timeout,
            ..ReliableConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::AckDelayNotBelowTimeout { .. })
        ));
        ReliableConfig::local().validate().unwrap();
    }

    #[test]
    fn sanitized_is_valid() {
        let bad = ReliableConfig {
            retransmit_timeout: Duration::ZERO,
            max_retransmit_timeout: Duration::ZERO,
            send_window: 0,
            recv_window: u32::MAX,
            max_queued_bytes: 0,
            max_message_len: usize::MAX,
            max_peers: 0,
            idle_timeout: Duration::ZERO,
            ack_delay: Duration::MAX,
        };
        bad.sanitized().validate().unwrap();
        assert_eq!(
            ReliableConfig::default().sanitized(),
            ReliableConfig::default()
        );
    }
}
