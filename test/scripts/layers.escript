#!/usr/bin/env escript
%% The shape of erlang_src/, checked on its compiled modules (xref): no
%% module of ecall calls the API module `ecall' (it is a facade over the
%% others), and no cycle of calls runs through more than two modules.
%% Usage: layers.escript EbinDir
-mode(compile).

main([Ebin]) ->
    {ok, _} = xref:start(?MODULE, [{xref_mode, modules}]),
    {ok, Mods} = xref:add_directory(?MODULE, Ebin),
    {ok, Edges} = xref:q(?MODULE, "ME"),
    Own = [{A, B} || {A, B} <- Edges, A =/= B, lists:member(A, Mods), lists:member(B, Mods)],
    Up = [A || {A, ecall} <- Own],
    {ok, Comps} = xref:q(?MODULE, "components ME"),
    Knots = [C || C <- Comps, length([M || M <- C, lists:member(M, Mods)]) > 2],
    [io:format("~p calls the API module ecall~n", [A]) || A <- Up],
    [io:format("a cycle of calls through ~p~n", [K]) || K <- Knots],
    case Up ++ Knots of
        [] -> io:format("layers: ~b modules, none calls ecall, no cycle of more than 2~n",
                        [length(Mods)]);
        _ -> halt(1)
    end;
main(_) ->
    io:format("usage: layers.escript EbinDir~n"),
    halt(2).
