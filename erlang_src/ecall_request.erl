%% @private
%% cast and call over a peer's transport (ecall_transport), and what the
%% receiving node runs for them.
%%
%% What a call returns, and how that compares with erpc:call/5, is written
%% once, in the edoc of ecall:call/5.
-module(ecall_request).

-export([cast/4, call/5, call/6, urgent/1, closed_loop/0, returned/0, run_call/5,
         run_call/6, run_cast/3]).

%% Urgency. Wins: closed-loop calls 67 % faster per call for one caller and
%% 104 % for 8, and a probe's call under load 179 % faster at the median
%% (switched off in the sitting of native/ecall_dist/src/link/tuning.rs,
%% where the write path's other tuning constants are).
%%
%% Process dictionary key: when the process's last call returned
%% (monotonic, microseconds).
-define(LAST_CALL, '$ecall_last_call').
%% A call made this soon after the caller's last one returned is in a
%% closed loop (see closed_loop/0): a busy link's writer would hold it up
%% to 1-2 ms waiting for company.
-define(CLOSED_LOOP_US, 2000).
%% Process dictionary key, with the peer: the peer's count of closed-loop
%% calls (ecall_transport:loop_starts/1) at the process's last one.
-define(LOOP_STARTS, '$ecall_loop_starts').
%% Closed-loop calls to one peer that may start during one caller's cycle
%% for its calls to stay urgent: past that, such callers bring each other
%% company, and gathering pays again (bench/run.sh pingpong: gathering
%% made each call of 1 to 64 such callers 4-13 times slower; at 1,000 it
%% carried more calls per second than no gathering; with 128, 256 and 512
%% callers this limit did better than none and than 0 at 256 and 512, and
%% urgency won at 128).
-define(LOOP_COMPANY, 256).

%% @doc See ecall:cast/4 (arguments checked there).
-spec cast(node(), module(), atom(), list()) -> ok | {error, overload}.
cast(Node, M, F, A) ->
    case ecall_conn:peer(Node) of
        undefined ->
            ecall_conn:plain(Node),
            erpc:cast(Node, M, F, A);
        {Mod, State} ->
            case Mod:push(State, {cast, M, F, A}, false) of
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
    Peer = ecall_conn:peer(Node),
    Result = call_peer(Node, Peer, M, F, A, Timeout, urgent(Node, Peer)),
    returned(),
    Result.

%% @doc call/5 with its urgency (urgent/1) decided by the caller: the
%% parallel patterns decide in the calling process, and call from helpers.
-spec call(node(), module(), atom(), list(), timeout(), boolean()) ->
          {ok, term()} | {error, term()}.
call(Node, M, F, A, Timeout, Urgent) ->
    call_peer(Node, ecall_conn:peer(Node), M, F, A, Timeout, Urgent).

%% A call to `Node', whose published transport (ecall_conn:peer/1) is
%% `Peer'.
-spec call_peer(node(), ecall_transport:t() | undefined, module(), atom(), list(),
                timeout(), boolean()) -> {ok, term()} | {error, term()}.
call_peer(Node, _Peer, M, F, A, Timeout, _Urgent) when Node =:= node() ->
    erpc_call(Node, M, F, A, Timeout);
call_peer(Node, undefined, M, F, A, Timeout, _Urgent) ->
    ecall_conn:plain(Node),
    erpc_call(Node, M, F, A, Timeout);
call_peer(Node, {Mod, State}, M, F, A, Timeout, Urgent) ->
    %% Made here, next to the receive that waits for its reply: the
    %% compiler then lets that receive skip the messages the caller
    %% already had (a process with a long mailbox does not scan it on
    %% every call).
    Ref = make_ref(),
    case Mod:call(State, Ref, M, F, A, Urgent) of
        {ok, Id} ->
            wait_reply(Mod, State, Id, Ref, Timeout);
        watched ->
            call_watched(Node, Mod, State, M, F, A, Timeout, Urgent);
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

%% A call answered by alias, for transports and peers without calls by
%% id: the caller monitors the process that stands for its path, with an
%% alias for the reply.
-spec call_watched(node(), module(), term(), module(), atom(), list(), timeout(), boolean()) ->
          {ok, term()} | {error, term()}.
call_watched(Node, Mod, State, M, F, A, Timeout, Urgent) ->
    case Mod:reply_watcher(State) of
        closed ->
            erpc_call(Node, M, F, A, Timeout);
        {ok, Watcher} ->
            %% Made next to the receive, as in call/6.
            Mref = monitor(process, Watcher, [{alias, reply_demonitor}]),
            case Mod:push(State, {call, Mref, M, F, A}, Urgent) of
                ok ->
                    wait_alias(Mref, Timeout);
                closed ->
                    demonitor(Mref, [flush]),
                    erpc_call(Node, M, F, A, Timeout);
                overload ->
                    demonitor(Mref, [flush]),
                    {error, overload}
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
%% the peer (ecall_transport:loop_starts/1), and the number of such calls
%% started since the caller's last one is about how many callers are in
%% such loops. Urgent up to 256 of them, and never with the `urgent'
%% setting false when the connection opened. (The first call of a loop that
%% starts long after the caller's last one compares with an old count,
%% and is not urgent; the next one is.)
-spec urgent(node()) -> boolean().
urgent(Node) ->
    urgent(Node, ecall_conn:peer(Node)).

%% urgent/1 with `Node''s published transport looked up already.
-spec urgent(node(), ecall_transport:t() | undefined) -> boolean().
urgent(Node, Peer) ->
    closed_loop() andalso
        case Peer of
            {Mod, State} ->
                case Mod:loop_starts(State) of
                    off ->
                        false;
                    Starts ->
                        case put({?LOOP_STARTS, Node}, Starts) of
                            undefined -> true;
                            Before -> Starts - Before =< ?LOOP_COMPANY
                        end
                end;
            undefined ->
                false
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

-spec wait_alias(reference(), timeout()) -> {ok, term()} | {error, term()}.
wait_alias(Mref, Timeout) ->
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

-spec result(ecall_transport:reply()) -> {ok, term()} | {error, term()}.
%% A big reply, as the peer encoded it (ecall_transport_nif:push_large/3):
%% decoded here, by its caller.
result({external, Encoded}) when is_binary(Encoded) -> result(binary_to_term(Encoded));
result({value, {error, _} = Error}) -> Error;
result({value, Value}) -> {ok, Value};
result({exception, Class, Reason, Stack}) -> {error, {exception, Class, Reason, Stack}};
%% From a peer of an earlier release, which sent the reason alone.
result({exception, Reason}) -> {error, {exception, exit, Reason, []}};
result({badrpc, Reason}) -> {error, {badrpc, Reason}}.

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
        error:{exception, Reason, Stack} -> {error, {exception, error, Reason, Stack}};
        exit:{exception, Reason} -> {error, {exception, exit, Reason, []}};
        exit:{signal, Reason} -> {error, {exception, exit, Reason, []}}
    end.

%% @doc On the receiving node: runs a call answered by id and sends the
%% reply to node `From' (ecall_route:reply/4), through this node's own
%% ecall connection to it (batched, or at once when `Urgent': its caller
%% is in a closed loop), or `!' without one.
-spec run_call(node(), non_neg_integer(), module(), atom(), list(), boolean()) -> ok.
run_call(From, Id, M, F, A, Urgent) ->
    ecall_route:reply(From, Id, apply_call(M, F, A), Urgent).

%% @doc On the receiving node: runs a call answered by alias and sends the
%% reply to `Alias', as run_call/6 does.
-spec run_call(reference(), module(), atom(), list(), boolean()) -> term().
run_call(Alias, M, F, A, Urgent) ->
    ecall:send_reply(Alias, {Alias, apply_call(M, F, A)}, Urgent).

-spec apply_call(module(), atom(), list()) -> ecall_transport:reply().
apply_call(M, F, A) ->
    try {value, apply(M, F, A)}
    catch
        throw:Value -> {value, Value};
        error:Reason:Stack -> {exception, error, Reason, callee_stack(Stack, M, F, A)};
        %% No stack trace for an exit, as erpc gives none.
        exit:Reason -> {exception, exit, Reason, []}
    end.

%% The stack trace of the called function without the frames of ecall
%% that ran it, as erpc:call/4 gives it: a function that raised without a
%% frame of its own (a BIF such as erlang:error/1) is named with its
%% arguments, `{M, F, A, []}'; one whose frame is not at the top gets
%% `{M, F, Arity, []}' in place of ecall's frames.
-spec callee_stack(list(), module(), atom(), list()) -> list().
callee_stack([Cut | _], M, F, A) when element(1, Cut) =:= ?MODULE,
                                      element(2, Cut) =:= apply_call ->
    [{M, F, A, []}];
callee_stack([{M, F, A, _} = Frame, Cut | _], M, F, A) when element(1, Cut) =:= ?MODULE,
                                                            element(2, Cut) =:= apply_call ->
    [Frame];
callee_stack(Stack, M, F, A) ->
    callee_frames(Stack, Stack, M, F, length(A)).

-spec callee_frames(list(), list(), module(), atom(), arity()) -> list().
callee_frames([], Stack, _M, _F, _Arity) ->
    %% ecall's frame is not in it (a trace cut short): all of it.
    Stack;
callee_frames([{M, F, Arity, _} = Frame, Cut | _], _Stack, M, F, Arity)
  when element(1, Cut) =:= ?MODULE, element(2, Cut) =:= apply_call ->
    [Frame];
callee_frames([Cut | _], _Stack, M, F, Arity) when element(1, Cut) =:= ?MODULE,
                                                   element(2, Cut) =:= apply_call ->
    [{M, F, Arity, []}];
callee_frames([Frame | Rest], Stack, M, F, Arity) ->
    case callee_frames(Rest, Stack, M, F, Arity) of
        Stack -> Stack;
        Frames -> [Frame | Frames]
    end.

%% @doc On the receiving node: runs a cast, as erpc:cast/4 would.
-spec run_cast(module(), atom(), list()) -> term().
run_cast(M, F, A) ->
    apply(M, F, A).
