#!/usr/bin/env bash
# Building ecall on a machine without cargo, as a user would:
#  1. `rebar3 compile` stops with what is needed (Rust 1.80 or newer, the
#     rustup line) and the switch, not with a bare "cargo: not found";
#  2. `ECALL_NO_NIF=1 rebar3 compile` succeeds, without a library in priv/;
#  3. two nodes of that build exchange ecall:send/2, cast/4 and call/4 over
#     the pure-Erlang transport.
# Runs on a copy of the sources in a temp dir, against a private epmd.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${ERL_EPMD_PORT:-}" ] || exec test/scripts/with_epmd.sh "$0" "$@"

tmp=$(mktemp -d)
node_b_pid=
cleanup() {
    if [ -n "$node_b_pid" ]; then
        kill "$node_b_pid" 2>/dev/null || true
        wait "$node_b_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "no_nif_build: FAIL: $*" >&2; exit 1; }

src=$tmp/ecall
mkdir -p "$src/native"
cp -r erlang_src rebar.config rebar.lock Cargo.toml "$src/"
cp native/build.sh "$src/native/"

# PATH without cargo: a directory that holds cargo is replaced by a copy of
# it (symbolic links) without the Rust tools.
nocargo=
n=0
IFS=: read -ra dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    [ -n "$d" ] || continue
    if [ -e "$d/cargo" ]; then
        n=$((n + 1))
        shim=$tmp/path$n
        mkdir -p "$shim"
        for f in "$d"/*; do
            case "${f##*/}" in cargo | cargo-* | rustc | rustup | rustdoc) continue ;; esac
            [ -x "$f" ] && ln -s "$f" "$shim/${f##*/}"
        done
        d=$shim
    fi
    nocargo=$nocargo${nocargo:+:}$d
done
! PATH=$nocargo command -v cargo >/dev/null || fail "cargo still on the stripped PATH"
PATH=$nocargo command -v rebar3 >/dev/null || fail "rebar3 lost with cargo"

echo "no_nif_build: rebar3 compile without cargo" >&2
if (cd "$src" && PATH=$nocargo rebar3 compile) >"$tmp/out" 2>&1; then
    cat "$tmp/out" >&2
    fail "the build without cargo and without ECALL_NO_NIF succeeded"
fi
for want in "Rust toolchain, 1.80 or newer" "https://sh.rustup.rs" "ECALL_NO_NIF=1 rebar3 compile"; do
    grep -qF "$want" "$tmp/out" || { cat "$tmp/out" >&2; fail "the message lacks '$want'"; }
done

echo "no_nif_build: ECALL_NO_NIF=1 rebar3 compile without cargo" >&2
(cd "$src" && PATH=$nocargo ECALL_NO_NIF=1 rebar3 compile) >"$tmp/out" 2>&1 ||
    { cat "$tmp/out" >&2; fail "ECALL_NO_NIF=1 rebar3 compile failed"; }
ebin=$src/_build/default/lib/ecall/ebin
[ -f "$ebin/ecall.beam" ] || fail "no ecall.beam in $ebin"
[ ! -e "$src/priv/libecall_nif.so" ] || fail "a NIF library in priv/ after ECALL_NO_NIF=1"

echo "no_nif_build: two nodes on the pure-Erlang transport" >&2
host=$(hostname -s)
a=no_nif_a_$$
b=no_nif_b_$$
cookie=no_nif_$$
PATH=$nocargo erl -sname "$b" -setcookie "$cookie" -noshell -pa "$ebin" -eval '
    {ok, _} = application:ensure_all_started(ecall),
    register(echo, spawn(fun Loop() ->
                             receive {From, M} -> From ! {echo, node(), M}, Loop() end
                         end))' >"$tmp/b.out" 2>&1 &
node_b_pid=$!

PATH=$nocargo erl -sname "$a" -setcookie "$cookie" -noshell -pa "$ebin" -eval '
    B = list_to_atom("'"$b@$host"'"),
    Wait = fun W(0) -> exit(b_not_up);
               W(N) -> case net_adm:ping(B) =:= pong andalso
                            erpc:call(B, erlang, whereis, [echo]) =/= undefined of
                           true -> ok;
                           false -> timer:sleep(100), W(N - 1)
                       end
           end,
    Main = fun() ->
        ok = Wait(100),
        {ok, _} = application:ensure_all_started(ecall),
        true = ecall_nif:load_error() =/= none,
        ok = ecall:connect(B),
        Self = self(),
        {Self, hello} = ecall:send({echo, B}, {Self, hello}),
        receive {echo, B, hello} -> ok after 5000 -> exit(no_echo) end,
        ok = ecall:cast(B, erlang, send, [Self, cast_ran]),
        receive cast_ran -> ok after 5000 -> exit(no_cast) end,
        {ok, B} = ecall:call(B, erlang, node, []),
        {ok, 3} = ecall:call(B, erlang, length, [[a, b, c]]),
        {ok, #{transport := erlang, requests := R}} = ecall:stats(B),
        true = R >= 4,
        io:format("no_nif_build: send, cast and call went through the pure-Erlang transport (~p requests)~n", [R])
    end,
    Status = try Main(), 0
             catch C:E:S -> io:format("no_nif_build: ~p:~p~n~p~n", [C, E, S]), 1
             end,
    catch erpc:call(B, init, stop, [], 5000),
    halt(Status)' || { cat "$tmp/b.out" >&2; fail "the two nodes did not exchange send, cast and call"; }
# Node b stops on a's init:stop; the trap kills it if it did not.
for _ in $(seq 1 100); do
    kill -0 "$node_b_pid" 2>/dev/null || break
    sleep 0.1
done
echo "no_nif_build: ok" >&2
