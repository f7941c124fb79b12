-module(ecall_example_app).
-behaviour(application).
-export([start/2, stop/1]).

start(_Type, _Args) ->
    ecall_example:start_link().

stop(_State) ->
    ok.
