%% @private
%% One receiver worker: replays each batch in order (ecall_request:replay/2,3,
%% where every kind of request is).
%%
%% A special process (proc_lib + sys) rather than a gen_server: the loop is
%% the hot path on the receiving node. It answers system messages, so
%% `sys:get_state/1', `sys:suspend/1' and release handling work. It does not
%% trap exits: when its supervisor goes, it goes with the same reason.
%%
%% The mailbox is off_heap, so a backlog of batches never enters garbage
%% collection (and OTP 25's parallel signal buffers are available). Nothing
%% a peer sends kills the worker: a malformed element is counted and
%% skipped (ecall_request:replay/2), and anything else than a batch
%% is counted malformed.
%%
%% Numbered streams. A batch from a peer's C-node link is `{batch, Node,
%% <<Epoch:64, Shard:32, Seq:64>>, Requests}': batch `Seq' of the peer's
%% shard `Shard', in the epoch of the peer's connection (a new one each
%% time it opens). The peer keeps each batch until acknowledged and, when
%% a link's connection ends, writes what it kept again on the next one.
%% So a worker takes, per stream (`{Node, Shard}'), only the next number:
%% - one it has processed is a duplicate: dropped, counted (`duplicates');
%% - a later one means batches in between were lost on the way (a worker
%%   killed with them in its mailbox, or sent to it while it was being
%%   restarted): it is dropped, counted (`resumes'), and the link's
%%   connection is closed (erlang:disconnect_node/1), so that the peer
%%   writes again everything not acknowledged; until the next number
%%   comes, later ones are dropped without closing again;
%% - a stream it has not seen, or batch 1 of another epoch, starts anew.
%% The last number of each stream is in a table that outlives the workers
%% (streams_init/0, made by ecall_sup), written before the batch is
%% replayed. Each request replayed adds 1 to the worker's slot of an
%% atomics array: a worker killed in the middle of a batch leaves its
%% successor how many of it are done, and the successor replays only the
%% rest when the batch comes again. A successor also closes the links whose
%% streams its predecessor served, so that what its mailbox held is
%% written again.
%%
%% Acknowledgements. After 16 batches, or 5 ms after the first one not yet
%% acknowledged, a worker tells each stream's link the last number it has
%% processed: `<<Epoch:64, Shard:32, Seq:64>>' to `ecall_ack' on the
%% link's node (never over a new connection: `noconnect'). Never per
%% request, never in answer to an acknowledgement.
-module(ecall_receiver).

-export([start_link/1, init/2, streams_init/0]).
-export([system_continue/3, system_terminate/4, system_get_state/1,
         system_replace_state/2, system_code_change/4]).

-include("ecall_receiver.hrl").

%% The streams' last numbers: {{Node, Shard}, Epoch, Seq, Rx, Resumed}
%% (`Rx': the worker that serves it; `Resumed': the number at which it
%% last closed the link for a gap, or 0), and per worker the batch it is
%% replaying: {{current, Rx}, {Node, Shard}, Epoch, Seq}.
-define(STREAMS, ecall_rx_streams).
%% The progress of each worker's batch (see the module doc).
-define(PROGRESS, {ecall, rx_progress}).
%% Acknowledge after this many batches, or this many ms after the first
%% one not yet acknowledged.
-define(ACK_BATCHES, 16).
-define(ACK_MS, 5).

-record(state, {
    parent :: pid(),
    counters :: counters:counters_ref(),
    index :: pos_integer(),
    progress :: atomics:atomics_ref(),
    %% Per stream, the last number processed and not yet acknowledged.
    acks = #{} :: #{{node(), non_neg_integer()} => {binary(), non_neg_integer()}},
    batches = 0 :: non_neg_integer(),
    timer = false :: boolean(),
    %% A batch its predecessor replayed in part: {Stream, Epoch, Seq, Done}.
    skip = none :: none | {{node(), non_neg_integer()}, binary(), pos_integer(), non_neg_integer()}
}).

%% @doc Makes the table of the streams' last numbers and the workers'
%% progress, owned by the calling process (ecall_sup: they live as long as
%% ecall does, across restarts of the workers and of their supervisor).
-spec streams_init() -> ok.
streams_init() ->
    _ = ets:new(?STREAMS, [named_table, public, set, {write_concurrency, true}]),
    persistent_term:put(?PROGRESS, atomics:new(ecall_config:receivers(), [])),
    ok.

-spec start_link(pos_integer()) -> {ok, pid()}.
start_link(I) ->
    proc_lib:start_link(?MODULE, init, [self(), I], infinity,
                        [link, {message_queue_data, off_heap}]).

-spec init(pid(), pos_integer()) -> no_return().
init(Parent, I) ->
    true = register(ecall_receiver_sup:name(I), self()),
    %% The casts and calls it spawns inherit its group leader: the node's
    %% `user', as erpc's run under their caller's, not ecall's, which
    %% would have them killed when ecall stops on this node.
    _ = case whereis(user) of
            undefined -> ok;
            User -> group_leader(User, self())
        end,
    Progress = persistent_term:get(?PROGRESS),
    Skip = take_over(I, Progress),
    proc_lib:init_ack(Parent, {ok, self()}),
    loop(#state{parent = Parent, counters = ecall_receiver_sup:counters(), index = I,
                progress = Progress, skip = Skip}).

%% What a predecessor of worker `I' left: the batch it was replaying, if
%% it died in the middle (the successor replays the rest when it comes
%% again); and the links of its streams are closed, so that the peers
%% write again what it had not processed.
-spec take_over(pos_integer(), atomics:atomics_ref()) ->
          none | {{node(), non_neg_integer()}, binary(), pos_integer(), non_neg_integer()}.
take_over(I, Progress) ->
    Done = atomics:exchange(Progress, I, 0),
    Skip = case ets:take(?STREAMS, {current, I}) of
               [{_, Stream, Epoch, Seq}] -> {Stream, Epoch, Seq, Done};
               [] -> none
           end,
    Served = ets:select(?STREAMS, [{{{'$1', '$2'}, '_', '$3', I, '_'}, [],
                                    [{{'$1', '$2', '$3'}}]}]),
    _ = [begin
             ets:update_element(?STREAMS, {Node, Shard}, {5, Seq}),
             erlang:disconnect_node(Node)
         end || {Node, Shard, Seq} <- Served],
    Skip.

-spec loop(#state{}) -> no_return().
loop(#state{counters = C, parent = Parent} = S) ->
    receive
        {batch, Node, <<Epoch:8/binary, Shard:32, Seq:64>>, Requests}
          when is_atom(Node), is_list(Requests) ->
            counters:add(C, ?BATCHES, 1),
            loop(numbered({Node, Shard}, Epoch, Seq, Requests, S));
        {batch, Requests} when is_list(Requests) ->
            %% From the pure-Erlang transport: on the node's own
            %% connection, which loses nothing while it lasts.
            counters:add(C, ?BATCHES, 1),
            ecall_request:replay(Requests, C),
            loop(S);
        ecall_ack ->
            loop(acknowledge(S#state{timer = false}));
        {system, From, Request} ->
            sys:handle_system_msg(Request, From, Parent, ?MODULE, [], S);
        _Other ->
            counters:add(C, ?MALFORMED, 1),
            loop(S)
    end.

%% Batch `Seq' of `Stream' in `Epoch' (see the module doc).
-spec numbered({node(), non_neg_integer()}, binary(), non_neg_integer(), list(), #state{}) ->
          #state{}.
numbered(Stream, Epoch, Seq, Requests, #state{skip = {Stream, Epoch, Seq, Done}} = S) ->
    %% Its predecessor replayed the first `Done' of it.
    replay(Stream, Epoch, Seq, safe_nthtail(Done, Requests), S#state{skip = none});
numbered(Stream, Epoch, Seq, Requests, #state{counters = C} = S) ->
    case ets:lookup(?STREAMS, Stream) of
        [{_, Epoch, Last, _, _}] when Last > 0, Seq =< Last ->
            counters:add(C, ?DUPLICATES, 1),
            %% The peer sent it again: it has not had the acknowledgement.
            %% This number, not the last: a batch after it may be one a
            %% predecessor replayed in part.
            note_ack(Stream, Epoch, Seq, S);
        [{_, Epoch, Last, _, _}] when Seq =:= Last + 1 ->
            replay(Stream, Epoch, Seq, Requests, S);
        [{_, Epoch, 0, _, First}] when Seq =< First ->
            %% The start of a stream whose first number seen here was
            %% `First', a gap: what the peer writes again after the resume.
            replay(Stream, Epoch, Seq, Requests, S);
        [{_, Epoch, Last, _, Resumed}] ->
            gap(Stream, Epoch, Last, Seq, Resumed, S);
        [{_, _Earlier, _, _, _}] when Seq =:= 1 ->
            replay(Stream, Epoch, Seq, Requests, S);
        [] when Seq =:= 1 ->
            replay(Stream, Epoch, Seq, Requests, S);
        _ ->
            %% A stream (or an epoch) that does not start at 1 here: its
            %% first batches were lost on the way (a worker killed with
            %% them), or this node's ecall forgot it (it crashed).
            gap(Stream, Epoch, 0, Seq, 0, S)
    end.

%% Batches between the last one processed (`Last', 0: none) and this one
%% were lost on the way: the link's connection is closed, once per gap,
%% and the peer writes again what is not acknowledged. Until it does,
%% later numbers (`Resumed' set) are dropped without closing again: after
%% the last one processed, the next; of a stream not started, one no later
%% than the first seen.
-spec gap({node(), non_neg_integer()}, binary(), non_neg_integer(), pos_integer(),
          non_neg_integer(), #state{}) -> #state{}.
gap(_Stream, _Epoch, Last, _Seq, Last, S) when Last > 0 ->
    S;
gap(_Stream, _Epoch, 0, _Seq, Resumed, S) when Resumed > 0 ->
    S;
gap({Node, _} = Stream, Epoch, Last, Seq, _Resumed, #state{counters = C, index = I} = S) ->
    counters:add(C, ?RESUMES, 1),
    Mark = case Last of
               0 -> Seq;
               _ -> Last
           end,
    true = ets:insert(?STREAMS, {Stream, Epoch, Last, I, Mark}),
    _ = erlang:disconnect_node(Node),
    S.

-spec replay({node(), non_neg_integer()}, binary(), pos_integer(), list(), #state{}) -> #state{}.
replay(Stream, Epoch, Seq, Requests, #state{counters = C, index = I, progress = P} = S) ->
    %% Recorded first: a worker killed in the middle leaves its successor
    %% the batch, and how much of it is done (the atomics, 0 here).
    true = ets:insert(?STREAMS, [{Stream, Epoch, Seq, I, 0}, {{current, I}, Stream, Epoch, Seq}]),
    ecall_request:replay(Requests, C, {P, I}),
    true = ets:delete(?STREAMS, {current, I}),
    atomics:put(P, I, 0),
    note_ack(Stream, Epoch, Seq, S).

-spec safe_nthtail(non_neg_integer(), list()) -> list().
safe_nthtail(0, L) -> L;
safe_nthtail(N, [_ | T]) -> safe_nthtail(N - 1, T);
safe_nthtail(_, _) -> [].

%% Notes `Seq' of `Stream' as processed, to acknowledge after
%% ?ACK_BATCHES batches or ?ACK_MS ms.
-spec note_ack({node(), non_neg_integer()}, binary(), non_neg_integer(), #state{}) -> #state{}.
note_ack(Stream, Epoch, Seq, #state{acks = Acks, batches = B, timer = T} = S) ->
    Acks1 = case Acks of
                #{Stream := {Epoch, Acked}} when Acked >= Seq -> Acks;
                _ -> Acks#{Stream => {Epoch, Seq}}
            end,
    S1 = S#state{acks = Acks1, batches = B + 1},
    case B + 1 >= ?ACK_BATCHES of
        true ->
            acknowledge(S1);
        false when T ->
            S1;
        false ->
            _ = erlang:send_after(?ACK_MS, self(), ecall_ack),
            S1#state{timer = true}
    end.

%% Tells each stream's link the last number processed.
-spec acknowledge(#state{}) -> #state{}.
acknowledge(#state{acks = Acks, counters = C} = S) ->
    maps:foreach(fun({Node, Shard}, {Epoch, Seq}) ->
                         counters:add(C, ?ACKS, 1),
                         _ = erlang:send({ecall_ack, Node}, <<Epoch/binary, Shard:32, Seq:64>>,
                                         [noconnect])
                 end, Acks),
    S#state{acks = #{}, batches = 0}.

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
    {ok, #{index => I, name => ecall_receiver_sup:name(I), parent => P}}.

-spec system_replace_state(fun((map()) -> map()), #state{}) -> {ok, map(), #state{}}.
system_replace_state(StateFun, S) ->
    {ok, State} = system_get_state(S),
    %% Nothing here is replaceable: the state is derived from the index.
    _ = StateFun(State),
    {ok, State, S}.

-spec system_code_change(#state{}, module(), term(), term()) -> {ok, #state{}}.
system_code_change(S, _Module, _OldVsn, _Extra) ->
    {ok, S}.
