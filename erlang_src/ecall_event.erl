%% @private
%% ecall's telemetry events, as they happen: execute/3 hands each to
%% `telemetry:execute/3' when the module is there (the user's release has
%% the `telemetry' application), and nowhere otherwise. Whether it is there
%% is checked once and kept in a persistent term, checked again when ecall
%% starts (refresh/0), so that an event costs one persistent-term read when
%% nobody listens. The stats measured on demand or periodically are
%% ecall_telemetry's.
-module(ecall_event).

-export([available/0, refresh/0, execute/3]).

-type event() :: [atom(), ...].
-type measurements() :: #{atom() => number()}.
-type metadata() :: #{atom() => term()}.
-export_type([event/0, measurements/0, metadata/0]).

%% The module events go to (`telemetry'), or `false'.
-define(KEY, {ecall, telemetry}).

%% @doc Whether events go anywhere: `telemetry' was loadable when last
%% checked ({@link refresh/0}).
-spec available() -> boolean().
available() ->
    target() =/= false.

-spec target() -> telemetry | false.
target() ->
    case persistent_term:get(?KEY, undefined) of
        undefined -> refresh_target();
        Target -> Target
    end.

%% @doc Checks again whether `telemetry' can be loaded (ecall does at
%% start; call it after loading telemetry into a running node).
-spec refresh() -> boolean().
refresh() ->
    refresh_target() =/= false.

-spec refresh_target() -> telemetry | false.
refresh_target() ->
    Target = case code:ensure_loaded(telemetry) of
                 {module, telemetry} ->
                     case erlang:function_exported(telemetry, execute, 3) of
                         true -> telemetry;
                         false -> false
                     end;
                 {error, _} ->
                     false
             end,
    %% Putting the value already there costs nothing (no scan of the
    %% processes); it changes at most when telemetry comes or goes.
    persistent_term:put(?KEY, Target),
    Target.

%% @doc Emits `Event' with `telemetry:execute/3', or does nothing when
%% telemetry is not there. A handler that crashes is telemetry's business
%% (it detaches it); never the emitting process's: an exception that
%% comes out of telemetry anyway stops here.
-spec execute(event(), measurements(), metadata()) -> ok.
execute(Event, Measurements, Metadata) ->
    case target() of
        false ->
            ok;
        Mod ->
            %% The module is a variable: telemetry is optional, so neither
            %% xref nor Dialyzer may require it.
            try
                _ = Mod:execute(Event, Measurements, Metadata),
                ok
            catch
                error:undef ->
                    %% Unloaded since it was checked: check again, and
                    %% never take an ecall process down for it.
                    _ = refresh(),
                    ok;
                _:_ ->
                    ok
            end
    end.

