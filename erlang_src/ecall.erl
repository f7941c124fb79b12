%% @doc ecall: send, cast and call between Erlang nodes, batched and
%% sharded past the single distribution queue of a node pair.
%%
%% `ecall:send(To, Msg)' is a drop-in for `To ! Msg'. When this node has an
%% ecall connection to the node of `To', the calling process encodes the
%% request once, pushes it into its shard of a Rust queue, and a C-node link
%% writes what the shard holds as one `{batch, Requests}' message to the
%% peer's receiver pool. Without a connection (or without the NIF, or on a
%% node that is not distributed) it is exactly `To ! Msg'.
%%
%% Ordering: messages from one caller to one node keep their order, as with
%% `!'. Nothing is promised between different callers.
-module(ecall).

-export([send/2, connect/1, disconnect/1, connections/0, nodes/0, stats/0, stats/1]).

-type dest() :: pid() | reference() | atom() | {atom(), node()}.
-export_type([dest/0]).

%% @doc Sends `Msg' to `To' and returns `Msg', like `To ! Msg'.
%%
%% `To' is a pid, an alias, a registered name or `{Name, Node}'. Raises
%% `badarg' for anything else, as `!' does. When the peer's queue budget is
%% full the caller waits for room (callers are admitted in the order they
%% came); if the connection closes meanwhile the message goes by `!'.
-spec send(dest(), Msg) -> Msg.
send(To, Msg) when is_pid(To); is_reference(To) ->
    case node(To) of
        Node when Node =:= node() -> To ! Msg;
        Node -> send_remote(Node, To, To, Msg)
    end;
send({Name, Node} = To, Msg) when is_atom(Name), is_atom(Node) ->
    case Node =:= node() of
        true -> To ! Msg;
        false -> send_remote(Node, Name, To, Msg)
    end;
send(To, Msg) when is_atom(To) ->
    To ! Msg;
send(To, Msg) ->
    erlang:error(badarg, [To, Msg]).

-spec send_remote(node(), pid() | reference() | atom(), dest(), Msg) -> Msg.
send_remote(Node, Dest, To, Msg) ->
    case ecall_conn:peer(Node) of
        undefined ->
            To ! Msg;
        Peer ->
            case ecall_nif:send(Peer, Dest, Msg) of
                ok -> Msg;
                closed -> To ! Msg;
                {full, Size} -> send_full(Peer, Size, Dest, To, Msg)
            end
    end.

%% Over the byte budget: queue up for room, then push as an admitted caller.
-spec send_full(ecall_nif:peer(), non_neg_integer(), pid() | reference() | atom(), dest(), Msg) -> Msg.
send_full(Peer, Size, Dest, To, Msg) ->
    Ref = make_ref(),
    case ecall_nif:wait_room(Peer, Size, Ref) of
        retry ->
            send_admitted(Peer, Dest, To, Msg);
        wait ->
            receive
                {ecall_room, Ref, true} -> send_admitted(Peer, Dest, To, Msg);
                {ecall_room, Ref, false} -> To ! Msg
            end
    end.

-spec send_admitted(ecall_nif:peer(), pid() | reference() | atom(), dest(), Msg) -> Msg.
send_admitted(Peer, Dest, To, Msg) ->
    case ecall_nif:send_admitted(Peer, Dest, Msg) of
        ok -> Msg;
        _Closed -> To ! Msg
    end.

%% @doc Connects to `Node' now (discovery does it on its own for nodes that
%% run ecall). Returns when every link is up.
-spec connect(node()) -> ok | {error, term()}.
connect(Node) when is_atom(Node) ->
    if
        Node =:= node() ->
            {error, local_node};
        true ->
            case ecall_cnode:cnode() of
                {ok, _} ->
                    Timeout = ecall_config:get(connect_timeout),
                    case ecall_conn_sup:start_conn(Node) of
                        {ok, Pid} -> ecall_conn:await(Pid, Timeout + 1000);
                        {error, {already_started, Pid}} -> ecall_conn:await(Pid, Timeout + 1000);
                        {error, Reason} -> {error, Reason}
                    end;
                {error, _} = E ->
                    E
            end
    end;
connect(Node) ->
    erlang:error(badarg, [Node]).

%% @doc Closes the connection to `Node'. What is still queued for it is
%% dropped (counted); later sends use native distribution until the next
%% `connect/1' (discovery reconnects only when the peer joins again).
-spec disconnect(node()) -> ok | {error, not_connected}.
disconnect(Node) when is_atom(Node) ->
    case whereis(ecall_conn:name(Node)) of
        undefined -> {error, not_connected};
        Pid -> ecall_conn:stop(Pid)
    end;
disconnect(Node) ->
    erlang:error(badarg, [Node]).

%% @doc Peers with a connection process, and its state.
-spec connections() -> [map()].
connections() ->
    [catch ecall_conn:info(Pid) || Pid <- ecall_conn_sup:conns()].

%% @doc This node's C-node names (they show in `nodes(hidden)' of peers).
-spec nodes() -> [node()].
nodes() ->
    ecall_cnode:nodes().

%% @doc Counters: per connected peer, and of this node's receiver pool.
%%
%% `identities' lists this node's C-node names with the incoming connections
%% they accepted and refused (a wrong cookie counts as refused).
-spec stats() -> #{peers := #{node() => map()}, receivers := map(), identities := [map()]}.
stats() ->
    Peers = maps:from_list([{N, S} || #{node := N} <- connections(),
                                      {ok, S} <- [stats(N)]]),
    C = ecall_receiver_sup:counters(),
    Ids = case ecall_cnode:cnode() of
              {ok, CNode} ->
                  [#{node => binary_to_atom(N), accepted => A, refused => R}
                   || {N, _, _, A, R} <- ecall_nif:cnode_info(CNode)];
              {error, _} ->
                  []
          end,
    #{peers => Peers,
      identities => Ids,
      receivers => #{batches => counters:get(C, 1), requests => counters:get(C, 2),
                     malformed => counters:get(C, 3), dead_letters => counters:get(C, 4)}}.

%% @doc Counters of the connection to `Node'.
-spec stats(node()) -> {ok, map()} | {error, not_connected}.
stats(Node) when is_atom(Node) ->
    case ecall_conn:peer(Node) of
        undefined -> {error, not_connected};
        Peer -> {ok, ecall_nif:peer_stats(Peer)}
    end;
stats(Node) ->
    erlang:error(badarg, [Node]).
