//! Which locks are contended at this node, so that their waiters sleep instead of spinning.
//!
//! A wait busy-polls for [`crate::NodeBuilder::spin_wait`] because waking a sleeping thread
//! costs about a loopback round trip. That pays only when the answer comes within the spin:
//! for a lock other owners hold and wait for, it comes after one or more handoffs, and the
//! spinning thread takes the CPU that the grantor and the next holder need for those
//! handoffs (on a small machine, measured in `docs/benchmarks.md`). So:
//! - a request the grantor queued behind another owner ([`LockNotice::Queued`]) stops
//!   spinning at once and sleeps until its grant wakes it;
//! - the lock is then marked contended here, and later requests of it do not spin at all;
//! - the first request of it that is granted without being queued clears the mark.
//!
//! While a lock is marked contended and nobody listens to the lock events of its service
//! (`Waiting` is the only thing the node would do with the message), its waiting requests ask
//! the grantor not to send `Queued` ([`LockService::lock_quiet`]): in a contended steady state
//! that saves the grantor a datagram per handoff and the waiter a wake-up (measured in
//! `docs/benchmarks.md`). Such a request cannot tell whether it was queued, so its grant clears
//! the mark only if it came within the spin: a lock whose grants come later than that is, for
//! spinning, as good as contended.
//!
//! [`LockNotice::Queued`]: conclave_protocol::locking::LockNotice::Queued
//! [`LockService::lock_quiet`]: conclave_protocol::locking::LockService::lock_quiet

use std::collections::BTreeSet;
use std::time::Duration;

use conclave_lock_api::LockName;

/// How many contended locks a node remembers; past this the memory starts afresh (at worst,
/// some waiters spin once more).
const REMEMBERED: usize = 1024;

/// The locks of one node whose last request was queued behind another owner.
#[derive(Debug, Default)]
pub(crate) struct Contention {
    contended: BTreeSet<LockName>,
}

impl Contention {
    /// Whether a new request of `name` should skip its spin.
    pub(crate) fn is_contended(&self, name: &LockName) -> bool {
        self.contended.contains(name)
    }

    /// A request of `name` was queued behind another owner.
    pub(crate) fn queued(&mut self, name: &LockName) {
        if self.contended.len() >= REMEMBERED && !self.contended.contains(name) {
            self.contended.clear();
        }
        self.contended.insert(name.clone());
    }

    /// A request of `name` was granted without being queued first.
    fn granted_unqueued(&mut self, name: &LockName) {
        self.contended.remove(name);
    }

    /// Whether a new request should ask the grantor not to say it was queued: it waits, its
    /// lock is contended here, and nobody listens for `Waiting`.
    pub(crate) fn wants_quiet(&self, name: &LockName, wait: bool, listened: bool) -> bool {
        wait && !listened && self.is_contended(name)
    }

    /// A request of `name` was granted. `queued`: the grantor said it was queued. `quiet`:
    /// it asked not to be told, and waited this long for its grant; it counts as unqueued
    /// only if that was within `spin` (a lock whose grants take longer is, for spinning, as
    /// good as contended).
    pub(crate) fn granted(
        &mut self,
        name: &LockName,
        queued: bool,
        quiet: Option<Duration>,
        spin: Duration,
    ) {
        if !queued && quiet.is_none_or(|waited| waited <= spin) {
            self.granted_unqueued(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_marks_and_an_unqueued_grant_clears() {
        let mut c = Contention::default();
        let hot = LockName::new("hot").expect("name");
        assert!(!c.is_contended(&hot));
        c.queued(&hot);
        assert!(c.is_contended(&hot));
        c.granted_unqueued(&hot);
        assert!(!c.is_contended(&hot));
    }

    #[test]
    fn only_unwatched_waits_of_contended_locks_are_quiet() {
        let mut c = Contention::default();
        let hot = LockName::new("hot").expect("name");
        assert!(!c.wants_quiet(&hot, true, false), "not contended yet");
        c.queued(&hot);
        assert!(c.wants_quiet(&hot, true, false));
        assert!(
            !c.wants_quiet(&hot, true, true),
            "someone listens for Waiting"
        );
        assert!(
            !c.wants_quiet(&hot, false, false),
            "a try-lock is never queued"
        );
    }

    #[test]
    fn a_quiet_grant_clears_the_mark_only_within_the_spin() {
        let spin = Duration::from_micros(100);
        let mut c = Contention::default();
        let hot = LockName::new("hot").expect("name");
        c.queued(&hot);
        c.granted(&hot, false, Some(Duration::from_micros(500)), spin);
        assert!(
            c.is_contended(&hot),
            "a late quiet grant may have been queued"
        );
        c.granted(&hot, true, None, spin);
        assert!(c.is_contended(&hot), "a queued grant keeps the mark");
        c.granted(&hot, false, Some(Duration::from_micros(40)), spin);
        assert!(!c.is_contended(&hot), "a prompt quiet grant clears it");
        c.queued(&hot);
        c.granted(&hot, false, None, spin);
        assert!(!c.is_contended(&hot), "an unqueued grant clears it");
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut c = Contention::default();
        for i in 0..=REMEMBERED {
            c.queued(&LockName::new(format!("l{i}")).expect("name"));
        }
        assert!(c.contended.len() <= REMEMBERED);
        assert!(c.is_contended(&LockName::new(format!("l{REMEMBERED}")).expect("name")));
    }
}
