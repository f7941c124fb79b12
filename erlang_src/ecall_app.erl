%% @private
-module(ecall_app).
-behaviour(application).

-export([start/2, prep_stop/1, stop/1]).

-include_lib("kernel/include/logger.hrl").

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    ok = command_line(),
    %% Every setting is checked here, once: a typo or a bad value stops the
    %% start with an error naming the key instead of failing later inside a
    %% caller's send.
    case ecall_config:validate() of
        ok ->
            %% telemetry may have come with a release upgrade or been
            %% loaded since the last start: check again.
            _ = ecall_event:refresh(),
            ok = ecall_conn:started(),
            ecall_sup:start_link();
        {error, Why} = Error ->
            ?LOG_ERROR("ecall: configuration refused, ecall not started: ~0p~ts. "
                       "Fix the value in the ecall application environment "
                       "(sys.config or -ecall Key Value); every key is listed "
                       "by ecall_config:spec/0 and in doc/configuration.md", [Why, allowed(Why)]),
            Error
    end.

%% `-ecall Key Value' on erl's command line with a value that starts with
%% `-' (a negative number): erl takes the value for a flag of its own, and
%% the key is not set at all. Said, since ecall then starts with the
%% key's default and nothing else would show it.
-spec command_line() -> ok.
command_line() ->
    case init:get_argument(ecall) of
        {ok, Lists} ->
            _ = [?LOG_WARNING("ecall: -ecall ~ts has no value on the command line (erl takes "
                              "a value that starts with - for a flag of its own), so it is "
                              "not set and its default is in force; write a negative value "
                              "as -ecall ~ts '(-1)', or set it in sys.config",
                              [lists:last(Args), lists:last(Args)])
                 || Args <- Lists, length(Args) rem 2 =:= 1],
            ok;
        error ->
            ok
    end.

%% What the refused key allows, for the log line.
-spec allowed(ecall_config:error()) -> string().
allowed({bad_config, Key, _}) -> " (allowed: " ++ ecall_config:allowed(Key) ++ ")";
allowed({unknown_config_key, _}) -> "".

%% Before the supervision tree stops, while the receivers still run:
%% every peer writes out what it holds for this node and closes its
%% connection (ecall_conn:stopping/0), so that an orderly stop loses
%% nothing that was sent through ecall.
-spec prep_stop(term()) -> term().
prep_stop(State) ->
    ok = ecall_conn:stopping(),
    State.

-spec stop(term()) -> ok.
stop(_State) ->
    ok.
