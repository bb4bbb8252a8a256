//! [`RwLock`]: a reader-writer lock across the cluster, on the protocol's shared and
//! exclusive modes.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use conclave_lock_api::{FencingToken, LockError, LockMode, LockName, LockStatus};

use crate::hold::{Backend, Hold, Lost, Params, Request, Unlock};

/// A handle to a reader-writer lock of the cluster, made by [`crate::Node::rw_lock`]: any
/// number of readers at once, or one writer. Each call is its own owner; waiters are served
/// in FIFO order, so a waiting writer is not starved by later readers.
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
///     let lock = node.rw_lock("catalogue")?;
///     let r1 = lock.read().await?;
///     let r2 = lock.try_read().await?; // readers share
///     assert!(matches!(lock.try_write().await, Err(LockError::WouldBlock)));
///     drop((r1, r2));
///     let _w = lock.write().await?;
///     Ok(())
/// })
/// # }
/// ```
#[derive(Clone)]
pub struct RwLock {
    backend: Backend,
    name: LockName,
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name)
            .field("member", self.backend.member())
            .finish()
    }
}

impl RwLock {
    pub(crate) fn new(backend: Backend, name: LockName) -> Self {
        Self { backend, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Waits for shared access.
    ///
    /// # Errors
    /// As [`DistributedMutex::lock`](crate::DistributedMutex::lock): [`LockError::Shutdown`],
    /// [`LockError::NotMember`], [`LockError::ServiceDestroyed`],
    /// [`LockError::TooManyServices`], [`LockError::Lost`] (a grant lost before it could be handed out: see [`DistributedMutex::lock`](crate::DistributedMutex::lock)), [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`crate::DistributedMutex::lock`]: dropping the future withdraws the request.
    pub fn read(&self) -> Read {
        Read(self.request(LockMode::Shared, true, None))
    }

    /// Shared access if it can be had now.
    ///
    /// # Errors
    /// [`LockError::WouldBlock`] if a writer holds the lock; otherwise as
    /// [`DistributedMutex::try_lock`](crate::DistributedMutex::try_lock):
    /// [`LockError::Unavailable`], [`LockError::NotMember`], [`LockError::Shutdown`],
    /// [`LockError::ServiceDestroyed`], [`LockError::TooManyServices`], [`LockError::Lost`],
    /// [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`RwLock::read`].
    pub fn try_read(&self) -> Read {
        Read(self.request(LockMode::Shared, false, None))
    }

    /// Waits at most `timeout` for shared access.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the deadline passes; otherwise as
    /// [`DistributedMutex::lock`](crate::DistributedMutex::lock): [`LockError::Shutdown`],
    /// [`LockError::NotMember`], [`LockError::ServiceDestroyed`],
    /// [`LockError::TooManyServices`], [`LockError::Lost`] (a grant lost before it could be handed out: see [`DistributedMutex::lock`](crate::DistributedMutex::lock)), [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`RwLock::read`].
    pub fn read_timeout(&self, timeout: Duration) -> Read {
        Read(self.request(LockMode::Shared, true, Some(timeout)))
    }

    /// Waits for exclusive access.
    ///
    /// # Errors
    /// As [`RwLock::read`].
    ///
    /// # Cancel safety
    /// As [`RwLock::read`].
    pub fn write(&self) -> Write {
        Write(self.request(LockMode::Exclusive, true, None))
    }

    /// Exclusive access if it can be had now.
    ///
    /// # Errors
    /// [`LockError::WouldBlock`] if anyone holds the lock; otherwise as
    /// [`DistributedMutex::try_lock`](crate::DistributedMutex::try_lock):
    /// [`LockError::Unavailable`], [`LockError::NotMember`], [`LockError::Shutdown`],
    /// [`LockError::ServiceDestroyed`], [`LockError::TooManyServices`], [`LockError::Lost`],
    /// [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`RwLock::read`].
    pub fn try_write(&self) -> Write {
        Write(self.request(LockMode::Exclusive, false, None))
    }

    /// Waits at most `timeout` for exclusive access.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the deadline passes; otherwise as
    /// [`DistributedMutex::lock`](crate::DistributedMutex::lock): [`LockError::Shutdown`],
    /// [`LockError::NotMember`], [`LockError::ServiceDestroyed`],
    /// [`LockError::TooManyServices`], [`LockError::Lost`] (a grant lost before it could be handed out: see [`DistributedMutex::lock`](crate::DistributedMutex::lock)), [`LockError::Cancelled`].
    ///
    /// # Cancel safety
    /// As [`RwLock::read`].
    pub fn write_timeout(&self, timeout: Duration) -> Write {
        Write(self.request(LockMode::Exclusive, true, Some(timeout)))
    }

    fn request(&self, mode: LockMode, wait: bool, timeout: Option<Duration>) -> Request {
        Request::new(
            self.backend.clone(),
            Params {
                name: self.name.clone(),
                mode,
                wait,
                timeout,
                lease: None,
                owner: None,
            },
        )
    }
}

/// The future of [`RwLock::read`] and its variants.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Read(Request);

impl Read {
    /// Gives the hold a lease of its own: the grantor frees the lock `lease` after it grants
    /// it, unless it was released before, so a holder that hangs or is cut off cannot keep it
    /// for ever. The guard turns [`LockStatus::Lost`](crate::LockStatus::Lost), with
    /// [`LockLostReason::LeaseExpired`](crate::LockLostReason::LeaseExpired), strictly before
    /// the grantor's deadline, counted on this process's monotonic clock from a send time
    /// before the grant and shortened by the clock-rate margin (`lease × lease / (lease +
    /// lease_margin)` of the node's [`LockConfig`](crate::EndpointConfig::locks): about 89% of it with
    /// the defaults). Watch `guard.lost()`; `unlock()` after expiry answers
    /// [`UnlockError::Lost`](crate::UnlockError::Lost). Call it before the first poll; a lease
    /// set later has no effect. Leased requests are never served from a node cache.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.0.set_lease(lease);
        self
    }
}

impl Future for Read {
    type Output = Result<RwLockGuard, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0
            .poll_acquire(cx)
            .map(|r| r.map(|hold| RwLockGuard { hold }))
    }
}

/// The future of [`RwLock::write`] and its variants.
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Write(Request);

impl Write {
    /// Gives the hold a lease of its own: see [`Read::lease`].
    pub fn lease(mut self, lease: Duration) -> Self {
        self.0.set_lease(lease);
        self
    }
}

impl Future for Write {
    type Output = Result<RwLockGuard, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0
            .poll_acquire(cx)
            .map(|r| r.map(|hold| RwLockGuard { hold }))
    }
}

/// A held [`RwLock`], shared or exclusive ([`RwLockGuard::mode`]). Dropping it releases the
/// lock without blocking.
#[derive(Debug)]
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct RwLockGuard {
    hold: Hold,
}

impl RwLockGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.hold.name()
    }

    /// Shared (read) or exclusive (write).
    pub fn mode(&self) -> LockMode {
        self.hold.mode()
    }

    /// The fencing token of this grant.
    pub fn fencing_token(&self) -> FencingToken {
        self.hold.token()
    }

    /// Held, suspended or lost, as this member sees it now.
    pub fn status(&self) -> LockStatus {
        self.hold.status()
    }

    /// Resolves when the lock is lost without being released, with the reason.
    pub fn lost(&self) -> Lost {
        self.hold.lost()
    }

    /// Renews the hold's own lease, as [`crate::MutexGuard::extend`].
    ///
    /// # Errors
    /// As [`crate::MutexGuard::extend`].
    pub fn extend(&self, lease: Duration) -> Result<(), LockError> {
        self.hold.extend(lease)
    }

    /// Releases the lock and waits for the grantor's acknowledgement.
    ///
    /// # Errors
    /// As [`crate::MutexGuard::unlock`].
    pub fn unlock(self) -> Unlock {
        self.hold.unlock()
    }
}
