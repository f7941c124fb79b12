%% What a node running ecall prints with OTP's default logger
%% configuration, and how it boots when the Rust path cannot work.
%%
%% Every node here is an `erl' started as a port with no logger settings
%% and no handler of the tests: what the case reads is what a user of a
%% plain node or release sees on its standard output.
-module(ecall_boot_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_testcase/2, end_per_testcase/2]).
-export([not_distributed_is_printed/1, refused_configuration_is_printed/1,
         negative_value_on_the_command_line_is_printed/1,
         nif_fallback_is_printed/1, link_down_is_printed/1,
         squatted_name_boots_then_moves_to_the_links/1,
         unreachable_epmd_boots_then_moves_to_the_links/1,
         missing_or_unreadable_tls_files_boot_then_move_to_the_links/1]).
%% Run on the nodes.
-export([seq_collector/1, seq_sender/2]).
%% A peer's printer (group leader of its control process).
-export([printer/2]).

%% An upper bound on waiting for a line or a state, never a pause.
-define(WAIT, 30000).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [not_distributed_is_printed, refused_configuration_is_printed,
     negative_value_on_the_command_line_is_printed, nif_fallback_is_printed,
     link_down_is_printed, squatted_name_boots_then_moves_to_the_links,
     unreachable_epmd_boots_then_moves_to_the_links,
     missing_or_unreadable_tls_files_boot_then_move_to_the_links].

%% Every node a case starts is written down (its OS pid) and stopped after
%% the case, whatever its outcome.
init_per_testcase(_Case, Config) ->
    File = filename:join(?config(priv_dir, Config), "os_pids"),
    ok = file:write_file(File, <<>>),
    put(os_pids, File),
    Config.

end_per_testcase(_Case, Config) ->
    File = filename:join(?config(priv_dir, Config), "os_pids"),
    {ok, Text} = file:read_file(File),
    _ = [os:cmd("kill -9 " ++ binary_to_list(P)) || P <- binary:split(Text, <<"\n">>, [global, trim_all])],
    ok.

%% Writes down a node's OS pid (end_per_testcase/2).
written_down(OsPid) ->
    ok = file:write_file(get(os_pids), [OsPid, $\n], [append]).

%% A node without -sname/-name says that ecall is plain `!' and erpc there.
not_distributed_is_printed(_Config) ->
    Lines = run_to_end(ecall_test_nodes:code_paths(),
                       "{ok, _} = application:ensure_all_started(ecall), init:stop()."),
    ?assert(has(Lines, "ecall: this node is not distributed")).

%% A bad value stops ecall's start with an error naming the key and what
%% it allows, and the node prints it.
refused_configuration_is_printed(_Config) ->
    Lines = run_to_end(ecall_test_nodes:code_paths() ++ ["-ecall", "overflow", "bogus"],
                       "io:format(\"start: ~p~n\", [application:ensure_all_started(ecall)]), "
                       "init:stop()."),
    ?assert(has(Lines, "ecall: configuration refused")),
    ?assert(has(Lines, "{bad_config,overflow,bogus} (allowed: block, error, drop)")).

%% `-ecall max_queue_bytes -1': erl takes `-1' for a flag of its own and
%% the key is not set. ecall starts on the default and prints that the key
%% has no value, and how to write it; written so, the value is refused.
negative_value_on_the_command_line_is_printed(_Config) ->
    Start = "io:format(\"start: ~p~n\", [application:ensure_all_started(ecall)]), init:stop().",
    Lines = run_to_end(ecall_test_nodes:code_paths() ++ ["-ecall", "max_queue_bytes", "-1"],
                       Start),
    ?assert(has(Lines, "ecall: -ecall max_queue_bytes has no value on the command line")),
    ?assert(has(Lines, "start: {ok,")),
    Quoted = run_to_end(ecall_test_nodes:code_paths() ++ ["-ecall", "max_queue_bytes", "(-1)"],
                        Start),
    ?assert(has(Quoted, "{bad_config,max_queue_bytes,-1} (allowed: integer > 0)")).

%% ecall's code without its library (an installation missing the .so, or
%% one built for another OTP): ecall starts on the pure-Erlang transport
%% and says so, as an error.
nif_fallback_is_printed(Config) ->
    Ebin = filename:join([?config(priv_dir, Config), "ecall", "ebin"]),
    ok = filelib:ensure_dir(filename:join(Ebin, "x")),
    From = filename:dirname(code:which(ecall)),
    _ = [{ok, _} = file:copy(F, filename:join(Ebin, filename:basename(F)))
         || F <- filelib:wildcard(filename:join(From, "*"))],
    Lines = run_to_end(["-sname", peer:random_name(ecall_boot), "-setcookie", cookie(),
                        "-pa", Ebin],
                       "{ok, _} = application:ensure_all_started(ecall), "
                       "io:format(\"transport: ~p~n\", [ecall_conn:transport()]), init:stop()."),
    ?assert(has(Lines, "ecall: the NIF did not load")),
    ?assert(has(Lines, "transport: erlang")).

%% A peer killed with SIGKILL: the node prints that the connection (or a
%% link of it) went down.
link_down_is_printed(_Config) ->
    process_flag(trap_exit, true),
    {A, Port, _} = start_node(peer:random_name(ecall_boot_a), []),
    {_Peer, B} = ecall_test_nodes:start_peer(),
    ok = erpc:call(A, ecall, connect, [B], ?WAIT),
    OsPid = erpc:call(B, os, getpid, []),
    "" = os:cmd("kill -9 " ++ OsPid),
    Line = await_line(Port, [atom_to_list(B)], ["down", "closed (nodedown)"]),
    ct:pal("printed: ~ts", [Line]),
    stop_node(A, Port).

%% Another node holds the name of this node's first C-node identity in
%% epmd before ecall starts. The node boots anyway, says which name is
%% taken and what to do, and serves a peer over the pure-Erlang transport.
%% When the squatter goes away, the identities register in the background
%% and the connection moves to the links, while a caller sends numbered
%% messages (and a call every 100): every one arrives once and in order,
%% and the links carry the traffic after the move.
squatted_name_boots_then_moves_to_the_links(_Config) ->
    process_flag(trap_exit, true),
    Name = peer:random_name(ecall_boot_x),
    {Squatter, SquatPort} = start_plain(Name ++ "_ecall_1"),
    {X, Port, Boot} = start_node(Name, []),
    %% Printed while ecall started (the line may reach us after `up').
    Warning = case [L || L <- Boot, string:find(L, "_ecall_1@") =/= nomatch,
                         string:find(L, "is taken in epmd") =/= nomatch] of
                  [L | _] -> L;
                  [] -> await_line(Port, ["_ecall_1@"], ["is taken in epmd"])
              end,
    ct:pal("printed: ~ts", [Warning]),
    ?assertMatch({registering, {name_taken, _}},
                 maps:get(identities_state, erpc:call(X, ecall, stats, []))),
    {_Peer, B} = ecall_test_nodes:start_peer(),
    ok = erpc:call(X, ecall, connect, [B], ?WAIT),
    ?assertMatch({ok, #{transport := erlang}}, erpc:call(X, ecall, stats, [B])),
    ?assertEqual({ok, B}, erpc:call(X, ecall, call, [B, erlang, node, []])),
    Collector = erpc:call(B, erlang, spawn, [?MODULE, seq_collector, [self()]]),
    Sender = erpc:call(X, erlang, spawn, [?MODULE, seq_sender, [Collector, B]]),
    Before = await_count(Collector, 1000),
    %% The squatter goes; the next registration attempt (at most 10 s
    %% later) takes the name.
    ok = erpc:call(Squatter, init, stop, []),
    receive {SquatPort, {exit_status, 0}} -> ok after ?WAIT -> ct:fail(squatter_stayed) end,
    Moved = await_line(Port, ["registered with epmd"], ["move to the NIF transport"]),
    ct:pal("printed: ~ts", [Moved]),
    await_transport(X, B, nif),
    %% Traffic goes on after the move, through the links.
    _ = await_count(Collector, Before + 2000),
    Sender ! stop,
    {Sent, Got, OutOfOrder} = receive {collected, Collector, R} -> R
                              after ?WAIT -> ct:fail(no_collection)
                              end,
    ct:pal("~b sent, ~b received, ~b out of order, ~b before the move",
           [Sent, Got, OutOfOrder, Before]),
    ?assertEqual({Sent, Sent, 0}, {Sent, Got, OutOfOrder}),
    {ok, #{transport := nif, requests := Requests}} = erpc:call(X, ecall, stats, [B]),
    ?assert(Requests > 0),
    ?assertEqual(registered, maps:get(identities_state, erpc:call(X, ecall, stats, []))),
    stop_node(X, Port).

%% The epmd the C-node identities register with cannot be reached when
%% ecall starts (here the node's `erl_epmd_port' names a port nobody
%% listens on; its own distribution uses the real epmd). The node boots
%% anyway, prints one warning that names the failure, shows
%% `{registering, Why}' in its stats and serves a peer over the
%% pure-Erlang transport. Once epmd can be reached, a registration retried
%% in the background succeeds and the connection moves to the links.
unreachable_epmd_boots_then_moves_to_the_links(_Config) ->
    process_flag(trap_exit, true),
    {Held, Closed} = closed_port(),
    {X, Port, Boot} = start_node(peer:random_name(ecall_boot_e),
                                 ["-kernel", "erl_epmd_port", integer_to_list(Closed)]),
    try
        Warning = printed_or_await(Boot, Port, ["C-node identities could not start", "epmd"],
                                   ["pure-Erlang transport"]),
        ct:pal("printed: ~ts", [Warning]),
        ?assertMatch({registering, _}, maps:get(identities_state, erpc:call(X, ecall, stats, []))),
        ?assertEqual([], erpc:call(X, ecall, identities, [])),
        {Peer, B} = ecall_test_nodes:start_peer(),
        try epmd_comes_within_reach(X, Port, B)
        after peer:stop(Peer)
        end
    after
        stop_node(X, Port),
        ok = socket:close(Held)
    end.

epmd_comes_within_reach(X, Port, B) ->
    ok = erpc:call(X, ecall, connect, [B], ?WAIT),
    ?assertMatch({ok, #{transport := erlang}}, erpc:call(X, ecall, stats, [B])),
    ?assertEqual({ok, B}, erpc:call(X, ecall, call, [B, erlang, node, []])),
    %% epmd within reach: the next attempt (at most 10 s later)
    %% registers the identities.
    Epmd = list_to_integer(os:getenv("ERL_EPMD_PORT")),
    ok = erpc:call(X, application, set_env, [kernel, erl_epmd_port, Epmd]),
    Moved = await_line(Port, ["registered with epmd"], ["move to the NIF transport"]),
    ct:pal("printed: ~ts", [Moved]),
    await_transport(X, B, nif),
    {ok, #{links := Links, links_up := Up}} = erpc:call(X, ecall, stats, [B]),
    ?assertEqual({2, 2}, {Links, Up}),
    ?assertEqual({ok, B}, erpc:call(X, ecall, call, [B, erlang, node, []])),
    ?assertEqual(registered, maps:get(identities_state, erpc:call(X, ecall, stats, []))).

%% A node on TLS distribution whose TLS files cannot be read when ecall
%% starts: one node's server certificate file is missing, the other's
%% server key file is a directory. Each boots anyway, prints one warning
%% that names the file, shows `{registering, Why}' in its stats and serves
%% a TLS peer over the pure-Erlang transport, on the node's own TLS
%% distribution (which reads the files only when it accepts a connection).
%% Once the files are in place, a registration retried in the background
%% succeeds and the connections move to the links, which speak TLS.
%%
%% These nodes cannot talk to this (plain) node: they are `peer' nodes
%% driven over standard input and output, and what they print with OTP's
%% default logger configuration comes back through their control process
%% (its group leader here is printer/2).
missing_or_unreadable_tls_files_boot_then_move_to_the_links(Config) ->
    Dir = filename:join(?config(priv_dir, Config), "tls_late"),
    {Cert, Key, Ca} = tls_cert(Dir),
    Late = fun(Name) -> filename:join(Dir, Name) end,
    Side = fun(C, K) -> [{certfile, C}, {keyfile, K}, {cacertfile, Ca}, {verify, verify_peer}] end,
    Conf = fun(Name, Server) ->
                   File = filename:join(Dir, Name ++ ".conf"),
                   ok = file:write_file(File, io_lib:format(
                          "~p.~n", [[{server, [{fail_if_no_peer_cert, true} | Server]},
                                     {client, Side(Cert, Key)}]])),
                   File
           end,
    Good = Conf("good", Side(Cert, Key)),
    NoCert = Conf("no_cert", Side(Late("late_cert.pem"), Key)),
    DirKey = Conf("dir_key", Side(Cert, Late("late_key.pem"))),
    ok = file:make_dir(Late("late_key.pem")),
    Self = self(),
    with_tls_nodes([{"y", Good}, {"x1", NoCert}, {"x2", DirKey}], Self,
                   fun(Nodes) -> tls_files_come_late(Nodes, Cert, Key, Late) end).

tls_files_come_late([{_, NY, _}, {PX1, _, Printer1}, {PX2, _, Printer2}], Cert, Key, Late) ->
    Falls = [{PX1, Printer1, "late_cert.pem"}, {PX2, Printer2, "late_key.pem"}],
    [begin
         Warning = await_printed(Printer, ["C-node identities could not start", File],
                                 ["pure-Erlang transport"]),
         ct:pal("printed: ~ts", [Warning]),
         ?assertMatch({registering, _}, maps:get(identities_state, peer:call(P, ecall, stats, []))),
         ?assertEqual(ok, peer:call(P, ecall, connect, [NY], ?WAIT)),
         ?assertMatch({ok, #{transport := erlang}}, peer:call(P, ecall, stats, [NY])),
         ?assertEqual({ok, NY}, peer:call(P, ecall, call, [NY, erlang, node, []], ?WAIT))
     end || {P, Printer, File} <- Falls],
    %% The files in place: the next attempts (at most 10 s later)
    %% register the identities.
    {ok, _} = file:copy(Cert, Late("late_cert.pem")),
    ok = file:del_dir(Late("late_key.pem")),
    {ok, _} = file:copy(Key, Late("late_key.pem")),
    [begin
         Moved = await_printed(Printer, ["registered with epmd"], ["move to the NIF transport"]),
         ct:pal("printed: ~ts", [Moved]),
         await_links(P, NY, erlang:monotonic_time(millisecond) + ?WAIT),
         ?assertEqual({ok, NY}, peer:call(P, ecall, call, [NY, erlang, node, []], ?WAIT)),
         ?assertEqual(registered, maps:get(identities_state, peer:call(P, ecall, stats, [])))
     end || {P, Printer, _} <- Falls].

%% On B: counts numbered messages from one sender and checks their order;
%% answers `{count, N}' when asked, and reports at `{done, Sent}'.
seq_collector(Owner) ->
    seq_collect(Owner, 0, 0).

seq_collect(Owner, Last, Bad) ->
    receive
        {seq, I} when I =:= Last + 1 -> seq_collect(Owner, I, Bad);
        {seq, I} -> seq_collect(Owner, I, Bad + 1);
        {count, From} -> From ! {count, self(), Last}, seq_collect(Owner, Last, Bad);
        {done, Sent} -> Owner ! {collected, self(), {Sent, Last, Bad}}
    end.

%% On X: sends numbered messages by ecall:send/2, a call after every 100
%% (its answer paces the sender), until told to stop.
seq_sender(Collector, B) ->
    seq_send(Collector, B, 1).

seq_send(Collector, B, I) ->
    receive
        stop -> ecall:send(Collector, {done, I - 1})
    after 0 ->
        ecall:send(Collector, {seq, I}),
        _ = I rem 100 =:= 0 andalso ({ok, B} = ecall:call(B, erlang, node, [])),
        seq_send(Collector, B, I + 1)
    end.

%% --- helpers ---

cookie() ->
    atom_to_list(erlang:get_cookie()).

%% Runs a node to its end; its output lines.
run_to_end(Args, Eval) ->
    {Exec, Pre} = ecall_test_nodes:node_exec(),
    Port = open_port({spawn_executable, Exec},
                     [{args, Pre ++ ["-noinput" | Args] ++ ["-eval", Eval]},
                      exit_status, stderr_to_stdout, {line, 4096}]),
    {os_pid, OsPid} = erlang:port_info(Port, os_pid),
    written_down(integer_to_list(OsPid)),
    Lines = read_to_end(Port, []),
    [ct:log("~ts", [L]) || L <- Lines],
    Lines.

read_to_end(Port, Acc) ->
    receive
        {Port, {data, {_, Line}}} -> read_to_end(Port, [Line | Acc]);
        {Port, {exit_status, 0}} -> lists:reverse(Acc);
        {Port, {exit_status, S}} -> ct:fail({exit_status, S, lists:reverse(Acc)})
    after ?WAIT -> ct:fail({node_did_not_end, lists:reverse(Acc)})
    end.

has(Lines, Text) ->
    lists:any(fun(L) -> string:find(L, Text) =/= nomatch end, Lines).

%% A node running ecall with the default logger configuration, under
%% `-sname Name', connected to this node; returns once ecall has started.
start_node(Name, Extra) ->
    Reg = list_to_atom("ecall_boot_" ++ integer_to_list(erlang:unique_integer([positive]))),
    register(Reg, self()),
    Eval = lists:flatten(io_lib:format(
             "erlang:send({~p, ~p}, {os_pid, os:getpid()}), "
             "{ok, _} = application:ensure_all_started(ecall), "
             "erlang:send({~p, ~p}, {up, node()}).", [Reg, node(), Reg, node()])),
    {Exec, Pre} = ecall_test_nodes:node_exec(),
    Args = Pre ++ ["-sname", Name, "-setcookie", cookie(), "-noinput"
                   | ecall_test_nodes:node_args() ++ Extra ++ ["-eval", Eval]],
    Port = open_port({spawn_executable, Exec},
                     [{args, Args}, exit_status, stderr_to_stdout, {line, 4096}]),
    {Node, Lines} = await_up(Port, []),
    unregister(Reg),
    {Node, Port, Lines}.

%% The node's name once it is up, and the lines it printed until then.
await_up(Port, Lines) ->
    receive
        {os_pid, OsPid} -> written_down(OsPid), await_up(Port, Lines);
        {up, Node} -> {Node, lists:reverse(Lines)};
        {Port, {data, {_, Line}}} -> ct:log("~ts", [Line]), await_up(Port, [Line | Lines]);
        {Port, {exit_status, S}} -> ct:fail({node_exited, S})
    after ?WAIT -> ct:fail(node_not_up)
    end.

%% A plain node (no ecall) named `Name', hidden.
start_plain(Name) ->
    Reg = list_to_atom("ecall_boot_" ++ integer_to_list(erlang:unique_integer([positive]))),
    register(Reg, self()),
    Eval = lists:flatten(io_lib:format("erlang:send({~p, ~p}, {os_pid, os:getpid()}), "
                                       "erlang:send({~p, ~p}, {up, node()}).",
                                       [Reg, node(), Reg, node()])),
    Port = open_port({spawn_executable, os:find_executable("erl")},
                     [{args, ["-sname", Name, "-setcookie", cookie(), "-hidden", "-noinput",
                              "-eval", Eval]},
                      exit_status, stderr_to_stdout, {line, 4096}]),
    {Node, _} = await_up(Port, []),
    unregister(Reg),
    {Node, Port}.

stop_node(Node, Port) ->
    ok = erpc:call(Node, init, stop, []),
    await_exit(Port).

await_exit(Port) ->
    receive
        {Port, {data, {_, Line}}} -> ct:log("~ts", [Line]), await_exit(Port);
        {Port, {exit_status, 0}} -> ok;
        {Port, {exit_status, S}} -> ct:fail({exit_status, S})
    after ?WAIT -> ct:fail(node_did_not_stop)
    end.

%% The first line the node prints that holds every one of `All' and one of
%% `Any'.
await_line(Port, All, Any) ->
    receive
        {Port, {data, {_, Line}}} ->
            ct:log("~ts", [Line]),
            Has = fun(T) -> string:find(Line, T) =/= nomatch end,
            case lists:all(Has, All) andalso lists:any(Has, Any) of
                true -> Line;
                false -> await_line(Port, All, Any)
            end;
        {Port, {exit_status, S}} -> ct:fail({node_exited, S, All, Any})
    after ?WAIT -> ct:fail({no_line, All, Any})
    end.

%% A port on 127.0.0.1 that nobody listens on for as long as the socket
%% returned is open: {Socket, Port}. The socket is bound (the system
%% picks the port) and never listens, so a connection there is refused,
%% and no other process can bind the port meanwhile (a port bound and
%% then released could be taken, and listened on, before it is used).
closed_port() ->
    {ok, S} = socket:open(inet, stream, tcp),
    ok = socket:bind(S, #{family => inet, addr => {127, 0, 0, 1}, port => 0}),
    {ok, #{port := P}} = socket:sockname(S),
    {S, P}.

%% The first line of `Boot' (printed before the node was up), else the
%% first the node prints next, that holds every one of `All' and one of
%% `Any'.
printed_or_await(Boot, Port, All, Any) ->
    Has = fun(L) -> lists:all(fun(T) -> string:find(L, T) =/= nomatch end, All)
                        andalso lists:any(fun(T) -> string:find(L, T) =/= nomatch end, Any)
          end,
    case lists:filter(Has, Boot) of
        [L | _] -> L;
        [] -> await_line(Port, All, Any)
    end.

%% A CA and a certificate for this host signed by it, in Dir (made here,
%% verification both ways). Returns the paths of the certificate, its key
%% and the CA certificate.
tls_cert(Dir) ->
    ok = filelib:ensure_path(Dir),
    F = fun(File) -> filename:join(Dir, File) end,
    Host = lists:last(string:split(atom_to_list(node()), "@")),
    openssl(["req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=ecall-boot-ca",
             " -keyout ", F("ca.key"), " -out ", F("ca.pem")]),
    ok = file:write_file(F("ext.cnf"), ["basicConstraints=CA:FALSE\n",
                                        "extendedKeyUsage=serverAuth,clientAuth\n",
                                        "subjectAltName=DNS:", Host, ",IP:127.0.0.1\n"]),
    openssl(["req -newkey rsa:2048 -nodes -subj /CN=", Host,
             " -keyout ", F("key.pem"), " -out ", F("node.csr")]),
    openssl(["x509 -req -days 2 -in ", F("node.csr"), " -CA ", F("ca.pem"),
             " -CAkey ", F("ca.key"), " -CAcreateserial -extfile ", F("ext.cnf"),
             " -out ", F("cert.pem")]),
    {F("cert.pem"), F("key.pem"), F("ca.pem")}.

openssl(Args) ->
    Out = os:cmd(lists:flatten(["openssl ", Args, " 2>&1; echo rc=$?"])),
    ?assertMatch({match, _}, re:run(Out, "rc=0\n$"), Out).

%% Runs Fun with the nodes start_tls/3 starts, one per {Prefix, Conf},
%% and stops them whatever happens (also when one of them does not start).
with_tls_nodes(Specs, Owner, Fun) ->
    with_tls_nodes(Specs, Owner, Fun, []).

with_tls_nodes([], _Owner, Fun, Started) ->
    Fun(lists:reverse(Started));
with_tls_nodes([{Prefix, Conf} | Specs], Owner, Fun, Started) ->
    {Peer, _, _} = Node = start_tls(Prefix, Conf, Owner),
    try
        with_tls_nodes(Specs, Owner, Fun, [Node | Started])
    after
        peer:stop(Peer)
    end.

%% A `peer' node on TLS distribution with the optfile `Conf' and discovery
%% off, driven over standard input and output, running ecall; what it
%% prints goes to a printer/2 of `Owner'. {Peer, Node, Printer}.
start_tls(Prefix, Conf, Owner) ->
    {ok, Peer, Node} =
        peer:start_link(#{exec => ecall_test_nodes:node_exec(),
                          connection => standard_io, name => peer:random_name(Prefix),
                          args => ["-setcookie", cookie(), "-proto_dist", "inet_tls",
                                   "-ssl_dist_optfile", Conf, "-ecall", "discovery", "false"
                                   | ecall_test_nodes:node_args()],
                          wait_boot => 60000}),
    %% `peer' writes what the node prints to its own group leader.
    Printer = spawn_link(?MODULE, printer, [Owner, group_leader()]),
    true = group_leader(Printer, Peer),
    try {ok, _} = peer:call(Peer, application, ensure_all_started, [ecall], ?WAIT)
    catch Class:Why:Stack -> peer:stop(Peer), erlang:raise(Class, Why, Stack)
    end,
    {Peer, Node, Printer}.

%% An I/O server that passes each whole line written to it to `Owner' as
%% {printed, self(), Line}, and the text on to `Next' (the case's log).
printer(Owner, Next) ->
    printer(Owner, Next, <<>>).

printer(Owner, Next, Part) ->
    receive
        {io_request, From, ReplyAs, Request} ->
            Text = iolist_to_binary(io_text(Request)),
            _ = Text =/= <<>> andalso io:put_chars(Next, Text),
            From ! {io_reply, ReplyAs, ok},
            [Rest | Lines] = lists:reverse(binary:split(<<Part/binary, Text/binary>>, <<"\n">>,
                                                        [global])),
            [Owner ! {printed, self(), L} || L <- lists:reverse(Lines)],
            printer(Owner, Next, Rest)
    end.

io_text({put_chars, Enc, Chars}) -> unicode:characters_to_binary(Chars, Enc);
io_text({put_chars, Enc, M, F, A}) -> io_text({put_chars, Enc, apply(M, F, A)});
io_text({put_chars, Chars}) -> io_text({put_chars, latin1, Chars});
io_text({requests, Requests}) -> [io_text(R) || R <- Requests];
io_text(_) -> <<>>.

%% The first line the printer passes on that holds every one of `All' and
%% one of `Any'.
await_printed(Printer, All, Any) ->
    receive
        {printed, Printer, Line} ->
            Has = fun(T) -> string:find(Line, T) =/= nomatch end,
            case lists:all(Has, All) andalso lists:any(Has, Any) of
                true -> Line;
                false -> await_printed(Printer, All, Any)
            end
    after ?WAIT -> ct:fail({not_printed, All, Any})
    end.

%% Returns once the connection from the peer node to `Node' is on the NIF
%% transport with every link up (the move runs in a process of the peer's
%% ecall after its identities registered).
await_links(Peer, Node, Deadline) ->
    case peer:call(Peer, ecall, stats, [Node]) of
        {ok, #{transport := nif, links := L, links_up := L}} ->
            ok;
        Other ->
            erlang:monotonic_time(millisecond) < Deadline orelse ct:fail({links, Other}),
            %% Asks again once the peer's connection processes have handled
            %% what came before this call.
            _ = peer:call(Peer, ecall, connections, []),
            await_links(Peer, Node, Deadline)
    end.

%% Returns once the collector has counted at least N messages: its count.
await_count(Collector, N) ->
    Collector ! {count, self()},
    receive
        {count, Collector, C} when C >= N -> C;
        {count, Collector, _} -> await_count(Collector, N)
    after ?WAIT -> ct:fail({collector_stuck, N})
    end.

%% Returns once the connection from X to B is on `Transport'. The move
%% happens in a process of X's ecall after the identities registered.
await_transport(X, B, Transport) ->
    await_transport(X, B, Transport, erlang:monotonic_time(millisecond) + ?WAIT).

await_transport(X, B, Transport, Deadline) ->
    case erpc:call(X, ecall, stats, [B]) of
        {ok, #{transport := Transport}} ->
            ok;
        Other ->
            erlang:monotonic_time(millisecond) < Deadline orelse
                ct:fail({transport, Other}),
            %% Asks again once X's connection process has handled what
            %% came before this call.
            _ = erpc:call(X, ecall, connections, []),
            await_transport(X, B, Transport, Deadline)
    end.
