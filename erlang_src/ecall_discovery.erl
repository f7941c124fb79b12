%% @private
%% Automatic discovery: every node running ecall joins the group `nodes' of
%% the pg scope `ecall_pg' and connects to the nodes that show up in it.
%% Connecting happens in a short-lived process per node so that a slow peer
%% never holds up discovery. A peer that leaves needs nothing here: its
%% connection process sees `nodedown' on its own.
-module(ecall_discovery).
-behaviour(gen_server).

-export([start_link/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-include_lib("kernel/include/logger.hrl").

-define(SCOPE, ecall_pg).
-define(GROUP, nodes).

-spec start_link() -> {ok, pid()} | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

-spec init([]) -> {ok, map()}.
init([]) ->
    case ecall_config:get(discovery) andalso is_alive() of
        true ->
            ok = pg:join(?SCOPE, ?GROUP, self()),
            {Ref, Members} = pg:monitor(?SCOPE, ?GROUP),
            connect_all(Members),
            {ok, #{ref => Ref}};
        _ ->
            {ok, #{}}
    end.

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info({Ref, join, ?GROUP, Pids}, #{ref := Ref} = St) ->
    connect_all(Pids),
    {noreply, St};
handle_info({Ref, leave, ?GROUP, _Pids}, #{ref := Ref} = St) ->
    %% Their connection processes see `nodedown' on their own.
    {noreply, St};
handle_info(Info, St) ->
    {noreply, ecall_log:unexpected_in(?MODULE, {info, Info}, St)}.

-spec connect_all([pid()]) -> ok.
connect_all(Pids) ->
    Me = node(),
    _ = [spawn(fun() -> connect(Node) end) || Node <- lists:usort([node(P) || P <- Pids]),
                                              Node =/= Me],
    ok.

%% A connection closed on purpose while this waited for it (disconnect/1,
%% or a move to the other transport, which opens a new one) is no failure
%% to warn of.
-spec connect(node()) -> ok.
connect(Node) ->
    case ecall_conn:connect(Node) of
        ok ->
            ok;
        {error, Reason} when Reason =:= normal; Reason =:= transport_change ->
            ?LOG_INFO("ecall: discovery's connect to ~p ended: the connection was closed (~p) "
                      "before it was up", [Node, Reason]);
        {error, peer_stopping} ->
            %% Its ecall stops in order; it joins again when it starts.
            ok;
        {error, {version, _}} ->
            %% Said once, at notice, by the connection (ecall_route:plain/2).
            ok;
        {error, Reason} ->
            ?LOG_WARNING("ecall: cannot connect to ~p: ~p", [Node, Reason])
    end.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, {error, badarg}, map()}.
handle_call(Req, _From, St) ->
    {reply, {error, badarg}, ecall_log:unexpected_in(?MODULE, {call, Req}, St)}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(Msg, St) ->
    {noreply, ecall_log:unexpected_in(?MODULE, {cast, Msg}, St)}.
