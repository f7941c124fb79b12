//! Links: one TCP connection per C-node identity to a peer,
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
//! for good ([`LinkDown::Restarted`]) and leaves the decision to its owner. If
//! the peer still holds our previous connection, the owner is told
//! ([`LinkEvents::alive`]) so that it can ask the peer to drop it, and the
//! attempt counts as failed.
//!
//! # Write
//!
//! Once connected, a reader task reads what the peer sends (ticks, `is_auth`
//! calls: see [`crate::net::inbound`]) and hands answers to the writer. The writer
//! takes one batch from each of its shards per pass and writes them with one
//! vectored write, the atom cache applied if the connection negotiated it
//! ([`frame_out`](crate::wire::frame::frame_out): a batch whose atoms the
//! encoder made id references goes out as it is, behind a header; others
//! are rewritten).
//! A single message larger than [`FRAGMENT`](crate::wire::fragment::FRAGMENT) goes
//! out one fragment per pass, so that other shards are not held up behind
//! it. When nothing is queued the writer sleeps; a push wakes it only then
//! (the sleeping-writer protocol: `link/protocol.rs`), or, if it is small, writes itself to the socket
//! without a thread hop (a lone write: `link/lent_side.rs`). With
//! [`PeerConfig::flusher`] a push that would
//! wake the writer asks for a *flush* instead (`Push::Flush`): the
//! caller has `Peer::flush` run soon on a thread of
//! its own (on the BEAM, by a process, after those already waiting to run,
//! whose pushes go in the same write), which writes what the link's shards
//! hold with one non-blocking `send`, or wakes the writer when the load is
//! its own (a full batch, [`GATHER_BYTES`] in a shard, TLS, a write's rest). The
//! writer stays asleep meanwhile; pushes wake nobody until the flush is
//! done. On a busy link (the
//! last pass wrote [`GATHER_AFTER`] requests or more, or a push woke the
//! writer within [`BUSY_SLEEP`] of its falling asleep) the writer gathers
//! instead: it waits until a shard holds [`GATHER_REQUESTS`] or
//! [`GATHER_BYTES`], or [`GATHER_WAIT`] has passed (`may_gather`), so that
//! batches are worth a write and the peer a message. An urgent request (its
//! caller waits for the answer before its next one: see
//! [`Element::urgent`](crate::queue::shard::Element::urgent)) ends that wait, or
//! keeps the writer from starting it: company would not come from such a
//! caller, and the wait would be added to each of its requests.
//!
//! # Tick
//!
//! The writer writes at least once per tick interval (an empty frame when
//! idle) so that the peer keeps the connection.
//!
//! # Stall reap
//!
//! Every socket write has a deadline (`stall_timeout`) per bounded piece
//! ([`STALL_PIECE`]); a write that does not make that much progress in time
//! reaps the link: the socket is closed and the link reconnects. So does a
//! link one of whose shards has waited `stall_timeout` for an
//! acknowledgement with none coming (a peer that takes the bytes and processes none: its
//! kernel buffers hold what the budget lets out). What its shards hold
//! waits, within the budget (callers wait for room under the overflow
//! policy).
//!
//! # Acknowledgements and resume
//!
//! Each shard numbers its batches; the peer's receiver processes each
//! number once, in order, and acknowledges the last one it processed now
//! and then (a message to `ecall_ack` on this link's node, read by the
//! reader: `net/inbound.rs`). A written batch stays in its shard, its
//! bytes in the budget, until acknowledged (`queue/shard.rs`).
//!
//! # Reconnect
//!
//! When a connection ends or an attempt fails, the owner is told
//! ([`LinkEvents::down`]) and the link tries again after a backoff that
//! starts at `backoff_min` and doubles up to `backoff_max`; a successful
//! connection resets it. What the shards hold stays queued meanwhile
//! (bounded by the byte budget); what was written and not acknowledged
//! goes back to the front of its shard, and the next connection writes it
//! again first, in order (counted in `replayed`). The receiver drops the
//! numbers it has seen. Nothing is written again on a live connection, nor
//! to a peer that restarted (a new creation: the link stops for good).
//!
//! # Shutdown
//!
//! `Peer::close` cancels every link: a connected
//! writer stops before its next pass (a write under way ends first, or
//! misses its deadline) and shuts its socket down, a link waiting for a
//! connection or a backoff stops at once, and no further event is
//! reported. During a backoff the link task holds its peer only weakly, so
//! a peer that nobody else holds is dropped then, which closes it.

use crate::error::Error;
use crate::net::inbound::{InboundStats, Malformed, ReadEnd};
use crate::net::stall_write::STALL_PIECE;
use crate::queue::shard::Backlog;
use protocol::Protocol;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};

mod backoff;
mod clock;
mod counted_write;
mod lent_side;
mod pacing;
mod peer_state;
pub(crate) mod protocol;
pub(crate) mod state;
mod task;
pub mod tuning;
mod writer;

pub(crate) use self::peer_state::PeerState;
pub use self::peer_state::{PeerConfig, PeerStats};
pub(crate) use lent_side::WriteSide;
pub use tuning::*;

pub(crate) use task::link_task;

/// What a link reports to its owner. Called from runtime threads.
pub trait LinkEvents: Send + Sync + 'static {
    /// Link `link` is connected.
    fn up(&self, link: usize);
    /// Link `link` lost its connection, or failed to make one. What it
    /// had written and the peer had not acknowledged goes again on the
    /// next connection.
    fn down(&self, link: usize, reason: &LinkDown);
    /// The peer still holds a connection under link `link`'s node name.
    fn alive(&self, link: usize, node: &str);
    /// The task of link `link` has ended (the peer was closed, or the peer
    /// node restarted): it writes nothing more, and its socket, if it had
    /// one, is shut down after everything written before. The last event
    /// of a link. Closing a connection waits for it (per-caller order: see
    /// the Erlang side's ecall_conn).
    fn stopped(&self, _link: usize) {}
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
    /// Requests lost by this link: a message sent straight to its target
    /// (no number, so not kept) whose write failed.
    pub dropped: AtomicU64,
    /// Batches written again on a new connection: kept, not acknowledged
    /// when the last one ended.
    pub replayed: AtomicU64,
    /// The requests in them.
    pub replayed_requests: AtomicU64,
    /// Acknowledgements read from the peer.
    pub acks: AtomicU64,
    /// Connections made (the first one included).
    pub connects: AtomicU64,
    /// Connections lost or failed.
    pub disconnects: AtomicU64,
    /// Reaps: writes that missed their deadline.
    pub stalls: AtomicU64,
    /// Messages sent in fragments.
    pub fragmented: AtomicU64,
    /// Requests written by their caller, alone, while the writer slept
    /// (also counted in `batches` and `requests` once written whole, or in
    /// `dropped`; see `link/lent_side.rs`).
    pub lone: AtomicU64,
    /// Lone writes and flushes the socket took only in part (the writer
    /// wrote the rest): a sign that the peer reads slowly.
    pub lone_partial: AtomicU64,
    /// Flushes on the caller's side that wrote (`Peer::flush`).
    pub flushes: AtomicU64,
    /// Flushes on the caller's side that woke the writer instead.
    pub flush_handoffs: AtomicU64,
    /// Gathering waits made by the writer (see `may_gather` in writer.rs).
    pub gathers: AtomicU64,
    /// Urgent requests pushed ([`Element::urgent`]): each ends or
    /// forestalls a gathering wait.
    ///
    /// [`Element::urgent`]: crate::queue::shard::Element::urgent
    pub urgent: AtomicU64,
    /// Gauge: connected now.
    pub up: AtomicBool,
    /// What the peer sent us on this link (ticks aside).
    pub inbound: InboundStats,
}

/// Whether a gathering writer should stop waiting for company: the shard
/// holds [`GATHER_REQUESTS`] or [`GATHER_BYTES`], or an urgent request.
pub(crate) fn worth_writing(b: Backlog) -> bool {
    b.urgent || b.requests >= GATHER_REQUESTS || b.bytes >= GATHER_BYTES
}

/// What the push path and a link's writer share.
#[derive(Debug, Default)]
pub(crate) struct LinkShared {
    /// The writer's state, its wake-up and its lent write side: the
    /// sleeping-writer protocol (`link/protocol.rs`).
    pub(crate) proto: Protocol<WriteSide>,
    /// Told when an acknowledgement lets batches go: a draining writer
    /// waits for the last one.
    pub(crate) acked: tokio::sync::Notify,
    /// The link's counters.
    pub(crate) stats: LinkStats,
    /// Since when the link has been quiet (`clock::clock`): set when the
    /// writer goes to sleep and by each lone write.
    pub(crate) quiet_since: AtomicU64,
}

/// Why a link went down, or why an attempt to connect it failed: what
/// [`LinkEvents::down`] reports. `Display` gives the text for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkDown {
    /// We closed it: the peer was closed.
    Closed,
    /// A write missed its deadline: the peer is not draining. What the
    /// link's shards hold waits for the next connection.
    Stalled,
    /// The peer node restarted under the same name (a new creation); the
    /// link stopped for good.
    Restarted,
    /// The peer still holds our previous connection under this name.
    Alive,
    /// The peer closed the connection (end of file on read).
    PeerClosed,
    /// Reading from the socket failed.
    Read(io::ErrorKind),
    /// Writing to the socket failed.
    Write(io::ErrorKind),
    /// The peer sent a malformed frame.
    Malformed(Malformed),
    /// The TCP connection to the peer could not be made.
    Connect(io::ErrorKind),
    /// The peer's epmd could not be reached or failed to answer (or the
    /// peer's name is not `name@host`, so there is no epmd to ask).
    Epmd(String),
    /// The peer's epmd does not know its name.
    NotRegistered,
    /// The distribution handshake failed (a wrong cookie shows up here).
    Handshake(String),
    /// The attempt did not finish within the handshake deadline.
    HandshakeTimeout,
}

impl LinkDown {
    /// Whether a write missed its deadline: a peer that does not drain
    /// will not drain what is queued either, so the link releases it.
    pub fn is_stalled(&self) -> bool {
        matches!(self, LinkDown::Stalled)
    }

    /// Why a connection's reader stopped.
    pub(crate) fn from_read(end: ReadEnd) -> LinkDown {
        match end {
            ReadEnd::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => LinkDown::PeerClosed,
            ReadEnd::Io(e) => LinkDown::Read(e.kind()),
            ReadEnd::Malformed(m) => LinkDown::Malformed(m),
            // Only after the writer stopped, whose reason is the one kept.
            ReadEnd::WriterGone => LinkDown::Closed,
        }
    }

    /// Why an attempt ([`crate::net::connect::connect`], then the creation check)
    /// failed.
    pub(crate) fn from_attempt(e: Error) -> LinkDown {
        match e {
            // The one socket `connect` opens itself, to the peer's port
            // (epmd failures, its socket's included, are `Error::Epmd`).
            Error::Io(_, e) => LinkDown::Connect(e.kind()),
            Error::Epmd(s) => LinkDown::Epmd(s),
            Error::NotRegistered(_) => LinkDown::NotRegistered,
            Error::Handshake(s) => LinkDown::Handshake(s),
            Error::Alive => LinkDown::Alive,
            Error::Restarted => LinkDown::Restarted,
            // A name that is not `name@host` has no epmd to ask; `connect`
            // registers nothing and returns nothing else.
            e @ (Error::BadName(_) | Error::Config(_) | Error::NameTaken(_)) => {
                LinkDown::Epmd(e.to_string())
            }
        }
    }
}

impl std::fmt::Display for LinkDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkDown::Closed => f.write_str("closed"),
            LinkDown::Stalled => write!(
                f,
                "stalled: the peer took less than {STALL_PIECE} bytes within the write deadline"
            ),
            LinkDown::Restarted => {
                f.write_str("the peer node restarted (new creation); link stopped")
            }
            LinkDown::Alive => f.write_str("the peer still holds our previous connection"),
            LinkDown::PeerClosed => f.write_str("the peer closed the connection"),
            LinkDown::Read(k) => write!(f, "read: {k}"),
            LinkDown::Write(k) => write!(f, "write: {k}"),
            LinkDown::Malformed(m) => write!(f, "malformed frame from the peer: {m}"),
            LinkDown::Connect(k) => write!(f, "connect to the peer: {k}"),
            LinkDown::Epmd(s) => write!(f, "epmd: {s}"),
            LinkDown::NotRegistered => f.write_str("not registered with the peer's epmd"),
            LinkDown::Handshake(s) => write!(f, "handshake: {s}"),
            LinkDown::HandshakeTimeout => f.write_str("handshake timed out"),
        }
    }
}

impl std::error::Error for LinkDown {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_ends_and_attempt_errors_map_to_reasons() {
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert_eq!(LinkDown::from_read(ReadEnd::Io(eof)), LinkDown::PeerClosed);
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(
            LinkDown::from_read(ReadEnd::Io(reset)),
            LinkDown::Read(io::ErrorKind::ConnectionReset)
        );
        assert_eq!(
            LinkDown::from_read(ReadEnd::Malformed(Malformed::BadTerm)),
            LinkDown::Malformed(Malformed::BadTerm)
        );
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            LinkDown::from_attempt(Error::Io("connect to the peer", refused)),
            LinkDown::Connect(io::ErrorKind::ConnectionRefused)
        );
        assert_eq!(
            LinkDown::from_attempt(Error::NotRegistered("b@h".into())),
            LinkDown::NotRegistered
        );
        assert_eq!(
            LinkDown::from_attempt(Error::Restarted),
            LinkDown::Restarted
        );
        assert!(LinkDown::Stalled.is_stalled());
        assert!(!LinkDown::Write(io::ErrorKind::BrokenPipe).is_stalled());
    }
}
