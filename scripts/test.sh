#!/usr/bin/env bash
# The test command named in README.md: every test and doctest of the workspace, in release
# mode so the simulator's seed bands (1,000 membership and 1,500 locking seeds per policy by default) run quickly.
# CONCLAVE_SIM_SEEDS / CONCLAVE_SIM_FIRST_SEED choose another band.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --workspace --all-features --release -- --nocapture
