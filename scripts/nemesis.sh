#!/usr/bin/env bash
# The nemesis on real processes (docs/reliability.md): five conclave-node processes in a
# network namespace of their own, fenced clients on four locks, faults chosen by a seed (kill -9
# and restart, SIGSTOP/SIGCONT, packet loss and partitions with nftables, in-process delay and
# reordering, garbage bytes), then a quiet phase and a checker that reads only the logs.
#
#   scripts/nemesis.sh --seconds N [--policy available|majority|raft] [--transport udp|tcp] [--key] [--handoff]
#                      [--seed S] [--out DIR] [--suspect-ms MS] [--hold-ms MS] [--broken]
#                      [--spare-coordinator]
#
# Each run writes its folder (under --out DIR if given, else the temporary directory) and
# prints it. Without --policy and --transport it runs the four combinations in turn (N seconds each, seeds
# S, S+1, ...). Needs root (it creates a network namespace); installs nftables and iproute2 if
# missing. Exits non-zero if any run found a violation; each failing run prints its seed and
# the command that reruns it.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
policy=""
transport=""
seed=""
out=""
rest=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) seconds="$2"; shift 2 ;;
        --policy) policy="$2"; shift 2 ;;
        --transport) transport="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        --key|--broken|--spare-coordinator|--handoff) rest+=("$1"); shift ;;
        --out) out="$2"; shift 2 ;;
        --suspect-ms|--hold-ms) rest+=("$1" "$2"); shift 2 ;;
        *) echo "nemesis.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done

if [ "$(id -u)" != 0 ]; then
    echo "nemesis.sh: needs root (it creates a network namespace)" >&2
    exit 2
fi
if ! command -v nft >/dev/null || ! command -v ip >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq nftables iproute2 >/dev/null
fi

# The workspace's features, as scripts/test.sh builds them, so CI reuses its release build.
cargo build --locked --release --workspace --all-features --bins
target="${CARGO_TARGET_DIR:-target}/release"
seed="${seed:-$(date +%s)}"

combos=()
for p in ${policy:-majority available}; do
    for t in ${transport:-udp tcp}; do
        combos+=("$p $t")
    done
done
failed=0
for combo in "${combos[@]}"; do
    set -- $combo
    where=()
    if [ -n "$out" ]; then
        where=(--out "$out/$1-$2-seed$seed")
    fi
    echo "== nemesis: --policy $1 --transport $2 --seconds $seconds --seed $seed ${rest[*]:-}"
    if ! "$target/conclave-nemesis" --seconds "$seconds" --policy "$1" --transport "$2" \
        --seed "$seed" "${where[@]}" "${rest[@]}"; then
        failed=1
    fi
    seed=$((seed + 1))
done
exit "$failed"
