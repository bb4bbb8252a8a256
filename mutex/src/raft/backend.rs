//! [`RaftBackend`]: the backend seam on a Raft member.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant as StdInstant};

use conclave_lock_api::wire::TABLE_LOCKS_MAX;
use conclave_lock_api::{
    Acquire, ClusterBackend, FencingToken, GrantorTable, HeldLock, LockBackend, LockError,
    LockEvent, LockLostReason, LockName, LockStatus, LostHandler, MemberId, RawLockBackend,
    RequestId, ServiceName, UnexpectedHandler, UnlockError, View,
};
use futures::stream::BoxStream;

use super::state::{Phase, Read, Record, Shared};

/// A member of a Raft lock cluster, as the front end sees it: one handle per lock service
/// (`None`: the default service), all on one replicated table.
pub struct RaftBackend {
    pub(super) shared: Arc<Shared>,
    pub(super) service: Option<ServiceName>,
    /// A named service's handle was destroyed (its name opens afresh as a new handle).
    pub(super) destroyed: AtomicBool,
}

impl fmt::Debug for RaftBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RaftBackend")
            .field("member", &self.shared.member)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl RaftBackend {
    /// Runs `f` on the state, then rings the driver and reports losses.
    fn with<T>(&self, f: impl FnOnce(&mut super::state::State) -> T) -> T {
        let out = {
            let mut state = self.shared.lock();
            f(&mut state)
        };
        self.shared.ring();
        self.shared.report_losses();
        out
    }

    /// A handle on `service` of the member `shared`.
    pub(super) fn new(shared: Arc<Shared>, service: Option<ServiceName>) -> Self {
        RaftBackend {
            shared,
            service,
            destroyed: AtomicBool::new(false),
        }
    }

    fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// `Err` once the node shut down or this service was destroyed.
    fn open(&self, closed: bool) -> Result<(), LockError> {
        if closed {
            Err(LockError::Shutdown)
        } else if self.is_destroyed() {
            Err(LockError::ServiceDestroyed)
        } else {
            Ok(())
        }
    }

    /// Destroys this named service here: its waits fail and its holds are lost with
    /// `ServiceDestroyed` (and released at the table), its listeners' streams end.
    fn destroy(&self, state: &mut super::state::State) {
        let Some(name) = &self.service else {
            return;
        };
        self.destroyed.store(true, Ordering::Release);
        if state
            .services
            .get(name)
            .is_some_and(|h| std::ptr::eq(Arc::as_ptr(h), self))
        {
            state.services.remove(name);
        }
        let requests: Vec<RequestId> = state
            .records
            .iter()
            .filter(|(_, r)| r.service.as_ref() == Some(name))
            .map(|(id, _)| *id)
            .collect();
        let now = state.now();
        for request in requests {
            match state.records.get(&request).map(|r| r.phase.clone()) {
                Some(Phase::Waiting) => {
                    state.fail(request, LockError::ServiceDestroyed);
                    state.node.cancel(now, request.0);
                }
                Some(Phase::Held(_) | Phase::Releasing(_)) => {
                    state.lose(request, LockLostReason::ServiceDestroyed);
                    state.node.cancel(now, request.0);
                }
                _ => {}
            }
        }
        state.destroyed_listeners.push(self.service.clone());
    }
}

impl RawLockBackend for RaftBackend {
    fn member(&self) -> &MemberId {
        &self.shared.member
    }

    fn new_owner(&self) -> u64 {
        self.shared.next_owner.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn created(&self, name: &LockName) {
        let service = self.service.clone();
        self.shared
            .lock()
            .emit(&service, LockEvent::Created { name: name.clone() });
    }

    fn submit(&self, request: Acquire) -> Result<RequestId, LockError> {
        let service = self.service.clone();
        self.with(|state| {
            self.open(state.closed)?;
            state.next_request += 1;
            let id = RequestId(state.next_request);
            let now = state.now();
            state.records.insert(
                id,
                Record {
                    service: service.clone(),
                    name: request.name.clone(),
                    owner: request.owner,
                    mode: request.mode,
                    phase: Phase::Waiting,
                    deadline: request.timeout.map(|t| StdInstant::now() + t),
                    wakers: Vec::new(),
                },
            );
            state.node.lock(
                now,
                id.0,
                (service, request.name),
                request.owner,
                request.mode,
                request.wait,
                request.lease,
            );
            Ok(id)
        })
    }

    fn poll_grant(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<FencingToken, LockError>> {
        let answer = {
            let mut state = self.shared.lock();
            let closed = state.closed;
            let Some(record) = state.records.get_mut(&request) else {
                return Poll::Ready(Err(LockError::Shutdown));
            };
            match &record.phase {
                Phase::Held(token) | Phase::Releasing(token) => Poll::Ready(Ok(*token)),
                Phase::Failed(error) => {
                    let error = error.clone();
                    state.records.remove(&request);
                    Poll::Ready(Err(error))
                }
                Phase::Lost(reason) => Poll::Ready(Err(LockError::Lost(*reason))),
                Phase::Released => Poll::Ready(Err(LockError::Cancelled)),
                Phase::Waiting if closed => Poll::Ready(Err(LockError::Shutdown)),
                Phase::Waiting => {
                    if record.deadline.is_some_and(|d| StdInstant::now() >= d) {
                        state.records.remove(&request);
                        let now = state.now();
                        state.node.cancel(now, request.0);
                        Poll::Ready(Err(LockError::Timeout))
                    } else {
                        record.register(cx.waker());
                        Poll::Pending
                    }
                }
            }
        };
        // The driver keeps the timeout (it wakes the task at its deadline).
        self.shared.ring();
        answer
    }

    fn cancel(&self, request: RequestId) {
        self.with(|state| {
            if state.records.remove(&request).is_some() && !state.stopped {
                let now = state.now();
                state.node.cancel(now, request.0);
            }
        });
    }

    fn release(&self, request: RequestId) -> Result<(), UnlockError> {
        let service = self.service.clone();
        self.with(|state| {
            let closed = state.closed;
            let Some(record) = state.records.get_mut(&request) else {
                return Err(if closed {
                    UnlockError::Shutdown
                } else {
                    UnlockError::Lost(LockLostReason::Shutdown)
                });
            };
            match record.phase.clone() {
                Phase::Held(token) => {
                    record.phase = Phase::Releasing(token);
                    let (name, owner) = (record.name.clone(), record.owner);
                    let owner = state.owner(owner);
                    state.emit(&service, LockEvent::Unlocked { name, owner });
                    let now = state.now();
                    state.node.unlock(now, request.0);
                    Ok(())
                }
                Phase::Releasing(_) | Phase::Released => Ok(()),
                Phase::Lost(reason) => {
                    state.records.remove(&request);
                    Err(UnlockError::Lost(reason))
                }
                Phase::Waiting | Phase::Failed(_) => {
                    state.records.remove(&request);
                    Err(UnlockError::Shutdown)
                }
            }
        })
    }

    fn poll_released(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UnlockError>> {
        let mut state = self.shared.lock();
        let closed = state.closed;
        let Some(record) = state.records.get_mut(&request) else {
            return Poll::Ready(Err(UnlockError::Shutdown));
        };
        let answer = match record.phase {
            Phase::Released => Ok(()),
            Phase::Lost(reason) => Err(UnlockError::Lost(reason)),
            Phase::Releasing(_) if !closed => {
                record.register(cx.waker());
                return Poll::Pending;
            }
            _ => Err(UnlockError::Shutdown),
        };
        state.records.remove(&request);
        Poll::Ready(answer)
    }

    fn extend_lease(&self, request: RequestId, lease: Duration) -> Result<(), UnlockError> {
        self.with(|state| {
            let closed = state.closed;
            match state.records.get(&request).map(|r| r.phase.clone()) {
                Some(Phase::Held(_)) => {
                    let now = state.now();
                    state.node.extend(now, request.0, lease);
                    Ok(())
                }
                Some(Phase::Lost(reason)) => Err(UnlockError::Lost(reason)),
                Some(_) => Err(UnlockError::Shutdown),
                None if closed => Err(UnlockError::Shutdown),
                None => Err(UnlockError::Lost(LockLostReason::Shutdown)),
            }
        })
    }

    fn status(&self, request: RequestId) -> LockStatus {
        let state = self.shared.lock();
        let now = state.now();
        match state.records.get(&request).map(|r| &r.phase) {
            // Its session or lease ran out and the driver has not said so yet (e.g. right
            // after a pause): not known to be held.
            Some(Phase::Held(_) | Phase::Releasing(_)) if !state.node.believes(now, request.0) => {
                self.shared.ring();
                LockStatus::Suspended
            }
            Some(Phase::Held(_) | Phase::Releasing(_)) => LockStatus::Held,
            _ => LockStatus::Lost,
        }
    }

    fn lost_reason(&self, request: RequestId) -> Option<LockLostReason> {
        match self.shared.lock().records.get(&request).map(|r| &r.phase) {
            Some(Phase::Lost(reason)) => Some(*reason),
            _ => None,
        }
    }

    fn poll_lost(&self, request: RequestId, cx: &mut Context<'_>) -> Poll<LockLostReason> {
        let mut state = self.shared.lock();
        match state.records.get_mut(&request) {
            Some(record) => match record.phase {
                Phase::Lost(reason) => Poll::Ready(reason),
                _ => {
                    record.register(cx.waker());
                    Poll::Pending
                }
            },
            None => Poll::Pending,
        }
    }

    fn holds(&self) -> Vec<HeldLock> {
        let state = self.shared.lock();
        let now = state.now();
        let mut holds: Vec<HeldLock> = state
            .records
            .iter()
            .filter(|(_, r)| r.service == self.service)
            .filter_map(|(id, r)| match r.phase {
                Phase::Held(token) | Phase::Releasing(token) => Some(HeldLock::new(
                    r.name.clone(),
                    state.owner(r.owner),
                    r.mode,
                    token,
                    if state.node.believes(now, id.0) {
                        LockStatus::Held
                    } else {
                        LockStatus::Suspended
                    },
                )),
                _ => None,
            })
            .collect();
        // Holds of this member's earlier incarnation, not taken over yet.
        for ((service, name), owner, mode, token) in state
            .node
            .table()
            .recovered_holds(self.shared.member.name())
        {
            if service == self.service {
                holds.push(HeldLock::new(name, owner, mode, token, LockStatus::Held));
            }
        }
        holds
    }

    fn pending_requests(&self) -> usize {
        self.shared
            .lock()
            .records
            .values()
            .filter(|r| r.service == self.service && r.phase == Phase::Waiting)
            .count()
    }
}

impl ClusterBackend for RaftBackend {
    fn view(&self) -> Option<View> {
        let state = self.shared.lock();
        if state.closed {
            None
        } else {
            state.view.clone()
        }
    }

    fn serving_grantor(&self) -> Option<MemberId> {
        let state = self.shared.lock();
        if state.closed {
            None
        } else {
            state.leader.clone()
        }
    }

    fn poll_serving_grantor(&self, cx: &mut Context<'_>) -> Poll<Option<MemberId>> {
        let mut state = self.shared.lock();
        if state.closed {
            return Poll::Ready(None);
        }
        match &state.leader {
            Some(leader) => Poll::Ready(Some(leader.clone())),
            None => {
                if !state.leader_wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    state.leader_wakers.push(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    fn become_grantor(&self) -> Result<(), LockError> {
        self.with(|state| {
            self.open(state.closed)?;
            let now = state.now();
            state.node.become_leader(now);
            Ok(())
        })
    }

    fn poll_is_grantor(&self, cx: &mut Context<'_>) -> Poll<Result<(), LockError>> {
        let mut state = self.shared.lock();
        if let Err(error) = self.open(state.closed) {
            return Poll::Ready(Err(error));
        }
        if state.leader.as_ref() == Some(&self.shared.member) {
            return Poll::Ready(Ok(()));
        }
        if !state.leader_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            state.leader_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn request_table(&self) -> Result<u64, LockError> {
        self.with(|state| {
            self.open(state.closed)?;
            state.next_query += 1;
            let query = state.next_query;
            state.reads.insert(
                query,
                Read {
                    ready: false,
                    waker: None,
                },
            );
            let now = state.now();
            state.node.read_table(now, query);
            Ok(query)
        })
    }

    fn poll_table(
        &self,
        query: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GrantorTable, LockError>> {
        let mut state = self.shared.lock();
        if let Err(error) = self.open(state.closed) {
            return Poll::Ready(Err(error));
        }
        let Some(read) = state.reads.get_mut(&query) else {
            return Poll::Ready(Err(LockError::Cancelled));
        };
        if !read.ready {
            read.waker = Some(cx.waker().clone());
            return Poll::Pending;
        }
        state.reads.remove(&query);
        let Some(grantor) = state.leader.clone() else {
            return Poll::Ready(Err(LockError::Unavailable));
        };
        let (locks, truncated) = state.node.locks(self.service.as_ref(), TABLE_LOCKS_MAX);
        Poll::Ready(Ok(GrantorTable::new(
            grantor,
            state.node.term(),
            locks,
            truncated,
        )))
    }

    fn cancel_table(&self, query: u64) {
        let mut state = self.shared.lock();
        state.reads.remove(&query);
        state.node.cancel_read(query);
    }

    fn views(&self) -> BoxStream<'static, View> {
        let (sender, receiver) = async_channel::unbounded();
        let mut state = self.shared.lock();
        if !state.closed {
            if let Some(view) = &state.view {
                let _ = sender.try_send(view.clone());
            }
            state.views.push(sender);
        }
        Box::pin(receiver)
    }

    fn events(&self) -> BoxStream<'static, LockEvent> {
        let (sender, receiver) = async_channel::unbounded();
        let mut state = self.shared.lock();
        if !state.closed && !self.is_destroyed() {
            state
                .listeners
                .entry(self.service.clone())
                .or_default()
                .events
                .push(sender);
        }
        Box::pin(receiver)
    }

    fn on_lock_lost(&self, handler: LostHandler) {
        self.shared
            .lock()
            .listeners
            .entry(self.service.clone())
            .or_default()
            .handlers
            .push(handler);
    }

    fn on_unexpected_lock(&self, handler: UnexpectedHandler) {
        self.shared
            .lock()
            .listeners
            .entry(self.service.clone())
            .or_default()
            .unexpected
            .push(handler);
    }

    fn shutdown(&self) {
        if self.service.is_some() {
            self.with(|state| self.destroy(state));
            return;
        }
        self.with(|state| {
            if state.closed {
                return;
            }
            state.closed = true;
            let now = state.now();
            state.node.leave(now);
            let requests: Vec<RequestId> = state.records.keys().copied().collect();
            for request in requests {
                state.lose(request, LockLostReason::Shutdown);
                state.fail(request, LockError::Shutdown);
            }
            for waker in state.leader_wakers.drain(..) {
                waker.wake();
            }
            for read in state.reads.values_mut() {
                if let Some(waker) = read.waker.take() {
                    waker.wake();
                }
            }
        });
    }

    fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut state = self.shared.lock();
        if state.stopped || self.is_destroyed() {
            Poll::Ready(())
        } else {
            state.closed_wakers.push(cx.waker().clone());
            Poll::Pending
        }
    }

    fn service(&self, name: &ServiceName) -> Result<Arc<dyn LockBackend>, LockError> {
        let mut state = self.shared.lock();
        if state.closed {
            return Err(LockError::Shutdown);
        }
        if let Some(handle) = state.services.get(name) {
            return Ok(handle.clone());
        }
        if state.services.len() >= conclave_protocol::MAX_SERVICES {
            return Err(LockError::TooManyServices);
        }
        let handle = Arc::new(RaftBackend::new(self.shared.clone(), Some(name.clone())));
        state.services.insert(name.clone(), handle.clone());
        Ok(handle)
    }
}
