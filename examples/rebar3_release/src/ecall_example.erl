%% ecall in a release. Every node runs a registered echo process
%% (`ecall_example'); main/1, run on one node, sends, casts and calls to
%% another through ecall and fails if anything is lost:
%%
%%   bin/ecall_example eval 'ecall_example:main(b@myhost).'
-module(ecall_example).
-export([start_link/0, main/1]).

start_link() ->
    Pid = spawn_link(fun echo/0),
    true = register(?MODULE, Pid),
    {ok, Pid}.

echo() ->
    receive
        {From, Msg} when is_pid(From) -> From ! {echo, node(), Msg}
    end,
    echo().

main(Peer) ->
    %% Waits until every ecall link to Peer is up (it connects the nodes
    %% too). Without an ecall connection, ecall:send/2 is plain `!' and
    %% ecall:call/4 goes through erpc.
    ok = ecall:connect(Peer),
    Self = self(),

    %% ecall:send/2 instead of `!': returns the message, as `!' does.
    {Self, hello} = ecall:send({?MODULE, Peer}, {Self, hello}),
    receive {echo, Peer, hello} -> ok after 5000 -> error({no_echo, Peer}) end,
    io:format("send: ~p echoed hello~n", [Peer]),

    %% ecall:cast/4 instead of erpc:cast/4: Peer runs erlang:send(Self, ...).
    ok = ecall:cast(Peer, erlang, send, [Self, {cast_ran, Peer}]),
    receive {cast_ran, Peer} -> ok after 5000 -> error({cast_lost, Peer}) end,
    io:format("cast: ran on ~p~n", [Peer]),

    %% ecall:call/4 instead of erpc:call/4: {ok, Result} or {error, Why}.
    {ok, Peer} = ecall:call(Peer, erlang, node, []),
    {ok, 6} = ecall:call(Peer, lists, sum, [[1, 2, 3]]),
    {error, {exception, error, oops, _}} = ecall:call(Peer, erlang, error, [oops]),
    io:format("call: lists:sum([1, 2, 3]) on ~p gave 6~n", [Peer]),

    {ok, #{transport := Transport, requests := Requests, batches := Batches}} = ecall:stats(Peer),
    io:format("stats: transport ~p, ~p requests in ~p batches~n", [Transport, Requests, Batches]),
    {ok, Transport, Requests}.
