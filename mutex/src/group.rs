//! The group backend: [`LockBackend`](conclave_lock_api::LockBackend) over the cluster protocol.
//!
//! It runs `conclave-protocol`'s [`Endpoint`](conclave_protocol::Endpoint) (membership, the
//! central grantor, reconciliation, duplicate resolution) over any
//! [`Transport`](conclave_lock_api::Transport), on one driver thread per node
//! ([`crate::driver`]). Its state is [`Inner`] ([`crate::shared`]); this module is where the
//! front end's calls meet it. A [`GroupBackend`] is the node's default lock service or one of
//! its named services: one implementation serves both, the service only choosing which
//! [`Front`](crate::front::Front) and which of the endpoint's lock services a call concerns.
//!
//! A wait busy-polls for as long as [`crate::spin`] says before it sleeps, and while it
//! spins it may read the transport itself ([`crate::duty`]): `poll_grant` and
//! `poll_released` do both, so a grant from another process reaches the waiting task without
//! a thread hop.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use conclave_lock_api::{
    Acquire, ClusterBackend, FencingToken, GrantorTable, HeldLock, LockError, LockEvent,
    LockLostReason, LockName, LockStatus, LostHandler, MemberId, RawLockBackend, RequestId,
    ServiceName, UnexpectedHandler, UnlockError, View,
};
use conclave_protocol::locking::{HoldStatus, LockRequest};
use conclave_protocol::ServiceTransferError;
use futures::stream::BoxStream;

use crate::front::Front;
use crate::shared::{Command, Inner, Phase, Shared, TableQuery};

/// A lock service of a group node as a backend: the default one, or a named one.
pub(crate) struct GroupBackend {
    inner: Arc<Inner>,
    /// `None`: the default service.
    service: Option<Service>,
}

/// Which named service a [`GroupBackend`] is, and which opening of it.
#[derive(Debug)]
struct Service {
    name: ServiceName,
    generation: u64,
}

impl fmt::Debug for GroupBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("member", &self.inner.member)
            .field("service", &self.service.as_ref().map(|s| &s.name))
            .finish()
    }
}

impl GroupBackend {
    /// The default lock service of the node `inner`.
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self {
            inner,
            service: None,
        }
    }

    /// The name of this backend's service (`None`: the default one).
    fn name(&self) -> Option<&ServiceName> {
        self.service.as_ref().map(|s| &s.name)
    }

    /// This service's front state, if it may still be used: `Err(Shutdown)` once the node
    /// stops, `Err(ServiceDestroyed)` once this opening of a named service was destroyed.
    fn front<'a>(&self, shared: &'a mut Shared) -> Result<&'a mut Front, LockError> {
        if shared.phase != Phase::Running {
            return Err(LockError::Shutdown);
        }
        self.own_front(shared).ok_or(LockError::ServiceDestroyed)
    }

    /// This service's front state unless this opening of a named service was destroyed,
    /// whatever the node's phase (listeners and handlers registered while the node shuts
    /// down are told of its losses).
    fn own_front<'a>(&self, shared: &'a mut Shared) -> Option<&'a mut Front> {
        match &self.service {
            None => Some(&mut shared.front),
            Some(service) => shared
                .services
                .get_mut(&service.name)
                .filter(|front| front.is_open(service.generation)),
        }
    }

    /// Destroys this named service on this member (see [`ClusterBackend::service`]).
    fn destroy(&self, service: &Service) {
        let effects = {
            let mut shared = self.inner.lock();
            let Ok(front) = self.front(&mut shared) else {
                return;
            };
            front.destroyed = true;
            let now = self.inner.now();
            shared.endpoint.destroy_service(now, &service.name);
            let effects = shared.settle(now);
            // The losses were told; the service's event streams end here.
            shared.front_mut(Some(&service.name)).close();
            effects
        };
        self.inner.flush(effects);
    }
}

impl RawLockBackend for GroupBackend {
    fn member(&self) -> &MemberId {
        &self.inner.member
    }

    fn new_owner(&self) -> u64 {
        self.inner.next_owner()
    }

    fn created(&self, name: &LockName) {
        if let Some(front) = self.own_front(&mut self.inner.lock()) {
            front.emit(LockEvent::Created { name: name.clone() });
        }
    }

    fn submit(&self, request: Acquire) -> Result<RequestId, LockError> {
        let (id, effects) = {
            let mut shared = self.inner.lock();
            self.front(&mut shared)?;
            let now = self.inner.now();
            let id = shared.register(
                now,
                self.name(),
                LockRequest {
                    owner: request.owner,
                    name: request.name,
                    mode: request.mode,
                    wait: request.wait,
                    timeout: request.timeout,
                    lease: request.lease,
                },
            )?;
            let effects = shared.settle(now);
            shared.start_spin(id, self.name());
            (id, effects)
        };
        self.inner.flush(effects);
        Ok(id)
    }

    fn poll_grant(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<FencingToken, LockError>> {
        let mut pumped = 0;
        loop {
            let mut shared = self.inner.lock();
            let Some(slot) = shared.slots.get_mut(&request) else {
                drop(shared);
                self.inner.duty.release(request);
                return Poll::Ready(Err(LockError::Shutdown));
            };
            let answer = match &slot.outcome {
                Some(Ok(token)) => Ok(*token),
                Some(Err(error)) => Err(error.clone()),
                None => {
                    let until = slot.spin_until;
                    drop(shared);
                    match self.inner.spin(request, until, &mut pumped, cx) {
                        Some(true) => continue,
                        Some(false) => return Poll::Pending,
                        None => {}
                    }
                    let mut shared = self.inner.lock();
                    let Some(slot) = shared.slots.get_mut(&request) else {
                        continue;
                    };
                    if slot.outcome.is_some() {
                        continue;
                    }
                    slot.spin_until = None;
                    slot.register(cx.waker());
                    drop(shared);
                    self.inner.duty.release(request);
                    return Poll::Pending;
                }
            };
            if answer.is_err() {
                shared.slots.remove(&request);
            }
            drop(shared);
            self.inner.duty.release(request);
            return Poll::Ready(answer);
        }
    }

    fn cancel(&self, request: RequestId) {
        self.inner.duty.release(request);
        let effects = {
            let mut shared = self.inner.lock();
            if !shared.slots.contains_key(&request) {
                return;
            }
            let now = self.inner.now();
            shared.withdraw(now, request);
            shared.settle(now)
        };
        self.inner.flush(effects);
    }

    fn release(&self, request: RequestId) -> Result<(), UnlockError> {
        let (result, effects) = {
            let mut shared = self.inner.lock();
            let now = self.inner.now();
            let lost = shared.slots.get(&request).and_then(|s| s.lost);
            let result = match (lost, shared.endpoint.unlock(now, request)) {
                (Some(reason), _) => Err(UnlockError::Lost(reason)),
                (None, Ok(())) => {
                    shared.emit_unlocked(request);
                    Ok(())
                }
                (None, Err(_)) if shared.phase != Phase::Running => Err(UnlockError::Shutdown),
                (None, Err(_)) => Err(UnlockError::Lost(LockLostReason::Shutdown)),
            };
            match (&result, shared.slots.get_mut(&request)) {
                (Ok(()), Some(slot)) => slot.releasing = true,
                (Err(_), Some(_)) => {
                    shared.slots.remove(&request);
                }
                (_, None) => {}
            }
            let effects = shared.settle(now);
            shared.start_release_spin(request);
            (result, effects)
        };
        self.inner.flush(effects);
        result
    }

    fn extend_lease(&self, request: RequestId, lease: Duration) -> Result<(), UnlockError> {
        let (result, effects) = {
            let mut shared = self.inner.lock();
            if shared.phase != Phase::Running {
                return Err(UnlockError::Shutdown);
            }
            let now = self.inner.now();
            let lost = shared.slots.get(&request).and_then(|s| s.lost);
            let result = match (lost, shared.endpoint.extend_lease(now, request, lease)) {
                (Some(reason), _) => Err(UnlockError::Lost(reason)),
                (None, Ok(())) => Ok(()),
                (None, Err(_)) => Err(UnlockError::Lost(LockLostReason::LeaseExpired)),
            };
            (result, shared.settle(now))
        };
        self.inner.flush(effects);
        result
    }

    fn poll_released(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UnlockError>> {
        let mut pumped = 0;
        loop {
            let mut shared = self.inner.lock();
            let closed = shared.phase == Phase::Closed;
            let hopeless = shared.in_minority();
            let answer = match shared.slots.get_mut(&request) {
                Some(slot) if slot.released => Ok(()),
                // No grantor answers a minority until the partition heals: say so now, as a
                // lock request there is answered `NotMember` at once.
                Some(_) if hopeless && !closed => Err(UnlockError::Unacknowledged),
                Some(_) if !closed => {
                    let until = shared.slots.get(&request).and_then(|s| s.spin_until);
                    drop(shared);
                    match self.inner.spin(request, until, &mut pumped, cx) {
                        Some(true) => continue,
                        Some(false) => return Poll::Pending,
                        None => {}
                    }
                    let mut shared = self.inner.lock();
                    match shared.slots.get_mut(&request) {
                        Some(slot) if !slot.released => {
                            slot.spin_until = None;
                            slot.register(cx.waker());
                        }
                        _ => continue,
                    }
                    drop(shared);
                    self.inner.duty.release(request);
                    return Poll::Pending;
                }
                _ => Err(UnlockError::Shutdown),
            };
            shared.slots.remove(&request);
            drop(shared);
            self.inner.duty.release(request);
            return Poll::Ready(answer);
        }
    }

    fn answer_bound(&self) -> Option<Duration> {
        Some(self.inner.answer_bound)
    }

    fn status(&self, request: RequestId) -> LockStatus {
        let shared = self.inner.lock();
        if shared.phase != Phase::Running
            || shared
                .slots
                .get(&request)
                .is_none_or(|s| s.lost.is_some() || s.releasing)
        {
            return LockStatus::Lost;
        }
        match shared.endpoint.lock_status(self.inner.now(), request) {
            Some(HoldStatus::Held) => LockStatus::Held,
            Some(HoldStatus::Suspended) => LockStatus::Suspended,
            Some(HoldStatus::Lost) | None => LockStatus::Lost,
        }
    }

    fn lost_reason(&self, request: RequestId) -> Option<LockLostReason> {
        if self.status(request) != LockStatus::Lost {
            return None;
        }
        let shared = self.inner.lock();
        let slot = shared.slots.get(&request)?;
        match slot.lost {
            Some(reason) => Some(reason),
            None if slot.releasing => None,
            None if shared.phase != Phase::Running => Some(LockLostReason::Shutdown),
            // The lease ran out on this node's clock; the notice is on its way.
            None => Some(LockLostReason::LeaseExpired),
        }
    }

    fn poll_lost(&self, request: RequestId, cx: &mut Context<'_>) -> Poll<LockLostReason> {
        let mut shared = self.inner.lock();
        let closed = shared.phase == Phase::Closed;
        match shared.slots.get_mut(&request) {
            Some(slot) => match slot.lost {
                Some(reason) => Poll::Ready(reason),
                None if slot.releasing => Poll::Pending,
                None if closed => Poll::Ready(LockLostReason::Shutdown),
                None => {
                    slot.register(cx.waker());
                    Poll::Pending
                }
            },
            // The hold ended (released, or its loss already reported to whoever released
            // it): it was not lost while held, so this never resolves.
            None => Poll::Pending,
        }
    }

    fn holds(&self) -> Vec<HeldLock> {
        let mut shared = self.inner.lock();
        if self.own_front(&mut shared).is_none() {
            return Vec::new();
        }
        let now = self.inner.now();
        let holds = match self.name() {
            None => shared.endpoint.holds(now),
            Some(name) => shared.endpoint.service_holds(now, name),
        };
        holds
            .into_iter()
            .map(|h| {
                let status = match h.status {
                    HoldStatus::Held => LockStatus::Held,
                    HoldStatus::Suspended => LockStatus::Suspended,
                    HoldStatus::Lost => LockStatus::Lost,
                };
                HeldLock::new(h.name, shared.owner_id(h.owner), h.mode, h.token, status)
            })
            .collect()
    }

    fn pending_requests(&self) -> usize {
        let mut shared = self.inner.lock();
        if self.own_front(&mut shared).is_none() {
            return 0;
        }
        let locks = match self.name() {
            None => Some(shared.endpoint.locks()),
            Some(name) => shared.endpoint.service(name),
        };
        locks.map_or(0, |l| l.pending_requests().len())
    }
}

impl ClusterBackend for GroupBackend {
    fn view(&self) -> Option<View> {
        let shared = self.inner.lock();
        if shared.phase == Phase::Running {
            shared.view.clone()
        } else {
            None
        }
    }

    fn serving_grantor(&self) -> Option<MemberId> {
        let mut shared = self.inner.lock();
        self.front(&mut shared).ok()?.serving_grantor.clone()
    }

    fn poll_serving_grantor(&self, cx: &mut Context<'_>) -> Poll<Option<MemberId>> {
        let mut shared = self.inner.lock();
        let Ok(front) = self.front(&mut shared) else {
            return Poll::Ready(None);
        };
        if let Some(grantor) = &front.serving_grantor {
            return Poll::Ready(Some(grantor.clone()));
        }
        if !front.serving_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            front.serving_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn become_grantor(&self) -> Result<(), LockError> {
        let effects = {
            let mut shared = self.inner.lock();
            self.front(&mut shared)?;
            let now = self.inner.now();
            let asked = match self.name() {
                None => shared.endpoint.become_grantor(now).map_err(Into::into),
                Some(name) => shared.endpoint.become_grantor_in(now, name),
            };
            asked.map_err(|error| match error {
                ServiceTransferError::TooManyServices(_) => LockError::TooManyServices,
                _ => LockError::TransferRefused,
            })?;
            shared.settle(now)
        };
        self.inner.flush(effects);
        Ok(())
    }

    fn poll_is_grantor(&self, cx: &mut Context<'_>) -> Poll<Result<(), LockError>> {
        let mut shared = self.inner.lock();
        let local = shared.endpoint.local().clone();
        let front = match self.front(&mut shared) {
            Ok(front) => front,
            Err(error) => return Poll::Ready(Err(error)),
        };
        if front.serving_grantor.as_ref() == Some(&local) {
            return Poll::Ready(Ok(()));
        }
        if !front.grantor_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            front.grantor_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn request_table(&self) -> Result<u64, LockError> {
        let (query, effects) = {
            let mut shared = self.inner.lock();
            self.front(&mut shared)?;
            let now = self.inner.now();
            // Registered before the endpoint can answer (it answers at once when this member
            // is the grantor).
            let locks = match self.name() {
                None => Some(shared.endpoint.locks()),
                Some(name) => shared.endpoint.service(name),
            };
            let query = locks.ok_or(LockError::TooManyServices)?.next_query();
            shared.tables.insert(query, TableQuery::default());
            let asked = match self.name() {
                None => Ok(shared.endpoint.query_table(now)),
                Some(name) => shared.endpoint.query_table_in(now, name),
            };
            if asked != Ok(query) {
                shared.tables.remove(&query);
                return Err(LockError::TooManyServices);
            }
            (query, shared.settle(now))
        };
        self.inner.flush(effects);
        Ok(query)
    }

    fn poll_table(
        &self,
        query: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GrantorTable, LockError>> {
        let mut shared = self.inner.lock();
        let Some(waiting) = shared.tables.get_mut(&query) else {
            return Poll::Ready(Err(LockError::Shutdown));
        };
        if let Some(answer) = waiting.answer.take() {
            shared.tables.remove(&query);
            return Poll::Ready(answer);
        }
        if !waiting.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            waiting.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn cancel_table(&self, query: u64) {
        self.inner.lock().tables.remove(&query);
    }

    fn views(&self) -> BoxStream<'static, View> {
        Box::pin(self.inner.lock().subscribe_views())
    }

    fn events(&self) -> BoxStream<'static, LockEvent> {
        let mut shared = self.inner.lock();
        let closed = shared.phase == Phase::Closed;
        let events = match self.own_front(&mut shared) {
            Some(front) if !closed => front.subscribe(false),
            _ => Front::default().subscribe(true),
        };
        Box::pin(events)
    }

    fn on_lock_lost(&self, handler: LostHandler) {
        if let Some(front) = self.own_front(&mut self.inner.lock()) {
            front.handlers.push(handler);
        }
    }

    fn on_unexpected_lock(&self, handler: UnexpectedHandler) {
        if let Some(front) = self.own_front(&mut self.inner.lock()) {
            front.unexpected_handlers.push(handler);
        }
    }

    fn shutdown(&self) {
        match &self.service {
            None => self.inner.command(Command::Shutdown),
            Some(service) => self.destroy(service),
        }
    }

    fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(service) = &self.service {
            // Destroyed once this opening is over and the grantor has every release.
            let mut shared = self.inner.lock();
            if shared.phase == Phase::Closed {
                return Poll::Ready(());
            }
            let releasing = shared
                .endpoint
                .service(&service.name)
                .map_or(0, |s| s.pending_releases());
            let Some(front) = shared.services.get_mut(&service.name) else {
                return Poll::Ready(());
            };
            if front.generation != service.generation || (front.destroyed && releasing == 0) {
                return Poll::Ready(());
            }
            if !front.destroy_wakers.iter().any(|w| w.will_wake(cx.waker())) {
                front.destroy_wakers.push(cx.waker().clone());
            }
            return Poll::Pending;
        }
        {
            // Register under the state lock: the driver marks the node closed under it and
            // wakes after, so the wake-up cannot slip between check and register.
            let mut shared = self.inner.lock();
            if shared.phase != Phase::Closed {
                if !shared.closed_wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    shared.closed_wakers.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        let thread = self
            .inner
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            // Dropped by a handler running on the driver thread itself: nothing to wait for.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!(member = %self.inner.member, "driver thread panicked");
            }
        }
        Poll::Ready(())
    }

    fn service(
        &self,
        name: &ServiceName,
    ) -> Result<Arc<dyn conclave_lock_api::LockBackend>, LockError> {
        let (generation, effects) = {
            let mut shared = self.inner.lock();
            if shared.phase != Phase::Running {
                return Err(LockError::Shutdown);
            }
            let now = self.inner.now();
            shared
                .endpoint
                .open_service(now, name)
                .map_err(|_| LockError::TooManyServices)?;
            let front = shared.front_mut(Some(name));
            if front.destroyed {
                front.reopen();
            }
            let generation = front.generation;
            (generation, shared.settle(now))
        };
        self.inner.flush(effects);
        Ok(Arc::new(GroupBackend {
            inner: self.inner.clone(),
            service: Some(Service {
                name: name.clone(),
                generation,
            }),
        }))
    }
}
