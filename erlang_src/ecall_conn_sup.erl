%% @private
%% One ecall_conn per connected peer, started on demand.
-module(ecall_conn_sup).
-behaviour(supervisor).

-export([start_link/0, init/1, start_conn/2, conns/0, infos/0, counters/0, closed_drops/0,
         add_closed_drops/1, keep_last/2, last/1, last_all/0]).

%% The index of the node-wide connection counter, read by name with
%% closed_drops/0: requests dropped when connections closed.
-define(CLOSED_DROPS, 1).
-define(COUNTERS, 1).

%% Closed peers whose last stats are kept (the oldest close goes first):
%% enough for any cluster, bounded for nodes that come and go under new
%% names.
-define(LAST_MAX, 1000).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    %% Node -> the stats of its last closed connection (ecall:last_stats/1),
    %% written by the closing connection process.
    _ = ets:new(ecall_last_stats, [named_table, public]),
    %% Nodes whose traffic went by plain distribution with no connection up,
    %% said once each (ecall_route:plain/2). Owned by this supervisor so
    %% that it outlives every connection.
    _ = ets:new(ecall_plain_said, [named_table, public, {read_concurrency, true}]),
    %% Node -> sends to it that went by `!' instead of a transport
    %% (ecall_route:native/3; ecall:stats/0,1).
    _ = ets:new(ecall_fallback_sends, [named_table, public, {write_concurrency, true}]),
    %% Requests dropped when connections closed (see ecall_conn).
    persistent_term:put({ecall, conn_counters}, counters:new(?COUNTERS, [write_concurrency])),
    Conn = #{id => ecall_conn, start => {ecall_conn, start_link, []},
             restart => temporary, shutdown => ecall_conn:close_timeout()},
    {ok, {#{strategy => simple_one_for_one, intensity => 100, period => 10}, [Conn]}}.

%% @doc Starts the connection to `Node', `Waiter' its first waiter (see
%% ecall_conn:start_link/2).
-spec start_conn(node(), ecall_conn:first_waiter()) -> {ok, pid()} | {error, term()}.
start_conn(Node, Waiter) ->
    supervisor:start_child(?MODULE, [Node, Waiter]).

-spec conns() -> [pid()].
conns() ->
    [Pid || {_, Pid, _, _} <- supervisor:which_children(?MODULE), is_pid(Pid)].

%% @doc What each connection process says of itself (ecall_conn:info/1);
%% one that ended meanwhile gives its exit instead.
-spec infos() -> [map() | {'EXIT', term()}].
infos() ->
    [catch ecall_conn:info(Pid) || Pid <- conns()].

%% @doc Node-wide counters of connections: 1, requests dropped on close
%% (read them with closed_drops/0, add with add_closed_drops/1).
-spec counters() -> counters:counters_ref().
counters() ->
    persistent_term:get({ecall, conn_counters}).

%% @doc Requests dropped when connections closed, node-wide (ecall:stats/0).
-spec closed_drops() -> non_neg_integer().
closed_drops() ->
    counters:get(counters(), ?CLOSED_DROPS).

%% @doc Counts `N' requests dropped when a connection closed.
-spec add_closed_drops(non_neg_integer()) -> ok.
add_closed_drops(N) ->
    counters:add(counters(), ?CLOSED_DROPS, N).

%% @doc Keeps `Stats' as the last stats of `Node' (its connection closed).
-spec keep_last(node(), map()) -> ok.
keep_last(Node, Stats) ->
    true = ets:insert(ecall_last_stats, {Node, erlang:monotonic_time(), Stats}),
    case ets:info(ecall_last_stats, size) > ?LAST_MAX of
        true ->
            %% A scan of ?LAST_MAX entries, once per close past the bound.
            {Oldest, _} = ets:foldl(fun({N, T, _}, {_, T0}) when T < T0 -> {N, T};
                                       (_, Acc) -> Acc
                                    end, {Node, erlang:monotonic_time()}, ecall_last_stats),
            true = ets:delete(ecall_last_stats, Oldest),
            ok;
        false ->
            ok
    end.

%% @doc The last stats of `Node''s closed connection, if any was kept.
-spec last(node()) -> {ok, map()} | {error, not_found}.
last(Node) ->
    case ets:lookup(ecall_last_stats, Node) of
        [{_, _, Stats}] -> {ok, Stats};
        [] -> {error, not_found}
    end.

%% @doc Every node with kept last stats, and those stats.
-spec last_all() -> #{node() => map()}.
last_all() ->
    maps:from_list([{N, S} || {N, _, S} <- ets:tab2list(ecall_last_stats)]).
