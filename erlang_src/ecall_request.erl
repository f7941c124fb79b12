%% @private
%% Requests over the links: the push protocol shared by send, cast and call,
%% cast and call themselves, and what the receiving node runs for them.
%%
%% Return values of call (the original ecall's, made the same on both paths):
%%
%% | the function ...            | ecall:call            | erpc:call          |
%% |-----------------------------|-----------------------|--------------------|
%% | returns V (not {error, _})  | {ok, V}               | V                  |
%% | returns {error, E}          | {error, E}            | {error, E}         |
%% | throws V                    | as if it returned V   | throws V           |
%% | raises error or exit R      | {error, {exit, R}}    | raises             |
%% | node/link gone, noconnection| {error, {badrpc, R}}  | raises {erpc, R}   |
%% | does not answer in Timeout  | {error, {badrpc, timeout}} | raises {erpc, timeout} |
-module(ecall_request).

-export([push/2, push_iovec/2, cast/4, call/5, run_call/4, run_cast/3]).

%% Where replies of linked calls go: `{Alias, Reply}' to the caller's alias.
-type reply() :: {value, term()} | {exception, term()}.
-export_type([reply/0]).

%% @doc Queues `Request' for a peer. When the peer's byte budget is full,
%% the `overflow' policy decides: `block' waits for room (callers are
%% admitted in arrival order), `error' and `drop' give up at once
%% (`overload', counted in `overflow_drops'). `closed': the peer went away;
%% the caller uses native distribution instead.
-spec push(ecall_nif:peer(), tuple()) -> ok | closed | overload.
push(Peer, Request) ->
    push_with(Peer, fun(Admitted) -> ecall_nif:push(Peer, Request, Admitted) end).

%% @doc push/2 for a large request already encoded by term_to_iovec/1: it
%% is queued as a batch of its own, copied on a dirty scheduler.
-spec push_iovec(ecall_nif:peer(), [binary()]) -> ok | closed | overload.
push_iovec(Peer, IoVec) ->
    push_with(Peer, fun(Admitted) -> ecall_nif:push_iovec(Peer, IoVec, Admitted) end).

-type pusher() :: fun((boolean()) -> ok | closed | {full, non_neg_integer()}).

-spec push_with(ecall_nif:peer(), pusher()) -> ok | closed | overload.
push_with(Peer, Push) ->
    case Push(false) of
        {full, Size} ->
            case ecall_config:get(overflow) of
                block ->
                    wait_room(Peer, Size, Push);
                _ErrorOrDrop ->
                    ok = ecall_nif:overflow_drop(Peer),
                    overload
            end;
        Result ->
            Result
    end.

-spec wait_room(ecall_nif:peer(), non_neg_integer(), pusher()) -> ok | closed.
wait_room(Peer, Size, Push) ->
    Ref = make_ref(),
    case ecall_nif:wait_room(Peer, Size, Ref) of
        retry ->
            admitted(Push);
        wait ->
            receive
                {ecall_room, Ref, true} -> admitted(Push);
                {ecall_room, Ref, false} -> closed
            end
    end.

-spec admitted(pusher()) -> ok | closed.
admitted(Push) ->
    case Push(true) of
        ok -> ok;
        _ -> closed
    end.

%% @doc See ecall:cast/4 (arguments checked there).
-spec cast(node(), module(), atom(), list()) -> ok | {error, overload}.
cast(Node, M, F, A) ->
    case ecall_conn:peer(Node) of
        undefined ->
            erpc:cast(Node, M, F, A);
        {erlang, Pool} ->
            ecall_proxy:pick(Pool) ! {do, {cast, M, F, A}},
            ok;
        Peer ->
            case push(Peer, {cast, M, F, A}) of
                ok -> ok;
                closed -> erpc:cast(Node, M, F, A);
                overload -> overloaded(ok)
            end
    end.

%% What a request refused for want of room returns: `{error, overload}'
%% under the `error' policy, `Dropped' (what the caller returns when all
%% is well) under `drop'.
-spec overloaded(T) -> T | {error, overload}.
overloaded(Dropped) ->
    case ecall_config:get(overflow) of
        drop -> Dropped;
        _ -> {error, overload}
    end.

%% @doc See ecall:call/5 (arguments checked there).
-spec call(node(), module(), atom(), list(), timeout()) ->
          {ok, term()} | {error, term()}.
call(Node, M, F, A, Timeout) when Node =:= node() ->
    erpc_call(Node, M, F, A, Timeout);
call(Node, M, F, A, Timeout) ->
    case ecall_conn:peer(Node) of
        undefined ->
            erpc_call(Node, M, F, A, Timeout);
        {erlang, Pool} ->
            %% The proxy is linked to the connection: it goes down with it.
            Proxy = ecall_proxy:pick(Pool),
            Mref = monitor(process, Proxy, [{alias, reply_demonitor}]),
            Proxy ! {do, {call, Mref, M, F, A}},
            wait_reply(Mref, Timeout);
        Peer ->
            %% One local monitor gives both the reply alias and prompt
            %% failure: it watches the process that stands for the link
            %% carrying this caller's requests, which exits when that link
            %% or the whole connection goes down. Nothing per call crosses
            %% the network but the request itself.
            case ecall_conn:watcher(Node, ecall_nif:caller_link(Peer)) of
                undefined ->
                    erpc_call(Node, M, F, A, Timeout);
                Watcher ->
                    Mref = monitor(process, Watcher, [{alias, reply_demonitor}]),
                    case push(Peer, {call, Mref, M, F, A}) of
                        ok ->
                            wait_reply(Mref, Timeout);
                        closed ->
                            demonitor(Mref, [flush]),
                            erpc_call(Node, M, F, A, Timeout);
                        overload ->
                            %% A call always says so: it has no result.
                            demonitor(Mref, [flush]),
                            {error, overload}
                    end
            end
    end.

-spec wait_reply(reference(), timeout()) -> {ok, term()} | {error, term()}.
wait_reply(Mref, Timeout) ->
    receive
        {Mref, Reply} ->
            result(Reply);
        {'DOWN', Mref, process, _, Reason} ->
            {error, {badrpc, down_reason(Reason)}}
    after Timeout ->
        %% Removing the monitor deactivates the alias: a reply that comes
        %% later is dropped by the runtime and never reaches the mailbox.
        demonitor(Mref, [flush]),
        receive
            {Mref, Reply} -> result(Reply)
        after 0 ->
            {error, {badrpc, timeout}}
        end
    end.

-spec result(reply()) -> {ok, term()} | {error, term()}.
result({value, {error, _} = Error}) -> Error;
result({value, Value}) -> {ok, Value};
result({exception, Reason}) -> {error, {exit, Reason}}.

-spec down_reason(term()) -> term().
down_reason({link_down, Reason}) -> {link_down, Reason};
down_reason(noproc) -> noconnection;
down_reason(Reason) -> Reason.

-spec erpc_call(node(), module(), atom(), list(), timeout()) ->
          {ok, term()} | {error, term()}.
erpc_call(Node, M, F, A, Timeout) ->
    try erpc:call(Node, M, F, A, Timeout) of
        Value -> result({value, Value})
    catch
        %% erpc rethrows a thrown value; ecall counts it as returned.
        throw:Value -> result({value, Value});
        error:{erpc, Reason} -> {error, {badrpc, Reason}};
        error:{exception, Reason, _Stack} -> {error, {exit, Reason}};
        exit:{exception, Reason} -> {error, {exit, Reason}};
        exit:{signal, Reason} -> {error, {exit, Reason}}
    end.

%% @doc On the receiving node: runs a linked call and sends the reply back
%% through this node's own ecall connection (batched), or `!' without one.
-spec run_call(reference(), module(), atom(), list()) -> term().
run_call(Alias, M, F, A) ->
    Reply = try {value, apply(M, F, A)}
            catch
                throw:Value -> {value, Value};
                _Class:Reason -> {exception, Reason}
            end,
    ecall:send(Alias, {Alias, Reply}).

%% @doc On the receiving node: runs a cast, as erpc:cast/4 would.
-spec run_cast(module(), atom(), list()) -> term().
run_cast(M, F, A) ->
    apply(M, F, A).
