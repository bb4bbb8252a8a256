//! What [`crate::Node`] and [`crate::LockService`] do alike, written once on the backend of a
//! lock service (the node's default one, or a named one): making lock handles, waiting for
//! and moving the grantor, reading the table, events and handlers.

use std::future::Future;
use std::sync::Arc;

use conclave_lock_api::{
    GrantorTable, LockBackend, LockError, LockLost, LockName, LockNameError, MemberId,
    UnexpectedLock,
};
use futures::future::Either;

use crate::hold::Backend;
use crate::mutex::DistributedMutex;
use crate::node::LockEvents;
use crate::reentrant::ReentrantLock;
use crate::rwlock::RwLock;

/// A distributed mutex for `name` in `backend`'s service.
pub(crate) fn mutex(
    backend: &Backend,
    name: impl Into<String>,
) -> Result<DistributedMutex, LockNameError> {
    Ok(DistributedMutex::new(
        backend.clone(),
        created(backend, name)?,
    ))
}

/// A reader-writer lock for `name` in `backend`'s service.
pub(crate) fn rw_lock(backend: &Backend, name: impl Into<String>) -> Result<RwLock, LockNameError> {
    Ok(RwLock::new(backend.clone(), created(backend, name)?))
}

/// A reentrant lock for `name` in `backend`'s service, of a new owner.
pub(crate) fn reentrant_lock(
    backend: &Backend,
    name: impl Into<String>,
) -> Result<ReentrantLock, LockNameError> {
    let name = created(backend, name)?;
    let owner = backend.new_owner();
    Ok(ReentrantLock::new(backend.clone(), name, owner))
}

/// Validates `name` and reports the new handle (`LockEvent::Created`).
fn created(backend: &Backend, name: impl Into<String>) -> Result<LockName, LockNameError> {
    let name = LockName::new(name)?;
    backend.created(&name);
    Ok(name)
}

/// Waits until `backend`'s service knows a serving grantor.
pub(crate) async fn wait_until_serving(backend: &Backend) -> Option<MemberId> {
    std::future::poll_fn(|cx| backend.poll_serving_grantor(cx)).await
}

/// Asks for the grantor role of `backend`'s service and waits until this member serves, at
/// most the backend's answer bound.
pub(crate) async fn become_grantor(backend: &Backend) -> Result<(), LockError> {
    backend.become_grantor()?;
    bounded(
        backend,
        std::future::poll_fn(|cx| backend.poll_is_grantor(cx)),
    )
    .await
    .unwrap_or(Err(LockError::Unavailable))
}

/// The lock table of `backend`'s service's grantor.
pub(crate) async fn lock_table(backend: &Backend) -> Result<GrantorTable, LockError> {
    /// Forgets the query if the future is dropped before the answer.
    struct Asked<'a>(&'a dyn LockBackend, u64);
    impl Drop for Asked<'_> {
        fn drop(&mut self) {
            self.0.cancel_table(self.1);
        }
    }
    let query = backend.request_table()?;
    let _asked = Asked(&**backend, query);
    bounded(
        backend,
        std::future::poll_fn(|cx| backend.poll_table(query, cx)),
    )
    .await
    .unwrap_or(Err(LockError::Unavailable))
}

/// `wait`'s answer, or `None` once `backend`'s answer bound has passed first.
pub(crate) async fn bounded<T>(backend: &Backend, wait: impl Future<Output = T>) -> Option<T> {
    let wait = std::pin::pin!(wait);
    let Some(bound) = backend.answer_bound() else {
        return Some(wait.await);
    };
    match futures::future::select(wait, async_io::Timer::after(bound)).await {
        Either::Left((answer, _)) => Some(answer),
        Either::Right(_) => None,
    }
}

/// A stream of the lock events of `backend`'s service.
pub(crate) fn lock_events(backend: &Backend) -> LockEvents {
    LockEvents::new(backend.events())
}

/// Registers a lost-lock handler with `backend`'s service.
pub(crate) fn on_lock_lost(backend: &Backend, handler: impl Fn(&LockLost) + Send + Sync + 'static) {
    backend.on_lock_lost(Arc::new(handler));
}

/// Registers an unexpected-grant handler with `backend`'s service.
pub(crate) fn on_unexpected_lock(
    backend: &Backend,
    handler: impl Fn(&UnexpectedLock) + Send + Sync + 'static,
) {
    backend.on_unexpected_lock(Arc::new(handler));
}
