//! The machinery every lock type shares: a request's life from registration to answer
//! ([`Request`]), a granted lock ([`Hold`]) and the futures of a held lock ([`Unlock`],
//! [`Lost`]).
//!
//! Waiting follows event-listener's pattern: under the node's state lock, check the slot,
//! and if the answer is not there, register a listener on the slot's event before the lock
//! is released; then sleep. The thread that records the answer (the driver, or a user's task
//! whose call produced it) notifies the event after recording it, so no wake-up is lost.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use conclave_lock_api::{
    FencingToken, LockError, LockLostReason, LockMode, LockName, OwnerId, RequestId,
};
use conclave_protocol::locking::{HoldStatus, LockRequest};
use event_listener::EventListener;

use crate::error::UnlockError;
use crate::shared::{Inner, Phase};

/// What the owner of a held lock should believe about it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockStatus {
    /// Held, and the grantor was heard from recently (under `Majority`: it confirmed the
    /// hold's lease within `suspend_after`).
    Held,
    /// The grantor has been silent for a while (under `Majority`: the lease was last
    /// confirmed more than `suspend_after` ago and has not run out): ownership is unknown until
    /// it is heard again (or the lock is lost). Pause writes to the protected resource, or rely
    /// on the fencing token.
    Suspended,
    /// Not held any more; [`crate::MutexGuard::lost`] tells why.
    Lost,
}

/// The parameters of a request not yet registered.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) name: LockName,
    pub(crate) mode: LockMode,
    pub(crate) wait: bool,
    pub(crate) timeout: Option<Duration>,
    /// A fixed owner (reentrant handles), or `None` for a fresh one.
    pub(crate) owner: Option<u64>,
}

enum State {
    /// Not polled yet: nothing registered.
    Idle(Params),
    /// Registered in the endpoint; busy-polling until `spin_until`, then `listener` is set
    /// while sleeping.
    Waiting {
        request: RequestId,
        spin_until: Option<std::time::Instant>,
        listener: Option<EventListener>,
    },
    /// Answered; the slot belongs to the guard (or is gone).
    Done,
}

/// A lock request from first poll to answer. Dropping it before the answer withdraws the
/// request synchronously (or releases the lock if the grant won the race).
pub(crate) struct Request {
    inner: Arc<Inner>,
    state: State,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Idle(params) => format!("idle {} {:?}", params.name, params.mode),
            State::Waiting { request, .. } => format!("waiting {request}"),
            State::Done => "done".to_owned(),
        };
        f.debug_struct("Request").field("state", &state).finish()
    }
}

impl Request {
    pub(crate) fn new(inner: Arc<Inner>, params: Params) -> Self {
        Self {
            inner,
            state: State::Idle(params),
        }
    }

    pub(crate) fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<Result<Hold, LockError>> {
        let mut pumped = 0;
        loop {
            match &mut self.state {
                State::Idle(params) => {
                    let params = params.clone();
                    let (request, effects) = {
                        let mut shared = self.inner.lock();
                        if shared.phase != Phase::Running {
                            self.state = State::Done;
                            return Poll::Ready(Err(LockError::Shutdown));
                        }
                        let now = self.inner.now();
                        let owner = match params.owner {
                            Some(owner) => owner,
                            None => shared.next_owner(),
                        };
                        let request = shared.register(
                            now,
                            LockRequest {
                                owner,
                                name: params.name,
                                mode: params.mode,
                                wait: params.wait,
                                timeout: params.timeout,
                            },
                        );
                        (request, shared.settle(now))
                    };
                    self.state = State::Waiting {
                        request,
                        spin_until: self.inner.spin_deadline(),
                        listener: None,
                    };
                    self.inner.flush(effects);
                }
                State::Waiting {
                    request,
                    spin_until,
                    listener,
                } => {
                    if let Some(l) = listener {
                        ready!(Pin::new(l).poll(cx));
                        *listener = None;
                    }
                    let (request, spin_until) = (*request, *spin_until);
                    let mut shared = self.inner.lock();
                    let Some(slot) = shared.slots.get(&request) else {
                        drop(shared);
                        self.inner.duty.release(request);
                        self.state = State::Done;
                        return Poll::Ready(Err(LockError::Shutdown));
                    };
                    match slot.outcome.clone() {
                        Some(Ok(token)) => {
                            let hold = Hold {
                                inner: self.inner.clone(),
                                request,
                                name: slot.name.clone(),
                                owner: slot.owner,
                                mode: slot.mode,
                                token,
                                armed: true,
                            };
                            drop(shared);
                            self.inner.duty.release(request);
                            self.state = State::Done;
                            return Poll::Ready(Ok(hold));
                        }
                        Some(Err(error)) => {
                            shared.slots.remove(&request);
                            drop(shared);
                            self.inner.duty.release(request);
                            self.state = State::Done;
                            return Poll::Ready(Err(error));
                        }
                        None if spinning(spin_until) => {
                            drop(shared);
                            // Read the transport ourselves while we spin (see `crate::duty`).
                            if pumped < PUMP_LIMIT
                                && spin_until
                                    .is_some_and(|until| self.inner.receive_inline(request, until))
                            {
                                pumped += 1;
                                continue;
                            }
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        None => {
                            self.inner.duty.release(request);
                            let l = slot.event.listen();
                            drop(shared);
                            self.state = State::Waiting {
                                request,
                                spin_until: None,
                                listener: Some(l),
                            };
                        }
                    }
                }
                State::Done => return Poll::Ready(Err(LockError::Cancelled)),
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let State::Waiting { request, .. } = self.state {
            self.inner.duty.release(request);
            let effects = {
                let mut shared = self.inner.lock();
                let now = self.inner.now();
                shared.withdraw(now, request);
                shared.settle(now)
            };
            self.inner.flush(effects);
        }
    }
}

/// A granted lock: released when dropped, unless unlocked explicitly.
pub(crate) struct Hold {
    inner: Arc<Inner>,
    request: RequestId,
    name: LockName,
    owner: u64,
    mode: LockMode,
    token: FencingToken,
    /// Whether dropping releases the lock (false once handed to an [`Unlock`]).
    armed: bool,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("mode", &self.mode)
            .field("token", &self.token)
            .field("request", &self.request)
            .finish()
    }
}

impl Hold {
    pub(crate) fn name(&self) -> &LockName {
        &self.name
    }

    pub(crate) fn mode(&self) -> LockMode {
        self.mode
    }

    pub(crate) fn token(&self) -> FencingToken {
        self.token
    }

    pub(crate) fn owner(&self) -> OwnerId {
        self.inner.lock().owner_id(self.owner)
    }

    pub(crate) fn status(&self) -> LockStatus {
        let shared = self.inner.lock();
        if shared.phase != Phase::Running
            || shared
                .slots
                .get(&self.request)
                .is_none_or(|s| s.lost.is_some())
        {
            return LockStatus::Lost;
        }
        match shared.endpoint.lock_status(self.inner.now(), self.request) {
            Some(HoldStatus::Held) => LockStatus::Held,
            Some(HoldStatus::Suspended) => LockStatus::Suspended,
            Some(HoldStatus::Lost) | None => LockStatus::Lost,
        }
    }

    /// Why the hold is lost, if it is (`None` while held or suspended).
    pub(crate) fn lost_reason(&self) -> Option<LockLostReason> {
        if self.status() != LockStatus::Lost {
            return None;
        }
        let shared = self.inner.lock();
        Some(match shared.slots.get(&self.request) {
            Some(slot) => match slot.lost {
                Some(reason) => reason,
                None if shared.phase == Phase::Closed => LockLostReason::Shutdown,
                // The lease ran out on this node's clock; the notice is on its way.
                None => LockLostReason::LeaseExpired,
            },
            None => LockLostReason::Shutdown,
        })
    }

    pub(crate) fn lost(&self) -> Lost {
        Lost {
            inner: self.inner.clone(),
            request: self.request,
            name: self.name.clone(),
            listener: None,
        }
    }

    /// What a guard needs to watch or release this hold later.
    pub(crate) fn handle(&self) -> (Arc<Inner>, RequestId) {
        (self.inner.clone(), self.request)
    }

    pub(crate) fn unlock(mut self) -> Unlock {
        self.armed = false;
        Unlock {
            inner: self.inner.clone(),
            request: self.request,
            state: UnlockState::Start,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let effects = {
            let mut shared = self.inner.lock();
            let now = self.inner.now();
            shared.release(now, self.request);
            shared.settle(now)
        };
        self.inner.flush(effects);
    }
}

/// The future of [`crate::MutexGuard::lost`] (and of every guard's `lost()`): resolves when
/// the held lock is lost without being released, with the reason. It never resolves while the
/// lock stays held, nor after it was released normally. It owns what it watches: it can be
/// moved to another task and outlives the guard (so one task can watch for loss while another
/// releases).
#[must_use = "futures do nothing unless polled"]
pub struct Lost {
    inner: Arc<Inner>,
    request: RequestId,
    name: LockName,
    listener: Option<EventListener>,
}

impl Lost {
    /// Watches the hold of `request` on the node `inner`.
    pub(crate) fn of(inner: Arc<Inner>, request: RequestId, name: LockName) -> Self {
        Self {
            inner,
            request,
            name,
            listener: None,
        }
    }
}

impl fmt::Debug for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lost").field("lock", &self.name).finish()
    }
}

impl Future for Lost {
    type Output = LockLostReason;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LockLostReason> {
        loop {
            if let Some(l) = &mut self.listener {
                ready!(Pin::new(l).poll(cx));
                self.listener = None;
            }
            let inner = self.inner.clone();
            let shared = inner.lock();
            let listener = match shared.slots.get(&self.request) {
                Some(slot) => match slot.lost {
                    Some(reason) => return Poll::Ready(reason),
                    None if shared.phase == Phase::Closed => {
                        return Poll::Ready(LockLostReason::Shutdown)
                    }
                    None => slot.event.listen(),
                },
                // The hold ended (released, or its loss already reported to whoever released
                // it): it was not lost while held, so this never resolves.
                None => return Poll::Pending,
            };
            drop(shared);
            self.listener = Some(listener);
        }
    }
}

enum UnlockState {
    Start,
    /// Busy-polling until the instant, then sleeping on the listener.
    Waiting(Option<std::time::Instant>, Option<EventListener>),
    Done,
}

/// The future of [`crate::MutexGuard::unlock`]: releases the lock at once and resolves when
/// the grantor acknowledged the release.
///
/// # Cancel safety
/// The release happens on the first poll, or when the future is dropped unpolled; dropping it
/// later only stops waiting for the acknowledgement (the driver still resends the release
/// until acknowledged).
#[must_use = "futures do nothing unless polled; dropping it releases the lock without waiting"]
pub struct Unlock {
    inner: Arc<Inner>,
    request: RequestId,
    state: UnlockState,
}

impl fmt::Debug for Unlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unlock")
            .field("request", &self.request)
            .finish()
    }
}

impl Future for Unlock {
    type Output = Result<(), UnlockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let mut pumped = 0;
        loop {
            match &mut this.state {
                UnlockState::Start => {
                    let (result, effects) = {
                        let mut shared = this.inner.lock();
                        let now = this.inner.now();
                        let lost = shared.slots.get(&this.request).and_then(|s| s.lost);
                        let result = match (lost, shared.endpoint.unlock(now, this.request)) {
                            (Some(reason), _) => Err(UnlockError::Lost(reason)),
                            (None, Ok(())) => {
                                if let Some(slot) = shared.slots.get(&this.request) {
                                    let (name, owner) = (slot.name.clone(), slot.owner);
                                    let owner = shared.owner_id(owner);
                                    shared.emit(conclave_lock_api::LockEvent::Unlocked {
                                        name,
                                        owner,
                                    });
                                }
                                Ok(())
                            }
                            (None, Err(_)) if shared.phase != Phase::Running => {
                                Err(UnlockError::Shutdown)
                            }
                            (None, Err(_)) => Err(UnlockError::Lost(LockLostReason::Shutdown)),
                        };
                        if result.is_err() {
                            shared.slots.remove(&this.request);
                        }
                        (result, shared.settle(now))
                    };
                    this.inner.flush(effects);
                    if let Err(error) = result {
                        this.state = UnlockState::Done;
                        return Poll::Ready(Err(error));
                    }
                    this.state = UnlockState::Waiting(this.inner.spin_deadline(), None);
                }
                UnlockState::Waiting(spin_until, listener) => {
                    if let Some(l) = listener {
                        ready!(Pin::new(l).poll(cx));
                        *listener = None;
                    }
                    let spin_until = *spin_until;
                    let mut shared = this.inner.lock();
                    let (released, closed) = match shared.slots.get(&this.request) {
                        Some(slot) => (slot.released, shared.phase == Phase::Closed),
                        None => (false, true),
                    };
                    if released || closed {
                        shared.slots.remove(&this.request);
                        drop(shared);
                        this.inner.duty.release(this.request);
                        this.state = UnlockState::Done;
                        return Poll::Ready(if released {
                            Ok(())
                        } else {
                            Err(UnlockError::Shutdown)
                        });
                    }
                    if spinning(spin_until) {
                        drop(shared);
                        if pumped < PUMP_LIMIT
                            && spin_until
                                .is_some_and(|until| this.inner.receive_inline(this.request, until))
                        {
                            pumped += 1;
                            continue;
                        }
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    this.inner.duty.release(this.request);
                    let l = shared
                        .slots
                        .get(&this.request)
                        .map(|slot| slot.event.listen());
                    drop(shared);
                    this.state = UnlockState::Waiting(None, l);
                }
                UnlockState::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl Unlock {
    /// The unlock of a nested reentrant hold: nothing to release at the grantor, done at once.
    pub(crate) fn nested(inner: Arc<Inner>, request: RequestId) -> Self {
        Self {
            inner,
            request,
            state: UnlockState::Done,
        }
    }
}

impl Drop for Unlock {
    fn drop(&mut self) {
        self.inner.duty.release(self.request);
        let effects = {
            let mut shared = self.inner.lock();
            let now = self.inner.now();
            match self.state {
                // Never polled: release like a guard's drop.
                UnlockState::Start => shared.release(now, self.request),
                UnlockState::Waiting(..) => {
                    shared.slots.remove(&self.request);
                }
                UnlockState::Done => return,
            }
            shared.settle(now)
        };
        self.inner.flush(effects);
    }
}

/// The most datagrams a spinning future handles in one poll before it yields.
const PUMP_LIMIT: usize = 64;

/// Whether a wait still busy-polls (until `until`). A spinning future asks to be polled again
/// at once, so its task yields to the executor between polls.
fn spinning(until: Option<std::time::Instant>) -> bool {
    until.is_some_and(|until| std::time::Instant::now() < until)
}
