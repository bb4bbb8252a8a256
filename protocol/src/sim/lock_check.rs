//! The lock checkers, run after every step of a simulation with a workload.
//!
//! 1. Mutual exclusion. `Majority`: never two owners that both believe (held or suspended,
//!    lease not run out) they hold conflicting modes of one lock. `Available`: the same within
//!    one view and one grantor: both granted by the current coordinator in the current view.
//! 2. Fencing tokens strictly increase per lock in grant order: cluster-wide under `Majority`,
//!    per grantor under `Available` (partitions grant independently there). The one excused
//!    case is counted, not failed: a granting view none of whose members ever heard of the
//!    epoch of the previous token (fresh processes formed a majority while every survivor of
//!    the previous granting view was out of reach); see `docs/protocol.md`.
//! 3. No lock stays held in a serving grantor's table by a member outside its view.
//! 4. Once faults stop, every request is answered and every lock released within the calm
//!    bound, and whenever the cluster is quiet the grantor's table equals what the members
//!    believe they hold (so every dropped holder was told).
//! 5. No request is granted twice.
//! 6. `Majority`: a member that has been in views without a majority for a lease waits for
//!    nothing (its waits were refused with `NoQuorum`, as jgroups-raft resigns a cut-off
//!    member's waits), judged on its own clock whenever its timers are up to date.

use std::collections::BTreeSet;

use conclave_lock_api::{FencingToken, LockMode, LockName, MemberId, RequestId, ServiceName, View};

use super::slot::SlotState;
use super::{Simulation, Violation};
use crate::endpoint::Endpoint;
use crate::locking::{CachedGrant, HoldStatus, LockMachine, LockNotice};

/// The last grant of a token key (see [`Simulation::check_tokens`]).
#[derive(Debug)]
pub(super) struct LastToken {
    /// The highest token granted (the last, save for readers of delegations side by side).
    token: FencingToken,
    /// The last token of an exclusive grant.
    exclusive: FencingToken,
    /// The grantor's incarnation.
    grantor: u128,
    /// Node starts so far at that grant.
    starts: u64,
}

/// A grant in the token log.
struct Grant {
    name: LockName,
    token: FencingToken,
    mode: LockMode,
    /// The highest epoch (or term) the granting member knew of.
    known_epoch: u64,
    /// The incarnation of the grantor (of the node grant, for a local grant from one).
    grantor: u128,
    /// A local grant from a node grant: the node grant's grantor.
    cached_from: Option<MemberId>,
    /// The epoch of the member's view when the node grant arrived (local grants only).
    granted_in: u64,
}

impl Grant {
    fn plain(
        name: LockName,
        token: FencingToken,
        known_epoch: u64,
        mode: LockMode,
        grantor: u128,
    ) -> Self {
        Self {
            name,
            token,
            mode,
            known_epoch,
            grantor,
            cached_from: None,
            granted_in: 0,
        }
    }

    fn cached(grant: CachedGrant, known_epoch: u64) -> Self {
        Self {
            name: grant.name,
            token: grant.token,
            mode: grant.mode,
            known_epoch,
            grantor: grant.granted_by.incarnation(),
            cached_from: Some(grant.granted_by),
            granted_in: grant.granted_in,
        }
    }
}

/// Every lock service of a member: the default one (`None`), then the named ones. Each is an
/// independent namespace with its own grantor, so every checker judges each on its own.
fn services(endpoint: &Endpoint) -> impl Iterator<Item = (Option<&ServiceName>, &LockMachine)> {
    std::iter::once((None, endpoint.locks()))
        .chain(endpoint.services().map(|(name, locks)| (Some(name), locks)))
}

/// A service's name for messages.
fn label(service: Option<&ServiceName>) -> String {
    service.map_or_else(|| "default service".to_owned(), |s| format!("service {s}"))
}

impl Simulation {
    pub(super) fn on_notice(&mut self, index: usize, notice: LockNotice) -> Result<(), Violation> {
        if let LockNotice::Granted { request, .. } = &notice {
            if !self.slots[index].granted.insert(*request) {
                return Err(self.violation(
                    "no client ever sees two grants for one request",
                    format!("node {index} was granted {request} twice"),
                ));
            }
        }
        if let LockNotice::Lost { .. } = &notice {
            self.report.locks_lost += 1;
        }
        if let LockNotice::Refused {
            reason: crate::locking::Refusal::NoQuorum,
            request,
            ..
        } = &notice
        {
            // A member is told it cannot be granted anything only while it is in a minority
            // (the view as of this notice: events arrive in order).
            let policy = self.config.endpoint.locks.policy;
            let len = self.slots[index].last_view_len;
            if len > 0 && policy.allows(len) {
                return Err(self.violation(
                    "a request is refused for lack of a majority only in a minority view",
                    format!("node {index} refused {request} in a majority view"),
                ));
            }
        }
        if let LockNotice::Granted { .. } = &notice {
            self.note_grant_gap();
        }
        if let Some(workload) = self.config.workload.clone() {
            let slot = &mut self.slots[index];
            for actor in &mut slot.actors {
                actor.on_notice(
                    &mut self.rng,
                    self.now,
                    &workload,
                    &notice,
                    &mut self.report.workload,
                );
            }
        }
        Ok(())
    }

    /// Availability (chaos phase only): the stretch that a grant ends, from the later of the
    /// previous grant and the start of the oldest wait.
    fn note_grant_gap(&mut self) {
        let oldest = self
            .slots
            .iter()
            .filter(|s| s.endpoint.is_some())
            .flat_map(|s| s.actors.iter())
            .filter_map(super::workload::Actor::waiting_since)
            .min();
        if let Some(oldest) = oldest.filter(|_| self.now <= self.chaos_end) {
            let gap = self
                .now
                .saturating_duration_since(oldest.max(self.last_grant));
            let w = &mut self.report.workload;
            w.longest_grant_gap = w.longest_grant_gap.max(gap);
            w.grant_gaps_over_1s += gap.saturating_sub(std::time::Duration::from_secs(1));
        }
        self.last_grant = self.now;
    }

    pub(super) fn check_locks(&mut self) -> Result<(), Violation> {
        self.check_cache()?;
        self.check_mutual_exclusion()?;
        self.check_tokens()?;
        self.check_grantor_tables()?;
        self.check_minority_waiters()?;
        if self.calm {
            self.check_consistency()?;
        }
        Ok(())
    }

    fn check_minority_waiters(&self) -> Result<(), Violation> {
        let lease = self.config.endpoint.locks.lease;
        for (index, slot) in self.slots.iter().enumerate() {
            let (Some(endpoint), Some(since)) = (&slot.endpoint, slot.minority_since) else {
                continue;
            };
            if !matches!(slot.state, SlotState::Up) {
                continue;
            }
            // Judged once the node has run its timers at or after `since + lease` (it refuses
            // its waits from the timer due then; a request made later is refused at once).
            if slot.timers_ran.is_some_and(|ran| ran >= since + lease) {
                let waiting: Vec<RequestId> = services(endpoint)
                    .flat_map(|(_, locks)| locks.pending_requests())
                    .collect();
                if !waiting.is_empty() {
                    return Err(self.violation(
                        "a member in a minority for a lease waits for nothing",
                        format!(
                            "node {index} has been in a minority since {since:?} and still waits for {waiting:?}"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_mutual_exclusion(&self) -> Result<(), Violation> {
        let majority = self.config.endpoint.locks.policy.is_majority();
        let mut holds = Vec::new();
        for (index, slot) in self.slots.iter().enumerate() {
            let Some(endpoint) = &slot.endpoint else {
                continue;
            };
            let Some(view) = endpoint.view() else {
                continue;
            };
            // Each owner's belief, judged on its own clock (a paused node's too: a lease that
            // ran out on its clock is lost, whether or not it has looked yet).
            for (service, locks) in services(endpoint) {
                for hold in locks.holds(slot.clock.local(self.now)) {
                    if hold.status == HoldStatus::Lost {
                        continue;
                    }
                    // A grant of this view's grantor: its coordinator, or a member the role was
                    // transferred to in this view (the grant arrived while the holder was in it).
                    let current_grant =
                        hold.granted_in == view.epoch() && view.contains(&hold.granted_by);
                    holds.push((index, view.id().clone(), current_grant, service, hold));
                }
            }
        }
        for (i, (a_node, a_view, a_current, a_service, a)) in holds.iter().enumerate() {
            for (b_node, b_view, b_current, b_service, b) in &holds[i + 1..] {
                if a_service != b_service
                    || a.name != b.name
                    || (a.mode == LockMode::Shared && b.mode == LockMode::Shared)
                {
                    continue;
                }
                let conflict = majority || (a_view == b_view && *a_current && *b_current);
                if conflict {
                    return Err(self.violation(
                        "mutual exclusion: no two owners believe they hold conflicting modes of one lock",
                        format!(
                            "lock {} ({}): node {a_node} holds {:?} {} ({:?}, token {}) and node {b_node} holds {:?} {} ({:?}, token {}); views {a_view} / {b_view}",
                            a.name, label(*a_service), a.mode, a.request, a.status, a.token, b.mode, b.request, b.status, b.token
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_tokens(&mut self) -> Result<(), Violation> {
        let majority = self.config.endpoint.locks.policy.is_majority();
        for index in 0..self.slots.len() {
            let Some(endpoint) = self.slots[index].endpoint.as_mut() else {
                continue;
            };
            let grantor = endpoint.local().incarnation();
            let view = endpoint.view().cloned();
            // Per service, the grantor's grants and the local grants from node grants in the
            // order made: a local grant follows the grantor's grant it counted (`after`).
            let mut log: Vec<(Option<ServiceName>, Grant)> = Vec::new();
            let mut take = |service: Option<ServiceName>, locks: &mut LockMachine| {
                let mut ordered: Vec<((u64, bool), Grant)> = Vec::new();
                for (seq, name, token, known, mode) in locks.take_grant_log() {
                    let grant = Grant::plain(name, token, known, mode, grantor);
                    ordered.push(((seq, false), grant));
                }
                for (cached, known) in locks.take_cached_grant_log() {
                    ordered.push(((cached.after, true), Grant::cached(cached, known)));
                }
                ordered.sort_by_key(|(order, _)| *order);
                log.extend(ordered.into_iter().map(|(_, g)| (service.clone(), g)));
            };
            take(None, endpoint.locks_mut());
            let names: Vec<ServiceName> = endpoint.services().map(|(n, _)| n.clone()).collect();
            for service in names {
                if let Some(locks) = endpoint.service_mut(&service) {
                    take(Some(service), locks);
                }
            }
            for (service, grant) in log {
                if let Some(by) = grant.cached_from.as_ref() {
                    // Under `Available` a node grant's block is ordered with its grantor's
                    // tokens only within one view and one grantor: while this member and the
                    // node grant's grantor are still in the view it was granted in.
                    if !majority && !self.in_grantors_view(view.as_ref(), by, grant.granted_in) {
                        continue;
                    }
                }
                self.check_token(index, service, grant, majority)?;
            }
        }
        Ok(())
    }

    /// Whether `by` (alive) and a member in `view` are in one view, of epoch `granted_in`.
    fn in_grantors_view(&self, view: Option<&View>, by: &MemberId, granted_in: u64) -> bool {
        let Some(view) = view.filter(|v| v.epoch() == granted_in && v.contains(by)) else {
            return false;
        };
        self.slots.iter().any(|slot| {
            slot.endpoint
                .as_ref()
                .is_some_and(|e| e.local() == by && e.view().is_some_and(|v| v.id() == view.id()))
        })
    }

    /// One grant in the token log: its token must exceed the last token of its key (a local
    /// grant from a read delegation: the last token of an exclusive grant, as other
    /// delegations' readers hold blocks of their own beside it).
    fn check_token(
        &mut self,
        index: usize,
        service: Option<ServiceName>,
        grant: Grant,
        majority: bool,
    ) -> Result<(), Violation> {
        let key = (
            service,
            if majority { 0 } else { grant.grantor },
            grant.name.clone(),
        );
        let delegated = grant.cached_from.is_some() && grant.mode == LockMode::Shared;
        let token = grant.token;
        if let Some(last) = self.last_tokens.get(&key) {
            let bar = if delegated {
                last.exclusive
            } else {
                last.token
            };
            // Amnesia: the grantor never heard of the previous token's epoch (or term); or,
            // under `Majority`, another grantor's term of the same or a lower number, begun
            // after a node restarted (a member in both majorities forgot the higher term it
            // had supported: see docs/protocol.md, "Tokens"). With durable terms, nothing is
            // excused under `Majority`.
            let durable = majority && self.config.durable_terms;
            let forgot = !durable
                && (grant.known_epoch < bar.epoch()
                    || (majority
                        && last.grantor != grant.grantor
                        && self.report.starts > last.starts));
            if token <= bar && forgot {
                self.report.token_amnesia += 1;
            } else if token <= bar {
                let what = match (&grant.cached_from, delegated) {
                    (None, _) => "granted",
                    (Some(_), false) => "granted from a node grant",
                    (Some(_), true) => "granted from a read delegation",
                };
                return Err(self.violation(
                    "fencing tokens strictly increase per lock in grant order",
                    format!(
                        "node {index} {what} {} with token {token} after token {bar}",
                        grant.name
                    ),
                ));
            }
        }
        let starts = self.report.starts;
        let entry = self.last_tokens.entry(key).or_insert(LastToken {
            token,
            exclusive: FencingToken::default(),
            grantor: grant.grantor,
            starts,
        });
        // Readers of delegations hold blocks side by side: the highest token so far stays.
        if !delegated || token > entry.token {
            entry.token = token;
            entry.grantor = grant.grantor;
            entry.starts = starts;
        }
        if grant.mode == LockMode::Exclusive || token < entry.exclusive {
            entry.exclusive = token;
        }
        Ok(())
    }

    fn check_grantor_tables(&self) -> Result<(), Violation> {
        type Key<'a> = (Option<&'a ServiceName>, conclave_lock_api::ViewId);
        let mut serving: std::collections::BTreeMap<Key<'_>, usize> =
            std::collections::BTreeMap::new();
        for (index, slot) in self.slots.iter().enumerate() {
            let Some(endpoint) = &slot.endpoint else {
                continue;
            };
            let Some(view) = endpoint.view() else {
                continue;
            };
            for (service, locks) in services(endpoint) {
                if !locks.is_serving() {
                    continue;
                }
                if let Some(other) = serving.insert((service, view.id().clone()), index) {
                    return Err(self.violation(
                        "one grantor per service per view: at most one member of a view serves a service",
                        format!("nodes {other} and {index} both serve the {} in {view}", label(service)),
                    ));
                }
                for (name, owner, request, _) in locks.grantor_holds() {
                    if !view.contains(&owner.member) {
                        return Err(self.violation(
                            "no lock stays held by a member that is not in the view",
                            format!("grantor node {index} of the {} has {name} held by {owner} ({request}) outside {view}", label(service)),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether the lock state has settled: every request answered, every lock released.
    pub(super) fn locks_settled(&self) -> bool {
        self.slots.iter().all(|slot| {
            let Some(endpoint) = &slot.endpoint else {
                return true;
            };
            slot.actors.iter().all(|a| a.is_idle())
                && services(endpoint).all(|(_, locks)| {
                    locks.pending_requests().is_empty()
                        && locks.pending_releases() == 0
                        && locks.holds(slot.clock.local(self.now)).is_empty()
                        && locks.grantor_holds().is_empty()
                        && !locks.is_reconciling()
                })
        })
    }

    /// When every reliable stream between view members is acknowledged, nothing is in flight: the grantor's table
    /// must then hold exactly what the members believe they hold.
    /// 7. Node caching: every local hold taken from a node grant is covered by that grant,
    ///    held by its member right now (no cached grant is used after it went back).
    fn check_cache(&self) -> Result<(), Violation> {
        for (index, slot) in self.slots.iter().enumerate() {
            let Some(endpoint) = slot.endpoint.as_ref() else {
                continue;
            };
            let orphans: Vec<_> = services(endpoint)
                .flat_map(|(_, locks)| locks.cache_orphans())
                .collect();
            if !orphans.is_empty() {
                return Err(self.violation(
                    "no lock is granted from a node grant its member no longer holds",
                    format!("node {index} holds {orphans:?} from node grants it returned or lost"),
                ));
            }
        }
        Ok(())
    }

    fn check_consistency(&self) -> Result<(), Violation> {
        for slot in &self.slots {
            match (&slot.state, &slot.endpoint) {
                (SlotState::Up, Some(e)) if e.is_settled() => {}
                _ => return Ok(()),
            }
        }
        if !self.views_converged() {
            // A crashed member may still be in the view, its locks rightly in the table
            // until it is excluded; compare only once the view holds exactly the live members.
            return Ok(());
        }
        let mut named: BTreeSet<Option<ServiceName>> = BTreeSet::from([None]);
        for slot in &self.slots {
            if let Some(endpoint) = &slot.endpoint {
                named.extend(endpoint.services().map(|(n, _)| Some(n.clone())));
            }
        }
        for service in &named {
            self.check_service_consistency(service.as_ref())?;
        }
        Ok(())
    }

    /// [`Simulation::check_consistency`] for one lock service.
    fn check_service_consistency(&self, service: Option<&ServiceName>) -> Result<(), Violation> {
        fn of<'a>(
            endpoint: &'a Endpoint,
            service: Option<&ServiceName>,
        ) -> Option<&'a LockMachine> {
            match service {
                None => Some(endpoint.locks()),
                Some(name) => endpoint.service(name),
            }
        }
        let endpoints = || self.slots.iter().filter_map(|slot| slot.endpoint.as_ref());
        if !endpoints().any(|e| of(e, service).is_some_and(LockMachine::is_serving)) {
            return Ok(());
        }
        let mut believed: BTreeSet<(MemberId, RequestId)> = BTreeSet::new();
        let mut table: BTreeSet<(MemberId, RequestId)> = BTreeSet::new();
        for endpoint in endpoints() {
            let Some(locks) = of(endpoint, service) else {
                continue;
            };
            for request in locks.member_holds() {
                believed.insert((endpoint.local().clone(), request));
            }
            if locks.is_serving() {
                for (_, owner, request, _) in locks.grantor_holds() {
                    table.insert((owner.member, request));
                }
            }
        }
        if believed != table {
            let only_members: Vec<String> = believed
                .difference(&table)
                .map(|(m, r)| format!("{m}/{r}"))
                .collect();
            let only_table: Vec<String> = table
                .difference(&believed)
                .map(|(m, r)| format!("{m}/{r}"))
                .collect();
            return Err(self.violation(
                "when the cluster is quiet, the grantor's table equals what members believe they hold",
                format!("{}: held only by members' belief: {only_members:?}; only in the grantor's table: {only_table:?}", label(service)),
            ));
        }
        Ok(())
    }
}
