//! The pushes: one request encoded once on the caller's scheduler
//! ([`encode`]) and queued on the caller's shard (`send/4`, `push/4`), or
//! encoded and queued on a dirty scheduler (`encode_large/1` and
//! `push_encoded/4`, which also sends a big message straight to its
//! target); a list of targets in one call into the VM (`push_many/4`, or
//! `push_many_dirty/4` for a long one); what a push answers; and the
//! encode as Erlang sees it (`encode/1`, `encoded_size/1`, for tests and
//! the benchmark).

use crate::{atoms, encode, EncodedRes, PeerRes, RoomRes};
use ecall_dist::wire::etf;
use ecall_dist::{Peer, Push};
use rustler::{Atom, Binary, Encoder, Env, NifResult, OwnedBinary, ResourceArc, Term};
use std::sync::Arc;

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

/// The shard of the calling process: a stable hash of its pid.
pub(crate) fn caller_shard(env: Env<'_>) -> usize {
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
/// [`encode::INLINE_MAX`]; the caller encodes it with `encode_large/1`).
/// `urgent`: see [`ecall_dist::Element::urgent`].
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
        queue_element(env, &peer, shard, &e, None, urgent)
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
        queue_element(env, &peer, shard, &e, Some(room), urgent)
    })
}

/// Encodes `{send_many, Dests, Msg}` and queues it on the caller's shard:
/// `Dests`, a list of pids, aliases and names of the peer, through one
/// `enif_term_to_binary` ([`encode::dests_with`]). On the caller's
/// scheduler, for at most [`MANY_NORMAL`] targets and a message whose
/// encoding stays within [`encode::INLINE_MAX`]; else it answers `large`
/// (nothing queued) and the caller pushes it with `push_many_dirty/4`.
/// Otherwise the same results as `push/4`.
#[rustler::nif]
fn push_many<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    dests: Term<'a>,
    msg: Term<'a>,
    room: Term<'a>,
) -> Term<'a> {
    let Some(n) = encode::cells_upto(dests, MANY_NORMAL) else {
        return atoms::large().encode(env);
    };
    let pushed = many(env, &peer, dests, msg, room, encode::INLINE_MAX);
    // The list's share of a 1 ms timeslice (see MANY_NORMAL).
    let percent = i32::try_from(n / 100).unwrap_or(100).clamp(1, 100);
    rustler::schedule::consume_timeslice(env, percent);
    pushed
}

/// `push_many/4` on a dirty scheduler, for any number of targets and a
/// message of any size: never `large`.
#[rustler::nif(schedule = "DirtyCpu")]
fn push_many_dirty<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    dests: Term<'a>,
    msg: Term<'a>,
    room: Term<'a>,
) -> Term<'a> {
    many(env, &peer, dests, msg, room, usize::MAX)
}

/// The most targets `push_many/4` encodes on a normal scheduler: a list
/// this long holds the scheduler for well within its 1 ms timeslice,
/// whose share the call reports at 0.1 µs a target. Longer lists go on a
/// dirty scheduler, whose round trip is dear: every node of a fan-out
/// pays it (doc/performance.md, "Fan-out", has the figures).
const MANY_NORMAL: usize = 4096;

fn many<'a>(
    env: Env<'a>,
    peer: &PeerRes,
    dests: Term<'a>,
    msg: Term<'a>,
    room: Term<'a>,
    limit: usize,
) -> Term<'a> {
    let shard = caller_shard(env);
    let tag = atoms::send_many().to_term(env);
    encode::dests_with(env, tag, dests, msg, limit, |e| {
        queue_element(env, peer, shard, &e, Some(room), false)
    })
}

/// Encodes a big message (`term_to_binary`, on a dirty scheduler) into
/// memory of the NIF's: `{Size, Encoded}`, for `push_encoded/4`. Not
/// `term_to_iovec/1` in the caller: that makes a binary of the caller's,
/// which counts against its heap's binary quota, and a caller holding a
/// big heap then pays a full collection of it (doc/performance.md, "Big
/// terms"); `!` makes no binary of the caller's either.
#[rustler::nif(schedule = "DirtyCpu")]
fn encode_large<'a>(env: Env<'a>, msg: Term<'a>) -> Term<'a> {
    let bin = msg.to_binary();
    let size = bin.len();
    let res = ResourceArc::new(EncodedRes {
        bytes: std::sync::Mutex::new(Some(bin)),
    });
    (size, res).encode(env)
}

/// Queues a message `encode_large/1` encoded, as `target` says:
/// `{direct, Dest}` straight to `Dest` on the peer (a pid, a registered
/// name or an alias), which decodes it in that process, as a message sent
/// with `!` (`Peer::push_direct`); or in a request the peer's receiver
/// replays, the NIF writing its front ([`encode::front`]): `{send, Dest}`
/// (`{send, Dest, Msg}`), `{reply, Id}` (`{reply, Id, Reply}`),
/// `{reply_external, Id}` (`{reply, Id, {external, Bytes}}`, the encoding
/// as the bytes of a binary), or `whole` (the encoding is the whole
/// request). Runs on a dirty scheduler: copying megabytes there holds no
/// normal scheduler. Same results as `send/4`, but never `large`; the
/// encoded message is freed by a push that queues it or finds the peer
/// closed, and kept by one that answers `full` (the caller pushes it
/// again with the room it waits for). `badarg` for a message pushed
/// already or a bad target (a `Dest` that is not a pid, an atom or an
/// alias for `direct`, an `Id` that is not a non-negative integer of 64
/// bits).
#[rustler::nif(schedule = "DirtyCpu")]
fn push_encoded<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    target: Term<'a>,
    encoded: ResourceArc<EncodedRes>,
    room: Term<'a>,
) -> NifResult<Term<'a>> {
    let target = Target::decode(target)?;
    let mut held = encoded.bytes.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = held.as_ref() else {
        return Err(rustler::Error::BadArg);
    };
    let bytes = bin.as_slice();
    let mut front = Vec::new();
    let parts = target.parts(bytes, &mut front)?;
    let (shard, reserved) = (caller_shard(env), reserved(room, &peer.peer));
    let (pushed, len) = match parts {
        Parts::Direct(to) => {
            let pushed = peer
                .peer
                .push_direct(shard, to, &[bytes], reserved)
                .ok_or(rustler::Error::BadArg)?;
            (pushed, bytes.len())
        }
        Parts::Relay(rest) => {
            let parts = [front.as_slice(), rest];
            let len = front.len() + rest.len();
            (peer.peer.push_alone(shard, &parts, reserved), len)
        }
    };
    if pushed != Push::Full {
        *held = None;
    }
    Ok(answer(env, &peer, pushed, len))
}

/// What `push_encoded/4` would queue for `target`, as one external term
/// (version byte first): the request, or for `{direct, Dest}` the
/// destination the frame is addressed to. The encoding is kept. For tests:
/// the bytes are the same as `term_to_binary/1` of the request gives.
#[rustler::nif(schedule = "DirtyCpu")]
fn encoded_request<'a>(
    env: Env<'a>,
    target: Term<'a>,
    encoded: ResourceArc<EncodedRes>,
) -> NifResult<Binary<'a>> {
    let target = Target::decode(target)?;
    let held = encoded.bytes.lock().unwrap_or_else(|p| p.into_inner());
    let bin = held.as_ref().ok_or(rustler::Error::BadArg)?;
    let mut front = Vec::new();
    let rest = match target.parts(bin.as_slice(), &mut front)? {
        Parts::Direct(to) => to,
        Parts::Relay(rest) => rest,
    };
    let mut out = rustler::NewBinary::new(env, 1 + front.len() + rest.len());
    let s = out.as_mut_slice();
    s[0] = ecall_dist::wire::etf::VERSION;
    s[1..=front.len()].copy_from_slice(&front);
    s[1 + front.len()..].copy_from_slice(rest);
    Ok(out.into())
}

/// The target of `push_encoded/4`, decoded; a destination as its
/// `term_to_binary`, version byte included.
enum Target {
    Direct(OwnedBinary),
    Send(OwnedBinary),
    Reply(u64),
    ReplyExternal(u64),
    Whole,
}

/// What goes out for an encoding: straight to a destination (external
/// format without the version byte), or a request's front (written
/// apart) and then this much of the encoding.
enum Parts<'b> {
    Direct(&'b [u8]),
    Relay(&'b [u8]),
}

impl Target {
    /// `badarg` for anything but the forms `push_encoded/4` takes.
    fn decode(term: Term<'_>) -> NifResult<Target> {
        if term.decode::<Atom>().is_ok_and(|a| a == atoms::whole()) {
            return Ok(Target::Whole);
        }
        let (kind, arg): (Atom, Term<'_>) = term.decode()?;
        if kind == atoms::direct() {
            Ok(Target::Direct(arg.to_binary()))
        } else if kind == atoms::send() {
            Ok(Target::Send(arg.to_binary()))
        } else if kind == atoms::reply() {
            // Fails for a negative integer, one past 64 bits, or no
            // integer: what the front writes is a u64.
            Ok(Target::Reply(arg.decode()?))
        } else if kind == atoms::reply_external() {
            Ok(Target::ReplyExternal(arg.decode()?))
        } else {
            Err(rustler::Error::BadArg)
        }
    }

    /// The parts of `encoded` (a whole `term_to_binary` result) that go
    /// out, a request's front written to `front`. `badarg` for a
    /// destination `direct` cannot address, or an encoding that is not
    /// plain external format.
    fn parts<'b>(&'b self, encoded: &'b [u8], front: &mut Vec<u8>) -> NifResult<Parts<'b>> {
        use encode::front::{write, Request};
        let body =
            |b: &'b OwnedBinary| etf::element_body(b.as_slice()).ok_or(rustler::Error::BadArg);
        let request = match self {
            Target::Direct(to) => {
                let to = body(to)?;
                etf::direct_control(to).ok_or(rustler::Error::BadArg)?;
                return Ok(Parts::Direct(to));
            }
            Target::Send(dest) => Request::Send(body(dest)?),
            Target::Reply(id) => Request::Reply(*id),
            Target::ReplyExternal(id) => Request::ReplyExternal(*id),
            Target::Whole => Request::Whole,
        };
        write(request, encoded, front)
            .map(Parts::Relay)
            .ok_or(rustler::Error::BadArg)
    }
}

/// How a push encodes `term`: `{Bytes, Text, Refs}` (the size, whether an
/// atom stays text, atoms written as id references), or `large` if a push
/// would give it to `encode_large/1`. For tests and the benchmark's timing
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
/// `encode_large/1`, and `room` is left for that push).
fn queue_element<'a>(
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
        } else if !ecall_dist::wire::term_walk::expand_term(e.bytes, &mut bytes) {
            return Err(rustler::Error::BadArg);
        }
        let mut bin = rustler::NewBinary::new(env, bytes.len());
        bin.as_mut_slice().copy_from_slice(&bytes);
        Ok(bin.into())
    })
}

/// Counts a request dropped by the overflow policy (`drop`, or `error` for
/// sends).
#[rustler::nif]
fn overflow_drop(peer: ResourceArc<PeerRes>) -> Atom {
    peer.peer.note_overflow_drop();
    atoms::ok()
}
