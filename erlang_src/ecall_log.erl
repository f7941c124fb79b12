%% @private
%% Receives the Rust side's `tracing' events and hands them to `logger'
%% with the same level, in the domain [ecall, rust]. The most verbose level
%% forwarded is logger's primary level when this process starts.
-module(ecall_log).
-behaviour(gen_server).

-export([start_link/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec init([]) -> {ok, #{}}.
init([]) ->
    process_flag(trap_exit, true),
    case ecall_nif:load_error() of
        none -> ok = ecall_nif:log_target(self(), rank(maps:get(level, logger:get_primary_config())));
        _ -> ok
    end,
    {ok, #{}}.

%% tracing's levels: 1 error, 2 warn, 3 info, 4 debug, 5 trace.
-spec rank(logger:level() | all | none) -> 0..5.
rank(none) -> 0;
rank(Level) when Level =:= emergency; Level =:= alert; Level =:= critical; Level =:= error -> 1;
rank(warning) -> 2;
rank(Level) when Level =:= notice; Level =:= info -> 3;
rank(debug) -> 4;
rank(all) -> 5.

-spec handle_info(term(), #{}) -> {noreply, #{}}.
handle_info({ecall_log, Level, Target, Text}, St) ->
    logger:log(Level, "~ts", [Text], #{domain => [ecall, rust], rust_target => Target}),
    {noreply, St};
handle_info(_Other, St) ->
    {noreply, St}.

-spec handle_call(term(), gen_server:from(), #{}) -> {reply, {error, badarg}, #{}}.
handle_call(_Req, _From, St) ->
    {reply, {error, badarg}, St}.

-spec handle_cast(term(), #{}) -> {noreply, #{}}.
handle_cast(_Msg, St) ->
    {noreply, St}.

-spec terminate(term(), #{}) -> ok.
terminate(_Reason, _St) ->
    case ecall_nif:load_error() of
        none -> ecall_nif:log_off();
        _ -> ok
    end.
