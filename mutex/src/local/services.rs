//! The named lock services of a local node ([`ClusterBackend::service`](conclave_lock_api::ClusterBackend::service)): each is another
//! [`LocalBackend`], a lock table of its own, kept by name so that every `lock_service` call
//! for a name gives the same one until it is destroyed.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use conclave_lock_api::{LockError, LockEvent, LockLost, LockLostReason, ServiceName};

use super::{call_handlers, LocalBackend, Stage, State};

/// What the lock services of one local node share.
#[derive(Default)]
pub(super) struct LocalNode {
    /// Owner numbers, unique across the node's services.
    pub(super) next_owner: AtomicU64,
    services: Mutex<Services>,
}

/// The named services of a local node.
#[derive(Default)]
struct Services {
    /// The node shut down: no service opens any more.
    closed: bool,
    by_name: BTreeMap<ServiceName, Arc<LocalBackend>>,
}

impl LocalNode {
    fn services(&self) -> std::sync::MutexGuard<'_, Services> {
        self.services.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the node shut down.
    pub(super) fn is_closed(&self) -> bool {
        self.services().closed
    }
}

impl LocalBackend {
    /// Closes this service: every hold lost for `reason`, every waiting request refused
    /// (with [`LockError::ServiceDestroyed`] for a destroyed service, else
    /// [`LockError::Shutdown`]), and the handlers told.
    pub(super) fn close(&self, reason: LockLostReason) {
        let destroyed = reason == LockLostReason::ServiceDestroyed;
        let (handlers, lost) = {
            let mut state = self.lock();
            if state.closed {
                return;
            }
            state.closed = true;
            state.destroyed = destroyed;
            let refusal = state.refusal();
            let mut lost = Vec::new();
            let mut events = Vec::new();
            for record in state.requests.values_mut() {
                match record.stage {
                    Stage::Held(token) => {
                        record.stage = Stage::Lost(reason);
                        let owner = self.owner_id(record.owner);
                        events.push(LockEvent::Lost {
                            name: record.name.clone(),
                            owner: owner.clone(),
                            reason,
                        });
                        lost.push(LockLost::new(record.name.clone(), owner, token, reason));
                    }
                    Stage::Queued => record.stage = Stage::Refused(refusal.clone()),
                    _ => {}
                }
                record.timer = None;
                record.wake();
            }
            for event in events {
                state.emit(event);
            }
            for entry in state.locks.values_mut() {
                entry.holders.clear();
                entry.queue.clear();
            }
            state.events.clear();
            if !destroyed {
                state.views.clear();
            }
            for waker in state.closed_wakers.drain(..) {
                waker.wake();
            }
            (state.handlers.clone(), lost)
        };
        call_handlers(&handlers, &lost);
    }

    /// Shuts the node down: its default service, then every named service, are closed with
    /// [`LockLostReason::Shutdown`], and no service opens any more.
    pub(super) fn shut_node_down(&self) {
        let services = {
            let mut services = self.node.services();
            services.closed = true;
            std::mem::take(&mut services.by_name)
        };
        self.close(LockLostReason::Shutdown);
        for service in services.values() {
            service.close(LockLostReason::Shutdown);
        }
    }

    /// The named service `name` of this node, opened if it is not (see
    /// [`ClusterBackend::service`](conclave_lock_api::ClusterBackend::service)).
    pub(super) fn open_service(&self, name: &ServiceName) -> Result<Arc<LocalBackend>, LockError> {
        let mut services = self.node.services();
        if services.closed {
            return Err(LockError::Shutdown);
        }
        // A destroyed service opens afresh, its fencing tokens going on from where they were.
        let mut state = State::default();
        if let Some(service) = services.by_name.get(name) {
            let old = service.lock();
            if !old.destroyed {
                return Ok(service.clone());
            }
            state.last_token = old.last_token;
        } else if services.by_name.len() >= conclave_protocol::MAX_SERVICES {
            return Err(LockError::TooManyServices);
        }
        let service = Arc::new(LocalBackend {
            member: self.member.clone(),
            view: self.view.clone(),
            state: Mutex::new(state),
            node: self.node.clone(),
            service: Some(name.clone()),
        });
        services.by_name.insert(name.clone(), service.clone());
        Ok(service)
    }
}
