//! [`LockService`]: a named lock service of a [`Node`](crate::Node), Geode's named
//! `DistributedLockService`.
//!
//! A node's locks live in its default service ([`Node::mutex`](crate::Node::mutex) and the
//! other handle makers). [`Node::lock_service`](crate::Node::lock_service) opens independent
//! namespaces next to it: the same lock name in two services is two locks. Each service has
//! its own grantor (the view's coordinator unless transferred, and transferred on its own),
//! its own reconciliation after a view change, its own lock table and its own events and
//! handlers. Destroying a service on a member ends its pending requests with
//! [`LockError::ServiceDestroyed`] and releases its locks at the grantor (their guards report
//! them lost with [`crate::LockLostReason::ServiceDestroyed`]); the other members keep using
//! it.

use std::fmt;
use std::task::{Context, Poll};

use conclave_lock_api::{
    GrantorTable, HeldLock, LockError, LockLost, LockNameError, MemberId, ServiceName,
    UnexpectedLock,
};

use crate::handles;
use crate::hold::Backend;
use crate::mutex::DistributedMutex;
use crate::node::LockEvents;
use crate::reentrant::ReentrantLock;
use crate::rwlock::RwLock;

/// A named lock service of a node: an independent namespace of locks with its own grantor,
/// reconciliation, table, events and handlers. Made by
/// [`Node::lock_service`](crate::Node::lock_service), which shows an example.
///
/// The same lock name in two services (or in a service and the node's default one) is two
/// locks. Each service's grantor is the view's coordinator unless transferred, and is
/// transferred on its own ([`LockService::become_grantor`]). Destroying a service on a member
/// ([`LockService::destroy`]) ends its pending requests there with
/// [`LockError::ServiceDestroyed`] and releases its locks at the grantor; the other members
/// keep using it.
///
/// Clones (and every `lock_service` call for the same name until it is destroyed) are the same
/// service. Dropping a `LockService` does not destroy it ([`LockService::destroy`] does); the
/// handles and guards made from it keep it usable. Its handles are [`DistributedMutex`],
/// [`RwLock`] and [`ReentrantLock`], as a node's.
#[derive(Clone)]
pub struct LockService {
    name: ServiceName,
    backend: Backend,
}

impl fmt::Debug for LockService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("name", &self.name)
            .field("member", self.backend.member())
            .finish()
    }
}

impl LockService {
    pub(crate) fn new(name: ServiceName, backend: Backend) -> Self {
        Self { name, backend }
    }

    /// The service's name.
    pub fn name(&self) -> &ServiceName {
        &self.name
    }

    /// A distributed mutex for `name` in this service. See [`Node::mutex`](crate::Node::mutex).
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty, longer than
    /// [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes or contains a control character.
    pub fn mutex(&self, name: impl Into<String>) -> Result<DistributedMutex, LockNameError> {
        handles::mutex(&self.backend, name)
    }

    /// A distributed reader-writer lock for `name` in this service. See
    /// [`Node::rw_lock`](crate::Node::rw_lock).
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty, longer than
    /// [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes or contains a control character.
    pub fn rw_lock(&self, name: impl Into<String>) -> Result<RwLock, LockNameError> {
        handles::rw_lock(&self.backend, name)
    }

    /// A reentrant lock for `name` in this service, of a new owner. See
    /// [`Node::reentrant_lock`](crate::Node::reentrant_lock).
    ///
    /// # Errors
    /// [`LockNameError`] if the name is empty, longer than
    /// [`LockName::MAX_LEN`](crate::LockName::MAX_LEN) bytes or contains a control character.
    pub fn reentrant_lock(&self, name: impl Into<String>) -> Result<ReentrantLock, LockNameError> {
        handles::reentrant_lock(&self.backend, name)
    }

    /// The grantor this member knows to serve this service (see
    /// [`Node::grantor`](crate::Node::grantor)); `None` while none is known, and once the
    /// service was destroyed here or the node stopped.
    pub fn grantor(&self) -> Option<MemberId> {
        self.backend.serving_grantor()
    }

    /// Waits until this member knows a serving grantor of this service and returns it; `None`
    /// if the service is destroyed here or the node stops first. See
    /// [`Node::wait_until_serving`](crate::Node::wait_until_serving).
    ///
    /// # Cancel safety
    /// Cancel-safe: it only watches.
    pub async fn wait_until_serving(&self) -> Option<MemberId> {
        handles::wait_until_serving(&self.backend).await
    }

    /// Makes this member the grantor of this service (Geode's `becomeLockGrantor` on a named
    /// service), as [`Node::become_grantor`](crate::Node::become_grantor) does for the default
    /// one; the other services' grantors stay where they are.
    ///
    /// # Errors
    /// [`LockError::TransferRefused`] under [`crate::PartitionPolicy::Majority`];
    /// [`LockError::ServiceDestroyed`] once the service was destroyed here;
    /// [`LockError::TooManyServices`] if the service had to be opened again on this node,
    /// which already runs the most services it may; [`LockError::Shutdown`] if the node stops
    /// first.
    ///
    /// # Cancel safety
    /// Dropping the future stops waiting; the request for the role stands.
    pub async fn become_grantor(&self) -> Result<(), LockError> {
        handles::become_grantor(&self.backend).await
    }

    /// This service's lock table, asked of its grantor (see
    /// [`Node::lock_table`](crate::Node::lock_table)): only the locks of this service.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] if no grantor could answer (retry shortly);
    /// [`LockError::ServiceDestroyed`] once the service was destroyed here;
    /// [`LockError::TooManyServices`] if the service had to be opened again on this node,
    /// which already runs the most services it may; [`LockError::Shutdown`] if the node
    /// stopped.
    ///
    /// # Cancel safety
    /// Dropping the future forgets the question.
    pub async fn lock_table(&self) -> Result<GrantorTable, LockError> {
        handles::lock_table(&self.backend).await
    }

    /// A stream of this service's lock events on this member (handles created, owners
    /// waiting, locks granted, released and lost, and its grantor changing); the default
    /// service's and other services' events are not in it. It ends when the service is
    /// destroyed here or the node stops. Events are buffered without bound: keep reading, or
    /// drop the stream.
    pub fn lock_events(&self) -> LockEvents {
        handles::lock_events(&self.backend)
    }

    /// Registers a handler called when a lock of this service held on this member is lost
    /// without its owner releasing it (see [`Node::on_lock_lost`](crate::Node::on_lock_lost)),
    /// destroying the service included.
    pub fn on_lock_lost(&self, handler: impl Fn(&LockLost) + Send + Sync + 'static) {
        handles::on_lock_lost(&self.backend, handler);
    }

    /// Registers a handler called when a grant of this service reaches this member that its
    /// owner did not expect (see
    /// [`Node::on_unexpected_lock`](crate::Node::on_unexpected_lock)).
    pub fn on_unexpected_lock(&self, handler: impl Fn(&UnexpectedLock) + Send + Sync + 'static) {
        handles::on_unexpected_lock(&self.backend, handler);
    }

    /// The locks of this service held on this member now.
    pub fn held_locks(&self) -> Vec<HeldLock> {
        self.backend.holds()
    }

    /// How many lock requests of this service on this member wait for an answer.
    pub fn pending_requests(&self) -> usize {
        self.backend.pending_requests()
    }

    /// Destroys this service on this member, and waits until its grantor acknowledged the
    /// releases: pending requests end with [`LockError::ServiceDestroyed`]; held locks are
    /// released at the grantor and lost with
    /// [`LockLostReason::ServiceDestroyed`](crate::LockLostReason::ServiceDestroyed) (their
    /// guards' `lost()` resolves, `unlock()` reports it, `Lost` events and lost-lock handlers
    /// as for any loss); the service's event streams end; every later call through this
    /// service's handles fails with [`LockError::ServiceDestroyed`]. Other members keep the
    /// service (this member keeps its part in it for them, as grantor if it is). A later
    /// [`Node::lock_service`](crate::Node::lock_service) of the same name opens it afresh.
    /// It waits at most the node's answer bound (`suspect_timeout + reconcile_timeout`, as
    /// [`MutexGuard::unlock`](crate::MutexGuard::unlock)); past it, it returns with the
    /// releases still being resent ([`LockService::is_destroyed`] is `false` until they are
    /// acknowledged).
    ///
    /// # Cancel safety
    /// The service is destroyed at the first poll; dropping the future only stops waiting for
    /// the acknowledgements.
    pub async fn destroy(&self) {
        self.backend.shutdown();
        let closed = std::future::poll_fn(|cx| self.backend.poll_closed(cx));
        // Past the bound the releases go on without a waiter.
        let _ = handles::bounded(&self.backend, closed).await;
    }

    /// Whether a destroy of this service completed (see [`LockService::destroy`]) or the
    /// node stopped: its handles accept no request any more.
    pub fn is_destroyed(&self) -> bool {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        self.backend.poll_closed(&mut cx) == Poll::Ready(())
    }
}
