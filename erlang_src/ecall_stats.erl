%% @private
%% The counters of ecall:stats/0,1 and ecall:last_stats/1, gathered from
%% where they are kept: each connection's transport, the C-node
%% identities, the receiver pool, and what closed connections left.
-module(ecall_stats).

-export([node/0, peer/1, last/1]).

%% @doc See ecall:stats/0 (the application is started).
-spec node() -> #{peers := #{node() => map()}, receivers := map(), identities := [map()],
                  identities_state := registered | none | {registering, term()},
                  closed_drops := non_neg_integer(),
                  fallback_sends := #{node() => non_neg_integer()}}.
node() ->
    Peers = maps:from_list([{N, S} || #{node := N} <- ecall_conn_sup:infos(),
                                      {ok, S} <- [peer(N)]]),
    Ids = case ecall_cnode:cnode() of
              {ok, CNode} ->
                  [I#{node := binary_to_atom(N)}
                   || #{node := N} = I <- ecall_nif:cnode_info(CNode)];
              {error, _} ->
                  []
          end,
    #{peers => Peers,
      identities => Ids,
      identities_state => ecall_cnode:state(),
      %% Requests dropped when connections closed (their peers' own
      %% counters are gone with them).
      closed_drops => ecall_conn_sup:closed_drops(),
      %% Sends that went by `!' instead of a transport, per node.
      fallback_sends => ecall_route:fallback_sends(),
      receivers => ecall_receiver_sup:counts()}.

%% @doc See ecall:stats/1 (the application is started).
-spec peer(node()) -> {ok, map()} | {error, not_connected}.
peer(Node) ->
    case ecall_route:peer(Node) of
        undefined -> {error, not_connected};
        {Mod, State, _Loops} ->
            {ok, (Mod:stats(State))#{fallback_sends => maps:get(Node, ecall_route:fallback_sends(), 0)}}
    end.

%% @doc See ecall:last_stats/1 (the application is started).
-spec last(node()) -> {ok, map()} | {error, not_found}.
last(Node) ->
    ecall_conn_sup:last(Node).
