//! A peer's life: `peer_open/6`, `peer_drain/1` and `peer_close/1`, its flusher
//! (`peer_flusher/2`, `flush/2`), and waiting for room in its byte budget
//! (`wait_room/3`, which hands out a [`RoomRes`]).

use crate::events::Events;
use crate::runtime::runtime;
use crate::{atoms, encode, CNode, PeerRes, RoomRes};
use ecall_dist::{BatchCaps, Peer, PeerConfig};
use rustler::env::OwnedEnv;
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, ResourceArc, Term};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

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
}

/// Opens the shards and links towards `node`; link events go to `owner` as
/// `{ecall_link, Index, up | {down, Reason, Unconfirmed} | {alive, OurNode}
/// | stopped}` (Index 0-based; Reason: see `events::down_reason`).
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
    // anything is pushed to it: local pids encode anew (see
    // `encode::new_epoch`).
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
        // A flush on a scheduler, by the connection's flusher process
        // (ecall_transport_nif), for pushes that find a writer asleep.
        flusher: true,
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

/// Drains the peer: pushes are refused (`closed`), each link writes what
/// its shards hold and then stops (`{ecall_link, K, stopped}`).
#[rustler::nif]
fn peer_drain(peer: ResourceArc<PeerRes>) -> Atom {
    peer.peer.drain();
    atoms::ok()
}

/// Closes the peer: links stop, queued requests are dropped and counted.
#[rustler::nif]
fn peer_close(peer: ResourceArc<PeerRes>) -> Atom {
    peer.peer.close();
    atoms::ok()
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
/// `{ecall_flush, K}` (see `push::answer`): `true` if it should be called again
/// (more was pushed meanwhile: the flusher sends itself the message again,
/// so that what is ready to run goes first).
#[rustler::nif]
fn flush(peer: ResourceArc<PeerRes>, k: usize) -> bool {
    peer.peer.flush(k)
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
        bytes: AtomicUsize::new(size),
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
