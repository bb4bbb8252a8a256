//! The simulator with lock users: grantor crashes, partitions, merges, leaves, message loss,
//! under both partition policies, with every lock checker after every step; and proof that
//! each checker fires when the protocol is broken on purpose.
//!
//! Sized by environment variables so CI can run large bands in release mode:
//! - `CONCLAVE_LOCK_SEEDS` (default 1500 in release builds, 25 in debug builds): seeds per
//!   policy;
//! - `CONCLAVE_SIM_FIRST_SEED` (default 1);
//! - `CONCLAVE_SIM_SEED` with `CONCLAVE_SIM_POLICY=available|majority`: the seed `replay`
//!   runs and prints;
//! - the fault knobs of [`SimConfig::with_env_knobs`] (`CONCLAVE_SIM_MAX_REORDER_MS`,
//!   `CONCLAVE_SIM_DRIFT`, `CONCLAVE_SIM_CLOCK_PINNED`, `CONCLAVE_SIM_CLOCK_FLIPPING`,
//!   `CONCLAVE_SIM_ONE_WAY`), in every band and `replay` (not in the known-bad variants,
//!   which run each profile's defaults).

use conclave_protocol::locking::{LockSabotage, PartitionPolicy};
use conclave_protocol::sim::{self, Report, SimConfig, Violation};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A band's seed count: `var` if set, else `debug` in a debug build and `release` otherwise.
fn seeds(var: &str, debug: u64, release: u64) -> u64 {
    env_u64(
        var,
        if cfg!(debug_assertions) {
            debug
        } else {
            release
        },
    )
}

const MAJORITY: PartitionPolicy = PartitionPolicy::Majority { cluster_size: 5 };

/// A band's gentle profile under `policy`, with the fault knobs set in the environment.
fn gentle_profile(policy: PartitionPolicy) -> SimConfig {
    SimConfig::locking(policy).with_env_knobs()
}

/// A band's harsh profile under `policy`, with the fault knobs set in the environment.
fn harsh_profile(policy: PartitionPolicy) -> SimConfig {
    SimConfig::locking_harsh(policy).with_env_knobs()
}

/// Seeds that broke an earlier version of the locking protocol, kept forever, per policy.
///
/// Available: 5 (a stale copy of a finished request, redelivered after a partition, was granted
/// and stayed in the table), 1879 (a view delivery that needed five retransmissions), 3550 and
/// 4663 (a lock report request processed before the view it belongs to, so ignored), 8012 (a
/// leaving member kept believing it held locks the grantor had already freed), 1200905 (a
/// late-reported hold met a grant of the current view, in an attempt at the open bug of seed
/// 1200060 that was not kept: docs/protocol.md).
const AVAILABLE_REGRESSIONS: &[u64] = &[5, 1879, 3550, 4663, 8012, 1200905];
/// Majority: 9 (two takeovers in separate partitions both used epoch 7 for tokens), 64 (a
/// minority that gained a majority by a fresh joiner granted at once, below older tokens),
/// 4728 (an excluded holder renewed its lease from the grantor's acks: two holders), 6019
/// (a cancel lost when a reconciliation restarted and dropped its backlog), 10586 and 11456
/// (a copy of a grant already given back was accepted: two holders).
const MAJORITY_REGRESSIONS: &[u64] = &[9, 64, 4728, 6019, 10586, 11456];

fn run_band(policy: PartitionPolicy, regressions: &[u64]) -> (Report, Vec<Violation>, usize) {
    let count = seeds("CONCLAVE_LOCK_SEEDS", 25, 1500);
    run_seeds(
        &SimConfig::from_env_profile(Some(policy)),
        regressions,
        count,
    )
}

/// The harsh band the test command always runs (`CONCLAVE_LOCK_HARSH_SEEDS` per policy).
fn run_harsh_band(policy: PartitionPolicy, regressions: &[u64]) -> (Report, Vec<Violation>, usize) {
    let count = seeds("CONCLAVE_LOCK_HARSH_SEEDS", 10, 400);
    run_seeds(&harsh_profile(policy), regressions, count)
}

fn run_seeds(
    config: &SimConfig,
    regressions: &[u64],
    count: u64,
) -> (Report, Vec<Violation>, usize) {
    let first = env_u64("CONCLAVE_SIM_FIRST_SEED", 1);
    run_seeds_from(config, regressions, first, count)
}

/// Runs `regressions`, then `count` seeds from `first`.
fn run_seeds_from(
    config: &SimConfig,
    regressions: &[u64],
    first: u64,
    count: u64,
) -> (Report, Vec<Violation>, usize) {
    let config = config.clone();
    let seeds: Vec<u64> = regressions
        .iter()
        .copied()
        .chain(first..first + count)
        .collect();
    let mut total = Report::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        match sim::run(seed, &config) {
            Ok(report) => total.accumulate(&report),
            Err(violation) => failures.push(violation),
        }
    }
    (total, failures, seeds.len())
}

fn assert_clean(name: &str, (total, failures, seeds): (Report, Vec<Violation>, usize)) -> Report {
    println!("locking simulator, {name}: {seeds} seeds\n{total}");
    if let Some(first) = failures.first() {
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        panic!(
            "{name}: {} of {seeds} seeds violated an invariant (seeds {failed:?}); the first:\n{first}",
            failures.len()
        );
    }
    // A band that never reached the faults cannot pass as one that survived them.
    let g = &total.grantor;
    assert!(g.grants > 0, "{name}: no grant");
    assert!(g.contended_grants > 0, "{name}: no contended grant");
    assert!(g.reconciliations > 0, "{name}: no reconciliation");
    assert!(
        total.grantor_crashes_with_locks > 0,
        "{name}: no grantor crash while locks were held"
    );
    assert!(
        total.coordinator_crashes > 0 && total.partitions_healed > 0 && total.gms.merges_led > 0
    );
    assert!(
        total.workload.timeouts > 0
            && total.workload.cancelled > 0
            && total.workload.would_block > 0
    );
    total
}

#[test]
fn available_policy_seeds_run_clean() {
    let total = assert_clean(
        "available",
        run_band(PartitionPolicy::Available, AVAILABLE_REGRESSIONS),
    );
    assert!(
        total.grantor.duplicates_resolved > 0,
        "no duplicate lock was resolved"
    );
}

#[test]
fn majority_policy_seeds_run_clean() {
    assert_clean("majority", run_band(MAJORITY, MAJORITY_REGRESSIONS));
}

/// Harsh-profile seeds that broke an earlier version, per policy. Majority, against the
/// protocol before grantor terms and send-time leases (the safety review's findings): 17, 68,
/// 71 (one grantor, a holder whose lease was renewed by heartbeats it received late: two
/// holders), 25, 48 (two coordinators behind link cuts both granting), 12, 42 (tokens going
/// back across two grantors); and 721 (two grantors used one term number after the member
/// common to both majorities restarted: token amnesia, counted then; impossible now that
/// members keep their promised term on disk). Available: 1416 (a request
/// granted again by a grantor that rebuilt its table was released under its first token: a
/// ghost hold).
const MAJORITY_HARSH_REGRESSIONS: &[u64] = &[12, 17, 25, 42, 48, 68, 71, 721];
///
/// Available 43272: a copy of a grant the member held, arriving from that grantor after the
/// member had moved to another, was given back and freed the hold under it. Available 42087:
/// a member granted a lock by itself as grantor of a split view kept that (higher) token when
/// its new grantor granted the same request from an older copy, and released under it: a ghost
/// hold in the new grantor's table. Available 46160: a coordinator cut off from a merge kept
/// a member's hold in its table; the member released it at the merged view's grantor and later
/// came back to the stale one, which never heard of the release (now the member tells a grantor
/// it moves to what it holds and waits for: `Holding`).
/// Available 1201064: as 1200905 of the gentle band, under harsh faults.
const AVAILABLE_HARSH_REGRESSIONS: &[u64] = &[1416, 42087, 43272, 46160, 1201064];

/// A harsh band must have exercised every harsh fault class, as far as the knobs set in the
/// environment ask for it.
fn assert_harsh(name: &str, total: &Report) {
    let config = harsh_profile(MAJORITY);
    let (h, knobs) = (&total.faults, config.harsh.clone().unwrap_or_default());
    if config.one_way < 1.0 {
        assert!(h.link_cuts > 0, "{name}: no link cut both ways: {h:?}");
    }
    if config.one_way > 0.0 {
        assert!(h.one_way_cuts > 0, "{name}: no one-way cut: {h:?}");
    }
    assert!(
        h.stalls > 0 && h.longest_stall.as_secs_f64() > 1.2,
        "{name}: no long stall: {h:?}"
    );
    assert!(
        h.max_loss_permille >= 250,
        "{name}: loss never reached 25%: {h:?}"
    );
    if let Some(missing) = h.missing_clock_faults(&knobs) {
        panic!("{name}: {missing}: {h:?}");
    }
    assert!(
        total.network.reordered > 0 && total.network.duplicated > 0,
        "{name}: no reordering or duplication"
    );
    assert!(
        h.longest_hold_back > knobs.max_reorder_delay / 2,
        "{name}: no hold-back near {:?}: {h:?}",
        knobs.max_reorder_delay
    );
}

#[test]
fn majority_policy_harsh_seeds_run_clean() {
    let total = assert_clean(
        "majority (harsh)",
        run_harsh_band(MAJORITY, MAJORITY_HARSH_REGRESSIONS),
    );
    assert_harsh("majority (harsh)", &total);
}

#[test]
fn available_policy_harsh_seeds_run_clean() {
    let total = assert_clean(
        "available (harsh)",
        run_harsh_band(PartitionPolicy::Available, AVAILABLE_HARSH_REGRESSIONS),
    );
    assert_harsh("available (harsh)", &total);
}

#[test]
fn the_same_locking_seed_gives_the_same_run() {
    for policy in [PartitionPolicy::Available, MAJORITY] {
        let config = SimConfig::locking(policy);
        let a = sim::run(5, &config).expect("seed runs clean");
        let b = sim::run(5, &config).expect("seed runs clean");
        assert_eq!(a, b);
        assert!(a.workload.requests > 0);
    }
}

/// Runs seeds with a broken protocol until a checker fires; returns the invariant named.
fn first_violation(policy: PartitionPolicy, sabotage: LockSabotage, seeds: u64) -> Option<String> {
    let config = SimConfig {
        lock_sabotage: sabotage,
        ..SimConfig::locking(policy)
    };
    (1..=seeds).find_map(|seed| {
        sim::run(seed, &config)
            .err()
            .map(|v| v.invariant.to_owned())
    })
}

#[test]
fn granting_while_reconciling_is_caught() {
    let sabotage = LockSabotage {
        grant_while_reconciling: true,
        ..LockSabotage::default()
    };
    // Grants from a half-built table, before a dead grantor's holders' leases have run out.
    let config = SimConfig {
        lock_sabotage: sabotage,
        ..SimConfig::locking(MAJORITY)
    };
    let caught = (1..=400).find(|seed| {
        sim::run(*seed, &config).is_err_and(|v| v.invariant.starts_with("mutual exclusion"))
    });
    assert!(caught.is_some(), "not caught");
}

#[test]
fn skipping_the_liveness_recheck_is_caught() {
    let sabotage = LockSabotage {
        skip_liveness_recheck: true,
        ..LockSabotage::default()
    };
    let caught = first_violation(PartitionPolicy::Available, sabotage, 40);
    assert_eq!(
        caught.as_deref(),
        Some("no lock stays held by a member that is not in the view")
    );
}

#[test]
fn forgetting_pending_releases_is_caught() {
    let sabotage = LockSabotage {
        forget_pending_releases: true,
        ..LockSabotage::default()
    };
    let caught = first_violation(PartitionPolicy::Available, sabotage, 40);
    assert!(caught.is_some(), "a lost release must be caught");
}

#[test]
fn reusing_a_fencing_token_is_caught() {
    let sabotage = LockSabotage {
        reuse_fencing_token: true,
        ..LockSabotage::default()
    };
    let caught = first_violation(PartitionPolicy::Available, sabotage, 5);
    assert_eq!(
        caught.as_deref(),
        Some("fencing tokens strictly increase per lock in grant order")
    );
}

/// Waits that a member keeps in a minority (instead of resigning them after a lease) are
/// caught by the minority-waiter checker.
#[test]
fn keeping_waits_in_a_minority_is_caught() {
    let sabotage = LockSabotage {
        keep_waits_in_minority: true,
        ..LockSabotage::default()
    };
    let caught = first_violation(MAJORITY, sabotage, 200);
    assert_eq!(
        caught.as_deref(),
        Some("a member in a minority for a lease waits for nothing")
    );
}

/// Runs harsh-profile seeds of `config` until a checker fires; returns the seed and invariant.
fn first_harsh_violation(config: &SimConfig, seeds: u64) -> Option<(u64, String)> {
    (1..=seeds).find_map(|seed| {
        sim::run(seed, config)
            .err()
            .map(|v| (seed, v.invariant.to_owned()))
    })
}

/// Process pauses and late deliveries: a lease that runs from when a grant or renewal
/// *arrived* (not from when the request it answers was sent) gives two holders.
#[test]
fn harsh_faults_catch_leases_anchored_at_receipt() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            anchor_leases_at_receipt: true,
            ..LockSabotage::default()
        },
        ..SimConfig::locking_harsh(MAJORITY)
    };
    let caught = first_harsh_violation(&config, 300);
    assert!(
        caught
            .as_ref()
            .is_some_and(|(_, v)| v.starts_with("mutual exclusion")),
        "not caught: {caught:?}"
    );
}

/// Link cuts: members that support any grantor at once, with no promise, let two
/// coordinators that cannot hear each other both grant.
#[test]
fn harsh_faults_catch_support_without_promises() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            promise_anyone: true,
            ..LockSabotage::default()
        },
        ..SimConfig::locking_harsh(MAJORITY)
    };
    let caught = first_harsh_violation(&config, 300);
    assert!(
        caught.as_ref().is_some_and(
            |(_, v)| v.starts_with("mutual exclusion") || v.starts_with("fencing tokens")
        ),
        "not caught: {caught:?}"
    );
}

/// Clock drift far beyond the bound the leases assume (50% against about 6%) breaks mutual
/// exclusion: the checker sees it, so drift within the bound is really exercised. (30% was
/// caught within these seeds until the serving announcements changed the traffic.)
#[test]
fn harsh_faults_catch_clock_drift_beyond_the_bound() {
    let mut config = SimConfig::locking_harsh(MAJORITY);
    if let Some(harsh) = config.harsh.as_mut() {
        harsh.clock_drift = 0.5;
    }
    let caught = first_harsh_violation(&config, 300);
    assert!(
        caught
            .as_ref()
            .is_some_and(|(_, v)| v.starts_with("mutual exclusion")),
        "not caught: {caught:?}"
    );
}

/// Link cuts and lock traffic: members that count any heartbeat and any acknowledgement as a
/// sign of life, whichever coordinator the sender follows, stay orphaned in views nobody
/// coordinates; the liveness checker (one view, every request answered, within the calm bound)
/// catches it.
#[test]
fn harsh_faults_catch_orphaned_members() {
    let config = SimConfig {
        sabotage: conclave_protocol::gms::Sabotage {
            ignore_lineage: true,
            ..Default::default()
        },
        ..SimConfig::locking_harsh(MAJORITY)
    };
    let caught = first_harsh_violation(&config, 400);
    assert!(
        caught
            .as_ref()
            .is_some_and(|(_, v)| v.starts_with("once faults stop")),
        "not caught: {caught:?}"
    );
}

/// Lock users in clusters of 32 and 64 members, both policies, gentle and harsh:
/// `CONCLAVE_LARGE_LOCK_SEEDS` seeds per size, policy and profile (default 1 in release builds,
/// 0 in debug builds). Replay one with `CONCLAVE_SIM_NODES=64` beside the usual variables.
#[test]
fn large_clusters_lock_safely() {
    let count = seeds("CONCLAVE_LARGE_LOCK_SEEDS", 0, 1);
    let mut failures = Vec::new();
    for nodes in [32, 64] {
        for policy in [PartitionPolicy::Available, MAJORITY] {
            for harsh in [false, true] {
                let config = if harsh {
                    harsh_profile(policy)
                } else {
                    gentle_profile(policy)
                }
                .with_nodes(nodes);
                let (total, mut failed, seeds) = run_seeds(&config, &[], count);
                let policy = config.endpoint.locks.policy;
                println!(
                    "locking simulator, {nodes} members, {policy:?}, harsh {harsh}: {seeds} seeds\n{total}"
                );
                assert!(
                    count == 0 || total.grantor.grants > 0,
                    "{nodes} members, {policy:?}: no grant"
                );
                failures.append(&mut failed);
            }
        }
    }
    if let Some(first) = failures.first() {
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        panic!(
            "{} large-cluster locking runs violated an invariant (seeds {failed:?}); the first:\n{first}",
            failures.len()
        );
    }
}

/// A configuration with node-level caching switched on at every member.
fn with_cache(mut config: SimConfig) -> SimConfig {
    config.endpoint.locks.node_cache.enabled = true;
    config.endpoint.locks.node_cache.delegate_reads = true;
    config
}

/// The cache band: node caching on, both policies, gentle and harsh
/// (`CONCLAVE_CACHE_SEEDS` / `CONCLAVE_CACHE_HARSH_SEEDS` per policy).
#[test]
fn cached_seeds_run_clean() {
    let gentle = seeds("CONCLAVE_CACHE_SEEDS", 10, 300);
    let harsh = seeds("CONCLAVE_CACHE_HARSH_SEEDS", 5, 75);
    for policy in [PartitionPolicy::Available, MAJORITY] {
        let name = format!("{policy:?}, node cache");
        let total = assert_clean(
            &name,
            run_seeds(&with_cache(gentle_profile(policy)), &[], gentle),
        );
        let harsh_name = format!("{policy:?}, node cache (harsh)");
        let harsh_total = assert_clean(
            &harsh_name,
            run_seeds(&with_cache(harsh_profile(policy)), &[], harsh),
        );
        assert_harsh(&harsh_name, &harsh_total);
        for (name, t) in [(&name, &total), (&harsh_name, &harsh_total)] {
            assert!(t.cache.hits > 0, "{name}: no cache hit");
            assert!(t.grantor.node_grants > 0, "{name}: no node grant");
            assert!(
                t.grantor.revokes > 0 && t.cache.revokes > 0,
                "{name}: no revoke"
            );
            assert!(t.grantor.delegations > 0, "{name}: no read delegation");
            assert!(
                t.grantor.delegation_revocations > 0,
                "{name}: no delegation revoked"
            );
        }
    }
}

fn with_handoff(mut config: SimConfig) -> SimConfig {
    config.endpoint.locks.one_hop_handoff = true;
    config
}

/// The one-hop handoff band: designations and passed grants on, per policy, gentle and
/// harsh, plain and with per-acquisition leases (`CONCLAVE_HANDOFF_SEEDS` /
/// `CONCLAVE_HANDOFF_HARSH_SEEDS` per policy and workload). Every checker runs as in the other
/// bands: exclusion on every holder's own clock, tokens, tables against beliefs, liveness.
#[test]
fn handoff_seeds_run_clean_available() {
    run_handoff_band(PartitionPolicy::Available);
}

/// The one-hop handoff band under `Majority` (see [`handoff_seeds_run_clean_available`]).
#[test]
fn handoff_seeds_run_clean_majority() {
    run_handoff_band(MAJORITY);
}

fn run_handoff_band(policy: PartitionPolicy) {
    let gentle = seeds("CONCLAVE_HANDOFF_SEEDS", 10, 150);
    let harsh = seeds("CONCLAVE_HANDOFF_HARSH_SEEDS", 5, 60);
    for leased in [false, true] {
        let lease = |c: SimConfig| if leased { with_leases(c) } else { c };
        let name = format!(
            "{policy:?}, one-hop handoff{}",
            if leased { ", leases" } else { "" }
        );
        let total = assert_clean(
            &name,
            run_seeds(&lease(with_handoff(gentle_profile(policy))), &[], gentle),
        );
        let harsh_name = format!("{name} (harsh)");
        let harsh_total = assert_clean(
            &harsh_name,
            run_seeds(&lease(with_handoff(harsh_profile(policy))), &[], harsh),
        );
        assert_harsh(&harsh_name, &harsh_total);
        for (name, t) in [(&name, &total), (&harsh_name, &harsh_total)] {
            let g = &t.grantor;
            assert!(g.designations > 0, "{name}: no designation");
            assert!(g.passes > 0, "{name}: no lock passed on");
        }
    }
}

/// Runs seeds of the handoff band's gentle and harsh profiles with a broken handoff until a
/// checker fires; returns the seed and the invariant named.
fn first_handoff_violation(
    policy: PartitionPolicy,
    sabotage: LockSabotage,
    seeds: u64,
) -> Option<(u64, String)> {
    [gentle_profile(policy), harsh_profile(policy)]
        .into_iter()
        .find_map(|profile| {
            let config = SimConfig {
                lock_sabotage: sabotage,
                ..with_handoff(profile)
            };
            first_harsh_violation(&config, seeds)
        })
}

/// A holder that passes its lock on and keeps it: two holders at once.
#[test]
fn a_handoff_that_keeps_the_hold_is_caught() {
    let sabotage = LockSabotage {
        pass_keeps_hold: true,
        ..LockSabotage::default()
    };
    let caught = first_handoff_violation(MAJORITY, sabotage, 40);
    assert!(
        caught
            .as_ref()
            .is_some_and(|(_, v)| v.starts_with("mutual exclusion")),
        "not caught: {caught:?}"
    );
}

/// A designation used after it was withdrawn, or twice: a member that takes a passed grant for
/// a request it no longer waits for (it gave up, the grantor granted the next waiter) holds
/// beside that waiter.
#[test]
fn a_designation_used_after_withdrawal_is_caught() {
    let sabotage = LockSabotage {
        pass_to_any: true,
        ..LockSabotage::default()
    };
    let caught = first_handoff_violation(MAJORITY, sabotage, 200);
    assert!(
        caught.is_some(),
        "not caught in 200 seeds per profile and policy"
    );
}

fn with_leases(mut config: SimConfig) -> SimConfig {
    if let Some(workload) = config.workload.as_mut() {
        workload.leased = 0.4;
    }
    config
}

/// The lease band: 40% of waiting requests ask for a lease of their own (20 ms up to the
/// longest hold), both policies, gentle and harsh (`CONCLAVE_LEASE_SEEDS` /
/// `CONCLAVE_LEASE_HARSH_SEEDS` per policy). The exclusion checker judges every holder on its
/// own clock, paused ones too: a holder past its lease must believe it lost before the grantor
/// frees the lock and grants it again.
#[test]
fn leased_seeds_run_clean() {
    let gentle = seeds("CONCLAVE_LEASE_SEEDS", 10, 200);
    let harsh = seeds("CONCLAVE_LEASE_HARSH_SEEDS", 5, 60);
    for policy in [PartitionPolicy::Available, MAJORITY] {
        let name = format!("{policy:?}, leases");
        let total = assert_clean(
            &name,
            run_seeds(&with_leases(gentle_profile(policy)), &[], gentle),
        );
        let harsh_name = format!("{policy:?}, leases (harsh)");
        let harsh_total = assert_clean(
            &harsh_name,
            run_seeds(&with_leases(harsh_profile(policy)), &[], harsh),
        );
        assert_harsh(&harsh_name, &harsh_total);
        for (name, t) in [(&name, &total), (&harsh_name, &harsh_total)] {
            assert!(t.leases_expired > 0, "{name}: no lease expired at a holder");
        }
        assert!(
            harsh_total.grantor.lease_expiries > 0,
            "{harsh_name}: no lease expired at a grantor"
        );
    }
}

fn with_transfers(mut config: SimConfig) -> SimConfig {
    if let Some(workload) = config.workload.as_mut() {
        workload.transfer = 0.03;
        workload.leased = 0.2;
    }
    config
}

/// The transfer band (`Available`: the role does not move under `Majority`): now and then an
/// actor asks for the grantor role for its node (`become_grantor`), under the gentle and the
/// harsh faults, with leased holds too (`CONCLAVE_TRANSFER_SEEDS` /
/// `CONCLAVE_TRANSFER_HARSH_SEEDS`). Besides every other checker, at most one member of a
/// view serves at any step.
#[test]
fn transfer_seeds_run_clean() {
    let gentle = seeds("CONCLAVE_TRANSFER_SEEDS", 10, 300);
    let harsh = seeds("CONCLAVE_TRANSFER_HARSH_SEEDS", 5, 100);
    let policy = PartitionPolicy::Available;
    let name = "Available, grantor transfers";
    // Regression seeds: 2 (a grant sent again carried no lease left), 70 (a late "holding"
    // statement dropped a newer hold), 6 (a handoff named the reconciled epoch, not the
    // view's), 20 (a late announcement of an earlier turn), 800 (an announcement that
    // arrived before its view).
    let total = assert_clean(
        name,
        run_seeds(
            &with_transfers(gentle_profile(policy)),
            &[2, 6, 20, 70, 800],
            gentle,
        ),
    );
    let harsh_name = "Available, grantor transfers (harsh)";
    let harsh_total = assert_clean(
        harsh_name,
        run_seeds(&with_transfers(harsh_profile(policy)), &[], harsh),
    );
    assert_harsh(harsh_name, &harsh_total);
    for (name, t) in [(name, &total), (harsh_name, &harsh_total)] {
        assert!(t.grantor.transfers > 0, "{name}: no grantor transfer");
        assert!(t.leases_expired > 0, "{name}: no lease expired");
    }
}

fn with_services(mut config: SimConfig) -> SimConfig {
    if let Some(workload) = config.workload.as_mut() {
        workload.services = 2;
        // One actor per service on each node (the replay line's CONCLAVE_SIM_SERVICES does the same).
        workload.actors_per_node = workload.services + 1;
        workload.leased = 0.2;
        if !config.endpoint.locks.policy.is_majority() {
            workload.transfer = 0.03;
        }
    }
    config
}

/// The named-services band: each node's three actors use the default service and the services
/// `svc-1` and `svc-2`, with the same lock names in each, leased holds, and (under `Available`)
/// grantor transfers per service; both policies, gentle and harsh (`CONCLAVE_SERVICE_SEEDS` /
/// `CONCLAVE_SERVICE_HARSH_SEEDS` per policy). Every checker judges each service on its own:
/// exclusion and tokens per (service, lock), one grantor per service per view, each service's
/// table equal to what its members hold.
#[test]
fn service_seeds_run_clean() {
    let gentle = seeds("CONCLAVE_SERVICE_SEEDS", 10, 200);
    let harsh = seeds("CONCLAVE_SERVICE_HARSH_SEEDS", 4, 60);
    for (policy, label) in [
        (PartitionPolicy::Available, "Available"),
        (MAJORITY, "Majority"),
    ] {
        let name = format!("{label}, named services");
        // Regression seeds: 499, Available (a grant of an earlier turn, given back to its
        // grantor after it had handed the table over, was lost there: the hold stayed in the
        // new grantor's table); 869, Majority (a service opened in a minority view counted
        // the minority from its opening, so its waits outlived the lease); 19, Majority (a
        // term that lapsed when the member lent it to its services asked the member's own
        // report over the network, where it was lost: the grantor lost its own waits).
        let gentle_regressions: &[u64] = if policy.is_majority() {
            &[19, 869]
        } else {
            &[499]
        };
        let total = assert_clean(
            &name,
            run_seeds(
                &with_services(gentle_profile(policy)),
                gentle_regressions,
                gentle,
            ),
        );
        let harsh_name = format!("{label}, named services (harsh)");
        // Regression seeds (Available, harsh): 94 and 132 (a member's report reached the
        // grantor after it had handed the table over, so a hold was in no table), 264 (a
        // joiner dropped the new grantor's announcement that came before its first view, and
        // waited for ever after the coordinator's "not grantor").
        let regressions: &[u64] = if policy.is_majority() {
            &[]
        } else {
            &[94, 132, 264]
        };
        let harsh_total = assert_clean(
            &harsh_name,
            run_seeds(&with_services(harsh_profile(policy)), regressions, harsh),
        );
        assert_harsh(&harsh_name, &harsh_total);
        for (name, t) in [(&name, &total), (&harsh_name, &harsh_total)] {
            let n = &t.named_services;
            assert!(
                n.grants > 0 && n.contended_grants > 0,
                "{name}: no grant in a named service"
            );
            assert!(
                n.reconciliations > 0,
                "{name}: no reconciliation in a named service"
            );
            if !policy.is_majority() {
                assert!(
                    n.transfers > 0,
                    "{name}: no transfer of a named service's grantor"
                );
            }
        }
    }
}

/// The quiet-requests band: half the waiting requests ask the grantor not to say they were
/// queued (`lock_quiet`), and half the holds end as a dropped guard does (a lazy release,
/// `unlock_lazy`), in the default service and in named ones (the named-services workload), both
/// policies, gentle and harsh (`CONCLAVE_QUIET_SEEDS` / `CONCLAVE_QUIET_HARSH_SEEDS` per
/// policy): what a contended loop of `drop(lock().await?)` does. A quiet request must wait its
/// turn like any other, and a lazy release must end like any other: every checker runs as in
/// the other bands.
#[test]
fn quiet_request_seeds_run_clean() {
    let gentle = seeds("CONCLAVE_QUIET_SEEDS", 8, 150);
    let harsh = seeds("CONCLAVE_QUIET_HARSH_SEEDS", 4, 50);
    let quiet = |mut config: SimConfig| {
        if let Some(workload) = config.workload.as_mut() {
            workload.quiet = 0.5;
            workload.dropped = 0.5;
        }
        config
    };
    for (policy, label) in [
        (PartitionPolicy::Available, "Available"),
        (MAJORITY, "Majority"),
    ] {
        let name = format!("{label}, quiet requests");
        let total = assert_clean(
            &name,
            run_seeds(&quiet(with_services(gentle_profile(policy))), &[], gentle),
        );
        let harsh_name = format!("{label}, quiet requests (harsh)");
        let harsh_total = assert_clean(
            &harsh_name,
            run_seeds(&quiet(with_services(harsh_profile(policy))), &[], harsh),
        );
        assert_harsh(&harsh_name, &harsh_total);
        for (name, t) in [(&name, &total), (&harsh_name, &harsh_total)] {
            let waits = t.grantor.quiet_waits + t.named_services.quiet_waits;
            assert!(waits > 0, "{name}: no request was queued quietly");
            assert!(
                t.named_services.quiet_waits > 0,
                "{name}: no quiet wait in a named service"
            );
            let lazy = t.grantor.lazy_acks + t.named_services.lazy_acks;
            assert!(lazy > 0, "{name}: no release acknowledgement was held back");
        }
    }
}

/// Named services under `Majority` grant under the member's term: a named service that
/// grants without it (no majority's support, no grace period after a takeover) is caught.
/// The window is narrow (the minority's holders lose their locks when they install their
/// minority view, about when the majority's new coordinator can grant), so the search runs
/// where a search of seeds 1 to 1500 first found it (seed 1054, tokens out of order).
#[test]
fn a_named_service_that_grants_without_the_term_is_caught() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            service_without_term: true,
            ..LockSabotage::default()
        },
        ..with_services(SimConfig::locking_harsh(MAJORITY))
    };
    let caught = (1040..=1070u64).find_map(|seed| {
        sim::run(seed, &config)
            .err()
            .filter(|v| {
                v.invariant.starts_with("mutual exclusion")
                    || v.invariant.starts_with("fencing tokens")
            })
            .map(|v| (seed, v.invariant))
    });
    assert!(caught.is_some(), "not caught");
}

#[test]
fn a_grantor_that_serves_after_its_handoff_is_caught() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            serve_after_handoff: true,
            ..LockSabotage::default()
        },
        ..with_transfers(SimConfig::locking(PartitionPolicy::Available))
    };
    let found = (1..=60).find_map(|seed| sim::run(seed, &config).err());
    let violation = found.expect("a checker catches two grantors in one view");
    assert!(
        violation.invariant.contains("one grantor") || violation.invariant.contains("mutual"),
        "{violation}"
    );
}

#[test]
fn a_holder_that_counts_its_lease_from_the_grant_is_caught() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            lease_from_receipt: true,
            ..LockSabotage::default()
        },
        ..with_leases(SimConfig::locking_harsh(PartitionPolicy::Available))
    };
    let found = (1..=60).find_map(|seed| sim::run(seed, &config).err());
    let violation = found.expect("a checker catches a lease counted from the grant's arrival");
    assert!(violation.invariant.contains("mutual"), "{violation}");
}

#[test]
fn granting_from_a_returned_node_grant_is_caught() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            cache_after_return: true,
            ..LockSabotage::default()
        },
        ..with_cache(SimConfig::locking(PartitionPolicy::Available))
    };
    // A protocol broken this way may also spin (the step bound ends the run): look past that.
    let found = (1..=50).find_map(|seed| {
        sim::run(seed, &config)
            .err()
            .filter(|v| !v.invariant.contains("step bound"))
    });
    let violation = found.expect("a checker catches grants from a returned node grant");
    assert!(
        violation.invariant.contains("node grant") || violation.invariant.contains("mutual"),
        "{violation}"
    );
}

/// Node caching under `Majority` with late timers (`SimConfig::late_timers`): lock users call
/// in while a node's lease timers are overdue.
fn cache_with_late_timers(max_ms: u64) -> SimConfig {
    SimConfig {
        late_timers: Some(std::time::Duration::from_millis(max_ms)),
        ..with_cache(SimConfig::locking_harsh(MAJORITY))
    }
}

/// The token checker sees local grants made from node grants (not only the node grants the
/// grantor logs): local grants that all carry their block's first token are caught. (The lapsed
/// node grant of issue 30's finding 4 is not reached by these runs: a lapsed node grant is lost
/// at the member's next input of any kind, and no lock user called in between; the unit tests
/// in `locking::tests::tokens` cover it.)
#[test]
fn repeating_a_cached_token_is_caught() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            cache_repeat_token: true,
            ..LockSabotage::default()
        },
        ..with_cache(SimConfig::locking(MAJORITY))
    };
    let found = (1..=100).find_map(|seed| sim::run(seed, &config).err());
    let violation = found.expect("the token checker sees local grants from node grants");
    assert!(
        violation.invariant.starts_with("fencing tokens"),
        "{violation}"
    );
}

/// Node caching under `Majority` with late timers: lock users call in while a node's lease
/// timers are overdue; the same runs without sabotage are clean (`CONCLAVE_CACHE_LATE_SEEDS`).
#[test]
fn cached_seeds_with_late_timers_run_clean() {
    let count = seeds("CONCLAVE_CACHE_LATE_SEEDS", 5, 50);
    let total = assert_clean(
        "Majority, node cache, late timers (harsh)",
        run_seeds(&cache_with_late_timers(2_500), &[], count),
    );
    assert!(total.cache.hits > 0, "no cache hit");
}

/// A rolling restart of the grantor: the chaos phase's only faults are graceful leaves of the
/// coordinator, one node down at a time, each leaver restarting as a new incarnation, on a
/// network that loses nothing (its delays still reorder datagrams of different streams, so a
/// successor's report request often overtakes the view the leaver sent). Both policies
/// (`CONCLAVE_LEAVE_SEEDS` per policy): every checker holds, no reconciliation runs out of
/// time, and under `Available` each successor serves from the leaver's table.
#[test]
fn graceful_grantor_leaves_never_stall() {
    let count = seeds("CONCLAVE_LEAVE_SEEDS", 10, 200);
    for (name, policy) in [
        ("available", PartitionPolicy::Available),
        ("majority", MAJORITY),
    ] {
        let mut config = SimConfig::locking(policy).with_env_knobs();
        config.only_leaves = true;
        config.grantor_leaves = 1.0;
        let (total, failures, seeds) = run_seeds(&config, &[], count);
        println!("locking simulator, graceful grantor leaves ({name}): {seeds} seeds\n{total}");
        if let Some(first) = failures.first() {
            panic!(
                "{name}: {} of {seeds} seeds failed; the first:\n{first}",
                failures.len()
            );
        }
        let g = &total.grantor;
        assert!(
            total.grantor_leaves >= seeds as u64,
            "{name}: too few grantor leaves"
        );
        assert!(
            total.workload.requests > 0 && g.grants > 0,
            "{name}: no lock traffic"
        );
        assert_eq!(
            g.reconcile_timeouts, 0,
            "{name}: a reconciliation ran out of time after a graceful leave"
        );
        if !policy.is_majority() {
            assert!(
                g.leave_handoffs * 10 >= total.grantor_leaves * 9,
                "{name}: {} tables handed over in {} grantor leaves",
                g.leave_handoffs,
                total.grantor_leaves
            );
        }
    }
}

#[test]
fn granting_a_writer_over_read_delegations_is_caught() {
    let config = SimConfig {
        lock_sabotage: LockSabotage {
            grant_over_delegations: true,
            ..LockSabotage::default()
        },
        ..with_cache(SimConfig::locking(PartitionPolicy::Available))
    };
    let found = (1..=200).find_map(|seed| sim::run(seed, &config).err());
    let violation = found.expect("a checker catches a writer granted over read delegations");
    // A reader served from the delegation beside the writer: a conflict, and (now that the
    // token checker sees local grants) a reader's token below the writer's, whichever the
    // checkers meet first.
    assert!(
        violation.invariant.contains("mutual")
            || violation.invariant.contains("exclusion")
            || violation.invariant.starts_with("fencing tokens"),
        "{violation}"
    );
}

/// The configuration `replay` runs: the profile and policy of the environment, with the
/// workload knobs a violation's replay line names.
fn replay_config() -> SimConfig {
    let policy = match std::env::var("CONCLAVE_SIM_POLICY").as_deref() {
        Ok("majority") => MAJORITY,
        _ => PartitionPolicy::Available,
    };
    let mut config = SimConfig::from_env_profile(Some(policy));
    if std::env::var("CONCLAVE_SIM_CACHE").is_ok_and(|v| v == "1") {
        config = with_cache(config);
    }
    if std::env::var("CONCLAVE_SIM_HANDOFF").is_ok_and(|v| v == "1") {
        config = with_handoff(config);
    }
    // The lease and transfer bands' workloads (the replay line of a violation names them).
    if let Some(workload) = config.workload.as_mut() {
        for (var, share) in [
            ("CONCLAVE_SIM_LEASED", &mut workload.leased),
            ("CONCLAVE_SIM_TRANSFER", &mut workload.transfer),
            ("CONCLAVE_SIM_QUIET", &mut workload.quiet),
            ("CONCLAVE_SIM_DROPPED", &mut workload.dropped),
        ] {
            if let Ok(value) = std::env::var(var) {
                *share = value.parse().expect("a share between 0 and 1");
            }
        }
        if let Ok(value) = std::env::var("CONCLAVE_SIM_SERVICES") {
            workload.services = value.parse().expect("a number of named services");
            workload.actors_per_node = workload.services + 1;
        }
    }
    config
}

/// The replays of issue 30 (each broke an earlier build, with its band's knobs; the simulator
/// and the protocol have changed since, so each is now a different run, kept as a regression
/// seed of its configuration): grantor transfers under `Available` whose members followed
/// another view's transferred grantor (9740974, 9741766; 9722220, 9722107, 9720015 with named
/// services, quiet and dropped requests; 9720380, found the same way; 6004172 and 6014384 of the
/// long transfer run, a grant made in another view accepted by a member whose grantor had moved
/// there, fixed by grants that name their view), a member admitted back as
/// a joiner keeping holds the grantor never learned of (1200060, node cache), and tables that
/// disagreed with beliefs once quiet (41585, 42849, 44509, 28574).
#[test]
fn issue_30_replays_run_clean() {
    let harsh = || harsh_profile(PartitionPolicy::Available);
    let with = |mut config: SimConfig, leased: f64, transfer: f64, services: bool| {
        if let Some(w) = config.workload.as_mut() {
            w.leased = leased;
            w.transfer = transfer;
            if services {
                w.services = 2;
                w.actors_per_node = 3;
                w.quiet = 0.5;
                w.dropped = 0.5;
            }
        }
        config
    };
    let runs: [(SimConfig, &[u64]); 4] = [
        (
            with(harsh(), 0.2, 0.05, false),
            &[9740974, 9741766, 6004172, 6014384],
        ),
        (
            with(harsh(), 0.3, 0.05, true),
            &[9722220, 9722107, 9720015, 9720380],
        ),
        (with_cache(harsh()), &[1200060]),
        (harsh(), &[41585, 42849, 44509, 28574]),
    ];
    for (config, seeds) in runs {
        for &seed in seeds {
            if let Err(violation) = sim::run(seed, &config) {
                panic!("{violation}");
            }
        }
    }
}

/// Replays `CONCLAVE_SIM_SEED` with the knobs of the environment; with `CONCLAVE_SIM_COUNT`,
/// runs that many seeds from it and fails listing every violation (the long runs by hand:
/// `CONCLAVE_SIM_FAULTS=harsh CONCLAVE_SIM_TRANSFER=0.05 CONCLAVE_SIM_SEED=9000000
/// CONCLAVE_SIM_COUNT=20000 cargo test -p conclave-protocol --features sim --release --test
/// locking_simulation replay -- --nocapture`).
#[test]
fn replay() {
    let Ok(seed) = std::env::var("CONCLAVE_SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("CONCLAVE_SIM_SEED is a number");
    let config = replay_config();
    if let Ok(count) = std::env::var("CONCLAVE_SIM_COUNT") {
        let count: u64 = count.parse().expect("CONCLAVE_SIM_COUNT is a number");
        let (total, failures, _) = run_seeds_from(&config, &[], seed, count);
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        println!(
            "{count} seeds from {seed}: {} failed {failed:?}\n{total}",
            failed.len()
        );
        if let Some(first) = failures.first() {
            panic!("{first}");
        }
        return;
    }
    match sim::run(seed, &config) {
        Ok(report) => println!("seed {seed} runs clean\n{report}"),
        Err(violation) => panic!("{violation}"),
    }
}
