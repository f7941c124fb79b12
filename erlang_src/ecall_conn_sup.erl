%% @private
%% One ecall_conn per connected peer, started on demand.
-module(ecall_conn_sup).
-behaviour(supervisor).

-export([start_link/0, init/1, start_conn/1, conns/0, counters/0]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    %% {Node, Link} -> watcher pid, read by callers (ecall_conn:watcher/2).
    %% Owned by this supervisor so that it outlives every connection.
    _ = ets:new(ecall_links, [named_table, public, {read_concurrency, true}]),
    %% Requests dropped when connections closed (see ecall_conn).
    persistent_term:put({ecall, conn_counters}, counters:new(1, [write_concurrency])),
    Conn = #{id => ecall_conn, start => {ecall_conn, start_link, []},
             restart => temporary, shutdown => 5000},
    {ok, {#{strategy => simple_one_for_one, intensity => 100, period => 10}, [Conn]}}.

-spec start_conn(node()) -> {ok, pid()} | {error, term()}.
start_conn(Node) ->
    supervisor:start_child(?MODULE, [Node]).

-spec conns() -> [pid()].
conns() ->
    [Pid || {_, Pid, _, _} <- supervisor:which_children(?MODULE), is_pid(Pid)].

%% @doc Node-wide counters of connections: 1, requests dropped on close.
-spec counters() -> counters:counters_ref().
counters() ->
    persistent_term:get({ecall, conn_counters}).
