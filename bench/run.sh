#!/usr/bin/env bash
# Runs the two-node benchmark:
#   bench/run.sh demo | quick | full | paced [N K P] | sweep N1,N2,.. K P
#                | micro | large | big | fanout | latency [N] | pingpong [N] | tls [N] | hops
#                | profile [N [OP]] | rest [PEERS] | soak MINUTES
# demo/quick: send, cast, call at 2,000 and 10,000 writers; full: the
# article's sweep to 150,000 writers; paced: send at N writers, K messages
# each, P ms apart; sweep: every operation at the writer counts given;
# micro: push and encode costs per call; large: 10 MB messages beside small
# ones; big: five terms of tens of MB one after another, then 20 senders
# of three 0.5-5 MB terms at once, by ecall:send/2 and `!' (delivery
# time, intact, a 1 ms ticker's lateness and long_schedule events on both
# nodes, B's receiver heaps after; ECALL_BENCH_ROUNDS rounds, default 2;
# ECALL_BENCH_BIG_SCALE scales the sizes, default 1.0; ECALL_BENCH_PROBE=native
# sends the small-message probe by `!' whatever the variant);
# fanout: one sender to 1,000 and 10,000 targets over 1 and 3 peers,
# messages of 200 B and 10 KB, by `!', ecall:send/2, a manifold-style
# per-node partitioner and ecall:send_many/2, beside the bound (each peer's
# own loop to its targets) (delivered msg/s, send time per fan-out, CPU and
# wire bytes per message, A's peak memory; about 2.5 min;
# ECALL_BENCH_FANOUT_TARGETS, _PEERS, _SIZES and _ROUNDS override,
# comma-separated);
# latency: a probe's call round trips, idle and under N writers;
# pingpong: closed-loop callers (1, 8, 64, 1,000, and 1 with 100,000 messages queued;
# ECALL_BENCH_CALLERS=C1,C2,.. for other counts)
# making N back-to-back calls each (ECALL_BENCH_EXCHANGE=send: a request
# and its reply by sends instead, plain and urgent);
# tls: send, cast, call at N writers, native and both ecall transports, on TLS
# distribution (ECALL_BENCH_TLS=1 puts any other mode on TLS); hops: idle round trips leg by leg (! or ecall each way);
# profile: perf on both nodes during one point per transport, flame graphs
# and a breakdown; rest: Erlang memory per peer at rest, with PEERS
# peers (default 8); soak: 5,000 writers for MINUTES. Variants (ECALL_BENCH_VARIANTS,
# comma-separated, in the order to run them at each point; default all):
# native, ecall_erlang, ecall_nif, local;
# ECALL_BENCH_OPS (send,cast,call) limits a sweep's operations;
# ECALL_BENCH_LOOPERS=N adds N closed-loop callers beside each point's writers.
# ECALL_BENCH_ERL_FLAGS adds emulator flags to node A (for example "+S 1").
# ECALL_BENCH_OTP=27 (or 29) runs both nodes on that OTP release, unpacked
# by test/scripts/otp27.sh as for the tests (A starts B from its own
# release); the modules stay those this machine's OTP compiled, which both
# releases load.
#
# Node A runs the driver; it starts node B with `peer'. Both run with
# +sbwt none (and the dirty-scheduler equivalents) so that CPU time is work,
# not busy-waiting. Use under test/scripts/with_epmd.sh (as `make demo`
# does) to keep to a private epmd.
set -euo pipefail
cd "$(dirname "$0")/.."

out=_build/bench
mkdir -p "$out"

# The tls mode: both nodes on TLS distribution (-proto_dist inet_tls), with
# a CA and a node certificate for this host made here (openssl), peer
# verification on both ways.
if [ "${1:-}" = tls ] || [ -n "${ECALL_BENCH_TLS:-}" ]; then
    tls="$out/tls"
    mkdir -p "$tls"
    host=$(hostname -s)
    printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=DNS:%s\n' "$host" > "$tls/ext.cnf"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ecall-bench-ca \
        -keyout "$tls/ca.key" -out "$tls/ca.pem" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$host" \
        -keyout "$tls/key.pem" -out "$tls/node.csr" 2>/dev/null
    openssl x509 -req -days 2 -in "$tls/node.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
        -CAcreateserial -extfile "$tls/ext.cnf" -out "$tls/cert.pem" 2>/dev/null
    side="{certfile, \"$PWD/$tls/cert.pem\"}, {keyfile, \"$PWD/$tls/key.pem\"}, {cacertfile, \"$PWD/$tls/ca.pem\"}, {verify, verify_peer}"
    echo "[{server, [{fail_if_no_peer_cert, true}, $side]}, {client, [$side]}]." > "$tls/dist.conf"
    flags="-proto_dist inet_tls -ssl_dist_optfile $PWD/$tls/dist.conf"
    export ECALL_BENCH_B_FLAGS="${ECALL_BENCH_B_FLAGS:-} $flags"
    ECALL_BENCH_ERL_FLAGS="${ECALL_BENCH_ERL_FLAGS:-} $flags"
fi

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
erl_cmd=erl
case "${ECALL_BENCH_OTP:-}" in
    "") ;;
    27) erl_cmd=$(test/scripts/otp27.sh) ;;
    29) erl_cmd=$(test/scripts/otp27.sh 29 sid) ;;
    *) echo "bench: ECALL_BENCH_OTP must be 27 or 29 (or unset: the erl on PATH)" >&2; exit 2 ;;
esac
# The node helper is shared with the Common Test suites.
erlc -o "$out" -I test bench/ecall_bench.erl bench/ecall_bench_big.erl bench/ecall_bench_fanout.erl test/ecall_test_nodes.erl
# Its nodes start through test/scripts/node.sh, found in scripts/ beside
# ecall_test_nodes.
cp -r test/scripts "$out/"
# shellcheck disable=SC2086
"$erl_cmd" -sname "bench_a_$$" +sbwt none +sbwtdcpu none +sbwtdio none +P 4000000 ${ECALL_BENCH_ERL_FLAGS:-} \
    -noinput -pa _build/default/lib/ecall/ebin -pa "$out" \
    -run ecall_bench main "$@" &
erl_pid=$!
# A run stopped part way (kill, or a signal to this script alone) stops
# node A too; A stops its peer B (peer:stop on shutdown). Without this, both
# nodes outlived the script, and the private epmd it ran under.
trap 'kill "$erl_pid" 2>/dev/null || true' INT TERM HUP
wait "$erl_pid"
trap - INT TERM HUP

if [ "${1:-}" = profile ]; then
    # Only this run's operation: `messages-OP' and `nodes-OP' speak of this run.
    op=${3:-send}
    for f in "$prof"/"$op"-*.perf; do
        v=$(basename "$f" .perf)
        # A recording of an earlier run (ECALL_BENCH_VARIANTS left its
        # variant out of this one) has no message count here: skipped.
        grep -q "^$v " "$prof/messages-$op" || continue
        { perf script -i "$f" 2>/dev/null || true; } | "$tools/bin/inferno-collapse-perf" > "$prof/$v.folded"
        # A recording perf did not finish (seen once: "data size field is
        # 0") has no stacks: said, and the other variant's still made.
        if [ ! -s "$prof/$v.folded" ]; then
            echo "bench: $f holds no samples (perf record did not finish); run the mode again" >&2
            continue
        fi
        "$tools/bin/inferno-flamegraph" --title "ecall $v: both nodes" < "$prof/$v.folded" > "$prof/$v.svg"
        msgs=$(awk -v v="$v" '$1 == v {print $2}' "$prof/messages-$op")
        python3 bench/profile.py "$f" "$prof/nodes-$op" "$msgs" 499 > "$prof/$v.md"
        echo "profile $v: $prof/$v.svg, $prof/$v.md"
        cat "$prof/$v.md"
    done
    exit 0
fi

# Plots of what this run wrote (matplotlib from PyPI, installed when
# missing; without it the CSV is still there), where it wrote it
# (ECALL_BENCH_OUT, as in ecall_bench:write_csv/3).
dir=$(ls -td "${ECALL_BENCH_OUT:-bench/results}"/*/ 2>/dev/null | head -1)
if [ -n "$dir" ] && ls "$dir"/*.csv >/dev/null 2>&1; then
    python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib >/dev/null 2>&1 || true
    python3 bench/plot.py "$dir" || echo "bench: no plots (matplotlib missing)"
fi
