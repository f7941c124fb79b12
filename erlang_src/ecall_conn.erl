%% @private
%% The connection to one peer: opens its shards and links in Rust, learns
%% of every link event by message, and publishes the peer for the send path
%% once every link is up.
%%
%% Lifecycle:
%% - init monitors the peer node and asks it for its receiver names over
%%   plain distribution (control plane only);
%% - the peer is published (persistent_term, so the send path reads it
%%   without a lock or a copy) when all links are up; `ecall:connect/1'
%%   returns then, or `{error, timeout}' after `connect_timeout';
%% - a link that goes down is logged and reconnects by itself in Rust; what
%%   its shards hold waits (within the byte budget) and goes out after;
%% - `nodedown', `ecall:disconnect/1' or a crash unpublishes the peer and
%%   closes it: queued requests are dropped and counted, blocked senders are
%%   released, and later sends use native distribution.
-module(ecall_conn).
-behaviour(gen_server).

-export([start_link/1, name/1, await/2, peer/1, watcher/2, info/1, stop/1, transport/0]).
-export([init/1, handle_continue/2, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-record(st, {
    node :: node(),
    peer :: ecall_nif:peer() | {erlang, ecall_proxy:pool()} | undefined,
    links = 0 :: non_neg_integer(),
    %% Link index -> its watcher, while the link is up.
    up = #{} :: #{non_neg_integer() => pid()},
    published = false :: boolean(),
    waiting = [] :: [gen_server:from()],
    down_logged = #{} :: #{non_neg_integer() => true}
}).

-spec name(node()) -> atom().
name(Node) ->
    list_to_atom("ecall_conn " ++ atom_to_list(Node)).

%% @doc The process that stands for link `K' to `Node' while it is up:
%% callers monitor it, and it exits with `{link_down, Reason}' when the link
%% goes down (or with the connection's reason when the connection ends).
-spec watcher(node(), non_neg_integer()) -> pid() | undefined.
watcher(Node, K) ->
    case ets:lookup(ecall_links, {Node, K}) of
        [{_, Pid}] -> Pid;
        [] -> undefined
    end.

%% @doc The transport new connections use: `nif' (the default), or
%% `erlang' when configured so or when the NIF did not load.
-spec transport() -> nif | erlang.
transport() ->
    case ecall_nif:load_error() of
        none -> ecall_config:get(transport);
        _ -> erlang
    end.

%% @doc The published peer of `Node', for the send path: a NIF peer, or
%% `{erlang, Pool}' for the pure-Erlang transport.
-spec peer(node()) -> ecall_nif:peer() | {erlang, ecall_proxy:pool()} | undefined.
peer(Node) ->
    persistent_term:get({ecall_peer, Node}, undefined).

-spec start_link(node()) -> {ok, pid()} | {error, term()}.
start_link(Node) ->
    gen_server:start_link({local, name(Node)}, ?MODULE, Node, []).

%% @doc Waits until every link is up.
-spec await(pid(), timeout()) -> ok | {error, term()}.
await(Pid, Timeout) ->
    try
        gen_server:call(Pid, await, Timeout)
    catch
        exit:{timeout, _} -> {error, timeout};
        exit:{Reason, _} -> {error, Reason}
    end.

-spec info(pid()) -> map().
info(Pid) ->
    gen_server:call(Pid, info).

-spec stop(pid()) -> ok.
stop(Pid) ->
    try gen_server:stop(Pid, normal, 5000)
    catch exit:_ -> ok
    end.

-spec init(node()) -> {ok, #st{}, {continue, open}}.
init(Node) ->
    process_flag(trap_exit, true),
    {ok, #st{node = Node}, {continue, open}}.

-spec handle_continue(open, #st{}) -> {noreply, #st{}} | {stop, term(), #st{}}.
handle_continue(open, #st{node = Node} = St) ->
    true = erlang:monitor_node(Node, true),
    Timeout = ecall_config:get(connect_timeout),
    erlang:send_after(Timeout, self(), connect_timeout),
    case open(transport(), Node, Timeout) of
        {ok, {erlang, _} = Peer, 0} ->
            %% No links to wait for: usable at once.
            {noreply, maybe_publish(St#st{peer = Peer, links = 0})};
        {ok, Peer, Links} ->
            {noreply, St#st{peer = Peer, links = Links}};
        {error, Reason} ->
            {stop, {shutdown, Reason}, St}
    end.

-spec open(nif | erlang, node(), timeout()) ->
          {ok, ecall_nif:peer() | {erlang, ecall_proxy:pool()}, non_neg_integer()}
          | {error, term()}.
open(Transport, Node, Timeout) ->
    case {Transport, ecall_cnode:cnode()} of
        {nif, {error, _} = E} ->
            E;
        {_, CNodeResult} ->
            try erpc:call(Node, ecall_receiver_sup, names, [], Timeout) of
                Receivers when Transport =:= erlang ->
                    {ok, {erlang, ecall_proxy:start_pool(Node, Receivers)}, 0};
                Receivers ->
                    {ok, CNode} = CNodeResult,
                    Cookie = atom_to_binary(erlang:get_cookie(Node)),
                    {ok, Peer} = ecall_nif:peer_open(CNode, atom_to_binary(Node), Cookie,
                                                     Receivers, self(), ecall_config:peer_opts()),
                    {ok, Peer, length(ecall_nif:cnode_info(CNode))}
            catch
                Class:Reason -> {error, {no_ecall_on_peer, {Class, Reason}}}
            end
    end.

-spec handle_call(term(), gen_server:from(), #st{}) -> {reply, term(), #st{}} | {noreply, #st{}}.
handle_call(await, _From, #st{published = true} = St) ->
    {reply, ok, St};
handle_call(await, From, #st{waiting = W} = St) ->
    {noreply, St#st{waiting = [From | W]}};
handle_call(info, _From, #st{node = Node, up = Up, links = L, published = P} = St) ->
    {reply, #{node => Node, links => L, links_up => map_size(Up), published => P}, St};
handle_call(_Req, _From, St) ->
    {reply, {error, badarg}, St}.

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(_Msg, St) ->
    {noreply, St}.

-spec handle_info(term(), #st{}) -> {noreply, #st{}} | {stop, term(), #st{}}.
handle_info({ecall_link, K, up}, #st{up = Up, down_logged = DL} = St0) ->
    case maps:is_key(K, DL) of
        true -> ?LOG_NOTICE("ecall: link ~b to ~p is back", [K + 1, St0#st.node]);
        false -> ok
    end,
    Watcher = spawn_link(fun watch/0),
    true = ets:insert(ecall_links, {{St0#st.node, K}, Watcher}),
    St = St0#st{up = Up#{K => Watcher}, down_logged = maps:remove(K, DL)},
    {noreply, maybe_publish(St)};
handle_info({ecall_link, K, {down, Reason}}, #st{up = Up, down_logged = DL} = St) ->
    %% Log the first failure of a streak, not every retry.
    case maps:is_key(K, DL) of
        false -> ?LOG_WARNING("ecall: link ~b to ~p down: ~ts", [K + 1, St#st.node, Reason]);
        true -> ok
    end,
    release(St#st.node, K, maps:get(K, Up, undefined), {link_down, Reason}),
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
handle_info(_Info, St) ->
    {noreply, St}.

-spec maybe_publish(#st{}) -> #st{}.
maybe_publish(#st{published = false, links = L, up = Up, node = Node, peer = Peer} = St)
  when map_size(Up) =:= L ->
    %% persistent_term:put/2 of a new key costs no global GC; only erase
    %% and overwrite do, and those happen once per connection lifetime.
    persistent_term:put({ecall_peer, Node}, Peer),
    ?LOG_INFO("ecall: connected to ~p over ~b links (~p transport)", [Node, L, transport()]),
    [gen_server:reply(From, ok) || From <- St#st.waiting],
    St#st{published = true, waiting = []};
maybe_publish(St) ->
    St.

%% Callers waiting on link K's calls see its watcher exit with `Why'.
-spec release(node(), non_neg_integer(), pid() | undefined, term()) -> ok.
release(_Node, _K, undefined, _Why) ->
    ok;
release(Node, K, Watcher, Why) ->
    true = ets:delete_object(ecall_links, {{Node, K}, Watcher}),
    Watcher ! {down, Why},
    ok.

-spec watch() -> no_return().
watch() ->
    receive {down, Why} -> exit(Why) end.

-spec terminate(term(), #st{}) -> ok.
terminate(Reason, #st{node = Node, peer = Peer, published = P, waiting = W, up = Up}) ->
    [gen_server:reply(From, {error, reason(Reason)}) || From <- W],
    _ = [release(Node, K, Watcher, reason(Reason)) || {K, Watcher} <- maps:to_list(Up)],
    P andalso persistent_term:erase({ecall_peer, Node}),
    close(Peer, reason(Reason)),
    ok.

-spec close(ecall_nif:peer() | {erlang, ecall_proxy:pool()} | undefined, term()) -> ok.
close(undefined, _Why) ->
    ok;
close({erlang, Pool}, Why) ->
    %% Callers waiting on calls monitor the proxies: they see this reason.
    ecall_proxy:stop(Pool, Why);
close(Peer, _Why) ->
    ecall_nif:peer_close(Peer).

-spec reason(term()) -> term().
reason({shutdown, R}) -> R;
reason(R) -> R.
