%% What ecall loses where `!' loses nothing, under traffic: 50 senders on
%% this node send numbered messages to a process registered on node B,
%% which hands each to a collector here by `!'.
%%
%% - An orderly stop of the peer, ecall:send/2 against `!' in the same
%%   run: B stops its ecall (`application:stop(ecall)', its node staying
%%   up, with traffic going on after) or the whole node (`init:stop/0', as
%%   every rolling deploy does).
%% - Faults while both nodes stay connected: a link's connection dropped
%%   or reset by the peer, a link reaped (the peer stopped past the stall
%%   timeout), a receiver worker or the receivers' supervisor killed on
%%   the peer, and the links that carry replies dropped under calls. `!'
%%   is untouched by these (they are ecall's own connections and
%%   processes): ecall must lose nothing, duplicate nothing, reorder
%%   nothing.
%%
%% The oracle is exact: each sender ends with `{done, Id, N}' on the same
%% path as its messages, and the collector counts, per sender, what came
%% before it. Whatever went through ecall's links before the stop and
%% whatever went by `!' after it must all be there, once and in order.
%% For `init:stop/0' the node's stop is held (ecall_test_hold, an
%% application started before ecall, so stopped after it) until the
%% senders are done: ecall has stopped on B by then and its node is up,
%% as it is during a real stop until its last applications go.
-module(ecall_loss_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([init_stop_loses_no_more_than_bang/1, app_stop_loses_no_more_than_bang/1,
         calls_and_casts_outlive_the_peers_stop/1,
         a_dropped_link_loses_nothing/1, a_reset_link_loses_nothing/1,
         a_reaped_link_loses_nothing/1, a_killed_receiver_loses_nothing/1,
         a_killed_receiver_supervisor_loses_nothing/1,
         dropped_reply_links_fail_no_call/1]).
%% Run on B.
-export([sink/1, reset_connection/1]).

-define(SENDERS, 50).
%% Messages received before the stop starts; messages each sender sends
%% after application:stop/1 returned, before the senders are told to end.
-define(BEFORE, 50000).
-define(AFTER, 1000).
-define(SINK, ecall_stop_sink).
%% Messages a sender sends at a time.
-define(BURST, 20).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [init_stop_loses_no_more_than_bang, app_stop_loses_no_more_than_bang,
     calls_and_casts_outlive_the_peers_stop,
     a_dropped_link_loses_nothing, a_reset_link_loses_nothing, a_reaped_link_loses_nothing,
     a_killed_receiver_loses_nothing, a_killed_receiver_supervisor_loses_nothing,
     dropped_reply_links_fail_no_call].

init_per_suite(Config) ->
    ok = ecall_test_nodes:start_ecall(),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall).

%% init:stop/0 on B under traffic: `!' and ecall:send/2 each lose nothing
%% that was sent while B's ecall stopped, and ecall counts nothing lost.
init_stop_loses_no_more_than_bang(_Config) ->
    Bang = run(bang, init_stop),
    Ecall = run(ecall, init_stop),
    compare(Bang, Ecall).

%% application:stop(ecall) on B under traffic, which goes on after the
%% stop: nothing is lost either way, and once ecall starts again on B the
%% connection is made again and carries the traffic.
app_stop_loses_no_more_than_bang(_Config) ->
    Bang = run(bang, app_stop),
    Ecall = run(ecall, app_stop),
    compare(Bang, Ecall).

%% A call and a cast running on B when its ecall stops in order, as erpc's
%% would: the cast's process is not killed with ecall's application, and
%% the call's caller goes on waiting after the connection closed, and gets
%% its answer.
calls_and_casts_outlive_the_peers_stop(_Config) ->
    {B, _} = NodeRef = ecall_test_nodes:start_node(os:find_executable("erl")),
    try
        ok = ecall:connect(B),
        Self = self(),
        ok = ecall:cast(B, ecall_test_nodes, block, [Self]),
        Caller = spawn_link(fun() -> Self ! {called, ecall:call(B, ecall_test_nodes, block, [Self])} end),
        Blocked = [receive {blocked, P, B} -> P end || _ <- [cast, call]],
        ok = erpc:call(B, application, stop, [ecall]),
        {ok, #{reason := peer_stopping, closed_drops := 0}} = ecall:last_stats(B),
        %% application:stop/1 has returned: processes of ecall's are gone.
        ?assertEqual([true, true], [erpc:call(B, erlang, is_process_alive, [P]) || P <- Blocked]),
        [P ! go || P <- Blocked],
        receive {called, Result} -> ?assertEqual({ok, late}, Result) end,
        unlink(Caller)
    after
        ecall_test_nodes:stop_node(NodeRef)
    end.

%% Each of this node's links to B has its connection closed by B, in turn,
%% under traffic.
a_dropped_link_loses_nothing(_Config) ->
    exact(run(ecall, drop_link)).

%% The same, the connection reset (closed with no linger: a TCP reset).
a_reset_link_loses_nothing(_Config) ->
    exact(run(ecall, reset_link)).

%% B stopped (SIGSTOP) past the stall timeout (1 s here): the links are
%% reaped; B runs again, and they reconnect.
a_reaped_link_loses_nothing(_Config) ->
    ok = application:set_env(ecall, stall_timeout, 1000),
    try exact(run(ecall, reap))
    after application:unset_env(ecall, stall_timeout)
    end.

%% Each receiver worker of B killed, in turn, under traffic: what its
%% mailbox held comes again.
a_killed_receiver_loses_nothing(_Config) ->
    exact(run(ecall, kill_receiver)).

%% The receivers' supervisor of B killed under traffic (ecall on B
%% restarts what came after it too).
a_killed_receiver_supervisor_loses_nothing(_Config) ->
    exact(run(ecall, kill_receiver_sup)).

%% Callers on this node call B in a loop while B's links to this node,
%% which carry the replies, are dropped in turn: every call returns its
%% value, none fails, none is answered twice.
dropped_reply_links_fail_no_call(_Config) ->
    {B, _} = NodeRef = ecall_test_nodes:start_node(os:find_executable("erl")),
    try
        ok = ecall:connect(B),
        ok = erpc:call(B, ecall, connect, [node()]),
        Self = self(),
        Callers = [spawn_link(fun() -> call_loop(Self, B, I, 1) end) || I <- lists:seq(1, 20)],
        BIds = erpc:call(B, ecall, identities, []),
        _ = [begin
                 Before = calls_done(Callers),
                 true = erlang:disconnect_node(Id),
                 ok = ecall_test_nodes:await(calls_go_on,
                                             fun() -> calls_done(Callers) > Before + 2000 end)
             end || Id <- BIds],
        [C ! {stop, Self} || C <- Callers],
        Results = [receive {called, C, R} -> R end || C <- Callers],
        ct:pal("calls per caller, and errors: ~p~nB's links: ~p",
               [Results, maps:with([replayed, replayed_requests, disconnects],
                                   element(2, erpc:call(B, ecall, stats, [node()])))]),
        ?assertEqual([], [R || {_, Errors} = R <- Results, Errors =/= []])
    after
        ecall_test_nodes:stop_node(NodeRef)
    end.

%% Calls echo({I, Seq}) on B until told to stop; keeps the errors and any
%% answer that is not its own.
call_loop(Owner, B, I, Seq) ->
    receive
        {stop, To} -> To ! {called, self(), {Seq - 1, errors()}};
        {done, To} -> To ! {done, self(), Seq - 1}, call_loop(Owner, B, I, Seq)
    after 0 ->
        case ecall:call(B, ecall_test_nodes, echo, [{I, Seq}]) of
            {ok, {I, Seq}} -> ok;
            Other -> put(errors, [{Seq, Other} | errors()])
        end,
        call_loop(Owner, B, I, Seq + 1)
    end.

errors() ->
    case get(errors) of
        undefined -> [];
        E -> E
    end.

calls_done(Callers) ->
    [C ! {done, self()} || C <- Callers],
    lists:sum([receive {done, C, N} -> N end || C <- Callers]).

%% Nothing lost, nothing twice or out of order.
exact(#{lost := Lost, bad := Bad} = Result) ->
    ct:pal("ecall:send/2: ~p", [Result]),
    ?assertEqual({0, 0}, {Lost, Bad}).

compare(#{lost := BangLost} = Bang, #{lost := Lost} = Ecall) ->
    ct:pal("`!': ~p~necall:send/2: ~p", [Bang, Ecall]),
    ?assertEqual(0, BangLost),
    ?assert(Lost =< BangLost),
    ?assertEqual(0, maps:get(bad, Ecall)),
    ?assertEqual(0, maps:get(bad, Bang)).

%% One run on a fresh node B: the senders' way (`bang' or `ecall'), the
%% kind of stop. Returns what was sent, lost (sent before the sender's
%% `done' and never received), out of order or twice (`bad'), and (ecall)
%% what the closed connection counted.
run(Way, Stop) ->
    {B, _} = NodeRef = ecall_test_nodes:start_node(os:find_executable("erl")),
    try
        %% ecall again after the hold, so that the hold stops after it.
        ok = erpc:call(B, application, stop, [ecall]),
        ok = erpc:call(B, ecall_test_hold, load, [self()]),
        ok = erpc:call(B, application, start, [ecall_test_hold]),
        {ok, _} = erpc:call(B, application, ensure_all_started, [ecall]),
        ok = ecall:connect(B),
        Collector = spawn_link(fun() -> collector(#{}, #{}, 0, []) end),
        Sink = erpc:call(B, erlang, spawn, [?MODULE, sink, [Collector]]),
        ok = wait_registered(B),
        Senders = [spawn_link(fun() -> sender(Way, B, I, 1) end) || I <- lists:seq(1, ?SENDERS)],
        ok = received(Collector, ?BEFORE),
        Result = stop(Stop, B, Way, Collector, Senders),
        unlink(Collector),
        exit(Collector, kill),
        _ = (catch erpc:call(B, erlang, exit, [Sink, kill])),
        Result
    after
        ecall_test_nodes:stop_node(NodeRef)
    end.

stop(Fault, B, Way, Collector, Senders)
  when Fault =:= drop_link; Fault =:= reset_link ->
    _ = [begin
             ok = case Fault of
                      drop_link -> true = erpc:call(B, erlang, disconnect_node, [Id]), ok;
                      reset_link -> erpc:call(B, ?MODULE, reset_connection, [Id])
                  end,
             ok = received(Collector, ?BEFORE)
         end || Id <- ecall:identities()],
    finish(Way, B, Collector, Senders);
stop(reap, B, Way, Collector, Senders) ->
    OsPid = erpc:call(B, os, getpid, []),
    {ok, #{stalls := S0}} = ecall:stats(B),
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        ok = ecall_test_nodes:await(reaped, fun() ->
                                                    {ok, #{stalls := S}} = ecall:stats(B),
                                                    S > S0
                                            end)
    after
        os:cmd("kill -CONT " ++ OsPid)
    end,
    ok = received(Collector, ?BEFORE),
    finish(Way, B, Collector, Senders);
stop(kill_receiver, B, Way, Collector, Senders) ->
    _ = [begin
             Old = erpc:call(B, erlang, whereis, [Name]),
             true = erpc:call(B, erlang, exit, [Old, kill]),
             ok = ecall_test_nodes:await(restarted, fun() ->
                                                            New = erpc:call(B, erlang, whereis, [Name]),
                                                            is_pid(New) andalso New =/= Old
                                                    end),
             ok = received(Collector, ?BEFORE)
         end || Name <- [list_to_atom(binary_to_list(N))
                         || N <- erpc:call(B, ecall_receiver_sup, names, [])]],
    finish(Way, B, Collector, Senders);
stop(kill_receiver_sup, B, Way, Collector, Senders) ->
    Old = erpc:call(B, erlang, whereis, [ecall_receiver_sup]),
    true = erpc:call(B, erlang, exit, [Old, kill]),
    ok = ecall_test_nodes:await(restarted, fun() ->
                                                   New = erpc:call(B, erlang, whereis, [ecall_rx_1]),
                                                   is_pid(New)
                                           end),
    ok = received(Collector, ?BEFORE),
    finish(Way, B, Collector, Senders);
stop(init_stop, B, Way, Collector, Senders) ->
    ok = erpc:cast(B, init, stop, []),
    Held = receive {held, B, Pid} -> Pid after 60000 -> error(not_held) end,
    Result = finish(Way, B, Collector, Senders),
    Held ! release,
    Result;
stop(app_stop, B, Way, Collector, Senders) ->
    ok = erpc:call(B, application, stop, [ecall]),
    %% Traffic goes on to B, whose ecall is stopped: each sender sends
    %% ?AFTER more.
    [S ! {mark, self()} || S <- Senders],
    [receive {marked, S} -> ok end || S <- Senders],
    Result = finish(Way, B, Collector, Senders),
    %% Through ecall, that traffic went by `!', and was counted so.
    _ = Way =:= ecall andalso ?assert(maps:get(fallback_sends, Result) >= ?SENDERS * ?AFTER),
    %% ecall starts again on B: a connection is made again, and carries
    %% what is sent.
    {ok, _} = erpc:call(B, application, ensure_all_started, [ecall]),
    ok = ecall:connect(B),
    {ok, #{pushed := P0}} = ecall:stats(B),
    ecall:send({?SINK, B}, again),
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(P0 + 1, P1),
    Result.

%% The senders end, each with `{done, Id, N}' on its path and a word to
%% this process of what it sent; the collector's count.
finish(Way, B, Collector, Senders) ->
    [S ! {stop, self()} || S <- Senders],
    Sent = maps:from_list([receive {sent, I, N} -> {I, N} end || _ <- Senders]),
    Collector ! {count, self(), Sent},
    {Lost, Bad} = receive {counted, Counted} -> Counted end,
    Closed = case Way of
                 ecall ->
                     %% The closed connection's counters (or the live
                     %% ones, if it did not close).
                     {ok, Stats} = case ecall:stats(B) of
                                       {ok, Live} -> {ok, Live#{reason => still_open}};
                                       {error, _} -> ecall:last_stats(B)
                                   end,
                     maps:with([closed_drops, dropped, unconfirmed, reason], Stats);
                 bang ->
                     #{}
             end,
    Fallback = maps:get(B, maps:get(fallback_sends, ecall:stats()), 0),
    Closed#{sent => lists:sum(maps:values(Sent)), lost => Lost, bad => Bad,
            fallback_sends => Fallback}.

%% Sends `{I, Seq}', Seq from 1, ?BURST every millisecond or so (a
%% backlog on the links when the stop comes), until told to stop. Told `{mark, Test}', it says `{marked, self()}' to Test once it
%% has sent ?AFTER more.
sender(Way, B, I, Seq) ->
    sender(Way, B, I, Seq, none).

sender(Way, B, I, Seq, Mark) ->
    receive
        {stop, Test} ->
            send(Way, B, {done, I, Seq - 1}),
            Test ! {sent, I, Seq - 1};
        {mark, Test} ->
            sender(Way, B, I, Seq, {Test, Seq + ?AFTER})
    after 1 ->
        Next = Seq + ?BURST,
        [send(Way, B, {I, S}) || S <- lists:seq(Seq, Next - 1)],
        case Mark of
            {Test, M} when M < Next ->
                Test ! {marked, self()},
                sender(Way, B, I, Next, none);
            _ ->
                sender(Way, B, I, Next, Mark)
        end
    end.

send(bang, B, Msg) -> {?SINK, B} ! Msg;
send(ecall, B, Msg) -> ecall:send({?SINK, B}, Msg).

wait_registered(B) ->
    case erpc:call(B, erlang, whereis, [?SINK]) of
        undefined -> wait_registered(B);
        _ -> ok
    end.

%% On B: closes the connection to `Node' with no linger (a TCP reset).
reset_connection(Node) ->
    {Node, Port} = lists:keyfind(Node, 1, erlang:system_info(dist_ctrl)),
    ok = inet:setopts(Port, [{linger, {true, 0}}]),
    true = erlang:port_close(Port),
    ok.

%% On B: hands everything to the collector by `!'.
sink(Collector) ->
    register(?SINK, self()),
    sink_loop(Collector).

sink_loop(Collector) ->
    receive Msg -> Collector ! Msg end,
    sink_loop(Collector).

%% Returns once the collector has received `N' messages more.
received(Collector, N) ->
    Collector ! {notify, N, self()},
    receive {received, Collector} -> ok after 60000 -> error({not_received, N}) end.

%% Per sender: the last number received and how many came (`Last'), its
%% `done'; `Bad', numbers out of order or twice.
collector(Last, Done, Bad, Waiters) ->
    receive
        {I, Seq} when is_integer(I), is_integer(Seq) ->
            {Last1, Bad1} = got(I, Seq, Last, Bad),
            collector(Last1, Done, Bad1, notify(Waiters));
        {done, I, N} ->
            collector(Last, Done#{I => N}, Bad, Waiters);
        {notify, N, From} ->
            collector(Last, Done, Bad, [{N, From} | Waiters]);
        {count, From, Sent} ->
            settle(From, Sent, Last, Done, Bad)
    end.

got(I, Seq, Last, Bad) ->
    {Prev, N} = maps:get(I, Last, {0, 0}),
    Bad1 = case Seq =:= Prev + 1 of
               true -> Bad;
               false -> Bad + 1
           end,
    {Last#{I => {max(Prev, Seq), N + 1}}, Bad1}.

%% Waits for every sender's `done' (it follows that sender's messages on
%% their path), then answers `{Lost, Bad}' against what each sent. A
%% `done' that has not come 5 s after the last message was lost with
%% whatever was lost before it: the wait is reached only on a loss.
settle(From, Sent, Last, Done, Bad) when map_size(Done) =:= map_size(Sent) ->
    count(From, Sent, Last, Bad);
settle(From, Sent, Last, Done, Bad) ->
    receive
        {I, Seq} when is_integer(I), is_integer(Seq) ->
            {Last1, Bad1} = got(I, Seq, Last, Bad),
            settle(From, Sent, Last1, Done, Bad1);
        {done, I, N} ->
            settle(From, Sent, Last, Done#{I => N}, Bad)
    after 5000 ->
        count(From, Sent, Last, Bad)
    end.

count(From, Sent, Last, Bad) ->
    Received = lists:sum([element(2, maps:get(I, Last, {0, 0})) || I <- maps:keys(Sent)]),
    From ! {counted, {lists:sum(maps:values(Sent)) - Received, Bad}}.

notify(Waiters) ->
    lists:filtermap(fun({1, From}) -> From ! {received, self()}, false;
                       ({N, From}) -> {true, {N - 1, From}}
                    end, Waiters).
