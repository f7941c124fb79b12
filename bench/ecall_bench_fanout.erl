%% The benchmark's `fanout' mode (bench/run.sh fanout): one sender on node
%% A sends the same message to many target processes spread over peers.
%% Run by ecall_bench (node A), with parts run on the peers.
%%
%% Points: 1,000 and 10,000 targets (ECALL_BENCH_FANOUT_TARGETS), spread
%% evenly over 1 and over 3 peers (ECALL_BENCH_FANOUT_PEERS), with a
%% message of 200 B and of 10 KB (ECALL_BENCH_FANOUT_SIZES, bytes; a
%% binary in a small tuple {fanout, Round, Binary}). Per point, every
%% variant (?VARIANTS, or those ECALL_BENCH_VARIANTS names; their order
%% rotates from point to point), each with fresh targets:
%%   native      [P ! M || P <- Pids]
%%   send_many   ecall:send_many(Pids, M)
%%   ecall_send  [ecall:send(P, M) || P <- Pids] (A connected to every
%%               peer by ecall:connect/1, its transport checked to be nif)
%%   manifold    a manifold-style pure-Erlang baseline (written here from
%%               its description, not manifold's code): the sender groups
%%               the pids by node and sends one message per node to a
%%               partitioner on that node, which hashes each pid over one
%%               worker per scheduler of its node (erlang:phash2(Pid, N))
%%               and gives each worker its sub-list; each worker does
%%               [P ! M || P <- Sub]. One partitioner per node and one
%%               worker per pid keep each target's messages in order.
%%   local       not a way to send, a yardstick: each peer's own process
%%               makes its targets' K rounds ([P ! M || P <- Pids]), with
%%               no network and nothing on A. Its CPU per delivered
%%               message is what delivery alone costs the peers, which
%%               any fan-out from A pays too; its us/fan-out is the
%%               peers' own loop (the mean over the peers).
%%
%% The sender makes K fan-outs back to back (K = 1,000,000 div targets for
%% messages up to 1 KB, 500,000 div targets above: 1,000 and 100, 500 and
%% 50; ECALL_BENCH_FANOUT_ROUNDS sets it);
%% a point ends when every target has had all K (each counts, and checks
%% that round numbers come in order; a collector per peer tells A when all
%% of its targets have). Then every target's count is checked: exactly K.
%%
%% Per point and variant: delivered messages per second (targets x K over
%% the wall time from the first send until the last collector's word);
%% the sender's mean time per fan-out (one round's send loop, µs); CPU per
%% delivered message on A and on the peers, by erlang:statistics(runtime)
%% deltas (user CPU of every thread of the OS process, the NIF's own
%% included, ms resolution; it leaves system time out) and, beside it, by
%% utime + stime of /proc/<pid>/stat (user + system, 10 ms resolution);
%% bytes on the wire per delivered message (ecall_send and send_many: the `bytes'
%% deltas of ecall:stats(Peer), summed over peers; native and manifold:
%% send_oct deltas of the distribution socket to each peer, the port of
%% erlang:system_info(dist_ctrl), summed; both are in the CSV for every
%% variant); A's peak erlang:memory(total), sampled every 10 ms.
%%
%% Writes fanout.csv (ecall_bench:write_csv/3). A message lost, doubled or
%% out of order fails the run, after the results are out.
-module(ecall_bench_fanout).

-export([fanout/0]).
%% Run on the peers.
-export([targets_start/4, partitioner_start/0, cpu_now/0, local_rounds/5]).

-import(ecall_bench, [start_b/0, settle/1, write_csv/3]).

%% The variants, in the order of the first point (rotated from point to
%% point).
-define(VARIANTS, [native, ecall_send, manifold, send_many, local]).

-define(PARTITIONER, ecall_bench_fanout_partitioner).
%% The longest a point may take from its last send until every target has
%% all its messages, before it is called lost.
-define(DELIVERY_WAIT, 120000).
-define(SAMPLE_MS, 10).

-type variant() :: native | ecall_send | manifold | send_many | local.
%% A point's result, one variant (the CSV's columns and a few more).
-type row() :: #{atom() => term()}.
%% CPU of one node at one moment: {statistics(runtime) ms, /proc user+sys s}.
-type cpu() :: {non_neg_integer(), float()}.
%% What one peer's collector found in its targets' counts.
-type tally() :: #{received := non_neg_integer(), short := non_neg_integer(),
                   over := non_neg_integer(), misordered := non_neg_integer()}.

-spec fanout() -> ok.
fanout() ->
    TargetCounts = int_list("ECALL_BENCH_FANOUT_TARGETS", [1000, 10000]),
    PeerCounts = int_list("ECALL_BENCH_FANOUT_PEERS", [1, 3]),
    Sizes = int_list("ECALL_BENCH_FANOUT_SIZES", [200, 10240]),
    Variants = variants(),
    Peers = [start_b() || _ <- lists:seq(1, lists:max(PeerCounts))],
    Nodes = [N || {_, N} <- Peers],
    ok = connect_all(Nodes),
    [ok = erpc:call(N, ?MODULE, partitioner_start, []) || N <- Nodes],
    io:format("fanout: A=~p (~b schedulers), peers ~p (~w schedulers), OTP ~s; "
              "targets ~w over ~w peers, messages ~w B, variants ~w~n",
              [node(), erlang:system_info(schedulers_online), Nodes,
               [erpc:call(N, erlang, system_info, [schedulers_online]) || N <- Nodes],
               erlang:system_info(otp_release), TargetCounts, PeerCounts, Sizes, Variants]),
    Points = [{P, T, S} || P <- PeerCounts, T <- TargetCounts, S <- Sizes],
    {Rows, _} = lists:mapfoldl(
                  fun({P, T, S}, I) ->
                          Used = lists:sublist(Nodes, P),
                          Rs = [run_point(Used, T, S, rounds(T, S), V)
                                || V <- rotate(Variants, I)],
                          {Rs, I + 1}
                  end, 0, Points),
    All = lists:append(Rows),
    print(All),
    write_csv("fanout", csv_cols(), [csv_row(R) || R <- All]),
    %% ecall's links closed first: fewer `link down' reports as peers stop.
    [ecall:disconnect(N) || N <- Nodes],
    [peer:stop(Pid) || {Pid, _} <- Peers],
    case [{V, P, T, S} || #{variant := V, peers := P, targets := T, msg_bytes := S,
                            lost := L, duplicated := D, misordered := M} <- All,
                          L + D + M > 0] of
        [] -> ok;
        Bad -> erlang:error({not_exact, Bad})
    end.

%% A comma-separated list of integers from the environment, or the default.
-spec int_list(string(), [pos_integer()]) -> [pos_integer()].
int_list(Var, Default) ->
    case os:getenv(Var) of
        false -> Default;
        S -> [list_to_integer(string:trim(X)) || X <- string:split(S, ",", all), X =/= ""]
    end.

%% ?VARIANTS, or those ECALL_BENCH_VARIANTS names, in its order.
-spec variants() -> [variant()].
variants() ->
    case os:getenv("ECALL_BENCH_VARIANTS") of
        false -> ?VARIANTS;
        Vs -> [V || Name <- string:split(Vs, ",", all), V <- ?VARIANTS,
                    atom_to_list(V) =:= Name]
    end.

%% Rounds per point: ECALL_BENCH_FANOUT_ROUNDS, else 1,000,000 deliveries
%% for messages up to 1 KB, 500,000 for larger ones, so that the fastest
%% variants run for a few tenths of a second, not a few hundredths (the
%% `wall_s' column of the run's CSV).
-spec rounds(pos_integer(), pos_integer()) -> pos_integer().
rounds(Targets, Size) ->
    Deliveries = case Size =< 1024 of true -> 1000000; false -> 500000 end,
    case os:getenv("ECALL_BENCH_FANOUT_ROUNDS") of
        false -> max(1, Deliveries div Targets);
        K -> list_to_integer(K)
    end.

%% The list turned left by N places.
-spec rotate([variant()], non_neg_integer()) -> [variant()].
rotate([], _N) -> [];
rotate(L, N) ->
    {H, T} = lists:split(N rem length(L), L),
    T ++ H.

%% ecall from A to every peer, by the NIF transport.
-spec connect_all([node()]) -> ok.
connect_all(Nodes) ->
    [begin
         ok = ecall:connect(N),
         {ok, #{transport := nif}} = ecall:stats(N)
     end || N <- Nodes],
    ok.

%%--------------------------------------------------------------------
%% One point by one variant.

-spec run_point([node()], pos_integer(), pos_integer(), pos_integer(), variant()) -> row().
run_point(Nodes, Targets, Size, K, Variant) ->
    Ref = make_ref(),
    Self = self(),
    PerNode = spread(Targets, length(Nodes)),
    Started = [{N, erpc:call(N, ?MODULE, targets_start, [Self, Ref, Count, K], 60000)}
               || {N, Count} <- lists:zip(Nodes, PerNode)],
    Pids = lists:append([Ps || {_, {_, Ps}} <- Started]),
    Bin = binary:copy(<<"f">>, Size),
    Sender = spawn_link(fun() -> sender(Self, Ref, Variant, Pids, Bin, K) end),
    [ok = settle(N) || N <- Nodes],
    Cpu0 = cpu_all(Nodes),
    Dist0 = dist_bytes(Nodes),
    Ecall0 = ecall_bytes(Nodes),
    Sampler = spawn_link(fun() -> sample(erlang:memory(total)) end),
    T0 = erlang:monotonic_time(),
    Sender ! {go, Ref},
    SendUs = receive {sent, Ref, Us} -> Us end,
    Done = wait_done(Ref, length(Nodes)),
    T1 = erlang:monotonic_time(),
    Cpu1 = cpu_all(Nodes),
    Dist1 = dist_bytes(Nodes),
    Ecall1 = ecall_bytes(Nodes),
    Sampler ! {stop, self()},
    PeakMem = receive {peak, Sampler, Peak} -> Peak end,
    Tallies = [{N, tally(Collector)} || {N, {Collector, _}} <- Started],
    Wall = erlang:convert_time_unit(T1 - T0, native, microsecond) / 1.0e6,
    Expected = Targets * K,
    Received = lists:sum([R || {_, #{received := R}} <- Tallies]),
    Over = lists:sum([O || {_, #{over := O}} <- Tallies]),
    Short = lists:sum([S || {_, #{short := S}} <- Tallies]),
    Misordered = lists:sum([M || {_, #{misordered := M}} <- Tallies]),
    Delivered = max(1, Received),
    {CpuA0, ProcA0} = maps:get(node(), Cpu0),
    {CpuA1, ProcA1} = maps:get(node(), Cpu1),
    PeerCpu = [{(element(1, maps:get(N, Cpu1)) - element(1, maps:get(N, Cpu0))) * 1000,
                (element(2, maps:get(N, Cpu1)) - element(2, maps:get(N, Cpu0))) * 1.0e6,
                Count * K}
               || {N, Count} <- lists:zip(Nodes, PerNode)],
    DistBytes = Dist1 - Dist0,
    EcallBytes = Ecall1 - Ecall0,
    Wire = case Variant of
               ecall_send -> EcallBytes;
               send_many -> EcallBytes;
               _ -> DistBytes
           end,
    Row = #{variant => Variant, peers => length(Nodes), targets => Targets,
            msg_bytes => Size, encoded_bytes => erlang:external_size({fanout, K, Bin}),
            rounds => K, expected => Expected, delivered => Received,
            complete => Done, wall_s => Wall, msgs_per_s => Received / Wall,
            send_us_per_fanout => SendUs / K,
            cpu_a_us_per_msg => (CpuA1 - CpuA0) * 1000 / Delivered,
            cpu_peers_us_per_msg => lists:sum([C || {C, _, _} <- PeerCpu]) / Delivered,
            cpu_peer_us_per_msg => [C / max(1, M) || {C, _, M} <- PeerCpu],
            cpu_a_sys_us_per_msg => (ProcA1 - ProcA0) * 1.0e6 / Delivered,
            cpu_peers_sys_us_per_msg => lists:sum([C || {_, C, _} <- PeerCpu]) / Delivered,
            wire_bytes_per_msg => Wire / Delivered,
            wire_source => case Variant of
                               ecall_send -> ecall;
                               send_many -> ecall;
                               _ -> dist
                           end,
            dist_bytes_per_msg => DistBytes / Delivered,
            ecall_bytes_per_msg => EcallBytes / Delivered,
            peak_mem_a_mb => PeakMem / 1048576,
            lost => Short, duplicated => Over, misordered => Misordered},
    io:format("  ~b peer(s), ~b targets, ~b B, ~s: ~.1fk msg/s, ~.1f us/fan-out, "
              "~.2f s, ~b B/msg on the wire~s~n",
              [length(Nodes), Targets, Size, Variant, Received / Wall / 1000, SendUs / K,
               Wall, round(Wire / Delivered),
               case Short + Over + Misordered of
                   0 -> "";
                   _ -> io_lib:format(", LOST ~b DUPLICATED ~b MISORDERED ~b",
                                      [Short, Over, Misordered])
               end]),
    Row.

%% Targets over nodes: as even as can be, the first nodes taking the rest.
-spec spread(pos_integer(), pos_integer()) -> [non_neg_integer()].
spread(Targets, Nodes) ->
    [Targets div Nodes + case I =< Targets rem Nodes of true -> 1; false -> 0 end
     || I <- lists:seq(1, Nodes)].

%% The sender: on `go', K fan-outs of {fanout, Round, Bin} back to back;
%% tells the owner the µs its send loops took in all. For `local', each
%% peer's own process makes its node's K rounds (local_rounds/5), and the
%% time is theirs, the mean over the peers.
-spec sender(pid(), reference(), variant(), [pid()], binary(), pos_integer()) -> ok.
sender(Owner, Ref, local, Pids, Bin, K) ->
    receive {go, Ref} -> ok end,
    Self = self(),
    Groups = maps:groups_from_list(fun erlang:node/1, Pids),
    maps:foreach(fun(Node, Sub) ->
                         erpc:cast(Node, ?MODULE, local_rounds, [Self, Ref, Sub, Bin, K])
                 end, Groups),
    Us = [receive {local_us, Ref, U} -> U end || _ <- maps:keys(Groups)],
    Owner ! {sent, Ref, lists:sum(Us) div length(Us)},
    ok;
sender(Owner, Ref, Variant, Pids, Bin, K) ->
    receive {go, Ref} -> ok end,
    Us = lists:foldl(fun(Round, Acc) ->
                             Msg = {fanout, Round, Bin},
                             S0 = erlang:monotonic_time(),
                             ok = fan_out(Variant, Pids, Msg),
                             S1 = erlang:monotonic_time(),
                             Acc + erlang:convert_time_unit(S1 - S0, native, microsecond)
                     end, 0, lists:seq(1, K)),
    Owner ! {sent, Ref, Us},
    ok.

%% One fan-out of Msg to every pid, by the variant.
-spec fan_out(variant(), [pid()], term()) -> ok.
fan_out(native, Pids, Msg) ->
    _ = [P ! Msg || P <- Pids],
    ok;
fan_out(ecall_send, Pids, Msg) ->
    _ = [ecall:send(P, Msg) || P <- Pids],
    ok;
fan_out(send_many, Pids, Msg) ->
    ecall:send_many(Pids, Msg);
fan_out(manifold, Pids, Msg) ->
    maps:foreach(fun(Node, Sub) -> {?PARTITIONER, Node} ! {fan_out, Sub, Msg} end,
                 maps:groups_from_list(fun erlang:node/1, Pids)),
    ok.

%% Waits for each node's collector to say all its targets have every
%% message; false if one did not within ?DELIVERY_WAIT.
-spec wait_done(reference(), non_neg_integer()) -> boolean().
wait_done(_Ref, 0) ->
    true;
wait_done(Ref, N) ->
    receive
        {fanout_done, Ref, _Node} -> wait_done(Ref, N - 1)
    after ?DELIVERY_WAIT ->
            false
    end.

%% A's erlang:memory(total), every ?SAMPLE_MS, the highest seen.
-spec sample(non_neg_integer()) -> ok.
sample(Peak) ->
    receive
        {stop, From} -> From ! {peak, self(), max(Peak, erlang:memory(total))}, ok
    after ?SAMPLE_MS ->
            sample(max(Peak, erlang:memory(total)))
    end.

%% The CPU of A and of every node given.
-spec cpu_all([node()]) -> #{node() => cpu()}.
cpu_all(Nodes) ->
    maps:from_list([{node(), cpu_now()} | [{N, erpc:call(N, ?MODULE, cpu_now, [])} || N <- Nodes]]).

%% This node's CPU: statistics(runtime) (ms) and /proc utime + stime (s).
-spec cpu_now() -> cpu().
cpu_now() ->
    {Runtime, _} = erlang:statistics(runtime),
    {ok, Bin} = file:read_file("/proc/self/stat"),
    [_, After] = string:split(Bin, ")", trailing),
    Fields = string:lexemes(After, " "),
    Ticks = binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)),
    %% USER_HZ, 100 on Linux.
    {Runtime, Ticks / 100}.

%% Bytes sent so far on the distribution sockets to the nodes given
%% (TCP distribution: the controller is the socket's port).
-spec dist_bytes([node()]) -> non_neg_integer().
dist_bytes(Nodes) ->
    Ctrl = erlang:system_info(dist_ctrl),
    lists:sum([begin
                   {N, Port} = lists:keyfind(N, 1, Ctrl),
                   {ok, [{send_oct, B}]} = inet:getstat(Port, [send_oct]),
                   B
               end || N <- Nodes]).

%% Bytes ecall's links have sent so far to the nodes given.
-spec ecall_bytes([node()]) -> non_neg_integer().
ecall_bytes(Nodes) ->
    lists:sum([begin
                   {ok, #{transport := nif, bytes := B}} = ecall:stats(N),
                   B
               end || N <- Nodes]).

%% What a peer's collector found: asks it and waits (it then stops its
%% targets and ends).
-spec tally(pid()) -> tally().
tally(Collector) ->
    Mon = monitor(process, Collector),
    Collector ! {tally, self()},
    receive
        {tally, Collector, T} -> demonitor(Mon, [flush]), T;
        {'DOWN', Mon, _, _, Why} -> erlang:error({collector_down, Why})
    after 60000 -> erlang:error(tally_timeout)
    end.

%%--------------------------------------------------------------------
%% On the peers.

%% Starts a collector with Count targets, each expecting K messages; the
%% collector tells Owner {fanout_done, Ref, node()} once all have them.
-spec targets_start(pid(), reference(), non_neg_integer(), pos_integer()) -> {pid(), [pid()]}.
targets_start(Owner, Ref, Count, K) ->
    Self = self(),
    Collector = spawn(fun() ->
                              Me = self(),
                              Ts = [spawn(fun() -> target(Me, K, 1, 0, 0) end)
                                    || _ <- lists:seq(1, Count)],
                              Self ! {targets, Me, Ts},
                              collect(Owner, Ref, K, Ts, Count)
                      end),
    receive {targets, Collector, Ts} -> {Collector, Ts} end.

%% A target: counts the messages, checks that rounds come in order (Next is
%% the round expected), tells the collector when it has K.
-spec target(pid(), pos_integer(), pos_integer(), non_neg_integer(), non_neg_integer()) -> ok.
target(Collector, K, Next, Count, Misordered) ->
    receive
        {fanout, Round, _Bin} ->
            Count1 = Count + 1,
            Count1 =:= K andalso (Collector ! {have_all, self()}),
            Mis = case Round of Next -> Misordered; _ -> Misordered + 1 end,
            target(Collector, K, Round + 1, Count1, Mis);
        {count, From} ->
            From ! {count, self(), Count, Misordered},
            target(Collector, K, Next, Count, Misordered);
        stop ->
            ok
    end.

%% The collector: waits for every target to have all its messages (Left
%% to go), tells the owner, then on {tally, From} gathers every target's
%% count, answers, and stops the targets.
-spec collect(pid(), reference(), pos_integer(), [pid()], non_neg_integer()) -> ok.
collect(Owner, Ref, K, Ts, 0) ->
    Owner ! {fanout_done, Ref, node()},
    receive {tally, From} -> tally_and_stop(From, K, Ts) end;
collect(Owner, Ref, K, Ts, Left) ->
    receive
        {have_all, _} -> collect(Owner, Ref, K, Ts, Left - 1);
        {tally, From} -> tally_and_stop(From, K, Ts)
    end.

%% Every target's count against K: messages received, missing (short),
%% beyond K (over) and out of order; the targets stop.
-spec tally_and_stop(pid(), pos_integer(), [pid()]) -> ok.
tally_and_stop(From, K, Ts) ->
    [T ! {count, self()} || T <- Ts],
    Counts = [receive {count, T, C, M} -> {C, M} end || T <- Ts],
    [T ! stop || T <- Ts],
    From ! {tally, self(), #{received => lists:sum([C || {C, _} <- Counts]),
                             short => lists:sum([max(0, K - C) || {C, _} <- Counts]),
                             over => lists:sum([max(0, C - K) || {C, _} <- Counts]),
                             misordered => lists:sum([M || {_, M} <- Counts])}},
    ok.

%% On each peer: the manifold partitioner, registered, with one worker per
%% scheduler of its node.
-spec partitioner_start() -> ok.
partitioner_start() ->
    Self = self(),
    Pid = spawn(fun() ->
                        true = register(?PARTITIONER, self()),
                        Workers = list_to_tuple(
                                    [spawn_link(fun worker/0)
                                     || _ <- lists:seq(1, erlang:system_info(schedulers_online))]),
                        Self ! {partitioner, self()},
                        partitioner(Workers)
                end),
    receive {partitioner, Pid} -> ok end.

%% Splits each fan-out's pids over the workers by hash, one message each.
-spec partitioner(tuple()) -> no_return().
partitioner(Workers) ->
    receive
        {fan_out, Pids, Msg} ->
            N = tuple_size(Workers),
            Subs = lists:foldl(fun(P, Acc) ->
                                       I = erlang:phash2(P, N) + 1,
                                       setelement(I, Acc, [P | element(I, Acc)])
                               end, erlang:make_tuple(N, []), Pids),
            [element(I, Workers) ! {fan_out, element(I, Subs), Msg}
             || I <- lists:seq(1, N), element(I, Subs) =/= []],
            partitioner(Workers)
    end.

%% On a peer, the `local' variant: K rounds of [P ! M || P <- Pids] by a
%% process of the targets' own node, no network; tells From the µs taken.
-spec local_rounds(pid(), reference(), [pid()], binary(), pos_integer()) -> ok.
local_rounds(From, Ref, Pids, Bin, K) ->
    T0 = erlang:monotonic_time(),
    lists:foreach(fun(Round) -> ok = fan_out(native, Pids, {fanout, Round, Bin}) end,
                  lists:seq(1, K)),
    Us = erlang:convert_time_unit(erlang:monotonic_time() - T0, native, microsecond),
    From ! {local_us, Ref, Us},
    ok.

-spec worker() -> no_return().
worker() ->
    receive
        {fan_out, Sub, Msg} ->
            _ = [P ! Msg || P <- Sub],
            worker()
    end.

%%--------------------------------------------------------------------
%% Output

-spec print([row()]) -> ok.
print(Rows) ->
    io:format("~nfanout: one sender on A to every target, K rounds; per delivered message "
              "unless said.~n"
              "cpu: erlang:statistics(runtime) deltas (user CPU, all threads), us/msg; "
              "peers: all peers' sum per message (each peer's own in the CSV);~n"
              "+sys: the same from /proc utime+stime; wire: ecall's `bytes' (ecall_send, send_many) "
              "or the dist sockets' send_oct (native, manifold)~n~n"),
    io:format("~5s ~7s ~6s ~-11s ~6s ~9s ~11s ~7s ~7s ~8s ~8s ~8s ~8s ~8s ~6s~n",
              ["peers", "targets", "bytes", "variant", "rounds", "msg/s", "us/fan-out",
               "cpuA", "cpuP", "cpuA+sys", "cpuP+sys", "wire B", "peak MB", "wall s",
               "exact"]),
    [io:format("~5b ~7b ~6b ~-11s ~6b ~9b ~11.1f ~7.2f ~7.2f ~8.2f ~8.2f ~8.1f ~8.1f ~8.2f ~6s~n",
               [P, T, S, V, K, round(Rate), SendUs, CA, CP, CAS, CPS, Wire, Mem, Wall,
                case L + D + M of 0 -> "yes"; _ -> "NO" end])
     || #{peers := P, targets := T, msg_bytes := S, variant := V, rounds := K,
          msgs_per_s := Rate, send_us_per_fanout := SendUs, cpu_a_us_per_msg := CA,
          cpu_peers_us_per_msg := CP, cpu_a_sys_us_per_msg := CAS,
          cpu_peers_sys_us_per_msg := CPS, wire_bytes_per_msg := Wire,
          peak_mem_a_mb := Mem, wall_s := Wall, lost := L, duplicated := D,
          misordered := M} <- Rows],
    ok.

-spec csv_cols() -> [atom()].
csv_cols() ->
    [peers, targets, msg_bytes, encoded_bytes, variant, rounds, expected, delivered, complete,
     wall_s, msgs_per_s, send_us_per_fanout, cpu_a_us_per_msg, cpu_peers_us_per_msg,
     cpu_peer_us_per_msg, cpu_a_sys_us_per_msg, cpu_peers_sys_us_per_msg,
     wire_bytes_per_msg, wire_source, dist_bytes_per_msg, ecall_bytes_per_msg,
     peak_mem_a_mb, lost, duplicated, misordered].

%% The row with its values as write_csv/3 takes them (each peer's CPU per
%% message joined by `;').
-spec csv_row(row()) -> row().
csv_row(#{cpu_peer_us_per_msg := PerPeer} = R) ->
    R#{cpu_peer_us_per_msg := lists:flatten(lists:join(";", [io_lib:format("~.3f", [C])
                                                            || C <- PerPeer]))}.
