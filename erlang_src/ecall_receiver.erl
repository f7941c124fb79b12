%% @private
%% One receiver worker: replays each `{batch, Requests}' in order (see
%% ecall_transport:request()): `{send, To, Msg}' is `To ! Msg', `{cast, M,
%% F, A}' spawns M:F(A...), and a call spawns a process that applies it and
%% sends the reply back: `{call, From, Id, M, F, A}' as `{reply, Id, Reply}'
%% to node `From' (ecall_request:run_call/6), `{call, Alias, M, F, A}' to
%% `Alias' (ecall_request:run_call/5); either marked urgent when the call
%% came with `urgent' last. `{reply, Id, Reply}' goes to the caller of
%% this node waiting under `Id' (ecall_nif:call_reply/2).
%%
%% A special process (proc_lib + sys) rather than a gen_server: the loop is
%% the hot path on the receiving node. It answers system messages, so
%% `sys:get_state/1', `sys:suspend/1' and release handling work. It does not
%% trap exits: when its supervisor goes, it goes with the same reason.
%%
%% The mailbox is off_heap, so a backlog of batches never enters garbage
%% collection (and OTP 25's parallel signal buffers are available). Nothing
%% a peer sends kills the worker: a malformed element is counted and
%% skipped; a cast or call that cannot be spawned (the process table is
%% full) is counted, and the call is answered `{badrpc, system_limit}'.
-module(ecall_receiver).

-export([start_link/1, name/1, init/2]).
-export([system_continue/3, system_terminate/4, system_get_state/1,
         system_replace_state/2, system_code_change/4]).

-include("ecall_receiver.hrl").

-record(state, {parent :: pid(), counters :: counters:counters_ref(), index :: pos_integer()}).

-spec name(pos_integer()) -> atom().
name(I) ->
    list_to_atom("ecall_rx_" ++ integer_to_list(I)).

-spec start_link(pos_integer()) -> {ok, pid()}.
start_link(I) ->
    proc_lib:start_link(?MODULE, init, [self(), I], infinity,
                        [link, {message_queue_data, off_heap}]).

-spec init(pid(), pos_integer()) -> no_return().
init(Parent, I) ->
    true = register(name(I), self()),
    proc_lib:init_ack(Parent, {ok, self()}),
    loop(#state{parent = Parent, counters = ecall_receiver_sup:counters(), index = I}).

-spec loop(#state{}) -> no_return().
loop(#state{counters = C, parent = Parent} = S) ->
    receive
        {batch, Requests} when is_list(Requests) ->
            counters:add(C, ?BATCHES, 1),
            replay(Requests, C, 0),
            loop(S);
        {system, From, Request} ->
            sys:handle_system_msg(Request, From, Parent, ?MODULE, [], S);
        _Other ->
            counters:add(C, ?MALFORMED, 1),
            loop(S)
    end.

%% `To ! Msg'; a name not registered here is counted (a dead letter),
%% where `!' would raise.
-spec deliver(pid() | reference() | atom(), term(), counters:counters_ref()) -> ok.
deliver(To, Msg, C) when is_atom(To) ->
    try
        To ! Msg,
        ok
    catch
        error:badarg -> counters:add(C, ?DEAD_LETTERS, 1)
    end;
deliver(To, Msg, _C) ->
    To ! Msg,
    ok.

-spec send_each(term(), term(), counters:counters_ref()) -> ok.
send_each([To | Rest], Msg, C) when is_pid(To); is_reference(To); is_atom(To) ->
    deliver(To, Msg, C),
    send_each(Rest, Msg, C);
send_each([_Bad | Rest], Msg, C) ->
    counters:add(C, ?MALFORMED, 1),
    send_each(Rest, Msg, C);
send_each([], _Msg, _C) ->
    ok;
send_each(_Improper, _Msg, C) ->
    counters:add(C, ?MALFORMED, 1).

-spec replay(list(), counters:counters_ref(), non_neg_integer()) -> ok.
replay([{send, To, Msg} | Rest], C, N) when is_pid(To); is_reference(To); is_atom(To) ->
    deliver(To, Msg, C),
    replay(Rest, C, N + 1);
replay([{send_many, Dests, Msg} | Rest], C, N) when is_list(Dests) ->
    %% One message to many local targets, in the order given; this worker
    %% replays the caller's other requests too, so each target gets the
    %% caller's messages in order. Targets that are not a pid, an alias or
    %% a name (or an improper tail) are counted malformed, the others still
    %% served.
    send_each(Dests, Msg, C),
    replay(Rest, C, N + 1);
replay([{cast, M, F, A} | Rest], C, N) when is_atom(M), is_atom(F), is_list(A) ->
    _ = spawn_or_count(C, ecall_request, run_cast, [M, F, A]),
    replay(Rest, C, N + 1);
replay([{call, From, Id, M, F, A} | Rest], C, N)
  when is_atom(From), is_integer(Id), is_atom(M), is_atom(F), is_list(A) ->
    call_by_id(C, From, Id, M, F, A, false),
    replay(Rest, C, N + 1);
replay([{call, From, Id, M, F, A, urgent} | Rest], C, N)
  when is_atom(From), is_integer(Id), is_atom(M), is_atom(F), is_list(A) ->
    call_by_id(C, From, Id, M, F, A, true),
    replay(Rest, C, N + 1);
replay([{reply, Id, Reply} | Rest], C, N) when is_integer(Id) ->
    reply(Id, Reply, C),
    replay(Rest, C, N + 1);
replay([{call, Alias, M, F, A} | Rest], C, N)
  when is_reference(Alias), is_atom(M), is_atom(F), is_list(A) ->
    call(C, Alias, M, F, A, false),
    replay(Rest, C, N + 1);
replay([{call, Alias, M, F, A, urgent} | Rest], C, N)
  when is_reference(Alias), is_atom(M), is_atom(F), is_list(A) ->
    %% Its caller waits for this reply before its next request: the reply
    %% is not held back for company on the way back.
    call(C, Alias, M, F, A, true),
    replay(Rest, C, N + 1);
replay([], C, N) ->
    counters:add(C, ?REQUESTS, N);
replay([_Bad | Rest], C, N) ->
    counters:add(C, ?MALFORMED, 1),
    replay(Rest, C, N);
replay(_Improper, C, N) ->
    counters:add(C, ?MALFORMED, 1),
    counters:add(C, ?REQUESTS, N).

-spec call(counters:counters_ref(), reference(), module(), atom(), list(), boolean()) -> term().
call(C, Alias, M, F, A, Urgent) ->
    case spawn_or_count(C, ecall_request, run_call, [Alias, M, F, A, Urgent]) of
        ok -> ok;
        {error, Why} -> ecall:send_reply(Alias, {Alias, {badrpc, Why}}, Urgent)
    end.

-spec call_by_id(counters:counters_ref(), node(), integer(), module(), atom(), list(),
                 boolean()) -> ok.
call_by_id(C, From, Id, M, F, A, Urgent) ->
    case spawn_or_count(C, ecall_request, run_call, [From, Id, M, F, A, Urgent]) of
        ok -> ok;
        {error, Why} -> ecall_route:reply(From, Id, {badrpc, Why}, Urgent)
    end.

%% A reply to a call of this node. One that finds no caller waiting (it
%% timed out, or its link failed) is counted; so is one on a node whose NIF
%% is not loaded (no call of this node waits by id: malformed).
-spec reply(integer(), term(), counters:counters_ref()) -> ok.
reply(Id, Reply, C) ->
    try ecall_nif:call_reply(Id, Reply) of
        true -> ok;
        false -> counters:add(C, ?LATE_REPLIES, 1)
    catch
        error:_ -> counters:add(C, ?MALFORMED, 1)
    end.

%% spawn/3 raises system_limit when the process table is full: counted, and
%% the rest of the batch goes on.
-spec spawn_or_count(counters:counters_ref(), module(), atom(), list()) ->
          ok | {error, system_limit}.
spawn_or_count(C, M, F, A) ->
    try spawn(M, F, A) of
        _Pid -> ok
    catch
        error:system_limit ->
            counters:add(C, ?SPAWN_FAILED, 1),
            {error, system_limit}
    end.

%%--------------------------------------------------------------------
%% sys callbacks

-spec system_continue(pid(), [sys:dbg_opt()], #state{}) -> no_return().
system_continue(_Parent, _Debug, S) ->
    loop(S).

-spec system_terminate(term(), pid(), [sys:dbg_opt()], #state{}) -> no_return().
system_terminate(Reason, _Parent, _Debug, _S) ->
    exit(Reason).

-spec system_get_state(#state{}) -> {ok, map()}.
system_get_state(#state{index = I, parent = P}) ->
    {ok, #{index => I, name => name(I), parent => P}}.

-spec system_replace_state(fun((map()) -> map()), #state{}) -> {ok, map(), #state{}}.
system_replace_state(StateFun, S) ->
    {ok, State} = system_get_state(S),
    %% Nothing here is replaceable: the state is derived from the index.
    _ = StateFun(State),
    {ok, State, S}.

-spec system_code_change(#state{}, module(), term(), term()) -> {ok, #state{}}.
system_code_change(S, _Module, _OldVsn, _Extra) ->
    {ok, S}.
