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
//! [`LockNotice::Queued`]: conclave_protocol::locking::LockNotice::Queued

use std::collections::BTreeSet;

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
    pub(crate) fn granted_unqueued(&mut self, name: &LockName) {
        self.contended.remove(name);
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
    fn the_memory_is_bounded() {
        let mut c = Contention::default();
        for i in 0..=REMEMBERED {
            c.queued(&LockName::new(format!("l{i}")).expect("name"));
        }
        assert!(c.contended.len() <= REMEMBERED);
        assert!(c.is_contended(&LockName::new(format!("l{REMEMBERED}")).expect("name")));
    }
}
