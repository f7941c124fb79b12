%% @private
%% The transport behaviour: how requests reach one peer.
%%
%% A connection process (ecall_conn) opens a transport for its peer and
%% publishes it (ecall_route:publish/2); callers then go through the
%% callbacks without a process hop. Two modules implement it, and
%% ecall_conn:transport/0 chooses which from the settings:
%%
%% - `ecall_transport_nif': the caller encodes each request once in the
%%   Rust NIF and pushes it into its shard; C-node links write `{batch,
%%   Requests}' messages to the peer's receiver pool (byte budget,
%%   overflow policy, write deadlines).
%% - `ecall_proxy': the pure-Erlang transport, a pool of proxy processes
%%   that batch over plain distribution (no budget).
%%
%% Both deliver the same requests (ecall_request) to the same receiver
%% pool (ecall_receiver), in per-caller order.
%%
%% Results of push and call: `ok' (queued), `closed' (the transport is
%% gone: the caller uses native distribution instead), `overload' (the
%% byte budget is full and the `overflow' policy is `error' or `drop';
%% counted).
-module(ecall_transport).

-type push_result() :: ok | closed | overload.
%% What a connection publishes: the transport's module and state, and the
%% peer's count of closed-loop calls (ecall_rpc:urgent/1).
-type t() :: {module(), term(), ecall_rpc:loops()}.
-export_type([push_result/0, t/0]).

%% Opens the transport to `Node', whose receiver pool has the names given.
%% The calling process is the owner: it gets the transport's events (for
%% the NIF, `{ecall_link, K, up | {down, Reason} | {alive,
%% Node} | stopped}') and it is linked to whatever processes the transport
%% starts. `Links' is how many `up' events to wait for before publishing
%% (0: usable at once).
-callback open(Node :: node(), Receivers :: [binary()]) ->
    {ok, State :: term(), Links :: non_neg_integer()} | {error, term()}.

%% Queues one request (ecall_request), in the caller's order. `Urgent':
%% the caller waits for an answer before its next request (a call in a
%% closed loop, or a reply to one), so the transport should not hold it
%% back waiting for other requests to batch with it.
-callback push(State :: term(), ecall_request:request(), Urgent :: boolean()) ->
    push_result().

%% Queues a call of `M:F(A...)', `Urgent' as for push/3. `{ok, Id}': the
%% reply comes as `{Ref, Reply}' (`Ref', the caller's own make_ref()), a
%% failure of its path as `{Ref, {badrpc, Reason}}'; or, when `Id' is a
%% reference (the alias of a monitor the transport made for the caller),
%% as `{Id, Reply}', a failure as that monitor's `'DOWN''. Else as push/3.
-callback call(State :: term(), Ref :: reference(), M :: module(), F :: atom(), A :: [term()],
               Urgent :: boolean()) ->
    {ok, Id :: term()} | push_result().

%% Gives up a call that call/6 queued: `true' if no reply reaches the
%% caller's mailbox from now on (one that came already is there), `false'
%% if the reply was handed over and is on its way (the caller waits for
%% it).
-callback cancel(State :: term(), Id :: term()) -> boolean().

%% Counters, as `ecall:stats/1' returns them.
-callback stats(State :: term()) -> map().

%% Starts an orderly close: from now on push/3 and call/6 answer `closed',
%% and the transport writes out what it holds. The owner is told
%% `{ecall_link, K, stopped}' for each of its links once that link has
%% written everything and stopped (a transport without links has nothing
%% to wait for). close/2 follows, and drops only what was not written.
-callback drain(State :: term()) -> ok.

%% Stops the transport; what it holds is dropped. Returns how many
%% requests that was. Callers waiting on replies see `Why'.
-callback close(State :: term(), Why :: term()) -> Dropped :: non_neg_integer().
