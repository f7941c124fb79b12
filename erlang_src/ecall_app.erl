%% @private
-module(ecall_app).
-behaviour(application).

-export([start/2, stop/1]).

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    %% Every setting is checked here, once: a typo or a bad value stops the
    %% start with an error naming the key instead of failing later inside a
    %% caller's send.
    case ecall_config:validate() of
        ok ->
            %% telemetry may have come with a release upgrade or been
            %% loaded since the last start: check again.
            _ = ecall_telemetry:refresh(),
            ecall_sup:start_link();
        {error, _} = Error -> Error
    end.

-spec stop(term()) -> ok.
stop(_State) ->
    ok.
