%% @private
%% What ecall:info/0,1 print, and ecall:info_lines/0,1 return: this
%% node's identities and receiver pool, each peer with its links and
%% counters, and the peers whose connection closed (their last stats). Plain text for a person at a shell; the
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
    case started() of
        false ->
            [line("ecall is not started on ~p: application:ensure_all_started(ecall)", [node()])];
        true ->
            node_lines(ecall_stats:node())
    end.

%% `{error, not_connected}' when there is nothing to say about `Node'.
-spec lines(node()) -> [string()] | {error, not_connected | not_started}.
lines(Node) ->
    case started() andalso ecall_stats:peer(Node) of
        false -> {error, not_started};
        {ok, S} -> peer(Node, S);
        {error, not_connected} = E ->
            case ecall_stats:last(Node) of
                {ok, S} -> closed(Node, S);
                _ -> E
            end
    end.

%% Whether the application runs here (its top supervisor is up).
-spec started() -> boolean().
started() ->
    whereis(ecall_sup) =/= undefined.

-spec node_lines(map()) -> [string()].
node_lines(#{peers := Peers, identities := Ids, receivers := Rx, closed_drops := CD}) ->
    Opening = [N || #{node := N, published := false} <- ecall_conn_sup:infos()],
    Closed = lists:sort(maps:to_list(maps:without(maps:keys(Peers), ecall_conn_sup:last_all()))),
    lists:append(
      [[line("ecall on ~p: ~p transport", [node(), ecall_conn:transport()])],
       case ecall_cnode:state() of
           {registering, Why} -> [line("  C-node identities not registered (~0p); retrying", [Why])];
           _ -> []
       end,
       [line("  identity ~p: accepted ~b, refused ~b, timed out ~b, "
             "shed idle ~b, shed stalled ~b",
             [N | [maps:get(K, I, 0) || K <- [accepted, refused, handshakes_timed_out,
                                              handshakes_shed_idle,
                                              handshakes_shed_stalled]]])
        || #{node := N} = I <- Ids],
       [line("  receivers: batches ~b, requests ~b, malformed ~b, dead letters ~b, "
             "spawn failed ~b, late replies ~b",
             [maps:get(K, Rx) || K <- [batches, requests, malformed, dead_letters, spawn_failed,
                                       late_replies]]),
        line("  dropped at closes (node-wide): ~b", [CD])],
       [line("peer ~p: connecting", [N]) || N <- Opening],
       lists:append([peer(N, S) || {N, S} <- lists:sort(maps:to_list(Peers))]),
       lists:append([closed(N, S) || {N, S} <- Closed]),
       [line("no peers", []) || map_size(Peers) + length(Opening) + length(Closed) =:= 0]]).

-spec peer(node(), map()) -> [string()].
peer(Node, S) ->
    [line("peer ~p: up, ~p transport, ~b of ~b links up",
          [Node, maps:get(transport, S, nif), maps:get(links_up, S, 0), maps:get(links, S, 0)])
     | counters(S)] ++ [link_line(L) || L <- maps:get(per_link, S, [])].

-spec closed(node(), map()) -> [string()].
closed(Node, S) ->
    [line("peer ~p: closed at ~ts (~0p), ~b queued requests dropped",
          [Node, calendar:system_time_to_rfc3339(maps:get(closed_at, S), [{unit, millisecond}]),
           maps:get(reason, S), maps:get(closed_drops, S, 0)])
     | counters(S)].

-spec counters(map()) -> [string()].
counters(S) ->
    G = fun(K) -> maps:get(K, S, 0) end,
    Avg = case G(batches) of
              0 -> 0.0;
              B -> G(requests) / B
          end,
    [line("  batches ~b, requests ~b (~.1f per batch), bytes ~b, writes ~b",
          [G(batches), G(requests), Avg, G(bytes), G(writes)])
     | case S of
           #{transport := erlang} ->
               [line("  queued ~b requests", [G(queued)])];
           _ ->
               [line("  queued ~b bytes (~b written, not yet acknowledged), pushed ~b, full ~b, "
                     "overflow waits ~b, overflow drops ~b",
                     [G(queued_bytes), G(retained_bytes), G(pushed), G(full), G(overflow_waits),
                      G(overflow_drops)]),
                line("  dropped ~b, replayed ~b, stalls ~b, connects ~b, disconnects ~b",
                     [G(dropped), G(replayed_requests), G(stalls), G(connects),
                      G(disconnects)])]
       end].

-spec link_line(map()) -> string().
link_line(L) ->
    G = fun(K) -> maps:get(K, L, 0) end,
    Up = case G(up) of
             1 -> "up";
             _ -> "down"
         end,
    line("  link ~b: ~s, batches ~b, requests ~b, writes ~b, dropped ~b, replayed ~b, "
         "stalls ~b, connects ~b, disconnects ~b",
         [G(link), Up, G(batches), G(requests), G(writes), G(dropped), G(replayed_requests),
          G(stalls), G(connects), G(disconnects)]).

%% One line of text, with its newline.
-spec line(io:format(), [term()]) -> string().
line(Format, Args) ->
    lists:flatten(io_lib:format(Format, Args)) ++ "\n".
