//! NIF binding of ecall (Erlang module `ecall_nif`).
//!
//! Kept thin on purpose: argument decoding, the one encode of each request
//! on the caller's scheduler, and messages from runtime threads to Erlang
//! processes. Everything with a protocol in it lives in `ecall_dist`.
//!
//! Threads: one tokio runtime (`ecall-io` threads, [`runtime`]) carries
//! every link. NIF calls never block on it: starting an identity is
//! asynchronous and answers with a message; a push is one short critical
//! section.
//!
//! Panics: rustler turns a panic inside a NIF call into an Erlang exception;
//! runtime threads talk to Erlang only through `OwnedEnv` messages.
//!
//! Here: the resources and the library's `init!`. The NIFs, by topic:
//! [`identity`] (C-node identities), [`peer`] (a peer's life, its flusher,
//! waiting for room), [`push`] (the pushes, and the encode seen from
//! Erlang), [`calls`] (calls waiting for their replies), [`events`] (link
//! events, and the counters `peer_stats/1` reads), [`log`] (Rust logs to
//! `logger`). The encoder: [`encode`].
#![deny(missing_docs)]
#![warn(clippy::all)]

use ecall_dist::{Identity, Peer};
use rustler::{Env, LocalPid, Resource, Term};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};

mod calls;
mod encode;
mod events;
mod identity;
mod log;
mod peer;
mod push;
mod runtime;

mod atoms {
    rustler::atoms! {
        ecall_log, name_taken,
        ok, error, send, send_many, full, closed, large, wait, retry, direct, reply, reply_external, whole, ecall_link, ecall_cnode, ecall_room,
        up, down, alive, badarg, badrpc, all,
        pushed, batches, requests, bytes, writes, dropped, connects, disconnects,
        stalls, unconfirmed, replayed, replayed_requests, acks, retained_bytes, cached_atoms, queued_bytes, links_up, overflow_waits, overflow_drops, per_link, link, fragmented, lone, lone_partial, gathers, flushes, flush_handoffs, ecall_flush, urgent, wakes, closed_drops, links, shards, accepted, refused,
        node, creation, port, inbound_frames, inbound_answered, inbound_ignored, inbound_malformed,
        handshakes_timed_out, handshakes_shed_idle, handshakes_shed_stalled, accept_errors, stopped,
        // Link-down reasons (see `events::down_reason`).
        stalled, restarted, peer_closed, not_registered, handshake_timeout,
        read, write, connect, malformed, epmd, handshake, other,
    }
}

/// The registered C-node identities of this node.
pub struct CNode {
    ids: Vec<Arc<Identity>>,
}

#[rustler::resource_impl]
impl Resource for CNode {
    /// The identities close with their owner (ecall_cnode, which goes when
    /// the application stops): a handshake under way must not keep one,
    /// and its name in epmd, until its deadline.
    fn destructor(self, _env: Env<'_>) {
        for id in &self.ids {
            id.close();
        }
    }
}

/// One peer's shards and links. Closing happens when the owner asks or when
/// the last reference is garbage-collected.
pub struct PeerRes {
    peer: Arc<Peer>,
    /// The process that flushes for pushes answered `Push::Flush` (see
    /// `peer_flusher/2`); until it is set, such a push wakes the writer.
    flusher: OnceLock<LocalPid>,
}

#[rustler::resource_impl]
impl Resource for PeerRes {
    fn destructor(self, _env: Env<'_>) {
        self.peer.close();
    }
}

/// Room in a peer's byte budget set aside for one caller that waited for
/// it (`wait_room/3`): handed to the caller in `{retry, Room}` or
/// `{ecall_room, Ref, Room}`, and used by its next push (`push/4`,
/// `push_encoded/4`). If the caller never pushes (it died, or was killed
/// while the message was on its way), the room goes back when the term is
/// garbage: without this, the room would be lost for good, or (when it
/// was only counted, not set aside) others could take it meanwhile.
pub struct RoomRes {
    /// Weak: a room must not keep a closed peer's memory alive.
    peer: Weak<Peer>,
    /// Bytes still set aside (0 once a push took them).
    bytes: AtomicUsize,
}

#[rustler::resource_impl]
impl Resource for RoomRes {}

impl RoomRes {
    /// The bytes set aside, now the caller's push's (0 the second time).
    fn take(&self) -> usize {
        self.bytes.swap(0, Ordering::AcqRel)
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

/// A big message encoded by `encode_large/1` on a dirty scheduler, in
/// memory of the NIF's, not of the caller's process: a binary of the
/// caller's (as `term_to_iovec/1` would make) counts against its heap's binary
/// quota, and a process that holds a big heap then pays a full collection
/// for it. Taken by the push that queues it (kept by one that answers
/// `full`, for its retry).
pub struct EncodedRes {
    bytes: std::sync::Mutex<Option<rustler::OwnedBinary>>,
}

#[rustler::resource_impl]
impl Resource for EncodedRes {}

fn load(_env: Env<'_>, _info: Term<'_>) -> bool {
    log::install();
    true
}

rustler::init!("ecall_nif", load = load);
