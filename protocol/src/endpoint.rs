//! One member's whole protocol stack on the wire: membership over reliable delivery.
//!
//! [`Endpoint`] takes datagrams in and gives datagrams out. It decodes and validates every
//! datagram, feeds discovery and heartbeats to [`Gms`], data segments and acks to
//! [`Reliable`], and reliably delivered messages back to [`Gms`]. The driver of `conclave` and
//! the simulator drive exactly this type.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use conclave_lock_api::wire::{
    self, ClusterId, DecodeError, Frame, LockMessage, Message, Packet, SharedSetting,
    PACKET_OVERHEAD_MAX, PROTOCOL_VERSION,
};
use conclave_lock_api::{MemberId, RequestId, ServiceName, View};
use tracing::{debug, trace, warn};

use crate::gms::{
    Founding, Gms, GmsConfig, GmsEvent, GmsOutput, GmsStats, JoinProblem, MembershipState,
    ViewOrigin,
};
use crate::locking::{
    service_index, Authority, GrantorStats, HoldInfo, HoldStatus, LockConfig, LockNotice,
    LockRequest, LockService, NotHeld,
};
use crate::reliable::{self, Reliable};
use crate::time::Instant;

/// The configuration of every layer of an [`Endpoint`].
#[derive(Clone, Debug, Default)]
pub struct EndpointConfig {
    /// Membership timing.
    pub gms: GmsConfig,
    /// Reliable delivery: windows, retransmission, memory bounds.
    pub reliable: reliable::Config,
    /// Locking: partition policy, reconciliation, leases.
    pub locks: LockConfig,
}

impl EndpointConfig {
    /// Fast timings for tests on one host (see [`GmsConfig::local`]).
    pub fn local() -> Self {
        Self {
            gms: GmsConfig::local(),
            reliable: reliable::Config::default(),
            locks: LockConfig::local(),
        }
    }
}

/// The most named lock services one member runs (opened here or by messages of other members).
/// Messages for a further service are dropped.
pub const MAX_SERVICES: usize = 256;

/// [`Endpoint::open_service`]: the member already runs [`MAX_SERVICES`] named services.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this member already runs the most named lock services ({MAX_SERVICES})")]
pub struct TooManyServices;

/// [`Endpoint::become_grantor_in`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceTransferError {
    /// The service is not open and cannot be opened.
    #[error(transparent)]
    TooManyServices(#[from] TooManyServices),
    /// The transfer itself was refused.
    #[error(transparent)]
    Refused(#[from] crate::locking::TransferRefused),
}

/// Where a datagram goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    /// One member, at its transport address.
    Member(SocketAddr),
    /// The discovery channel (multicast group or seed list).
    Discovery,
}

/// A datagram to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub destination: Destination,
    /// The encoded datagram, header included.
    pub bytes: Vec<u8>,
}

/// Something the application should know about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointEvent {
    /// A new view was installed at this member.
    ViewInstalled {
        /// The view.
        view: View,
        /// How it came to be.
        origin: ViewOrigin,
    },
    /// This member has left the cluster.
    Left,
    /// This joiner cannot join (yet): nobody answered and it may not found a cluster alone, or
    /// a coordinator refused it for a setting. It keeps looking.
    JoinProblem(JoinProblem),
    /// A lock request was answered or a held lock changed, in the default lock service.
    Lock(LockNotice),
    /// The same, in a named lock service.
    ServiceLock {
        /// The service.
        service: ServiceName,
        /// What happened.
        notice: LockNotice,
    },
}

/// The settings of `config` that every member of a cluster must share, by name and value:
/// `protocol_version`, `partition_policy` (with the cluster size under `Majority`), `lease`,
/// and under `Majority` also `lease_margin` and `support_lease`, which its mutual exclusion
/// rests on. A coordinator refuses a joiner, and does not merge with a view, whose value of
/// one of them differs (the timings of membership and caching may differ between members).
///
/// ```
/// use conclave_protocol::locking::{LockConfig, PartitionPolicy};
///
/// let config = LockConfig { policy: PartitionPolicy::Majority { cluster_size: 3 }, ..LockConfig::default() };
/// let settings = conclave_protocol::shared_settings(&config);
/// let policy = settings.iter().find(|s| s.name == "partition_policy").unwrap();
/// assert_eq!(policy.value, "Majority { cluster_size: 3 }");
/// ```
pub fn shared_settings(config: &LockConfig) -> Vec<SharedSetting> {
    let setting = |name: &str, value: String| SharedSetting {
        name: name.to_owned(),
        value,
    };
    let mut settings = vec![
        setting("protocol_version", PROTOCOL_VERSION.to_string()),
        setting("partition_policy", format!("{:?}", config.policy)),
        setting("lease", format!("{:?}", config.lease)),
    ];
    if config.policy.is_majority() {
        settings.push(setting(
            "lease_margin",
            format!("{:?}", config.lease_margin),
        ));
        settings.push(setting(
            "support_lease",
            format!("{:?}", config.support_lease),
        ));
    }
    settings
}

/// Counters of the endpoint and its layers.
#[derive(Clone, Debug, Default)]
pub struct EndpointStats {
    /// Membership counters.
    pub gms: GmsStats,
    /// Reliable-delivery counters.
    pub reliable: reliable::Stats,
    /// Grantor counters.
    pub grantor: GrantorStats,
    /// Node-level caching counters.
    pub cache: crate::locking::CacheStats,
    /// Holds of this member lost because their own lease (`lock_with_lease`) ran out.
    pub leases_expired: u64,
    /// Datagrams dropped because they belong to another cluster.
    pub dropped_foreign: u64,
    /// Datagrams dropped because of an unsupported protocol version.
    pub dropped_version: u64,
    /// Datagrams or messages dropped as malformed (bad magic, truncated, bad CBOR, too large).
    pub dropped_malformed: u64,
}

/// One member's whole protocol stack on the wire: it decodes and validates every datagram,
/// feeds discovery and heartbeats to [`Gms`], data segments and acks to [`Reliable`], delivered
/// messages to [`Gms`] or [`LockService`], and encodes what they send.
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
    locks: LockService,
    /// Named lock services, each with its own grantor, by name.
    services: BTreeMap<ServiceName, LockService>,
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
            locks: LockService::new(local.clone(), config.locks.clone()),
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
        let mut grantor = self.locks.grantor_stats();
        let mut cache = self.locks.cache_stats();
        let mut leases_expired = self.locks.leases_expired();
        for service in self.services.values() {
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
    pub fn locks(&self) -> &LockService {
        &self.locks
    }

    /// The locking layer, to break it on purpose or read its grant log in simulator tests.
    #[cfg(feature = "sim")]
    pub fn locks_mut(&mut self) -> &mut LockService {
        &mut self.locks
    }

    /// Breaks the locking protocol on purpose in every lock service, present and future
    /// (simulator tests of the checkers only).
    #[cfg(feature = "sim")]
    pub fn set_lock_sabotage(&mut self, sabotage: crate::locking::LockSabotage) {
        self.lock_sabotage = sabotage;
        self.locks.set_sabotage(sabotage);
        for service in self.services.values_mut() {
            service.set_sabotage(sabotage);
        }
    }

    /// A named lock service, if this member runs it.
    pub fn service(&self, name: &ServiceName) -> Option<&LockService> {
        self.services.get(name)
    }

    /// A named lock service, to break it on purpose or read its grant log in simulator tests.
    #[cfg(feature = "sim")]
    pub fn service_mut(&mut self, name: &ServiceName) -> Option<&mut LockService> {
        self.services.get_mut(name)
    }

    /// The named lock services this member runs, by name.
    pub fn services(&self) -> impl Iterator<Item = (&ServiceName, &LockService)> {
        self.services.iter()
    }

    /// Opens the named lock service `name` on this member (if it does not run it already):
    /// an independent namespace of locks with its own grantor (the view's coordinator unless
    /// transferred), reconciliation, table and notices ([`EndpointEvent::ServiceLock`]). A
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
    fn open_service_quietly(
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
            LockService::for_service(self.local.clone(), self.lock_config.clone(), index);
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
    fn service_at(
        &mut self,
        now: Instant,
        service: Option<&ServiceName>,
    ) -> Option<&mut LockService> {
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
    fn opened(
        &mut self,
        now: Instant,
        service: &ServiceName,
    ) -> Result<&mut LockService, TooManyServices> {
        self.open_service_quietly(now, service)?;
        self.service_at(now, Some(service)).ok_or(TooManyServices)
    }

    /// The lock service a request id belongs to, with its authority as of `now`.
    fn service_for(&mut self, now: Instant, id: u64) -> Option<&mut LockService> {
        let name = self.service_of(id).cloned();
        self.service_at(now, name.as_ref())
    }

    /// The lock service a request id belongs to, read-only.
    fn service_ref(&self, id: u64) -> &LockService {
        self.service_of(id)
            .and_then(|name| self.services.get(name))
            .unwrap_or(&self.locks)
    }

    /// Asks for a lock; the answer comes as [`EndpointEvent::Lock`]. See [`LockService::lock`].
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
    /// service) or [`EndpointEvent::ServiceLock`]. See [`LockService::lock_quiet`].
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

    /// Asks the grantor for its lock table. See [`LockService::query_table`].
    pub fn query_table(&mut self, now: Instant) -> u64 {
        let query = self.locks.query_table(now);
        self.pump(now);
        query
    }

    /// Withdraws a pending lock request. See [`LockService::cancel`].
    pub fn cancel(&mut self, now: Instant, request: RequestId) {
        if let Some(locks) = self.service_for(now, request.0) {
            locks.cancel(now, request);
        }
        self.pump(now);
    }

    /// Releases the lock acquired by `request`. See [`LockService::unlock`].
    ///
    /// # Errors
    /// [`NotHeld`] if the request holds no lock here.
    pub fn unlock(&mut self, now: Instant, request: RequestId) -> Result<(), NotHeld> {
        self.release(now, request, false)
    }

    /// Releases the lock acquired by `request` without waiting for the acknowledgement (a
    /// guard dropped). See [`LockService::unlock_lazy`].
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
    /// See [`LockService::extend_lease`].
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

    /// Asks for the grantor role of this member's view. See [`LockService::become_grantor`].
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
        self.locks.shutdown(now);
        for service in self.services.values_mut() {
            service.shutdown(now);
        }
        self.pump(now);
        self.gms.leave(now);
        // The view goes out first: the handoffs must reach the successor after it.
        self.pump(now);
        let next = self.gms.handover().cloned();
        self.locks.leave(now, next.as_ref());
        for service in self.services.values_mut() {
            service.leave(now, next.as_ref());
        }
        self.pump(now);
    }

    /// Handles one received datagram. Foreign, malformed or hostile input is dropped with a
    /// `tracing` event and counted; it never panics.
    pub fn handle_datagram(&mut self, now: Instant, bytes: &[u8]) {
        let packet = match wire::decode_packet(self.cluster, bytes) {
            Ok(packet) => packet,
            Err(error) => return self.count_drop(&error),
        };
        let Packet { sender, frame } = packet;
        if sender == self.local {
            return; // our own multicast, looped back
        }
        match frame {
            Frame::Discovery(discovery) => self.gms.handle_discovery(now, &sender, discovery),
            Frame::Heartbeat {
                epoch,
                view_epoch,
                coordinator,
                lease,
            } => {
                self.locks.note_alive(now, &sender);
                for service in self.services.values_mut() {
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
                self.transmit(Destination::Member(to.addr()), frame);
            }
        }
        self.transmits.pop_front()
    }

    /// `Majority`: restores the highest term this member promised in an earlier life (read
    /// from the stable storage [`Endpoint::poll_durable_term`] fills). Call it after
    /// [`Endpoint::new`], before [`Endpoint::join`].
    pub fn restore_term(&mut self, term: u64) {
        self.locks.restore_term(term);
        for service in self.services.values_mut() {
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
            self.locks.poll_timeout(),
            self.departed.values().min().copied(),
        ]
        .into_iter()
        .chain(self.services.values().map(LockService::poll_timeout))
        .flatten()
        .min()
    }

    /// Moves outputs between the layers until none has anything left.
    fn pump(&mut self, now: Instant) {
        loop {
            let mut progressed = false;
            // Under `Available` a grantor whose tokens ran out for its epoch grants again only
            // in a view with a higher one: as coordinator, install the same members again.
            let wanted = std::iter::once(self.locks.needs_new_view())
                .chain(self.services.values().map(LockService::needs_new_view))
                .flatten()
                .max();
            if let Some(at_least) = wanted {
                self.gms.renew_view(now, at_least);
            }
            let max_epoch = self.gms.max_epoch_seen();
            self.locks.observe_epoch(now, max_epoch);
            for service in self.services.values_mut() {
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
                    Frame::Heartbeat {
                        epoch,
                        view_epoch,
                        coordinator,
                        lease,
                    },
                );
            }
            GmsOutput::Discover(discovery) => {
                self.transmit(Destination::Discovery, Frame::Discovery(discovery));
            }
            GmsOutput::DiscoveryReply { to, discovery } => {
                self.transmit(Destination::Member(to), Frame::Discovery(discovery));
            }
            GmsOutput::Forget(member) => self.reliable.remove_peer(&member),
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
        let bytes = match wire::encode_message(&message) {
            Ok(bytes) => bytes,
            Err(error) => return warn!(%error, "could not encode a message"),
        };
        if let Err(error) = self.reliable.send(now, to, bytes) {
            warn!(%to, %error, "could not queue a message");
        }
    }

    fn transmit(&mut self, destination: Destination, frame: Frame) {
        let packet = Packet {
            sender: self.local.clone(),
            frame,
        };
        match wire::encode_packet(self.cluster, &packet) {
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
