%% @private
%% What ecall:info/0,1 print, and ecall:info_lines/0,1 return: this node's identities and receiver pool,
%% each peer with its links and counters, and the peers whose connection
%% closed (their last stats). Plain text for a person at a shell; the
%% numbers themselves are ecall:stats/0,1 and ecall:last_stats/1.
-module(ecall_info).

-export([print/0, print/1, lines/0, lines/1]).

-spec print() -> ok.
print() ->
    io:put_chars(lines()).

-spec print(node()) -> ok | {error, not_connected | not_started}.
print(Node) ->
    case lines(Node) of
        {error, _} = E -> E;
        Lines -> io:put_chars(Lines)
    end.

%% The text, one string per line (each ends with a newline).
-spec lines() -> [string()].
lines() ->
    case ecall:stats() of
        {error, not_started} -> [not_started()];
        Stats -> collect(fun() -> node_lines(Stats) end)
    end.

%% `{error, not_connected}' when there is nothing to say about `Node'.
-spec lines(node()) -> [string()] | {error, not_connected | not_started}.
lines(Node) ->
    case ecall:stats(Node) of
        {ok, S} -> collect(fun() -> peer(Node, S) end);
        {error, not_started} = E -> E;
        {error, not_connected} = E ->
            case ecall:last_stats(Node) of
                {ok, S} -> collect(fun() -> closed(Node, S) end);
                _ -> E
            end
    end.

-spec not_started() -> string().
not_started() ->
    lists:flatten(io_lib:format("ecall is not started on ~p: application:ensure_all_started(ecall)~n",
                                [node()])).

%% Runs `Fun', which writes its lines with out/2, and returns them.
-spec collect(fun(() -> term())) -> [string()].
collect(Fun) ->
    Prev = put(?MODULE, []),
    try
        _ = Fun(),
        lists:reverse(get(?MODULE))
    after
        case Prev of
            undefined -> erase(?MODULE);
            _ -> put(?MODULE, Prev)
        end
    end.

-spec node_lines(map()) -> ok.
node_lines(#{peers := Peers, identities := Ids, receivers := Rx, closed_drops := CD}) ->
    out("ecall on ~p: ~p transport~n", [node(), ecall_conn:transport()]),
    case ecall_cnode:state() of
        {registering, Why} ->
            out("  C-node identities not registered (~0p); retrying~n", [Why]);
        _ ->
            ok
    end,
    _ = [out("  identity ~p: accepted ~b, refused ~b, handshakes shed ~b~n",
             [N, maps:get(accepted, I, 0), maps:get(refused, I, 0),
              maps:get(handshakes_shed, I, 0)])
         || #{node := N} = I <- Ids],
    out("  receivers: batches ~b, requests ~b, malformed ~b, dead letters ~b, "
        "spawn failed ~b~n",
        [maps:get(K, Rx) || K <- [batches, requests, malformed, dead_letters, spawn_failed]]),
    out("  dropped at closes (node-wide): ~b~n", [CD]),
    Opening = [N || #{node := N, published := false} <- ecall:connections()],
    _ = [out("peer ~p: connecting~n", [N]) || N <- Opening],
    _ = [peer(N, S) || {N, S} <- lists:sort(maps:to_list(Peers))],
    Closed = lists:sort(maps:to_list(maps:without(maps:keys(Peers), ecall_conn_sup:last_all()))),
    _ = [closed(N, S) || {N, S} <- Closed],
    case map_size(Peers) + length(Opening) + length(Closed) of
        0 -> out("no peers~n", []);
        _ -> ok
    end.

-spec peer(node(), map()) -> ok.
peer(Node, S) ->
    out("peer ~p: up, ~p transport, ~b of ~b links up~n",
        [Node, maps:get(transport, S, nif), maps:get(links_up, S, 0), maps:get(links, S, 0)]),
    counters(S),
    _ = [link_line(L) || L <- maps:get(per_link, S, [])],
    ok.

-spec closed(node(), map()) -> ok.
closed(Node, S) ->
    out("peer ~p: closed at ~ts (~0p), ~b queued requests dropped~n",
        [Node, calendar:system_time_to_rfc3339(maps:get(closed_at, S), [{unit, millisecond}]),
         maps:get(reason, S), maps:get(closed_drops, S, 0)]),
    counters(S).

-spec counters(map()) -> ok.
counters(S) ->
    G = fun(K) -> maps:get(K, S, 0) end,
    Avg = case G(batches) of
              0 -> 0.0;
              B -> G(requests) / B
          end,
    out("  batches ~b, requests ~b (~.1f per batch), bytes ~b, writes ~b~n",
        [G(batches), G(requests), Avg, G(bytes), G(writes)]),
    case S of
        #{transport := erlang} ->
            out("  queued ~b requests~n", [G(queued)]);
        _ ->
            out("  queued ~b bytes, pushed ~b, full ~b, overflow waits ~b, overflow drops ~b~n",
                [G(queued_bytes), G(pushed), G(full), G(overflow_waits), G(overflow_drops)]),
            out("  dropped ~b, unconfirmed ~b, stalls ~b, connects ~b, disconnects ~b~n",
                [G(dropped), G(unconfirmed), G(stalls), G(connects), G(disconnects)])
    end.

-spec link_line(map()) -> ok.
link_line(L) ->
    G = fun(K) -> maps:get(K, L, 0) end,
    Up = case G(up) of
             1 -> "up";
             _ -> "down"
         end,
    out("  link ~b: ~s, batches ~b, requests ~b, writes ~b, dropped ~b, unconfirmed ~b, "
        "stalls ~b, connects ~b, disconnects ~b~n",
        [G(link), Up, G(batches), G(requests), G(writes), G(dropped), G(unconfirmed),
         G(stalls), G(connects), G(disconnects)]).

-spec out(io:format(), [term()]) -> ok.
out(Format, Args) ->
    put(?MODULE, [lists:flatten(io_lib:format(Format, Args)) | get(?MODULE)]),
    ok.
