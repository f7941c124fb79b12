%% Overload and the stall watchdog on real nodes: the byte budget and the
%% overflow policies, stalled peers (SIGSTOP) reaped, slow ones not. Each
%% case starts the peers it needs, with discovery off so that only the
%% connection made here exists.
-module(ecall_overload_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([budget_bounds_queue_and_close_releases/1, room_of_a_dead_caller_goes_back/1,
         full_budget_blocks_without_loss/1,
         stalled_peer_is_reaped/1, slow_peer_is_not_reaped/1,
         stall_timeout_zero_never_reaps/1, overload_stays_within_budget/1,
         drop_when_the_budget_is_full/1, a_reap_loses_nothing_and_a_waiting_sender_waits/1,
         casts_and_calls_wait_for_room_under_block/1]).
%% Run on peers.
-export([count_fills/1]).

-import(ecall_test_nodes, [start_peer/1, send_payload_seq/3, flush_traces/0,
                           step_sender/3, step/2, step_until_blocked/2]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [budget_bounds_queue_and_close_releases, room_of_a_dead_caller_goes_back,
     full_budget_blocks_without_loss,
     stalled_peer_is_reaped, slow_peer_is_not_reaped, stall_timeout_zero_never_reaps,
     overload_stays_within_budget, drop_when_the_budget_is_full,
     a_reap_loses_nothing_and_a_waiting_sender_waits,
     casts_and_calls_wait_for_room_under_block].

init_per_suite(Config) ->
    ok = ecall_test_nodes:start_ecall(),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall).

%% The byte budget bounds what is queued for a peer. Against a peer whose
%% links cannot come up, pushes fill the budget and are then refused; a
%% refused caller waits for room and is released when the peer closes, and
%% everything that was queued is counted as dropped.
budget_bounds_queue_and_close_releases(_Config) ->
    {ok, CNode} = ecall_cnode:cnode(),
    Budget = 4096,
    Ghost = list_to_atom("ghost_" ++ integer_to_list(erlang:unique_integer([positive]))
                         ++ "@" ++ lists:last(string:split(atom_to_list(node()), "@"))),
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
    ?assertMatch({full, _}, ecall_nif:send(Peer, self(), tiny, false)),
    ok = ecall_nif:peer_close(Peer),
    receive {ecall_room, Ref, false} -> ok after 30000 -> ct:fail(waiter_not_released) end,
    Closed = ecall_nif:peer_stats(Peer),
    ?assertEqual(Queued, maps:get(closed_drops, Closed)),
    ?assertEqual(0, maps:get(queued_bytes, Closed)),
    ?assertEqual(closed, ecall_nif:send(Peer, self(), x, false)).

%% Room set aside for a caller let in from a full budget is the caller's
%% until its push: a caller that dies first (killed between its wake-up
%% and its push) gives it back when its room term is collected, which
%% wakes the next caller waiting for room; a push takes its room and gives
%% back what it did not need; a room used up is not given back twice, and
%% a room of another peer is not taken.
room_of_a_dead_caller_goes_back(_Config) ->
    {ok, CNode} = ecall_cnode:cnode(),
    Ghost = list_to_atom("ghost_" ++ integer_to_list(erlang:unique_integer([positive]))
                         ++ "@" ++ lists:last(string:split(atom_to_list(node()), "@"))),
    {ok, Peer} = ecall_nif:peer_open(CNode, atom_to_binary(Ghost), <<"c">>, [<<"ecall_rx_1">>],
                                     self(), (ecall_config:peer_opts())#{max_queue_bytes => 4096}),
    Queued = fun() -> maps:get(queued_bytes, ecall_nif:peer_stats(Peer)) end,
    ?assertEqual(0, Queued()),
    Self = self(),
    %% Nobody waits and 3,000 bytes fit: set aside at once; the caller
    %% hands its room over and dies.
    {Caller, Mref} = spawn_monitor(fun() ->
                                           {retry, Room} = ecall_nif:wait_room(Peer, 3000, make_ref()),
                                           Self ! {room, self(), Room}
                                   end),
    receive {'DOWN', Mref, process, Caller, normal} -> ok end,
    %% Its room is in this mailbox (it came before the 'DOWN'), alive.
    ?assertEqual(3000, Queued()),
    %% 3,000 of 4,096 are set aside: a push of 1,500 bytes does not fit.
    Big = binary:copy(<<"x">>, 1500),
    ?assertMatch({full, _}, ecall_nif:send(Peer, self(), Big, false)),
    %% A caller waiting for 2,000 bytes (they do not fit beside the
    %% 3,000) is woken, with its room, once the dead caller's room is taken
    %% out, dropped and collected.
    Ref = make_ref(),
    ?assertEqual(wait, ecall_nif:wait_room(Peer, 2000, Ref)),
    receive {room, Caller, _} -> ok end,
    garbage_collect(),
    Room = receive
               {ecall_room, Ref, R} when R =/= false -> R
           after 30000 -> ct:fail({room_not_given_back, Queued()})
           end,
    ?assertEqual(2000, Queued()),
    %% A push takes its room; room it did not need goes back at once.
    Request = {send, self(), binary:copy(<<"y">>, 500)},
    {Size, _, _} = ecall_nif:encoded_size(Request),
    ?assertEqual(ok, ecall_nif:push(Peer, Request, Room, false)),
    ?assertEqual(Size, Queued()),
    %% Used up: a second push with it is an ordinary one, and collecting
    %% it gives nothing back.
    ?assertEqual(ok, ecall_nif:push(Peer, Request, Room, false)),
    ?assertEqual(2 * Size, Queued()),
    garbage_collect(),
    ?assertEqual(2 * Size, Queued()),
    %% A room of another peer is not taken by a push to this one: the
    %% push is an ordinary one here, and the room stays its peer's.
    {ok, Other} = ecall_nif:peer_open(CNode, atom_to_binary(Ghost), <<"c">>, [<<"ecall_rx_1">>],
                                      self(), (ecall_config:peer_opts())#{max_queue_bytes => 4096}),
    OtherQueued = fun() -> maps:get(queued_bytes, ecall_nif:peer_stats(Other)) end,
    {retry, Foreign} = ecall_nif:wait_room(Other, 1000, make_ref()),
    ?assertEqual(ok, ecall_nif:push(Peer, Request, Foreign, false)),
    ?assertEqual(3 * Size, Queued()),
    ?assertEqual(1000, OtherQueued()),
    ok = ecall_nif:peer_close(Other),
    ok = ecall_nif:peer_close(Peer).

push_until_full(Peer, Payload, N) ->
    case ecall_nif:send(Peer, self(), Payload, false) of
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
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, collector, [self(), Total]]),
    Payload = binary:copy(<<"x">>, 500),
    Go = make_ref(),
    Senders = [spawn_link(fun() -> receive Go -> send_payload_seq(Collector, Payload, 100) end end)
               || _ <- lists:seq(1, 20)],
    [S ! Go || S <- Senders],
    receive
        {collected, Collector, Result} ->
            ?assertEqual(#{total => Total, callers => 20, out_of_order => 0, last_seq_ok => 20},
                         Result)
    after 60000 -> ct:fail({lost_under_budget, ecall:stats(C)})
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

%% A peer started with a 1 s stall timeout on our side, discovery off so
%% that only our connection exists.
start_stall_peer() ->
    start_stall_peer(1000).

start_stall_peer(StallMs) ->
    ok = application:set_env(ecall, stall_timeout, StallMs),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, stall_timeout)
    end,
    {Peer, C, erpc:call(C, os, getpid, [])}.

%% A peer whose OS process is stopped (SIGSTOP) stops draining: the link
%% is reaped as stalled, not before the stall timeout, and the reap is
%% reported; it loses nothing: the budget holds every push, to go again
%% once the peer runs.
%%
%% Nothing here depends on how fast this machine runs the sends: on a slow
%% machine the reap can come while the loop still pushes (a stall counts
%% from the writer's last progress, not from the last push), so the time of
%% the reap is the time the connection process received it (a trace
%% timestamp), and the budget check is an exact account of every push.
%% The time is bounded from below only: every write it could stall on
%% started after the stop, so the reap comes a full timeout after it (less
%% a tenth for the two clocks, tokio's and the trace's), on any machine.
%% How late it may come is load's to decide: the wait for it is a hang
%% guard (a link never reaped, the peer being stopped for good, fails
%% there), and `stalled' says why the link went.
stalled_peer_is_reaped(_Config) ->
    {Peer, C, OsPid} = start_stall_peer(),
    Conn = whereis(ecall_conn:name(C)),
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    erlang:trace(Conn, true, ['receive', monotonic_timestamp]),
    "" = os:cmd("kill -STOP " ++ OsPid),
    T0 = erlang:monotonic_time(),
    try
        %% 30 MB from one caller (one shard, one link): far more than the
        %% loopback socket buffers hold, well within the 64 MB budget.
        Chunk = binary:copy(<<"s">>, 100000),
        Pushes = 300,
        [ecall:send(Sink, Chunk) || _ <- lists:seq(1, Pushes)],
        {Why, T1} = receive
                        {trace_ts, Conn, 'receive', {ecall_link, _, {down, W}}, T} -> {W, T}
                    after 60000 -> ct:fail(not_reaped)
                    end,
        Ms = erlang:convert_time_unit(T1 - T0, native, millisecond),
        ct:pal("reaped ~b ms after SIGSTOP: ~p", [Ms, Why]),
        ?assertEqual(stalled, Why),
        ?assert(Ms >= 1000 * 9 div 10),
        %% The peer is still stopped: nothing is written or dropped any
        %% more (a new link cannot finish its handshake), so the counters
        %% are still.
        {ok, Stats} = ecall:stats(C),
        ct:pal("after the reap: ~p", [Stats]),
        #{pushed := Pushes, requests := Written, dropped := Dropped,
          queued_bytes := Queued, stalls := Stalls} = Stats,
        ?assert(Stalls >= 1),
        %% The reap loses nothing: what was written waits for the peer's
        %% acknowledgement, the rest for the next connection, and the
        %% budget holds every push.
        ?assertEqual(0, Dropped),
        ?assert(Written =< Pushes),
        ?assertEqual(0, Queued rem Pushes),
        ?assert(Queued div Pushes >= 100000 andalso Queued div Pushes < 100100)
    after
        erlang:trace(Conn, false, ['receive', monotonic_timestamp]),
        os:cmd("kill -CONT " ++ OsPid)
    end,
    flush_traces(),
    peer:stop(Peer).

%% The guard: a peer that is alive but slow (stopped for 500 ms, then
%% running for 200 ms, in a cycle) keeps draining over many stall windows
%% and is never reaped; nothing is lost.
%%
%% The stall timeout is 3 s here, six stops long: a link is reaped only if
%% the peer took less than a piece (STALL_PIECE, native/ecall_dist's
%% net/stall_write.rs) in 3 s, so through four run
%% windows in a row. And the stops are measured, from before the SIGSTOP
%% to after the SIGCONT (os:cmd/1 forks a shell, which a loaded machine
%% can make slow): a run in which one lasted half the timeout or more did
%% not give the peer the premise of the case (a peer stopped that long
%% may rightly be reaped), and the case runs again with a new peer, three
%% times at most. What a run asserts then holds on any machine.
slow_peer_is_not_reaped(_Config) ->
    slow_peer_is_not_reaped(3000, 3).

slow_peer_is_not_reaped(StallMs, 0) ->
    ct:fail({every_run_had_a_stop_of_half_the_stall_timeout, StallMs});
slow_peer_is_not_reaped(StallMs, Tries) ->
    {Peer, C, OsPid} = start_stall_peer(StallMs),
    Stutter = spawn_link(fun() -> stutter(OsPid, 0) end),
    %% Whatever happens, the stutter ends and the peer runs again: a peer
    %% left stopped would outlive the suite.
    Run = try
              slow_peer_drains(C, Stutter, StallMs)
          after
              unlink(Stutter),
              exit(Stutter, kill),
              os:cmd("kill -CONT " ++ OsPid)
          end,
    peer:stop(Peer),
    case Run of
        {longest_stop, Longest} when Longest >= StallMs div 2 ->
            ct:pal("a stop lasted ~b ms, half the stall timeout or more: again", [Longest]),
            slow_peer_is_not_reaped(StallMs, Tries - 1);
        {longest_stop, Longest} ->
            ct:pal("longest stop ~b ms", [Longest])
    end.

%% 800 messages of 100 KB to a collector on the stuttering peer C, 10 at a
%% time with 100 ms between: every one arrives, in order, over more than
%% two stall windows, with nothing stalled, disconnected or dropped, unless
%% a stop lasted half the stall timeout or more (then nothing is
%% asserted). Returns {longest_stop, Ms}.
slow_peer_drains(C, Stutter, StallMs) ->
    Total = 800,
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, collector, [self(), Total]]),
    Payload = binary:copy(<<"p">>, 100000),
    Self = self(),
    T0 = erlang:monotonic_time(millisecond),
    %% 10 MB/s for 8 s: each stop leaves the link blocked for most of it.
    [begin
         {seq, Self, I, Payload} = ecall:send(Collector, {seq, Self, I, Payload}),
         I rem 10 =:= 0 andalso timer:sleep(100)
     end || I <- lists:seq(1, Total)],
    Collected = receive
                    {collected, Collector, Result} -> Result
                after 120000 -> ct:fail(slow_peer_lost_messages)
                end,
    Ms = erlang:monotonic_time(millisecond) - T0,
    unlink(Stutter),
    Stutter ! {stop, self()},
    Longest = receive {stutter_stopped, L} -> L end,
    {ok, Stats} = ecall:stats(C),
    ct:pal("slow peer, ~b ms, longest stop ~b ms: ~p", [Ms, Longest, Stats]),
    case Longest >= StallMs div 2 of
        true ->
            ok;
        false ->
            ?assertMatch(#{out_of_order := 0, total := Total}, Collected),
            %% It spanned several stall windows ...
            ?assert(Ms > 2 * StallMs),
            %% ... and was never taken for stalled.
            ?assertEqual(0, maps:get(stalls, Stats)),
            ?assertEqual(0, maps:get(disconnects, Stats)),
            ?assertEqual(0, maps:get(dropped, Stats))
    end,
    {longest_stop, Longest}.

%% `stall_timeout => 0': no write deadline, a link is never reaped for a
%% write that does not end. The peer's OS process is stopped (SIGSTOP)
%% while one caller sends it 30 MB: the link's writer is stuck in a write
%% for 2 s, twice the 1 s after which stalled_peer_is_reaped/1 reaps, and
%% no link goes down. Run again, the peer gets every message, in order,
%% and nothing was counted as stalled or dropped.
stall_timeout_zero_never_reaps(_Config) ->
    {Peer, C, OsPid} = start_stall_peer(0),
    Conn = whereis(ecall_conn:name(C)),
    Total = 300,
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, collector, [self(), Total]]),
    Chunk = binary:copy(<<"z">>, 100000),
    erlang:trace(Conn, true, ['receive']),
    "" = os:cmd("kill -STOP " ++ OsPid),
    try
        send_payload_seq(Collector, Chunk, Total),
        %% A bound, not a pause: with a deadline of 1 s or less the link
        %% would be reaped within it.
        receive
            {trace, Conn, 'receive', {ecall_link, _, {down, Why}}} -> ct:fail({link_down, Why})
        after 2000 -> ok
        end,
        %% The writer is still stuck: what the socket buffers could not
        %% take is still queued, unwritten.
        {ok, #{pushed := Total, requests := Written, queued_bytes := Queued}} = ecall:stats(C),
        ct:pal("after 2 s stopped: ~b of ~b written, ~b bytes queued", [Written, Total, Queued]),
        ?assert(Written < Total),
        ?assert(Queued > 0)
    after
        erlang:trace(Conn, false, ['receive']),
        os:cmd("kill -CONT " ++ OsPid)
    end,
    receive
        {collected, Collector, Result} ->
            ?assertMatch(#{out_of_order := 0, total := Total}, Result)
    after 30000 -> ct:fail(messages_lost)
    end,
    {ok, Stats} = ecall:stats(C),
    ct:pal("stall_timeout 0: ~p", [Stats]),
    Links = ecall_config:links(),
    ?assertMatch(#{stalls := 0, disconnects := 0, dropped := 0, links_up := Links}, Stats),
    flush_traces(),
    ok = ecall:disconnect(C),
    peer:stop(Peer).

%% A sender waiting for room under `overflow => block' when its link is
%% reaped stays waiting: the reap frees nothing, since it loses nothing
%% (what the link wrote waits for the peer's acknowledgement, the rest for
%% the next connection). The peer is stopped (SIGSTOP) with a 1 MB budget
%% and a 2 s stall timeout; one sender (one shard, one link) sends 100 KB
%% messages until it waits for room, and the link is reaped (`stalled':
%% the peer acknowledged nothing for 2 s) while it waits. Once the peer
%% runs again, the link reconnects and writes again what it kept, the
%% peer acknowledges, the sender is let in, and every message arrives
%% once, in order: none dropped, none sent by `!'.
a_reap_loses_nothing_and_a_waiting_sender_waits(_Config) ->
    ok = application:set_env(ecall, max_queue_bytes, 1000000),
    {Peer, C, OsPid} = try start_stall_peer(2000)
                       after application:unset_env(ecall, max_queue_bytes)
                       end,
    Self = self(),
    Conn = whereis(ecall_conn:name(C)),
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, seq_log, [Self, []]]),
    Payload = binary:copy(<<"r">>, 100000),
    Sender = spawn_link(fun() -> step_sender(Self, Collector, Payload) end),
    1 = erlang:trace_pattern({ecall_nif, wait_room, 3}, [{'_', [], [{return_trace}]}], [local]),
    1 = erlang:trace(Sender, true, [call, 'receive']),
    1 = erlang:trace(Conn, true, ['receive']),
    "" = os:cmd("kill -STOP " ++ OsPid),
    K = try
            K0 = step_until_blocked(Sender, 1),
            ok = reaped(Conn),
            receive
                {trace, Sender, 'receive', {ecall_room, _, _} = Let} -> ct:fail({let_in, Let})
            after 0 -> ok
            end,
            {ok, #{dropped := 0, pushed := Pushed}} = ecall:stats(C),
            ?assertEqual(K0 - 1, Pushed),
            K0
        after
            os:cmd("kill -CONT " ++ OsPid)
        end,
    receive {sent, Sender, K} -> ok after 30000 -> ct:fail({send_stuck, K}) end,
    erlang:trace_pattern({ecall_nif, wait_room, 3}, false, [local]),
    erlang:trace(Sender, false, [call, 'receive']),
    erlang:trace(Conn, false, ['receive']),
    [step(Sender, I) || I <- lists:seq(K + 1, K + 3)],
    Sender ! {report, Self},
    Got = receive {seq_log, Collector, L} -> L after 30000 -> ct:fail(no_log) end,
    {ok, #{dropped := 0, replayed := Replayed}} = ecall:stats(C),
    ct:pal("waited at message ~b; ~b batches written again; arrived: ~w", [K, Replayed, Got]),
    ?assertEqual(lists:seq(1, K + 3), Got),
    flush_traces(),
    peer:stop(Peer).

%% `overflow => block' (the default) holds casts and calls too, not only
%% sends. The peer is stopped (SIGSTOP; 1 MB budget, 1 s stall timeout)
%% and a process casts 100 KB arguments until a cast waits for room
%% (traced: the NIF answers `wait'): what was written waits for the
%% stopped peer's acknowledgement, so room comes only once it runs again,
%% and the reap of the link (it acknowledged nothing for 1 s) frees none.
%% Then a call, from a process whose link is the other one (up: the call
%% goes on the links, not by erpc), waits too, behind it. Once the peer
%% runs again the cast returns `ok' and the call its value, neither
%% {error, overload}, and every cast runs there.
casts_and_calls_wait_for_room_under_block(_Config) ->
    ok = application:set_env(ecall, max_queue_bytes, 1000000),
    {Peer, C, OsPid} = try start_stall_peer(1000)
                       after application:unset_env(ecall, max_queue_bytes)
                       end,
    ?assertEqual(block, ecall_config:get(overflow)),
    ?assertEqual(2, ecall_config:links()),
    Self = self(),
    Conn = whereis(ecall_conn:name(C)),
    {ecall_transport_nif, St, _} = ecall_route:peer(C),
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, seq_log, [Self, []]]),
    Payload = binary:copy(<<"k">>, 100000),
    {Caster, Link} = requester(C, Collector, Payload, St, any),
    {Caller, _} = requester(C, Collector, Payload, St, {not_on, Link}),
    1 = erlang:trace_pattern({ecall_nif, wait_room, 3}, [{'_', [], [{return_trace}]}], [local]),
    1 = erlang:trace(Conn, true, ['receive']),
    "" = os:cmd("kill -STOP " ++ OsPid),
    {First, Cast} =
        try
            [1 = erlang:trace(P, true, [call]) || P <- [Caster, Caller]],
            K = cast_until_waiting(Caster, 1),
            ok = reaped(Conn),
            Caller ! {call, K},
            receive
                {trace, Caller, return_from, {ecall_nif, wait_room, 3}, wait} -> ok;
                {done, Caller, call, Early} -> ct:fail({call_did_not_wait, Early})
            after 30000 -> ct:fail(call_neither_waiting_nor_done)
            end,
            {1, K}
        after
            erlang:trace_pattern({ecall_nif, wait_room, 3}, false, [local]),
            erlang:trace(Conn, false, ['receive']),
            os:cmd("kill -CONT " ++ OsPid)
        end,
    receive {done, Caster, {cast, Cast}, R1} -> ?assertEqual(ok, R1)
    after 30000 -> ct:fail(cast_still_waiting)
    end,
    receive {done, Caller, call, R2} -> ?assertEqual({ok, {echoed, Cast}}, R2)
    after 30000 -> ct:fail(call_still_waiting)
    end,
    %% Each cast's process on C sent its number.
    After = lists:seq(First, Cast),
    ok = ecall_test_nodes:await(casts_run, fun() -> After -- seq_log_now(Collector) =:= [] end),
    ct:pal("casts ~b to ~b run; the cast and the call waited at ~b", [First, Cast, Cast]),
    {ok, #{overflow_waits := Waits}} = ecall:stats(C),
    ?assert(Waits >= 2),
    flush_traces(),
    peer:stop(Peer).

%% A process that casts erlang:send(Collector, {seq, I, Payload}) to C, or
%% calls ecall_test_nodes:echo({echoed, I}) there, when told, and says what
%% it got; with the link (0-based) that carries its requests: any, or not
%% link `K' ({not_on, K}). Linked to the caller.
requester(C, Collector, Payload, St, Where) ->
    Self = self(),
    P = spawn_link(fun() ->
                           Self ! {link, self(), ecall_transport_nif:caller_link(St)},
                           request_loop(Self, C, Collector, Payload)
                   end),
    K = receive {link, P, L} -> L end,
    case Where of
        {not_on, K} ->
            unlink(P),
            exit(P, kill),
            requester(C, Collector, Payload, St, Where);
        _ ->
            {P, K}
    end.

request_loop(Owner, C, Collector, Payload) ->
    receive
        {cast, I} ->
            Owner ! {done, self(), {cast, I},
                     ecall:cast(C, erlang, send, [Collector, {seq, I, Payload}])};
        {call, I} ->
            Owner ! {done, self(), call, ecall:call(C, ecall_test_nodes, echo, [{echoed, I}])}
    end,
    request_loop(Owner, C, Collector, Payload).

%% Returns once the connection process `Conn' (traced) heard that a link
%% went down, and checks that it was reaped (`stalled').
reaped(Conn) ->
    receive
        {trace, Conn, 'receive', {ecall_link, _, {down, Why}}} -> ?assertEqual(stalled, Why)
    after 30000 -> ct:fail(not_reaped)
    end.

%% Makes the caster cast I, I + 1, ... until its cast waits for room;
%% that cast's number. A cast that returns anything but `ok' fails the
%% case.
cast_until_waiting(Caster, I) when I =< 1000 ->
    Caster ! {cast, I},
    receive
        {done, Caster, {cast, I}, ok} -> cast_until_waiting(Caster, I + 1);
        {done, Caster, {cast, I}, Other} -> ct:fail({cast_refused, I, Other});
        {trace, Caster, return_from, {ecall_nif, wait_room, 3}, wait} -> I
    after 30000 -> ct:fail({neither_cast_nor_waiting, I})
    end.

%% The numbers ecall_test_nodes:seq_log/2 on C has so far (it goes on logging).
seq_log_now(Collector) ->
    Ref = make_ref(),
    Collector ! {peek, self(), Ref},
    receive {Ref, Log} -> Log after 30000 -> ct:fail(no_log) end.

%% Stops an OS process for 500 ms, lets it run for 200 ms, until told to
%% stop (and leaves it running); then tells how long the longest stop
%% lasted (ms, from before the SIGSTOP to after the SIGCONT: at least what
%% the process was stopped). The sleeps are the subject: a slow peer.
stutter(OsPid, Longest) ->
    T0 = erlang:monotonic_time(millisecond),
    os:cmd("kill -STOP " ++ OsPid),
    timer:sleep(500),
    os:cmd("kill -CONT " ++ OsPid),
    Stop = erlang:monotonic_time(millisecond) - T0,
    receive
        {stop, From} -> From ! {stutter_stopped, max(Longest, Stop)}
    after 200 ->
        stutter(OsPid, max(Longest, Stop))
    end.

%% A peer that drains nothing (SIGSTOP) and senders pushing far more than
%% it could take: what is queued never exceeds the budget, whatever the
%% overflow policy. `error': casts and calls say {error, overload}, sends
%% are dropped and counted; `drop': everything over is dropped and counted;
%% `block': the sender waits, and once the peer runs again every one of its
%% messages arrives.
overload_stays_within_budget(_Config) ->
    Budget = 1000000,
    {Peer, C, OsPid} = budget_peer(Budget),
    Sink = erpc:call(C, erlang, spawn, [fun() -> receive never -> ok end end]),
    Total = 100,
    Collector = erpc:call(C, erlang, spawn, [ecall_test_nodes, collector, [self(), Total]]),
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
        ?assertEqual({error, overload}, ecall:call(C, ecall_test_nodes, echo, [Huge], 1000)),
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
        after 30000 -> ct:fail(sender_did_not_wait)
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

%% `overflow => drop' with a budget that is merely full: every request
%% here fits in the budget (the case above refuses one larger than the
%% whole budget, which never fits). The peer drains nothing (SIGSTOP);
%% one sender sends 100 KB messages, then 100-byte ones, until one of
%% each is refused. Each refused send is dropped and counted in
%% `overflow_drops', each other one pushed (every send is one or the
%% other), and the queue stays within the budget. A call of a 1 KB
%% argument, made each time the 100-byte sends are refused again, says
%% {error, overload} (a call the writer made room for meanwhile is pushed
%% instead, and waits for nothing: timeout 0); a cast says `ok' and is
%% counted either way. Once the peer runs again exactly the sends that
%% were pushed arrive, none of those dropped.
drop_when_the_budget_is_full(_Config) ->
    Budget = 1000000,
    {Peer, C, OsPid} = budget_peer(Budget),
    Counter = erpc:call(C, erlang, spawn, [?MODULE, count_fills, [0]]),
    Stats = fun() -> {ok, S} = ecall:stats(C), S end,
    %% The setting goes, and the peer runs again, whatever happens.
    {Sends, Refused} =
        try
            ok = application:set_env(ecall, overflow, drop),
            "" = os:cmd("kill -STOP " ++ OsPid),
            #{overflow_drops := D0, pushed := P0} = Stats(),
            %% 1,000 x 100 KB is far more than the budget and the socket
            %% buffers hold together: a send is refused well before.
            Big = {fill, binary:copy(<<"b">>, 100000)},
            {Sent1, 1} = send_until_refused(C, Counter, Big, Budget, 1000),
            Small = {fill, binary:copy(<<"s">>, 100)},
            {Sent2, 1} = send_until_refused(C, Counter, Small, Budget, 100000),
            %% Room for less than a 100-byte send, unless the writer has
            %% made more since.
            #{queued_bytes := Q} = Stats(),
            ct:pal("~b big sends, ~b small ones: ~b bytes queued of ~b",
                   [Sent1, Sent2, Q, Budget]),
            {Sent3, Refused3, Rounds} = call_until_overload(C, Counter, Small, Budget, 100),
            ct:pal("a call refused at round ~b", [Rounds]),
            #{overflow_drops := D1, pushed := P1} = Stats(),
            ?assertEqual(ok, ecall:cast(C, erlang, node, [])),
            #{overflow_drops := D2, pushed := P2} = Stats(),
            ?assertEqual(1, (D2 - D1) + (P2 - P1)),
            %% The calls refused, and the sends: every send refused was
            %% dropped and counted (a pushed call is in `pushed').
            Sent = Sent1 + Sent2 + Sent3,
            Dropped = 2 + Refused3,
            ?assertEqual(Sent, (P1 - P0) - (Rounds - 1) + Dropped),
            ?assertEqual(Dropped + 1, D1 - D0),
            #{queued_bytes := Q2} = Stats(),
            ?assert(Q2 =< Budget),
            {Sent, Dropped}
        after
            application:unset_env(ecall, overflow),
            os:cmd("kill -CONT " ++ OsPid)
        end,
    %% Behind every send of this process (one shard), under `block'.
    ecall:send(Counter, {done, self()}),
    receive
        {filled, Counter, N} -> ?assertEqual(Sends - Refused, N)
    after 30000 -> ct:fail(fills_not_counted)
    end,
    peer:stop(Peer).

%% Sends Msg to To until one send is refused (counted in `overflow_drops'),
%% at most Max times; {how many were sent, how many were refused}. Nothing
%% else pushes to C meanwhile: each send's own count is the change.
send_until_refused(C, To, Msg, Budget, Max) ->
    send_until_refused(C, To, Msg, Budget, Max, 0).

send_until_refused(_C, _To, _Msg, _Budget, Max, Max) ->
    ct:fail({never_refused, Max});
send_until_refused(C, To, Msg, Budget, Max, Sent) ->
    {ok, #{overflow_drops := D0}} = ecall:stats(C),
    Msg = ecall:send(To, Msg),
    {ok, #{overflow_drops := D1, queued_bytes := Q}} = ecall:stats(C),
    ?assert(Q =< Budget),
    case D1 - D0 of
        0 -> send_until_refused(C, To, Msg, Budget, Max, Sent + 1);
        1 -> {Sent + 1, 1}
    end.

%% Rounds of 100-byte sends until one is refused, each followed by a call
%% of a 1 KB argument, until a call says {error, overload}, at most Max
%% rounds; {sends, sends refused, rounds}.
call_until_overload(C, To, Small, Budget, Max) ->
    call_until_overload(C, To, Small, Budget, Max, 1, 0, 0).

call_until_overload(_C, _To, _Small, _Budget, Max, Round, _Sent, _Refused) when Round > Max ->
    ct:fail({no_call_refused, Max});
call_until_overload(C, To, Small, Budget, Max, Round, Sent, Refused) ->
    {S, R} = send_until_refused(C, To, Small, Budget, 100000),
    case ecall:call(C, ecall_test_nodes, echo, [binary:copy(<<"c">>, 1000)], 0) of
        {error, overload} ->
            {Sent + S, Refused + R, Round};
        {error, {badrpc, timeout}} ->
            call_until_overload(C, To, Small, Budget, Max, Round + 1, Sent + S, Refused + R)
    end.

%% On the peer: counts `{fill, _}' messages until asked.
count_fills(N) ->
    receive
        {fill, _} -> count_fills(N + 1);
        {done, From} -> From ! {filled, self(), N}
    end.

%% A peer connected with a byte budget of `Budget' (the setting is read
%% when the connection opens, then put back), and its OS pid.
budget_peer(Budget) ->
    ok = application:set_env(ecall, max_queue_bytes, Budget),
    {Peer, C} = start_peer(["-ecall", "discovery", "false"]),
    try ok = ecall:connect(C)
    after application:unset_env(ecall, max_queue_bytes)
    end,
    {Peer, C, erpc:call(C, os, getpid, [])}.
