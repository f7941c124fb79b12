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
         nif_fallback_is_printed/1, link_down_is_printed/1,
         squatted_name_boots_then_moves_to_the_links/1]).
%% Run on the nodes.
-export([seq_collector/1, seq_sender/2]).

%% An upper bound on waiting for a line or a state, never a pause.
-define(WAIT, 30000).

suite() ->
    [{timetrap, {minutes, 3}}].

all() ->
    [not_distributed_is_printed, refused_configuration_is_printed, nif_fallback_is_printed,
     link_down_is_printed, squatted_name_boots_then_moves_to_the_links].

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

%% A bad value stops ecall's start with an error naming the key, and the
%% node prints it.
refused_configuration_is_printed(_Config) ->
    Lines = run_to_end(ecall_test_nodes:code_paths() ++ ["-ecall", "overflow", "bogus"],
                       "io:format(\"start: ~p~n\", [application:ensure_all_started(ecall)]), "
                       "init:stop()."),
    ?assert(has(Lines, "ecall: configuration refused")),
    ?assert(has(Lines, "{bad_config,overflow,bogus}")).

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
