%% @private
%% The receiver pool: one off_heap worker per index, registered as
%% `ecall_rx_<I>'. Peers learn the names through {@link names/0} when they
%% connect, and each of their shards always writes to the same worker.
-module(ecall_receiver_sup).
-behaviour(supervisor).

-export([start_link/0, init/1, names/0, counters/0]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    N = ecall_config:receivers(),
    %% Shared counters: batches, requests, malformed, dead letters, spawns
    %% that failed (system_limit).
    persistent_term:put({ecall, rx_counters}, counters:new(5, [write_concurrency])),
    persistent_term:put({ecall, rx_names}, [ecall_receiver:name(I) || I <- lists:seq(1, N)]),
    Workers = [#{id => I, start => {ecall_receiver, start_link, [I]}}
               || I <- lists:seq(1, N)],
    {ok, {#{strategy => one_for_one, intensity => 10, period => 10}, Workers}}.

%% @doc Registered names of the pool, as the C-node of a peer wants them.
-spec names() -> [binary()].
names() ->
    [atom_to_binary(A) || A <- persistent_term:get({ecall, rx_names})].

-spec counters() -> counters:counters_ref().
counters() ->
    persistent_term:get({ecall, rx_counters}).
