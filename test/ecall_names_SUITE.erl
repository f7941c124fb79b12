%% Long names, IPv6, where the C-node identities listen, and TLS
%% distribution (the links speak TLS too when the node's options allow;
%% otherwise the pure-Erlang transport carries the traffic over the node's
%% own TLS connection).
%%
%% The nodes here are started with `-name' (on 127.0.0.1 or ::1), which the
%% Common Test node (`-sname') cannot connect to: they are OTP `peer' nodes
%% driven over their standard input and output, and talk to each other by
%% distribution and through ecall. They use the epmd of
%% test/scripts/with_epmd.sh.
-module(ecall_names_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0]).
-export([long_names_ipv4/1, long_names_ipv6/1, use_interface_binds_the_identities/1,
         listen_port_range_holds_the_identities/1, no_room_in_the_range_means_erlang_transport/1,
         tls_links/1, tls_links_ipv6/1, tls_links_from_ssl_dist_opt/1,
         tls_listener_uses_the_server_options/1,
         tls_options_not_honoured_use_the_erlang_transport/1,
         tls_untrusted_peer_is_refused_both_ways/1]).
%% Run on peers.
-export([connect_and_link_downs/1, log/2]).

suite() ->
    [{timetrap, {minutes, 5}}].

all() ->
    [long_names_ipv4, long_names_ipv6, use_interface_binds_the_identities,
     listen_port_range_holds_the_identities, no_room_in_the_range_means_erlang_transport,
     tls_links, tls_links_ipv6, tls_links_from_ssl_dist_opt,
     tls_listener_uses_the_server_options,
     tls_options_not_honoured_use_the_erlang_transport,
     tls_untrusted_peer_is_refused_both_ways].

%% Two `-name' nodes on 127.0.0.1: connect through the C-node links, 100,000
%% messages from 1,000 callers exactly once and in order, a call.
long_names_ipv4(_Config) ->
    X = start("x", "127.0.0.1", []),
    Y = start("y", "127.0.0.1", []),
    exchange(X, Y),
    stop([X, Y]).

%% The same over IPv6 distribution (`-proto_dist inet6_tcp', names on ::1).
%% The identities listen on IPv6 too: before anything connects the two
%% nodes, the peer pings one of them (a new connection to its listener).
long_names_ipv6(_Config) ->
    Inet6 = ["-proto_dist", "inet6_tcp"],
    X = start("x", "::1", Inet6),
    Y = start("y", "::1", Inet6),
    ?assertMatch("x" ++ _, atom_to_list(ping_identity(X, Y))),
    exchange(X, Y),
    stop([X, Y]).

%% Before anything connects the two nodes, Y pings one of X's C-node
%% identities: a new connection to the identities' listener (over TLS
%% when the nodes run TLS distribution). Returns the identity.
ping_identity({PX, _}, {PY, _}) ->
    [Id | _] = peer:call(PX, ecall, identities, []),
    ?assertEqual([], peer:call(PY, erlang, nodes, [connected])),
    ?assertEqual(pong, peer:call(PY, net_adm, ping, [Id], 30000)),
    Id.

%% X connects to Y and sends 100,000 messages from 1,000 callers, exactly
%% once and in order, and a call, through the links; returns X's stats.
exchange({PX, _}, {_, NY}) ->
    ?assertEqual(ok, peer:call(PX, ecall, connect, [NY], 30000)),
    ?assertEqual(100000, peer:call(PX, ecall_test_nodes, many_callers_exactly_once, [NY],
                                   150000)),
    ?assertEqual({ok, NY}, peer:call(PX, ecall, call, [NY, erlang, node, []], 30000)),
    %% Through the links, not the fallback.
    {ok, Stats} = peer:call(PX, ecall, stats, [NY]),
    %% The call's own request may not be counted yet (its writer counts
    %% after the write); the 100,000 before it are.
    ?assert(maps:get(requests, Stats) >= 100000),
    ?assertEqual(2, maps:get(links_up, Stats)),
    Stats.

%% With `inet_dist_use_interface' the identities listen on that address
%% only, as the node does: 127.0.0.1 answers, 127.0.0.2 (loopback as well)
%% does not. Without it they listen on every interface.
use_interface_binds_the_identities(_Config) ->
    Kept = start("x", "127.0.0.1", ["-kernel", "inet_dist_use_interface", "{127,0,0,1}"]),
    Open = start("y", "127.0.0.1", []),
    [KeptPort | _] = ports(Kept),
    [OpenPort | _] = ports(Open),
    ?assertMatch({ok, _}, try_connect({127, 0, 0, 1}, KeptPort)),
    ?assertEqual({error, econnrefused}, try_connect({127, 0, 0, 2}, KeptPort)),
    ?assertMatch({ok, _}, try_connect({127, 0, 0, 2}, OpenPort)),
    stop([Kept, Open]).

%% With `inet_dist_listen_min/max' the identities take ports of that range.
listen_port_range_holds_the_identities(_Config) ->
    {X, {Min, Max}} = start_in_range("x", 10),
    Ports = ports(X),
    ?assertEqual(2, length(Ports)),
    [?assert(P >= Min andalso P =< Max) || P <- Ports],
    stop([X]).

%% A range with room for the node alone: ecall starts, says so, and uses
%% the pure-Erlang transport (same API) instead of failing.
no_room_in_the_range_means_erlang_transport(_Config) ->
    {X = {PX, _}, _} = start_in_range("x", 1),
    Y = {_, NY} = start("y", "127.0.0.1", []),
    ?assertEqual(erlang, peer:call(PX, ecall_conn, transport, [])),
    ?assertEqual([], peer:call(PX, ecall, identities, [])),
    ?assertEqual(ok, peer:call(PX, ecall, connect, [NY], 30000)),
    ?assertEqual({ok, NY}, peer:call(PX, ecall, call, [NY, erlang, node, []], 30000)),
    stop([X, Y]).

%% Two nodes on TLS distribution (`-proto_dist inet_tls', certificates made
%% here: a CA and a node certificate for this host, verification on both
%% ways): the C-node links speak TLS too, with the node's client options,
%% and carry 100,000 messages exactly once and in order, in batches.
tls_links(Config) ->
    Conf = tls_conf(Config, "good", "ca", []),
    Tls = ["-proto_dist", "inet_tls", "-ssl_dist_optfile", Conf],
    X = {PX, _} = start_short("x", Tls),
    Y = start_short("y", Tls),
    ?assertMatch({ok, _}, peer:call(PX, ecall_cnode, cnode, [])),
    ?assertEqual(nif, peer:call(PX, ecall_conn, transport, [])),
    ping_identity(X, Y),
    Stats = exchange(X, Y),
    ?assert(maps:get(requests, Stats) > 2 * maps:get(batches, Stats)),
    stop([X, Y]).

%% TLS distribution over IPv6 (`-proto_dist inet6_tls', names on ::1, the
%% certificate naming the address): the identities listen on IPv6 with TLS
%% (a ping reaches one before the nodes are connected) and the links carry
%% 100,000 messages exactly once and in order.
tls_links_ipv6(Config) ->
    Conf = tls_conf(Config, "good6", "ca", []),
    Tls = ["-proto_dist", "inet6_tls", "-ssl_dist_optfile", Conf],
    X = {PX, _} = start("x", "::1", Tls),
    Y = start("y", "::1", Tls),
    ?assertEqual(nif, peer:call(PX, ecall_conn, transport, [])),
    ping_identity(X, Y),
    exchange(X, Y),
    stop([X, Y]).

%% The same options given as `-ssl_dist_opt' arguments instead of a file
%% (`client_certfile', ..., as OTP reads them): the links take the client
%% ones and carry a call and a burst, through TLS links; a peer's options
%% that they cannot honour (here `client_verify verify_none') still send
%% it to the pure-Erlang transport.
tls_links_from_ssl_dist_opt(Config) ->
    Conf = tls_conf(Config, "args", "ca", []),
    Dir = filename:dirname(Conf),
    Ca = filename:join([filename:dirname(Dir), "ca", "ca.pem"]),
    Side = fun(S, Verify) ->
                   [Opt || {K, V} <- [{"certfile", filename:join(Dir, "cert.pem")},
                                      {"keyfile", filename:join(Dir, "key.pem")},
                                      {"cacertfile", Ca}, {"verify", Verify}],
                           Opt <- ["-ssl_dist_opt", S ++ K, V]]
           end,
    Args = fun(Verify) ->
                   ["-proto_dist", "inet_tls" | Side("server_", "verify_peer")]
                       ++ ["-ssl_dist_opt", "server_fail_if_no_peer_cert", "true"
                           | Side("client_", Verify)]
           end,
    X = {PX, _} = start_short("x", Args("verify_peer")),
    Y = {_, NY} = start_short("y", Args("verify_peer")),
    Z = {PZ, _} = start_short("z", Args("verify_none")),
    ?assertEqual(nif, peer:call(PX, ecall_conn, transport, [])),
    ?assertEqual(ok, peer:call(PX, ecall, connect, [NY], 30000)),
    ?assertEqual({ok, NY}, peer:call(PX, ecall, call, [NY, erlang, node, []], 30000)),
    %% The reply can come before the link's writer has counted the
    %% request: read the counters once a marker behind it on every link
    %% has come back (the markers' own counts may still lag).
    _ = peer:call(PX, ecall_test_nodes, flush_links, [NY], 30000),
    {ok, Stats} = peer:call(PX, ecall, stats, [NY]),
    ?assertEqual(2, maps:get(links_up, Stats)),
    ?assert(maps:get(requests, Stats) >= 1),
    ?assertMatch({error, {unsupported_tls, "client option verify is not verify_peer"}},
                 peer:call(PZ, ecall_cnode, cnode, [])),
    ?assertEqual(erlang, peer:call(PZ, ecall_conn, transport, [])),
    stop([X, Y, Z]).

%% The identities' listener presents the node's server certificate, the
%% links the client one. Here each is good for its role only (extended key
%% usage serverAuth, clientAuth), as OTP checks: a peer's ping to an
%% identity is answered, and the links connect and carry a call.
tls_listener_uses_the_server_options(Config) ->
    {SCert, SKey, Ca} = tls_cert(Config, "server_only", "ca", "serverAuth"),
    {CCert, CKey, Ca} = tls_cert(Config, "client_only", "ca", "clientAuth"),
    Side = fun(Cert, Key) ->
                   [{certfile, Cert}, {keyfile, Key}, {cacertfile, Ca}, {verify, verify_peer}]
           end,
    Conf = filename:join(filename:dirname(SCert), "split.conf"),
    ok = file:write_file(Conf, io_lib:format(
        "~p.~n", [[{server, [{fail_if_no_peer_cert, true} | Side(SCert, SKey)]},
                   {client, Side(CCert, CKey)}]])),
    Tls = ["-proto_dist", "inet_tls", "-ssl_dist_optfile", Conf],
    X = {PX, _} = start_short("x", Tls),
    Y = {_, NY} = start_short("y", Tls),
    ?assertEqual(nif, peer:call(PX, ecall_conn, transport, [])),
    ping_identity(X, Y),
    ?assertEqual(ok, peer:call(PX, ecall, connect, [NY], 30000)),
    ?assertEqual({ok, NY}, peer:call(PX, ecall, call, [NY, erlang, node, []], 30000)),
    {ok, Stats} = peer:call(PX, ecall, stats, [NY]),
    ?assertEqual(2, maps:get(links_up, Stats)),
    stop([X, Y]).

%% Client options the links cannot honour (here `verify_none'): no C-node
%% identities, one notice, and the pure-Erlang transport over the node's
%% own TLS distribution, at once (not after a handshake timeout).
tls_options_not_honoured_use_the_erlang_transport(Config) ->
    Conf = tls_conf(Config, "lax", "ca", [{verify, verify_none}]),
    Tls = ["-proto_dist", "inet_tls", "-ssl_dist_optfile", Conf],
    X = {PX, _} = start_short("x", Tls),
    Y = {_, NY} = start_short("y", Tls),
    ?assertMatch({error, {unsupported_tls, "client option verify is not verify_peer"}},
                 peer:call(PX, ecall_cnode, cnode, [])),
    ?assertEqual(erlang, peer:call(PX, ecall_conn, transport, [])),
    T0 = erlang:monotonic_time(millisecond),
    ?assertEqual(ok, peer:call(PX, ecall, connect, [NY], 30000)),
    ?assertEqual({ok, NY}, peer:call(PX, ecall, call, [NY, erlang, node, []], 30000)),
    ?assert(erlang:monotonic_time(millisecond) - T0 < 5000),
    stop([X, Y]).

%% A peer whose certificate the links do not trust is refused by the
%% links' own TLS handshake, and the reason says so. The nodes' own
%% distribution connects them the other way (Y dials X and Z, with
%% certificates both sides trust), so ecall:connect/1 gets past its hello
%% over that connection to the links, whose TLS handshake fails; it
%% returns {error, timeout} at `connect_timeout'. Both ways:
%% - X's links check Y's certificate against X's client CA certificates,
%%   which are another CA's (X's server side trusts Y's CA: Y's
%%   distribution connects to X). X's link-down reason names the unknown
%%   issuer of Y's certificate.
%% - Z's links present a client certificate of another CA (Z's server
%%   certificate is Y's CA's: Y's distribution connects to Z). Y's
%%   distribution listener refuses it, and Z's link-down reason is the
%%   TLS alert Y sent: unknown CA.
tls_untrusted_peer_is_refused_both_ways(Config) ->
    Trusted = tls_conf(Config, "trusted", "ca", []),
    {StrangerCert, StrangerKey, OtherCa} = tls_cert(Config, "stranger", "otherca",
                                                    "serverAuth,clientAuth"),
    Distrustful = tls_conf(Config, "distrustful", "ca", [{cacertfile, OtherCa}]),
    Untrusted = tls_conf(Config, "untrusted", "ca", [{certfile, StrangerCert},
                                                     {keyfile, StrangerKey}]),
    %% `-connect_all false': global would connect X and Z, which cannot
    %% reach each other, and drop Y's connections when that fails.
    Args = fun(Conf) -> ["-proto_dist", "inet_tls", "-ssl_dist_optfile", Conf,
                         "-connect_all", "false",
                         "-ecall", "connect_timeout", "3000", "-ecall", "discovery", "false"]
           end,
    X = {PX, _} = start_short("x", Args(Distrustful)),
    Y = {PY, NY} = start_short("y", Args(Trusted)),
    Z = {PZ, _} = start_short("z", Args(Untrusted)),
    [?assertEqual(nif, peer:call(P, ecall_conn, transport, [])) || P <- [PX, PZ]],
    [?assertEqual(pong, peer:call(PY, net_adm, ping, [N], 30000)) || {_, N} <- [X, Z]],
    {XResult, XDowns} = peer:call(PX, ?MODULE, connect_and_link_downs, [NY], 30000),
    {ZResult, ZDowns} = peer:call(PZ, ?MODULE, connect_and_link_downs, [NY], 30000),
    ct:pal("X: ~p, ~p~nZ: ~p, ~p", [XResult, XDowns, ZResult, ZDowns]),
    ?assertEqual({error, timeout}, XResult),
    ?assertEqual({error, timeout}, ZResult),
    ?assertEqual([1, 2], lists:sort([K || {K, _} <- XDowns])),
    ?assertEqual([1, 2], lists:sort([K || {K, _} <- ZDowns])),
    [?assertEqual({handshake, <<"TLS: invalid peer certificate: UnknownIssuer">>}, Why)
     || {_, Why} <- XDowns],
    [?assertEqual({handshake, <<"TLS: received fatal alert: UnknownCA">>}, Why)
     || {_, Why} <- ZDowns],
    stop([X, Y, Z]).

%% On a peer: ecall:connect(Node)'s result, and the links that went down
%% meanwhile with their reasons, as the connection logged them (the first
%% down of each link).
connect_and_link_downs(Node) ->
    ok = logger:add_handler(?MODULE, ?MODULE, #{config => #{pid => self()}}),
    try ecall:connect(Node) of
        Result -> {Result, link_downs()}
    after
        logger:remove_handler(?MODULE)
    end.

link_downs() ->
    receive {link_down, K, Why} -> [{K, Why} | link_downs()] after 0 -> [] end.

%% logger handler (connect_and_link_downs/1): a link's down, from its
%% connection's log line.
log(#{msg := {"ecall: link ~b to ~p down: ~p", [K, _Node, Why]}}, #{config := #{pid := Pid}}) ->
    Pid ! {link_down, K, Why};
log(_Event, _Config) ->
    ok.

%% Certificates in their own directory Name: a CA (Ca: two names give two
%% unrelated CAs) and a node certificate for this host signed by it; and
%% an ssl_dist_optfile with verification both ways (`Client' options
%% replace the client's defaults). Returns the optfile's path.
tls_conf(Config, Name, Ca, Client) ->
    {Cert, Key, CaPem} = tls_cert(Config, Name, Ca, "serverAuth,clientAuth"),
    Side = [{certfile, Cert}, {keyfile, Key}, {cacertfile, CaPem}, {verify, verify_peer}],
    ClientSide = lists:ukeymerge(1, lists:ukeysort(1, Client), lists:ukeysort(1, Side)),
    Conf = filename:join(filename:dirname(Cert), "dist.conf"),
    ok = file:write_file(Conf, io_lib:format(
        "~p.~n", [[{server, [{fail_if_no_peer_cert, true} | Side]}, {client, ClientSide}]])),
    Conf.

%% A certificate for this host in directory Name, for the extended key
%% usages Eku, signed by CA Ca (made on first use). Returns the paths of
%% the certificate, its key and the CA certificate.
tls_cert(Config, Name, Ca, Eku) ->
    Root = ?config(priv_dir, Config),
    CaDir = filename:join(Root, Ca),
    Dir = filename:join(Root, Name),
    ok = filelib:ensure_path(Dir),
    Host = lists:last(string:split(atom_to_list(node()), "@")),
    C = fun(F) -> filename:join(CaDir, F) end,
    F = fun(File) -> filename:join(Dir, File) end,
    case filelib:is_regular(C("ca.pem")) of
        true ->
            ok;
        false ->
            ok = filelib:ensure_path(CaDir),
            openssl(["req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ecall-test-", Ca,
                     " -keyout ", C("ca.key"), " -out ", C("ca.pem")])
    end,
    %% `DNS:::1' as well as `IP:::1': OTP's inet6_tls checks the host part
    %% of a node name (`::1') as a DNS name; rustls checks an address
    %% against the IP names.
    Ext = F("ext.cnf"),
    ok = file:write_file(Ext, ["basicConstraints=CA:FALSE\n",
                               "extendedKeyUsage=", Eku, "\n",
                               "subjectAltName=DNS:", Host, ",DNS:::1,IP:127.0.0.1,IP:::1\n"]),
    openssl(["req -newkey rsa:2048 -nodes -subj /CN=", Host,
             " -keyout ", F("key.pem"), " -out ", F("node.csr")]),
    openssl(["x509 -req -days 2 -in ", F("node.csr"), " -CA ", C("ca.pem"),
             " -CAkey ", C("ca.key"), " -CAcreateserial -extfile ", Ext, " -out ", F("cert.pem")]),
    {F("cert.pem"), F("key.pem"), C("ca.pem")}.

openssl(Args) ->
    Out = os:cmd(lists:flatten(["openssl ", Args, " 2>&1; echo rc=$?"])),
    ?assertMatch({match, _}, re:run(Out, "rc=0\n$"), Out).

%%--------------------------------------------------------------------

%% A `-sname' node (its host name is this node's).
start_short(Prefix, Extra) ->
    {ok, Peer, Node} =
        peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                          connection => standard_io, name => peer:random_name(Prefix),
                          args => ["-setcookie", "ecall_names" | Extra]
                              ++ ecall_test_nodes:node_args(),
                          wait_boot => 60000}),
    {ok, _} = peer:call(Peer, application, ensure_all_started, [ecall], 30000),
    {Peer, Node}.

%% A node on `Host' with long names, running ecall, linked to the caller
%% once it has booted: a node that does not boot raises `{boot_failed, _}'
%% in the caller (start_in_range/3 retries on it).
start(Prefix, Host, Extra) ->
    Name = peer:random_name(Prefix),
    Node = list_to_atom(Name ++ "@" ++ Host),
    {ok, Peer, Node} =
        peer:start(#{exec => ecall_test_nodes:node_exec(),
                     connection => standard_io, name => Name, host => Host,
                     longnames => true,
                     args => ["-setcookie", "ecall_names" | Extra]
                         ++ ecall_test_nodes:node_args(),
                     wait_boot => 60000}),
    true = link(Peer),
    {ok, _} = peer:call(Peer, application, ensure_all_started, [ecall], 30000),
    {Peer, Node}.

stop(Nodes) ->
    [peer:stop(P) || {P, _} <- Nodes],
    ok.

%% The listen ports of a node's identities.
ports({Peer, _}) ->
    {ok, C} = peer:call(Peer, ecall_cnode, cnode, []),
    [P || #{port := P} <- peer:call(Peer, ecall_nif, cnode_info, [C])].

try_connect(Ip, Port) ->
    case gen_tcp:connect(Ip, Port, [binary, {active, false}], 5000) of
        {ok, S} -> gen_tcp:close(S), {ok, Port};
        Error -> Error
    end.

range_args(Min, Max) ->
    ["-kernel", "inet_dist_listen_min", integer_to_list(Min),
     "-kernel", "inet_dist_listen_max", integer_to_list(Max)].

%% A node (start/3 on 127.0.0.1) whose listen port range is N
%% consecutive ports that were free: {Node, {Min, Max}}. Free is when
%% free_range/1 looks; another process can take a port before the node
%% binds it, since the node must bind them itself. A node whose own
%% listener finds its port taken does not boot (`eaddrinuse'): then, if a
%% port of the range is indeed taken now, another range is tried, a few
%% times. (With room for more than the node, the node and its identities
%% move on to the next free port of the range by themselves.)
start_in_range(Prefix, N) ->
    start_in_range(Prefix, N, 5).

start_in_range(_Prefix, N, 0) ->
    ct:fail({no_free_range_kept, N});
start_in_range(Prefix, N, Tries) ->
    {Min, Max} = Range = free_range(N),
    try start(Prefix, "127.0.0.1", range_args(Min, Max)) of
        Node -> {Node, Range}
    catch
        exit:{boot_failed, _} = Why ->
            case lists:all(fun port_free/1, lists:seq(Min, Max)) of
                true -> exit(Why);
                false ->
                    ct:pal("range ~p taken before the node bound it: another one", [Range]),
                    start_in_range(Prefix, N, Tries - 1)
            end
    end.

%% N consecutive ports free now on 127.0.0.1 and on every interface (found
%% by binding them).
free_range(N) ->
    Base = 40000 + rand:uniform(15000),
    case lists:all(fun(P) -> port_free(P) end, lists:seq(Base, Base + N - 1)) of
        true -> {Base, Base + N - 1};
        false -> free_range(N)
    end.

port_free(P) ->
    case gen_tcp:listen(P, [{reuseaddr, false}]) of
        {ok, L} -> gen_tcp:close(L), true;
        {error, _} -> false
    end.
