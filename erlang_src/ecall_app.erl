%% @private
-module(ecall_app).
-behaviour(application).

-export([start/2, stop/1]).

-include_lib("kernel/include/logger.hrl").

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    %% Every setting is checked here, once: a typo or a bad value stops the
    %% start with an error naming the key instead of failing later inside a
    %% caller's send.
    case ecall_config:validate() of
        ok ->
            %% telemetry may have come with a release upgrade or been
            %% loaded since the last start: check again.
            _ = ecall_event:refresh(),
            ecall_sup:start_link();
        {error, Why} = Error ->
            ?LOG_ERROR("ecall: configuration refused, ecall not started: ~0p. "
                       "Fix the value in the ecall application environment "
                       "(sys.config or -ecall Key Value); every key is listed "
                       "by ecall_config:spec/0", [Why]),
            Error
    end.

-spec stop(term()) -> ok.
stop(_State) ->
    ok.
