//! What a simulated Raft run exercised: every counter is here so that a band that never
//! reached a fault cannot pass as one that survived it.

use std::fmt;
use std::time::Duration;

use crate::sim::NetworkStats;

/// The faults injected in a Raft run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftFaultStats {
    /// Partitions started (symmetric or one way).
    pub partitions: u64,
    /// Partitions in which one side hears the other but is not heard.
    pub one_way_partitions: u64,
    /// Links cut both ways.
    pub link_cuts: u64,
    /// Links cut one way.
    pub one_way_cuts: u64,
    /// Single members crashed.
    pub crashes: u64,
    /// Crashes of the leader.
    pub leader_crashes: u64,
    /// Crashes of every member at once.
    pub full_restarts: u64,
    /// Persistence batches polled but not yet on the disk when their member crashed (lost).
    pub batches_lost: u64,
    /// Members started (first starts and restarts).
    pub starts: u64,
    /// Restarts that found a snapshot on their disk.
    pub restarts_from_snapshot: u64,
    /// Process pauses.
    pub pauses: u64,
    /// The longest pause.
    pub longest_pause: Duration,
    /// Graceful leaves.
    pub leaves: u64,
    /// Leadership transfers asked for.
    pub transfers: u64,
    /// Compactions asked for (`compact_now`).
    pub compactions_asked: u64,
    /// Changes of loss and duplication rates.
    pub link_changes: u64,
    /// The highest loss rate set, in per mille.
    pub max_loss_permille: u64,
    /// The largest clock-rate difference from true time, in parts per million.
    pub max_drift_ppm: u64,
}

/// What the engine did in a Raft run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftEngineStats {
    /// `Leader` events, at every member.
    pub leader_changes: u64,
    /// The highest term seen.
    pub max_term: u64,
    /// The highest index committed.
    pub committed: u64,
    /// Snapshots members made (`Compact`).
    pub snapshots_made: u64,
    /// Snapshots installed from a leader (`Installed`).
    pub snapshots_installed: u64,
    /// Timer calls after which the node's next deadline was still not in the future (its
    /// driver would spin); the harness runs the node again 1 ms later.
    pub busy_timers: u64,
}

/// What the lock users of a Raft run did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftWorkloadStats {
    /// Lock requests made.
    pub requests: u64,
    /// Grants (`Granted`), adopted ones included.
    pub granted: u64,
    /// Grants that took over a hold of an earlier incarnation.
    pub adopted: u64,
    /// Requests queued.
    pub queued: u64,
    /// Try-locks refused.
    pub busy: u64,
    /// Waits given up by their timeout (`cancel`).
    pub timeouts: u64,
    /// Holds released by their owner (`unlock`).
    pub unlocked: u64,
    /// Lease extensions asked for.
    pub extends: u64,
    /// Holds or waits lost because the member's session ran out or it was expired.
    pub lost_minority: u64,
    /// Holds lost to their lease.
    pub lost_lease: u64,
    /// Holds or waits lost otherwise.
    pub lost_other: u64,
    /// Requests failed because their member was cut off (`CutOff`).
    pub cut_off: u64,
    /// Table reads asked for.
    pub reads: u64,
    /// Table reads answered (`TableReady`), each checked to be linearizable.
    pub reads_answered: u64,
    /// Locks taken by the final probes of the calm phase.
    pub probes: u64,
}

/// What the checkers compared in a Raft run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftCheckStats {
    /// Steps at which at least two holds were believed at once.
    pub concurrent_beliefs: u64,
    /// Committed entries compared between members (after the first copy of each).
    pub entries_compared: u64,
    /// Tables compared between members at an equal applied index.
    pub tables_compared: u64,
    /// Grants whose token was compared with earlier grants of their lock.
    pub tokens_compared: u64,
    /// Incarnations that left or were replaced by a newer one (no grant to them after).
    pub gone_members: u64,
}

/// What one Raft run exercised.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftReport {
    /// The seed (of the last run, when accumulated).
    pub seed: u64,
    /// Runs summed in this report.
    pub runs: u64,
    /// Members (of the last run, when accumulated).
    pub nodes: usize,
    /// Entries between snapshots (of the last run, when accumulated).
    pub snapshot_every: u64,
    /// Steps taken (deliveries, timer rounds, disk writes, faults).
    pub steps: u64,
    /// Virtual time at the end of the run.
    pub virtual_time: Duration,
    /// A hash of every packet delivered and every grant, in order: equal for equal runs.
    pub trace_hash: u64,
    /// What the network did.
    pub network: NetworkStats,
    /// The faults injected.
    pub faults: RaftFaultStats,
    /// What the engine did.
    pub engine: RaftEngineStats,
    /// What the lock users did.
    pub workload: RaftWorkloadStats,
    /// What the checkers compared.
    pub checks: RaftCheckStats,
    /// Virtual time from the end of the faults until liveness was shown (the longest, when
    /// accumulated).
    pub converged_after: Duration,
}

impl RaftReport {
    /// Adds another run's counters (a band's totals; maxima stay maxima).
    pub fn accumulate(&mut self, o: &RaftReport) {
        self.seed = o.seed;
        self.runs += o.runs;
        self.nodes = o.nodes;
        self.snapshot_every = o.snapshot_every;
        self.steps += o.steps;
        self.virtual_time += o.virtual_time;
        self.trace_hash ^= o.trace_hash;
        let (n, on) = (&mut self.network, &o.network);
        n.sent += on.sent;
        n.delivered += on.delivered;
        n.lost += on.lost;
        n.duplicated += on.duplicated;
        n.partitioned += on.partitioned;
        n.to_dead += on.to_dead;
        n.cut += on.cut;
        n.reordered += on.reordered;
        let (f, of) = (&mut self.faults, &o.faults);
        f.partitions += of.partitions;
        f.one_way_partitions += of.one_way_partitions;
        f.link_cuts += of.link_cuts;
        f.one_way_cuts += of.one_way_cuts;
        f.crashes += of.crashes;
        f.leader_crashes += of.leader_crashes;
        f.full_restarts += of.full_restarts;
        f.batches_lost += of.batches_lost;
        f.starts += of.starts;
        f.restarts_from_snapshot += of.restarts_from_snapshot;
        f.pauses += of.pauses;
        f.longest_pause = f.longest_pause.max(of.longest_pause);
        f.leaves += of.leaves;
        f.transfers += of.transfers;
        f.compactions_asked += of.compactions_asked;
        f.link_changes += of.link_changes;
        f.max_loss_permille = f.max_loss_permille.max(of.max_loss_permille);
        f.max_drift_ppm = f.max_drift_ppm.max(of.max_drift_ppm);
        let (e, oe) = (&mut self.engine, &o.engine);
        e.leader_changes += oe.leader_changes;
        e.max_term = e.max_term.max(oe.max_term);
        e.committed += oe.committed;
        e.snapshots_made += oe.snapshots_made;
        e.snapshots_installed += oe.snapshots_installed;
        e.busy_timers += oe.busy_timers;
        let (w, ow) = (&mut self.workload, &o.workload);
        w.requests += ow.requests;
        w.granted += ow.granted;
        w.adopted += ow.adopted;
        w.queued += ow.queued;
        w.busy += ow.busy;
        w.timeouts += ow.timeouts;
        w.unlocked += ow.unlocked;
        w.extends += ow.extends;
        w.lost_minority += ow.lost_minority;
        w.lost_lease += ow.lost_lease;
        w.lost_other += ow.lost_other;
        w.cut_off += ow.cut_off;
        w.reads += ow.reads;
        w.reads_answered += ow.reads_answered;
        w.probes += ow.probes;
        let (c, oc) = (&mut self.checks, &o.checks);
        c.concurrent_beliefs += oc.concurrent_beliefs;
        c.entries_compared += oc.entries_compared;
        c.tables_compared += oc.tables_compared;
        c.tokens_compared += oc.tokens_compared;
        c.gone_members += oc.gone_members;
        self.converged_after = self.converged_after.max(o.converged_after);
    }
}

impl fmt::Display for RaftReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (n, h, e, w, c) = (
            &self.network,
            &self.faults,
            &self.engine,
            &self.workload,
            &self.checks,
        );
        writeln!(
            f,
            "runs {}, steps {}, virtual time {:.1} s, calm reached after at most {:.2} s",
            self.runs,
            self.steps,
            self.virtual_time.as_secs_f64(),
            self.converged_after.as_secs_f64()
        )?;
        writeln!(
            f,
            "packets      {} sent, {} delivered, {} lost, {} duplicated, {} held back, {} partitioned, {} cut, {} to dead nodes",
            n.sent, n.delivered, n.lost, n.duplicated, n.reordered, n.partitioned, n.cut, n.to_dead
        )?;
        writeln!(
            f,
            "faults       {} partitions ({} one way), {} link cuts ({} one way), {} link changes (loss up to {:.1} %), {} pauses (longest {:.2} s), clock drift up to {} ppm",
            h.partitions,
            h.one_way_partitions,
            h.link_cuts + h.one_way_cuts,
            h.one_way_cuts,
            h.link_changes,
            h.max_loss_permille as f64 / 10.0,
            h.pauses,
            h.longest_pause.as_secs_f64(),
            h.max_drift_ppm
        )?;
        writeln!(
            f,
            "members      {} crashes ({} of leaders), {} full restarts, {} batches lost at a crash, {} starts ({} from a snapshot), {} leaves, {} transfers, {} compactions asked",
            h.crashes,
            h.leader_crashes,
            h.full_restarts,
            h.batches_lost,
            h.starts,
            h.restarts_from_snapshot,
            h.leaves,
            h.transfers,
            h.compactions_asked
        )?;
        writeln!(
            f,
            "engine       {} leader changes, terms up to {}, {} entries committed, {} snapshots made, {} installed, {} busy timers",
            e.leader_changes, e.max_term, e.committed, e.snapshots_made, e.snapshots_installed, e.busy_timers
        )?;
        writeln!(
            f,
            "workload     {} requests, {} granted ({} adopted), {} queued, {} busy, {} timed out, {} unlocked, {} extends, lost: {} minority, {} lease, {} other; {} cut off; {} reads ({} answered), {} probes",
            w.requests,
            w.granted,
            w.adopted,
            w.queued,
            w.busy,
            w.timeouts,
            w.unlocked,
            w.extends,
            w.lost_minority,
            w.lost_lease,
            w.lost_other,
            w.cut_off,
            w.reads,
            w.reads_answered,
            w.probes
        )?;
        write!(
            f,
            "checks       {} steps with concurrent beliefs, {} entries and {} tables compared, {} tokens compared, {} incarnations gone",
            c.concurrent_beliefs, c.entries_compared, c.tables_compared, c.tokens_compared, c.gone_members
        )
    }
}
