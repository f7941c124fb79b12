%% @private
%% The connection to one peer: opens its shards and links in Rust, learns
%% of every link event by message, and publishes the peer for the send path
%% once every link is up.
%%
%% Lifecycle:
%% - init monitors the peer node and asks it for its receiver names over
%%   plain distribution (control plane only, hello/2), which it gives when
%%   both nodes speak the same version of the requests (ecall_request);
%% - the peer is published (ecall_route:publish/2) when all links are up;
%%   connect/1 returns then, or `{error, timeout}' after `connect_timeout';
%% - a link that goes down is logged and reconnects by itself in Rust; what
%%   its shards hold waits (within the byte budget) and goes out after;
%% - `nodedown', `ecall:disconnect/1', the exit of a process the transport
%%   linked to this one (a proxy of the pure-Erlang transport) or a crash
%%   unpublishes the peer and closes it: queued requests are dropped and
%%   counted, blocked senders are released, and later sends use native
%%   distribution.
%%
%% Links are numbered from 1 in logs, as the C-node identities are named
%% (`<node>_ecall_1'); the messages from Rust carry 0-based indexes.
-module(ecall_conn).
-behaviour(gen_server).

-export([connect/1, move_to_nif/0, hello/2, stopping/0, peer_stopping/1, started/0]).
-export([start_link/2, name/1, await/1, info/1, stop/1, stop/2, transport/0, close_timeout/0]).
-export([init/1, handle_continue/2, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

%% Who waits for the connection to come up: the caller of connect/1 that
%% started the process, waiting from its start (open/2, answered by
%% message to its tag), or a caller of await/1 (a gen_server call).
-type first_waiter() :: {first, pid(), reference()}.
-type waiter() :: first_waiter() | gen_server:from().
-export_type([first_waiter/0]).

%% How long closing a connection lets the transport write out what it
%% holds (write_out/3), then how long it waits for the peer to replay what
%% was written (drain/4). Together, with the fence's margin, below
%% ?CLOSE_TIMEOUT.
-define(WRITE_OUT_TIMEOUT, 2000).
-define(DRAIN_TIMEOUT, 3000).
%% How long stop/2 waits for the close, and ecall_conn_sup's shutdown of a
%% connection.
-define(CLOSE_TIMEOUT, 8000).
%% How long a stopping node waits for its peers to close their connections
%% to it (stopping/0), with a margin.
-define(STOP_TIMEOUT, 9000).
%% Set while this node's ecall stops (stopping/0).
-define(STOPPING, {ecall, stopping}).

-record(st, {
    node :: node(),
    transport :: nif | erlang,
    %% erlang:monotonic_time/0 when this process started, and when the
    %% peer was published (telemetry durations).
    started :: integer(),
    up_at :: integer() | undefined,
    %% The transport, as published once every link is up.
    peer :: ecall_transport:t() | undefined,
    links = 0 :: non_neg_integer(),
    %% The links that are up.
    up = #{} :: #{non_neg_integer() => true},
    published = false :: boolean(),
    waiting = [] :: [waiter()],
    down_logged = #{} :: #{non_neg_integer() => true},
    %% Messages nobody expects: the first is logged, all are counted.
    unexpected = 0 :: non_neg_integer()
}).

-spec name(node()) -> atom().
name(Node) ->
    list_to_atom("ecall_conn " ++ atom_to_list(Node)).

%% @doc The transport new connections use: `nif' (the default), or
%% `erlang' when configured so, when the NIF did not load, or when the
%% C-node identities could not start (no port to listen on, or a
%% distribution carrier other than plain TCP, such as TLS).
-spec transport() -> nif | erlang.
transport() ->
    case ecall_nif:load_error() =:= none andalso ecall_cnode:usable() of
        true -> ecall_config:get(transport);
        false -> erlang
    end.

%% How many connection processes one connect/1 may find there already and
%% see end under it (see join/3) before it gives up with their reason.
-define(CONNECT_TRIES, 3).

%% @doc See ecall:connect/1 (the application is started, `Node' is an
%% atom).
-spec connect(node()) -> ok | {error, term()}.
connect(Node) when Node =:= node() ->
    {error, local_node};
connect(Node) ->
    case usable() of
        ok -> open(Node, ?CONNECT_TRIES);
        {error, _} = E -> E
    end.

%% The connection process answers every waiter within `connect_timeout'
%% (it stops then, and its terminate answers `{error, timeout}'), so no
%% second timer here.
%% The caller is the new process's first waiter from its start: a
%% connection that fails at once (a peer not there, or of another version)
%% answers it before it ends, where a call made after the start could find
%% it gone already (`noproc', not the reason).
-spec open(node(), pos_integer()) -> ok | {error, term()}.
open(Node, Tries) ->
    Tag = make_ref(),
    case ecall_conn_sup:start_conn(Node, {first, self(), Tag}) of
        {ok, Pid} -> answer(Pid, Tag);
        {error, {already_started, Pid}} -> join(Node, Pid, Tries);
        {error, Reason} -> {error, Reason}
    end.

%% The answer of connection `Pid' to its first waiter (`Tag'), or the
%% reason it ended without one. It answers before it ends, so an answer
%% is in the mailbox before the `'DOWN''.
-spec answer(pid(), reference()) -> ok | {error, term()}.
answer(Pid, Tag) ->
    Mon = monitor(process, Pid),
    receive
        {Tag, Reply} ->
            demonitor(Mon, [flush]),
            Reply;
        {'DOWN', Mon, process, Pid, Why} ->
            receive {Tag, Reply} -> Reply
            after 0 -> {error, reason(Why)}
            end
    end.

%% The connection process to `Node' that is there already: its outcome,
%% unless it ends under us for a reason that says nothing of a new one.
%% - Closing: it stays registered until the peer has replayed what its
%%   links delivered (a drain that reconnects the two nodes if a nodedown
%%   closed it, and so brings discovery's connect here). A new one once it
%%   has gone.
%% - Gone by the time it is asked (`noproc': closing, not yet published as
%%   such), or ended by a nodedown it had not yet read when we asked: the
%%   two nodes may be connected again (discovery connects when the peer
%%   joins again, which comes after the nodeup), so a new one too. If the
%%   node is down, the new one fails at once (`nodedown', `noconnection').
%% Bounded: `Tries' such ends, then their reason.
-spec join(node(), pid(), pos_integer()) -> ok | {error, term()}.
join(Node, Pid, Tries) ->
    case ecall_route:route(Node) of
        {closing, Pid} ->
            ok = ecall_route:await_close(Node),
            again(Node, Tries, closing);
        _ ->
            case await(Pid) of
                {error, Gone} when Gone =:= noproc; Gone =:= nodedown ->
                    again(Node, Tries, Gone);
                Outcome ->
                    Outcome
            end
    end.

-spec again(node(), pos_integer(), atom()) -> ok | {error, term()}.
again(_Node, 1, Why) -> {error, Why};
again(Node, Tries, _Why) -> open(Node, Tries - 1).

%% Whether this node can open connections with the transport it would use.
-spec usable() -> ok | {error, term()}.
usable() ->
    case {transport(), is_alive()} of
        {_, false} -> {error, not_distributed};
        {erlang, true} -> ok;
        {nif, true} ->
            case ecall_cnode:cnode() of
                {ok, _} -> ok;
                {error, _} = E -> E
            end
    end.

%% @doc Every connection on the pure-Erlang transport reopens on the NIF
%% (when that is the configured transport), each in a process of its own
%% so that a slow peer holds up no other. Called by ecall_cnode when its
%% identities register after they had failed to; no request is dropped
%% (ecall_proxy:close/2 with `transport_change'), and per-caller order
%% holds across the switch as across any close (terminate/2).
-spec move_to_nif() -> ok.
move_to_nif() ->
    case transport() of
        nif -> _ = [spawn(fun() -> move(Pid) end) || Pid <- ecall_conn_sup:conns()], ok;
        erlang -> ok
    end.

-spec move(pid()) -> ok.
move(Pid) ->
    case catch info(Pid) of
        #{node := Node, transport := erlang} ->
            ok = stop(Pid, transport_change),
            case connect(Node) of
                ok -> ok;
                {error, Why} -> ?LOG_WARNING("ecall: cannot connect to ~p on the NIF "
                                             "transport: ~p", [Node, Why])
            end;
        _ ->
            ok
    end.

%% @doc What a peer opening a connection to this node needs (called over
%% plain distribution by ecall_conn on node `From'): the version of the
%% requests this node speaks and, when `From' speaks it too, the names of
%% its receiver pool. A peer of another version gets no names, so its
%% links have nowhere to write; it is said once, at notice. This function
%% and the `version' key of its answer stay as they are in every release,
%% so that any two releases can tell each other apart.
%% While this node's ecall stops (stopping/0) it gives no names either,
%% and says `stopping'.
-spec hello(node(), pos_integer()) ->
          #{version := pos_integer(), receivers => [binary()], stopping => true}.
hello(From, Version) ->
    case ecall_request:version() of
        Version ->
            case persistent_term:get(?STOPPING, false) of
                true -> #{version => Version, stopping => true};
                false -> #{version => Version, receivers => ecall_receiver_sup:names()}
            end;
        Mine ->
            ecall_route:plain(From, {version, Version, Mine}),
            #{version => Mine}
    end.

%% @doc This node's ecall is stopping in order (ecall_app:prep_stop/1,
%% for `application:stop(ecall)', `init:stop/0' or a release restart):
%% every connected node is told (peer_stopping/1 there), and each closes
%% its connection to this node after writing out what it holds, and after
%% this node's receivers have replayed it. Returns when they all have, or
%% after ?STOP_TIMEOUT. New connections to this node are refused
%% meanwhile (hello/2), until ecall starts again (started/0).
-spec stopping() -> ok.
stopping() ->
    persistent_term:put(?STOPPING, true),
    _ = erpc:multicall(nodes(), ?MODULE, peer_stopping, [node()], ?STOP_TIMEOUT),
    ok.

%% @doc ecall starts on this node: connections to it are taken again
%% (see stopping/0).
-spec started() -> ok.
started() ->
    _ = persistent_term:erase(?STOPPING),
    ok.

%% @doc `Node''s ecall is stopping in order (called over plain distribution
%% by stopping/0 there): the connection to it, if any, closes after
%% writing out what it holds, and returns once `Node''s receivers have
%% replayed it. Sends after that go by `!' (after the close: per-caller
%% order), as to a node without ecall.
-spec peer_stopping(node()) -> ok.
peer_stopping(Node) ->
    case whereis(name(Node)) of
        undefined -> ok;
        Pid -> stop(Pid, peer_stopping)
    end.

%% `Waiter' waits for the connection from the start, as if it had called
%% await/1 (see open/2).
-spec start_link(node(), first_waiter()) -> {ok, pid()} | {error, term()}.
start_link(Node, Waiter) ->
    gen_server:start_link({local, name(Node)}, ?MODULE, {Node, Waiter}, []).

%% @doc Waits until every link is up. No timeout here: the connection
%% process answers every waiter within `connect_timeout' (it stops then,
%% and terminate/2 answers `{error, timeout}'); if it dies, the call's
%% monitor answers.
-spec await(pid()) -> ok | {error, term()}.
await(Pid) ->
    try
        gen_server:call(Pid, await, infinity)
    catch
        exit:{Reason, _} -> {error, reason(Reason)}
    end.

-spec info(pid()) -> map().
info(Pid) ->
    gen_server:call(Pid, info).

-spec stop(pid()) -> ok.
stop(Pid) ->
    stop(Pid, normal).

%% @doc Closes the connection with `Why' (see terminate/2): the transport
%% writes out what it holds first (write_out/3). With `transport_change'
%% the caller reopens the connection on the other transport; with
%% `peer_stopping' the peer's ecall is stopping (peer_stopping/1).
-spec stop(pid(), normal | transport_change | peer_stopping) -> ok.
stop(Pid, Why) ->
    Reason = case Why of
                 normal -> normal;
                 _ -> {shutdown, Why}
             end,
    try gen_server:stop(Pid, Reason, ?CLOSE_TIMEOUT)
    catch exit:_ -> ok
    end.

-spec init({node(), first_waiter()}) -> {ok, #st{}, {continue, open}}.
init({Node, Waiter}) ->
    process_flag(trap_exit, true),
    {ok, #st{node = Node, transport = transport(), started = erlang:monotonic_time(),
             waiting = [Waiter]},
     {continue, open}}.

-spec handle_continue(open, #st{}) -> {noreply, #st{}} | {stop, term(), #st{}}.
handle_continue(open, #st{node = Node, transport = Transport} = St) ->
    true = erlang:monitor_node(Node, true),
    Timeout = ecall_config:get(connect_timeout),
    erlang:send_after(Timeout, self(), connect_timeout),
    case open(Transport, Node, Timeout) of
        {ok, Peer, Links} ->
            %% The pure-Erlang transport has no links to wait for: it is
            %% usable at once.
            {noreply, maybe_publish(St#st{peer = Peer, links = Links})};
        {error, Reason} ->
            {stop, {shutdown, Reason}, St}
    end.

%% The transport of each setting (transport/0): the one place it is
%% chosen.
-spec open(nif | erlang, node(), timeout()) -> {ok, ecall_transport:t(), non_neg_integer()}
                                             | {error, term()}.
open(Transport, Node, Timeout) ->
    Mod = case Transport of
              nif -> ecall_transport_nif;
              erlang -> ecall_proxy
          end,
    %% The peer's receiver names, over plain distribution (control plane).
    Mine = ecall_request:version(),
    try erpc:call(Node, ?MODULE, hello, [node(), Mine], Timeout) of
        #{version := Mine, receivers := Receivers} ->
            case Mod:open(Node, Receivers) of
                {ok, State, Links} -> {ok, {Mod, State, ecall_rpc:loops()}, Links};
                {error, _} = E -> E
            end;
        #{version := Mine, stopping := true} ->
            {error, peer_stopping};
        #{version := Theirs} ->
            ecall_route:plain(Node, {version, Theirs, Mine}),
            {error, {version, Theirs}}
    catch
        error:{erpc, noconnection} -> {error, noconnection};
        %% The peer did not answer within connect_timeout (hung, or
        %% stopped): a timeout, not a peer without ecall.
        error:{erpc, timeout} -> {error, timeout};
        error:{erpc, Reason} -> {error, Reason};
        Class:Reason ->
            %% The peer answered, but its ecall did not: the code is not
            %% there (undef) or the application is not started.
            ?LOG_WARNING("ecall: ecall is not running on ~p (~p): start the ecall "
                         "application there; until then traffic to it goes by plain "
                         "distribution", [Node, not_running_why(Class, Reason)]),
            {error, {ecall_not_running, Node}}
    end.

%% A short reason for the log line, not the whole remote stack trace.
-spec not_running_why(atom(), term()) -> term().
not_running_why(error, {exception, undef, [{M, F, A, _} | _]}) ->
    {undef, {M, F, length_or(A)}};
not_running_why(error, {exception, Reason, _Stack}) -> Reason;
not_running_why(error, {erpc, Reason}) -> Reason;
not_running_why(_Class, Reason) -> Reason.

-spec length_or(list() | arity()) -> arity().
length_or(A) when is_list(A) -> length(A);
length_or(A) -> A.

-spec handle_call(term(), gen_server:from(), #st{}) -> {reply, term(), #st{}} | {noreply, #st{}}.
handle_call(await, _From, #st{published = true} = St) ->
    {reply, ok, St};
handle_call(await, From, #st{waiting = W} = St) ->
    {noreply, St#st{waiting = [From | W]}};
handle_call(info, _From, #st{node = Node, up = Up, links = L, published = P,
                              unexpected = U, transport = T} = St) ->
    {reply, #{node => Node, transport => T, links => L, links_up => map_size(Up),
              published => P, unexpected_messages => U}, St};
handle_call(Req, _From, St) ->
    {reply, {error, badarg}, unexpected({call, Req}, St)}.

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(Msg, St) ->
    {noreply, unexpected({cast, Msg}, St)}.

-spec handle_info(term(), #st{}) -> {noreply, #st{}} | {stop, term(), #st{}}.
handle_info({ecall_link, K, up}, #st{up = Up, down_logged = DL} = St0) ->
    ecall_event:execute([ecall, link, up], #{}, #{peer => St0#st.node, link => K + 1}),
    case maps:is_key(K, DL) of
        true -> ?LOG_NOTICE("ecall: link ~b to ~p is back", [K + 1, St0#st.node]);
        false -> ok
    end,
    St = St0#st{up = Up#{K => true}, down_logged = maps:remove(K, DL)},
    {noreply, maybe_publish(St)};
handle_info({ecall_link, K, {down, Reason}}, #st{up = Up, down_logged = DL} = St) ->
    %% Telemetry hears of every failure (`retry': a reconnect attempt
    %% failed), the log of the first of a streak only. Nothing is lost
    %% with the connection: what the link wrote and the peer did not
    %% acknowledge goes again on the next one, and calls waiting on it go
    %% on waiting.
    Meta = #{peer => St#st.node, link => K + 1, reason => Reason, retry => maps:is_key(K, DL)},
    ecall_event:execute([ecall, link, down], #{}, Meta),
    _ = Reason =:= stalled andalso ecall_event:execute([ecall, link, reap], #{}, Meta),
    case maps:is_key(K, DL) of
        false -> log_down(K, St#st.node, Reason);
        true -> ok
    end,
    {noreply, St#st{up = maps:remove(K, Up), down_logged = DL#{K => true}}};
handle_info({ecall_link, _K, {alive, OurNode}}, #st{node = Node} = St) ->
    %% The peer still holds our previous connection under that name (it has
    %% not noticed that it died). Ask it to drop it, over plain
    %% distribution; the link retries after its backoff.
    erpc:cast(Node, erlang, disconnect_node, [binary_to_atom(OurNode)]),
    {noreply, St};
handle_info(connect_timeout, #st{published = false} = St) ->
    {stop, {shutdown, timeout}, St};
handle_info(connect_timeout, St) ->
    {noreply, St};
handle_info({nodedown, Node}, #st{node = Node} = St) ->
    {stop, {shutdown, nodedown}, St};
handle_info({'EXIT', Pid, Reason}, St) ->
    %% A process of the transport (a proxy): sends would go on to a dead
    %% process and be lost. Close, so that they use `!' instead.
    ?LOG_WARNING("ecall: transport process ~p to ~p exited: ~p", [Pid, St#st.node, Reason]),
    {stop, {shutdown, {transport_down, Reason}}, St};
handle_info(Info, St) ->
    {noreply, unexpected({info, Info}, St)}.

%% The one line of a link going down. The peer closing the connection
%% (its node stopping, or a receiver there resuming the stream) is a
%% notice; anything else a warning. Either way nothing is lost: the link
%% writes again, on its next connection, what the peer did not
%% acknowledge.
-spec log_down(non_neg_integer(), node(), term()) -> ok.
log_down(K, Node, peer_closed) ->
    ?LOG_NOTICE("ecall: link ~b to ~p down: peer_closed", [K + 1, Node]);
log_down(K, Node, Reason) ->
    ?LOG_WARNING("ecall: link ~b to ~p down: ~p", [K + 1, Node, Reason]).

-spec unexpected(term(), #st{}) -> #st{}.
unexpected(What, #st{unexpected = N, node = Node} = St) ->
    St#st{unexpected = ecall_log:unexpected({?MODULE, Node}, What, N)}.

-spec maybe_publish(#st{}) -> #st{}.
maybe_publish(#st{published = false, links = L, up = Up, node = Node, peer = Peer,
                   transport = T} = St)
  when map_size(Up) =:= L ->
    ok = ecall_route:publish(Node, Peer),
    ?LOG_NOTICE("ecall: connected to ~p over ~b links (~p transport)", [Node, L, T]),
    Now = erlang:monotonic_time(),
    ecall_event:execute([ecall, connection, up],
                            #{duration => Now - St#st.started, links => L},
                            #{peer => Node, transport => T}),
    [reply(From, ok) || From <- St#st.waiting],
    St#st{published = true, waiting = [], up_at = Now};
maybe_publish(St) ->
    St.

-spec reply(waiter(), ok | {error, term()}) -> ok.
reply({first, Pid, Tag}, Reply) ->
    Pid ! {Tag, Reply},
    ok;
reply(From, Reply) ->
    gen_server:reply(From, Reply).

-spec terminate(term(), #st{}) -> ok.
terminate(Reason, #st{node = Node, peer = Peer, published = P, waiting = W,
                      links = L} = St) ->
    Why = reason(Reason),
    T0 = erlang:monotonic_time(),
    [reply(From, {error, Why}) || From <- W],
    %% `down' pairs with `up'; a connection that never came up `failed'.
    Meta = #{peer => Node, transport => St#st.transport, reason => Why},
    case P of
        true -> ecall_event:execute([ecall, connection, down],
                                        #{duration => T0 - St#st.up_at}, Meta);
        false -> ecall_event:execute([ecall, connection, failed],
                                         #{duration => T0 - St#st.started}, Meta)
    end,
    %% While it closes, the peer is published as closing: a send by `!'
    %% waits for this process to exit first (ecall_route:native/3), so that it
    %% cannot overtake what the transport wrote. Replacing and erasing a
    %% persistent term costs a scan of the processes; once per close.
    _ = P andalso ecall_route:closing(Node, self()),
    %% What the transport holds goes out first, unless the node is gone.
    Stopped = case P andalso drains(Why) of
                  true -> write_out(Peer, L, erlang:monotonic_time(millisecond) + ?WRITE_OUT_TIMEOUT);
                  false -> []
              end,
    Dropped = close(Peer, Why),
    Deadline = erlang:monotonic_time(millisecond) + ?DRAIN_TIMEOUT,
    _ = P andalso drain(Node, lists:seq(0, L - 1) -- Stopped, L > 0, Deadline),
    %% Counted after the drain: a link's last pass (a message it finishes
    %% in fragments) may still lose requests after the close.
    Drops = closed(Node, Peer, Why, Dropped, {St#st.transport, L}),
    _ = P andalso ecall_route:unpublish(Node),
    case Drops of
        none ->
            ok;
        {Queued, Lost, Unconfirmed} ->
            %% After the drain: `duration' is how long sends by `!' to
            %% this node waited for the close (ecall_route:native/3).
            ecall_event:execute([ecall, connection, close],
                                    #{closed_drops => Queued, dropped => Lost,
                                      unconfirmed => Unconfirmed,
                                      duration => erlang:monotonic_time() - T0},
                                    Meta)
    end.

%% Whether a close writes out what the transport holds before it stops
%% (ecall_transport:drain/1): always, unless the node is down (nothing can
%% reach it) or the transport broke.
%% @doc How long a connection may take to close (stop/2, and
%% ecall_conn_sup's shutdown of it).
-spec close_timeout() -> pos_integer().
close_timeout() ->
    ?CLOSE_TIMEOUT.

-spec drains(term()) -> boolean().
drains(nodedown) -> false;
drains({transport_down, _}) -> false;
drains(_) -> true.

%% Has the transport write out what it holds (ecall_transport:drain/1):
%% the links (0-based) that have written everything and stopped by
%% `Deadline'. What the others still hold, close/2 drops and counts.
-spec write_out(ecall_transport:t(), non_neg_integer(), integer()) -> [non_neg_integer()].
write_out({Mod, State, _Loops}, Links, Deadline) ->
    ok = Mod:drain(State),
    [K || K <- lists:seq(0, Links - 1), stopped(K, Deadline)].

-spec stopped(non_neg_integer(), integer()) -> boolean().
stopped(K, Deadline) ->
    receive {ecall_link, K, stopped} -> true
    after max(0, Deadline - erlang:monotonic_time(millisecond)) -> false
    end.

%% After the close: waits until every link (of `Links', those not known
%% to have stopped) has stopped writing (its last pass done, its socket
%% shut down), then until the peer has replayed what came before: it
%% waits for the links' connections to end there (a node's messages are
%% delivered before its nodedown) and for each receiver worker to answer
%% a system message (behind every batch in its mailbox). Bounded by
%% `Deadline': a peer that does not answer in time, or is gone, has no
%% order to keep.
-spec drain(node(), [non_neg_integer()], boolean(), integer()) -> ok.
drain(Node, Links, HasLinks, Deadline) ->
    _ = [stopped(K, Deadline) || K <- Links],
    Left = max(1, Deadline - erlang:monotonic_time(millisecond)),
    %% The C-node connections to wait for on the peer: this node's
    %% identities, when the transport had links (the pure-Erlang one has
    %% none: its batches came on the native connection, before the fence).
    Ids = case HasLinks of
              false -> [];
              true -> ecall_cnode:nodes()
          end,
    _ = (catch erpc:call(Node, ecall_receiver_sup, fence, [Ids, Left], Left + 500)),
    ok.

%% Closes the transport: what it dropped, counted.
-spec close(ecall_transport:t() | undefined, term()) -> non_neg_integer() | none.
close(undefined, _Why) ->
    none;
close({Mod, State, _Loops}, Why) ->
    Mod:close(State, Why).

%% What a close dropped is logged (one line, always: a close is rare) and
%% added to the node's count (`closed_drops' in ecall:stats/0), and the
%% peer's last stats are kept (ecall:last_stats/1): its live counters go
%% with it. Returns what was queued at the close, what the links lost (a
%% message sent straight to its target whose write failed), and what was
%% written and not acknowledged (the peer may or may not have processed
%% it), or `none' without a transport.
-spec closed(node(), ecall_transport:t() | undefined, term(), non_neg_integer() | none,
             {nif | erlang, non_neg_integer()}) ->
          {non_neg_integer(), non_neg_integer(), non_neg_integer()} | none.
closed(_Node, undefined, _Why, _Dropped, _Path) ->
    none;
closed(Node, {Mod, State, _Loops}, Why, Dropped, {Transport, Links}) ->
    Stats = Mod:stats(State),
    %% The NIF transport counts what the close found queued apart from
    %% what its links lost; the proxies lose nothing on the way.
    {Queued, Lost, Unconfirmed} = case Stats of
                                      #{closed_drops := C, dropped := D, unconfirmed := U} ->
                                          {C, D, U};
                                      _ ->
                                          {Dropped, 0, 0}
                                  end,
    ecall_conn_sup:add_closed_drops(Queued + Lost),
    ok = ecall_conn_sup:keep_last(Node, Stats#{state => closed, reason => Why,
                                               closed_drops => Queued,
                                               closed_at => erlang:system_time(millisecond)}),
    %% Shown by OTP's default logger configuration, as the connection's up
    %% line is: which transport a peer's traffic takes is visible.
    ?LOG_NOTICE("ecall: connection to ~p closed (~0p; ~p transport, ~b links): ~b queued "
                "requests dropped, ~b lost on its links, ~b written and not acknowledged "
                "(ecall:last_stats(~p))",
                [Node, Why, Transport, Links, Queued, Lost, Unconfirmed, Node]),
    {Queued, Lost, Unconfirmed}.

-spec reason(term()) -> term().
reason({shutdown, R}) -> R;
reason(R) -> R.
