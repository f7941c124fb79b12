%% A stateful property test (PropEr) of ecall on real nodes: generated
%% sequences of sends, casts, calls and faults between this node (A) and a
%% peer (B), each checked against what ecall promises, and shrunk to a
%% shortest failing sequence when a check fails.
%%
%% Commands: `send' from one of three sender processes (small terms, terms
%% past the NIF's inline bound (INLINE_MAX, native/ecall_nif's
%% encode/mod.rs), and terms bigger than a fragment, which go out in
%% fragments), `send_many' to two targets, `cast', `call' (functions that
%% return, raise, exit, throw, and sleep past the timeout), `disconnect' and
%% `connect', closing one link's socket, killing one of the peer's
%% receiver workers, stopping ecall on the peer and starting it again
%% (`application:stop/1': an orderly stop), SIGSTOP and SIGCONT of the
%% peer with pauses shorter and longer than `stall_timeout' in between,
%% switching `overflow' and `max_queue_bytes', and restarting the peer.
%%
%% Sends, casts and calls run in their own processes, so that a caller
%% waiting for room (`overflow => block' to a stopped peer) leaves the
%% sequence going. What they did is checked at checkpoints: a restart of
%% the peer, and the end of a sequence. A checkpoint lets the peer run and
%% waits (on conditions) until everything has arrived or been counted;
%% then:
%% - per-sender order holds at every target, and nothing came twice;
%% - every request (send, send_many, cast, call) arrived once or is
%%   counted as dropped (`closed_drops', `dropped', `overflow_drops') or
%%   as `unconfirmed' (written, not acknowledged when its connection
%%   closed: it may have arrived); a link's socket closed under it, a
%%   killed receiver, an orderly stop of ecall on the peer lose nothing;
%% - a send_many reached both of its targets or neither (it is one
%%   request);
%% - every call returned a documented term (the table of ecall:call/5),
%%   its exact result when nothing disturbed it, within its timeout plus
%%   ?CALL_BOUND (a bound against hangs, not a speed check);
%% - no reply landed in a caller's mailbox after its call returned;
%% - the connection's byte budget holds nothing any more;
%% - the peer node is alive.
%% At the end of a sequence, once its processes are gone, the counts of
%% processes, ports, ETS tables and file descriptors on both nodes are
%% back where they were before it.
%%
%% Reproducing: the run prints its seed (ECALL_CHAOS_SEED=A,B,C runs the
%% same sequences again), and a failure prints the shrunk sequence.
%% ECALL_CHAOS_TESTS sets the number of sequences (CI: ?CI_TESTS);
%% `make chaos' runs more.
-module(ecall_chaos_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([chaos/1]).
%% PropEr's state machine.
-export([initial_state/0, command/1, precondition/2, next_state/3, postcondition/3]).
%% The commands.
-export([send/2, send_many/2, cast/1, call/2, disconnect/0, connect/0, kill_link/1,
         kill_receiver/1, restart_ecall/0,
         stop_peer/0, cont_peer/0, pause/1, set_overflow/1, set_max_queue_bytes/1,
         restart_peer/0]).
%% Run on the peer.
-export([collector/0, cast_fun/3, callee/4]).

%% Sequences CI runs; ECALL_CHAOS_TESTS overrides.
-define(CI_TESTS, 25).
-define(SENDERS, 3).
%% Sequences are up to this long (half as long on average).
-define(LENGTH, 60).
%% A's stall_timeout: a pause past it reaps a link that is writing.
-define(STALL_MS, 1000).
%% The small byte budget: a few of the largest messages.
-define(SMALL_BUDGET, 300000).
%% A call returns within its timeout plus this (a hang guard: ms).
-define(CALL_BOUND, 10000).
%% Where the world of a sequence is kept (the test process's dictionary).
-define(W, ecall_chaos_world).

suite() ->
    [{timetrap, {minutes, 30}}].

all() ->
    [chaos].

init_per_suite(Config) ->
    ok = application:load(ecall),
    %% Connections are opened by the commands only; the short stall
    %% timeout lets a pause reap a link (read at open).
    ok = application:set_env(ecall, discovery, false),
    ok = application:set_env(ecall, stall_timeout, ?STALL_MS),
    ok = ecall_test_nodes:start_ecall(),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall),
    [application:unset_env(ecall, K) || K <- [discovery, stall_timeout, overflow,
                                               max_queue_bytes]],
    ok.

%%--------------------------------------------------------------------
%% The property

chaos(_Config) ->
    Tests = case os:getenv("ECALL_CHAOS_TESTS") of
                false -> ?CI_TESTS;
                N -> list_to_integer(N)
            end,
    Seed = case os:getenv("ECALL_CHAOS_SEED") of
               false -> list_to_tuple([rand:uniform(1 bsl 30) || _ <- [1, 2, 3]]);
               S -> list_to_tuple([list_to_integer(X) || X <- string:lexemes(S, ",")])
           end,
    {A1, A2, A3} = Seed,
    ct:pal("chaos: ~b sequences; to run the same ones again: ECALL_CHAOS_SEED=~b,~b,~b",
           [Tests, A1, A2, A3]),
    start_world(),
    try
        _ = rand:seed(exsss, Seed),
        put(ecall_chaos_ran, #{}),
        Prop = proper:forall(proper_statem:commands(?MODULE),
                             fun run/1),
        case proper:quickcheck(Prop, [{numtests, Tests}, {start_size, ?LENGTH}, {max_size, ?LENGTH},
                                      {max_shrinks, 100},
                                      {on_output, fun(F, A) -> ct:pal(F, A) end}]) of
            true ->
                ct:pal("chaos: commands run: ~p", [get(ecall_chaos_ran)]);
            Other ->
                Shrunk = proper:counterexample(),
                {Last, Problems} = get(ecall_chaos_last),
                ct:pal("chaos: failed (~p); seed ~b,~b,~b; shrunk sequence:~n~p~n"
                       "the last sequence that failed:~n~p~nits problems:~n~p",
                       [Other, A1, A2, A3, Shrunk, Last, Problems]),
                ct:fail({chaos_failed, Other, {seed, Seed}})
        end
    after
        stop_world()
    end.

%% One sequence: its checks, and what failed printed when one did.
run(Cmds) ->
    Ran = lists:foldl(fun({set, _, {call, _, F, _}}, Acc) -> maps:update_with(F, fun(N) -> N + 1 end, 1, Acc) end,
                      get(ecall_chaos_ran), Cmds),
    put(ecall_chaos_ran, Ran#{sequences => maps:get(sequences, Ran, 0) + 1}),
    %% PropEr 1.2 cannot report an exception on OTP 23 and later (it asks
    %% for erlang:get_stacktrace/0): commands and checks return theirs.
    {History, Problems} =
        try
            Before = begin_sequence(),
            {H, _State, Result} = proper_statem:run_commands(?MODULE, Cmds),
            {H, case Result of
                    ok -> end_sequence(Before);
                    _ -> abort_sequence(), [{result, Result}]
                end}
        catch
            Class:Reason:Stack ->
                abort_sequence(),
                {[], [{crashed, Class, Reason, Stack}]}
        end,
    Problems =:= [] orelse put(ecall_chaos_last, {Cmds, Problems}),
    proper:whenfail(
      fun() ->
              ct:pal("chaos: sequence failed:~n~p~nproblems: ~p~nlast history: ~p",
                     [Cmds, Problems, lists:sublist(lists:reverse(History), 3)])
      end,
      fun() -> Problems =:= [] end).

%%--------------------------------------------------------------------
%% The model: what the test knows without looking.

initial_state() ->
    #{connected => true, stopped => false, overflow => block, budget => default}.

command(#{connected := Conn, stopped := Stopped}) ->
    Sender = proper_types:integer(1, ?SENDERS),
    Size = proper_types:frequency([{6, small}, {3, big}, {1, fragments}]),
    Always = [{10, {call, ?MODULE, send, [Sender, Size]}},
              {3, {call, ?MODULE, send_many, [Sender, Size]}},
              {4, {call, ?MODULE, cast, [Sender]}},
              {5, {call, ?MODULE, call, [proper_types:elements([ret, raise, exit, throw, sleep]),
                                         proper_types:elements([100, 300])]}},
              {1, {call, ?MODULE, set_overflow, [proper_types:elements([block, drop, error])]}},
              {1, {call, ?MODULE, set_max_queue_bytes, [proper_types:elements([small, default])]}}],
    Faults = [{1, {call, ?MODULE, disconnect, []}} || Conn]
        ++ [{2, {call, ?MODULE, connect, []}} || not Conn, not Stopped]
        ++ [{1, {call, ?MODULE, kill_link, [proper_types:integer(1, 2)]}} || Conn, not Stopped]
        ++ [{1, {call, ?MODULE, kill_receiver, [proper_types:integer(1, 2)]}} || not Stopped]
        ++ [{1, {call, ?MODULE, restart_ecall, []}} || Conn, not Stopped]
        ++ [{1, {call, ?MODULE, stop_peer, []}} || not Stopped]
        ++ [{3, {call, ?MODULE, cont_peer, []}} || Stopped]
        ++ [{2, {call, ?MODULE, pause, [proper_types:elements([200, ?STALL_MS + 500])]}}
            || Stopped]
        ++ [{1, {call, ?MODULE, restart_peer, []}} || not Stopped],
    proper_types:frequency(Always ++ Faults).

precondition(#{connected := C}, {call, _, disconnect, []}) -> C;
precondition(#{connected := C, stopped := S}, {call, _, connect, []}) -> not C andalso not S;
precondition(#{connected := C, stopped := S}, {call, _, kill_link, _}) -> C andalso not S;
precondition(#{stopped := S}, {call, _, kill_receiver, _}) -> not S;
precondition(#{connected := C, stopped := S}, {call, _, restart_ecall, []}) -> C andalso not S;
precondition(#{stopped := S}, {call, _, stop_peer, []}) -> not S;
precondition(#{stopped := S}, {call, _, cont_peer, []}) -> S;
precondition(#{stopped := S}, {call, _, pause, _}) -> S;
precondition(#{stopped := S}, {call, _, restart_peer, []}) -> not S;
precondition(_, _) -> true.

next_state(S, _, {call, _, disconnect, []}) -> S#{connected := false};
next_state(S, _, {call, _, connect, []}) -> S#{connected := true};
next_state(S, _, {call, _, stop_peer, []}) -> S#{stopped := true};
next_state(S, _, {call, _, cont_peer, []}) -> S#{stopped := false};
next_state(S, _, {call, _, set_overflow, [O]}) -> S#{overflow := O};
next_state(S, _, {call, _, set_max_queue_bytes, [B]}) -> S#{budget := B};
next_state(S, _, {call, _, restart_peer, []}) -> S#{connected := true};
next_state(S, _, _) -> S.

%% What a command returns at once; the rest is checked at checkpoints.
postcondition(_, _, {crashed, _, _, _}) -> false;
postcondition(_, {call, _, disconnect, []}, R) -> R =:= ok;
postcondition(_, {call, _, connect, []}, R) -> R =:= ok;
postcondition(_, {call, _, restart_ecall, []}, R) -> R =:= ok;
postcondition(_, {call, _, restart_peer, []}, R) -> R =:= [];
postcondition(_, _, _) -> true.

%%--------------------------------------------------------------------
%% The world: the peer, its collectors, the senders, what was done.

start_world() ->
    {Peer, B} = ecall_test_nodes:start_peer([], [?MODULE]),
    put(?W, #{peer => Peer, b => B}),
    ok.

stop_world() ->
    #{peer := Peer, b := B} = get(?W),
    _ = os:cmd("kill -CONT " ++ os_pid(B)),
    _ = ecall:disconnect(B),
    peer:stop(Peer).

w(Key) -> maps:get(Key, get(?W)).
w(Key, Value) -> put(?W, (get(?W))#{Key => Value}).

%% Before a sequence: the settings and connections of the initial state,
%% then what a leak check compares against, then the sequence's processes.
begin_sequence() ->
    ok = application:unset_env(ecall, overflow),
    ok = application:unset_env(ecall, max_queue_bytes),
    B = w(b),
    %% A connection of its own: counters from zero, default settings.
    _ = ecall:disconnect(B),
    ok = ecall:connect(B),
    ok = ecall_test_nodes:connect_back(B),
    w(os_pid, os_pid(B)),
    Counts = {resources(node()), resources(B)},
    Senders = [{I, spawn(fun() -> sender(I, B) end)} || I <- lists:seq(1, ?SENDERS)],
    w(senders, maps:from_list(Senders)),
    w(faults, 0),
    w(tasks, #{}),
    w(stopped, false),
    w(overflow, block),
    new_epoch(),
    w(b_counts, element(2, Counts)),
    element(1, Counts).

%% A new epoch: new collectors on the peer, what the senders target, and
%% counts from zero.
new_epoch() ->
    B = w(b),
    C1 = erpc:call(B, erlang, spawn, [?MODULE, collector, []]),
    C2 = erpc:call(B, erlang, spawn, [?MODULE, collector, []]),
    w(collectors, {C1, C2}),
    [Pid ! {collectors, C1, C2} || Pid <- maps:values(w(senders))],
    w(calls, []),
    w(closed, #{closed_drops => 0, dropped => 0, overflow_drops => 0, unconfirmed => 0}),
    w(issued, 0),
    w(order_cut, #{}),
    ok.

%% After a sequence that ran to its end: the last checkpoint, then the
%% sequence's processes are stopped, the settings put back, and the
%% resources counted again.
end_sequence(AtBegin) ->
    Problems = checkpoint(),
    stop_processes(),
    ok = application:unset_env(ecall, overflow),
    ok = application:unset_env(ecall, max_queue_bytes),
    B = w(b),
    Leaks = case Problems of
                [] ->
                    ok = ecall:connect(B),
                    leaks(node(), AtBegin) ++ leaks(B, w(b_counts));
                _ ->
                    []
            end,
    Problems ++ Leaks.

%% After a sequence that crashed: the peer runs again, the rest stops.
abort_sequence() ->
    _ = (catch os:cmd("kill -CONT " ++ w(os_pid))),
    _ = (catch stop_processes()),
    ok.

stop_processes() ->
    [exit(Pid, kill) || Pid <- maps:values(w(senders))],
    [exit(Pid, kill) || {_Id, Pid, _, _, _} <- w(calls)],
    B = w(b),
    _ = [catch erpc:call(B, erlang, exit, [C, kill]) || C <- tuple_to_list(w(collectors))],
    ok.

%%--------------------------------------------------------------------
%% Commands: each returns `{crashed, Class, Reason, Stack}' instead of
%% raising (see run/1).

send(A1, A2) -> safe(fun() -> do_send(A1, A2) end).
send_many(A1, A2) -> safe(fun() -> do_send_many(A1, A2) end).
cast(A1) -> safe(fun() -> do_cast(A1) end).
call(A1, A2) -> safe(fun() -> do_call(A1, A2) end).
disconnect() -> safe(fun() -> do_disconnect() end).
connect() -> safe(fun() -> do_connect() end).
kill_link(A1) -> safe(fun() -> do_kill_link(A1) end).
kill_receiver(A1) -> safe(fun() -> do_kill_receiver(A1) end).
restart_ecall() -> safe(fun() -> do_restart_ecall() end).
stop_peer() -> safe(fun() -> do_stop_peer() end).
cont_peer() -> safe(fun() -> do_cont_peer() end).
pause(A1) -> safe(fun() -> do_pause(A1) end).
set_overflow(A1) -> safe(fun() -> do_set_overflow(A1) end).
set_max_queue_bytes(A1) -> safe(fun() -> do_set_max_queue_bytes(A1) end).
restart_peer() -> safe(fun() -> do_restart_peer() end).

safe(Fun) ->
    try Fun()
    catch Class:Reason:Stack -> {crashed, Class, Reason, Stack}
    end.

do_send(Sender, Size) ->
    sender_do(Sender, {send, Size}).

do_send_many(Sender, Size) ->
    sender_do(Sender, {send_many, Size}).

do_cast(Sender) ->
    sender_do(Sender, cast).

sender_do(Sender, What) ->
    maps:get(Sender, w(senders)) ! What,
    w(tasks, maps:update_with(Sender, fun(N) -> N + 1 end, 1, w(tasks))),
    ok.

%% A call in a process of its own; the result comes to this process.
do_call(Kind, Timeout) ->
    Id = length(w(calls)) + 1,
    Self = self(),
    {C1, _} = w(collectors),
    B = w(b),
    Pid = spawn(fun() -> caller(Self, Id, B, Kind, Timeout, C1) end),
    Clean = not w(stopped) andalso w(overflow) =:= block,
    w(calls, [{Id, Pid, Kind, Timeout, Clean andalso w(faults)} | w(calls)]),
    ok.

do_disconnect() ->
    fault(),
    B = w(b),
    %% The close waits up to 3 s for the peer to replay what the links
    %% delivered before a caller goes on by `!' (doc/behaviour.md,
    %% "Order"): a stopped peer does not, so the messages given to the
    %% senders so far (a sender's k-th is its number k) may be overtaken.
    w(stopped) andalso w(order_cut, w(tasks)),
    R = ecall:disconnect(B),
    case ecall:last_stats(B) of
        {ok, Last} ->
            w(closed, maps:map(fun(K, V) -> V + maps:get(K, Last, 0) end, w(closed)));
        _ ->
            ok
    end,
    R.

do_connect() ->
    ecall:connect(w(b)).

%% Closes the socket of A's link K on the peer's side: the link writes
%% again what the peer had not acknowledged; nothing is lost.
do_kill_link(K) ->
    fault(),
    Id = lists:nth(K, ecall:identities()),
    {D0, _} = link_state(K),
    R = catch erpc:call(w(b), ecall_test_nodes, drop_connection, [Id], 30000),
    %% The fault is over once the link has seen it and is up again: a call
    %% made after the command does not meet it.
    _ = poll(fun() -> {D, Up} = link_state(K), D > D0 andalso Up =:= 1 end,
             erlang:monotonic_time(millisecond) + 30000),
    {R, link_state(K)}.

%% Kills receiver worker K of the peer (if it has that many), and waits
%% for its successor: what the dead one had not processed comes again.
do_kill_receiver(K) ->
    %% A fault for the calls: what comes again comes after a reconnect,
    %% which a short timeout may not wait for.
    fault(),
    B = w(b),
    Names = erpc:call(B, ecall_receiver_sup, names, []),
    Name = binary_to_atom(lists:nth(1 + (K - 1) rem length(Names), Names)),
    Old = erpc:call(B, erlang, whereis, [Name]),
    _ = erpc:call(B, erlang, exit, [Old, kill]),
    true = poll(fun() ->
                        New = erpc:call(B, erlang, whereis, [Name]),
                        is_pid(New) andalso New =/= Old
                end, erlang:monotonic_time(millisecond) + 30000),
    %% The fault is over once the successor has taken over (it answers a
    %% system message after its init, which closed the links it served)
    %% and every link is back: a call made after the command does not
    %% meet it.
    _ = erpc:call(B, sys, get_state, [erpc:call(B, erlang, whereis, [Name])]),
    true = poll(fun() -> links_back(B) end, erlang:monotonic_time(millisecond) + 30000),
    ok.

%% Whether every link of the connection to `B' is up and connected there
%% (no connection: nothing to wait for).
links_back(B) ->
    case ecall:stats(B) of
        {error, not_connected} ->
            true;
        {ok, #{links := L, links_up := L}} ->
            Hidden = erpc:call(B, erlang, nodes, [hidden]),
            lists:all(fun(Id) -> lists:member(Id, Hidden) end, ecall:identities());
        {ok, _} ->
            false
    end.

%% Stops ecall on the peer (an orderly stop: this node's connection to it
%% writes out what it holds first) and starts it again, then connects
%% both ways as at the start of a sequence. Traffic meanwhile goes by
%% plain distribution, behind the close.
do_restart_ecall() ->
    fault(),
    B = w(b),
    ok = erpc:call(B, application, stop, [ecall]),
    case ecall:last_stats(B) of
        {ok, Last} ->
            w(closed, maps:map(fun(K, V) -> V + maps:get(K, Last, 0) end, w(closed)));
        _ ->
            ok
    end,
    {ok, _} = erpc:call(B, application, ensure_all_started, [ecall]),
    ok = ecall:connect(B),
    ecall_test_nodes:connect_back(B).

%% Link K's disconnects, and whether it is up (1) or not (0).
link_state(K) ->
    {ok, #{per_link := Links}} = ecall:stats(w(b)),
    [{D, U}] = [{D, U} || #{link := L, disconnects := D, up := U} <- Links, L =:= K],
    {D, U}.

do_stop_peer() ->
    fault(),
    w(stopped, true),
    os:cmd("kill -STOP " ++ w(os_pid)).

do_cont_peer() ->
    w(stopped, false),
    os:cmd("kill -CONT " ++ w(os_pid)).

%% The peer stays stopped this long: the fault's duration.
do_pause(Ms) ->
    receive after Ms -> ok end.

do_set_overflow(O) ->
    O =:= block orelse fault(),
    w(overflow, O),
    application:set_env(ecall, overflow, O).

do_set_max_queue_bytes(small) -> application:set_env(ecall, max_queue_bytes, ?SMALL_BUDGET);
do_set_max_queue_bytes(default) -> application:unset_env(ecall, max_queue_bytes).

%% A checkpoint, then a new peer node, connected both ways.
do_restart_peer() ->
    Problems = checkpoint(),
    #{peer := Peer, b := Old} = get(?W),
    _ = [catch erpc:call(Old, erlang, exit, [C, kill]) || C <- tuple_to_list(w(collectors))],
    _ = ecall:disconnect(Old),
    peer:stop(Peer),
    {Peer1, B} = ecall_test_nodes:start_peer([], [?MODULE]),
    w(peer, Peer1),
    w(b, B),
    w(os_pid, os_pid(B)),
    ok = ecall:connect(B),
    ok = ecall_test_nodes:connect_back(B),
    w(b_counts, resources(B)),
    [Pid ! {peer, B} || Pid <- maps:values(w(senders))],
    new_epoch(),
    Problems.

fault() ->
    w(faults, w(faults) + 1).

%%--------------------------------------------------------------------
%% Checkpoints

%% Lets the peer run and everything in flight land, then checks the epoch.
%% Returns the problems found.
checkpoint() ->
    B = w(b),
    _ = os:cmd("kill -CONT " ++ w(os_pid)),
    w(stopped, false),
    {C1, C2} = w(collectors),
    Attempts = issued(),
    Calls = [await_call(Call) || Call <- lists:reverse(w(calls))],
    Sent = Attempts + length(Calls),
    %% Everything arrived or was counted (a cast runs in a process of its
    %% own on the peer; calls still running are waited for). When that
    %% does not come, the checks below say what is missing.
    Counted = fun() -> counted(B) end,
    Got = fun() -> {report(C1), report(C2)} end,
    _ = poll(fun() ->
                     {R1, R2} = Got(),
                     #{total := T, unconfirmed := U} = Counted(),
                     Delivered = delivered(R1, R2),
                     Delivered + T + U >= Sent andalso running(R1) =:= 0
             end, erlang:monotonic_time(millisecond) + 30000),
    %% Replies written by the peer before now are in: its links to us are
    %% flushed, and our receivers have handled what came.
    _ = (catch erpc:call(B, ecall_test_nodes, flush_links, [node()], 30000)),
    ok = ecall_test_nodes:sync_receivers(node()),
    {R1, R2} = Got(),
    #{total := Total, unconfirmed := Unconfirmed} = Count = Counted(),
    Delivered = delivered(R1, R2),
    Fault = w(faults),
    [{accounting, #{sent => Sent, delivered => Delivered, counted => Count}}
     || Delivered + Total > Sent orelse Delivered + Total + Unconfirmed < Sent]
        ++ [{calls_running, running(R1)} || running(R1) =/= 0]
        ++ [{duplicates, C, Dups} || {C, R} <- [{1, R1}, {2, R2}], Dups <- [dups(R)], Dups =/= []]
        ++ [{order, C, Bad} || {C, R} <- [{1, R1}, {2, R2}], Bad <- [disorder(R, w(order_cut))], Bad =/= []]
        ++ [{send_many_split, Split} || Split <- [split(R1, R2)], Split =/= []]
        ++ [{call, Id, Kind, Result} || {Id, Kind, Result, _, _, _} = C <- Calls,
                                         not call_ok(C, Fault)]
        ++ [{call_late, Id, Ms} || {Id, _, _, Ms, _, Timeout} <- Calls,
                                   Ms > Timeout + ?CALL_BOUND]
        ++ [{late_reply, Id, Msgs} || {Id, Msgs} <- mailboxes()]
        ++ [{budget_held, Held} || Held <- [held(B)], Held =/= 0]
        ++ [{peer_down, B} || pong =/= net_adm:ping(B)].

%% Whether `Cond' held before `Deadline' (polled: what it waits for sends
%% no signal).
poll(Cond, Deadline) ->
    Cond() orelse (erlang:monotonic_time(millisecond) < Deadline
                   andalso begin receive after 20 -> ok end, poll(Cond, Deadline) end).

%% Requests the senders made in this epoch, once they have made every one
%% they were told to.
issued() ->
    w(issued, w(issued) + lists:sum([sync(Pid) || Pid <- maps:values(w(senders))])),
    w(issued).

%% What the sender did since its last sync: its attempts.
sync(Pid) ->
    Ref = monitor(process, Pid),
    Pid ! {sync, self(), Ref},
    receive
        {Ref, N} -> demonitor(Ref, [flush]), N;
        {'DOWN', Ref, process, Pid, Why} -> ct:fail({sender_died, Why})
    after 60000 -> ct:fail({sender_stuck, process_info(Pid, [current_stacktrace, messages])})
    end.

await_call({Id, Pid, Kind, Timeout, Clean}) ->
    receive
        {called, Pid, Result, Ms} -> {Id, Kind, Result, Ms, Clean, Timeout}
    after Timeout + ?CALL_BOUND ->
            ct:fail({call_hangs, Id, Kind, process_info(Pid, current_stacktrace)})
    end.

%% Whether a call's result is documented, and exact when nothing disturbed
%% it: no fault since it was made (`Clean' is the fault count then).
call_ok({Id, Kind, Result, _Ms, Clean, _Timeout}, Faults) ->
    Exact = exact(Kind, Id, Result),
    Exact orelse (Clean =/= Faults andalso failure(Result)).

exact(ret, Id, R) -> R =:= {ok, {ret, Id}};
exact(throw, Id, R) -> R =:= {ok, {thrown, Id}};
exact(raise, Id, {error, {exception, error, {raised, Id}, Stack}}) -> is_list(Stack);
exact(exit, Id, R) -> R =:= {error, {exception, exit, {exited, Id}, []}};
exact(sleep, _Id, R) -> R =:= {error, {badrpc, timeout}};
exact(_, _, _) -> false.

%% The failures of the table of ecall:call/5.
failure({error, overload}) -> true;
failure({error, {badrpc, R}}) ->
    lists:member(R, [timeout, noconnection, nodedown, normal, shutdown, transport_change]);
failure(_) -> false.

%% Callers whose mailbox holds anything after their call returned.
mailboxes() ->
    [{Id, Msgs} || {Id, Pid, _, _, _} <- w(calls), Msgs <- [mailbox(Pid)], Msgs =/= []].

mailbox(Pid) ->
    Ref = monitor(process, Pid),
    Pid ! {check, self(), Ref},
    receive
        {Ref, Msgs} -> demonitor(Ref, [flush]), Msgs;
        {'DOWN', Ref, process, Pid, Why} -> [{caller_died, Why}]
    after 30000 -> [caller_stuck]
    end.

%% The bytes the connection's budget still holds once everything is
%% written or dropped: 0 (polled: a link gives them back after its write).
held(B) ->
    Held = fun() ->
                   case ecall:stats(B) of
                       {ok, #{queued_bytes := Q}} -> Q;
                       {error, _} -> 0
                   end
           end,
    _ = poll(fun() -> Held() =:= 0 end, erlang:monotonic_time(millisecond) + 10000),
    Held().

%% Requests counted as dropped: by the connection now, and by those closed
%% in this epoch.
counted(B) ->
    Now = case ecall:stats(B) of
              {ok, S} -> S;
              {error, _} -> #{}
          end,
    C = maps:map(fun(K, V) -> V + maps:get(K, Now, 0) end, w(closed)),
    #{closed_drops := Q, dropped := D, overflow_drops := O} = C,
    C#{total => Q + D + O}.

%%--------------------------------------------------------------------
%% What the collectors saw

report(C) ->
    C ! {report, self()},
    receive {collected, C, Log} -> Log after 30000 -> ct:fail({no_report, C}) end.

%% Requests that arrived: ids seen at either collector (a send_many goes
%% to both), calls that began.
delivered(R1, R2) ->
    length(lists:usort([Id || {Kind, Id} <- R1 ++ R2, Kind =/= done])).

running(R1) ->
    length([I || {exec, {call, I}} <- R1]) - length([I || {done, {call, I}} <- R1]).

dups(R) ->
    Ids = [E || {Kind, _} = E <- R, Kind =/= done],
    Ids -- lists:usort(Ids).

%% Messages of a sender that came after a later one of the same sender,
%% but those made before a close that could not keep order (`Cut', see
%% do_disconnect/0).
disorder(R, Cut) ->
    {_, Bad} = lists:foldl(
                 fun({m, {_, S, Seq} = Id}, {Last, Bad}) ->
                         case maps:get(S, Last, 0) of
                             Prev when Seq > Prev -> {Last#{S => Seq}, Bad};
                             Prev ->
                                 case Seq =< maps:get(S, Cut, 0) of
                                     true -> {Last, Bad};
                                     false -> {Last, [{Id, after_seq, Prev} | Bad]}
                                 end
                         end;
                    (_, Acc) ->
                         Acc
                 end, {#{}, []}, R),
    lists:reverse(Bad).

%% send_many requests seen by one target only.
split(R1, R2) ->
    Many = fun(R) -> sets:from_list([Id || {m, {many, _, _} = Id} <- R]) end,
    {M1, M2} = {Many(R1), Many(R2)},
    sets:to_list(sets:subtract(sets:union(M1, M2), sets:intersection(M1, M2))).

%%--------------------------------------------------------------------
%% Leaks

%% ecall's processes (Common Test's own come and go on this node), all
%% ports and ETS tables, and the sockets among the file descriptors (this
%% node's log files come and go too).
resources(Node) ->
    erpc:call(Node, fun() ->
                            Dir = "/proc/self/fd",
                            {ok, Fds} = file:list_dir(Dir),
                            Sockets = [F || F <- Fds,
                                            {ok, "socket:" ++ _} <- [file:read_link(filename:join(Dir, F))]],
                            #{processes => length([P || P <- processes(),
                                                        application:get_application(P) =:= {ok, ecall}]),
                              ports => length(erlang:ports()),
                              ets => length(ets:all()),
                              sockets => length(Sockets)}
                    end).

%% What grew since `Before', once every count is back or 30 s have passed.
leaks(Node, Before) ->
    Deadline = erlang:monotonic_time(millisecond) + 30000,
    leaks(Node, Before, Deadline).

leaks(Node, Before, Deadline) ->
    Now = resources(Node),
    Grew = maps:filter(fun(K, V) -> V > maps:get(K, Before) end, Now),
    case map_size(Grew) =:= 0 orelse erlang:monotonic_time(millisecond) > Deadline of
        true -> [{leak, Node, Before, Now, details(Node)} || map_size(Grew) > 0];
        false -> receive after 50 -> leaks(Node, Before, Deadline) end
    end.

%% What a leak report shows of a node: its ports and connected nodes, and
%% what its file descriptors are.
details(Node) ->
    erpc:call(Node, fun() ->
                            Dir = "/proc/self/fd",
                            {ok, Fds} = file:list_dir(Dir),
                            Ecall = [P || P <- processes(),
                                          application:get_application(P) =:= {ok, ecall}],
                            #{ports => [{erlang:port_info(P, name), erlang:port_info(P, connected),
                                         inet:sockname(P), inet:peername(P)}
                                        || P <- erlang:ports()],
                              ecall => [process_info(P, [registered_name, initial_call,
                                                         current_function, dictionary])
                                        || P <- Ecall],
                              nodes => nodes(connected),
                              fds => [file:read_link(filename:join(Dir, F)) || F <- Fds]}
                    end).

os_pid(Node) ->
    erpc:call(Node, os, getpid, []).

%%--------------------------------------------------------------------
%% The processes of a sequence

%% A sender: sends, send_manys and casts in its own order; answers a sync
%% with how many it made since the last one.
sender(I, B) ->
    receive {collectors, C1, C2} -> sender(I, B, C1, C2, 0, 0) end.

sender(I, B, C1, C2, Seq, N) ->
    receive
        {send, Size} ->
            _ = ecall:send(C1, {m, {send, I, Seq + 1}, payload(Size)}),
            sender(I, B, C1, C2, Seq + 1, N + 1);
        {send_many, Size} ->
            ok = ecall:send_many([C1, C2], {m, {many, I, Seq + 1}, payload(Size)}),
            sender(I, B, C1, C2, Seq + 1, N + 1);
        cast ->
            _ = ecall:cast(B, ?MODULE, cast_fun, [C1, I, Seq + 1]),
            sender(I, B, C1, C2, Seq + 1, N + 1);
        {peer, B1} ->
            sender(I, B1, C1, C2, Seq, N);
        {collectors, D1, D2} ->
            sender(I, B, D1, D2, Seq, N);
        {sync, From, Ref} ->
            From ! {Ref, N},
            sender(I, B, C1, C2, Seq, 0)
    end.

payload(small) -> <<"s">>;
payload(big) -> binary:copy(<<"b">>, 20 * 1024);
payload(fragments) -> binary:copy(<<"f">>, 100 * 1024).

caller(Owner, Id, B, Kind, Timeout, C1) ->
    T0 = erlang:monotonic_time(millisecond),
    Result = ecall:call(B, ?MODULE, callee, [Kind, Id, Timeout, C1], Timeout),
    Owner ! {called, self(), Result, erlang:monotonic_time(millisecond) - T0},
    receive
        {check, From, Ref} ->
            {messages, Msgs} = process_info(self(), messages),
            From ! {Ref, Msgs}
    end.

%%--------------------------------------------------------------------
%% On the peer

%% Keeps what arrived, in order (ids only), until asked for it.
collector() ->
    collector([]).

collector(Log) ->
    receive
        {m, Id, _Payload} -> collector([{m, Id} | Log]);
        {cast, Id} -> collector([{cast, Id} | Log]);
        {exec, Id} -> collector([{exec, Id} | Log]);
        {done, Id} -> collector([{done, Id} | Log]);
        {report, To} -> To ! {collected, self(), lists:reverse(Log)}, collector(Log)
    end.

cast_fun(C1, I, Seq) ->
    C1 ! {cast, {I, Seq}}.

callee(Kind, Id, Timeout, C1) ->
    C1 ! {exec, {call, Id}},
    try
        case Kind of
            ret -> {ret, Id};
            throw -> throw({thrown, Id});
            raise -> error({raised, Id});
            exit -> exit({exited, Id});
            sleep -> receive after Timeout + 200 -> {slept, Id} end
        end
    after
        C1 ! {done, {call, Id}}
    end.
