//! The front state of one lock service of a group node: who listens to its events, its
//! handlers, the grantor it knows to serve and who waits for that. A node has one for its
//! default service and one per named service it opened or heard of ([`crate::shared::Shared`]).

use std::task::Waker;

use async_channel::Sender;
use conclave_lock_api::{LockEvent, LostHandler, MemberId, UnexpectedHandler};

/// The front state of one lock service.
#[derive(Default)]
pub(crate) struct Front {
    event_subscribers: Vec<Sender<LockEvent>>,
    pub(crate) handlers: Vec<LostHandler>,
    pub(crate) unexpected_handlers: Vec<UnexpectedHandler>,
    /// The grantor known to serve ([`conclave_protocol::locking::LockNotice::GrantorServing`]).
    pub(crate) serving_grantor: Option<MemberId>,
    /// Woken when a serving grantor becomes known, and when the service or node closes.
    pub(crate) serving_wakers: Vec<Waker>,
    /// Woken whenever the serving grantor changes (`become_grantor` waits on it).
    pub(crate) grantor_wakers: Vec<Waker>,
    /// A named service: which opening of it the handles of this front belong to (handles of
    /// an earlier one see the service destroyed).
    pub(crate) generation: u64,
    /// A named service destroyed on this member (until it is opened again).
    pub(crate) destroyed: bool,
    /// Woken when the service's releases are acknowledged, while it is destroyed.
    pub(crate) destroy_wakers: Vec<Waker>,
}

impl Front {
    /// A front knowing `serving_grantor` already.
    pub(crate) fn serving(serving_grantor: Option<MemberId>) -> Self {
        Self {
            serving_grantor,
            ..Self::default()
        }
    }

    /// Whether handles of opening `generation` may still use the service.
    pub(crate) fn is_open(&self, generation: u64) -> bool {
        self.generation == generation && !self.destroyed
    }

    /// The service is opened again after a destroy: a fresh front (no listeners, no handlers)
    /// for new handles, knowing the same grantor.
    pub(crate) fn reopen(&mut self) {
        let mut fresh = Self::serving(self.serving_grantor.take());
        fresh.generation = self.generation + 1;
        self.close();
        *self = fresh;
    }

    /// Emits a lock event to every listener.
    pub(crate) fn emit(&mut self, event: LockEvent) {
        self.emit_with(|| event);
    }

    /// Whether anyone listens to the events (a listener whose stream was dropped does not).
    pub(crate) fn is_listened(&self) -> bool {
        self.event_subscribers.iter().any(|s| !s.is_closed())
    }

    /// Emits the lock event `event` makes to every listener; with no listener, the event is
    /// not made (a lock and its release build no event nobody reads).
    pub(crate) fn emit_with(&mut self, event: impl FnOnce() -> LockEvent) {
        if !self.is_listened() {
            return;
        }
        let event = event();
        self.event_subscribers
            .retain(|s| s.try_send(event.clone()).is_ok());
    }

    /// A new listener of the events (a stream that has ended if `ended`).
    pub(crate) fn subscribe(&mut self, ended: bool) -> async_channel::Receiver<LockEvent> {
        let (sender, receiver) = async_channel::unbounded();
        if !ended {
            self.event_subscribers.push(sender);
        }
        receiver
    }

    /// The serving grantor changed to `grantor`: wakes who waits for it and tells the
    /// listeners.
    pub(crate) fn grantor_changed(&mut self, grantor: Option<MemberId>) {
        if grantor.is_some() {
            for waker in self.serving_wakers.drain(..) {
                waker.wake();
            }
        }
        for waker in self.grantor_wakers.drain(..) {
            waker.wake();
        }
        self.emit(LockEvent::GrantorChanged {
            grantor: grantor.clone(),
        });
        self.serving_grantor = grantor;
    }

    /// Wakes whoever waits for the end of a destroy.
    pub(crate) fn wake_destroy(&mut self) {
        for waker in self.destroy_wakers.drain(..) {
            waker.wake();
        }
    }

    /// The service (or the node) closed: its event streams end, and every waiter is woken to
    /// see it.
    pub(crate) fn close(&mut self) {
        self.event_subscribers.clear();
        for waker in self
            .serving_wakers
            .drain(..)
            .chain(self.grantor_wakers.drain(..))
            .chain(self.destroy_wakers.drain(..))
        {
            waker.wake();
        }
    }
}
