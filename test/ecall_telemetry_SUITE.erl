%% Telemetry events, the last stats of a closed peer, named per-link stats,
%% ecall:info/0,1 and the log lines, on real nodes; and what connections do
%% on their own, seen through those events: discovery's connects, and a
%% connect that gives up at `connect_timeout'.
%%
%% `telemetry' cannot be fetched here: this node loads a stand-in module of
%% that name (built in init_per_suite, never on the peers' code path) whose
%% execute/3 forwards every event to the process registered as
%% `ecall_telemetry_sink' (each case registers itself). The peers run
%% without it, as the other suites do: that is the absent case. The
%% stand-in is acceptable only because telemetry is not what these cases
%% test: ecall is.
-module(ecall_telemetry_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([connection_links_stats_and_info/1, link_down_and_back/1,
         reap_and_close_count_drops/1, overflow_drops_are_events/1,
         periodic_stats/1, absent_telemetry_is_harmless/1, bad_arguments/1,
         discovery_connects_on_its_own/1, connect_gives_up_at_connect_timeout/1,
         last_stats_keeps_the_last_1000_peers/1, crashing_handler_is_harmless/1,
         exception_through_telemetry_is_harmless/1]).
%% A telemetry handler that crashes.
-export([crash/4]).
%% logger handler: forwards ecall's Erlang-side events to the test process.
-export([log/2]).
%% Run on peers.
-export([forward_link_events/2]).

-import(ecall_test_nodes, [start_peer/1, flush_traces/0]).

-define(SINK, ecall_telemetry_sink).
%% The stand-in's handlers (a public bag a case makes: {Event, Id, Fun, Config}).
-define(HANDLERS, telemetry_stand_in_handlers).
%% An upper bound on waiting for an event, never a pause.
-define(WAIT, 10000).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [connection_links_stats_and_info, link_down_and_back, reap_and_close_count_drops,
     overflow_drops_are_events, periodic_stats, absent_telemetry_is_harmless, bad_arguments,
     discovery_connects_on_its_own, connect_gives_up_at_connect_timeout,
     last_stats_keeps_the_last_1000_peers, crashing_handler_is_harmless,
     exception_through_telemetry_is_harmless].

init_per_suite(Config) ->
    ok = load_stand_in(),
    ok = ecall_test_nodes:start_ecall(),
    %% ecall checked for telemetry when it started.
    true = ecall_telemetry:available(),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall),
    %% Leave the node as other suites expect it: no telemetry.
    _ = code:purge(telemetry),
    true = code:delete(telemetry),
    _ = code:purge(telemetry),
    false = ecall_telemetry:refresh(),
    ok.

%% The stand-in: telemetry:execute/3, forwarding to the sink if there is
%% one, then calling the handlers attached with attach/4 (kept in the
%% table ?HANDLERS, when a case made one) as telemetry 1.x does: each in
%% the emitting process, and one that fails (raises, exits or throws) is
%% detached and never reaches the emitter. That catch is telemetry's, not
%% ecall's: ecall's docs rely on it. A handler attached with an id
%% `{raw, _}' runs outside that catch: what a telemetry that let an
%% exception through would do to the emitter.
load_stand_in() ->
    Src = "-module(telemetry).\n"
          "-export([execute/3, attach/4, detach/1]).\n"
          "execute(Event, Measurements, Metadata) ->\n"
          "    case whereis(" ++ atom_to_list(?SINK) ++ ") of\n"
          "        undefined -> ok;\n"
          "        Pid -> Pid ! {telemetry, Event, Measurements, Metadata}, ok\n"
          "    end,\n"
          "    Handlers = try ets:lookup(" ++ atom_to_list(?HANDLERS) ++ ", Event)\n"
          "               catch error:badarg -> [] end,\n"
          "    lists:foreach(\n"
          "      fun({_, {raw, _}, Fun, Config}) -> Fun(Event, Measurements, Metadata, Config);\n"
          "         ({_, Id, Fun, Config}) ->\n"
          "          try Fun(Event, Measurements, Metadata, Config)\n"
          "          catch _:_ -> detach(Id)\n"
          "          end\n"
          "      end, Handlers).\n"
          "attach(Id, Event, Fun, Config) ->\n"
          "    true = ets:insert(" ++ atom_to_list(?HANDLERS) ++ ", {Event, Id, Fun, Config}),\n"
          "    ok.\n"
          "detach(Id) ->\n"
          "    true = ets:match_delete(" ++ atom_to_list(?HANDLERS) ++ ", {'_', Id, '_', '_'}),\n"
          "    ok.\n",
    {ok, Tokens, _} = erl_scan:string(Src),
    Forms = [begin {ok, F} = erl_parse:parse_form(T), F end || T <- split_forms(Tokens, [])],
    {ok, telemetry, Bin} = compile:forms(Forms, [return_errors]),
    {module, telemetry} = code:load_binary(telemetry, "telemetry_stand_in.erl", Bin),
    ok.

split_forms([], []) -> [];
split_forms([{dot, _} = Dot | Rest], Acc) -> [lists:reverse([Dot | Acc]) | split_forms(Rest, [])];
split_forms([T | Rest], Acc) -> split_forms(Rest, [T | Acc]).

%% A peer with discovery off, so that only the connection made here exists.
peer_node() ->
    start_peer(["-ecall", "discovery", "false"]).

sink() ->
    true = register(?SINK, self()),
    ok.

%% Connects to `Peer' and takes the events of the connect: the link ups
%% come before the connection's up, from the same process.
connect(Peer) ->
    ok = ecall:connect(Peer),
    _ = event([ecall, connection, up], Peer),
    flush_link_ups(Peer).

flush_link_ups(Peer) ->
    receive {telemetry, [ecall, link, up], _, #{peer := Peer}} -> flush_link_ups(Peer)
    after 0 -> ok
    end.

%% Waits for one event `Event' about `Peer'; others are left alone.
event(Event, Peer) ->
    receive
        {telemetry, Event, M, #{peer := Peer} = Meta} -> {M, Meta}
    after ?WAIT -> ct:fail({no_event, Event, Peer})
    end.

%% Connecting emits a link up per link, then connection up; measure/0 emits
%% the peer's stats, each link's and the receivers'; stats name each link;
%% info/0,1 print the peer; a disconnect emits down and close, and leaves
%% the last stats readable.
connection_links_stats_and_info(_Config) ->
    ok = sink(),
    {Peer, C} = peer_node(),
    ok = ecall:connect(C),
    Links = ecall_config:links(),
    Up = lists:sort([maps:get(link, element(2, event([ecall, link, up], C)))
                     || _ <- lists:seq(1, Links)]),
    ?assertEqual(lists:seq(1, Links), Up),
    {#{duration := D, links := Links}, #{transport := nif}} = event([ecall, connection, up], C),
    ?assert(is_integer(D) andalso D > 0),
    %% Some traffic, so that the counters are not all zero.
    Self = self(),
    Echo = erpc:call(C, erlang, spawn, [fun() -> receive {ping, P} -> P ! pong end end]),
    {ping, Self} = ecall:send(Echo, {ping, Self}),
    receive pong -> ok after ?WAIT -> ct:fail(no_pong) end,
    {ok, Stats} = ecall:stats(C),
    ?assertEqual(lists:seq(1, Links), [K || #{link := K} <- maps:get(per_link, Stats)]),
    ok = ecall_telemetry:measure(),
    {M, #{transport := nif}} = event([ecall, stats], C),
    ct:pal("stats measurement: ~p", [M]),
    ?assertMatch(#{queued_bytes := _, batches := _, requests := _, pushed := _,
                   avg_batch_size := _}, M),
    ?assert(maps:get(pushed, M) >= 1),
    ?assertEqual(#{}, maps:filter(fun(_, V) -> not is_number(V) end, M)),
    ?assertNot(maps:is_key(per_link, M)),
    LinkStats = lists:sort([{maps:get(link, Meta), LM}
                            || {LM, Meta} <- [event([ecall, link, stats], C)
                                              || _ <- lists:seq(1, Links)]]),
    ?assertEqual(lists:seq(1, Links), [K || {K, _} <- LinkStats]),
    [?assertMatch(#{batches := _, writes := _, up := 1}, LM) || {_, LM} <- LinkStats],
    receive
        {telemetry, [ecall, receivers, stats], #{batches := _, requests := _}, #{}} -> ok
    after ?WAIT -> ct:fail(no_receivers_stats)
    end,
    ?assertEqual(ok, ecall_telemetry:measure(C)),
    _ = event([ecall, stats], C),
    %% info prints the peer and its links.
    Printed = capture(fun() -> ok = ecall:info(), ok = ecall:info(C) end),
    ct:pal("~ts", [Printed]),
    Name = lists:flatten(io_lib:format("~p", [C])),
    ?assertEqual(2, length(string:split(Printed, "peer " ++ Name, all)) - 1),
    ?assertMatch([_, _ | _], string:split(Printed, "link 1: up")),
    %% Closing.
    ?assertEqual({error, not_found}, ecall:last_stats(C)),
    ok = ecall:disconnect(C),
    {#{duration := _}, #{reason := normal, transport := nif}} = event([ecall, connection, down], C),
    {#{closed_drops := 0, dropped := 0, duration := _}, #{reason := normal}} =
        event([ecall, connection, close], C),
    {ok, Last} = ecall:last_stats(C),
    ?assertMatch(#{state := closed, reason := normal, closed_drops := 0, closed_at := _,
                   per_link := [#{link := 1} | _]}, Last),
    ?assertEqual(maps:get(pushed, Stats), maps:get(pushed, Last)),
    ?assertEqual({error, not_connected}, ecall:stats(C)),
    %% info of a closed peer prints its last close.
    Closed = capture(fun() -> ok = ecall:info(C) end),
    ?assertMatch([_, _ | _], string:split(Closed, "peer " ++ Name ++ ": closed")),
    peer:stop(Peer).

capture(Fun) ->
    ct:capture_start(),
    try Fun()
    after ct:capture_stop()
    end,
    lists:flatten(ct:capture_get()).

%% A link the peer drops: link down with its typed reason and number, and
%% link up when it is back.
link_down_and_back(_Config) ->
    ok = sink(),
    {Peer, C} = peer_node(),
    ok = connect(C),
    [Id1 | _] = ecall:identities(),
    ok = erpc:call(C, ecall_test_nodes, drop_connection, [Id1]),
    {_, #{link := 1, reason := Reason, retry := false}} = event([ecall, link, down], C),
    ?assert(Reason =:= peer_closed orelse element(1, Reason) =:= read),
    {_, #{link := 1}} = event([ecall, link, up], C),
    ok = ecall:disconnect(C),
    peer:stop(Peer).

%% A stalled peer (SIGSTOP): the link is reaped (link down `stalled' and
%% reap) and loses nothing: what it wrote is kept until acknowledged. What
%% is sent after stays queued behind the link that cannot reconnect. The
%% close (the peer still stopped) can write nothing out: it drops what is
%% queued and counts what was written and never acknowledged as
%% `unconfirmed'; close event, last stats and one log line carry the
%% counts, and they account for every push.
reap_and_close_count_drops(_Config) ->
    ok = sink(),
    ok = application:set_env(ecall, stall_timeout, 1000),
    {Peer, C} = peer_node(),
    try ok = connect(C)
    after application:unset_env(ecall, stall_timeout)
    end,
    OsPid = erpc:call(C, os, getpid, []),
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    After = 50,
    %% The handler goes, and the peer runs again, whatever happens.
    try
        ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
        "" = os:cmd("kill -STOP " ++ OsPid),
        %% 30 MB from this process (one shard, one link): far more than
        %% the loopback socket buffers hold.
        Chunk = binary:copy(<<"s">>, 100000),
        [ecall:send(Sink, Chunk) || _ <- lists:seq(1, 300)],
        {_, #{link := K, reason := stalled}} = event([ecall, link, reap], C),
        {_, #{link := K, reason := stalled, retry := false}} = event([ecall, link, down], C),
        [{tail, I} = ecall:send(Sink, {tail, I}) || I <- lists:seq(1, After)],
        ok = ecall:disconnect(C)
    after
        os:cmd("kill -CONT " ++ OsPid),
        logger:remove_handler(?MODULE)
    end,
    {_, #{reason := normal}} = event([ecall, connection, down], C),
    {#{closed_drops := Queued, dropped := Lost, unconfirmed := Unconfirmed}, _} =
        event([ecall, connection, close], C),
    ct:pal("close: ~b queued dropped, ~b lost before, ~b unconfirmed",
           [Queued, Lost, Unconfirmed]),
    %% The tail is still queued at the close, behind what the reap kept.
    ?assert(Queued >= After),
    ?assertEqual(0, Lost),
    ?assert(Unconfirmed > 0),
    {ok, Last} = ecall:last_stats(C),
    ?assertMatch(#{state := closed, closed_drops := Queued, stalls := S,
                   unconfirmed := Unconfirmed} when S >= 1, Last),
    #{pushed := Pushed} = Last,
    ?assertEqual(300 + After, Pushed),
    ?assertEqual(Pushed, Queued + Unconfirmed),
    Line = close_line(lists:flatten(io_lib:format("connection to ~p closed", [C]))),
    ct:pal("logged: ~ts", [Line]),
    ?assertNotEqual(nomatch, string:find(Line, integer_to_list(Queued) ++ " queued requests dropped")),
    ?assertNotEqual(nomatch, string:find(Line, integer_to_list(Unconfirmed) ++ " written and not acknowledged")),
    flush_traces(),
    peer:stop(Peer).

%% The log line of the close (ecall's other lines are skipped).
close_line(Prefix) ->
    receive
        {ecall_log, notice, Text} ->
            case string:find(Text, Prefix) of
                nomatch -> close_line(Prefix);
                _ -> Text
            end
    after ?WAIT -> ct:fail(no_close_log_line)
    end.

%% logger handler: ecall's own (Erlang-side) events, those of its
%% modules.
log(#{level := Level, msg := {Format, Args}, meta := #{mfa := {ecall_conn, _, _}}},
    #{config := #{pid := Pid}}) ->
    Pid ! {ecall_log, Level, lists:flatten(io_lib:format(Format, Args))};
log(_Event, _Config) ->
    ok.

%% Requests refused for want of room (a request larger than the whole
%% budget never fits): one overflow_drop event per count, with the kind of
%% request and the policy.
overflow_drops_are_events(_Config) ->
    ok = sink(),
    Budget = 100000,
    ok = application:set_env(ecall, max_queue_bytes, Budget),
    {Peer, C} = peer_node(),
    try ok = connect(C)
    after application:unset_env(ecall, max_queue_bytes)
    end,
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    Huge = binary:copy(<<"h">>, 2 * Budget),
    try
        ok = application:set_env(ecall, overflow, drop),
        ?assertEqual(ok, ecall:cast(C, erlang, send, [Sink, Huge])),
        {#{count := 1}, #{kind := cast, policy := drop}} =
            event([ecall, request, overflow_drop], C),
        ?assertEqual(Huge, ecall:send(Sink, Huge)),
        {#{count := 1}, #{kind := send, policy := drop}} =
            event([ecall, request, overflow_drop], C),
        ok = application:set_env(ecall, overflow, error),
        ?assertEqual({error, overload}, ecall:call(C, ecall_test_nodes, echo, [Huge], 1000)),
        {#{count := 1}, #{kind := call, policy := error}} =
            event([ecall, request, overflow_drop], C)
    after
        application:unset_env(ecall, overflow)
    end,
    ?assertMatch({ok, #{overflow_drops := 3}}, ecall:stats(C)),
    ok = ecall:disconnect(C),
    peer:stop(Peer).

%% `telemetry_interval' is checked like every setting, and when set the
%% peers' stats come on their own, again and again. Whatever happens, the
%% setting goes and ecall runs again without it: the suites share this
%% node.
periodic_stats(_Config) ->
    try
        [begin
             ok = application:set_env(ecall, telemetry_interval, Bad),
             ?assertEqual({error, {bad_config, telemetry_interval, Bad}}, ecall_config:validate())
         end || Bad <- [0, -5, never, 1.5]],
        ok = application:stop(ecall),
        ok = application:set_env(ecall, telemetry_interval, 100),
        ok = ecall_test_nodes:start_ecall(),
        ok = sink(),
        {Peer, C} = peer_node(),
        ok = ecall:connect(C),
        {#{queued_bytes := _}, _} = event([ecall, stats], C),
        {#{queued_bytes := _}, _} = event([ecall, stats], C),
        ok = ecall:disconnect(C),
        peer:stop(Peer)
    after
        %% Not running if the start above failed.
        _ = application:stop(ecall),
        application:unset_env(ecall, telemetry_interval),
        ok = ecall_test_nodes:start_ecall()
    end.

%% A node without telemetry (the peers) connects, measures, prints, closes
%% and keeps the last stats; nothing crashes.
absent_telemetry_is_harmless(_Config) ->
    {Peer, C} = peer_node(),
    ?assertEqual(false, erpc:call(C, ecall_telemetry, available, [])),
    Conn = {ecall_conn:name(node()), C},
    ok = erpc:call(C, ecall, connect, [node()]),
    ConnPid = erpc:call(C, erlang, whereis, [element(1, Conn)]),
    ?assertEqual(ok, erpc:call(C, ecall_telemetry, measure, [])),
    ?assertEqual(ok, erpc:call(C, ecall_event, execute, [[ecall, test], #{}, #{}])),
    _ = capture(fun() -> ok = erpc:call(C, ecall, info, []) end),
    %% A link down and back, on the peer's side: its connection process
    %% handles both events and lives on.
    Self = self(),
    _ = erpc:call(C, erlang, spawn, [?MODULE, forward_link_events, [Self, ConnPid]]),
    receive {tracing, ConnPid} -> ok after ?WAIT -> ct:fail(no_tracer) end,
    [Id1 | _] = erpc:call(C, ecall, identities, []),
    ok = ecall_test_nodes:drop_connection(Id1),
    receive {ecall_link, 0, {down, _}} -> ok after ?WAIT -> ct:fail(no_link_down) end,
    receive {ecall_link, 0, up} -> ok after ?WAIT -> ct:fail(no_link_up) end,
    %% Answered after both events: they were handled.
    ?assertMatch(#{links_up := 2}, erpc:call(C, ecall_conn, info, [ConnPid])),
    ok = erpc:call(C, ecall, disconnect, [node()]),
    ?assertMatch({ok, #{state := closed}}, erpc:call(C, ecall, last_stats, [node()])),
    peer:stop(Peer).

%% On a peer: forwards the link events its connection process `Conn'
%% receives to `Owner' (a tracer must be local to what it traces).
forward_link_events(Owner, Conn) ->
    erlang:trace(Conn, true, ['receive']),
    Owner ! {tracing, Conn},
    forward(Owner, Conn).

forward(Owner, Conn) ->
    receive
        {trace, Conn, 'receive', {ecall_link, _, _} = E} -> Owner ! E;
        _ -> ok
    end,
    forward(Owner, Conn).

bad_arguments(_Config) ->
    ?assertError(badarg, ecall:last_stats("node")),
    ?assertError(badarg, ecall:info(42)),
    ?assertError(badarg, ecall_telemetry:measure(<<"n">>)),
    ?assertEqual({error, not_found}, ecall:last_stats('nobody@nowhere')),
    ?assertEqual({error, not_connected}, ecall:info('nobody@nowhere')),
    ?assertEqual({error, not_connected}, ecall_telemetry:measure('nobody@nowhere')).

%% Discovery: two nodes running ecall with `discovery' left on (the
%% default: neither this node nor the peer sets it), connected by
%% distribution alone (the peer dials this node as it boots, and its ecall
%% is started by an erpc call), open ecall connections to each other
%% without anyone calling ecall:connect/1. This node's connection to the
%% peer comes up on the links (its [ecall, connection, up] event), and the
%% peer's connection to this node does too.
discovery_connects_on_its_own(_Config) ->
    ok = sink(),
    ?assert(ecall_config:get(discovery)),
    {Peer, C} = start_peer([]),
    try
        ?assert(erpc:call(C, ecall_config, get, [discovery])),
        {#{links := Links}, #{transport := nif}} = event([ecall, connection, up], C),
        ?assertMatch({ok, #{transport := nif, links_up := Links}}, ecall:stats(C)),
        %% The peer has no telemetry: its side is polled, within a bound.
        ?assertMatch({ok, #{transport := nif, links_up := Links}},
                     poll(fun() -> erpc:call(C, ecall, stats, [node()]) end,
                          fun({ok, #{transport := nif, links_up := L}}) -> L =:= Links;
                             (_) -> false
                          end))
    after
        peer:stop(Peer)
    end.

%% `connect_timeout': a peer whose links cannot come up in time. The peer
%% runs and its ecall answers (the hello goes over the distribution
%% connection that is already up), but its net_kernel is suspended, so no
%% new distribution connection, and a link is one, gets through its
%% handshake there. ecall:connect/1 returns {error, timeout} once
%% `connect_timeout' has passed; the attempt ends with [ecall, connection,
%% failed], reason `timeout' (never `up'), then its close, and the last
%% stats say `timeout' too. Resumed, the same peer connects at once.
connect_gives_up_at_connect_timeout(_Config) ->
    ok = sink(),
    {Peer, C} = peer_node(),
    Timeout = 500,
    %% The setting goes, and the peer's net_kernel runs again, whatever
    %% happens.
    try
        ok = application:set_env(ecall, connect_timeout, Timeout),
        ok = erpc:call(C, sys, suspend, [net_kernel]),
        T0 = erlang:monotonic_time(millisecond),
        %% Bounded: a connect that never gives up fails here, not at the
        %% timetrap.
        ?assertEqual({error, timeout}, bounded_connect(C, Timeout + ?WAIT)),
        Ms = erlang:monotonic_time(millisecond) - T0,
        ct:pal("connect gave up after ~b ms", [Ms]),
        ?assert(Ms >= Timeout),
        {#{duration := D}, #{reason := timeout, transport := nif}} =
            event([ecall, connection, failed], C),
        ?assert(erlang:convert_time_unit(D, native, millisecond) >= Timeout),
        {#{closed_drops := 0, dropped := 0}, #{reason := timeout}} =
            event([ecall, connection, close], C),
        receive
            {telemetry, [ecall, connection, up], _, #{peer := C}} -> ct:fail(came_up)
        after 0 -> ok
        end,
        ?assertMatch({ok, #{state := closed, reason := timeout}}, ecall:last_stats(C)),
        ?assertEqual({error, not_connected}, ecall:stats(C))
    after
        application:unset_env(ecall, connect_timeout),
        ok = erpc:call(C, sys, resume, [net_kernel])
    end,
    ok = connect(C),
    ?assertMatch({ok, #{transport := nif}}, ecall:stats(C)),
    ok = ecall:disconnect(C),
    %% A peer that does not answer at all (its OS process stopped): the
    %% opening call times out too, and that is a timeout, not a peer
    %% without ecall.
    OsPid = erpc:call(C, os, getpid, []),
    try
        ok = application:set_env(ecall, connect_timeout, Timeout),
        [] = os:cmd("kill -STOP " ++ OsPid),
        ?assertEqual({error, timeout}, bounded_connect(C, Timeout + ?WAIT)),
        {_, #{reason := timeout}} = event([ecall, connection, failed], C)
    after
        application:unset_env(ecall, connect_timeout),
        os:cmd("kill -CONT " ++ OsPid)
    end,
    peer:stop(Peer).

%% ecall:connect(Node)'s result, or a failure after `Limit' ms.
bounded_connect(Node, Limit) ->
    {Pid, Mref} = spawn_monitor(fun() -> exit({connected, ecall:connect(Node)}) end),
    receive
        {'DOWN', Mref, process, Pid, {connected, Result}} -> Result
    after Limit ->
        exit(Pid, kill),
        ct:fail({connect_did_not_return, Limit})
    end.

%% Fun() again, every 20 ms, until Done(Result) or ?WAIT ms have passed;
%% the last result.
poll(Fun, Done) ->
    poll(Fun, Done, erlang:monotonic_time(millisecond) + ?WAIT).

poll(Fun, Done, Deadline) ->
    Result = Fun(),
    case Done(Result) orelse erlang:monotonic_time(millisecond) > Deadline of
        true -> Result;
        false -> receive after 20 -> poll(Fun, Done, Deadline) end
    end.

%% ecall:last_stats/1 keeps the last stats of the last 1,000 peers that
%% closed, as its edoc says, dropping the oldest close first: a real peer
%% whose connection closed is still there after 999 more peers closed, and
%% gone after the 1,000th, while the first of those stays; a new close of
%% it keeps it again (in place of the oldest). The 1,000 other peers are
%% names that never existed, their closes written down as a closing
%% connection does (ecall_conn_sup:keep_last/2): 1,000 real nodes are not
%% affordable here. They are taken out again at the end (and the closes of
%% earlier cases' peers at the start).
last_stats_keeps_the_last_1000_peers(_Config) ->
    {Peer, C} = peer_node(),
    Others = [list_to_atom("closed_" ++ integer_to_list(I) ++ "@nowhere") || I <- lists:seq(1, 1000)],
    try
        %% The closes of earlier cases' peers would be older than C's.
        true = ets:delete_all_objects(ecall_last_stats),
        ok = ecall:connect(C),
        ok = ecall:disconnect(C),
        {ok, #{state := closed, reason := normal}} = ecall:last_stats(C),
        ?assertEqual(1, length(ets:tab2list(ecall_last_stats))),
        Filler = lists:sublist(Others, 999),
        [ok = ecall_conn_sup:keep_last(N, #{state => closed, reason => normal}) || N <- Filler],
        %% 1,000 kept, C's the oldest of them.
        ?assertEqual(1000, length(ets:tab2list(ecall_last_stats))),
        ?assertMatch({ok, #{state := closed}}, ecall:last_stats(C)),
        [Next | _] = Others -- Filler,
        ok = ecall_conn_sup:keep_last(Next, #{state => closed, reason => normal}),
        ?assertEqual(1000, length(ets:tab2list(ecall_last_stats))),
        ?assertEqual({error, not_found}, ecall:last_stats(C)),
        ?assertMatch({ok, _}, ecall:last_stats(hd(Filler))),
        ?assertMatch({ok, _}, ecall:last_stats(Next)),
        %% Closed again: kept again, in place of the oldest.
        ok = ecall:connect(C),
        ok = ecall:disconnect(C),
        ?assertMatch({ok, #{state := closed, reason := normal}}, ecall:last_stats(C)),
        ?assertEqual(1000, length(ets:tab2list(ecall_last_stats))),
        ?assertEqual({error, not_found}, ecall:last_stats(hd(Filler)))
    after
        [ets:delete(ecall_last_stats, N) || N <- Others],
        peer:stop(Peer)
    end.

%% A handler that crashes, attached to every event ecall emits here, so
%% that it crashes in each process that emits one: the connection process
%% (link up and down, connection up, down and close), a caller refused for
%% want of room (overflow drop), and whoever measures (stats, link stats,
%% receivers stats). One handler per event, each failing in its own way
%% (raise, exit, throw), and each reports where it ran before it fails.
%%
%% ecall goes on as if no handler were there: the connect, a send, a
%% cast and a call return what they always return, the refused send
%% returns its message, the link that went down comes back, the close
%% counts no drops, the connection process ends only with the disconnect,
%% and with the reason `normal'; every ecall process that ran before the
%% case still runs (none died, none was restarted). Events go on to the
%% sink after each crash (the second link's up, the link's return). As
%% the docs say, telemetry detaches a handler that crashed: each one ran
%% once, although link up, link stats and the others came again.
crashing_handler_is_harmless(_Config) ->
    ok = sink(),
    Self = self(),
    Before = ecall_processes(),
    ?HANDLERS = ets:new(?HANDLERS, [named_table, public, bag]),
    Events = [[ecall, link, up], [ecall, link, down], [ecall, connection, up],
              [ecall, connection, down], [ecall, connection, close],
              [ecall, request, overflow_drop], [ecall, stats], [ecall, link, stats],
              [ecall, receivers, stats]],
    Classes = [error, exit, throw],
    _ = [ok = telemetry:attach({crash, E}, E, fun ?MODULE:crash/4,
                               {Self, lists:nth(1 + I rem 3, Classes)})
         || {I, E} <- lists:enumerate(Events)],
    Budget = 100000,
    ok = application:set_env(ecall, max_queue_bytes, Budget),
    {Peer, C} = peer_node(),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, max_queue_bytes)
    end,
    Conn = whereis(ecall_conn:name(C)),
    ConnRef = monitor(process, Conn),
    Links = ecall_config:links(),
    ?assert(Links >= 2),
    %% The first link's up crashed the handler in the connection process;
    %% the others' came after it, and so did the connection's up.
    ok = crashed([ecall, link, up], Conn),
    ok = crashed([ecall, connection, up], Conn),
    _ = [event([ecall, link, up], C) || _ <- lists:seq(1, Links)],
    _ = event([ecall, connection, up], C),
    %% Sends, casts and calls.
    Echo = erpc:call(C, erlang, spawn, [fun() -> receive {ping, P} -> P ! pong end end]),
    ?assertEqual({ping, Self}, ecall:send(Echo, {ping, Self})),
    receive pong -> ok after ?WAIT -> ct:fail(no_pong) end,
    ?assertEqual(ok, ecall:cast(C, ecall_test_nodes, tell, [Self, cast_ran])),
    receive cast_ran -> ok after ?WAIT -> ct:fail(no_cast) end,
    ?assertEqual({ok, C}, ecall:call(C, ecall_test_nodes, whoami, [], ?WAIT)),
    %% A send refused for want of room (larger than the whole budget),
    %% from a caller of its own: it returns its message and lives on.
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    Huge = binary:copy(<<"h">>, 2 * Budget),
    Refused = try
                  ok = application:set_env(ecall, overflow, drop),
                  in_process(fun() -> ecall:send(Sink, Huge) end)
              after
                  application:unset_env(ecall, overflow)
              end,
    ?assertMatch({Pid, Huge} when is_pid(Pid), Refused),
    ok = crashed([ecall, request, overflow_drop], element(1, Refused)),
    {#{count := 1}, #{kind := send}} = event([ecall, request, overflow_drop], C),
    %% Measuring, from a process of its own: every event was emitted.
    {Measurer, ok} = in_process(fun ecall_telemetry:measure/0),
    ok = crashed([ecall, stats], Measurer),
    ok = crashed([ecall, link, stats], Measurer),
    ok = crashed([ecall, receivers, stats], Measurer),
    _ = event([ecall, stats], C),
    _ = [event([ecall, link, stats], C) || _ <- lists:seq(1, Links)],
    %% A link the peer drops: down (the crash), then back.
    [Id1 | _] = ecall:identities(),
    ok = erpc:call(C, ecall_test_nodes, drop_connection, [Id1]),
    ok = crashed([ecall, link, down], Conn),
    {_, #{link := 1}} = event([ecall, link, down], C),
    {_, #{link := 1}} = event([ecall, link, up], C),
    ?assertEqual({ok, C}, ecall:call(C, ecall_test_nodes, whoami, [], ?WAIT)),
    ?assertMatch({ok, #{overflow_drops := 1, links_up := Links}}, ecall:stats(C)),
    %% The close: down and close crash in the connection process, which
    %% ends as a disconnect ends it.
    ok = ecall:disconnect(C),
    ok = crashed([ecall, connection, down], Conn),
    ok = crashed([ecall, connection, close], Conn),
    {#{closed_drops := 0, dropped := 0}, #{reason := normal}} =
        event([ecall, connection, close], C),
    receive {'DOWN', ConnRef, process, Conn, Why} -> ?assertEqual(normal, Why)
    after ?WAIT -> ct:fail(connection_process_lives_on)
    end,
    ?assertMatch({ok, #{state := closed, reason := normal, closed_drops := 0}},
                 ecall:last_stats(C)),
    %% Detached: no handler ran twice.
    receive {crashed, E2, Where} -> ct:fail({ran_again, E2, Where})
    after 0 -> ok
    end,
    ?assertEqual([], [P || P <- Before, not is_process_alive(P)]),
    ets:delete(?HANDLERS),
    peer:stop(Peer).

%% An exception that comes out of telemetry:execute/3 itself (a handler
%% telemetry did not catch) stops at ecall's emit: the connection process
%% that emits link and connection events connects, carries a call and
%% closes as without it.
exception_through_telemetry_is_harmless(_Config) ->
    Self = self(),
    ?HANDLERS = ets:new(?HANDLERS, [named_table, public, bag]),
    Events = [[ecall, link, up], [ecall, connection, up], [ecall, connection, down],
              [ecall, connection, close]],
    _ = [ok = telemetry:attach({raw, E}, E, fun ?MODULE:crash/4, {Self, error}) || E <- Events],
    {Peer, C} = peer_node(),
    try
        ?assertEqual(ok, ecall:connect(C)),
        Conn = whereis(ecall_conn:name(C)),
        ok = crashed([ecall, link, up], Conn),
        ?assertEqual({ok, C}, ecall:call(C, ecall_test_nodes, whoami, [], ?WAIT)),
        ?assertEqual(Conn, whereis(ecall_conn:name(C))),
        Ref = monitor(process, Conn),
        ok = ecall:disconnect(C),
        receive {'DOWN', Ref, process, Conn, Why} -> ?assertEqual(normal, Why)
        after ?WAIT -> ct:fail(connection_process_lives_on)
        end,
        ?assertMatch({ok, #{state := closed, reason := normal}}, ecall:last_stats(C))
    after
        ets:delete(?HANDLERS),
        peer:stop(Peer)
    end.

%% The handler: says where it ran, then fails.
crash(Event, _Measurements, _Metadata, {Owner, Class}) ->
    Owner ! {crashed, Event, self()},
    ecall_test_nodes:fail(Class, handler_crash).

%% The handler of `Event' ran (and crashed) in process `Pid'.
crashed(Event, Pid) ->
    receive
        {crashed, Event, Where} -> ?assertEqual(Pid, Where)
    after ?WAIT -> ct:fail({handler_not_run, Event})
    end.

%% Fun() in a process of its own: {Pid, Result}; a failure fails the case.
in_process(Fun) ->
    {Pid, Ref} = spawn_monitor(fun() -> exit({returned, Fun()}) end),
    receive
        {'DOWN', Ref, process, Pid, {returned, Result}} -> {Pid, Result};
        {'DOWN', Ref, process, Pid, Other} -> ct:fail({caller_died, Other})
    after ?WAIT -> ct:fail(caller_did_not_return)
    end.

%% The processes of the ecall application.
ecall_processes() ->
    [P || P <- processes(), application:get_application(P) =:= {ok, ecall}].
