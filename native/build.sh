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

# cargo names the library libecall_nif.dylib on macOS, .so elsewhere;
# erlang:load_nif/2 looks for .so on both.
case "$(uname -s)" in
    Darwin | Linux | *BSD | DragonFly | SunOS) ;;
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

# Nothing to do, and nothing said, when the installed library is newer than
# every file cargo would build it from: mix compiles a path dependency on
# every run, and a build with nothing changed should be quiet and quick.
# (Any change, a git checkout included, makes a source newer: then cargo
# decides, and the library is touched after it, see below. Deleting
# priv/libecall_nif.so forces a build, after a toolchain change say.)
fresh_sources=$(find Cargo.toml Cargo.lock native -newer "$lib" \
                    \( -name '*.rs' -o -name '*.toml' -o -name Cargo.lock \) -print -quit \
                    2>/dev/null || echo stale)
if [ -f "$lib" ] && [ -z "$fresh_sources" ]; then
    exit 0
fi

# cargo's messages go to stderr; its JSON lines (stdout) name the library
# it built, wherever its target dir is (CARGO_TARGET_DIR, a build.target-dir
# of a .cargo/config.toml, or target/ beside Cargo.toml).
build() {
    if ! json=$(cargo build --release -p ecall_nif --message-format=json-render-diagnostics); then
        say "cargo failed to build the NIF (see above)."
        hint
        exit 1
    fi
    artifact=$(printf '%s\n' "$json" | grep '"reason":"compiler-artifact"' | grep '"kind":\["cdylib"\]' || true)
}
build
built=$(printf '%s\n' "$artifact" | sed -n 's/.*"filenames":\["\([^"]*\)".*/\1/p')
[ -n "$built" ] && [ -f "$built" ] || { say "cargo reported no NIF library"; exit 1; }

# Two checkouts of ecall sharing one target dir (CARGO_TARGET_DIR) share one
# library file there (a cdylib's name carries no hash), and cargo does not
# link again a build it finds fresh when the other checkout wrote that file
# last. A stamp beside it names the checkout that linked it last.
here=$(pwd -P)
stamp=$(dirname "$built")/.ecall_nif.checkout
if [ ! -f "$stamp" ] || printf '%s\n' "$artifact" | grep -q '"fresh":false'; then
    echo "$here" >"$stamp"
elif [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$here" ]; then
    say "the NIF in $(dirname "$built") was linked for $(cat "$stamp"): linking it again for $here"
    rm -f "$built" "$(dirname "$built")/deps/${built##*/}"
    build
    echo "$here" >"$stamp"
fi
[ -f "$built" ] || { say "cargo built nothing at $built"; exit 1; }

# Stripped, and renamed into place (never copied over the old file, which
# a running node may have loaded). Touched, so that the next build finds it
# newer than the sources it was just checked against.
native/install_nif.sh "$built" priv
touch "$lib"
