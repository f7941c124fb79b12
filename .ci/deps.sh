#!/usr/bin/env bash
# Installs what ecall needs to build and test, when it is missing: Erlang/OTP
# and rebar3 from Debian packages; with --examples also Elixir (the mix
# example). Rust (cargo, 1.80 or newer) is expected on the machine: its
# absence is reported with the line that installs it.
set -euo pipefail

examples=false
[ "${1:-}" = --examples ] && examples=true

# Checked first and always: without cargo nothing below can build the NIF.
if ! command -v cargo >/dev/null; then
    echo "ecall needs a Rust toolchain, 1.80 or newer (cargo on PATH); install it with" >&2
    echo "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
    echo "(a project that only uses ecall can build without it: ECALL_NO_NIF=1, see the README)" >&2
    exit 1
fi
rust=$(rustc --version 2>/dev/null | awk '{print $2}')
case "$rust" in
    1.[0-9].* | 1.[0-7][0-9].*)
        echo "ecall needs Rust 1.80 or newer, this is $rust: rustup update stable" >&2
        exit 1
        ;;
esac

pkgs=(erlang-nox erlang-dev rebar3 erlang-common-test erlang-dialyzer erlang-proper patchelf python3 iproute2 util-linux openssl binutils)
need=()
command -v erl >/dev/null || need+=(erlang-nox erlang-dev)
command -v rebar3 >/dev/null || need+=(rebar3)
command -v ct_run >/dev/null || need+=(erlang-common-test)
command -v dialyzer >/dev/null || need+=(erlang-dialyzer)
# The chaos suite's state machine (PropEr).
[ -d "$(erl -noshell -eval 'io:format("~s", [code:lib_dir(proper)]), halt().' 2>/dev/null)" ] || need+=(erlang-proper)
command -v patchelf >/dev/null || need+=(patchelf)
command -v python3 >/dev/null || need+=(python3)
# The partition suite makes network namespaces (ip) and the EMFILE test
# lowers a descriptor limit (prlimit).
command -v ip >/dev/null || need+=(iproute2)
command -v prlimit >/dev/null || need+=(util-linux)
# The TLS-distribution case makes its certificates with openssl;
# test/scripts/nif_reinstall.sh makes a second library with objcopy.
command -v openssl >/dev/null || need+=(openssl)
command -v objcopy >/dev/null || need+=(binutils)
if $examples; then
    pkgs+=(elixir)
    command -v mix >/dev/null || need+=(elixir)
fi
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "ecall needs: ${pkgs[*]}" >&2
    echo "install them with: sudo apt-get install -y ${pkgs[*]}" >&2
    exit 1
fi
echo "installing ${need[*]} from Debian packages" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
