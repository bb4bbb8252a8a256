//! The grantor role of the coordinator: the lock table, reconciliation and duplicate locks.
//!
//! Phases: `Idle` (not the grantor), `Reconciling` (a new grantor collects every member's
//! report and grants nothing; requests that arrive wait in a backlog) and `Serving`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use conclave_lock_api::wire::{
    GrantView, LockMessage, PendingRelease, PendingRequest, ReportedHold,
};
use conclave_lock_api::{LockMode, LockName, MemberId, OwnerId, RequestId, View};
use tracing::{debug, info, warn};

use super::lazy_ack::LazyAcks;
use super::table::{Holder, LockTable, Waiter};
use super::types::Outbox;
use crate::time::Instant;

mod pass;
mod serve;

/// Requests held back while reconciling, at most; more are dropped (their clients resend them
/// to the next grantor or report them in the next reconciliation).
const MAX_BACKLOG: usize = 100_000;

/// What the grantor needs to know about the world at each input.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub(crate) now: Instant,
    pub(crate) view: &'a View,
    /// The grantor may grant now: the partition policy allows this view to grant and, under
    /// `Majority`, the term's support is a majority and its grace period is over.
    pub(crate) policy_ok: bool,
    /// The grantor may vouch for holds now (answer renewals, resend grants): always under
    /// `Available`; under `Majority` while its term's support is a majority.
    pub(crate) lease_ok: bool,
    /// `Majority`: the grantor's term, the high half of its fencing tokens (`Available` uses
    /// the epoch of the reconciled view).
    pub(crate) term: Option<u64>,
    /// `Majority`: how long a departed member's locks stay fenced (lease + margin) after the
    /// grantor last vouched for its holds.
    pub(crate) fence: Option<Duration>,
    /// `Majority`: when the term's grace period ends (`None` before a majority supported it):
    /// by then every hold no grantor of this term vouched for has run out.
    pub(crate) grace_end: Option<Instant>,
    pub(crate) reconcile_timeout: Duration,
    /// `Majority`: the cluster size; reconciliation needs reports from a strict majority of
    /// it (members that installed the grantor's view) before the grantor may serve.
    pub(crate) quorum: Option<usize>,
    /// Per-acquisition leases: a duration a holder counted on its clock lasts at most
    /// `d × .0 / .1` on ours (the clock-rate margin, `(lease + lease_margin) / lease`).
    pub(crate) drift: (Duration, Duration),
}

/// One member's reconciliation report.
#[derive(Debug, Default)]
pub(crate) struct Report {
    held: Vec<ReportedHold>,
    pending: Vec<PendingRequest>,
    releases: Vec<PendingRelease>,
}

#[derive(Debug)]
struct Reconciliation {
    epoch: u64,
    deadline: Instant,
    awaiting: BTreeSet<MemberId>,
    reports: Vec<(MemberId, Report)>,
    backlog: Vec<(MemberId, LockMessage)>,
}

#[derive(Debug)]
enum Phase {
    Idle,
    Reconciling(Reconciliation),
    Serving,
}

/// Counters of the grantor role.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GrantorStats {
    /// Grants made.
    pub grants: u64,
    /// Grants made to a request that had to wait in the queue.
    pub contended_grants: u64,
    /// Reconciliations completed.
    pub reconciliations: u64,
    /// Holders dropped as duplicates (each told with DUPLICATE-LOCK).
    pub duplicates_resolved: u64,
    /// Reports merged after their reconciliation had finished.
    pub late_reports: u64,
    /// Node grants made (locks cached at a node).
    pub node_grants: u64,
    /// Revokes sent: node grants asked back because another owner wanted the lock.
    pub revokes: u64,
    /// Read delegations made (shared node grants).
    pub delegations: u64,
    /// Revokes of read delegations (by a writer, or after a reconciliation).
    pub delegation_revocations: u64,
    /// Holds freed because their own lease (`lock_with_lease`) ran out before their release.
    pub lease_expiries: u64,
    /// Lock tables handed over to another member (`become_grantor`).
    pub handoffs: u64,
    /// Lock tables taken over from the previous grantor of the view (`become_grantor`).
    pub transfers: u64,
    /// Lock tables taken over from a coordinator that left gracefully: its successor serves
    /// at once, without waiting for the members' reports.
    pub leave_handoffs: u64,
    /// Reconciliations whose deadline passed before every member of the view had reported
    /// (the grantor then went on with the reports it had, or asked the missing again).
    pub reconcile_timeouts: u64,
    /// Requests queued behind another owner without a `Queued` message, because they asked
    /// not to be told ([`crate::locking::LockMachine::lock_quiet`]).
    pub quiet_waits: u64,
    /// Lazy releases (nobody waits for them, such as dropped guards) whose acknowledgement
    /// was held back, to leave with a later message to their member or on its own once due
    /// (see [`crate::locking::LAZY_ACK_DELAY`]).
    pub lazy_acks: u64,
    /// One-hop handoff: grants made in advance to the waiter next in line and sent to the
    /// holder to pass on at its release ([`LockMessage::Designate`]).
    pub designations: u64,
    /// One-hop handoff: releases that passed the lock straight to its successor (the
    /// grantor completed the handoff, without a grant of its own).
    pub passes: u64,
}

impl std::ops::AddAssign for GrantorStats {
    /// Adds the counters of another lock service of the member.
    fn add_assign(&mut self, other: Self) {
        self.grants += other.grants;
        self.contended_grants += other.contended_grants;
        self.reconciliations += other.reconciliations;
        self.duplicates_resolved += other.duplicates_resolved;
        self.late_reports += other.late_reports;
        self.node_grants += other.node_grants;
        self.revokes += other.revokes;
        self.delegations += other.delegations;
        self.delegation_revocations += other.delegation_revocations;
        self.lease_expiries += other.lease_expiries;
        self.handoffs += other.handoffs;
        self.transfers += other.transfers;
        self.leave_handoffs += other.leave_handoffs;
        self.reconcile_timeouts += other.reconcile_timeouts;
        self.quiet_waits += other.quiet_waits;
        self.lazy_acks += other.lazy_acks;
        self.designations += other.designations;
        self.passes += other.passes;
    }
}

/// The most locks whose last write is remembered (for the delegation grace).
const LAST_WRITES_MAX: usize = 4096;

/// The most revokes remembered (to send each once).
const REVOKED_MAX: usize = 65_536;

/// Test-only ways to break the grantor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GrantorSabotage {
    pub(crate) grant_while_reconciling: bool,
    pub(crate) skip_liveness_recheck: bool,
    pub(crate) serve_after_handoff: bool,
    pub(crate) pass_without_fence: bool,
}

#[derive(Debug)]
pub(crate) struct Grantor {
    local: MemberId,
    phase: Phase,
    pub(crate) table: LockTable,
    /// The high half of this grantor's fencing tokens: its term, or the reconciled epoch.
    epoch: u64,
    /// The epoch of the view reconciled (reports answer it).
    view_epoch: u64,
    grace_until: Option<Instant>,
    /// The newest send stamp received from each member (its grants' leases run from it).
    stamps: BTreeMap<MemberId, u64>,
    /// When this grantor last vouched for a hold of each member (a grant, a resent grant, a
    /// renewal): that hold's lease ends at most a `lease` (on the holder's clock) after it.
    /// Kept whatever the phase; pruned once older than the fence.
    vouched: BTreeMap<MemberId, Instant>,
    /// This grantor's turn in its view: 0 after a reconciliation, one more per handoff.
    pub(crate) generation: u64,
    pub(crate) stats: GrantorStats,
    pub(crate) sabotage: GrantorSabotage,
    /// One-hop handoff ([`super::LockConfig::one_hop_handoff`]).
    pub(crate) one_hop: bool,
    /// The members (incarnations) whose requests said they take one-hop handoffs: only
    /// they are designated or told of a designation. Pruned with the view.
    handoff_takers: BTreeSet<MemberId>,
    /// When each lock was last granted for writing (delegations wait out a grace after it).
    last_write: BTreeMap<LockName, Instant>,
    /// The grace after a write during which shared node grants are plain.
    pub(crate) delegation_grace: Duration,
    /// Node grants asked back already: (member, request, token).
    revoked: BTreeSet<(MemberId, RequestId, conclave_lock_api::FencingToken)>,
    /// Acknowledgements of lazy releases held back (kept across phases: each answers a
    /// release already applied).
    pub(crate) lazy_acks: LazyAcks,
    /// Grants in the order made, for the simulator's token checker.
    #[cfg(feature = "sim")]
    /// Each with the grant's number (`stats.grants`), which orders it with local grants from
    /// node grants.
    #[allow(clippy::type_complexity)]
    pub(crate) grant_log: Vec<(u64, LockName, conclave_lock_api::FencingToken, LockMode)>,
}

impl Grantor {
    pub(crate) fn new(local: MemberId) -> Self {
        Self {
            local,
            phase: Phase::Idle,
            table: LockTable::default(),
            revoked: BTreeSet::new(),
            lazy_acks: LazyAcks::default(),
            last_write: BTreeMap::new(),
            delegation_grace: Duration::from_secs(1),
            epoch: 0,
            view_epoch: 0,
            grace_until: None,
            stamps: BTreeMap::new(),
            vouched: BTreeMap::new(),
            generation: 0,
            stats: GrantorStats::default(),
            sabotage: GrantorSabotage::default(),
            one_hop: false,
            handoff_takers: BTreeSet::new(),
            #[cfg(feature = "sim")]
            grant_log: Vec::new(),
        }
    }

    pub(crate) fn is_active(&self) -> bool {
        !matches!(self.phase, Phase::Idle)
    }

    pub(crate) fn is_serving(&self) -> bool {
        matches!(self.phase, Phase::Serving)
    }

    pub(crate) fn is_reconciling(&self) -> bool {
        matches!(self.phase, Phase::Reconciling(_))
    }

    fn may_grant(&self, ctx: &Ctx<'_>) -> bool {
        if self.sabotage.grant_while_reconciling {
            // The historical bug: serve at once from whatever table there is.
            return self.is_active() && ctx.policy_ok && !self.exhausted();
        }
        self.is_serving()
            && ctx.policy_ok
            && self.grace_until.is_none_or(|t| ctx.now >= t)
            && !self.exhausted()
    }

    /// Whether this grantor's term (`Available`: its reconciled epoch) has no tokens left: a
    /// node grant's block no longer fits under it. It grants nothing more (requests wait,
    /// tries are denied as unavailable) until it starts again with a higher one: at once
    /// under `Majority` (a new term), at the next view under `Available`.
    pub(crate) fn exhausted(&self) -> bool {
        self.is_active() && self.table.exhausted(self.epoch)
    }

    /// Becomes the grantor (or restarts after a merge): asks every member for its report.
    pub(crate) fn start(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        let epoch = ctx.view.epoch();
        info!(grantor = %self.local, epoch, term = ?ctx.term, members = ctx.view.len(), "reconciling the lock table");
        // Requests held back by a reconciliation that is starting over still wait.
        let backlog = match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Reconciling(r) => r.backlog,
            _ => Vec::new(),
        };
        self.epoch = ctx.term.unwrap_or(epoch);
        self.view_epoch = epoch;
        self.generation = 0;
        self.table.clear();
        self.stamps.retain(|m, _| ctx.view.contains(m));
        self.handoff_takers.retain(|m| ctx.view.contains(m));
        self.grace_until = ctx.fence.map(|d| ctx.now + d);
        let awaiting: BTreeSet<MemberId> = ctx.view.members().iter().cloned().collect();
        for member in &awaiting {
            out.push_back((member.clone(), LockMessage::LockInfoRequest { epoch }));
        }
        self.phase = Phase::Reconciling(Reconciliation {
            epoch,
            deadline: ctx.now + ctx.reconcile_timeout,
            awaiting,
            reports: Vec::new(),
            backlog,
        });
    }

    /// Sets the end of the grace period of the reconciliation just started (a named
    /// service's: the member's term's, see `LockMachine::begin_term`).
    pub(crate) fn set_grace(&mut self, until: Option<Instant>) {
        self.grace_until = until;
    }

    /// Hands the table over (`become_grantor` of another member): returns the handoff for the
    /// new grantor and stops granting at once. Only a serving grantor hands over.
    pub(crate) fn hand_off(&mut self, ctx: &Ctx<'_>) -> Option<LockMessage> {
        self.hand_off_in(ctx, ctx.view, self.generation + 1)
    }

    /// Hands the table over to the grantor of turn `generation` of `view` (this grantor's view
    /// for a transfer; the next view, with turn 0, for a coordinator that leaves): returns the
    /// handoff and stops granting at once. Only a serving grantor hands over.
    pub(crate) fn hand_off_in(
        &mut self,
        ctx: &Ctx<'_>,
        view: &View,
        generation: u64,
    ) -> Option<LockMessage> {
        if !self.is_serving() {
            return None;
        }
        let mut held = Vec::new();
        for (name, h) in self.table.holders() {
            held.push(ReportedHold {
                request: h.request,
                name: name.clone(),
                owner: h.owner.clone(),
                mode: h.mode,
                token: h.token,
                lease_ms: h
                    .lease_until
                    .map(|t| millis_up(t.saturating_duration_since(ctx.now))),
            });
        }
        let waiting = self
            .table
            .waiters()
            .map(|(name, w)| PendingRequest {
                request: w.request,
                name: name.clone(),
                owner: w.owner.clone(),
                mode: w.mode,
                wait: true,
                lease_ms: w.lease.map(millis_up),
            })
            .collect();
        let handoff = LockMessage::Handoff {
            epoch: view.epoch(),
            coordinator: view.coordinator().incarnation(),
            token_epoch: self.epoch,
            last_token: self.table.last_token(),
            held,
            waiting,
            generation,
        };
        self.stats.handoffs += 1;
        info!(grantor = %self.local, "lock table handed over");
        if !self.sabotage.serve_after_handoff {
            self.stop();
        }
        Some(handoff)
    }

    /// Takes over the table the previous grantor of this view handed over, and serves.
    pub(crate) fn adopt(&mut self, ctx: &Ctx<'_>, handoff: LockMessage, out: &mut Outbox) {
        if !self.load(ctx, handoff) {
            return;
        }
        self.stats.transfers += 1;
        info!(grantor = %self.local, locks = self.table.len(), "lock table taken over; serving");
        self.promote_all(ctx, out);
    }

    /// Makes the table of a handoff this grantor's, serving (nothing granted yet). False if the
    /// message is no handoff.
    fn load(&mut self, ctx: &Ctx<'_>, handoff: LockMessage) -> bool {
        let LockMessage::Handoff {
            token_epoch,
            last_token,
            held,
            waiting,
            generation,
            ..
        } = handoff
        else {
            return false;
        };
        self.generation = generation;
        self.phase = Phase::Serving;
        self.epoch = token_epoch;
        self.view_epoch = ctx.view.epoch();
        self.grace_until = None;
        self.stamps.clear();
        self.table.clear();
        self.table.observe_token(last_token);
        for h in &held {
            if ctx.view.contains(&h.owner.member) {
                self.table.insert_holder(&h.name, holder_of(h, ctx));
            }
        }
        for w in waiting {
            if ctx.view.contains(&w.owner.member) {
                self.table.enqueue(
                    &w.name,
                    Waiter {
                        owner: w.owner,
                        mode: w.mode,
                        request: w.request,
                        lease: w.lease_ms.map(Duration::from_millis),
                    },
                );
            }
        }
        true
    }

    /// Takes over the table of the coordinator that left gracefully and handed its view to
    /// this member, and serves at once: the reconciliation the view began is over (reports
    /// received so far, and those still on their way, are merged like late reports; requests
    /// that waited in its backlog are served). Only while that reconciliation runs: a grantor
    /// that finished it already has a complete table. Returns whether it took the table.
    ///
    /// The handed table is as complete as the leaver's was: it applied everything its members
    /// sent it until it handed over, and granted nothing after; what they sent it since goes
    /// again to this member, their new grantor, when they install the view.
    pub(crate) fn take_over_on_leave(
        &mut self,
        ctx: &Ctx<'_>,
        handoff: LockMessage,
        out: &mut Outbox,
    ) -> bool {
        let Phase::Reconciling(reconciliation) = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return false;
        };
        if !self.load(ctx, handoff) {
            self.phase = Phase::Reconciling(reconciliation);
            return false;
        }
        self.stats.leave_handoffs += 1;
        info!(grantor = %self.local, locks = self.table.len(), "lock table taken over from the coordinator that left; serving");
        // Tokens carry this view's epoch from now on (the counter keeps them increasing).
        self.epoch = self.epoch.max(ctx.view.epoch());
        for (member, report) in reconciliation.reports {
            if ctx.view.contains(&member) {
                self.merge_report(ctx, &member, report, out);
            }
        }
        for (from, message) in reconciliation.backlog {
            if ctx.view.contains(&from) {
                self.serve(ctx, &from, message, out);
            }
        }
        self.promote_all(ctx, out);
        true
    }

    /// Stops being the grantor: forgets the table (the next grantor rebuilds it).
    pub(crate) fn stop(&mut self) {
        if self.is_active() {
            debug!(grantor = %self.local, "no longer the grantor");
        }
        self.phase = Phase::Idle;
        self.table.clear();
        self.grace_until = None;
        self.stamps.clear();
        self.handoff_takers.clear();
    }

    /// A view change that keeps this member grantor (no merge): drop departed members.
    pub(crate) fn view_changed(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        // Under `Majority` tokens keep the term. Under `Available` they follow the view: a
        // grantor that stays grantor moves its tokens' high half up to the new view's epoch
        // (its counter keeps them increasing), so they rank with the epochs views are numbered
        // by. Otherwise the side that kept the coordinator, which reconciles nothing when a
        // member is cut off, would grant below the cut-off member's takeover view.
        if ctx.term.is_none() {
            self.epoch = self.epoch.max(ctx.view.epoch());
        }
        if self.is_reconciling() {
            // Reports certify the view they answer; start over for the new one (members
            // answer only the request of the view they are in).
            self.start(ctx, out);
            return;
        }
        self.handoff_takers.retain(|m| ctx.view.contains(m));
        if !self.is_serving() {
            return;
        }
        let departed: BTreeSet<MemberId> = self
            .table
            .holders()
            .map(|(_, h)| h.owner.member.clone())
            .filter(|m| !ctx.view.contains(m))
            .collect();
        for member in &departed {
            let fenced_until = self.fenced_until(ctx, member);
            let locks = self.table.remove_holders_of(member, fenced_until);
            debug!(%member, locks = locks.len(), ?fenced_until, "departed member's locks freed");
        }
        // Only vouches within a fence of now can still fence anything. They are kept across
        // phases and terms otherwise: a hold this grantor vouched for may come back in a
        // report (a named service can reconcile again within one term of its member).
        if let Some(fence) = ctx.fence {
            self.vouched.retain(|_, at| *at + fence > ctx.now);
        }
        self.drop_departed_successors(ctx, out);
        self.promote_all(ctx, out);
        // Waiters of departed members that promotion did not reach.
        self.table.remove_waiters(|m| ctx.view.contains(m));
    }

    /// `Majority`: until when the locks of `member`, removed from the view, stay fenced: its
    /// holds' leases all end by then. Each ran from a stamp `member` sent before this grantor
    /// last vouched for it, or, if this grantor never did, was last confirmed by an earlier
    /// term and ended by this term's grace end (the same bound as the grace period itself).
    /// Without a grace end yet, a full fence from now.
    fn fenced_until(&self, ctx: &Ctx<'_>, member: &MemberId) -> Option<Instant> {
        let fence = ctx.fence?;
        let Some(grace_end) = ctx.grace_end else {
            return Some(ctx.now + fence);
        };
        let vouched = self.vouched.get(member).map(|at| *at + fence);
        Some(vouched.map_or(grace_end, |v| v.max(grace_end)))
    }

    /// Records that this grantor vouches for a hold of `member` now (just before it sends the
    /// grant or the renewal).
    fn vouch(&mut self, member: &MemberId, now: Instant) {
        self.vouched.insert(member.clone(), now);
    }

    /// Handles a message for the grantor role from `from`.
    pub(crate) fn handle(
        &mut self,
        ctx: &Ctx<'_>,
        from: &MemberId,
        message: LockMessage,
        out: &mut Outbox,
    ) {
        if !ctx.view.contains(from) {
            debug!(%from, "lock message from a non-member; dropped");
            return;
        }
        if let LockMessage::Lock { stamp, .. }
        | LockMessage::Renew { stamp, .. }
        | LockMessage::ExtendLease { stamp, .. } = &message
        {
            let newest = self.stamps.entry(from.clone()).or_insert(*stamp);
            *newest = (*newest).max(*stamp);
        }
        match message {
            LockMessage::Renew { stamp, held } => {
                // Vouch only for holds in the table, and only while the term is supported: the
                // holder's lease then runs from the renewal's send time, which precedes now.
                if self.is_serving() && ctx.lease_ok {
                    let held = held
                        .into_iter()
                        .filter(|r| self.table.holds_request(from, *r))
                        .collect();
                    self.vouch(from, ctx.now);
                    out.push_back((from.clone(), LockMessage::Renewed { stamp, held }));
                }
            }
            LockMessage::LockInfoResponse {
                epoch,
                held,
                pending,
                releases,
            } => {
                let report = Report {
                    held,
                    pending,
                    releases,
                };
                match &mut self.phase {
                    Phase::Reconciling(r) if r.epoch == epoch => {
                        if r.awaiting.remove(from) {
                            r.reports.push((from.clone(), report));
                        }
                        self.maybe_finish(ctx, out);
                    }
                    Phase::Serving if epoch == self.view_epoch => {
                        debug!(%from, "late lock report merged");
                        self.stats.late_reports += 1;
                        self.merge_report(ctx, from, report, out);
                        self.promote_all(ctx, out);
                    }
                    _ => {}
                }
            }
            // A member's statement of what it holds is true when it is sent: applied later
            // (after the reports of a reconciliation that began meanwhile) it would drop what
            // the member asked for since. A reconciling table is rebuilt from reports anyway.
            LockMessage::Holding { .. } if !self.is_serving() => {}
            message => {
                if let Phase::Reconciling(r) = &mut self.phase {
                    if !self.sabotage.grant_while_reconciling {
                        if r.backlog.len() < MAX_BACKLOG {
                            r.backlog.push((from.clone(), message));
                        } else {
                            warn!(%from, "reconciliation backlog full; request dropped");
                        }
                        return;
                    }
                }
                if self.is_active() {
                    self.serve(ctx, from, message, out);
                }
            }
        }
    }

    /// Timers: the reconciliation deadline, the end of the grace period, fenced locks.
    pub(crate) fn handle_timeout(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        if let Phase::Reconciling(r) = &mut self.phase {
            if ctx.now < r.deadline {
                return;
            }
            if !r.awaiting.is_empty() {
                self.stats.reconcile_timeouts += 1;
            }
            if has_quorum(ctx, r) {
                info!(grantor = %self.local, missing = r.awaiting.len(), "reconciliation timed out; using the reports received");
                self.finish(ctx, out);
            } else {
                // Without reports from a majority this epoch may not grant: ask again.
                r.deadline = ctx.now + ctx.reconcile_timeout;
                for member in &r.awaiting {
                    out.push_back((
                        member.clone(),
                        LockMessage::LockInfoRequest { epoch: r.epoch },
                    ));
                }
            }
            return;
        }
        self.expire_leases(ctx, out);
        self.promote_all(ctx, out);
    }

    /// Frees every hold whose own lease ran out. Its holder has already counted it lost on its
    /// own clock (its deadline runs from a send time before the grant, shortened by the
    /// clock-rate margin); a release it sends later is acknowledged as usual.
    fn expire_leases(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        if !self.is_serving() {
            return;
        }
        for (name, holder) in self.table.expire_leases(ctx.now) {
            info!(lock = %name, owner = %holder.owner, token = %holder.token, "lease ran out; lock freed");
            self.stats.lease_expiries += 1;
            self.promote(ctx, &name, out);
            self.table.forget_if_unused(&name, ctx.now);
        }
    }

    pub(crate) fn poll_timeout(&self, now: Instant) -> Option<Instant> {
        match &self.phase {
            Phase::Idle => None,
            Phase::Reconciling(r) => Some(r.deadline),
            Phase::Serving => {
                let grace = self
                    .grace_until
                    .filter(|t| *t > now && self.table.waiting() > 0);
                [
                    grace,
                    self.table.next_not_before(now),
                    self.table.next_lease_expiry(),
                ]
                .into_iter()
                .flatten()
                .min()
            }
        }
    }

    fn maybe_finish(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        if matches!(&self.phase, Phase::Reconciling(r) if r.awaiting.is_empty() && has_quorum(ctx, r))
        {
            self.finish(ctx, out);
        }
    }

    /// Rebuilds the table from the reports, resolves duplicates, applies releases, queues
    /// pending requests, then serves the backlog.
    fn finish(&mut self, ctx: &Ctx<'_>, out: &mut Outbox) {
        let Phase::Reconciling(r) = std::mem::replace(&mut self.phase, Phase::Serving) else {
            return;
        };
        self.stats.reconciliations += 1;
        self.table.clear();
        let mut reports: Vec<(MemberId, Report)> = r
            .reports
            .into_iter()
            .filter(|(m, _)| ctx.view.contains(m))
            .collect();
        reports.sort_by_key(|(m, _)| ctx.view.rank(m));
        self.settle_held(ctx, &reports, out);
        for (member, report) in reports {
            self.apply_releases_and_requests(ctx, &member, report, out);
        }
        info!(grantor = %self.local, locks = self.table.len(), "lock table rebuilt; serving");
        for (from, message) in r.backlog {
            if ctx.view.contains(&from) {
                self.serve(ctx, &from, message, out);
            }
        }
        self.promote_all(ctx, out);
        self.revoke_delegations(out);
    }

    /// Merges a report that arrived after its reconciliation finished.
    fn merge_report(&mut self, ctx: &Ctx<'_>, member: &MemberId, report: Report, out: &mut Outbox) {
        let reports = [(member.clone(), report)];
        self.settle_held(ctx, &reports, out);
        let [(member, report)] = reports;
        self.apply_releases_and_requests(ctx, &member, report, out);
    }

    /// Adds the locks the reports say are held (each member speaks only for its own owners)
    /// to the table, lock by lock, through the duplicate rule.
    fn settle_held(&mut self, ctx: &Ctx<'_>, reports: &[(MemberId, Report)], out: &mut Outbox) {
        let mut by_name: BTreeMap<LockName, Vec<Holder>> = BTreeMap::new();
        for (member, report) in reports {
            for h in &report.held {
                let known = self.table.holder(&h.name, member, h.request).is_some();
                if h.owner.member == *member && !known {
                    by_name
                        .entry(h.name.clone())
                        .or_default()
                        .push(holder_of(h, ctx));
                }
            }
        }
        for (name, incoming) in by_name {
            self.settle(&name, incoming, out);
        }
    }

    /// Puts `incoming` holders of `name` into the table beside the current ones, keeping one
    /// side of every conflict by the duplicate rule and telling the dropped holders.
    fn settle(&mut self, name: &LockName, incoming: Vec<Holder>, out: &mut Outbox) {
        let mut all = self.table.take_holders(name);
        all.extend(incoming);
        let (kept, dropped) = resolve_duplicates(all);
        for holder in kept {
            self.table.insert_holder(name, holder);
        }
        for loser in dropped {
            info!(lock = %name, owner = %loser.owner, token = %loser.token, "duplicate lock; telling the holder");
            self.stats.duplicates_resolved += 1;
            self.table.observe_token(loser.token);
            out.push_back((
                loser.owner.member.clone(),
                LockMessage::DuplicateLock {
                    name: name.clone(),
                    owner: loser.owner,
                    token: loser.token,
                },
            ));
        }
    }

    fn apply_releases_and_requests(
        &mut self,
        ctx: &Ctx<'_>,
        member: &MemberId,
        report: Report,
        out: &mut Outbox,
    ) {
        for release in report.releases {
            if release.owner.member == *member {
                self.serve(
                    ctx,
                    member,
                    LockMessage::Unlock {
                        request: release.request,
                        name: release.name,
                        owner: release.owner,
                        token: release.token,
                        lazy: false,
                        passed_to: None,
                    },
                    out,
                );
            }
        }
        let mut pending = report.pending;
        pending.sort_by_key(|p| p.request);
        for p in pending {
            if p.owner.member == *member {
                self.serve(
                    ctx,
                    member,
                    LockMessage::Lock {
                        request: p.request,
                        name: p.name,
                        owner: p.owner,
                        mode: p.mode,
                        wait: p.wait,
                        stamp: 0,
                        lease_ms: p.lease_ms,
                        quiet: false,
                        passes: false,
                    },
                    out,
                );
            }
        }
    }

    /// Every hold in the table, for checkers and status queries.
    pub(crate) fn holds(&self) -> impl Iterator<Item = (&LockName, &OwnerId, RequestId, LockMode)> {
        self.table
            .holders()
            .map(|(name, h)| (name, &h.owner, h.request, h.mode))
    }
}

/// `d` in whole milliseconds, rounded down (what a holder may count on).
fn millis_down(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `d` in whole milliseconds, rounded up.
fn millis_up(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// Whether the reports received come from a strict majority of the cluster (`Majority`), or
/// always (`Available`).
fn has_quorum(ctx: &Ctx<'_>, r: &Reconciliation) -> bool {
    ctx.quorum
        .is_none_or(|cluster_size| r.reports.len() * 2 > cluster_size)
}

/// A holder as a member reported it. Its remaining lease was counted on the holder's clock
/// when it sent the report, before now: counted from now and scaled up by the clock-rate
/// margin, it runs out after the holder's own deadline.
fn holder_of(h: &ReportedHold, ctx: &Ctx<'_>) -> Holder {
    Holder {
        owner: h.owner.clone(),
        mode: h.mode,
        token: h.token,
        request: h.request,
        lease_until: h.lease_ms.map(|ms| {
            ctx.now + super::lease::scale(Duration::from_millis(ms), ctx.drift.0, ctx.drift.1)
        }),
    }
}

/// The duplicate-lock rule. Among conflicting holders of one lock, the one with the highest
/// fencing token is kept (ties: the lowest owner id): a resource that checks tokens has already
/// seen that token, so every other holder's writes are rejected there anyway. If the kept holder
/// is shared, every shared holder is kept; otherwise it is kept alone.
pub(crate) fn resolve_duplicates(mut holders: Vec<Holder>) -> (Vec<Holder>, Vec<Holder>) {
    holders.sort_by(|a, b| (Reverse(a.token), &a.owner).cmp(&(Reverse(b.token), &b.owner)));
    let Some(winner) = holders.first() else {
        return (Vec::new(), Vec::new());
    };
    if winner.mode == LockMode::Shared {
        holders
            .into_iter()
            .partition(|h| h.mode == LockMode::Shared)
    } else {
        let mut rest = holders;
        let kept = rest.remove(0);
        (vec![kept], rest)
    }
}

/// `view` as grants name it.
pub(crate) fn grant_view(view: &View) -> GrantView {
    GrantView {
        epoch: view.epoch(),
        coordinator: view.coordinator().incarnation(),
    }
}

#[cfg(test)]
mod tests;
