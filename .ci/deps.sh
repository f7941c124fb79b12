#!/usr/bin/env bash
# Installs what ecall needs to build and test, when it is missing: Erlang/OTP
# and rebar3 from Debian packages. Rust (cargo) is expected on the machine.
set -euo pipefail

pkgs=(erlang-nox erlang-dev rebar3 erlang-common-test erlang-dialyzer patchelf python3 iproute2 util-linux)
need=()
command -v erl >/dev/null || need+=(erlang-nox erlang-dev)
command -v rebar3 >/dev/null || need+=(rebar3)
command -v ct_run >/dev/null || need+=(erlang-common-test)
command -v dialyzer >/dev/null || need+=(erlang-dialyzer)
command -v patchelf >/dev/null || need+=(patchelf)
command -v python3 >/dev/null || need+=(python3)
# The partition suite makes network namespaces (ip) and the EMFILE test
# lowers a descriptor limit (prlimit).
command -v ip >/dev/null || need+=(iproute2)
command -v prlimit >/dev/null || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "ecall needs: ${pkgs[*]}" >&2
    echo "install them with: sudo apt-get install -y ${pkgs[*]}" >&2
    exit 1
fi
echo "installing ${need[*]} from Debian packages" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
command -v cargo >/dev/null || { echo "ecall needs a Rust toolchain (cargo) on PATH" >&2; exit 1; }
