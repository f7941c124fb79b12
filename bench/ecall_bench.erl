%% Two-node benchmark of ecall:send/2 against `!', in one run.
%%
%% The article's workload: N writer processes on this node (A), one
%% receiver per writer on node B; each writer sends K messages of the
%% nested-map payload (three sub-maps of ten atom fields), sleeping P ms
%% between them, so the intended rate is N * 1000 / P messages per second.
%% A point ends when every receiver has counted all K of its messages:
%% nothing may be lost, a slow point is only a long one.
%%
%% Variants, measured side by side in the same run:
%%   native  `Pid ! Msg' to B
%%   ecall   `ecall:send(Pid, Msg)' to B (NIF, Rust shards, C-node links)
%%   local   the same operations with receivers on A itself, no network:
%%           the harness's own floor (`!'; a cast spawns a process on A; a
%%           call is erpc:call/4 to A itself: spawn, monitor and result
%%           message, the emulator's share of any call)
%%
%% Per point: achieved rate, elapsed (mean of the receivers' first-to-last
%% spans, as the article defines it), wall time, CPU seconds of both OS
%% processes and CPU microseconds per message, peak erlang:memory(total) on
%% A, maximum run queue on A, ecall's batches and average batch size, and
%% messages lost.
%%
%% Started by bench/run.sh, which starts A; A starts B with `peer'.
-module(ecall_bench).

-export([echo/1, main/1, receiver/3, aggregator/3, big_sink/2, tick_sink/0, deliver/2,
         wire_out/1]).
%% The cluster mode, run on its nodes.
-export([node_facts/0, cluster_sink/0, cluster_load/5]).
%% Shared with the big and fanout modes (ecall_bench_big, ecall_bench_fanout).
-export([start_b/0, chosen/1, settle/1, ready/2, vm_rss/0, write_csv/3]).

-define(NODE_ARGS, ["+sbwt", "none", "+sbwtdcpu", "none", "+sbwtdio", "none",
                    "+P", "4000000"]).

-spec main([string()]) -> no_return().
main(Args) ->
    Result = try run(Args) of
                 ok -> 0
             catch
                 Class:Reason:Stack ->
                     io:format("bench failed: ~p:~p~n~p~n", [Class, Reason, Stack]),
                     1
             end,
    erlang:halt(Result).

-define(VARIANTS, [native, ecall_erlang, ecall_nif, local]).
-define(OPS, [send, cast, call]).

run(["demo"]) ->
    %% The README's main job, and the quick profile: every operation and
    %% variant side by side at two loads, in a few minutes.
    matrix([2000, 10000], 20, 50, ?OPS, ?VARIANTS, "quick");
run(["quick"]) ->
    run(["demo"]);
run(["full"]) ->
    %% The article's sweep, for machines that can hold it.
    matrix(lists:seq(10000, 150000, 10000), 1000, 100, ?OPS, ?VARIANTS, "full");
run(["paced" | Rest]) ->
    [N, K, P] = case Rest of
                    [] -> [20000, 100, 50];
                    _ -> [list_to_integer(X) || X <- Rest]
                end,
    matrix([N], K, P, [send], ?VARIANTS, "paced");
run(["sweep", Ns, K, P]) ->
    matrix([list_to_integer(X) || X <- string:split(Ns, ",", all)],
           list_to_integer(K), list_to_integer(P), chosen_ops(), ?VARIANTS, "sweep");
run(["micro"]) ->
    micro();
run(["large"]) ->
    large();
run(["big"]) ->
    ecall_bench_big:big();
run(["fanout"]) ->
    ecall_bench_fanout:fanout();
run(["profile" | Rest]) ->
    {N, Op} = case Rest of
                  [] -> {20000, send};
                  [N0] -> {list_to_integer(N0), send};
                  [N0, Op0] -> {list_to_integer(N0), list_to_existing_atom(Op0)}
              end,
    profile(N, Op);
run(["cluster" | Rest]) ->
    [Nodes, W] = case Rest of
                     [] -> [8, 500];
                     [A] -> [list_to_integer(A), 500];
                     [A, B] -> [list_to_integer(A), list_to_integer(B)]
                 end,
    cluster(Nodes, W);
run(["hops"]) ->
    hops();
run(["rest" | Rest]) ->
    rest(case Rest of [] -> 8; [N] -> list_to_integer(N) end);
run(["tls" | Rest]) ->
    %% bench/run.sh started both nodes on TLS distribution: native over
    %% it, the pure-Erlang transport over it, and the C-node links over
    %% their own TLS connections.
    N = case Rest of [] -> 10000; [N0] -> list_to_integer(N0) end,
    matrix([N], 100, 50, chosen_ops(), [native, ecall_erlang, ecall_nif], "tls");
run(["latency" | Rest]) ->
    latency(case Rest of [] -> 10000; [N] -> list_to_integer(N) end);
run(["pingpong" | Rest]) ->
    N = case Rest of [] -> 2000; [X] -> list_to_integer(X) end,
    pingpong(N);
run(["soak", Minutes]) ->
    soak(list_to_integer(Minutes));
run(Other) ->
    erlang:error({usage, "demo | quick | full | paced [N K P] | tls [N] | hops | sweep N1,N2,.. K P | micro | large | big | fanout | latency [N] | profile [N [send|cast|call]] | cluster [NODES [WRITERS]] | rest [PEERS] | soak MINUTES", Other}).

%%--------------------------------------------------------------------
%% Soak: 5,000 writers at 20 msg/s each through ecall for MINUTES; every
%% 10 s a line with what was written and replayed, the resident memory of
%% both OS processes, and what ecall holds queued. Ends by checking that
%% the peer replayed every request written.

soak(Minutes) ->
    {Peer, B} = start_b(),
    ok = ecall:connect(B),
    N = 5000,
    Receivers = erpc:call(B, lists, map,
                          [fun(_) -> spawn(fun Loop() -> receive _ -> Loop() end end) end,
                           lists:seq(1, N)], 60000),
    Payload = payload(),
    End = erlang:monotonic_time(millisecond) + Minutes * 60000,
    Writers = [spawn(fun() -> soak_write(R, Payload, End) end) || R <- Receivers],
    BPid = erpc:call(B, os, getpid, []),
    io:format("soak: ~b writers x 20 msg/s for ~b min; A=~p B=~p~n", [N, Minutes, node(), B]),
    io:format("~6s ~12s ~12s ~8s ~8s ~12s~n", ["s", "written", "replayed", "A MB", "B MB", "queued B"]),
    soak_report(B, BPid, End, erlang:monotonic_time(millisecond)),
    [begin Ref = monitor(process, W), receive {'DOWN', Ref, _, _, _} -> ok end end || W <- Writers],
    %% Every request written is replayed: wait for the counts to meet.
    Final = soak_settle(B, 100),
    io:format("final: ~p~n", [Final]),
    peer:stop(Peer),
    ok.

soak_write(To, Payload, End) ->
    case erlang:monotonic_time(millisecond) < End of
        true -> ecall:send(To, Payload), timer:sleep(50), soak_write(To, Payload, End);
        false -> ok
    end.

soak_report(B, BPid, End, T0) ->
    Now = erlang:monotonic_time(millisecond),
    case Now < End of
        true ->
            {ok, S} = ecall:stats(B),
            #{receivers := R} = erpc:call(B, ecall, stats, []),
            io:format("~6b ~12b ~12b ~8b ~8b ~12b~n",
                      [(Now - T0) div 1000, maps:get(requests, S), maps:get(requests, R),
                       rss_mb(os:getpid()), rss_mb(BPid), maps:get(queued_bytes, S)]),
            receive after 10000 -> ok end,
            soak_report(B, BPid, End, T0);
        false ->
            ok
    end.

soak_settle(B, Tries) ->
    {ok, #{requests := W, dropped := D}} = ecall:stats(B),
    #{receivers := #{requests := R}} = erpc:call(B, ecall, stats, []),
    case W =:= R orelse Tries =:= 0 of
        true -> #{written => W, replayed => R, dropped => D, lost => W - R};
        false -> receive after 100 -> soak_settle(B, Tries - 1) end
    end.

rss_mb(OsPid) ->
    {ok, Bin} = file:read_file("/proc/" ++ OsPid ++ "/statm"),
    [_, Rss | _] = string:lexemes(Bin, " "),
    binary_to_integer(Rss) * 4096 div 1048576.

%%--------------------------------------------------------------------
%% Large messages: how long is a scheduler held, and how long do small
%% messages of another caller on the same link wait, while 10 MB binaries
%% go out? Run with ECALL_BENCH_ERL_FLAGS="+S 1" so that a held scheduler
%% shows in the probe (a process that yields in a loop and records the
%% longest gap between two of its turns).

large() ->
    {Peer, B} = start_b(),
    ok = ecall:connect(B),
    io:format("large: A=~p (~b schedulers) B=~p, 10 x 10 MB binaries per variant~n",
              [node(), erlang:system_info(schedulers_online), B]),
    Rows = [large_point(B, V) || V <- [ecall, native]],
    io:format("~n~-13s ~18s ~22s ~10s~n",
              ["variant", "max sched gap ms", "max small delay ms", "ticks"]),
    [io:format("~-13s ~18.2f ~22.2f ~10b~n", [V, Gap, Delay, N]) || {V, Gap, Delay, N} <- Rows],
    peer:stop(Peer),
    ok.

large_point(B, Variant) ->
    Big = binary:copy(<<"L">>, 10000000),
    {ecall_transport_nif, Peer, _} = ecall_route:peer(B),
    Sink = erpc:call(B, erlang, spawn, [?MODULE, big_sink, [self(), 10]]),
    Ticks = erpc:call(B, erlang, spawn, [?MODULE, tick_sink, []]),
    MyLink = ecall_transport_nif:caller_link(Peer),
    Probe = spawn(fun() -> probe(erlang:monotonic_time(microsecond), 0) end),
    Ticker = same_link_ticker(Peer, MyLink, Ticks, Variant),
    Send = case Variant of
               ecall -> fun(M) -> ecall:send(Sink, M) end;
               native -> fun(M) -> Sink ! M end
           end,
    [Send(Big) || _ <- lists:seq(1, 10)],
    receive {big_sink, Sink, done} -> ok end,
    Probe ! {stop, self()},
    Gap = receive {probe, G} -> G / 1000 end,
    Ticker ! {stop, self()},
    receive ticker_stopped -> ok end,
    Ticks ! {report, self()},
    {Delay, N} = receive {ticks, D, Count} -> {D / 1000, Count} end,
    {Variant, Gap, Delay, N}.

probe(Last, Max) ->
    erlang:yield(),
    Now = erlang:monotonic_time(microsecond),
    receive
        {stop, From} -> From ! {probe, max(Max, Now - Last)}
    after 0 ->
        probe(Now, max(Max, Now - Last))
    end.

%% A process whose requests go over the same link as the caller's, sending
%% a small timestamped message every millisecond.
same_link_ticker(Peer, Link, To, Variant) ->
    Self = self(),
    Pid = spawn(fun() ->
                        Self ! {link, self(), ecall_transport_nif:caller_link(Peer)},
                        receive go -> tick(To, Variant) end
                end),
    receive {link, Pid, L} -> ok end,
    case L =:= Link of
        true -> Pid ! go, Pid;
        false -> exit(Pid, kill), same_link_ticker(Peer, Link, To, Variant)
    end.

tick(To, Variant) ->
    Msg = {tick, erlang:system_time(microsecond)},
    case Variant of
        native -> To ! Msg;
        _ -> ecall:send(To, Msg)
    end,
    receive
        {stop, From} -> From ! ticker_stopped
    after 1 ->
        tick(To, Variant)
    end.

%% On B: the longest delay of a tick (same host, so system time agrees).
tick_sink() -> tick_sink(0, 0).
tick_sink(Max, N) ->
    receive
        {tick, Sent} -> tick_sink(max(Max, erlang:system_time(microsecond) - Sent), N + 1);
        {report, From} -> From ! {ticks, Max, N}
    end.

big_sink(Owner, 0) -> Owner ! {big_sink, self(), done};
big_sink(Owner, N) -> receive _ -> big_sink(Owner, N - 1) end.

matrix(Ns, K, P, Ops, Variants, Label) ->
    {Peer, B} = start_b(),
    erlang:system_flag(scheduler_wall_time, true),
    io:format("~s: A=~p B=~p, OTP ~s, ~b schedulers, payload ~b bytes of ETF, "
              "~b ecall links, ~b shards~n",
              [Label, node(), B, erlang:system_info(otp_release),
               erlang:system_info(schedulers), erlang:external_size(payload()),
               ecall_config:links(), ecall_config:shards()]),
    %% Each point (operation, load) for every variant in turn (a transport
    %% switch reconnects), and both nodes idle before each: this machine
    %% drifts by tens of percent within a run, and a variant run after
    %% another's heavy point paid for its aftermath (gigabytes still being
    %% freed). Run variant by variant, the ratios between variants also
    %% measured the drift between their turns.
    %% ECALL_BENCH_VARIANTS=ecall_nif,native runs only those. The order
    %% of the variants alternates like a checkerboard over (operation,
    %% load), so that no variant always runs right after the same other
    %% one (whose aftermath it would pay for: calls at 20,000 writers came
    %% out a few percent apart with the order swapped).
    Chosen = chosen(Variants),
    Points = [{Op, N, V} || {I, Op} <- lists:enumerate(Ops), {J, N} <- lists:enumerate(Ns),
                            V <- case (I + J) rem 2 of
                                     0 -> Chosen;
                                     1 -> lists:reverse(Chosen)
                                 end],
    Total = length(Points),
    [{Op1, N1, _} | _] = Points,
    warm_up(B, Chosen, Op1, N1, K, P),
    Rows0 = [begin
                 ready(B, V),
                 progress(I, Total, point(B, V, Op, N, K, P))
             end || {I, {Op, N, V}} <- lists:enumerate(Points)],
    %% Printed and written variant by variant, as before.
    Rows = [R || V <- Chosen, #{variant := V1} = R <- Rows0, V1 =:= V],
    print(Rows),
    write_results(Label, Rows),
    peer:stop(Peer),
    %% Nothing may be lost (no variant drops: the default overflow policy
    %% blocks). A run that lost messages fails, after its results are out,
    %% so that `make demo' in CI is a check of every path end to end.
    case [{Op, V, N, L} || #{op := Op, variant := V, writers := N, lost := L} <- Rows, L =/= 0] of
        [] -> ok;
        Lost -> erlang:error({lost, Lost})
    end.

%% One point of Op at N writers by every variant, measured by nobody,
%% before the measured ones. The first point after the nodes start pays
%% for the first touch of the memory its heaps and buffers grow into (the
%% kernel zeroing fresh pages, `clear_page_erms' in the profile mode);
%% whichever variant came first was charged for it. ECALL_BENCH_WARMUP=0
%% leaves it out, to see that cost.
warm_up(B, Variants, Op, N, K, P) ->
    case os:getenv("ECALL_BENCH_WARMUP") of
        "0" ->
            ok;
        _ ->
            [begin
                 ready(B, V),
                 #{rate := Rate} = point(B, V, Op, N, K, P),
                 io:format("  warm-up ~s ~s, ~b writers: ~.1fk ops/s (not counted)~n",
                           [Op, V, N, Rate / 1000])
             end || V <- Variants],
            ok
    end.

%% The variant's transport on both nodes, and both nodes idle: what every
%% point starts from.
ready(B, V) ->
    use_transport(B, V),
    settle(B).

%% Returns once neither node has had anything to run for three looks in a
%% row, 20 ms apart (at most 10 s): the last point's processes are gone
%% and its memory is being given back, not still being worked through.
settle(B) ->
    settle(B, 0, 500).

settle(_B, 3, _Left) ->
    ok;
settle(_B, _Quiet, 0) ->
    ok;
settle(B, Quiet, Left) ->
    Busy = erlang:statistics(total_run_queue_lengths_all)
        + erpc:call(B, erlang, statistics, [total_run_queue_lengths_all]),
    timer:sleep(20),
    settle(B, case Busy of 0 -> Quiet + 1; _ -> 0 end, Left - 1).

%% One line per point as it ends, so that a long run shows where it is.
progress(I, Total, #{variant := V, op := Op, writers := N, rate := Rate,
                     cpu_us_per_op := Cpu, peak_mem_mb := Mem, lost := Lost} = Row) ->
    io:format("  [~b/~b] ~s ~s, ~b writers: ~.1fk ops/s, ~.1f us/op, ~b MB, lost ~b~n",
              [I, Total, Op, V, N, Rate / 1000, Cpu, round(Mem), Lost]),
    Row.

%% Profile: one paced point of Op (send by default; N writers, 100
%% requests each, 50 ms apart) per transport, with Linux perf recording both nodes for 4 s
%% from 1 s after the writers start (bench/run.sh runs perf and makes the
%% flame graphs and the breakdown; here the point and the recording).
profile(N, Op) ->
    {Peer, B} = start_b(),
    erlang:system_flag(scheduler_wall_time, true),
    Out = os:getenv("ECALL_BENCH_PROFILE_DIR"),
    OsA = os:getpid(),
    OsB = erpc:call(B, os, getpid, []),
    io:format("profile: A=~p (~s) B=~p (~s), ~b writers~n", [node(), OsA, B, OsB, N]),
    Chosen = chosen([ecall_nif, ecall_erlang]),
    warm_up(B, Chosen, Op, N, 100, 50),
    Rows = [begin
                ready(B, V),
                File = filename:join(Out, atom_to_list(Op) ++ "-" ++ atom_to_list(V) ++ ".perf"),
                Self = self(),
                Ref = make_ref(),
                Record = fun() ->
                                 spawn_link(fun() ->
                                                    timer:sleep(1000),
                                                    Cmd = io_lib:format(
                                                            "perf record -q -g -F 499 -p ~s,~s -o ~s"
                                                            " -- sleep 4 2>&1", [OsA, OsB, File]),
                                                    io:format("~s", [os:cmd(lists:flatten(Cmd))]),
                                                    Self ! {Ref, recorded}
                                            end)
                         end,
                Row = point(B, V, Op, N, 100, 50, Record),
                receive {Ref, recorded} -> ok end,
                io:format("recorded ~s: ~s~n", [V, File]),
                Row
            end || V <- Chosen],
    print(Rows),
    %% One pair of files per operation, so that a send run and a call run
    %% in the same folder each keep their own (the recordings are per
    %% operation too): the OS pids, and the messages in the 4 s recording
    %% window at the point's rate.
    OpName = atom_to_list(Op),
    ok = file:write_file(filename:join(Out, "nodes-" ++ OpName),
                         io_lib:format("A ~s~nB ~s~n", [OsA, OsB])),
    ok = file:write_file(filename:join(Out, "messages-" ++ OpName),
                         [io_lib:format("~s-~s ~b~n", [Op, V, round(4 * R)])
                          || #{variant := V, rate := R} <- Rows]),
    peer:stop(Peer),
    ok.

%% Cluster: NODES nodes on this machine, each running ecall with
%% discovery (so they connect in a full mesh), this node only driving.
%% Reports per node, at rest and under load: connections, links up, OS
%% threads, file descriptors, memory; the time the mesh took to connect
%% after the last node started; then each node sends to every other (W
%% writers per node, 20 messages each, 50 ms apart, destinations in turn)
%% by `!' and through ecall, and the total rate of each.
cluster(NNodes, W) ->
    io:format("cluster: ~b nodes on one machine (~b schedulers each), ~b writers per node~n",
              [NNodes, erlang:system_info(schedulers), W]),
    Peers = [ecall_test_nodes:start_peer(?NODE_ARGS, [?MODULE]) || _ <- lists:seq(1, NNodes)],
    Nodes = [N || {_, N} <- Peers],
    T0 = erlang:monotonic_time(millisecond),
    ok = wait_mesh(Nodes, NNodes - 1, 600),
    MeshMs = erlang:monotonic_time(millisecond) - T0,
    io:format("full mesh connected ~b ms after the last node started~n", [MeshMs]),
    [_ = erpc:call(N, erlang, spawn, [?MODULE, cluster_sink, []]) || N <- Nodes],
    Rest = facts(Nodes),
    Loads = [cluster_point(Nodes, V, W) || V <- [native, ecall_nif]],
    print_facts("at rest", Rest),
    [begin
         io:format("~s: ~b messages in ~.1f s = ~b msg/s~n", [V, Total, Secs, round(Total / Secs)]),
         print_facts(io_lib:format("under load (~s)", [V]), Facts)
     end || {V, Total, Secs, Facts} <- Loads],
    write_csv("cluster", [state, node, connections, links_up, threads, fds, memory_mb, rss_mb],
              [F#{state => S} || {S, Fs} <- [{rest, Rest} | [{V, Fs0} || {V, _, _, Fs0} <- Loads]],
                                 F <- Fs]),
    [peer:stop(P) || {P, _} <- Peers],
    ok.

%% Rest: what each peer costs this node at rest. This node's Erlang
%% memory, and the part of it in ecall's own processes and ETS tables,
%% before any peer and once N peers running ecall are connected, every
%% link up and nothing sent (the processes collected first, each time).
%% The whole includes the peer's native connection and the harness's
%% `peer' process.
rest(N) ->
    {ok, _} = application:ensure_all_started(ecall),
    Before = rest_memory(),
    Peers = [ecall_test_nodes:start_peer(?NODE_ARGS, [?MODULE]) || _ <- lists:seq(1, N)],
    [ok = ecall:connect(B) || {_, B} <- Peers],
    After = rest_memory(),
    [peer:stop(P) || {P, _} <- Peers],
    Rows = [M#{state => S} || {S, M} <- [{no_peer, Before}, {peers, After}]],
    #{total := T0, ecall := E0} = Before,
    #{total := T1, ecall := E1} = After,
    io:format("rest: ~b peers connected: ~.1f KB of Erlang memory per peer, ~.1f KB of "
              "it in ecall's processes and tables~n",
              [N, (T1 - T0) / N / 1024, (E1 - E0) / N / 1024]),
    write_csv("rest", [state, total, ecall, ecall_processes, ecall_tables], Rows).

%% erlang:memory(total), and the bytes of ecall's processes (those of its
%% application) and the ETS tables they own, after a collection of every
%% process.
rest_memory() ->
    [garbage_collect(P) || P <- processes()],
    Procs = [P || P <- processes(), application:get_application(P) =:= {ok, ecall}],
    ProcBytes = lists:sum([M || P <- Procs, {memory, M} <- [process_info(P, memory)]]),
    Word = erlang:system_info(wordsize),
    Tabs = [T || T <- ets:all(), lists:member(ets:info(T, owner), Procs)],
    TabBytes = lists:sum([M * Word || T <- Tabs, M <- [ets:info(T, memory)], is_integer(M)]),
    #{total => erlang:memory(total), ecall => ProcBytes + TabBytes,
      ecall_processes => ProcBytes, ecall_tables => TabBytes}.

%% Each node connected to all the others with every link up (discovery
%% does it; there is no message to wait for here).
wait_mesh(_Nodes, _Want, 0) ->
    {error, mesh_not_connected};
wait_mesh(Nodes, Want, N) ->
    Done = lists:all(fun(Node) ->
                             Conns = erpc:call(Node, ecall, connections, []),
                             length([C || #{published := true} = C <- Conns]) >= Want
                     end, Nodes),
    case Done of
        true -> ok;
        false -> timer:sleep(100), wait_mesh(Nodes, Want, N - 1)
    end.

facts(Nodes) ->
    [(erpc:call(N, ?MODULE, node_facts, []))#{node => N} || N <- Nodes].

%% On a cluster node.
node_facts() ->
    OsPid = os:getpid(),
    Count = fun(Dir) -> {ok, L} = file:list_dir("/proc/" ++ OsPid ++ "/" ++ Dir), length(L) end,
    #{peers := Peers} = ecall:stats(),
    #{connections => map_size(Peers),
      links_up => lists:sum([maps:get(links_up, S, 0) || S <- maps:values(Peers)]),
      threads => Count("task"), fds => Count("fd"),
      memory_mb => erlang:memory(total) div 1048576, rss_mb => vm_rss() div 1048576}.

print_facts(Label, Facts) ->
    io:format("~n~s~n~-28s ~6s ~6s ~8s ~5s ~10s ~7s~n",
              [Label, "node", "conns", "links", "threads", "fds", "memory MB", "RSS MB"]),
    [io:format("~-28s ~6b ~6b ~8b ~5b ~10b ~7b~n",
               [N, C, L, T, F, M, R])
     || #{node := N, connections := C, links_up := L, threads := T, fds := F,
          memory_mb := M, rss_mb := R} <- Facts],
    ok.

%% Every node sends to every other; facts sampled halfway.
cluster_point(Nodes, Variant, W) ->
    K = 20,
    Expected = length(Nodes) * W * K,
    Counts0 = sink_counts(Nodes),
    T0 = erlang:monotonic_time(millisecond),
    Self = self(),
    [erpc:cast(N, ?MODULE, cluster_load, [Self, Variant, Nodes -- [N], W, K]) || N <- Nodes],
    timer:sleep(K * 50 div 2),
    Facts = facts(Nodes),
    [receive {cluster_load_done, N} -> ok end || N <- Nodes],
    ok = wait_counts(Nodes, Counts0, Expected, 300),
    Secs = (erlang:monotonic_time(millisecond) - T0) / 1000,
    Total = lists:sum(sink_counts(Nodes)) - lists:sum(Counts0),
    {Variant, Total, Secs, Facts}.

sink_counts(Nodes) ->
    [erpc:call(N, fun() -> Ref = make_ref(), bench_sink ! {count, self(), Ref},
                            receive {Ref, C} -> C end end) || N <- Nodes].

wait_counts(_Nodes, _C0, _Expected, 0) ->
    ok;
wait_counts(Nodes, C0, Expected, N) ->
    case lists:sum(sink_counts(Nodes)) - lists:sum(C0) >= Expected of
        true -> ok;
        false -> timer:sleep(100), wait_counts(Nodes, C0, Expected, N - 1)
    end.

%% On a cluster node: counts what arrives.
cluster_sink() ->
    register(bench_sink, self()),
    cluster_sink(0).

cluster_sink(N) ->
    receive
        {count, From, Ref} -> From ! {Ref, N}, cluster_sink(N);
        _ -> cluster_sink(N + 1)
    end.

%% On a cluster node: W writers, K messages each, 50 ms apart, to the
%% sinks of `Others' in turn.
cluster_load(Owner, Variant, Others, W, K) ->
    Payload = payload(),
    Dests = list_to_tuple([{bench_sink, O} || O <- Others]),
    Send = case Variant of
               native -> fun erlang:send/2;
               _ -> fun ecall:send/2
           end,
    Self = self(),
    Writers = [spawn(fun() ->
                             [begin
                                  Send(element((I + J) rem tuple_size(Dests) + 1, Dests), Payload),
                                  timer:sleep(50)
                              end || J <- lists:seq(1, K)],
                             Self ! {done, self()}
                     end) || I <- lists:seq(1, W)],
    [receive {done, P} -> ok end || P <- Writers],
    Owner ! {cluster_load_done, node()}.

%% The variants ECALL_BENCH_VARIANTS names (comma-separated), or all.
%% ECALL_BENCH_OPS (comma-separated, default all): the operations a sweep runs.
chosen_ops() ->
    case os:getenv("ECALL_BENCH_OPS") of
        false -> ?OPS;
        Os -> [O || O <- ?OPS, lists:member(atom_to_list(O), string:split(Os, ",", all))]
    end.

%% ECALL_BENCH_VARIANTS names the variants to run, in the order to run
%% them at each point (so that the order's effect can be measured too).
%% ecall_nif_nogather (the NIF transport with `gather' off) runs only when
%% named there.
chosen(Variants) ->
    case os:getenv("ECALL_BENCH_VARIANTS") of
        false -> Variants;
        Vs -> [V || Name <- string:split(Vs, ",", all),
                    V <- lists:usort(Variants ++ [ecall_nif_nogather]),
                    atom_to_list(V) =:= Name]
    end.

%%--------------------------------------------------------------------
%% Latency: a probe process makes sequential calls to B, 1 ms apart:
%% ?PROBES on an idle connection, and while N writers send (the paced
%% load: 100 messages each, 50 ms apart) as many as it makes until the
%% load ends; p50, p99 and max of its round trips, and how many there
%% were. native is erpc:call/4; ecall_erlang and ecall_nif are
%% ecall:call/4 over that transport.
%%
%% The loaded probe stops when the point does. It used to make ?PROBES
%% calls whatever happened, and under load it waits in the run queue
%% behind the writers, so that in some runs most of its calls came after
%% the load had ended and its p50 was an idle call's (one probe made 398
%% of its 1,000 calls while the writers sent, another 910).
%%
%% Every variant's idle probes come first, before any load, in
%% ?IDLE_ROUNDS rounds that take the variants in turn (a share of the
%% probes each): a variant measured just after another's loaded point
%% paid for its aftermath (both nodes still freeing gigabytes), and one
%% measured alone paid for whatever the shared machine did meanwhile.

-define(PROBES, 1000).
-define(IDLE_ROUNDS, 4).

latency(N) ->
    {Peer, B} = start_b(),
    erlang:system_flag(scheduler_wall_time, true),
    io:format("latency: A=~p B=~p, OTP ~s, ~b schedulers, probe calls 1 ms apart: "
              "~b idle (~b rounds over the variants), and while ~b writers send~n",
              [node(), B, erlang:system_info(otp_release), erlang:system_info(schedulers),
               ?PROBES, ?IDLE_ROUNDS, N]),
    Variants = chosen([native, ecall_erlang, ecall_nif]),
    PerRound = ?PROBES div ?IDLE_ROUNDS,
    IdleRounds = [{V, begin use_transport(B, V), call_probe(B, V, PerRound) end}
                  || _ <- lists:seq(1, ?IDLE_ROUNDS), V <- Variants],
    Idle = [{V, lists:sort(lists:append([P || {V1, P} <- IdleRounds, V1 =:= V]))}
            || V <- Variants],
    Rows = lists:append(
             [begin
                  use_transport(B, V),
                  Self = self(),
                  Ref = make_ref(),
                  Start = fun() ->
                                  spawn_link(fun() ->
                                                     Self ! {Ref, probe, self()},
                                                     Self ! {Ref, loaded_probe(B, V, Ref, [])}
                                             end)
                          end,
                  _ = point(B, V, send, N, 100, 50, Start),
                  receive {Ref, probe, Probe} -> Probe ! {Ref, stop} end,
                  Loaded = receive {Ref, L} -> L end,
                  [latency_row(V, 0, proplists:get_value(V, Idle)), latency_row(V, N, Loaded)]
              end || V <- Variants]),
    io:format("~n~-13s ~8s ~7s ~9s ~9s ~9s~n", ["variant", "writers", "probes", "p50 us", "p99 us", "max us"]),
    [io:format("~-13s ~8b ~7b ~9b ~9b ~9b~n", [V, W, Probes, P50, P99, Max])
     || #{variant := V, writers := W, probes := Probes, p50_us := P50, p99_us := P99,
          max_us := Max} <- Rows],
    write_csv("latency", [variant, writers, probes, p50_us, p99_us, max_us], Rows),
    peer:stop(Peer),
    ok.

%% Closed-loop callers: C processes (1, 8, 64), each making N calls of
%% erlang:node/0 on B back to back, each waiting for its reply before the
%% next. What a process doing request-response in a loop sees (a
%% gen_server calling out per message, say): no pause between calls, so a
%% link never looks quiet, and no company for a request, since every
%% caller waits. Prints wall µs per call and calls per second in all. A
%% last row has one caller with 100,000 other messages in its mailbox: a
%% call's receive should not scan them (erpc's does not). The row of 1,000
%% callers makes a twentieth of N calls each.
%%
%% ECALL_BENCH_EXCHANGE=send: the exchange is a request and its reply by
%% sends instead (each caller has an echo process of its own on B, which
%% answers the way the request came), with the variant ecall_nif_urgent:
%% ecall:send/3 with `urgent' both ways. No mailbox row then (a plain
%% receive scans the mailbox).
pingpong(N) ->
    {Peer, B} = start_b(),
    Exchange = case os:getenv("ECALL_BENCH_EXCHANGE") of
                   "send" -> send;
                   _ -> call
               end,
    io:format("pingpong: A=~p B=~p, ~b back-to-back ~ss per caller~n", [node(), B, N, Exchange]),
    Variants = chosen(case Exchange of
                          call -> [native, ecall_erlang, ecall_nif, ecall_nif_nogather];
                          send -> [native, ecall_erlang, ecall_nif, ecall_nif_urgent]
                      end),
    %% The 1,000-caller row is the closed loop under load (the link is
    %% never idle): a twentieth of the calls each, to keep its length.
    %% ECALL_BENCH_CALLERS=C1,C2,...: those rows instead (no mailbox row),
    %% past 64 callers with a twentieth of the calls each too.
    Shape = case os:getenv("ECALL_BENCH_CALLERS") of
                false when Exchange =:= send ->
                    [{1, 0, N}, {8, 0, N}, {64, 0, N}, {1000, 0, max(10, N div 20)}];
                false ->
                    [{1, 0, N}, {8, 0, N}, {64, 0, N}, {1000, 0, max(10, N div 20)},
                     {1, 100000, N}];
                Cs ->
                    [{C, 0, case C > 64 of true -> max(10, N div 20); false -> N end}
                     || C <- [list_to_integer(X) || X <- string:lexemes(Cs, ",")]]
            end,
    Rows = [pingpong_row(B, V, C, Junk, Calls, Exchange)
            || {C, Junk, Calls} <- Shape, V <- Variants],
    %% urgent: the share of calls sent urgent (A's links) and of replies
    %% (B's links back); batch: requests per batch on A's links.
    io:format("~n~-19s ~8s ~9s ~12s ~10s ~8s ~8s ~7s~n",
              ["variant", "callers", "mailbox", "us per call", "calls/s", "urgent%",
               "back%", "batch"]),
    [io:format("~-19s ~8b ~9b ~12.1f ~10b ~8.1f ~8.1f ~7.1f~n",
               [V, C, J, Us, round(Rate), U, UB, Batch])
     || #{variant := V, callers := C, mailbox := J, us_per_call := Us, rate := Rate,
          urgent := U, urgent_back := UB, batch := Batch} <- Rows],
    Csv = case Exchange of call -> "pingpong"; send -> "pingpong-send" end,
    write_csv(Csv, [variant, callers, mailbox, calls, us_per_call, rate, urgent,
                    urgent_back, batch], Rows),
    peer:stop(Peer),
    ok.

pingpong_row(B, V, C, Junk, N, Exchange) ->
    use_transport(B, V),
    Exchanges = [exchange(B, V, Exchange) || _ <- lists:seq(1, C)],
    %% Warm the path (connections up, atoms cached) before timing.
    {Warm, _} = hd(Exchanges),
    [Warm() || _ <- lists:seq(1, 10)],
    Self = self(),
    Go = make_ref(),
    Pids = [spawn_link(fun() ->
                               [self() ! {junk, I} || I <- lists:seq(1, Junk)],
                               receive Go -> ok end,
                               T0 = erlang:monotonic_time(microsecond),
                               repeat(Call, N),
                               Self ! {Go, self(), erlang:monotonic_time(microsecond) - T0}
                       end) || {Call, _} <- Exchanges],
    Stats = fun() ->
                    {case ecall:stats(B) of {ok, S} -> S; _ -> #{} end,
                     case erpc:call(B, ecall, stats, [node()]) of {ok, SB} -> SB; _ -> #{} end}
            end,
    {A0, B0} = Stats(),
    T0 = erlang:monotonic_time(microsecond),
    [P ! Go || P <- Pids],
    Times = [receive {Go, P, T} -> T end || P <- Pids],
    Wall = erlang:monotonic_time(microsecond) - T0,
    [Echo ! stop || {_, Echo} <- Exchanges, is_pid(Echo)],
    {A1, B1} = Stats(),
    D = fun(Key, S1, S0) -> maps:get(Key, S1, 0) - maps:get(Key, S0, 0) end,
    os:getenv("ECALL_BENCH_DEBUG") =:= false orelse
        io:format("~p ~b callers: A's links: batches ~b, requests ~b, wakes ~b, lone ~b, "
                  "gathers ~b, flushes ~b; B's: batches ~b, "
                  "requests ~b, wakes ~b, lone ~b, gathers ~b, flushes ~b~n",
                  [V, C | [D(K, S1, S0) || {S1, S0} <- [{A1, A0}, {B1, B0}],
                                           K <- [batches, requests, wakes, lone, gathers,
                                                 flushes]]]),
    #{variant => V, callers => C, mailbox => Junk, calls => C * N,
      us_per_call => lists:sum(Times) / C / N,
      rate => C * N * 1.0e6 / Wall,
      urgent => 100 * D(urgent, A1, A0) / (C * N),
      urgent_back => 100 * D(urgent, B1, B0) / (C * N),
      batch => D(requests, A1, A0) / max(1, D(batches, A1, A0))}.

%% One exchange of a pingpong caller, and the echo process on B it uses
%% (none for calls): a call of erlang:node/0 on B, or a request and its
%% reply by sends (see pingpong/1).
exchange(B, native, call) ->
    {fun() -> B = erpc:call(B, erlang, node, []) end, none};
exchange(B, _V, call) ->
    {fun() -> {ok, B} = ecall:call(B, erlang, node, []) end, none};
exchange(B, V, send) ->
    Back = case V of
               native -> bang;
               ecall_nif_urgent -> ecall_urgent;
               _ -> ecall
           end,
    Echo = erpc:call(B, erlang, spawn, [?MODULE, echo, [Back]]),
    Send = case Back of
               bang -> fun erlang:send/2;
               ecall -> fun ecall:send/2;
               ecall_urgent -> fun(To, Msg) -> ecall:send(To, Msg, [urgent]) end
           end,
    {fun() -> Send(Echo, {self(), ping}), receive {Echo, ping} -> ok end end, Echo}.

%% Where an idle round trip goes: a message to an echo process on B and
%% back, each leg by `!' or by ecall:send/2 (over the NIF transport), p50
%% and p99 of ?PROBES round trips 1 ms apart. The difference between rows
%% is the cost of one leg's path.
hops() ->
    {Peer, B} = start_b(),
    Rows = lists:append(
             [begin
                  use_transport(B, T),
                  [begin
                       Echo = erpc:call(B, erlang, spawn, [?MODULE, echo, [Back]]),
                       Sorted = echo_probe(Echo, There),
                       Echo ! stop,
                       Pct = fun(P) -> lists:nth(max(1, round(P * length(Sorted))), Sorted) end,
                       io:format("~-8s there ~-6s back ~-6s p50 ~5b us  p99 ~5b us~n",
                                 [T, There, Back, Pct(0.5), Pct(0.99)]),
                       #{transport => T, there => There, back => Back,
                         p50_us => Pct(0.5), p99_us => Pct(0.99)}
                   end || {There, Back} <- [{bang, bang}, {ecall, bang},
                                            {bang, ecall}, {ecall, ecall}]]
              end || T <- [ecall_nif, ecall_erlang]]),
    write_csv("hops", [transport, there, back, p50_us, p99_us], Rows),
    peer:stop(Peer).

echo_probe(Echo, There) ->
    Send = case There of bang -> fun erlang:send/2; ecall -> fun ecall:send/2 end,
    lists:sort([begin
                    T0 = erlang:monotonic_time(),
                    Send(Echo, {self(), ping}),
                    receive {Echo, ping} -> ok end,
                    T1 = erlang:monotonic_time(),
                    timer:sleep(1),
                    erlang:convert_time_unit(T1 - T0, native, microsecond)
                end || _ <- lists:seq(1, ?PROBES)]).

%% On B: answers each {From, X} with {self(), X} by `!' (bang), ecall
%% or ecall urgent (ecall:send/3).
echo(Back) ->
    receive
        stop -> ok;
        {From, X} ->
            case Back of
                bang -> From ! {self(), X};
                ecall -> ecall:send(From, {self(), X});
                ecall_urgent -> ecall:send(From, {self(), X}, [urgent])
            end,
            echo(Back)
    end.

%% Count calls, 1 ms apart; their round trips in microseconds, sorted.
call_probe(B, Variant, Count) ->
    lists:sort([probe_call(B, Variant) || _ <- lists:seq(1, Count)]).

%% Calls 1 ms apart until `{Ref, stop}' comes (neither call's receive nor
%% the sleep takes it); their round trips in microseconds, sorted.
loaded_probe(B, Variant, Ref, Acc) ->
    receive
        {Ref, stop} -> lists:sort(Acc)
    after 0 ->
        loaded_probe(B, Variant, Ref, [probe_call(B, Variant) | Acc])
    end.

%% One call's round trip in microseconds, then 1 ms of sleep.
probe_call(B, native) ->
    probe_call(fun() -> B = erpc:call(B, erlang, node, []) end);
probe_call(B, _Ecall) ->
    probe_call(fun() -> {ok, B} = ecall:call(B, erlang, node, []) end).

probe_call(Call) ->
    T0 = erlang:monotonic_time(),
    Call(),
    T1 = erlang:monotonic_time(),
    timer:sleep(1),
    erlang:convert_time_unit(T1 - T0, native, microsecond).

latency_row(Variant, Writers, Sorted) ->
    Pct = fun(P) -> lists:nth(max(1, round(P * length(Sorted))), Sorted) end,
    #{variant => Variant, writers => Writers, probes => length(Sorted),
      p50_us => Pct(0.5), p99_us => Pct(0.99), max_us => lists:last(Sorted)}.

%%--------------------------------------------------------------------
%% Micro-benchmarks: the cost of one push through the NIF (from one
%% process, and from one process per scheduler at once), and blast
%% throughput (one unpaced writer per scheduler) for each variant.

micro() ->
    {Peer, B} = start_b(),
    erlang:system_flag(scheduler_wall_time, true),
    use_transport(B, ecall_nif),
    S = erlang:system_info(schedulers_online),
    Sink = erpc:call(B, erlang, spawn, [fun Loop() -> receive _ -> Loop() end end]),
    Payload = payload(),
    N = 200000,
    {One, OneCpu} = push_cpu(B, Sink, Payload, N, 1),
    {All, AllCpu} = push_cpu(B, Sink, Payload, N, S),
    io:format("micro: ecall:send/2 push, ~b-byte payload: ~.1f ns per call from one process, "
              "~.1f ns per call with ~b processes at once (wall / calls per process); "
              "node A's CPU per message, its writes included: ~.1f ns, ~.1f ns~n",
              [erlang:external_size(Payload), One, All, S, OneCpu, AllCpu]),
    %% What the push's encode and the receiver's decode cost on their own,
    %% and one atom decoded as text (what the atom cache saves).
    Bin = term_to_binary(Payload),
    Atoms = term_to_binary([list_to_atom("atom_" ++ integer_to_list(I)) || I <- lists:seq(1, 100)]),
    Request = {send, Sink, Payload},
    io:format("micro: encode of the request {send, Pid, Payload}: term_to_binary ~.1f ns, "
              "the NIF's encoder (ecall_nif:encoded_size/1) ~.1f ns~n",
              [per_call(fun() -> term_to_binary(Request) end, 100000),
               per_call(fun() -> ecall_nif:encoded_size(Request) end, 100000)]),
    %% The destination's share: a local pid and an atom come from the
    %% encoder's per-thread table, another node's pid from its remote
    %% cache (hash, then a check against a copy), a reference through
    %% enif_term_to_binary each time.
    Ref = erpc:call(B, erlang, make_ref, []),
    io:format("micro: encode of {send, To, 1}, ns: To a local pid ~.1f, a pid on B ~.1f, "
              "an atom ~.1f, a reference of B ~.1f~n",
              [per_call(fun() -> ecall_nif:encoded_size({send, To, 1}) end, 200000)
               || To <- [self(), Sink, sink, Ref]]),
    %% The same atoms as the payload's maps, as a tuple and as a list: what
    %% walking a map (two calls into the VM per pair) and a list (one per
    %% cell) cost the encoder against a tuple's array.
    Pairs = [[K, V] || G <- maps:values(Payload), {K, V} <- maps:to_list(G)],
    AsTuple = list_to_tuple(lists:append(Pairs) ++ maps:keys(Payload)),
    AsList = lists:append(Pairs) ++ maps:keys(Payload),
    io:format("micro: encode of the payload's atoms, ns: as the map ~.1f, a tuple ~.1f, "
              "a list ~.1f~n",
              [per_call(fun() -> ecall_nif:encoded_size(T) end, 200000)
               || T <- [Payload, AsTuple, AsList]]),
    %% Atoms that share a set of the encoder's table (ecall_dist's
    %% two_way.rs): which atoms do depends on the order the VM made them
    %% in. In 30 sets of 15 atoms (10 fresh ones and 5 of the payload's),
    %% each pair encoded alone: a pair that pushes each other out of the
    %% table goes to the VM on every encode and takes several times the
    %% median pair. With a direct-mapped table 1 set in 30 had such a pair.
    Sets = [[send, a, b, c, v | [list_to_atom(lists:concat([x, T, '_', J]))
                                 || J <- lists:seq(0, 9)]]
            || T <- lists:seq(1, 30)],
    %% A pair slow once may have met a preemption: it counts if it is
    %% slow the best of three times.
    Pair = fun(A, B1) -> per_call(fun() -> ecall_nif:encoded_size({A, B1}) end, 3000) end,
    Firsts = [[{A, B1, Pair(A, B1)} || A <- Set, B1 <- Set, A < B1] || Set <- Sets],
    PairAll = [Ns || {_, _, Ns} <- lists:append(Firsts)],
    Median = lists:nth(length(PairAll) div 2, lists:sort(PairAll)),
    Bests = [[case Ns > 2.5 * Median of
                  true -> lists:min([Ns, Pair(A, B1), Pair(A, B1)]);
                  false -> Ns
              end || {A, B1, Ns} <- Set]
             || Set <- Firsts],
    io:format("micro: encode of two atoms, 30 sets of 15: median pair ~.1f ns, slowest ~.1f ns; "
              "sets with a pair over 2.5 x the median: ~b~n",
              [Median, lists:max(lists:append(Bests)),
               length([Set || Set <- Bests, lists:max(Set) > 2.5 * Median])]),
    %% Atoms past the ids (only the first 200 atoms a node's encoder meets
    %% get one), as text: short ones, and ones longer than 16 bytes, as
    %% Elixir module names are ('Elixir.MyApp.Orders.Created').
    use_up_ids(),
    Past = fun(Prefix) ->
                   list_to_tuple([list_to_atom(Prefix ++ integer_to_list(I))
                                  || I <- lists:seq(10, 19)])
           end,
    LongAtoms = Past("Elixir.EcallBench.Long"),
    ShortAtoms = Past("ecall_s"),
    {_, true, _} = ecall_nif:encoded_size(LongAtoms),
    {_, true, _} = ecall_nif:encoded_size(ShortAtoms),
    io:format("micro: encode of 10 atoms past the ids, as text, ns: of 24 bytes ~.1f, "
              "of 9 bytes ~.1f~n",
              [per_call(fun() -> ecall_nif:encoded_size(LongAtoms) end, 100000),
               per_call(fun() -> ecall_nif:encoded_size(ShortAtoms) end, 100000)]),
    %% How soon a push gives up a large term (it then goes by
    %% term_to_iovec): the longest a push holds the caller's scheduler.
    List = lists:seq(1, 1000000),
    Map = maps:from_list([{K, K} || K <- lists:seq(1, 8000)]),
    large = ecall_nif:encoded_size(List),
    large = ecall_nif:encoded_size(Map),
    io:format("micro: a push gives up a list of 1,000,000 integers after ~.1f us, "
              "a map of 8,000 pairs after ~.1f us~n",
              [per_call(fun() -> ecall_nif:encoded_size(List) end, 1000) / 1000,
               per_call(fun() -> ecall_nif:encoded_size(Map) end, 1000) / 1000]),
    %% send_many's targets of one node: ecall_nif:push_many/4 writes the
    %% list through one call into the VM (term_to_binary/1's own writer);
    %% the walk meets each pid once, its cache of other nodes' pids
    %% missing every time, and gives up such a list at INLINE_MAX.
    Many = pids_like(Sink, 4096),
    {ecall_transport_nif, {_, NifPeer}, _} = ecall_route:peer(B),
    large = ecall_nif:encoded_size({send_many, Many, 1}),
    io:format("micro: a send_many request with 4,096 pids of B, us: term_to_binary of the "
              "list ~.1f, ecall_nif:push_many/4 of it ~.1f; the walk gives it up after ~.1f~n",
              [per_call(fun() -> term_to_binary(Many) end, 200) / 1000,
               per_call(fun() -> ok = ecall_nif:push_many(NifPeer, Many, 1, false) end, 50) / 1000,
               per_call(fun() -> ecall_nif:encoded_size({send_many, Many, 1}) end, 200) / 1000]),
    %% Requests around the encoder's bound (ecall_nif's INLINE_MAX):
    %% below it the NIF encodes them inline, above it the push gives up and
    %% goes by term_to_iovec and a dirty-scheduler copy (`iovec').
    Sized = [{KiB, lists:duplicate(KiB * 1024 div erlang:external_size(Payload), Payload)}
             || KiB <- [4, 12, 20, 48]],
    io:format("micro: push of a list of payloads, one process, us per push (term_to_binary's "
              "time in brackets):~s~n",
              [[io_lib:format(" ~b KiB ~s ~.1f (~.1f);",
                              [KiB, Path, sized_push_us(B, Sink, T, KiB),
                               per_call(fun() -> term_to_binary(T) end, 200) / 1000])
                || {KiB, T} <- Sized,
                   Path <- [case ecall_nif:encoded_size(T) of
                                large -> "iovec";
                                _ -> "inline"
                            end]]]),
    %% A call from a caller in a closed loop decides whether it is urgent
    %% (ecall_rpc:urgent/1: the caller's history, one count in the
    %% peer): that alone, from one process and from one per scheduler.
    %% (Urgent or not: with several such loops on one scheduler, each one
    %% sees the others' calls between two of its own, past the limit.)
    Loop = fun() ->
                   _ = ecall_rpc:urgent(B),
                   ecall_rpc:returned()
           end,
    ecall_rpc:returned(),
    io:format("micro: a closed-loop call's urgency: ~.1f ns from one process, ~.1f ns "
              "with ~b processes at once~n",
              [per_call(Loop, 200000), par_per_call(Loop, 200000, S), S]),
    io:format("micro: term_to_binary of the payload ~.1f ns, binary_to_term ~.1f ns, "
              "one atom decoded from text ~.1f ns~n",
              [per_call(fun() -> term_to_binary(Payload) end, 100000),
               per_call(fun() -> binary_to_term(Bin) end, 100000),
               per_call(fun() -> binary_to_term(Atoms) end, 10000) / 100]),
    Rows = lists:append([begin use_transport(B, V), [point(B, V, send, S, 100000, 0)] end
                         || V <- [native, ecall_erlang, ecall_nif, local]]),
    io:format("~nblast: ~b unpaced writers x 100,000 messages~n", [S]),
    print(Rows),
    write_results("micro", Rows),
    peer:stop(Peer),
    ok.

%% N pids of Pid's node and creation that name no process there (sends
%% to them are dropped): numbers 1 to N (a node takes a number past 32,767
%% for a corrupted term) with serial 8,000, which a node reaches only
%% after 8,000 times its process table of spawns.
pids_like(Pid, N) ->
    <<131, 88, Rest/binary>> = term_to_binary(Pid),
    %% NEW_PID_EXT: the node's atom, then id, serial and creation, 4 bytes each.
    AtomLen = byte_size(Rest) - 12,
    <<Atom:AtomLen/binary, _Id:32, _Serial:32, Creation:32>> = Rest,
    [binary_to_term(<<131, 88, Atom/binary, I:32, 8000:32, Creation:32>>)
     || I <- lists:seq(1, N)].

%% Pushes of one size: 4 MiB of them at most, each row starting with an
%% empty queue, so that the byte budget (64 MiB) never makes a push wait
%% for the link: the push's own cost, not the peer's decode rate.
sized_push_us(B, Sink, T, KiB) ->
    drained(B, 1000),
    push_ns(Sink, T, max(50, min(2000, 4096 div KiB)), 1) / 1000.

drained(_B, 0) ->
    ok;
drained(B, Tries) ->
    case ecall:stats(B) of
        {ok, #{queued_bytes := 0}} -> ok;
        _ -> timer:sleep(10), drained(B, Tries - 1)
    end.

per_call(Fun, N) ->
    T0 = erlang:monotonic_time(nanosecond),
    repeat(Fun, N),
    (erlang:monotonic_time(nanosecond) - T0) / N.

%% ECALL_BENCH_LOOPERS=N: N callers in a closed loop (back-to-back calls
%% of erlang:node/0 on B, through the variant's call) beside a point's
%% writers, from their release to the point's end: what a few such
%% callers do to a paced load sharing their links, and what it does to
%% them. Their calls are not in the point's rate; their CPU is in its CPU.
loopers(local, _B) ->
    [];
loopers(Variant, B) ->
    N = list_to_integer(os:getenv("ECALL_BENCH_LOOPERS", "0")),
    Call = case Variant of
               native -> fun() -> B = erpc:call(B, erlang, node, []) end;
               _ -> fun() -> {ok, B} = ecall:call(B, erlang, node, []) end
           end,
    [spawn_link(fun() -> looper(Call, 0, erlang:monotonic_time(microsecond)) end)
     || _ <- lists:seq(1, N)].

looper(Call, Calls, T0) ->
    receive
        {stop, From} -> From ! {looped, self(), Calls, erlang:monotonic_time(microsecond) - T0}
    after 0 ->
        Call(),
        looper(Call, Calls + 1, T0)
    end.

stop_loopers(_Variant, []) ->
    ok;
stop_loopers(Variant, Loopers) ->
    [L ! {stop, self()} || L <- Loopers],
    Done = [receive {looped, L, Calls, Us} -> {Calls, Us} end || L <- Loopers],
    Calls = lists:sum([C || {C, _} <- Done]),
    io:format("~p loopers: ~b callers, ~b calls, ~.1f us per call~n",
              [Variant, length(Loopers), Calls,
               lists:sum([Us / max(1, C) || {C, Us} <- Done]) / length(Loopers)]).

%% Wall ns per call of Procs processes making N calls each at once. A
%% process that fails fails the run (it used to leave the run waiting for
%% its answer forever).
par_per_call(Fun, N, Procs) ->
    Ps = [spawn_monitor(fun() ->
                                receive go -> ok end,
                                ecall_rpc:returned(),
                                repeat(Fun, N)
                        end) || _ <- lists:seq(1, Procs)],
    T0 = erlang:monotonic_time(nanosecond),
    [P ! go || {P, _} <- Ps],
    [receive
         {'DOWN', M, process, P, normal} -> ok;
         {'DOWN', M, process, P, Reason} -> erlang:error({par_per_call, Reason})
     end || {P, M} <- Ps],
    (erlang:monotonic_time(nanosecond) - T0) / N.

repeat(_Fun, 0) -> ok;
repeat(Fun, N) -> _ = Fun(), repeat(Fun, N - 1).

%% push_ns/4, and node A's CPU (every thread: schedulers and the link's
%% I/O) per message from the first push until the queue is empty again.
%% The wall time of a push counts whatever else shares the cores (node B,
%% the I/O thread); the CPU does not, and is the steadier of the two here.
push_cpu(B, Sink, Payload, N, Procs) ->
    drained(B, 1000),
    {R0, _} = statistics(runtime),
    Ns = push_ns(Sink, Payload, N, Procs),
    drained(B, 1000),
    {R1, _} = statistics(runtime),
    {Ns, (R1 - R0) * 1.0e6 / N}.

push_ns(Sink, Payload, N, Procs) ->
    Self = self(),
    Per = N div Procs,
    Pids = [spawn(fun() ->
                          receive go -> ok end,
                          T0 = erlang:monotonic_time(nanosecond),
                          [ecall:send(Sink, Payload) || _ <- lists:seq(1, Per)],
                          Self ! {done, self(), erlang:monotonic_time(nanosecond) - T0}
                  end) || _ <- lists:seq(1, Procs)],
    [P ! go || P <- Pids],
    Times = [receive {done, P, T} -> T end || P <- Pids],
    lists:sum(Times) / length(Times) / Per.

%% Connects both ways with the variant's transport (replies to calls come
%% back through B's own connection).
use_transport(B, V) ->
    T = case V of ecall_erlang -> erlang; _ -> nif end,
    %% ecall_nif_nogather: the NIF transport with `gather' off.
    Gather = V =/= ecall_nif_nogather,
    _ = ecall:disconnect(B),
    _ = erpc:call(B, ecall, disconnect, [node()]),
    ok = application:set_env(ecall, transport, T),
    ok = erpc:call(B, application, set_env, [ecall, transport, T]),
    ok = application:set_env(ecall, gather, Gather),
    ok = erpc:call(B, application, set_env, [ecall, gather, Gather]),
    ok = ecall:connect(B),
    ok = erpc:call(B, ecall, connect, [node()]).

%% What a cast or call applies on B: delivers the payload to the writer's
%% receiver (so a point ends only when every one has run) and answers ok.
deliver(To, Msg) ->
    To ! Msg,
    ok.

%% Starts ecall here and node B (a peer of this node) running ecall, with
%% this module on its path; the node helper is the test suites' own.
start_b() ->
    {ok, _} = application:ensure_all_started(ecall),
    %% ECALL_BENCH_PERF=1 (the profile mode): B's JIT code gets perf maps.
    Perf = case os:getenv("ECALL_BENCH_PERF") of false -> []; _ -> ["+JPperf", "true"] end,
    %% ECALL_BENCH_B_FLAGS: more arguments for B (the tls mode's).
    Extra = string:lexemes(os:getenv("ECALL_BENCH_B_FLAGS", ""), " "),
    ecall_test_nodes:start_peer(?NODE_ARGS ++ Perf ++ Extra, [?MODULE]).

%% Three sub-maps of ten atom fields (the article's payload; its size in
%% ETF is printed at the start of a run), with ECALL_BENCH_PAYLOAD=binary
%% a binary of about the same size, with ECALL_BENCH_PAYLOAD=map_past_ids
%% the map with atoms past the encoder's ids.
payload() ->
    payload(os:getenv("ECALL_BENCH_PAYLOAD", "map")).

payload("binary") ->
    %% The same size without atoms: isolates the cost of atom decoding.
    binary:copy(<<"x">>, 290);
payload("map") ->
    maps:from_list(
      [{G, maps:from_list([{list_to_atom([$f, $0 + J]), v} || J <- lists:seq(0, 9)])}
       || G <- [a, b, c]]);
payload("map_past_ids") ->
    %% The same shape with atoms that have no id: node A's encoder gives
    %% ids to the first 200 atoms it meets, and 250 others are met first
    %% (ecall_nif, when loaded), as in an application that sends more than
    %% 200 atoms. Its atoms then go as text, and each batch that holds
    %% them is rewritten by the link writer into its connection's atom
    %% cache. The atoms are made after the others, and are as short as
    %% the map's.
    use_up_ids(),
    maps:from_list(
      [{list_to_atom("p" ++ G), maps:from_list([{list_to_atom([$q, $0 + J]), w}
                                                || J <- lists:seq(0, 9)])}
       || G <- ["a", "b", "c"]]).

%% Has this node's encoder meet 250 atoms of its own, so that the ids
%% (the first 200 atoms met get one, ecall_dist's fixed_atom_ids) are all given
%% and atoms made after this go as text. Without the NIF: nothing to do.
use_up_ids() ->
    _ = (catch ecall_nif:encoded_size(
                 list_to_tuple([list_to_atom("ecall_bench_id_" ++ integer_to_list(I))
                                || I <- lists:seq(1, 250)]))),
    ok.

%%--------------------------------------------------------------------
%% One point

point(B, Variant, Op, N, K, P) ->
    point(B, Variant, Op, N, K, P, fun() -> ok end).

%% OnStart runs as the writers are released (the latency mode starts its
%% probe there).
point(B, Variant, Op, N, K, P, OnStart) ->
    Where = case Variant of local -> node(); _ -> B end,
    Ref = make_ref(),
    Agg = erpc:call(Where, erlang, spawn, [?MODULE, aggregator, [self(), Ref, N]]),
    Receivers = erpc:call(Where, lists, map,
                          [fun(_) -> spawn(?MODULE, receiver, [Agg, K, undefined]) end,
                           lists:seq(1, N)], 120000),
    Send = operation(Variant, Op, B),
    Payload = payload(),
    Go = make_ref(),
    Self = self(),
    Writers = [spawn(fun() -> receive Go -> write(Send, R, Payload, K, P) end, Self ! {written, Go} end)
               || R <- Receivers],
    garbage_collect(),
    S0 = stats(B),
    Back0 = back_stats(B),
    Wire0 = wire(B),
    Rss0 = vm_rss(),
    Sampler = spawn_link(fun() -> sample(#{mem => 0, rq => 0, rss => Rss0, carriers => 0}) end),
    CpuA0 = cpu_seconds(os:getpid()),
    CpuB0 = cpu_seconds(erpc:call(B, os, getpid, [])),
    Wall0 = erlang:statistics(scheduler_wall_time),
    T0 = erlang:monotonic_time(),
    [W ! Go || W <- Writers],
    OnStart(),
    Loopers = loopers(Variant, B),
    {Counted, SpanSum} = receive {Ref, done, C, Sum} -> {C, Sum} end,
    T1 = erlang:monotonic_time(),
    stop_loopers(Variant, Loopers),
    Wall1 = erlang:statistics(scheduler_wall_time),
    CpuA = cpu_seconds(os:getpid()) - CpuA0,
    CpuB = cpu_seconds(erpc:call(B, os, getpid, [])) - CpuB0,
    [receive {written, Go} -> ok end || _ <- Writers],
    Sampler ! {stop, self()},
    Peak = receive {sampled, S} -> S end,
    S1 = stats(B),
    Back1 = back_stats(B),
    Wire = wire(B) - Wire0,
    Wall = erlang:convert_time_unit(T1 - T0, native, microsecond) / 1.0e6,
    Elapsed = case Op of
                  %% Casts and calls: wall time to verified completion, as
                  %% the article measures them.
                  send -> SpanSum / N / 1.0e6;
                  _ -> Wall
              end,
    Total = N * K,
    %% The NIF link's counters speak for the NIF variant only (native and
    %% local runs would show its idle ticks).
    Delta = fun(Key) when Variant =:= ecall_nif; Variant =:= ecall_nif_nogather;
                          Variant =:= ecall_erlang ->
                    maps:get(Key, S1, 0) - maps:get(Key, S0, 0);
               (_Key) ->
                    0
            end,
    Batches = Delta(batches),
    Writes = Delta(writes),
    BackDelta = fun(Key) -> maps:get(Key, Back1, 0) - maps:get(Key, Back0, 0) end,
    %% Lone writes are counted per link.
    LinkSum = fun(St) ->
                      Links = case maps:get(per_link, St, []) of
                                  M when is_map(M) -> maps:values(M);
                                  L -> L
                              end,
                      lists:sum([maps:get(lone, L, 0) || L <- Links])
              end,
    os:getenv("ECALL_BENCH_DEBUG") =:= false orelse
        io:format("~p ~p: wakes ~b, lone ~b, batches ~b, writes ~b, requests ~b, "
                  "gathers ~b, urgent ~b, flushes ~b (~b to the writer); "
                  "B back to A (replies): wakes ~b, lone ~b, batches ~b, writes ~b, requests ~b, "
                  "gathers ~b, urgent ~b, flushes ~b (~b to the writer)~n",
                  [Variant, Op, Delta(wakes), LinkSum(S1) - LinkSum(S0), Batches, Writes,
                   Delta(requests), Delta(gathers), Delta(urgent),
                   Delta(flushes), Delta(flush_handoffs),
                   BackDelta(wakes), LinkSum(Back1) - LinkSum(Back0),
                   BackDelta(batches), BackDelta(writes), BackDelta(requests),
                   BackDelta(gathers), BackDelta(urgent),
                   BackDelta(flushes), BackDelta(flush_handoffs)]),
    #{variant => Variant, op => Op,
      payload => list_to_atom(os:getenv("ECALL_BENCH_PAYLOAD", "map")),
      writers => N, per_writer => K, pause_ms => P,
      intended => case P of 0 -> 0; _ -> N * 1000 / P end,
      rate => Total / max(Elapsed, 1.0e-9),
      elapsed => Elapsed, wall => Wall,
      cpu_a => CpuA, cpu_b => CpuB,
      cpu_us_per_op => (CpuA + CpuB) * 1.0e6 / Total,
      cpu_a_us_per_op => CpuA * 1.0e6 / Total,
      cpu_b_us_per_op => CpuB * 1.0e6 / Total,
      wire_bytes_per_op => Wire / Total,
      sched_util_a => utilisation(Wall0, Wall1),
      peak_mem_mb => maps:get(mem, Peak) / 1048576,
      start_rss_mb => Rss0 / 1048576,
      peak_rss_mb => maps:get(rss, Peak) / 1048576,
      peak_carriers_mb => maps:get(carriers, Peak) / 1048576,
      max_run_queue => maps:get(rq, Peak),
      avg_batch => case Batches of 0 -> 0.0; _ -> Delta(requests) / Batches end,
      bytes_per_write => case Writes of 0 -> 0.0; _ -> Delta(bytes) / Writes end,
      lost => Total - Counted}.

%% Bytes A and B wrote to each other's sockets, both ways (see wire_out/1).
wire(B) ->
    wire_out(B) + erpc:call(B, ?MODULE, wire_out, [node()]).

%% Bytes this node wrote to its sockets towards `Peer': every distribution
%% connection of this node (to the peer, and the peer's C-node links,
%% which carry only ticks this way; the bench's nodes have no others), and
%% this node's own C-node links to the peer when its connection uses them.
%% On TLS distribution the distribution connections are not ports and
%% are not counted.
wire_out(Peer) ->
    Dist = lists:sum([Oct || {_, Port} <- erlang:system_info(dist_ctrl), is_port(Port),
                             {ok, [{send_oct, Oct}]} <- [inet:getstat(Port, [send_oct])]]),
    Links = case ecall:stats(Peer) of
                {ok, #{transport := nif, bytes := Bytes}} -> Bytes;
                _ -> 0
            end,
    Dist + Links.

%% The function each writer calls K times with its receiver and the payload.
operation(native, send, _B) -> fun erlang:send/2;
operation(native, cast, B) -> fun(R, M) -> erpc:cast(B, ?MODULE, deliver, [R, M]) end;
operation(native, call, B) -> fun(R, M) -> ok = erpc:call(B, ?MODULE, deliver, [R, M]) end;
operation(local, send, _B) -> fun erlang:send/2;
operation(local, cast, _B) -> fun(R, M) -> spawn(?MODULE, deliver, [R, M]) end;
operation(local, call, _B) -> fun(R, M) -> ok = erpc:call(node(), ?MODULE, deliver, [R, M]) end;
operation(_Ecall, send, _B) -> fun ecall:send/2;
operation(_Ecall, cast, B) -> fun(R, M) -> ok = ecall:cast(B, ?MODULE, deliver, [R, M]) end;
operation(_Ecall, call, B) -> fun(R, M) -> {ok, ok} = ecall:call(B, ?MODULE, deliver, [R, M]) end.

%% Share of scheduler wall time spent busy on A.
utilisation(W0, W1) ->
    {Active, Total} = lists:foldl(fun({{I, A0, T0}, {I, A1, T1}}, {A, T}) -> {A + A1 - A0, T + T1 - T0} end,
                                  {0, 0}, lists:zip(lists:sort(W0), lists:sort(W1))),
    case Total of 0 -> 0.0; _ -> Active / Total end.

write(_Send, _To, _Payload, 0, _P) ->
    ok;
write(Send, To, Payload, K, P) ->
    Send(To, Payload),
    K > 1 andalso P > 0 andalso timer:sleep(P),
    write(Send, To, Payload, K - 1, P).

%% Counts up to K messages; reports its first-to-last span and how many it
%% really got. A receiver that hears nothing for ?IDLE_MS reports what it
%% has: the point ends, and the missing ones show in `lost'.
-define(IDLE_MS, 30000).
receiver(Agg, K, _) ->
    receive
        _ -> count(Agg, K - 1, erlang:monotonic_time(), 1)
    after ?IDLE_MS ->
        Agg ! {span, 0, 0}
    end.

count(Agg, 0, First, Counted) ->
    Span = erlang:convert_time_unit(erlang:monotonic_time() - First, native, microsecond),
    Agg ! {span, Span, Counted};
count(Agg, K, First, Counted) ->
    receive
        _ -> count(Agg, K - 1, First, Counted + 1)
    after ?IDLE_MS ->
        count(Agg, 0, First, Counted)
    end.

aggregator(Owner, Ref, N) ->
    aggregate(Owner, Ref, N, 0, 0).

aggregate(Owner, Ref, 0, Done, Sum) ->
    %% Every receiver reported: all its messages, or what came before it
    %% gave up waiting.
    Owner ! {Ref, done, Done, Sum};
aggregate(Owner, Ref, N, Done, Sum) ->
    receive {span, S, C} -> aggregate(Owner, Ref, N - 1, Done + C, Sum + S) end.

%% B's counters of its own connection to this node (replies to calls).
back_stats(B) ->
    case erpc:call(B, ecall, stats, [node()]) of
        {ok, S} -> S;
        {error, _} -> #{}
    end.

stats(B) ->
    case ecall:stats(B) of
        {ok, S} -> S;
        {error, _} -> #{}
    end.

sample(#{mem := M, rq := R, rss := Rss, carriers := C} = Acc) ->
    receive
        {stop, From} -> From ! {sampled, Acc}
    after 100 ->
        sample(Acc#{mem := max(M, erlang:memory(total)),
                    rq := max(R, erlang:statistics(total_run_queue_lengths_all)),
                    rss := max(Rss, vm_rss()),
                    carriers := max(C, carriers())})
    end.

%% With ECALL_BENCH_CARRIERS=1: the bytes the emulator's allocators hold
%% from the OS in carriers (multiblock and singleblock, every allocator
%% and instance, as recon_alloc's `allocated`); 0 otherwise. The resident
%% set minus this is memory the emulator's allocators do not hold: the
%% NIF's own (shards, link buffers, tokio's threads), libc's and the
%% code. Off by default: one reading takes about 0.5 ms on an idle node.
carriers() ->
    case os:getenv("ECALL_BENCH_CARRIERS") of
        "1" ->
            lists:sum([Size || A <- erlang:system_info(alloc_util_allocators),
                               {instance, _, Info} <- alloc_sizes(A),
                               {Kind, Props} <- Info, Kind =:= mbcs orelse Kind =:= sbcs,
                               {carriers_size, Size, _, _} <- Props]);
        _ ->
            0
    end.

alloc_sizes(A) ->
    case erlang:system_info({allocator_sizes, A}) of
        L when is_list(L) -> L;
        false -> []
    end.

%% Node A's resident set in bytes (VmRSS of /proc/self/status; 0 where
%% there is none). erlang:memory(total) counts what the emulator
%% allocated, and not the NIF's own memory (its shards, link buffers,
%% tokio's threads), which the system allocator gives: the resident set
%% counts both, and also what the emulator's allocators keep after use.
vm_rss() ->
    case file:read_file("/proc/self/status") of
        {ok, Status} ->
            case [binary_to_integer(string:trim(V, both, " kB\t"))
                  || <<"VmRSS:", V/binary>> <- binary:split(Status, <<"\n">>, [global])] of
                [Kb | _] -> Kb * 1024;
                [] -> 0
            end;
        {error, _} ->
            0
    end.

%% utime + stime of an OS process, from /proc.
cpu_seconds(OsPid) ->
    {ok, Bin} = file:read_file("/proc/" ++ OsPid ++ "/stat"),
    %% The command name may hold spaces: fields count from after its ')'.
    [_, After] = string:split(Bin, ")", trailing),
    Fields = string:lexemes(After, " "),
    UTime = binary_to_integer(lists:nth(12, Fields)),
    STime = binary_to_integer(lists:nth(13, Fields)),
    (UTime + STime) / clock_ticks().

clock_ticks() ->
    case os:cmd("getconf CLK_TCK") of
        "" -> 100;
        S -> list_to_integer(string:trim(S))
    end.

%%--------------------------------------------------------------------
%% Output

-define(COLS, [op, variant, payload, writers, pause_ms, per_writer, intended, rate, elapsed,
               wall, cpu_a, cpu_b, cpu_us_per_op, cpu_a_us_per_op, cpu_b_us_per_op,
               wire_bytes_per_op, sched_util_a, peak_mem_mb, max_run_queue,
               avg_batch, bytes_per_write, lost, start_rss_mb, peak_rss_mb, peak_carriers_mb]).

%% The CPU columns are µs per operation: both nodes, then A and B apart;
%% wire: bytes written between the nodes, both ways, per operation.
print(Rows) ->
    io:format("~n~-5s ~-13s ~7s ~9s ~9s ~7s ~7s ~6s ~6s ~6s ~6s ~8s ~7s ~7s ~8s ~5s ~8s~n",
              ["op", "variant", "writers", "intended", "ops/s", "elapsed", "us/op", "A", "B",
               "wire", "util%", "peak MB", "max rq", "batch", "B/write", "lost", "RSS MB"]),
    [io:format("~-5s ~-13s ~7b ~9b ~9b ~7.1f ~7.2f ~6.2f ~6.2f ~6b ~6.1f ~8.1f ~7b ~7.1f ~8.1f ~5b ~8.1f~n",
               [maps:get(op, R), maps:get(variant, R), maps:get(writers, R),
                round(maps:get(intended, R)), round(maps:get(rate, R)), maps:get(elapsed, R),
                maps:get(cpu_us_per_op, R), maps:get(cpu_a_us_per_op, R),
                maps:get(cpu_b_us_per_op, R), round(maps:get(wire_bytes_per_op, R)),
                100 * maps:get(sched_util_a, R), maps:get(peak_mem_mb, R),
                maps:get(max_run_queue, R), float(maps:get(avg_batch, R)),
                float(maps:get(bytes_per_write, R)), maps:get(lost, R),
                maps:get(peak_rss_mb, R)])
     || R <- Rows],
    ok.

%% bench/results/<date>-<host>/<label>.csv, and PNG plots beside it.
write_results(Label, Rows) ->
    write_csv(Label ++ "-" ++ os:getenv("ECALL_BENCH_PAYLOAD", "map"), ?COLS, Rows).

write_csv(Label, Cols, Rows) ->
    {{Y, Mo, D}, _} = calendar:local_time(),
    [_, Host] = string:split(atom_to_list(node()), "@"),
    Root = case os:getenv("ECALL_BENCH_OUT") of
               false -> "bench/results";
               O -> O
           end,
    Dir = lists:flatten(io_lib:format("~s/~4..0b-~2..0b-~2..0b-~s", [Root, Y, Mo, D, Host])),
    Name = filename:join(Dir, Label ++ ".csv"),
    ok = filelib:ensure_dir(Name),
    Header = lists:join(",", [atom_to_list(C) || C <- Cols]),
    Lines = [lists:join(",", [fmt(maps:get(C, R)) || C <- Cols]) || R <- Rows],
    ok = file:write_file(Name, [Header, $\n, lists:join($\n, Lines), $\n]),
    io:format("~ncsv: ~s~n", [Name]).

fmt(X) when is_atom(X) -> atom_to_list(X);
fmt(X) when is_integer(X) -> integer_to_list(X);
fmt(X) when is_float(X) -> io_lib:format("~.3f", [X]);
fmt(X) when is_list(X) -> X.
