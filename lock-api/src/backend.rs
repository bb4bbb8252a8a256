//! What the front end drives: a lock service, whatever runs it.

use std::time::Duration;

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
/// An abstraction point for front ends that want to stand a fake or another coordination
/// system in for the cluster. Today's front end (`conclave`) drives `conclave-protocol`'s
/// `Endpoint` directly and does not go through this trait.
#[async_trait]
pub trait LockBackend: Send + Sync {
    /// Waits until `owner` holds `name` in `mode`, or `timeout` runs out. The timeout is a
    /// duration, not a deadline: deadlines live inside the protocol core, on its own clock.
    ///
    /// # Errors
    /// [`LockError::Timeout`] when the timeout runs out (the request is withdrawn),
    /// [`LockError::Shutdown`] if the backend stops.
    async fn acquire(
        &self,
        request: RequestId,
        name: &LockName,
        owner: &OwnerId,
        mode: LockMode,
        timeout: Option<Duration>,
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
