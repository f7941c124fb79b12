%% An application that holds a node's orderly stop (init:stop/0) after
%% everything started later has stopped: started before ecall, it stops
%% after it. Its stop tells `Owner' `{held, Node, Pid}' and waits for
%% `release' at `Pid', so that a test can look at the node with ecall
%% stopped and every other process still there (ecall_loss_SUITE).
-module(ecall_test_hold).
-behaviour(application).

-export([load/1, start/2, stop/1]).

%% Loads the application on this node, `Owner' to be told of the hold.
load(Owner) ->
    ok = application:load({application, ?MODULE,
                           [{description, "holds an orderly stop"}, {vsn, "1"},
                            {modules, [?MODULE]}, {registered, []},
                            {applications, [kernel, stdlib]},
                            {mod, {?MODULE, Owner}}]}).

start(_Type, Owner) ->
    persistent_term:put({?MODULE, owner}, Owner),
    {ok, spawn(fun() -> receive never -> ok end end)}.

stop(_State) ->
    Owner = persistent_term:get({?MODULE, owner}),
    Owner ! {held, node(), self()},
    receive release -> ok end.
