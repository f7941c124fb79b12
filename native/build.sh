#!/bin/sh
# Builds ecall's NIF (crate native/ecall_nif) and installs it, stripped of
# debug info, as priv/libecall_nif.so, where ecall_nif.erl loads it from.
#
# rebar3 runs it before compiling ecall (pre_hook in rebar.config), whether
# ecall is the project itself or a dependency (rebar3 git or _checkouts
# dependency, mix with `manager: :rebar3`).
#
#   ECALL_NO_NIF=1     build without the NIF: no cargo needed, ecall then
#                      carries its traffic over its pure-Erlang transport
#   CARGO_TARGET_DIR   cargo's target dir (cargo's own variable); default:
#                      target/ beside ecall's Cargo.toml
#
# Supported: Linux (tested) and macOS (cargo builds a .dylib, installed
# under the .so name that erlang:load_nif/2 looks for). Needs Rust 1.80 or
# newer.
set -eu
cd "$(dirname "$0")/.."

lib=priv/libecall_nif.so
say() { echo "ecall: $*" >&2; }
hint() {
    cat >&2 <<'EOF'
ecall: the NIF needs a Rust toolchain, 1.80 or newer (cargo on PATH). Install it with
ecall:     curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh
ecall: or build without the NIF (ecall then uses its pure-Erlang transport) with
ecall:     ECALL_NO_NIF=1 rebar3 compile     (or ECALL_NO_NIF=1 mix compile)
EOF
}

case "${ECALL_NO_NIF:-}" in
    1 | true | yes)
        # What the switch says, also when an earlier build left a library.
        rm -f "$lib"
        say "ECALL_NO_NIF is set: built without the NIF; connections use the pure-Erlang transport"
        exit 0
        ;;
esac

case "$(uname -s)" in
    Darwin) ext=dylib ;;
    Linux | *BSD | DragonFly | SunOS) ext=so ;;
    *)
        say "$(uname -s) is not supported by the NIF build; set ECALL_NO_NIF=1 to build without it"
        exit 1
        ;;
esac

if ! command -v cargo >/dev/null 2>&1; then
    say "cargo was not found on PATH."
    hint
    exit 1
fi

if ! cargo build --release -p ecall_nif; then
    say "cargo failed to build the NIF (see above)."
    hint
    exit 1
fi

# cargo's target dir: CARGO_TARGET_DIR, a build.target-dir of a
# .cargo/config.toml, or target/ beside Cargo.toml; cargo knows which.
target=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$target" ] || target=${CARGO_TARGET_DIR:-$PWD/target}
built=$target/release/libecall_nif.$ext
[ -f "$built" ] || { say "cargo built nothing at $built"; exit 1; }

# A new file renamed into place: a running node that loaded the old library
# keeps its mapping (copying over it in place would crash that node).
mkdir -p priv
tmp=priv/.libecall_nif.so.$$
trap 'rm -f "$tmp"' EXIT
if ! { command -v strip >/dev/null 2>&1 && strip -S -o "$tmp" "$built" 2>/dev/null; }; then
    cp "$built" "$tmp"
fi
if cmp -s "$tmp" "$lib"; then
    rm -f "$tmp"
else
    mv -f "$tmp" "$lib"
fi
