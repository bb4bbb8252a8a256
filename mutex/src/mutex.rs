//! [`DistributedMutex`]: an exclusive lock across the cluster.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use conclave_lock_api::{FencingToken, LockError, LockMode, LockName, LockStatus, OwnerId};

use crate::hold::{Backend, Hold, Lost, Params, Request, Unlock};

/// A handle to an exclusive lock of the cluster, made by [`crate::Node::mutex`].
///
/// Each [`lock`](Self::lock) call is its own owner: two tasks sharing one handle (or clones of
/// it) exclude each other like tasks on different machines. Cloning is cheap.
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
///     let mutex = node.mutex("invoice-42")?;
///     let guard = mutex.lock().await?;
///     let token = guard.fencing_token(); // pass it to the resource you protect
///     assert!(matches!(mutex.try_lock().await, Err(LockError::WouldBlock)));
///     drop(guard); // released without blocking
///     let again = mutex.try_lock().await?;
///     assert!(again.fencing_token() > token);
///     again.unlock().await?; // released, and acknowledged by the grantor
///     Ok(())
/// })
/// # }
/// ```
#[derive(Clone)]
pub struct DistributedMutex {
    backend: Backend,
    name: LockName,
}

impl fmt::Debug for DistributedMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DistributedMutex")
            .field("name", &self.name)
            .field("member", self.backend.member())
            .finish()
    }
}

impl DistributedMutex {
    pub(crate) fn new(backend: Backend, name: LockName) -> Self {
        Self { backend, name }
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        &self.name
    }

    /// Waits until the lock is granted, in FIFO order with the other waiters.
    ///
    /// The guard it hands out is never lost at that moment: a grant lost before the future
    /// was polled again (the process paused past the hold's lease, a newer grantor term, a
    /// minority view) is given back and the lock asked for again, up to 3 times, then the
    /// call fails with [`LockError::Lost`]. The same holds for every lock call, of every lock
    /// type; a `try_` call does not ask again, and a `_timeout` call only while time is left.
    ///
    /// # Errors
    /// - [`LockError::Shutdown`]: the node shut down or left the cluster first.
    /// - [`LockError::NotMember`]: under [`PartitionPolicy::Majority`](crate::PartitionPolicy::Majority),
    ///   this node has been in a view without a majority of the cluster for the lock lease;
    ///   the request was withdrawn.
    /// - [`LockError::ServiceDestroyed`]: a handle of a named [`LockService`](crate::LockService)
    ///   destroyed on this node; [`LockError::TooManyServices`]: that service had to be
    ///   opened again here, and the node already runs the most services it may.
    /// - [`LockError::Lost`]: the grant was lost before it could be handed out, and asking
    ///   again did not help (see above).
    /// - [`LockError::Cancelled`]: the future was polled again after it completed.
    ///
    /// # Cancel safety
    /// The request is registered on the first poll. Dropping the future before it completes
    /// withdraws the request at the grantor from `Drop`, synchronously; if the grant raced
    /// the drop, the lock is released. Nothing stays held or queued.
    pub fn lock(&self) -> Lock {
        self.request(true, None)
    }

    /// Takes the lock only if it is free now; never queues.
    ///
    /// # Errors
    /// - [`LockError::WouldBlock`]: another owner holds it.
    /// - [`LockError::Unavailable`]: the lock may be free, but no grantor can grant it at this
    ///   moment: a new grantor rebuilding its table after a failover, or (under `Majority`)
    ///   waiting out the earlier grantor's leases or lacking a majority's support. Retry
    ///   shortly.
    /// - [`LockError::NotMember`]: under `Majority`, this node is in a view without a majority
    ///   of the cluster (answered at once).
    /// - [`LockError::Shutdown`], [`LockError::ServiceDestroyed`],
    ///   [`LockError::TooManyServices`], [`LockError::Lost`], [`LockError::Cancelled`]: as for
    ///   [`DistributedMutex::lock`].
    ///
    /// # Cancel safety
    /// As [`DistributedMutex::lock`].
    pub fn try_lock(&self) -> Lock {
        self.request(false, None)
    }

    /// Waits at most `timeout` for the lock. The deadline is kept by the protocol core, which
    /// withdraws the request at the grantor when it passes.
    ///
    /// # Errors
    /// - [`LockError::Timeout`]: the deadline passed first; the request was withdrawn.
    /// - [`LockError::Shutdown`], [`LockError::NotMember`], [`LockError::ServiceDestroyed`],
    ///   [`LockError::TooManyServices`], [`LockError::Lost`], [`LockError::Cancelled`]: as for
    ///   [`DistributedMutex::lock`].
    ///
    /// # Cancel safety
    /// As [`DistributedMutex::lock`].
    pub fn lock_timeout(&self, timeout: Duration) -> Lock {
        self.request(true, Some(timeout))
    }

    /// [`DistributedMutex::lock`] with a lease of the hold: see [`Lock::lease`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use conclave::{LockLostReason, LockStatus, Node};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// smol::block_on(async {
    ///     let node = Node::local("docs")?;
    ///     let mutex = node.mutex("report")?;
    ///     let guard = mutex.lock_with_lease(Duration::from_millis(50)).await?;
    ///     assert_eq!(guard.status(), LockStatus::Held);
    ///     // The holder hangs on to it too long: the lease frees the lock.
    ///     assert_eq!(guard.lost().await, LockLostReason::LeaseExpired);
    ///     assert!(mutex.try_lock().await.is_ok());
    ///     Ok(())
    /// })
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`DistributedMutex::lock`].
    pub fn lock_with_lease(&self, lease: Duration) -> Lock {
        self.lock().lease(lease)
    }

    /// [`DistributedMutex::try_lock`] with a lease of the hold: see [`Lock::lease`].
    ///
    /// # Errors
    /// As [`DistributedMutex::try_lock`].
    pub fn try_lock_with_lease(&self, lease: Duration) -> Lock {
        self.try_lock().lease(lease)
    }

    /// [`DistributedMutex::lock_timeout`] with a lease of the hold: see [`Lock::lease`].
    ///
    /// # Errors
    /// As [`DistributedMutex::lock_timeout`].
    pub fn lock_timeout_with_lease(&self, timeout: Duration, lease: Duration) -> Lock {
        self.lock_timeout(timeout).lease(lease)
    }

    fn request(&self, wait: bool, timeout: Option<Duration>) -> Lock {
        Lock {
            request: Request::new(
                self.backend.clone(),
                Params {
                    name: self.name.clone(),
                    mode: LockMode::Exclusive,
                    wait,
                    timeout,
                    lease: None,
                    owner: None,
                },
            ),
        }
    }
}

/// The future of [`DistributedMutex::lock`], [`DistributedMutex::try_lock`] and
/// [`DistributedMutex::lock_timeout`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Lock {
    request: Request,
}

impl Lock {
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
        self.request.set_lease(lease);
        self
    }
}

impl Future for Lock {
    type Output = Result<MutexGuard, LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.request
            .poll_acquire(cx)
            .map(|r| r.map(|hold| MutexGuard { hold }))
    }
}

/// A held [`DistributedMutex`]. Dropping it releases the lock without blocking (the driver
/// resends the release until the grantor acknowledges it); [`MutexGuard::unlock`] releases
/// and waits for the acknowledgement.
#[derive(Debug)]
#[must_use = "the lock is released as soon as the guard is dropped"]
#[clippy::has_significant_drop]
pub struct MutexGuard {
    hold: Hold,
}

impl MutexGuard {
    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.hold.name()
    }

    /// The fencing token of this grant: it strictly increases with every grant of this lock.
    /// Pass it to the resource you protect, which rejects tokens lower than the highest seen.
    pub fn fencing_token(&self) -> FencingToken {
        self.hold.token()
    }

    /// The owner holding the lock (this member and a local owner number).
    pub fn owner(&self) -> OwnerId {
        self.hold.owner()
    }

    /// Held, suspended (grantor silent, ownership unknown) or lost, as this member sees it now.
    pub fn status(&self) -> LockStatus {
        self.hold.status()
    }

    /// Resolves when the lock is lost without being released (duplicate after a merge,
    /// minority, lease expiry, expelled, node shut down), with the reason.
    ///
    /// # Cancel safety
    /// Cancel-safe: it only watches.
    pub fn lost(&self) -> Lost {
        self.hold.lost()
    }

    /// Renews the lease of this hold (one given by [`Lock::lease`] or `lock_with_lease`):
    /// asks the grantor to make it run until at least `lease` from now, and returns at once.
    /// The old deadline stands until the grantor confirms; if no confirmation comes before it
    /// (the grantor is cut off, the network drops everything), the hold is lost as any lease
    /// runs out: [`MutexGuard::status`] turns `Lost`, [`MutexGuard::lost`] resolves with
    /// `LockLostReason::LeaseExpired` and the `on_lock_lost` handlers run. A renewal never
    /// shortens a lease (it becomes `max(remaining, lease)`), and a hold without a lease of its
    /// own has none to renew (held until released: `Ok`, nothing asked). Call it every half
    /// lease or so while you work; `lock_table()` shows the lease the grantor counts
    /// (`TableHolder::lease_ms`).
    ///
    /// ```no_run
    /// # async fn demo(mutex: conclave::DistributedMutex) -> Result<(), conclave::LockError> {
    /// use std::time::Duration;
    /// let guard = mutex.lock_with_lease(Duration::from_secs(10)).await?;
    /// for _chunk in 0..100 {
    ///     // ... a piece of work shorter than the lease ...
    ///     guard.extend(Duration::from_secs(10))?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`crate::LockError::Lost`] if the hold is lost already (nothing is renewed);
    /// [`crate::LockError::Shutdown`] if the node has stopped.
    pub fn extend(&self, lease: Duration) -> Result<(), LockError> {
        self.hold.extend(lease)
    }

    /// Releases the lock and waits until the grantor acknowledges the release, at most the
    /// node's answer bound: `suspect_timeout + reconcile_timeout` of its configuration (5 s
    /// with the LAN defaults), and not at all in a minority view under `Majority`.
    ///
    /// # Errors
    /// [`crate::UnlockError::Lost`] if the lock had been lost already;
    /// [`crate::UnlockError::Shutdown`] if the node stopped before the acknowledgement;
    /// [`crate::UnlockError::Unacknowledged`] if no acknowledgement came within the bound (or
    /// none can come: a minority view): released here, the release resent until a grantor
    /// takes it.
    ///
    /// # Cancel safety
    /// See [`Unlock`]: the lock is released either way.
    pub fn unlock(self) -> Unlock {
        self.hold.unlock()
    }
}
