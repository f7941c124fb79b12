//! NIF binding of ecall (Erlang module `ecall_nif`).
//!
//! Kept thin on purpose: argument decoding, the one encode of each request
//! on the caller's scheduler, and messages from runtime threads to Erlang
//! processes. Everything with a protocol in it lives in `ecall_dist`.
//!
//! Threads: one tokio runtime (`ecall-io` threads) carries every link. NIF
//! calls never block on it: starting an identity is asynchronous and
//! answers with a message; a push is one short critical section.
//!
//! Panics: rustler turns a panic inside a NIF call into an Erlang exception;
//! runtime threads talk to Erlang only through `OwnedEnv` messages.
#![deny(missing_docs)]
#![warn(clippy::all)]

use ecall_dist::link::posix_name;
use ecall_dist::{
    BatchCaps, Identity, IdentityConfig, LinkDown, LinkEvents, Listen, Peer, PeerConfig, Push,
};
use rustler::env::OwnedEnv;
use rustler::{Atom, Binary, Encoder, Env, LocalPid, NifResult, Resource, ResourceArc, Term};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

mod encode;
mod log;

mod atoms {
    rustler::atoms! {
        ecall_log, name_taken,
        ok, error, send, full, closed, large, wait, retry, ecall_link, ecall_cnode, ecall_room,
        up, down, alive, badarg,
        pushed, batches, requests, bytes, writes, dropped, connects, disconnects,
        stalls, unconfirmed, cached_atoms, queued_bytes, links_up, overflow_waits, overflow_drops, per_link, link, fragmented, lone, lone_partial, gathers, lull_trials, lulls, flushes, flush_handoffs, ecall_flush, urgent, wakes, closed_drops, links, shards, accepted, refused,
        node, creation, port, inbound_frames, inbound_answered, inbound_ignored, inbound_malformed,
        handshakes_shed, accept_errors, stopped,
        // Link-down reasons (see `down_reason`).
        stalled, restarted, peer_closed, not_registered, handshake_timeout,
        read, write, connect, malformed, epmd, handshake, other,
    }
}

/// I/O threads: `ECALL_IO_THREADS`, else one per two cores the process
/// may use, at least 1 and at most 2. The threads share the cores with the
/// node's schedulers, and every wake-up of one may preempt a scheduler: on
/// a 2-core machine (where the default used to be 2) one thread gave the
/// NIF transport 1.30-1.71 × the pure-Erlang transport's sends at 20,000
/// writers against 1.00-1.45 × with two, and calls 0.97-1.11 × against
/// 0.91-1.20 × (five runs each, alternated). Machines of 4 cores and more
/// keep the 2 they had (not measured here).
fn io_threads() -> usize {
    std::env::var("ECALL_IO_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).clamp(1, 2))
        })
        .max(1)
}

pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let threads = io_threads();
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("ecall-io")
            .enable_all()
            .build()
            .expect("ecall: cannot start the I/O runtime")
    })
}

/// The registered C-node identities of this node.
pub struct CNode {
    ids: Vec<Arc<Identity>>,
}

#[rustler::resource_impl]
impl Resource for CNode {}

/// One peer's shards and links. Closing happens when the owner asks or when
/// the last reference is garbage-collected.
pub struct PeerRes {
    peer: Arc<Peer>,
    /// The process that flushes for pushes answered `Push::Flush` (see
    /// `peer_flusher/2`); until it is set, such a push wakes the writer.
    flusher: std::sync::OnceLock<LocalPid>,
}

#[rustler::resource_impl]
impl Resource for PeerRes {
    fn destructor(self, _env: Env<'_>) {
        self.peer.close();
    }
}

/// Room in a peer's byte budget set aside for one caller that waited for
/// it (`wait_room/3`): handed to the caller in `{retry, Room}` or
/// `{ecall_room, Ref, Room}`, and used by its next push (`push/3`,
/// `push_iovec/3`). If the caller never pushes (it died, or was killed
/// while the message was on its way), the room goes back when the term is
/// garbage: without this, the room would be lost for good, or (when it
/// was only counted, not set aside) others could take it meanwhile.
pub struct RoomRes {
    /// Weak: a room must not keep a closed peer's memory alive.
    peer: std::sync::Weak<Peer>,
    /// Bytes still set aside (0 once a push took them).
    bytes: std::sync::atomic::AtomicUsize,
}

#[rustler::resource_impl]
impl Resource for RoomRes {}

impl RoomRes {
    /// The bytes set aside, now the caller's push's (0 the second time).
    fn take(&self) -> usize {
        self.bytes.swap(0, std::sync::atomic::Ordering::AcqRel)
    }
}

impl Drop for RoomRes {
    fn drop(&mut self) {
        let bytes = self.take();
        if let Some(peer) = self.peer.upgrade() {
            // Nothing for a room a push used up: releasing 0 does nothing.
            peer.release(bytes);
        }
    }
}

/// The room a push to `peer` may use: `false` (none), or a room from
/// `wait_room/3` on that same peer. A room of another peer is not taken
/// (it goes back to its own peer when collected): used here, it would
/// charge this peer too little and keep the other's room for good.
fn reserved(room: Term<'_>, peer: &Arc<Peer>) -> usize {
    room.decode::<ResourceArc<RoomRes>>()
        .ok()
        .filter(|r| std::ptr::eq(r.peer.as_ptr(), Arc::as_ptr(peer)))
        .map_or(0, |r| r.take())
}

/// Options of `cnode_start/4`, all required (the Erlang side fills them).
#[derive(rustler::NifMap)]
struct CNodeOpts {
    tick_ms: u64,
    handshake_ms: u64,
    epmd_port: u16,
    /// Address to listen on, as text (`"0.0.0.0"`, `"::"`, `"127.0.0.1"`).
    listen_addr: String,
    /// Port range to listen on; `0, 0`: any.
    listen_min: u16,
    listen_max: u16,
    /// TLS on the links (the node runs TLS distribution), with the node's
    /// client options (`ssl_dist_optfile`); the files are read on a
    /// runtime thread, not here.
    tls: bool,
    tls_certfile: String,
    tls_keyfile: String,
    tls_cacertfile: String,
    tls_sni: bool,
    /// The node's server files for the identities' listener (empty: the
    /// client's).
    tls_server_certfile: String,
    tls_server_keyfile: String,
    tls_server_cacertfile: String,
    /// How long a name epmd refuses is asked for again (ms) before the
    /// answer is `{name_taken, Node}`.
    register_retry_ms: u64,
}

/// Starts identities `nodes` (full names) registered with the epmd on
/// `epmd_port`, listening where `opts` says; answers the caller with
/// `{ecall_cnode, Ref, {ok, CNode} | {error, Reason}}`.
#[rustler::nif]
fn cnode_start(
    env: Env<'_>,
    nodes: Vec<String>,
    cookie: String,
    opts: CNodeOpts,
    reference: Term<'_>,
) -> NifResult<Atom> {
    // This node may have a new name or creation: local pids encode anew.
    encode::new_epoch();
    let CNodeOpts {
        tick_ms,
        handshake_ms,
        epmd_port,
        listen_addr,
        listen_min,
        listen_max,
        tls,
        tls_certfile,
        tls_keyfile,
        tls_cacertfile,
        tls_sni,
        tls_server_certfile,
        tls_server_keyfile,
        tls_server_cacertfile,
        register_retry_ms,
    } = opts;
    let tls = tls.then_some(ecall_dist::TlsOptions {
        certfile: tls_certfile,
        keyfile: tls_keyfile,
        cacertfile: tls_cacertfile,
        sni: tls_sni,
        server_certfile: tls_server_certfile,
        server_keyfile: tls_server_keyfile,
        server_cacertfile: tls_server_cacertfile,
    });
    let addr = listen_addr.parse().map_err(|_| rustler::Error::BadArg)?;
    if nodes.is_empty()
        || tick_ms == 0
        || handshake_ms == 0
        || (listen_min == 0) != (listen_max == 0)
        || listen_min > listen_max
    {
        return Err(rustler::Error::BadArg);
    }
    let listen = Listen {
        addr,
        ports: (listen_min, listen_max),
    };
    let caller = env.pid();
    let mut owned = OwnedEnv::new();
    let saved = owned.save(reference);
    runtime().spawn(async move {
        let mut ids = Vec::with_capacity(nodes.len());
        let mut failure = None;
        let tls = match tls.as_ref().map(ecall_dist::TlsClient::new).transpose() {
            Ok(tls) => tls,
            Err(e) => {
                failure = Some(e);
                None
            }
        };
        for node in nodes.into_iter().filter(|_| failure.is_none()) {
            let cfg = IdentityConfig {
                node,
                cookie: cookie.clone(),
                tick: Duration::from_millis(tick_ms),
                handshake_timeout: Duration::from_millis(handshake_ms),
                epmd_port,
                listen: listen.clone(),
                tls: tls.clone(),
                register_retry: Duration::from_millis(register_retry_ms),
            };
            match Identity::start(cfg).await {
                Ok(id) => ids.push(id),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        let _ = owned.send_and_clear(&caller, |env| {
            let r = saved.load(env);
            let result = match failure {
                None => (atoms::ok(), ResourceArc::new(CNode { ids })).encode(env),
                // A taken name is the one failure the Erlang side retries
                // by name (and says what to do about); the others are text.
                Some(ecall_dist::Error::NameTaken(node)) => {
                    (atoms::error(), (atoms::name_taken(), node)).encode(env)
                }
                Some(e) => (atoms::error(), e.to_string()).encode(env),
            };
            (atoms::ecall_cnode(), r, result).encode(env)
        });
    });
    Ok(atoms::ok())
}

/// One map per identity: `node` (binary), `creation`, `port`, incoming
/// connections `accepted` and `refused`, and what they sent
/// (`inbound_frames`, `inbound_answered`, `inbound_ignored`, and
/// `inbound_malformed`: connections closed on a malformed frame).
#[rustler::nif]
fn cnode_info<'a>(env: Env<'a>, cnode: ResourceArc<CNode>) -> NifResult<Vec<Term<'a>>> {
    use std::sync::atomic::Ordering::Relaxed;
    cnode
        .ids
        .iter()
        .map(|i| {
            let mut pairs = vec![
                (atoms::creation(), u64::from(i.creation().get())),
                (atoms::port(), u64::from(i.port())),
                (atoms::accepted(), i.accepted.load(Relaxed)),
                (atoms::refused(), i.refused.load(Relaxed)),
                (atoms::handshakes_shed(), i.shed.load(Relaxed)),
                (atoms::accept_errors(), i.accept_errors.load(Relaxed)),
            ];
            pairs.extend(inbound_counters(&i.inbound));
            map_of(env, &pairs)?.map_put(atoms::node().encode(env), i.node().encode(env))
        })
        .collect()
}

fn inbound_counters(s: &ecall_dist::inbound::InboundStats) -> [(Atom, u64); 4] {
    use std::sync::atomic::Ordering::Relaxed;
    [
        (atoms::inbound_frames(), s.frames.load(Relaxed)),
        (atoms::inbound_answered(), s.answered.load(Relaxed)),
        (atoms::inbound_ignored(), s.ignored.load(Relaxed)),
        (atoms::inbound_malformed(), s.malformed.load(Relaxed)),
    ]
}

struct Events {
    owner: LocalPid,
}

impl Events {
    fn tell(&self, link: usize, what: impl for<'a> FnOnce(Env<'a>) -> Term<'a>) {
        let mut env = OwnedEnv::new();
        let _ = env.send_and_clear(&self.owner, |env| {
            (atoms::ecall_link(), link, what(env)).encode(env)
        });
    }
}

impl LinkEvents for Events {
    fn up(&self, link: usize) {
        self.tell(link, |env| atoms::up().encode(env));
    }
    fn down(&self, link: usize, reason: &LinkDown, unconfirmed: u64) {
        let reason = reason.clone();
        self.tell(link, move |env| {
            (atoms::down(), down_reason(env, &reason), unconfirmed).encode(env)
        });
    }
    fn alive(&self, link: usize, node: &str) {
        let node = node.to_string();
        self.tell(link, move |env| (atoms::alive(), node).encode(env));
    }
    fn stopped(&self, link: usize) {
        self.tell(link, |env| atoms::stopped().encode(env));
    }
}

/// The Erlang term of a link-down reason, as sent in
/// `{ecall_link, K, {down, Reason, Unconfirmed}}` (`Unconfirmed`: requests
/// possibly lost with the connection, see `LinkEvents::down`):
///
/// ```text
/// Reason = closed              % the peer was closed (peer_close/1)
///        | stalled             % a write missed stall_timeout; the link's
///                              % queue was dropped
///        | restarted           % the peer node has a new creation; the
///                              % link stopped for good
///        | alive               % the peer still holds our previous
///                              % connection ({alive, OurNode} came first)
///        | peer_closed         % the peer closed the socket
///        | not_registered      % the peer's epmd does not know its name
///        | handshake_timeout   % no connection within the handshake time
///        | {read, Posix}       % reading the socket failed
///        | {write, Posix}      % writing the socket failed
///        | {connect, Posix}    % the TCP connection to the peer failed
///        | {malformed, frame_too_large | unknown_frame_kind
///                    | bad_distribution_header | bad_term}
///        | {epmd, binary()}    % the peer's epmd failed (text)
///        | {handshake, binary()}  % the handshake failed (text; a wrong
///                                 % cookie shows up here)
/// Posix  = econnreset | epipe | econnrefused | econnaborted | enotconn
///        | etimedout | ehostunreach | enetunreach | eaddrnotavail
///        | eaddrinuse | enomem | other
/// ```
fn down_reason<'a>(env: Env<'a>, reason: &LinkDown) -> Term<'a> {
    // Atoms named by ecall_dist (errno names, malformed-frame names).
    let named = |name: &str| Atom::from_str(env, name).unwrap_or_else(|_| atoms::other());
    match reason {
        LinkDown::Closed => atoms::closed().encode(env),
        LinkDown::Stalled => atoms::stalled().encode(env),
        LinkDown::Restarted => atoms::restarted().encode(env),
        LinkDown::Alive => atoms::alive().encode(env),
        LinkDown::PeerClosed => atoms::peer_closed().encode(env),
        LinkDown::NotRegistered => atoms::not_registered().encode(env),
        LinkDown::HandshakeTimeout => atoms::handshake_timeout().encode(env),
        LinkDown::Read(k) => (atoms::read(), named(posix_name(*k))).encode(env),
        LinkDown::Write(k) => (atoms::write(), named(posix_name(*k))).encode(env),
        LinkDown::Connect(k) => (atoms::connect(), named(posix_name(*k))).encode(env),
        LinkDown::Malformed(m) => (atoms::malformed(), named(m.as_str())).encode(env),
        LinkDown::Epmd(s) => (atoms::epmd(), s.as_str()).encode(env),
        LinkDown::Handshake(s) => (atoms::handshake(), s.as_str()).encode(env),
    }
}

/// Options of `peer_open/6`, all required (the Erlang side fills defaults).
#[derive(rustler::NifMap)]
struct PeerOpts {
    shards: usize,
    max_batch_count: u32,
    max_batch_bytes: usize,
    max_queue_bytes: usize,
    stall_timeout: u64,
    backoff_min: u64,
    backoff_max: u64,
    gather: bool,
    lulls: bool,
    flusher: bool,
}

/// Opens the shards and links towards `node`; link events go to `owner` as
/// `{ecall_link, Index, up | {down, Reason} | {alive, OurNode}}` (Index
/// 0-based; Reason: see `down_reason`).
#[rustler::nif]
fn peer_open(
    cnode: ResourceArc<CNode>,
    node: String,
    cookie: String,
    receivers: Vec<String>,
    owner: LocalPid,
    opts: PeerOpts,
) -> NifResult<(Atom, ResourceArc<PeerRes>)> {
    if opts.max_batch_count == 0 || opts.max_batch_bytes == 0 || opts.max_queue_bytes == 0 {
        return Err(rustler::Error::BadArg);
    }
    // After a restart of distribution every peer is opened again before
    // anything is pushed to it: local pids encode anew (encode::EPOCH).
    encode::new_epoch();
    let config = PeerConfig {
        node,
        cookie,
        receivers,
        shards: opts.shards,
        caps: BatchCaps {
            max_count: opts.max_batch_count,
            max_bytes: opts.max_batch_bytes,
        },
        max_queue_bytes: opts.max_queue_bytes,
        stall_timeout: (opts.stall_timeout > 0).then(|| Duration::from_millis(opts.stall_timeout)),
        backoff_min: Duration::from_millis(opts.backoff_min.max(1)),
        backoff_max: Duration::from_millis(opts.backoff_max.max(opts.backoff_min).max(1)),
        gather: opts.gather,
        lulls: opts.lulls,
        flusher: opts.flusher,
    };
    let peer = Peer::open(
        runtime().handle(),
        &cnode.ids,
        config,
        Arc::new(Events { owner }),
    )
    .map_err(|e| rustler::Error::Term(Box::new(e.to_string())))?;
    Ok((
        atoms::ok(),
        ResourceArc::new(PeerRes {
            peer,
            flusher: Default::default(),
        }),
    ))
}

/// The shard of the calling process: a stable hash of its pid.
fn caller_shard(env: Env<'_>) -> usize {
    // A local pid is an immediate: its term word names the process for its
    // whole life, which is all per-caller order needs. Mixed here (the
    // finaliser of splitmix64: processes spawned one after the other get
    // unrelated shards; a single multiply gave them runs of the same
    // link), not by `enif_hash`, a call into the VM on every push.
    let mut x = encode::word(env.pid().encode(env).as_c_arg());
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) as usize
}

/// Encodes `{send, To, Msg}` once and queues it on the caller's shard.
/// Returns `ok`, `{full, Size}` (nothing queued: see `wait_room/3`),
/// `closed`, or `large` (nothing queued: the encoding passed
/// [`encode::INLINE_MAX`]; the caller pushes it with `push_iovec/3`).
/// `urgent`: see [`ecall_dist::shard::Element::urgent`].
#[rustler::nif]
fn send<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    to: Term<'a>,
    msg: Term<'a>,
    urgent: bool,
) -> Term<'a> {
    let shard = caller_shard(env);
    let req = [atoms::send().to_term(env), to, msg];
    encode::tuple_with(env, &req, encode::INLINE_MAX, |e| {
        push_encoded(env, &peer, shard, &e, None, urgent)
    })
}

/// Queues any request term (`{send, ...}`, `{cast, ...}`, `{call, ...}`)
/// on the caller's shard; same results as `send/4`. `room` is `false`, or
/// the room `wait_room/3` set aside for this caller (used up by a push
/// that queues; kept by one that answers `large`).
#[rustler::nif(name = "push")]
fn push_request<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    req: Term<'a>,
    room: Term<'a>,
    urgent: bool,
) -> Term<'a> {
    let shard = caller_shard(env);
    encode::term_with(env, req, encode::INLINE_MAX, |e| {
        push_encoded(env, &peer, shard, &e, Some(room), urgent)
    })
}

/// Queues a large request encoded by `erlang:term_to_iovec/1` (big
/// binaries referenced, not copied) as a batch of its own. Runs on a
/// dirty scheduler: copying megabytes there holds no normal scheduler.
/// Same results as `send/3`.
#[rustler::nif(schedule = "DirtyCpu")]
fn push_iovec<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    iovec: Vec<Binary<'a>>,
    room: Term<'a>,
) -> NifResult<Term<'a>> {
    let mut parts: Vec<&[u8]> = iovec
        .iter()
        .map(|b| b.as_slice())
        .filter(|p| !p.is_empty())
        .collect();
    let Some(first) = parts.first_mut() else {
        return Err(rustler::Error::BadArg);
    };
    let body = ecall_dist::etf::element_body(first).ok_or(rustler::Error::BadArg)?;
    let len: usize = body.len() + parts[1..].iter().map(|p| p.len()).sum::<usize>();
    parts[0] = body;
    let pushed = peer
        .peer
        .push_alone(caller_shard(env), &parts, reserved(room, &peer.peer));
    Ok(answer(env, &peer, pushed, len))
}

/// How a push encodes `term`: `{Bytes, Text, Refs}` (the size, whether an
/// atom stays text, atoms written as id references), or `large` if a push
/// would give it to `term_to_iovec`. For tests and the benchmark's timing
/// of the encode alone.
#[rustler::nif]
fn encoded_size<'a>(env: Env<'a>, term: Term<'a>) -> Term<'a> {
    encode::term_with(env, term, encode::INLINE_MAX, |e| {
        if e.large {
            atoms::large().encode(env)
        } else {
            (e.bytes.len(), e.text, e.refs).encode(env)
        }
    })
}

/// The link (0-based) that carries the calling process's requests.
#[rustler::nif]
fn caller_link(env: Env<'_>, peer: ResourceArc<PeerRes>) -> usize {
    peer.peer.link_of_shard(caller_shard(env))
}

/// Queues encoded element `e` on `shard` and answers as [`answer`] does,
/// or `large` (nothing queued: the encode gave up, the caller goes by
/// `term_to_iovec`, and `room` is left for that push).
fn push_encoded<'a>(
    env: Env<'a>,
    peer: &PeerRes,
    shard: usize,
    e: &encode::Encoded<'_>,
    room: Option<Term<'a>>,
    urgent: bool,
) -> Term<'a> {
    if e.large {
        return atoms::large().encode(env);
    }
    let reserved = room.map_or(0, |r| reserved(r, &peer.peer));
    answer(
        env,
        peer,
        peer.peer.push_element(shard, e.element(urgent), reserved),
        e.bytes.len(),
    )
}

/// What a push of `size` bytes answers: `ok`, `{full, Size}` (nothing
/// queued: see `wait_room/3`) or `closed`. A push queued behind a sleeping
/// writer that asks for a flush (`Push::Flush`) sends `{ecall_flush, K}`
/// to the peer's flusher, which calls `flush/2`; it runs after the
/// processes already waiting to run, whose pushes go in the same write.
fn answer<'a>(env: Env<'a>, peer: &PeerRes, pushed: Push, size: usize) -> Term<'a> {
    match pushed {
        Push::Queued => atoms::ok().encode(env),
        Push::Flush(k) => {
            let sent = peer
                .flusher
                .get()
                .is_some_and(|f| env.send(f, (atoms::ecall_flush(), k)).is_ok());
            if !sent {
                // No flusher (not set yet, or gone): the writer writes it.
                peer.peer.wake_writer(k);
            }
            atoms::ok().encode(env)
        }
        Push::Full => (atoms::full(), size).encode(env),
        Push::Closed => atoms::closed().encode(env),
    }
}

/// Sets the peer's flusher (once; `badarg` the second time): the process
/// that calls `flush/2` for each `{ecall_flush, K}` it is sent.
#[rustler::nif]
fn peer_flusher(peer: ResourceArc<PeerRes>, pid: LocalPid) -> NifResult<Atom> {
    peer.flusher
        .set(pid)
        .map(|()| atoms::ok())
        .map_err(|_| rustler::Error::BadArg)
}

/// Writes what link `K` holds from the calling process, as asked by
/// `{ecall_flush, K}` (see `answer`): `true` if it should be called again
/// (more was pushed meanwhile: the flusher sends itself the message again,
/// so that what is ready to run goes first).
#[rustler::nif]
fn flush(peer: ResourceArc<PeerRes>, k: usize) -> bool {
    peer.peer.flush(k)
}

/// `term` in external format as a push encodes it, its id references
/// written back as text (for tests and the benchmark: `binary_to_term/1`
/// of it must give `term` back).
#[rustler::nif]
fn encode<'a>(env: Env<'a>, term: Term<'a>) -> NifResult<Binary<'a>> {
    encode::term_with(env, term, usize::MAX, |e| {
        let mut bytes = Vec::with_capacity(e.bytes.len() + 8);
        bytes.push(131);
        if e.refs == 0 {
            bytes.extend_from_slice(e.bytes);
        } else if !ecall_dist::atom_cache::expand_term(e.bytes, &mut bytes) {
            return Err(rustler::Error::BadArg);
        }
        let mut bin = rustler::NewBinary::new(env, bytes.len());
        bin.as_mut_slice().copy_from_slice(&bytes);
        Ok(bin.into())
    })
}

/// After `{full, Size}`: sets `Size` bytes of the budget aside for the
/// caller. Returns `{retry, Room}` if that could be done now, else `wait`,
/// and later sends `{ecall_room, Ref, Room}`, or `{ecall_room, Ref, false}`
/// if the peer closed first. `Room` goes to the caller's next push.
#[rustler::nif]
fn wait_room<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    size: usize,
    reference: Term<'a>,
) -> Term<'a> {
    let caller = env.pid();
    let mut owned = OwnedEnv::new();
    let saved = owned.save(reference);
    let weak = Arc::downgrade(&peer.peer);
    let room_of = move || RoomRes {
        peer: weak,
        bytes: std::sync::atomic::AtomicUsize::new(size),
    };
    let room_now = room_of.clone();
    let wake = Box::new(move |room: bool| {
        let send = move || {
            // Made here, not before: a room exists only once it is set
            // aside. If the caller is gone the message is not sent, the
            // term dies with the env, and the room goes back.
            let _ = owned.send_and_clear(&caller, |env| {
                let room = match room {
                    true => ResourceArc::new(room_of()).encode(env),
                    false => false.encode(env),
                };
                (atoms::ecall_room(), saved.load(env), room).encode(env)
            });
        };
        // Room is found by link writers (runtime threads: send now, which
        // keeps the wake-ups in order). A close can run on a scheduler
        // (peer_close/1, or the destructor during GC), where an OwnedEnv
        // cannot send: hand it to the runtime; order does not matter then.
        if rustler::thread::is_scheduler_thread() {
            runtime().spawn(async move { send() });
        } else {
            send();
        }
    });
    if peer.peer.wait_room(size, wake) {
        atoms::wait().encode(env)
    } else {
        (atoms::retry(), ResourceArc::new(room_now())).encode(env)
    }
}

/// Closes the peer: links stop, queued requests are dropped and counted.
#[rustler::nif]
fn peer_close(peer: ResourceArc<PeerRes>) -> Atom {
    peer.peer.close();
    atoms::ok()
}

/// Counts a request dropped by the overflow policy (`drop`, or `error` for
/// sends).
#[rustler::nif]
fn overflow_drop(peer: ResourceArc<PeerRes>) -> Atom {
    peer.peer.note_overflow_drop();
    atoms::ok()
}

fn map_of<'a>(env: Env<'a>, pairs: &[(Atom, u64)]) -> NifResult<Term<'a>> {
    let keys: Vec<Term> = pairs.iter().map(|(k, _)| k.encode(env)).collect();
    let vals: Vec<Term> = pairs.iter().map(|(_, v)| v.encode(env)).collect();
    Term::map_from_term_arrays(env, &keys, &vals)
}

/// Counters of a peer, as a map: totals, and `per_link`, one map per link.
#[rustler::nif]
fn peer_stats<'a>(env: Env<'a>, peer: ResourceArc<PeerRes>) -> NifResult<Term<'a>> {
    use ecall_dist::link::LinkStats;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let p = &peer.peer;
    let s = &p.stats;
    let links: Vec<&LinkStats> = (0..p.link_count())
        .filter_map(|k| p.link_stats(k))
        .collect();
    // The counters every link keeps; a peer's total is their sum.
    type Counter = fn(&LinkStats) -> &AtomicU64;
    let counters: [(Atom, Counter); 22] = [
        (atoms::batches(), |l| &l.batches),
        (atoms::requests(), |l| &l.requests),
        (atoms::bytes(), |l| &l.bytes),
        (atoms::writes(), |l| &l.writes),
        (atoms::dropped(), |l| &l.dropped),
        (atoms::unconfirmed(), |l| &l.unconfirmed),
        (atoms::connects(), |l| &l.connects),
        (atoms::disconnects(), |l| &l.disconnects),
        (atoms::stalls(), |l| &l.stalls),
        (atoms::fragmented(), |l| &l.fragmented),
        (atoms::lone(), |l| &l.lone),
        (atoms::lone_partial(), |l| &l.lone_partial),
        (atoms::gathers(), |l| &l.gathers),
        (atoms::lull_trials(), |l| &l.lull_trials),
        (atoms::lulls(), |l| &l.lulls),
        (atoms::flushes(), |l| &l.flushes),
        (atoms::flush_handoffs(), |l| &l.flush_handoffs),
        (atoms::urgent(), |l| &l.urgent),
        (atoms::inbound_frames(), |l| &l.inbound.frames),
        (atoms::inbound_answered(), |l| &l.inbound.answered),
        (atoms::inbound_ignored(), |l| &l.inbound.ignored),
        (atoms::inbound_malformed(), |l| &l.inbound.malformed),
    ];
    let per_link: Vec<Term> = links
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let mut pairs: Vec<(Atom, u64)> = counters
                .iter()
                .map(|(k, f)| (*k, f(l).load(Relaxed)))
                .collect();
            pairs.push((atoms::up(), u64::from(l.up.load(Relaxed))));
            // Numbered from 1, as in logs, telemetry and the identities'
            // names (`<node>_ecall_<link>`).
            pairs.push((atoms::link(), k as u64 + 1));
            map_of(env, &pairs)
        })
        .collect::<NifResult<_>>()?;
    let mut totals: Vec<(Atom, u64)> = counters
        .iter()
        .map(|(k, f)| (*k, links.iter().map(|l| f(l).load(Relaxed)).sum()))
        .collect();
    totals.extend([
        // Queued when the whole peer closed: no link's doing.
        (atoms::closed_drops(), s.dropped.load(Relaxed)),
        (atoms::pushed(), s.pushed.load(Relaxed)),
        (atoms::full(), s.full.load(Relaxed)),
        (atoms::overflow_waits(), s.waits.load(Relaxed)),
        (atoms::wakes(), s.wakes.load(Relaxed)),
        (atoms::overflow_drops(), s.overflow_drops.load(Relaxed)),
        (atoms::cached_atoms(), s.cached_atoms.load(Relaxed)),
        (atoms::queued_bytes(), p.queued_bytes() as u64),
        (atoms::links_up(), s.links_up.load(Relaxed) as u64),
        (atoms::links(), p.link_count() as u64),
        (atoms::shards(), p.shard_count() as u64),
    ]);
    map_of(env, &totals)?.map_put(atoms::per_link().encode(env), per_link.encode(env))
}

/// Sends Rust `tracing` events up to `max` (1 error .. 5 trace; 0 stops)
/// to `pid` as `{ecall_log, Level, Target, Text}`.
#[rustler::nif]
fn log_target(pid: LocalPid, max: u8) -> Atom {
    log::set_target(Some(pid), max);
    atoms::ok()
}

/// Stops forwarding `tracing` events.
#[rustler::nif]
fn log_off() -> Atom {
    log::set_target(None, 0);
    atoms::ok()
}

fn load(_env: Env<'_>, _info: Term<'_>) -> bool {
    log::install();
    true
}

rustler::init!("ecall_nif", load = load);
