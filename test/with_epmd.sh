#!/usr/bin/env bash
# Runs a command against a private epmd on a free loopback port.
#
# Every Erlang node and every C-node started under it finds this epmd through
# ERL_EPMD_PORT, so tests never touch (or depend on) a system epmd, and the
# epmd is stopped, by its pid, when the command ends, whatever its outcome.
set -euo pipefail

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
epmd -port "$port" -address 127.0.0.1 &
epmd_pid=$!
trap 'kill "$epmd_pid" 2>/dev/null || true; wait "$epmd_pid" 2>/dev/null || true' EXIT
export ERL_EPMD_PORT=$port

# epmd is ready when it answers a names request (a few ms).
for _ in $(seq 1 100); do
    epmd -port "$port" -names >/dev/null 2>&1 && break
    sleep 0.05
done

"$@"
