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

%% One element of a `{batch, Requests}' message.
-type request() :: {send, Dest :: pid() | reference() | atom(), Msg :: term()}
                 | {cast, module(), atom(), [term()]}
                 | {call, Alias :: reference(), module(), atom(), [term()]}.
%% What a linked call's reply carries back to `Alias', as `{Alias, Reply}'.
-type reply() :: {value, term()} | {exception, term()} | {badrpc, term()}.
-type push_result() :: ok | closed | overload.
-type t() :: {module(), term()}.
-export_type([request/0, reply/0, push_result/0, t/0]).

%% Opens the transport to `Node', whose receiver pool has the names given.
%% The calling process is the owner: it gets the transport's events (for
%% the NIF, `{ecall_link, K, up | {down, Reason} | {alive, Node}}') and
%% it is linked to whatever processes the transport starts. `Links' is how
%% many `up' events to wait for before publishing (0: usable at once).
-callback open(Node :: node(), Receivers :: [binary()]) ->
    {ok, State :: term(), Links :: non_neg_integer()} | {error, term()}.

%% `Dest ! Msg' on the peer, in the caller's order.
-callback send(State :: term(), Dest :: pid() | reference() | atom(), Msg :: term()) ->
    push_result().

%% Queues one request, in the caller's order.
-callback push(State :: term(), request()) -> push_result().

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
