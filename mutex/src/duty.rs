//! Who reads a transport that has a blocking receive ([`BlockingRecv`]): the driver thread,
//! or, for a few microseconds, a task spinning for its answer.
//!
//! On a small machine, waking a thread costs about as much as a loopback round trip. A task
//! waiting for a grant from another process busy-polls for a moment anyway
//! ([`crate::NodeBuilder::spin_wait`]); while it does, it takes the *receive duty* and reads
//! the transport itself, so the grant that completes it never passes through another thread.
//! Meanwhile the driver stands by: it parks without polling the sockets (so the kernel does
//! not wake it for what the task reads) until the duty comes back, its next deadline, or a
//! command. The duty comes back when the task is answered or stops spinning, and by itself
//! at the end of the task's spin, so a task that is not polled cannot hold the node's traffic
//! up for longer than that.
//!
//! [`BlockingRecv`]: conclave_lock_api::BlockingRecv

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::Thread;
use std::time::Instant;

use conclave_lock_api::RequestId;

/// The receive duty of one node.
#[derive(Debug, Default)]
pub(crate) struct ReceiveDuty {
    /// The task holding the duty (by its request) and until when.
    holder: Mutex<Option<(RequestId, Instant)>>,
    /// Whether `holder` may be `Some`: set under its lock when a task takes the duty, so a
    /// task that never took it gives nothing back without taking the lock.
    lent: AtomicBool,
    /// The driver thread, unparked when the duty comes back.
    driver: OnceLock<Thread>,
}

impl ReceiveDuty {
    /// Records the driver thread (once, when it starts).
    pub(crate) fn set_driver(&self, thread: Thread) {
        let _ = self.driver.set(thread);
    }

    /// Wakes the driver if it stands by (a no-op otherwise, but for its next standby, which
    /// then ends at once).
    pub(crate) fn wake_driver(&self) {
        if let Some(driver) = self.driver.get() {
            driver.unpark();
        }
    }

    /// `request` takes the duty until `until`, unless another task holds it. Returns whether
    /// `request` holds it.
    pub(crate) fn take(&self, request: RequestId, until: Instant, now: Instant) -> bool {
        let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
        match *holder {
            Some((other, other_until)) if other != request && now < other_until => false,
            _ => {
                *holder = Some((request, until));
                self.lent.store(true, Ordering::Release);
                true
            }
        }
    }

    /// `request` gives the duty back if it holds it, and wakes the driver to take over.
    pub(crate) fn release(&self, request: RequestId) {
        // A task that took the duty set `lent` itself, earlier on its own thread.
        if !self.lent.load(Ordering::Acquire) {
            return;
        }
        let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
        if holder.is_some_and(|(holding, _)| holding == request) {
            *holder = None;
            self.lent.store(false, Ordering::Release);
            drop(holder);
            self.wake_driver();
        }
    }

    /// For the driver: until when a task reads the transport, or `None` when the driver does
    /// (the duty of a task whose time is up returns to the driver here).
    pub(crate) fn lent_until(&self, now: Instant) -> Option<Instant> {
        let mut holder = self.holder.lock().unwrap_or_else(PoisonError::into_inner);
        match *holder {
            Some((_, until)) if now < until => Some(until),
            _ => {
                *holder = None;
                self.lent.store(false, Ordering::Release);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn one_task_at_a_time_until_its_time_is_up() {
        let duty = ReceiveDuty::default();
        let now = Instant::now();
        let (a, b) = (RequestId(1), RequestId(2));
        let until = now + Duration::from_micros(50);
        assert_eq!(duty.lent_until(now), None);
        assert!(duty.take(a, until, now));
        assert!(!duty.take(b, until, now), "a holds it");
        assert!(duty.take(a, until, now), "a may renew");
        assert_eq!(duty.lent_until(now), Some(until));
        // Past its time, the duty is the driver's again and another task may take it.
        assert_eq!(duty.lent_until(until), None);
        assert!(duty.take(b, until + Duration::from_micros(50), until));
        duty.release(a);
        assert!(
            duty.lent_until(until).is_some(),
            "only the holder gives it back"
        );
        duty.release(b);
        assert_eq!(duty.lent_until(until), None);
    }
}
