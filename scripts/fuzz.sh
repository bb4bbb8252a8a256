#!/usr/bin/env bash
# Builds the cargo-fuzz targets in fuzz/ and runs each for a bounded time.
#
#   scripts/fuzz.sh smoke            # about 20 s per target (CI)
#   scripts/fuzz.sh long [SECONDS]   # SECONDS per target, default 600
#
# Environment:
#   FUZZ_TARGETS   targets to run, space-separated (default: all four)
#   FUZZ_SECONDS   seconds per target in smoke mode (default 20)
#   CARGO_TARGET_DIR, CARGO_BUILD_JOBS   passed on to cargo as usual
#
# Needs the nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz with
# `cargo install cargo-fuzz --locked` if it is missing. The committed seeds in
# fuzz/corpus/<target>/ are only read; what the fuzzer finds goes to fuzz/work/<target>/
# (ignored by git), so a later run starts from it. A crash leaves its input in
# fuzz/artifacts/<target>/, is printed in base64, and makes the script exit 1.
set -euo pipefail

usage() {
    sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

mode=${1:-smoke}
case "$mode" in
smoke) seconds=${FUZZ_SECONDS:-20} ;;
long) seconds=${2:-600} ;;
*) usage ;;
esac
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || usage
targets=${FUZZ_TARGETS:-wire_decode tcp_frames seal_open endpoint_input}

cd "$(dirname "$0")/.."
started=$(date +%s)

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: the nightly toolchain is missing: rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

echo "== building the fuzz targets"
(cd fuzz && cargo +nightly fuzz build)

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
failed=0
summary=()
for target in $targets; do
    echo "== $target: ${seconds}s"
    mkdir -p "fuzz/work/$target" "fuzz/artifacts/$target"
    log="$logs/$target.log"
    status=0
    # libFuzzer stops itself after max_total_time; the timeout is a backstop (the build is
    # already done, so cargo's start takes seconds).
    (cd fuzz && timeout --kill-after=30 $((seconds + 120)) \
        cargo +nightly fuzz run "$target" "work/$target" "corpus/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 -timeout=10 -rss_limit_mb=2048 \
        >"$log" 2>&1) || status=$?
    runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
    summary+=("$(printf '%-16s %12s runs in %ss' "$target" "${runs:-?}" "$seconds")")
    if [[ $status -ne 0 ]]; then
        failed=1
        summary[-1]+="  FAILED (exit $status)"
        echo "-- $target failed (exit $status); the end of its log:"
        tail -n 40 "$log"
        echo "-- the panic:"
        grep -A 1 'panicked at' "$log" | head -n 4 || echo "(none: a timeout, a leak or a memory limit)"
        for artifact in $(sed -n 's/.*Test unit written to \([^ ]*\).*/\1/p' "$log" | sort -u); do
            if [[ -f "$artifact" ]]; then
                echo "-- input $artifact (base64): $(base64 -w0 "$artifact")"
            fi
        done
    fi
done

echo "== fuzz summary ($mode, $(($(date +%s) - started))s in all)"
printf '%s\n' "${summary[@]}"
exit $failed
