%% @private
%% The caller's side of a cast and a call (ecall:cast/4, ecall:call/4,5):
%% over the peer's published transport (ecall_route:peer/1), or erpc
%% without one; how a call waits for its reply, what it returns, and
%% whether it is urgent.
%%
%% What a call returns, and how that compares with erpc:call/5, is written
%% once, in the edoc of ecall:call/5.
-module(ecall_rpc).

-export([cast/4, call/5, call/6, urgent/1, closed_loop/0, returned/0, loops/0]).

%% Urgency. Wins: closed-loop calls faster per call for one caller and for
%% 8, and a probe's call under load (doc/performance.md, "Which write-path
%% mechanisms earn their place"; switched off with the `urgent' setting).
%%
%% Process dictionary key: when the process's last call returned
%% (monotonic, microseconds).
-define(LAST_CALL, '$ecall_last_call').
%% A call made this soon after the caller's last one returned is in a
%% closed loop (see closed_loop/0): a busy link's writer would hold it up
%% to 1-2 ms waiting for company.
-define(CLOSED_LOOP_US, 2000).
%% Process dictionary key, with the peer: the peer's count of closed-loop
%% calls (loop_starts/1) at the process's last one.
-define(LOOP_STARTS, '$ecall_loop_starts').
%% Closed-loop calls to one peer that may start during one caller's cycle
%% for its calls to stay urgent: past that, such callers bring each other
%% company, and gathering pays again (doc/performance.md, "Which write-path
%% mechanisms earn their place", urgent calls).
-define(LOOP_COMPANY, 256).

%% A peer's count of closed-loop calls (urgent/1), made when its
%% connection is published; `off' with the `urgent' setting false.
-type loops() :: atomics:atomics_ref() | off.
-export_type([loops/0]).

%% @doc See ecall:cast/4 (arguments checked there).
-spec cast(node(), module(), atom(), list()) -> ok | {error, overload}.
cast(Node, M, F, A) ->
    case ecall_route:peer(Node) of
        undefined ->
            ecall_route:plain(Node),
            erpc:cast(Node, M, F, A);
        {Mod, State, _Loops} ->
            case Mod:push(State, ecall_request:cast(M, F, A), false) of
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
call(Node, M, F, A, Timeout) ->
    Peer = ecall_route:peer(Node),
    Result = call_peer(Node, Peer, M, F, A, Timeout, urgent(Node, Peer)),
    returned(),
    Result.

%% @doc call/5 with its urgency (urgent/1) decided by the caller: the
%% parallel patterns decide in the calling process, and call from helpers.
-spec call(node(), module(), atom(), list(), timeout(), boolean()) ->
          {ok, term()} | {error, term()}.
call(Node, M, F, A, Timeout, Urgent) ->
    call_peer(Node, ecall_route:peer(Node), M, F, A, Timeout, Urgent).

%% A call to `Node', whose published transport is `Peer'.
-spec call_peer(node(), ecall_transport:t() | undefined, module(), atom(), list(),
                timeout(), boolean()) -> {ok, term()} | {error, term()}.
call_peer(Node, _Peer, M, F, A, Timeout, _Urgent) when Node =:= node() ->
    erpc_call(Node, M, F, A, Timeout);
call_peer(Node, undefined, M, F, A, Timeout, _Urgent) ->
    ecall_route:plain(Node),
    erpc_call(Node, M, F, A, Timeout);
call_peer(Node, {Mod, State, _Loops}, M, F, A, Timeout, Urgent) ->
    %% Made here, next to the receive that waits for its reply: the
    %% compiler then lets that receive skip the messages the caller
    %% already had (a process with a long mailbox does not scan it on
    %% every call).
    Ref = make_ref(),
    case Mod:call(State, Ref, M, F, A, Urgent) of
        {ok, Alias} when is_reference(Alias) ->
            wait_alias(Mod, State, Alias, Timeout);
        {ok, Id} ->
            wait_reply(Mod, State, Id, Ref, Timeout);
        closed ->
            erpc_call(Node, M, F, A, Timeout);
        overload ->
            %% A call always says so: it has no result.
            {error, overload}
    end.

%% A call answered by id (ecall_transport:call/6): the reply, or a failure
%% of its path, comes as `{Ref, Reply}'. A call that times out is given up
%% first: if its reply was handed over already, it is taken from the
%% mailbox, so that no reply reaches the caller after the call returned.
-spec wait_reply(module(), term(), term(), reference(), timeout()) ->
          {ok, term()} | {error, term()}.
wait_reply(Mod, State, Id, Ref, Timeout) ->
    receive
        {Ref, Reply} ->
            result(Reply)
    after Timeout ->
        case Mod:cancel(State, Id) of
            true ->
                {error, {badrpc, timeout}};
            false ->
                receive {Ref, Reply} -> result(Reply) end
        end
    end.

%% A call answered by alias (ecall_transport:call/6): the reply comes as
%% `{Alias, Reply}', a failure of its path as the `'DOWN'' of the monitor
%% whose alias it is. After a timeout the call is given up (the monitor
%% goes, which deactivates the alias: a later reply is dropped by the
%% runtime) and a reply that came meanwhile is taken from the mailbox.
-spec wait_alias(module(), term(), reference(), timeout()) -> {ok, term()} | {error, term()}.
wait_alias(Mod, State, Alias, Timeout) ->
    receive
        {Alias, Reply} ->
            result(Reply);
        {'DOWN', Alias, process, _, Reason} ->
            {error, {badrpc, down_reason(Reason)}}
    after Timeout ->
        _ = Mod:cancel(State, Alias),
        receive
            {Alias, Reply} -> result(Reply)
        after 0 ->
            {error, {badrpc, timeout}}
        end
    end.

%% @doc Whether the calling process's next call to `Node' should be urgent:
%% not held back on either link to be batched with others. A busy link's
%% writer batches requests by waiting up to 1-2 ms for more to come. A
%% caller in a closed loop (closed_loop/0) brings none while it waits for
%% its answer: held back, each of its calls would wait that long on the
%% way out and again on the way back. Unless many callers are in such
%% loops with the same peer: they then bring each other company, and the
%% batches save more than the wait costs. How many is counted without
%% any bookkeeping of their own: each closed-loop call counts itself in
%% the peer (loops/0), and the number of such calls started since the
%% caller's last one is about how many callers are in such loops. Urgent
%% up to 256 of them, and never with the `urgent' setting false when the
%% connection opened. (The first call of a loop that starts long after the
%% caller's last one compares with an old count, and is not urgent; the
%% next one is.)
-spec urgent(node()) -> boolean().
urgent(Node) ->
    urgent(Node, ecall_route:peer(Node)).

%% urgent/1 with `Node''s published transport looked up already.
-spec urgent(node(), ecall_transport:t() | undefined) -> boolean().
urgent(Node, Peer) ->
    closed_loop() andalso
        case Peer of
            {_Mod, _State, off} ->
                false;
            {_Mod, _State, Loops} ->
                Starts = atomics:add_get(Loops, 1, 1),
                case put({?LOOP_STARTS, Node}, Starts) of
                    undefined -> true;
                    Before -> Starts - Before =< ?LOOP_COMPANY
                end;
            undefined ->
                false
        end.

%% @doc A count of closed-loop calls for a connection published now
%% (urgent/2), or `off' when the `urgent' setting is false.
-spec loops() -> loops().
loops() ->
    case ecall_config:get(urgent) of
        true -> atomics:new(1, []);
        false -> off
    end.

%% @doc Whether the calling process is in a closed loop: its last call
%% returned less than 2 ms ago, so it waits for each answer before its
%% next request (a process calling in a loop, a gen_server calling per
%% message). A caller that pauses between calls (a paced load) is not.
-spec closed_loop() -> boolean().
closed_loop() ->
    case get(?LAST_CALL) of
        undefined -> false;
        Last -> erlang:monotonic_time(microsecond) - Last < ?CLOSED_LOOP_US
    end.

%% @doc Notes that a call of the calling process has returned (see
%% closed_loop/0).
-spec returned() -> ok.
returned() ->
    _ = put(?LAST_CALL, erlang:monotonic_time(microsecond)),
    ok.

-spec result(ecall_request:reply()) -> {ok, term()} | {error, term()}.
%% A big reply, as the peer encoded it (ecall_transport_nif): decoded
%% here, by its caller.
result({external, Encoded}) when is_binary(Encoded) -> result(binary_to_term(Encoded));
result({value, {error, _} = Error}) -> Error;
result({value, Value}) -> {ok, Value};
result({exception, Class, Reason, Stack}) -> {error, {exception, Class, Reason, Stack}};
result({badrpc, Reason}) -> {error, {badrpc, Reason}}.

-spec down_reason(term()) -> term().
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
        error:{exception, Reason, Stack} -> {error, {exception, error, Reason, Stack}};
        exit:{exception, Reason} -> {error, {exception, exit, Reason, []}};
        exit:{signal, Reason} -> {error, {exception, exit, Reason, []}}
    end.
