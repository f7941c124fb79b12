%% The pure-Erlang transport (proxies over plain distribution): the same
%% guarantees and results as the NIF transport, used when configured so
%% and when the NIF cannot load.
-module(ecall_transports_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([erlang_transport_data_path/1, nif_missing_falls_back_to_erlang/1,
         proxy_exit_closes_connection/1, transport_change_proxies_stand_for_calls_in_flight/1,
         transport_change_ends_the_calls_of_a_proxy_that_cannot_retire/1,
         erlang_transport_timed_out_call_leaves_no_late_reply/1,
         erlang_transport_call_returns_when_the_peer_goes_down/1]).

-import(ecall_test_nodes, [start_node/1, many_callers_exactly_once/1, connect_back/1]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [erlang_transport_data_path, nif_missing_falls_back_to_erlang, proxy_exit_closes_connection,
     transport_change_proxies_stand_for_calls_in_flight,
     transport_change_ends_the_calls_of_a_proxy_that_cannot_retire,
     erlang_transport_timed_out_call_leaves_no_late_reply,
     erlang_transport_call_returns_when_the_peer_goes_down].

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

%% A connection on the pure-Erlang transport that closes for a move to the
%% links (`transport_change', as when the C-node identities register late)
%% drops nothing: its proxies linger, still standing for the calls in
%% flight. A call waiting on one when the move starts returns its answer
%% after the close, and a request handed to a retired proxy by a caller
%% that read the old transport is still sent.
transport_change_proxies_stand_for_calls_in_flight(_Config) ->
    {Peer, C, Pool} = erlang_transport_peer(),
    {Caller, Proxy} = blocked_call(C, Pool),
    Blocked = receive {blocked, P, C} -> P after 5000 -> ct:fail(not_blocked) end,
    ok = ecall_conn:stop(whereis(ecall_conn:name(C)), transport_change),
    ?assertEqual({error, not_connected}, ecall:stats(C)),
    ?assert(is_process_alive(Proxy)),
    receive {result, Caller, Early} -> ct:fail({returned_at_the_move, Early}) after 0 -> ok end,
    %% A late request: the retired proxy sends it on.
    Self = self(),
    Echo = erpc:call(C, erlang, spawn, [ecall_test_nodes, echo_loop, []]),
    Ref = make_ref(),
    ok = ecall_proxy:push(Pool, ecall_request:send(Echo, {echo, Self, Ref}), false),
    receive Ref -> ok after 5000 -> ct:fail(late_request_lost) end,
    Blocked ! go,
    receive
        {result, Caller, Result} -> ?assertEqual({ok, late}, Result)
    after 5000 -> ct:fail(call_not_answered)
    end,
    peer:stop(Peer).

%% A proxy that does not retire within the close's 3 s (here it is stuck
%% in a send to a peer whose OS process is stopped, on a busy distribution
%% connection) is ended with `transport_change', and the call it stood
%% for returns {error, {badrpc, transport_change}} at once: no call
%% waits on a transport that is gone.
transport_change_ends_the_calls_of_a_proxy_that_cannot_retire(_Config) ->
    {Peer, C, Pool} = erlang_transport_peer(),
    OsPid = erpc:call(C, os, getpid, []),
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    {Caller, Proxy} = blocked_call(C, Pool),
    receive {blocked, _, C} -> ok after 5000 -> ct:fail(not_blocked) end,
    Conn = whereis(ecall_conn:name(C)),
    ConnRef = monitor(process, Conn),
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        %% 40 MB through the caller's proxy: far more than the socket
        %% buffers and the distribution queue hold, so the proxy is
        %% suspended in its send. Nothing signals that: polled.
        stuff_proxy(Pool, Proxy, Sink, binary:copy(<<"t">>, 1000000), 40),
        suspended = poll_status(Proxy, suspended, 10000),
        T0 = erlang:monotonic_time(millisecond),
        _ = spawn(fun() -> ecall_conn:stop(Conn, transport_change) end),
        receive
            {result, Caller, Result} ->
                ct:pal("the call returned ~b ms after the close began",
                       [erlang:monotonic_time(millisecond) - T0]),
                ?assertEqual({error, {badrpc, transport_change}}, Result)
        after 10000 -> ct:fail(call_still_waiting)
        end,
        ?assertNot(is_process_alive(Proxy))
    after
        os:cmd("kill -CONT " ++ OsPid)
    end,
    receive {'DOWN', ConnRef, process, Conn, _} -> ok after 15000 -> ct:fail(connection_left) end,
    peer:stop(Peer).

%% A call through the proxies (answered by alias) that times out leaves
%% nothing in the caller's mailbox, also once the callee has answered:
%% the timeout removes the monitor that carries the alias, and the runtime
%% drops the reply. The callee's process is monitored before it is let
%% go: its reply (by `!': C has no ecall connection back) and its 'DOWN'
%% both come from it to this process, in that order, so once the 'DOWN'
%% is here a reply let through would be here too.
erlang_transport_timed_out_call_leaves_no_late_reply(_Config) ->
    {Peer, C, _Pool} = erlang_transport_peer(),
    ?assertEqual({error, {badrpc, timeout}}, ecall:call(C, ecall_test_nodes, block, [self()], 100)),
    Blocked = receive {blocked, P, C} -> P after 30000 -> ct:fail(not_blocked) end,
    Ref = monitor(process, Blocked),
    Blocked ! go,
    receive {'DOWN', Ref, process, Blocked, normal} -> ok
    after 30000 -> ct:fail(callee_still_running)
    end,
    receive Late -> ct:fail({late_reply, Late}) after 0 -> ok end,
    peer:stop(Peer).

%% A call waiting on its proxy returns when the peer goes down (its OS
%% process killed): the connection closes on the nodedown, its proxies
%% exit with that reason, and the caller's monitor of its proxy ends the
%% wait with {error, {badrpc, nodedown}}, the term ecall:call/5 documents,
%% even with timeout `infinity'.
erlang_transport_call_returns_when_the_peer_goes_down(_Config) ->
    {_Peer, C, Pool} = erlang_transport_peer(),
    OsPid = erpc:call(C, os, getpid, []),
    {Caller, _Proxy} = blocked_call(C, Pool),
    receive {blocked, _, C} -> ok after 30000 -> ct:fail(not_blocked) end,
    _ = os:cmd("kill -9 " ++ OsPid),
    receive
        {result, Caller, Result} -> ?assertEqual({error, {badrpc, nodedown}}, Result)
    after 30000 -> ct:fail(call_still_waiting)
    end.

%% A peer without discovery, connected over the pure-Erlang transport;
%% the transport's pool.
erlang_transport_peer() ->
    {Peer, C} = ecall_test_nodes:start_peer(["-ecall", "discovery", "false"]),
    ok = application:set_env(ecall, transport, erlang),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, transport)
    end,
    {ecall_proxy, Pool, _} = ecall_route:peer(C),
    {Peer, C, Pool}.

%% A caller whose call to block/1 on C waits on its proxy; the caller and
%% that proxy (pick/1, as the caller's call picks it).
blocked_call(C, Pool) ->
    Self = self(),
    Caller = spawn_link(fun() ->
                                Proxy = ecall_proxy:pick(Pool),
                                Self ! {proxy, self(), Proxy},
                                Self ! {result, self(), ecall:call(C, ecall_test_nodes, block, [Self])}
                        end),
    receive {proxy, Caller, Proxy} -> {Caller, Proxy} end.

%% N sends of Msg to To through `Proxy' (from a process that picks it).
stuff_proxy(Pool, Proxy, To, Msg, N) ->
    Self = self(),
    {Pid, Mref} = spawn_monitor(fun() ->
                                        case ecall_proxy:pick(Pool) of
                                            Proxy ->
                                                [ok = ecall_proxy:push(Pool, ecall_request:send(To, Msg), false)
                                                 || _ <- lists:seq(1, N)],
                                                Self ! {stuffed, self()};
                                            _Other ->
                                                ok
                                        end
                                end),
    receive
        {stuffed, Pid} -> demonitor(Mref, [flush]), ok;
        {'DOWN', Mref, process, Pid, normal} -> stuff_proxy(Pool, Proxy, To, Msg, N)
    end.

%% Polls the status of `Pid' every 10 ms until it is `Want', for at most
%% `Ms' ms; the last status.
poll_status(Pid, _Want, Ms) when Ms =< 0 ->
    element(2, process_info(Pid, status));
poll_status(Pid, Want, Ms) ->
    case process_info(Pid, status) of
        {status, Want} -> Want;
        _ -> receive after 10 -> poll_status(Pid, Want, Ms - 10) end
    end.
