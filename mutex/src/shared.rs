//! The state a node shares between its driver thread and its users' tasks.
//!
//! One `std::sync::Mutex` guards the [`Endpoint`] and the table of requests the front end
//! waits on. It is never held across an `.await`. Whoever calls into the endpoint (a user's
//! task registering a lock, a guard's `Drop`, the driver thread) then calls
//! [`Shared::settle`]: it turns the endpoint's events into completed waiters (notified at
//! once, so a grant reaches the waiting task without passing through the driver), and
//! returns the datagrams to send, which [`Inner::flush`] hands to the transport from the
//! caller's own thread.

use std::collections::BTreeMap;
use std::task::Waker;

use async_channel::Sender;
use conclave_lock_api::{
    FencingToken, LockError, LockEvent, LockLost, LockLostReason, OwnerId, RequestId, ServiceName,
    UnexpectedGrant, UnexpectedLock, View,
};
use conclave_protocol::locking::{LockNotice, Refusal};
use conclave_protocol::{Endpoint, EndpointEvent, Instant};
use tracing::{debug, trace, warn};

use crate::contention::Contention;
use crate::durable::TermFile;
use crate::front::Front;
use crate::spin::SpinBudget;

pub(crate) use crate::effects::Effects;
pub(crate) use crate::inner::{Command, Inner};
pub(crate) use crate::slot::{Slot, TableQuery};

/// Where a node is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Joining or joined: requests are accepted.
    Running,
    /// Shutting down: locks released, leaving; new requests fail with `Shutdown`.
    Closing,
    /// The driver thread has stopped.
    Closed,
}

/// The state behind the node's mutex.
pub(crate) struct Shared {
    pub(crate) endpoint: Endpoint,
    pub(crate) phase: Phase,
    pub(crate) view: Option<View>,
    /// Why the join has not succeeded, as the protocol last reported it (until a view).
    pub(crate) join_problem: Option<conclave_protocol::gms::JoinProblem>,
    pub(crate) slots: BTreeMap<RequestId, Slot>,
    /// The deadline the driver's timer is armed for.
    pub(crate) armed: Option<Instant>,
    view_subscribers: Vec<Sender<View>>,
    /// The default lock service's listeners, handlers and serving grantor.
    pub(crate) front: Front,
    /// The same for each named lock service this member opened or heard of.
    pub(crate) services: BTreeMap<ServiceName, Front>,
    /// The unexpected grants reported lately, so that resent copies are reported once.
    reported: std::collections::VecDeque<(RequestId, FencingToken)>,
    /// Woken when the driver has stopped.
    pub(crate) closed_wakers: Vec<Waker>,
    /// Table queries: the answer once it came, and who waits for it.
    pub(crate) tables: BTreeMap<u64, TableQuery>,
    /// The data directory's promised-term file, if the node has one.
    pub(crate) durable: Option<TermFile>,
    /// A promised term not yet on disk (a write failed): nothing is sent until it is.
    unsaved: Option<u64>,
    /// The locks contended here, whose waiters sleep instead of spinning.
    contention: Contention,
    /// How long waits spin, learnt from their round trips.
    spin: SpinBudget,
}

impl Shared {
    pub(crate) fn new(endpoint: Endpoint, spin_wait: std::time::Duration) -> Self {
        Self {
            endpoint,
            phase: Phase::Running,
            view: None,
            join_problem: None,
            slots: BTreeMap::new(),
            armed: None,
            view_subscribers: Vec::new(),
            front: Front::default(),
            services: BTreeMap::new(),
            reported: std::collections::VecDeque::new(),
            closed_wakers: Vec::new(),
            durable: None,
            unsaved: None,
            tables: BTreeMap::new(),
            contention: Contention::default(),
            spin: SpinBudget::new(spin_wait),
        }
    }

    /// Whether this member is in a view that cannot grant (a minority under `Majority`):
    /// nothing it sends to a grantor is answered until the partition heals.
    pub(crate) fn in_minority(&self) -> bool {
        let policy = &self.endpoint.locks().config().policy;
        self.view
            .as_ref()
            .is_some_and(|view| !policy.allows(view.len()))
    }

    pub(crate) fn owner_id(&self, local: u64) -> OwnerId {
        OwnerId {
            member: self.endpoint.local().clone(),
            local,
        }
    }

    /// Registers a lock request in the endpoint (in the named service `service`, or the
    /// default one) and in the table of waiters.
    pub(crate) fn register(
        &mut self,
        now: Instant,
        service: Option<&ServiceName>,
        request: conclave_protocol::locking::LockRequest,
    ) -> Result<RequestId, LockError> {
        let (name, owner, mode) = (request.name.clone(), request.owner, request.mode);
        // A wait for a lock known contended here, that nobody watches, does not need the
        // grantor's `Queued` (see `crate::contention`).
        let listened = self.front_mut(service).is_listened();
        let quiet = self
            .contention
            .wants_quiet(service, &name, request.wait, listened);
        let id = match (service, quiet) {
            (_, true) => self.endpoint.lock_quiet(now, service, request),
            (None, false) => Ok(self.endpoint.lock(now, request)),
            (Some(service), false) => self.endpoint.lock_in(now, service, request),
        }
        .map_err(|_| LockError::TooManyServices)?;
        self.slots.insert(id, Slot::new(name, owner, mode, quiet));
        Ok(id)
    }

    /// Starts the spin of `request`'s wait (in the named service `service`, or the default
    /// one), for as long as [`SpinBudget`] says, unless it was answered already, the grantor
    /// queued it, it is quiet, or its lock is contended here (see [`crate::contention`]).
    pub(crate) fn start_spin(&mut self, request: RequestId, service: Option<&ServiceName>) {
        if let Some(slot) = self.slots.get_mut(&request) {
            if slot.outcome.is_none()
                && !slot.queued()
                && !slot.quiet()
                && !self.contention.is_contended(service, &slot.name)
            {
                slot.begin_round_trip(&mut self.spin);
            }
        }
    }

    /// Starts the spin of a wait for the acknowledgement of `request`'s release, unless it
    /// came already (a release at this member's own grantor is acknowledged at once).
    pub(crate) fn start_release_spin(&mut self, request: RequestId) {
        if let Some(slot) = self.slots.get_mut(&request) {
            if slot.releasing && !slot.released {
                slot.begin_round_trip(&mut self.spin);
            }
        }
    }

    /// Forgets `request`: withdraws it if it waits, releases its hold without waiting if it
    /// holds (a dropped guard, or a grant that raced a dropped future), stops tracking its
    /// release if one was started.
    pub(crate) fn withdraw(&mut self, now: Instant, request: RequestId) {
        let Some(slot) = self.slots.remove(&request) else {
            return;
        };
        match slot.outcome {
            Some(Ok(_)) if slot.releasing => {}
            Some(Ok(_)) => self.release_dropped(now, request, &slot),
            Some(Err(_)) => {}
            None => self.endpoint.cancel(now, request),
        }
    }

    /// Releases the hold of a guard dropped (or a grant nobody waits for any more): nobody
    /// waits for the acknowledgement, so the release is lazy.
    fn release_dropped(&mut self, now: Instant, request: RequestId, slot: &Slot) {
        if self.endpoint.unlock_lazy(now, request).is_ok() {
            self.emit_unlocked_of(request, slot);
        }
    }

    /// Emits `Unlocked` for the release of `request`, whose slot is in the table, to its
    /// service's listeners.
    pub(crate) fn emit_unlocked(&mut self, request: RequestId) {
        let service = self.endpoint.service_of(request.0).cloned();
        if !self.front_mut(service.as_ref()).is_listened() {
            return;
        }
        let Some(event) = self.slots.get(&request).map(|slot| LockEvent::Unlocked {
            name: slot.name.clone(),
            owner: self.owner_id(slot.owner),
        }) else {
            return;
        };
        self.front_mut(service.as_ref()).emit(event);
    }

    /// Emits `Unlocked` for the release of `request`, whose slot was `slot`.
    fn emit_unlocked_of(&mut self, request: RequestId, slot: &Slot) {
        let service = self.endpoint.service_of(request.0).cloned();
        let owner = self.owner_id(slot.owner);
        self.front_mut(service.as_ref())
            .emit_with(|| LockEvent::Unlocked {
                name: slot.name.clone(),
                owner,
            });
    }

    /// The front state of the named service `service`, or of the default one (made for a
    /// named service heard of for the first time).
    pub(crate) fn front_mut(&mut self, service: Option<&ServiceName>) -> &mut Front {
        match service {
            None => &mut self.front,
            Some(name) => {
                let endpoint = &self.endpoint;
                self.services.entry(name.clone()).or_insert_with(|| {
                    let locks = endpoint.service(name);
                    Front::serving(locks.and_then(|s| s.serving_grantor().cloned()))
                })
            }
        }
    }

    pub(crate) fn subscribe_views(&mut self) -> async_channel::Receiver<View> {
        let (sender, receiver) = async_channel::unbounded();
        if let Some(view) = &self.view {
            let _ = sender.try_send(view.clone());
        }
        if self.phase != Phase::Closed {
            self.view_subscribers.push(sender);
        }
        receiver
    }

    /// Processes the endpoint's events and collects its datagrams. Call after every call into
    /// the endpoint, then pass the result to [`Inner::flush`] once the lock is released.
    pub(crate) fn settle(&mut self, now: Instant) -> Effects {
        let mut effects = Effects::default();
        while let Some(event) = self.endpoint.poll_event() {
            match event {
                EndpointEvent::ViewInstalled { view, origin } => {
                    debug!(member = %self.endpoint.local(), %view, ?origin, "view installed");
                    self.view_subscribers
                        .retain(|s| s.try_send(view.clone()).is_ok());
                    self.view = Some(view);
                    effects.node_changed = true;
                    if self.in_minority() {
                        // No acknowledgement comes to a minority: its unlocks end now.
                        for slot in self.slots.values_mut().filter(|s| s.releasing) {
                            slot.wake_later(&mut effects);
                        }
                    }
                }
                EndpointEvent::Left => {
                    debug!(member = %self.endpoint.local(), "left the cluster");
                    effects.node_changed = true;
                }
                EndpointEvent::JoinProblem(problem) => {
                    debug!(member = %self.endpoint.local(), %problem, "join problem");
                    self.join_problem = Some(problem);
                    effects.node_changed = true;
                }
                EndpointEvent::Lock(notice) => {
                    self.handle_notice(now, None, notice, &mut effects);
                }
                EndpointEvent::ServiceLock { service, notice } => {
                    self.handle_notice(now, Some(&service), notice, &mut effects);
                    let front = self.front_mut(Some(&service));
                    if front.destroyed {
                        front.wake_destroy();
                    }
                }
                // An event of a newer protocol crate this front end does not know yet.
                other => trace!(member = %self.endpoint.local(), ?other, "event ignored"),
            }
        }
        if self.persist_promises() {
            effects.transmits = std::iter::from_fn(|| self.endpoint.poll_transmit()).collect();
        } else {
            // The promise is not on disk: sending what follows it would break the guarantee
            // that tokens never go back. The protocol retransmits once the disk takes it.
            while self.endpoint.poll_transmit().is_some() {}
        }
        let deadline = self.endpoint.poll_timeout();
        effects.wake_driver = match (deadline, self.armed) {
            (Some(new), Some(armed)) => new < armed,
            (Some(_), None) => true,
            (None, _) => false,
        };
        effects
    }

    /// Writes the term the endpoint just promised to the data directory, under the state lock
    /// (so nothing that follows the promise can leave first). Returns whether the disk is up
    /// to date, so that the datagrams may go.
    fn persist_promises(&mut self) -> bool {
        let promised = self.endpoint.poll_durable_term();
        let Some(file) = self.durable.as_mut() else {
            return true;
        };
        self.unsaved = self.unsaved.max(promised);
        let Some(term) = self.unsaved else {
            return true;
        };
        match file.store(term) {
            Ok(()) => {
                self.unsaved = None;
                true
            }
            Err(error) => {
                tracing::error!(%error, term, "cannot write the promised term to the data directory; sending nothing until it can");
                false
            }
        }
    }

    /// Acts on a notice of the named service `service` (`None`: the default one).
    fn handle_notice(
        &mut self,
        now: Instant,
        service: Option<&ServiceName>,
        notice: LockNotice,
        effects: &mut Effects,
    ) {
        match notice {
            LockNotice::Granted {
                request,
                name,
                owner,
                mode,
                token,
            } => match self.slots.get_mut(&request) {
                Some(slot) if slot.outcome.is_none() => {
                    self.contention
                        .granted(service, &slot.name, slot.queued(), slot.quiet());
                    slot.end_round_trip(&mut self.spin);
                    slot.outcome = Some(Ok(token));
                    slot.wake_later(effects);
                    let owner = self.owner_id(owner);
                    self.front_mut(service).emit_with(|| LockEvent::Locked {
                        name,
                        owner,
                        mode,
                        token,
                    });
                }
                _ => {
                    // Nobody waits for it any more: give it back.
                    debug!(%request, lock = %name, "grant without a waiter; releasing it");
                    let _ = self.endpoint.unlock(now, request);
                    let owner = Some(self.owner_id(owner));
                    let report =
                        UnexpectedLock::new(name, owner, token, UnexpectedGrant::Withdrawn);
                    self.unexpected(service, request, report, effects);
                }
            },
            LockNotice::Queued {
                request, position, ..
            } => {
                // `Waiting` means queued by the grantor, never an immediate grant.
                if let Some(slot) = self.slots.get_mut(&request) {
                    // Behind another owner: sleep until the grant (see `crate::contention`).
                    slot.mark_queued();
                    let (name, owner, mode) = (slot.name.clone(), slot.owner, slot.mode);
                    self.contention.queued(service, &name);
                    let owner = self.owner_id(owner);
                    self.front_mut(service).emit_with(|| LockEvent::Waiting {
                        name,
                        owner,
                        mode,
                        position,
                    });
                }
            }
            LockNotice::Refused {
                request, reason, ..
            } => {
                if let Some(slot) = self.slots.get_mut(&request) {
                    slot.outcome = Some(Err(match reason {
                        Refusal::WouldBlock => LockError::WouldBlock,
                        Refusal::Timeout => LockError::Timeout,
                        Refusal::Shutdown => LockError::Shutdown,
                        Refusal::NoQuorum => LockError::NotMember,
                        Refusal::Unavailable => LockError::Unavailable,
                        Refusal::Destroyed => LockError::ServiceDestroyed,
                    }));
                    slot.wake_later(effects);
                }
            }
            LockNotice::Released { request } => {
                if let Some(slot) = self.slots.get_mut(&request) {
                    slot.released = true;
                    slot.end_round_trip(&mut self.spin);
                    slot.wake_later(effects);
                }
            }
            LockNotice::Table { query, table } => {
                if let Some(waiting) = self.tables.get_mut(&query) {
                    waiting.answer = Some(table.ok_or(LockError::Unavailable));
                    effects.wakers.append(&mut waiting.wakers);
                }
            }
            LockNotice::GrantorServing { grantor } => {
                debug!(member = %self.endpoint.local(), ?service, ?grantor, "serving grantor");
                self.front_mut(service).grantor_changed(grantor);
            }
            LockNotice::Unexpected {
                request,
                name,
                owner,
                token,
                reason,
            } => {
                debug!(member = %self.endpoint.local(), lock = %name, %reason, "unexpected grant, resolved");
                let owner = owner.map(|o| self.owner_id(o));
                let report = UnexpectedLock::new(name, owner, token, reason);
                self.unexpected(service, request, report, effects);
            }
            LockNotice::Lost {
                request,
                name,
                owner,
                token,
                reason,
            } => {
                warn!(member = %self.endpoint.local(), lock = %name, ?reason, "lock lost");
                if let Some(slot) = self.slots.get_mut(&request) {
                    slot.lost = Some(reason);
                    slot.wake_later(effects);
                }
                self.lost(
                    service,
                    LockLost::new(name, self.owner_id(owner), token, reason),
                    effects,
                );
            }
            // A notice of a newer protocol crate this front end does not know yet.
            other => trace!(member = %self.endpoint.local(), ?other, "notice ignored"),
        }
    }

    /// Reports an unexpected grant to the handlers, once per grant.
    fn unexpected(
        &mut self,
        service: Option<&ServiceName>,
        request: RequestId,
        report: UnexpectedLock,
        effects: &mut Effects,
    ) {
        /// How many reported grants are remembered to drop their resent copies.
        const REMEMBERED: usize = 256;
        let key = (request, report.token);
        if self.reported.contains(&key) {
            return;
        }
        if self.reported.len() == REMEMBERED {
            self.reported.pop_front();
        }
        self.reported.push_back(key);
        effects.unexpected.extend(
            self.front_mut(service)
                .unexpected_handlers
                .iter()
                .map(|h| (h.clone(), report.clone())),
        );
    }

    /// Reports a lost hold of the named service `service` (or the default one) to its
    /// listeners and handlers.
    fn lost(&mut self, service: Option<&ServiceName>, event: LockLost, effects: &mut Effects) {
        let front = self.front_mut(service);
        front.emit(LockEvent::Lost {
            name: event.name.clone(),
            owner: event.owner.clone(),
            reason: event.reason,
        });
        effects
            .lost
            .extend(front.handlers.iter().map(|h| (h.clone(), event.clone())));
    }

    /// Shutdown: the endpoint releases every held lock (reported lost to its owner and the
    /// handlers with [`LockLostReason::Shutdown`]), withdraws every pending request and
    /// leaves the view; new requests fail with `Shutdown`.
    pub(crate) fn close_locks(&mut self, now: Instant) -> Effects {
        self.phase = Phase::Closing;
        self.endpoint.leave(now);
        let effects = self.settle(now);
        for slot in self.slots.values_mut() {
            if slot.outcome.is_none() {
                slot.outcome = Some(Err(LockError::Shutdown));
                slot.wake();
            }
        }
        effects
    }

    /// The driver stopped: nothing will be answered any more.
    pub(crate) fn close(&mut self) {
        self.phase = Phase::Closed;
        for slot in self.slots.values_mut() {
            if slot.outcome.is_none() {
                slot.outcome = Some(Err(LockError::Shutdown));
            }
            if matches!(slot.outcome, Some(Ok(_))) && slot.lost.is_none() {
                slot.lost = Some(LockLostReason::Shutdown);
            }
            slot.wake();
        }
        self.view_subscribers.clear();
        for front in std::iter::once(&mut self.front).chain(self.services.values_mut()) {
            front.serving_grantor = None;
            front.close();
        }
        for waker in self.closed_wakers.drain(..) {
            waker.wake();
        }
        for query in self.tables.values_mut() {
            query.answer.get_or_insert(Err(LockError::Shutdown));
            for waker in query.wakers.drain(..) {
                waker.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, RequestId};
    use conclave_protocol::locking::{LockNotice, LockRequest};
    use conclave_protocol::{Endpoint, EndpointConfig, Instant};

    use super::{Effects, Shared};

    const BOUND: Duration = Duration::from_secs(60);

    fn shared() -> Shared {
        let member = MemberId::new(1, "spin", ([127, 0, 0, 1], 1).into()).expect("member");
        let endpoint = Endpoint::new("spin", member, EndpointConfig::local(), 1400);
        Shared::new(endpoint, BOUND)
    }

    /// A request of `name` waiting for its remote answer, its round trip timed.
    fn waiting(shared: &mut Shared, name: &str) -> RequestId {
        let name = LockName::new(name).expect("name");
        let id = shared
            .register(Instant::ZERO, None, LockRequest::exclusive(1, name))
            .expect("registered");
        shared.start_spin(id, None);
        assert!(shared.slots[&id].timed(), "timed");
        id
    }

    fn notice(shared: &mut Shared, notice: LockNotice) {
        shared.handle_notice(Instant::ZERO, None, notice, &mut Effects::default());
    }

    fn granted(request: RequestId, name: &str) -> LockNotice {
        LockNotice::Granted {
            request,
            name: LockName::new(name).expect("name"),
            owner: 1,
            mode: LockMode::Exclusive,
            token: FencingToken(1),
        }
    }

    /// Only uncontended round trips teach the node how long to spin: a request the grantor
    /// queued is not timed (its answer waits for other owners), one granted at once is, and so
    /// is an acknowledged release.
    #[test]
    fn only_uncontended_round_trips_teach_the_spin() {
        let mut shared = shared();
        let queued = waiting(&mut shared, "queued");
        notice(
            &mut shared,
            LockNotice::Queued {
                request: queued,
                name: LockName::new("queued").expect("name"),
                position: 1,
            },
        );
        assert!(!shared.slots[&queued].timed());
        notice(&mut shared, granted(queued, "queued"));
        assert_eq!(shared.spin.current(), BOUND, "a queued wait taught nothing");

        let free = waiting(&mut shared, "free");
        notice(&mut shared, granted(free, "free"));
        let after_grant = shared.spin.current();
        assert!(after_grant < BOUND, "a caught grant pulls the spin down");

        shared.slots.get_mut(&free).expect("slot").releasing = true;
        shared.start_release_spin(free);
        assert!(shared.slots[&free].timed(), "the release is timed");
        notice(&mut shared, LockNotice::Released { request: free });
        assert!(
            shared.spin.current() < after_grant,
            "and its acknowledgement counts"
        );
    }
}
