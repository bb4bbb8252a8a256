//! The member's lock services: the default one and the named ones, opened on demand.

use conclave_lock_api::ServiceName;

use super::{Endpoint, TooManyServices, MAX_SERVICES};
use crate::gms::ViewOrigin;
use crate::locking::{service_index, LockMachine};
use crate::time::Instant;

impl Endpoint {
    /// Every lock service of this member: the default one, then the named ones by name.
    pub(super) fn all_services(&self) -> impl Iterator<Item = &LockMachine> {
        std::iter::once(&self.locks).chain(self.services.values())
    }

    /// [`Endpoint::all_services`], to change them.
    pub(super) fn all_services_mut(&mut self) -> impl Iterator<Item = &mut LockMachine> {
        std::iter::once(&mut self.locks).chain(self.services.values_mut())
    }

    /// A named lock service, if this member runs it.
    pub fn service(&self, name: &ServiceName) -> Option<&LockMachine> {
        self.services.get(name)
    }

    /// A named lock service, to break it on purpose or read its grant log in simulator tests.
    #[cfg(feature = "sim")]
    pub fn service_mut(&mut self, name: &ServiceName) -> Option<&mut LockMachine> {
        self.services.get_mut(name)
    }

    /// The named lock services this member runs, by name.
    pub fn services(&self) -> impl Iterator<Item = (&ServiceName, &LockMachine)> {
        self.services.iter()
    }

    /// Opens the named lock service `name` on this member (if it does not run it already):
    /// an independent namespace of locks with its own grantor (the view's coordinator unless
    /// transferred), reconciliation, table and notices ([`EndpointEvent::ServiceLock`](super::EndpointEvent::ServiceLock)). A
    /// member also runs a service once another member's message for it arrives, so the
    /// service's grantor need not open it. Under `Majority` it grants under the member's
    /// one term, so a service opened at a serving coordinator serves after one reconciliation.
    ///
    /// # Errors
    /// [`TooManyServices`] if the member runs [`MAX_SERVICES`] named services already.
    pub fn open_service(
        &mut self,
        now: Instant,
        name: &ServiceName,
    ) -> Result<(), TooManyServices> {
        self.open_service_quietly(now, name)?;
        self.pump(now);
        Ok(())
    }

    /// [`Endpoint::open_service`] without moving outputs (the caller pumps).
    pub(super) fn open_service_quietly(
        &mut self,
        now: Instant,
        name: &ServiceName,
    ) -> Result<(), TooManyServices> {
        if self.services.contains_key(name) {
            return Ok(());
        }
        if self.services.len() >= MAX_SERVICES {
            return Err(TooManyServices);
        }
        let index = self
            .service_names
            .keys()
            .next_back()
            .map_or(1, |last| last + 1);
        let mut service =
            LockMachine::for_service(self.local.clone(), self.lock_config.clone(), index);
        if let Some(term) = self.restored_term {
            service.restore_term(term);
        }
        #[cfg(feature = "sim")]
        service.set_sabotage(self.lock_sabotage);
        if let Some(view) = self.gms.view().cloned() {
            let authority = self.locks.authority(now);
            service.lend_authority(now, authority, true);
            service.observe_epoch(now, self.gms.max_epoch_seen());
            service.handle_view(now, &view, ViewOrigin::Changed);
            service.inherit_minority_since(&self.locks);
        }
        self.services.insert(name.clone(), service);
        self.service_names.insert(index, name.clone());
        Ok(())
    }

    /// Destroys the named service `name` on this member: its held locks are released at the
    /// grantor and reported lost ([`LockLostReason::ServiceDestroyed`]), its pending requests
    /// withdrawn and refused ([`Refusal::Destroyed`]). The member keeps its part in the
    /// service for the others (its grant role, if it has it, and its lock reports).
    ///
    /// [`LockLostReason::ServiceDestroyed`]: conclave_lock_api::LockLostReason::ServiceDestroyed
    /// [`Refusal::Destroyed`]: crate::locking::Refusal::Destroyed
    pub fn destroy_service(&mut self, now: Instant, name: &ServiceName) {
        if let Some(service) = self.services.get_mut(name) {
            service.destroy(now);
            self.pump(now);
        }
    }

    /// The lock service a request id or table query belongs to: `Some(name)` for a named
    /// one, `None` for the default service (or an id of no service of this member).
    pub fn service_of(&self, id: u64) -> Option<&ServiceName> {
        self.service_names.get(&service_index(id))
    }

    /// The lock service `service` names (`None`: the default one), with the member's right to
    /// grant lent to it as of `now` (`Majority`). `None` if the member does not run it.
    pub(super) fn service_at(
        &mut self,
        now: Instant,
        service: Option<&ServiceName>,
    ) -> Option<&mut LockMachine> {
        match service {
            None => Some(&mut self.locks),
            Some(name) => {
                let service = self.services.get_mut(name)?;
                if self.lock_config.policy.is_majority() {
                    let authority = self.locks.authority(now);
                    service.lend_authority(now, authority, false);
                }
                Some(service)
            }
        }
    }

    /// The named service `service`, opened if this member does not run it yet (the caller
    /// pumps once, after its call into the service), with its authority as of `now`.
    pub(super) fn opened(
        &mut self,
        now: Instant,
        service: &ServiceName,
    ) -> Result<&mut LockMachine, TooManyServices> {
        self.open_service_quietly(now, service)?;
        self.service_at(now, Some(service)).ok_or(TooManyServices)
    }

    /// The lock service a request id belongs to, with its authority as of `now`.
    pub(super) fn service_for(&mut self, now: Instant, id: u64) -> Option<&mut LockMachine> {
        let name = self.service_of(id).cloned();
        self.service_at(now, name.as_ref())
    }

    /// The lock service a request id belongs to, read-only.
    pub(super) fn service_ref(&self, id: u64) -> &LockMachine {
        self.service_of(id)
            .and_then(|name| self.services.get(name))
            .unwrap_or(&self.locks)
    }
}
