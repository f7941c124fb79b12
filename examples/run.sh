#!/usr/bin/env bash
# Follows the README's mix steps on fresh `mix new` projects, then builds
# both examples and runs each on two nodes, against a private epmd:
#   README's mix    ecall as a path and as a git dependency, no hex
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

# --- the README's mix steps --------------------------------------------------
# Its mix section (Installation) as written: the dependency lines and the
# shell lines, each project with a MIX_HOME of its own, as on a new machine.
# HEX_MIRROR points nowhere, so anything that needs hex fails here as it
# would without hex access.
export MIX_ENV=dev HEX_MIRROR=http://127.0.0.1:9
mix_section() { awk '/^mix \(Elixir\)/ { on = 1 } on && /^Start the `ecall` application/ { exit } on' README.md; }
mapfile -t mix_steps < <(mix_section | awk '/^```sh$/ { on = 1; next } on && /^```$/ { exit } on')
[ ${#mix_steps[@]} -gt 0 ] || fail "README.md: no shell lines in the mix section"
readme_dep() { # git | path: the README's dependency of that kind
    local dep
    dep=$(mix_section | grep -o "{:ecall, $1: [^}]*}") || fail "README.md: no $1 dependency in the mix section"
    [ "$(echo "$dep" | wc -l)" -eq 1 ] || fail "README.md: more than one $1 dependency in the mix section"
    echo "$dep"
}
readme_steps() { # dir log: the README's shell lines, one at a time, in dir
    local line
    for line in "${mix_steps[@]}"; do
        echo "\$ $line" >>"$2"
        (cd "$1" && bash -c "$line") </dev/null >>"$2" 2>&1 || fail "README's '$line' in ${1##*/}"
    done
}
mix_app() { # name dep: a `mix new' project in $logs with dep as its one dependency
    (cd "$logs" && mix new "$1") >/dev/null 2>&1 || fail "mix new $1"
    DEP=$2 perl -0pi -e 's/(defp deps do\n\s*\[)[^\]]*\]/$1$ENV{DEP}]/' "$logs/$1/mix.exs"
    grep -qF "[$2]" "$logs/$1/mix.exs" || fail "$1/mix.exs does not list $2"
}
probe='IO.inspect(:ecall.call(node(), :lists, :sum, [[1, 2]])); IO.puts(hd(:ecall.info_lines())); IO.puts(:code.which(:ecall))'

# A path dependency, "../ecall" from the project as in the README: a link
# to this checkout, whose NIF is built already (or built in its target/).
say "README's mix steps: a path dependency"
ln -s "$root" "$logs/ecall"
export MIX_HOME=$logs/mix_home_path
dep=$(readme_dep path)
mix_app readme_path "$dep"
readme_steps "$logs/readme_path" "$logs/readme_path.out"
(cd "$logs/readme_path" && timeout 60 mix run -e "$probe") >>"$logs/readme_path.out" 2>&1 ||
    fail "mix run in readme_path"
expect "$logs/readme_path.out" "{:ok, 3}" ": nif transport"

# A git dependency: the README's line with its URL replaced by a local
# repository whose branch main holds this checkout's HEAD (its files, one
# commit: this checkout may be a shallow clone). Built with ECALL_NO_NIF=1:
# the NIF would be a full cargo build of a fresh clone (minutes), and the
# NIF build is what the path dependency and elixir_app run.
say "README's mix steps: a git dependency"
mkdir "$logs/ecall_git"
git archive HEAD | tar -x -C "$logs/ecall_git"
(cd "$logs/ecall_git" && git init -q -b main && git add -A &&
    git -c user.name=examples -c user.email=examples@localhost commit -q -m ecall) || fail "git repository for the git dependency"
export MIX_HOME=$logs/mix_home_git
dep=$(readme_dep git)
mix_app readme_git "$(echo "$dep" | sed "s|git: \"[^\"]*\"|git: \"file://$logs/ecall_git\"|")"
ECALL_NO_NIF=1 readme_steps "$logs/readme_git" "$logs/readme_git.out"
(cd "$logs/readme_git" && ECALL_NO_NIF=1 timeout 60 mix run -e "$probe") >>"$logs/readme_git.out" 2>&1 ||
    fail "mix run in readme_git"
expect "$logs/readme_git.out" "{:ok, 3}" ": erlang transport" "readme_git/_build/dev/lib/ecall/ebin/ecall.beam"

# --- a mix project -----------------------------------------------------------
say "elixir_app: mix compile (the README's mix steps)"
ex=$root/examples/elixir_app
export MIX_HOME=$logs/mix_home
readme_steps "$ex" "$logs/mix_build"

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
