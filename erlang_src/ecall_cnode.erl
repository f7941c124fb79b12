%% @private
%% Owns this node's C-node identities (`<name>_ecall_<K>@<host>', one per
%% link), registered with epmd for as long as this process lives.
%%
%% When the node is not distributed, or the NIF did not load, no identity is
%% started and a clear log line says why: without distribution ecall is
%% plain `!' and erpc; without the NIF, connections use the pure-Erlang
%% transport (ecall_proxy).
%%
%% When the identities cannot be registered (a name taken in epmd by
%% another node, or by an earlier instance epmd has not yet forgotten; epmd
%% unreachable; no free port; unreadable TLS files), the node goes on: one
%% warning says what failed and what to do, connections use the pure-Erlang
%% transport, and registration is retried in the background with backoff.
%% Once it succeeds, every connection on the pure-Erlang transport is
%% closed without dropping what it holds and opened again on the NIF
%% transport (ecall_conn:move_to_nif/0); per-caller order holds across the
%% switch as across any close (ecall_conn:terminate/2, ecall_route).
-module(ecall_cnode).
-behaviour(gen_server).

-export([start_link/1, cnode/0, nodes/0, usable/0, state/0]).
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-define(KEY, {ecall, cnode}).
%% How long registering the identities with epmd may take (not a handshake:
%% the handshake deadline of each connection is the `handshake_timeout'
%% setting).
-define(REGISTER_TIMEOUT, 15000).
%% Retries of a failed registration: from 1 s, doubling, at most every
%% 10 s. The first registration asks epmd again for up to
%% ?FIRST_REGISTER_RETRY ms when it refuses a name (an instance of this node
%% that just stopped: epmd drops its names a little after); the retries in
%% the background ask once each.
-define(RETRY_MIN, 1000).
-define(RETRY_MAX, 10000).
-define(FIRST_REGISTER_RETRY, 1000).

%% `OnRegistered' is applied when the identities register after a failed
%% first attempt: the connections on the pure-Erlang transport then move
%% to the NIF (ecall_sup passes ecall_conn:move_to_nif/0; this module
%% knows nothing of connections).
-spec start_link(mfa()) -> {ok, pid()} | {error, term()}.
start_link(OnRegistered) ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, OnRegistered, []).

%% @doc The identities, or why there are none (`{registering, Why}': the
%% last registration failed, and is retried).
-spec cnode() -> {ok, ecall_nif:cnode()}
               | {error, not_distributed | {nif_not_loaded, term()} | {registering, term()}
                  | term()}.
cnode() ->
    persistent_term:get(?KEY, {error, not_started}).

%% @doc What the identities are doing, for stats: `registered', `none'
%% (not wanted or not possible: see cnode/0), or `{registering, Why}'.
-spec state() -> registered | none | {registering, term()}.
state() ->
    case cnode() of
        {ok, _} -> registered;
        {error, {registering, _} = R} -> R;
        {error, _} -> none
    end.

%% @doc Node names of this node's C-node identities.
-spec nodes() -> [node()].
nodes() ->
    case cnode() of
        {ok, C} -> [binary_to_atom(N) || #{node := N} <- ecall_nif:cnode_info(C)];
        {error, _} -> []
    end.

-spec init({module(), atom(), list()}) -> {ok, map()}.
init(OnRegistered) ->
    {ok, St} = start(),
    {ok, St#{on_registered => OnRegistered}}.

-spec start() -> {ok, map()}.
start() ->
    %% terminate/2 must run on shutdown to drop the identities.
    process_flag(trap_exit, true),
    Result = start_identities(?FIRST_REGISTER_RETRY),
    persistent_term:put(?KEY, Result),
    case Result of
        {ok, CNode} ->
            ?LOG_INFO("ecall: C-node identities ~p registered with epmd",
                      [[N || #{node := N} <- ecall_nif:cnode_info(CNode)]]),
            {ok, #{cnode => CNode}};
        {error, not_distributed} ->
            ?LOG_NOTICE("ecall: this node is not distributed (no -sname/-name); "
                        "ecall:send/2 and friends behave as plain ! and erpc", []),
            {ok, #{}};
        {error, {unsupported_tls, Why}} ->
            ?LOG_NOTICE("ecall: the C-node links cannot honour this node's TLS distribution "
                        "options (~ts); connections use the pure-Erlang transport, over the "
                        "node's own TLS distribution", [Why]),
            {ok, #{}};
        {error, {unsupported_proto_dist, Proto}} ->
            ?LOG_NOTICE("ecall: distribution over ~s is not supported by the C-node links "
                        "(they speak plain TCP); connections use the pure-Erlang transport, "
                        "over the node's own distribution", [Proto]),
            {ok, #{}};
        {error, {no_listen_port, Min, Max}} ->
            ?LOG_WARNING("ecall: inet_dist_listen_min..max (~b..~b) leaves no port for the ~b "
                         "C-node identities (the node takes one); connections use the "
                         "pure-Erlang transport. Widen the range to use the NIF.",
                         [Min, Max, ecall_config:links()]),
            {ok, #{}};
        {error, {nif_not_loaded, Why}} ->
            %% Expected with `{transport, erlang}' (a build without the NIF,
            %% ECALL_NO_NIF=1): a notice. Otherwise the NIF was wanted: an
            %% error, with the reason.
            case ecall_config:get(transport) of
                erlang ->
                    ?LOG_NOTICE("ecall: no NIF (~p); the pure-Erlang transport, as configured",
                                [Why]);
                nif ->
                    ?LOG_ERROR("ecall: the NIF did not load (~p); connections use the "
                               "pure-Erlang transport", [Why])
            end,
            {ok, #{}};
        {error, Why} ->
            {ok, registering(Why, undefined, ?RETRY_MIN)}
    end.

%% The registration failed with `Why': the node goes on without the
%% identities (connections use the pure-Erlang transport) and tries again
%% in `Delay' ms. A failure is logged when its reason differs from the last
%% one logged (`Logged'), so a name that stays taken is one warning.
-spec registering(term(), term(), pos_integer()) -> map().
registering(Why, Logged, Delay) ->
    persistent_term:put(?KEY, {error, {registering, Why}}),
    ecall_event:execute([ecall, identities, register_failed], #{retry_in => Delay},
                            #{reason => Why}),
    _ = Why =:= Logged orelse log_failure(Why),
    erlang:send_after(Delay, self(), register),
    #{registering => Why, delay => Delay}.

-spec log_failure(term()) -> ok.
log_failure({name_taken, Name}) ->
    ?LOG_WARNING("ecall: the name ~ts is taken in epmd by another node (a node started "
                 "under that name, or an earlier instance of this node that epmd has not "
                 "forgotten yet). Connections use the pure-Erlang transport meanwhile; "
                 "ecall retries in the background and moves them to the NIF transport "
                 "once the name is free. Stop the node holding it, or give this node "
                 "another name.", [Name]);
log_failure(Why) ->
    ?LOG_WARNING("ecall: the C-node identities could not start (~0p). Connections use "
                 "the pure-Erlang transport meanwhile; ecall retries in the background "
                 "and moves them to the NIF transport once the identities start.", [Why]).

-spec start_identities(non_neg_integer()) -> {ok, ecall_nif:cnode()} | {error, term()}.
start_identities(Retry) ->
    case {is_alive(), ecall_nif:load_error()} of
        {false, _} ->
            {error, not_distributed};
        {true, none} ->
            case proto_dist() of
                tcp -> start_identities_tcp(#{tls => false}, Retry);
                {tls, Tls} -> start_identities_tcp(Tls, Retry);
                {tls_unsupported, Why} -> {error, {unsupported_tls, Why}};
                {other, Proto} -> {error, {unsupported_proto_dist, Proto}}
            end;
        {true, Why} ->
            {error, {nif_not_loaded, Why}}
    end.

%% The links speak plain TCP, or TLS for a node on TLS distribution
%% (`inet_tls', `inet6_tls') when its client options are ones they can
%% honour (tls_options/0). With another carrier (a user's module) the peer
%% would not understand them.
-spec proto_dist() -> tcp | {tls, map()} | {tls_unsupported, string()} | {other, string()}.
proto_dist() ->
    case init:get_argument(proto_dist) of
        {ok, [[Proto | _] | _]} when Proto =:= "inet_tcp"; Proto =:= "inet6_tcp" ->
            tcp;
        {ok, [[Proto | _] | _]} when Proto =:= "inet_tls"; Proto =:= "inet6_tls" ->
            case tls_options() of
                {ok, Tls} -> {tls, Tls};
                {error, Why} -> {tls_unsupported, Why}
            end;
        {ok, [[Proto | _] | _]} ->
            {other, Proto};
        _ ->
            tcp
    end.

%% The node's TLS client options, as the links take them: `certfile',
%% `keyfile', `cacertfile', `verify' (verify_peer only) and
%% `server_name_indication' (`disable' only, or absent). Anything else is
%% refused by name: the links would not do what the node does. They are
%% found where OTP's inet_tls_dist finds them: the `client' section of
%% -ssl_dist_optfile, or, when the file has none (or there is no file),
%% the `client_'-prefixed -ssl_dist_opt arguments.
-spec tls_options() -> {ok, map()} | {error, string()}.
tls_options() ->
    case optfile() of
        {ok, Opts} ->
            Args = init:get_argument(ssl_dist_opt),
            %% OTP reads a side from the file when the file has it, else
            %% from that side's arguments.
            Side = fun(S) ->
                           case proplists:get_value(S, Opts) of
                               undefined -> arg_options(S, Args);
                               Section -> Section
                           end
                   end,
            with_server(client_options(Side(client)), Side(server));
        {error, _} = Error ->
            Error
    end.

%% The -ssl_dist_optfile's terms ([] without one).
-spec optfile() -> {ok, list()} | {error, string()}.
optfile() ->
    case init:get_argument(ssl_dist_optfile) of
        {ok, [[File | _] | _]} ->
            case file:consult(File) of
                {ok, [Opts]} when is_list(Opts) -> {ok, Opts};
                Other -> {error, lists:flatten(io_lib:format("~ts: ~p", [File, Other]))}
            end;
        _ ->
            {ok, []}
    end.

%% The identities' listener takes the node's server `certfile', `keyfile'
%% and `cacertfile' (each absent one: the client's). It always asks for a
%% client certificate; the server's other options are not applied there.
%% That listener answers pings and `is_auth' only: no request goes through
%% it.
-spec with_server({ok, map()} | {error, string()}, term()) -> {ok, map()} | {error, string()}.
with_server({ok, Tls}, Server) when is_list(Server) ->
    case files(Server, "server", [certfile, keyfile, cacertfile]) of
        {ok, [Cert, Key, Ca]} ->
            {ok, Tls#{tls_server_certfile => Cert, tls_server_keyfile => Key,
                      tls_server_cacertfile => Ca}};
        Error ->
            Error
    end;
with_server(Result, _) ->
    Result.

%% The file names of `Keys' in `Options' as binaries (`<<>>' for an absent
%% one), or an error naming the first that is not a file name.
-spec files(list(), string(), [atom()]) -> {ok, [binary()]} | {error, string()}.
files(Options, Side, Keys) ->
    Names = [{K, file_name(proplists:get_value(K, Options, ""))} || K <- Keys],
    case [K || {K, error} <- Names] of
        [] -> {ok, [N || {_, N} <- Names]};
        [K | _] -> {error, lists:flatten(io_lib:format("~s option ~p is not a file name",
                                                       [Side, K]))}
    end.

-spec file_name(term()) -> binary() | error.
file_name(Name) ->
    try unicode:characters_to_binary(Name) of
        Bin when is_binary(Bin) -> Bin;
        _ -> error
    catch
        error:badarg -> error
    end.

%% The `client_' or `server_' -ssl_dist_opt arguments as a proplist, the
%% way inet_tls_dist reads them (pairs; the other side's skipped).
-spec arg_options(client | server, {ok, [[string()]]} | error) -> [{atom(), term()}].
arg_options(Side, {ok, Args}) ->
    side_args(atom_to_list(Side) ++ "_", lists:append(Args));
arg_options(_, error) ->
    [].

-spec side_args(string(), [string()]) -> [{atom(), term()}].
side_args(Prefix, [Key, Value | Rest]) ->
    case lists:prefix(Prefix, Key) of
        true ->
            Opt = lists:nthtail(length(Prefix), Key),
            Typed = case Opt of
                        "verify" -> list_to_atom(Value);
                        _ -> Value
                    end,
            [{list_to_atom(Opt), Typed} | side_args(Prefix, Rest)];
        false ->
            side_args(Prefix, Rest)
    end;
side_args(_, _) ->
    [].

-spec client_options(term()) -> {ok, map()} | {error, string()}.
client_options([]) ->
    {error, "no client options in -ssl_dist_optfile or -ssl_dist_opt"};
client_options(Client) when is_list(Client) ->
    Known = [certfile, keyfile, cacertfile, verify, server_name_indication],
    case [K || {K, _} <- Client, not lists:member(K, Known)] of
        [] ->
            Get = fun(K) -> proplists:get_value(K, Client) end,
            case {Get(certfile), Get(cacertfile), Get(verify), Get(server_name_indication)} of
                {undefined, _, _, _} -> {error, "client option certfile missing"};
                {_, undefined, _, _} -> {error, "client option cacertfile missing"};
                {_, _, V, _} when V =/= verify_peer -> {error, "client option verify is not verify_peer"};
                {_, _, _, Sni} when Sni =:= undefined; Sni =:= disable ->
                    case files(Client, "client", [certfile, keyfile, cacertfile]) of
                        {ok, [Cert, Key, Ca]} ->
                            {ok, #{tls => true, tls_certfile => Cert, tls_keyfile => Key,
                                   tls_cacertfile => Ca, tls_sni => Sni =:= undefined}};
                        Error ->
                            Error
                    end;
                _ -> {error, "client option server_name_indication other than disable"}
            end;
        Unknown ->
            {error, lists:flatten(io_lib:format("client options ~p", [Unknown]))}
    end;
client_options(_) ->
    {error, "client options in -ssl_dist_optfile are not a list"}.

-spec start_identities_tcp(map(), non_neg_integer()) ->
          {ok, ecall_nif:cnode()} | {error, term()}.
start_identities_tcp(Tls, Retry) ->
    [Name, Host] = string:split(atom_to_list(node()), "@"),
    Links = ecall_config:links(),
    Nodes = [iolist_to_binary([Name, "_ecall_", integer_to_list(K), $@, Host])
             || K <- lists:seq(1, Links)],
    Cookie = atom_to_binary(erlang:get_cookie()),
    {Min, Max} = listen_ports(),
    case Min > 0 andalso Max - Min < Links of
        true ->
            %% The node's own listener takes one port of the range; each
            %% identity needs another.
            {error, {no_listen_port, Min, Max}};
        false ->
            Ref = make_ref(),
            Opts = #{tick_ms => tick_ms(),
                     handshake_ms => ecall_config:get(handshake_timeout),
                     epmd_port => epmd_port(),
                     listen_addr => listen_addr(),
                     listen_min => Min, listen_max => Max,
                     tls => false, tls_certfile => <<>>, tls_keyfile => <<>>,
                     tls_cacertfile => <<>>, tls_sni => false,
                     tls_server_certfile => <<>>, tls_server_keyfile => <<>>,
                     tls_server_cacertfile => <<>>,
                     register_retry_ms => Retry},
            %% An option the NIF refuses (badarg) is a failure to start,
            %% like any other: the node goes on without the identities.
            try ecall_nif:cnode_start(Nodes, Cookie, maps:merge(Opts, Tls), Ref) of
                ok ->
                    receive
                        {ecall_cnode, Ref, Result} -> Result
                    after ?REGISTER_TIMEOUT ->
                        {error, timeout}
                    end
            catch
                error:Why -> {error, {cnode_start, Why}}
            end
    end.

%% @doc Whether connections can use the C-node links: `false' when the
%% identities were not started because this node's distribution is not
%% one they can join, or while their registration is retried (then
%% connections use the pure-Erlang transport, over the node's own
%% distribution).
-spec usable() -> boolean().
usable() ->
    case cnode() of
        {error, {registering, _}} -> false;
        {error, {no_listen_port, _, _}} -> false;
        {error, {unsupported_proto_dist, _}} -> false;
        {error, {unsupported_tls, _}} -> false;
        _ -> true
    end.

%% Where the identities listen: where the node's distribution listens, so
%% that a node kept to one interface (inet_dist_use_interface) does not get
%% links listening on every one. Otherwise every interface of the node's
%% address family (`-proto_dist inet6_tcp' and `inet6_tls': IPv6; on Linux
%% `::' takes IPv4 too, as the node's own listener does).
-spec listen_addr() -> binary().
listen_addr() ->
    case application:get_env(kernel, inet_dist_use_interface) of
        {ok, Ip} when is_tuple(Ip) ->
            list_to_binary(inet:ntoa(Ip));
        _ ->
            case proto_family() of
                inet6 -> <<"::">>;
                inet -> <<"0.0.0.0">>
            end
    end.

-spec proto_family() -> inet | inet6.
proto_family() ->
    case init:get_argument(proto_dist) of
        {ok, [[Proto | _] | _]} ->
            case lists:prefix("inet6", Proto) of
                true -> inet6;
                false -> inet
            end;
        _ ->
            inet
    end.

%% The port range of the node's distribution listener (as inet_tcp_dist
%% reads it: a minimum alone is also the maximum), or {0, 0}: any port.
-spec listen_ports() -> {0..65535, 0..65535}.
listen_ports() ->
    case {application:get_env(kernel, inet_dist_listen_min),
          application:get_env(kernel, inet_dist_listen_max)} of
        {{ok, Min}, {ok, Max}} when is_integer(Min), is_integer(Max), Min > 0, Max >= Min ->
            {Min, min(Max, 65535)};
        {{ok, Min}, _} when is_integer(Min), Min > 0 ->
            {Min, Min};
        _ ->
            {0, 0}
    end.

%% The epmd this node uses, found the way erl_epmd finds it.
-spec epmd_port() -> 1..65535.
epmd_port() ->
    case application:get_env(kernel, erl_epmd_port) of
        {ok, Port} when is_integer(Port) -> Port;
        _ ->
            case os:getenv("ERL_EPMD_PORT") of
                false -> 4369;
                Port -> list_to_integer(Port)
            end
    end.

%% The peer drops a connection after net_ticktime without traffic from it
%% and ticks every quarter of that; we write at least as often.
-spec tick_ms() -> pos_integer().
tick_ms() ->
    Ticktime = case net_kernel:get_net_ticktime() of
                   {ongoing_change_to, T} -> T;
                   T when is_integer(T) -> T;
                   _ -> 60
               end,
    max(100, Ticktime * 1000 div 4).

-spec handle_call(term(), gen_server:from(), map()) -> {reply, {error, badarg}, map()}.
handle_call(Req, _From, State) ->
    {reply, {error, badarg}, ecall_log:unexpected_in(?MODULE, {call, Req}, State)}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(Msg, State) ->
    {noreply, ecall_log:unexpected_in(?MODULE, {cast, Msg}, State)}.

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info(register, #{registering := Logged, delay := Delay,
                         on_registered := {M, F, A} = OnRegistered}) ->
    case start_identities(0) of
        {ok, CNode} ->
            persistent_term:put(?KEY, {ok, CNode}),
            Names = [N || #{node := N} <- ecall_nif:cnode_info(CNode)],
            ?LOG_NOTICE("ecall: C-node identities ~p registered with epmd; connections "
                        "move to the NIF transport", [Names]),
            ecall_event:execute([ecall, identities, registered], #{}, #{nodes => Names}),
            _ = apply(M, F, A),
            {noreply, #{cnode => CNode, on_registered => OnRegistered}};
        {error, Why} ->
            St = registering(Why, Logged, min(2 * Delay, ?RETRY_MAX)),
            {noreply, St#{on_registered => OnRegistered}}
    end;
handle_info(Info, State) ->
    {noreply, ecall_log:unexpected_in(?MODULE, {info, Info}, State)}.

-spec terminate(term(), map()) -> ok.
terminate(_Reason, _State) ->
    %% Dropping the last reference closes the listeners and the epmd
    %% registrations (once the links that use them have stopped).
    _ = persistent_term:erase(?KEY),
    ok.
