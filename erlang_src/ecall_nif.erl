%% @private
%% Loader and stubs of the Rust NIF (crate `native/ecall_nif`).
%%
%% The module always loads: when the shared library cannot be loaded the
%% reason is kept (see {@link load_error/0}), every stub raises
%% `nif_not_loaded', and ecall uses the pure-Erlang transport (ecall_proxy)
%% for its connections instead. Nothing here is part of the public API.
-module(ecall_nif).

-export([load_error/0, log_target/2, log_off/0]).
-export([cnode_start/4, cnode_info/1,
         peer_open/6, peer_drain/1, peer_close/1, peer_stats/1, overflow_drop/1,
         send/4, push/4, push_many/4, push_many_dirty/4, encode_large/1, push_encoded/4,
         caller_link/1, wait_room/3,
         peer_flusher/2, flush/2]).
-export([call_wait/2, call_cancel/1, call_reply/2, calls_fail/3, calls_waiting/1]).
-export([encode/1, encoded_size/1, encoded_request/2]).

-on_load(init/0).

-define(LIB, "libecall_nif").

-type cnode() :: reference().
-type peer() :: reference().
%% Room in a peer's budget set aside for one caller (wait_room/3).
-type room() :: reference().
-export_type([cnode/0, peer/0, room/0, cnode_opts/0]).
%% A big message encode_large/1 encoded, for push_encoded/4, and where
%% it goes.
-type encoded() :: reference().
-type encoded_target() :: {direct, pid() | reference() | atom()}
                        | {send, pid() | reference() | atom()}
                        | {reply | reply_external, non_neg_integer()}
                        | whole.
-export_type([encoded/0, encoded_target/0]).

-spec init() -> ok.
init() ->
    Path = filename:join(priv_dir(), ?LIB),
    case erlang:load_nif(Path, 0) of
        ok ->
            ok;
        {error, Reason} ->
            %% Keep loading the module: connections use the pure-Erlang
            %% transport, and ecall_cnode logs why.
            persistent_term:put({?MODULE, load_error}, Reason),
            ok
    end.

-spec priv_dir() -> file:filename().
priv_dir() ->
    case code:priv_dir(ecall) of
        {error, bad_name} ->
            filename:join(filename:dirname(filename:dirname(code:which(?MODULE))), "priv");
        Dir ->
            Dir
    end.

%% @doc Why the NIF did not load, or `none'.
-spec load_error() -> none | term().
load_error() ->
    persistent_term:get({?MODULE, load_error}, none).

%% Rust `tracing' events up to Max (1 error .. 5 trace) go to Pid as
%% {ecall_log, Level, Target, Text}.
-spec log_target(pid(), 0..5) -> ok.
log_target(_Pid, _Max) -> erlang:nif_error(nif_not_loaded).

-spec log_off() -> ok.
log_off() -> erlang:nif_error(nif_not_loaded).

-type cnode_opts() :: #{tick_ms := pos_integer(), handshake_ms := pos_integer(),
                        epmd_port := 1..65535, listen_addr := binary(),
                        listen_min := 0..65535, listen_max := 0..65535,
                        tls := boolean(), tls_certfile := binary(), tls_keyfile := binary(),
                        tls_cacertfile := binary(), tls_sni := boolean(),
                        tls_server_certfile := binary(), tls_server_keyfile := binary(),
                        tls_server_cacertfile := binary(),
                        register_retry_ms := non_neg_integer()}.

%% The answer, `{ecall_cnode, Ref, Result}': `{ok, CNode}', `{error,
%% {name_taken, Node}}' (epmd refused a name for `register_retry_ms'), or
%% `{error, Text}'.
-spec cnode_start([binary()], binary(), cnode_opts(), reference()) -> ok.
cnode_start(_Nodes, _Cookie, _Opts, _Ref) -> erlang:nif_error(nif_not_loaded).

%% One map per identity: node (binary), creation, port, incoming connections
%% accepted and refused, and what they sent: inbound_frames, inbound_answered
%% (is_auth), inbound_ignored, inbound_malformed (connections closed on a
%% malformed frame).
-spec cnode_info(cnode()) -> [#{node := binary(), atom() => non_neg_integer() | binary()}].
cnode_info(_CNode) -> erlang:nif_error(nif_not_loaded).

-spec peer_open(cnode(), binary(), binary(), [binary()], pid(), map()) -> {ok, peer()}.
peer_open(_CNode, _Node, _Cookie, _Receivers, _Owner, _Opts) -> erlang:nif_error(nif_not_loaded).

%% @doc Refuses new pushes (they answer `closed') and has the links write
%% what the peer's shards hold, then stop (`{ecall_link, K, stopped}');
%% peer_close/1 ends it, dropping what is left.
-spec peer_drain(peer()) -> ok.
peer_drain(_Peer) -> erlang:nif_error(nif_not_loaded).

-spec peer_close(peer()) -> ok.
peer_close(_Peer) -> erlang:nif_error(nif_not_loaded).

-spec overflow_drop(peer()) -> ok.
overflow_drop(_Peer) -> erlang:nif_error(nif_not_loaded).

-spec peer_stats(peer()) -> #{atom() => non_neg_integer() | [map()]}.
peer_stats(_Peer) -> erlang:nif_error(nif_not_loaded).

%% Encodes {send, To, Msg} and queues it. `large': nothing queued, its
%% encoding passed the inline bound (INLINE_MAX, native/ecall_nif's
%% encode/mod.rs); encode it with encode_large/1 and push that with
%% push_encoded/4.
%% `Urgent': its caller waits for the answer before its next request, so
%% a busy link's writer does not hold it back for company.
-spec send(peer(), pid() | atom() | reference(), term(), boolean()) ->
          ok | closed | large | {full, non_neg_integer()}.
send(_Peer, _To, _Msg, _Urgent) -> erlang:nif_error(nif_not_loaded).

%% Queues any request tuple. `Room': `false', or the room wait_room/3
%% set aside for this caller (a push that queues uses it up; one that
%% answers `large' leaves it for push_encoded/4). `large' and `Urgent' as
%% for send/4.
-spec push(peer(), tuple(), room() | false, boolean()) ->
          ok | closed | large | {full, non_neg_integer()}.
push(_Peer, _Request, _Room, _Urgent) -> erlang:nif_error(nif_not_loaded).

%% Encodes {send_many, Dests, Msg} and queues it: `Dests', a list of
%% pids, aliases and registered names of the peer, in one call into the
%% VM. `large' (nothing queued) for more targets than MANY_NORMAL
%% (push.rs) or a message whose encoding passes INLINE_MAX: push it with
%% push_many_dirty/4. `Room' and the other results as for push/4.
-spec push_many(peer(), [pid() | reference() | atom()], term(), room() | false) ->
          ok | closed | large | {full, non_neg_integer()}.
push_many(_Peer, _Dests, _Msg, _Room) -> erlang:nif_error(nif_not_loaded).

%% push_many/4 on a dirty scheduler, for any number of targets and a
%% message of any size: never `large'.
-spec push_many_dirty(peer(), [pid() | reference() | atom()], term(), room() | false) ->
          ok | closed | {full, non_neg_integer()}.
push_many_dirty(_Peer, _Dests, _Msg, _Room) -> erlang:nif_error(nif_not_loaded).

%% Encodes a big message on a dirty scheduler into memory of the NIF's (not
%% a binary of the caller's, which would count against its heap's binary
%% quota and bring a full collection of a big heap): its size and a handle
%% for push_encoded/4.
-spec encode_large(term()) -> {non_neg_integer(), encoded()}.
encode_large(_Msg) -> erlang:nif_error(nif_not_loaded).

%% Queues what encode_large/1 encoded, as `Target' says: `{direct, Dest}'
%% straight to `Dest' on the peer (a pid, a registered name or an alias),
%% which decodes it in that process; or in a request the peer's receiver
%% replays, whose front the NIF writes around the encoding: `{send, Dest}'
%% for `{send, Dest, Msg}', `{reply, Id}' for `{reply, Id, Reply}',
%% `{reply_external, Id}' for `{reply, Id, {external, Bytes}}' (the
%% encoding as the bytes of a binary, for the caller to decode), or
%% `whole' when the encoding is the whole request. `Id' is a non-negative
%% integer of at most 64 bits. A push that answers `{full, _}' keeps the
%% encoding for the retry; any other frees it. `badarg' for an encoding
%% pushed already or a bad target.
-spec push_encoded(peer(), encoded_target(), encoded(), room() | false) ->
          ok | closed | {full, non_neg_integer()}.
push_encoded(_Peer, _Target, _Encoded, _Room) -> erlang:nif_error(nif_not_loaded).

%% Sets the peer's flusher (once): the process that is sent `{ecall_flush,
%% K}' when a push queued behind link K's sleeping writer, and answers it
%% with flush/2.
-spec peer_flusher(peer(), pid()) -> ok.
peer_flusher(_Peer, _Pid) -> erlang:nif_error(nif_not_loaded).

%% Writes what link K holds from the calling process (one non-blocking
%% write), or wakes its writer when the load is the writer's. `true': more
%% came meanwhile, call it again.
-spec flush(peer(), non_neg_integer()) -> boolean().
flush(_Peer, _K) -> erlang:nif_error(nif_not_loaded).

%% `Term' in external format, encoded as a push encodes it (for tests
%% and the benchmark): `binary_to_term(encode(T))' is equal to `T'.
-spec encode(term()) -> binary().
encode(_Term) -> erlang:nif_error(nif_not_loaded).

%% What push_encoded/4 would queue for `Target', as one external term: the
%% request (`term_to_binary/1' of it gives the same bytes from OTP 26 on),
%% or for `{direct, Dest}' the destination. The encoding is kept. For
%% tests.
-spec encoded_request(encoded_target(), encoded()) -> binary().
encoded_request(_Target, _Encoded) -> erlang:nif_error(nif_not_loaded).

%% How a push encodes `Term': its size in bytes, whether some atom stays
%% text, and how many atoms went as encode-time cache references, or
%% `large' when a push would leave it to encode_large/1 (for tests and the
%% benchmark).
-spec encoded_size(term()) -> {non_neg_integer(), boolean(), non_neg_integer()} | large.
encoded_size(_Term) -> erlang:nif_error(nif_not_loaded).

%% The link (0-based) that carries the calling process's requests.
-spec caller_link(peer()) -> non_neg_integer().
caller_link(_Peer) -> erlang:nif_error(nif_not_loaded).

%% After `{full, Size}': sets Size bytes of the budget aside for the
%% caller, now (`{retry, Room}') or once they fit, callers in the order
%% they came (`wait', then `{ecall_room, Ref, Room}', or `{ecall_room,
%% Ref, false}' if the peer closed first). Room not used by a push goes
%% back when the term is garbage.
-spec wait_room(peer(), non_neg_integer(), reference()) -> wait | {retry, room()}.
wait_room(_Peer, _Size, _Ref) -> erlang:nif_error(nif_not_loaded).

%% Calls waiting for their replies (native/ecall_nif/src/calls.rs).

%% Registers the calling process as waiting for a reply under `Ref', on
%% the link that carries its requests to `Peer': the id its request
%% carries, or `closed' when that link is not up.
-spec call_wait(peer(), reference()) -> {ok, non_neg_integer()} | closed.
call_wait(_Peer, _Ref) -> erlang:nif_error(nif_not_loaded).

%% Gives up a call: `true' if no reply will reach its caller, `false' if
%% the reply was handed over already.
-spec call_cancel(non_neg_integer()) -> boolean().
call_cancel(_Id) -> erlang:nif_error(nif_not_loaded).

%% Sends `{Ref, Reply}' to the process waiting for call `Id'; `false' when
%% none waits (the reply is dropped).
-spec call_reply(non_neg_integer(), term()) -> boolean().
call_reply(_Id, _Reply) -> erlang:nif_error(nif_not_loaded).

%% Fails the calls waiting on a link of `Peer' (`all': any of its links):
%% each caller gets `{Ref, {badrpc, Reason}}'. Returns how many.
-spec calls_fail(peer(), non_neg_integer() | all, term()) -> non_neg_integer().
calls_fail(_Peer, _Link, _Reason) -> erlang:nif_error(nif_not_loaded).

%% @doc How many calls still wait on `Peer' (the entries of callers that
%% died are dropped).
-spec calls_waiting(peer()) -> non_neg_integer().
calls_waiting(_Peer) -> erlang:nif_error(nif_not_loaded).
