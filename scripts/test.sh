#!/usr/bin/env bash
# The test command named in README.md: every test and doctest of the workspace, in release
# mode so the simulator's seed bands run quickly: 1,000 gentle and 400 harsh membership seeds,
# 1,500 gentle and 400 harsh locking seeds per policy, and 300 gentle and 75 harsh locking seeds
# per policy with node caching and read delegations on, by default.
# CONCLAVE_SIM_SEEDS / CONCLAVE_LOCK_SEEDS / CONCLAVE_SIM_HARSH_SEEDS / CONCLAVE_LOCK_HARSH_SEEDS /
# CONCLAVE_CACHE_SEEDS / CONCLAVE_CACHE_HARSH_SEEDS / CONCLAVE_SIM_FIRST_SEED choose other bands; CONCLAVE_SIM_FAULTS=harsh runs the gentle bands'
# tests with the harsh profile. Clusters of 32 and 64 members: CONCLAVE_LARGE_SEEDS (membership,
# default 4 per size and profile) and CONCLAVE_LARGE_LOCK_SEEDS (locking, default 1 per size,
# policy and profile). Leases per acquisition: CONCLAVE_LEASE_SEEDS / CONCLAVE_LEASE_HARSH_SEEDS
# (200 / 60 per policy); grantor transfers (Available): CONCLAVE_TRANSFER_SEEDS /
# CONCLAVE_TRANSFER_HARSH_SEEDS (300 / 100). Quiet requests (`lock_quiet`), both policies:
# CONCLAVE_QUIET_SEEDS / CONCLAVE_QUIET_HARSH_SEEDS (150 / 50 per policy). Named services, both
# policies: CONCLAVE_SERVICE_SEEDS / CONCLAVE_SERVICE_HARSH_SEEDS (200 / 60 per policy).
# Every harsh band runs the harsh profile's new faults by default: hold-backs up to 3 s, 1 s or
# 300 ms by seed, clocks pinned at 1 ± ρ or flipping between them, half the cuts and partitions
# one way (docs/protocol.md, "Fault profiles"). Fault knobs, read by every band and `replay`:
# CONCLAVE_SIM_MAX_REORDER_MS (one fixed hold-back ceiling for every seed, e.g. 3000),
# CONCLAVE_SIM_DRIFT (the clock-rate bound ρ, default 0.02), CONCLAVE_SIM_CLOCK_PINNED /
# CONCLAVE_SIM_CLOCK_FLIPPING (shares of incarnations, default 0.25 each; 0 turns one off),
# CONCLAVE_SIM_ONE_WAY (share of one-way cuts and partitions: gentle 0, harsh 0.5).
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --workspace --all-features --release -- --nocapture
