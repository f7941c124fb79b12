%% @private
%% One receiver worker: replays each `{batch, Requests}' in order
%% (ecall_request:replay/2, where every kind of request is).
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
-module(ecall_receiver).

-export([start_link/1, init/2]).
-export([system_continue/3, system_terminate/4, system_get_state/1,
         system_replace_state/2, system_code_change/4]).

-include("ecall_receiver.hrl").

-record(state, {parent :: pid(), counters :: counters:counters_ref(), index :: pos_integer()}).

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
    proc_lib:init_ack(Parent, {ok, self()}),
    loop(#state{parent = Parent, counters = ecall_receiver_sup:counters(), index = I}).

-spec loop(#state{}) -> no_return().
loop(#state{counters = C, parent = Parent} = S) ->
    receive
        {batch, Requests} when is_list(Requests) ->
            counters:add(C, ?BATCHES, 1),
            ecall_request:replay(Requests, C),
            loop(S);
        {system, From, Request} ->
            sys:handle_system_msg(Request, From, Parent, ?MODULE, [], S);
        _Other ->
            counters:add(C, ?MALFORMED, 1),
            loop(S)
    end.

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
