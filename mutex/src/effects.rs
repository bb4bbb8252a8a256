//! [`Effects`]: what a call into the endpoint leaves to do once the state lock is released.

use std::task::Waker;

use conclave_lock_api::{LockLost, LostHandler, UnexpectedHandler, UnexpectedLock};
use conclave_protocol::Transmit;

/// What a call into the endpoint left to do once the state lock is released.
#[derive(Default)]
#[must_use]
pub(crate) struct Effects {
    /// Datagrams to send.
    pub(crate) transmits: Vec<Transmit>,
    /// Whether the driver must re-arm its timer.
    pub(crate) wake_driver: bool,
    /// Lost-lock handlers to call, with their event.
    pub(crate) lost: Vec<(LostHandler, LockLost)>,
    /// Unexpected-lock handlers to call, with their report.
    pub(crate) unexpected: Vec<(UnexpectedHandler, UnexpectedLock)>,
    /// Whether the node's view or phase changed (its listeners are notified).
    pub(crate) node_changed: bool,
    /// Tasks to wake: their slots were answered.
    pub(crate) wakers: Vec<Waker>,
}

impl Effects {
    /// The same, without waking the driver (for the driver's own calls).
    pub(crate) fn without_driver_wake(mut self) -> Self {
        self.wake_driver = false;
        self
    }

    /// Adds `later`'s effects after these.
    pub(crate) fn merge(&mut self, later: Effects) {
        self.transmits.extend(later.transmits);
        self.wake_driver |= later.wake_driver;
        self.lost.extend(later.lost);
        self.unexpected.extend(later.unexpected);
        self.node_changed |= later.node_changed;
        self.wakers.extend(later.wakers);
    }
}
