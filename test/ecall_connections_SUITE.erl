%% Connections and their edges on real nodes: cookies both ways, nodedown,
%% a node that is not distributed, bad arguments, configuration checked at
%% start, OTP process hygiene.
-module(ecall_connections_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([wrong_cookie_refused_incoming/1, wrong_cookie_refused_outgoing/1,
         stalled_incoming_handshakes_time_out/1,
         nodedown_closes_connection/1, not_distributed/1, bad_arguments/1,
         bad_config_stops_start/1, links_follow_schedulers/1,
         receiver_answers_system_messages/1,
         spawn_failure_is_counted_and_answered/1,
         numbered_call_gets_system_limit_at_once/1, restart_cycles_start_first_time/1,
         order_holds_across_reconnects/1, a_node_that_crashes_is_written_down/1,
         a_peer_without_ecall_says_so/1, a_peer_of_another_version_is_refused/1,
         connect_reasons/1, bad_settings_at_run_time_are_refused/1,
         an_orderly_shutdown_is_one_notice_per_link/1,
         not_started_says_so/1,
         configuration_doc_matches_spec/1, overflow_is_read_at_use/1,
         max_queue_bytes_is_read_at_open/1,
         connection_up_and_down_are_notices/1,
         blocked_sender_goes_by_native_when_the_connection_closes/1,
         message_in_fragments_outlives_the_close/1,
         discovery_reconnects_after_a_nodedown/1, discovery_reconnects_after_a_restart/1,
         discovery_is_quiet_about_a_disconnect/1, connect_outlives_an_unread_nodedown/1,
         restart_with_handshakes_under_way_registers_at_once/1,
         a_stale_connection_is_dropped_and_the_link_comes_up/1]).
%% logger handler.
-export([log/2]).
%% Run on peers.
-export([not_distributed_check/0, hold/1, order_collector/2, load_loop/1,
         big_receiver/1, fill_table/1]).

-import(ecall_test_nodes, [start_peer/0, start_peer/1, node_args/0,
                           step_sender/3, step/2, step_until_blocked/2]).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [wrong_cookie_refused_incoming, wrong_cookie_refused_outgoing,
     stalled_incoming_handshakes_time_out, nodedown_closes_connection,
     not_distributed, bad_arguments, bad_config_stops_start, links_follow_schedulers,
     receiver_answers_system_messages,
     spawn_failure_is_counted_and_answered, numbered_call_gets_system_limit_at_once,
     restart_cycles_start_first_time,
     restart_with_handshakes_under_way_registers_at_once,
     order_holds_across_reconnects, a_node_that_crashes_is_written_down,
     a_peer_without_ecall_says_so, a_peer_of_another_version_is_refused, not_started_says_so,
     connect_reasons, bad_settings_at_run_time_are_refused,
     an_orderly_shutdown_is_one_notice_per_link,
     configuration_doc_matches_spec,
     overflow_is_read_at_use, max_queue_bytes_is_read_at_open,
     connection_up_and_down_are_notices,
     blocked_sender_goes_by_native_when_the_connection_closes,
     message_in_fragments_outlives_the_close,
     discovery_reconnects_after_a_nodedown, discovery_reconnects_after_a_restart,
     discovery_is_quiet_about_a_disconnect, connect_outlives_an_unread_nodedown,
     a_stale_connection_is_dropped_and_the_link_comes_up].

init_per_suite(Config) ->
    ok = ecall_test_nodes:start_ecall(),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall).

%% A node with another cookie cannot connect to our C-node; each refusal
%% is counted, and logged: the first at warning, those within the next
%% 10 s at debug only (a flood of them would flood the log). The line is
%% sent before the count is made, so once the count shows the third
%% refusal, a round trip through the process that hands the Rust side's
%% lines to logger (ecall_log) brings every line there is.
wrong_cookie_refused_incoming(_Config) ->
    {ok, Peer, _} = peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                                      connection => standard_io,
                                   name => peer:random_name(wrong_cookie),
                                   args => ["-setcookie", "not_the_cookie"],
                                   wait_boot => 60000}),
    [Id | _] = ecall:identities(),
    Refused0 = refused(Id),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        ?assertEqual(pang, peer:call(Peer, net_adm, ping, [Id], 30000)),
        await_warning(["incoming handshake refused", "refused=" ++ integer_to_list(Refused0 + 1)]),
        [?assertEqual(pang, peer:call(Peer, net_adm, ping, [Id], 30000)) || _ <- [2, 3]],
        %% The peer may hear the socket close before the count is made.
        ok = ecall_test_nodes:await({refused, Refused0 + 3},
                                    fun() -> refused(Id) >= Refused0 + 3 end),
        ?assertEqual(Refused0 + 3, refused(Id)),
        _ = sys:get_state(ecall_log),
        ?assertEqual([], [T || {log, warning, T} <- flush_logs(),
                               string:find(T, "incoming handshake refused") =/= nomatch])
    after
        _ = logger:remove_handler(?MODULE)
    end,
    peer:stop(Peer).

refused(Id) ->
    #{identities := Ids} = ecall:stats(),
    [R] = [R || #{node := N, refused := R} <- Ids, N =:= Id],
    R.

%% An incoming connection to an identity that does not finish its
%% handshake is closed at the `handshake_timeout' deadline (5 s, the
%% default) and counted in `handshakes_timed_out', and only there: one that
%% sends nothing, and one that stops in the middle of its send_name
%% message. (The flood cases of ecall_hostile_SUITE only assert that
%% none of theirs timed out.) The identity closes them: each socket is
%% seen closed, then the counts.
stalled_incoming_handshakes_time_out(_Config) ->
    [Id | _] = ecall:identities(),
    #{port := Port} = I0 = identity(Id),
    Silent = connect_to_identity(Port),
    Halfway = connect_to_identity(Port),
    %% A send_name message's length (30), its tag and part of its flags.
    ok = gen_tcp:send(Halfway, <<0, 30, $N, 0, 0, 0, 0>>),
    [receive {tcp_closed, S} -> ok after 30000 -> ct:fail({still_open, S}) end
     || S <- [Silent, Halfway]],
    Delta = fun(Key) -> maps:get(Key, identity(Id)) - maps:get(Key, I0) end,
    ok = ecall_test_nodes:await(timed_out, fun() -> Delta(handshakes_timed_out) >= 2 end),
    ?assertEqual(#{handshakes_timed_out => 2, refused => 0, accepted => 0,
                   handshakes_shed_idle => 0, handshakes_shed_stalled => 0},
                 maps:from_list([{K, Delta(K)} || K <- [handshakes_timed_out, refused, accepted,
                                                        handshakes_shed_idle,
                                                        handshakes_shed_stalled]])).

%% This node's identity `Id', as ecall:stats/0 shows it.
identity(Id) ->
    #{identities := Ids} = ecall:stats(),
    [I] = [I || #{node := N} = I <- Ids, N =:= Id],
    I.

%% A plain TCP connection to an identity's port, in active mode (its close
%% comes as a message).
connect_to_identity(Port) ->
    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, true}]),
    S.

%% The log lines the handler has sent so far.
flush_logs() ->
    receive {log, _, _} = L -> [L | flush_logs()] after 0 -> [] end.

%% Our link, offered the wrong cookie, is refused by the peer, and the
%% owner is told. (A node without ecall running, so that nothing else
%% connects our identities to it first.)
wrong_cookie_refused_outgoing(_Config) ->
    {ok, Peer, C} = peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                                      name => peer:random_name(?MODULE),
                                      args => ["-setcookie", atom_to_list(erlang:get_cookie())],
                                      wait_boot => 60000}),
    {ok, CNode} = ecall_cnode:cnode(),
    {ok, P} = ecall_nif:peer_open(CNode, atom_to_binary(C), <<"wrong">>, [<<"ecall_rx_1">>],
                                  self(), (ecall_config:peer_opts())#{backoff_min => 60000}),
    receive
        {ecall_link, _, {down, Reason}} ->
            ct:pal("refused: ~p", [Reason]),
            ?assertMatch({handshake, _}, Reason)
    after 15000 -> ct:fail(no_refusal)
    end,
    ok = ecall_nif:peer_close(P),
    ?assertEqual([], [N || N <- ecall:identities(), lists:member(N, erpc:call(C, erlang, nodes, [hidden]))]),
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
    {ok, Peer, nonode@nohost} = peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                                                  connection => standard_io, args => node_args(),
                                   wait_boot => 60000}),
    ?assertMatch({ok, _}, peer:call(Peer, application, ensure_all_started, [ecall])),
    ?assertEqual({error, not_distributed}, peer:call(Peer, ecall_cnode, cnode, [])),
    ?assertEqual(ok, peer:call(Peer, ?MODULE, not_distributed_check, [])),
    peer:stop(Peer).

not_distributed_check() ->
    [] = ecall:identities(),
    {error, local_node} = ecall:connect(node()),
    hi = ecall:send(self(), hi),
    receive hi -> ok after 1000 -> lost end.

%% Bad arguments raise badarg, as `!' and erpc do.
bad_arguments(_Config) ->
    ?assertError(badarg, ecall:send("not a pid", x)),
    ?assertError(badarg, ecall:send({1, 2}, x)),
    ?assertError(badarg, ecall:connect("node")),
    ?assertError(badarg, ecall:stats(42)),
    %% One node where a list of nodes is due.
    ?assertError(badarg, ecall:call_any(node(), erlang, node, [])),
    ?assertError(badarg, ecall:call_one(node(), erlang, node, [])),
    ?assertError(badarg, ecall:call_all(node(), erlang, node, [])),
    ?assertError(badarg, ecall:call_all_wait(node(), erlang, node, [])),
    ?assertError(badarg, ecall:cast_one(node(), erlang, node, [])),
    ?assertError(badarg, ecall:cast_all(node(), erlang, node, [])),
    ?assertError(badarg, ecall:info_lines(42)),
    ?assertEqual({error, local_node}, ecall:connect(node())),
    ?assertEqual({error, not_connected}, ecall:disconnect('nobody@nowhere')).

%% `links' left at `auto' gives one link per two schedulers, at least 1
%% and at most 2, and the node registers that many C-node identities; a
%% number set is taken as it is. The peers are started without the suite's
%% own setting (node_args/0 would pass it on).
links_follow_schedulers(_Config) ->
    Code = ecall_test_nodes:code_paths(),
    Links = fun(Args) ->
                    {ok, Peer, C} = peer:start_link(
                                      #{exec => ecall_test_nodes:node_exec(),
                                        name => peer:random_name(?MODULE),
                                        args => ["-setcookie", atom_to_list(erlang:get_cookie())
                                                 | Code ++ Args],
                                        wait_boot => 60000}),
                    {ok, _} = erpc:call(C, application, ensure_all_started, [ecall]),
                    Result = {erpc:call(C, application, get_env, [ecall, links]),
                              erpc:call(C, ecall_config, links, []),
                              length(erpc:call(C, ecall, identities, []))},
                    peer:stop(Peer),
                    Result
            end,
    ?assertEqual({{ok, auto}, 1, 1}, Links(["+S", "1"])),
    ?assertEqual({{ok, auto}, 1, 1}, Links(["+S", "2"])),
    ?assertEqual({{ok, auto}, 1, 1}, Links(["+S", "3"])),
    ?assertEqual({{ok, auto}, 2, 2}, Links(["+S", "4"])),
    ?assertEqual({{ok, auto}, 2, 2}, Links(["+S", "8"])),
    ?assertEqual({{ok, 3}, 3, 3}, Links(["+S", "1", "-ecall", "links", "3"])).

%% Every setting is checked when the application starts: a bad value or an
%% unknown key stops the start with an error naming the key (before, some
%% were accepted and failed later, inside a caller's send or connect).
bad_config_stops_start(_Config) ->
    {ok, Peer, C} = peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                                      name => peer:random_name(?MODULE),
                                      args => ["-setcookie", atom_to_list(erlang:get_cookie())
                                               | node_args()],
                                      wait_boot => 60000}),
    ok = erpc:call(C, application, load, [ecall]),
    Bad = [{discovery, 3}, {max_queue_bytes, -1}, {overflow, foo}, {shards, 0},
           {stall_timeout, -5}, {max_batch_count, 0}, {transport, bar}, {connect_timeout, 0},
           {links, 0}, {links, schedulers}, {handshake_timeout, infinity},
           {receivers, many}],
    [begin
         ok = erpc:call(C, application, set_env, [ecall, Key, Value]),
         ?assertMatch({Key, {error, {{bad_config, Key, Value}, _}}},
                      {Key, erpc:call(C, application, start, [ecall])}),
         ok = erpc:call(C, application, unset_env, [ecall, Key])
     end || {Key, Value} <- Bad],
    ok = erpc:call(C, application, set_env, [ecall, no_such_key, 1]),
    ?assertMatch({error, {{unknown_config_key, no_such_key}, _}},
                 erpc:call(C, application, start, [ecall])),
    ok = erpc:call(C, application, unset_env, [ecall, no_such_key]),
    %% Checked across keys too.
    ok = erpc:call(C, application, set_env, [ecall, backoff_min, 500]),
    ok = erpc:call(C, application, set_env, [ecall, backoff_max, 100]),
    ?assertMatch({error, {{bad_config, backoff_max, 100}, _}},
                 erpc:call(C, application, start, [ecall])),
    ok = erpc:call(C, application, unset_env, [ecall, backoff_max]),
    %% Good values start.
    ok = erpc:call(C, application, set_env, [ecall, shards, schedulers]),
    ?assertEqual(ok, erpc:call(C, application, start, [ecall])),
    peer:stop(Peer).

%% A receiver worker is a proper special process: sys:get_state/1 answers
%% (it used to hang: system messages were counted as malformed), and a
%% suspended worker replays what came meanwhile once resumed.
receiver_answers_system_messages(_Config) ->
    Worker = whereis(ecall_rx_1),
    ?assertMatch(#{index := 1, name := ecall_rx_1}, sys:get_state(ecall_rx_1, 5000)),
    #{receivers := #{malformed := M0}} = ecall:stats(),
    ok = sys:suspend(ecall_rx_1),
    ecall_rx_1 ! {batch, [{send, self(), while_suspended}]},
    receive while_suspended -> ct:fail(replayed_while_suspended) after 0 -> ok end,
    ok = sys:resume(ecall_rx_1),
    receive while_suspended -> ok after 5000 -> ct:fail(lost_while_suspended) end,
    #{receivers := #{malformed := M1}} = ecall:stats(),
    ?assertEqual(M0, M1),
    ?assertEqual(Worker, whereis(ecall_rx_1)).

%% A batch of casts that fills the peer's process table: the casts that
%% cannot be spawned are counted, a call in the same batch is answered
%% {badrpc, system_limit}, and the worker carries on (before, the bare
%% spawn raised, the worker died and the rest of its batch was lost).
spawn_failure_is_counted_and_answered(_Config) ->
    %% 1,024 processes at most (the smallest table the emulator takes).
    %% Discovery off: no connection processes start on C while its table
    %% is full.
    {Peer, C} = start_peer(["+P", "1024", "-ecall", "discovery", "false"]),
    Worker = erpc:call(C, erlang, whereis, [ecall_rx_1]),
    #{receivers := #{spawn_failed := F0}} = erpc:call(C, ecall, stats, []),
    %% Every cast process links to Holder and waits: stopping Holder frees
    %% the table again.
    Holder = erpc:call(C, erlang, spawn, [fun() -> receive stop -> exit(stop) end end]),
    Alias = alias(),
    Casts = [{cast, ?MODULE, hold, [Holder]} || _ <- lists:seq(1, 2000)],
    {ecall_rx_1, C} ! {batch, Casts ++ [{call, Alias, erlang, node, []},
                                        {send, self(), after_the_call}]},
    receive
        {Alias, Reply} -> ?assertEqual({badrpc, system_limit}, Reply)
    after 30000 -> ct:fail(call_not_answered)
    end,
    receive after_the_call -> ok after 30000 -> ct:fail(rest_of_batch_lost) end,
    Holder ! stop,
    %% The table has room again: erpc spawns on C.
    #{receivers := #{spawn_failed := F1}} = wait_erpc(C, ecall, stats, []),
    ct:pal("~b spawns failed", [F1 - F0]),
    ?assert(F1 - F0 >= 2000 + 1 - 1024),
    ?assertEqual(Worker, erpc:call(C, erlang, whereis, [ecall_rx_1])),
    unalias(Alias),
    peer:stop(Peer).

%% On a peer: one of the casts above.
hold(Holder) ->
    link(Holder),
    receive after infinity -> ok end.

%% erpc:call/4, retried while the peer's process table is still full (the
%% held processes exit asynchronously after Holder does).
wait_erpc(Node, M, F, A) ->
    try erpc:call(Node, M, F, A)
    catch error:{erpc, system_limit} -> wait_erpc(Node, M, F, A)
    end.

%% A call by ecall:call/4,5 (the default path: answered by id, `{call,
%% From, Id, ...}') to a peer whose process table is full returns
%% {error, {badrpc, system_limit}} as soon as the peer's receiver fails to
%% spawn it, not after its timeout: with a timeout of 20 s it is that term,
%% not {badrpc, timeout}; with `infinity' it returns at all (each call runs
%% in a process of its own, waited on with a guard against a hang). Each
%% call is traced to have taken the numbered path (the NIF registered it
%% under an id). The table is filled by a process spawned on the peer
%% directly (no erpc process that could exit and free a slot) and held
%% while the calls run.
numbered_call_gets_system_limit_at_once(_Config) ->
    {Peer, C} = start_peer(["+P", "1024", "-ecall", "discovery", "false"]),
    ok = ecall:connect(C),
    #{receivers := #{spawn_failed := F0}} = erpc:call(C, ecall, stats, []),
    Filler = spawn(C, ?MODULE, fill_table, [self()]),
    receive {full, Filler} -> ok after 30000 -> ct:fail(table_not_full) end,
    1 = erlang:trace_pattern({ecall_nif, call_wait, 2}, [{'_', [], [{return_trace}]}], [local]),
    try
        ?assertEqual({error, {badrpc, system_limit}}, numbered_call(C, 20000, 60000)),
        ?assertEqual({error, {badrpc, system_limit}}, numbered_call(C, infinity, 30000))
    after
        erlang:trace_pattern({ecall_nif, call_wait, 2}, false, [local]),
        flush_all_traces()
    end,
    Filler ! release,
    #{receivers := #{spawn_failed := F1}} = wait_erpc(C, ecall, stats, []),
    ?assertEqual(2, F1 - F0),
    %% The table has room again: the same call is served.
    ?assertEqual({ok, C}, ecall:call(C, erlang, node, [])),
    peer:stop(Peer).

%% ecall:call(C, erlang, node, [], Timeout) in a new process, traced: its
%% result, once the trace shows that the NIF registered it under an id
%% (the numbered path, not the alias one); `Guard' ms at most.
numbered_call(C, Timeout, Guard) ->
    Self = self(),
    Caller = spawn_link(fun() ->
                                receive go -> ok end,
                                Self ! {result, self(), ecall:call(C, erlang, node, [], Timeout)}
                        end),
    1 = erlang:trace(Caller, true, [call]),
    Caller ! go,
    receive
        {trace, Caller, return_from, {ecall_nif, call_wait, 2}, Registered} ->
            ?assertMatch({ok, _}, Registered)
    after Guard -> ct:fail({not_numbered, Timeout})
    end,
    receive
        {result, Caller, Result} -> Result
    after Guard -> ct:fail({still_waiting, Timeout})
    end.

%% On a peer: spawns until its process table is full, says so, and holds
%% the processes until told to release them.
fill_table(Owner) ->
    Held = fill([]),
    Owner ! {full, self()},
    receive release -> [exit(P, kill) || P <- Held] end.

fill(Held) ->
    try spawn(fun() -> receive after infinity -> ok end end) of
        P -> fill([P | Held])
    catch
        error:system_limit -> Held
    end.

%% ecall stopped and started again on node C while 64 handshakes wait on
%% one of its identities (65 idle connections: once the first is shed,
%% each of the others has its handshake under way): the new start
%% registers every identity at once. The handshakes under way end with the
%% identity; they held it, and its name in epmd, until their 5 s deadline,
%% and the start found the name taken.
restart_with_handshakes_under_way_registers_at_once(_Config) ->
    {Peer, C} = start_peer(),
    try
        #{identities := [#{port := Port} = I0 | _]} = erpc:call(C, ecall, stats, []),
        Idle = [begin
                    {ok, S} = gen_tcp:connect({127, 0, 0, 1}, Port, [binary, {active, false}]),
                    S
                end || _ <- lists:seq(1, 65)],
        Shed0 = maps:get(handshakes_shed_idle, I0),
        ok = ecall_test_nodes:await({shed, Shed0 + 1}, fun() -> shed_idle(C) > Shed0 end),
        ok = erpc:call(C, application, stop, [ecall]),
        ?assertEqual(ok, erpc:call(C, application, start, [ecall])),
        ?assertEqual(ecall_config:links(), length(erpc:call(C, ecall, identities, []))),
        [gen_tcp:close(S) || S <- Idle]
    after
        peer:stop(Peer)
    end.

%% What C's first identity has shed before a name.
shed_idle(C) ->
    #{identities := [#{handshakes_shed_idle := Shed} | _]} = erpc:call(C, ecall, stats, []),
    Shed.

%% application:stop/1 then start/1 at once, 100 times, on a node connected
%% both ways and sending to this node all along: every start succeeds at
%% the first try (it used to fail with cnode_start_failed ... ALIVE2_REQ
%% while epmd still held the old names), the identities are registered
%% again, and file descriptors, OS threads and epmd names do not grow with
%% the cycles.
restart_cycles_start_first_time(_Config) ->
    {Peer, C} = start_peer(),
    ok = ecall:connect(C),
    OsPid = erpc:call(C, os, getpid, []),
    Self = self(),
    %% Load: a process on C that sends to this node without pause, through
    %% whatever path is there (links, or `!' while ecall is stopped).
    Counter = spawn_link(fun() -> count_loop(0) end),
    Loader = erpc:call(C, erlang, spawn, [?MODULE, load_loop, [Counter]]),
    [CName, _] = string:split(atom_to_list(C), "@"),
    Names = fun() ->
                    {ok, All} = erpc:call(C, erl_epmd, names, []),
                    length([N || {N, _} <- All, lists:prefix(CName, N)])
            end,
    Cycle = fun() ->
                    ok = erpc:call(C, application, stop, [ecall]),
                    ?assertEqual(ok, erpc:call(C, application, start, [ecall])),
                    ?assertEqual(ecall_config:links(), length(erpc:call(C, ecall, identities, [])))
            end,
    Cycle(),
    {Fds0, Threads0} = os_counts(OsPid),
    Names0 = Names(),
    [Cycle() || _ <- lists:seq(1, 100)],
    {Fds1, Threads1} = os_counts(OsPid),
    Names1 = Names(),
    exit(Loader, kill),
    Counter ! {count, Self},
    Got = receive {counted, N} -> N end,
    ct:pal("after 1 cycle: ~b fds, ~b threads, ~b epmd names; after 101: ~b, ~b, ~b; "
           "~b messages received meanwhile", [Fds0, Threads0, Names0, Fds1, Threads1, Names1, Got]),
    %% The node and its identities: 1 + links names, before and after.
    ?assertEqual(1 + ecall_config:links(), Names0),
    ?assertEqual(Names0, Names1),
    %% A leak of one per cycle would show as 100.
    ?assert(Fds1 - Fds0 < 10),
    ?assert(Threads1 - Threads0 < 10),
    ?assert(Got > 0),
    %% The restarted node still serves: a round trip through its links.
    ok = erpc:call(C, ecall, connect, [node()]),
    hi = erpc:call(C, ecall, send, [Self, hi]),
    receive hi -> ok after 5000 -> ct:fail(lost_after_restarts) end,
    peer:stop(Peer).

%% On C: sends to `To' until killed, 100 messages per millisecond at most.
%% Unpaced, the sender outran this node's counter (a mailbox with no bound)
%% once pushes got cheaper, and the case drowned in its own load.
load_loop(To) ->
    [ecall:send(To, load) || _ <- lists:seq(1, 100)],
    timer:sleep(1),
    load_loop(To).

count_loop(N) ->
    receive
        load -> count_loop(N + 1);
        {count, From} -> From ! {counted, N}
    end.

os_counts(OsPid) ->
    Count = fun(Dir) -> {ok, L} = file:list_dir("/proc/" ++ OsPid ++ "/" ++ Dir), length(L) end,
    {Count("fd"), Count("task")}.

%% Per-caller order across switches between `!' and the links: 50 callers
%% send numbered messages without pause while the connection is closed and
%% opened again 15 times. Sends go by `!' while it is closed and through
%% the links while it is open; each caller's messages still arrive in
%% order and none twice (before, messages sent after a reconnect overtook
%% the ones still on their way by `!': 1.19 M out of order in 10 s), and
%% every one missing is one a close dropped, counted in `closed_drops'.
order_holds_across_reconnects(_Config) ->
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    ok = ecall:connect(C),
    #{closed_drops := D0} = ecall:stats(),
    N = 50,
    #{receivers := #{requests := Replayed0}} = erpc:call(C, ecall, stats, []),
    Collector = erpc:call(C, erlang, spawn, [?MODULE, order_collector, [self(), N]]),
    Self = self(),
    Callers = [spawn_link(fun() -> order_caller(Self, Collector, 1) end)
               || _ <- lists:seq(1, N)],
    %% The sleeps are the subject: how long the connection stays closed
    %% and open.
    [begin
         ok = ecall:disconnect(C),
         timer:sleep(30),
         ok = ecall:connect(C),
         timer:sleep(30)
     end || _ <- lists:seq(1, 15)],
    [P ! stop || P <- Callers],
    Result = receive {order_collected, Collector, R} -> R
             after 60000 -> ct:fail(collector_timeout)
             end,
    #{closed_drops := D1} = ecall:stats(),
    ct:pal("across 15 reconnects: ~p; dropped by closes: ~b", [Result, D1 - D0]),
    #{sent := Sent, received := Received, out_of_order := Bad} = Result,
    ?assertEqual(0, Bad),
    ?assert(Received > 0),
    ?assertEqual(Sent - Received, D1 - D0),
    %% Both paths were taken: C's receivers replayed some of the messages
    %% (more requests than the callers' N `fin's), and fewer than arrived,
    %% so `!' carried the rest.
    ok = ecall_test_nodes:sync_receivers(C),
    #{receivers := #{requests := Replayed1}} = erpc:call(C, ecall, stats, []),
    Replayed = Replayed1 - Replayed0,
    ct:pal("~b requests replayed by C's receivers", [Replayed]),
    ?assert(Replayed > N),
    ?assert(Replayed < Received),
    peer:stop(Peer).

%% Sends 1, 2, 3, ... to the collector until told to stop, then its count.
order_caller(Owner, Collector, I) ->
    receive
        stop -> ecall:send(Collector, {fin, self(), I - 1})
    after 0 ->
        ecall:send(Collector, {seq, self(), I}),
        I rem 200 =:= 0 andalso erlang:yield(),
        order_caller(Owner, Collector, I + 1)
    end.

%% On the peer: per caller, the last number seen; counts numbers that do
%% not come after it (out of order or twice). Reports when every caller
%% has sent its count.
order_collector(Owner, N) ->
    order_collect(Owner, N, #{}, #{sent => 0, received => 0, out_of_order => 0}).

order_collect(Owner, 0, _Last, Acc) ->
    Owner ! {order_collected, self(), Acc};
order_collect(Owner, N, Last, #{received := R, out_of_order := B} = Acc) ->
    receive
        {seq, From, Seq} ->
            Bad = case maps:get(From, Last, 0) of
                      Prev when Seq > Prev -> B;
                      _ -> B + 1
                  end,
            order_collect(Owner, N, Last#{From => Seq}, Acc#{received := R + 1, out_of_order := Bad});
        {fin, _From, Sent} ->
            order_collect(Owner, N - 1, Last, Acc#{sent := maps:get(sent, Acc) + Sent})
    end.

%% A sender waiting for room under `overflow => block' (the peer is
%% stopped with SIGSTOP, so its byte budget of 1 MB fills and stays full)
%% when the connection closes (ecall:disconnect/1): the close releases it,
%% and its message goes by `!'. The peer runs again once the sender is
%% released, so that the close can wait until the peer has replayed what
%% the links delivered. The peer gets every message from the blocked one
%% on (the next ones go by `!' too), all in the order sent, and what is
%% missing before the blocked one is what the close counted as dropped.
blocked_sender_goes_by_native_when_the_connection_closes(_Config) ->
    ok = application:set_env(ecall, max_queue_bytes, 1000000),
    {Peer, C} = try
                    {P, N} = start_peer(["-ecall", "discovery", "false"]),
                    ok = ecall:connect(N),
                    {P, N}
                after
                    application:unset_env(ecall, max_queue_bytes)
                end,
    Self = self(),
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, seq_log, [Self, []]]),
    Payload = binary:copy(<<"p">>, 100000),
    Sender = spawn_link(fun() -> step_sender(Self, Collector, Payload) end),
    try
        blocked_then_closed(C, Sender, Collector)
    after
        unlink(Sender),
        exit(Sender, kill),
        flush_all_traces(),
        peer:stop(Peer)
    end.

blocked_then_closed(C, Sender, Collector) ->
    Self = self(),
    OsPid = erpc:call(C, os, getpid, []),
    1 = erlang:trace_pattern({ecall_nif, wait_room, 3}, [{'_', [], [{return_trace}]}], [local]),
    1 = erlang:trace(Sender, true, [call, 'receive']),
    "" = os:cmd("kill -STOP " ++ OsPid),
    Blocked =
        try
            K = step_until_blocked(Sender, 1),
            Closer = spawn_link(fun() -> Self ! {closed, self(), ecall:disconnect(C)} end),
            receive
                {trace, Sender, 'receive', {ecall_room, _, false}} -> ok
            after 10000 -> ct:fail(sender_not_released)
            end,
            "" = os:cmd("kill -CONT " ++ OsPid),
            receive {sent, Sender, K} -> ok after 30000 -> ct:fail(blocked_send_stuck) end,
            receive {closed, Closer, ok} -> ok after 30000 -> ct:fail(close_stuck) end,
            K
        after
            erlang:trace_pattern({ecall_nif, wait_room, 3}, false, [local]),
            os:cmd("kill -CONT " ++ OsPid)
        end,
    ?assertEqual({error, not_connected}, ecall:stats(C)),
    [step(Sender, I) || I <- lists:seq(Blocked + 1, Blocked + 10)],
    Sender ! {report, Self},
    Got = receive {seq_log, Collector, L} -> L after 30000 -> ct:fail(no_log) end,
    {ok, #{closed_drops := Queued, dropped := Lost, overflow_waits := Waits}} = ecall:last_stats(C),
    Before = [I || I <- Got, I < Blocked],
    ct:pal("blocked at message ~b; ~b of those before it arrived, ~b dropped by the close, "
           "~b lost on the links", [Blocked, length(Before), Queued, Lost]),
    ?assert(Waits >= 1),
    ?assertEqual(lists:usort(Got), Got),
    ?assertEqual(lists:seq(Blocked, Blocked + 10), Got -- Before),
    ?assertEqual(Blocked - 1 - length(Before), Queued + Lost).

%% A message that a link had begun to write in fragments when the
%% connection closed is finished, not lost: the close drops what is still
%% queued, and this message was on the wire already. The peer is stopped
%% (SIGSTOP) so that the 32 MB message cannot leave before the close: the
%% sockets take a few MB of it, and the link waits in the middle. Once the
%% close has run (ecall_nif:peer_close/1 returned), the peer runs again and
%% must get the message whole. (When a closed link dropped what it had in
%% flight, the message was neither delivered nor counted.)
message_in_fragments_outlives_the_close(_Config) ->
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    ok = ecall:connect(C),
    Self = self(),
    Receiver = erpc:call(C, erlang, spawn, [?MODULE, big_receiver, [Self]]),
    OsPid = erpc:call(C, os, getpid, []),
    {ok, #{fragmented := F0}} = ecall:stats(C),
    Big = binary:copy(<<"f">>, 32 * 1024 * 1024),
    1 = erlang:trace_pattern({ecall_nif, peer_close, 1}, [{'_', [], [{return_trace}]}], [local]),
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        _ = ecall:send(Receiver, {big, Big}),
        %% The link took it and began writing it.
        ok = ecall_test_nodes:await(fragmented,
                                    fun() ->
                                            {ok, #{fragmented := F}} = ecall:stats(C),
                                            F > F0
                                    end),
        Conn = whereis(ecall_conn:name(C)),
        1 = erlang:trace(Conn, true, [call]),
        Closer = spawn_link(fun() -> Self ! {closed, self(), ecall:disconnect(C)} end),
        receive
            {trace, Conn, return_from, {ecall_nif, peer_close, 1}, ok} -> ok
        after 30000 -> ct:fail(not_closed)
        end,
        "" = os:cmd("kill -CONT " ++ OsPid),
        receive {closed, Closer, ok} -> ok after 30000 -> ct:fail(close_stuck) end
    after
        erlang:trace_pattern({ecall_nif, peer_close, 1}, false, [local]),
        os:cmd("kill -CONT " ++ OsPid),
        flush_all_traces()
    end,
    Size = byte_size(Big),
    receive
        {big, Receiver, Size} -> ok
    after 30000 ->
            ct:fail({lost, ecall:last_stats(C)})
    end,
    peer:stop(Peer).

%% On the peer: tells Owner the size of the one {big, Bin} it gets.
big_receiver(Owner) ->
    receive {big, B} -> Owner ! {big, self(), byte_size(B)} end.

flush_all_traces() ->
    receive
        T when element(1, T) =:= trace -> flush_all_traces()
    after 0 -> ok
    end.

%% Discovery (on by default) connects again, without ecall:connect/1,
%% after a nodedown and a nodeup between this node and a peer (here a
%% disconnect, then a ping): a new connection process for the peer is
%% started on its own and comes up with every link, and calls go through
%% it. Connection processes are seen start by tracing their supervisor.
discovery_reconnects_after_a_nodedown(_Config) ->
    with_conn_sup_traced(
      fun(Sup) ->
              {Peer, C} = start_named_peer(peer:random_name(rediscovered)),
              try
                  Conn1 = discovered(Sup, C),
                  Down = monitor(process, Conn1),
                  true = erlang:disconnect_node(C),
                  receive {'DOWN', Down, process, Conn1, _} -> ok
                  after 10000 -> ct:fail(conn_kept)
                  end,
                  pong = net_adm:ping(C),
                  _Conn2 = discovered(Sup, C),
                  ?assertEqual({ok, C}, ecall:call(C, erlang, node, []))
              after
                  peer:stop(Peer)
              end
      end).

%% The same after the peer restarts under its name (a new incarnation,
%% connected to this node again by a ping): the new connection comes up
%% with every link, and calls reach the new incarnation.
discovery_reconnects_after_a_restart(_Config) ->
    with_conn_sup_traced(
      fun(Sup) ->
              Name = peer:random_name(restarted),
              {Peer1, C} = start_named_peer(Name),
              OsPid1 = try
                           Conn1 = discovered(Sup, C),
                           Down = monitor(process, Conn1),
                           P = erpc:call(C, os, getpid, []),
                           peer:stop(Peer1),
                           receive {'DOWN', Down, process, Conn1, _} -> ok
                           after 30000 -> ct:fail(conn_kept)
                           end,
                           P
                       catch Class:Why:Stack ->
                           peer:stop(Peer1),
                           erlang:raise(Class, Why, Stack)
                       end,
              %% The name is free again once epmd has dropped the old
              %% incarnation's registrations (the node's, and its C-node
              %% identities'): epmd does so when it sees their connections
              %% close, which can come after peer:stop/1 returns. A node
              %% started before would find its name taken.
              ok = ecall_test_nodes:await({epmd_still_has, Name},
                                          fun() -> not registered_with_epmd(Name) end),
              {Peer2, C} = start_named_peer(Name),
              try
                  _Conn2 = discovered(Sup, C),
                  OsPid2 = erpc:call(C, os, getpid, []),
                  ?assertNotEqual(OsPid1, OsPid2),
                  ?assertEqual({ok, OsPid2}, ecall:call(C, os, getpid, []))
              after
                  peer:stop(Peer2)
              end
      end).

%% A connect of discovery's that a disconnect/1 ends is no failure: said
%% at info, not warned of. The connection process is held (suspended)
%% while discovery's connect waits on it: a process of B's joining the
%% group sends discovery there, and the connect waits on the connection
%% that is there already. disconnect/1 then closes it (a suspended process
%% still ends on a system message). With every failure warned of, this
%% case gets "cannot connect to B: normal" at warning.
discovery_is_quiet_about_a_disconnect(_Config) ->
    ?assert(ecall_config:get(discovery)),
    {Peer, B} = start_peer(),
    #{level := Level} = logger:get_primary_config(),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    ok = logger:set_primary_config(level, info),
    try
        ok = ecall:connect(B),
        Conn = whereis(ecall_conn:name(B)),
        ok = sys:suspend(Conn),
        Member = erpc:call(B, erlang, spawn, [timer, sleep, [infinity]]),
        ok = erpc:call(B, pg, join, [ecall_pg, nodes, Member]),
        %% Discovery's call (from a process of its own) in the suspended
        %% process's mailbox.
        ok = ecall_test_nodes:await(awaited, fun() -> holds(Conn, await_from(any)) end),
        ok = ecall:disconnect(B),
        Said = await_log_text(lists:flatten(io_lib:format("~p", [B]))),
        ?assertMatch({info, _}, Said),
        ?assertNotEqual(nomatch, string:find(element(2, Said), "closed (normal)"))
    after
        ok = logger:set_primary_config(level, Level),
        _ = logger:remove_handler(?MODULE),
        %% A connection process left suspended by a failure would hold up
        %% the application's stop.
        _ = [catch sys:resume(P) || P <- [whereis(ecall_conn:name(B))], is_pid(P)],
        peer:stop(Peer)
    end.

%% A connect that finds a connection up, and waits on it while it ends by
%% a nodedown it had not read when asked, opens a new one: the two nodes
%% may be connected again by then (discovery's connect, sent when the
%% peer joins again after the nodeup, meets this). Here the connection
%% process is held (suspended) with the nodedown in its mailbox, the nodes
%% are connected again, and a connect waits behind the nodedown. Without
%% a new connection, it returns `{error, nodedown}'.
connect_outlives_an_unread_nodedown(_Config) ->
    %% A peer controlled over stdio: one over distribution halts on the
    %% disconnect.
    {Peer, B} = start_named_peer(peer:random_name(nodedown_unread)),
    try
        ok = ecall:connect(B),
        Conn = whereis(ecall_conn:name(B)),
        ok = sys:suspend(Conn),
        true = erlang:disconnect_node(B),
        ok = ecall_test_nodes:await(nodedown,
                                    fun() -> holds(Conn, fun(M) -> M =:= {nodedown, B} end) end),
        pong = net_adm:ping(B),
        Self = self(),
        Connect = spawn_link(fun() -> Self ! {connected, self(), ecall:connect(B)} end),
        ok = ecall_test_nodes:await(awaited, fun() -> holds(Conn, await_from(Connect)) end),
        ok = sys:resume(Conn),
        receive {connected, Connect, Outcome} -> ?assertEqual(ok, Outcome)
        after 30000 -> ct:fail(no_outcome)
        end,
        New = whereis(ecall_conn:name(B)),
        ?assert(is_pid(New)),
        ?assertNotEqual(Conn, New),
        ?assertEqual({ok, B}, ecall:call(B, erlang, node, []))
    after
        _ = [catch sys:resume(P) || P <- [whereis(ecall_conn:name(B))], is_pid(P)],
        peer:stop(Peer)
    end.

%% Whether process Pid holds a message for which Pred holds.
holds(Pid, Pred) ->
    {messages, Ms} = process_info(Pid, messages),
    lists:any(Pred, Ms).

%% Whether a message to a connection process is a call of ecall_conn:await/1
%% from `Caller' (`any': from any process).
await_from(Caller) ->
    fun({'$gen_call', {P, _}, await}) -> Caller =:= any orelse P =:= Caller;
       (_) -> false
    end.

%% The first line at warning or info that names discovery's connect to
%% the node (`NodeText', as ~p prints it), as {Level, Text}.
await_log_text(NodeText) ->
    receive
        {log, Level, Text} when Level =:= warning; Level =:= info ->
            case string:find(Text, "connect to " ++ NodeText) of
                nomatch -> await_log_text(NodeText);
                _ -> {Level, Text}
            end
    after 10000 -> ct:fail(no_line_about_the_connect)
    end.

%% Runs Fun(Sup) with ecall_conn_sup traced for the processes it starts
%% (discovery is on here, as by default).
with_conn_sup_traced(Fun) ->
    ?assert(ecall_config:get(discovery)),
    Sup = whereis(ecall_conn_sup),
    1 = erlang:trace(Sup, true, [procs]),
    try
        Fun(Sup)
    after
        erlang:trace(Sup, false, [procs]),
        flush_all_traces()
    end.

%% Whether epmd on this host still has `Name', or one of its C-node
%% identities (`Name_ecall_K'), registered.
registered_with_epmd(Name) ->
    [_, Host] = string:split(atom_to_list(node()), "@"),
    {ok, Names} = erl_epmd:names(Host),
    Prefix = Name ++ "_ecall_",
    lists:any(fun({N, _Port}) -> N =:= Name orelse lists:prefix(Prefix, N) end, Names).

%% An OTP 25 peer running ecall under the name `Name' (on this host), with
%% the suites' settings, then connected to this node by a ping. It is
%% driven over its standard input and output, so that it outlives a
%% nodedown between the two nodes (a peer driven by distribution halts).
start_named_peer(Name) ->
    {ok, Peer, Node} = peer:start_link(#{name => Name, exec => ecall_test_nodes:node_exec(),
                                         connection => standard_io,
                                         args => ["-setcookie", atom_to_list(erlang:get_cookie())
                                                  | node_args()],
                                         wait_boot => 60000}),
    {ok, _} = peer:call(Peer, application, ensure_all_started, [ecall], 30000),
    pong = net_adm:ping(Node),
    {Peer, Node}.

%% The next connection process that ecall_conn_sup (traced) starts for
%% `Node', once it is up: it has every link up, and ecall:stats/1 and
%% ecall:connections/0 show it so.
discovered(Sup, Node) ->
    receive
        {trace, Sup, spawn, Pid, _} ->
            case ecall_conn:await(Pid) of
                ok ->
                    case ecall_conn:info(Pid) of
                        #{node := Node} ->
                            {ok, #{transport := nif, links := L, links_up := Up}} = ecall:stats(Node),
                            ?assertEqual(ecall_config:links(), Up),
                            ?assertEqual(L, Up),
                            ?assertMatch([#{transport := nif, links_up := Up}],
                                         [I || #{node := N} = I <- ecall:connections(), N =:= Node]),
                            Pid;
                        _ ->
                            discovered(Sup, Node)
                    end;
                {error, Why} ->
                    ct:fail({connection_failed, Node, Why})
            end
    after 30000 -> ct:fail({not_discovered, Node})
    end.

%% The tests' own net under every node they start (test/scripts/node.sh,
%% checked by test/scripts/with_epmd.sh): a node that dies of a crash
%% signal is written down, so that the run fails even when the node
%% crashed after its test had passed, or while it halted (two scheduler
%% threads of such nodes once died of SIGSEGV, seen only in the kernel's
%% log). A node that halts, or one a test kills (SIGKILL), is not. Each
%% node here is a port, whose exit status comes after node.sh has written
%% what it writes.
a_node_that_crashes_is_written_down(Config) ->
    Log = filename:join(?config(priv_dir, Config), "crashes"),
    Run = fun(Eval) ->
                  Port = open_port({spawn_executable, ecall_test_nodes:node_wrapper()},
                                   [{args, [os:find_executable("erl"), "-noshell", "-eval", Eval]},
                                    {env, [{"ECALL_NODE_CRASHES", Log}]}, exit_status]),
                  receive {Port, {exit_status, S}} -> S end
          end,
    Kill = fun(Signal) -> "os:cmd(\"kill -" ++ Signal ++ " \" ++ os:getpid())." end,
    ?assertEqual(0, Run("halt().")),
    ?assertEqual(137, Run(Kill("KILL"))),
    ?assertEqual({error, enoent}, file:read_file(Log)),
    ?assertEqual(139, Run(Kill("SEGV"))),
    ?assertEqual(135, Run(Kill("BUS"))),
    {ok, Text} = file:read_file(Log),
    ?assertMatch([<<"signal 11 (exit status 139): ", _/binary>>,
                  <<"signal 7 (exit status 135): ", _/binary>>],
                 binary:split(Text, <<"\n">>, [global, trim])).

%% A peer where ecall is not running, with its code but not started or
%% without its code: connecting says so in a plain term and in one warning,
%% and traffic to it still goes, by plain distribution. That traffic is
%% said once, at notice (OTP's default logger level), however much of it
%% there is: two sends, a cast and a call make one line.
a_peer_without_ecall_says_so(_Config) ->
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        Cookie = ["-setcookie", atom_to_list(erlang:get_cookie())],
        [begin
             {ok, Peer, Node} = peer:start_link(#{name => peer:random_name(no_ecall),
                                                  exec => ecall_test_nodes:node_exec(),
                                                  args => Cookie ++ Args,
                                                  wait_boot => 60000}),
             ?assertEqual({error, {ecall_not_running, Node}}, ecall:connect(Node)),
             await_warning(["ecall is not running on", atom_to_list(Node)]),
             ?assertEqual({error, not_connected}, ecall:stats(Node)),
             Init = erpc:call(Node, erlang, whereis, [init]),
             _ = ecall:send(Init, not_for_init),
             _ = ecall:send(Init, not_for_init),
             ok = ecall:cast(Node, erlang, node, []),
             ?assertEqual({ok, Node}, ecall:call(Node, erlang, node, [])),
             Plain = ["no ecall connection to", atom_to_list(Node)],
             await_log(notice, Plain),
             %% Nothing more about it (a later line would say so by now:
             %% logger handlers run in the logging process).
             ?assertEqual([], logged(Plain)),
             peer:stop(Peer)
         end || Args <- [node_args(), []]]
    after
        logger:remove_handler(?MODULE)
    end.

%% A peer that runs a release of ecall whose requests are of another
%% version is refused both ways: connect/1 answers `{error, {version,
%% V}}' on each side, this node says so once, at notice (and nothing
%% about a missing connection after it), no connection opens, and traffic
%% between them goes by plain distribution: sends, casts and calls still
%% arrive. B runs ecall; its ecall_request is rebuilt from its own code
%% with version/0 answering another number.
a_peer_of_another_version_is_refused(_Config) ->
    {Peer, B} = start_peer(["-ecall", "discovery", "false"]),
    Mine = ecall_request:version(),
    Other = Mine + 1,
    ok = load_with_version(B, Other),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        ?assertEqual({error, {version, Other}}, ecall:connect(B)),
        Said = [atom_to_list(B), "version " ++ integer_to_list(Other),
                "version " ++ integer_to_list(Mine), "plain distribution"],
        await_log(notice, Said),
        ?assertEqual({error, {version, Mine}}, erpc:call(B, ecall, connect, [node()])),
        ?assertEqual({error, {version, Other}}, ecall:connect(B)),
        ?assertEqual({error, not_connected}, ecall:stats(B)),
        ?assertEqual({error, not_connected}, erpc:call(B, ecall, stats, [node()])),
        Echo = erpc:call(B, erlang, spawn, [ecall_test_nodes, echo_loop, []]),
        Ref = make_ref(),
        _ = ecall:send(Echo, {echo, self(), Ref}),
        receive Ref -> ok after 10000 -> ct:fail(send_lost) end,
        ok = ecall:cast(B, erlang, send, [self(), {cast, Ref}]),
        receive {cast, Ref} -> ok after 10000 -> ct:fail(cast_lost) end,
        ?assertEqual({ok, B}, ecall:call(B, erlang, node, [])),
        %% Nothing more said about B: no second notice, no "no ecall
        %% connection" line (logger handlers run in the logging process,
        %% so a line would be here by now).
        ?assertEqual([], logged([atom_to_list(B)]))
    after
        logger:remove_handler(?MODULE),
        peer:stop(Peer)
    end.

%% Loads on `Node' its own ecall_request with version/0 answering
%% `Version'.
load_with_version(Node, Version) ->
    Mod = ecall_request,
    File = erpc:call(Node, code, which, [Mod]),
    {ok, {Mod, [{abstract_code, {raw_abstract_v1, Forms}}]}} =
        erpc:call(Node, beam_lib, chunks, [File, [abstract_code]]),
    New = [case F of
               {function, L, version, 0, [{clause, CL, [], [], _}]} ->
                   {function, L, version, 0, [{clause, CL, [], [], [{integer, CL, Version}]}]};
               _ ->
                   F
           end || F <- Forms],
    {ok, Mod, Bin} = compile:forms(New, [binary, return_errors]),
    {module, Mod} = erpc:call(Node, code, load_binary, [Mod, File, Bin]),
    ?assertEqual(Version, erpc:call(Node, Mod, version, [])),
    ok.

%% connect/1 gives one reason per kind of mistake, every time: a name
%% that cannot be a node raises badarg (as a non-atom does), a node that
%% is not there is `noconnection', each of three tries in a row.
connect_reasons(_Config) ->
    [?assertError(badarg, ecall:connect(Bad)) || Bad <- [foo, 'foo@', '@host', 'a@b@c', '']],
    [?assertEqual({error, noconnection}, ecall:connect('nobody@nowhere.invalid'))
     || _ <- [1, 2, 3]],
    {ok, Host} = inet:gethostname(),
    Absent = list_to_atom("ecall_absent_" ++ integer_to_list(erlang:unique_integer([positive]))
                          ++ "@" ++ Host),
    [?assertEqual({error, noconnection}, ecall:connect(Absent)) || _ <- [1, 2, 3]].

%% A bad value set at run time, for every key read after the start, is
%% refused where it is read: callers sending, casting and calling all the
%% while never crash, a connection opens on the last good values, no
%% process of ecall crashes (no crash report), and one warning per key
%% and value names the key, `{bad_config, Key, Value}' (the error a start
%% gives) and what is allowed; a second reading says nothing more.
bad_settings_at_run_time_are_refused(_Config) ->
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    ok = ecall:connect(C),
    Bad = [{shards, foo}, {max_batch_count, 0}, {max_batch_bytes, -1}, {max_queue_bytes, -5},
           {stall_timeout, -1}, {connect_timeout, 0}, {backoff_min, nope}, {backoff_max, 0},
           {gather, maybe}, {urgent, 1}, {transport, rust}],
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    Load = [spawn_monitor(fun() -> load(C) end) || _ <- lists:seq(1, 4)],
    try
        [ok = application:set_env(ecall, K, V) || {K, V} <- Bad],
        %% Read at open: the connection opens on the last good values.
        ok = ecall:disconnect(C),
        ?assertEqual(ok, ecall:connect(C)),
        %% Logged by the connection process before it published the peer.
        Said = [T || {log, warning, T} <- flush_logs()],
        [?assertMatch([_], [T || T <- Said,
                                 lists:all(fun(W) -> string:find(T, W) =/= nomatch end,
                                           ["setting " ++ atom_to_list(K) ++ " refused",
                                            lists:flatten(io_lib:format("~0p",
                                                                        [{bad_config, K, V}])),
                                            "allowed: " ++ ecall_config:allowed(K)])])
         || {K, V} <- Bad],
        %% `overflow', read at use when the budget is full: a budget of
        %% one byte (read at open) and `drop' read once, then a bad value.
        ok = application:set_env(ecall, max_queue_bytes, 1),
        ok = application:set_env(ecall, overflow, drop),
        ok = ecall:disconnect(C),
        ok = ecall:connect(C),
        {ok, #{overflow_drops := D0}} = ecall:stats(C),
        _ = ecall:send({nobody, C}, x),
        ok = application:set_env(ecall, overflow, sometimes),
        _ = ecall:send({nobody, C}, x),
        ?assertEqual(ok, ecall:cast(C, erlang, node, [])),
        ?assertEqual({error, overload}, ecall:call(C, erlang, node, [])),
        {ok, #{overflow_drops := D1}} = ecall:stats(C),
        %% These four at least (the callers of the load are refused too).
        ?assert(D1 - D0 >= 4),
        await_log(warning, ["setting overflow refused", "{bad_config,overflow,sometimes}",
                            "allowed: block, error, drop", "drop stays in force"]),
        %% Read again: nothing more said.
        _ = ecall:send({nobody, C}, x),
        ok = ecall:disconnect(C),
        ok = ecall:connect(C),
        [?assert(is_process_alive(P)) || {P, _} <- Load],
        _ = sys:get_state(ecall_log),
        Lines = [T || {log, _, T} <- flush_logs()],
        ?assertEqual([], [T || T <- Lines, string:find(T, "refused") =/= nomatch]),
        ?assertEqual([], [T || T <- Lines, string:find(T, "crash") =/= nomatch])
    after
        [application:unset_env(ecall, K) || K <- [overflow | [K || {K, _} <- Bad]]],
        logger:remove_handler(?MODULE),
        [begin P ! stop,
               receive {'DOWN', M, process, P, Why} -> ?assertEqual(normal, Why) end
         end || {P, M} <- Load],
        peer:stop(Peer)
    end.

%% A caller sending, casting and calling to `C' until told to stop.
load(C) ->
    _ = ecall:send({nobody, C}, x),
    _ = ecall:cast(C, erlang, node, []),
    _ = ecall:call(C, erlang, node, [], 1000),
    receive stop -> ok after 1 -> load(C) end.

%% A link whose peer closes its connection with nothing lost is one
%% line, a notice (and one more when it is back); a peer that stops
%% (init:stop/0) says so once per link at most, at notice (its links may
%% go down before its nodedown closes the connection, or not), and the
%% connection's close at notice: not one warning, nothing from the Rust
%% side about it.
an_orderly_shutdown_is_one_notice_per_link(_Config) ->
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    ok = ecall:connect(C),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        [Id1 | _] = ecall:identities(),
        ok = erpc:call(C, ecall_test_nodes, drop_connection, [Id1]),
        Links = ecall_config:links(),
        ok = ecall_test_nodes:await(link_back,
                                    fun() ->
                                            {ok, S} = ecall:stats(C),
                                            maps:get(disconnects, S) >= 1
                                                andalso maps:get(links_up, S) =:= Links
                                    end),
        %% The back line is said by the connection process, after the
        %% counters: a call to it brings it.
        _ = ecall:connections(),
        _ = sys:get_state(ecall_log),
        About = fun() -> [L || {log, _, T} = L <- flush_logs(),
                               string:find(T, atom_to_list(C)) =/= nomatch]
                end,
        CText = lists:flatten(io_lib:format("~p", [C])),
        ?assertEqual([{log, notice, "ecall: link 1 to " ++ CText ++ " down: peer_closed"},
                      {log, notice, "ecall: link 1 to " ++ CText ++ " is back"}],
                     About()),
        Mon = monitor(process, whereis(ecall_conn:name(C))),
        ok = erpc:call(C, init, stop, []),
        receive {'DOWN', Mon, process, _, _} -> ok after 30000 -> ct:fail(not_closed) end,
        _ = sys:get_state(ecall_log),
        Lines = About(),
        ct:pal("lines about ~p: ~p", [C, Lines]),
        Downs = [T || {log, notice, T} <- Lines, string:find(T, "down: peer_closed") =/= nomatch],
        ?assert(length(Downs) =< Links),
        ?assertEqual(length(Downs), length(lists:usort(Downs))),
        ?assertMatch([_], [T || {log, notice, T} <- Lines, string:find(T, "closed (") =/= nomatch]),
        ?assertEqual([], [L || {log, Level, _} = L <- Lines, Level =/= notice, Level =/= info,
                               Level =/= debug])
    after
        logger:remove_handler(?MODULE),
        catch peer:stop(Peer)
    end.

%% A connection coming up and closing are said at notice, with the
%% transport and the number of links, so that the default log shows which
%% path a peer's traffic takes.
connection_up_and_down_are_notices(_Config) ->
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        Links = integer_to_list(ecall_config:links()),
        ok = ecall:connect(C),
        await_log(notice, ["connected to", atom_to_list(C), "over " ++ Links ++ " links",
                           "nif transport"]),
        ok = ecall:disconnect(C),
        await_log(notice, ["connection to", atom_to_list(C), "closed", "nif transport",
                           Links ++ " links"])
    after
        logger:remove_handler(?MODULE),
        peer:stop(Peer)
    end.

%% The next log event at `Level' the suite's handler forwards that holds
%% every text of `Texts' (others are passed over).
await_log(Level, Texts) ->
    receive
        {log, Level, Text} ->
            case lists:all(fun(T) -> string:find(Text, T) =/= nomatch end, Texts) of
                true -> ok;
                false -> await_log(Level, Texts)
            end
    after 10000 -> ct:fail({no_log, Level, Texts})
    end.

%% The events forwarded so far that hold every text of `Texts'.
logged(Texts) ->
    receive
        {log, _, Text} = Log ->
            case lists:all(fun(T) -> string:find(Text, T) =/= nomatch end, Texts) of
                true -> [Log | logged(Texts)];
                false -> logged(Texts)
            end
    after 0 -> []
    end.

%% Before the application is started, info and stats say so.
not_started_says_so(_Config) ->
    {ok, Peer, Node} = peer:start_link(#{name => peer:random_name(not_started),
                                         exec => ecall_test_nodes:node_exec(),
                                         args => node_args(), wait_boot => 60000}),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, stats, [])),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, stats, [node()])),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, info, [node()])),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, last_stats, [node()])),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, connections, [])),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, connect, [node()])),
    ?assertEqual({error, not_started}, erpc:call(Node, ecall, disconnect, [node()])),
    ?assertEqual([], erpc:call(Node, ecall, identities, [])),
    [Line] = erpc:call(Node, ecall, info_lines, []),
    ?assertEqual(1, string:str(Line, "ecall is not started on")),
    ?assertEqual(ok, erpc:call(Node, ecall, info, [])),
    peer:stop(Peer),
    %% Started, the lines reach the caller as a value.
    [First | _] = ecall:info_lines(),
    ?assertEqual(1, string:str(First, "ecall on " ++ atom_to_list(node()))).

%% The next warning the suite's handler forwards that holds every text of
%% `Texts' (others are passed over).
await_warning(Texts) ->
    receive
        {log, warning, Text} ->
            case lists:all(fun(T) -> string:find(Text, T) =/= nomatch end, Texts) of
                true -> ok;
                false -> await_warning(Texts)
            end
    after 10000 -> ct:fail({no_warning, Texts})
    end.

log(#{level := Level, msg := Msg}, #{config := #{pid := Pid}}) ->
    Text = case Msg of
               {report, R} -> io_lib:format("~0p", [R]);
               {string, S} -> S;
               {F, A} -> io_lib:format(F, A)
           end,
    Pid ! {log, Level, lists:flatten(Text)}.

%% doc/configuration.md is what ecall_config:doc/0 makes of the table the
%% configuration is checked against: a key added, removed or changed
%% without `make config-doc' fails here.
configuration_doc_matches_spec(_Config) ->
    Source = proplists:get_value(source, ecall_config:module_info(compile)),
    Root = filename:dirname(filename:dirname(Source)),
    {ok, OnDisk} = file:read_file(filename:join([Root, "doc", "configuration.md"])),
    Made = unicode:characters_to_binary(ecall_config:doc()),
    ?assertEqual(Made, OnDisk),
    [?assertNotEqual(nomatch, binary:match(OnDisk, <<"| `", (atom_to_binary(K))/binary, "` |">>))
     || K <- maps:keys(ecall_config:spec())].

%% `overflow' is read at each use, as configuration.md says, not when the
%% connection opens: a connection opened with a budget of 1 byte (every
%% request overflows it) and `drop' drops a cast and says `ok'; `error'
%% set afterwards, on the same connection, makes the same cast say
%% {error, overload} at once. The budget stays the same throughout.
overflow_is_read_at_use(_Config) ->
    ?assertMatch(#{overflow := {_, _, use, _}}, ecall_config:spec()),
    ok = application:set_env(ecall, max_queue_bytes, 1),
    ok = application:set_env(ecall, overflow, drop),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try
        ok = ecall:connect(C),
        Conn = whereis(ecall_conn:name(C)),
        {ok, #{overflow_drops := D0}} = ecall:stats(C),
        ?assertEqual(ok, ecall:cast(C, erlang, node, [])),
        ?assertMatch({ok, #{overflow_drops := D1}} when D1 =:= D0 + 1, ecall:stats(C)),
        ok = application:set_env(ecall, overflow, error),
        ?assertEqual({error, overload}, ecall:cast(C, erlang, node, [])),
        %% The same connection.
        ?assertEqual(Conn, whereis(ecall_conn:name(C)))
    after
        ok = application:unset_env(ecall, max_queue_bytes),
        ok = application:unset_env(ecall, overflow),
        peer:stop(Peer)
    end.

%% `max_queue_bytes' is read when a connection opens, as
%% configuration.md says, neither at use nor only at start: set to 1 byte
%% on an open connection it changes nothing (a cast still goes, under
%% `error', which holds throughout), and the connection opened next has
%% that budget (the same cast is refused at once).
max_queue_bytes_is_read_at_open(_Config) ->
    ?assertMatch(#{max_queue_bytes := {_, _, open, _}}, ecall_config:spec()),
    ok = application:set_env(ecall, overflow, error),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try
        ok = ecall:connect(C),
        ok = application:set_env(ecall, max_queue_bytes, 1),
        ?assertEqual(ok, ecall:cast(C, erlang, node, [])),
        ok = ecall:disconnect(C),
        ok = ecall:connect(C),
        ?assertEqual({error, overload}, ecall:cast(C, erlang, node, []))
    after
        ok = application:unset_env(ecall, max_queue_bytes),
        ok = application:unset_env(ecall, overflow),
        peer:stop(Peer)
    end.

%% A peer that still holds a connection under the name of one of our
%% identities answers `alive' to that link's handshake: ecall asks it, over
%% plain distribution, to drop the old connection, and the link comes up on
%% its next attempt; connect/1 returns ok and every link carries traffic.
%% The old connection is a real node's: an `erl' under our first
%% identity's name that does not listen (`-dist_listen false', so it needs
%% no name in epmd) and connects to C first, as a previous connection of
%% that identity that C has not seen die would be there. It tells on its
%% standard output when C drops it. Without the drop the link meets
%% `alive' at every attempt and connect/1 times out.
a_stale_connection_is_dropped_and_the_link_comes_up(_Config) ->
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    [Id | _] = ecall:identities(),
    Old = stale_holder(Id, C),
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try
        receive {Old, {data, {eol, "connected"}}} -> ok
        after 30000 -> ct:fail(old_connection_not_made)
        end,
        ok = ecall_test_nodes:await({held, Id},
                                    fun() -> lists:member(Id, erpc:call(C, erlang, nodes, [hidden])) end),
        ?assertEqual(ok, ecall:connect(C)),
        await_warning([lists:flatten(io_lib:format("to ~p down: alive", [C]))]),
        receive {Old, {data, {eol, "dropped"}}} -> ok
        after 30000 -> ct:fail(old_connection_kept)
        end,
        {ok, #{links := Links, links_up := Links}} = ecall:stats(C),
        ?assertEqual(Links, ecall_test_nodes:flush_links(C)),
        ?assertEqual({ok, C}, ecall:call(C, erlang, node, []))
    after
        _ = logger:remove_handler(?MODULE),
        peer:stop(Peer)
    end.

%% An `erl' named as our identity `Id' that connects to `C' without
%% listening, says `connected', then `dropped' when C drops it, and halts
%% (also if it cannot connect, or when C goes). Its port.
stale_holder(Id, C) ->
    [Name, _Host] = string:split(atom_to_list(Id), "@"),
    Eval = lists:flatten(io_lib:format(
             "case net_kernel:connect_node(~p) of "
             "true -> erlang:monitor_node(~p, true), io:format(\"connected~~n\"), "
             "receive {nodedown, _} -> io:format(\"dropped~~n\") end, halt(); "
             "_ -> io:format(\"failed~~n\"), halt(1) end.", [C, C])),
    {Exec, Pre} = ecall_test_nodes:node_exec(),
    open_port({spawn_executable, Exec},
              [{args, Pre ++ ["-sname", Name, "-hidden", "-dist_listen", "false",
                              "-setcookie", atom_to_list(erlang:get_cookie()),
                              "-noshell", "-eval", Eval]},
               {line, 4096}, exit_status, stderr_to_stdout]).
