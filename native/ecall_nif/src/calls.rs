//! Calls waiting for their replies (`call_wait/2`, `call_reply/2`,
//! `call_cancel/1`, `calls_fail/3`).
//!
//! A call through the NIF transport goes out as `{call, From, Id, M, F, A}`:
//! `From` is this node and `Id` a number that stands for the waiting caller
//! here. The peer answers `{reply, Id, Reply}` to this node's receivers,
//! and the receiver hands it to `call_reply/2`, which sends `{Ref, Reply}`
//! to the caller. `Ref` is the caller's own `make_ref()`, which its receive
//! matches on (so that it skips the messages it already had).
//!
//! What this replaces, a monitor of the link's watcher with an alias per
//! call, cost the caller's node a monitor and a demonitor (two signals to
//! the watcher), an entry in the VM's table of aliases, a look-up there
//! for each copy of the alias the receiver decoded, and the alias's
//! handling when the reply arrived (`bench/run.sh profile 20000 call`).
//!
//! A call that gives up (`call_cancel/1`) or fails is taken out here
//! first: a reply that comes later finds nothing and is dropped, so no
//! stray reply reaches the caller. The calls of a link that goes down, or
//! of a peer that closes, fail at once (`calls_fail/3`): each caller gets
//! `{Ref, {badrpc, Reason}}`.
//!
//! Ids count up from a random start, so that a reply meant for an earlier
//! run of this node (one that restarted under the same name while a call
//! was out) never finds a waiting call here.
//!
//! Bounded: a call waits here until its reply, its cancel, or the failure
//! of its link. A caller that dies while waiting for a reply that never
//! comes (the peer's function never returns) leaves its entry; when a
//! shard has grown to twice its size at its last sweep, the entries of
//! dead callers are dropped.

use crate::{atoms, PeerRes};
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, OwnedBinary, ResourceArc, Term};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

/// Shards of the table, by id: callers on every scheduler register and
/// receivers take at once.
const SHARDS: usize = 64;

/// A shard is swept when it has grown past this, and then at twice its
/// size after each sweep.
const SWEEP_MIN: usize = 1024;

struct Waiting {
    pid: LocalPid,
    /// The caller's reference, in external format.
    reference: OwnedBinary,
    /// The peer (its address) and the link the request went on.
    peer: usize,
    link: usize,
}

#[derive(Default)]
struct Shard {
    calls: HashMap<u64, Waiting>,
    sweep_at: usize,
}

struct Table {
    shards: [Mutex<Shard>; SHARDS],
    next: AtomicU64,
}

static TABLE: LazyLock<Table> = LazyLock::new(|| Table {
    shards: std::array::from_fn(|_| Mutex::default()),
    next: AtomicU64::new(random_start()),
});

/// A start for the ids that a restarted node does not repeat: the clock's
/// nanoseconds mixed (the finaliser of splitmix64), in 62 bits.
fn random_start() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ u64::from(std::process::id()).rotate_left(32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) >> 2
}

fn shard(id: u64) -> MutexGuard<'static, Shard> {
    // Nothing here panics while holding the lock; a poisoned lock still
    // holds a consistent table.
    TABLE.shards[(id % SHARDS as u64) as usize]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn peer_key(peer: &PeerRes) -> usize {
    Arc::as_ptr(&peer.peer) as usize
}

/// Registers the calling process as waiting for a reply under `reference`
/// (its `make_ref()`), on the link that carries its requests to `peer`:
/// `{ok, Id}`, the id its request carries, or `closed` when that link is
/// not up (the caller then goes by erpc).
#[rustler::nif]
fn call_wait<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    reference: Term<'a>,
) -> NifResult<Term<'a>> {
    if reference.get_type() != rustler::TermType::Ref {
        return Err(rustler::Error::BadArg);
    }
    let link = peer.peer.link_of_shard(crate::push::caller_shard(env));
    if peer.peer.is_closed() || !peer.peer.link_up(link) {
        return Ok(atoms::closed().encode(env));
    }
    let id = TABLE.next.fetch_add(1, Ordering::Relaxed);
    let waiting = Waiting {
        pid: env.pid(),
        reference: reference.to_binary(),
        peer: peer_key(&peer),
        link,
    };
    let mut s = shard(id);
    s.calls.insert(id, waiting);
    if s.calls.len() > s.sweep_at.max(SWEEP_MIN) {
        s.calls.retain(|_, w| env.is_process_alive(w.pid));
        s.sweep_at = 2 * s.calls.len();
    }
    Ok((atoms::ok(), id).encode(env))
}

/// Gives up the call `Id` (its caller timed out, or its request could not
/// be queued): `true` if it was still waiting (no reply will reach the
/// caller), `false` if its reply was handed over already (it is on its way
/// to the caller, or in its mailbox).
#[rustler::nif]
fn call_cancel(id: u64) -> bool {
    shard(id).calls.remove(&id).is_some()
}

/// On the caller's node, from a receiver: sends `{Ref, Reply}` to the
/// process waiting for call `Id`. `true`, or `false` when no call waits
/// under that id (it gave up or failed: the reply is dropped).
#[rustler::nif]
fn call_reply<'a>(env: Env<'a>, id: u64, reply: Term<'a>) -> bool {
    let Some(w) = shard(id).calls.remove(&id) else {
        return false;
    };
    deliver(env, &w, reply)
}

/// Sends `{Ref, Msg}` to a waiting caller.
fn deliver<'a>(env: Env<'a>, w: &Waiting, msg: Term<'a>) -> bool {
    match env.binary_to_term(w.reference.as_slice()) {
        Some((reference, _)) => env.send(&w.pid, (reference, msg)).is_ok(),
        None => false,
    }
}

/// Fails the calls waiting on `peer`'s link `Link` (`all`: on any of its
/// links): each caller gets `{Ref, {badrpc, Reason}}`. The number failed.
/// On a dirty scheduler: a link may have many callers waiting.
#[rustler::nif(schedule = "DirtyCpu")]
fn calls_fail<'a>(
    env: Env<'a>,
    peer: ResourceArc<PeerRes>,
    link: Term<'a>,
    reason: Term<'a>,
) -> NifResult<usize> {
    let link: Option<usize> = if link.decode::<Atom>().is_ok_and(|a| a == atoms::all()) {
        None
    } else {
        Some(link.decode()?)
    };
    let key = peer_key(&peer);
    let msg = (atoms::badrpc(), reason).encode(env);
    let mut failed = 0;
    for s in &TABLE.shards {
        let taken: Vec<Waiting> = {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<u64> = s
                .calls
                .iter()
                .filter(|(_, w)| w.peer == key && (link.is_none() || link == Some(w.link)))
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| s.calls.remove(id)).collect()
        };
        failed += taken.iter().filter(|w| deliver(env, w, msg)).count();
    }
    Ok(failed)
}
