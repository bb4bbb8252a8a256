//! Replay protection: which packets of each sender were already accepted.
//!
//! Each sender (known by the address in its authenticated header) has a current session —
//! the 16-byte id it drew when it started: its start time in nanoseconds since the Unix epoch,
//! then 8 random bytes — and a sliding window over the counters of that session:
//! [`WINDOW`] counters below the highest one accepted. A counter seen before, or below the
//! window, is a replay (or too late to matter: the reliable layer sends again). A packet of a
//! newer session (a restart) starts a new window; one of an older session is stale. Windows
//! are kept only for authenticated packets, at most [`MAX_SENDERS`] of them; a sender silent
//! for [`FORGET_AFTER`] is forgotten.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How many counters below the highest the window remembers. One counter runs over all of a
/// sender's destinations, so this bounds reordering in packets sent by the sender, to anyone.
pub const WINDOW: u64 = 1024;
/// The most senders whose windows are kept.
pub const MAX_SENDERS: usize = 4096;
/// How long a silent sender's window is kept.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

const WORDS: usize = (WINDOW / 64) as usize;

/// What the windows say of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not seen before: accept it.
    Fresh,
    /// Seen before, or below the window.
    Replayed,
    /// Of a session older than the sender's current one.
    Stale,
}

#[derive(Debug)]
struct Window {
    session: [u8; 16],
    top: u64,
    /// Bit `i` (word `i / 64`, bit `i % 64`) set: counter `top - i` accepted.
    seen: [u64; WORDS],
    last: Instant,
}

impl Window {
    fn new(session: [u8; 16], counter: u64, now: Instant) -> Self {
        let mut seen = [0; WORDS];
        seen[0] = 1;
        Self {
            session,
            top: counter,
            seen,
            last: now,
        }
    }

    fn accept(&mut self, counter: u64) -> bool {
        if counter > self.top {
            self.shift(counter - self.top);
            self.top = counter;
            self.seen[0] |= 1;
            return true;
        }
        let back = self.top - counter;
        if back >= WINDOW {
            return false;
        }
        let (word, bit) = ((back / 64) as usize, back % 64);
        let fresh = self.seen[word] & (1 << bit) == 0;
        self.seen[word] |= 1 << bit;
        fresh
    }

    /// Moves every mark `by` places further from the top.
    fn shift(&mut self, by: u64) {
        if by >= WINDOW {
            self.seen = [0; WORDS];
            return;
        }
        let (words, bits) = ((by / 64) as usize, (by % 64) as u32);
        for i in (0..WORDS).rev() {
            let lo = i.checked_sub(words).map_or(0, |j| self.seen[j]);
            let carry = match i.checked_sub(words + 1) {
                Some(j) if bits > 0 => self.seen[j] >> (64 - bits),
                _ => 0,
            };
            self.seen[i] = (lo << bits) | carry;
        }
    }
}

/// Every sender's window.
#[derive(Debug, Default)]
pub(crate) struct Windows {
    senders: HashMap<SocketAddr, Window>,
}

impl Windows {
    /// Judges a packet by its (not yet authenticated) header without marking anything: a
    /// packet that is a replay or stale by its header need not be opened, and a forged header
    /// changes no window.
    pub(crate) fn peek(
        &self,
        now: Instant,
        sender: SocketAddr,
        session: [u8; 16],
        counter: u64,
    ) -> Verdict {
        let Some(window) = self.senders.get(&sender) else {
            return Verdict::Fresh;
        };
        if now.saturating_duration_since(window.last) >= FORGET_AFTER {
            return Verdict::Fresh;
        }
        if session != window.session {
            return if session < window.session {
                Verdict::Stale
            } else {
                Verdict::Fresh
            };
        }
        if counter > window.top {
            return Verdict::Fresh;
        }
        let back = window.top - counter;
        if back >= WINDOW || window.seen[(back / 64) as usize] & (1 << (back % 64)) != 0 {
            Verdict::Replayed
        } else {
            Verdict::Fresh
        }
    }

    /// Judges an authenticated packet and, if fresh, marks it seen.
    pub(crate) fn check(
        &mut self,
        now: Instant,
        sender: SocketAddr,
        session: [u8; 16],
        counter: u64,
    ) -> Verdict {
        if let Some(window) = self.senders.get_mut(&sender) {
            if now.saturating_duration_since(window.last) < FORGET_AFTER {
                if session < window.session {
                    return Verdict::Stale;
                }
                if session == window.session {
                    if !window.accept(counter) {
                        return Verdict::Replayed;
                    }
                    window.last = now;
                    return Verdict::Fresh;
                }
            }
            *window = Window::new(session, counter, now);
            return Verdict::Fresh;
        }
        if self.senders.len() >= MAX_SENDERS {
            self.senders
                .retain(|_, w| now.saturating_duration_since(w.last) < FORGET_AFTER);
            if self.senders.len() >= MAX_SENDERS {
                if let Some(oldest) = self
                    .senders
                    .iter()
                    .min_by_key(|(_, w)| w.last)
                    .map(|(a, _)| *a)
                {
                    self.senders.remove(&oldest);
                }
            }
        }
        self.senders
            .insert(sender, Window::new(session, counter, now));
        Verdict::Fresh
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn each_counter_is_accepted_once_in_any_order_within_the_window() {
        let now = Instant::now();
        let mut w = Windows::default();
        let s = [1; 16];
        let order = [
            5u64, 3, 9, 4, 2000, 1500, 977, 976, 2000, 9, 3000, 1977, 1976,
        ];
        let want = [
            Verdict::Fresh,
            Verdict::Fresh,
            Verdict::Fresh,
            Verdict::Fresh,
            Verdict::Fresh,
            Verdict::Fresh,
            Verdict::Fresh,
            Verdict::Replayed, // 2000 - 976 = 1024: below the window
            Verdict::Replayed,
            Verdict::Replayed,
            Verdict::Fresh,
            Verdict::Fresh, // 3000 - 1977 = 1023: the window's last place
            Verdict::Replayed,
        ];
        for (c, v) in order.iter().zip(want) {
            assert_eq!(w.check(now, addr(1), s, *c), v, "counter {c}");
        }
    }

    #[test]
    fn shifting_keeps_marks_across_words() {
        let now = Instant::now();
        let mut w = Windows::default();
        let s = [1; 16];
        for c in 0..300 {
            assert_eq!(w.check(now, addr(1), s, c * 3), Verdict::Fresh);
        }
        for c in 0..300 {
            assert_eq!(w.check(now, addr(1), s, c * 3), Verdict::Replayed);
        }
        for c in 0..299 {
            let counter = c * 3 + 1;
            assert_eq!(
                w.check(now, addr(1), s, counter),
                Verdict::Fresh,
                "{counter}"
            );
        }
    }

    #[test]
    fn newer_sessions_restart_older_ones_are_stale_until_forgotten() {
        let now = Instant::now();
        let mut w = Windows::default();
        assert_eq!(w.check(now, addr(1), [2; 16], 10), Verdict::Fresh);
        assert_eq!(w.check(now, addr(1), [3; 16], 0), Verdict::Fresh);
        assert_eq!(w.check(now, addr(1), [2; 16], 11), Verdict::Stale);
        assert_eq!(w.check(now, addr(2), [2; 16], 11), Verdict::Fresh);
        let later = now + FORGET_AFTER;
        assert_eq!(w.check(later, addr(1), [2; 16], 12), Verdict::Fresh);
    }

    #[test]
    fn peeking_agrees_with_checking_and_marks_nothing() {
        let now = Instant::now();
        let mut w = Windows::default();
        let s = [4; 16];
        for c in [10u64, 12, 11, 2000, 12, 975, 976, 3000] {
            let peeked = w.peek(now, addr(1), s, c);
            assert_eq!(w.peek(now, addr(1), s, c), peeked, "peek marked {c}");
            assert_eq!(w.check(now, addr(1), s, c), peeked, "counter {c}");
        }
        assert_eq!(w.peek(now, addr(1), [3; 16], 0), Verdict::Stale);
        assert_eq!(w.peek(now, addr(1), [5; 16], 0), Verdict::Fresh);
        assert_eq!(w.check(now, addr(1), s, 2999), Verdict::Fresh);
    }

    #[test]
    fn the_table_stays_bounded() {
        let now = Instant::now();
        let mut w = Windows::default();
        for i in 0..(MAX_SENDERS as u32 + 100) {
            let a = SocketAddr::from(([127, 0, (i >> 8) as u8, i as u8], 1));
            assert_eq!(w.check(now, a, [1; 16], 0), Verdict::Fresh);
        }
        assert_eq!(w.len(), MAX_SENDERS);
    }
}
