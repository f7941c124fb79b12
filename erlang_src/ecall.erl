%% @doc ecall: send, cast and call between Erlang nodes, batched and
%% sharded past the single distribution queue of a node pair.
%%
%% `ecall:send(To, Msg)' is a drop-in for `To ! Msg'. When this node has an
%% ecall connection to the node of `To', the calling process encodes the
%% request once, pushes it into its shard of a Rust queue, and a C-node link
%% writes what the shard holds as one `{batch, Requests}' message to the
%% peer's receiver pool. When the NIF cannot load (or with the application
%% env `transport' set to `erlang'), a pool of Erlang proxies does the
%% batching over plain distribution instead. Without a connection, or on a
%% node that is not distributed, it is exactly `To ! Msg'.
%%
%% Ordering: messages from one caller to one node keep their order, as with
%% `!'. Nothing is promised between different callers.
-module(ecall).

-export([send/2, send/3, send_many/2, send_group/3, cast/4, call/4, call/5]).
-export([cast_one/4, cast_all/4,
         call_one/4, call_one/5, call_any/4, call_any/5,
         call_all/4, call_all/5, call_all_wait/4, call_all_wait/5]).
-export([connect/1, disconnect/1, connections/0, identities/0, stats/0, stats/1,
         last_stats/1, info/0, info/1, info_lines/0, info_lines/1]).

-type dest() :: pid() | reference() | atom() | {atom(), node()}.
%% Where a message goes: a pid, an alias, a registered name, or `{Name,
%% Node}', as with `!'.

-type call_result() :: {ok, term()} | {error, term()}.


%% What call/4,5 return: see the table of {@link call/5}.

-type send_option() :: urgent.
%% An option of {@link send/3}.
-export_type([dest/0, call_result/0, send_option/0]).

%% @doc Sends `Msg' to `To' and returns `Msg', like `To ! Msg'.
%%
%% `To' is a pid, an alias, a registered name or `{Name, Node}'. Raises
%% `badarg' for anything else, as `!' does. When the peer's byte budget is
%% full, the `overflow' setting decides: `block' (default) waits for room
%% (callers are admitted in the order they came; if the connection closes
%% meanwhile the message goes by `!'); `error' and `drop' drop the message
%% and count it (`overflow_drops'): a send has no error to return.
-spec send(dest(), Msg) -> Msg.
send(To, Msg) ->
    send(To, Msg, false, [To, Msg]).

%% @doc send/2 with options; `send(To, Msg, [])' is `send(To, Msg)'.
%%
%% `urgent': the message is not held back on a busy link. A link that
%% carries many requests waits up to 1-2 ms for a batch worth a write
%% (gathering, see doc/behaviour.md). A process that waits for an answer before
%% it sends again brings no company meanwhile, so each of its messages
%% would wait that long on the way out, and the answer again on the way
%% back: a request and its reply exchanged with send/2 pay 2-4 ms a round
%% trip on a busy link. An urgent message ends that wait (or keeps the
%% link from starting it) and is written at once, alone if the link's
%% writer sleeps. Send the reply urgent too. Calls (call/4,5) decide this
%% by themselves; sends never do, since nothing tells a send that an answer
%% is awaited. (A link that is not busy writes every message at once,
%% urgent or not.) The cost: the batch it cuts short, so keep it for
%% messages someone waits on. Order is kept as for send/2.
%%
%% Raises `badarg' for an unknown option, or as send/2 does.
-spec send(dest(), Msg, [send_option()]) -> Msg.
send(To, Msg, Opts) ->
    send(To, Msg, urgent_option(Opts, false, [To, Msg, Opts]), [To, Msg, Opts]).

%% @doc Sends `Msg' to every destination of `Dests', as `[To ! Msg || To
%% <- Dests]' would, and returns `ok'.
%%
%% Each destination is what send/2 takes: a pid, an alias, a registered
%% name or `{Name, Node}', on this node or any other. Targets on this node
%% get it by `!'. For each other node with an ecall connection, the
%% message goes as one request with the node's targets, encoded once and
%% counted once against that peer's byte budget, and the peer's receiver
%% delivers it to each target there; to a node without one, each target
%% gets it as send/2 would send it. Per-caller order to each target is
%% that of send/2, also for a caller that mixes send/2 and send_many/2.
%% Targets on nodes that are down are ignored, as `!' ignores them. Raises
%% `badarg', sending nothing, when `Dests' is not a proper list of
%% destinations.
-spec send_many([dest()], term()) -> ok.
send_many(Dests, Msg) ->
    case ecall_route:send_many(Dests, Msg) of
        ok -> ok;
        badarg -> erlang:error(badarg, [Dests, Msg])
    end.

%% @doc Sends `Msg' to every member of the `pg' group `Group' of scope
%% `Scope', on every node, as send_many/2 does, and returns `ok'.
%%
%% The members are those `pg:get_members(Scope, Group)' returns at the
%% call: a process that joins after it does not get this message, one
%% that left before it does not; one that leaves while the message is on
%% its way gets it as `!' would deliver it (or not, if it is gone).
%% Raises `badarg' when `Scope' is not a running pg scope here.
-spec send_group(atom(), term(), term()) -> ok.
send_group(Scope, Group, Msg) when is_atom(Scope) ->
    %% A scope is a registered process; pg:get_members/2 answers [] for
    %% one that does not run, which would hide a misspelt scope.
    case whereis(Scope) of
        undefined -> erlang:error(badarg, [Scope, Group, Msg]);
        _ -> send_many(pg:get_members(Scope, Group), Msg)
    end;
send_group(Scope, Group, Msg) ->
    erlang:error(badarg, [Scope, Group, Msg]).

%% send/2,3: the destination checked (`Args' for the badarg), then the
%% send path (ecall_route).
-spec send(dest(), Msg, boolean(), [term()]) -> Msg.
send(To, Msg, Urgent, _Args) when is_pid(To); is_reference(To); is_atom(To) ->
    ecall_route:send(To, Msg, Urgent);
send({Name, Node} = To, Msg, Urgent, _Args) when is_atom(Name), is_atom(Node) ->
    ecall_route:send(To, Msg, Urgent);
send(_To, _Msg, _Urgent, Args) ->
    erlang:error(badarg, Args).

%% The options of send/3, a proper list of `urgent': whether one is there.
-spec urgent_option(term(), boolean(), [term()]) -> boolean().
urgent_option([urgent | Rest], _Urgent, Args) -> urgent_option(Rest, true, Args);
urgent_option([], Urgent, _Args) -> Urgent;
urgent_option(_Bad, _Urgent, Args) -> erlang:error(badarg, Args).

%% @doc Applies `M:F(A...)' on `Node' in a new process and returns `ok' at
%% once, like `erpc:cast/4'. With an ecall connection the request travels
%% in a batch; without one this is `erpc:cast/4'. Raises `badarg' for
%% arguments of the wrong types. When the peer's byte budget is full:
%% waits for room under `overflow' `block', returns `{error, overload}'
%% under `error', drops the cast (counted) and returns `ok' under `drop'.
-spec cast(node(), module(), atom(), [term()]) -> ok | {error, overload}.
cast(Node, M, F, A) when is_atom(Node), is_atom(M), is_atom(F), is_list(A) ->
    ecall_rpc:cast(Node, M, F, A);
cast(Node, M, F, A) ->
    erlang:error(badarg, [Node, M, F, A]).

%% @equiv call(Node, M, F, A, infinity)
%% @doc call/5 without a timeout. What it returns: the table of {@link
%% call/5}.
-spec call(node(), module(), atom(), [term()]) -> call_result().
call(Node, M, F, A) ->
    call(Node, M, F, A, infinity).

%% @doc Applies `M:F(A...)' on `Node' and returns its result.
%%
%% With an ecall connection the request and its reply travel in batches
%% (the reply through the called node's own ecall links); without one this
%% is `erpc:call/5', its results mapped to the same return values. What
%% call/4,5 return, against what `erpc:call/4,5' would:
%%
%% <table border="1" summary="What ecall:call/5 returns, and erpc:call/5">
%% <tr><th>the called function ...</th><th>`ecall:call'</th><th>`erpc:call'</th></tr>
%% <tr><td>returns `V' (not `{error, _}')</td><td>`{ok, V}'</td><td>`V'</td></tr>
%% <tr><td>returns `{error, E}'</td><td>`{error, E}'</td><td>`{error, E}'</td></tr>
%% <tr><td>throws `V'</td><td>as if it returned `V'</td><td>throws `V'</td></tr>
%% <tr><td>raises error or exit `R' (also `undef' when the function is
%%     not there on the peer)</td><td>`{error, {exception, Class, R,
%%     Stack}}': `Class' is `error' or `exit', `Stack' the stack trace of
%%     the called function for an error, `[]' for an exit</td><td>raises `{exception, R, Stack}' (error),
%%     `{exception, R}' (exit)</td></tr>
%% <tr><td>cannot be reached: node down, no connection</td>
%%     <td>`{error, {badrpc, R}}': `R' is `noconnection', `nodedown', or the
%%     reason the connection closed, such as `transport_change' (the call was in
%%     flight for more than 60 s while its peer moved from the pure-Erlang
%%     transport to the links)</td>
%%     <td>raises `{erpc, noconnection}'</td></tr>
%% <tr><td>cannot be spawned on the peer (its process table is full)</td>
%%     <td>`{error, {badrpc, system_limit}}'</td><td>raises</td></tr>
%% <tr><td>does not answer within `Timeout'</td><td>`{error, {badrpc, timeout}}'</td>
%%     <td>raises `{erpc, timeout}'</td></tr>
%% <tr><td>is not called: the peer's byte budget is full and `overflow' is
%%     `error' or `drop' (nothing was sent)</td><td>`{error, overload}'</td>
%%     <td>(no budget)</td></tr>
%% </table>
%%
%% After a timeout no late reply ever reaches the caller's mailbox.
%%
%% A call made less than 2 ms after the caller's last one returned (a
%% caller in a closed loop) is urgent: the links do not hold it or its
%% reply back to batch it with others, unless many callers are in such
%% loops with the same node. For that the calling process keeps two
%% entries in its process dictionary: <code>'$ecall_last_call'</code> (when its last
%% call returned) and <code>{'$ecall_loop_starts', Node}</code> (a count seen at its
%% last closed-loop call to `Node').
-spec call(node(), module(), atom(), [term()], timeout()) -> call_result().
call(Node, M, F, A, Timeout)
  when is_atom(Node), is_atom(M), is_atom(F), is_list(A),
       (Timeout =:= infinity orelse (is_integer(Timeout) andalso Timeout >= 0)) ->
    ecall_rpc:call(Node, M, F, A, Timeout);
call(Node, M, F, A, Timeout) ->
    erlang:error(badarg, [Node, M, F, A, Timeout]).

%%--------------------------------------------------------------------
%% Several nodes
%%
%% A node that is gone answers `{error, {badrpc, _}}'. The `call_*'
%% functions ignore such nodes unless `RpcErr' (the optional fifth
%% argument) is true, in which case they count as errors. The local node,
%% when listed, is served locally, without the transport.

%% @doc Casts to one node of `Nodes': the local node if listed, else one at
%% random. `{error, none_is_available}' for an empty list.
-spec cast_one([node()], module(), atom(), [term()]) ->
          ok | {error, none_is_available | overload}.
cast_one([], _M, _F, _A) ->
    {error, none_is_available};
cast_one(Nodes, M, F, A) when is_list(Nodes) ->
    cast(ecall_patterns:pick_local(Nodes), M, F, A);
cast_one(Nodes, M, F, A) ->
    erlang:error(badarg, [Nodes, M, F, A]).

%% @doc Casts to every node of `Nodes'.
-spec cast_all([node()], module(), atom(), [term()]) -> ok.
cast_all(Nodes, M, F, A) when is_list(Nodes) ->
    ok = check_request(Nodes, M, F, A, [Nodes, M, F, A]),
    lists:foreach(fun(N) -> _ = cast(N, M, F, A) end, Nodes);
cast_all(Nodes, M, F, A) ->
    erlang:error(badarg, [Nodes, M, F, A]).

%% @equiv call_one(Nodes, M, F, A, false)
-spec call_one([node()], module(), atom(), [term()]) ->
          {ok, {node(), term()}} | {error, term()}.
call_one(Nodes, M, F, A) ->
    call_one(Nodes, M, F, A, false).

%% @doc Calls the nodes one at a time, the local node first if listed, the
%% others in random order, until one answers `{ok, _}': returns `{ok, {Node,
%% Result}}'. When none does: `{error, [{Node, Error}]}', or `{error,
%% none_is_available}' when there was no error to report.
-spec call_one([node()], module(), atom(), [term()], boolean()) ->
          {ok, {node(), term()}} | {error, term()}.
call_one(Nodes, M, F, A, RpcErr) when is_list(Nodes), is_boolean(RpcErr) ->
    ecall_patterns:call_one(Nodes, M, F, A, RpcErr);
call_one(Nodes, M, F, A, RpcErr) ->
    erlang:error(badarg, [Nodes, M, F, A, RpcErr]).

%% @equiv call_any(Nodes, M, F, A, false)
-spec call_any([node()], module(), atom(), [term()]) ->
          {ok, {node(), term()}} | {error, term()}.
call_any(Nodes, M, F, A) ->
    call_any(Nodes, M, F, A, false).

%% @doc Calls all nodes in parallel and returns the first `{ok, {Node,
%% Result}}'; the other answers are dropped. When none answers `{ok, _}':
%% `{error, [{Node, Error}]}' or `{error, none_is_available}'.
-spec call_any([node()], module(), atom(), [term()], boolean()) ->
          {ok, {node(), term()}} | {error, term()}.
call_any(Nodes, M, F, A, RpcErr) when is_list(Nodes), is_boolean(RpcErr) ->
    ok = check_request(Nodes, M, F, A, [Nodes, M, F, A, RpcErr]),
    ecall_patterns:call_any(Nodes, M, F, A, RpcErr);
call_any(Nodes, M, F, A, RpcErr) ->
    erlang:error(badarg, [Nodes, M, F, A, RpcErr]).

%% @equiv call_all(Nodes, M, F, A, false)
-spec call_all([node()], module(), atom(), [term()]) ->
          {ok, [{node(), term()}]} | {error, term()}.
call_all(Nodes, M, F, A) ->
    call_all(Nodes, M, F, A, false).

%% @doc Calls all nodes in parallel and requires every answer to be `{ok,
%% _}': returns `{ok, [{Node, Result}]}' in the order of `Nodes', or the
%% first `{error, {Node, Error}}' as soon as it comes.
%% `{error, none_is_available}' when no node answered.
-spec call_all([node()], module(), atom(), [term()], boolean()) ->
          {ok, [{node(), term()}]} | {error, term()}.
call_all(Nodes, M, F, A, RpcErr) when is_list(Nodes), is_boolean(RpcErr) ->
    ok = check_request(Nodes, M, F, A, [Nodes, M, F, A, RpcErr]),
    ecall_patterns:call_all(Nodes, M, F, A, RpcErr);
call_all(Nodes, M, F, A, RpcErr) ->
    erlang:error(badarg, [Nodes, M, F, A, RpcErr]).

%% @equiv call_all_wait(Nodes, M, F, A, false)
-spec call_all_wait([node()], module(), atom(), [term()]) ->
          {[{node(), term()}], [{node(), term()}]}.
call_all_wait(Nodes, M, F, A) ->
    call_all_wait(Nodes, M, F, A, false).

%% @doc Calls all nodes in parallel, waits for every answer and returns
%% `{Replies, Rejects}': `[{Node, Result}]' of the `{ok, _}' answers and
%% `[{Node, Error}]' of the others (without `{badrpc, _}' ones unless
%% `RpcErr'), both in the order of `Nodes'.
-spec call_all_wait([node()], module(), atom(), [term()], boolean()) ->
          {[{node(), term()}], [{node(), term()}]}.
call_all_wait(Nodes, M, F, A, RpcErr) when is_list(Nodes), is_boolean(RpcErr) ->
    ok = check_request(Nodes, M, F, A, [Nodes, M, F, A, RpcErr]),
    ecall_patterns:call_all_wait(Nodes, M, F, A, RpcErr);
call_all_wait(Nodes, M, F, A, RpcErr) ->
    erlang:error(badarg, [Nodes, M, F, A, RpcErr]).

%% The checks of cast/4 and call/5, made before anything is sent: a
%% parallel pattern's helper that raised `badarg' would never answer, and
%% the pattern would wait for it forever.
-spec check_request(term(), term(), term(), term(), [term()]) -> ok.
check_request(Nodes, M, F, A, Args) ->
    case is_atom(M) andalso is_atom(F) andalso is_list(A)
        andalso all_atoms(Nodes) of
        true -> ok;
        false -> erlang:error(badarg, Args)
    end.

-spec all_atoms(term()) -> boolean().
all_atoms([N | Rest]) when is_atom(N) -> all_atoms(Rest);
all_atoms([]) -> true;
all_atoms(_) -> false.

%% @doc Connects to `Node' now (discovery does it on its own for nodes that
%% run ecall). Returns when every link is up; `{error, not_started}' when
%% the application is not started; `{error, normal}' when disconnect/1
%% closed the connection before it was up; `{error, nodedown | noproc |
%% closing}' when three connections to it in a row, opened by others, ended
%% while this waited on them; `{error, {version, V}}' when `Node' runs a
%% release of ecall whose requests are of another version `V' (traffic to
%% it goes by plain distribution; the log says so once); `{error,
%% noconnection}' when `Node' cannot be reached (not running, not
%% there); else why it failed (`timeout' after `connect_timeout', ...).
%% Raises `badarg' when `Node' is not a node name (`Name@Host', neither
%% part empty).
-spec connect(node()) -> ok | {error, term()}.
connect(Node) when is_atom(Node) ->
    case node_name(Node) of
        false -> erlang:error(badarg, [Node]);
        true ->
            case started() of
                true -> ecall_conn:connect(Node);
                false -> {error, not_started}
            end
    end;
connect(Node) ->
    erlang:error(badarg, [Node]).

%% Whether `Node' is a node name: `Name@Host', neither part empty.
-spec node_name(atom()) -> boolean().
node_name(Node) ->
    case string:split(atom_to_list(Node), "@") of
        [[_ | _], [_ | _] = Host] -> not lists:member($@, Host);
        _ -> false
    end.

%% @doc Closes the connection to `Node'. What is still queued for it is
%% dropped (counted in `closed_drops'); later sends use native distribution
%% until the next `connect/1' (discovery reconnects only when the peer joins
%% again). `{error, not_started}' when the application is not started.
-spec disconnect(node()) -> ok | {error, not_connected | not_started}.
disconnect(Node) when is_atom(Node) ->
    case {started(), whereis(ecall_conn:name(Node))} of
        {false, _} -> {error, not_started};
        {true, undefined} -> {error, not_connected};
        {true, Pid} -> ecall_conn:stop(Pid)
    end;
disconnect(Node) ->
    erlang:error(badarg, [Node]).

%% @doc Peers with a connection process, and its state; `{error,
%% not_started}' when the application is not started.
-spec connections() -> [map()] | {error, not_started}.
connections() ->
    case started() of
        true -> ecall_conn_sup:infos();
        false -> {error, not_started}
    end.

%% @doc This node's own C-node identities, such as `a_ecall_1@host': the
%% hidden names its links connect from (they show in `nodes(hidden)' of
%% peers). Not the peers: those are {@link connections/0}.
-spec identities() -> [node()].
identities() ->
    ecall_cnode:nodes().

%% @doc Counters: per connected peer, and of this node's receiver pool.
%%
%% `identities' lists this node's C-node names with the incoming connections
%% they accepted and refused (a wrong cookie counts as refused), whose
%% handshake timed out (`handshakes_timed_out'), that were closed to make room
%% for a newer one while 64 handshakes were under way
%% (`handshakes_shed_idle': before they sent their name,
%% `handshakes_shed_stalled': after it), `accept_errors', and what
%% those connections sent: `inbound_frames', `inbound_answered' (pings),
%% `inbound_ignored' and `inbound_malformed' (connections closed because a
%% frame was malformed or over the size bound). `identities_state' is
%% `registered', `none' (no identities: not distributed, no NIF, or a
%% distribution the links cannot join; the log says which), or
%% `{registering, Why}': their registration with epmd failed (`Why' is
%% `{name_taken, Name}' when another node holds a name) and is retried in
%% the background, while connections use the pure-Erlang transport.
%%
%% `{error, not_started}' when the application is not started.
-spec stats() -> #{peers := #{node() => map()}, receivers := map(), identities := [map()],
                   identities_state := registered | none | {registering, term()},
                   closed_drops := non_neg_integer()}
               | {error, not_started}.
stats() ->
    case started() of
        true -> ecall_stats:node();
        false -> {error, not_started}
    end.

%% @doc Counters of the connection to `Node'. `{error, not_connected}'
%% when this node has no ecall connection to it (traffic to it goes by
%% plain distribution), `{error, not_started}' when the application is not
%% started.
-spec stats(node()) -> {ok, map()} | {error, not_connected | not_started}.
stats(Node) when is_atom(Node) ->
    case started() of
        true -> ecall_stats:peer(Node);
        false -> {error, not_started}
    end;
stats(Node) ->
    erlang:error(badarg, [Node]).

%% @doc The stats of the last connection to `Node' that closed, as {@link
%% stats/1} returned them at the close, with `state => closed', `reason'
%% (why it closed: `nodedown', `normal' for `disconnect/1', ...),
%% `closed_at' (system time, ms) and `closed_drops' (requests still queued
%% when it closed, dropped; `dropped' is what its links had lost before).
%% A peer's live counters go with its connection: this is where they are
%% read after it. Kept until the next close of that peer (for the last
%% 1,000 peers that closed), also while it is connected again.
%% `{error, not_found}' when no connection to `Node' has closed.
%% `{error, not_started}' when the application is not started.
-spec last_stats(node()) -> {ok, map()} | {error, not_found | not_started}.
last_stats(Node) when is_atom(Node) ->
    case started() of
        true -> ecall_stats:last(Node);
        false -> {error, not_started}
    end;
last_stats(Node) ->
    erlang:error(badarg, [Node]).

%% @doc Prints a readable status on the caller's group leader: this
%% node's transport, C-node identities and receiver pool, each peer with
%% its links and counters, and the peers whose connection closed (from
%% {@link last_stats/1}). The numbers are those of {@link stats/0}; this is
%% for a person at a shell. Before the application is started it says so.
%% From a release's `bin/app eval' or `bin/app rpc', whose output may go to
%% the node's own console, use {@link info_lines/0}.
-spec info() -> ok.
info() ->
    ecall_info:print().

%% @doc Prints the status of the connection to `Node' (its links and
%% counters), or of its last closed connection. `{error, not_connected}'
%% when there is neither, `{error, not_started}' when the application is
%% not started.
-spec info(node()) -> ok | {error, not_connected | not_started}.
info(Node) when is_atom(Node) ->
    ecall_info:print(Node);
info(Node) ->
    erlang:error(badarg, [Node]).

%% @doc What {@link info/0} prints, returned as a list of lines: for
%% `bin/app eval "ecall:info_lines()."' and `bin/app rpc ecall info_lines',
%% which show the value returned to the caller.
-spec info_lines() -> [string()].
info_lines() ->
    ecall_info:lines().

%% @doc What {@link info/1} prints, returned as a list of lines.
-spec info_lines(node()) -> [string()] | {error, not_connected | not_started}.
info_lines(Node) when is_atom(Node) ->
    ecall_info:lines(Node);
info_lines(Node) ->
    erlang:error(badarg, [Node]).

%% Whether the application runs here (its top supervisor is up).
-spec started() -> boolean().
started() ->
    whereis(ecall_sup) =/= undefined.
