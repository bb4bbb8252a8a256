//! What the mesh knows of one member address: its connection and its reconnect backoff.

use std::time::{Duration, Instant};

use crate::config::MAX_DURATION;
use crate::wake::Token;

/// One member address: its listen address, or an alias under which it was dialled.
#[derive(Debug, Default)]
pub(crate) struct Peer {
    /// The connection frames to this address go on, once dialled or greeted.
    pub(crate) conn: Option<Token>,
    /// Consecutive failed connection attempts.
    failures: u32,
    /// No attempt before this instant.
    retry_at: Option<Instant>,
}

impl Peer {
    /// Whether a connection attempt must wait.
    pub(crate) fn in_backoff(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|at| now < at)
    }

    /// Notes a failed attempt: the next waits `min`, doubled per earlier consecutive failure,
    /// at most `max` (and at most [`MAX_DURATION`], whatever the configuration says).
    pub(crate) fn failed(&mut self, now: Instant, min: Duration, max: Duration) {
        let doublings = self.failures.min(31);
        self.failures = self.failures.saturating_add(1);
        let wait = min
            .saturating_mul(1 << doublings)
            .min(max)
            .min(MAX_DURATION);
        // Past the end of the clock: no backoff rather than a panic.
        self.retry_at = now.checked_add(wait);
    }

    /// Notes a handshake that succeeded: the backoff starts over.
    pub(crate) fn succeeded(&mut self) {
        self.failures = 0;
        self.retry_at = None;
    }

    /// Whether the entry holds nothing at all: no connection, no backoff.
    pub(crate) fn is_idle(&self) -> bool {
        self.conn.is_none() && self.failures == 0
    }

    /// Whether the entry holds nothing worth keeping at `now`: no connection and a backoff
    /// that ended at least `max` ago.
    pub(crate) fn is_stale(&self, now: Instant, max: Duration) -> bool {
        self.conn.is_none()
            && self
                .retry_at
                .is_none_or(|at| at.checked_add(max).is_some_and(|end| now >= end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_and_resets_on_success() {
        let min = Duration::from_millis(50);
        let max = Duration::from_secs(5);
        let now = Instant::now();
        let mut peer = Peer::default();
        assert!(!peer.in_backoff(now));
        let mut waits = Vec::new();
        for _ in 0..10 {
            peer.failed(now, min, max);
            waits.push(peer.retry_at.unwrap() - now);
        }
        assert_eq!(waits[0], min);
        assert_eq!(waits[1], min * 2);
        assert_eq!(waits[2], min * 4);
        assert_eq!(*waits.last().unwrap(), max);
        assert!(peer.in_backoff(now));
        assert!(!peer.in_backoff(now + max));
        assert!(!peer.is_stale(now, max));
        assert!(peer.is_stale(now + max * 2, max));
        peer.succeeded();
        assert!(!peer.in_backoff(now));
        peer.failed(now, min, max);
        assert_eq!(peer.retry_at.unwrap() - now, min);
    }

    #[test]
    fn huge_backoffs_do_not_panic() {
        let now = Instant::now();
        let mut peer = Peer::default();
        for _ in 0..40 {
            peer.failed(now, Duration::MAX, Duration::MAX);
        }
        assert!(peer.in_backoff(now));
        assert!(!peer.is_stale(now, Duration::MAX));
    }
}
