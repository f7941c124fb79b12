//! Calls waiting for their replies (`call_wait/2`, `call_reply/2`,
//! `call_cancel/1`, `calls_fail/3`, `calls_waiting/1`).
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
//! handling when the reply arrived (doc/performance.md, "Ideas kept",
//! calls answered by number).
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
//! comes (the peer's function never returns) leaves its entry, until a
//! sweep (`calls/table.rs`, which holds the table and its tests).

mod table;

use crate::{atoms, PeerRes};
use rustler::{Atom, Encoder, Env, LocalPid, NifResult, OwnedBinary, ResourceArc, Term};
use std::sync::{Arc, LazyLock};
use table::Table;

struct Waiting {
    pid: LocalPid,
    /// The caller's reference, in external format.
    reference: OwnedBinary,
    /// The peer (its address) and the link the request went on.
    peer: usize,
    link: usize,
}

static TABLE: LazyLock<Table<Waiting>> = LazyLock::new(|| Table::new(table::random_start()));

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
    let waiting = Waiting {
        pid: env.pid(),
        reference: reference.to_binary(),
        peer: peer_key(&peer),
        link,
    };
    let id = TABLE.insert(waiting, |w| env.is_process_alive(w.pid));
    Ok((atoms::ok(), id).encode(env))
}

/// Gives up the call `Id` (its caller timed out, or its request could not
/// be queued): `true` if it was still waiting (no reply will reach the
/// caller), `false` if its reply was handed over already (it is on its way
/// to the caller, or in its mailbox).
#[rustler::nif]
fn call_cancel(id: u64) -> bool {
    TABLE.take(id).is_some()
}

/// On the caller's node, from a receiver: sends `{Ref, Reply}` to the
/// process waiting for call `Id`. `true`, or `false` when no call waits
/// under that id (it gave up or failed: the reply is dropped).
#[rustler::nif]
fn call_reply<'a>(env: Env<'a>, id: u64, reply: Term<'a>) -> bool {
    let Some(w) = TABLE.take(id) else {
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
    let taken = TABLE.take_all(|w| w.peer == key && (link.is_none() || link == Some(w.link)));
    Ok(taken.iter().filter(|w| deliver(env, w, msg)).count())
}

/// The calls still waiting on `peer` whose callers are alive (the entries
/// of callers that died are dropped here): a peer closed in order keeps
/// its calls until they are answered or the node goes down
/// (ecall_transport_nif), and this says when none is left.
#[rustler::nif(schedule = "DirtyCpu")]
fn calls_waiting(env: Env<'_>, peer: ResourceArc<PeerRes>) -> usize {
    let key = peer_key(&peer);
    TABLE.count_alive(|w| w.peer == key, |w| env.is_process_alive(w.pid))
}
