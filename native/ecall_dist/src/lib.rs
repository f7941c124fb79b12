//! The ecall C-node: the part of ecall that speaks Erlang distribution.
//!
//! It has no BEAM dependency, so it can be tested against a real `erl` on
//! its own. The data path, from the NIF's point of view:
//!
//! 1. [`cnode::Identity::start`] registers a hidden node name such as
//!    `a_ecall_1@host` with the local epmd and accepts connections (it
//!    answers `is_auth`, so `net_adm:ping/1` works, and ticks).
//! 2. [`peer::Peer::open`] makes the lock-sharded queues ([`shard`]) for one
//!    remote node, under one byte budget, and starts one [`link`] per
//!    identity; each link does the real handshake with the peer's cookie,
//!    then writes what its shards hold as `{batch, Requests}` messages to
//!    the peer's receiver pool, reconnecting with backoff when the
//!    connection ends.
//! 3. [`peer::Peer::push`] is the hot path: one short critical section, no
//!    thread wake-up when the link's writer is already busy.
//! 4. The link's writer takes whole batches, rewrites them for the atom
//!    cache ([`atom_cache`]), sends single large messages in fragments
//!    ([`fragment`]), and writes with a stall deadline ([`io`]). What the
//!    peer sends back is read and checked by [`inbound`].
//!
//! Frames are spliced ([`etf::BatchHeader`]): request bytes encoded once by
//! the caller are never decoded into terms here. On links where the peer
//! accepts it, the writer replaces atoms by distribution atom cache
//! references in one pass over the bytes ([`atom_cache`]), which is what
//! keeps the receiving node from looking up every atom of every message.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::all)]

pub mod atom_cache;
pub mod atom_ids;
mod budget;
pub mod cnode;
pub mod etf;
pub mod fragment;
pub mod inbound;
pub mod io;
pub mod link;
pub mod peer;
pub mod shard;
pub mod stream;
mod sync;
pub mod word_cache;

pub use cnode::{Identity, IdentityConfig, Listen};
pub use link::{LinkDown, LinkEvents};
pub use peer::{Peer, PeerConfig, Push};
pub use shard::BatchCaps;
pub use stream::{TlsClient, TlsOptions};

/// Errors of the C-node.
#[derive(Debug)]
pub enum Error {
    /// A node name that is not `name@host`.
    BadName(String),
    /// A socket operation failed.
    Io(&'static str, std::io::Error),
    /// epmd refused or failed.
    Epmd(String),
    /// epmd refused to register this full node name: another node (or an
    /// earlier instance whose registration epmd has not yet dropped)
    /// holds it.
    NameTaken(String),
    /// The peer is not registered with its epmd.
    NotRegistered(String),
    /// The handshake failed.
    Handshake(String),
    /// The peer still holds a connection under our name.
    Alive,
    /// The peer node was restarted: the name answers, but it is a new
    /// incarnation, which knows nothing of this peer's receivers.
    Restarted,
    /// Inconsistent settings.
    Config(String),
}

impl Error {
    fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
        move |e| Error::Io(what, e)
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::BadName(s) => write!(f, "bad node name {s}"),
            Error::Io(what, e) => write!(f, "{what}: {e}"),
            Error::Epmd(s) => write!(f, "epmd: {s}"),
            Error::NameTaken(s) => write!(f, "epmd: the name {s} is taken by another node"),
            Error::NotRegistered(s) => write!(f, "{s} is not registered with epmd"),
            Error::Handshake(s) => write!(f, "handshake: {s}"),
            Error::Alive => write!(f, "the peer still holds a connection under our name"),
            Error::Restarted => write!(f, "the peer node restarted (new creation); link stopped"),
            Error::Config(s) => write!(f, "configuration: {s}"),
        }
    }
}

impl std::error::Error for Error {}
