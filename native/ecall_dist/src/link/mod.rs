//! Links: one TCP connection per C-node identity to a [peer](crate::peer),
//! carrying the batches of that link's shards.
//!
//! A link is a task that lives as long as its peer. It connects, writes
//! until the connection ends, tells its owner, waits, and connects again.
//! Its owner hears about every change through [`LinkEvents`]; its counters
//! are in [`LinkStats`].
//!
//! # Connect
//!
//! An attempt is the epmd lookup, the TCP connect and the distribution
//! handshake under the link's identity, all within the identity's handshake
//! deadline. The first connection records the peer's creation. A later
//! connection to a different creation means the peer node restarted under
//! the same name: it has none of our receivers yet, so the link stops there
//! for good (reason "restarted") and leaves the decision to its owner. If
//! the peer still holds our previous connection, the owner is told
//! ([`LinkEvents::alive`]) so that it can ask the peer to drop it, and the
//! attempt counts as failed.
//!
//! # Write
//!
//! Once connected, a reader task reads what the peer sends (ticks, `is_auth`
//! calls: see [`crate::inbound`]) and hands answers to the writer. The writer
//! takes one batch from each of its shards per pass and writes them with one
//! vectored write, the atom cache applied if the connection negotiated it.
//! A single message larger than [`FRAGMENT`](crate::fragment::FRAGMENT) goes
//! out one fragment per pass, so that other shards are not held up behind
//! it. When nothing is queued the writer sleeps; a push wakes it only then
//! (the sleeping-writer protocol is written down at `may_sleep` in
//! `link/writer.rs`).
//!
//! # Tick
//!
//! The writer writes at least once per tick interval (an empty frame when
//! idle) so that the peer keeps the connection.
//!
//! # Stall reap
//!
//! Every socket write has a deadline (`stall_timeout`) per bounded piece
//! ([`STALL_PIECE`](crate::io::STALL_PIECE)); a write that does not make
//! that much progress in time reaps the link: the socket is closed, what
//! the link's shards hold is dropped and counted, its bytes go back to the
//! budget (waking callers waiting for room), and the link reconnects.
//!
//! # Reconnect
//!
//! When a connection ends or an attempt fails, the owner is told
//! ([`LinkEvents::down`]) and the link tries again after a backoff that
//! starts at `backoff_min` and doubles up to `backoff_max`; a successful
//! connection resets it. What the shards hold stays queued meanwhile
//! (bounded by the byte budget) and goes out once the link is back. A batch
//! that was being written when the socket died is lost, as it would be with
//! native distribution, and counted in `dropped`.
//!
//! # Shutdown
//!
//! [`Peer::close`](crate::Peer::close) cancels every link: a connected
//! writer stops before its next pass (a write under way ends first, or
//! misses its deadline) and shuts its socket down, a link waiting for a
//! connection or a backoff stops at once, and no further event is
//! reported. During a backoff the link task holds its peer only weakly, so
//! a peer that nobody else holds is dropped then, which closes it.

use crate::inbound::InboundStats;
use std::sync::atomic::{AtomicBool, AtomicU64};
use tokio::sync::Notify;

mod task;
mod writer;

pub(crate) use task::link_task;

/// What a link reports to its owner. Called from runtime threads.
pub trait LinkEvents: Send + Sync + 'static {
    /// Link `link` is connected.
    fn up(&self, link: usize);
    /// Link `link` lost its connection, or failed to make one.
    fn down(&self, link: usize, reason: &str);
    /// The peer still holds a connection under link `link`'s node name.
    fn alive(&self, link: usize, node: &str);
}

/// Counters of one link (monotonic, but `up`).
#[derive(Debug, Default)]
pub struct LinkStats {
    /// Batches written.
    pub batches: AtomicU64,
    /// Requests written (sum of batch sizes).
    pub requests: AtomicU64,
    /// Bytes written to the socket, frames and ticks.
    pub bytes: AtomicU64,
    /// Socket writes (one vectored write may carry several batches).
    pub writes: AtomicU64,
    /// Requests dropped by this link: lost in a write that failed, or
    /// queued when the link was reaped as stalled.
    pub dropped: AtomicU64,
    /// Connections made (the first one included).
    pub connects: AtomicU64,
    /// Connections lost or failed.
    pub disconnects: AtomicU64,
    /// Reaps: writes that missed their deadline.
    pub stalls: AtomicU64,
    /// Messages sent in fragments.
    pub fragmented: AtomicU64,
    /// Gauge: connected now.
    pub up: AtomicBool,
    /// What the peer sent us on this link (ticks aside).
    pub inbound: InboundStats,
}

/// What the push path and a link's writer share.
#[derive(Debug, Default)]
pub(crate) struct LinkShared {
    /// The writer found nothing to do and waits for `notify`.
    pub(crate) sleeping: AtomicBool,
    /// Wakes a sleeping writer.
    pub(crate) notify: Notify,
    /// The link's counters.
    pub(crate) stats: LinkStats,
}

/// Why a connected link ended.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) why: String,
    /// A write missed its deadline: the peer is not draining.
    pub(crate) stalled: bool,
}

impl From<String> for Ended {
    fn from(why: String) -> Self {
        Ended {
            why,
            stalled: false,
        }
    }
}

impl From<&str> for Ended {
    fn from(why: &str) -> Self {
        why.to_string().into()
    }
}
