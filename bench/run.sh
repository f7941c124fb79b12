#!/usr/bin/env bash
# Runs the two-node benchmark:
#   bench/run.sh demo | quick | full | paced [N K P] | sweep N1,N2,.. K P
#                | micro | large | latency [N] | profile [N [OP]] | soak MINUTES
# demo/quick: send, cast, call at 2,000 and 10,000 writers; full: the
# article's sweep to 150,000 writers; paced: send at N writers, K messages
# each, P ms apart; sweep: every operation at the writer counts given;
# micro: push and encode costs per call; large: 10 MB messages beside small
# ones; latency: a probe's call round trips, idle and under N writers;
# profile: perf on both nodes during one point per transport, flame graphs
# and a breakdown; soak: 5,000 writers for MINUTES. Variants (ECALL_BENCH_VARIANTS,
# comma-separated, default all): native, ecall_erlang, ecall_nif, local;
# ECALL_BENCH_OPS (send,cast,call) limits a sweep's operations.
# ECALL_BENCH_ERL_FLAGS adds emulator flags to node A (for example "+S 1").
#
# Node A runs the driver; it starts node B with `peer'. Both run with
# +sbwt none (and the dirty-scheduler equivalents) so that CPU time is work,
# not busy-waiting. Use under test/with_epmd.sh (as `make demo` does) to
# keep to a private epmd.
set -euo pipefail
cd "$(dirname "$0")/.."

out=_build/bench
mkdir -p "$out"

# The profile mode: perf records both nodes (Debian's linux-perf), and
# inferno (from crates.io, built once into a cache outside the clone) turns
# the recordings into flame graphs.
if [ "${1:-}" = profile ]; then
    command -v perf >/dev/null || { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; }
    tools=${ECALL_BENCH_TOOLS:-$HOME/.cache/ecall-bench}
    if [ ! -x "$tools/bin/inferno-flamegraph" ]; then
        echo "bench: building inferno (once) into $tools" >&2
        cargo install -q --locked inferno --root "$tools"
    fi
    prof="bench/results/$(date +%F)-$(hostname -s)/profile"
    mkdir -p "$prof"
    export ECALL_BENCH_PROFILE_DIR=$prof ECALL_BENCH_PERF=1
    ECALL_BENCH_ERL_FLAGS="${ECALL_BENCH_ERL_FLAGS:-} +JPperf true"
fi
# The node helper is shared with the Common Test suites.
erlc -o "$out" -I test bench/ecall_bench.erl test/ecall_test_nodes.erl
# shellcheck disable=SC2086
erl -sname "bench_a_$$" +sbwt none +sbwtdcpu none +sbwtdio none +P 4000000 ${ECALL_BENCH_ERL_FLAGS:-} \
    -noinput -pa _build/default/lib/ecall/ebin -pa "$out" \
    -run ecall_bench main "$@"

if [ "${1:-}" = profile ]; then
    # Only this run's operation: `messages' and `nodes' speak of this run.
    for f in "$prof"/"${3:-send}"-*.perf; do
        v=$(basename "$f" .perf)
        perf script -i "$f" 2>/dev/null | "$tools/bin/inferno-collapse-perf" > "$prof/$v.folded"
        "$tools/bin/inferno-flamegraph" --title "ecall $v: both nodes" < "$prof/$v.folded" > "$prof/$v.svg"
        msgs=$(awk -v v="$v" '$1 == v {print $2}' "$prof/messages")
        python3 bench/profile.py "$f" "$prof/nodes" "$msgs" 499 > "$prof/$v.md"
        echo "profile $v: $prof/$v.svg, $prof/$v.md"
        cat "$prof/$v.md"
    done
    exit 0
fi

# Plots of what this run wrote (matplotlib from PyPI, installed when
# missing; without it the CSV is still there).
dir=$(ls -td bench/results/*/ 2>/dev/null | head -1)
if [ -n "$dir" ] && ls "$dir"/*.csv >/dev/null 2>&1; then
    python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib >/dev/null 2>&1 || true
    python3 bench/plot.py "$dir" || echo "bench: no plots (matplotlib missing)"
fi
