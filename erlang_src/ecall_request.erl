%% @private
%% cast and call over a peer's transport (ecall_transport), and what the
%% receiving node runs for them.
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
%% | cannot be spawned on the peer | {error, {badrpc, system_limit}} | raises      |
-module(ecall_request).

-export([cast/4, call/5, run_call/4, run_cast/3]).

%% @doc See ecall:cast/4 (arguments checked there).
-spec cast(node(), module(), atom(), list()) -> ok | {error, overload}.
cast(Node, M, F, A) ->
    case ecall_conn:peer(Node) of
        undefined ->
            erpc:cast(Node, M, F, A);
        {Mod, State} ->
            case Mod:push(State, {cast, M, F, A}) of
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
        {Mod, State} ->
            case Mod:reply_watcher(State) of
                closed ->
                    erpc_call(Node, M, F, A, Timeout);
                {ok, Watcher} ->
                    %% Made here, next to the receive that waits for its
                    %% reply: the compiler then lets that receive skip the
                    %% messages the caller already had (a process with a
                    %% long mailbox does not scan it on every call).
                    Mref = monitor(process, Watcher, [{alias, reply_demonitor}]),
                    case Mod:push(State, {call, Mref, M, F, A}) of
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

-spec result(ecall_transport:reply()) -> {ok, term()} | {error, term()}.
result({value, {error, _} = Error}) -> Error;
result({value, Value}) -> {ok, Value};
result({exception, Reason}) -> {error, {exit, Reason}};
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
