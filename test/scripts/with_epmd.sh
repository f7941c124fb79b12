#!/usr/bin/env bash
# Runs a command against a private epmd on a free loopback port.
#
# Every Erlang node and every C-node started under it finds this epmd through
# ERL_EPMD_PORT, so tests never touch (or depend on) a system epmd, and the
# epmd is stopped, by its pid, when the command ends, whatever its outcome.
#
# Nodes started through test/scripts/node.sh (the tests' and the
# benchmark's) write down a crash signal in $ECALL_NODE_CRASHES: when the
# command ends, this waits for every such node to end too (at most a
# minute: a node left running fails the run), and a node that died of a
# crash, even after its test passed or while it halted, fails the run. An outer with_epmd.sh
# (ECALL_NODE_CRASHES set already) does that for the inner one.
set -euo pipefail

# The port is free when python looks, but anything else on the machine can
# take it before epmd binds it (it comes from the ephemeral range): epmd then
# exits at once, and another port is tried.
epmd_pid=
trap '[ -z "$epmd_pid" ] || { kill "$epmd_pid" 2>/dev/null || true; wait "$epmd_pid" 2>/dev/null || true; }' EXIT
for attempt in 1 2 3 4 5; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    epmd -port "$port" -address 127.0.0.1 &
    epmd_pid=$!
    # epmd is ready when it answers a names request (a few ms).
    ready=false
    for _ in $(seq 1 100); do
        kill -0 "$epmd_pid" 2>/dev/null || break
        if epmd -port "$port" -names >/dev/null 2>&1; then
            ready=true
            break
        fi
        sleep 0.05
    done
    $ready && break
    echo "with_epmd.sh: epmd on port $port did not start (attempt $attempt of 5)" >&2
    kill "$epmd_pid" 2>/dev/null || true
    wait "$epmd_pid" 2>/dev/null || true
    epmd_pid=
done
[ -n "$epmd_pid" ] || { echo "with_epmd.sh: no epmd" >&2; exit 1; }
export ERL_EPMD_PORT=$port

crashes=
if [ -z "${ECALL_NODE_CRASHES:-}" ]; then
    crashes=$(mktemp)
    export ECALL_NODE_CRASHES=$crashes
fi
status=0
"$@" || status=$?
if [ -n "$crashes" ]; then
    # Each node.sh holds a shared lock while its node runs.
    exec 8>>"$crashes.lock"
    if ! flock -x -w 60 8; then
        echo "with_epmd.sh: nodes of this run were still running a minute after it ended" >&2
        status=1
    fi
    if [ -s "$crashes" ]; then
        echo "with_epmd.sh: nodes of this run died of a crash signal:" >&2
        sed 's/^/  /' "$crashes" >&2
        status=1
    fi
    exec 8>&-
    rm -f "$crashes" "$crashes.lock"
fi
exit "$status"
