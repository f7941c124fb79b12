#!/usr/bin/env bash
# test/scripts/with_epmd.sh fails a run in which one of the tests' nodes
# died of a crash signal, even when everything the run checked passed and
# even when the node crashed after the command had ended: two scheduler
# threads of such nodes once died of SIGSEGV while they exited (their
# library was overwritten in place), the kernel logged it, and nothing
# failed.
#  1. a node that halts: the run passes;
#  2. a node killed by SIGSEGV while the command still runs: the run fails
#     and says which node;
#  3. a node that crashes after the command has ended: the run waits for
#     it, then fails.
# Run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/../.."
say() { echo "crash_check: $*" >&2; }
fail() { say "FAILED: $*"; exit 1; }
erl=$(command -v erl)
# Each case runs under a with_epmd.sh of its own (not this script's).
unset ECALL_NODE_CRASHES ERL_EPMD_PORT

out=$(mktemp)
fifo=$(mktemp -u)
trap 'rm -f "$out"' EXIT

test/scripts/with_epmd.sh test/scripts/node.sh "$erl" -noshell -eval 'halt().' 2>"$out" ||
    { cat "$out" >&2; fail "a node that halted failed the run"; }
say "ok: a node that halts passes"

if test/scripts/with_epmd.sh sh -c '"$@"; exit 0' sh test/scripts/node.sh "$erl" -noshell \
        -eval 'os:cmd("kill -SEGV " ++ os:getpid()).' 2>"$out"; then
    fail "a node killed by SIGSEGV did not fail the run"
fi
grep -q "died of a crash signal" "$out" && grep -q "signal 11 (exit status 139)" "$out" ||
    { cat "$out" >&2; fail "the run did not say which node crashed"; }
say "ok: a node killed by SIGSEGV fails the run"

# The node crashes only once the command has ended: its input is a fifo
# that the command alone holds open for writing, so the node reads end of
# file when the command exits (it exits once the node said "up").
in=$fifo.in up=$fifo.up
mkfifo "$in" "$up"
trap 'rm -f "$out" "$in" "$up"' EXIT
if test/scripts/with_epmd.sh sh -c 'in=$1 up=$2; shift 2
        "$@" <"$in" >"$up" & exec 3>"$in"; read -r line <"$up"; exit 0' \
        sh "$in" "$up" test/scripts/node.sh "$erl" -noshell \
        -eval 'io:format("up~n"), eof = io:get_line(""), os:cmd("kill -SEGV " ++ os:getpid()).' \
        2>"$out"; then
    fail "a node that crashed after the command ended did not fail the run"
fi
grep -q "signal 11 (exit status 139)" "$out" || { cat "$out" >&2; fail "no crash reported"; }
say "ok: a node that crashes after the command ended fails the run"
