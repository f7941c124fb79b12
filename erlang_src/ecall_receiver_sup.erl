%% @private
%% The receiver pool: one off_heap worker per index, registered as
%% `ecall_rx_<I>'. Peers learn the names through {@link names/0} when they
%% connect (ecall_conn:hello/1), and each of their shards always writes to the same worker.
-module(ecall_receiver_sup).
-behaviour(supervisor).

-export([start_link/0, init/1, name/1, names/0, counters/0, counts/0, fence/2]).

-include("ecall_receiver.hrl").

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    N = ecall_config:receivers(),
    %% Shared counters: batches, requests, malformed, dead letters, spawns
    %% that failed (system_limit).
    persistent_term:put({ecall, rx_counters}, counters:new(?COUNTERS, [write_concurrency])),
    persistent_term:put({ecall, rx_names}, [name(I) || I <- lists:seq(1, N)]),
    Workers = [#{id => I, start => {ecall_receiver, start_link, [I]}}
               || I <- lists:seq(1, N)],
    {ok, {#{strategy => one_for_one, intensity => 10, period => 10}, Workers}}.

%% @doc The registered name of worker `I'.
-spec name(pos_integer()) -> atom().
name(I) ->
    list_to_atom("ecall_rx_" ++ integer_to_list(I)).

%% @doc Registered names of the pool, as the C-node of a peer wants them.
-spec names() -> [binary()].
names() ->
    [atom_to_binary(A) || A <- persistent_term:get({ecall, rx_names})].

%% @doc The pool's shared counters, for its workers to add to.
-spec counters() -> counters:counters_ref().
counters() ->
    persistent_term:get({ecall, rx_counters}).

%% @doc The pool's counters, by name (ecall:stats/0, ecall_telemetry):
%% batches received, requests in them, malformed elements and messages,
%% sends to a name not registered (`dead_letters'), casts and calls that
%% could not be spawned (`spawn_failed'), replies to calls of this node
%% that came after their caller gave up (`late_replies'), batches a peer
%% wrote again that were processed already (`duplicates'), gaps that
%% closed a link so that its peer writes again what was lost on the way
%% (`resumes'), and acknowledgements sent (`acks'; see ecall_receiver).
-spec counts() -> #{batches := non_neg_integer(), requests := non_neg_integer(),
                    malformed := non_neg_integer(), dead_letters := non_neg_integer(),
                    spawn_failed := non_neg_integer(), late_replies := non_neg_integer(),
                    duplicates := non_neg_integer(), resumes := non_neg_integer(),
                    acks := non_neg_integer()}.
counts() ->
    C = counters(),
    #{batches => counters:get(C, ?BATCHES), requests => counters:get(C, ?REQUESTS),
      malformed => counters:get(C, ?MALFORMED), dead_letters => counters:get(C, ?DEAD_LETTERS),
      spawn_failed => counters:get(C, ?SPAWN_FAILED),
      late_replies => counters:get(C, ?LATE_REPLIES),
      duplicates => counters:get(C, ?DUPLICATES), resumes => counters:get(C, ?RESUMES),
      acks => counters:get(C, ?ACKS)}.

%% @doc Returns once everything that the C-node connections `Links' (a
%% peer's identities, closing) delivered to this node has been replayed:
%% their connections have ended here (a connection's messages are delivered
%% before its nodedown) and each worker has answered a system message,
%% which it handles after the batches before it. Called over plain
%% distribution by a closing connection on the peer (ecall_conn). Gives up
%% after `Timeout' ms.
-spec fence([node()], timeout()) -> ok.
fence(Links, Timeout) ->
    Deadline = erlang:monotonic_time(millisecond) + Timeout,
    %% Subscribe first, then look: a connection that ends in between is
    %% reported, and no connection attempt is made (monitor_node/2 would
    %% make one to a name that is not connected).
    ok = net_kernel:monitor_nodes(true, [{node_type, hidden}]),
    try
        Connected = [N || N <- Links, lists:member(N, erlang:nodes(hidden))],
        _ = [receive {nodedown, N, _} -> ok
             after max(0, Deadline - erlang:monotonic_time(millisecond)) -> ok
             end || N <- Connected],
        _ = [catch sys:get_state(W, max(1, Deadline - erlang:monotonic_time(millisecond)))
             || W <- persistent_term:get({ecall, rx_names})],
        ok
    after
        net_kernel:monitor_nodes(false, [{node_type, hidden}])
    end.
