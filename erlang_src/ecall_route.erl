%% @private
%% The data path of a send (ecall:send/2,3, and the replies of calls,
%% ecall:send_reply/3): whether a message to another node goes by native
%% `!' or through the ecall transport of a connection to that node, and
%% how one caller's messages to one node keep their order when they switch
%% from one path to the other.
%%
%% The choice, per message (send_remote/5): the transport of the node's
%% connection when one is published (ecall_conn:route/1); native `!' when
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

-export([send_to/3, send_remote/5, send_many/2, send_many/3, reply/4]).

%% Process dictionary key: the nodes this process sent to by `!' since its
%% last send to them through a transport (see native/3).
-define(NATIVE_SENT, '$ecall_native_sent').
-define(BARRIER_TIMEOUT, 5000).

%% send_many/2: lists of at most this many targets, each on a node of its
%% own, go as one send each (see one_per_node/4). Not measured beyond the
%% one-per-node broadcast over 3 peers (bench/run.sh fanout).
-define(ONE_PER_NODE_MAX, 16).

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
    case ecall_conn:route(Node) of
        {Mod, State} when Mod =/= closing ->
            after_native(Node),
            case Mod:send(State, Dest, Msg, Urgent) of
                ok -> Msg;
                closed -> native(Node, To, Msg);
                %% A send has no error to return: under `error' as under
                %% `drop' the message is dropped and counted.
                overload -> Msg
            end;
        undefined ->
            ecall_conn:plain(Node),
            native(Node, To, Msg);
        {closing, _} ->
            native(Node, To, Msg)
    end.

%% @doc On the node that ran a call answered by id: its reply, `{reply,
%% Id, Reply}', to a receiver of the caller's node `From', through the
%% transport of the connection to it, else by `!' to its first receiver.
%% A reply is the replying process's last message: it has no order to keep
%% with others. One the transport refuses for want of room goes by `!'
%% too: its caller waits for it.
-spec reply(node(), non_neg_integer(), ecall_transport:reply(), boolean()) -> ok.
reply(From, Id, Reply, Urgent) ->
    Request = {reply, Id, Reply},
    case ecall_conn:route(From) of
        {Mod, State} when Mod =/= closing ->
            case Mod:push(State, Request, Urgent) of
                ok -> ok;
                _ClosedOrOverload -> native_reply(From, Request)
            end;
        _UndefinedOrClosing ->
            native_reply(From, Request)
    end.

-spec native_reply(node(), ecall_transport:request()) -> ok.
native_reply(From, Request) ->
    _ = erlang:send({ecall_receiver:name(1), From}, {batch, [Request]}),
    ok.

%% @doc ecall:send_many/2: `Msg' to every destination of `Dests' (see
%% there), or `badarg', having sent nothing, when `Dests' is not a proper
%% list of destinations.
-spec send_many(term(), term()) -> ok | badarg.
send_many(Dests, Msg) ->
    case one_per_node(Dests, node(), [], ?ONE_PER_NODE_MAX) of
        true ->
            %% A few targets, each on a node of its own (a broadcast to one
            %% process per node): a send each costs less than the grouping.
            lists:foreach(fun(To) -> ecall:send(To, Msg) end, Dests);
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
%% request through the transport of its connection when it has one and
%% the peer knows the request, else each as send_remote/5 sends it. The
%% same order rules as send_remote/5, per target.
-spec send_many(node(), [pid() | reference() | atom()], term()) -> ok.
send_many(Node, [Dest], Msg) ->
    %% One target on that node (a broadcast to one process per node): a
    %% send, which costs less than a list of one.
    _ = send_remote(Node, Dest, to(Node, Dest), Msg, false),
    ok;
send_many(Node, Dests, Msg) ->
    Native = fun(_Dest, To) -> native(Node, To, Msg) end,
    case ecall_conn:route(Node) of
        {Mod, State} when Mod =/= closing ->
            after_native(Node),
            case Mod:send_many(State, Dests, Msg) of
                ok -> ok;
                %% A send has no error to return (see send_remote/5).
                overload -> ok;
                closed -> each(Node, Dests, Native);
                unsupported -> each(Node, Dests, fun(Dest, To) ->
                                                         send_remote(Node, Dest, To, Msg, false)
                                                 end)
            end;
        undefined ->
            ecall_conn:plain(Node),
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
    ecall_conn:await_close(Node),
    case get(?NATIVE_SENT) of
        undefined ->
            put(?NATIVE_SENT, [Node]);
        Nodes ->
            lists:member(Node, Nodes) orelse put(?NATIVE_SENT, [Node | Nodes])
    end,
    To ! Msg.

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
