//! [`Inner`]: everything of a node that lives behind an `Arc`, and the commands its driver
//! thread takes.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Context;
use std::thread::JoinHandle;

use async_channel::Sender;
use conclave_lock_api::{MemberId, RequestId, Transport};
use conclave_protocol::{Destination, Endpoint, Instant};
use event_listener::Event;
use tracing::debug;

use crate::duty::ReceiveDuty;
use crate::effects::Effects;
use crate::shared::Shared;

/// What the driver thread is asked to do.
pub(crate) enum Command {
    /// Something changed in the endpoint (a new timer, queued datagrams): look again.
    Flush,
    /// Release everything, leave the cluster and stop.
    Shutdown,
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Command::Flush => "Flush",
            Command::Shutdown => "Shutdown",
        })
    }
}

/// Everything of a node that lives behind an `Arc`: shared by the [`crate::Node`], every
/// handle and guard, and the driver thread.
pub(crate) struct Inner {
    shared: Mutex<Shared>,
    pub(crate) commands: Sender<Command>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) member: MemberId,
    origin: std::time::Instant,
    /// Who reads a blocking transport: the driver or a spinning task.
    pub(crate) duty: ReceiveDuty,
    /// Notified when a view is installed and when the node closes.
    pub(crate) changed: Event,
    /// The driver thread, joined once the node has closed.
    pub(crate) thread: Mutex<Option<JoinHandle<()>>>,
    /// The last local owner number handed out ([`Inner::next_owner`]).
    owners: AtomicU64,
    /// How long a wait for the cluster's answer lasts at most
    /// ([`conclave_lock_api::RawLockBackend::answer_bound`]).
    pub(crate) answer_bound: std::time::Duration,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("member", &self.member)
            .finish()
    }
}

impl Inner {
    pub(crate) fn new(
        endpoint: Endpoint,
        transport: Arc<dyn Transport>,
        commands: Sender<Command>,
        spin_wait: std::time::Duration,
        answer_bound: std::time::Duration,
    ) -> Self {
        Self {
            member: endpoint.local().clone(),
            shared: Mutex::new(Shared::new(endpoint, spin_wait)),
            commands,
            transport,
            origin: std::time::Instant::now(),
            duty: ReceiveDuty::default(),
            changed: Event::new(),
            thread: Mutex::new(None),
            owners: AtomicU64::new(0),
            answer_bound,
        }
    }

    /// A fresh local owner number (the first is 1), without taking the state lock.
    pub(crate) fn next_owner(&self) -> u64 {
        self.owners.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The shared state. A panic while it was held (a bug) does not make it unusable: every
    /// method leaves it consistent between calls into the endpoint.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The protocol's clock: time since the node started.
    pub(crate) fn now(&self) -> Instant {
        Instant::from_duration(self.origin.elapsed())
    }

    /// The protocol instant `at` on the std clock.
    pub(crate) fn to_std(&self, at: Instant) -> std::time::Instant {
        self.origin + std::time::Duration::from_nanos(at.as_nanos())
    }

    /// Acts on what [`Shared::settle`] returned, after the state lock is released: sends the
    /// datagrams from this thread (sends never block: see the `Transport` send contract),
    /// wakes the driver if its timer must be re-armed, and calls lost-lock handlers.
    pub(crate) fn flush(&self, effects: Effects) {
        let Effects {
            transmits,
            wake_driver,
            lost,
            unexpected,
            node_changed,
            wakers,
        } = effects;
        for transmit in transmits {
            let result = match transmit.destination {
                Destination::Member(addr) => self.transport.send_to(addr, &transmit.bytes),
                Destination::Discovery => self.transport.send_discovery(&transmit.bytes),
            };
            if let Err(error) = result {
                debug!(%error, "datagram not sent; the protocol will retransmit");
            }
        }
        for waker in wakers {
            waker.wake();
        }
        if wake_driver {
            self.command(Command::Flush);
        }
        if node_changed {
            self.changed.notify(usize::MAX);
        }
        for (handler, report) in unexpected {
            let call = std::panic::AssertUnwindSafe(|| handler(&report));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!(lock = %report.name, "an unexpected-lock handler panicked");
            }
        }
        for (handler, event) in lost {
            // A panicking handler must not take the driver thread (and every waiter) down.
            let call = std::panic::AssertUnwindSafe(|| handler(&event));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!(lock = %event.name, "a lost-lock handler panicked");
            }
        }
    }

    /// Gives the driver a command and wakes it: out of the reactor (the channel does that),
    /// out of a blocking receive, or out of its standby.
    pub(crate) fn command(&self, command: Command) {
        if self.commands.try_send(command).is_ok() {
            if let Some(blocking) = self.transport.blocking() {
                blocking.interrupt();
                self.duty.wake_driver();
            }
        }
    }

    /// Feeds a datagram to the endpoint and acts on what follows (a task holding the
    /// receive duty does this on its own thread).
    pub(crate) fn handle_datagram(&self, bytes: &[u8]) {
        let effects = {
            let mut shared = self.lock();
            let now = self.now();
            shared.endpoint.handle_datagram(now, bytes);
            shared.settle(now)
        };
        self.flush(effects);
    }

    /// One step of a task spinning for the answer to `request` until `until`: takes the
    /// receive duty if the transport has a blocking receive and no other task holds it, and
    /// handles one waiting datagram. Returns whether it handled one.
    pub(crate) fn receive_inline(&self, request: RequestId, until: std::time::Instant) -> bool {
        let Some(blocking) = self.transport.blocking() else {
            return false;
        };
        if !self.duty.take(request, until, std::time::Instant::now()) {
            return false;
        }
        match blocking.try_recv() {
            Ok(Some(datagram)) => {
                self.handle_datagram(&datagram.bytes);
                true
            }
            Ok(None) | Err(_) => false,
        }
    }

    /// Spins for the answer to `request` if its wait still may: reads the transport if it
    /// can, else asks to be polled again. Returns `Some` with the poll's answer while
    /// spinning, `None` once the wait should sleep; `pumped` counts datagrams read so far.
    pub(crate) fn spin(
        &self,
        request: RequestId,
        until: Option<std::time::Instant>,
        pumped: &mut usize,
        cx: &mut Context<'_>,
    ) -> Option<bool> {
        if !spinning(until) {
            return None;
        }
        if *pumped < PUMP_LIMIT && until.is_some_and(|until| self.receive_inline(request, until)) {
            *pumped += 1;
            return Some(true); // look again
        }
        cx.waker().wake_by_ref();
        Some(false)
    }
}

/// The most datagrams a spinning wait handles in one poll before it yields.
const PUMP_LIMIT: usize = 64;

/// Whether a wait still busy-polls (until `until`). A spinning wait asks to be polled again
/// at once, so its task yields to the executor between polls.
fn spinning(until: Option<std::time::Instant>) -> bool {
    until.is_some_and(|until| std::time::Instant::now() < until)
}
