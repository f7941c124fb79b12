-module(pp).
-export([main/0]).
main() ->
    {ok, _} = application:ensure_all_started(ecall),
    {_Peer, B} = ecall_test_nodes:start_peer(["+sbwt","none"], []),
    _ = ecall:disconnect(B),
    ok = ecall:connect(B),
    Sink = erpc:call(B, erlang, spawn, [fun Loop() -> receive _ -> Loop() end end]),
    Payload = maps:from_list([{G, maps:from_list([{list_to_atom([$f, $0 + J]), v} || J <- lists:seq(0, 9)])} || G <- [a, b, c]]),
    io:format("~p~n", [ecall:stats(B)]),
    file:write_file("/tmp/pp/pid", os:getpid()),
    loop(Sink, Payload, 200000),
    timer:sleep(500),
    T0 = erlang:monotonic_time(),
    loop(Sink, Payload, 5000000),
    T1 = erlang:monotonic_time(),
    io:format("ns/push ~p~n", [erlang:convert_time_unit(T1-T0, native, nanosecond)/5000000]),
    Atoms = [send, a, b, c, v | [list_to_atom([$f, $0 + J]) || J <- lists:seq(0, 9)]],
    [io:format("~p,~p ~p~n", [A, B2, P]) || A <- Atoms, B2 <- Atoms, A < B2, (P = per(fun() -> ecall_nif:encoded_size({A,B2}) end, 50000)) > 200],
    halt().
per(F, N) -> T0 = erlang:monotonic_time(nanosecond), lp(F, N), (erlang:monotonic_time(nanosecond) - T0) / N.
lp(_, 0) -> ok; lp(F, N) -> F(), lp(F, N-1).
loop(_, _, 0) -> ok;
loop(S, P, N) -> ecall:send(S, P), loop(S, P, N-1).
