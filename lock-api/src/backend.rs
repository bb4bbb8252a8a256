//! The seam between the front end and whatever grants locks: [`LockBackend`].
//!
//! The front end (`conclave`'s `DistributedMutex`, `ReentrantLock`, `RwLock`, their guards,
//! lock events and handlers) is written once, on this trait. A backend decides who holds
//! what: the group backend runs the cluster protocol (membership, the central grantor,
//! reconciliation, duplicate resolution) over a `Transport`; the local backend keeps the lock
//! table of one process. A backend replicating the table by consensus fits the same trait.
//!
//! The trait is shaped like a `RawMutex`: synchronous, poll-based, object-safe. The front end
//! owns the futures and the guards; a backend only records requests and wakes the
//! [`Waker`](std::task::Waker)s it was given when their answer changes. Every method is
//! callable from any thread, from a user's task and from `Drop`, and none of them blocks.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;

use crate::error::{LockError, UnlockError};
use crate::event::{LockEvent, LockLostReason, UnexpectedGrant};
use crate::ids::{MemberId, OwnerId, RequestId};
use crate::lock::{FencingToken, LockMode, LockName, ServiceName};
use crate::view::View;
use crate::wire::TableLock;

/// A lock request as the front end hands it to a backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acquire {
    /// The lock.
    pub name: LockName,
    /// The local owner number (from [`RawLockBackend::new_owner`]) the hold will belong to.
    pub owner: u64,
    /// Exclusive or shared.
    pub mode: LockMode,
    /// `false` for a try-lock: granted at once or refused, never queued.
    pub wait: bool,
    /// How long to wait at most (`None`: until granted). Kept by the backend, which
    /// withdraws the request when it runs out and answers [`LockError::Timeout`].
    pub timeout: Option<Duration>,
    /// The hold's own lease (`None`: held until released). The backend frees the lock this
    /// long after granting it unless it is released first, and the hold turns
    /// [`LockStatus::Lost`] with [`LockLostReason::LeaseExpired`] no later than that, on this
    /// member's clock (see [`RawLockBackend::extend_lease`]).
    pub lease: Option<Duration>,
}

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
    /// Not held any more: lost (the guard's `lost()` tells why) or released.
    Lost,
}

/// A lock held on this member was lost without its owner releasing it; what unexpected-status
/// handlers ([`ClusterBackend::on_lock_lost`]) are told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockLost {
    /// The lock.
    pub name: LockName,
    /// The owner that held it.
    pub owner: OwnerId,
    /// The fencing token of the lost grant.
    pub token: FencingToken,
    /// Why it was lost.
    pub reason: LockLostReason,
}

impl LockLost {
    /// A report of `owner`'s hold of `name` with `token`, lost for `reason`.
    pub fn new(
        name: LockName,
        owner: OwnerId,
        token: FencingToken,
        reason: LockLostReason,
    ) -> Self {
        Self {
            name,
            owner,
            token,
            reason,
        }
    }
}

/// A handler called when a lock held on this member is lost.
pub type LostHandler = Arc<dyn Fn(&LockLost) + Send + Sync + 'static>;

/// A grant reached this member that its owner did not expect (the jgroups-raft "unexpected
/// locking" case); what [`ClusterBackend::on_unexpected_lock`] handlers are told. The backend
/// resolved it safely before reporting it: the owner holds nothing because of it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnexpectedLock {
    /// The lock.
    pub name: LockName,
    /// The owner the grant was for, if the member still knew the request.
    pub owner: Option<OwnerId>,
    /// The grant's fencing token.
    pub token: FencingToken,
    /// What was unexpected, and so how it was resolved.
    pub reason: UnexpectedGrant,
}

impl UnexpectedLock {
    /// A report of a grant of `name` with `token` for `owner`, unexpected for `reason`.
    pub fn new(
        name: LockName,
        owner: Option<OwnerId>,
        token: FencingToken,
        reason: UnexpectedGrant,
    ) -> Self {
        Self {
            name,
            owner,
            token,
            reason,
        }
    }
}

/// A handler called when a grant reaches this member unexpectedly.
pub type UnexpectedHandler = Arc<dyn Fn(&UnexpectedLock) + Send + Sync + 'static>;

/// A lock held on a member, as [`RawLockBackend::holds`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock.
    pub name: LockName,
    /// Its owner.
    pub owner: OwnerId,
    /// The mode held.
    pub mode: LockMode,
    /// The fencing token of the grant.
    pub token: FencingToken,
    /// Held or suspended (lost locks are not listed once their owner was told).
    pub status: LockStatus,
}

impl HeldLock {
    /// A hold of `name` by `owner` in `mode` with `token`, in `status`.
    pub fn new(
        name: LockName,
        owner: OwnerId,
        mode: LockMode,
        token: FencingToken,
        status: LockStatus,
    ) -> Self {
        Self {
            name,
            owner,
            mode,
            token,
            status,
        }
    }
}

/// A grantor's lock table, for inspection: what an operator's dashboard or a CLI status
/// command reads ([`ClusterBackend::request_table`]). Its `Display` is a printable table.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GrantorTable {
    /// The grantor that answered.
    pub grantor: MemberId,
    /// The epoch of its view.
    pub epoch: u64,
    /// Every lock with holders or waiters, by name: holders, and waiters in queue order.
    pub locks: Vec<TableLock>,
    /// The grantor had more locks than an answer carries
    /// ([`TABLE_LOCKS_MAX`](crate::wire::TABLE_LOCKS_MAX)); the first ones by name are here.
    pub truncated: bool,
}

impl GrantorTable {
    /// A table of `grantor`, in its view of `epoch`.
    pub fn new(grantor: MemberId, epoch: u64, locks: Vec<TableLock>, truncated: bool) -> Self {
        Self {
            grantor,
            epoch,
            locks,
            truncated,
        }
    }
}

impl fmt::Display for GrantorTable {
    /// One line for the grantor, then one per lock: its holders (owner, mode, token) and its
    /// waiters in order.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "grantor {} (view epoch {}), {} lock(s){}",
            self.grantor,
            self.epoch,
            self.locks.len(),
            if self.truncated { ", truncated" } else { "" }
        )?;
        for lock in &self.locks {
            write!(f, "  {}: held by", lock.name)?;
            if lock.holders.is_empty() {
                write!(f, " nobody")?;
            }
            for (i, h) in lock.holders.iter().enumerate() {
                let sep = if i == 0 { " " } else { ", " };
                write!(
                    f,
                    "{sep}{}:{} ({:?}, token {})",
                    h.owner.member, h.owner.local, h.mode, h.token
                )?;
            }
            if !lock.waiters.is_empty() {
                write!(f, "; waiting:")?;
                for (i, w) in lock.waiters.iter().enumerate() {
                    let sep = if i == 0 { " " } else { ", " };
                    write!(
                        f,
                        "{sep}{}. {}:{} ({:?})",
                        i + 1,
                        w.owner.member,
                        w.owner.local,
                        w.mode
                    )?;
                }
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// What grants locks to the front end: the seam every backend implements, in two halves.
///
/// The front end (`conclave`'s `DistributedMutex`, `ReentrantLock`, `RwLock`, their guards,
/// lock events and handlers) is written once on `dyn LockBackend`. A backend implements its
/// two halves, and is a `LockBackend` by that alone:
///
/// - [`RawLockBackend`]: the locks of this member, shaped like parking_lot's `RawMutex` —
///   register a request, poll its grant, release or cancel, watch a hold's status and loss;
/// - [`ClusterBackend`]: the cluster around them — views, the grantor, its table, events and
///   handlers, named services, shutdown.
///
/// Both are synchronous, poll-based and object-safe: the front end owns the futures and the
/// guards; a backend records requests and wakes the [`Waker`](std::task::Waker)s it was given
/// when their answer changes. Every method is callable from any thread, from a user's task and
/// from `Drop`, and none of them blocks. A backend in one process (`conclave`'s local backend)
/// implements both in a few hundred lines; the conformance suite (`tests/` in the repository)
/// runs every scenario against every backend.
pub trait LockBackend: RawLockBackend + ClusterBackend {}

impl<T: RawLockBackend + ClusterBackend> LockBackend for T {}

/// The locks of one member: the half of [`LockBackend`] a request goes through, shaped like
/// parking_lot's `RawMutex` (the front end owns the futures and the guards).
///
/// # The life of a request
/// 1. [`RawLockBackend::submit`] registers a request and returns its [`RequestId`].
/// 2. [`RawLockBackend::poll_grant`] is polled until it is ready: `Ok(token)` means the
///    request's owner holds the lock (the request is now a *hold*); `Err` means it does not,
///    and the backend has forgotten the request.
/// 3. A hold ends in one of two ways: [`RawLockBackend::release`] (an explicit unlock), then
///    [`RawLockBackend::poll_released`] until the release is acknowledged; or
///    [`RawLockBackend::cancel`] (a dropped guard).
/// 4. [`RawLockBackend::cancel`] may be called at any step, any number of times: it undoes what
///    the request holds or waits for, without waiting, and forgets it. A request whose future
///    is dropped is cancelled; so is a hold whose guard is dropped, and a release whose
///    acknowledgement nobody waits for any more.
///
/// While a hold lasts, [`RawLockBackend::status`] says what its owner should believe, and
/// [`RawLockBackend::poll_lost`] resolves if the hold is lost without being released. Requests
/// of an owner of this member are identified by a local owner number from
/// [`RawLockBackend::new_owner`]; the backend makes the cluster-wide [`OwnerId`] from it.
///
/// # The contract
/// The conformance suite (`tests/` in the repository) checks it for every backend:
///
/// - **Exclusion.** An exclusive hold excludes every other hold of the lock; shared holds
///   exclude exclusive ones. A backend that cannot be sure (a partitioned cluster member)
///   reports the hold [`LockStatus::Suspended`] or lost, never held.
/// - **Fairness.** Waiting requests are granted in the order the backend queued them; a
///   queued exclusive request holds back later shared ones.
/// - **Fencing tokens** strictly increase with every grant of a lock.
/// - **Events.** Every listener of [`ClusterBackend::events`] sees, per request, at most one
///   `Waiting` (only when queued behind another owner), then `Locked`, then `Unlocked` or
///   `Lost`; and `Created` when the front end reports a handle.
/// - **Lost holds are told.** A hold that ends without its owner releasing it (the backend
///   shut down, a partition, a duplicate after a merge) makes [`RawLockBackend::poll_lost`]
///   ready with the reason, emits `LockEvent::Lost` and calls every handler, once.
/// - **Shutdown.** After [`ClusterBackend::shutdown`] new requests fail with
///   [`LockError::Shutdown`], waiting ones end with it, holds are lost with
///   [`LockLostReason::Shutdown`], and [`ClusterBackend::poll_closed`] becomes ready.
/// - **Wake-ups.** A `poll_*` method that returns `Pending` wakes the waker it was given
///   (the latest one, per request and method) once it may be ready.
pub trait RawLockBackend: Send + Sync + fmt::Debug + 'static {
    /// This member's id; the [`OwnerId`]s of its owners are made from it.
    fn member(&self) -> &MemberId;

    /// A fresh local owner number, never returned before by this backend.
    fn new_owner(&self) -> u64;

    /// The front end made a handle for `name`: emits [`LockEvent::Created`].
    fn created(&self, name: &LockName);

    /// Registers a request.
    ///
    /// # Errors
    /// [`LockError::Shutdown`] after [`ClusterBackend::shutdown`]; nothing is registered then.
    fn submit(&self, request: Acquire) -> Result<RequestId, LockError>;

    /// The answer to `request`: `Ok(token)` once granted (again on every later poll while
    /// held), an error once refused (the request is forgotten then), `Pending` meanwhile. An
    /// unknown request answers [`LockError::Shutdown`].
    fn poll_grant(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<FencingToken, LockError>>;

    /// Undoes and forgets `request` without waiting: withdraws it if it waits, releases its
    /// hold if granted (also when the grant raced the cancel), stops tracking a release. A
    /// no-op for an unknown request.
    fn cancel(&self, request: RequestId);

    /// Starts releasing the hold of `request`; [`RawLockBackend::poll_released`] then tells when
    /// the release is acknowledged.
    ///
    /// # Errors
    /// [`UnlockError::Lost`] if the hold was lost before (the request is forgotten);
    /// [`UnlockError::Shutdown`] if the backend shut down.
    fn release(&self, request: RequestId) -> Result<(), UnlockError>;

    /// Whether the release of `request` was acknowledged; the request is forgotten once this
    /// is ready. A backend that knows no acknowledgement can come (a minority view under
    /// `Majority`) answers [`UnlockError::Unacknowledged`] at once.
    fn poll_released(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UnlockError>>;

    /// How long a wait for the cluster's answer lasts at most (a release's acknowledgement, a
    /// table query, a grantor transfer, the releases of a destroyed service) before the front
    /// end gives up waiting; `None` (the default) if every answer comes within a bounded time
    /// anyway, as for a backend in one process. The front end's waits end within it and say
    /// so: [`UnlockError::Unacknowledged`], [`LockError::Unavailable`]. What was started goes
    /// on (a release is resent until acknowledged; a wish to grant stands).
    fn answer_bound(&self) -> Option<Duration> {
        None
    }

    /// A reentrant re-lock with a lease: the lease of the hold of `request` becomes
    /// `max(remaining, lease)`; a hold without a lease keeps none. Returns at once; a backend
    /// that must ask a remote grantor moves the holder's deadline only once the grantor has
    /// moved its own, so the holder is always told first.
    ///
    /// # Errors
    /// [`UnlockError::Lost`] if the hold was lost; [`UnlockError::Shutdown`] if the backend
    /// shut down.
    fn extend_lease(&self, request: RequestId, lease: Duration) -> Result<(), UnlockError>;

    /// What the owner of the hold of `request` should believe now ([`LockStatus::Lost`] for
    /// an unknown or ended request).
    fn status(&self, request: RequestId) -> LockStatus;

    /// Why the hold of `request` was lost, once it was (`None` while held or suspended, and
    /// after a normal release).
    fn lost_reason(&self, request: RequestId) -> Option<LockLostReason>;

    /// Ready with the reason when the hold of `request` is lost without being released; never
    /// ready for a hold that is released (or a request that is unknown).
    fn poll_lost(&self, request: RequestId, cx: &mut Context<'_>) -> Poll<LockLostReason>;

    /// The locks held on this member now.
    fn holds(&self) -> Vec<HeldLock>;

    /// How many requests of this member wait for an answer.
    fn pending_requests(&self) -> usize;
}

/// The cluster around a member's locks: the half of [`LockBackend`] that knows views, the
/// grantor and its table, lock events and handlers, named services and shutdown.
pub trait ClusterBackend: Send + Sync + fmt::Debug + 'static {
    /// The view this member is in (`None` before the first and after shutdown).
    fn view(&self) -> Option<View>;

    /// The grantor this member knows to be serving (it announced so, and nothing since says
    /// otherwise); `None` while none is known, e.g. during a failover.
    fn serving_grantor(&self) -> Option<MemberId>;

    /// Ready with the serving grantor once one is known, or with `None` once the backend has
    /// shut down.
    fn poll_serving_grantor(&self, cx: &mut Context<'_>) -> Poll<Option<MemberId>>;

    /// Asks for the grantor role for this member (Geode's `becomeLockGrantor`):
    /// [`ClusterBackend::poll_is_grantor`] tells when it has it. A backend with one member is
    /// the grantor already.
    ///
    /// # Errors
    /// [`LockError::TransferRefused`] if the role cannot move (the `Majority` policy);
    /// [`LockError::Shutdown`] after shutdown.
    fn become_grantor(&self) -> Result<(), LockError>;

    /// Ready with `Ok` once this member serves as the grantor, or with
    /// [`LockError::Shutdown`] once the backend has shut down.
    fn poll_is_grantor(&self, cx: &mut Context<'_>) -> Poll<Result<(), LockError>>;

    /// Asks the grantor for its lock table; returns the query, answered by
    /// [`ClusterBackend::poll_table`].
    ///
    /// # Errors
    /// [`LockError::Shutdown`] after shutdown.
    fn request_table(&self) -> Result<u64, LockError>;

    /// The answer to table query `query`: the table, or [`LockError::Unavailable`] if no
    /// grantor could answer (none serving, or the grantor changed before it answered), or
    /// [`LockError::Shutdown`]. The query is forgotten once this is ready.
    fn poll_table(&self, query: u64, cx: &mut Context<'_>)
        -> Poll<Result<GrantorTable, LockError>>;

    /// Forgets table query `query` (its future was dropped).
    fn cancel_table(&self, query: u64);

    /// A stream of the views this member installs, starting with the current one; it ends at
    /// shutdown.
    fn views(&self) -> BoxStream<'static, View>;

    /// A stream of this member's lock events; it ends at shutdown.
    fn events(&self) -> BoxStream<'static, LockEvent>;

    /// Registers an unexpected-status handler for lost holds (see [`LockLost`]).
    fn on_lock_lost(&self, handler: LostHandler);

    /// Registers an unexpected-status handler for grants nobody expected (see
    /// [`UnexpectedLock`]). A backend that can never grant unexpectedly (one process) keeps
    /// no handler.
    fn on_unexpected_lock(&self, handler: UnexpectedHandler);

    /// Starts shutting down without blocking: releases every hold (lost with
    /// [`LockLostReason::Shutdown`]), fails every waiting request, leaves the cluster.
    fn shutdown(&self);

    /// Ready once the backend has shut down completely (after [`ClusterBackend::shutdown`]).
    fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// The named lock service `name` of this member, as a backend of its own (Geode's named
    /// `DistributedLockService`): an independent namespace of locks with its own grantor
    /// (transferred on its own), its own reconciliation, table and events. The service is
    /// opened on this member if it is not yet.
    ///
    /// Every method of the returned backend means what it means here, for that service:
    /// [`submit`](RawLockBackend::submit) locks in it; [`serving_grantor`](ClusterBackend::serving_grantor),
    /// [`poll_serving_grantor`](ClusterBackend::poll_serving_grantor),
    /// [`become_grantor`](ClusterBackend::become_grantor) and
    /// [`poll_is_grantor`](ClusterBackend::poll_is_grantor) concern its grantor;
    /// [`request_table`](ClusterBackend::request_table) asks for its table;
    /// [`events`](ClusterBackend::events), [`on_lock_lost`](ClusterBackend::on_lock_lost) and
    /// [`on_unexpected_lock`](ClusterBackend::on_unexpected_lock) see only its events;
    /// [`holds`](RawLockBackend::holds) and [`pending_requests`](RawLockBackend::pending_requests)
    /// count only its requests. Methods on a request id or table query work on either backend
    /// (ids are unique across the services of a member). [`member`](RawLockBackend::member),
    /// [`new_owner`](RawLockBackend::new_owner), [`view`](ClusterBackend::view) and
    /// [`views`](ClusterBackend::views) are the node's.
    ///
    /// [`shutdown`](ClusterBackend::shutdown) of the returned backend **destroys the service** on
    /// this member, not the node: its holds are released at the grantor and lost with
    /// [`LockLostReason::ServiceDestroyed`] (events and handlers as for any loss), its
    /// pending requests end with [`LockError::ServiceDestroyed`], and every later call through
    /// it fails with that error (its event streams end).
    /// [`poll_closed`](ClusterBackend::poll_closed) is ready once the grantor acknowledged those
    /// releases, or the node closed. Asking again for a destroyed name gives a fresh service;
    /// shutting the node down closes every service.
    ///
    /// The default implementation is for backends without named services: they run none, so
    /// it answers [`LockError::TooManyServices`]. Conclave's own backends implement it.
    ///
    /// # Errors
    /// [`LockError::TooManyServices`] if the member runs the most services it may already
    /// (`conclave_protocol::MAX_SERVICES`, 256, for the group backend);
    /// [`LockError::Shutdown`] after the node shut down.
    fn service(&self, name: &ServiceName) -> Result<Arc<dyn LockBackend>, LockError> {
        let _ = name;
        Err(LockError::TooManyServices)
    }
}
