//! The ecall C-node: the part of ecall that speaks Erlang distribution.
//!
//! It has no BEAM dependency, so it is tested against a real `erl` on its
//! own. The modules, in the order a request meets them:
//!
//! ```text
//!  caller (the NIF, on a scheduler)
//!    │ Peer::push               peer      the push path and its wake rules
//!    ▼
//!  link::PeerState ── shards ─  queue     batches built in place, one byte
//!    │  (one per remote node)             budget per peer (budget, shard)
//!    │ wake / lend the socket
//!    ▼
//!  link writer ───────────────  link      writer state, pacing, gathering,
//!    │  (one task per identity)           lone writes and flushes, connect
//!    │ frame_out, fragments
//!    ▼
//!  bytes on the wire ─────────  wire      term format, batch header, atom
//!    │                                    ids, connection atom cache, walker
//!    ▼
//!  socket ────────────────────  net       deadlined writes, TCP/TLS,
//!                                         inbound checks, epmd, handshake
//! ```
//!
//! Imports run one way, down: `peer` names `link`; `link` names `queue`,
//! `net` and `wire`; `queue` and `net` name only `wire`; `wire` names
//! nothing of the crate. (`queue` is read before `link` but sits below
//! it: the writer takes frames out of the queue, which knows nothing of
//! writers.) `error` and `sync` sit beside them all.
//!
//! 1. [`Identity::start`] registers a hidden node name such as
//!    `a_ecall_1@host` with the local epmd and accepts connections (it
//!    answers `is_auth`, so `net_adm:ping/1` works, and ticks).
//! 2. [`Peer::open`] makes the shards for one remote node, under one byte
//!    budget, and starts one link per identity; each link does the real
//!    handshake with the peer's cookie, then writes what its shards hold as
//!    `{batch, Requests}` messages to the peer's receiver pool,
//!    reconnecting with backoff when the connection ends.
//! 3. [`Peer::push`] is the hot path: one short critical section, no
//!    thread wake-up when the link's writer is already busy.
//! 4. The link's writer takes whole batches, rewrites them for the
//!    connection's atom cache, sends single large messages in fragments,
//!    and writes with a stall deadline. What the peer sends back is read
//!    and checked by the inbound reader (`net/inbound.rs`).
//!
//! Frames are spliced (`wire::etf::BatchHeader`): request bytes encoded
//! once by the caller are never decoded into terms here.
#![deny(missing_docs)]
#![deny(unsafe_code)]
#![warn(clippy::all)]

mod error;
mod link;
mod net;
mod peer;
mod queue;
mod sync;
pub mod wire;

pub use error::{posix_name, Error};
pub use link::{LinkDown, LinkEvents, LinkStats, PeerConfig, PeerStats};
pub use net::accept::Listen;
pub use net::identity::{Identity, IdentityConfig};
pub use net::inbound::InboundStats;
pub use net::tls::{TlsClient, TlsOptions};
pub use peer::{Peer, Push};
pub use queue::shard::{BatchCaps, Element};

/// Internals that the crate's own integration tests, fuzzers and
/// examples reach into. Not part of the API: nothing outside this
/// repository should name them.
#[doc(hidden)]
pub mod internals {
    pub use crate::link::tuning;
    pub use crate::net::connect::connect;
    pub use crate::net::{inbound, pending};
    pub use crate::queue::shard;
}
