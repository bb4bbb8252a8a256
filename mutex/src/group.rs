//! The group backend: [`LockBackend`] over the cluster protocol.
//!
//! It runs `conclave-protocol`'s [`Endpoint`](conclave_protocol::Endpoint) (membership, the
//! central grantor, reconciliation, duplicate resolution) over any
//! [`Transport`](conclave_lock_api::Transport), on one driver thread per node
//! ([`crate::driver`]). Its state is [`Inner`] ([`crate::shared`]); this module is where the
//! front end's calls meet it.
//!
//! A wait busy-polls for [`crate::NodeBuilder::spin_wait`] before it sleeps, and while it
//! spins it may read the transport itself ([`crate::duty`]): `poll_grant` and
//! `poll_released` do both, so a grant from another process reaches the waiting task without
//! a thread hop.

use std::task::{Context, Poll};
use std::time::Duration;

use conclave_lock_api::{
    Acquire, FencingToken, GrantorTable, HeldLock, LockBackend, LockError, LockEvent,
    LockLostReason, LockName, LockStatus, LostHandler, MemberId, RequestId, UnexpectedHandler,
    UnlockError, View,
};
use conclave_protocol::locking::{HoldStatus, LockRequest};
use futures::stream::BoxStream;

use crate::shared::{Command, Inner, Phase, TableQuery};

/// The most datagrams a spinning wait handles in one poll before it yields.
const PUMP_LIMIT: usize = 64;

/// Whether a wait still busy-polls (until `until`). A spinning wait asks to be polled again
/// at once, so its task yields to the executor between polls.
fn spinning(until: Option<std::time::Instant>) -> bool {
    until.is_some_and(|until| std::time::Instant::now() < until)
}

impl Inner {
    /// Spins for the answer to `request` if its wait still may: reads the transport if it
    /// can, else asks to be polled again. Returns `Some` with the poll's answer while
    /// spinning, `None` once the wait should sleep; `pumped` counts datagrams read so far.
    fn spin(
        &self,
        request: RequestId,
        until: Option<std::time::Instant>,
        pumped: &mut usize,
        cx: &mut Context<'_>,
    ) -> Option<bool> {
        if !spinning(until) {
            return None;
        }
        if *pumped < PUMP_LIMIT && until.is_some_and(|until| self.receive_inline(request, until)) {
            *pumped += 1;
            return Some(true); // look again
        }
        cx.waker().wake_by_ref();
        Some(false)
    }
}

impl LockBackend for Inner {
    fn member(&self) -> &MemberId {
        &self.member
    }

    fn new_owner(&self) -> u64 {
        self.lock().next_owner()
    }

    fn created(&self, name: &LockName) {
        self.lock().emit(LockEvent::Created { name: name.clone() });
    }

    fn submit(&self, request: Acquire) -> Result<RequestId, LockError> {
        let (id, effects) = {
            let mut shared = self.lock();
            if shared.phase != Phase::Running {
                return Err(LockError::Shutdown);
            }
            let now = self.now();
            let id = shared.register(
                now,
                LockRequest {
                    owner: request.owner,
                    name: request.name,
                    mode: request.mode,
                    wait: request.wait,
                    timeout: request.timeout,
                    lease: request.lease,
                },
            );
            shared.start_spin(id, self.spin_deadline());
            (id, shared.settle(now))
        };
        self.flush(effects);
        Ok(id)
    }

    fn poll_grant(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<FencingToken, LockError>> {
        let mut pumped = 0;
        loop {
            let mut shared = self.lock();
            let Some(slot) = shared.slots.get_mut(&request) else {
                drop(shared);
                self.duty.release(request);
                return Poll::Ready(Err(LockError::Shutdown));
            };
            let answer = match &slot.outcome {
                Some(Ok(token)) => Ok(*token),
                Some(Err(error)) => Err(error.clone()),
                None => {
                    let until = slot.spin_until;
                    drop(shared);
                    match self.spin(request, until, &mut pumped, cx) {
                        Some(true) => continue,
                        Some(false) => return Poll::Pending,
                        None => {}
                    }
                    let mut shared = self.lock();
                    let Some(slot) = shared.slots.get_mut(&request) else {
                        continue;
                    };
                    if slot.outcome.is_some() {
                        continue;
                    }
                    slot.spin_until = None;
                    slot.register(cx.waker());
                    drop(shared);
                    self.duty.release(request);
                    return Poll::Pending;
                }
            };
            if answer.is_err() {
                shared.slots.remove(&request);
            }
            drop(shared);
            self.duty.release(request);
            return Poll::Ready(answer);
        }
    }

    fn cancel(&self, request: RequestId) {
        self.duty.release(request);
        let effects = {
            let mut shared = self.lock();
            if !shared.slots.contains_key(&request) {
                return;
            }
            let now = self.now();
            shared.withdraw(now, request);
            shared.settle(now)
        };
        self.flush(effects);
    }

    fn release(&self, request: RequestId) -> Result<(), UnlockError> {
        let (result, effects) = {
            let mut shared = self.lock();
            let now = self.now();
            let lost = shared.slots.get(&request).and_then(|s| s.lost);
            let result = match (lost, shared.endpoint.unlock(now, request)) {
                (Some(reason), _) => Err(UnlockError::Lost(reason)),
                (None, Ok(())) => {
                    if let Some(slot) = shared.slots.get(&request) {
                        let (name, owner) = (slot.name.clone(), slot.owner);
                        let owner = shared.owner_id(owner);
                        shared.emit(LockEvent::Unlocked { name, owner });
                    }
                    Ok(())
                }
                (None, Err(_)) if shared.phase != Phase::Running => Err(UnlockError::Shutdown),
                (None, Err(_)) => Err(UnlockError::Lost(LockLostReason::Shutdown)),
            };
            match (&result, shared.slots.get_mut(&request)) {
                (Ok(()), Some(slot)) => {
                    slot.releasing = true;
                    slot.spin_until = self.spin_deadline();
                }
                (Err(_), Some(_)) => {
                    shared.slots.remove(&request);
                }
                (_, None) => {}
            }
            (result, shared.settle(now))
        };
        self.flush(effects);
        result
    }

    fn extend_lease(&self, request: RequestId, lease: Duration) -> Result<(), UnlockError> {
        let (result, effects) = {
            let mut shared = self.lock();
            if shared.phase != Phase::Running {
                return Err(UnlockError::Shutdown);
            }
            let now = self.now();
            let lost = shared.slots.get(&request).and_then(|s| s.lost);
            let result = match (lost, shared.endpoint.extend_lease(now, request, lease)) {
                (Some(reason), _) => Err(UnlockError::Lost(reason)),
                (None, Ok(())) => Ok(()),
                (None, Err(_)) => Err(UnlockError::Lost(LockLostReason::LeaseExpired)),
            };
            (result, shared.settle(now))
        };
        self.flush(effects);
        result
    }

    fn poll_released(
        &self,
        request: RequestId,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), UnlockError>> {
        let mut pumped = 0;
        loop {
            let mut shared = self.lock();
            let closed = shared.phase == Phase::Closed;
            let answer = match shared.slots.get_mut(&request) {
                Some(slot) if slot.released => Ok(()),
                Some(_) if !closed => {
                    let until = shared.slots.get(&request).and_then(|s| s.spin_until);
                    drop(shared);
                    match self.spin(request, until, &mut pumped, cx) {
                        Some(true) => continue,
                        Some(false) => return Poll::Pending,
                        None => {}
                    }
                    let mut shared = self.lock();
                    match shared.slots.get_mut(&request) {
                        Some(slot) if !slot.released => {
                            slot.spin_until = None;
                            slot.register(cx.waker());
                        }
                        _ => continue,
                    }
                    drop(shared);
                    self.duty.release(request);
                    return Poll::Pending;
                }
                _ => Err(UnlockError::Shutdown),
            };
            shared.slots.remove(&request);
            drop(shared);
            self.duty.release(request);
            return Poll::Ready(answer);
        }
    }

    fn status(&self, request: RequestId) -> LockStatus {
        let shared = self.lock();
        if shared.phase != Phase::Running
            || shared
                .slots
                .get(&request)
                .is_none_or(|s| s.lost.is_some() || s.releasing)
        {
            return LockStatus::Lost;
        }
        match shared.endpoint.lock_status(self.now(), request) {
            Some(HoldStatus::Held) => LockStatus::Held,
            Some(HoldStatus::Suspended) => LockStatus::Suspended,
            Some(HoldStatus::Lost) | None => LockStatus::Lost,
        }
    }

    fn lost_reason(&self, request: RequestId) -> Option<LockLostReason> {
        if self.status(request) != LockStatus::Lost {
            return None;
        }
        let shared = self.lock();
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
        let mut shared = self.lock();
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

    fn view(&self) -> Option<View> {
        let shared = self.lock();
        if shared.phase == Phase::Running {
            shared.view.clone()
        } else {
            None
        }
    }

    fn serving_grantor(&self) -> Option<MemberId> {
        let shared = self.lock();
        if shared.phase == Phase::Running {
            shared.serving_grantor.clone()
        } else {
            None
        }
    }

    fn poll_serving_grantor(&self, cx: &mut Context<'_>) -> Poll<Option<MemberId>> {
        let mut shared = self.lock();
        if shared.phase != Phase::Running {
            return Poll::Ready(None);
        }
        if let Some(grantor) = &shared.serving_grantor {
            return Poll::Ready(Some(grantor.clone()));
        }
        if !shared
            .serving_wakers
            .iter()
            .any(|w| w.will_wake(cx.waker()))
        {
            shared.serving_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn become_grantor(&self) -> Result<(), LockError> {
        let effects = {
            let mut shared = self.lock();
            if shared.phase != Phase::Running {
                return Err(LockError::Shutdown);
            }
            let now = self.now();
            shared
                .endpoint
                .become_grantor(now)
                .map_err(|_| LockError::TransferRefused)?;
            shared.settle(now)
        };
        self.flush(effects);
        Ok(())
    }

    fn poll_is_grantor(&self, cx: &mut Context<'_>) -> Poll<Result<(), LockError>> {
        let mut shared = self.lock();
        if shared.phase != Phase::Running {
            return Poll::Ready(Err(LockError::Shutdown));
        }
        if shared.serving_grantor.as_ref() == Some(shared.endpoint.local()) {
            return Poll::Ready(Ok(()));
        }
        if !shared
            .grantor_wakers
            .iter()
            .any(|w| w.will_wake(cx.waker()))
        {
            shared.grantor_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    fn request_table(&self) -> Result<u64, LockError> {
        let (query, effects) = {
            let mut shared = self.lock();
            if shared.phase != Phase::Running {
                return Err(LockError::Shutdown);
            }
            let now = self.now();
            // Registered before the endpoint can answer (it answers at once when this member
            // is the grantor).
            let query = shared.endpoint.locks().next_query();
            shared.tables.insert(query, TableQuery::default());
            let asked = shared.endpoint.query_table(now);
            debug_assert_eq!(asked, query);
            (query, shared.settle(now))
        };
        self.flush(effects);
        Ok(query)
    }

    fn poll_table(
        &self,
        query: u64,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GrantorTable, LockError>> {
        let mut shared = self.lock();
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
        self.lock().tables.remove(&query);
    }

    fn views(&self) -> BoxStream<'static, View> {
        Box::pin(self.lock().subscribe_views())
    }

    fn events(&self) -> BoxStream<'static, LockEvent> {
        Box::pin(self.lock().subscribe_events())
    }

    fn on_lock_lost(&self, handler: LostHandler) {
        self.lock().handlers.push(handler);
    }

    fn on_unexpected_lock(&self, handler: UnexpectedHandler) {
        self.lock().unexpected_handlers.push(handler);
    }

    fn holds(&self) -> Vec<HeldLock> {
        let shared = self.lock();
        let now = self.now();
        shared
            .endpoint
            .holds(now)
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
        self.lock().endpoint.locks().pending_requests().len()
    }

    fn shutdown(&self) {
        self.command(Command::Shutdown);
    }

    fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        {
            // Register under the state lock: the driver marks the node closed under it and
            // wakes after, so the wake-up cannot slip between check and register.
            let mut shared = self.lock();
            if shared.phase != Phase::Closed {
                if !shared.closed_wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    shared.closed_wakers.push(cx.waker().clone());
                }
                return Poll::Pending;
            }
        }
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            // Dropped by a handler running on the driver thread itself: nothing to wait for.
            if thread.thread().id() != std::thread::current().id() && thread.join().is_err() {
                tracing::error!(member = %self.member, "driver thread panicked");
            }
        }
        Poll::Ready(())
    }
}
