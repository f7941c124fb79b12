#!/usr/bin/env bash
# Builds both examples and runs each on two nodes, against a private epmd:
#   elixir_app      a mix project, ecall as a path dependency (Debian's elixir)
#   rebar3_release  a rebar3 project with a relx release, ecall in _checkouts
# On each pair, node a sends, casts and calls to node b through ecall; the
# run fails unless every message and reply came back and the NIF transport
# carried them. Every node it starts is stopped by its pid at the end, and
# the epmd by test/scripts/with_epmd.sh. No hex packages: mix uses the
# system's rebar3. cargo's target dir is ecall's own target/ (or
# CARGO_TARGET_DIR), so a built NIF is not built again.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [ -z "${ERL_EPMD_PORT:-}" ]; then
    bash .ci/deps.sh --examples
    exec test/scripts/with_epmd.sh "$0" "$@"
fi

pids=()
logs=$(mktemp -d)
cleanup() {
    local p
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$logs"
}
trap cleanup EXIT
say() { echo "examples: $*" >&2; }
fail() {
    say "FAIL: $*"
    for f in "$logs"/*; do [ -f "$f" ] && { echo "--- ${f##*/}" >&2; tail -30 "$f" >&2; }; done
    exit 1
}
# Waits (10 s at most) until a command succeeds.
await() {
    local what=$1
    shift
    for _ in $(seq 1 100); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    fail "$what"
}
expect() { # file, then fixed strings it must contain
    local f=$1
    shift
    for s in "$@"; do grep -qF -- "$s" "$f" || fail "${f##*/} lacks '$s'"; done
}

host=$(hostname -s)
cookie=examples_$$

# --- a mix project -----------------------------------------------------------
say "elixir_app: mix compile"
ex=$root/examples/elixir_app
export MIX_HOME=$ex/_build/mix_home MIX_ENV=dev
(cd "$ex" && mix local.rebar --force rebar3 "$(command -v rebar3)" && mix deps.get && mix compile) \
    >"$logs/mix_build" 2>&1 || fail "mix compile"

say "elixir_app: two nodes"
b=ex_b_$$
ready=$logs/ex_b.ready
(cd "$ex" && exec elixir --sname "$b" --cookie "$cookie" -S mix run --no-halt --no-compile --no-deps-check \
    -e "File.write!(\"$ready\", \"\")") >"$logs/ex_b" 2>&1 &
pids+=($!)
await "node $b did not start" test -f "$ready"
(cd "$ex" && exec timeout 60 elixir --sname "ex_a_$$" --cookie "$cookie" -S mix run --no-compile --no-deps-check \
    -e "EcallExample.main(:\"$b@$host\")") >"$logs/ex_a" 2>&1 || fail "EcallExample.main on ex_a_$$"
expect "$logs/ex_a" "send: :$b@$host echoed :hello" "cast: ran on" "call: String.upcase" "stats: transport nif"
# The pub/sub example: 50 subscribers on each node, broadcasts by
# :ecall.send_group/3.
(cd "$ex" && exec timeout 60 elixir --sname "ex_c_$$" --cookie "$cookie" -S mix run --no-compile --no-deps-check \
    -e "EcallExample.PubSub.demo(:\"$b@$host\", 50)") >"$logs/ex_pubsub" 2>&1 || fail "EcallExample.PubSub.demo on ex_c_$$"
expect "$logs/ex_pubsub" "pubsub: 100 subscribers on 2 nodes got 10 broadcasts each, in order"
cat "$logs/ex_a" "$logs/ex_pubsub" >&2

# --- a relx release ----------------------------------------------------------
say "rebar3_release: rebar3 release"
rel=$root/examples/rebar3_release
(cd "$rel" && rebar3 release) >"$logs/rel_build" 2>&1 || fail "rebar3 release"
bin=$rel/_build/default/rel/ecall_example/bin/ecall_example
[ -f "$rel/_build/default/rel/ecall_example/lib/ecall-0.1.0/priv/libecall_nif.so" ] ||
    fail "the release has no lib/ecall-0.1.0/priv/libecall_nif.so"

say "rebar3_release: two nodes"
# The start script writes vm.args from vm.args.src with NODE_NAME and COOKIE
# replaced; each node gets its own directory for it (RELX_OUT_FILE_PATH).
relenv() { echo NODE_NAME="rel_$1_$$" COOKIE="$cookie" RELX_OUT_FILE_PATH="$logs/vm_$1"; }
for n in a b; do
    mkdir -p "$logs/vm_$n"
    env $(relenv $n) "$bin" foreground >"$logs/rel_$n" 2>&1 &
    pids+=($!)
done
for n in a b; do
    # eval starts a hidden node: the node is up and the example app started
    await "release node rel_${n}_$$ did not start" \
        env $(relenv $n) "$bin" eval 'true = is_pid(whereis(ecall_example)).'
done
env $(relenv a) timeout 60 "$bin" eval "ecall_example:main('rel_b_$$@$host')." \
    >"$logs/rel_eval" 2>&1 || fail "ecall_example:main on rel_a_$$"
expect "$logs/rel_eval" "{ok, nif, "
expect "$logs/rel_a" "send: rel_b_$$@$host echoed hello" "cast: ran on" "call: lists:sum" "stats: transport nif"
# ecall's status reaches the caller of `bin/... eval' (info_lines/0 returns
# it; info/0 prints on the node).
env $(relenv a) "$bin" eval 'ecall:info_lines().' >"$logs/rel_info" 2>&1 ||
    fail "ecall:info_lines() on rel_a_$$"
expect "$logs/rel_info" "ecall on rel_a_$$@$host: nif transport" "peer rel_b_$$@$host: up"
cat "$logs/rel_a" "$logs/rel_eval" "$logs/rel_info" >&2

say "ok: both examples sent, cast and called between two nodes"
