%% The data path on two real nodes: this node (started by rebar3 ct with
%% -sname) and node B running ecall, on OTP 25 (group otp25), on OTP 27
%% (group otp27: the `erl' named by ECALL_OTP27_ERL) and on OTP 29 (group
%% otp29: ECALL_OTP29_ERL, Debian unstable's release; Debian has no OTP 28),
%% both prepared by test/scripts/otp27.sh. Every node talks to a private
%% epmd (test/scripts/with_epmd.sh).
-module(ecall_data_path_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([all/0, groups/0, suite/0, init_per_suite/1, end_per_suite/1,
         init_per_group/2, end_per_group/2]).
-export([exactly_once_in_order/1, large_messages_in_order/1, links_are_hidden_cnodes/1,
         ping_cnode/1, fallback_without_link/1, names_and_aliases/1,
         malformed_element_skipped/1, link_loss_is_reported_and_healed/1,
         every_term_kind_arrives_equal/1, remote_pids_arrive_equal/1,
         atoms_past_the_ids_go_as_text/1,
         large_terms_go_by_iovec/1, big_messages_go_straight_in_order/1]).

-import(ecall_test_nodes, [start_node/1, stop_node/1, many_callers_exactly_once/1, send_seq/2]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [{group, otp25}, {group, otp27}, {group, otp29}].

groups() ->
    DataPath = [exactly_once_in_order, large_messages_in_order, links_are_hidden_cnodes, ping_cnode,
                fallback_without_link, names_and_aliases, malformed_element_skipped,
                link_loss_is_reported_and_healed, every_term_kind_arrives_equal,
                remote_pids_arrive_equal, atoms_past_the_ids_go_as_text,
                large_terms_go_by_iovec, big_messages_go_straight_in_order],
    [{otp25, [], DataPath},
     {otp27, [], DataPath},
     {otp29, [], DataPath}].

init_per_suite(Config) ->
    ok = ecall_test_nodes:start_ecall(),
    Config.

end_per_suite(_Config) ->
    ok = application:stop(ecall).

init_per_group(Group, Config) when Group =:= otp27; Group =:= otp29 ->
    Var = string:uppercase("ECALL_" ++ atom_to_list(Group) ++ "_ERL"),
    Erl = os:getenv(Var, ""),
    %% A missing release is a failure, not a skip: the README's test
    %% command prepares it.
    ?assert(filelib:is_regular(Erl)),
    start_b(Config, Erl);
init_per_group(_Group, Config) ->
    start_b(Config, os:find_executable("erl")).

end_per_group(_Group, Config) ->
    _ = ecall:disconnect(?config(b, Config)),
    stop_node(?config(b_node, Config)).

start_b(Config, Erl) ->
    {Node, _} = NodeRef = start_node(Erl),
    ok = ecall:connect(Node),
    [{b, Node}, {b_node, NodeRef} | Config].

%% 100,000 messages from 1,000 callers arrive exactly once, in per-caller
%% order, through the C-node links, in batches larger than one on average.
exactly_once_in_order(Config) ->
    B = ?config(b, Config),
    {ok, S0} = ecall:stats(B),
    #{receivers := R0} = erpc:call(B, ecall, stats, []),
    Total = many_callers_exactly_once(B),
    %% Counters are read once the link writers have counted every request
    %% (a marker of flush_links behind them on each link has come back; a
    %% marker's own count may lag) and B's receivers everything.
    Markers = ecall_test_nodes:flush_links(B),
    ok = ecall_test_nodes:sync_receivers(B),
    {ok, S1} = ecall:stats(B),
    #{receivers := R1} = erpc:call(B, ecall, stats, []),
    Requests = maps:get(requests, S1) - maps:get(requests, S0),
    Batches = maps:get(batches, S1) - maps:get(batches, S0),
    ct:pal("~b requests in ~b batches (~.1f per batch), ~b socket writes",
           [Requests, Batches, Requests / max(1, Batches),
            maps:get(writes, S1) - maps:get(writes, S0)]),
    %% Everything went through the NIF and the links ...
    ?assertEqual(Total + Markers, maps:get(pushed, S1) - maps:get(pushed, S0)),
    ?assert(Requests >= Total andalso Requests =< Total + Markers),
    ?assertEqual(0, maps:get(dropped, S1)),
    %% Every {seq, Pid, I} went with its atom and its pid's node as cache
    %% references (encode-time ids, counted as they are written).
    ?assert(maps:get(cached_atoms, S1) - maps:get(cached_atoms, S0) >= 2 * Total),
    %% ... and through B's receiver pool ...
    ?assertEqual(Total + Markers, maps:get(requests, R1) - maps:get(requests, R0)),
    %% ... in batches, not one message per write.
    ?assert(Requests / Batches > 1.0).

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
    %% And one fence per message that went straight to its target.
    ?assertEqual(length(Sizes) + direct_count(Msgs), P1 - P0),
    %% The large ones went as batches of their own, the multi-megabyte ones
    %% (at least) in fragments.
    ?assert(B1 - B0 >= 3),
    ?assert(F1 - F0 >= 2).

%% The links are hidden C-nodes named after this node, one per link.
links_are_hidden_cnodes(Config) ->
    B = ?config(b, Config),
    Ids = ecall:identities(),
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
    [?assertEqual(pong, erpc:call(B, net_adm, ping, [Id])) || Id <- ecall:identities()].

%% Without an ecall connection, send is plain `!': same result, and nothing
%% goes through the NIF or the peer's receiver pool.
fallback_without_link(Config) ->
    B = ?config(b, Config),
    ok = ecall:disconnect(B),
    ?assertEqual({error, not_connected}, ecall:stats(B)),
    #{receivers := R0} = erpc:call(B, ecall, stats, []),
    Collector = erpc:call(B, erlang, spawn, [ecall_test_nodes, collector, [self(), ?PER_CALLER]]),
    send_seq(Collector, ?PER_CALLER),
    receive
        {collected, Collector, #{out_of_order := 0, total := ?PER_CALLER}} -> ok
    after 10000 -> ct:fail(fallback_lost_messages)
    end,
    #{receivers := R1} = erpc:call(B, ecall, stats, []),
    ?assertEqual(maps:get(requests, R0), maps:get(requests, R1)),
    ok = ecall:connect(B),
    Links = ecall_config:links(),
    ?assertMatch({ok, #{links_up := Links}}, ecall:stats(B)).

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
%% once (no polling), the link comes back, and what a caller on that link
%% sent meanwhile is delivered in order, written by that link once back.
link_loss_is_reported_and_healed(Config) ->
    B = ?config(b, Config),
    Conn = whereis(ecall_conn:name(B)),
    %% The Rust side's log lines reach logger. The handler and
    %% the trace go whatever happens: the next group's run of this case
    %% would fail on them, for the wrong reason.
    ok = logger:add_handler(ecall_test_rust_log, ecall_test_nodes, #{config => #{pid => self()}}),
    try
        link_loss_reported(B, Conn)
    after
        _ = logger:remove_handler(ecall_test_rust_log),
        _ = erlang:trace(Conn, false, ['receive'])
    end.

link_loss_reported(B, Conn) ->
    {ecall_transport_nif, St, _} = ecall_route:peer(B),
    erlang:trace(Conn, true, ['receive']),
    [Id1 | _] = ecall:identities(),
    T0 = erlang:monotonic_time(millisecond),
    ok = erpc:call(B, ecall_test_nodes, drop_connection, [Id1]),
    Down = receive {trace, Conn, 'receive', {ecall_link, 0, {down, R}}} -> R
           after 5000 -> ct:fail(no_down_event)
           end,
    T1 = erlang:monotonic_time(millisecond),
    ct:pal("link 1 down after ~b ms: ~p", [T1 - T0, Down]),
    %% The peer dropped the connection: a typed reason, not text.
    case Down of
        peer_closed -> ok;
        {read, _} -> ok;
        _ -> ct:fail({unexpected_reason, Down})
    end,
    %% Sends while the link is down are queued in Rust, not lost: sent
    %% from a process whose requests go on that link.
    #{1 := Written0} = link_requests(B),
    Collector = erpc:call(B, erlang, spawn, [ecall_test_nodes, collector, [self(), ?PER_CALLER]]),
    on_link(St, 0, fun() -> send_seq(Collector, ?PER_CALLER) end),
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
    %% That link wrote them (and the marker of flush_links/1, whose own
    %% count may not be in yet).
    _ = ecall_test_nodes:flush_links(B),
    #{1 := Written1} = link_requests(B),
    ?assert(lists:member(Written1 - Written0, [?PER_CALLER, ?PER_CALLER + 1])),
    {ok, #{disconnects := D}} = ecall:stats(B),
    ?assert(D >= 1),
    %% One line for the event, ecall_conn's (ecall_connections_SUITE
    %% counts them): none from the Rust side, whose lines have all reached
    %% logger once ecall_log, which hands them over, has answered.
    _ = sys:get_state(ecall_log),
    ?assertEqual([], [T || {rust_log, _, T} <- flush_rust_logs(),
                           re:run(T, "link down") =/= nomatch]).

flush_rust_logs() ->
    receive {rust_log, _, _} = L -> [L | flush_rust_logs()] after 0 -> [] end.

%% Runs Fun in a process whose requests go on link K (0-based; a caller's
%% link follows from its pid, so processes are started until one is on
%% K), and returns when it is done.
on_link(St, K, Fun) ->
    {Pid, Mref} = spawn_monitor(fun() ->
                                        case ecall_transport_nif:caller_link(St) of
                                            K -> Fun(), exit(done);
                                            _ -> exit(other_link)
                                        end
                                end),
    receive
        {'DOWN', Mref, process, Pid, done} -> ok;
        {'DOWN', Mref, process, Pid, other_link} -> on_link(St, K, Fun);
        {'DOWN', Mref, process, Pid, Why} -> ct:fail({on_link, K, Why})
    end.

%% Requests each link to `Node' has written so far: link number (from 1)
%% => count.
link_requests(Node) ->
    {ok, #{per_link := PerLink}} = ecall:stats(Node),
    maps:from_list([{L, R} || #{link := L, requests := R} <- PerLink]).

%% Every kind of term crosses the links equal to what was sent. The NIF
%% encodes requests itself (atoms as encode-time cache references or, past
%% the ids, as text the link writer rewrites; through term_to_binary
%% whatever it does not write itself: pids, ports and references, whose
%% node atom it then rewrites, funs, big integers, bitstrings, atoms it has
%% not seen yet): the peer must get an equal term. It answers with `!', so
%% what comes back went through native distribution only on the way home.
every_term_kind_arrives_equal(Config) ->
    B = ?config(b, Config),
    Self = self(),
    Terms = term_kinds(B) ++ random_terms(400),
    %% Locally first: the encoding decodes to an equal term.
    [?assert(binary_to_term(ecall_nif:encode(T)) =:= T) || T <- Terms],
    %% Byte for byte what term_to_binary writes (atoms as UTF-8), once the
    %% atoms are cached too, when the encoder writes a map's or a tuple's
    %% cached atoms as it walks it and queues the rest: a small map's keys
    %% in their sorted order (the peer then checks them instead of sorting
    %% them) and nothing out of place where a term the cache does not hold
    %% (a long atom, a float, a binary, a nested term) comes between them.
    Long = list_to_atom(lists:duplicate(255, $y)),
    Exact = [#{a => 1, b => [x, y], c => {d, e}, f => 1.5, g => <<"bin">>},
             maps:from_list([{list_to_atom("k" ++ integer_to_list(I)), I} || I <- lists:seq(1, 32)]),
             {a, b, Long, c, [e], f, 1.5, #{h => i}},
             #{a => b, c => Long, d => #{e => f}, g => h},
             {{a, b}, a, b}],
    [?assertEqual(term_to_binary(T, [{minor_version, 2}]), ecall_nif:encode(T))
     || T <- Exact ++ Exact],
    %% A plain message's atoms (the pid's node name too) go as encode-time
    %% cache references, nothing as text; a fun's atoms stay text.
    ?assertMatch({_, false, 3}, ecall_nif:encoded_size({send, self(), #{a => 1}})),
    ?assertMatch({_, true, _}, ecall_nif:encoded_size({fun() -> ok end})),
    %% A local pid's encoding is cached with the atoms (so the second
    %% encode of it is the cache's), and a reference met again in the same
    %% request is copied from where it was first written: both decode
    %% equal, their node atoms as references (send, R three times, the
    %% pid twice).
    R = make_ref(),
    Again = {send, R, {R, self(), [self(), R]}},
    [?assert(binary_to_term(ecall_nif:encode(Again)) =:= Again) || _ <- [1, 2]],
    [?assertMatch({_, false, 6}, ecall_nif:encoded_size(Again)) || _ <- [1, 2]],
    Mirror = erpc:call(B, erlang, spawn, [fun() -> mirror(Self) end]),
    %% Twice: the second time every atom comes from the NIF's cache.
    Sent = Terms ++ Terms,
    via_links(B, Sent ++ [mirror_done],
              fun() -> lists:foreach(fun(T) -> ecall:send(Mirror, T) end, Sent ++ [mirror_done]) end),
    Got = mirrored([]),
    ?assertEqual(length(Sent), length(Got)),
    Bad = [{T, G} || {T, G} <- lists:zip(Sent, Got), T =/= G],
    ?assertEqual([], lists:sublist(Bad, 3)).

%% The NIF caches the encodings of other nodes' pids and ports (keyed by
%% hash, checked against a copy of the term): 3,000 distinct pids of B,
%% more than its slots and more than it copies before it starts again,
%% each encoded twice and sent through the link twice, all arrive equal;
%% so do a pid of a node that is not connected and B's port, each met
%% again after the others.
remote_pids_arrive_equal(Config) ->
    B = ?config(b, Config),
    Self = self(),
    BPid = erpc:call(B, erlang, self, []),
    %% NEW_PID_EXT: the node atom, then the number, serial and creation
    %% (cut with binary:part/3: this module is loaded on B too, and an OTP
    %% 29 node refuses OTP 25's binary matching).
    Bin = term_to_binary(BPid),
    Head = binary:part(Bin, 0, byte_size(Bin) - 12),
    Tail = binary:part(Bin, byte_size(Bin) - 8, 8),
    Pids = [binary_to_term(<<Head/binary, I:32, Tail/binary>>) || I <- lists:seq(100, 3099)],
    Far = list_to_binary(["far_", integer_to_list(erlang:unique_integer([positive])), "@nohost"]),
    FarPid = binary_to_term(<<131, 88, 119, (byte_size(Far)), Far/binary, 5:32, 0:32, 1:32>>),
    Port = erpc:call(B, erlang, hd, [erlang:ports()]),
    Odd = [FarPid, Port],
    All = Odd ++ Pids ++ Odd ++ Pids ++ Odd,
    [?assert(binary_to_term(ecall_nif:encode(P)) =:= P) || P <- All],
    %% Each written as B's own pid is (its node as a reference when it has
    %% an id), from the cache too.
    Sized = ecall_nif:encoded_size({send, BPid, 1}),
    [?assertEqual(Sized, ecall_nif:encoded_size({send, P, 1})) || P <- Pids ++ Pids],
    Mirror = erpc:call(B, erlang, spawn, [fun() -> mirror(Self) end]),
    Sent = [{P, [P]} || P <- All] ++ [mirror_done],
    via_links(B, Sent, fun() -> lists:foreach(fun(M) -> ecall:send(Mirror, M) end, Sent) end),
    Got = mirrored([]),
    ?assertEqual([{P, [P]} || P <- All], Got).

mirror(To) ->
    receive
        mirror_done -> To ! mirror_done;
        T -> To ! {mirrored, T}, mirror(To)
    end.

mirrored(Acc) ->
    receive
        {mirrored, T} -> mirrored([T | Acc]);
        mirror_done -> lists:reverse(Acc)
    after 20000 -> ct:fail({mirror_stalled, length(Acc)})
    end.

term_kinds(B) ->
    Big = binary:copy(<<"0123456789">>, 10000),
    Deep = lists:foldl(fun(_, A) -> [A] end, [], lists:seq(1, 10000)),
    [%% Atoms: empty, Latin-1, Unicode, the longest, and ones no cache has.
     '', a, 'hello world', '\x{e9}t\x{e9}', list_to_atom([16#65E5, 16#672C]),
     list_to_atom(lists:duplicate(255, $x)), list_to_atom(lists:duplicate(255, 16#65E5)),
     list_to_atom("fresh_" ++ integer_to_list(erlang:unique_integer([positive]))),
     true, false, undefined,
     %% Integers at every boundary of the external format.
     0, 255, 256, -1, -256, 2147483647, -2147483648, 2147483648, -2147483649,
     1 bsl 59, -(1 bsl 59), (1 bsl 63) - 1, -(1 bsl 63), 1 bsl 63, -(1 bsl 63) - 1,
     1 bsl 64, 1 bsl 200, -(1 bsl 200),
     %% Floats, -0.0 included.
     0.0, -0.0, 1.5, -1.0e300, 5.0e-324, 1.7976931348623157e308,
     %% Binaries and bitstrings.
     <<>>, <<"abc">>, Big, binary:part(Big, 3, 1000), <<1:3>>, <<"ab", 5:4>>,
     %% Lists: strings, improper, nested, long.
     [], "string", [16#65E5, 16#672C], [1, 2, 3], [a | b], [1, [2, [3 | 4]]],
     lists:seq(1, 5000), Deep,
     %% Tuples, small and large.
     {}, {a}, {a, {b, {c}}}, list_to_tuple(lists:seq(1, 300)),
     %% Maps: empty, flat, large (a hash map), complex keys.
     #{}, #{a => 1, b => [x]}, maps:from_list([{K, K * 2} || K <- lists:seq(1, 100)]),
     #{{a, 1} => [x], <<"k">> => 1.0, [1] => #{nested => #{deeper => self()}}},
     %% Pids, ports, references, funs: local and the peer's.
     self(), erpc:call(B, erlang, self, []), hd(erlang:ports()), make_ref(),
     erpc:call(B, erlang, make_ref, []), alias(),
     fun lists:map/2, fun() -> ok end,
     %% A message as applications send them.
     {'$gen_cast', {update, #{id => 42, name => <<"n">>, tags => [a, b]}}}].

%% Random nested terms from a fixed seed (the failure message names the
%% terms).
random_terms(N) ->
    rand:seed(exsss, {1, 2, 3}),
    [random_term(4) || _ <- lists:seq(1, N)].

random_term(0) ->
    random_leaf();
random_term(D) ->
    case rand:uniform(8) of
        1 -> list_to_tuple([random_term(D - 1) || _ <- lists:seq(1, rand:uniform(4) - 1)]);
        2 -> [random_term(D - 1) || _ <- lists:seq(1, rand:uniform(4) - 1)];
        3 -> maps:from_list([{random_leaf(), random_term(D - 1)} || _ <- lists:seq(1, rand:uniform(5))]);
        4 -> [random_leaf() | random_leaf()];
        _ -> random_leaf()
    end.

random_leaf() ->
    case rand:uniform(9) of
        1 -> list_to_atom("k" ++ integer_to_list(rand:uniform(50)));
        2 -> rand:uniform(1 bsl (rand:uniform(70))) - (1 bsl 34);
        3 -> rand:uniform(300);
        4 -> (rand:uniform() - 0.5) * math:pow(10, rand:uniform(40));
        5 -> rand:bytes(rand:uniform(20) - 1);
        6 -> <<(rand:uniform(127)):7>>;
        7 -> [rand:uniform(255) || _ <- lists:seq(1, rand:uniform(6) - 1)];
        8 -> self();
        9 -> make_ref()
    end.

%% Only the first atoms a node's encoder meets get ids (IDS,
%% native/ecall_dist's wire/fixed_atom_ids.rs); later ones go
%% as text (and through the link's own atom cache), mixed with ids in one
%% message, and arrive all the same. Some are longer than the encoder's
%% table entries (text of more than 16 bytes, kept apart), and each atom is
%% met three times per message and again in the next one: the kept
%% encodings are the ones that arrive.
atoms_past_the_ids_go_as_text(Config) ->
    B = ?config(b, Config),
    Self = self(),
    Fresh = [list_to_atom(Prefix ++ integer_to_list(erlang:unique_integer([positive])))
             || {Prefix, N} <- [{"past_ids_", 220}, {"Elixir.Ecall.PastTheIds.Long", 40}],
                _ <- lists:seq(1, N)],
    ?assert(lists:any(fun(A) -> length(atom_to_list(A)) > 16 end, Fresh)),
    Term = {ok, Fresh, #{Fresh => lists:reverse(Fresh)}},
    ?assertMatch({_, true, _}, ecall_nif:encoded_size(Term)),
    Mirror = erpc:call(B, erlang, spawn, [fun() -> mirror(Self) end]),
    Sent = [Term, {ok, Term}, mirror_done],
    Sent = via_links(B, Sent, fun() -> [ecall:send(Mirror, M) || M <- Sent] end),
    ?assertEqual([Term, {ok, Term}], mirrored([])).

%% A request whose encoding would pass the NIF's inline bound (INLINE_MAX,
%% native/ecall_nif's encode/mod.rs) is not encoded on the
%% caller's scheduler: the NIF gives up (encoded_size/1 says `large') and the
%% transport pushes it by term_to_iovec from a dirty scheduler. Big lists,
%% maps and binaries inside tuples, between small messages, as sends and as
%% a call's argument, arrive equal and in order.
large_terms_go_by_iovec(Config) ->
    B = ?config(b, Config),
    Self = self(),
    List = lists:seq(1, 100000),
    Map = maps:from_list([{K, integer_to_binary(K)} || K <- lists:seq(1, 20000)]),
    Nested = {data, binary:copy(<<"z">>, 300000)},
    [?assertEqual(large, ecall_nif:encoded_size(T)) || T <- [List, Map, Nested]],
    %% (Atoms may be text here: an earlier case may have used up the ids.)
    ?assertMatch({_, _, _}, ecall_nif:encoded_size({small, 1})),
    Mirror = erpc:call(B, erlang, spawn, [fun() -> mirror(Self) end]),
    Sent = [{small, 1}, List, {small, 2}, Map, Nested, {small, 3}],
    {ok, #{pushed := P0}} = ecall:stats(B),
    lists:foreach(fun(T) -> T = ecall:send(Mirror, T) end, Sent),
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(length(Sent) + direct_count(Sent), P1 - P0),
    ecall:send(Mirror, mirror_done),
    ?assertEqual(Sent, mirrored([])),
    ?assertEqual({ok, length(List)}, ecall:call(B, erlang, length, [List])).

%% A message whose encoding reaches ecall_transport_nif's ?DIRECT bytes
%% goes straight to its target (a
%% pid, or a name registered on the peer), which decodes it itself, not
%% through the peer's receivers: they replay only the smaller ones and one
%% fence per big one. One caller's small, medium and big messages, in
%% turn, arrive in order and intact.
big_messages_go_straight_in_order(Config) ->
    B = ?config(b, Config),
    Self = self(),
    Name = ecall_big_sink,
    Sink = erpc:call(B, erlang, spawn, [fun() -> mirror_hashes(Self) end]),
    true = erpc:call(B, erlang, register, [Name, Sink]),
    Big = fun(I) -> [{I, K, <<"abcdefgh">>} || K <- lists:seq(1, 20000)] end,
    ?assert(iolist_size(term_to_iovec(Big(0))) >= 262144),
    %% In pairs, small then big, to the pid and to the name in turn (one
    %% process: order holds across both).
    %% A medium one too, past what the NIF encodes inline (INLINE_MAX) but
    %% below ecall_transport_nif's ?DIRECT: relayed by the receivers.
    Medium = fun(I) -> {medium, I, lists:seq(1, 10000)} end,
    ?assertEqual(large, ecall_nif:encoded_size(Medium(0))),
    ?assert(iolist_size(term_to_iovec(Medium(0))) < 262144),
    Pairs = [{lists:nth(1 + I rem 2, [Sink, {Name, B}]), [{small, I}, Medium(I), {big, I, Big(I)}]}
             || I <- lists:seq(1, 6)],
    Msgs = lists:append([Ms || {_, Ms} <- Pairs]),
    #{receivers := #{requests := R0}} = erpc:call(B, ecall, stats, []),
    {ok, #{pushed := P0}} = ecall:stats(B),
    [ecall:send(To, M) || {To, Ms} <- Pairs, M <- Ms],
    Got = [receive {hash, H} -> H after 30000 -> ct:fail(lost) end || _ <- Msgs],
    ?assertEqual([erlang:phash2(M) || M <- Msgs], Got),
    %% A receiver counts a batch once it has replayed all of it.
    ok = ecall_test_nodes:sync_receivers(B),
    #{receivers := #{requests := R1}} = erpc:call(B, ecall, stats, []),
    {ok, #{pushed := P1}} = ecall:stats(B),
    Bigs = length([M || M <- Msgs, element(1, M) =:= big]),
    %% Pushed: every message and one fence per big one; replayed by the
    %% receivers: the small and medium ones and the fences only.
    ?assertEqual(length(Msgs) + Bigs, P1 - P0),
    ?assertEqual(length(Msgs), R1 - R0),
    Sink ! stop,
    %% A big call result goes back as its encoding: B pushes the reply
    %% alone, and this node's receiver hands over a binary, which the
    %% caller decodes (a receiver never decodes the big term).
    ecall_test_nodes:connect_back(B),
    {ok, #{pushed := BP0}} = erpc:call(B, ecall, stats, [node()]),
    #{receivers := #{requests := AR0}} = ecall:stats(),
    Workers = [whereis(ecall_receiver_sup:name(I)) || I <- lists:seq(1, ecall_config:receivers())],
    [erlang:trace(W, true, ['receive']) || W <- Workers],
    Result = Big(7),
    ?assertEqual({ok, Result}, ecall:call(B, ecall_test_nodes, echo, [Result])),
    Replayed = receive
                   {trace, _, 'receive', {batch, _, _, [{reply, _, {external, Encoded}}]}} ->
                       byte_size(Encoded)
               after 5000 ->
                   ct:fail(no_encoded_reply)
               end,
    [erlang:trace(W, false, ['receive']) || W <- Workers],
    ecall_test_nodes:flush_traces(),
    ?assert(Replayed >= 262144),
    ok = ecall_test_nodes:sync_receivers(node()),
    {ok, #{pushed := BP1}} = erpc:call(B, ecall, stats, [node()]),
    #{receivers := #{requests := AR1}} = ecall:stats(),
    ?assertEqual(1, BP1 - BP0),
    ?assertEqual(1, AR1 - AR0),
    %% A medium result (past what a push encodes inline, short of
    %% ecall_transport_nif's ?DIRECT) goes back as {reply, Id, Result}
    %% around its own encoding.
    Reply = Medium(8),
    ?assertEqual({ok, Reply}, ecall:call(B, ecall_test_nodes, echo, [Reply])),
    {ok, #{pushed := BP2}} = erpc:call(B, ecall, stats, [node()]),
    ?assertEqual(1, BP2 - BP1).

mirror_hashes(Owner) ->
    receive
        stop -> ok;
        M -> Owner ! {hash, erlang:phash2(M)}, mirror_hashes(Owner)
    end.

%% How many of `Msgs' go straight to their target, each after a fence
%% (ecall_transport_nif: an encoding of ?DIRECT bytes or more).
direct_count(Msgs) ->
    length([M || M <- Msgs, iolist_size(term_to_iovec(M)) >= 262144]).

%% Runs `Send', which sends `Sent' through ecall to B, and returns what it
%% returns, once it has checked that the links carried every message:
%% ecall:send/2 falls back to `!' without a word, and equal terms would
%% arrive either way.
via_links(B, Sent, Send) ->
    {ok, #{pushed := P0}} = ecall:stats(B),
    Result = Send(),
    {ok, #{pushed := P1}} = ecall:stats(B),
    ?assertEqual(length(Sent) + direct_count(Sent), P1 - P0),
    Result.
