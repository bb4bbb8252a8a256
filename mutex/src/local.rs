//! The local backend: the lock table of one process, with no network and no thread.
//!
//! [`LocalBackend`] implements the backend seam ([`LockBackend`](conclave_lock_api::LockBackend)) with the semantics of a
//! cluster whose only member never fails: FIFO queues per lock (a queued exclusive request
//! holds back later shared ones, consecutive shared waiters are granted together), fencing
//! tokens that strictly increase per lock, `Waiting` events only for requests queued behind
//! another owner, timeouts kept by the backend, cancel safety (a dropped request is withdrawn,
//! a grant that raced it released), and holds lost with [`LockLostReason::Shutdown`] when the
//! node shuts down. Holds are never suspended: nothing can cut this member off. Each named
//! lock service ([`ClusterBackend::service`]) is another such table, of its own.
//!
//! It is what [`crate::Node::local`] runs on: code that takes Conclave locks can be unit-tested
//! without a cluster, and behaves the same on one.
//!
//! ```
//! use conclave::{LockEvent, Node};
//! use futures::StreamExt;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! smol::block_on(async {
//!     let node = Node::local("test")?;
//!     let mut events = node.lock_events();
//!     let lock = node.rw_lock("config")?;
//!     let (r1, r2) = (lock.read().await?, lock.read().await?); // readers share
//!     assert!(r2.fencing_token() > r1.fencing_token());
//!     drop((r1, r2));
//!     let w = lock.write().await?;
//!     w.unlock().await?;
//!     node.leave().await;
//!     let first = events.next().await;
//!     assert!(matches!(first, Some(LockEvent::Created { .. })));
//!     Ok(())
//! })
//! # }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use async_channel::Sender;
use async_io::Timer;
use conclave_lock_api::wire::{TableHolder, TableLock, TableWaiter, TABLE_LOCKS_MAX};
use conclave_lock_api::{
    Acquire, ClusterBackend, FencingToken, GrantorTable, HeldLock, LockError, LockEvent, LockLost,
    LockLostReason, LockMode, LockName, LockStatus, LostHandler, MemberId, OwnerId, RawLockBackend,
    RequestId, ServiceName, UnexpectedHandler, UnlockError, View,
};
use futures::stream::BoxStream;

use self::services::LocalNode;

mod services;

/// The lock table of one process: see the [module documentation](self).
pub struct LocalBackend {
    member: MemberId,
    view: View,
    state: Mutex<State>,
    /// What the node's default service and its named services share.
    node: Arc<LocalNode>,
    /// `None`: the node's default service.
    service: Option<ServiceName>,
}

impl fmt::Debug for LocalBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalBackend")
            .field("member", &self.member)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

/// Where a request stands.
enum Stage {
    /// In its lock's queue.
    Queued,
    /// Holding, with this token.
    Held(FencingToken),
    /// Refused; the answer waits for the future.
    Refused(LockError),
    /// Lost while held, for this reason.
    Lost(LockLostReason),
    /// Released by an explicit unlock (acknowledged at once: there is nobody to ask).
    Released,
}

struct Record {
    name: LockName,
    owner: u64,
    mode: LockMode,
    stage: Stage,
    deadline: Option<Instant>,
    /// Wakes the waiting task at `deadline`.
    timer: Option<Timer>,
    /// The hold's own lease, from its grant.
    lease: Option<Duration>,
    /// While held with a lease: when it runs out, and a timer that wakes the tasks watching
    /// the hold (or waiting behind it) then.
    lease_until: Option<(Instant, Timer)>,
    wakers: Vec<Waker>,
}

impl Record {
    fn wake(&mut self) {
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
    }

    fn register(&mut self, waker: &Waker) {
        if !self.wakers.iter().any(|w| w.will_wake(waker)) {
            self.wakers.push(waker.clone());
        }
    }
}

/// One lock's holders and queue.
#[derive(Default)]
struct Entry {
    holders: Vec<(RequestId, LockMode)>,
    queue: VecDeque<RequestId>,
}

impl Entry {
    fn compatible(&self, mode: LockMode) -> bool {
        match mode {
            LockMode::Exclusive => self.holders.is_empty(),
            LockMode::Shared => self.holders.iter().all(|(_, m)| *m == LockMode::Shared),
        }
    }
}

#[derive(Default)]
struct State {
    closed: bool,
    /// Closed because the named service was destroyed (the node still runs).
    destroyed: bool,
    /// The last fencing token issued, for any lock: tokens increase per lock because they
    /// increase overall.
    last_token: u64,
    next_request: u64,
    next_query: u64,
    locks: BTreeMap<LockName, Entry>,
    requests: BTreeMap<RequestId, Record>,
    events: Vec<Sender<LockEvent>>,
    views: Vec<Sender<View>>,
    handlers: Vec<LostHandler>,
    closed_wakers: Vec<Waker>,
}

impl LocalBackend {
    /// A lock table for the one member `member`.
    pub fn new(member: MemberId) -> Self {
        let view = View::new(1, vec![member.clone()]).expect("a view of one member is valid");
        Self {
            member,
            view,
            state: Mutex::new(State::default()),
            node: Arc::default(),
            service: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the holds whose own lease ran out and tells the lost-lock handlers.
    fn expire_leases(&self) {
        let (handlers, lost) = {
            let mut state = self.lock();
            let lost = state.expire_leases(&self.member, Instant::now());
            if lost.is_empty() {
                return;
            }
            (state.handlers.clone(), lost)
        };
        call_handlers(&handlers, &lost);
    }

    fn owner_id(&self, local: u64) -> OwnerId {
        OwnerId {
            member: self.member.clone(),
            local,
        }
    }
}

impl State {
    /// Why requests fail once closed.
    fn refusal(&self) -> LockError {
        if self.destroyed {
            LockError::ServiceDestroyed
        } else {
            LockError::Shutdown
        }
    }

    /// `Err` with [`State::refusal`] once closed.
    fn open(&self) -> Result<(), LockError> {
        if self.closed {
            Err(self.refusal())
        } else {
            Ok(())
        }
    }

    fn emit(&mut self, event: LockEvent) {
        self.events.retain(|s| s.try_send(event.clone()).is_ok());
    }

    /// Grants `request` (already removed from any queue) and records its token.
    fn grant(&mut self, member: &MemberId, request: RequestId) {
        let Some(record) = self.requests.get_mut(&request) else {
            return;
        };
        self.last_token += 1;
        let token = FencingToken(self.last_token);
        let entry = self.locks.entry(record.name.clone()).or_default();
        entry.holders.push((request, record.mode));
        record.stage = Stage::Held(token);
        record.timer = None;
        record.lease_until = record.lease.map(|d| {
            let until = Instant::now() + d;
            (until, Timer::at(until))
        });
        record.wake();
        let event = LockEvent::Locked {
            name: record.name.clone(),
            owner: OwnerId {
                member: member.clone(),
                local: record.owner,
            },
            mode: record.mode,
            token,
        };
        self.emit(event);
    }

    /// Grants from the head of `name`'s queue while the head is compatible with the holders,
    /// answering the waiters whose deadline passed on the way.
    fn promote(&mut self, member: &MemberId, name: &LockName, now: Instant) {
        loop {
            let Some(entry) = self.locks.get_mut(name) else {
                return;
            };
            let Some(&head) = entry.queue.front() else {
                break;
            };
            let Some(record) = self.requests.get_mut(&head) else {
                entry.queue.pop_front();
                continue;
            };
            if record.deadline.is_some_and(|d| d <= now) {
                entry.queue.pop_front();
                record.stage = Stage::Refused(LockError::Timeout);
                record.wake();
                continue;
            }
            if !entry.compatible(record.mode) {
                break;
            }
            entry.queue.pop_front();
            self.grant(member, head);
        }
        self.forget_if_unused(name);
    }

    /// Drops `name`'s entry once nothing holds or waits for it (memory stays bounded by the
    /// locks in use).
    fn forget_if_unused(&mut self, name: &LockName) {
        if self
            .locks
            .get(name)
            .is_some_and(|e| e.holders.is_empty() && e.queue.is_empty())
        {
            self.locks.remove(name);
        }
    }

    /// Ends every hold whose own lease ran out at `now`: lost with
    /// [`LockLostReason::LeaseExpired`] (event emitted, owner woken) before the lock goes to
    /// the next waiter. Returns the losses for the handlers, to call without the state lock.
    fn expire_leases(&mut self, member: &MemberId, now: Instant) -> Vec<LockLost> {
        let expired: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, r)| matches!(r.stage, Stage::Held(_)))
            .filter(|(_, r)| r.lease_until.as_ref().is_some_and(|(t, _)| *t <= now))
            .map(|(id, _)| *id)
            .collect();
        let mut lost = Vec::new();
        for request in expired {
            let Some(record) = self.requests.get_mut(&request) else {
                continue;
            };
            let Stage::Held(token) = record.stage else {
                continue;
            };
            let reason = LockLostReason::LeaseExpired;
            record.stage = Stage::Lost(reason);
            record.lease_until = None;
            record.wake();
            let owner = OwnerId {
                member: member.clone(),
                local: record.owner,
            };
            let name = record.name.clone();
            lost.push(LockLost::new(name.clone(), owner.clone(), token, reason));
            self.detach(request, &name);
            self.emit(LockEvent::Lost {
                name: name.clone(),
                owner,
                reason,
            });
            self.promote(member, &name, now);
        }
        lost
    }

    /// Registers `waker` to run when the first lease of a holder of `name` runs out.
    fn watch_holder_leases(&mut self, name: &LockName, waker: &Waker) {
        let Some(entry) = self.locks.get(name) else {
            return;
        };
        let holders: Vec<RequestId> = entry.holders.iter().map(|(r, _)| *r).collect();
        for request in holders {
            if let Some(record) = self.requests.get_mut(&request) {
                if record.lease_until.is_some() {
                    record.register(waker);
                    if let Some((_, timer)) = &mut record.lease_until {
                        let mut cx = Context::from_waker(waker);
                        let _ = Pin::new(timer).poll(&mut cx);
                    }
                }
            }
        }
    }

    /// Removes `request` from its lock's holders or queue; returns whether it held.
    fn detach(&mut self, request: RequestId, name: &LockName) -> bool {
        let Some(entry) = self.locks.get_mut(name) else {
            return false;
        };
        let held = entry.holders.len();
        entry.holders.retain(|(r, _)| *r != request);
        entry.queue.retain(|r| *r != request);
        held != entry.holders.len()
    }
}

impl RawLockBackend for LocalBackend {
    fn member(&self) -> &MemberId {
        &self.member
    }

    fn new_owner(&self) -> u64 {
        self.node.next_owner.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn created(&self, name: &LockName) {
        self.lock().emit(LockEvent::Created { name: name.clone() });
    }

    fn submit(&self, request: Acquire) -> Result<RequestId, LockError> {
        self.expire_leases();
        let mut state = self.lock();
        state.open()?;
        state.next_request += 1;
        let id = RequestId(state.next_request);
        let now = Instant::now();
        let entry = state.locks.entry(request.name.clone()).or_default();
        let free = entry.queue.is_empty() && entry.compatible(request.mode);
        let deadline = request.timeout.map(|t| now + t);
        let queued = !free && request.wait;
        let position = if queued {
            entry.queue.push_back(id);
            Some(entry.queue.len())
        } else {
            None
        };
        state.requests.insert(
            id,
            Record {
                name: request.name.clone(),
                owner: request.owner,
                mode: request.mode,
                stage: if free || queued {
                    Stage::Queued
                } else {
                    Stage::Refused(LockError::WouldBlock)
                },
                deadline,
                timer: deadline.filter(|_| queued).map(Timer::at),
                lease: request.lease,
                lease_until: None,
                wakers: Vec::new(),
            },
        );
        if free {
            state.grant(&self.member, id);
        } else if let Some(position) = position {
            let event = LockEvent::Waiting {
                name: request.name,
                owner: self.owner_id(request.owner),
                mode: request.mode,
                position: u32::try_from(position).unwrap_or(u32::MAX),
            };
            state.emit(event);
        }
        Ok(id)
    }

    fn poll_grant(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<FencingToken, LockError>> {
        self.expire_leases();
        let mut state = self.lock();
        let Some(record) = state.requests.get_mut(&request) else {
            return Poll::Ready(Err(LockError::Shutdown));
        };
        match &record.stage {
            Stage::Held(token) => return Poll::Ready(Ok(*token)),
            Stage::Refused(error) => {
                let error = error.clone();
                state.requests.remove(&request);
                return Poll::Ready(Err(error));
            }
            Stage::Lost(reason) => return Poll::Ready(Err(LockError::Lost(*reason))),
            Stage::Released => return Poll::Ready(Err(LockError::Cancelled)),
            Stage::Queued => {}
        }
        let expired = match &mut record.timer {
            Some(timer) => Pin::new(timer).poll(cx).is_ready(),
            None => false,
        };
        if expired {
            let name = record.name.clone();
            state.requests.remove(&request);
            state.detach(request, &name);
            // A waiter that leaves may unblock those behind it (shared ones behind it).
            state.promote(&self.member, &name, Instant::now());
            return Poll::Ready(Err(LockError::Timeout));
        }
        record.register(cx.waker());
        let name = record.name.clone();
        state.watch_holder_leases(&name, cx.waker());
        Poll::Pending
    }

    fn cancel(&self, request: RequestId) {
        let mut state = self.lock();
        let Some(record) = state.requests.remove(&request) else {
            return;
        };
        let held = state.detach(request, &record.name);
        if held {
            let event = LockEvent::Unlocked {
                name: record.name.clone(),
                owner: self.owner_id(record.owner),
            };
            state.emit(event);
        }
        state.promote(&self.member, &record.name, Instant::now());
    }

    fn release(&self, request: RequestId) -> Result<(), UnlockError> {
        self.expire_leases();
        let mut state = self.lock();
        let closed = state.closed;
        let Some(record) = state.requests.get_mut(&request) else {
            return Err(if closed {
                UnlockError::Shutdown
            } else {
                UnlockError::Lost(LockLostReason::Shutdown)
            });
        };
        match record.stage {
            Stage::Held(_) => {}
            Stage::Lost(reason) => {
                state.requests.remove(&request);
                return Err(UnlockError::Lost(reason));
            }
            Stage::Released => return Ok(()),
            Stage::Queued | Stage::Refused(_) => {
                state.requests.remove(&request);
                return Err(UnlockError::Shutdown);
            }
        }
        record.stage = Stage::Released;
        record.wake();
        let (name, owner) = (record.name.clone(), record.owner);
        state.detach(request, &name);
        state.emit(LockEvent::Unlocked {
            name: name.clone(),
            owner: self.owner_id(owner),
        });
        state.promote(&self.member, &name, Instant::now());
        Ok(())
    }

    fn poll_released(
        &self,
        request: RequestId,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<(), UnlockError>> {
        let mut state = self.lock();
        let answer = match state.requests.get(&request).map(|r| &r.stage) {
            Some(Stage::Released) => Ok(()),
            _ => Err(UnlockError::Shutdown),
        };
        state.requests.remove(&request);
        Poll::Ready(answer)
    }

    fn extend_lease(&self, request: RequestId, lease: Duration) -> Result<(), UnlockError> {
        self.expire_leases();
        let mut state = self.lock();
        let closed = state.closed;
        match state.requests.get_mut(&request) {
            Some(record) => match record.stage {
                Stage::Held(_) => {
                    if let Some((until, timer)) = &mut record.lease_until {
                        let later = Instant::now() + lease;
                        if later > *until {
                            *until = later;
                            timer.set_at(later);
                        }
                    }
                    Ok(())
                }
                Stage::Lost(reason) => Err(UnlockError::Lost(reason)),
                _ => Err(UnlockError::Shutdown),
            },
            None if closed => Err(UnlockError::Shutdown),
            None => Err(UnlockError::Lost(LockLostReason::Shutdown)),
        }
    }

    fn status(&self, request: RequestId) -> LockStatus {
        self.expire_leases();
        match self.lock().requests.get(&request).map(|r| &r.stage) {
            Some(Stage::Held(_)) => LockStatus::Held,
            _ => LockStatus::Lost,
        }
    }

    fn lost_reason(&self, request: RequestId) -> Option<LockLostReason> {
        self.expire_leases();
        match self.lock().requests.get(&request).map(|r| &r.stage) {
            Some(Stage::Lost(reason)) => Some(*reason),
            _ => None,
        }
    }

    fn poll_lost(&self, request: RequestId, cx: &mut Context<'_>) -> Poll<LockLostReason> {
        self.expire_leases();
        let mut state = self.lock();
        match state.requests.get_mut(&request) {
            Some(record) => match record.stage {
                Stage::Lost(reason) => Poll::Ready(reason),
                Stage::Held(_) => {
                    record.register(cx.waker());
                    if let Some((_, timer)) = &mut record.lease_until {
                        let _ = Pin::new(timer).poll(cx);
                    }
                    Poll::Pending
                }
                _ => Poll::Pending,
            },
            None => Poll::Pending,
        }
    }

    fn holds(&self) -> Vec<HeldLock> {
        self.expire_leases();
        let state = self.lock();
        state
            .requests
            .values()
            .filter_map(|r| match r.stage {
                Stage::Held(token) => Some(HeldLock::new(
                    r.name.clone(),
                    self.owner_id(r.owner),
                    r.mode,
                    token,
                    LockStatus::Held,
                )),
                _ => None,
            })
            .collect()
    }

    fn pending_requests(&self) -> usize {
        self.lock()
            .requests
            .values()
            .filter(|r| matches!(r.stage, Stage::Queued))
            .count()
    }
}

impl ClusterBackend for LocalBackend {
    fn view(&self) -> Option<View> {
        // A destroyed service still shows the node's view.
        let shown = {
            let state = self.lock();
            !state.closed || state.destroyed
        };
        (shown && !self.node.is_closed()).then(|| self.view.clone())
    }

    fn serving_grantor(&self) -> Option<MemberId> {
        (!self.lock().closed).then(|| self.member.clone())
    }

    fn poll_serving_grantor(&self, _cx: &mut Context<'_>) -> Poll<Option<MemberId>> {
        Poll::Ready(self.serving_grantor())
    }

    fn become_grantor(&self) -> Result<(), LockError> {
        self.lock().open()
    }

    fn poll_is_grantor(&self, _cx: &mut Context<'_>) -> Poll<Result<(), LockError>> {
        Poll::Ready(self.lock().open())
    }

    fn request_table(&self) -> Result<u64, LockError> {
        let mut state = self.lock();
        state.open()?;
        state.next_query += 1;
        Ok(state.next_query)
    }

    fn poll_table(
        &self,
        _query: u64,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<GrantorTable, LockError>> {
        // This process is the grantor: its table is the answer, now.
        self.expire_leases();
        let now = Instant::now();
        let state = self.lock();
        if let Err(error) = state.open() {
            return Poll::Ready(Err(error));
        }
        let holder = |r: &RequestId| state.requests.get(r);
        let locks = state
            .locks
            .iter()
            .filter(|(_, e)| !e.holders.is_empty() || !e.queue.is_empty())
            .take(TABLE_LOCKS_MAX)
            .map(|(name, e)| TableLock {
                name: name.clone(),
                holders: e
                    .holders
                    .iter()
                    .filter_map(|(r, mode)| {
                        let record = holder(r)?;
                        let Stage::Held(token) = record.stage else {
                            return None;
                        };
                        Some(TableHolder {
                            owner: self.owner_id(record.owner),
                            mode: *mode,
                            token,
                            lease_ms: record.lease_until.as_ref().map(|(t, _)| {
                                let left = t.saturating_duration_since(now).as_millis();
                                u64::try_from(left).unwrap_or(u64::MAX)
                            }),
                        })
                    })
                    .collect(),
                waiters: e
                    .queue
                    .iter()
                    .filter_map(|r| {
                        let record = holder(r)?;
                        Some(TableWaiter {
                            owner: self.owner_id(record.owner),
                            mode: record.mode,
                        })
                    })
                    .collect(),
            })
            .collect();
        let in_use = state
            .locks
            .values()
            .filter(|e| !e.holders.is_empty() || !e.queue.is_empty())
            .count();
        Poll::Ready(Ok(GrantorTable::new(
            self.member.clone(),
            self.view.epoch(),
            locks,
            in_use > TABLE_LOCKS_MAX,
        )))
    }

    fn cancel_table(&self, _query: u64) {}

    fn views(&self) -> BoxStream<'static, View> {
        let (sender, receiver) = async_channel::unbounded();
        let mut state = self.lock();
        if !state.closed {
            let _ = sender.try_send(self.view.clone());
            state.views.push(sender);
        }
        Box::pin(receiver)
    }

    fn events(&self) -> BoxStream<'static, LockEvent> {
        let (sender, receiver) = async_channel::unbounded();
        let mut state = self.lock();
        if !state.closed {
            state.events.push(sender);
        }
        Box::pin(receiver)
    }

    fn on_lock_lost(&self, handler: LostHandler) {
        self.lock().handlers.push(handler);
    }

    fn on_unexpected_lock(&self, _handler: UnexpectedHandler) {
        // One process grants only what its owners asked for and still wait for: a grant is
        // never unexpected here.
    }

    fn shutdown(&self) {
        match self.service {
            None => self.shut_node_down(),
            Some(_) => self.close(LockLostReason::ServiceDestroyed),
        }
    }

    fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.lock();
        if state.closed {
            Poll::Ready(())
        } else {
            if !state.closed_wakers.iter().any(|w| w.will_wake(cx.waker())) {
                state.closed_wakers.push(cx.waker().clone());
            }
            Poll::Pending
        }
    }

    fn service(
        &self,
        name: &ServiceName,
    ) -> Result<Arc<dyn conclave_lock_api::LockBackend>, LockError> {
        Ok(self.open_service(name)?)
    }
}

/// Calls every lost-lock handler for every loss; a handler that panics is logged, not fatal.
fn call_handlers(handlers: &[LostHandler], lost: &[LockLost]) {
    for event in lost {
        for handler in handlers {
            let call = std::panic::AssertUnwindSafe(|| handler(event));
            if std::panic::catch_unwind(call).is_err() {
                tracing::error!(lock = %event.name, "a lost-lock handler panicked");
            }
        }
    }
}
