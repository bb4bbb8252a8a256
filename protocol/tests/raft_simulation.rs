//! The Raft engine under the deterministic simulator (`conclave_protocol::sim::raft`): a
//! gentle and a harsh seed band, regression seeds, determinism (also across threads), and
//! proof that the exclusion checker fires on a clock outside the engine's drift margin.
//!
//! Sized by environment variables:
//! - `CONCLAVE_RAFT_SEEDS` / `CONCLAVE_RAFT_HARSH_SEEDS`: seeds of the gentle and harsh bands
//!   (defaults: 16 / 12 in debug builds, 400 / 200 in release builds);
//! - `CONCLAVE_SIM_FIRST_SEED` (default 1): the bands' first seed;
//! - `CONCLAVE_SIM_SEED` (with `CONCLAVE_SIM_FAULTS=harsh` for the harsh profile): the seed
//!   `replay` runs and prints; with `CONCLAVE_SIM_COUNT`, that many seeds from it (the long
//!   runs, by hand);
//! - `CONCLAVE_RAFT_NODES`, `CONCLAVE_RAFT_SNAPSHOT_EVERY`, `CONCLAVE_RAFT_SLOW_CLOCK`: the
//!   knobs of `RaftSimConfig::with_env_knobs`, read by the bands and `replay`;
//! - `CONCLAVE_SIM_TRACE=1`: print every fault and event.
//!
//! The long run, by hand (about 15 minutes per 10,000 seeds and profile on one core, release):
//! `CONCLAVE_SIM_FAULTS=harsh CONCLAVE_SIM_SEED=100000 CONCLAVE_SIM_COUNT=10000 cargo test -p
//! conclave-protocol --features sim,raft --release --test raft_simulation replay -- --nocapture`

use std::time::Instant as WallClock;

use conclave_protocol::sim::raft::{self, RaftReport, RaftSimConfig};
use conclave_protocol::sim::Violation;

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

/// Runs `regressions`, then `count` seeds from `first`.
fn run_seeds(
    config: &RaftSimConfig,
    regressions: &[u64],
    first: u64,
    count: u64,
) -> (RaftReport, Vec<Violation>, usize) {
    let seeds: Vec<u64> = regressions
        .iter()
        .copied()
        .chain(first..first + count)
        .collect();
    let mut total = RaftReport::default();
    let mut failures = Vec::new();
    for &seed in &seeds {
        match raft::run(seed, config) {
            Ok(report) => total.accumulate(&report),
            Err(violation) => failures.push(violation),
        }
    }
    (total, failures, seeds.len())
}

fn assert_clean(
    name: &str,
    (total, failures, seeds): (RaftReport, Vec<Violation>, usize),
) -> RaftReport {
    println!("raft simulator, {name}: {seeds} seeds\n{total}");
    if let Some(first) = failures.first() {
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        panic!(
            "{name}: {} of {seeds} seeds violated an invariant (seeds {failed:?}); the first:\n{first}",
            failures.len()
        );
    }
    total
}

fn band(name: &str, config: &RaftSimConfig, regressions: &[u64], count: u64) -> RaftReport {
    let first = env_u64("CONCLAVE_SIM_FIRST_SEED", 1);
    let started = WallClock::now();
    let total = assert_clean(name, run_seeds(config, regressions, first, count));
    println!(
        "{name}: {:.1} s of wall time",
        started.elapsed().as_secs_f64()
    );
    total
}

#[test]
fn gentle_seeds_run_clean() {
    let count = seeds("CONCLAVE_RAFT_SEEDS", 16, 400);
    band(
        "gentle",
        &RaftSimConfig::gentle().with_env_knobs(),
        &[],
        count,
    );
}

#[test]
fn harsh_seeds_run_clean() {
    let count = seeds("CONCLAVE_RAFT_HARSH_SEEDS", 12, 200);
    band(
        "harsh",
        &RaftSimConfig::harsh().with_env_knobs(),
        &[],
        count,
    );
}

/// Replays `CONCLAVE_SIM_SEED` under the profile and knobs of the environment; with
/// `CONCLAVE_SIM_COUNT`, runs that many seeds from it and fails listing every violation.
#[test]
fn replay() {
    let Ok(seed) = std::env::var("CONCLAVE_SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("CONCLAVE_SIM_SEED is a number");
    let config = RaftSimConfig::from_env();
    if let Ok(count) = std::env::var("CONCLAVE_SIM_COUNT") {
        let count: u64 = count.parse().expect("CONCLAVE_SIM_COUNT is a number");
        let started = WallClock::now();
        let (total, failures, _) = run_seeds(&config, &[], seed, count);
        let failed: Vec<u64> = failures.iter().map(|v| v.seed).collect();
        println!(
            "{count} seeds from {seed}: {} failed {failed:?} ({:.1} s)\n{total}",
            failed.len(),
            started.elapsed().as_secs_f64()
        );
        for v in &failures {
            println!("{v}\n");
        }
        if let Some(first) = failures.first() {
            panic!("{first}");
        }
        return;
    }
    match raft::run(seed, &config) {
        Ok(report) => println!("seed {seed} runs clean\n{report}"),
        Err(violation) => panic!("{violation}"),
    }
}

/// The same seed gives the same run, also on another thread (raft-rs draws its election
/// jitter from a thread-local generator: the engine overwrites every draw from the seed).
#[test]
fn a_seed_replays_the_same_run_on_any_thread() {
    for config in [RaftSimConfig::gentle(), RaftSimConfig::harsh()] {
        for seed in [3, 11, 29] {
            let here = raft::run(seed, &config).expect("a clean seed");
            let again = raft::run(seed, &config).expect("a clean seed");
            assert_eq!(here, again, "seed {seed} replays");
            let elsewhere = {
                let config = config.clone();
                std::thread::spawn(move || raft::run(seed, &config).expect("a clean seed"))
                    .join()
                    .expect("the thread ran")
            };
            assert_eq!(
                here.trace_hash, elsewhere.trace_hash,
                "seed {seed} on another thread"
            );
            assert_eq!(here, elsewhere);
        }
    }
}

/// Known-bad: a member whose clock runs at 0.3 of true time (far outside the 10 % margin the sessions
/// assume) keeps believing its holds after the leader expired it; the exclusion checker must
/// say so within a band of seeds.
#[test]
fn the_exclusion_checker_catches_a_clock_outside_the_margin() {
    let config = RaftSimConfig {
        slow_clock: Some(raft::SlowClock { node: 0, rate: 0.3 }),
        ..RaftSimConfig::harsh()
    };
    let caught = (1..=200u64).find(|&seed| raft::run(seed, &config).is_err());
    assert!(
        caught.is_some(),
        "200 harsh seeds with a clock at 0.3 and no violation: the checker is blind"
    );
}
