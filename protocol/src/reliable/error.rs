//! Errors of the reliable layer.

use thiserror::Error;

/// Why [`super::Reliable::send`] refused a message. In every case nothing was queued and no
/// state changed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SendError {
    /// The message is longer than `ReliableConfig::max_message_len`.
    #[error("message of {len} bytes exceeds the limit of {max} bytes; nothing was queued")]
    TooLarge {
        /// Length of the message.
        len: usize,
        /// The limit, `ReliableConfig::max_message_len`.
        max: usize,
    },
    /// The peer already has this many bytes queued or in flight; retry once acknowledgements
    /// have drained its queue (see [`super::Reliable::has_unacked`]).
    #[error("{queued} bytes already queued or unacknowledged to the peer, limit {max}; nothing was queued")]
    QueueFull {
        /// Payload bytes queued or unacknowledged to the peer.
        queued: usize,
        /// The limit, `ReliableConfig::max_queued_bytes`.
        max: usize,
    },
    /// The peer is new and `ReliableConfig::max_peers` peer states exist already.
    #[error("peer table full ({max} peers); nothing was queued")]
    TooManyPeers {
        /// The limit, `ReliableConfig::max_peers`.
        max: usize,
    },
    /// The destination is this member itself; deliver locally instead.
    #[error("cannot send to this member itself")]
    ToSelf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_say_nothing_was_queued() {
        let e = SendError::QueueFull { queued: 10, max: 8 };
        assert!(e.to_string().contains("nothing was queued"));
        fn assert_send_sync<T: Send + Sync + 'static>() {}
        assert_send_sync::<SendError>();
    }
}
