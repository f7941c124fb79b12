%% @private
%% The requests of ecall: every kind, how it is built, its wire form, and
%% how the receiving node replays it. This module is their one home.
%%
%% A batch message carries a list of these to a receiver worker of the
%% peer (ecall_receiver), which replays them in order with replay/2,3:
%% `{batch, Node, Stream, Requests}' from a C-node link (numbered, see
%% ecall_receiver), `{batch, Requests}' from the pure-Erlang transport. Both transports carry the same terms: the pure-Erlang one as
%% built here, the NIF one encoded by the NIF, which writes `{send, Dest,
%% Msg}' and `{send_many, Dests, Msg}' as it encodes (native/ecall_nif/src/
%% push.rs) and the front of a big request around a message it encoded on
%% a dirty scheduler (push_encoded/4, for `send' and `reply'); any other
%% request it encodes as built here.
%%
%% A new kind takes: a constructor and a replay clause here, its line in
%% request(), the NIF's encoding if it has a fast path of its own, a test,
%% and a line in doc/behaviour.md.
%%
%% Both nodes of a connection speak the same version/0 (ecall_conn checks
%% it when the connection opens; a peer of another version is refused and
%% its traffic goes by plain distribution).
-module(ecall_request).

-export([version/0]).
-export([send/2, send_many/2, cast/3, call/5, call_alias/4, reply/2, wire/2]).
-export([replay/2, replay/3, reply/4, run_call/5, run_call/6, run_cast/3]).

-include("ecall_receiver.hrl").

%% The version of the requests below. Peers of another version do not
%% exchange requests (see ecall_conn).
-define(VERSION, 2).

%% One element of a `{batch, Requests}' message.
%% - `send': `Dest ! Msg'; `send_many': `Msg' to each of `Dests', in order.
%% - `cast': spawns `M:F(A...)'.
%% - `call' with `From' and `Id' (the NIF transport): the peer sends
%%   `{reply, Id, Reply}' to a receiver of node `From', which hands it to
%%   the caller waiting under `Id' (ecall_nif:call_reply/2).
%% - `call' with `Alias' (the pure-Erlang transport): the peer sends
%%   `{Alias, Reply}' to `Alias'.
%% - A call marked `urgent' comes from a caller in a closed loop
%%   (ecall_rpc:closed_loop/0): the peer sends its reply without waiting
%%   for other requests to batch with it (wire/2).
-type request() :: {send, Dest :: dest(), Msg :: term()}
                 | {send_many, [dest()], Msg :: term()}
                 | {cast, module(), atom(), [term()]}
                 | {call, From :: node(), Id :: non_neg_integer(), module(), atom(), [term()]}
                 | {call, From :: node(), Id :: non_neg_integer(), module(), atom(), [term()],
                    urgent}
                 | {reply, Id :: non_neg_integer(), reply()}
                 | {call, Alias :: reference(), module(), atom(), [term()]}
                 | {call, Alias :: reference(), module(), atom(), [term()], urgent}.
%% A target on the peer: a pid, an alias or a registered name.
-type dest() :: pid() | reference() | atom().
%% What a call's reply carries back: to `Alias', as `{Alias, Reply}'; to a
%% caller waiting under an id, as `{Ref, Reply}'.
-type reply() :: {value, term()} | {exception, error | exit, term(), list()}
               | {badrpc, term()}
               %% A big reply to a call answered by id: the other forms, in
               %% external format, decoded by the caller.
               | {external, binary()}.
%% Where replay/3 counts the requests of a batch done: slot `I' of an
%% atomics array.
-type progress() :: none | {atomics:atomics_ref(), pos_integer()}.
-export_type([request/0, dest/0, reply/0, progress/0]).

%% @doc The version of the requests this node sends and replays.
-spec version() -> pos_integer().
version() ->
    ?VERSION.

%%--------------------------------------------------------------------
%% Constructors

-spec send(dest(), term()) -> request().
send(Dest, Msg) -> {send, Dest, Msg}.

-spec send_many([dest()], term()) -> request().
send_many(Dests, Msg) -> {send_many, Dests, Msg}.

-spec cast(module(), atom(), [term()]) -> request().
cast(M, F, A) -> {cast, M, F, A}.

%% @doc A call answered by id: its reply goes to a receiver of node
%% `From', for the caller waiting under `Id'.
-spec call(node(), non_neg_integer(), module(), atom(), [term()]) -> request().
call(From, Id, M, F, A) -> {call, From, Id, M, F, A}.

%% @doc A call answered by alias: its reply goes to `Alias'.
-spec call_alias(reference(), module(), atom(), [term()]) -> request().
call_alias(Alias, M, F, A) -> {call, Alias, M, F, A}.

-spec reply(non_neg_integer(), reply()) -> request().
reply(Id, Reply) -> {reply, Id, Reply}.

%% @doc The request as it goes on the wire: a call from a caller in a
%% closed loop (`Urgent') is marked `urgent'.
-spec wire(request(), boolean()) -> request().
wire({call, _, _, _, _} = Call, true) -> erlang:append_element(Call, urgent);
wire({call, _, _, _, _, _} = Call, true) -> erlang:append_element(Call, urgent);
wire(Request, _Urgent) -> Request.

%%--------------------------------------------------------------------
%% Replay, on the receiving node

%% @doc Replays the requests of one batch in order, counting them in the
%% receiver pool's counters `C'. Nothing a peer sends raises here: a
%% malformed element is counted and skipped; a cast or call that cannot be
%% spawned (the process table is full) is counted, and the call is
%% answered `{badrpc, system_limit}'.
-spec replay(term(), counters:counters_ref()) -> ok.
replay(Requests, C) ->
    replay(Requests, C, 0, none).

%% @doc replay/2, adding 1 to slot `I' of atomics `Done' as each request
%% has been replayed (or skipped, malformed): a receiver killed in the
%% middle of a batch leaves its successor the number of requests of it
%% that are done (ecall_receiver).
-spec replay(term(), counters:counters_ref(), progress()) -> ok.
replay(Requests, C, Progress) ->
    replay(Requests, C, 0, Progress).

-spec replay(term(), counters:counters_ref(), non_neg_integer(), progress()) -> ok.
replay([{send, To, Msg} | Rest], C, N, P) when is_pid(To); is_reference(To); is_atom(To) ->
    deliver(To, Msg, C),
    next(Rest, C, N + 1, P);
replay([{send_many, Dests, Msg} | Rest], C, N, P) when is_list(Dests) ->
    %% One message to many local targets, in the order given; this worker
    %% replays the caller's other requests too, so each target gets the
    %% caller's messages in order. Targets that are not a pid, an alias or
    %% a name (or an improper tail) are counted malformed, the others still
    %% served.
    send_each(Dests, Msg, C),
    next(Rest, C, N + 1, P);
replay([{cast, M, F, A} | Rest], C, N, P) when is_atom(M), is_atom(F), is_list(A) ->
    _ = spawn_or_count(C, ?MODULE, run_cast, [M, F, A]),
    next(Rest, C, N + 1, P);
replay([{call, From, Id, M, F, A} | Rest], C, N, P)
  when is_atom(From), is_integer(Id), is_atom(M), is_atom(F), is_list(A) ->
    call_by_id(C, From, Id, M, F, A, false),
    next(Rest, C, N + 1, P);
replay([{call, From, Id, M, F, A, urgent} | Rest], C, N, P)
  when is_atom(From), is_integer(Id), is_atom(M), is_atom(F), is_list(A) ->
    call_by_id(C, From, Id, M, F, A, true),
    next(Rest, C, N + 1, P);
replay([{reply, Id, Reply} | Rest], C, N, P) when is_integer(Id) ->
    hand_reply(Id, Reply, C),
    next(Rest, C, N + 1, P);
replay([{call, Alias, M, F, A} | Rest], C, N, P)
  when is_reference(Alias), is_atom(M), is_atom(F), is_list(A) ->
    call_by_alias(C, Alias, M, F, A, false),
    next(Rest, C, N + 1, P);
replay([{call, Alias, M, F, A, urgent} | Rest], C, N, P)
  when is_reference(Alias), is_atom(M), is_atom(F), is_list(A) ->
    call_by_alias(C, Alias, M, F, A, true),
    next(Rest, C, N + 1, P);
replay([], C, N, _P) ->
    counters:add(C, ?REQUESTS, N);
replay([_Bad | Rest], C, N, P) ->
    counters:add(C, ?MALFORMED, 1),
    next(Rest, C, N, P);
replay(_Improper, C, N, _P) ->
    counters:add(C, ?MALFORMED, 1),
    counters:add(C, ?REQUESTS, N).

%% One request of the batch done.
-spec next(term(), counters:counters_ref(), non_neg_integer(), progress()) -> ok.
next(Rest, C, N, none) ->
    replay(Rest, C, N, none);
next(Rest, C, N, {Done, I} = P) ->
    atomics:add(Done, I, 1),
    replay(Rest, C, N, P).

%% `To ! Msg'; a name not registered here is counted (a dead letter),
%% where `!' would raise.
-spec deliver(dest(), term(), counters:counters_ref()) -> ok.
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

-spec call_by_alias(counters:counters_ref(), reference(), module(), atom(), list(), boolean()) ->
          term().
call_by_alias(C, Alias, M, F, A, Urgent) ->
    case spawn_or_count(C, ?MODULE, run_call, [Alias, M, F, A, Urgent]) of
        ok -> ok;
        {error, Why} -> ecall_route:send_to(Alias, {Alias, {badrpc, Why}}, Urgent)
    end.

-spec call_by_id(counters:counters_ref(), node(), integer(), module(), atom(), list(),
                 boolean()) -> ok.
call_by_id(C, From, Id, M, F, A, Urgent) ->
    case spawn_or_count(C, ?MODULE, run_call, [From, Id, M, F, A, Urgent]) of
        ok -> ok;
        {error, Why} -> reply(From, Id, {badrpc, Why}, Urgent)
    end.

%% A reply to a call of this node. One that finds no caller waiting (it
%% timed out, or its link failed) is counted; so is one on a node whose NIF
%% is not loaded (no call of this node waits by id: malformed).
-spec hand_reply(integer(), term(), counters:counters_ref()) -> ok.
hand_reply(Id, Reply, C) ->
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

%% @doc On the node that ran a call answered by id: its reply, `{reply,
%% Id, Reply}', to a receiver of the caller's node `From', through the
%% transport of the connection to it (batched, or at once when `Urgent':
%% its caller is in a closed loop), else by `!' to its first receiver. A
%% reply is the replying process's last message: it has no order to keep
%% with others. One the transport refuses for want of room goes by `!'
%% too: its caller waits for it.
-spec reply(node(), non_neg_integer(), reply(), boolean()) -> ok.
reply(From, Id, Reply, Urgent) ->
    Request = reply(Id, Reply),
    case ecall_route:peer(From) of
        {Mod, State, _Loops} ->
            case Mod:push(State, Request, Urgent) of
                ok -> ok;
                _ClosedOrOverload -> native_reply(From, Request)
            end;
        undefined ->
            native_reply(From, Request)
    end.

-spec native_reply(node(), request()) -> ok.
native_reply(From, Request) ->
    _ = erlang:send({ecall_receiver_sup:name(1), From}, {batch, [Request]}),
    ok.

%% @doc On the receiving node: runs a call answered by id and sends the
%% reply to node `From' (reply/4).
-spec run_call(node(), non_neg_integer(), module(), atom(), list(), boolean()) -> ok.
run_call(From, Id, M, F, A, Urgent) ->
    reply(From, Id, apply_call(M, F, A), Urgent).

%% @doc On the receiving node: runs a call answered by alias and sends the
%% reply to `Alias' as a send does (ecall_route), urgent when the call was.
-spec run_call(reference(), module(), atom(), list(), boolean()) -> term().
run_call(Alias, M, F, A, Urgent) ->
    ecall_route:send_to(Alias, {Alias, apply_call(M, F, A)}, Urgent).

%% @doc On the receiving node: runs a cast, as erpc:cast/4 would.
-spec run_cast(module(), atom(), list()) -> term().
run_cast(M, F, A) ->
    apply(M, F, A).

-spec apply_call(module(), atom(), list()) -> reply().
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
