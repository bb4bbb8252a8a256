//! One member's whole protocol stack on the wire: membership over reliable delivery.
//!
//! [`Endpoint`] takes datagrams in and gives datagrams out. It decodes and validates every
//! datagram, feeds discovery and heartbeats to [`Gms`], data segments and acks to
//! [`Reliable`], and reliably delivered messages back to [`Gms`]. The driver of `conclave` and
//! the simulator drive exactly this type.

use std::collections::{BTreeMap, VecDeque};

use conclave_lock_api::wire::{
    self, ClusterId, DecodeError, Frame, LockMessage, Message, Packet, SharedSetting, WireVersion,
    PACKET_OVERHEAD_MAX,
};
use conclave_lock_api::{MemberId, RequestId, ServiceName, View};
use tracing::{debug, trace, warn};

use crate::gms::{Founding, Gms, GmsEvent, GmsOutput, MembershipState};
use crate::locking::{
    Authority, CacheStats, GrantorStats, HoldInfo, HoldStatus, LockConfig, LockMachine,
    LockRequest, NotHeld,
};
use crate::reliable::Reliable;
use crate::time::Instant;

mod services;
mod types;
mod versions;

pub use types::{
    shared_settings, Destination, EndpointConfig, EndpointEvent, EndpointStats,
    ServiceTransferError, TooManyServices, Transmit, MAX_SERVICES,
};

/// One member's whole protocol stack on the wire: it decodes and validates every datagram,
/// feeds discovery and heartbeats to [`Gms`], data segments and acks to [`Reliable`], delivered
/// messages to [`Gms`] or [`LockMachine`], and encodes what they send.
///
/// # Driving contract
/// `Endpoint` performs no IO and reads no clock: whoever drives it (the `conclave` driver, the
/// simulator, a test) owns the socket, the clock and the timer, and must keep these rules.
///
/// 1. **Inputs.** The inputs are [`Endpoint::join`] (once, first), [`Endpoint::handle_datagram`]
///    (every datagram the transport receives, in any order, duplicates and garbage included:
///    the endpoint drops what it cannot use), [`Endpoint::handle_timeout`], the lock calls
///    ([`Endpoint::lock`], [`Endpoint::cancel`], [`Endpoint::unlock`]) and [`Endpoint::leave`].
///    Call them from one thread at a time (the type is `Send`, not shared: wrap it in a mutex
///    if several threads feed it, as the `conclave` driver does).
/// 2. **Time.** Every input takes `now`, on one monotonic clock of the driver's choosing.
///    `now` never goes backwards from one call to the next (equal is fine). The protocol
///    measures every lease and timeout on it; a clock that jumps back would stretch them, a
///    clock that runs fast only shortens them (see `docs/protocol.md`, "Leases", for the drift
///    bound the `Majority` policy assumes).
/// 3. **After every input**, before waiting for the next one: drain
///    [`Endpoint::poll_transmit`] until `None` and hand each datagram to the transport; drain
///    [`Endpoint::poll_event`] until `None`; then read [`Endpoint::poll_timeout`] **again** and
///    re-arm the timer to it — any input may move the deadline earlier or later, or clear it.
///    Taking several inputs before draining is allowed (the driver takes every waiting
///    datagram first, so replies to one member leave together), as long as the drain follows.
/// 4. **Timers.** Call [`Endpoint::handle_timeout`] once `now` has reached the deadline
///    `poll_timeout` returned. Calling it early, or more than once, is harmless; calling it
///    late delays heartbeats and retransmissions by as much (a stalled driver is a stalled
///    member, which the protocol survives but the cluster may suspect).
/// 5. **Sends may fail.** A datagram the transport drops is not reported back: the protocol
///    treats every send as possibly lost and retransmits.
/// 6. **Leaving.** After [`Endpoint::leave`], keep driving until [`Endpoint::is_drained`] (or a
///    bound of the driver's choosing), so the leave and the last acknowledgements go out.
/// 7. **Stable storage** (`Majority`, optional). After every input, before sending, take
///    [`Endpoint::poll_durable_term`] and, if it is `Some`, write it durably; restore the
///    stored value with [`Endpoint::restore_term`] when the member starts again. Without it,
///    fencing tokens stay increasing across any restart but a restart of the whole cluster.
///
/// The drive loop, as the driver and the simulator run it:
///
/// ```
/// use conclave_lock_api::MemberId;
/// use conclave_protocol::{Endpoint, EndpointConfig, EndpointEvent, Instant};
///
/// let me = MemberId::new(42, "solo", "127.0.0.1:7800".parse()?)?;
/// let mut endpoint = Endpoint::new("orders", me, EndpointConfig::local(), 1400);
/// let mut now = Instant::ZERO;
/// endpoint.join(now);
/// let mut joined = false;
/// for _ in 0..100 {
///     while let Some(transmit) = endpoint.poll_transmit() {
///         // a driver hands transmit.bytes to its transport here
///         # let _ = transmit;
///     }
///     while let Some(event) = endpoint.poll_event() {
///         joined |= matches!(event, EndpointEvent::ViewInstalled { .. });
///     }
///     if joined { break; }
///     // ... wait for a datagram (then call handle_datagram) or for the timeout:
///     now = endpoint.poll_timeout().expect("a joining member has timers");
///     endpoint.handle_timeout(now);
/// }
/// assert!(joined);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Endpoint {
    cluster: ClusterId,
    local: MemberId,
    gms: Gms,
    reliable: Reliable,
    locks: LockMachine,
    /// Named lock services, each with its own grantor, by name.
    services: BTreeMap<ServiceName, LockMachine>,
    /// The name of each named service's index (the high bits of its request ids).
    service_names: BTreeMap<u64, ServiceName>,
    /// The configuration every new service starts with.
    lock_config: LockConfig,
    /// `Majority`: the term floor restored from stable storage, for services opened later.
    restored_term: Option<u64>,
    /// Simulator tests of the checkers: the protocol broken on purpose, in every service.
    #[cfg(feature = "sim")]
    lock_sabotage: crate::locking::LockSabotage,
    transmits: VecDeque<Transmit>,
    events: VecDeque<EndpointEvent>,
    stats: EndpointStats,
    /// Members that left our view, and when their reliable streams are dropped if they do not
    /// come back (a graceful leaver's last acks, a partitioned member's retransmissions).
    departed: BTreeMap<MemberId, Instant>,
    gms_previous_view: Option<View>,
    /// The wire version to send each peer in.
    versions: versions::PeerVersions,
}

impl Endpoint {
    /// A member of the cluster called `cluster` that has not joined yet.
    ///
    /// `max_datagram` is the largest datagram the transport carries
    /// ([`conclave_lock_api::Transport::max_datagram_size`]); larger messages are fragmented.
    pub fn new(
        cluster: &str,
        local: MemberId,
        config: EndpointConfig,
        max_datagram: usize,
    ) -> Self {
        let fragment = max_datagram.saturating_sub(PACKET_OVERHEAD_MAX).max(64);
        let mut gms = Gms::new(local.clone(), config.gms);
        gms.set_shared_settings(shared_settings(&config.locks));
        Self {
            cluster: ClusterId::from_name(cluster),
            gms,
            reliable: Reliable::new(local.clone(), config.reliable, fragment),
            locks: LockMachine::new(local.clone(), config.locks.clone()),
            services: BTreeMap::new(),
            service_names: BTreeMap::new(),
            lock_config: config.locks,
            restored_term: None,
            #[cfg(feature = "sim")]
            lock_sabotage: crate::locking::LockSabotage::default(),
            local,
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            stats: EndpointStats::default(),
            departed: BTreeMap::new(),
            gms_previous_view: None,
            versions: versions::PeerVersions::new(config.wire),
        }
    }

    /// Sets when this member may found a cluster (see [`Founding`]; default
    /// [`Founding::Alone`]). Call before [`Endpoint::join`].
    pub fn set_founding(&mut self, founding: Founding) {
        self.gms.set_founding(founding);
    }

    /// The settings every member of the cluster must share, as this member sends them when it
    /// joins and compares them as coordinator: see [`shared_settings`].
    pub fn shared_settings(&self) -> &[SharedSetting] {
        self.gms.shared_settings()
    }

    /// This member's id.
    pub fn local(&self) -> &MemberId {
        &self.local
    }

    /// The current view, once joined.
    pub fn view(&self) -> Option<&View> {
        self.gms.view()
    }

    /// Where this member is in its life cycle.
    pub fn state(&self) -> MembershipState {
        self.gms.state()
    }

    /// Whether this member coordinates its view.
    pub fn is_coordinator(&self) -> bool {
        self.gms.is_coordinator()
    }

    /// True once the member has left and everything it sent was acknowledged: the driver may
    /// stop.
    pub fn is_drained(&self) -> bool {
        self.gms.state() == MembershipState::Left && self.reliable.is_quiescent()
    }

    /// Whether everything this member sent reliably has been acknowledged.
    pub fn is_quiescent(&self) -> bool {
        self.reliable.is_quiescent()
    }

    /// Whether everything this member sent to the members of its view has been acknowledged.
    pub fn is_settled(&self) -> bool {
        self.view()
            .is_some_and(|v| v.members().iter().all(|m| !self.reliable.has_unacked(m)))
    }

    /// Counters of every layer; the lock counters add up every lock service of the member.
    pub fn stats(&self) -> EndpointStats {
        let mut grantor = GrantorStats::default();
        let mut cache = CacheStats::default();
        let mut leases_expired = 0;
        for service in self.all_services() {
            grantor += service.grantor_stats();
            cache += service.cache_stats();
            leases_expired += service.leases_expired();
        }
        EndpointStats {
            gms: self.gms.stats(),
            reliable: self.reliable.stats(),
            grantor,
            cache,
            leases_expired,
            ..self.stats.clone()
        }
    }

    /// The membership layer, to break it on purpose in simulator tests.
    #[cfg(feature = "sim")]
    pub fn gms_mut(&mut self) -> &mut Gms {
        &mut self.gms
    }

    /// The locking layer (read-only: tables, holds, counters).
    pub fn locks(&self) -> &LockMachine {
        &self.locks
    }

    /// The locking layer, to break it on purpose or read its grant log in simulator tests.
    #[cfg(feature = "sim")]
    pub fn locks_mut(&mut self) -> &mut LockMachine {
        &mut self.locks
    }

    /// Breaks the locking protocol on purpose in every lock service, present and future
    /// (simulator tests of the checkers only).
    #[cfg(feature = "sim")]
    pub fn set_lock_sabotage(&mut self, sabotage: crate::locking::LockSabotage) {
        self.lock_sabotage = sabotage;
        for service in self.all_services_mut() {
            service.set_sabotage(sabotage);
        }
    }

    /// Asks for a lock; the answer comes as [`EndpointEvent::Lock`]. See [`LockMachine::lock`].
    pub fn lock(&mut self, now: Instant, request: LockRequest) -> RequestId {
        let id = self.locks.lock(now, request);
        self.pump(now);
        id
    }

    /// Asks for a lock in the named service `service` (opened if this member does not run it
    /// yet); the answer comes as [`EndpointEvent::ServiceLock`].
    ///
    /// # Errors
    /// [`TooManyServices`] if the service is not open and cannot be opened.
    pub fn lock_in(
        &mut self,
        now: Instant,
        service: &ServiceName,
        request: LockRequest,
    ) -> Result<RequestId, TooManyServices> {
        let id = self.opened(now, service)?.lock(now, request);
        self.pump(now);
        Ok(id)
    }

    /// Asks for a lock in the default service (`service` `None`) or a named one, without
    /// being told that it was queued; the answer comes as [`EndpointEvent::Lock`] (default
    /// service) or [`EndpointEvent::ServiceLock`]. See [`LockMachine::lock_quiet`].
    ///
    /// # Errors
    /// [`TooManyServices`] if the service is not open and cannot be opened.
    pub fn lock_quiet(
        &mut self,
        now: Instant,
        service: Option<&ServiceName>,
        request: LockRequest,
    ) -> Result<RequestId, TooManyServices> {
        let id = match service {
            None => self.locks.lock_quiet(now, request),
            Some(service) => self.opened(now, service)?.lock_quiet(now, request),
        };
        self.pump(now);
        Ok(id)
    }

    /// Asks the grantor of the named service `service` for its lock table (see
    /// [`Endpoint::query_table`]); the answer comes as [`EndpointEvent::ServiceLock`].
    ///
    /// # Errors
    /// [`TooManyServices`] if the service is not open and cannot be opened.
    pub fn query_table_in(
        &mut self,
        now: Instant,
        service: &ServiceName,
    ) -> Result<u64, TooManyServices> {
        let query = self.opened(now, service)?.query_table(now);
        self.pump(now);
        Ok(query)
    }

    /// Asks for the grantor role of the named service `service` in this member's view (see
    /// [`Endpoint::become_grantor`]). Each service's role moves on its own.
    ///
    /// # Errors
    /// [`ServiceTransferError`] under `Majority`, or if the service cannot be opened.
    pub fn become_grantor_in(
        &mut self,
        now: Instant,
        service: &ServiceName,
    ) -> Result<(), ServiceTransferError> {
        self.opened(now, service)?.become_grantor(now)?;
        self.pump(now);
        Ok(())
    }

    /// Asks the grantor for its lock table. See [`LockMachine::query_table`].
    pub fn query_table(&mut self, now: Instant) -> u64 {
        let query = self.locks.query_table(now);
        self.pump(now);
        query
    }

    /// Withdraws a pending lock request. See [`LockMachine::cancel`].
    pub fn cancel(&mut self, now: Instant, request: RequestId) {
        if let Some(locks) = self.service_for(now, request.0) {
            locks.cancel(now, request);
        }
        self.pump(now);
    }

    /// Releases the lock acquired by `request`. See [`LockMachine::unlock`].
    ///
    /// # Errors
    /// [`NotHeld`] if the request holds no lock here.
    pub fn unlock(&mut self, now: Instant, request: RequestId) -> Result<(), NotHeld> {
        self.release(now, request, false)
    }

    /// Releases the lock acquired by `request` without waiting for the acknowledgement (a
    /// guard dropped). See [`LockMachine::unlock_lazy`].
    ///
    /// # Errors
    /// [`NotHeld`] if the request holds no lock here.
    pub fn unlock_lazy(&mut self, now: Instant, request: RequestId) -> Result<(), NotHeld> {
        self.release(now, request, true)
    }

    fn release(&mut self, now: Instant, request: RequestId, lazy: bool) -> Result<(), NotHeld> {
        self.service_for(now, request.0)
            .ok_or(NotHeld(request))?
            .release(now, request, lazy)?;
        self.pump(now);
        Ok(())
    }

    /// A reentrant re-lock with a lease: the hold's lease becomes `max(remaining, lease)`.
    /// See [`LockMachine::extend_lease`].
    ///
    /// # Errors
    /// [`NotHeld`] if `request` holds nothing here.
    pub fn extend_lease(
        &mut self,
        now: Instant,
        request: RequestId,
        lease: std::time::Duration,
    ) -> Result<(), NotHeld> {
        self.service_for(now, request.0)
            .ok_or(NotHeld(request))?
            .extend_lease(now, request, lease)?;
        self.pump(now);
        Ok(())
    }

    /// Asks for the grantor role of this member's view. See [`LockMachine::become_grantor`].
    ///
    /// # Errors
    /// [`TransferRefused`](crate::locking::TransferRefused) under `Majority`.
    pub fn become_grantor(&mut self, now: Instant) -> Result<(), crate::locking::TransferRefused> {
        self.locks.become_grantor(now)?;
        self.pump(now);
        Ok(())
    }

    /// The status of the lock acquired by `request`, if held here.
    pub fn lock_status(&self, now: Instant, request: RequestId) -> Option<HoldStatus> {
        self.service_ref(request.0).status(now, request)
    }

    /// Every lock held on this member in the default service, with its status at `now`.
    pub fn holds(&self, now: Instant) -> Vec<HoldInfo> {
        self.locks.holds(now)
    }

    /// Every lock held on this member in the named service `service`.
    pub fn service_holds(&self, now: Instant, service: &ServiceName) -> Vec<HoldInfo> {
        self.services
            .get(service)
            .map_or_else(Vec::new, |locks| locks.holds(now))
    }

    /// Starts joining the cluster.
    pub fn join(&mut self, now: Instant) {
        self.gms.join(now);
        self.pump(now);
    }

    /// Leaves the cluster gracefully: held locks are released (and reported lost with
    /// `LockLostReason::Shutdown`), pending requests withdrawn, then the member leaves the
    /// view and grants nothing more. A coordinator hands its view to the next member and,
    /// under `Available`, the lock table of every service it grants (after the view, on the
    /// same streams), so the successor serves at once. Keep driving until
    /// [`Endpoint::is_drained`].
    pub fn leave(&mut self, now: Instant) {
        for service in self.all_services_mut() {
            service.shutdown(now);
        }
        self.pump(now);
        self.gms.leave(now);
        // The view goes out first: the handoffs must reach the successor after it.
        self.pump(now);
        let next = self.gms.handover().cloned();
        for service in self.all_services_mut() {
            service.leave(now, next.as_ref());
        }
        self.pump(now);
    }

    /// Handles one received datagram. Foreign, malformed or hostile input is dropped with a
    /// `tracing` event and counted; it never panics.
    pub fn handle_datagram(&mut self, now: Instant, bytes: &[u8]) {
        let datagram = match wire::decode_datagram(self.cluster, bytes) {
            Ok(datagram) => datagram,
            Err(error) => return self.count_drop(&error),
        };
        let Packet { sender, frame } = datagram.packet;
        if sender == self.local {
            return; // our own multicast, looped back
        }
        self.versions.heard(&sender, datagram.common);
        match frame {
            Frame::Discovery(discovery) => self.gms.handle_discovery(now, &sender, discovery),
            Frame::Heartbeat {
                epoch,
                view_epoch,
                coordinator,
                lease,
            } => {
                for service in self.all_services_mut() {
                    service.note_alive(now, &sender);
                }
                self.gms
                    .handle_heartbeat(now, &sender, epoch, view_epoch, coordinator);
                if let Some(beat) = lease {
                    self.locks.handle_lease_beat(now, &sender, beat);
                    self.lend_authority(now);
                }
            }
            // Reliable-layer frames are no sign of life: a coordinator that excluded us (or
            // left our view for another) still acknowledges what we send, and counting that
            // would keep us in a view nobody coordinates. Heartbeats go only to the members
            // of the sender's view.
            Frame::Data(_) | Frame::Bundle(_) | Frame::Ack(_) if self.gms.ignore_lineage() => {
                self.gms.note_alive(now, &sender);
                self.handle_reliable(now, &sender, frame);
            }
            frame => self.handle_reliable(now, &sender, frame),
        }
        self.pump(now);
    }

    /// Advances every timer. Calling it early is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.gms.handle_timeout(now);
        self.reliable.handle_timeout(now);
        // A view the membership layer just installed reaches the lock layer before its timers
        // run: it acts on the view it is in (a minority's waits are refused only in one).
        self.drain_gms_events(now);
        self.locks.handle_timeout(now);
        self.lend_authority(now);
        for service in self.services.values_mut() {
            service.handle_timeout(now);
        }
        let gone: Vec<MemberId> = self
            .departed
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(m, _)| m.clone())
            .collect();
        for member in gone {
            self.departed.remove(&member);
            self.versions.forget(&member);
            self.reliable.remove_peer(&member);
        }
        self.pump(now);
    }

    fn handle_reliable(&mut self, now: Instant, sender: &MemberId, frame: Frame) {
        match frame {
            Frame::Data(segment) => self.reliable.handle_segment(now, sender, segment),
            Frame::Bundle(segments) => self.reliable.handle_bundle(now, sender, segments),
            Frame::Ack(ack) => self.reliable.handle_ack(now, sender, ack),
            Frame::Discovery(_) | Frame::Heartbeat { .. } => {}
        }
    }

    /// The next datagram to send. Reliable traffic is framed here, when it is asked for:
    /// messages queued for one member by several inputs in a row (a driver that handles every
    /// datagram waiting before it sends) leave in one datagram.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.transmits.is_empty() {
            while let Some((to, frame)) = self.reliable.poll_transmit() {
                let version = self.versions.for_member(&to);
                self.transmit(Destination::Member(to.addr()), version, frame);
            }
        }
        self.transmits.pop_front()
    }

    /// `Majority`: restores the highest term this member promised in an earlier life (read
    /// from the stable storage [`Endpoint::poll_durable_term`] fills). Call it after
    /// [`Endpoint::new`], before [`Endpoint::join`].
    pub fn restore_term(&mut self, term: u64) {
        for service in self.all_services_mut() {
            service.restore_term(term);
        }
        self.restored_term = Some(self.restored_term.unwrap_or(0).max(term));
    }

    /// `Majority`: a term to write to stable storage (durably: written and synced) **before**
    /// sending any datagram [`Endpoint::poll_transmit`] gives after the input that produced it.
    /// A driver without stable storage ignores it; then fencing tokens can go back after the
    /// whole cluster restarts.
    #[must_use]
    pub fn poll_durable_term(&mut self) -> Option<u64> {
        self.locks.poll_durable_term()
    }

    /// The next event for the application.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<EndpointEvent> {
        self.events.pop_front()
    }

    /// When [`Endpoint::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.gms.poll_timeout(),
            self.reliable.poll_timeout(),
            self.departed.values().min().copied(),
        ]
        .into_iter()
        .chain(self.all_services().map(LockMachine::poll_timeout))
        .flatten()
        .min()
    }

    /// Moves outputs between the layers until none has anything left.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            // Under `Available` a grantor whose tokens ran out for its epoch grants again only
            // in a view with a higher one: as coordinator, install the same members again.
            let wanted = self
                .all_services()
                .filter_map(LockMachine::needs_new_view)
                .max();
            if let Some(at_least) = wanted {
                self.gms.renew_view(now, at_least);
            }
            let max_epoch = self.gms.max_epoch_seen();
            for service in self.all_services_mut() {
                service.observe_epoch(now, max_epoch);
            }
            while let Some(output) = self.gms.poll_output() {
                progressed = true;
                self.handle_gms_output(now, output);
            }
            progressed |= self.drain_gms_events(now);
            while let Some((from, bytes)) = self.reliable.poll_delivered() {
                progressed = true;
                match wire::decode_message(&bytes) {
                    Ok(Message::Gms(message)) => self.gms.handle_message(now, &from, message),
                    Ok(Message::Lock(message)) => self.locks.handle_message(now, &from, message),
                    Ok(Message::Service { service, message }) => {
                        self.handle_service_message(now, &from, &service, message);
                    }
                    Err(error) => {
                        warn!(%from, %error, "undecodable message from a member; dropped");
                        self.stats.dropped_malformed += 1;
                    }
                }
                // A view must reach the lock layer before the next message of the stream: the
                // grantor sends its view, then asks for lock reports of that view.
                self.drain_gms_events(now);
            }
            while let Some((to, message)) = self.locks.poll_transmit() {
                progressed = true;
                self.send_reliably(now, &to, Message::Lock(message));
            }
            while let Some(notice) = self.locks.poll_notice() {
                progressed = true;
                self.events.push_back(EndpointEvent::Lock(notice));
            }
            let mut outgoing = Vec::new();
            for (name, service) in &mut self.services {
                while let Some((to, message)) = service.poll_transmit() {
                    let service = name.clone();
                    outgoing.push((to, Message::Service { service, message }));
                }
                while let Some(notice) = service.poll_notice() {
                    progressed = true;
                    let service = name.clone();
                    self.events
                        .push_back(EndpointEvent::ServiceLock { service, notice });
                }
            }
            for (to, message) in outgoing {
                progressed = true;
                self.send_reliably(now, &to, message);
            }
            if !progressed {
                return;
            }
        }
    }

    /// Hands membership events to the lock layer and the application. Returns whether there
    /// were any.
    fn drain_gms_events(&mut self, now: Instant) -> bool {
        let mut any = false;
        while let Some(event) = self.gms.poll_event() {
            any = true;
            match event {
                GmsEvent::ViewInstalled { view, origin } => {
                    self.note_departures(now, &view);
                    self.locks.handle_view(now, &view, origin);
                    if !self.services.is_empty() {
                        let authority = self.locks.authority(now);
                        for service in self.services.values_mut() {
                            service.lend_authority(now, authority, true);
                            service.handle_view(now, &view, origin);
                        }
                    }
                    self.events
                        .push_back(EndpointEvent::ViewInstalled { view, origin });
                }
                GmsEvent::Left => self.events.push_back(EndpointEvent::Left),
                GmsEvent::JoinProblem(problem) => {
                    self.events.push_back(EndpointEvent::JoinProblem(problem));
                }
            }
        }
        any
    }

    fn handle_gms_output(&mut self, now: Instant, output: GmsOutput) {
        match output {
            GmsOutput::Send { to, message } => self.send_reliably(now, &to, Message::Gms(message)),
            GmsOutput::Heartbeat {
                to,
                epoch,
                view_epoch,
                coordinator,
            } => {
                let lease = self.locks.lease_beat(now, &to);
                self.transmit(
                    Destination::Member(to.addr()),
                    self.versions.for_member(&to),
                    Frame::Heartbeat {
                        epoch,
                        view_epoch,
                        coordinator,
                        lease,
                    },
                );
            }
            // Discovery may reach members of any version.
            GmsOutput::Discover(discovery) => {
                let discovery = Frame::Discovery(discovery);
                self.transmit(Destination::Discovery, WireVersion::OLDEST, discovery);
            }
            GmsOutput::DiscoveryReply { to, discovery } => {
                let discovery = Frame::Discovery(discovery);
                self.transmit(Destination::Member(to), WireVersion::OLDEST, discovery);
            }
            GmsOutput::Forget(member) => {
                self.versions.forget(&member);
                self.reliable.remove_peer(&member);
            }
        }
    }

    /// A message of the named service `name` from `from`: the service is opened here if it
    /// is not (a member takes part in every service another member uses), up to
    /// [`MAX_SERVICES`].
    fn handle_service_message(
        &mut self,
        now: Instant,
        from: &MemberId,
        name: &ServiceName,
        message: LockMessage,
    ) {
        if self.open_service_quietly(now, name).is_err() {
            warn!(%from, service = %name, "message for a lock service beyond the most a member runs; dropped");
            self.stats.dropped_malformed += 1;
            return;
        }
        if let Some(service) = self.service_at(now, Some(name)) {
            service.handle_message(now, from, message);
        }
    }

    /// `Majority`: lends the default service's right to grant, as of `now`, to every named
    /// service (after anything that may have changed it: a lease beat, a timer).
    fn lend_authority(&mut self, now: Instant) {
        if self.services.is_empty() || !self.lock_config.policy.is_majority() {
            return;
        }
        let authority: Authority = self.locks.authority(now);
        for service in self.services.values_mut() {
            service.lend_authority(now, authority, false);
        }
    }

    fn note_departures(&mut self, now: Instant, view: &View) {
        let grace = self.gms.config().leave_timeout * 4;
        if let Some(previous) = self.gms_previous_view.replace(view.clone()) {
            for member in previous.members() {
                if !view.contains(member) && *member != self.local {
                    self.departed.insert(member.clone(), now + grace);
                }
            }
        }
        for member in view.members() {
            self.departed.remove(member);
        }
    }

    fn send_reliably(&mut self, now: Instant, to: &MemberId, message: Message) {
        let bytes = match wire::encode_message_as(&message, self.versions.for_member(to)) {
            Ok(bytes) => bytes,
            Err(error) => return warn!(%error, "could not encode a message"),
        };
        if let Err(error) = self.reliable.send(now, to, bytes) {
            warn!(%to, %error, "could not queue a message");
        }
    }

    /// Sends `frame` in `version`. A member held at the oldest version sends it plainly,
    /// without naming a newer one.
    fn transmit(&mut self, destination: Destination, version: WireVersion, frame: Frame) {
        let packet = Packet {
            sender: self.local.clone(),
            frame,
        };
        let encoded = if self.versions.newest() == WireVersion::OLDEST {
            wire::encode_packet(self.cluster, &packet)
        } else {
            wire::encode_packet_as(self.cluster, &packet, version)
        };
        match encoded {
            Ok(bytes) => self.transmits.push_back(Transmit { destination, bytes }),
            Err(error) => warn!(%error, "could not encode a datagram"),
        }
    }

    fn count_drop(&mut self, error: &DecodeError) {
        match error {
            DecodeError::ForeignCluster { .. } => {
                trace!(%error, "datagram dropped");
                self.stats.dropped_foreign += 1;
            }
            DecodeError::UnsupportedVersion { .. } => {
                debug!(%error, "datagram dropped");
                self.stats.dropped_version += 1;
            }
            _ => {
                debug!(%error, "datagram dropped");
                self.stats.dropped_malformed += 1;
            }
        }
    }
}
