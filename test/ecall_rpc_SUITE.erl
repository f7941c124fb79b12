%% cast, call and the multi-node patterns on real nodes: this node, B
%% connected both ways (replies come back through B's own links), and
%% nodes started by the cases.
-module(ecall_rpc_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([cast_through_link/1, call_results_match_fallback/1, call_timeout_no_late_reply/1,
         link_loss_fails_no_caller/1, peer_killed_with_1000_calls/1,
         unreachable_node/1, multi_node_patterns/1, rpc_bad_arguments/1,
         call_from_a_long_mailbox/1]).

-import(ecall_test_nodes, [start_peer/1, flush_traces/0, connect_back/1]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [cast_through_link, call_results_match_fallback, call_timeout_no_late_reply,
     link_loss_fails_no_caller, peer_killed_with_1000_calls, unreachable_node,
     multi_node_patterns, rpc_bad_arguments, call_from_a_long_mailbox].

init_per_suite(Config) ->
    ecall_test_nodes:start_b(Config).

end_per_suite(Config) ->
    ecall_test_nodes:stop_b(Config).

%% A caller with a long mailbox: its calls through the links (each one
%% pushed to B's queues) answer right and leave its other messages where
%% they were, in order. And the receive that waits for the reply skips
%% them: the compiler marks the mailbox when the reply's reference is made
%% (recv_marker_reserve/bind) and the receive starts from the mark
%% (recv_marker_use), as erpc's does, instead of scanning the whole
%% mailbox on every call. The reference must be made in the function that
%% waits: made in the transport module, it gives no mark, and with 100,000
%% waiting messages a back-to-back call takes 0.67 ms instead of 0.11 ms.
call_from_a_long_mailbox(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    P0 = pushed(B),
    Self = self(),
    Caller = spawn_link(fun() ->
                                [self() ! {junk, I} || I <- lists:seq(1, 10000)],
                                Results = [ecall:call(B, ecall_test_nodes, echo, [I])
                                           || I <- lists:seq(1, 100)],
                                Junk = [receive {junk, _} = J -> J after 0 -> missing end
                                        || _ <- lists:seq(1, 10000)],
                                Self ! {self(), Results, Junk}
                        end),
    receive
        {Caller, Results, Junk} ->
            ?assertEqual([{ok, I} || I <- lists:seq(1, 100)], Results),
            ?assertEqual([{junk, I} || I <- lists:seq(1, 10000)], Junk)
    after 60000 -> ct:fail(caller_stuck)
    end,
    ?assertEqual(100, pushed(B) - P0),
    ?assert(uses_receive_marker(ecall_rpc)).

%% Requests pushed to `Node''s queues so far (counted at the push).
pushed(Node) ->
    {ok, #{pushed := P}} = ecall:stats(Node),
    P.

%% Requests each link to `Node' has written so far: link number => count.
link_requests(Node) ->
    {ok, #{per_link := PerLink}} = ecall:stats(Node),
    maps:from_list([{K, R} || #{link := K, requests := R} <- PerLink]).

%% Whether the module's compiled code binds a receive marker to a
%% reference and a receive uses it.
uses_receive_marker(Module) ->
    {beam_file, Module, _, _, _, Functions} = beam_disasm:file(code:which(Module)),
    Ops = [element(1, I) || {function, _, _, _, Is} <- Functions, I <- Is, is_tuple(I)],
    lists:member(recv_marker_bind, Ops) andalso lists:member(recv_marker_use, Ops).

cast_through_link(Config) ->
    B = ?config(b, Config),
    {ok, #{pushed := P0}} = ecall:stats(B),
    ?assertEqual(ok, ecall:cast(B, ecall_test_nodes, tell, [self(), {cast, 1}])),
    receive {cast, 1} -> ok after 30000 -> ct:fail(cast_lost) end,
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
             {fail, [exit, bye], {error, {exception, exit, bye, []}}}],
    {ok, #{pushed := P0}} = ecall:stats(B),
    [begin
         ?assertEqual({F, Expected}, {F, ecall:call(B, ecall_test_nodes, F, A)}),
         ?assertEqual({F, Expected}, {F, ecall:call(C, ecall_test_nodes, F, A, 30000)})
     end || {F, A, Expected} <- Cases],
    %% An error carries its class and the called function's stack trace,
    %% the same on both paths (the erpc path's is erpc's own); so does a
    %% function missing on the peer, and a BIF called directly, which has
    %% no frame of its own: erpc names it with its arguments.
    Raised = [{ecall_test_nodes, fail, [error, boom], boom,
               [{ecall_test_nodes, fail, 2, '_'}]},
              {ecall_test_nodes, no_such_function, [], undef,
               [{ecall_test_nodes, no_such_function, [], '_'}]},
              {erlang, error, [oops], oops, [{erlang, error, [oops], []}]},
              {erlang, atom_to_list, [1], badarg, [{erlang, atom_to_list, [1], '_'}]},
              {lists, nth, [0, []], function_clause, [{lists, nth, [0, []], '_'}]}],
    [begin
         Via = ecall:call(B, M, F, A),
         ?assertEqual({M, F, Via}, {M, F, ecall:call(C, M, F, A, 30000)}),
         {error, {exception, error, R, Stack}} = Via,
         ?assertEqual(length(Top), length(lists:sublist(Stack, length(Top)))),
         [?assertMatch({Mod, Fun, ArgsOrArity, _}, Frame)
          || {{Mod, Fun, ArgsOrArity, _}, Frame} <- lists:zip(Top, lists:sublist(Stack, length(Top)))]
     end || {M, F, A, R, Top} <- Raised],
    %% Exits and throws carry no stack, on both paths.
    [?assertEqual({F, ecall:call(C, erlang, F, [x], 30000)}, {F, ecall:call(B, erlang, F, [x])})
     || F <- [exit, throw]],
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(length(Cases) + length(Raised) + 2, P1 - P0),
    peer:stop(Peer).

%% A call that times out returns {error, {badrpc, timeout}}, and its reply,
%% when it comes later, never reaches the caller's mailbox: the receiver
%% finds no caller waiting under its id, and counts it.
call_timeout_no_late_reply(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    Self = self(),
    #{receivers := #{late_replies := Late0}} = ecall:stats(),
    Workers = [whereis(ecall_receiver_sup:name(I)) || I <- lists:seq(1, ecall_config:receivers())],
    [erlang:trace(W, true, ['receive']) || W <- Workers],
    ?assertEqual({error, {badrpc, timeout}}, ecall:call(B, ecall_test_nodes, block, [Self], 200)),
    Blocked = receive {blocked, P, B} -> P after 30000 -> ct:fail(not_blocked) end,
    Blocked ! go,
    %% The reply comes back in a batch to one of our receiver workers: the
    %% batch that holds it (`late' is block/1's answer, and this is the
    %% only call of it), whatever other batches the workers take first ...
    W = late_reply_worker(),
    %% ... which has replayed it once it takes its next message.
    W ! {batch, []},
    receive {trace, W, 'receive', {batch, []}} -> ok after 30000 -> ct:fail(worker_stuck) end,
    [erlang:trace(X, false, ['receive']) || X <- Workers],
    flush_traces(),
    receive Late -> ct:fail({late_reply, Late}) after 0 -> ok end,
    ?assertMatch(#{receivers := #{late_replies := L}} when L =:= Late0 + 1, ecall:stats()).

%% The receiver worker whose traced batch holds the late reply (one reply
%% of `late', and only that of it); batches without it are passed over.
late_reply_worker() ->
    receive
        {trace, W, 'receive', {batch, _, _, Elems}} when is_pid(W) ->
            case [E || {reply, _, {value, late}} = E <- Elems] of
                [] ->
                    late_reply_worker();
                Late ->
                    ?assertMatch([{reply, Id, {value, late}}] when is_integer(Id), Late),
                    W
            end
    after 30000 -> ct:fail(no_late_reply_batch)
    end.

%% When a link goes down while calls on both links wait for their replies
%% (each call blocked in its function on B), no call fails: the link comes
%% back, and every caller gets its answer once released, as erpc's would.
link_loss_fails_no_caller(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    {ecall_transport_nif, St, _} = ecall_route:peer(B),
    %% Three callers on each link (a caller's link follows from its pid, so
    %% callers are started until both links have theirs).
    #{0 := OnLink0, 1 := OnLink1} = callers_per_link(B, St, #{0 => [], 1 => []}, 3),
    Callers = OnLink0 ++ OnLink1,
    [C ! go || C <- Callers],
    Blocked = [receive {blocked, P, B} -> P after 30000 -> ct:fail(not_blocked) end || _ <- Callers],
    [Id1 | _] = ecall:identities(),
    ok = erpc:call(B, ecall_test_nodes, drop_connection, [Id1]),
    %% The link comes back; no caller was failed meanwhile.
    ok = ecall_test_nodes:await(link_back, fun() -> element(1, ecall:stats(B)) =:= ok andalso
                                                        maps:get(links_up, element(2, ecall:stats(B))) =:= 2
                                           end),
    [receive {result, C, R} -> ct:fail({early, C, R}) after 0 -> ok end || C <- Callers],
    [P ! go || P <- Blocked],
    [receive
         {result, C, R} -> ?assertEqual({ok, late}, R)
     after 30000 -> ct:fail({lost_call, C})
     end || C <- Callers],
    ok.

%% Callers that wait for `go', then call block/1 on B; `N' on each link.
callers_per_link(B, St, Acc, N) ->
    case lists:all(fun(L) -> length(L) >= N end, maps:values(Acc)) of
        true ->
            Acc;
        false ->
            Self = self(),
            C = spawn_link(fun() ->
                                   Self ! {link, self(), ecall_transport_nif:caller_link(St)},
                                   receive go -> ok end,
                                   Self ! {result, self(),
                                           ecall:call(B, ecall_test_nodes, block, [Self])}
                           end),
            K = receive {link, C, K0} -> K0 end,
            case length(maps:get(K, Acc)) < N of
                true ->
                    callers_per_link(B, St, Acc#{K := [C | maps:get(K, Acc)]}, N);
                false ->
                    unlink(C),
                    exit(C, kill),
                    callers_per_link(B, St, Acc, N)
            end
    end.

%% 1,000 calls outstanding on a node whose OS process is killed: every one
%% returns `{error, {badrpc, nodedown}}', none hangs. A link going down
%% fails no call (what it wrote goes again on its next connection): the
%% nodedown that closes the whole connection does, as it does erpc's. The
%% 1,000 went to the links' queues (the connection was new: its count was
%% 0). The calls have no timeout, and nothing else would end them before
%% the hang guard (30 s, shorter than the 60 s net_ticktime). The time
%% they took is logged (doc/behaviour.md quotes it), not asserted: a loaded
%% machine stretches it.
peer_killed_with_1000_calls(_Config) ->
    {_Peer, C} = start_peer([]),
    ok = ecall:connect(C),
    Self = self(),
    OsPid = erpc:call(C, os, getpid, []),
    Callers = [spawn(fun() ->
                             Self ! {result, self(), ecall:call(C, ecall_test_nodes, block, [Self])}
                     end)
               || _ <- lists:seq(1, 1000)],
    [receive {blocked, _, C} -> ok after 30000 -> ct:fail(not_blocked) end || _ <- Callers],
    ?assertEqual(1000, pushed(C)),
    T0 = erlang:monotonic_time(millisecond),
    os:cmd("kill -9 " ++ OsPid),
    Results = [{P, receive {result, P, R} -> R after 30000 -> ct:fail({hung, P}) end} || P <- Callers],
    Ms = erlang:monotonic_time(millisecond) - T0,
    ct:pal("1000 callers returned ~b ms after the kill: ~p",
           [Ms, lists:usort([R || {_, {error, {badrpc, R}}} <- Results])]),
    ?assertEqual([], [{P, R} || {P, R} <- Results, R =/= {error, {badrpc, nodedown}}]).

unreachable_node(_Config) ->
    [_, Host] = string:split(atom_to_list(node()), "@"),
    Nobody = list_to_atom("nobody@" ++ Host),
    ?assertEqual({error, {badrpc, noconnection}}, ecall:call(Nobody, ecall_test_nodes, echo, [1])),
    %% A cast returns ok whatever happens (as erpc:cast/4 does); what can be
    %% checked is that it neither raised nor left a connection behind.
    ?assertEqual(ok, ecall:cast(Nobody, ecall_test_nodes, echo, [1])),
    ?assertEqual({error, not_connected}, ecall:stats(Nobody)),
    ?assertEqual({error, noconnection}, ecall:connect(Nobody)).

%% cast_one, cast_all, call_one, call_any, call_all and call_all_wait
%% over this node, B, C and a node that does not exist, with and without
%% RpcErr. Every request for B and C goes through the links: their queues
%% count each one that the patterns send there (the local node is served
%% locally, the missing one by erpc).
multi_node_patterns(Config) ->
    B = ?config(b, Config),
    connect_back(B),
    {Peer, C} = start_peer([]),
    ok = ecall:connect(C),
    PB0 = pushed(B),
    PC0 = pushed(C),
    A = node(),
    [_, Host] = string:split(atom_to_list(A), "@"),
    Nobody = list_to_atom("nobody@" ++ Host),
    Self = self(),
    %% cast_one: the local node when listed.
    ok = ecall:cast_one([B, A], ecall_test_nodes, tell, [Self, {one, A}]),
    receive {one, A} -> ok after 30000 -> ct:fail(cast_one_lost) end,
    ok = ecall:cast_one([B], erlang, send, [Self, cast_one_b]),
    receive cast_one_b -> ok after 30000 -> ct:fail(cast_one_b_lost) end,
    ?assertEqual({error, none_is_available}, ecall:cast_one([], ecall_test_nodes, echo, [1])),
    %% cast_all: every node, once.
    ok = ecall:cast_all([A, B, C], ecall_test_nodes, tell, [Self, all]),
    ok = ecall:cast_all([A, B, C], erlang, send, [Self, {all, x}]),
    [receive {all, x} -> ok after 30000 -> ct:fail(cast_all_lost) end || _ <- [A, B, C]],
    [receive all -> ok after 30000 -> ct:fail(cast_all_lost) end || _ <- [A, B, C]],
    %% call_one: local first; on to the next node after an error; badrpc
    %% ignored unless asked for.
    ?assertEqual({ok, {A, A}}, ecall:call_one([B, A, C], ecall_test_nodes, whoami, [])),
    ?assertEqual({ok, {C, C}}, ecall:call_one([B, C], ecall_test_nodes, error_on, [B])),
    ?assertEqual({error, [{B, no}]}, ecall:call_one([B], ecall_test_nodes, error_on, [B])),
    ?assertEqual({error, none_is_available}, ecall:call_one([Nobody], ecall_test_nodes, whoami, [])),
    ?assertEqual({error, [{Nobody, {badrpc, noconnection}}]},
                 ecall:call_one([Nobody], ecall_test_nodes, whoami, [], true)),
    ?assertEqual({error, none_is_available}, ecall:call_one([], ecall_test_nodes, whoami, [])),
    %% call_any: the first {ok, _}.
    {ok, {N1, N1}} = ecall:call_any([B, C], ecall_test_nodes, whoami, []),
    ?assert(lists:member(N1, [B, C])),
    ?assertEqual({ok, {B, B}}, ecall:call_any([Nobody, B], ecall_test_nodes, whoami, [])),
    ?assertEqual({ok, {C, C}}, ecall:call_any([B, C], ecall_test_nodes, error_on, [B])),
    ?assertEqual({error, [{B, no}]}, ecall:call_any([B, Nobody], ecall_test_nodes, error_on, [B])),
    ?assertMatch({error, [_, _]}, ecall:call_any([B, Nobody], ecall_test_nodes, error_on, [B], true)),
    %% call_all: every node must answer {ok, _}.
    ?assertEqual({ok, [{A, A}, {B, B}, {C, C}]}, ecall:call_all([A, B, C], ecall_test_nodes, whoami, [])),
    ?assertEqual({error, {B, no}}, ecall:call_all([B, C], ecall_test_nodes, error_on, [B])),
    ?assertEqual({ok, [{B, B}]}, ecall:call_all([B, Nobody], ecall_test_nodes, whoami, [])),
    ?assertEqual({error, {Nobody, {badrpc, noconnection}}},
                 ecall:call_all([B, Nobody], ecall_test_nodes, whoami, [], true)),
    ?assertEqual({error, none_is_available}, ecall:call_all([Nobody], ecall_test_nodes, whoami, [])),
    %% call_all_wait: replies and rejects.
    ?assertEqual({[{C, C}, {A, A}], [{B, no}]},
                 ecall:call_all_wait([B, C, A, Nobody], ecall_test_nodes, error_on, [B])),
    ?assertEqual({[{C, C}], [{B, no}, {Nobody, {badrpc, noconnection}}]},
                 ecall:call_all_wait([B, C, Nobody], ecall_test_nodes, error_on, [B], true)),
    %% No stray answers were left behind.
    receive Stray -> ct:fail({stray, Stray}) after 0 -> ok end,
    %% B: 3 casts, 2 call_one (1 when call_one tried C before B: its order
    %% is random), 5 call_any, 4 call_all, 2 call_all_wait; C: 2 casts,
    %% 1 call_one, 2 call_any, 2 call_all, 2 call_all_wait.
    PB = pushed(B) - PB0,
    ?assertMatch(N when N =:= 15; N =:= 16, PB),
    ?assertEqual(9, pushed(C) - PC0),
    ok = ecall:disconnect(C),
    peer:stop(Peer).

rpc_bad_arguments(_Config) ->
    ?assertError(badarg, ecall:cast("b", m, f, [])),
    ?assertError(badarg, ecall:cast(b, m, f, not_a_list)),
    ?assertError(badarg, ecall:call(b, m, "f", [])),
    ?assertError(badarg, ecall:call(b, m, f, [], -1)),
    ?assertError(badarg, ecall:call(b, m, f, [], soon)),
    ?assertError(badarg, ecall:call_all(not_a_list, m, f, [])),
    %% The parallel patterns check before they start: a helper that raised
    %% would never answer, and the pattern would wait for it forever.
    ?assertError(badarg, ecall:call_all([b], m, "f", [])),
    ?assertError(badarg, ecall:call_any([b, "c"], m, f, [])),
    ?assertError(badarg, ecall:call_all_wait([b | c], m, f, [])),
    ?assertError(badarg, ecall:call_any([b], m, f, not_a_list, true)),
    ?assertError(badarg, ecall:cast_all([b], "m", f, [])).
