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

-export([open/2, send/3, push/2, reply_watcher/1, stats/1, close/2]).
-export([caller_link/1]).

%% Binary messages from this size on take the large-message path: encoded
%% by term_to_iovec/1 (the binary is referenced, not copied) and copied
%% into a batch of their own on a dirty scheduler, so that no normal
%% scheduler is held for the copy.
-define(LARGE, 65536).

-opaque state() :: {node(), ecall_nif:peer()}.
-export_type([state/0]).

-spec open(node(), [binary()]) -> {ok, state(), pos_integer()} | {error, term()}.
open(Node, Receivers) ->
    case ecall_cnode:cnode() of
        {ok, CNode} ->
            Cookie = atom_to_binary(erlang:get_cookie(Node)),
            {ok, Peer} = ecall_nif:peer_open(CNode, atom_to_binary(Node), Cookie,
                                             Receivers, self(), ecall_config:peer_opts()),
            {ok, {Node, Peer}, length(ecall_nif:cnode_info(CNode))};
        {error, _} = E ->
            E
    end.

-spec send(state(), pid() | reference() | atom(), term()) -> ecall_transport:push_result().
send(State, Dest, Msg) when is_binary(Msg), byte_size(Msg) >= ?LARGE ->
    push_iovec(State, {send, Dest, Msg});
send({_, Peer} = State, Dest, Msg) ->
    %% The common case: the NIF builds {send, Dest, Msg} as it encodes.
    case ecall_nif:send(Peer, Dest, Msg) of
        {full, _} -> push(State, {send, Dest, Msg});
        large -> push_iovec(State, {send, Dest, Msg});
        Result -> Result
    end.

-spec push(state(), ecall_transport:request()) -> ecall_transport:push_result().
push({_, Peer} = State, Request) ->
    push_with(State, element(1, Request),
              fun(Room) ->
                      case ecall_nif:push(Peer, Request, Room) of
                          large -> ecall_nif:push_iovec(Peer, erlang:term_to_iovec(Request), Room);
                          Result -> Result
                      end
              end).

%% A request whose encoding passes 16 KiB (the NIF says `large' rather
%% than hold the caller's scheduler that long), or a large binary: encoded
%% by term_to_iovec (a BIF that yields; big binaries are referenced, not
%% copied), copied into a batch of its own on a dirty scheduler.
-spec push_iovec(state(), ecall_transport:request()) -> ecall_transport:push_result().
push_iovec({_, Peer} = State, Request) ->
    IoVec = erlang:term_to_iovec(Request),
    push_with(State, element(1, Request),
              fun(Room) -> ecall_nif:push_iovec(Peer, IoVec, Room) end).

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
                    ecall_telemetry:execute([ecall, request, overflow_drop], #{count => 1},
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

%% The process that stands for the link carrying this caller's requests,
%% which exits when that link or the whole connection goes down: one local
%% monitor on it gives the caller both the reply alias and prompt failure.
%% Nothing per call crosses the network but the request itself.
-spec reply_watcher(state()) -> {ok, pid()} | closed.
reply_watcher({Node, Peer}) ->
    case ecall_conn:watcher(Node, ecall_nif:caller_link(Peer)) of
        undefined -> closed;
        Watcher -> {ok, Watcher}
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

-spec close(state(), term()) -> non_neg_integer().
close({_, Peer}, _Why) ->
    %% Callers waiting on replies monitor the link watchers, which the
    %% connection process ends with the reason.
    ok = ecall_nif:peer_close(Peer),
    %% What the close dropped, and what its links dropped before (failed
    %% writes, reaps): the peer's counters go with it.
    #{closed_drops := Closed, dropped := Lost} = ecall_nif:peer_stats(Peer),
    Closed + Lost.
