%% The benchmark's `big' mode (bench/run.sh big): terms of tens of MB,
%% by ecall:send/2 and by `!', and what they cost both nodes on the way.
%% Run by ecall_bench (node A), with parts run on node B.
-module(ecall_bench_big).

-export([big/0]).
%% Run on B (and its watchers on A too).
-export([term_sink_start/1, rx_memory/0, probe_sink_start/0, probe_result/1]).

-import(ecall_bench, [start_b/0, chosen/1, settle/1, ready/2, vm_rss/0, write_csv/3]).
%%--------------------------------------------------------------------
%% Big terms: what terms of tens of MB cost both nodes on the way, by
%% ecall:send/2 and by `!', side by side. Variants: native and ecall_nif
%% (ECALL_BENCH_VARIANTS may name ecall_erlang too, and sets the order);
%% ECALL_BENCH_ROUNDS rounds (default 2), the variants' order alternating
%% from round to round; ECALL_BENCH_BIG_SCALE (default 1.0) scales every
%% term's size (0.1 for a quick run).
%%
%% Phase 1 (terms): five big terms built on A beforehand (big_terms/1)
%% go one after another to a registered sink on B. Per term: the time
%% from the send on A until the sink has it, how long the send call
%% itself took, and whether it arrived intact (erlang:phash2/1 on B
%% against A's). After it, on B: the heaps of ecall's receiver workers
%% (nobody collects them: does the memory come back by itself?) and
%% erlang:memory(total), before the phase, right after it and 2 s later.
%%
%% Phase 2 (burst): 20 senders at once, each with 3 terms of 0.5-5 MB
%% (encoded) built beforehand, to one sink on B: the time from the start
%% until all 60 arrived, all intact.
%%
%% While each phase runs, on both nodes: a 1 ms ticker's worst lateness
%% (wake-up minus planned) and the long_schedule events of
%% erlang:system_monitor/2 (a process or port that ran 10 ms or more
%% without a break): how many, the longest, and which process, where.
%%
%% Each node's Erlang monotonic clock counts from a start of its own (one
%% host or not), so B's arrival times are moved onto A's clock by an
%% offset measured by round trips (clock_offset/1) before each phase.
%%
%% Terms are held by processes that do nothing else (term_holder/1,
%% burst_sender/3), with the terms moved to their old heap beforehand
%% (old_heap/0), so that what the phases see is the transport's work and
%% not a collection of the bench's own copies. The sink timestamps and
%% answers at once, and hashes only when asked, after the deliveries
%% measured.

-define(BIG_SINK, ecall_bench_big_sink).
%% The longest a term may take to arrive before the run fails.
-define(BIG_WAIT, 300000).
-define(BURST_SENDERS, 20).
-define(BURST_TERMS, 3).
%% The worst long_schedule events printed per node and run (the CSV has all).
-define(WORST_SHOWN, 3).

%% What a node's watcher saw during one phase.
-type watched() :: ecall_test_nodes:watched().
%% B's memory at one moment (rx_memory/0).
-type b_memory() :: #{rx_heap_bytes := non_neg_integer(), rx_heap_max_bytes := non_neg_integer(),
                      b_memory_bytes := non_neg_integer(), b_rss_bytes := non_neg_integer()}.
-type term_result() :: #{term := atom(), bytes := non_neg_integer(), send_ms := float(),
                         delivery_ms := float(), intact := boolean()}.
%% One phase run by one variant; phase 1's has `terms' and `memory', phase
%% 2's `total_s', `bytes' and `intact'.
-type big_run() :: #{phase := terms | burst, round := pos_integer(), variant := atom(),
                     a := watched(), b := watched(), atom() => term()}.
%% A process holding terms to send, and per term: {Name or index, Hash, Bytes}.
-type holder() :: {pid(), [{term(), integer(), non_neg_integer()}]}.

-spec big() -> ok.
big() ->
    {Peer, B} = start_b(),
    Scale = big_scale(),
    Rounds = list_to_integer(os:getenv("ECALL_BENCH_ROUNDS", "2")),
    Variants = big_variants(),
    io:format("big: A=~p B=~p, OTP ~s, ~b schedulers, ~b ecall receivers on B, scale ~p, "
              "~b rounds of ~w~n",
              [node(), B, erlang:system_info(otp_release), erlang:system_info(schedulers),
               erpc:call(B, ecall_config, receivers, []), Scale, Rounds, Variants]),
    {_, HeldTerms} = Holder = term_holder(Scale),
    io:format("phase 1 terms (encoded MB): ~s~n",
              [lists:join(", ", [io_lib:format("~s ~.1f", [Name, Bytes / 1.0e6])
                                 || {Name, _, Bytes} <- HeldTerms])]),
    Senders = burst_senders(Scale),
    BurstBytes = lists:sum([Bytes || {_, Terms} <- Senders, {_, _, Bytes} <- Terms]),
    io:format("phase 2 terms: ~b senders x ~b, ~.1f MB in all~n",
              [?BURST_SENDERS, ?BURST_TERMS, BurstBytes / 1.0e6]),
    idle_watch(B),
    Runs = lists:append([big_round(B, Holder, Senders, R, alternate(Variants, R))
                         || R <- lists:seq(1, Rounds)]),
    Terms = [Run || #{phase := terms} = Run <- Runs],
    Bursts = [Run || #{phase := burst} = Run <- Runs],
    print_terms(Terms, [Name || {Name, _, _} <- HeldTerms]),
    print_b_memory(Terms),
    print_bursts(Bursts),
    print_long_schedules(Runs),
    write_big_csvs(Runs),
    [P ! stop || {P, _} <- [Holder | Senders]],
    peer:stop(Peer),
    %% A term that arrived changed fails the run, after the results are out.
    case [{Phase, R, V} || #{phase := Phase, round := R, variant := V} = Run <- Runs,
                           not run_intact(Run)] of
        [] -> ok;
        Bad -> erlang:error({not_intact, Bad})
    end.

%% ECALL_BENCH_BIG_SCALE, an integer or a float.
-spec big_scale() -> float().
big_scale() ->
    S = os:getenv("ECALL_BENCH_BIG_SCALE", "1.0"),
    case string:to_float(S) of
        {F, []} -> F;
        _ -> float(list_to_integer(S))
    end.

%% native and ecall_nif, or those ECALL_BENCH_VARIANTS names.
-spec big_variants() -> [atom()].
big_variants() ->
    case os:getenv("ECALL_BENCH_VARIANTS") of
        false -> [native, ecall_nif];
        _ -> chosen([native, ecall_nif, ecall_erlang])
    end.

%% The variants in their order in odd rounds, reversed in even ones.
-spec alternate([atom()], pos_integer()) -> [atom()].
alternate(Variants, Round) when Round rem 2 =:= 1 -> Variants;
alternate(Variants, _Round) -> lists:reverse(Variants).

%% Both nodes watched for a second with nothing to do: the floor of the
%% ticker's lateness on this machine, to read the phases' against.
-spec idle_watch(node()) -> ok.
idle_watch(B) ->
    settle(B),
    Watchers = watch([node(), B]),
    timer:sleep(1000),
    [A, BW] = watched(Watchers),
    io:format("idle for 1 s: late A ~.1f ms, late B ~.1f ms, long A ~s, long B ~s~n",
              [maps:get(lateness_ms, A), maps:get(lateness_ms, BW), long_cell(A), long_cell(BW)]).

%% Phase 1 by every variant in turn, then phase 2 in the reverse order
%% (so that no variant's phase 2 always follows its own phase 1).
-spec big_round(node(), holder(), [holder()], pos_integer(), [atom()]) -> [big_run()].
big_round(B, Holder, Senders, Round, Variants) ->
    Terms = [terms_run(B, Holder, Round, V) || V <- Variants],
    Terms ++ [burst_run(B, Senders, Round, V) || V <- lists:reverse(Variants)].

%% The five terms, built by the caller (Scale times the counts).
-spec big_terms(float()) -> [{atom(), term()}].
big_terms(Scale) ->
    N = fun(Count) -> max(1, round(Count * Scale)) end,
    [{list_tuples, [{I, I + 1} || I <- lists:seq(1, N(5000000))]},
     {map, maps:from_list([{I, I} || I <- lists:seq(1, N(1000000))])},
     {list_bins, [{I, <<"abcdefgh">>} || I <- lists:seq(1, N(3000000))]},
     {float_lists, [[float(I), I / 2, I / 3] || I <- lists:seq(1, N(1000000))]},
     {tuple, list_to_tuple(lists:seq(1, N(2000000)))}].

%% A process holding the five terms (built there, hashed and measured),
%% which sends one when told (hold/1).
-spec term_holder(float()) -> holder().
term_holder(Scale) ->
    Self = self(),
    Pid = spawn_link(fun() ->
                             %% Named, for the long_schedule events.
                             true = register(ecall_bench_big_holder, self()),
                             Terms = [{Name, T, erlang:phash2(T), erlang:external_size(T)}
                                      || {Name, T} <- big_terms(Scale)],
                             old_heap(),
                             Self ! {held, self(), [{Name, H, Bytes} || {Name, _, H, Bytes} <- Terms]},
                             hold(Terms)
                     end),
    receive {held, Pid, Held} -> {Pid, Held} end.

-spec hold([{atom(), term(), integer(), non_neg_integer()}]) -> ok.
hold(Terms) ->
    receive
        {send, From, Tag, Variant, To, Name} ->
            {Name, T, _, _} = lists:keyfind(Name, 1, Terms),
            From ! {sent, Tag, timed_send(Variant, To, {big, Tag, T})},
            hold(Terms);
        stop ->
            ok
    end.

%% Once the caller's terms are built: a full collection, then a minor one,
%% which moves them all to the old heap; the young collections that the
%% sends cause later then copy nothing of them.
-spec old_heap() -> true.
old_heap() ->
    true = garbage_collect(),
    garbage_collect(self(), [{type, minor}]).

%% Sends by the variant; the monotonic times (µs) before and after the call.
-spec timed_send(atom(), {atom(), node()}, term()) -> {integer(), integer()}.
timed_send(Variant, To, Msg) ->
    T0 = erlang:monotonic_time(microsecond),
    _ = case Variant of
            native -> To ! Msg;
            _ -> ecall:send(To, Msg)
        end,
    {T0, erlang:monotonic_time(microsecond)}.

%% The burst's senders: ?BURST_SENDERS processes, each holding
%% ?BURST_TERMS lists of tuples (of 1 to 4 integers) of 0.5-5 MB encoded
%% (times Scale; the same sizes in every run).
-spec burst_senders(float()) -> [holder()].
burst_senders(Scale) ->
    {Sizes, _} = lists:mapfoldl(fun(_, S0) ->
                                        {U, S1} = rand:uniform_s(S0),
                                        {round((500000 + U * 4500000) * Scale), S1}
                                end, rand:seed_s(exsss, {20, 3, 1}),
                                lists:seq(1, ?BURST_SENDERS * ?BURST_TERMS)),
    Self = self(),
    Pids = [spawn_link(fun() -> burst_sender(Self, I, lists:sublist(Sizes, I * 3 - 2, 3)) end)
            || I <- lists:seq(1, ?BURST_SENDERS)],
    [receive {held, P, Held} -> {P, Held} end || P <- Pids].

%% One burst sender: builds its terms, then sends them all, back to back,
%% each time it is told to go.
-spec burst_sender(pid(), pos_integer(), [non_neg_integer()]) -> ok.
burst_sender(Owner, Index, Sizes) ->
    true = register(list_to_atom("ecall_bench_burst_" ++ integer_to_list(Index)), self()),
    %% About 14.5 bytes an element: a tuple of 2.5 integers on average.
    Terms = [begin
                 T = [list_to_tuple(lists:seq(I, I + I rem 4))
                      || I <- lists:seq(Index * 10000000 + J * 1000000,
                                        Index * 10000000 + J * 1000000 + round(Bytes / 14.5))],
                 {J, T, erlang:phash2(T), erlang:external_size(T)}
             end || {J, Bytes} <- lists:enumerate(Sizes)],
    old_heap(),
    Owner ! {held, self(), [{J, H, Bytes} || {J, _, H, Bytes} <- Terms]},
    burst_loop(Terms).

-spec burst_loop([{pos_integer(), term(), integer(), non_neg_integer()}]) -> ok.
burst_loop(Terms) ->
    receive
        {go, From, Ref, Variant, To} ->
            [timed_send(Variant, To, {big, {Ref, self(), J}, T}) || {J, T, _, _} <- Terms],
            From ! {burst_sent, Ref, self()},
            burst_loop(Terms);
        stop ->
            ok
    end.

%% Phase 1 by one variant.
-spec terms_run(node(), holder(), pos_integer(), atom()) -> big_run().
terms_run(B, {Holder, Held}, Round, Variant) ->
    ready(B, Variant),
    Sink = term_sink(B),
    Before = erpc:call(B, ?MODULE, rx_memory, []),
    Offset = clock_offset(B),
    Watchers = watch([node(), B]),
    ProbeSink = erpc:call(B, ?MODULE, probe_sink_start, []),
    ProbeVariant = case os:getenv("ECALL_BENCH_PROBE") of
                       "native" -> native;
                       _ -> Variant
                   end,
    Probe = spawn_link(fun() -> probe(ProbeVariant, ProbeSink) end),
    Terms = [deliver_term(B, Sink, Holder, Variant, Name, Hash, Offset)
             || {Name, Hash, _} <- Held],
    [A, BW] = watched(Watchers),
    Probed = probe_stop(B, Probe, ProbeSink, Offset),
    After = erpc:call(B, ?MODULE, rx_memory, []),
    timer:sleep(2000),
    Later = erpc:call(B, ?MODULE, rx_memory, []),
    stop_sink(Sink),
    io:format("  [round ~b] terms ~s: ~s~n",
              [Round, Variant, lists:join(", ", [io_lib:format("~s ~b ms", [N, round(D)])
                                                 || #{term := N, delivery_ms := D} <- Terms])]),
    #{phase => terms, round => Round, variant => Variant, a => A, b => BW, terms => Terms,
      probe => Probed, memory => #{before => Before, 'after' => After, after_2s => Later}}.

%% The small-message probe of phase 1: another process of A sends a small
%% message every millisecond, by the same variant, to a process of B that
%% keeps the longest time one took (B's clock minus A's at the send; the
%% offset between the clocks is taken out on A). How long the big terms
%% hold up a small message from another caller.
-spec probe(atom(), pid()) -> ok.
probe(Variant, Sink) ->
    receive
        {stop, From} ->
            _ = timed_send(Variant, Sink, {probe_done, From}),
            ok
    after 1 ->
            _ = timed_send(Variant, Sink, {probe, erlang:monotonic_time(microsecond)}),
            probe(Variant, Sink)
    end.

%% Stops the probe; its sink's {longest delay in ms, messages} once the
%% probe's last message arrived (so that every one was counted).
-spec probe_stop(node(), pid(), pid(), integer()) -> #{probe_max_ms := float(), probes := non_neg_integer()}.
probe_stop(B, Probe, Sink, Offset) ->
    Probe ! {stop, self()},
    receive {probe_done, Sink} -> ok after ?BIG_WAIT -> erlang:error(probe_lost) end,
    {Longest, N} = erpc:call(B, ?MODULE, probe_result, [Sink]),
    #{probe_max_ms => (Longest - Offset) / 1000, probes => N}.

%% On B: the probe's sink.
-spec probe_sink_start() -> pid().
probe_sink_start() ->
    spawn(fun() -> probe_sink(0, 0) end).

-spec probe_sink(integer(), non_neg_integer()) -> ok.
probe_sink(Longest, N) ->
    receive
        {probe, Sent} ->
            probe_sink(max(Longest, erlang:monotonic_time(microsecond) - Sent), N + 1);
        {probe_done, Owner} ->
            Owner ! {probe_done, self()},
            probe_sink(Longest, N);
        {result, From} ->
            From ! {probe_result, self(), {Longest, N}},
            ok
    end.

%% On B: the probe sink's result; the sink ends.
-spec probe_result(pid()) -> {integer(), non_neg_integer()}.
probe_result(Sink) ->
    Sink ! {result, self()},
    receive {probe_result, Sink, R} -> R end.

%% One term, from the send on A to its arrival in B's sink; then B's hash of it.
-spec deliver_term(node(), pid(), pid(), atom(), atom(), integer(), integer()) -> term_result().
deliver_term(B, Sink, Holder, Variant, Name, Hash, Offset) ->
    Tag = make_ref(),
    Holder ! {send, self(), Tag, Variant, {?BIG_SINK, B}, Name},
    {T0, T1} = receive {sent, Tag, Times} -> Times end,
    Arrived = receive
                  {big_arrived, Tag, T} -> T - Offset
              after ?BIG_WAIT ->
                      erlang:error({not_delivered, Variant, Name})
              end,
    [{Tag, BHash, Bytes}] = sink_hashes(Sink),
    #{term => Name, bytes => Bytes, send_ms => (T1 - T0) / 1000,
      delivery_ms => (Arrived - T0) / 1000, intact => BHash =:= Hash}.

%% Phase 2 by one variant.
-spec burst_run(node(), [holder()], pos_integer(), atom()) -> big_run().
burst_run(B, Senders, Round, Variant) ->
    ready(B, Variant),
    Sink = term_sink(B),
    Offset = clock_offset(B),
    Watchers = watch([node(), B]),
    Ref = make_ref(),
    T0 = erlang:monotonic_time(microsecond),
    [P ! {go, self(), Ref, Variant, {?BIG_SINK, B}} || {P, _} <- Senders],
    Arrived = arrivals(Ref, ?BURST_SENDERS * ?BURST_TERMS, []),
    [receive {burst_sent, Ref, P} -> ok end || {P, _} <- Senders],
    [A, BW] = watched(Watchers),
    Hashes = sink_hashes(Sink),
    stop_sink(Sink),
    Want = [{{Ref, P, J}, H} || {P, Terms} <- Senders, {J, H, _} <- Terms],
    Intact = length([Tag || {Tag, H, _} <- Hashes, lists:member({Tag, H}, Want)]),
    Total = (lists:max(Arrived) - Offset - T0) / 1.0e6,
    io:format("  [round ~b] burst ~s: ~.2f s, ~b of ~b intact~n",
              [Round, Variant, Total, Intact, length(Want)]),
    #{phase => burst, round => Round, variant => Variant, a => A, b => BW,
      total_s => Total, terms => length(Want), intact => Intact,
      bytes => lists:sum([Bytes || {_, _, Bytes} <- Hashes])}.

%% The arrival times (B's clock) of N terms of the burst Ref.
-spec arrivals(reference(), non_neg_integer(), [integer()]) -> [integer()].
arrivals(_Ref, 0, Acc) ->
    Acc;
arrivals(Ref, N, Acc) ->
    receive
        {big_arrived, {Ref, _, _}, T} -> arrivals(Ref, N - 1, [T | Acc])
    after ?BIG_WAIT ->
            erlang:error({not_delivered, burst, N})
    end.

-spec run_intact(big_run()) -> boolean().
run_intact(#{phase := terms, terms := Terms}) ->
    lists:all(fun(#{intact := I}) -> I end, Terms);
run_intact(#{phase := burst, terms := N, intact := I}) ->
    I =:= N.

%% B's monotonic clock (µs) minus A's: the round trip of the fastest of
%% 20 calls to B, B's reading taken as at its midpoint.
-spec clock_offset(node()) -> integer().
clock_offset(B) ->
    {_, Offset} = lists:min(
                    [begin
                         T0 = erlang:monotonic_time(microsecond),
                         TB = erpc:call(B, erlang, monotonic_time, [microsecond]),
                         T1 = erlang:monotonic_time(microsecond),
                         {T1 - T0, TB - (T0 + T1) div 2}
                     end || _ <- lists:seq(1, 20)]),
    Offset.

%%--------------------------------------------------------------------
%% The big mode's sink, on B.

%% A sink registered as ?BIG_SINK on B, owned by the caller.
-spec term_sink(node()) -> pid().
term_sink(B) ->
    erpc:call(B, ?MODULE, term_sink_start, [self()]).

%% On B.
-spec term_sink_start(pid()) -> pid().
term_sink_start(Owner) ->
    Pid = spawn(fun() -> term_sink_loop(Owner, []) end),
    true = register(?BIG_SINK, Pid),
    Pid.

%% Tells the owner when each term arrives (B's monotonic µs), at once;
%% then hashes it, keeps only the hash, and lets the term go (a collection
%% of its own heap), so that every term costs the sink the same whatever
%% the variant, and B's memory is not the sink's. Hashes go back when
%% asked.
-spec term_sink_loop(pid(), [{term(), integer(), non_neg_integer()}]) -> ok.
term_sink_loop(Owner, Hashes) ->
    receive
        {big, Tag, Term} ->
            Owner ! {big_arrived, Tag, erlang:monotonic_time(microsecond)},
            Hash = {Tag, erlang:phash2(Term), erlang:external_size(Term)},
            term_sink_emptied(Owner, [Hash | Hashes]);
        {hashes, From} ->
            From ! {big_hashes, self(), lists:reverse(Hashes)},
            term_sink_loop(Owner, []);
        stop ->
            ok
    end.

-spec term_sink_emptied(pid(), [{term(), integer(), non_neg_integer()}]) -> ok.
term_sink_emptied(Owner, Hashes) ->
    true = garbage_collect(),
    term_sink_loop(Owner, Hashes).

%% Returns once the sink is gone, and its name free for the next one.
-spec stop_sink(pid()) -> ok.
stop_sink(Sink) ->
    Ref = monitor(process, Sink),
    Sink ! stop,
    receive {'DOWN', Ref, process, Sink, _} -> ok end.

%% {Tag, Hash, Bytes} of every term the sink holds, computed on B.
-spec sink_hashes(pid()) -> [{term(), integer(), non_neg_integer()}].
sink_hashes(Sink) ->
    Sink ! {hashes, self()},
    receive {big_hashes, Sink, Hashes} -> Hashes end.

%% On B: the heaps of ecall's receiver workers (total_heap_size, in
%% bytes: summed and the largest), not collected first, and the node's
%% erlang:memory(total) and resident set.
-spec rx_memory() -> b_memory().
rx_memory() ->
    WordSize = erlang:system_info(wordsize),
    Heaps = [Words * WordSize
             || I <- lists:seq(1, ecall_config:receivers()),
                Pid <- [whereis(ecall_receiver_sup:name(I))], is_pid(Pid),
                {total_heap_size, Words} <- [process_info(Pid, total_heap_size)]],
    #{rx_heap_bytes => lists:sum(Heaps), rx_heap_max_bytes => lists:max([0 | Heaps]),
      b_memory_bytes => erlang:memory(total), b_rss_bytes => vm_rss()}.

%%--------------------------------------------------------------------
%% Watchers (ecall_test_nodes:watcher_start/0): on each node, a 1 ms
%% ticker and a system monitor of long schedules, from watch/1 to
%% watched/1.

-spec watch([node()]) -> [pid()].
watch(Nodes) ->
    [erpc:call(N, ecall_test_nodes, watcher_start, []) || N <- Nodes].

%% What each watcher saw; they stop.
-spec watched([pid()]) -> [watched()].
watched(Watchers) ->
    [ecall_test_nodes:watched(W) || W <- Watchers].

%%--------------------------------------------------------------------
%% The big mode's output.

%% Phase 1: per round and variant, both nodes' watch and the delivery of
%% each term; then the send calls' own times.
-spec print_terms([big_run()], [atom()]) -> ok.
print_terms(Runs, Names) ->
    io:format("~nphase 1: five big terms one after another, ms from the send on A to the "
              "arrival in B's sink~n"),
    Head = fun(Last) ->
                   io:format("~-5s ~-13s ~8s ~8s ~11s ~11s ~s ~s~n",
                             ["round", "variant", "late A", "late B", "long A", "long B",
                              [io_lib:format("~12s", [N]) || N <- Names], Last])
           end,
    Head("intact"),
    [io:format("~-5b ~-13s ~8.1f ~8.1f ~11s ~11s ~s ~b/~b~n",
               [R, V, LA, LB, long_cell(A), long_cell(B),
                [io_lib:format("~12.1f", [D]) || #{delivery_ms := D} <- Terms],
                length([I || #{intact := true} = I <- Terms]), length(Terms)])
     || #{round := R, variant := V, a := #{lateness_ms := LA} = A,
          b := #{lateness_ms := LB} = B, terms := Terms} <- Runs],
    io:format("(late: the 1 ms ticker's worst lateness, ms; long: long_schedule events, "
              "count/longest ms)~n"),
    io:format("~nphase 1: a small message every ms from another process of A, longest on the way~n"),
    [io:format("~-5b ~-13s ~8.1f ms of ~b~n", [R, V, P, N])
     || #{round := R, variant := V, probe := #{probe_max_ms := P, probes := N}} <- Runs],
    io:format("~nphase 1: ms the send call itself took on A~n~-5s ~-13s ~s~n",
              ["round", "variant", [io_lib:format("~12s", [N]) || N <- Names]]),
    [io:format("~-5b ~-13s ~s~n",
               [R, V, [io_lib:format("~12.1f", [S]) || #{send_ms := S} <- Terms]])
     || #{round := R, variant := V, terms := Terms} <- Runs],
    ok.

-spec long_cell(watched()) -> string().
long_cell(#{events := Events}) ->
    lists:flatten(io_lib:format("~b/~b", [length(Events),
                                          lists:max([0 | [T || #{timeout_ms := T} <- Events]])])).

%% After phase 1, on B.
-spec print_b_memory([big_run()]) -> ok.
print_b_memory(Runs) ->
    io:format("~nB around phase 1, MB: ecall receiver heaps (sum, largest) before, right "
              "after, 2 s after (no collection forced); erlang:memory(total) and RSS~n"),
    io:format("~-5s ~-13s ~18s ~18s ~18s ~18s ~18s~n",
              ["round", "variant", "rx heap before", "rx heap after", "rx heap +2s",
               "memory after/+2s", "RSS after/+2s"]),
    MB = fun(Bytes) -> Bytes / 1048576 end,
    Pair = fun(Key1, Key2, M) ->
                   io_lib:format("~.1f/~.1f", [MB(maps:get(Key1, M)), MB(maps:get(Key2, M))])
           end,
    [io:format("~-5b ~-13s ~18s ~18s ~18s ~18s ~18s~n",
               [R, V, Pair(rx_heap_bytes, rx_heap_max_bytes, M0),
                Pair(rx_heap_bytes, rx_heap_max_bytes, M1),
                Pair(rx_heap_bytes, rx_heap_max_bytes, M2),
                io_lib:format("~.1f/~.1f", [MB(maps:get(b_memory_bytes, M1)),
                                            MB(maps:get(b_memory_bytes, M2))]),
                io_lib:format("~.1f/~.1f", [MB(maps:get(b_rss_bytes, M1)),
                                            MB(maps:get(b_rss_bytes, M2))])])
     || #{round := R, variant := V,
          memory := #{before := M0, 'after' := M1, after_2s := M2}} <- Runs],
    ok.

-spec print_bursts([big_run()]) -> ok.
print_bursts(Runs) ->
    io:format("~nphase 2: ~b senders x ~b terms at once to one sink on B~n",
              [?BURST_SENDERS, ?BURST_TERMS]),
    io:format("~-5s ~-13s ~8s ~8s ~11s ~11s ~8s ~9s ~7s~n",
              ["round", "variant", "late A", "late B", "long A", "long B", "MB",
               "total s", "intact"]),
    [io:format("~-5b ~-13s ~8.1f ~8.1f ~11s ~11s ~8.1f ~9.2f ~b/~b~n",
               [R, V, LA, LB, long_cell(A), long_cell(B), Bytes / 1.0e6, Total, I, N])
     || #{round := R, variant := V, a := #{lateness_ms := LA} = A,
          b := #{lateness_ms := LB} = B, bytes := Bytes, total_s := Total,
          intact := I, terms := N} <- Runs],
    ok.

%% The longest few long_schedule events of each run, per node.
-spec print_long_schedules([big_run()]) -> ok.
print_long_schedules(Runs) ->
    io:format("~nlongest long_schedule events (ms, process, in -> out), ~b per node and run~n",
              [?WORST_SHOWN]),
    [begin
         Worst = lists:sublist(lists:reverse(lists:sort(
                                               [{T, E} || #{timeout_ms := T} = E <- Events])),
                               ?WORST_SHOWN),
         [io:format("  ~-5s ~b ~-13s ~s ~6b ~s, ~s -> ~s~n",
                    [Phase, R, V, Node, T, Who, In, Out])
          || {T, #{who := Who, in := In, out := Out}} <- Worst]
     end || #{phase := Phase, round := R, variant := V} = Run <- Runs,
            {Node, #{events := Events}} <- [{"A", maps:get(a, Run)}, {"B", maps:get(b, Run)}]],
    ok.

%% big-terms.csv, big-memory.csv, big-burst.csv, big-watch.csv (per run
%% and node) and big-long-schedules.csv (every event).
-spec write_big_csvs([big_run()]) -> ok.
write_big_csvs(Runs) ->
    write_csv("big-terms", [round, variant, term, bytes, send_ms, delivery_ms, intact],
              [T#{round => R, variant => V}
               || #{phase := terms, round := R, variant := V, terms := Ts} <- Runs, T <- Ts]),
    write_csv("big-memory", [round, variant, at, rx_heap_bytes, rx_heap_max_bytes,
                             b_memory_bytes, b_rss_bytes],
              [M#{round => R, variant => V, at => At}
               || #{phase := terms, round := R, variant := V, memory := Ms} <- Runs,
                  At <- [before, 'after', after_2s], M <- [maps:get(At, Ms)]]),
    write_csv("big-probe", [round, variant, probe_max_ms, probes],
              [P#{round => R, variant => V}
               || #{phase := terms, round := R, variant := V, probe := P} <- Runs]),
    write_csv("big-burst", [round, variant, terms, bytes, total_s, intact],
              [Run || #{phase := burst} = Run <- Runs]),
    Watched = [{Run, Node, W} || Run <- Runs, {Node, W} <- [{a, maps:get(a, Run)},
                                                           {b, maps:get(b, Run)}]],
    write_csv("big-watch", [phase, round, variant, node, lateness_ms, long_schedules,
                            longest_ms],
              [#{phase => P, round => R, variant => V, node => Node, lateness_ms => L,
                 long_schedules => length(Es),
                 longest_ms => lists:max([0 | [T || #{timeout_ms := T} <- Es]])}
               || {#{phase := P, round := R, variant := V}, Node,
                   #{lateness_ms := L, events := Es}} <- Watched]),
    write_csv("big-long-schedules", [phase, round, variant, node, timeout_ms, who, in, out],
              [E#{phase => P, round => R, variant => V, node => Node}
               || {#{phase := P, round := R, variant := V}, Node, #{events := Es}} <- Watched,
                  E <- Es]),
    ok.

