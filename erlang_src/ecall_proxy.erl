%% @private
%% The pure-Erlang transport (see ecall_transport): the original ecall
%% design, kept as the fallback when the NIF cannot load (and selectable
%% with the application env `transport', `erlang' or `nif') and as the
%% reference the benchmark compares against.
%%
%% Per peer, one proxy per receiver worker of the peer. A caller picks its
%% proxy by hashing its pid (so per-caller order holds) and hands it the
%% request; the proxy takes whatever its mailbox holds right now (`after 0',
%% never waiting for a batch to fill; at most `max_batch_count') and sends
%% it as one `{batch, Requests}' message over plain distribution to its
%% receiver. Proxies are off_heap (their mailbox is the backlog) and
%% collect garbage before every batch (they hold nothing between batches,
%% so it is nearly free and releases the batch just sent at once).
%%
%% Not bounded: under sustained overload the proxies' mailboxes grow, as
%% in the article. The NIF transport has the byte budget.
-module(ecall_proxy).
-behaviour(ecall_transport).

-export([open/2, push/3, call/6, cancel/2, stats/1, drain/1, close/2]).
-export([pick/1, init/4]).

%% A transport change (see close/2): how long the proxies may take to send
%% what they hold, and how long a proxy lingers after that, still sending
%% what late callers hand it and standing for the calls in flight (the
%% process their monitor watches) until they are answered.
-define(DRAIN_TIMEOUT, 3000).
-define(LINGER_MS, 60000).

%% The indexes of a pool's counters (stats/1): batches and requests sent.
-define(BATCHES, 1).
-define(REQUESTS, 2).
-define(COUNTERS, 2).

-record(pool, {proxies :: tuple(), counters :: counters:counters_ref()}).
-opaque pool() :: #pool{}.
-export_type([pool/0]).

%% @doc Starts one proxy per receiver name of `Node', linked to the caller
%% (the connection process, which stops when a proxy dies). No links to
%% wait for: usable at once.
-spec open(node(), [binary()]) -> {ok, pool(), 0}.
open(Node, Receivers) ->
    C = counters:new(?COUNTERS, [write_concurrency]),
    Max = ecall_config:get(max_batch_count),
    Proxies = [proc_lib:spawn_opt(?MODULE, init, [{binary_to_atom(R), Node}, C, Max, self()],
                                  [link, {message_queue_data, off_heap}])
               || R <- Receivers],
    {ok, #pool{proxies = list_to_tuple(Proxies), counters = C}, 0}.

%% A proxy never holds a request back for company (it sends what its
%% mailbox holds as soon as it runs): `Urgent' only marks a call, so that
%% the peer does not hold back its reply (ecall_request:wire/2).
-spec push(pool(), ecall_request:request(), boolean()) -> ok.
push(Pool, Request, Urgent) ->
    pick(Pool) ! {do, ecall_request:wire(Request, Urgent)},
    ok.

%% @doc Calls through the proxies are answered by alias: the caller
%% monitors its proxy, which is linked to the connection (it goes down
%% with it, and the connection with it), with an alias for the reply.
-spec call(pool(), reference(), module(), atom(), [term()], boolean()) -> {ok, reference()}.
call(Pool, _Ref, M, F, A, Urgent) ->
    Proxy = pick(Pool),
    Alias = monitor(process, Proxy, [{alias, reply_demonitor}]),
    Proxy ! {do, ecall_request:wire(ecall_request:call_alias(Alias, M, F, A), Urgent)},
    {ok, Alias}.

%% Removing the monitor deactivates the alias: a reply that comes later is
%% dropped by the runtime and never reaches the mailbox.
-spec cancel(pool(), reference()) -> true.
cancel(_Pool, Alias) ->
    demonitor(Alias, [flush]).

%% @doc The calling process's proxy: the one its requests go through, in
%% its order, and its calls' monitor watches.
-spec pick(pool()) -> pid().
pick(#pool{proxies = P}) ->
    element(erlang:phash2(self(), tuple_size(P)) + 1, P).

%% @doc Stops the proxies; what they hold is dropped, and returned as a
%% count (what their mailboxes held just before). Processes monitoring them
%% see `Why'.
%%
%% `transport_change' (the node moves this peer to the NIF transport) and
%% `peer_stopping' (the peer's ecall stops in order) drop nothing: each proxy sends what its mailbox holds before the request to
%% stop, answers, and lingers for ?LINGER_MS (see linger/3). Returns once
%% every proxy has answered (or after ?DRAIN_TIMEOUT; what the late ones
%% still hold is then dropped and counted), so that the connection's fence
%% comes after their batches.
%% No links: the proxies' batches travel on the node's own connection, and
%% close/2 retires them in order where it drops nothing.
-spec drain(pool()) -> ok.
drain(_Pool) ->
    ok.

-spec close(pool(), term()) -> non_neg_integer().
close(#pool{proxies = P}, Why) when Why =:= transport_change; Why =:= peer_stopping ->
    Ref = make_ref(),
    Pids = tuple_to_list(P),
    _ = [begin unlink(Pid), Pid ! {retire, self(), Ref} end || Pid <- Pids],
    Deadline = erlang:monotonic_time(millisecond) + ?DRAIN_TIMEOUT,
    Late = [Pid || Pid <- Pids, not retired(Pid, Ref, Deadline)],
    Held = queued(list_to_tuple(Late)),
    _ = [exit(Pid, transport_change) || Pid <- Late],
    Held;
close(#pool{proxies = P}, Why) ->
    Reason = case Why of
                 normal -> connection_closed;
                 _ -> Why
             end,
    Held = queued(P),
    _ = [begin unlink(Pid), exit(Pid, Reason) end || Pid <- tuple_to_list(P)],
    Held.

-spec retired(pid(), reference(), integer()) -> boolean().
retired(Pid, Ref, Deadline) ->
    receive
        {Ref, retired, Pid} -> true
    after max(0, Deadline - erlang:monotonic_time(millisecond)) ->
        false
    end.

-spec queued(tuple()) -> non_neg_integer().
queued(P) ->
    lists:sum([case process_info(Pid, message_queue_len) of
                   {message_queue_len, N} -> N;
                   undefined -> 0
               end || Pid <- tuple_to_list(P)]).

%% @doc Counters of a pool: batches and requests sent, requests queued.
-spec stats(pool()) -> map().
stats(#pool{proxies = P, counters = C}) ->
    Queued = queued(P),
    #{transport => erlang, batches => counters:get(C, ?BATCHES),
      requests => counters:get(C, ?REQUESTS),
      queued => Queued, links => 0, links_up => 0}.

-spec init({atom(), node()}, counters:counters_ref(), pos_integer(), pid()) -> no_return().
init(Remote, C, Max, _Owner) ->
    loop(Remote, C, Max).

-spec loop({atom(), node()}, counters:counters_ref(), pos_integer()) -> no_return().
loop(Remote, C, Max) ->
    %% Nothing is held here: collecting now is nearly free and releases
    %% the batch just sent.
    erlang:garbage_collect(),
    receive
        {do, Request} ->
            Requests = [Request | collect(1, Max)],
            Remote ! {batch, Requests},
            counters:add(C, ?BATCHES, 1),
            counters:add(C, ?REQUESTS, length(Requests)),
            loop(Remote, C, Max);
        {retire, From, Ref} ->
            %% Taken only from a mailbox with no request before it:
            %% everything before it has been sent.
            From ! {Ref, retired, self()},
            {_, Node} = Remote,
            true = erlang:monitor_node(Node, true),
            linger(Remote, erlang:monotonic_time(millisecond) + ?LINGER_MS)
    end.

-spec collect(pos_integer(), pos_integer()) -> [tuple()].
collect(N, Max) when N < Max ->
    receive
        {do, Request} -> [Request | collect(N + 1, Max)]
    after 0 ->
        []
    end;
collect(_N, _Max) ->
    [].

%% A retired proxy sends what callers that read the transport just before
%% it closed hand it, each as its own batch, and stands for the calls in
%% flight (callers monitor it, ecall_rpc:wait_alias/4): it exits with
%% `noconnection' if the peer goes down, else with `transport_change'
%% after ?LINGER_MS.
-spec linger({atom(), node()}, integer()) -> no_return().
linger({_, Node} = Remote, Until) ->
    receive
        {do, Request} ->
            Remote ! {batch, [Request]},
            linger(Remote, Until);
        {nodedown, Node} ->
            exit(noconnection)
    after max(0, Until - erlang:monotonic_time(millisecond)) ->
        exit(transport_change)
    end.
