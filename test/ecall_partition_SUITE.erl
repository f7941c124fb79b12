%% A network partition between two real nodes, each in a network namespace
%% of its own, joined by a veth pair; the suite creates both namespaces,
%% the pair, an epmd in each and the nodes (`-name' on 169.254.77.1 and .2,
%% link-local addresses that exist only inside those namespaces), and
%% removes them all at the end. Root only (ip netns), as CI runs.
%%
%% The cut is `ip link set ... down' on B's side of the pair: A's packets
%% vanish, as in a real partition. Node A runs the scenario (partition_a/0)
%% and reads the suite's commands on its standard input; the suite, in the
%% root namespace, reaches the nodes only through their stdio.
%%
%% Settings on A: stall_timeout 3 s, a 2 MiB byte budget under `block',
%% net_ticktime 20 s (so that nodedown comes after the cuts end).
-module(ecall_partition_SUITE).

-include_lib("common_test/include/ct.hrl").
-include_lib("stdlib/include/assert.hrl").

-export([all/0, suite/0, init_per_suite/1, end_per_suite/1]).
-export([short_and_long_cuts_lose_nothing/1]).
%% Run on node A / B.
-export([partition_a/0, partition_b/0, sink/1]).

-define(A_ADDR, "169.254.77.1").
-define(B_ADDR, "169.254.77.2").
-define(STALL_MS, 3000).
%% Bytes of each sender's message (node A).
-define(PAYLOAD, 2000).

suite() ->
    [{timetrap, {minutes, 4}}].

all() ->
    [short_and_long_cuts_lose_nothing].

init_per_suite(Config) ->
    %% Not a skip: CI runs as root, and a skipped case counts as a failure.
    ?assertEqual("0", string:trim(os:cmd("id -u"))),
    Ip = os:find_executable("ip"),
    ?assertNotEqual(false, Ip),
    Id = os:getpid(),
    NsA = "ecall_pa_" ++ Id, NsB = "ecall_pb_" ++ Id,
    VA = "eca" ++ Id, VB = "ecb" ++ Id,
    Net = #{ip => Ip, ns_a => NsA, ns_b => NsB, veth_a => VA, veth_b => VB},
    %% What a failed step made is removed before the failure goes on.
    try [ok = ip(Ip, Args) || Args <- [["netns", "add", NsA], ["netns", "add", NsB],
                                   ["link", "add", VA, "type", "veth", "peer", "name", VB],
                                   ["link", "set", VA, "netns", NsA],
                                   ["link", "set", VB, "netns", NsB],
                                   ["-n", NsA, "addr", "add", ?A_ADDR ++ "/24", "dev", VA],
                                   ["-n", NsB, "addr", "add", ?B_ADDR ++ "/24", "dev", VB],
                                   ["-n", NsA, "link", "set", "lo", "up"],
                                   ["-n", NsB, "link", "set", "lo", "up"],
                                   ["-n", NsA, "link", "set", VA, "up"],
                                   ["-n", NsB, "link", "set", VB, "up"]]]
    catch
        Class:Reason:Stack ->
            _ = remove_namespaces(Net),
            erlang:raise(Class, Reason, Stack)
    end,
    [{net, Net} | Config].

end_per_suite(Config) ->
    ?assertEqual([ok, ok], remove_namespaces(?config(net, Config))).

%% Deleting a namespace deletes its end of the pair, and so the pair. Both
%% are tried, whatever the first answers.
remove_namespaces(#{ip := Ip, ns_a := NsA, ns_b := NsB}) ->
    [ip(Ip, ["netns", "del", Ns]) || Ns <- [NsA, NsB]].

ip(Ip, Args) ->
    Port = open_port({spawn_executable, Ip}, [{args, Args}, exit_status, stderr_to_stdout]),
    collect_exit(Port, []).

collect_exit(Port, Out) ->
    receive
        {Port, {data, D}} -> collect_exit(Port, [Out, D]);
        {Port, {exit_status, 0}} -> ok;
        {Port, {exit_status, S}} -> {error, S, lists:flatten(Out)}
    end.

%%--------------------------------------------------------------------

%% A short cut (1 s, under the stall timeout): senders block on the budget,
%% memory stays within it, and once the link is back every message arrives,
%% in order, and every call returns its value. A long cut (6 s, twice the
%% stall timeout): the links are reaped (nothing acknowledged within the
%% stall timeout), memory stays within the budget, and once the network is
%% back the links reconnect and write again what the peer had not
%% acknowledged: every message arrives once, in order, and every call
%% returns its value, as after the short cut.
short_and_long_cuts_lose_nothing(Config) ->
    Net = ?config(net, Config),
    %% Each thing started is stopped, also when a later start fails.
    EpmdA = ns_cmd(Net, ns_a, "epmd", ["-port", "4369"]),
    try
        EpmdB = ns_cmd(Net, ns_b, "epmd", ["-port", "4369"]),
        try
            [ok = epmd_ready(Net, Ns, 100) || Ns <- [ns_a, ns_b]],
            B = start_node(Net, ns_b, "b", ?B_ADDR, "partition_b"),
            try
                A = start_node(Net, ns_a, "a", ?A_ADDR, "partition_a"),
                try
                    cuts(Net, A, B)
                after
                    stop_node(A)
                end
            after
                stop_node(B)
            end
        after
            stop_port(EpmdB)
        end
    after
        stop_port(EpmdA)
    end.

cuts(Net, A, B) ->
    expect(B, "ready"),
    expect(A, "loaded"),
    %% The short cut.
    cut(Net, "down"),
    tell(A, "cut"),
    timer:sleep(1000), % the subject: how long the partition lasts
    cut(Net, "up"),
    tell(A, "restored"),
    Short = result(A),
    ct:pal("short cut: ~p", [Short]),
    #{lost := 0, out_of_order := 0, call_errors := 0, max_queued := Q1, unconfirmed := 0,
      budget := Budget, sent := S1, received := R1} = Short,
    ?assertEqual(S1, R1),
    %% Never past the budget: callers let in from a full budget have
    %% their room set aside before they run (max_queued counts it).
    ?assert(Q1 =< Budget),
    %% The long cut.
    cut(Net, "down"),
    tell(A, "cut"),
    timer:sleep(2 * ?STALL_MS), % the subject again
    cut(Net, "up"),
    tell(A, "restored"),
    Long = result(A),
    ct:pal("long cut: ~p", [Long]),
    #{out_of_order := 0, max_queued := Q2, lost := 0, call_errors := 0, stalls := Stalls,
      links_up := Up, links := Links, sent := S2, received := R2, counted_drops := 0,
      unconfirmed := 0} = Long,
    ?assertEqual(S2, R2),
    ?assert(Q2 =< Budget),
    ?assert(Stalls >= 1),
    ?assertEqual(Links, Up).

%% epmd answers a names request (a few ms after it starts).
epmd_ready(_Net, _Key, 0) ->
    {error, epmd_not_ready};
epmd_ready(#{ip := Ip} = Net, Key, N) ->
    case ip(Ip, ["netns", "exec", maps:get(Key, Net), "epmd", "-port", "4369", "-names"]) of
        ok -> ok;
        _ -> timer:sleep(50), epmd_ready(Net, Key, N - 1)
    end.

cut(#{ip := Ip, ns_b := NsB, veth_b := VB}, UpDown) ->
    ok = ip(Ip, ["-n", NsB, "link", "set", VB, UpDown]).

%% A command in a namespace, as a port: `ip netns exec' replaces itself
%% with the command, so the port's OS pid is the command's.
ns_cmd(#{ip := Ip} = Net, Key, Cmd, Args) ->
    Ns = maps:get(Key, Net),
    open_port({spawn_executable, Ip},
              [{args, ["netns", "exec", Ns, Cmd | Args]}, exit_status, stderr_to_stdout,
               {line, 4096}]).

start_node(Net, Key, Name, Addr, Main) ->
    %% -start_epmd false: the suite's epmd, never one of the node's own
    %% that would outlive the test.
    Args = ["-name", Name ++ "@" ++ Addr, "-setcookie", "ecall_partition", "-noshell",
            "-start_epmd", "false",
            "-kernel", "net_ticktime", "20",
            "-ecall", "stall_timeout", integer_to_list(?STALL_MS),
            "-ecall", "max_queue_bytes", "2097152",
            "-ecall", "discovery", "false",
            "-ecall", "backoff_max", "500"
            %% The code, and the suites' two links (test/ct.config): the
            %% cut stalls and reaps both.
            | ecall_test_nodes:node_args()] ++ ["-s", ?MODULE_STRING, Main],
    %% Through test/scripts/node.sh when the run records crashes: a node
    %% that dies of a crash signal, here where links are cut and reaped,
    %% fails the run.
    {Exec, Pre} = ecall_test_nodes:node_exec(),
    #{ip := Ip} = Net,
    open_port({spawn_executable, Ip},
              [{args, ["netns", "exec", maps:get(Key, Net), Exec | Pre ++ Args]},
               {env, [{"ERL_EPMD_PORT", "4369"}]},
               exit_status, use_stdio, stderr_to_stdout, {line, 65536}]).

tell(Port, Line) ->
    true = port_command(Port, [Line, $\n]).

%% Waits for `Want' on the node's output (logging every line).
expect(Port, Want) ->
    receive
        {Port, {data, {eol, Want}}} -> ok;
        {Port, {data, {_, Line}}} -> ct:log("~ts", [Line]), expect(Port, Want);
        {Port, {exit_status, S}} -> ct:fail({node_exited, S, waiting_for, Want})
    after 60000 -> ct:fail({timeout_waiting_for, Want})
    end.

%% The next `result <term>.' line of node A.
result(Port) ->
    receive
        {Port, {data, {eol, "result " ++ Term}}} ->
            {ok, Tokens, _} = erl_scan:string(Term),
            {ok, Value} = erl_parse:parse_term(Tokens),
            Value;
        {Port, {data, {_, Line}}} -> ct:log("~ts", [Line]), result(Port);
        {Port, {exit_status, S}} -> ct:fail({node_exited, S})
    after 60000 -> ct:fail(no_result)
    end.

%% Asks the node to halt and waits for it: it must end with status 0 (a
%% crash signal gives 128 + the signal, through test/scripts/node.sh as
%% without it). One that does not end within 30 s is killed, with what it runs.
stop_node(Port) ->
    case catch tell(Port, "stop") of
        true -> await_exit(Port);
        _ -> stop_port(Port)
    end.

await_exit(Port) ->
    receive
        {Port, {exit_status, S}} -> ?assertEqual({node_exit_status, 0}, {node_exit_status, S});
        {Port, {data, {_, Line}}} -> ct:log("~ts", [Line]), await_exit(Port)
    after 30000 ->
        {os_pid, OsPid} = erlang:port_info(Port, os_pid),
        P = integer_to_list(OsPid),
        _ = os:cmd("kill -9 $(ps -o pid= --ppid " ++ P ++ ") " ++ P),
        catch port_close(Port),
        ct:fail({node_did_not_stop, OsPid})
    end.

stop_port(Port) ->
    case erlang:port_info(Port, os_pid) of
        {os_pid, OsPid} ->
            catch port_close(Port),
            os:cmd("kill " ++ integer_to_list(OsPid));
        undefined ->
            ok
    end.

%%--------------------------------------------------------------------
%% Node B: ecall, then waits for its input to close.

partition_b() ->
    {ok, _} = application:ensure_all_started(ecall),
    io:format("ready~n"),
    wait_eof().

wait_eof() ->
    case io:get_line("") of
        "stop\n" -> erlang:halt();
        eof -> erlang:halt();
        {error, _} -> erlang:halt();
        _ -> wait_eof()
    end.

%% On B: per sender, the last number; counts numbers out of order. A
%% report for round R is sent once R's marks have come from `N' senders
%% (each sends its mark after its numbers, through the same path: per-
%% caller order makes the mark come after them).
sink(Owner) ->
    sink(Owner, #{last => #{}, n => 0, bad => 0, marks => #{}, waiting => []}).

sink(Owner, #{last := Last, n := N, bad := Bad, marks := Marks} = St) ->
    receive
        {seq, From, Seq, _Payload} ->
            Bad1 = case maps:get(From, Last, 0) of
                       Prev when Seq > Prev -> Bad;
                       _ -> Bad + 1
                   end,
            sink(Owner, St#{last := Last#{From => Seq}, n := N + 1, bad := Bad1});
        {mark, _From, Round} ->
            reply_ready(Owner, St#{marks := Marks#{Round => maps:get(Round, Marks, 0) + 1}});
        {report, Ref, From, Round, Senders} ->
            reply_ready(Owner, St#{waiting := [{Ref, From, Round, Senders}
                                               | maps:get(waiting, St)]})
    end.

reply_ready(Owner, #{waiting := W, marks := Marks, n := N, bad := Bad} = St) ->
    {Ready, Waiting} = lists:partition(fun({_, _, R, S}) -> maps:get(R, Marks, 0) >= S end, W),
    [From ! {Ref, N, Bad} || {Ref, From, _, _} <- Ready],
    sink(Owner, St#{waiting := Waiting}).

%%--------------------------------------------------------------------
%% Node A: connects, runs senders and callers, and for each cut the suite
%% announces ("cut" ... "restored") prints one `result' line.

-define(SENDERS, 20).
-define(CALLERS, 10).

partition_a() ->
    try run_a()
    catch C:R:St -> io:format("result ~p.~n", [{crashed, C, R, St}])
    end,
    wait_eof().

run_a() ->
    {ok, _} = application:ensure_all_started(ecall),
    B = list_to_atom("b@" ++ ?B_ADDR),
    ok = wait_connect(B, 100),
    Sink = erpc:call(B, erlang, spawn, [?MODULE, sink, [self()]]),
    Self = self(),
    Payload = binary:copy(<<"p">>, ?PAYLOAD),
    Senders = [spawn_link(fun() -> sender(Sink, Payload, 1) end) || _ <- lists:seq(1, ?SENDERS)],
    Callers = [spawn_link(fun() -> caller(Self, B) end) || _ <- lists:seq(1, ?CALLERS)],
    io:format("loaded~n"),
    [cut_round(B, Sink, Senders, Callers, Round) || Round <- [1, 2]],
    ok.

%% One cut: samples the queue until "restored", then waits for the links
%% and for the traffic to settle, and reports.
cut_round(B, Sink, Senders, Callers, Round) ->
    "cut\n" = io:get_line(""),
    {ok, S0} = ecall:stats(B),
    #{closed_drops := C0} = ecall:stats(),
    T0 = erlang:monotonic_time(millisecond),
    Sampler = spawn_link(fun() -> sample(B, 0, 0) end),
    "restored\n" = io:get_line(""),
    Restored = erlang:monotonic_time(millisecond) - T0,
    %% Stop the senders: each sends its mark after its numbers and says
    %% how many it sent in all. The sink reports once every mark is in, so
    %% once everything sent before them has arrived (or was dropped).
    Sent = lists:sum([begin S ! {pause, self(), Round}, receive {paused, S, N} -> N end end
                      || S <- Senders]),
    Ref = make_ref(),
    Sink ! {report, Ref, self(), Round, length(Senders)},
    {Received, Bad} = receive {Ref, Got, OutOfOrder} -> {Got, OutOfOrder} end,
    Sampler ! {stop, self()},
    {MaxQ, MaxKernel} = receive {sampled, Q, K} -> {Q, K} end,
    {ok, #{links := Links}} = ecall:stats(B),
    {ok, S1} = ecall:stats(B),
    #{closed_drops := C1} = ecall:stats(),
    Errors = lists:append([begin C ! {errors, self(), T0}, receive {errors, C, E} -> E end end
                           || C <- Callers]),
    First = case [Ms || {Ms, _} <- Errors] of [] -> none; L -> lists:min(L) - T0 end,
    Result = #{sent => Sent, received => Received, lost => Sent - Received,
               out_of_order => Bad, max_queued => MaxQ, kernel_queued => MaxKernel,
               budget => ecall_config:get(max_queue_bytes),
               counted_drops => maps:get(dropped, S1) - maps:get(dropped, S0) + C1 - C0
                                + maps:get(closed_drops, S1) - maps:get(closed_drops, S0),
               stalls => maps:get(stalls, S1) - maps:get(stalls, S0),
               unconfirmed => maps:get(unconfirmed, S1) - maps:get(unconfirmed, S0),
               call_errors => length(Errors), first_call_error_ms => First,
               restored_ms => Restored,
               call_error_reasons => lists:usort([R || {_, R} <- Errors]),
               links => Links, links_up => maps:get(links_up, S1)},
    io:format("result ~0p.~n", [Result]),
    [S ! resume || S <- Senders],
    ok.

sender(Sink, Payload, I) ->
    receive
        {pause, From, Round} ->
            ecall:send(Sink, {mark, self(), Round}),
            From ! {paused, self(), I - 1},
            receive resume -> sender(Sink, Payload, I) end
    after 0 ->
        %% Some bulk, so that the budget fills during a cut.
        ecall:send(Sink, {seq, self(), I, Payload}),
        timer:sleep(1),
        sender(Sink, Payload, I + 1)
    end.

%% Calls in a loop; keeps its errors with the time they came, and gives
%% those since a time when asked (a caller that was blocked in a call
%% answers late; the time says which round an error belongs to).
caller(Owner, B) ->
    caller(Owner, B, []).

caller(Owner, B, Errors) ->
    receive
        {errors, From, Since} ->
            From ! {errors, self(), [E || {T, _} = E <- Errors, T >= Since]},
            caller(Owner, B, Errors)
    after 0 ->
        case ecall:call(B, erlang, node, [], 30000) of
            {ok, _} ->
                caller(Owner, B, Errors);
            {error, R} ->
                caller(Owner, B, [{erlang:monotonic_time(millisecond), R} | Errors])
        end
    end.

%% The most queued for B in ecall's budget, and in this node's kernel: the
%% Send-Q (written, not acknowledged) of every TCP socket to B, by `ss'.
sample(B, Max, MaxKernel) ->
    Q = case ecall:stats(B) of
            {ok, #{queued_bytes := Bytes}} -> Bytes;
            _ -> 0
        end,
    K = lists:sum([list_to_integer(SendQ)
                   || Line <- string:lexemes(os:cmd("ss -Htn dst " ?B_ADDR), "\n"),
                      [_State, _RecvQ, SendQ | _] <- [string:lexemes(Line, " ")]]),
    receive
        {stop, From} -> From ! {sampled, max(Max, Q), max(MaxKernel, K)}
    after 20 ->
        sample(B, max(Max, Q), max(MaxKernel, K))
    end.

%% The first connect can come before B's ecall has started.
wait_connect(B, 0) -> {error, {cannot_connect, B}};
wait_connect(B, N) ->
    case ecall:connect(B) of
        ok -> ok;
        _ -> timer:sleep(100), wait_connect(B, N - 1)
    end.
