%% @doc Telemetry events of ecall (see doc/operations.md, section Telemetry, for
%% every event, measurement and metadata key).
%%
%% `telemetry' (beam-telemetry) is an optional dependency: events go to
%% `telemetry:execute/3' when the module is there (the user's release has
%% the `telemetry' application), and nowhere otherwise. Whether it is there
%% is checked once, checked again when ecall starts ({@link refresh/0}), so
%% that an event costs one persistent-term read when nobody listens.
%%
%% The process of this module (started by ecall_sup) emits the peers'
%% stats every `telemetry_interval' ms when that is set (default
%% `infinity': only on demand, {@link measure/0}).
-module(ecall_telemetry).
-behaviour(gen_server).

-export([start_link/0, available/0, refresh/0, measure/0, measure/1]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-type measurements() :: #{atom() => number()}.

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Whether events go anywhere: `telemetry' was loadable when last
%% checked ({@link refresh/0}).
-spec available() -> boolean().
available() ->
    ecall_event:available().

%% @doc Checks again whether `telemetry' can be loaded (ecall does at
%% start; call it after loading telemetry into a running node).
-spec refresh() -> boolean().
refresh() ->
    ecall_event:refresh().

%% @doc Emits the stats of every connected peer (`[ecall, stats]', and
%% `[ecall, link, stats]' per link) and of the receiver pool (`[ecall,
%% receivers, stats]'). Nothing is read when telemetry is not there.
-spec measure() -> ok.
measure() ->
    case available() of
        false ->
            ok;
        true ->
            _ = [measure(N) || #{node := N} <- ecall_conn_sup:infos()],
            ecall_event:execute([ecall, receivers, stats], ecall_receiver_sup:counts(), #{})
    end.

%% @doc Emits the stats of the connection to `Node': `[ecall, stats]' with
%% every number of `ecall:stats(Node)' and `avg_batch_size', and `[ecall,
%% link, stats]' for each link.
-spec measure(node()) -> ok | {error, not_connected}.
measure(Node) when is_atom(Node) ->
    case ecall_stats:peer(Node) of
        {ok, Stats} ->
            Meta = #{peer => Node, transport => maps:get(transport, Stats, nif)},
            ecall_event:execute([ecall, stats], numbers(Stats), Meta),
            _ = [ecall_event:execute([ecall, link, stats], numbers(L), Meta#{link => K})
                 || #{link := K} = L <- maps:get(per_link, Stats, [])],
            ok;
        {error, _} = E ->
            E
    end;
measure(Node) ->
    erlang:error(badarg, [Node]).

%% Measurements are numbers: `transport' goes to the metadata, `per_link'
%% to events of its own, `link' is the link's metadata.
-spec numbers(map()) -> measurements().
numbers(Stats) ->
    Numbers = maps:filter(fun(K, V) -> is_number(V) andalso K =/= link end, Stats),
    case Numbers of
        #{batches := B, requests := R} when B > 0 -> Numbers#{avg_batch_size => R / B};
        #{batches := _} -> Numbers#{avg_batch_size => 0.0};
        _ -> Numbers
    end.

%%--------------------------------------------------------------------
%% The periodic measurement

-spec init([]) -> {ok, #{interval := pos_integer() | infinity}}.
init([]) ->
    Interval = ecall_config:get(telemetry_interval),
    schedule(Interval),
    {ok, #{interval => Interval}}.

-spec schedule(pos_integer() | infinity) -> ok.
schedule(infinity) ->
    ok;
schedule(Ms) ->
    _ = erlang:send_after(Ms, self(), measure),
    ok.

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info(measure, #{interval := Interval} = St) ->
    %% A peer that closes meanwhile answers not_connected: skipped.
    ok = measure(),
    schedule(Interval),
    {noreply, St};
handle_info(Info, St) ->
    {noreply, ecall_log:unexpected_in(?MODULE, {info, Info}, St)}.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, {error, badarg}, map()}.
handle_call(Req, _From, St) ->
    {reply, {error, badarg}, ecall_log:unexpected_in(?MODULE, {call, Req}, St)}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(Msg, St) ->
    {noreply, ecall_log:unexpected_in(?MODULE, {cast, Msg}, St)}.
