%% @private
%% The multi-node patterns of ecall (call_one, call_any, call_all,
%% call_all_wait, and cast_one's choice of node): how they call and gather
%% the answers. Their API, argument checks and docs are in ecall.
-module(ecall_patterns).

-export([call_one/5, call_any/5, call_all/5, call_all_wait/5, pick_local/1]).

%% @doc See ecall:call_one/5: the local node first, the others in random
%% order.
-spec call_one([node()], module(), atom(), [term()], boolean()) ->
          {ok, {node(), term()}} | {error, term()}.
call_one(Nodes, M, F, A, RpcErr) ->
    Local = [node() || lists:member(node(), Nodes)],
    Others = [N || {_, N} <- lists:sort([{rand:uniform(), N} || N <- Nodes -- Local])],
    call_one_loop(Local ++ Others, M, F, A, RpcErr, []).

%% @doc See ecall:call_any/5.
-spec call_any([node()], module(), atom(), [term()], boolean()) ->
          {ok, {node(), term()}} | {error, term()}.
call_any(Nodes, M, F, A, RpcErr) ->
    in_master(Nodes, fun(Urgent) ->
                             {Tag, Called} = parallel(Nodes, M, F, A, Urgent),
                             any_loop(Tag, length(Called), RpcErr, [])
                     end).

%% @doc See ecall:call_all/5.
-spec call_all([node()], module(), atom(), [term()], boolean()) ->
          {ok, [{node(), term()}]} | {error, term()}.
call_all(Nodes, M, F, A, RpcErr) ->
    {Called, Result} =
        in_master(Nodes, fun(Urgent) ->
                                 {Tag, Called0} = parallel(Nodes, M, F, A, Urgent),
                                 {Called0, all_loop(Tag, length(Called0), RpcErr, #{})}
                         end),
    case Result of
        {ok, Oks} when map_size(Oks) =:= 0 -> {error, none_is_available};
        {ok, Oks} -> {ok, [{N, maps:get(N, Oks)} || N <- Called, maps:is_key(N, Oks)]};
        Error -> Error
    end.

%% @doc See ecall:call_all_wait/5.
-spec call_all_wait([node()], module(), atom(), [term()], boolean()) ->
          {[{node(), term()}], [{node(), term()}]}.
call_all_wait(Nodes, M, F, A, RpcErr) ->
    {Called, Answers} =
        in_master(Nodes, fun(Urgent) ->
                                 {Tag, Called0} = parallel(Nodes, M, F, A, Urgent),
                                 {Called0, maps:from_list([receive {Tag, N, R} -> {N, R} end
                                                           || _ <- Called0])}
                         end),
    Replies = [{N, R} || N <- Called, {ok, R} <- [maps:get(N, Answers)]],
    Rejects = [{N, E} || N <- Called, {error, E} <- [maps:get(N, Answers)],
                         RpcErr orelse not is_badrpc(E)],
    {Replies, Rejects}.

-spec call_one_loop([node()], module(), atom(), [term()], boolean(), [{node(), term()}]) ->
          {ok, {node(), term()}} | {error, term()}.
call_one_loop([], _M, _F, _A, _RpcErr, []) ->
    {error, none_is_available};
call_one_loop([], _M, _F, _A, _RpcErr, Errors) ->
    {error, lists:reverse(Errors)};
call_one_loop([N | Rest], M, F, A, RpcErr, Errors) ->
    case ecall_rpc:call(N, M, F, A, infinity) of
        {ok, Result} -> {ok, {N, Result}};
        {error, E} -> call_one_loop(Rest, M, F, A, RpcErr, add_error(N, E, RpcErr, Errors))
    end.

-spec any_loop(reference(), non_neg_integer(), boolean(), [{node(), term()}]) ->
          {ok, {node(), term()}} | {error, term()}.
any_loop(_Tag, 0, _RpcErr, []) ->
    {error, none_is_available};
any_loop(_Tag, 0, _RpcErr, Errors) ->
    {error, lists:reverse(Errors)};
any_loop(Tag, Left, RpcErr, Errors) ->
    receive
        {Tag, N, {ok, Result}} -> {ok, {N, Result}};
        {Tag, N, {error, E}} -> any_loop(Tag, Left - 1, RpcErr, add_error(N, E, RpcErr, Errors))
    end.

-spec all_loop(reference(), non_neg_integer(), boolean(), #{node() => term()}) ->
          {ok, #{node() => term()}} | {error, {node(), term()}}.
all_loop(_Tag, 0, _RpcErr, Oks) ->
    {ok, Oks};
all_loop(Tag, Left, RpcErr, Oks) ->
    receive
        {Tag, N, {ok, Result}} ->
            all_loop(Tag, Left - 1, RpcErr, Oks#{N => Result});
        {Tag, _N, {error, {badrpc, _}}} when not RpcErr ->
            all_loop(Tag, Left - 1, RpcErr, Oks);
        {Tag, N, {error, E}} ->
            {error, {N, E}}
    end.

%% Runs `Fun' in a short-lived process and returns its result. The
%% parallel patterns gather answers there: answers that come after the
%% pattern has decided (call_any, call_all) go to a process that is gone
%% and never reach the caller's mailbox. Whether each node's call is
%% urgent is decided here, in the calling process, which keeps the history
%% (ecall_rpc:urgent/1); `Fun' gets the answers, by node.
-spec in_master([node()], fun((#{node() => boolean()}) -> Result)) -> Result.
in_master(Nodes, Fun) ->
    Caller = self(),
    Urgent = case ecall_rpc:closed_loop() of
                 true -> maps:from_list([{N, ecall_rpc:urgent(N)} || N <- unique(Nodes)]);
                 false -> #{}
             end,
    {Master, Mref} = spawn_monitor(fun() -> Caller ! {self(), Fun(Urgent)} end),
    receive
        {Master, Result} ->
            demonitor(Mref, [flush]),
            ecall_rpc:returned(),
            Result;
        {'DOWN', Mref, process, Master, Reason} ->
            erlang:error(Reason)
    end.

%% Starts one call per distinct node; answers come as {Tag, Node, Result}.
-spec parallel([node()], module(), atom(), [term()], #{node() => boolean()}) ->
          {reference(), [node()]}.
parallel(Nodes, M, F, A, Urgent) ->
    Tag = make_ref(),
    Self = self(),
    Called = unique(Nodes),
    _ = [spawn(fun() ->
                       U = maps:get(N, Urgent, false),
                       Self ! {Tag, N, ecall_rpc:call(N, M, F, A, infinity, U)}
               end)
         || N <- Called],
    {Tag, Called}.

%% Nodes without repeats, in their first order.
-spec unique([node()]) -> [node()].
unique(Nodes) ->
    {Unique, _} = lists:foldl(fun(N, {Acc, Seen}) ->
                                      case maps:is_key(N, Seen) of
                                          true -> {Acc, Seen};
                                          false -> {[N | Acc], Seen#{N => true}}
                                      end
                              end, {[], #{}}, Nodes),
    lists:reverse(Unique).

-spec is_badrpc(term()) -> boolean().
is_badrpc({badrpc, _}) -> true;
is_badrpc(_) -> false.

-spec pick_local([node(), ...]) -> node().
pick_local(Nodes) ->
    case lists:member(node(), Nodes) of
        true -> node();
        false -> lists:nth(rand:uniform(length(Nodes)), Nodes)
    end.

-spec add_error(node(), term(), boolean(), [{node(), term()}]) -> [{node(), term()}].
add_error(N, E, RpcErr, Errors) ->
    case RpcErr orelse not is_badrpc(E) of
        true -> [{N, E} | Errors];
        false -> Errors
    end.

