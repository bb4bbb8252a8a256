//! What the front end drives: a lock service, whatever runs it.

use std::time::Instant;

use async_trait::async_trait;
use futures::stream::BoxStream;

use crate::error::LockError;
use crate::event::LockEvent;
use crate::ids::{OwnerId, RequestId};
use crate::lock::{FencingToken, LockMode, LockName};

/// A granted lock, as a backend reports it to the front end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The request that was granted.
    pub request: RequestId,
    /// The fencing token of the grant.
    pub token: FencingToken,
}

/// The operations the front end (`conclave`) needs from a lock service.
///
/// The cluster driver of `conclave` implements it over `conclave-protocol`; other
/// implementations (an in-process fake, a service over another coordination system) can stand
/// in for tests.
#[async_trait]
pub trait LockBackend: Send + Sync {
    /// Waits until `owner` holds `name` in `mode`, or `deadline` passes.
    ///
    /// # Errors
    /// [`LockError::Timeout`] at the deadline (the request is withdrawn),
    /// [`LockError::Shutdown`] if the backend stops.
    async fn acquire(
        &self,
        request: RequestId,
        name: &LockName,
        owner: &OwnerId,
        mode: LockMode,
        deadline: Option<Instant>,
    ) -> Result<Grant, LockError>;

    /// Grants at once or refuses with [`LockError::WouldBlock`]; never queues.
    ///
    /// # Errors
    /// [`LockError::WouldBlock`] if the lock is held elsewhere, [`LockError::Shutdown`].
    async fn try_acquire(
        &self,
        request: RequestId,
        name: &LockName,
        owner: &OwnerId,
        mode: LockMode,
    ) -> Result<Grant, LockError>;

    /// Withdraws a pending request; callable from `Drop` (never blocks).
    fn cancel(&self, request: RequestId);

    /// Releases a held lock without blocking; the backend retries until acknowledged.
    fn release(&self, name: &LockName, owner: &OwnerId, token: FencingToken);

    /// A stream of the lock events of this member.
    fn events(&self) -> BoxStream<'static, LockEvent>;
}
