%% Nodes for the suites and the benchmark: peers on OTP 25 started with
%% OTP's `peer', nodes from any `erl' (an OTP 27 one) that outlive the
%% process starting them, and what runs on those nodes for the tests
%% (collectors, echo, block, ...). Every node started here talks to the
%% epmd named by ERL_EPMD_PORT (test/scripts/with_epmd.sh), and halts when
%% this node goes away.
-module(ecall_test_nodes).

-include_lib("stdlib/include/assert.hrl").
-include("ecall_test.hrl").

-export([start_ecall/0, start_node/1, stop_node/1, start_b/1, stop_b/1,
         start_peer/0, start_peer/1, start_peer/2, node_args/0, code_paths/0, node_exec/0,
         node_exec/1,
         node_wrapper/0,
         many_callers_exactly_once/1, send_seq/2, send_payload_seq/3, flush_traces/0,
         connect_back/1, flush_links/1, sync_receivers/1]).
%% logger handler used by the suites.
-export([log/2]).
%% Polling for a condition nothing signals.
-export([await/2]).
%% A sender stepped one message at a time, and its collector (run on peers).
-export([step_sender/3, step/2, step_until_blocked/2, seq_log/2]).
-export([kill_transport_process/2]).
%% A node's watcher (ecall_large_SUITE, bench/run.sh big): run there.
-export([watcher_start/0, watched/1]).
-export_type([watched/0, long_schedule/0]).

%% long_schedule events: a process or port that ran this long (ms) or
%% more without a break.
-define(LONG_SCHEDULE_MS, 10).
%% One such event: how long, who (its registered name, else its initial
%% call, as M:F/A), and where it was switched in and out.
-type long_schedule() :: #{timeout_ms := non_neg_integer(), who := string(),
                           in := string(), out := string()}.
%% What a watcher saw: its 1 ms ticker's worst lateness, and the events.
-type watched() :: #{lateness_ms := float(), events := [long_schedule()]}.
%% Run on peers.
-export([drop_connection/1, collector/2, echo/1, echo_loop/0, ecall_echo_loop/0, fail/2, tell/2, whoami/0,
         block/1, error_on/1]).

%% ecall on this node (the suites' init_per_suite): distributed, with its
%% C-node identities registered.
start_ecall() ->
    ?assert(is_alive()),
    {ok, _} = application:ensure_all_started(ecall),
    ?assertMatch({ok, _}, ecall_cnode:cnode()),
    ok.

%% A suite's peer B: ecall on this node, a node B running ecall from this
%% `erl', connected; `b' (its name) and `b_node' (for stop_b/1) in Config.
start_b(Config) ->
    ok = start_ecall(),
    {Node, _} = NodeRef = start_node(os:find_executable("erl")),
    ok = ecall:connect(Node),
    [{b, Node}, {b_node, NodeRef} | Config].

%% Undoes start_b/1.
stop_b(Config) ->
    _ = ecall:disconnect(proplists:get_value(b, Config)),
    stop_node(proplists:get_value(b_node, Config)),
    ok = application:stop(ecall).

%% A node running ecall, started from the `erl' given, that outlives the
%% process that starts it (the group's cases run in other processes). OTP's
%% `peer' is not used here because an OTP 27 peer cannot be driven by OTP
%% 25's `peer' module. The node halts by itself if this node goes away.
start_node(Erl) ->
    Owner = self(),
    Ready = make_ref(),
    Keeper = spawn(fun() -> keep_node(Owner, Ready, Erl) end),
    receive
        {Ready, Node} -> {Node, Keeper};
        {Ready, failed, Why} -> erlang:error({node_start_failed, Why})
    after 60000 -> erlang:error(node_start_timeout)
    end.

keep_node(Owner, Ready, Erl) ->
    Name = peer:random_name(ecall_test),
    register(list_to_atom(Name), self()),
    Eval = lists:flatten(io_lib:format(
        "{ok, _} = application:ensure_all_started(ecall), "
        "erlang:monitor_node(~p, true), "
        "erlang:send({~p, ~p}, {up, node()}), "
        "receive {nodedown, _} -> erlang:halt() end.", [node(), list_to_atom(Name), node()])),
    {Exec, Pre} = node_exec(Erl),
    Port = open_port({spawn_executable, Exec},
                     [{args, Pre ++ ["-sname", Name, "-setcookie", atom_to_list(erlang:get_cookie()),
                                     "-noinput", "-eval", Eval | node_args()]},
                      exit_status, stderr_to_stdout, {line, 4096}]),
    keep_node(Owner, Ready, Port, undefined).

keep_node(Owner, Ready, Port, Node) ->
    receive
        {up, N} ->
            Owner ! {Ready, N},
            keep_node(Owner, Ready, Port, N);
        {Port, {data, {_, Line}}} ->
            ct:log("~p: ~ts", [Node, Line]),
            keep_node(Owner, Ready, Port, Node);
        {Port, {exit_status, S}} when Node =:= undefined ->
            Owner ! {Ready, failed, {exit_status, S}};
        {Port, {exit_status, _}} ->
            ok;
        {stop, From} ->
            erpc:cast(Node, erlang, halt, []),
            receive {Port, {exit_status, _}} -> From ! {stopped, self()} end
    end.

stop_node({_Node, Keeper}) ->
    Ref = monitor(process, Keeper),
    Keeper ! {stop, self()},
    receive {'DOWN', Ref, process, Keeper, _} -> ok end.

%% An OTP 25 peer running ecall, with ecall's and the tests' code on its
%% path (and the code of `Modules'), `Extra' added to its arguments,
%% linked to the calling process.
start_peer() ->
    start_peer([]).

start_peer(Extra) ->
    start_peer(Extra, []).

start_peer(Extra, Modules) ->
    Code = lists:append([["-pa", filename:dirname(code:which(M))] || M <- Modules]),
    Args = ["-setcookie", atom_to_list(erlang:get_cookie()) | node_args() ++ Code ++ Extra],
    {ok, Peer, Node} = peer:start_link(#{name => peer:random_name(ecall_test),
                                         exec => node_exec(),
                                         args => Args,
                                         wait_boot => 60000}),
    {ok, _} = erpc:call(Node, application, ensure_all_started, [ecall]),
    {Peer, Node}.

%% How the tests start a node (`peer''s `exec' option): through
%% test/scripts/node.sh, which writes down a node that dies of a crash
%% signal for test/scripts/with_epmd.sh to fail the run on (see there),
%% when a run records them (ECALL_NODE_CRASHES); else `erl' itself.
node_exec() ->
    node_exec(os:find_executable("erl")).

%% The same for another `erl' (an OTP 27 or 29 one), as {Executable, Args
%% before the node's own}.
node_exec(Erl) ->
    case os:getenv("ECALL_NODE_CRASHES") of
        false -> {Erl, []};
        _ -> {node_wrapper(), [Erl]}
    end.

%% test/scripts/node.sh, in scripts/ beside this module (rebar3 ct copies
%% test/ with its subfolders next to the beams; bench/run.sh copies
%% test/scripts/ to where it compiles this module).
node_wrapper() ->
    Wrapper = filename:join([filename:dirname(code:which(?MODULE)), "scripts", "node.sh"]),
    true = filelib:is_regular(Wrapper) orelse erlang:error({no_node_wrapper, Wrapper}),
    Wrapper.

%% Arguments of every node the tests start: ecall's and this module's code,
%% and this node's `links' setting when it has one. The suites run with two
%% links (test/ct.config), so that what spans links (shards on different
%% links, one link down while another carries on) is tested on this 2-core
%% machine too, where the default is one; the benchmark sets none, and its
%% nodes take the default.
node_args() ->
    Links = case application:get_env(ecall, links) of
                {ok, L} when is_integer(L) -> ["-ecall", "links", integer_to_list(L)];
                _ -> []
            end,
    code_paths() ++ Links.

%% ecall's and this module's code, alone.
code_paths() ->
    ["-pa", filename:dirname(code:which(ecall)),
     "-pa", filename:dirname(code:which(?MODULE))].

%% ?CALLERS callers, released together, each send ?PER_CALLER numbered
%% messages to one collector on B, which checks that every one arrived once
%% and in each caller's order. Returns how many were sent.
many_callers_exactly_once(B) ->
    Total = ?CALLERS * ?PER_CALLER,
    Collector = erpc:call(B, erlang, spawn, [?MODULE, collector, [self(), Total]]),
    Go = make_ref(),
    Callers = [spawn_link(fun() -> receive Go -> send_seq(Collector, ?PER_CALLER) end end)
               || _ <- lists:seq(1, ?CALLERS)],
    [C ! Go || C <- Callers],
    receive
        {collected, Collector, Result} ->
            ?assertEqual(#{total => Total, callers => ?CALLERS,
                           out_of_order => 0, last_seq_ok => ?CALLERS}, Result)
    after 120000 ->
        erlang:error({collector_timeout, erpc:call(B, erlang, process_info, [Collector, message_queue_len])})
    end,
    Total.

%% Returns once every link of this node to `Node' has written, and counted,
%% everything pushed before: a process on each link sends a marker that B
%% echoes by `!'. A link's writer counts a pass before it starts the next
%% one, and a lone write counts under the lock the next write takes, so
%% once a marker is back its link's counters hold everything before it.
%% (Reading them right after the data arrived raced the writer's counting:
%% 99,985 of 100,000 under load.) Returns how many markers it pushed.
flush_links(Node) ->
    {Mod, State, _} = ecall_route:peer(Node),
    Echo = erpc:call(Node, erlang, spawn, [?MODULE, echo_loop, []]),
    Links = lists:seq(0, ecall_config:links() - 1),
    flush_links(Mod, State, Echo, Links),
    exit(Echo, kill),
    length(Links).

flush_links(_Mod, _State, _Echo, []) ->
    ok;
flush_links(Mod, State, Echo, Wanted) ->
    Self = self(),
    %% A fresh process per try: its pid picks its shard, hence its link.
    Pid = spawn_link(fun() ->
                             K = Mod:caller_link(State),
                             case lists:member(K, Wanted) of
                                 true ->
                                     Ref = make_ref(),
                                     ecall:send(Echo, {echo, self(), Ref}),
                                     receive Ref -> ok end;
                                 false ->
                                     ok
                             end,
                             Self ! {flushed, self(), K}
                     end),
    receive {flushed, Pid, K} -> flush_links(Mod, State, Echo, Wanted -- [K]) end.

%% On the node that holds the connection from C-node identity `Id' (one
%% link of a peer): drops it, once this node has it. The link's side counts
%% a connection up at the handshake's last message, a moment before this
%% node's emulator lists it (and sends `nodeup'), and net_kernel's table
%% marks it up a moment after that: `erlang:disconnect_node/1' in between
%% finds nothing (`false'). So the connection's controller, which the
%% emulator knows from the start, gets the exit signal net_kernel's
%% disconnect would send it.
drop_connection(Id) ->
    ok = net_kernel:monitor_nodes(true, [{node_type, hidden}]),
    Known = lists:member(Id, nodes(hidden))
        orelse receive {nodeup, Id, _} -> true after 10000 -> false end,
    ok = net_kernel:monitor_nodes(false, [{node_type, hidden}]),
    true = Known orelse erlang:error({not_connected, Id}),
    {Id, Ctrlr} = lists:keyfind(Id, 1, erlang:system_info(dist_ctrl)),
    true = exit(Ctrlr, disconnect),
    ok.

%% A sender driven one message at a time (the suites' blocked-sender
%% cases): sends {seq, I, Payload} by ecall:send/2 each time it is told to,
%% and says so; `{report, To}' asks the collector for its log, behind them.
step_sender(Owner, Collector, Payload) ->
    receive
        {go, I} ->
            _ = ecall:send(Collector, {seq, I, Payload}),
            Owner ! {sent, self(), I},
            step_sender(Owner, Collector, Payload);
        {report, To} ->
            _ = ecall:send(Collector, {report, To}),
            step_sender(Owner, Collector, Payload)
    end.

%% Has the step sender send message I, and waits until it did.
step(Sender, I) ->
    Sender ! {go, I},
    receive {sent, Sender, I} -> ok after 30000 -> ct:fail({send_stuck, I}) end.

%% Makes the step sender send I, I + 1, ... until it waits for room (the
%% NIF answers `wait', seen by a call trace of ecall_nif:wait_room/3 with
%% return_trace); the message it waits with.
step_until_blocked(Sender, I) when I =< 1000 ->
    Sender ! {go, I},
    receive
        {sent, Sender, I} -> step_until_blocked(Sender, I + 1);
        {trace, Sender, return_from, {ecall_nif, wait_room, 3}, wait} -> I
    after 30000 -> ct:fail({neither_sent_nor_waiting, I})
    end.

%% On the peer: the numbers of the {seq, I, _} messages, in the order they
%% came, sent back when asked (`report': and it ends; `peek': it goes on).
seq_log(Owner, Acc) ->
    receive
        {seq, I, _} -> seq_log(Owner, [I | Acc]);
        {report, To} -> To ! {seq_log, self(), lists:reverse(Acc)};
        {peek, To, Ref} -> To ! {Ref, lists:reverse(Acc)}, seq_log(Owner, Acc)
    end.

%% On the peer: echoes markers.
echo_loop() ->
    receive {echo, From, Ref} -> From ! Ref, echo_loop() end.

%% echo_loop/0 answering through ecall:send/2; `stop' ends it.
ecall_echo_loop() ->
    receive
        {echo, From, Ref} -> ecall:send(From, Ref), ecall_echo_loop();
        stop -> ok
    end.

%% Returns once every receiver worker on `Node' has counted the batches it
%% has begun: a system message is handled between batches.
sync_receivers(Node) ->
    Names = erpc:call(Node, ecall_receiver_sup, names, []),
    [_ = erpc:call(Node, sys, get_state, [binary_to_atom(N)]) || N <- Names],
    ok.

send_seq(To, N) ->
    Self = self(),
    %% send/2 returns the message, like `!'.
    [{seq, Self, I} = ecall:send(To, {seq, Self, I}) || I <- lists:seq(1, N)],
    ok.

%% On the peer: counts messages per caller and checks that each caller's
%% sequence numbers arrive as 1, 2, 3, ...
collector(Owner, Total) ->
    collect(Owner, Total, #{}, 0, 0).

collect(Owner, Total, Last, Total, Bad) ->
    Ok = length([S || S <- maps:values(Last), S =:= ?PER_CALLER]),
    Owner ! {collected, self(), #{total => Total, callers => map_size(Last),
                                  out_of_order => Bad, last_seq_ok => Ok}};
collect(Owner, Total, Last, N, Bad) ->
    receive
        {seq, From, Seq} ->
            Bad1 = seq_check(Last, From, Seq, Bad),
            collect(Owner, Total, Last#{From => Seq}, N + 1, Bad1);
        {seq, From, Seq, _Payload} ->
            Bad1 = seq_check(Last, From, Seq, Bad),
            collect(Owner, Total, Last#{From => Seq}, N + 1, Bad1)
    end.

seq_check(Last, From, Seq, Bad) ->
    case maps:get(From, Last, 0) of
        Prev when Seq =:= Prev + 1 -> Bad;
        _ -> Bad + 1
    end.

send_payload_seq(To, Payload, N) ->
    Self = self(),
    [{seq, Self, I, Payload} = ecall:send(To, {seq, Self, I, Payload}) || I <- lists:seq(1, N)],
    ok.

flush_traces() ->
    receive
        {trace, _, _, _} -> flush_traces();
        {trace_ts, _, _, _, _} -> flush_traces()
    after 0 -> ok
    end.

%% B answers back through its own links.
connect_back(B) ->
    ok = erpc:call(B, ecall, connect, [node()]).

%% logger handler: forwards the Rust side's events to the test process.
log(#{level := Level, msg := {"~ts", [Text]}, meta := #{rust_target := _}},
    #{config := #{pid := Pid}}) ->
    Pid ! {rust_log, Level, iolist_to_binary(Text)};
log(_Event, _Config) ->
    ok.

echo(X) -> X.

fail(error, R) -> erlang:error(R);
fail(exit, R) -> exit(R);
fail(throw, V) -> throw(V).

tell(Pid, Msg) -> Pid ! Msg.

whoami() -> node().

error_on(Node) when Node =:= node() -> {error, no};
error_on(_) -> node().

%% Tells the caller it runs, then waits for `go'.
block(Pid) ->
    Pid ! {blocked, self(), node()},
    receive go -> late end.

%% Kills the process linked to the connection to `Node' whose initial call
%% (proc_lib) satisfies `Is', and returns once the connection process has
%% exited; its exit reason.
kill_transport_process(Node, Is) ->
    Conn = whereis(ecall_conn:name(Node)),
    {links, Linked} = process_info(Conn, links),
    [Victim | _] = [P || P <- Linked, is_pid(P), Is(proc_lib:translate_initial_call(P))],
    Ref = monitor(process, Conn),
    exit(Victim, kill),
    receive
        {'DOWN', Ref, process, Conn, Why} -> Why
    after 5000 -> error(connection_kept_a_dead_transport_process)
    end.

%%--------------------------------------------------------------------
%% A node's watcher: a 1 ms ticker and a system monitor of long
%% schedules, from watcher_start/0 (run on the node watched) to
%% watched/1.

%% Stops `Watcher': what it saw.
-spec watched(pid()) -> watched().
watched(Watcher) ->
    Watcher ! {stop, self()},
    receive {watched, Watcher, Seen} -> Seen after 60000 -> error(watcher_lost) end.

%% On the node watched: a watcher, there once this returns.
-spec watcher_start() -> pid().
watcher_start() ->
    Self = self(),
    Pid = spawn(fun() -> watcher(Self) end),
    receive {watching, Pid} -> Pid end.

%% The node's system monitor (the one before it comes back when it stops)
%% and the owner of its ticker. Long schedules of the watcher itself are
%% not reported, so it does nothing else.
-spec watcher(pid()) -> ok.
watcher(Starter) ->
    Previous = erlang:system_monitor(self(), [{long_schedule, ?LONG_SCHEDULE_MS}]),
    Ticker = spawn_link(fun() -> ticker(erlang:monotonic_time(millisecond) + 1, 0) end),
    Starter ! {watching, self()},
    watcher_loop(Previous, Ticker, []).

-spec watcher_loop(undefined | {pid(), list()}, pid(), [long_schedule()]) -> ok.
watcher_loop(Previous, Ticker, Events) ->
    receive
        {monitor, Who, long_schedule, Info} ->
            watcher_loop(Previous, Ticker, [long_schedule(Who, Info) | Events]);
        {stop, From} ->
            _ = erlang:system_monitor(Previous),
            Ticker ! {stop, self()},
            Late = receive {ticked, Ticker, L} -> L end,
            From ! {watched, self(), #{lateness_ms => Late / 1000,
                                       events => lists:reverse(last_events(Events))}},
            ok
    end.

%% The events already sent when the monitor was switched off.
-spec last_events([long_schedule()]) -> [long_schedule()].
last_events(Events) ->
    receive
        {monitor, Who, long_schedule, Info} -> last_events([long_schedule(Who, Info) | Events])
    after 0 ->
            Events
    end.

%% Wakes at each millisecond (an absolute timer), keeping its worst
%% lateness in µs: wake-up minus the planned time. After a late wake-up
%% the next tick is planned from now, not from the ticks missed.
-spec ticker(integer(), non_neg_integer()) -> ok.
ticker(Planned, Worst) ->
    _ = erlang:send_after(Planned, self(), tick, [{abs, true}]),
    receive
        tick ->
            Now = erlang:monotonic_time(microsecond),
            ticker(max(Planned + 1, erlang:monotonic_time(millisecond) + 1),
                   max(Worst, Now - Planned * 1000));
        {stop, From} ->
            From ! {ticked, self(), Worst},
            ok
    end.

%% One long_schedule event, with the process named now (while it may
%% still be there): its registered name, else its initial call.
-spec long_schedule(pid() | port(), [{atom(), term()}]) -> long_schedule().
long_schedule(Who, Info) ->
    #{timeout_ms => proplists:get_value(timeout, Info, 0), who => who(Who),
      in => location(proplists:get_value(in, Info)),
      out => location(proplists:get_value(out, Info))}.

-spec who(pid() | port()) -> string().
who(Port) when is_port(Port) ->
    case erlang:port_info(Port, name) of
        {name, Name} -> "port " ++ Name;
        undefined -> "port " ++ erlang:port_to_list(Port)
    end;
who(Pid) ->
    case process_info(Pid, [registered_name, initial_call]) of
        undefined ->
            pid_to_list(Pid) ++ " (gone)";
        [{registered_name, Name}, _] when is_atom(Name) ->
            atom_to_list(Name);
        [_, {initial_call, {proc_lib, init_p, 5}}] ->
            case process_info(Pid, dictionary) of
                {dictionary, Dict} -> location(proplists:get_value('$initial_call', Dict));
                undefined -> pid_to_list(Pid) ++ " (gone)"
            end;
        [_, {initial_call, MFA}] ->
            location(MFA)
    end.

%% M:F/A (no commas: it goes into the CSV as it is).
-spec location(term()) -> string().
location({M, F, A}) when is_integer(A) ->
    lists:flatten(io_lib:format("~s:~s/~b", [M, F, A]));
location(undefined) ->
    "-";
location(Other) ->
    [C || C <- lists:flatten(io_lib:format("~w", [Other])), C =/= $,].

%% Waits for `Fun' to hold, up to 30 s, and fails with `{timeout, What}'
%% then: for counts and states that nothing signals (polled every 20 ms).
-spec await(term(), fun(() -> boolean())) -> ok.
await(What, Fun) ->
    await(What, Fun, erlang:monotonic_time(millisecond) + 30000).

await(What, Fun, Deadline) ->
    case Fun() of
        true ->
            ok;
        false ->
            erlang:monotonic_time(millisecond) < Deadline orelse ct:fail({timeout, What}),
            receive after 20 -> await(What, Fun, Deadline) end
    end.
