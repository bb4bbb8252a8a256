//! What a Raft member's front end shares between users' tasks and its driver thread: the
//! protocol node, every request's record, the subscribers, and the handlers.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Instant as StdInstant;

use async_channel::Sender;
use conclave_lock_api::{
    FencingToken, LockError, LockEvent, LockLost, LockLostReason, LockMode, LockName, LostHandler,
    MemberId, OwnerId, RequestId, ServiceName, UnexpectedHandler, View,
};
use conclave_protocol::raft::{RaftEvent, RaftNode};
use conclave_protocol::Instant;

/// Where one request stands, here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Asked or queued.
    Waiting,
    /// Holds with this token.
    Held(FencingToken),
    /// Its unlock is on its way.
    Releasing(FencingToken),
    /// Released (the unlock applied).
    Released,
    /// Refused or failed; the answer waits for the future.
    Failed(LockError),
    /// Lost while held.
    Lost(LockLostReason),
}

pub(super) struct Record {
    pub(super) service: Option<ServiceName>,
    pub(super) name: LockName,
    pub(super) owner: u64,
    pub(super) mode: LockMode,
    pub(super) phase: Phase,
    /// When a waiting request gives up (its timeout).
    pub(super) deadline: Option<StdInstant>,
    pub(super) wakers: Vec<Waker>,
}

impl Record {
    pub(super) fn wake(&mut self) {
        for waker in self.wakers.drain(..) {
            waker.wake();
        }
    }

    pub(super) fn register(&mut self, waker: &Waker) {
        if !self.wakers.iter().any(|w| w.will_wake(waker)) {
            self.wakers.push(waker.clone());
        }
    }
}

/// Subscribers and handlers of one service (`None`: the default one).
#[derive(Default)]
pub(super) struct Listeners {
    pub(super) events: Vec<Sender<LockEvent>>,
    pub(super) handlers: Vec<LostHandler>,
    pub(super) unexpected: Vec<UnexpectedHandler>,
}

/// A table read in flight.
pub(super) struct Read {
    pub(super) ready: bool,
    pub(super) waker: Option<Waker>,
}

pub(super) struct State {
    pub(super) node: RaftNode,
    pub(super) peers: BTreeMap<String, SocketAddr>,
    pub(super) base: StdInstant,
    pub(super) records: BTreeMap<RequestId, Record>,
    pub(super) next_request: u64,
    pub(super) next_query: u64,
    pub(super) reads: BTreeMap<u64, Read>,
    pub(super) listeners: BTreeMap<Option<ServiceName>, Listeners>,
    pub(super) views: Vec<Sender<View>>,
    pub(super) view: Option<View>,
    pub(super) leader: Option<MemberId>,
    /// Tasks waiting for a leader, or for this member to lead.
    pub(super) leader_wakers: Vec<Waker>,
    pub(super) closed: bool,
    /// The driver has stopped.
    pub(super) stopped: bool,
    pub(super) closed_wakers: Vec<Waker>,
    /// Losses to report to handlers once the state lock is released.
    pub(super) losses: Vec<(Option<ServiceName>, LockLost)>,
    /// The open named services' handles.
    pub(super) services: BTreeMap<ServiceName, std::sync::Arc<super::backend::RaftBackend>>,
    /// Services destroyed whose listeners are dropped once their losses are reported.
    pub(super) destroyed_listeners: Vec<Option<ServiceName>>,
}

impl State {
    pub(super) fn now(&self) -> Instant {
        Instant::from_duration(self.base.elapsed())
    }

    pub(super) fn owner(&self, local: u64) -> OwnerId {
        OwnerId {
            member: self.node.member().clone(),
            local,
        }
    }

    pub(super) fn emit(&mut self, service: &Option<ServiceName>, event: LockEvent) {
        if let Some(listeners) = self.listeners.get_mut(service) {
            listeners
                .events
                .retain(|s| s.try_send(event.clone()).is_ok());
        }
    }

    fn emit_all(&mut self, event: LockEvent) {
        for listeners in self.listeners.values_mut() {
            listeners
                .events
                .retain(|s| s.try_send(event.clone()).is_ok());
        }
    }

    /// Ends a held record with `reason`: its owner is woken, listeners and handlers told.
    pub(super) fn lose(&mut self, request: RequestId, reason: LockLostReason) {
        let Some(record) = self.records.get_mut(&request) else {
            return;
        };
        let (Phase::Held(token) | Phase::Releasing(token)) = record.phase else {
            return;
        };
        record.phase = Phase::Lost(reason);
        record.wake();
        let (service, name, owner) = (record.service.clone(), record.name.clone(), record.owner);
        let owner = self.owner(owner);
        self.losses.push((
            service.clone(),
            LockLost::new(name.clone(), owner.clone(), token, reason),
        ));
        self.emit(
            &service,
            LockEvent::Lost {
                name,
                owner,
                reason,
            },
        );
    }

    /// Fails a waiting record with `error`.
    pub(super) fn fail(&mut self, request: RequestId, error: LockError) {
        if let Some(record) = self.records.get_mut(&request) {
            if record.phase == Phase::Waiting {
                record.phase = Phase::Failed(error);
                record.wake();
            }
        }
    }

    /// The member stops: every hold is lost and every wait fails, with `Shutdown`.
    pub(super) fn close_ending_requests(&mut self) {
        self.closed = true;
        let requests: Vec<_> = self.records.keys().copied().collect();
        for request in requests {
            self.lose(request, LockLostReason::Shutdown);
            self.fail(request, LockError::Shutdown);
        }
    }

    /// Takes in one event of the protocol node.
    pub(super) fn take(&mut self, event: RaftEvent) {
        match event {
            RaftEvent::Granted { request, token, .. } => {
                let request = RequestId(request);
                let Some(record) = self.records.get_mut(&request) else {
                    return;
                };
                if record.phase != Phase::Waiting {
                    return;
                }
                record.phase = Phase::Held(token);
                record.deadline = None;
                record.wake();
                let (service, name, owner, mode) = (
                    record.service.clone(),
                    record.name.clone(),
                    record.owner,
                    record.mode,
                );
                let owner = self.owner(owner);
                self.emit(
                    &service,
                    LockEvent::Locked {
                        name,
                        owner,
                        mode,
                        token,
                    },
                );
            }
            RaftEvent::Queued { request, position } => {
                let Some(record) = self.records.get(&RequestId(request)) else {
                    return;
                };
                let (service, name, owner, mode) = (
                    record.service.clone(),
                    record.name.clone(),
                    record.owner,
                    record.mode,
                );
                let owner = self.owner(owner);
                self.emit(
                    &service,
                    LockEvent::Waiting {
                        name,
                        owner,
                        mode,
                        position,
                    },
                );
            }
            RaftEvent::Busy { request } => self.fail(RequestId(request), LockError::WouldBlock),
            RaftEvent::CutOff { request } => self.fail(RequestId(request), LockError::NotMember),
            RaftEvent::Released { request } | RaftEvent::Withdrawn { request } => {
                let request = RequestId(request);
                let Some(record) = self.records.get_mut(&request) else {
                    return;
                };
                if matches!(record.phase, Phase::Releasing(_)) {
                    record.phase = Phase::Released;
                    record.wake();
                }
            }
            RaftEvent::Lost {
                request,
                held,
                reason,
            } => {
                let request = RequestId(request);
                if held {
                    self.lose(request, reason);
                } else {
                    self.fail(request, LockError::Lost(reason));
                }
            }
            RaftEvent::Leader(leader) => {
                if leader != self.leader {
                    self.leader = leader.clone();
                    self.emit_all(LockEvent::GrantorChanged { grantor: leader });
                }
                for waker in self.leader_wakers.drain(..) {
                    waker.wake();
                }
            }
            RaftEvent::Members => {
                self.refresh_view();
                for waker in self.leader_wakers.drain(..) {
                    waker.wake();
                }
            }
            RaftEvent::TableReady { query } => {
                if let Some(read) = self.reads.get_mut(&query) {
                    read.ready = true;
                    if let Some(waker) = read.waker.take() {
                        waker.wake();
                    }
                }
            }
            _ => {}
        }
        // A leader's name may have been learnt with the members.
        let leader = self.node.leader();
        if leader.is_some() && leader != self.leader {
            self.leader = leader.clone();
            self.emit_all(LockEvent::GrantorChanged { grantor: leader });
            for waker in self.leader_wakers.drain(..) {
                waker.wake();
            }
        }
    }

    /// The view: every member that joined, by its latest incarnation, the leader first.
    pub(super) fn refresh_view(&mut self) {
        let mut members = self.node.members();
        if let Some(leader) = &self.leader {
            if let Some(place) = members.iter().position(|m| m == leader) {
                let leader = members.remove(place);
                members.insert(0, leader);
            }
        }
        let epoch = self.node.view_epoch();
        let Ok(view) = View::new(epoch, members) else {
            return;
        };
        if self.view.as_ref() != Some(&view) {
            self.view = Some(view.clone());
            self.views.retain(|s| s.try_send(view.clone()).is_ok());
        }
    }
}

/// The state behind its lock.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// Rings the driver: something to send or a deadline moved.
    pub(super) ring: Sender<()>,
    pub(super) next_owner: std::sync::atomic::AtomicU64,
    pub(super) member: MemberId,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn ring(&self) {
        let _ = self.ring.try_send(());
    }

    /// Calls the lost-lock handlers for the losses recorded, outside the state lock; then
    /// ends the streams of destroyed services.
    pub(super) fn report_losses(&self) {
        let (losses, handlers) = {
            let mut state = self.lock();
            if state.losses.is_empty() {
                let destroyed = std::mem::take(&mut state.destroyed_listeners);
                for service in destroyed {
                    state.listeners.remove(&service);
                }
                return;
            }
            let losses = std::mem::take(&mut state.losses);
            let handlers: BTreeMap<Option<ServiceName>, Vec<LostHandler>> = state
                .listeners
                .iter()
                .map(|(s, l)| (s.clone(), l.handlers.clone()))
                .collect();
            (losses, handlers)
        };
        for (service, lost) in losses {
            for handler in handlers.get(&service).into_iter().flatten() {
                let call = std::panic::AssertUnwindSafe(|| handler(&lost));
                if std::panic::catch_unwind(call).is_err() {
                    tracing::error!(lock = %lost.name, "a lost-lock handler panicked");
                }
            }
        }
        let mut state = self.lock();
        let destroyed = std::mem::take(&mut state.destroyed_listeners);
        for service in destroyed {
            state.listeners.remove(&service);
        }
    }
}
