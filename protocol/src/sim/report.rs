//! What a simulation run exercised, and how it failed.

use std::fmt;
use std::time::Duration;

use super::faults::FaultStats;
use super::network::NetworkStats;
use super::workload::WorkloadStats;
use crate::endpoint::Endpoint;
use crate::gms::GmsStats;
use crate::locking::{CacheStats, GrantorStats};
use crate::reliable::Stats as ReliableStats;
use crate::time::Instant;

/// What one seed exercised. A run that never reached a fault cannot pass as one that survived
/// it: every counter is here to be checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Steps taken (deliveries, timer rounds, faults).
    pub steps: u64,
    /// Virtual time at the end of the run.
    pub virtual_time: Duration,
    /// What the network did.
    pub network: NetworkStats,
    /// Partitions started.
    pub partitions: u64,
    /// Partitions healed (including the final heal).
    pub partitions_healed: u64,
    /// Nodes crashed (any role).
    pub crashes: u64,
    /// Crashes of a node that coordinated a view of two or more members.
    pub coordinator_crashes: u64,
    /// Nodes restarted as new incarnations (including the first start).
    pub starts: u64,
    /// Graceful leaves.
    pub leaves: u64,
    /// Graceful leaves of a member that coordinated a view of two or more members (its
    /// grantor, unless the role was transferred).
    pub grantor_leaves: u64,
    /// Changes of loss and duplication rates.
    pub link_changes: u64,
    /// The harsh profile's faults: link cuts, pauses, loss, clock drift.
    pub faults: FaultStats,
    /// Crashes whose exclusion deadline was checked (the crash was isolated from other faults).
    pub exclusions_checked: u64,
    /// Membership counters summed over every incarnation.
    pub gms: GmsStats,
    /// Views installed, counted from events at every member.
    pub views_installed: u64,
    /// Grantor counters summed over every incarnation.
    pub grantor: GrantorStats,
    /// Node-level caching counters summed over every incarnation.
    pub cache: CacheStats,
    /// Reliable-layer counters summed over every incarnation.
    pub reliable: ReliableStats,
    /// Crashes of a grantor whose table held at least one lock.
    pub grantor_crashes_with_locks: u64,
    /// Holds lost at their holder because their own lease ran out.
    pub leases_expired: u64,
    /// Grantor counters of the named lock services alone (also counted in `grantor`).
    pub named_services: GrantorStats,
    /// What the simulated lock users did.
    pub workload: WorkloadStats,
    /// Lost-lock notices (duplicate, minority, lease).
    pub locks_lost: u64,
    /// Token regressions by a grantor that had never heard of the previous token's epoch
    /// (the documented fresh-majority limitation of `Majority`).
    pub token_amnesia: u64,
    /// Virtual time from the end of the faults until every live member had one view.
    pub converged_after: Duration,
    /// A hash of everything delivered and installed: equal for equal runs.
    pub trace_hash: u64,
}

impl Report {
    /// Adds the counters of an endpoint that stops (crash, leave, end of run).
    pub(crate) fn add_endpoint(&mut self, endpoint: &Endpoint) {
        let stats = endpoint.stats();
        add_gms(&mut self.gms, &stats.gms);
        add_grantor(&mut self.grantor, &stats.grantor);
        add_cache(&mut self.cache, &stats.cache);
        add_reliable(&mut self.reliable, &stats.reliable);
        self.leases_expired += stats.leases_expired;
        for (_, service) in endpoint.services() {
            add_grantor(&mut self.named_services, &service.grantor_stats());
        }
    }

    /// Adds the counters of `other` (for totals over many seeds).
    pub fn accumulate(&mut self, other: &Report) {
        self.steps += other.steps;
        self.virtual_time += other.virtual_time;
        let (n, o) = (&mut self.network, &other.network);
        n.sent += o.sent;
        n.delivered += o.delivered;
        n.lost += o.lost;
        n.duplicated += o.duplicated;
        n.partitioned += o.partitioned;
        n.to_dead += o.to_dead;
        n.cut += o.cut;
        n.reordered += o.reordered;
        self.faults.accumulate(&other.faults);
        self.partitions += other.partitions;
        self.partitions_healed += other.partitions_healed;
        self.crashes += other.crashes;
        self.coordinator_crashes += other.coordinator_crashes;
        self.starts += other.starts;
        self.leaves += other.leaves;
        self.grantor_leaves += other.grantor_leaves;
        self.link_changes += other.link_changes;
        self.exclusions_checked += other.exclusions_checked;
        add_gms(&mut self.gms, &other.gms);
        self.views_installed += other.views_installed;
        add_grantor(&mut self.grantor, &other.grantor);
        add_cache(&mut self.cache, &other.cache);
        add_reliable(&mut self.reliable, &other.reliable);
        self.grantor_crashes_with_locks += other.grantor_crashes_with_locks;
        self.leases_expired += other.leases_expired;
        add_grantor(&mut self.named_services, &other.named_services);
        let (w, o) = (&mut self.workload, &other.workload);
        w.requests += o.requests;
        w.granted += o.granted;
        w.would_block += o.would_block;
        w.timeouts += o.timeouts;
        w.cancelled += o.cancelled;
        w.released += o.released;
        w.lost += o.lost;
        w.no_quorum += o.no_quorum;
        w.unavailable += o.unavailable;
        w.longest_grant_gap = w.longest_grant_gap.max(o.longest_grant_gap);
        w.grant_gaps_over_1s += o.grant_gaps_over_1s;
        self.locks_lost += other.locks_lost;
        self.token_amnesia += other.token_amnesia;
        self.converged_after = self.converged_after.max(other.converged_after);
    }
}

fn add_grantor(total: &mut GrantorStats, s: &GrantorStats) {
    *total += *s;
}

fn add_cache(total: &mut CacheStats, s: &CacheStats) {
    total.hits += s.hits;
    total.node_grants_asked += s.node_grants_asked;
    total.revokes += s.revokes;
    total.returned += s.returned;
}

fn add_reliable(total: &mut ReliableStats, s: &ReliableStats) {
    total.segments_sent += s.segments_sent;
    total.segments_retransmitted += s.segments_retransmitted;
    total.bundles_sent += s.bundles_sent;
    total.acks_sent += s.acks_sent;
    total.acks_piggybacked += s.acks_piggybacked;
}

pub(crate) fn add_gms(total: &mut GmsStats, s: &GmsStats) {
    total.views_installed += s.views_installed;
    total.founded += s.founded;
    total.joins_accepted += s.joins_accepted;
    total.members_excluded += s.members_excluded;
    total.leaves_accepted += s.leaves_accepted;
    total.takeovers += s.takeovers;
    total.merges_led += s.merges_led;
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "steps               {}", self.steps)?;
        writeln!(
            f,
            "virtual time        {:.1} s",
            self.virtual_time.as_secs_f64()
        )?;
        writeln!(
            f,
            "datagrams           {} sent, {} delivered, {} lost, {} duplicated, {} cut by partitions, {} to dead nodes",
            self.network.sent,
            self.network.delivered,
            self.network.lost,
            self.network.duplicated,
            self.network.partitioned,
            self.network.to_dead
        )?;
        writeln!(
            f,
            "faults              {} partitions ({} healed), {} crashes ({} of coordinators), {} leaves ({} of coordinators), {} link changes",
            self.partitions,
            self.partitions_healed,
            self.crashes,
            self.coordinator_crashes,
            self.leaves,
            self.grantor_leaves,
            self.link_changes
        )?;
        let h = &self.faults;
        if h.link_cuts + h.one_way_cuts + h.one_way_partitions + h.stalls + h.max_drift_ppm > 0 {
            writeln!(
                f,
                "harsh faults        {} link cuts, {} one-way cuts ({} datagrams cut), {} one-way partitions, {} stalls ({:.1} s in all, longest {:.2} s), loss up to {:.1}%",
                h.link_cuts,
                h.one_way_cuts,
                self.network.cut,
                h.one_way_partitions,
                h.stalls,
                h.stall_time.as_secs_f64(),
                h.longest_stall.as_secs_f64(),
                h.max_loss_permille as f64 / 10.0,
            )?;
            writeln!(
                f,
                "reorderings, clocks {} reordered ({} held back 1 s or more, longest {:.2} s), clock drift up to {} ppm ({} clocks pinned at the bound, {} flipping)",
                self.network.reordered,
                h.long_hold_backs,
                h.longest_hold_back.as_secs_f64(),
                h.max_drift_ppm,
                h.pinned_clocks,
                h.flipping_clocks,
            )?;
        }
        writeln!(f, "node starts         {}", self.starts)?;
        writeln!(
            f,
            "membership          {} views installed, {} founded, {} joins, {} excluded, {} leaves, {} takeovers, {} merges",
            self.views_installed,
            self.gms.founded,
            self.gms.joins_accepted,
            self.gms.members_excluded,
            self.gms.leaves_accepted,
            self.gms.takeovers,
            self.gms.merges_led
        )?;
        let r = &self.reliable;
        writeln!(
            f,
            "reliable            {} segments ({} retransmitted, {} bundles), {} lone acks, {} acks on data",
            r.segments_sent, r.segments_retransmitted, r.bundles_sent, r.acks_sent, r.acks_piggybacked
        )?;
        writeln!(f, "exclusions checked  {}", self.exclusions_checked)?;
        if self.workload.requests > 0 {
            let w = &self.workload;
            writeln!(
                f,
                "lock requests       {} ({} granted, {} would block, {} timed out, {} cancelled, {} refused in a minority, {} unavailable, {} released, {} lost)",
                w.requests, w.granted, w.would_block, w.timeouts, w.cancelled, w.no_quorum, w.unavailable, w.released, w.lost
            )?;
            writeln!(
                f,
                "availability        longest stretch with a request waiting and no grant {:.2} s; {:.1} s of such stretches beyond their first second",
                w.longest_grant_gap.as_secs_f64(),
                w.grant_gaps_over_1s.as_secs_f64()
            )?;
            let g = &self.grantor;
            writeln!(
                f,
                "grantor             {} grants ({} contended), {} reconciliations, {} duplicates resolved, {} late reports, {} grantor crashes while locks were held",
                g.grants, g.contended_grants, g.reconciliations, g.duplicates_resolved, g.late_reports, self.grantor_crashes_with_locks
            )?;
            if g.designations > 0 {
                writeln!(
                    f,
                    "one-hop handoff     {} designations, {} locks passed straight to the next holder",
                    g.designations, g.passes
                )?;
            }
            let c = &self.cache;
            writeln!(
                f,
                "node cache          {} cache hits, {} node grants ({} asked), {} revokes sent, {} revokes received, {} returned; {} delegations, {} delegation revocations",
                c.hits, g.node_grants, c.node_grants_asked, g.revokes, c.revokes, c.returned, g.delegations, g.delegation_revocations
            )?;
            writeln!(
                f,
                "grantor transfers   {} tables taken over ({} handed over), {} from a coordinator that left; {} reconciliations timed out",
                g.transfers, g.handoffs, g.leave_handoffs, g.reconcile_timeouts
            )?;
            writeln!(
                f,
                "lease expiries      {} at holders, {} at grantors (holds whose own lease ran out)",
                self.leases_expired, g.lease_expiries
            )?;
            let n = &self.named_services;
            if n.grants > 0 || n.reconciliations > 0 {
                writeln!(
                    f,
                    "named services      {} grants ({} contended), {} reconciliations, {} tables taken over, {} lease expiries at grantors",
                    n.grants, n.contended_grants, n.reconciliations, n.transfers, n.lease_expiries
                )?;
            }
            writeln!(f, "token amnesia       {} (grants below a token whose epoch the grantor never heard of)", self.token_amnesia)?;
        }
        write!(
            f,
            "slowest convergence {:.2} s after faults stopped",
            self.converged_after.as_secs_f64()
        )
    }
}

/// An invariant broken during a run, with what is needed to replay it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The seed that replays the run.
    pub seed: u64,
    /// The step at which the checker fired.
    pub step: u64,
    /// Virtual time at which the checker fired.
    pub at: Instant,
    /// The invariant, in words.
    pub invariant: &'static str,
    /// What was observed.
    pub detail: String,
    /// The command that replays the run.
    pub replay: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "invariant violated: {}\n  seed {}, step {}, {:?}\n  {}",
            self.invariant, self.seed, self.step, self.at, self.detail
        )?;
        write!(f, "  replay: {}", self.replay)
    }
}

impl std::error::Error for Violation {}
