//! The machinery every lock type shares, written once on the backend seam
//! ([`LockBackend`]): a request's life from registration to answer ([`Request`]), a granted
//! lock ([`Hold`]) and the futures of a held lock ([`Unlock`], [`Lost`]).
//!
//! These futures own no protocol state: each holds the node's backend and a [`RequestId`],
//! and polls the backend, which wakes the task when the answer changes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use conclave_lock_api::{
    Acquire, FencingToken, LockBackend, LockError, LockLostReason, LockMode, LockName, LockStatus,
    OwnerId, RequestId, UnlockError,
};

/// The backend a node's handles and guards share.
pub(crate) type Backend = Arc<dyn LockBackend>;

/// The parameters of a request not yet registered.
#[derive(Clone, Debug)]
pub(crate) struct Params {
    pub(crate) name: LockName,
    pub(crate) mode: LockMode,
    pub(crate) wait: bool,
    pub(crate) timeout: Option<Duration>,
    /// The hold's own lease.
    pub(crate) lease: Option<Duration>,
    /// A fixed owner (reentrant handles), or `None` for a fresh one.
    pub(crate) owner: Option<u64>,
}

enum State {
    /// Not polled yet: nothing registered.
    Idle(Params),
    /// Registered with the backend, for this owner.
    Waiting(RequestId, Params, u64),
    /// Answered; the request belongs to the guard (or is gone).
    Done,
}

/// How many times one lock call asks again after a grant was lost before the call could hand
/// it out, before it gives up with [`LockError::Lost`] (a lease shorter than the time the
/// caller takes to poll would otherwise ask for ever).
const REASKS: u32 = 3;

/// A lock request from first poll to answer. Dropping it before the answer withdraws the
/// request synchronously (or releases the lock if the grant won the race).
///
/// A grant is handed out only if its hold is not lost at that moment: a grant lost before the
/// caller polled (a process paused past the lease, a newer grantor term, a minority view) is
/// released, and a waiting call with time left asks again ([`REASKS`] times at most); any
/// other call fails with [`LockError::Lost`].
pub(crate) struct Request {
    backend: Backend,
    state: State,
    /// When a waiting call with a timeout gives up, fixed at its first registration (a call
    /// that asks again gets only what is left).
    deadline: Option<std::time::Instant>,
    /// How many times the call asked again after a lost grant.
    reasks: u32,
    /// When the call first registered (what `conclave_lock_wait_seconds` counts from).
    #[cfg(feature = "metrics")]
    asked: Option<std::time::Instant>,
    /// The span of this lock call (`lock`, with the lock's name and mode): what the call logs
    /// while it asks, waits and asks again is inside it.
    span: tracing::Span,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Idle(params) => format!("idle {} {:?}", params.name, params.mode),
            State::Waiting(request, ..) => format!("waiting {request}"),
            State::Done => "done".to_owned(),
        };
        f.debug_struct("Request")
            .field("state", &state)
            .field("reasks", &self.reasks)
            .finish()
    }
}

impl Request {
    pub(crate) fn new(backend: Backend, params: Params) -> Self {
        let span = tracing::debug_span!("lock", lock = %params.name, mode = ?params.mode);
        Self {
            span,
            backend,
            state: State::Idle(params),
            deadline: None,
            reasks: 0,
            #[cfg(feature = "metrics")]
            asked: None,
        }
    }

    /// Gives the hold a lease of its own; no effect once the request is registered.
    pub(crate) fn set_lease(&mut self, lease: Duration) {
        if let State::Idle(params) = &mut self.state {
            params.lease = Some(lease);
        }
    }

    pub(crate) fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<Result<Hold, LockError>> {
        let span = self.span.clone();
        let _entered = span.enter();
        loop {
            if let State::Idle(params) = &self.state {
                let params = params.clone();
                if let Err(error) = self.submit(params) {
                    self.state = State::Done;
                    return Poll::Ready(Err(error));
                }
            }
            let State::Waiting(request, ..) = &self.state else {
                return Poll::Ready(Err(LockError::Cancelled));
            };
            let answer = ready!(self.backend.poll_grant(*request, cx));
            let State::Waiting(request, params, owner) =
                std::mem::replace(&mut self.state, State::Done)
            else {
                unreachable!("the state was Waiting above");
            };
            let lost = match &answer {
                Ok(_) => self.backend.lost_reason(request),
                Err(LockError::Lost(reason)) => Some(*reason),
                Err(_) => None,
            };
            if let Some(reason) = lost {
                // Granted, but lost before it could be handed out: a guard must never be
                // lost at birth. Give it back, and ask again while the call may still wait.
                self.backend.cancel(request);
                match self.reask(params) {
                    Some(params) => {
                        tracing::debug!(%request, lock = %params.name, ?reason, "grant lost before hand-out; asking again");
                        self.state = State::Idle(params);
                        continue;
                    }
                    None => return Poll::Ready(Err(LockError::Lost(reason))),
                }
            }
            #[cfg(feature = "metrics")]
            if answer.is_ok() {
                let waited = self.asked.map_or(Duration::ZERO, |at| at.elapsed());
                crate::metrics::lock_waited(self.backend.member().name(), params.mode, waited);
            }
            return Poll::Ready(answer.map(|token| Hold {
                backend: self.backend.clone(),
                request,
                name: params.name,
                owner,
                mode: params.mode,
                token,
                armed: true,
                #[cfg(feature = "metrics")]
                granted_at: std::time::Instant::now(),
            }));
        }
    }

    /// Registers `params` with the backend (with what is left of the call's timeout).
    fn submit(&mut self, params: Params) -> Result<(), LockError> {
        let now = std::time::Instant::now();
        #[cfg(feature = "metrics")]
        self.asked.get_or_insert(now);
        if self.deadline.is_none() {
            self.deadline = params.timeout.map(|timeout| now + timeout);
        }
        let owner = params.owner.unwrap_or_else(|| self.backend.new_owner());
        let request = self.backend.submit(Acquire {
            name: params.name.clone(),
            owner,
            mode: params.mode,
            wait: params.wait,
            timeout: self.deadline.map(|d| d.saturating_duration_since(now)),
            lease: params.lease,
        })?;
        self.state = State::Waiting(request, params, owner);
        Ok(())
    }

    /// The request to ask again after a lost grant, if the call may: it waits, has time
    /// left, and has not asked again [`REASKS`] times already.
    fn reask(&mut self, params: Params) -> Option<Params> {
        let time_left = self
            .deadline
            .is_none_or(|deadline| std::time::Instant::now() < deadline);
        if !params.wait || !time_left || self.reasks >= REASKS {
            return None;
        }
        self.reasks += 1;
        Some(params)
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let State::Waiting(request, ..) = self.state {
            self.backend.cancel(request);
        }
    }
}

/// A granted lock: released when dropped, unless unlocked explicitly.
pub(crate) struct Hold {
    backend: Backend,
    request: RequestId,
    name: LockName,
    owner: u64,
    mode: LockMode,
    token: FencingToken,
    /// Whether dropping releases the lock (false once handed to an [`Unlock`]).
    armed: bool,
    /// When the guard was handed out (what `conclave_lock_hold_seconds` counts from).
    #[cfg(feature = "metrics")]
    granted_at: std::time::Instant,
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
        OwnerId {
            member: self.backend.member().clone(),
            local: self.owner,
        }
    }

    pub(crate) fn status(&self) -> LockStatus {
        self.backend.status(self.request)
    }

    /// Why the hold is lost, if it is (`None` while held or suspended).
    pub(crate) fn lost_reason(&self) -> Option<LockLostReason> {
        self.backend.lost_reason(self.request)
    }

    pub(crate) fn lost(&self) -> Lost {
        Lost::of(self.backend.clone(), self.request, self.name.clone())
    }

    /// Renews the hold's own lease: see [`crate::MutexGuard::extend`].
    pub(crate) fn extend(&self, lease: Duration) -> Result<(), LockError> {
        extend(&self.backend, self.request, lease)
    }

    /// Reports how long the hold lasted (feature `metrics`).
    fn record_hold(&self) {
        #[cfg(feature = "metrics")]
        crate::metrics::lock_held(
            self.backend.member().name(),
            self.mode,
            self.granted_at.elapsed(),
        );
    }

    /// What a guard needs to watch or release this hold later.
    pub(crate) fn handle(&self) -> (Backend, RequestId) {
        (self.backend.clone(), self.request)
    }

    pub(crate) fn unlock(mut self) -> Unlock {
        self.armed = false;
        self.record_hold();
        Unlock {
            backend: self.backend.clone(),
            request: self.request,
            state: UnlockState::Start,
            timer: None,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.armed {
            self.record_hold();
            self.backend.cancel(self.request);
        }
    }
}

/// The future of [`crate::MutexGuard::lost`] (and of every guard's `lost()`): resolves when
/// the held lock is lost without being released, with the reason. It never resolves while the
/// lock stays held, nor after it was released normally. It owns what it watches: it can be
/// moved to another task and outlives the guard (so one task can watch for loss while another
/// releases).
#[must_use = "futures do nothing unless polled"]
pub struct Lost {
    backend: Backend,
    request: RequestId,
    name: LockName,
}

impl Lost {
    /// Watches the hold of `request` on `backend`.
    pub(crate) fn of(backend: Backend, request: RequestId, name: LockName) -> Self {
        Self {
            backend,
            request,
            name,
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<LockLostReason> {
        self.backend.poll_lost(self.request, cx)
    }
}

enum UnlockState {
    Start,
    Waiting,
    Done,
}

/// The future of [`crate::MutexGuard::unlock`]: releases the lock at once and resolves when
/// the grantor acknowledged the release, or when it is clear that no acknowledgement comes in
/// time: at once in a minority view under `Majority`, else after the node's answer bound
/// (`suspect_timeout + reconcile_timeout` of its configuration), both with
/// [`UnlockError::Unacknowledged`]. The lock is released on this member either way.
///
/// # Cancel safety
/// The release happens on the first poll, or when the future is dropped unpolled; dropping it
/// later only stops waiting for the acknowledgement (the backend still resends the release
/// until acknowledged).
#[must_use = "futures do nothing unless polled; dropping it releases the lock without waiting"]
pub struct Unlock {
    backend: Backend,
    request: RequestId,
    state: UnlockState,
    /// Ends the wait for the acknowledgement ([`RawLockBackend::answer_bound`]).
    timer: Option<async_io::Timer>,
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
        if let UnlockState::Start = this.state {
            if let Err(error) = this.backend.release(this.request) {
                this.state = UnlockState::Done;
                return Poll::Ready(Err(error));
            }
            this.timer = this.backend.answer_bound().map(async_io::Timer::after);
            this.state = UnlockState::Waiting;
        }
        match this.state {
            UnlockState::Waiting => {
                if let Poll::Ready(answer) = this.backend.poll_released(this.request, cx) {
                    this.state = UnlockState::Done;
                    return Poll::Ready(answer);
                }
                let timer = this.timer.as_mut().map(|t| Pin::new(t).poll(cx));
                if !matches!(timer, Some(Poll::Ready(_))) {
                    return Poll::Pending;
                }
                // Released here; the release goes on without a waiter.
                this.backend.cancel(this.request);
                this.state = UnlockState::Done;
                Poll::Ready(Err(UnlockError::Unacknowledged))
            }
            UnlockState::Start | UnlockState::Done => Poll::Ready(Ok(())),
        }
    }
}

impl Unlock {
    /// The unlock of a nested reentrant hold: nothing to release at the grantor, done at once.
    pub(crate) fn nested(backend: Backend, request: RequestId) -> Self {
        Self {
            backend,
            request,
            state: UnlockState::Done,
            timer: None,
        }
    }
}

impl Drop for Unlock {
    fn drop(&mut self) {
        match self.state {
            // Never polled: release like a guard's drop. Waiting: stop waiting (the release
            // goes on).
            UnlockState::Start | UnlockState::Waiting => self.backend.cancel(self.request),
            UnlockState::Done => {}
        }
    }
}

/// Asks `backend` to renew the lease of the hold of `request`: the lease becomes at least
/// `lease` from now once the grantor confirms (every guard's `extend`).
pub(crate) fn extend(
    backend: &Backend,
    request: RequestId,
    lease: Duration,
) -> Result<(), LockError> {
    backend
        .extend_lease(request, lease)
        .map_err(|error| match error {
            UnlockError::Lost(reason) => LockError::Lost(reason),
            _ => LockError::Shutdown,
        })
}
