%% @private
%% The data path of a send (ecall:send/2,3, and the replies of calls
%% answered by alias): whether a message to another node goes by native
%% `!' or through the ecall transport of a connection to that node, and
%% how one caller's messages to one node keep their order when they switch
%% from one path to the other.
%%
%% The choice, per message (send_remote/5): the transport of the node's
%% connection when one is published (route/1, written by ecall_conn); native `!' when
%% none is (no connection, or one still opening), when it is closing, and
%% when its transport finds it closed at the push. A message to this node
%% is always `!'. When the peer's byte budget is full and the transport
%% refuses the message (`overflow' `error' or `drop'), it is dropped and
%% counted: a send has no error to return.
%%
%% Per-caller order across a switch of paths. A message sent by `!' travels
%% on the node's own distribution connection; one sent through a transport
%% travels another way (a C-node link, or a proxy's batch replayed by a
%% receiver worker), and could overtake it, or be overtaken:
%%
%% - `!' then transport: the process remembers the nodes it sent to by `!'
%%   (process dictionary, written on that path only), and its next send to
%%   one of them through a transport first makes a round trip on the
%%   native connection, which the peer handles only after everything this
%%   caller sent before it on that connection has been delivered.
%% - transport then `!' (the connection is closing): while a connection
%%   closes it is published as `{closing, Pid}', and a send by `!' first
%%   waits for that process, which makes sure that what its transport
%%   wrote has been replayed on the peer (ecall_conn:terminate/2; at most a
%%   few seconds).
%%
%% Within one path order holds by itself: `!' on the node's own
%% connection, a transport in per-caller order (ecall_transport).
%%
%% Cost on the transport path: one process-dictionary read (an atom key,
%% `undefined' for a process that never sent by `!'); one round trip per
%% caller per switch to a transport.
-module(ecall_route).

-export([send/3, send_to/3, send_remote/5, send_many/2, send_many/3]).
-export([route/1, peer/1, await_close/1, plain/1, plain/2, publish/2, closing/2, unpublish/1,
         fallback_sends/0]).

-include_lib("kernel/include/logger.hrl").

%% Process dictionary key: the nodes this process sent to by `!' since its
%% last send to them through a transport (see native/3).
-define(NATIVE_SENT, '$ecall_native_sent').
-define(BARRIER_TIMEOUT, 5000).

%% send_many/2: lists of at most this many targets, each on a node of its
%% own, go as one send each (see one_per_node/4). Not measured beyond the
%% one-per-node broadcast over 3 peers (bench/run.sh fanout).
-define(ONE_PER_NODE_MAX, 16).

%% What a connection publishes for its peer (persistent_term, so the send
%% path reads it without a lock or a copy): its transport once every link
%% is up, `{closing, Pid}' while it closes.
-define(KEY(Node), {ecall_peer, Node}).

%% @doc What is published for `Node', for the send path: the transport
%% (ecall_transport:t()), `{closing, Pid}' while a connection closes
%% (ecall_conn:terminate/2), or `undefined'.
-spec route(node()) -> ecall_transport:t() | {closing, pid()} | undefined.
route(Node) ->
    persistent_term:get(?KEY(Node), undefined).

%% @doc The published transport of `Node', or `undefined' (none, or
%% closing).
-spec peer(node()) -> ecall_transport:t() | undefined.
peer(Node) ->
    case route(Node) of
        {closing, _} -> undefined;
        Route -> Route
    end.

%% @doc Publishes `Node''s transport: sends to it go through it from now.
%% A new key costs no global GC (only an overwrite or an erase does, once
%% per connection lifetime). Traffic to it by plain distribution is said
%% again after this (plain/1).
-spec publish(node(), ecall_transport:t()) -> ok.
publish(Node, Transport) ->
    persistent_term:put(?KEY(Node), Transport),
    _ = ets:delete(ecall_plain_said, Node),
    ok.

%% @doc Publishes `Node''s connection as closing, by process `Pid': a send
%% by `!' waits for `Pid' to end (await_close/1).
-spec closing(node(), pid()) -> ok.
closing(Node, Pid) ->
    persistent_term:put(?KEY(Node), {closing, Pid}).

%% @doc Nothing published for `Node' any more.
-spec unpublish(node()) -> ok.
unpublish(Node) ->
    _ = persistent_term:erase(?KEY(Node)),
    ok.

%% @doc Returns when no connection to `Node' is closing: at once, or when
%% the closing one has made sure that what its transport wrote has been
%% replayed on the peer (ecall_conn:terminate/2). For callers about to
%% send by `!' (per-caller order).
-spec await_close(node()) -> ok.
await_close(Node) ->
    case route(Node) of
        {closing, Pid} ->
            Ref = monitor(process, Pid),
            receive {'DOWN', Ref, process, Pid, _} -> ok end;
        _ ->
            ok
    end.

%% @doc Traffic to `Node' goes by plain distribution (`!', erpc) because
%% no ecall connection to it is up: said once per node, at notice, so that
%% the default log shows that the links are not in use (and again after a
%% connection to it has been up). Quiet before the application starts.
-spec plain(node()) -> ok.
plain(Node) ->
    plain(Node, no_connection).

%% @doc plain/1, saying why: no connection is up, or `{version, Theirs,
%% Mine}': `Node' speaks another version of the requests (ecall_conn),
%% so no connection will be.
-spec plain(node(), no_connection | {version, pos_integer(), pos_integer()}) -> ok.
plain(Node, Why) ->
    try ets:member(ecall_plain_said, Node) of
        true -> ok;
        false ->
            case ets:insert_new(ecall_plain_said, {Node}) of
                true -> say_plain(Node, Why);
                false -> ok
            end
    catch
        error:badarg -> ok
    end.

-spec say_plain(node(), no_connection | {version, pos_integer(), pos_integer()}) -> ok.
say_plain(Node, no_connection) ->
    ?LOG_NOTICE("ecall: no ecall connection to ~p is up: traffic to it goes "
                "by plain distribution (! and erpc) until one is "
                "(ecall:connect/1, or discovery if ecall runs there)", [Node]);
say_plain(Node, {version, Theirs, Mine}) ->
    ?LOG_NOTICE("ecall: ~p runs a release of ecall that speaks version ~b of its requests, "
                "this node version ~b: no ecall connection between them; traffic to it goes "
                "by plain distribution (! and erpc). Run the same ecall release on both",
                [Node, Theirs, Mine]).

%% @doc Sends `Msg' to `To', a destination ecall:send/2 checked: `!' for a
%% name or a process of this node, else as send_remote/5 does. `Urgent':
%% see ecall:send/3.
-spec send(ecall:dest(), Msg, boolean()) -> Msg.
send(To, Msg, Urgent) when is_pid(To); is_reference(To) ->
    send_to(To, Msg, Urgent);
send({Name, Node} = To, Msg, Urgent) ->
    case Node =:= node() of
        true -> To ! Msg;
        false -> send_remote(Node, Name, To, Msg, Urgent)
    end;
send(To, Msg, _Urgent) ->
    To ! Msg.

%% @doc Sends `Msg' to the pid or alias `To': `!' when it is on this node,
%% else as send_remote/5 does. `Urgent': see ecall:send/3.
-spec send_to(pid() | reference(), Msg, boolean()) -> Msg.
send_to(To, Msg, Urgent) ->
    case node(To) of
        Node when Node =:= node() -> To ! Msg;
        Node -> send_remote(Node, To, To, Msg, Urgent)
    end.

%% @doc Sends `Msg' to `To' on the other node `Node', through the
%% transport of its connection if it has one, else by `!' (see the module
%% comment); `Dest' is `To' as the transport names it (a pid, an alias or a
%% registered name).
-spec send_remote(node(), pid() | reference() | atom(), ecall:dest(), Msg, boolean()) -> Msg.
send_remote(Node, Dest, To, Msg, Urgent) ->
    case route(Node) of
        {Mod, State, _Loops} ->
            after_native(Node),
            case Mod:push(State, ecall_request:send(Dest, Msg), Urgent) of
                ok -> Msg;
                closed -> native(Node, To, Msg);
                %% A send has no error to return: under `error' as under
                %% `drop' the message is dropped and counted.
                overload -> Msg
            end;
        undefined ->
            plain(Node),
            native(Node, To, Msg);
        {closing, _} ->
            native(Node, To, Msg)
    end.

%% @doc ecall:send_many/2: `Msg' to every destination of `Dests' (see
%% there), or `badarg', having sent nothing, when `Dests' is not a proper
%% list of destinations.
-spec send_many(term(), term()) -> ok | badarg.
send_many(Dests, Msg) ->
    case one_per_node(Dests, node(), [], ?ONE_PER_NODE_MAX) of
        true ->
            %% A few targets, each on a node of its own (a broadcast to one
            %% process per node): a send each costs less than the grouping.
            lists:foreach(fun(To) -> send(To, Msg, false) end, Dests);
        false ->
            case group(Dests, node(), [], '$none', [], #{}) of
                {Local, Remote} ->
                    lists:foreach(fun(To) -> To ! Msg end, Local),
                    maps:foreach(fun(Node, Dests1) ->
                                         send_many(Node, lists:reverse(Dests1), Msg)
                                 end, Remote);
                badarg ->
                    badarg
            end
    end.

%% Whether `Dests' is a proper list of at most `Max' destinations whose
%% remote ones are each on a node of their own (local ones go by `!'
%% either way). Anything else (a longer list, two targets on one node, a
%% bad destination) is left to the grouping, which also raises badarg.
-spec one_per_node(term(), node(), [node()], non_neg_integer()) -> boolean().
one_per_node([], _Me, _Seen, _Max) ->
    true;
one_per_node(_Dests, _Me, _Seen, 0) ->
    false;
one_per_node([To | Rest], Me, Seen, Max) when is_pid(To); is_reference(To) ->
    one_on(node(To), Rest, Me, Seen, Max);
one_per_node([{Name, Node} | Rest], Me, Seen, Max) when is_atom(Name), is_atom(Node) ->
    one_on(Node, Rest, Me, Seen, Max);
one_per_node([To | Rest], Me, Seen, Max) when is_atom(To) ->
    one_per_node(Rest, Me, Seen, Max - 1);
one_per_node(_Bad, _Me, _Seen, _Max) ->
    false.

-spec one_on(node(), term(), node(), [node()], pos_integer()) -> boolean().
one_on(Me, Rest, Me, Seen, Max) ->
    one_per_node(Rest, Me, Seen, Max - 1);
one_on(Node, Rest, Me, Seen, Max) ->
    not lists:member(Node, Seen) andalso one_per_node(Rest, Me, [Node | Seen], Max - 1).

%% Local destinations in order, and the others by node (each list
%% reversed, a name without its node); `badarg' for anything that is not
%% a proper list of destinations. `Me' is node(). Consecutive targets of one node (a run)
%% gather in `Run' and go into the map when the node changes: targets
%% listed node by node, as most callers list them, cost one map update a
%% node, not one a target.
-spec group(term(), node(), [ecall:dest()], node() | '$none', [ecall:dest()], #{node() => [ecall:dest()]}) ->
          {[ecall:dest()], #{node() => [ecall:dest()]}} | badarg.
group([To | Rest], Me, Local, Cur, Run, Remote) when is_pid(To); is_reference(To) ->
    case node(To) of
        Me -> group(Rest, Me, [To | Local], Cur, Run, Remote);
        Cur -> group(Rest, Me, Local, Cur, [To | Run], Remote);
        Node -> switch(Rest, Me, Local, Cur, Run, Remote, Node, To)
    end;
group([{Name, Node} | Rest], Me, Local, Cur, Run, Remote)
  when is_atom(Name), is_atom(Node) ->
    %% By its name alone: the node is the map's key.
    case Node of
        Me -> group(Rest, Me, [Name | Local], Cur, Run, Remote);
        Cur -> group(Rest, Me, Local, Cur, [Name | Run], Remote);
        _ -> switch(Rest, Me, Local, Cur, Run, Remote, Node, Name)
    end;
group([To | Rest], Me, Local, Cur, Run, Remote) when is_atom(To) ->
    group(Rest, Me, [To | Local], Cur, Run, Remote);
group([], _Me, Local, Cur, Run, Remote) ->
    {lists:reverse(Local), put_run(Cur, Run, Remote)};
group(_, _Me, _Local, _Cur, _Run, _Remote) ->
    badarg.

%% A target of another node than the run's: the run goes into the map,
%% and that node's list so far becomes the run.
-spec switch(term(), node(), [ecall:dest()], node() | '$none', [ecall:dest()], #{node() => [ecall:dest()]},
             node(), ecall:dest()) -> {[ecall:dest()], #{node() => [ecall:dest()]}} | badarg.
switch(Rest, Me, Local, Cur, Run, Remote0, Node, To) ->
    Remote = put_run(Cur, Run, Remote0),
    Earlier = maps:get(Node, Remote, []),
    group(Rest, Me, Local, Node, [To | Earlier], Remote).

-spec put_run(node() | '$none', [ecall:dest()], #{node() => [ecall:dest()]}) -> #{node() => [ecall:dest()]}.
put_run('$none', _Run, Remote) -> Remote;
put_run(Node, Run, Remote) -> Remote#{Node => Run}.

%% @doc Sends `Msg' to each of `Dests' on the other node `Node' (a pid,
%% an alias, or the name a process is registered under there): one
%% request through the transport of its connection when it has one, else
%% each by `!'. The
%% same order rules as send_remote/5, per target.
-spec send_many(node(), [pid() | reference() | atom()], term()) -> ok.
send_many(Node, [Dest], Msg) ->
    %% One target on that node (a broadcast to one process per node): a
    %% send, which costs less than a list of one.
    _ = send_remote(Node, Dest, to(Node, Dest), Msg, false),
    ok;
send_many(Node, Dests, Msg) ->
    Native = fun(_Dest, To) -> native(Node, To, Msg) end,
    case route(Node) of
        {Mod, State, _Loops} ->
            after_native(Node),
            case Mod:push(State, ecall_request:send_many(Dests, Msg), false) of
                ok -> ok;
                %% A send has no error to return (see send_remote/5).
                overload -> ok;
                closed -> each(Node, Dests, Native)
            end;
        undefined ->
            plain(Node),
            each(Node, Dests, Native);
        {closing, _} ->
            each(Node, Dests, Native)
    end.

%% Send(Dest, To) for each of `Dests' of `Node', To as ecall:send/2 names
%% it (a name as {Name, Node}).
-spec each(node(), [pid() | reference() | atom()],
           fun((pid() | reference() | atom(), ecall:dest()) -> term())) -> ok.
each(Node, Dests, Send) ->
    lists:foreach(fun(Dest) -> Send(Dest, to(Node, Dest)) end, Dests).

%% A target of `Node' as ecall:send/2 names it: a name as {Name, Node}.
-spec to(node(), pid() | reference() | atom()) -> ecall:dest().
to(Node, Name) when is_atom(Name) -> {Name, Node};
to(_Node, To) -> To.

%% A send by `!': after the close of the node's connection, if it is
%% closing (transport then `!'), and remembered for the next send to
%% `Node' through a transport (`!' then transport; see the module comment).
-spec native(node(), ecall:dest(), Msg) -> Msg.
native(Node, To, Msg) ->
    await_close(Node),
    count_fallback(Node),
    case get(?NATIVE_SENT) of
        undefined ->
            put(?NATIVE_SENT, [Node]);
        Nodes ->
            lists:member(Node, Nodes) orelse put(?NATIVE_SENT, [Node | Nodes])
    end,
    To ! Msg.

%% A send to `Node' by `!' instead of a transport, counted (ecall:stats/0,1:
%% `fallback_sends'); not before the application starts.
-spec count_fallback(node()) -> ok.
count_fallback(Node) ->
    try ets:update_counter(ecall_fallback_sends, Node, 1, {Node, 0}) of
        _ -> ok
    catch
        error:badarg -> ok
    end.

%% @doc Sends to each node that went by `!' instead of a transport since
%% ecall started (no connection up, one closing, or a transport that found
%% itself closed).
-spec fallback_sends() -> #{node() => non_neg_integer()}.
fallback_sends() ->
    try maps:from_list(ets:tab2list(ecall_fallback_sends))
    catch error:badarg -> #{}
    end.

%% Before a send to `Node' through a transport: the barrier, when this
%% process sent to `Node' by `!' since its last send through a transport
%% (see the module comment).
-spec after_native(node()) -> ok.
after_native(Node) ->
    case get(?NATIVE_SENT) of
        undefined ->
            ok;
        Nodes ->
            case lists:member(Node, Nodes) of
                false ->
                    ok;
                true ->
                    case lists:delete(Node, Nodes) of
                        [] -> erase(?NATIVE_SENT);
                        Rest -> put(?NATIVE_SENT, Rest)
                    end,
                    %% erpc's spawn request goes on the same connection,
                    %% after this caller's earlier messages; its answer
                    %% means they have reached their receivers. A node
                    %% that does not answer has no order to keep.
                    _ = (catch erpc:call(Node, erlang, node, [], ?BARRIER_TIMEOUT)),
                    ok
            end
    end.
