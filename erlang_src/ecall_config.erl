%% @private
%% The application environment: every key with its type and default in one
%% table ({@link spec/0}), checked once when the application starts
%% ({@link validate/0}: an unknown key or a bad value stops the start with an
%% error naming the key) and read with {@link get/1}.
%%
%% get/1 checks the one key it reads as well: the environment can be changed
%% at run time (application:set_env/3). A bad value set then is refused
%% where it is read, never raised in a caller: the last good value of the
%% key stays in force, and one warning per key and value names the key,
%% the value (as `{bad_config, Key, Value}', the error a start gives for
%% it) and what is allowed. The good values are kept in a table the top
%% supervisor owns (keep_good/0).
-module(ecall_config).

-compile({no_auto_import, [get/1]}).
-export([spec/0, validate/0, get/1, links/0, shards/0, receivers/0, peer_opts/0]).
-export([keep_good/0, allowed/1, doc/0, write_doc/1]).

-include_lib("kernel/include/logger.hrl").

%% The table of the values in force: `{Key, Value}' for the last good
%% value read of each key, `{{said, Key, Value}}' for a bad value warned
%% of.
-define(GOOD, ecall_config_good).

-type check() :: pos_integer | non_neg_integer | boolean | {one_of, [atom()]}
               | {pos_integer_or, atom()}.
%% When a key is read (see spec/0).
-type read() :: start | open | use.
-type error() :: {bad_config, atom(), term()} | {unknown_config_key, atom()}.
-export_type([error/0]).

%% Key => {Check, Default, When, What it is}. doc/configuration.md is this
%% table ({@link doc/0}). When it is read: `start' (when the application
%% starts), `open' (when a connection to a peer opens: a change applies to
%% connections opened after it), `use' (each time it is used).
-spec spec() -> #{atom() => {check(), term(), read(), string()}}.
spec() ->
    #{links => {{pos_integer_or, auto}, auto, start,
                "C-node links (and identities) per peer (auto: one per two schedulers, "
                "at least 1, at most 2)"},
      shards => {{pos_integer_or, schedulers}, schedulers, open,
                 "queues per peer (schedulers: one per scheduler)"},
      receivers => {{pos_integer_or, schedulers}, schedulers, start,
                    "receiver workers on this node (schedulers: one per scheduler)"},
      max_batch_count => {pos_integer, 1000, open,
                          "most requests in one batch"},
      max_batch_bytes => {pos_integer, 1048576, open,
                          "most bytes in one batch"},
      max_queue_bytes => {pos_integer, 67108864, open,
                          "byte budget of one peer's queues"},
      overflow => {{one_of, [block, error, drop]}, block, use,
                   "what a full budget does to a caller"},
      stall_timeout => {non_neg_integer, 30000, open,
                        "ms a link may take for a bounded piece of a write before "
                        "it is reaped; 0: never"},
      connect_timeout => {pos_integer, 10000, open,
                          "ms ecall:connect/1 waits for every link to be up"},
      handshake_timeout => {pos_integer, 5000, start,
                            "ms one link's connection attempt (epmd, TCP, handshake) may take"},
      backoff_min => {pos_integer, 100, open,
                      "ms before the first reconnect attempt of a link"},
      backoff_max => {pos_integer, 5000, open,
                      "most ms between reconnect attempts (doubling from backoff_min)"},
      gather => {boolean, true, open,
                 "a busy link waits up to 1-2 ms for 128 requests before it writes "
                 "(urgent requests end the wait); false: it never waits"},
      urgent => {boolean, true, open,
                 "calls of callers in a closed loop go urgent, not held back for company; "
                 "false: they wait like any request"},
      discovery => {boolean, true, start,
                    "connect to every node that runs ecall (pg group)"},
      transport => {{one_of, [nif, erlang]}, nif, open,
                    "nif: Rust C-node links; erlang: the pure-Erlang proxies"},
      telemetry_interval => {{pos_integer_or, infinity}, infinity, start,
                             "ms between [ecall, stats] telemetry events; "
                             "infinity: only on demand"}}.

%% @doc doc/configuration.md, made from {@link spec/0}: a test fails when
%% the file and the table disagree (`make config-doc' writes it again).
-spec doc() -> unicode:chardata().
doc() ->
    Rows = [io_lib:format("| `~s` | ~s | `~0p` | ~s | ~s |~n", [K, values(C), D, read(R), What])
            || {K, {C, D, R, What}} <- lists:sort(maps:to_list(spec()))],
    ["# ecall: configuration\n\n"
     "<!-- Made by ecall_config:doc/0 from ecall_config:spec/0 (make config-doc). -->\n\n"
     "ecall is configured through the environment of the application `ecall`:\n"
     "`sys.config`, `-ecall Key Value` on the command line, or\n"
     "`config :ecall, key: value` in Elixir. Every key is checked when the\n"
     "application starts: an unknown key or a bad value stops the start with\n"
     "`{bad_config, Key, Value}` or `{unknown_config_key, Key}` and an error in\n"
     "the log that says what the key allows. The column \"read\" says when\n"
     "ecall reads a key, and so when a change made at run time\n"
     "(`application:set_env/3`) applies: *at start* (after the application\n"
     "restarts), *at open* (to connections opened after the change;\n"
     "`ecall:disconnect/1` then `ecall:connect/1` opens one again), or *at use*\n"
     "(at once).\n\n"
     "A bad value set at run time is refused where it is read: the last good\n"
     "value of the key stays in force, and one warning per key and value gives\n"
     "`{bad_config, Key, Value}` and what is allowed. `send`, `cast` and `call`\n"
     "never raise because of a setting.\n\n"
     "On erl's command line a value that starts with `-` is taken by erl for a\n"
     "flag of its own: `-ecall max_queue_bytes -1` sets nothing, and ecall\n"
     "warns at start that the key has no value. Write such a value as\n"
     "`-ecall max_queue_bytes '(-1)'`, or set it in `sys.config`.\n\n"
     "Which settings matter, and when to change them: `operations.md`.\n\n"
     "| key | values | default | read | what it does |\n"
     "| --- | --- | --- | --- | --- |\n",
     Rows].

%% @doc Writes {@link doc/0} to `File'.
-spec write_doc(file:filename()) -> ok | {error, term()}.
write_doc(File) ->
    file:write_file(File, unicode:characters_to_binary(doc())).

-spec read(read()) -> string().
read(start) -> "at start";
read(open) -> "at open";
read(use) -> "at use".

-spec values(check()) -> string().
values(pos_integer) -> "integer > 0";
values(non_neg_integer) -> "integer >= 0";
values(boolean) -> "`true`, `false`";
values({pos_integer_or, Word}) -> lists:flatten(io_lib:format("integer > 0, `~s`", [Word]));
values({one_of, Atoms}) -> lists:join(", ", [io_lib:format("`~s`", [A]) || A <- Atoms]).

%% @doc Checks every key set for the application: `ok', or the first
%% problem found (keys in alphabetical order).
-spec validate() -> ok | {error, error()}.
validate() ->
    Spec = spec(),
    Env = lists:sort(application:get_all_env(ecall)),
    try
        _ = [case maps:find(Key, Spec) of
                 {ok, {Check, _, _, _}} -> check(Key, Check, Value);
                 error -> throw({unknown_config_key, Key})
             end || {Key, Value} <- Env],
        check_backoff(get(backoff_min), get(backoff_max))
    catch
        throw:Error -> {error, Error};
        error:{bad_config, _, _} = Error -> {error, Error}
    end.

-spec check_backoff(pos_integer(), pos_integer()) -> ok.
check_backoff(Min, Max) when Max >= Min -> ok;
check_backoff(_Min, Max) -> erlang:error({bad_config, backoff_max, Max}).

%% @doc The value of `Key', or its default. A bad value is refused: the
%% last good value read stays in force (the default if none was), and a
%% warning says so once per key and value (see the module doc). Raises
%% `{unknown_config_key, Key}' for a key that is not in the table (a bug
%% of ecall, not a setting).
-spec get(atom()) -> term().
get(Key) ->
    case maps:find(Key, spec()) of
        {ok, {Check, Default, _, _}} ->
            case application:get_env(ecall, Key) of
                {ok, V} ->
                    try check(Key, Check, V) of
                        V -> good(Key, V)
                    catch
                        error:{bad_config, Key, V} -> refused(Key, V, Check, Default)
                    end;
                undefined ->
                    Default
            end;
        error ->
            erlang:error({unknown_config_key, Key})
    end.

%% @doc Keeps every value of the environment, checked already by
%% validate/0 when the application started, as the last good ones.
%% Called by the top supervisor, which owns the table.
-spec keep_good() -> ok.
keep_good() ->
    _ = ets:new(?GOOD, [named_table, public, {read_concurrency, true}]),
    _ = [good(Key, V) || {Key, V} <- application:get_all_env(ecall),
                         maps:is_key(Key, spec())],
    ok.

%% A good value read: kept, when it differs from the one kept (a lookup
%% otherwise). Before the application starts (no table) nothing is kept.
-spec good(atom(), V) -> V.
good(Key, V) ->
    try ets:lookup(?GOOD, Key) of
        [{_, V}] -> V;
        _ -> true = ets:insert(?GOOD, {Key, V}), V
    catch
        error:badarg -> V
    end.

-spec refused(atom(), term(), check(), term()) -> term().
refused(Key, V, Check, Default) ->
    InForce = try ets:lookup(?GOOD, Key) of
                  [{_, Good}] -> Good;
                  [] -> Default
              catch
                  error:badarg -> Default
              end,
    _ = try ets:insert_new(?GOOD, {{said, Key, V}}) of
            true ->
                ?LOG_WARNING("ecall: setting ~p refused: ~0p (allowed: ~ts); ~0p stays in "
                             "force. Set a good value with application:set_env(ecall, ~p, "
                             "Value)", [Key, {bad_config, Key, V}, allowed_by(Check), InForce,
                                        Key]);
            false ->
                ok
        catch
            error:badarg -> ok
        end,
    InForce.

%% @doc What key `Key' allows, in words (for the log lines that refuse a
%% value).
-spec allowed(atom()) -> string().
allowed(Key) ->
    {Check, _, _, _} = maps:get(Key, spec()),
    allowed_by(Check).

-spec allowed_by(check()) -> string().
allowed_by(Check) ->
    lists:flatten(string:replace(values(Check), "`", "", all)).

-spec check(atom(), check(), term()) -> term().
check(_Key, pos_integer, V) when is_integer(V), V > 0 -> V;
check(_Key, non_neg_integer, V) when is_integer(V), V >= 0 -> V;
check(_Key, boolean, V) when is_boolean(V) -> V;
check(_Key, {pos_integer_or, Word}, Word) -> Word;
check(Key, {pos_integer_or, _}, V) -> check(Key, pos_integer, V);
check(Key, {one_of, Allowed}, V) ->
    case lists:member(V, Allowed) of
        true -> V;
        false -> erlang:error({bad_config, Key, V})
    end;
check(Key, _Check, V) ->
    erlang:error({bad_config, Key, V}).

%% @doc The number of C-node links per peer. `auto' is one per two
%% schedulers, at least 1 and at most 2. On a node with two schedulers one
%% link did as well as two or a little better, with one identity, socket
%% and hidden connection per peer instead of two (doc/performance.md,
%% "Ideas kept"); a bigger node keeps two links (more were never
%% measured).
-spec links() -> pos_integer().
links() ->
    case get(links) of
        auto -> max(1, min(2, erlang:system_info(schedulers) div 2));
        N -> N
    end.

-spec shards() -> pos_integer().
shards() -> or_schedulers(get(shards)).

-spec receivers() -> pos_integer().
receivers() -> or_schedulers(get(receivers)).

-spec or_schedulers(pos_integer() | schedulers) -> pos_integer().
or_schedulers(schedulers) -> erlang:system_info(schedulers);
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
      backoff_max => get(backoff_max),
      gather => get(gather)}.
