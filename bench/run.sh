#!/usr/bin/env bash
# Runs the two-node benchmark:
#   bench/run.sh demo | quick | full | paced [N K P] | sweep N1,N2,.. K P
#                | micro | large | soak MINUTES
# demo/quick: send, cast, call at 2,000 and 10,000 writers; full: the
# article's sweep to 150,000 writers; paced: send at N writers, K messages
# each, P ms apart; sweep: every operation at the writer counts given;
# micro: push and encode costs per call; large: 10 MB messages beside small
# ones; soak: 5,000 writers for MINUTES. Variants (ECALL_BENCH_VARIANTS,
# comma-separated, default all): native, ecall_erlang, ecall_nif, local.
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
# The node helper is shared with the Common Test suites.
erlc -o "$out" -I test bench/ecall_bench.erl test/ecall_test_nodes.erl
# shellcheck disable=SC2086
erl -sname "bench_a_$$" +sbwt none +sbwtdcpu none +sbwtdio none +P 4000000 ${ECALL_BENCH_ERL_FLAGS:-} \
    -noinput -pa _build/default/lib/ecall/ebin -pa "$out" \
    -run ecall_bench main "$@"

# Plots of what this run wrote (matplotlib from PyPI, installed when
# missing; without it the CSV is still there).
dir=$(ls -td bench/results/*/ 2>/dev/null | head -1)
if [ -n "$dir" ] && ls "$dir"/*.csv >/dev/null 2>&1; then
    python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib >/dev/null 2>&1 || true
    python3 bench/plot.py "$dir" || echo "bench: no plots (matplotlib missing)"
fi
