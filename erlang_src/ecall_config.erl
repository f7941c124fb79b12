%% @private
%% Application environment with defaults and checks in one place.
-module(ecall_config).

-compile({no_auto_import, [get/1]}).
-export([get/1, links/0, shards/0, receivers/0, peer_opts/0]).

-spec get(atom()) -> term().
get(Key) ->
    case application:get_env(ecall, Key) of
        {ok, V} -> check(Key, V);
        undefined -> default(Key)
    end.

-spec default(atom()) -> term().
default(links) -> 2;
default(shards) -> 0;
default(receivers) -> 0;
default(max_batch_count) -> 1000;
default(max_batch_bytes) -> 1048576;
default(max_queue_bytes) -> 67108864;
default(stall_timeout) -> 30000;
default(connect_timeout) -> 10000;
default(backoff_min) -> 100;
default(backoff_max) -> 5000;
default(discovery) -> true;
default(overflow) -> block;
default(transport) -> nif.

-spec check(atom(), term()) -> term().
check(discovery, V) when is_boolean(V) -> V;
check(overflow, V) when V =:= block; V =:= error; V =:= drop -> V;
check(transport, V) when V =:= nif; V =:= erlang -> V;
check(Key, V) when is_integer(V), V >= 0, Key =/= overflow, Key =/= transport,
                   Key =/= links, Key =/= max_batch_count, Key =/= max_batch_bytes,
                   Key =/= max_queue_bytes, Key =/= connect_timeout ->
    V;
check(_Key, V) when is_integer(V), V > 0 -> V;
check(Key, V) ->
    erlang:error({bad_config, Key, V}).

-spec links() -> pos_integer().
links() -> get(links).

-spec shards() -> pos_integer().
shards() -> or_schedulers(get(shards)).

-spec receivers() -> pos_integer().
receivers() -> or_schedulers(get(receivers)).

-spec or_schedulers(non_neg_integer()) -> pos_integer().
or_schedulers(0) -> erlang:system_info(schedulers);
or_schedulers(N) -> N.

%% @doc Options map for ecall_nif:peer_open/6.
-spec peer_opts() -> map().
peer_opts() ->
    #{shards => shards(),
      max_batch_count => get(max_batch_count),
      max_batch_bytes => get(max_batch_bytes),
      max_queue_bytes => get(max_queue_bytes),
      stall_timeout => get(stall_timeout),
      backoff_min => get(backoff_min),
      backoff_max => get(backoff_max)}.
