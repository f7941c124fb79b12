%% @private
%% The NIF transport (see ecall_transport): the calling process encodes its
%% request once in the Rust NIF and pushes it into its shard of the peer's
%% queues; C-node links write what each shard holds as one `{batch,
%% Requests}' message.
%%
%% When the peer's byte budget is full the `overflow' policy decides:
%% `block' waits for room (callers are admitted in arrival order), `error'
%% and `drop' give up at once (`overload', counted in `overflow_drops').
-module(ecall_transport_nif).
-behaviour(ecall_transport).

-export([open/2, push/3, call/6, cancel/2, stats/1, drain/1, close/2]).
-export([caller_link/1]).

%% For the peer's flusher (see flusher/2); flush_loop/2 is called by its
%% module name, so that a flusher survives code upgrades.
-export([flusher/2, flush_loop/2]).
%% Calls that outlive a close in order (see close/2).
-export([calls_watch/2]).

%% Binary messages from this size on take the large-message path
%% (send_large/3): encoded and copied into a batch of their own on a dirty
%% scheduler, so that no normal scheduler is held for the copy.
-define(LARGE, 65536).

%% Messages whose encoding reaches this size go straight to their target,
%% not through the peer's receiver (direct/3): a relayed message is built
%% twice on the peer, each time holding a scheduler, and its fence costs a
%% round trip, small against the transfer of that many bytes.
-define(DIRECT, 262144).
%% How long the fence of a direct message may take (direct/3).
-define(FENCE_TIMEOUT, 5000).

-opaque state() :: {node(), ecall_nif:peer()}.
-export_type([state/0]).

-spec open(node(), [binary()]) -> {ok, state(), pos_integer()} | {error, term()}.
open(Node, Receivers) ->
    case ecall_cnode:cnode() of
        {ok, CNode} ->
            Cookie = atom_to_binary(erlang:get_cookie(Node)),
            {ok, Peer} = ecall_nif:peer_open(CNode, atom_to_binary(Node), Cookie,
                                             Receivers, self(), ecall_config:peer_opts()),
            %% Linked to the connection process, which ends the connection
            %% if it dies (a transport process); it ends when that process
            %% does, whatever the reason.
            Owner = self(),
            ok = ecall_nif:peer_flusher(Peer, proc_lib:spawn_link(?MODULE, flusher, [Peer, Owner])),
            {ok, {Node, Peer}, length(ecall_nif:cnode_info(CNode))};
        {error, _} = E ->
            E
    end.

%% A send takes the NIF's own encoding of `{send, Dest, Msg}' (built as it
%% encodes), and the large-message path when it is big; a send_many the
%% NIF's list of targets; any other request the NIF's encoding of the
%% term.
-spec push(state(), ecall_request:request(), boolean()) -> ecall_transport:push_result().
push(State, {send, Dest, Msg}, _Urgent) when is_binary(Msg), byte_size(Msg) >= ?LARGE ->
    %% A batch of its own: never held back for company.
    send_large(State, Dest, Msg);
push({_, Peer} = State, {send, Dest, Msg} = Request, Urgent) ->
    case ecall_nif:send(Peer, Dest, Msg, Urgent) of
        {full, _} -> push_term(State, Request, Urgent);
        large -> send_large(State, Dest, Msg);
        Result -> Result
    end;
push({_, Peer} = State, {send_many, Dests, Msg}, _Urgent) ->
    %% On this scheduler if the list and the message are short enough
    %% (see ecall_nif:push_many/4), else on a dirty one.
    push_with(State, send,
              fun(Room) ->
                      case ecall_nif:push_many(Peer, Dests, Msg, Room) of
                          large -> ecall_nif:push_many_dirty(Peer, Dests, Msg, Room);
                          Result -> Result
                      end
              end);
push(State, Request, Urgent) ->
    push_term(State, Request, Urgent).

%% A message whose encoding passes the NIF's inline bound (INLINE_MAX,
%% native/ecall_nif's encode/mod.rs), or a binary of ?LARGE bytes,
%% encoded once by encode_large/1, on a dirty scheduler and into memory of
%% the NIF's, not a binary of the caller's (see ecall_nif). From ?DIRECT
%% bytes on it goes straight to its target, a pid, a registered name or
%% an alias (a call's reply: see direct/3); below, as a request the peer's
%% receiver replays.
-spec send_large(state(), pid() | reference() | atom(), term()) ->
          ecall_transport:push_result().
send_large(State, Dest, Msg) ->
    {Size, Encoded} = ecall_nif:encode_large(Msg),
    case Size >= ?DIRECT of
        true -> direct(State, Dest, Encoded);
        false -> relayed(State, Dest, Encoded)
    end.

%% The encoded message as a request the peer's receiver replays: the NIF
%% writes {send, Dest, Msg} around it, without encoding it again.
-spec relayed(state(), pid() | reference() | atom(), ecall_nif:encoded()) ->
          ecall_transport:push_result().
relayed({_, Peer} = State, Dest, Encoded) ->
    push_with(State, send,
              fun(Room) -> ecall_nif:push_encoded(Peer, {send, Dest}, Encoded, Room) end).

%% A big message straight to its target, which decodes it itself, as a
%% message sent with `!': relayed by the receiver it would be decoded by
%% the receiver and then copied again to the target, and each of those
%% holds a scheduler of the peer for as long as it takes (seconds for
%% terms of tens of MB), with everything behind it on that receiver.
%%
%% Per-caller order: this caller's earlier requests on the links are
%% replayed by a receiver on the peer, which may not have done so yet when
%% this message reaches its target. So first a call through the links (the
%% fence): it is replayed after them, so its answer means they have been.
%% The caller's later requests follow this message on the same connection
%% and its shard holds them until it has been written. The fence costs one
%% round trip per big message; a failed one leaves the message to the
%% receiver's replay, in order.
-spec direct(state(), pid() | reference() | atom(), ecall_nif:encoded()) ->
          ecall_transport:push_result().
direct({Node, Peer} = State, Dest, Encoded) ->
    case ecall_rpc:call(Node, erlang, node, [], ?FENCE_TIMEOUT, true) of
        {ok, _} ->
            push_with(State, send,
                      fun(Room) -> ecall_nif:push_encoded(Peer, {direct, Dest}, Encoded, Room) end);
        {error, overload} ->
            overload;
        {error, _} ->
            relayed(State, Dest, Encoded)
    end.

-spec push_term(state(), ecall_request:request(), boolean()) -> ecall_transport:push_result().
push_term({_, Peer} = State, Request0, Urgent) ->
    Request = ecall_request:wire(Request0, Urgent),
    push_with(State, element(1, Request),
              fun(Room) ->
                      case ecall_nif:push(Peer, Request, Room, Urgent) of
                          large -> push_large(Peer, Request, Room);
                          Result -> Result
                      end
              end).

%% A request whose encoding passes what the NIF encodes inline (INLINE_MAX),
%% encoded on a dirty scheduler. A cast's or call's large arguments: the
%% whole request. A call's reply: the reply alone, and from ?DIRECT bytes
%% on as a binary, `{reply, Id, {external, Encoded}}': the receiver on the
%% caller's node then hands the binary to the caller, which decodes it
%% (ecall_request:result/1), instead of holding the receiver for as long as
%% the decode of a big term takes.
-spec push_large(ecall_nif:peer(), ecall_request:request(), ecall_nif:room() | false) ->
          ok | closed | {full, non_neg_integer()}.
push_large(Peer, {reply, Id, Reply}, Room) ->
    {Size, Encoded} = ecall_nif:encode_large(Reply),
    Target = case Size >= ?DIRECT of
                 true -> {reply_external, Id};
                 false -> {reply, Id}
             end,
    ecall_nif:push_encoded(Peer, Target, Encoded, Room);
push_large(Peer, Request, Room) ->
    {_, Encoded} = ecall_nif:encode_large(Request),
    ecall_nif:push_encoded(Peer, whole, Encoded, Room).

%% A call whose reply the caller waits for under `Ref': registered with
%% the NIF under an id (which stands for the caller and `Ref' on this
%% node; see native/ecall_nif/src/calls/), then pushed as `{call, node(),
%% Id, M, F, A}'.
-spec call(state(), reference(), module(), atom(), [term()], boolean()) ->
          {ok, non_neg_integer()} | ecall_transport:push_result().
call({_, Peer} = State, Ref, M, F, A, Urgent) ->
    case ecall_nif:call_wait(Peer, Ref) of
        {ok, Id} ->
            case push_term(State, ecall_request:call(node(), Id, M, F, A), Urgent) of
                ok ->
                    {ok, Id};
                NotQueued ->
                    _ = ecall_nif:call_cancel(Id),
                    NotQueued
            end;
        closed ->
            closed
    end.

-spec cancel(state(), non_neg_integer()) -> boolean().
cancel(_State, Id) ->
    ecall_nif:call_cancel(Id).

%% Pushes the request, with `false' or with the room set aside for it.
-type pusher() :: fun((ecall_nif:room() | false) -> ok | closed | {full, non_neg_integer()}).

%% `Kind' (send, cast, call) is for the overflow_drop telemetry event.
-spec push_with(state(), send | cast | call, pusher()) -> ecall_transport:push_result().
push_with({Node, Peer}, Kind, Push) ->
    case Push(false) of
        {full, Size} ->
            case ecall_config:get(overflow) of
                block ->
                    wait_room(Peer, Size, Push);
                Policy ->
                    ok = ecall_nif:overflow_drop(Peer),
                    %% One event per count of `overflow_drops'.
                    ecall_event:execute([ecall, request, overflow_drop], #{count => 1},
                                            #{peer => Node, kind => Kind, policy => Policy}),
                    overload
            end;
        Result ->
            Result
    end.

-spec wait_room(ecall_nif:peer(), non_neg_integer(), pusher()) -> ok | closed.
wait_room(Peer, Size, Push) ->
    Ref = make_ref(),
    case ecall_nif:wait_room(Peer, Size, Ref) of
        {retry, Room} ->
            admitted(Push, Room);
        wait ->
            receive
                {ecall_room, Ref, false} -> closed;
                {ecall_room, Ref, Room} -> admitted(Push, Room)
            end
    end.

%% The room is set aside in the budget: the push uses it (a caller killed
%% before it pushes gives it back when the room term is collected).
-spec admitted(pusher(), ecall_nif:room()) -> ok | closed.
admitted(Push, Room) ->
    case Push(Room) of
        ok -> ok;
        _ -> closed
    end.

%% The peer's flusher: a push that finds its link's writer asleep sends it
%% `{ecall_flush, K}' instead of waking the writer thread. It writes what
%% link K holds (ecall_nif:flush/2), on a scheduler, after the processes
%% that were ready to run before it: on a busy node their pushes make one
%% write. More pushed meanwhile: the message again, behind them.
-spec flusher(ecall_nif:peer(), pid()) -> ok.
flusher(Peer, Owner) ->
    flush_loop(Peer, monitor(process, Owner)).

-spec flush_loop(ecall_nif:peer(), reference()) -> ok.
flush_loop(Peer, Owner) ->
    receive
        {ecall_flush, K} ->
            _ = case ecall_nif:flush(Peer, K) of
                    true -> self() ! {ecall_flush, K};
                    false -> ok
                end,
            ?MODULE:flush_loop(Peer, Owner);
        {'DOWN', Owner, process, _, _} ->
            ok
    end.

%% The calls of a peer closed in order (close/2): they fail with
%% `noconnection' if `Node' goes down; the watch ends then, or once none
%% is left (looked at every second).
-spec calls_watch(node(), ecall_nif:peer()) -> ok.
calls_watch(Node, Peer) ->
    true = erlang:monitor_node(Node, true),
    calls_watch_loop(Node, Peer).

-spec calls_watch_loop(node(), ecall_nif:peer()) -> ok.
calls_watch_loop(Node, Peer) ->
    receive
        {nodedown, Node} ->
            _ = ecall_nif:calls_fail(Peer, all, noconnection),
            ok
    after 1000 ->
        case ecall_nif:calls_waiting(Peer) of
            0 -> ok;
            _ -> calls_watch_loop(Node, Peer)
        end
    end.

%% @doc The link (0-based) that carries the calling process's requests.
-spec caller_link(state()) -> non_neg_integer().
caller_link({_, Peer}) ->
    ecall_nif:caller_link(Peer).

%% Each `per_link' entry carries its link number (`link', from 1, as in
%% logs and telemetry).
-spec stats(state()) -> map().
stats({_, Peer}) ->
    (ecall_nif:peer_stats(Peer))#{transport => nif}.

%% Pushes answer `closed' from now on; each link writes what its shards
%% hold, then stops and says so (`{ecall_link, K, stopped}').
-spec drain(state()) -> ok.
drain({_, Peer}) ->
    ecall_nif:peer_drain(Peer).

%% Callers waiting on replies fail here, once nothing more can be queued;
%% unless the peer is stopping in order (`peer_stopping'): their requests
%% have been replayed there, and their replies come back on the peer's
%% way to this node. They then wait as erpc's would: until the reply,
%% their timeout, or `nodedown' (calls_watch/2).
-spec close(state(), term()) -> non_neg_integer().
close({Node, Peer}, Why) ->
    ok = ecall_nif:peer_close(Peer),
    _ = case Why of
            peer_stopping -> proc_lib:spawn(?MODULE, calls_watch, [Node, Peer]);
            _ -> ecall_nif:calls_fail(Peer, all, Why)
        end,
    %% What the close dropped, and what its links dropped before (failed
    %% writes, reaps): the peer's counters go with it.
    #{closed_drops := Closed, dropped := Lost} = ecall_nif:peer_stats(Peer),
    Closed + Lost.
