%% The pure-Erlang transport (proxies over plain distribution): the same
%% guarantees and results as the NIF transport, used when configured so
%% and when the NIF cannot load.
-module(ecall_transports_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([erlang_transport_data_path/1, nif_missing_falls_back_to_erlang/1,
         proxy_exit_closes_connection/1]).

-import(ecall_test_nodes, [start_node/1, many_callers_exactly_once/1, connect_back/1]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [erlang_transport_data_path, nif_missing_falls_back_to_erlang, proxy_exit_closes_connection].

init_per_suite(Config) ->
    ok = ecall_test_nodes:start_ecall(),
    ok = application:set_env(ecall, transport, erlang),
    try
        {Node, _} = NodeRef = start_node(os:find_executable("erl")),
        ok = ecall:connect(Node),
        [{b, Node}, {b_node, NodeRef} | Config]
    after
        application:unset_env(ecall, transport)
    end.

end_per_suite(Config) ->
    ecall_test_nodes:stop_b(Config).

%% The same guarantees through proxies over plain distribution: exactly
%% once, per-caller order, batches, and cast and call with the same
%% results.
erlang_transport_data_path(Config) ->
    B = ?config(b, Config),
    {ok, #{transport := erlang, requests := R0, batches := Bt0}} = ecall:stats(B),
    Total = many_callers_exactly_once(B),
    {ok, #{requests := R1, batches := Bt1}} = ecall:stats(B),
    ?assertEqual(Total, R1 - R0),
    ?assert((R1 - R0) / (Bt1 - Bt0) > 1.0),
    connect_back(B),
    ?assertEqual(ok, ecall:cast(B, ecall_test_nodes, tell, [self(), {cast, erl}])),
    receive {cast, erl} -> ok after 5000 -> ct:fail(cast_lost) end,
    ?assertEqual({ok, 42}, ecall:call(B, ecall_test_nodes, echo, [42])),
    ?assertMatch({error, {exception, error, boom, [{ecall_test_nodes, fail, 2, _} | _]}},
                 ecall:call(B, ecall_test_nodes, fail, [error, boom])),
    ?assertEqual({error, {badrpc, timeout}}, ecall:call(B, ecall_test_nodes, block, [self()], 100)),
    receive {blocked, P, B} -> P ! go after 5000 -> ct:fail(not_blocked) end.

%% A node whose NIF cannot load (its code without priv/) says so, and
%% connects with the pure-Erlang transport instead.
nif_missing_falls_back_to_erlang(Config) ->
    Dir = filename:join(?config(priv_dir, Config), "ecall_without_nif"),
    Ebin = filename:join(Dir, "ebin"),
    ok = filelib:ensure_path(Ebin),
    Src = filename:dirname(code:which(ecall)),
    [{ok, _} = file:copy(F, filename:join(Ebin, filename:basename(F)))
     || F <- filelib:wildcard(filename:join(Src, "*"))],
    Args = ["-setcookie", atom_to_list(erlang:get_cookie()),
            "-pa", Ebin, "-pa", filename:dirname(code:which(?MODULE))],
    {ok, Peer, D} = peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                                      name => peer:random_name(?MODULE), args => Args,
                                      wait_boot => 60000}),
    {ok, _} = erpc:call(D, application, ensure_all_started, [ecall]),
    ?assertNotEqual(none, erpc:call(D, ecall_nif, load_error, [])),
    ?assertEqual(erlang, erpc:call(D, ecall_conn, transport, [])),
    ok = erpc:call(D, ecall, connect, [node()]),
    {ok, #{transport := erlang}} = erpc:call(D, ecall, stats, [node()]),
    Self = self(),
    hi = erpc:call(D, ecall, send, [Self, hi]),
    receive hi -> ok after 5000 -> ct:fail(lost) end,
    ?assertEqual({ok, node()}, erpc:call(D, ecall, call, [node(), ecall_test_nodes, whoami, []])),
    peer:stop(Peer).

%% A proxy that dies takes its connection down (before, the connection
%% swallowed the exit and its callers kept sending to the dead proxy, all
%% lost): the peer is unpublished, and sends go by `!' until a reconnect.
proxy_exit_closes_connection(Config) ->
    B = ?config(b, Config),
    Why = ecall_test_nodes:kill_transport_process(
            B, fun(Call) -> element(1, Call) =:= ecall_proxy end),
    ?assertEqual({shutdown, {transport_down, killed}}, Why),
    ?assertEqual({error, not_connected}, ecall:stats(B)),
    Self = self(),
    Echo = erpc:call(B, erlang, spawn, [fun() -> receive M -> Self ! {echo, M} end end]),
    ecall:send(Echo, after_the_proxy),
    receive {echo, after_the_proxy} -> ok after 5000 -> ct:fail(lost_after_close) end,
    ok = application:set_env(ecall, transport, erlang),
    try ?assertEqual(ok, ecall:connect(B))
    after application:unset_env(ecall, transport)
    end.
