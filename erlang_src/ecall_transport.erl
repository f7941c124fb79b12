%% @private
%% The transport behaviour: how requests reach one peer.
%%
%% A connection process (ecall_conn) opens a transport for its peer and
%% publishes `{Module, State}'; callers then go through the callbacks
%% without a process hop. Two modules implement it:
%%
%% - `ecall_transport_nif': the caller encodes each request once in the
%%   Rust NIF and pushes it into its shard; C-node links write `{batch,
%%   Requests}' messages to the peer's receiver pool (byte budget,
%%   overflow policy, write deadlines).
%% - `ecall_proxy': the pure-Erlang transport, a pool of proxy processes
%%   that batch over plain distribution (no budget).
%%
%% Both deliver the same {@type request()}s to the same receiver pool
%% (ecall_receiver), in per-caller order.
%%
%% Results of send/push: `ok' (queued), `closed' (the transport is gone:
%% the caller uses native distribution instead), `overload' (the byte
%% budget is full and the `overflow' policy is `error' or `drop'; counted).
-module(ecall_transport).

%% One element of a `{batch, Requests}' message. A call marked `urgent'
%% comes from a caller in a closed loop (ecall_request:closed_loop/0): the
%% peer sends its reply without waiting for other requests to batch with
%% it. Only sent to a peer of protocol 1 or more (wire/3).
%%
%% A call is answered one of two ways. `{call, From, Id, M, F, A}' (peers
%% of protocol 3 or more, through the NIF transport): the peer sends
%% `{reply, Id, Reply}' to a receiver of node `From', which hands it to
%% the caller waiting under `Id' (ecall_nif:call_reply/2). `{call, Alias,
%% M, F, A}': the peer sends `{Alias, Reply}' to `Alias'.
-type request() :: {send, Dest :: pid() | reference() | atom(), Msg :: term()}
                 | {send_many, [Dest :: pid() | reference() | atom()], Msg :: term()}
                 | {cast, module(), atom(), [term()]}
                 | {call, From :: node(), Id :: non_neg_integer(), module(), atom(), [term()]}
                 | {call, From :: node(), Id :: non_neg_integer(), module(), atom(), [term()],
                    urgent}
                 | {reply, Id :: non_neg_integer(), reply()}
                 | {call, Alias :: reference(), module(), atom(), [term()]}
                 | {call, Alias :: reference(), module(), atom(), [term()], urgent}.
%% What a call's reply carries back: to `Alias', as `{Alias, Reply}'; to a
%% caller waiting under an id, as `{Ref, Reply}'.
-type reply() :: {value, term()} | {exception, error | exit, term(), list()}
               | {exception, term()} | {badrpc, term()}
               %% A big reply to a call answered by id: the other forms, in
               %% external format, decoded by the caller.
               | {external, binary()}.
-type push_result() :: ok | closed | overload.
-type t() :: {module(), term()}.
%% What a peer's receivers accept, learnt when the connection opens
%% (ecall_receiver_sup:hello/1): 0, the first releases (no `hello/1'); 1,
%% also urgent calls; 2, also `send_many' (one message to many targets);
%% 3, also calls answered by id (`{call, From, Id, ...}', `{reply, Id,
%% Reply}').
-type protocol() :: non_neg_integer().
-export_type([request/0, reply/0, push_result/0, t/0, protocol/0]).

-export([protocol/0, wire/3, loops/0, loop_starts/1]).

%% This node's protocol: what its receivers accept.
-define(PROTOCOL, 3).

%% Opens the transport to `Node', whose receiver pool has the names given
%% and accepts what `Protocol' says.
%% The calling process is the owner: it gets the transport's events (for
%% the NIF, `{ecall_link, K, up | {down, Reason, Unconfirmed} | {alive, Node}}') and
%% it is linked to whatever processes the transport starts. `Links' is how
%% many `up' events to wait for before publishing (0: usable at once).
-callback open(Node :: node(), Receivers :: [binary()], Protocol :: protocol()) ->
    {ok, State :: term(), Links :: non_neg_integer()} | {error, term()}.

%% `Msg' to each of `Dests' on the peer, in the caller's order, as one
%% request (one message encoded once, one charge to the byte budget);
%% `unsupported' when the peer's receivers do not know the request
%% (protocol below 2): the caller then sends to each.
-callback send_many(State :: term(), Dests :: [pid() | reference() | atom()], Msg :: term()) ->
    push_result() | unsupported.

%% `Dest ! Msg' on the peer, in the caller's order. `Urgent': the caller
%% waits for an answer before its next request (a call in a closed loop,
%% or a reply to one), so the transport should not hold it back waiting
%% for other requests to batch with it.
-callback send(State :: term(), Dest :: pid() | reference() | atom(), Msg :: term(),
               Urgent :: boolean()) ->
    push_result().

%% Queues one request, in the caller's order; `Urgent' as for send/4.
-callback push(State :: term(), request(), Urgent :: boolean()) -> push_result().

%% Counts a call of a caller in a closed loop (ecall_request:closed_loop/0)
%% and returns the count so far: the difference between the counts that a
%% caller sees at two of its calls is how many such calls to this peer
%% started in between, about how many callers are in such loops with this
%% peer (ecall_request:urgent/1); `off' when the `urgent' setting was
%% false as the transport opened. Both transports keep the counter made
%% by loops/0 and count with loop_starts/1 below.
-callback loop_starts(State :: term()) -> pos_integer() | off.

%% Queues a call of `M:F(A...)' whose caller waits for the reply under
%% `Ref' (its own make_ref()): `{ok, Id}', the reply then comes as `{Ref,
%% Reply}' (a failure of the path as `{Ref, {badrpc, Reason}}'), and
%% cancel/2 gives it up; `watched' when the transport, or the peer, does not
%% answer calls by id (the caller then monitors reply_watcher/1's process
%% and pushes `{call, Alias, ...}'); or as push/3.
-callback call(State :: term(), Ref :: reference(), M :: module(), F :: atom(), A :: [term()],
               Urgent :: boolean()) ->
    {ok, Id :: term()} | watched | push_result().

%% Gives up a call that call/6 queued: `true' if its reply will not reach
%% the caller, `false' if the reply was handed over already (it is in the
%% caller's mailbox, or about to be).
-callback cancel(State :: term(), Id :: term()) -> boolean().

%% Link `K' went down (`Why': `{link_down, Reason}'): the calls waiting on
%% it fail.
-callback link_down(State :: term(), K :: non_neg_integer(), Why :: term()) -> ok.

%% The process that stands for the path carrying the calling process's
%% requests: it exits when that path fails (with `{link_down, Reason}' or
%% the connection's reason). A caller monitors it, with an alias for the
%% reply, while it waits. `closed': no such path now.
-callback reply_watcher(State :: term()) -> {ok, pid()} | closed.

%% Counters, as `ecall:stats/1' returns them.
-callback stats(State :: term()) -> map().

%% Stops the transport; what it holds is dropped. Returns how many
%% requests that was. Callers waiting on replies see `Why'.
-callback close(State :: term(), Why :: term()) -> Dropped :: non_neg_integer().

%% @doc This node's protocol (see {@type protocol()}).
-spec protocol() -> protocol().
protocol() ->
    ?PROTOCOL.

%% @doc The request as it goes to a peer of protocol `Protocol': a call
%% from a caller in a closed loop is marked `urgent' when the peer knows
%% what that means (an older receiver would count it malformed and the
%% caller would wait out its timeout).
-spec wire(request(), boolean(), protocol()) -> request().
wire({call, From, Id, M, F, A}, true, _Protocol) when is_atom(From), is_integer(Id) ->
    {call, From, Id, M, F, A, urgent};
wire({call, Alias, M, F, A}, true, Protocol) when Protocol >= 1 ->
    {call, Alias, M, F, A, urgent};
wire(Request, _Urgent, _Protocol) ->
    Request.

%% @doc A counter of closed-loop calls for a transport that opens now, or
%% `off' when the `urgent' setting is false.
-spec loops() -> atomics:atomics_ref() | off.
loops() ->
    case ecall_config:get(urgent) of
        true -> atomics:new(1, []);
        false -> off
    end.

%% @doc Counts one closed-loop call on a counter of loops/0.
-spec loop_starts(atomics:atomics_ref() | off) -> pos_integer() | off.
loop_starts(off) ->
    off;
loop_starts(Loops) ->
    atomics:add_get(Loops, 1, 1).
