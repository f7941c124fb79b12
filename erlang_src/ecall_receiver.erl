%% @private
%% One receiver worker: replays each `{batch, Requests}' in order:
%% `{send, To, Msg}' is `To ! Msg', `{cast, M, F, A}' spawns M:F(A...) and
%% `{call, Alias, M, F, A}' spawns a process that applies it and sends the
%% reply to `Alias' (ecall_request:run_call/4).
%%
%% A plain receive loop rather than a gen_server: the loop is the hot path
%% on the receiving node. The mailbox is off_heap, so a backlog of batches
%% never enters garbage collection (and OTP 25's parallel signal buffers are
%% available). A malformed element is counted and skipped; it never kills
%% the worker.
-module(ecall_receiver).

-export([start_link/1, name/1, init/2]).

%% Counter indexes (see ecall_receiver_sup:init/1).
-define(BATCHES, 1).
-define(REQUESTS, 2).
-define(MALFORMED, 3).
-define(DEAD, 4).

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
    loop(ecall_receiver_sup:counters()).

-spec loop(counters:counters_ref()) -> no_return().
loop(C) ->
    receive
        {batch, Requests} when is_list(Requests) ->
            counters:add(C, ?BATCHES, 1),
            replay(Requests, C, 0);
        _Other ->
            counters:add(C, ?MALFORMED, 1)
    end,
    loop(C).

-spec replay(list(), counters:counters_ref(), non_neg_integer()) -> ok.
replay([{send, To, Msg} | Rest], C, N) when is_pid(To); is_reference(To) ->
    To ! Msg,
    replay(Rest, C, N + 1);
replay([{send, To, Msg} | Rest], C, N) when is_atom(To) ->
    try
        To ! Msg
    catch
        error:badarg -> counters:add(C, ?DEAD, 1)
    end,
    replay(Rest, C, N + 1);
replay([{cast, M, F, A} | Rest], C, N) when is_atom(M), is_atom(F), is_list(A) ->
    _ = spawn(ecall_request, run_cast, [M, F, A]),
    replay(Rest, C, N + 1);
replay([{call, Alias, M, F, A} | Rest], C, N)
  when is_reference(Alias), is_atom(M), is_atom(F), is_list(A) ->
    _ = spawn(ecall_request, run_call, [Alias, M, F, A]),
    replay(Rest, C, N + 1);
replay([], C, N) ->
    counters:add(C, ?REQUESTS, N);
replay([_Bad | Rest], C, N) ->
    counters:add(C, ?MALFORMED, 1),
    replay(Rest, C, N);
replay(_Improper, C, N) ->
    counters:add(C, ?MALFORMED, 1),
    counters:add(C, ?REQUESTS, N).
