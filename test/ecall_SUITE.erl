%% Two (and more) real nodes on loopback: this node, started by rebar3 ct
%% with -sname, and peers started with OTP's `peer'. Every node talks to a
%% private epmd (ERL_EPMD_PORT, set by test/with_epmd.sh).
%%
%% The group `otp27' runs the data-path cases again with the peer on OTP 27
%% (the `erl' named by ECALL_OTP27_ERL, which test/otp27.sh prepares).
-module(ecall_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, groups/0, suite/0,
         init_per_suite/1, end_per_suite/1,
         init_per_group/2, end_per_group/2]).
-export([large_messages_in_order/1, exactly_once_in_order/1, links_are_hidden_cnodes/1, ping_cnode/1,
         fallback_without_link/1, wrong_cookie_refused_incoming/1,
         wrong_cookie_refused_outgoing/1, malformed_element_skipped/1,
         link_loss_is_reported_and_healed/1, nodedown_closes_connection/1,
         not_distributed/1, bad_arguments/1, names_and_aliases/1,
         budget_bounds_queue_and_close_releases/1, full_budget_blocks_without_loss/1]).
-export([cast_through_link/1, call_results_match_fallback/1, call_timeout_no_late_reply/1,
         link_loss_fails_its_callers_only/1, peer_killed_with_1000_calls/1,
         unreachable_node/1, multi_node_patterns/1, rpc_bad_arguments/1]).
-export([erlang_transport_data_path/1, nif_missing_falls_back_to_erlang/1]).
-export([stalled_peer_is_reaped/1, slow_peer_is_not_reaped/1, overload_stays_within_budget/1]).
%% logger handler used by the cases.
-export([log/2]).
%% Run on peers.
-export([collector/2, not_distributed_check/0,
         echo/1, fail/2, tell/2, whoami/0, block/1, error_on/1]).

-define(CALLERS, 1000).
-define(PER_CALLER, 100).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [{group, otp25}, {group, otp27}, {group, edges}, {group, rpc}, {group, watchdog},
     {group, erlang_transport}].

groups() ->
    DataPath = [exactly_once_in_order, large_messages_in_order, links_are_hidden_cnodes, ping_cnode,
                fallback_without_link, names_and_aliases, malformed_element_skipped,
                link_loss_is_reported_and_healed],
    [{otp25, [], DataPath},
     {otp27, [], DataPath},
     {edges, [], [wrong_cookie_refused_incoming, wrong_cookie_refused_outgoing,
                          nodedown_closes_connection, not_distributed, bad_arguments,
                          budget_bounds_queue_and_close_releases,
                          full_budget_blocks_without_loss]},
     {rpc, [], [cast_through_link, call_results_match_fallback, call_timeout_no_late_reply,
                link_loss_fails_its_callers_only, peer_killed_with_1000_calls,
                unreachable_node, multi_node_patterns, rpc_bad_arguments]},
     {erlang_transport, [], [erlang_transport_data_path, nif_missing_falls_back_to_erlang]},
     {watchdog, [], [stalled_peer_is_reaped, slow_peer_is_not_reaped,
                     overload_stays_within_budget]}].

init_per_suite(Config) ->
    ?assert(is_alive()),
    {ok, _} = application:ensure_all_started(ecall),
    ?assertMatch({ok, _}, ecall_cnode:cnode()),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall).

init_per_group(otp27, Config) ->
    Erl = os:getenv("ECALL_OTP27_ERL", ""),
    %% A missing OTP 27 is a failure, not a skip: the README's test command
    %% prepares it.
    ?assert(filelib:is_regular(Erl)),
    start_b(Config, Erl);
init_per_group(erlang_transport, Config) ->
    ok = application:set_env(ecall, transport, erlang),
    try start_b(Config, os:find_executable("erl"))
    after application:unset_env(ecall, transport)
    end;
init_per_group(_Group, Config) ->
    start_b(Config, os:find_executable("erl")).

end_per_group(_Group, Config) ->
    _ = ecall:disconnect(?config(b, Config)),
    stop_node(?config(b_node, Config)).

start_b(Config, Erl) ->
    {Node, _} = NodeRef = start_node(Erl),
    ok = ecall:connect(Node),
    [{b, Node}, {b_node, NodeRef} | Config].

%% A node running ecall, started from the `erl' given, that outlives the
%% process that starts it (the group's cases run in other processes). OTP's
%% `peer' is not used here because an OTP 27 peer cannot be driven by OTP
%% 25's `peer' module. The node halts by itself if this node goes away.
start_node(Erl) ->
    Owner = self(),
    Ready = make_ref(),
    Keeper = spawn(fun() -> keep_node(Owner, Ready, Erl) end),
    receive
        {Ready, Node} -> {Node, Keeper};
        {Ready, failed, Why} -> ct:fail({node_start_failed, Why})
    after 60000 -> ct:fail(node_start_timeout)
    end.

keep_node(Owner, Ready, Erl) ->
    Name = peer:random_name(?MODULE),
    register(list_to_atom(Name), self()),
    Eval = lists:flatten(io_lib:format(
        "{ok, _} = application:ensure_all_started(ecall), "
        "erlang:monitor_node(~p, true), "
        "erlang:send({~p, ~p}, {up, node()}), "
        "receive {nodedown, _} -> erlang:halt() end.", [node(), list_to_atom(Name), node()])),
    Port = open_port({spawn_executable, Erl},
                     [{args, ["-sname", Name, "-setcookie", atom_to_list(erlang:get_cookie()),
                              "-noinput", "-eval", Eval | code_args()]},
                      exit_status, stderr_to_stdout, {line, 4096}]),
    keep_node(Owner, Ready, Port, undefined).

keep_node(Owner, Ready, Port, Node) ->
    receive
        {up, N} ->
            Owner ! {Ready, N},
            keep_node(Owner, Ready, Port, N);
        {Port, {data, {_, Line}}} ->
            ct:log("~p: ~ts", [Node, Line]),
            keep_node(Owner, Ready, Port, Node);
        {Port, {exit_status, S}} when Node =:= undefined ->
            Owner ! {Ready, failed, {exit_status, S}};
        {Port, {exit_status, _}} ->
            ok;
        {stop, From} ->
            erpc:cast(Node, erlang, halt, []),
            receive {Port, {exit_status, _}} -> From ! {stopped, self()} end
    end.

stop_node({_Node, Keeper}) ->
    Ref = monitor(process, Keeper),
    Keeper ! {stop, self()},
    receive {'DOWN', Ref, process, Keeper, _} -> ok end.

%% An OTP 25 peer running ecall, with this suite's code on its path, linked
%% to the calling process.
start_peer() ->
    start_peer([]).

start_peer(Extra) ->
    Args = ["-setcookie", atom_to_list(erlang:get_cookie()) | code_args() ++ Extra],
    {ok, Peer, Node} = peer:start_link(#{name => peer:random_name(?MODULE),
                                         args => Args,
                                         wait_boot => 60000}),
    {ok, _} = erpc:call(Node, application, ensure_all_started, [ecall]),
    {Peer, Node}.

code_args() ->
    ["-pa", filename:dirname(code:which(ecall)),
     "-pa", filename:dirname(code:which(?MODULE))].

%%--------------------------------------------------------------------
%% Cases

%% 100,000 messages from 1,000 callers arrive exactly once, in per-caller
%% order, through the C-node links, in batches larger than one on average.
exactly_once_in_order(Config) ->
    B = ?config(b, Config),
    {ok, S0} = ecall:stats(B),
    #{receivers := R0} = erpc:call(B, ecall, stats, []),
    Total = many_callers_exactly_once(B),
    {ok, S1} = ecall:stats(B),
    #{receivers := R1} = erpc:call(B, ecall, stats, []),
    Requests = maps:get(requests, S1) - maps:get(requests, S0),
    Batches = maps:get(batches, S1) - maps:get(batches, S0),
    ct:pal("~b requests in ~b batches (~.1f per batch), ~b socket writes",
           [Requests, Batches, Requests / max(1, Batches),
            maps:get(writes, S1) - maps:get(writes, S0)]),
    %% Everything went through the NIF and the links ...
    ?assertEqual(Total, maps:get(pushed, S1) - maps:get(pushed, S0)),
    ?assertEqual(Total, Requests),
    ?assertEqual(0, maps:get(dropped, S1)),
    %% ... and through B's receiver pool ...
    ?assertEqual(Total, maps:get(requests, R1) - maps:get(requests, R0)),
    %% ... in batches, not one message per write.
    ?assert(Requests / Batches > 1.0).

%% ?CALLERS callers, released together, each send ?PER_CALLER numbered
%% messages to one collector on B, which checks that every one arrived once
%% and in each caller's order. Returns how many were sent.
many_callers_exactly_once(B) ->
    Total = ?CALLERS * ?PER_CALLER,
    Collector = erpc:call(B, erlang, spawn, [?MODULE, collector, [self(), Total]]),
    Go = make_ref(),
    Callers = [spawn_link(fun() -> receive Go -> send_seq(Collector, ?PER_CALLER) end end)
               || _ <- lists:seq(1, ?CALLERS)],
    [C ! Go || C <- Callers],
    receive
        {collected, Collector, Result} ->
            ?assertEqual(#{total => Total, callers => ?CALLERS,
                           out_of_order => 0, last_seq_ok => ?CALLERS}, Result)
    after 120000 ->
        ct:fail({collector_timeout, erpc:call(B, erlang, process_info, [Collector, message_queue_len])})
    end,
    Total.

send_seq(To, N) ->
    Self = self(),
    %% send/2 returns the message, like `!'.
    [{seq, Self, I} = ecall:send(To, {seq, Self, I}) || I <- lists:seq(1, N)],
    ok.

%% On the peer: counts messages per caller and checks that each caller's
%% sequence numbers arrive as 1, 2, 3, ...
collector(Owner, Total) ->
    collect(Owner, Total, #{}, 0, 0).

collect(Owner, Total, Last, Total, Bad) ->
    Ok = length([S || S <- maps:values(Last), S =:= ?PER_CALLER]),
    Owner ! {collected, self(), #{total => Total, callers => map_size(Last),
                                  out_of_order => Bad, last_seq_ok => Ok}};
collect(Owner, Total, Last, N, Bad) ->
    receive
        {seq, From, Seq} ->
            Bad1 = seq_check(Last, From, Seq, Bad),
            collect(Owner, Total, Last#{From => Seq}, N + 1, Bad1);
        {seq, From, Seq, _Payload} ->
            Bad1 = seq_check(Last, From, Seq, Bad),
            collect(Owner, Total, Last#{From => Seq}, N + 1, Bad1)
    end.

seq_check(Last, From, Seq, Bad) ->
    case maps:get(From, Last, 0) of
        Prev when Seq =:= Prev + 1 -> Bad;
        _ -> Bad + 1
    end.

%% Large binaries take their own path (term_to_iovec, dirty copy, a batch of
%% their own) and keep their place among the caller's small messages.
large_messages_in_order(Config) ->
    B = ?config(b, Config),
    {ok, #{pushed := P0, batches := B0, fragmented := F0}} = ecall:stats(B),
    Self = self(),
    Sizes = [10, 2000000, 10, 65536, 65535, 10, 10000000, 10],
    Echo = erpc:call(B, erlang, spawn,
                     [fun() -> [receive {I, Bin} -> Self ! {I, byte_size(Bin), erlang:md5(Bin)} end
                                || _ <- Sizes] end]),
    Msgs = [{I, rand:bytes(Size)} || {I, Size} <- lists:zip(lists:seq(1, length(Sizes)), Sizes)],
    [Msg = ecall:send(Echo, Msg) || Msg <- Msgs],
    %% In arrival order, intact.
    Got = [receive {I, Size, Md5} -> {I, Size, Md5} after 30000 -> ct:fail(lost) end
           || _ <- Msgs],
    ?assertEqual([{I, byte_size(Bin), erlang:md5(Bin)} || {I, Bin} <- Msgs], Got),
    {ok, #{pushed := P1, batches := B1, fragmented := F1}} = ecall:stats(B),
    ?assertEqual(length(Sizes), P1 - P0),
    %% The large ones went as batches of their own, the multi-megabyte ones
    %% (at least) in fragments.
    ?assert(B1 - B0 >= 3),
    ?assert(F1 - F0 >= 2).

%% The links are hidden C-nodes named after this node, one per link.
links_are_hidden_cnodes(Config) ->
    B = ?config(b, Config),
    Ids = ecall:nodes(),
    ?assertEqual(ecall_config:links(), length(Ids)),
    [?assertMatch({match, _}, re:run(atom_to_list(Id), "_ecall_[0-9]+@")) || Id <- Ids],
    Hidden = erpc:call(B, erlang, nodes, [hidden]),
    ?assertEqual([], Ids -- Hidden),
    ?assertEqual([], Ids -- erpc:call(B, erlang, nodes, [connected])),
    ?assertEqual([], [Id || Id <- Ids, lists:member(Id, erpc:call(B, erlang, nodes, []))]),
    {ok, #{links_up := Up}} = ecall:stats(B),
    ?assertEqual(length(Ids), Up).

%% net_adm:ping/1 from the peer to a C-node answers pong.
ping_cnode(Config) ->
    B = ?config(b, Config),
    [?assertEqual(pong, erpc:call(B, net_adm, ping, [Id])) || Id <- ecall:nodes()].

%% Without an ecall connection, send is plain `!': same result, and nothing
%% goes through the NIF or the peer's receiver pool.
fallback_without_link(Config) ->
    B = ?config(b, Config),
    ok = ecall:disconnect(B),
    ?assertEqual({error, not_connected}, ecall:stats(B)),
    #{receivers := R0} = erpc:call(B, ecall, stats, []),
    Collector = erpc:call(B, erlang, spawn, [?MODULE, collector, [self(), ?PER_CALLER]]),
    send_seq(Collector, ?PER_CALLER),
    receive
        {collected, Collector, #{out_of_order := 0, total := ?PER_CALLER}} -> ok
    after 10000 -> ct:fail(fallback_lost_messages)
    end,
    #{receivers := R1} = erpc:call(B, ecall, stats, []),
    ?assertEqual(maps:get(requests, R0), maps:get(requests, R1)),
    ok = ecall:connect(B),
    ?assertMatch({ok, #{links_up := 2}}, ecall:stats(B)).

%% {Name, Node} and registered names on the peer; a name that is not
%% registered there is counted, as `!' to it would be lost.
names_and_aliases(Config) ->
    B = ?config(b, Config),
    Self = self(),
    Name = list_to_atom("ecall_test_" ++ integer_to_list(erlang:unique_integer([positive]))),
    Pid = erpc:call(B, erlang, spawn, [fun() -> register(Name, self()), Self ! registered,
                                               receive M -> Self ! {got, M} end end]),
    receive registered -> ok end,
    ?assertEqual({hi, 1}, ecall:send({Name, B}, {hi, 1})),
    receive {got, {hi, 1}} -> ok after 5000 -> ct:fail(name_not_delivered) end,
    #{receivers := #{dead_letters := D0}} = erpc:call(B, ecall, stats, []),
    Ref = monitor(process, Pid),
    receive {'DOWN', Ref, process, Pid, _} -> ok end,
    ecall:send({Name, B}, lost),
    %% A marker sent after it on the same shard proves the dead letter was
    %% processed (per-caller order).
    Marker = erpc:call(B, erlang, spawn, [fun() -> receive M -> Self ! {marker, M} end end]),
    ecall:send(Marker, done),
    receive {marker, done} -> ok after 5000 -> ct:fail(marker_lost) end,
    #{receivers := #{dead_letters := D1}} = erpc:call(B, ecall, stats, []),
    ?assertEqual(D0 + 1, D1).

%% A malformed element is counted and skipped; the worker survives and the
%% rest of its batch is delivered.
malformed_element_skipped(Config) ->
    B = ?config(b, Config),
    Worker = erpc:call(B, erlang, whereis, [ecall_rx_1]),
    #{receivers := #{malformed := M0}} = erpc:call(B, ecall, stats, []),
    {ecall_rx_1, B} ! {batch, [bogus, {send, self(), after_bogus}, {send, 42, x}]},
    receive after_bogus -> ok after 5000 -> ct:fail(rest_of_batch_lost) end,
    {ecall_rx_1, B} ! not_a_batch,
    {ecall_rx_1, B} ! {batch, [{send, self(), sync}]},
    receive sync -> ok after 5000 -> ct:fail(worker_gone) end,
    ?assertEqual(Worker, erpc:call(B, erlang, whereis, [ecall_rx_1])),
    #{receivers := #{malformed := M1}} = erpc:call(B, ecall, stats, []),
    ?assertEqual(M0 + 3, M1).

%% When the peer drops a link, the connection process hears it from Rust at
%% once (no polling), the link comes back, and what was sent meanwhile is
%% delivered in order.
link_loss_is_reported_and_healed(Config) ->
    B = ?config(b, Config),
    Conn = whereis(ecall_conn:name(B)),
    %% Rust's own log line reaches logger, at its level.
    ok = logger:add_handler(ecall_test_rust_log, ?MODULE, #{config => #{pid => self()}}),
    erlang:trace(Conn, true, ['receive']),
    [Id1 | _] = ecall:nodes(),
    T0 = erlang:monotonic_time(millisecond),
    true = erpc:call(B, erlang, disconnect_node, [Id1]),
    Down = receive {trace, Conn, 'receive', {ecall_link, 0, {down, R}}} -> R
           after 5000 -> ct:fail(no_down_event)
           end,
    T1 = erlang:monotonic_time(millisecond),
    ct:pal("link 1 down after ~b ms: ~ts", [T1 - T0, Down]),
    %% Sends while the link is down are queued in Rust, not lost.
    Collector = erpc:call(B, erlang, spawn, [?MODULE, collector, [self(), ?PER_CALLER]]),
    send_seq(Collector, ?PER_CALLER),
    receive {trace, Conn, 'receive', {ecall_link, 0, up}} -> ok
    after 10000 -> ct:fail(no_up_event)
    end,
    erlang:trace(Conn, false, ['receive']),
    ct:pal("link 1 back after ~b ms", [erlang:monotonic_time(millisecond) - T1]),
    receive
        {collected, Collector, Result} ->
            ?assertMatch(#{out_of_order := 0, total := ?PER_CALLER}, Result)
    after 10000 -> ct:fail(queued_messages_lost)
    end,
    {ok, #{disconnects := D}} = ecall:stats(B),
    ?assert(D >= 1),
    receive
        {rust_log, warning, Text} ->
            ?assertMatch({match, _}, re:run(Text, "link down.*link=0"))
    after 5000 -> ct:fail(no_rust_log)
    end,
    ok = logger:remove_handler(ecall_test_rust_log).

%% logger handler: forwards the Rust side's events to the test process.
log(#{level := Level, msg := {"~ts", [Text]}, meta := #{domain := [ecall, rust]}},
    #{config := #{pid := Pid}}) ->
    Pid ! {rust_log, Level, iolist_to_binary(Text)};
log(_Event, _Config) ->
    ok.

%% A node with another cookie cannot connect to our C-node.
wrong_cookie_refused_incoming(_Config) ->
    {ok, Peer, _} = peer:start_link(#{connection => standard_io,
                                   name => peer:random_name(wrong_cookie),
                                   args => ["-setcookie", "not_the_cookie"],
                                   wait_boot => 60000}),
    [Id | _] = ecall:nodes(),
    Refused0 = refused(Id),
    ?assertEqual(pang, peer:call(Peer, net_adm, ping, [Id], 30000)),
    ?assertEqual(Refused0 + 1, refused(Id)),
    peer:stop(Peer).

refused(Id) ->
    #{identities := Ids} = ecall:stats(),
    [R] = [R || #{node := N, refused := R} <- Ids, N =:= Id],
    R.

%% Our link, offered the wrong cookie, is refused by the peer, and the
%% owner is told. (A node without ecall running, so that nothing else
%% connects our identities to it first.)
wrong_cookie_refused_outgoing(_Config) ->
    {ok, Peer, C} = peer:start_link(#{name => peer:random_name(?MODULE),
                                      args => ["-setcookie", atom_to_list(erlang:get_cookie())],
                                      wait_boot => 60000}),
    {ok, CNode} = ecall_cnode:cnode(),
    {ok, P} = ecall_nif:peer_open(CNode, atom_to_binary(C), <<"wrong">>, [<<"ecall_rx_1">>],
                                  self(), (ecall_config:peer_opts())#{backoff_min => 60000}),
    receive
        {ecall_link, _, {down, Reason}} ->
            ct:pal("refused: ~ts", [Reason]),
            ?assertMatch({match, _}, re:run(Reason, "handshake"))
    after 15000 -> ct:fail(no_refusal)
    end,
    ok = ecall_nif:peer_close(P),
    ?assertEqual([], [N || N <- ecall:nodes(), lists:member(N, erpc:call(C, erlang, nodes, [hidden]))]),
    peer:stop(Peer).

%% When the peer node goes down, its connection closes promptly, and sends
%% to it behave like `!' to a dead node.
nodedown_closes_connection(_Config) ->
    {Peer, C} = start_peer(),
    ok = ecall:connect(C),
    Conn = whereis(ecall_conn:name(C)),
    Ref = monitor(process, Conn),
    Remote = erpc:call(C, erlang, whereis, [init]),
    peer:stop(Peer),
    receive {'DOWN', Ref, process, Conn, _} -> ok after 10000 -> ct:fail(conn_still_up) end,
    ?assertEqual({error, not_connected}, ecall:stats(C)),
    ?assertEqual(ping, ecall:send(Remote, ping)).

%% Without -sname/-name, ecall starts, says so, and send is plain `!'.
not_distributed(_Config) ->
    {ok, Peer, nonode@nohost} = peer:start_link(#{connection => standard_io, args => code_args(),
                                   wait_boot => 60000}),
    ?assertMatch({ok, _}, peer:call(Peer, application, ensure_all_started, [ecall])),
    ?assertEqual({error, not_distributed}, peer:call(Peer, ecall_cnode, cnode, [])),
    ?assertEqual(ok, peer:call(Peer, ?MODULE, not_distributed_check, [])),
    peer:stop(Peer).

not_distributed_check() ->
    [] = ecall:nodes(),
    {error, local_node} = ecall:connect(node()),
    hi = ecall:send(self(), hi),
    receive hi -> ok after 1000 -> lost end.

%% Bad arguments raise badarg, as `!' and erpc do.
bad_arguments(_Config) ->
    ?assertError(badarg, ecall:send("not a pid", x)),
    ?assertError(badarg, ecall:send({1, 2}, x)),
    ?assertError(badarg, ecall:connect("node")),
    ?assertError(badarg, ecall:stats(42)),
    ?assertEqual({error, local_node}, ecall:connect(node())),
    ?assertEqual({error, not_connected}, ecall:disconnect('nobody@nowhere')).

%% The byte budget bounds what is queued for a peer. Against a peer whose
%% links cannot come up, pushes fill the budget and are then refused; a
%% refused caller waits for room and is released when the peer closes, and
%% everything that was queued is counted as dropped.
budget_bounds_queue_and_close_releases(Config) ->
    B = ?config(b, Config),
    {ok, CNode} = ecall_cnode:cnode(),
    Budget = 4096,
    Ghost = list_to_atom("ghost_" ++ integer_to_list(erlang:unique_integer([positive]))
                         ++ "@" ++ lists:last(string:split(atom_to_list(B), "@"))),
    {ok, Peer} = ecall_nif:peer_open(CNode, atom_to_binary(Ghost), <<"c">>, [<<"ecall_rx_1">>],
                                     self(), (ecall_config:peer_opts())#{max_queue_bytes => Budget}),
    Payload = binary:copy(<<"x">>, 500),
    Queued = push_until_full(Peer, Payload, 0),
    Stats = ecall_nif:peer_stats(Peer),
    ?assert(Queued > 0),
    ?assert(maps:get(queued_bytes, Stats) =< Budget),
    ?assert(maps:get(queued_bytes, Stats) > Budget - 600),
    Ref = make_ref(),
    ?assertEqual(wait, ecall_nif:wait_room(Peer, 520, Ref)),
    %% Later callers queue behind the waiting one even if they would fit.
    ?assertMatch({full, _}, ecall_nif:send(Peer, self(), tiny)),
    ok = ecall_nif:peer_close(Peer),
    receive {ecall_room, Ref, false} -> ok after 5000 -> ct:fail(waiter_not_released) end,
    Closed = ecall_nif:peer_stats(Peer),
    ?assertEqual(Queued, maps:get(closed_drops, Closed)),
    ?assertEqual(0, maps:get(queued_bytes, Closed)),
    ?assertEqual(closed, ecall_nif:send(Peer, self(), x)).

push_until_full(Peer, Payload, N) ->
    case ecall_nif:send(Peer, self(), Payload) of
        ok -> push_until_full(Peer, Payload, N + 1);
        {full, _} -> N
    end.

%% With a budget of two messages and twenty concurrent senders, ecall:send/2
%% waits for room (callers woken in order as the link writes) and nothing is
%% lost or reordered.
full_budget_blocks_without_loss(_Config) ->
    Budget = 1100,
    ok = application:set_env(ecall, max_queue_bytes, Budget),
    %% A fresh node that does not connect back on its own, so that the
    %% connection made here is the one with the small budget.
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, max_queue_bytes)
    end,
    Total = 2000,
    Collector = erpc:call(C, erlang, spawn, [?MODULE, collector, [self(), Total]]),
    Payload = binary:copy(<<"x">>, 500),
    Go = make_ref(),
    Senders = [spawn_link(fun() -> receive Go -> send_payload_seq(Collector, Payload, 100) end end)
               || _ <- lists:seq(1, 20)],
    [S ! Go || S <- Senders],
    receive
        {collected, Collector, Result} ->
            ?assertEqual(#{total => Total, callers => 20, out_of_order => 0, last_seq_ok => 20},
                         Result)
    after 60000 -> ct:fail(lost_under_budget)
    end,
    {ok, Stats} = ecall:stats(C),
    ct:pal("budget test: ~p", [Stats]),
    %% The budget was hit and nothing was dropped for it. (The writer's
    %% `requests' and `queued_bytes' are updated just after a write returns,
    %% which can be after the collector has every message: not asserted.)
    ?assert(maps:get(full, Stats) > 0),
    ?assertEqual(Total, maps:get(pushed, Stats)),
    ?assertEqual(0, maps:get(dropped, Stats)),
    ?assertEqual(0, maps:get(overflow_drops, Stats)),
    ok = ecall:disconnect(C),
    peer:stop(Peer).

send_payload_seq(To, Payload, N) ->
    Self = self(),
    [{seq, Self, I, Payload} = ecall:send(To, {seq, Self, I, Payload}) || I <- lists:seq(1, N)],
    ok.


%%--------------------------------------------------------------------
%% cast, call and the multi-node patterns (group rpc: this node, B connected
%% both ways, and nodes started by the cases)

echo(X) -> X.
fail(error, R) -> erlang:error(R);
fail(exit, R) -> exit(R);
fail(throw, V) -> throw(V).
tell(Pid, Msg) -> Pid ! Msg.
whoami() -> node().
error_on(Node) when Node =:= node() -> {error, no};
error_on(_) -> node().
%% Tells the caller it runs, then waits for `go'.
block(Pid) ->
    Pid ! {blocked, self(), node()},
    receive go -> late end.

%% B answers back through its own links.
connect_back(B) ->
    ok = erpc:call(B, ecall, connect, [node()]).

cast_through_link(Config) ->
    B = ?config(b, Config),
    {ok, #{pushed := P0}} = ecall:stats(B),
    ?assertEqual(ok, ecall:cast(B, ?MODULE, tell, [self(), {cast, 1}])),
    receive {cast, 1} -> ok after 5000 -> ct:fail(cast_lost) end,
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(P0 + 1, P1).

%% Every outcome of a call, through the links to B and through erpc to a
%% node without an ecall connection: the same return values.
call_results_match_fallback(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    ?assertEqual({error, not_connected}, ecall:stats(C)),
    Cases = [{echo, [42], {ok, 42}},
             {echo, [{error, x}], {error, x}},
             {fail, [throw, thrown], {ok, thrown}},
             {fail, [throw, {error, t}], {error, t}},
             {fail, [error, boom], {error, {exit, boom}}},
             {fail, [exit, bye], {error, {exit, bye}}}],
    {ok, #{pushed := P0}} = ecall:stats(B),
    [begin
         ?assertEqual({F, Expected}, {F, ecall:call(B, ?MODULE, F, A)}),
         ?assertEqual({F, Expected}, {F, ecall:call(C, ?MODULE, F, A, 5000)})
     end || {F, A, Expected} <- Cases],
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(length(Cases), P1 - P0),
    peer:stop(Peer).

%% A call that times out returns {error, {badrpc, timeout}}, and its reply,
%% when it comes later, never reaches the caller's mailbox.
call_timeout_no_late_reply(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    Self = self(),
    Workers = [whereis(ecall_receiver:name(I)) || I <- lists:seq(1, ecall_config:receivers())],
    [erlang:trace(W, true, ['receive']) || W <- Workers],
    ?assertEqual({error, {badrpc, timeout}}, ecall:call(B, ?MODULE, block, [Self], 200)),
    Blocked = receive {blocked, P, B} -> P after 5000 -> ct:fail(not_blocked) end,
    Blocked ! go,
    %% The reply comes back in a batch to one of our receiver workers ...
    W = receive
            {trace, W0, 'receive', {batch, Elems}} when is_pid(W0) ->
                ?assertMatch([{send, Ref, {Ref, {value, late}}}] when is_reference(Ref), Elems),
                W0
        after 5000 -> ct:fail(no_late_reply_batch)
        end,
    %% ... which has replayed it once it takes its next message.
    W ! {batch, []},
    receive {trace, W, 'receive', {batch, []}} -> ok after 5000 -> ct:fail(worker_stuck) end,
    [erlang:trace(X, false, ['receive']) || X <- Workers],
    flush_traces(),
    receive Late -> ct:fail({late_reply, Late}) after 0 -> ok end.

flush_traces() ->
    receive {trace, _, _, _} -> flush_traces() after 0 -> ok end.

%% When a link goes down, the calls waiting on it return {badrpc,
%% {link_down, _}} at once; calls on the other link are not disturbed.
link_loss_fails_its_callers_only(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    Peer = ecall_conn:peer(B),
    Self = self(),
    Callers = [spawn_link(fun() ->
                                  K = ecall_nif:caller_link(Peer),
                                  Self ! {link, self(), K},
                                  Self ! {result, self(), ecall:call(B, ?MODULE, block, [Self])}
                          end) || _ <- lists:seq(1, 20)],
    Links = [{C, receive {link, C, K} -> K end} || C <- Callers],
    OnLink0 = [C || {C, 0} <- Links],
    OnLink1 = [C || {C, 1} <- Links],
    ?assertNotEqual([], OnLink0),
    Blocked = [receive {blocked, P, B} -> P after 5000 -> ct:fail(not_blocked) end || _ <- Callers],
    [Id1 | _] = ecall:nodes(),
    true = erpc:call(B, erlang, disconnect_node, [Id1]),
    %% Link 0 (Id1) callers fail ...
    [receive
         {result, C, R} -> ?assertMatch({error, {badrpc, {link_down, _}}}, R)
     after 5000 -> ct:fail({still_waiting, C})
     end || C <- OnLink0],
    %% ... the others are still waiting, and get their answers once released.
    [receive {result, C, R} -> ct:fail({early, C, R}) after 0 -> ok end || C <- OnLink1],
    [P ! go || P <- Blocked],
    [receive
         {result, C, R} -> ?assertEqual({ok, late}, R)
     after 5000 -> ct:fail({lost_call, C})
     end || C <- OnLink1],
    ok.

%% 1,000 calls outstanding on a node whose OS process is killed: every one
%% returns {error, {badrpc, _}}, none hangs.
peer_killed_with_1000_calls(_Config) ->
    {_Peer, C} = start_peer([]),
    ok = ecall:connect(C),
    Self = self(),
    OsPid = erpc:call(C, os, getpid, []),
    Callers = [spawn(fun() -> Self ! {result, self(), ecall:call(C, ?MODULE, block, [Self])} end)
               || _ <- lists:seq(1, 1000)],
    [receive {blocked, _, C} -> ok after 30000 -> ct:fail(not_blocked) end || _ <- Callers],
    T0 = erlang:monotonic_time(millisecond),
    os:cmd("kill -9 " ++ OsPid),
    Results = [receive {result, P, R} -> R after 30000 -> ct:fail({hung, P}) end || P <- Callers],
    Ms = erlang:monotonic_time(millisecond) - T0,
    ct:pal("1000 callers returned ~b ms after the kill: ~p",
           [Ms, lists:usort([R || {error, {badrpc, R}} <- Results])]),
    [?assertMatch({error, {badrpc, _}}, R) || R <- Results],
    %% The bound stated in the README.
    ?assert(Ms < 5000).

unreachable_node(_Config) ->
    [_, Host] = string:split(atom_to_list(node()), "@"),
    Nobody = list_to_atom("nobody@" ++ Host),
    ?assertEqual({error, {badrpc, noconnection}}, ecall:call(Nobody, ?MODULE, echo, [1])),
    ?assertEqual(ok, ecall:cast(Nobody, ?MODULE, echo, [1])).

multi_node_patterns(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    {Peer, C} = start_peer([]),
    ok = ecall:connect(C),
    A = node(),
    [_, Host] = string:split(atom_to_list(A), "@"),
    Nobody = list_to_atom("nobody@" ++ Host),
    Self = self(),
    %% cast_one: the local node when listed.
    ok = ecall:cast_one([B, A], ?MODULE, tell, [Self, {one, A}]),
    receive {one, A} -> ok after 5000 -> ct:fail(cast_one_lost) end,
    ok = ecall:cast_one([B], erlang, send, [Self, cast_one_b]),
    receive cast_one_b -> ok after 5000 -> ct:fail(cast_one_b_lost) end,
    ?assertEqual({error, none_is_available}, ecall:cast_one([], ?MODULE, echo, [1])),
    %% cast_all: every node, once.
    ok = ecall:cast_all([A, B, C], ?MODULE, tell, [Self, all]),
    ok = ecall:cast_all([A, B, C], erlang, send, [Self, {all, x}]),
    [receive {all, x} -> ok after 5000 -> ct:fail(cast_all_lost) end || _ <- [A, B, C]],
    [receive all -> ok after 5000 -> ct:fail(cast_all_lost) end || _ <- [A, B, C]],
    %% call_one: local first; on to the next node after an error; badrpc
    %% ignored unless asked for.
    ?assertEqual({ok, {A, A}}, ecall:call_one([B, A, C], ?MODULE, whoami, [])),
    ?assertEqual({ok, {C, C}}, ecall:call_one([B, C], ?MODULE, error_on, [B])),
    ?assertEqual({error, [{B, no}]}, ecall:call_one([B], ?MODULE, error_on, [B])),
    ?assertEqual({error, none_is_available}, ecall:call_one([Nobody], ?MODULE, whoami, [])),
    ?assertEqual({error, [{Nobody, {badrpc, noconnection}}]},
                 ecall:call_one([Nobody], ?MODULE, whoami, [], true)),
    ?assertEqual({error, none_is_available}, ecall:call_one([], ?MODULE, whoami, [])),
    %% call_any: the first {ok, _}.
    {ok, {N1, N1}} = ecall:call_any([B, C], ?MODULE, whoami, []),
    ?assert(lists:member(N1, [B, C])),
    ?assertEqual({ok, {B, B}}, ecall:call_any([Nobody, B], ?MODULE, whoami, [])),
    ?assertEqual({ok, {C, C}}, ecall:call_any([B, C], ?MODULE, error_on, [B])),
    ?assertEqual({error, [{B, no}]}, ecall:call_any([B, Nobody], ?MODULE, error_on, [B])),
    ?assertMatch({error, [_, _]}, ecall:call_any([B, Nobody], ?MODULE, error_on, [B], true)),
    %% call_all: every node must answer {ok, _}.
    ?assertEqual({ok, [{A, A}, {B, B}, {C, C}]}, ecall:call_all([A, B, C], ?MODULE, whoami, [])),
    ?assertEqual({error, {B, no}}, ecall:call_all([B, C], ?MODULE, error_on, [B])),
    ?assertEqual({ok, [{B, B}]}, ecall:call_all([B, Nobody], ?MODULE, whoami, [])),
    ?assertEqual({error, {Nobody, {badrpc, noconnection}}},
                 ecall:call_all([B, Nobody], ?MODULE, whoami, [], true)),
    ?assertEqual({error, none_is_available}, ecall:call_all([Nobody], ?MODULE, whoami, [])),
    %% call_all_wait: replies and rejects.
    ?assertEqual({[{C, C}, {A, A}], [{B, no}]},
                 ecall:call_all_wait([B, C, A, Nobody], ?MODULE, error_on, [B])),
    ?assertEqual({[{C, C}], [{B, no}, {Nobody, {badrpc, noconnection}}]},
                 ecall:call_all_wait([B, C, Nobody], ?MODULE, error_on, [B], true)),
    %% No stray answers were left behind.
    receive Stray -> ct:fail({stray, Stray}) after 0 -> ok end,
    ok = ecall:disconnect(C),
    peer:stop(Peer).

rpc_bad_arguments(_Config) ->
    ?assertError(badarg, ecall:cast("b", m, f, [])),
    ?assertError(badarg, ecall:cast(b, m, f, not_a_list)),
    ?assertError(badarg, ecall:call(b, m, "f", [])),
    ?assertError(badarg, ecall:call(b, m, f, [], -1)),
    ?assertError(badarg, ecall:call(b, m, f, [], soon)),
    ?assertError(function_clause, ecall:call_all(not_a_list, m, f, [])).

%%--------------------------------------------------------------------
%% The stall watchdog (group watchdog: each case starts its own peer)

%% A peer started with a 1 s stall timeout on our side, discovery off so
%% that only our connection exists.
start_stall_peer() ->
    ok = application:set_env(ecall, stall_timeout, 1000),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, stall_timeout)
    end,
    {Peer, C, erpc:call(C, os, getpid, [])}.

%% A peer whose OS process is stopped (SIGSTOP) stops draining: the link
%% is reaped within the stall timeout plus slack, what it held is dropped
%% and counted, the budget is back to zero, and the reap is reported.
stalled_peer_is_reaped(_Config) ->
    {Peer, C, OsPid} = start_stall_peer(),
    Conn = whereis(ecall_conn:name(C)),
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    erlang:trace(Conn, true, ['receive']),
    "" = os:cmd("kill -STOP " ++ OsPid),
    T0 = erlang:monotonic_time(millisecond),
    try
        %% 30 MB from one caller (one shard, one link): far more than the
        %% loopback socket buffers hold, well within the 64 MB budget.
        Chunk = binary:copy(<<"s">>, 100000),
        [ecall:send(Sink, Chunk) || _ <- lists:seq(1, 300)],
        Why = receive
                  {trace, Conn, 'receive', {ecall_link, _, {down, W}}} -> W
              after 10000 -> ct:fail(not_reaped)
              end,
        Ms = erlang:monotonic_time(millisecond) - T0,
        ct:pal("reaped ~b ms after SIGSTOP: ~ts", [Ms, Why]),
        ?assertMatch({match, _}, re:run(Why, "stalled")),
        ?assert(Ms < 1000 + 3000),
        {ok, Stats} = ecall:stats(C),
        ct:pal("after the reap: ~p", [Stats]),
        ?assert(maps:get(stalls, Stats) >= 1),
        ?assert(maps:get(dropped, Stats) > 0),
        ?assertEqual(0, maps:get(queued_bytes, Stats))
    after
        erlang:trace(Conn, false, ['receive']),
        os:cmd("kill -CONT " ++ OsPid)
    end,
    flush_traces(),
    peer:stop(Peer).

%% The guard: a peer that is alive but slow (stopped for 600 ms, then
%% running for 200 ms, in a cycle) keeps draining over many stall windows
%% and is never reaped; nothing is lost.
slow_peer_is_not_reaped(_Config) ->
    {Peer, C, OsPid} = start_stall_peer(),
    Total = 400,
    Collector = erpc:call(C, erlang, spawn, [?MODULE, collector, [self(), Total]]),
    Stutter = spawn_link(fun() -> stutter(OsPid) end),
    Payload = binary:copy(<<"p">>, 100000),
    Self = self(),
    T0 = erlang:monotonic_time(millisecond),
    %% 10 MB/s for 4 s: each stop leaves the link blocked for most of it.
    [begin
         {seq, Self, I, Payload} = ecall:send(Collector, {seq, Self, I, Payload}),
         I rem 10 =:= 0 andalso timer:sleep(100)
     end || I <- lists:seq(1, Total)],
    receive
        {collected, Collector, Result} ->
            ?assertMatch(#{out_of_order := 0, total := Total}, Result)
    after 60000 -> ct:fail(slow_peer_lost_messages)
    end,
    Ms = erlang:monotonic_time(millisecond) - T0,
    unlink(Stutter),
    Stutter ! {stop, self()},
    receive stutter_stopped -> ok end,
    {ok, Stats} = ecall:stats(C),
    ct:pal("slow peer, ~b ms: ~p", [Ms, Stats]),
    %% It spanned several stall windows ...
    ?assert(Ms > 3000),
    %% ... and was never taken for stalled.
    ?assertEqual(0, maps:get(stalls, Stats)),
    ?assertEqual(0, maps:get(disconnects, Stats)),
    ?assertEqual(0, maps:get(dropped, Stats)),
    peer:stop(Peer).

%% Stops an OS process for 600 ms, lets it run for 200 ms, until told to
%% stop (and leaves it running). The sleeps are the subject: a slow peer.
stutter(OsPid) ->
    os:cmd("kill -STOP " ++ OsPid),
    timer:sleep(600),
    os:cmd("kill -CONT " ++ OsPid),
    receive
        {stop, From} -> From ! stutter_stopped
    after 200 ->
        stutter(OsPid)
    end.

%% A peer that drains nothing (SIGSTOP) and senders pushing far more than
%% it could take: what is queued never exceeds the budget, whatever the
%% overflow policy. `error': casts and calls say {error, overload}, sends
%% are dropped and counted; `drop': everything over is dropped and counted;
%% `block': the sender waits, and once the peer runs again every one of its
%% messages arrives.
overload_stays_within_budget(_Config) ->
    Budget = 1000000,
    ok = application:set_env(ecall, max_queue_bytes, Budget),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, max_queue_bytes)
    end,
    OsPid = erpc:call(C, os, getpid, []),
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    Total = 100,
    Collector = erpc:call(C, erlang, spawn, [?MODULE, collector, [self(), Total]]),
    Chunk = binary:copy(<<"o">>, 100000),
    Within = fun() ->
                     {ok, #{queued_bytes := Q}} = ecall:stats(C),
                     ?assert(Q =< Budget),
                     Q
             end,
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        %% error: 20 MB pushed, far past the socket buffers and the budget.
        ok = application:set_env(ecall, overflow, error),
        Casts = [begin R = ecall:cast(C, erlang, send, [Sink, Chunk]), Within(), R end
                 || _ <- lists:seq(1, 200)],
        ?assert(lists:member({error, overload}, Casts)),
        %% Requests larger than the whole budget never fit: deterministic.
        Huge = binary:copy(<<"h">>, 2 * Budget),
        ?assertEqual(Huge, ecall:send(Sink, Huge)),
        ?assertEqual({error, overload}, ecall:call(C, ?MODULE, echo, [Huge], 1000)),
        {ok, #{overflow_drops := D1}} = ecall:stats(C),
        ?assert(D1 >= 3),
        %% drop: casts look fine, and are counted.
        ok = application:set_env(ecall, overflow, drop),
        ?assertEqual(ok, ecall:cast(C, erlang, send, [Sink, Huge])),
        {ok, #{overflow_drops := D2}} = ecall:stats(C),
        ?assertEqual(D1 + 1, D2),
        %% block: the sender waits for room ...
        ok = application:set_env(ecall, overflow, block),
        Self = self(),
        1 = erlang:trace_pattern({ecall_nif, wait_room, 3}, true, [local]),
        Sender = spawn_link(fun() -> send_payload_seq(Collector, Chunk, Total), Self ! sent end),
        erlang:trace(Sender, true, [call]),
        receive {trace, Sender, call, {ecall_nif, wait_room, _}} -> ok
        after 10000 -> ct:fail(sender_did_not_wait)
        end,
        Within()
    after
        erlang:trace_pattern({ecall_nif, wait_room, 3}, false, [local]),
        application:unset_env(ecall, overflow),
        os:cmd("kill -CONT " ++ OsPid)
    end,
    %% ... and, the peer running again, nothing it sent is lost.
    receive sent -> ok after 30000 -> ct:fail(sender_stuck) end,
    receive
        {collected, Collector, Result} ->
            ?assertMatch(#{out_of_order := 0, total := Total}, Result)
    after 30000 -> ct:fail(blocked_messages_lost)
    end,
    {ok, Stats} = ecall:stats(C),
    ct:pal("overload: ~p", [Stats]),
    ?assert(maps:get(overflow_waits, Stats) >= 1),
    flush_traces(),
    peer:stop(Peer).

%%--------------------------------------------------------------------
%% The pure-Erlang transport (group erlang_transport: B connected with it)

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
    ?assertEqual(ok, ecall:cast(B, ?MODULE, tell, [self(), {cast, erl}])),
    receive {cast, erl} -> ok after 5000 -> ct:fail(cast_lost) end,
    ?assertEqual({ok, 42}, ecall:call(B, ?MODULE, echo, [42])),
    ?assertEqual({error, {exit, boom}}, ecall:call(B, ?MODULE, fail, [error, boom])),
    ?assertEqual({error, {badrpc, timeout}}, ecall:call(B, ?MODULE, block, [self()], 100)),
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
    {ok, Peer, D} = peer:start_link(#{name => peer:random_name(?MODULE), args => Args,
                                      wait_boot => 60000}),
    {ok, _} = erpc:call(D, application, ensure_all_started, [ecall]),
    ?assertNotEqual(none, erpc:call(D, ecall_nif, load_error, [])),
    ?assertEqual(erlang, erpc:call(D, ecall_conn, transport, [])),
    ok = erpc:call(D, ecall, connect, [node()]),
    {ok, #{transport := erlang}} = erpc:call(D, ecall, stats, [node()]),
    Self = self(),
    hi = erpc:call(D, ecall, send, [Self, hi]),
    receive hi -> ok after 5000 -> ct:fail(lost) end,
    ?assertEqual({ok, node()}, erpc:call(D, ecall, call, [node(), ?MODULE, whoami, []])),
    peer:stop(Peer).
