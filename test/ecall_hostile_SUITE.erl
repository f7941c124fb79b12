%% Hostile input from real nodes that have the cookie: what reached the
%% C-node from outside once killed this whole node (SIGSEGV on a term nested
%% 10,000 levels). This node runs ecall; the peers send to its C-node names
%% with plain `!', over the ecall links (peer B, connected) and over
%% connections they open themselves (peer C, no ecall connection).
%%
%% If a case here crashed the node, the whole run would stop: every case
%% also asserts what the C-node counted and that it still serves.
-module(ecall_hostile_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([deep_terms_over_links/1, deep_terms_over_accepted_connections/1,
         oversized_frame_closes_one_connection/1, large_message_over_link_in_fragments/1,
         unknown_messages_to_discovery_stop_discovery_only/1]).
%% Run on peers.
-export([deep_list/1, deep_tuple/1, send_and_wait_close/2]).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [deep_terms_over_links, deep_terms_over_accepted_connections,
     oversized_frame_closes_one_connection, large_message_over_link_in_fragments,
     %% Last: it leaves this node without discovery.
     unknown_messages_to_discovery_stop_discovery_only].

init_per_suite(Config) ->
    ok = ecall_test_nodes:start_ecall(),
    {PeerB, B} = start_peer(true),
    ok = ecall:connect(B),
    %% Without ecall: ecall's discovery would connect links to it, and its
    %% frames to our C-node names would go over those.
    {PeerC, C} = start_peer(false),
    [{b, B}, {peer_b, PeerB}, {c, C}, {peer_c, PeerC} | Config].

end_per_suite(Config) ->
    _ = ecall:disconnect(?config(b, Config)),
    peer:stop(?config(peer_b, Config)),
    peer:stop(?config(peer_c, Config)),
    ok = application:stop(ecall).

start_peer(WithEcall) ->
    Args = ["-setcookie", atom_to_list(erlang:get_cookie()) | ecall_test_nodes:node_args()],
    {ok, Peer, Node} = peer:start(#{exec => ecall_test_nodes:node_exec(),
                                    name => peer:random_name(?MODULE), args => Args,
                                    wait_boot => 60000}),
    WithEcall andalso ({ok, _} = erpc:call(Node, application, ensure_all_started, [ecall])),
    {Peer, Node}.

%%--------------------------------------------------------------------
%% Cases

%% B sends a list and a tuple nested 10,000 levels to each C-node name over
%% the ecall links (B's frames carry atom cache headers there). The links
%% stay up, count the frames as ignored, and still answer a ping on the same
%% connection afterwards; traffic still flows.
deep_terms_over_links(Config) ->
    B = ?config(b, Config),
    {ok, S0} = ecall:stats(B),
    Ids = ecall:identities(),
    [begin
         _ = erpc:call(B, erlang, send, [{net_kernel, Id}, ?MODULE:deep_list(10000)]),
         _ = erpc:call(B, erlang, send, [{net_kernel, Id}, ?MODULE:deep_tuple(10000)]),
         %% Answered on the same connection, after the deep ones.
         ?assertEqual(pong, erpc:call(B, net_adm, ping, [Id]))
     end || Id <- Ids],
    {ok, S1} = ecall:stats(B),
    ?assertEqual(length(Ids), maps:get(links_up, S1)),
    ?assertEqual(maps:get(connects, S0), maps:get(connects, S1)),
    ?assertEqual(0, maps:get(inbound_malformed, S1)),
    ?assert(maps:get(inbound_ignored, S1) - maps:get(inbound_ignored, S0) >= 2 * length(Ids)),
    echo_through_links(B).

%% C, which does not run ecall, opens its own connections to the C-node
%% names (as a ping does) and sends the same deep terms there.
deep_terms_over_accepted_connections(Config) ->
    C = ?config(c, Config),
    I0 = identities(),
    [begin
         _ = erpc:call(C, erlang, send, [{net_kernel, Id}, ?MODULE:deep_list(10000)]),
         _ = erpc:call(C, erlang, send, [{net_kernel, Id}, ?MODULE:deep_tuple(10000)]),
         ?assertEqual(pong, erpc:call(C, net_adm, ping, [Id]))
     end || Id <- ecall:identities()],
    I1 = identities(),
    [begin
         #{inbound_ignored := G0, inbound_malformed := M0} = maps:get(Id, I0),
         #{inbound_ignored := G1, inbound_malformed := M1} = maps:get(Id, I1),
         ?assertEqual(M0, M1),
         ?assert(G1 - G0 >= 2)
     end || Id <- ecall:identities()].

%% A message over the frame bound (1 MiB) on a connection without fragments
%% closes that connection only, counted; C's next ping opens a new one.
oversized_frame_closes_one_connection(Config) ->
    C = ?config(c, Config),
    B = ?config(b, Config),
    [Id | _] = ecall:identities(),
    pong = erpc:call(C, net_adm, ping, [Id]),
    #{inbound_malformed := M0} = maps:get(Id, identities()),
    Big = lists:seq(1, 300000),
    ?assertEqual(closed, erpc:call(C, ?MODULE, send_and_wait_close, [{net_kernel, Id}, Big])),
    #{inbound_malformed := M1} = maps:get(Id, identities()),
    ?assertEqual(M0 + 1, M1),
    ?assertEqual(pong, erpc:call(C, net_adm, ping, [Id])),
    %% The links to B never noticed.
    {ok, #{inbound_malformed := 0}} = ecall:stats(B),
    echo_through_links(B).

%% Over a link, where fragments were agreed, a 3 MB message comes in
%% pieces that each fit the bound: ignored, the link stays.
large_message_over_link_in_fragments(Config) ->
    B = ?config(b, Config),
    {ok, S0} = ecall:stats(B),
    [begin
         _ = erpc:call(B, erlang, send, [{net_kernel, Id}, binary:copy(<<7>>, 3000000)]),
         ?assertEqual(pong, erpc:call(B, net_adm, ping, [Id]))
     end || Id <- ecall:identities()],
    {ok, S1} = ecall:stats(B),
    ?assertEqual(maps:get(connects, S0), maps:get(connects, S1)),
    ?assertEqual(0, maps:get(inbound_malformed, S1)).

%%--------------------------------------------------------------------
%% Helpers

identities() ->
    #{identities := Ids} = ecall:stats(),
    maps:from_list([{N, I} || #{node := N} = I <- Ids]).

%% A round trip through the links: ecall:send to a process on B that
%% answers with ecall:send.
echo_through_links(B) ->
    Self = self(),
    Echo = erpc:call(B, erlang, spawn, [fun() -> receive M -> ecall:send(Self, {echo, M}) end end]),
    ecall:send(Echo, ping),
    receive {echo, ping} -> ok after 10000 -> ct:fail(no_echo) end.

%% On a peer: [[[...[]...]]] and {{{...{}...}}}, `N' levels.
deep_list(0) -> [];
deep_list(N) -> [deep_list(N - 1)].

deep_tuple(0) -> {};
deep_tuple(N) -> {deep_tuple(N - 1)}.

%% On a peer: sends `Msg' to `{Name, Node}' and waits for the connection to
%% `Node' to close.
send_and_wait_close({_, Node} = To, Msg) ->
    true = erlang:monitor_node(Node, true),
    To ! Msg,
    receive {nodedown, Node} -> closed after 10000 -> still_open end.

%% Any node can send the discovery scope process (OTP's pg, registered as
%% ecall_pg) a message it does not know, and pg crashes on it (OTP 25's pg
%% does on the discovery message of OTP 29's). Six such messages from B,
%% each after the scope came back: discovery restarts each time, then gives
%% up; the C-node, the connection to B and its links are the same processes
%% throughout, and messages still go through the links.
unknown_messages_to_discovery_stop_discovery_only(Config) ->
    B = ?config(b, Config),
    CNode = whereis(ecall_cnode),
    Conn = whereis(ecall_conn:name(B)),
    {ok, #{connects := Connects}} = ecall:stats(B),
    DiscoverySup = whereis(ecall_discovery_sup),
    SupRef = monitor(process, DiscoverySup),
    lists:foreach(
      fun(_) ->
              Pg = whereis(ecall_pg),
              Ref = monitor(process, Pg),
              _ = erpc:call(B, erlang, send, [{ecall_pg, node()}, {discover, self(), 1}]),
              receive {'DOWN', Ref, process, Pg, _} -> ok end,
              %% Answered once the supervisor has restarted (or given up).
              catch supervisor:which_children(DiscoverySup)
      end, lists:seq(1, 6)),
    receive {'DOWN', SupRef, process, DiscoverySup, Why} ->
            ?assertEqual(shutdown, Why)
    end,
    ?assertEqual(undefined, whereis(ecall_discovery_sup)),
    ?assertEqual(CNode, whereis(ecall_cnode)),
    ?assertEqual(Conn, whereis(ecall_conn:name(B))),
    ?assert(lists:keymember(ecall, 1, application:which_applications())),
    {ok, #{connects := Connects, links_up := 2} = S0} = ecall:stats(B),
    ?assertEqual({ok, B}, ecall:call(B, ecall_test_nodes, whoami, [])),
    {ok, S1} = ecall:stats(B),
    %% Counted when pushed, before the call returns.
    ?assertEqual(maps:get(pushed, S0) + 1, maps:get(pushed, S1)).
