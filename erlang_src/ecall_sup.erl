%% @private
%% Top supervisor. Order matters: the receiver pool is up before anything
%% can announce this node to peers (discovery comes after the data path),
%% and connections start after the C-node they use. rest_for_one: a restarted C-node takes the connections that
%% used its identities down with it.
-module(ecall_sup).
-behaviour(supervisor).

-export([start_link/0, init/1]).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    %% The values of the settings in force (refused ones keep the last
    %% good value), owned here so that they live as long as ecall.
    ok = ecall_config:keep_good(),
    %% The receivers' streams (ecall_receiver): they must outlive the
    %% workers and their supervisor, or a restart would take batches
    %% processed before it for new ones.
    ok = ecall_receiver:streams_init(),
    Children = [
        #{id => ecall_log, start => {ecall_log, start_link, []}},
        #{id => ecall_receiver_sup, type => supervisor,
          start => {ecall_receiver_sup, start_link, []}},
        #{id => ecall_cnode, start => {ecall_cnode, start_link, [{ecall_conn, move_to_nif, []}]}},
        #{id => ecall_conn_sup, type => supervisor,
          start => {ecall_conn_sup, start_link, []}},
        %% Temporary, and after the data path: peers can crash discovery
        %% (see ecall_discovery_sup), never the rest.
        #{id => ecall_discovery_sup, type => supervisor, restart => temporary,
          start => {ecall_discovery_sup, start_link, []}},
        %% Last: it only reads the others (periodic telemetry), and a crash
        %% of it restarts nothing else under rest_for_one.
        #{id => ecall_telemetry, start => {ecall_telemetry, start_link, []}}
    ],
    {ok, {#{strategy => rest_for_one, intensity => 5, period => 10}, Children}}.
