//! The deterministic simulator as a test: many seeds with partitions, crashes, restarts and
//! leaves, zero violations; equal seeds give equal runs; deliberately broken protocols are
//! caught.
//!
//! Sized by environment variables so CI can run a large band in release mode:
//! - `CONCLAVE_SIM_SEEDS` (default 1000 in release builds, 40 in debug builds): how many seeds
//!   `seeds_run_clean` runs;
//! - `CONCLAVE_SIM_FIRST_SEED` (default 1): the first of them;
//! - `CONCLAVE_SIM_SEED`: the seed `replay` runs and prints;
//! - the fault knobs of [`SimConfig::with_env_knobs`] (`CONCLAVE_SIM_MAX_REORDER_MS`,
//!   `CONCLAVE_SIM_DRIFT`, `CONCLAVE_SIM_CLOCK_PINNED`, `CONCLAVE_SIM_CLOCK_FLIPPING`,
//!   `CONCLAVE_SIM_ONE_WAY`), in every band and `replay`.

use std::time::Duration;

use conclave_protocol::gms::Sabotage;
use conclave_protocol::sim::{self, Report, SimConfig};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Seeds found to break an earlier version of the protocol, kept forever.
///
/// - 961: an excluded member kept counting its former coordinator's announcements as signs of
///   life, never suspected it, and stayed in a stale view forever.
const REGRESSION_SEEDS: &[u64] = &[961];

#[test]
fn seeds_run_clean() {
    let first = env_u64("CONCLAVE_SIM_FIRST_SEED", 1);
    let count = env_u64(
        "CONCLAVE_SIM_SEEDS",
        if cfg!(debug_assertions) { 40 } else { 1000 },
    );
    let config = SimConfig::from_env_profile(None);
    let mut total = Report::default();
    let mut failures = Vec::new();
    let seeds: Vec<u64> = REGRESSION_SEEDS
        .iter()
        .copied()
        .chain(first..first + count)
        .collect();
    for &seed in &seeds {
        match sim::run(seed, &config) {
            Ok(report) => total.accumulate(&report),
            Err(violation) => failures.push(violation),
        }
    }
    println!(
        "simulator: {} seeds ({} regression seeds)\n{total}",
        seeds.len(),
        REGRESSION_SEEDS.len()
    );
    if let Some(first) = failures.first() {
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        panic!(
            "{} of {} seeds violated an invariant (seeds {failed:?}); the first:\n{first}",
            failures.len(),
            seeds.len()
        );
    }
    // A band that never reached the faults cannot pass as one that survived them.
    assert!(
        total.coordinator_crashes > 0,
        "no coordinator crash was exercised"
    );
    assert!(
        total.partitions_healed > 0,
        "no partition heal was exercised"
    );
    assert!(total.gms.merges_led > 0, "no merge was exercised");
    assert!(total.gms.joins_accepted > 0, "no join was exercised");
    assert!(total.gms.takeovers > 0, "no takeover was exercised");
    assert!(
        total.gms.leaves_accepted > 0,
        "no graceful leave was exercised"
    );
    assert!(
        total.exclusions_checked > 0,
        "no exclusion deadline was checked"
    );
    assert!(
        total.network.lost > 0 && total.network.duplicated > 0,
        "no loss or duplication"
    );
}

/// Seeds of the harsh profile that broke an earlier version (none yet).
const HARSH_REGRESSION_SEEDS: &[u64] = &[];

/// The harsh profile (link cuts and partitions both ways and one way, process pauses, loss to
/// 30%, reorderings of up to 3 s, clock rates drifting, pinned at the bound or flipping within
/// it): `CONCLAVE_SIM_HARSH_SEEDS` seeds (default 400 in release).
#[test]
fn harsh_seeds_run_clean() {
    let first = env_u64("CONCLAVE_SIM_FIRST_SEED", 1);
    let count = env_u64(
        "CONCLAVE_SIM_HARSH_SEEDS",
        if cfg!(debug_assertions) { 10 } else { 400 },
    );
    let config = SimConfig::harsh().with_env_knobs();
    let mut total = Report::default();
    let mut failures = Vec::new();
    let seeds: Vec<u64> = HARSH_REGRESSION_SEEDS
        .iter()
        .copied()
        .chain(first..first + count)
        .collect();
    for &seed in &seeds {
        match sim::run(seed, &config) {
            Ok(report) => total.accumulate(&report),
            Err(violation) => failures.push(violation),
        }
    }
    println!("simulator, harsh: {} seeds\n{total}", seeds.len());
    if let Some(first) = failures.first() {
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        panic!(
            "{} of {} harsh seeds violated an invariant (seeds {failed:?}); the first:\n{first}",
            failures.len(),
            seeds.len()
        );
    }
    let h = &total.faults;
    assert!(h.stalls > 0, "no stall: {h:?}");
    assert!(h.max_loss_permille >= 250, "loss never reached 25%: {h:?}");
    assert_knobs_exercised("harsh", &config, &total);
    assert!(total.gms.takeovers > 0 && total.gms.merges_led > 0);
}

/// A harsh band must have exercised what its knobs ask for: link cuts both ways and one way,
/// one-way partitions, hold-backs near the longest, clocks pinned at the bound and flipping.
fn assert_knobs_exercised(name: &str, config: &SimConfig, total: &Report) {
    let (h, knobs) = (&total.faults, config.harsh.clone().unwrap_or_default());
    if config.one_way < 1.0 {
        assert!(h.link_cuts > 0, "{name}: no link cut both ways: {h:?}");
    }
    if config.one_way > 0.0 {
        assert!(
            h.one_way_cuts > 0 && h.one_way_partitions > 0,
            "{name}: no one-way cut or partition: {h:?}"
        );
    }
    if knobs.reorder > 0.0 {
        assert!(
            total.network.reordered > 0 && h.longest_hold_back > knobs.max_reorder_delay / 2,
            "{name}: no hold-back near {:?}: {h:?}",
            knobs.max_reorder_delay
        );
    }
    if let Some(missing) = h.missing_clock_faults(&knobs) {
        panic!("{name}: {missing}: {h:?}");
    }
}

/// Clusters of 32 and 64 members, gentle and harsh: `CONCLAVE_LARGE_SEEDS` seeds per size and
/// profile (default 4 in release builds, 1 in debug builds). Replay one with
/// `CONCLAVE_SIM_NODES=64` (and `CONCLAVE_SIM_FAULTS=harsh`) and `CONCLAVE_SIM_SEED`.
#[test]
fn large_clusters_run_clean() {
    let first = env_u64("CONCLAVE_SIM_FIRST_SEED", 1);
    let count = env_u64(
        "CONCLAVE_LARGE_SEEDS",
        if cfg!(debug_assertions) { 1 } else { 4 },
    );
    let mut failures = Vec::new();
    let mut all = Report::default();
    for nodes in [32, 64] {
        for (name, config) in [
            ("gentle", SimConfig::default().with_env_knobs()),
            ("harsh", SimConfig::harsh().with_env_knobs()),
        ] {
            let config = config.with_nodes(nodes);
            let mut total = Report::default();
            for seed in first..first + count {
                match sim::run(seed, &config) {
                    Ok(report) => total.accumulate(&report),
                    Err(violation) => failures.push(violation),
                }
            }
            println!("simulator, {nodes} members, {name}: {count} seeds\n{total}");
            all.accumulate(&total);
        }
    }
    if count > 0 {
        assert!(
            all.coordinator_crashes > 0,
            "no coordinator crash was exercised"
        );
        assert!(all.gms.takeovers > 0 && all.gms.merges_led > 0);
    }
    if let Some(first) = failures.first() {
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        panic!(
            "{} large-cluster runs violated an invariant (seeds {failed:?}); the first:\n{first}",
            failures.len()
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let config = SimConfig::default();
    for seed in [3, 11] {
        let a = sim::run(seed, &config).expect("seed runs clean");
        let b = sim::run(seed, &config).expect("seed runs clean");
        assert_eq!(a, b);
        assert_ne!(a.trace_hash, 0);
    }
    let a = sim::run(3, &config).expect("seed runs clean");
    let c = sim::run(4, &config).expect("seed runs clean");
    assert_ne!(a.trace_hash, c.trace_hash, "different seeds should differ");
}

/// Runs seeds with a broken protocol until a checker fires; returns the invariant named.
fn first_violation(sabotage: Sabotage, seeds: u64) -> Option<&'static str> {
    let config = SimConfig {
        sabotage,
        ..SimConfig::default()
    };
    (1..=seeds).find_map(|seed| sim::run(seed, &config).err().map(|v| v.invariant))
}

#[test]
fn accepting_stale_views_is_caught() {
    let caught = first_violation(
        Sabotage {
            skip_view_epoch_check: true,
            ..Sabotage::default()
        },
        30,
    );
    assert_eq!(caught, Some("view epochs strictly increase at each member"));
}

#[test]
fn never_excluding_the_dead_is_caught() {
    let caught = first_violation(
        Sabotage {
            never_exclude: true,
            ..Sabotage::default()
        },
        10,
    );
    assert!(
        caught.is_some(),
        "a coordinator that never excludes must be caught"
    );
}

#[test]
fn calm_bound_is_reached_quickly_without_faults() {
    let config = SimConfig {
        chaos: Duration::ZERO,
        ..SimConfig::default()
    };
    let report = sim::run(1, &config).expect("a fault-free start converges");
    assert_eq!(report.crashes + report.partitions, 0);
    assert!(report.converged_after < Duration::from_secs(3), "{report}");
}

#[test]
fn replay() {
    let Ok(seed) = std::env::var("CONCLAVE_SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("CONCLAVE_SIM_SEED is a number");
    match sim::run(seed, &SimConfig::from_env_profile(None)) {
        Ok(report) => println!("seed {seed} runs clean\n{report}"),
        Err(violation) => panic!("{violation}"),
    }
}
