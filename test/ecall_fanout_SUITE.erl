%% ecall:send_many/2 on real nodes: this node and B, both running ecall,
%% connected through the links. One message to many targets: each gets it
%% exactly once, in the caller's order also when the caller mixes send/2
%% and send_many/2; local, remote and dead-node targets, registered names;
%% bad input refused with nothing sent.
-module(ecall_fanout_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([every_target_once_in_order/1, local_remote_and_dead_targets/1,
         registered_names/1, a_long_list_of_every_kind/1, bad_input_sends_nothing/1,
         a_peer_that_goes_away_midway/1, a_pg_group_on_two_nodes/1,
         one_target_per_node_goes_as_sends/1]).
%% Run on B.
-export([target/1, alias_target/1, pg_start/1, trace_requests/1]).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [every_target_once_in_order, local_remote_and_dead_targets, registered_names,
     a_long_list_of_every_kind, bad_input_sends_nothing, a_peer_that_goes_away_midway, a_pg_group_on_two_nodes,
     one_target_per_node_goes_as_sends].

init_per_suite(Config) ->
    ecall_test_nodes:start_b(Config).

end_per_suite(Config) ->
    ecall_test_nodes:stop_b(Config).

%% 50 targets on B. One caller sends, 200 times, a send/2 to one target
%% then a send_many/2 to all: every target gets each of its messages once,
%% in the order sent. Each send_many is one push (one request for the
%% node), not one per target.
every_target_once_in_order(Config) ->
    B = ?config(b, Config),
    Targets = [erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]) || _ <- lists:seq(1, 50)],
    N = 200,
    {ok, #{pushed := P0}} = ecall:stats(B),
    lists:foreach(fun(I) ->
                          ecall:send(lists:nth(1 + I rem 50, Targets), {seq, 2 * I - 1}),
                          ok = ecall:send_many(Targets, {seq, 2 * I})
                  end, lists:seq(1, N)),
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(2 * N, P1 - P0),
    Got = [collect(T) || T <- Targets],
    [begin
         Seqs = [S || {seq, S} <- Msgs],
         Expected = lists:sort([2 * I || I <- lists:seq(1, N)]
                               ++ [2 * I - 1 || I <- lists:seq(1, N), 1 + I rem 50 =:= K]),
         ?assertEqual(Expected, Seqs)
     end || {K, Msgs} <- lists:zip(lists:seq(1, 50), Got)].

%% Targets on this node, on B and on a node that is gone: the live ones
%% get the message once; the dead one is ignored, as `!' ignores it. B's
%% five targets get it through the links, as one request.
local_remote_and_dead_targets(Config) ->
    B = ?config(b, Config),
    {Peer, C} = ecall_test_nodes:start_peer(["-ecall", "discovery", "false"]),
    Dead = erpc:call(C, erlang, spawn, [?MODULE, target, [self()]]),
    peer:stop(Peer),
    Local = [spawn_link(?MODULE, target, [self()]) || _ <- lists:seq(1, 5)],
    Remote = [erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]) || _ <- lists:seq(1, 5)],
    P0 = pushed(B),
    ?assertEqual(ok, ecall:send_many(Local ++ [Dead] ++ Remote, hello)),
    ?assertEqual(1, pushed(B) - P0),
    [?assertEqual([hello], collect(T)) || T <- Local ++ Remote].

%% Requests pushed to `Node''s queues so far (counted at the push).
pushed(Node) ->
    {ok, #{pushed := P}} = ecall:stats(Node),
    P.

%% Registered names, on this node (a bare name or {Name, node()}) and on
%% B ({Name, B}); a name not registered on B is counted, as for send/2.
registered_names(Config) ->
    B = ?config(b, Config),
    LocalT = spawn_link(?MODULE, target, [self()]),
    true = register(ecall_fanout_local, LocalT),
    RemoteT = erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]),
    true = erpc:call(B, erlang, register, [ecall_fanout_remote, RemoteT]),
    #{receivers := #{dead_letters := D0}} = erpc:call(B, ecall, stats, []),
    ok = ecall:send_many([ecall_fanout_local, {ecall_fanout_local, node()},
                          {ecall_fanout_remote, B}, {nobody_here, B}], named),
    ?assertEqual([named, named], collect(LocalT)),
    ?assertEqual([named], collect(RemoteT)),
    #{receivers := #{dead_letters := D1}} = erpc:call(B, ecall, stats, []),
    ?assertEqual(1, D1 - D0).

%% A list long enough to be written in one call into the VM
%% (ecall_nif:push_many/4): 1,000 pids on B each get the message once, and
%% go on the wire in 15 bytes each (their node as an atom id, not its
%% name); then pids, an alias and names of B in one list: each target gets
%% it once, and the name not registered is counted; then a message too big
%% for the caller's scheduler.
a_long_list_of_every_kind(Config) ->
    B = ?config(b, Config),
    Pids = [erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]) || _ <- lists:seq(1, 1000)],
    {ok, #{bytes := Bytes0}} = ecall:stats(B),
    ok = ecall:send_many(Pids, long),
    %% Once the links have written and counted it (and a marker each).
    _ = ecall_test_nodes:flush_links(B),
    {ok, #{bytes := Bytes1}} = ecall:stats(B),
    %% 15 bytes a pid; with the node's name in every pid, 36.
    ct:pal("1,000 pids in ~b bytes", [Bytes1 - Bytes0]),
    ?assert(Bytes1 - Bytes0 >= 1000 * 15),
    ?assert(Bytes1 - Bytes0 < 1000 * 24),
    [?assertEqual([long], collect(T)) || T <- Pids],
    APid = erpc:call(B, erlang, spawn, [?MODULE, alias_target, [self()]]),
    Alias = receive {alias, APid, A} -> A after 10000 -> ct:fail(no_alias) end,
    Named = erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]),
    true = erpc:call(B, erlang, register, [ecall_fanout_long, Named]),
    #{receivers := #{dead_letters := D0}} = erpc:call(B, ecall, stats, []),
    Some = lists:sublist(Pids, 20),
    ok = ecall:send_many(Some ++ [Alias, {ecall_fanout_long, B}, {nobody_here, B}], mixed),
    %% A message past the NIF's inline bound (INLINE_MAX, native/ecall_nif's
    %% encode/mod.rs): its list is encoded on a dirty scheduler.
    Big = {big, binary:copy(<<"b">>, 20000)},
    ok = ecall:send_many(Some, Big),
    [?assertEqual([mixed, Big], collect(T)) || T <- Some],
    [?assertEqual([mixed], collect(T)) || T <- [APid, Named]],
    #{receivers := #{dead_letters := D1}} = erpc:call(B, ecall, stats, []),
    ?assertEqual(1, D1 - D0).

%% Not a proper list of destinations: badarg, and nothing sent, not even
%% to the valid destinations before the bad one.
bad_input_sends_nothing(Config) ->
    B = ?config(b, Config),
    T = erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]),
    L = spawn_link(?MODULE, target, [self()]),
    {ok, #{pushed := P0}} = ecall:stats(B),
    [?assertError(badarg, ecall:send_many(Bad, m))
     || Bad <- [not_a_list, [T | L], [T, L, "string"], [T, {1, 2}], [L, 42], #{}]],
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(P0, P1),
    ?assertEqual([], collect(T)),
    ?assertEqual([], collect(L)).

%% Targets on B and on C; C goes away (its OS process killed) halfway
%% through 200 fan-outs, with the first half perhaps still on its way.
%% B's targets get all 200, once each and in order; the fan-outs after
%% C's connection has closed return `ok' as before. Every fan-out goes to
%% B through the links (one request each), and so does each of the first
%% half to C.
a_peer_that_goes_away_midway(Config) ->
    B = ?config(b, Config),
    {_Peer, C} = ecall_test_nodes:start_peer(["-ecall", "discovery", "false"]),
    ok = ecall:connect(C),
    OsPid = erpc:call(C, os, getpid, []),
    OnB = [erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]) || _ <- lists:seq(1, 20)],
    OnC = [erpc:call(C, erlang, spawn, [?MODULE, target, [self()]]) || _ <- lists:seq(1, 20)],
    N = 200,
    PB0 = pushed(B),
    PC0 = pushed(C),
    [ok = ecall:send_many(OnB ++ OnC, {seq, I}) || I <- lists:seq(1, N div 2)],
    ?assertEqual(N div 2, pushed(C) - PC0),
    Conn = monitor(process, whereis(ecall_conn:name(C))),
    _ = os:cmd("kill -9 " ++ OsPid),
    receive {'DOWN', Conn, process, _, _} -> ok after 30000 -> ct:fail(connection_still_up) end,
    [ok = ecall:send_many(OnB ++ OnC, {seq, I}) || I <- lists:seq(N div 2 + 1, N)],
    ?assertEqual(N, pushed(B) - PB0),
    [?assertEqual([{seq, I} || I <- lists:seq(1, N)], collect(T)) || T <- OnB].

%% send_group/3: every member of a pg group, here and on B, gets the
%% message once (B's through the links, as one request); one that left
%% before the call does not; a scope that does not run is badarg.
a_pg_group_on_two_nodes(Config) ->
    B = ?config(b, Config),
    Scope = ecall_fanout_pg,
    {ok, _} = pg:start(Scope),
    {ok, _} = erpc:call(B, ?MODULE, pg_start, [Scope]),
    %% This node's view of the group, as pg tells it (it spreads joins and
    %% leaves to other nodes asynchronously).
    {Watch, []} = pg:monitor(Scope, room),
    Here = [spawn_link(?MODULE, target, [self()]) || _ <- lists:seq(1, 3)],
    There = [erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]) || _ <- lists:seq(1, 3)],
    ok = pg:join(Scope, room, Here),
    ok = erpc:call(B, pg, join, [Scope, room, There]),
    Left = hd(There),
    ok = erpc:call(B, pg, leave, [Scope, room, Left]),
    %% Until this node's scope has seen B's joins and the leave.
    ok = await_members(Scope, Watch, lists:sort(Here ++ tl(There)), []),
    P0 = pushed(B),
    ok = ecall:send_group(Scope, room, news),
    ?assertEqual(1, pushed(B) - P0),
    [?assertEqual([news], collect(T)) || T <- Here ++ tl(There)],
    ?assertEqual([], collect(Left)),
    ?assertError(badarg, ecall:send_group(no_such_scope, room, news)),
    ?assertError(badarg, ecall:send_group("scope", room, news)).

%% On B: a pg scope that outlives the erpc call that starts it.
pg_start(Scope) ->
    Self = self(),
    spawn(fun() -> {ok, Pid} = pg:start(Scope), unlink(Pid), Self ! {started, Pid},
                   receive never -> ok end end),
    receive {started, Pid} -> {ok, Pid} end.

%% Returns once the joins and leaves that pg:monitor/2 tells of make the
%% group `Want' (sorted); `Members', the group so far.
await_members(Scope, Watch, Want, Members) ->
    case lists:sort(Members) of
        Want ->
            pg:demonitor(Scope, Watch),
            ok;
        _ ->
            receive
                {Watch, join, room, Pids} -> await_members(Scope, Watch, Want, Members ++ Pids);
                {Watch, leave, room, Pids} -> await_members(Scope, Watch, Want, Members -- Pids)
            after 10000 -> ct:fail({pg_members, Members, Want})
            end
    end.

%% A target reached by an alias too: tells Owner the alias.
alias_target(Owner) ->
    Owner ! {alias, self(), alias()},
    target(Owner).

%% A target: keeps what it receives, in order, until asked.
%% A broadcast to one process per node (a local one and one on B): the
%% target on B gets each message as a send (`{send, Pid, Msg}' in B's
%% batches, not a `{send_many, ...}' of one), so it costs what a loop of
%% send/2 does; in order with the caller's send/2 to it, and with a
%% send_many/2 of two targets on B, which goes as one request.
one_target_per_node_goes_as_sends(Config) ->
    B = ?config(b, Config),
    Local = spawn_link(?MODULE, target, [self()]),
    [TB, TB2] = [erpc:call(B, erlang, spawn, [?MODULE, target, [self()]]) || _ <- [1, 2]],
    Tracer = erpc:call(B, erlang, spawn, [?MODULE, trace_requests, [self()]]),
    receive {tracing, Tracer} -> ok after 10000 -> ct:fail(no_tracer) end,
    lists:foreach(fun(I) ->
                          ok = ecall:send_many([Local, TB], {seq, 3 * I}),
                          ecall:send(TB, {seq, 3 * I + 1}),
                          ok = ecall:send_many([TB, TB2], {seq, 3 * I + 2})
                  end, lists:seq(1, 20)),
    ?assertEqual([{seq, S} || I <- lists:seq(1, 20), S <- [3 * I, 3 * I + 1, 3 * I + 2]],
                 collect(TB)),
    ?assertEqual([{seq, 3 * I} || I <- lists:seq(1, 20)], collect(Local)),
    Tracer ! {stop, self()},
    Requests = receive {traced, Tracer, Rs} -> Rs after 10000 -> ct:fail(no_trace) end,
    Sends = [S || {send, To, {seq, S}} <- Requests, To =:= TB],
    Many = [S || {send_many, _, {seq, S}} <- Requests],
    ?assertEqual([3 * I || I <- lists:seq(1, 20)],
                 [S || S <- Sends, S rem 3 =:= 0]),
    ?assertEqual([3 * I + 2 || I <- lists:seq(1, 20)], Many).

%% On B: traces what B's receivers get, until `{stop, From}'; then sends
%% From every request of those batches, in order.
trace_requests(Owner) ->
    Workers = [whereis(ecall_receiver_sup:name(I)) || I <- lists:seq(1, ecall_config:receivers())],
    [erlang:trace(W, true, ['receive']) || W <- Workers],
    Owner ! {tracing, self()},
    receive {stop, From} -> ok end,
    [erlang:trace(W, false, ['receive']) || W <- Workers],
    Ref = erlang:trace_delivered(all),
    From ! {traced, self(), traced_requests(Ref, [])}.

traced_requests(Ref, Acc) ->
    receive
        {trace, _, 'receive', {batch, _, _, Rs}} -> traced_requests(Ref, lists:reverse(Rs, Acc));
        {trace, _, 'receive', _} -> traced_requests(Ref, Acc);
        {trace_delivered, all, Ref} -> lists:reverse(Acc)
    end.

target(Owner) ->
    target(Owner, []).

target(Owner, Got) ->
    receive
        {collect, From, Ref} -> From ! {Ref, lists:reverse(Got)}, target(Owner, []);
        M -> target(Owner, [M | Got])
    end.

%% What `T' got so far. Asked with `!' after everything sent to it: for a
%% remote target the request goes by native distribution, so first a
%% round trip through the links (a call to B replayed after the caller's
%% sends) makes sure those were delivered.
collect(T) ->
    case node(T) =:= node() of
        true -> ok;
        false -> {ok, _} = ecall:call(node(T), erlang, node, [])
    end,
    Ref = make_ref(),
    T ! {collect, self(), Ref},
    receive {Ref, Got} -> Got after 10000 -> ct:fail({no_answer, T}) end.
