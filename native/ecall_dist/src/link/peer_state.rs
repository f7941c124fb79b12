//! The state of one peer, which its links share with the callers that push
//! to it: the shards, the byte budget, each link's shared half, the
//! settings ([`PeerConfig`]) and the counters ([`PeerStats`]). The peer's
//! handle (`crate::peer::Peer`, the push path) and the link tasks each hold
//! it; neither owns the other. It sits here, under `link`, so that imports
//! keep running down: the handle names the links, never the reverse.
//!
//! - The shards are numbered streams of this peer's epoch (a random number
//!   drawn when it is made): an acknowledgement lets go of what a shard
//!   kept ([`PeerState::ack`]), a link that ends puts it back to be written
//!   again ([`PeerState::rewind_link`]).
//! - [`PeerState::drain`] refuses new pushes and lets each link write what
//!   its shards hold, then stop; [`PeerState::close`] after it drops only
//!   what no link could write.
//! - [`PeerState::close`] stops the links, drops what is queued (counted in
//!   `dropped`) and releases every caller waiting for room.

use super::LinkShared;
use crate::error::Error;
use crate::queue::budget::Budget;
use crate::queue::shard::{BatchCaps, Shard};
use crate::wire::etf::BatchHeader;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Settings of one peer.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// Remote node name, `b@host`.
    pub node: String,
    /// Cookie for that node.
    pub cookie: String,
    /// Registered names of the receiver pool on the peer.
    pub receivers: Vec<String>,
    /// Number of shards.
    pub shards: usize,
    /// Batch caps.
    pub caps: BatchCaps,
    /// Byte budget for everything queued for the peer.
    pub max_queue_bytes: usize,
    /// Deadline of one socket write; `None` disables it.
    pub stall_timeout: Option<Duration>,
    /// First reconnect delay; doubles up to `backoff_max`.
    pub backoff_min: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Whether a busy link's writer gathers (waits up to
    /// [`GATHER_WAIT`](super::GATHER_WAIT) for company before it
    /// writes). Off, it writes what its shards hold as soon as it looks:
    /// for callers that each wait for an answer before their next request,
    /// whom gathering makes wait 1-2 ms per request.
    pub gather: bool,
    /// Whether a push that finds its link's writer asleep asks for a flush
    /// on the caller's side (`Push::Flush`) instead of waking the writer.
    pub flusher: bool,
}

/// Counters of one peer (per-link counters are in [`LinkStats`](super::LinkStats); see
/// `Peer::link_stats`). All monotonic except the gauges noted.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Requests accepted by `Peer::push`.
    pub pushed: AtomicU64,
    /// Requests dropped when the peer closed: queued, never written.
    pub dropped: AtomicU64,
    /// Requests written and not acknowledged when the peer closed: they
    /// may or may not have been processed (the peer node restarted, or
    /// went down).
    pub unconfirmed: AtomicU64,
    /// Pushes refused for want of room.
    pub full: AtomicU64,
    /// Callers that waited for room (`Peer::wait_room`).
    pub waits: AtomicU64,
    /// Pushes that had to wake a sleeping link writer.
    pub wakes: AtomicU64,
    /// Requests dropped by the overflow policy (counted by the caller
    /// through `Peer::note_overflow_drop`).
    pub overflow_drops: AtomicU64,
    /// Atoms sent as atom cache references instead of text.
    pub cached_atoms: AtomicU64,
    /// Gauge: links connected now.
    pub links_up: AtomicUsize,
}

/// See the module docs.
pub(crate) struct PeerState {
    pub(crate) config: PeerConfig,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) links: Box<[LinkShared]>,
    /// The bytes queued, bounded, and the callers waiting for room.
    pub(crate) budget: Budget,
    pub(crate) cancel: CancellationToken,
    /// Cancelled by [`PeerState::drain`], after every shard is shut: wakes
    /// the links, which write what their shards hold and then stop.
    pub(crate) drain: CancellationToken,
    /// Set by [`PeerState::close`] before the token is cancelled: the push path
    /// reads this plain flag (one atomic load) instead of the token, whose
    /// check costs more.
    pub(crate) closed: AtomicBool,
    /// Set by [`PeerState::drain`] and [`PeerState::close`]: the push path
    /// takes nothing more (one atomic load, as for `closed`).
    refusing: AtomicBool,
    /// Creation of the peer at the first connection (0 until then).
    creation: AtomicU32,
    /// This peer's epoch, in every batch's stream: a receiver tells a
    /// stream of a later opening of the peer from one it has seen.
    pub(crate) epoch: u64,
    /// Counters.
    pub(crate) stats: PeerStats,
}

impl PeerState {
    /// The shards and links of a peer, with no link task running: batches
    /// of link `k` come from node `from[k]` (name, creation).
    pub(crate) fn new(config: PeerConfig, from: &[(String, u32)]) -> PeerState {
        let nlinks = from.len();
        let epoch = new_epoch();
        let shards = (0..config.shards)
            .map(|s| {
                let (node, creation) = &from[s % nlinks];
                let to = &config.receivers[s % config.receivers.len()];
                let header = BatchHeader::new(node, *creation, to, epoch, s as u32);
                Shard::new(&header, config.caps)
            })
            .collect();
        let links = (0..nlinks).map(|_| LinkShared::default()).collect();
        PeerState {
            budget: Budget::new(config.max_queue_bytes),
            config,
            shards,
            links,
            cancel: CancellationToken::new(),
            drain: CancellationToken::new(),
            closed: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
            creation: AtomicU32::new(0),
            epoch,
            stats: PeerStats::default(),
        }
    }

    /// Remote node name.
    pub(crate) fn node(&self) -> &str {
        &self.config.node
    }

    /// The link that carries shard `shard % shard_count`.
    pub(crate) fn link_of_shard(&self, shard: usize) -> usize {
        (shard % self.shards.len()) % self.links.len()
    }

    /// The shards that link `k` carries, in order.
    pub(crate) fn shards_of_link(&self, k: usize) -> impl Iterator<Item = usize> + Clone {
        (k..self.shards.len()).step_by(self.links.len())
    }

    /// Whether `Peer::close` was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Whether [`PeerState::drain`] was called.
    pub(crate) fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Whether the push path takes nothing more: the peer drains or is
    /// closed.
    pub(crate) fn refuses(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    /// Whether the shards of link `k` hold nothing. Once the peer drains,
    /// an empty link stays empty.
    pub(crate) fn link_is_empty(&self, k: usize) -> bool {
        self.shards_of_link(k).all(|s| self.shards[s].is_empty())
    }

    /// Refuses every later push (`Push::Closed`: its caller takes another
    /// path) and wakes the links, which write what their shards hold, then
    /// stop (their last event, `LinkEvents::stopped`), as at a close but
    /// with nothing dropped. A link that is down reconnects to write what
    /// it holds, if it holds anything. [`PeerState::close`] ends it all,
    /// dropping what is left: the owner bounds the drain.
    pub(crate) fn drain(&self) {
        // Every shard first, under its lock: once a link sees the token,
        // an empty shard of its own stays empty.
        self.refusing.store(true, Ordering::Release);
        for s in self.shards.iter() {
            s.shut();
        }
        self.drain.cancel();
    }

    /// Gives `bytes` back to the budget (written by a link, or set aside by
    /// `Peer::wait_room` and not used: the caller is gone) and wakes, in
    /// order, the waiters that now fit. 0 does nothing.
    pub(crate) fn release(&self, bytes: usize) {
        self.budget.release(bytes);
    }

    /// Records the peer's creation at the first connection; refuses a
    /// different one later.
    pub(crate) fn same_incarnation(&self, creation: u32) -> Result<(), Error> {
        match self
            .creation
            .compare_exchange(0, creation, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(()),
            Err(known) if known == creation || creation == 0 => Ok(()),
            Err(_) => Err(Error::Restarted),
        }
    }

    /// Since when the longest wait for an acknowledgement among link
    /// `k`'s shards has gone on with none coming (0: none waits).
    pub(crate) fn link_waiting_since(&self, k: usize) -> u64 {
        self.shards_of_link(k)
            .map(|s| self.shards[s].waiting_since())
            .filter(|&t| t != 0)
            .min()
            .unwrap_or(0)
    }

    /// Whether link `k` has nothing left to write and nothing waiting
    /// for an acknowledgement.
    pub(crate) fn link_is_done(&self, k: usize) -> bool {
        self.shards_of_link(k)
            .all(|s| self.shards[s].is_empty() && !self.shards[s].has_retained())
    }

    /// The peer's receiver acknowledges batches of shard `shard` up to
    /// number `seq`, on link `k` (in `epoch`): they are let go and their
    /// room goes back. An acknowledgement of another epoch (an earlier
    /// opening of this peer) is ignored; one of a shard that is not link
    /// `k`'s, or of a number never sent, is malformed (`false`).
    pub(crate) fn ack(&self, k: usize, epoch: u64, shard: u32, seq: u64) -> bool {
        if epoch != self.epoch {
            return true;
        }
        let s = shard as usize;
        if s >= self.shards.len() || self.link_of_shard(s) != k {
            return false;
        }
        let Some(freed) = self.shards[s].ack(seq, super::clock::clock()) else {
            return false;
        };
        let link = &self.links[k];
        link.stats.acks.fetch_add(1, Ordering::Relaxed);
        if freed.requests > 0 {
            self.release(freed.bytes);
            link.acked.notify_one();
        }
        true
    }

    /// Link `k`'s connection ended: what its shards kept goes back to be
    /// written again, first, on the next one (counted in `replayed`).
    pub(crate) fn rewind_link(&self, k: usize) {
        let ls = &self.links[k].stats;
        for s in self.shards_of_link(k) {
            let back = self.shards[s].rewind();
            if back.requests > 0 {
                ls.replayed.fetch_add(1, Ordering::Relaxed);
                ls.replayed_requests
                    .fetch_add(back.requests, Ordering::Relaxed);
            }
        }
    }

    /// Stops the links, drops what is queued and releases every waiter.
    pub(crate) fn close(&self) {
        self.refusing.store(true, Ordering::Release);
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.cancel.cancel();
        for s in self.shards.iter() {
            let c = s.close();
            self.stats
                .dropped
                .fetch_add(c.queued.requests, Ordering::Relaxed);
            self.stats
                .unconfirmed
                .fetch_add(c.retained.requests, Ordering::Relaxed);
            self.budget.forget(c.queued.bytes + c.retained.bytes);
        }
        for f in self.budget.close() {
            f(false);
        }
    }
}

/// A number that no earlier opening of a peer on this node drew: the time
/// and a counter, mixed (the receiver only tells epochs apart).
fn new_epoch() -> u64 {
    static OPENED: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ OPENED
        .fetch_add(1, Ordering::Relaxed)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
