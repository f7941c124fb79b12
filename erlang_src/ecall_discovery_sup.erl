%% @private
%% Discovery, kept apart from the data path: the pg scope `ecall_pg' and
%% ecall_discovery, restarted together (one_for_all: the scope's state is
%% gone when it restarts, so the member joins again).
%%
%% Why apart: any node in the cluster can send the scope process a message,
%% and OTP's pg crashes on one it does not know (OTP 25's crashes on the
%% discovery message of OTP 29's pg, for example). Under ecall_sup's
%% rest_for_one that used to restart the C-node and every connection, and a
%% few such messages stopped ecall. Now a crash restarts discovery alone; if
%% it keeps crashing this supervisor gives up, and, being a temporary child
%% of ecall_sup, is not restarted: ecall goes on without discovery
%% (`ecall:connect/1' still works) and says so in the log.
-module(ecall_discovery_sup).
-behaviour(supervisor).

-export([start_link/0, init/1]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    Children = [
        #{id => ecall_pg, start => {pg, start_link, [ecall_pg]}},
        #{id => ecall_discovery, start => {ecall_discovery, start_link, []}}
    ],
    {ok, {#{strategy => one_for_all, intensity => 5, period => 10}, Children}}.
