#!/usr/bin/env bash
# A NIF library installed while nodes run it must not kill them.
#
# Two nodes load ecall's NIF from one priv/ directory (as a benchmark's
# nodes do, or a release's) and send through the C-node links; meanwhile a
# different library is installed there with native/install_nif.sh (what
# every build does). Both nodes must live on and keep carrying messages.
# Copying over the loaded file in place made both nodes die with SIGSEGV
# or SIGBUS at once; this fails then.
#
# Works in a temporary copy of the ebin and priv directories, so the
# checkout's own priv/ is not touched. Run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${ERL_EPMD_PORT:-}" ]; then
    exec test/scripts/with_epmd.sh "$0" "$@"
fi
say() { echo "nif_reinstall: $*" >&2; }

built=$(ls -t target/release/libecall_nif.so 2>/dev/null | head -1)
[ -n "$built" ] || { say "no target/release/libecall_nif.so: run rebar3 compile first"; exit 1; }
work=$(mktemp -d)
a_pid=
cleanup() {
    [ -n "$a_pid" ] && kill "$a_pid" 2>/dev/null && wait "$a_pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

app=$work/ecall
mkdir -p "$app/ebin"
cp _build/default/lib/ecall/ebin/* "$app/ebin/"
native/install_nif.sh "$built" "$app/priv"
# Another valid library: the same one with one more section (the install
# strips debug information only, so it stays different).
echo "reinstalled" > "$work/marker"
objcopy --add-section .ecall_reinstall="$work/marker" "$built" "$work/other.so"

# Node A starts node B (a peer loading the same priv/), connects, sends
# without pause, says "sending", and waits for "go" on its input; then it
# checks that B is alive and that messages sent now still arrive through
# the links, and says "survived".
eval_a='
    {ok, _} = application:ensure_all_started(ecall),
    Erl = os:find_executable("erl"),
    %% Through test/scripts/node.sh, as the suites start theirs, so that a
    %% crash of B fails the run (test/scripts/with_epmd.sh).
    Exec = case os:getenv("ECALL_NODE_CRASHES") of
               false -> Erl;
               _ -> {filename:absname("test/scripts/node.sh"), [Erl]}
           end,
    {ok, Peer, B} = peer:start(#{name => peer:random_name(reinstall_b), exec => Exec,
                                 args => ["-setcookie", atom_to_list(erlang:get_cookie()),
                                          "-pa", code:lib_dir(ecall, ebin)]}),
    {ok, _} = erpc:call(B, application, ensure_all_started, [ecall]),
    ok = ecall:connect(B),
    Self = self(),
    Sink = erpc:call(B, erlang, spawn,
                     [fun() -> (fun L(N) -> receive {n, From, K} -> From ! {got, K}, L(N + 1);
                                                   _ -> L(N + 1) end end)(0) end]),
    Sender = spawn_link(fun() -> (fun L(I) -> ecall:send(Sink, {x, I}), L(I + 1) end)(0) end),
    io:format("sending~n"),
    "go\n" = io:get_line(""),
    unlink(Sender), exit(Sender, kill),
    B = erpc:call(B, erlang, node, []),
    ecall:send(Sink, {n, Self, 1}),
    receive {got, 1} -> ok after 10000 -> io:format("no reply~n"), halt(1) end,
    {ok, #{links_up := L, links := L}} = ecall:stats(B),
    L = ecall_config:links(),
    io:format("survived~n"),
    peer:stop(Peer),
    halt(0).'
# Node A runs under test/scripts/node.sh too (with_epmd.sh sets
# ECALL_NODE_CRASHES).
coproc A { test/scripts/node.sh erl -sname "reinstall_a_$$" -noshell -pa "$app/ebin" -eval "$eval_a" 2>&1; }
a_pid=$A_PID
# Our own copies: bash drops A's descriptors when the coprocess ends.
exec {a_out}<&"${A[0]}" {a_in}>&"${A[1]}"
expect() {
    local line
    while IFS= read -r line <&"$a_out"; do
        [ "$line" = "$1" ] && return 0
        echo "  a: $line" >&2
    done
    say "FAIL: node A ended before saying '$1' (a node died)"
    exit 1
}
expect sending
say "installing another library over the one both nodes run"
cp "$app/priv/libecall_nif.so" "$work/before.so"
native/install_nif.sh "$work/other.so" "$app/priv"
# Else this test would pass without testing anything.
cmp -s "$work/before.so" "$app/priv/libecall_nif.so" && { say "FAIL: the library was not replaced"; exit 1; }
# A node that died closed its input: say so below, not by SIGPIPE here.
trap '' PIPE
echo go >&"$a_in" 2>/dev/null || true
expect survived
wait "$a_pid" || { say "FAIL: node A exited with $?"; exit 1; }
a_pid=
say "ok: both nodes lived through the install and kept sending through the links"
