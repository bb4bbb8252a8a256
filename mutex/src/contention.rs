//! Which locks are contended at this node, so that their waiters sleep instead of spinning.
//!
//! A wait busy-polls (at most [`crate::NodeBuilder::spin_wait`], see [`crate::spin`])
//! because waking a sleeping thread costs about a loopback round trip. That pays only when
//! the answer comes within the spin: for a lock other owners hold and wait for, it comes
//! after one or more handoffs, and the spinning thread takes the CPU that the grantor and the
//! next holder need for those handoffs (on a small machine, measured in
//! `docs/benchmarks.md`). So:
//! - a request the grantor queued behind another owner ([`LockNotice::Queued`]) stops
//!   spinning at once and sleeps until its grant wakes it;
//! - the lock is then marked contended here, and later requests of it do not spin at all;
//! - the first request of it that is granted without being queued clears the mark.
//!
//! While a lock is marked contended and nobody listens to the lock events of its service
//! (`Waiting` is the only other thing the node does with the message), its waiting requests
//! ask the grantor not to send `Queued` ([`LockMachine::lock_quiet`]): in a contended steady
//! state that saves the grantor a datagram per handoff and the waiter a wake-up (measured in
//! `docs/benchmarks.md`). A quiet request cannot tell whether it was queued, so its grant
//! leaves the mark as it is; every [`PROBE_EVERY`]th wait of a marked lock asks as usual, and
//! its grant clears the mark once the lock is no longer contended.
//!
//! A lock is its service and its name: the same name in two services is two locks.
//!
//! [`LockNotice::Queued`]: conclave_protocol::locking::LockNotice::Queued
//! [`LockMachine::lock_quiet`]: conclave_protocol::locking::LockMachine::lock_quiet

use std::collections::BTreeMap;

use conclave_lock_api::{LockName, ServiceName};

/// How many contended locks a node remembers; past this the memory starts afresh (at worst,
/// some waiters spin once more).
const REMEMBERED: usize = 1024;

/// One wait in this many, for a lock marked contended, is not quiet: it finds out whether
/// the lock still is.
pub(crate) const PROBE_EVERY: u32 = 8;

/// A lock: its service (`None`: the default one) and its name.
type Key = (Option<ServiceName>, LockName);

/// The locks of one node whose last request was queued behind another owner, each with the
/// number of quiet waits asked for since the last wait that was not quiet.
#[derive(Debug, Default)]
pub(crate) struct Contention {
    contended: BTreeMap<Key, u32>,
}

fn key(service: Option<&ServiceName>, name: &LockName) -> Key {
    (service.cloned(), name.clone())
}

impl Contention {
    /// Whether a new request of the lock should skip its spin.
    pub(crate) fn is_contended(&self, service: Option<&ServiceName>, name: &LockName) -> bool {
        !self.contended.is_empty() && self.contended.contains_key(&key(service, name))
    }

    /// A request of the lock was queued behind another owner.
    pub(crate) fn queued(&mut self, service: Option<&ServiceName>, name: &LockName) {
        let key = key(service, name);
        if self.contended.len() >= REMEMBERED && !self.contended.contains_key(&key) {
            self.contended.clear();
        }
        self.contended.entry(key).or_insert(0);
    }

    /// Whether a new request should ask the grantor not to say it was queued: it waits, its
    /// lock is contended here, nobody listens for `Waiting`, and it is not this lock's turn to
    /// probe (every [`PROBE_EVERY`]th such wait is not quiet).
    pub(crate) fn wants_quiet(
        &mut self,
        service: Option<&ServiceName>,
        name: &LockName,
        wait: bool,
        listened: bool,
    ) -> bool {
        if !wait || listened || self.contended.is_empty() {
            return false;
        }
        let Some(quiet) = self.contended.get_mut(&key(service, name)) else {
            return false;
        };
        *quiet += 1;
        if *quiet >= PROBE_EVERY {
            *quiet = 0;
            return false;
        }
        true
    }

    /// A request of the lock was granted. `queued`: the grantor said it was queued; `quiet`:
    /// it had asked not to be told, so its grant says nothing about contention. Any other
    /// grant came without queueing and clears the mark.
    pub(crate) fn granted(
        &mut self,
        service: Option<&ServiceName>,
        name: &LockName,
        queued: bool,
        quiet: bool,
    ) {
        if !queued && !quiet && !self.contended.is_empty() {
            self.contended.remove(&key(service, name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot() -> LockName {
        LockName::new("hot").expect("name")
    }

    #[test]
    fn queued_marks_and_an_unqueued_grant_clears() {
        let mut c = Contention::default();
        assert!(!c.is_contended(None, &hot()));
        c.queued(None, &hot());
        assert!(c.is_contended(None, &hot()));
        c.granted(None, &hot(), true, false);
        assert!(
            c.is_contended(None, &hot()),
            "a queued grant keeps the mark"
        );
        c.granted(None, &hot(), false, true);
        assert!(c.is_contended(None, &hot()), "a quiet grant tells nothing");
        c.granted(None, &hot(), false, false);
        assert!(!c.is_contended(None, &hot()));
    }

    #[test]
    fn a_lock_is_its_service_and_its_name() {
        let mut c = Contention::default();
        let billing = ServiceName::new("billing").expect("name");
        c.queued(Some(&billing), &hot());
        assert!(c.is_contended(Some(&billing), &hot()));
        assert!(!c.is_contended(None, &hot()), "another service's lock");
        assert!(!c.wants_quiet(None, &hot(), true, false));
        c.granted(None, &hot(), false, false);
        assert!(c.is_contended(Some(&billing), &hot()));
    }

    #[test]
    fn only_unwatched_waits_of_contended_locks_are_quiet() {
        let mut c = Contention::default();
        assert!(
            !c.wants_quiet(None, &hot(), true, false),
            "not contended yet"
        );
        c.queued(None, &hot());
        assert!(c.wants_quiet(None, &hot(), true, false));
        assert!(
            !c.wants_quiet(None, &hot(), true, true),
            "someone listens for Waiting"
        );
        assert!(
            !c.wants_quiet(None, &hot(), false, false),
            "a try-lock is never queued"
        );
    }

    #[test]
    fn every_eighth_wait_probes_so_the_mark_can_clear() {
        let mut c = Contention::default();
        c.queued(None, &hot());
        let quiet: Vec<bool> = (0..2 * PROBE_EVERY)
            .map(|_| c.wants_quiet(None, &hot(), true, false))
            .collect();
        let probes = quiet.iter().filter(|q| !**q).count();
        assert_eq!(probes, 2, "{quiet:?}");
        assert!(!quiet[PROBE_EVERY as usize - 1] && !quiet[2 * PROBE_EVERY as usize - 1]);
        // The probe is granted without queueing: the contention is over.
        c.granted(None, &hot(), false, false);
        assert!(!c.wants_quiet(None, &hot(), true, false));
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut c = Contention::default();
        for i in 0..=REMEMBERED {
            c.queued(None, &LockName::new(format!("l{i}")).expect("name"));
        }
        assert!(c.contended.len() <= REMEMBERED);
        let last = LockName::new(format!("l{REMEMBERED}")).expect("name");
        assert!(c.is_contended(None, &last));
    }
}
