%% The write path's mechanisms on real nodes: when a link's writer writes
%% what callers pushed, and what it waits for. Calls of a caller in a
%% closed loop and sends with `urgent', which no link holds back for
%% company (and the `urgent' setting, and a peer of the first releases,
%% which takes no mark); requests and replies exchanged back to back, for
%% which waiting for company (gathering) only delays; the flusher, which
%% writes what pushes that find a link's writer asleep bring (and the
%% flusher's death); and `gather' off. This node and B, connected
%% both ways (replies come back through B's own links). The data path's
%% other cases (what arrives, in which order, on each OTP release) are in
%% ecall_data_path_SUITE, cast and call in ecall_rpc_SUITE.
-module(ecall_write_path_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([closed_loop_calls_are_urgent/1, urgent_off/1,
         urgent_sends/1, sends_in_a_closed_loop/1,
         flushes_in_a_closed_loop/1, flusher_exit_closes_connection/1,
         busy_links_gather/1, gather_off_writes_at_once/1]).

-import(ecall_test_nodes, [connect_back/1,
                           many_callers_exactly_once/1]).

%% Calls in closed_loop_of_calls/1: all but the first come right after
%% the one before.
-define(LOOP_CALLS, 200).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [closed_loop_calls_are_urgent, urgent_off,
     urgent_sends, sends_in_a_closed_loop,
     flushes_in_a_closed_loop, flusher_exit_closes_connection,
     busy_links_gather, gather_off_writes_at_once].

init_per_suite(Config) ->
    ecall_test_nodes:start_b(Config).

end_per_suite(Config) ->
    ecall_test_nodes:stop_b(Config).

%% A caller in a closed loop (each call right after the last one returned)
%% sends its calls urgent, so that neither node's link holds them back
%% waiting for company; its reply comes back urgent too. A caller's first
%% call is not urgent (it has no last call), and neither is the reply.
%% Counted per link in `urgent' on each node; the results are checked too.
%%
%% Whether a call is in a closed loop is a matter of time (it comes within
%% 2 ms of the caller's last return: ecall_rpc:closed_loop/0), which a
%% loaded machine can stretch for any call. So the caller's own decisions
%% are traced (closed_loop/0 and urgent/2, with what they returned), and
%% what is asserted holds whatever the schedule: every call found in a
%% closed loop is urgent (one caller is far from the company limit), no
%% other call is, never the first, and both nodes count exactly the urgent
%% ones. Rounds of ?LOOP_CALLS back-to-back calls, each from a new process,
%% go on until ?LOOP_CALLS div 2 calls were found in a closed loop (the
%% first round, unless the machine is very busy), so that the urgent path
%% is not left untried. (This case used to pass with one urgent call of
%% 49: a caller whose calls stopped being urgent after its first
%% closed-loop call went through; its urgent/2 answered false where
%% closed_loop/0 had answered true.)
closed_loop_calls_are_urgent(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    U0 = urgent_counts(B),
    ?assertEqual({ok, B}, in_fresh_process(fun() -> ecall:call(B, erlang, node, []) end)),
    %% Nothing else calls between the two readings.
    ?assertEqual(U0, urgent_counts(B)),
    Urgent = closed_loops_until(B, fun loop_of_calls/1, ?LOOP_CALLS div 2, 10, 0),
    ct:pal("~b calls in closed loops urgent", [Urgent]),
    %% The parallel patterns decide in the calling process: the same for
    %% 20 call_all/4 back to back (19 follow one).
    AllLoop = fun(Node) ->
                      [ecall:call_all([Node], erlang, node, []) || _ <- lists:seq(1, 20)]
              end,
    AllUrgent = closed_loops_until(
                  B, fun(Node) ->
                             ?assertEqual(lists:duplicate(20, {ok, [{Node, Node}]}), AllLoop(Node))
                     end, 10, 10, 0),
    ct:pal("~b call_all/4 in closed loops urgent", [AllUrgent]).

%% Rounds of Loop(B), each in a new process whose urgency decisions are
%% traced, until `Want' calls in all were found in a closed loop (at most
%% `Max' rounds). Each round: the decisions as asserted above, and the
%% links' counts of urgent requests on both nodes rose by exactly the
%% urgent ones. Returns the urgent calls in all.
closed_loops_until(_B, _Loop, Want, 0, Urgent) ->
    ct:fail({closed_loop_calls, Urgent, of_at_least, Want});
closed_loops_until(B, Loop, Want, Max, Urgent) ->
    {UA0, UB0} = urgent_counts(B),
    Decisions = urgency_traced(fun() -> Loop(B) end),
    {UA1, UB1} = urgent_counts(B),
    %% Each urgent/2 answer with the closed_loop/0 answer just before it
    %% (the one urgent/2 made itself).
    %% The first call has no last one.
    ?assertMatch([{closed_loop, false} | _], Decisions),
    Pairs = pair_decisions(Decisions, undefined),
    [?assertEqual(Closed, U) || {Closed, U} <- Pairs],
    N = length([U || {_, true} = U <- Pairs]),
    ?assertEqual(N, UA1 - UA0),
    ?assertEqual(N, UB1 - UB0),
    case Urgent + N of
        Enough when Enough >= Want -> Enough;
        More -> closed_loops_until(B, Loop, Want, Max - 1, More)
    end.

%% [{closed_loop/0's answer, urgent/2's answer}] from the traced answers,
%% in order.
pair_decisions([], _Closed) -> [];
pair_decisions([{closed_loop, C} | Rest], _) -> pair_decisions(Rest, C);
pair_decisions([{urgent, U} | Rest], Closed) -> [{Closed, U} | pair_decisions(Rest, Closed)].

%% Runs Fun in a new process (one with no calls behind it) with the
%% answers of ecall_rpc:closed_loop/0 and ecall_rpc:urgent/2
%% traced: [{closed_loop | urgent, boolean()}], in the order they came.
urgency_traced(Fun) ->
    Go = make_ref(),
    {Pid, Mref} = spawn_monitor(fun() -> receive Go -> exit({done, Fun()}) end end),
    Spec = [{'_', [], [{return_trace}]}],
    1 = erlang:trace_pattern({ecall_rpc, closed_loop, 0}, Spec, [local]),
    1 = erlang:trace_pattern({ecall_rpc, urgent, 2}, Spec, [local]),
    1 = erlang:trace(Pid, true, [call]),
    Pid ! Go,
    try
        receive
            {'DOWN', Mref, process, Pid, {done, _}} -> ok;
            {'DOWN', Mref, process, Pid, Why} -> ct:fail({traced_process, Why})
        end
    after
        erlang:trace_pattern({ecall_rpc, closed_loop, 0}, false, [local]),
        erlang:trace_pattern({ecall_rpc, urgent, 2}, false, [local])
    end,
    Delivered = erlang:trace_delivered(Pid),
    receive {trace_delivered, Pid, Delivered} -> ok end,
    traced_answers(Pid).

traced_answers(Pid) ->
    receive
        {trace, Pid, call, _} ->
            traced_answers(Pid);
        {trace, Pid, return_from, {ecall_rpc, F, _}, Answer} ->
            [{F, Answer} | traced_answers(Pid)]
    after 0 ->
        []
    end.

%% With the `urgent' setting false (read when a connection opens), the
%% same closed loop (?LOOP_CALLS calls, most of them urgent with the
%% setting on) sends nothing urgent: neither node's links count one, and
%% the calls are all answered.
urgent_off(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    with_setting(B, urgent, false,
                 fun() ->
                         U0 = urgent_counts(B),
                         ok = closed_loop_of_calls(B),
                         ?assertEqual(U0, urgent_counts(B))
                 end).

%% send/3 with `urgent': each such send counts as urgent on this node's
%% links (it ends or forestalls a gathering wait there), none on B's (a
%% send carries no mark: whoever answers decides for the answer), and
%% urgent and plain sends from one process arrive in the order they were
%% made, to a pid and to a registered name. `[]' is send/2. Options that
%% are not a proper list of `urgent' raise badarg, before anything is sent.
urgent_sends(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    ?assertError(badarg, ecall:send(self(), x, [bogus])),
    ?assertError(badarg, ecall:send(self(), x, urgent)),
    ?assertError(badarg, ecall:send(self(), x, [urgent | bad])),
    ?assertError(badarg, ecall:send("pid", x, [urgent])),
    ?assertError(badarg, ecall:send({"name", B}, x, [])),
    N = 200,
    Collector = erpc:call(B, erlang, spawn, [ecall_test_nodes, collector, [self(), N]]),
    Name = list_to_atom("urgent_sends_" ++ integer_to_list(erlang:unique_integer([positive]))),
    true = erpc:call(B, erlang, register, [Name, Collector]),
    {UA0, UB0} = urgent_counts(B),
    %% Every third send plain, and every other one to the name.
    Sent = [begin
                Msg = {seq, self(), I},
                To = case I rem 2 of 0 -> Collector; 1 -> {Name, B} end,
                Opts = case I rem 3 of 0 -> []; _ -> [urgent] end,
                Msg = ecall:send(To, Msg, Opts),
                Opts
            end || I <- lists:seq(1, N)],
    receive
        {collected, Collector, Report} ->
            ?assertMatch(#{total := N, callers := 1, out_of_order := 0}, Report)
    after 30000 ->
        ct:fail(not_collected)
    end,
    {UA1, UB1} = urgent_counts(B),
    ?assertEqual(length([O || [urgent] = O <- Sent]), UA1 - UA0),
    ?assertEqual(UB0, UB1).

%% A request and its reply exchanged with ecall:send/2, back to back, by
%% one pair of processes: each request finds its link's writer asleep,
%% right after it fell asleep. A push that woke the writer then would make
%% it take the link for busy and gather (wait 1-2 ms for company) before
%% every write, on both nodes: about one wait per exchange here. Written
%% alone or flushed instead, the requests leave the writer asleep. Every
%% reply comes back, in order.
%%
%% Counted, not timed: a writer gathers only once woken within 200 us of
%% falling asleep, or after a pass of several requests, which only an
%% awake writer makes; its own tick wakes it after a long sleep, which
%% never makes it gather. So this node's links count no more gathering
%% waits than wake-ups by pushes (`wakes') and by flushes handed to the
%% writer (`flush_handoffs'). And the pushes themselves wake it only
%% rarely: a flush hands off only when the writer is awake or about to
%% sleep (after one of its ticks, some seconds apart), so such wake-ups
%% are a small part of the exchanges, far from the one per exchange of a
%% writer woken by each push (a quarter of them would need the exchanges
%% to last minutes, past the suite's timetrap).
sends_in_a_closed_loop(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    Echo = erpc:call(B, erlang, spawn, [ecall_test_nodes, ecall_echo_loop, []]),
    N = 200,
    Exchange = fun(I) ->
                       _ = ecall:send(Echo, {echo, self(), I}),
                       receive I -> ok after 30000 -> {timeout, I} end
               end,
    %% The path warmed (connections up, atoms cached): counted from here.
    ok = Exchange(0),
    Keys = [gathers, wakes, flush_handoffs, flushes, lone],
    #{gathers := G, wakes := W, flush_handoffs := H} = Counted =
        counted(B, Keys, fun() -> ?assertEqual(lists:duplicate(N, ok),
                                               [Exchange(I) || I <- lists:seq(1, N)])
                         end),
    Echo ! stop,
    ct:pal("~b exchanges: ~p", [N, Counted]),
    ?assert(G =< W + H),
    ?assert(W + H =< N div 4).

%% The same 64 pairs with the default settings: a push that finds its
%% link's writer asleep sends a message to the peer's flusher process
%% instead of waking the writer thread, and the flusher writes what the
%% pairs pushed meanwhile from its scheduler. Here every leg of an exchange
%% finds the writer asleep: this node's links flush (no assertion on how
%% many: how many pushes one flush takes depends on the schedule), and
%% every reply comes back in order. With pushes that always woke the
%% writer (the setting ignored) no flush would be counted.
flushes_in_a_closed_loop(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    #{flushes := F} = counted(B, [flushes], fun() -> all_pairs(B, 200) end),
    ct:pal("~b flushes", [F]),
    ?assert(F > 0).

%% The flusher is a process of the connection: if it dies, pushes would
%% wait for flushes that never come. The connection closes instead (as
%% for a proxy of the pure-Erlang transport), sends go by `!' meanwhile,
%% and a new connection has a flusher of its own.
flusher_exit_closes_connection(Config) ->
    B = ?config(b, Config),
    Why = ecall_test_nodes:kill_transport_process(
            B, fun(Call) -> Call =:= {ecall_transport_nif, flusher, 2} end),
    ?assertEqual({shutdown, {transport_down, killed}}, Why),
    Self = self(),
    Echo = erpc:call(B, erlang, spawn, [fun() -> receive M -> Self ! {echo, M} end end]),
    ecall:send(Echo, after_the_flusher),
    receive {echo, after_the_flusher} -> ok after 30000 -> ct:fail(lost_after_close) end,
    ok = ecall:connect(B),
    ?assertMatch({ok, #{transport := nif}}, ecall:stats(B)),
    all_pairs(B, 20).

%% With `gather' on (the default) a busy link's writer waits for company
%% before it writes: the 100,000 messages from 1,000 callers below, on a
%% connection opened with the default settings, go through exactly once and
%% in order, and this node's links count gathering waits (`gathers', each
%% link's in `per_link', and their total). How many depends on the
%% schedule (the flusher writes much of such a load: 3 to 416 waits a
%% round were seen), so the load goes again, five rounds at most, until
%% one is counted; with gathering that never happens, five rounds count
%% none. The case below is the same load with `gather' off, which counts
%% none.
busy_links_gather(Config) ->
    B = ?config(b, Config),
    ?assert(ecall_config:get(gather)),
    reconnect(B),
    {ok, #{gathers := G0, per_link := Links0}} = ecall:stats(B),
    Rounds = load_until_gathered(B, G0, 5),
    {ok, #{gathers := G1, batches := Batches, per_link := Links1}} = ecall:stats(B),
    PerLink = [maps:get(gathers, L1) - maps:get(gathers, L0)
               || {L0, L1} <- lists:zip(Links0, Links1)],
    ct:pal("~b rounds of 100,000 messages, ~b batches, gathering waits per link: ~w",
           [Rounds, Batches, PerLink]),
    ?assert(G1 - G0 > 0),
    ?assert(lists:sum(PerLink) > 0).

%% many_callers_exactly_once/1 until B's connection counts more gathering
%% waits than G0, at most Max times; how many rounds it took.
load_until_gathered(B, G0, Max) ->
    load_until_gathered(B, G0, Max, 1).

load_until_gathered(B, G0, Max, Round) ->
    _ = many_callers_exactly_once(B),
    {ok, #{gathers := G}} = ecall:stats(B),
    if G > G0; Round >= Max -> Round;
       true -> load_until_gathered(B, G0, Max, Round + 1)
    end.

%% With `gather' off a link's writer never waits for company: the same
%% 100,000 messages from 1,000 callers as ecall_data_path_SUITE's
%% exactly_once_in_order go through, exactly once and in order, without
%% one gathering wait on any link (each link counts its waits in
%% `gathers'; with the setting ignored the same load counted waits, from
%% a handful to hundreds, and this case failed). busy_links_gather above
%% is the same load with `gather' on.
gather_off_writes_at_once(Config) ->
    B = ?config(b, Config),
    %% Set before the links close: a connection that discovery makes again
    %% meanwhile takes the setting too.
    ok = application:set_env(ecall, gather, false),
    try
        _ = ecall:disconnect(B),
        ok = ecall:connect(B),
        {ok, #{gathers := G0, per_link := Links}} = ecall:stats(B),
        ?assert(lists:all(fun(L) -> is_integer(maps:get(gathers, L)) end, Links)),
        Total = many_callers_exactly_once(B),
        {ok, #{gathers := G1, batches := Batches, per_link := Links1}} = ecall:stats(B),
        ct:pal("~b messages, ~b batches, ~b gathering waits", [Total, Batches, G1 - G0]),
        ?assertEqual(G0, G1),
        ?assertEqual([maps:get(gathers, L) || L <- Links],
                     [maps:get(gathers, L) || L <- Links1])
    after
        ok = application:set_env(ecall, gather, true),
        _ = ecall:disconnect(B),
        ok = ecall:connect(B)
    end.

%% pairs/2 until each pair has made N exchanges; fails unless every reply
%% of every pair came back, in order.
all_pairs(B, N) ->
    ?assertEqual(lists:duplicate(64, {done, N}),
                 pairs(B, fun(Done) when Done >= N -> {done, Done};
                             (_) -> more
                          end)).

%% How much the counters `Keys' of this node's connection to B rose while
%% Fun ran.
counted(B, Keys, Fun) ->
    {ok, S0} = ecall:stats(B),
    Fun(),
    {ok, S1} = ecall:stats(B),
    maps:from_list([{K, maps:get(K, S1) - maps:get(K, S0)} || K <- Keys]).

%% 64 pairs of processes, each exchanging requests and replies by
%% ecall:send/2 with its own echo on B, in rounds of 20, until
%% `Until(ExchangesSoFar)' says how it ended; their results.
pairs(B, Until) ->
    Self = self(),
    Pairs = [spawn_link(fun() -> pair(B, Self, Until) end) || _ <- lists:seq(1, 64)],
    [receive {pair_done, P, R} -> R end || P <- Pairs].

pair(B, Parent, Until) ->
    Echo = erpc:call(B, erlang, spawn, [ecall_test_nodes, ecall_echo_loop, []]),
    Result = pair_rounds(Echo, Until, 0),
    Echo ! stop,
    Parent ! {pair_done, self(), Result}.

pair_rounds(Echo, Until, Done) ->
    Exchange = fun(I) ->
                       _ = ecall:send(Echo, {echo, self(), I}),
                       receive I -> ok after 30000 -> {timeout, I} end
               end,
    case [R || R <- [Exchange(Done + I) || I <- lists:seq(1, 20)], R =/= ok] of
        [] ->
            case Until(Done + 20) of
                more -> pair_rounds(Echo, Until, Done + 20);
                Result -> Result
            end;
        Failed ->
            {failed, Failed}
    end.

%% {urgent requests on this node's links to B, on B's links to this node}.
urgent_counts(B) ->
    {ok, #{urgent := UA}} = ecall:stats(B),
    {ok, #{urgent := UB}} = erpc:call(B, ecall, stats, [node()]),
    {UA, UB}.

%% Fun's result, run in a new process: one with no calls behind it.
in_fresh_process(Fun) ->
    {Pid, Mref} = spawn_monitor(fun() -> exit({done, Fun()}) end),
    receive
        {'DOWN', Mref, process, Pid, {done, R}} -> R;
        {'DOWN', Mref, process, Pid, Why} -> ct:fail({fresh_process, Why})
    end.

%% ?LOOP_CALLS back-to-back calls from a new process, all answered right.
closed_loop_of_calls(B) ->
    in_fresh_process(fun() -> loop_of_calls(B) end).

%% ?LOOP_CALLS back-to-back calls from this process, all answered right.
loop_of_calls(B) ->
    N = ?LOOP_CALLS,
    Results = [ecall:call(B, erlang, '+', [I, 1], 30000) || I <- lists:seq(1, N)],
    ?assertEqual([{ok, I + 1} || I <- lists:seq(1, N)], Results),
    ok.

%% A new connection to B: one that reads the settings now.
reconnect(B) ->
    _ = ecall:disconnect(B),
    ok = ecall:connect(B).

%% Fun() on a connection to B opened with the application's `Key' set to
%% `Value' (settings read when a connection opens); the key unset and
%% the connection opened again afterwards.
with_setting(B, Key, Value, Fun) ->
    with_settings(B, [{Key, Value}], Fun).

%% with_setting/4 of several keys.
with_settings(B, Settings, Fun) ->
    [ok = application:set_env(ecall, Key, Value) || {Key, Value} <- Settings],
    try
        reconnect(B),
        Fun()
    after
        [ok = application:unset_env(ecall, Key) || {Key, _} <- Settings],
        reconnect(B)
    end.
