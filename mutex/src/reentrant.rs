//! [`ReentrantLock`]: an exclusive lock that one handle (and its clones) may take again while
//! holding it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use conclave_lock_api::{FencingToken, LockError, LockMode, LockName, LockStatus, RequestId};
use event_listener::{Event, EventListener};

use crate::hold::{Backend, Hold, Lost, Params, Request, Unlock};

/// A handle to a reentrant exclusive lock of the cluster, made by
/// [`crate::Node::reentrant_lock`].
///
/// The handle and its clones are **one owner**: while any of them holds the lock, locking
/// through any of them succeeds at once and increments a hold count kept on this node; the
/// grantor sees one hold, released when the count returns to zero. Another handle for the
/// same name, on this node or another, is another owner and waits. Re-acquiring keeps the
/// fencing token.
///
/// ```
/// use conclave::memory::MemoryNetwork;
/// use conclave::{EndpointConfig, LockError, Node};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let network = MemoryNetwork::new();
/// smol::block_on(async {
///     let node = Node::builder("docs")
///         .transport(network.transport())
///         .config(EndpointConfig::local())
///         .join()
///         .await?;
///     let lock = node.reentrant_lock("config")?;
///     let outer = lock.lock().await?;
///     let inner = lock.clone().lock().await?; // same owner: at once
///     assert_eq!(lock.hold_count(), 2);
///     assert_eq!(inner.fencing_token(), outer.fencing_token());
///     let other = node.reentrant_lock("config")?; // another owner
///     assert!(matches!(other.try_lock().await, Err(LockError::WouldBlock)));
///     drop((inner, outer)); // released at the grantor now
///     assert_eq!(lock.hold_count(), 0);
///     Ok(())
/// })
/// # }
/// ```
#[derive(Clone)]
pub struct ReentrantLock {
    backend: Backend,
    name: LockName,
    owner: u64,
    state: Arc<Reentry>,
}

/// The owner's local state, shared by the handle's clones and guards.
struct Reentry {
    local: Mutex<Count>,
    /// Notified when an acquisition by a clone ends (the lock is held, or it failed).
    changed: Event,
}

#[derive(Default)]
struct Count {
    holds: usize,
    hold: Option<Hold>,
    /// A clone's request is in flight; the others wait for it rather than ask again.
    acquiring: bool,
}

impl Reentry {
    fn lock(&self) -> MutexGuard<'_, Count> {
        self.local.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl fmt::Debug for ReentrantLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReentrantLock")
            .field("name", &self.name)
            .field("owner", &self.owner)
            .field("holds", &self.hold_count())
            .finish()
    }
}

impl ReentrantLock {
    pub(crate) fn new(backend: Backend, name: LockName, owner: u64) -> Self {
        Self {
            backend,
            name,
            owner,
            state: Arc::new(Reentry {
                local: Mutex::new(Count::default()),
                changed: Event::new(),
            }),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// How many guards of this owner are alive.
    pub fn hold_count(&self) -> usize {
        self.state.lock().holds
    }

    /// Takes the lock, at once if this owner holds it already, else waiting in FIFO order.
    ///
    /// # Errors
    /// - [`LockError::Lost`]: this owner holds the lock but that hold was lost (minority,
    ///   lease, duplicate): a lost hold is never entered again and the hold count does not
    ///   change; drop the remaining guards and lock afresh.
    /// - [`LockError::Shutdown`], [`LockError::NotMember`], [`LockError::ServiceDestroyed`],
    ///   [`LockError::TooManyServices`], [`LockError::Cancelled`]: as for
    ///   [`DistributedMutex::lock`](crate::DistributedMutex::lock).
    ///
    /// # Cancel safety
    /// As [`crate::DistributedMutex::lock`]; a clone waiting for this request takes over when
    /// it is dropped.
    pub fn lock(&self) -> LockReentrant {
        self.future(true, None)
    }

    /// Takes the lock if this owner holds it already or it is free now.
    ///
    /// # Errors
    /// [`LockError::WouldBlock`] if another owner holds it; [`LockError::Unavailable`] and
    /// [`LockError::NotMember`] as for
    /// [`DistributedMutex::try_lock`](crate::DistributedMutex::try_lock); otherwise as
    /// [`ReentrantLock::lock`]: [`LockError::Lost`], [`LockError::Shutdown`],
    /// [`LockError::ServiceDestroyed`], [`LockError::TooManyServices`], [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`ReentrantLock::lock`].
    pub fn try_lock(&self) -> LockReentrant {
        self.future(false, None)
    }

    /// Waits at most `timeout`.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the deadline passes; otherwise as [`ReentrantLock::lock`]:
    /// [`LockError::Lost`], [`LockError::Shutdown`], [`LockError::NotMember`],
    /// [`LockError::ServiceDestroyed`], [`LockError::TooManyServices`], [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`ReentrantLock::lock`].
    pub fn lock_timeout(&self, timeout: Duration) -> LockReentrant {
        self.future(true, Some(timeout))
    }

    fn future(&self, wait: bool, timeout: Option<Duration>) -> LockReentrant {
        LockReentrant {
            lock: self.clone(),
            wait,
            timeout,
            lease: None,
            step: Step::Start,
        }
    }

    /// [`ReentrantLock::lock`] with a lease: see [`LockReentrant::lease`].
    ///
    /// # Errors
    /// As [`ReentrantLock::lock`].
    pub fn lock_with_lease(&self, lease: Duration) -> LockReentrant {
        self.lock().lease(lease)
    }

    /// [`ReentrantLock::try_lock`] with a lease: see [`LockReentrant::lease`].
    ///
    /// # Errors
    /// As [`ReentrantLock::try_lock`].
    pub fn try_lock_with_lease(&self, lease: Duration) -> LockReentrant {
        self.try_lock().lease(lease)
    }

    /// [`ReentrantLock::lock_timeout`] with a lease: see [`LockReentrant::lease`].
    ///
    /// # Errors
    /// As [`ReentrantLock::lock_timeout`].
    pub fn lock_timeout_with_lease(&self, timeout: Duration, lease: Duration) -> LockReentrant {
        self.lock_timeout(timeout).lease(lease)
    }
}

enum Step {
    Start,
    /// Waiting for a clone's acquisition to end.
    Queued(EventListener),
    /// This future's own request.
    Acquiring(Request),
    Done,
}

/// The future of [`ReentrantLock::lock`] and its variants.
#[must_use = "futures do nothing unless polled"]
pub struct LockReentrant {
    lock: ReentrantLock,
    wait: bool,
    timeout: Option<Duration>,
    lease: Option<Duration>,
    step: Step,
}

impl fmt::Debug for LockReentrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let step = match &self.step {
            Step::Start => "start",
            Step::Queued(_) => "queued behind a clone",
            Step::Acquiring(_) => "acquiring",
            Step::Done => "done",
        };
        f.debug_struct("LockReentrant")
            .field("lock", &self.lock.name)
            .field("step", &step)
            .finish()
    }
}

impl Future for LockReentrant {
    type Output = Result<ReentrantGuard, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            match &mut this.step {
                Step::Start => {
                    let mut count = this.lock.state.lock();
                    if let Some(hold) = &count.hold {
                        let handle = hold.handle();
                        // A lost hold is never entered again: the nested call fails, and the
                        // count (the guards still alive) stays as it is.
                        if let Some(reason) = hold.lost_reason() {
                            drop(count);
                            this.step = Step::Done;
                            return Poll::Ready(Err(LockError::Lost(reason)));
                        }
                        if let Some(lease) = this.lease {
                            if let Err(error) = handle.0.extend_lease(handle.1, lease) {
                                drop(count);
                                this.step = Step::Done;
                                return Poll::Ready(Err(match error {
                                    conclave_lock_api::UnlockError::Lost(reason) => {
                                        LockError::Lost(reason)
                                    }
                                    _ => LockError::Shutdown,
                                }));
                            }
                        }
                        let token = hold.token();
                        count.holds += 1;
                        drop(count);
                        this.step = Step::Done;
                        return Poll::Ready(Ok(this.guard(token, handle)));
                    }
                    if count.acquiring {
                        let listener = this.lock.state.changed.listen();
                        drop(count);
                        this.step = Step::Queued(listener);
                        continue;
                    }
                    count.acquiring = true;
                    drop(count);
                    this.step = Step::Acquiring(Request::new(
                        this.lock.backend.clone(),
                        Params {
                            name: this.lock.name.clone(),
                            mode: LockMode::Exclusive,
                            wait: this.wait,
                            timeout: this.timeout,
                            lease: this.lease,
                            owner: Some(this.lock.owner),
                        },
                    ));
                }
                Step::Queued(listener) => {
                    ready!(Pin::new(listener).poll(cx));
                    this.step = Step::Start;
                }
                Step::Acquiring(request) => {
                    let result = ready!(request.poll_acquire(cx));
                    this.step = Step::Done;
                    let mut count = this.lock.state.lock();
                    count.acquiring = false;
                    let result = result.map(|hold| {
                        let token = hold.token();
                        let handle = hold.handle();
                        count.hold = Some(hold);
                        count.holds = 1;
                        (token, handle)
                    });
                    drop(count);
                    this.lock.state.changed.notify(usize::MAX);
                    return Poll::Ready(result.map(|(token, handle)| this.guard(token, handle)));
                }
                Step::Done => return Poll::Ready(Err(LockError::Cancelled)),
            }
        }
    }
}

impl LockReentrant {
    /// Gives the hold a lease of its own, as [`crate::Lock::lease`] does for a mutex. If this
    /// owner holds the lock already, the re-lock extends the hold's lease to `max(remaining,
    /// lease)` (the grantor is asked, and the holder's deadline moves once it confirmed); a
    /// hold taken without a lease keeps none, and a re-lock without a lease leaves the lease
    /// as it is.
    ///
    /// ```
    /// use std::time::Duration;
    /// use conclave::{LockStatus, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// smol::block_on(async {
    ///     let node = Node::local("docs")?;
    ///     let lock = node.reentrant_lock("job")?;
    ///     let outer = lock.lock_with_lease(Duration::from_millis(30)).await?;
    ///     let inner = lock.lock_with_lease(Duration::from_secs(60)).await?; // extends
    ///     smol::Timer::after(Duration::from_millis(60)).await;
    ///     assert_eq!(outer.status(), LockStatus::Held, "the re-lock extended the lease");
    ///     drop((inner, outer));
    ///     Ok(())
    /// })
    /// # }
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    fn guard(&self, token: FencingToken, handle: (Backend, RequestId)) -> ReentrantGuard {
        ReentrantGuard {
            state: self.lock.state.clone(),
            name: self.lock.name.clone(),
            token,
            handle,
            armed: true,
        }
    }
}

impl Drop for LockReentrant {
    fn drop(&mut self) {
        if let Step::Acquiring(request) = std::mem::replace(&mut self.step, Step::Done) {
            // Withdraw the request first; then a clone waiting behind it asks on its own.
            drop(request);
            self.lock.state.lock().acquiring = false;
            self.lock.state.changed.notify(usize::MAX);
        }
    }
}

/// One hold of a [`ReentrantLock`]. The lock is released at the grantor, without blocking,
/// when the last guard of its owner drops.
#[must_use = "the hold ends as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct ReentrantGuard {
    state: Arc<Reentry>,
    name: LockName,
    token: FencingToken,
    /// The node and the request of the owner's grant.
    handle: (Backend, RequestId),
    /// Cleared by `unlock`, which does the guard's drop itself.
    armed: bool,
}

impl fmt::Debug for ReentrantGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReentrantGuard")
            .field("name", &self.name)
            .field("token", &self.token)
            .finish()
    }
}

impl ReentrantGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// The fencing token of the owner's grant (the same for every nested hold).
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// Held, suspended or lost, as this member sees it now.
    pub fn status(&self) -> LockStatus {
        self.state
            .lock()
            .hold
            .as_ref()
            .map_or(LockStatus::Lost, Hold::status)
    }

    /// Resolves when the owner's hold is lost without being released, with the reason (as
    /// [`crate::MutexGuard::lost`]; an owned future).
    pub fn lost(&self) -> Lost {
        match self.state.lock().hold.as_ref() {
            Some(hold) => hold.lost(),
            None => Lost::of(self.handle.0.clone(), self.handle.1, self.name.clone()),
        }
    }

    /// Renews the owner's hold's own lease (one lease for all its nested holds), as
    /// [`crate::MutexGuard::extend`].
    ///
    /// # Errors
    /// As [`crate::MutexGuard::extend`].
    pub fn extend(&self, lease: Duration) -> Result<(), LockError> {
        crate::hold::extend(&self.handle.0, self.handle.1, lease)
    }

    /// Ends this hold. The last hold of the owner releases the lock at the grantor, and the
    /// future waits for the grantor's acknowledgement (as [`crate::MutexGuard::unlock`]); a
    /// nested hold only lowers the count and is done at once.
    pub fn unlock(mut self) -> Unlock {
        self.armed = false;
        let last = {
            let mut count = self.state.lock();
            count.holds = count.holds.saturating_sub(1);
            if count.holds == 0 {
                count.hold.take()
            } else {
                None
            }
        };
        match last {
            Some(hold) => hold.unlock(),
            None => Unlock::nested(self.handle.0.clone(), self.handle.1),
        }
    }
}

impl Drop for ReentrantGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let released = {
            let mut count = self.state.lock();
            count.holds = count.holds.saturating_sub(1);
            if count.holds == 0 {
                count.hold.take()
            } else {
                None
            }
        };
        // Released outside the owner's lock.
        drop(released);
    }
}
