%% @private
%% Receives the Rust side's `tracing' events and hands them to `logger'
%% with the same level, with the metadata `rust_target' (the Rust module).
%% The most verbose level forwarded is logger's primary level when this
%% process starts.
%%
%% None of ecall's events has a `domain': OTP's default handler prints
%% only events without one (or in `[otp]'), so a domain of ecall's own
%% would hide every line. They come from ecall's modules, so
%% `logger:set_application_level(ecall, Level)' selects how much of them
%% is printed.
-module(ecall_log).
-behaviour(gen_server).

-export([start_link/0, unexpected/3, unexpected_in/3]).

-include_lib("kernel/include/logger.hrl").
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

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info({ecall_log, Level, Target, Text}, St) ->
    ?LOG(Level, "~ts", [Text], #{rust_target => Target}),
    {noreply, St};
handle_info(Other, St) ->
    {noreply, unexpected_in(?MODULE, {info, Other}, St)}.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, {error, badarg}, map()}.
handle_call(Req, _From, St) ->
    {reply, {error, badarg}, unexpected_in(?MODULE, {call, Req}, St)}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(Msg, St) ->
    {noreply, unexpected_in(?MODULE, {cast, Msg}, St)}.

%% @doc For ecall's processes: logs an unexpected message `What' if it is
%% the first one `Who' got (`Seen' is how many came before) and returns
%% the new count. Later ones are only counted, so that a stray sender
%% cannot flood the log.
-spec unexpected(term(), term(), non_neg_integer()) -> pos_integer().
unexpected(Who, What, 0) ->
    ?LOG_WARNING("ecall: ~p got an unexpected message (logged once, later ones counted): ~0P",
                 [Who, What, 30]),
    1;
unexpected(_Who, _What, Seen) ->
    Seen + 1.

%% @doc unexpected/3 for a process whose state is a map: the count is its
%% key `unexpected'.
-spec unexpected_in(atom(), term(), map()) -> map().
unexpected_in(Who, What, St) ->
    St#{unexpected => unexpected(Who, What, maps:get(unexpected, St, 0))}.

-spec terminate(term(), #{}) -> ok.
terminate(_Reason, _St) ->
    case ecall_nif:load_error() of
        none -> ecall_nif:log_off();
        _ -> ok
    end.
