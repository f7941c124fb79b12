//! A peer: the shards that hold requests for one remote node, the byte
//! budget that bounds them, and the callers waiting for room.
//!
//! A peer owns one link ([`crate::link`]) per C-node identity; each link
//! carries every `links`-th shard (shard `s` goes on link `s % links`).
//!
//! - A push appends to the caller's shard and wakes the shard's link writer
//!   only if that writer is asleep; a busy writer finds the request on its
//!   next pass (the sleeping-writer protocol: `may_sleep` in
//!   `link/writer.rs`).
//! - Memory: the element bytes queued for the peer are accounted in one
//!   budget. Past it, a push is refused with [`Push::Full`]; the caller may
//!   then wait for room ([`Peer::wait_room`]), and is woken in arrival order
//!   as writes free room.
//! - A link reaped as stalled gives back what its shards hold
//!   (`Peer::drop_link_queue`); other links' shards are untouched.
//! - [`Peer::close`] stops the links, drops what is queued (counted in
//!   `dropped`) and releases every caller waiting for room.

use crate::budget::Budget;
use crate::cnode::Identity;
use crate::etf::BatchHeader;
use crate::link::state::Writer;
use crate::link::{self, LinkEvents, LinkShared, LinkStats};
use crate::shard::{Backlog, BatchCaps, Element, Shard};
use crate::Error;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
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
    /// [`GATHER_WAIT`](crate::link::GATHER_WAIT) for company before it
    /// writes). Off, it writes what its shards hold as soon as it looks:
    /// for callers that each wait for an answer before their next request,
    /// whom gathering makes wait 1-2 ms per request.
    pub gather: bool,
    /// Whether lulls start trials of not gathering (see
    /// [`LULL_FOR`](crate::link::LULL_FOR)). Off, pushes do not note when
    /// they came, and a link gathers whenever it is busy.
    pub lulls: bool,
    /// Whether a push that finds its link's writer asleep asks for a flush
    /// on the caller's side ([`Push::Flush`]) instead of waking the writer.
    pub flusher: bool,
}

/// Result of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Push {
    /// Queued.
    Queued,
    /// Over the byte budget: nothing was queued.
    Full,
    /// The peer is closed: nothing was queued.
    Closed,
    /// Queued behind a sleeping writer that was not woken: the caller has
    /// [`Peer::flush`] of this link called soon, after the pushes that are
    /// ready to run (on the BEAM: by a process, which runs after the
    /// processes already in the run queue, whose pushes it then writes in
    /// the same batch).
    Flush(usize),
}

/// Counters of one peer (per-link counters are in [`LinkStats`]; see
/// [`Peer::link_stats`]). All monotonic except the gauges noted.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Requests accepted by [`Peer::push`].
    pub pushed: AtomicU64,
    /// Requests dropped when the peer closed.
    pub dropped: AtomicU64,
    /// Pushes refused for want of room.
    pub full: AtomicU64,
    /// Callers that waited for room ([`Peer::wait_room`]).
    pub waits: AtomicU64,
    /// Pushes that had to wake a sleeping link writer.
    pub wakes: AtomicU64,
    /// Requests dropped by the overflow policy (counted by the caller
    /// through [`Peer::note_overflow_drop`]).
    pub overflow_drops: AtomicU64,
    /// Atoms sent as atom cache references instead of text.
    pub cached_atoms: AtomicU64,
    /// Gauge: links connected now.
    pub links_up: AtomicUsize,
}

/// See the module docs.
pub struct Peer {
    pub(crate) config: PeerConfig,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) links: Box<[LinkShared]>,
    /// The bytes queued, bounded, and the callers waiting for room.
    budget: Budget,
    pub(crate) cancel: CancellationToken,
    /// Set by [`Peer::close`] before the token is cancelled: the push path
    /// reads this plain flag (one atomic load) instead of the token, whose
    /// check costs more.
    closed: AtomicBool,
    /// Creation of the peer at the first connection (0 until then).
    creation: AtomicU32,
    /// Counters.
    pub stats: PeerStats,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("node", &self.config.node)
            .finish()
    }
}

impl Peer {
    /// Makes the shards and starts one link per identity on `rt`.
    pub fn open(
        rt: &tokio::runtime::Handle,
        identities: &[Arc<Identity>],
        config: PeerConfig,
        events: Arc<dyn LinkEvents>,
    ) -> Result<Arc<Peer>, Error> {
        if identities.is_empty() || config.receivers.is_empty() || config.shards == 0 {
            return Err(Error::Config(
                "need at least one identity, receiver and shard".into(),
            ));
        }
        let from: Vec<(String, u32)> = identities
            .iter()
            .map(|id| (id.node().to_string(), id.creation().get()))
            .collect();
        let peer = Arc::new(Peer::new(config, &from));
        for (k, id) in identities.iter().enumerate() {
            rt.spawn(link::link_task(peer.clone(), k, id.clone(), events.clone()));
        }
        Ok(peer)
    }

    /// The shards and links of a peer, with no link task running: batches
    /// of link `k` come from node `from[k]` (name, creation).
    fn new(config: PeerConfig, from: &[(String, u32)]) -> Peer {
        let nlinks = from.len();
        let shards = (0..config.shards)
            .map(|s| {
                let (node, creation) = &from[s % nlinks];
                let to = &config.receivers[s % config.receivers.len()];
                Shard::new(&BatchHeader::new(node, *creation, to), config.caps)
            })
            .collect();
        let links = (0..nlinks).map(|_| LinkShared::default()).collect();
        Peer {
            budget: Budget::new(config.max_queue_bytes),
            config,
            shards,
            links,
            cancel: CancellationToken::new(),
            closed: AtomicBool::new(false),
            creation: AtomicU32::new(0),
            stats: PeerStats::default(),
        }
    }

    /// Remote node name.
    pub fn node(&self) -> &str {
        &self.config.node
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// Number of links.
    pub fn link_count(&self) -> usize {
        self.links.len()
    }

    /// The link that carries shard `shard % shard_count`.
    pub fn link_of_shard(&self, shard: usize) -> usize {
        (shard % self.shards.len()) % self.links.len()
    }

    /// The shards that link `k` carries, in order.
    pub(crate) fn shards_of_link(&self, k: usize) -> impl Iterator<Item = usize> + Clone {
        (k..self.shards.len()).step_by(self.links.len())
    }

    /// Counters of link `k`.
    pub fn link_stats(&self, k: usize) -> Option<&LinkStats> {
        self.links.get(k).map(|l| &l.stats)
    }

    /// Counts a request that the caller's overflow policy dropped.
    pub fn note_overflow_drop(&self) {
        self.stats.overflow_drops.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether link `k` is connected now.
    pub fn link_up(&self, k: usize) -> bool {
        self.links
            .get(k)
            .is_some_and(|l| l.stats.up.load(Ordering::Relaxed))
    }

    /// Whether a small push to link `k` would now be written by its caller
    /// (a lone write: the writer sleeps and the link has been quiet for
    /// [`LONE_GAP`](crate::link::LONE_GAP); see `link/side.rs`).
    pub fn would_write_lone(&self, k: usize) -> bool {
        self.links.get(k).is_some_and(LinkShared::lone_ready)
    }

    /// Whether [`Peer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Queues one element (external format without the version byte) on
    /// shard `shard % shard_count`.
    ///
    /// `reserved` is 0, or the room [`Peer::wait_room`] set aside for this
    /// caller: such a push neither queues behind later waiters nor is
    /// refused again, and takes the reserved room instead of new room.
    pub fn push(&self, shard: usize, element: &[u8], reserved: usize) -> Push {
        self.push_element(shard, Element::text(element), reserved)
    }

    /// [`Peer::push`] of an element that says what its atoms are: one whose
    /// atoms are all id references ([`crate::atom_ids`]) is written without
    /// a pass over its bytes.
    pub fn push_element(&self, shard: usize, element: Element<'_>, reserved: usize) -> Push {
        self.push_with(
            shard,
            element.bytes.len(),
            reserved,
            Some(element),
            |s, under_lock| s.push(element, under_lock),
        )
    }

    /// [`Peer::push`] for a large element given in pieces (as
    /// `term_to_iovec` gives it, version byte already stripped): it becomes
    /// a batch of its own, built outside the shard lock.
    pub fn push_alone(&self, shard: usize, parts: &[&[u8]], reserved: usize) -> Push {
        let len = parts.iter().map(|p| p.len()).sum();
        self.push_with(shard, len, reserved, None, |s, under_lock| {
            s.push_alone(parts, under_lock)
        })
    }

    /// Writes what link `k`'s shards hold from the calling thread, once a
    /// push answered [`Push::Flush`]`(k)`: one non-blocking write, as the
    /// writer would make (see `LinkShared::flush` in `link/side.rs`), or a
    /// wake-up of the writer when the load is its. Returns whether it
    /// should be called again (more came meanwhile). Never blocks.
    pub fn flush(&self, k: usize) -> bool {
        let Some(link) = self.links.get(k) else {
            return false;
        };
        let taken = link.flush(
            &self.shards,
            self.shards_of_link(k),
            &self.stats.cached_atoms,
        );
        let payload = taken.iter().map(|(_, f)| f.payload).sum();
        for (s, f) in taken {
            self.shards[s].recycle(f.bytes);
        }
        self.release(payload);
        // The push side's protocol again (`may_sleep` in link/writer.rs): the
        // writer sleeps once more, then every shard is looked at; a push
        // that came after the look sees the writer sleeping and asks for a
        // flush.
        if !link.state.flushed() {
            return false;
        }
        self.shards_of_link(k).any(|s| !self.shards[s].is_empty()) && link.state.ask_flush()
    }

    /// Wakes link `k`'s writer (after [`Push::Flush`], when no flush
    /// can be arranged).
    pub fn wake_writer(&self, k: usize) {
        if self.links.get(k).is_some_and(LinkShared::wake_writer) {
            self.stats.wakes.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn push_with(
        &self,
        shard: usize,
        len: usize,
        reserved: usize,
        lone: Option<Element<'_>>,
        push: impl FnOnce(&Shard, &dyn Fn(Backlog) -> bool) -> Option<bool>,
    ) -> Push {
        if self.is_closed() {
            self.release(reserved);
            return Push::Closed;
        }
        let admitted = reserved > 0;
        let st = &self.stats;
        if admitted {
            // The room was set aside when this caller was let in: a request
            // that encodes longer than the size it waited for (it is the
            // same request, so only by a byte or two, if ever) takes the
            // difference, a shorter one gives the rest back.
            self.budget.settle(reserved, len);
        } else if !self.budget.admit(len) {
            // Callers already waiting for room go first (no barging); an
            // oversized request is refused here too, and let through alone
            // by `wait_room` when nothing is queued.
            st.full.fetch_add(1, Ordering::Relaxed);
            return Push::Full;
        }
        let shard = shard % self.shards.len();
        let link = &self.links[self.link_of_shard(shard)];
        if lone.is_some_and(|e| e.urgent) {
            link.stats.urgent.fetch_add(1, Ordering::Relaxed);
        }
        // A small request behind a sleeping writer goes to the socket at
        // once, from this thread (link/side.rs). Not an admitted one: the
        // callers still waiting for room are woken by the writer's
        // releases, and only queued requests make the writer release.
        if let Some(element) = lone.filter(|_| !admitted) {
            if link.write_lone(&self.shards[shard], element, &st.cached_atoms) {
                // Written, not queued: its room goes back, waking whoever
                // the reservation made wait meanwhile.
                self.release(len);
                st.pushed.fetch_add(1, Ordering::Relaxed);
                return Push::Queued;
            }
        }
        // The push side of the sleeping-writer protocol: `may_sleep` in link/writer.rs.
        let Some(wake) = push(&self.shards[shard], &|b| link.wants_wake(b)) else {
            // Closed since the check above (close() runs concurrently).
            self.budget.forget(len);
            return Push::Closed;
        };
        if wake {
            // Behind a sleeping writer, a flush on the caller's side where
            // the link takes one.
            if link.flushable.load(Ordering::Relaxed) && link.state.ask_flush() {
                st.pushed.fetch_add(1, Ordering::Relaxed);
                return Push::Flush(self.link_of_shard(shard));
            }
            // Else a sleeping or gathering writer is woken. An awake one,
            // or a flush asked for already, looks at the shards after this
            // push.
            if link.state.wake_for_push() {
                st.wakes.fetch_add(1, Ordering::Relaxed);
                link.notify.notify_one();
            }
        } else if self.config.lulls && link.state.get() == Writer::Gathering {
            // When company came, for the writer's pacing (link::LULL_FOR).
            link.note_gathering_push();
        }
        st.pushed.fetch_add(1, Ordering::Relaxed);
        Push::Queued
    }

    /// After [`Push::Full`]: sets `size` bytes of the budget aside for the
    /// caller, at once if nobody waits and they fit (returns `false`), else
    /// once they fit, callers in the order they came, and then calls
    /// `wake(true)`; `wake(false)` if the peer closes first (nothing set
    /// aside then). Returns `true` when it registered `wake`, which may be
    /// called before this returns (room freed while it registered).
    ///
    /// The room set aside is the caller's: its next push passes it as
    /// `reserved`, or it goes back with [`Peer::release`]. See
    /// `budget.rs`.
    pub fn wait_room(&self, size: usize, wake: Box<dyn FnOnce(bool) + Send>) -> bool {
        if self.is_closed() {
            wake(false);
            return true;
        }
        let listed = self.budget.wait_room(size, wake);
        if listed {
            self.stats.waits.fetch_add(1, Ordering::Relaxed);
            // Closed while it registered: `close` may have taken the list
            // before this caller was on it.
            if self.is_closed() {
                for f in self.budget.close() {
                    f(false);
                }
            }
        }
        listed
    }

    /// Gives `bytes` back to the budget (written by a link, or set aside by
    /// [`Peer::wait_room`] and not used: the caller is gone) and wakes, in
    /// order, the waiters that now fit. 0 does nothing.
    pub fn release(&self, bytes: usize) {
        self.budget.release(bytes);
    }

    /// Element bytes queued now (a gauge), room set aside for woken
    /// callers included.
    pub fn queued_bytes(&self) -> usize {
        self.budget.queued()
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

    /// Drops what the shards of link `k` hold (counted in `dropped`) and
    /// gives its bytes back to the budget, waking callers waiting for room.
    pub(crate) fn drop_link_queue(&self, k: usize) {
        let (mut n, mut b) = (0u64, 0usize);
        for s in self.shards_of_link(k) {
            let (sn, sb) = self.shards[s].clear();
            n += sn;
            b += sb as usize;
        }
        self.links[k].stats.dropped.fetch_add(n, Ordering::Relaxed);
        self.release(b);
    }

    /// Stops the links, drops what is queued and releases every waiter.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.cancel.cancel();
        for s in self.shards.iter() {
            let (n, b) = s.close();
            self.stats.dropped.fetch_add(n, Ordering::Relaxed);
            self.budget.forget(b as usize);
        }
        for f in self.budget.close() {
            f(false);
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etf::{BINARY_EXT, SMALL_INTEGER_EXT};
    use std::sync::Mutex;

    fn test_peer(budget: usize) -> Peer {
        Peer::new(
            PeerConfig {
                node: "b@h".into(),
                cookie: "c".into(),
                receivers: vec!["ecall_rx_1".into()],
                shards: 1,
                caps: BatchCaps::default(),
                max_queue_bytes: budget,
                stall_timeout: None,
                backoff_min: Duration::from_millis(1),
                backoff_max: Duration::from_millis(1),
                gather: true,
                lulls: true,
                flusher: false,
            },
            &[("a_ecall_1@h".into(), 1)],
        )
    }

    /// The push side of the sleeping-writer protocol and of gathering: a
    /// sleeping writer is woken by the first push; a gathering one only by
    /// the push that brings its shard to `GATHER_REQUESTS`; a busy one by
    /// none. Each wake-up happens once (the state goes back to awake).
    #[test]
    fn pushes_wake_a_sleeping_writer_at_once_and_a_gathering_one_at_the_threshold() {
        use crate::link::GATHER_REQUESTS;
        let peer = test_peer(1 << 20);
        let link = &peer.links[0];
        let wakes = || peer.stats.wakes.load(Ordering::Relaxed);
        assert_eq!(peer.push(0, &[97, 1], 0), Push::Queued);
        assert_eq!(wakes(), 0, "a busy writer is not woken");
        link.state.sleep();
        peer.push(0, &[97, 2], 0);
        assert_eq!((wakes(), link.state.get()), (1, Writer::Awake));
        peer.push(0, &[97, 3], 0);
        assert_eq!(wakes(), 1);
        link.state.gather();
        // Three are queued; the one that makes GATHER_REQUESTS wakes it.
        for i in 3..GATHER_REQUESTS - 1 {
            peer.push(0, &[97, (i % 200) as u8], 0);
            assert_eq!(wakes(), 1, "woken at {i} requests");
        }
        peer.push(0, &[97, 0], 0);
        assert_eq!((wakes(), link.state.get()), (2, Writer::Awake));
        assert_eq!(peer.shards[0].backlog().requests, GATHER_REQUESTS);
    }

    /// An urgent request (its caller waits for the answer before its next
    /// one) wakes a gathering writer at once, and is counted; once the
    /// writer has taken it, the shard is no longer urgent, so ordinary
    /// pushes that follow wait for company again.
    #[test]
    fn an_urgent_push_ends_gathering() {
        let peer = test_peer(1 << 20);
        let link = &peer.links[0];
        let wakes = || peer.stats.wakes.load(Ordering::Relaxed);
        let urgent = |b: &'static [u8]| Element {
            urgent: true,
            ..Element::text(b)
        };
        link.state.gather();
        peer.push(0, &[97, 1], 0);
        assert_eq!(wakes(), 0, "an ordinary push waits for company");
        assert!(!peer.shards[0].backlog().urgent);
        assert_eq!(peer.push_element(0, urgent(&[97, 2]), 0), Push::Queued);
        assert_eq!((wakes(), link.state.get()), (1, Writer::Awake));
        assert_eq!(link.stats.urgent.load(Ordering::Relaxed), 1);
        assert!(peer.shards[0].backlog().worth_writing());
        assert_eq!(peer.shards[0].take().map(|f| f.count), Some(2));
        link.state.gather();
        peer.push(0, &[97, 3], 0);
        assert_eq!(wakes(), 1);
        assert!(!peer.shards[0].backlog().worth_writing());
    }

    /// Pushes racing for the last room never take the queue past the
    /// budget: the check and the taking of the room are one atomic step.
    /// Four threads push 100-byte elements into a 10,000-byte budget that
    /// nothing drains; exactly 100 go in whatever the interleaving (when
    /// the check was a load before the add, two pushes that both saw room
    /// for one both went in).
    #[test]
    fn racing_pushes_stay_within_the_budget() {
        let mut element = vec![BINARY_EXT, 0, 0, 0, 95];
        element.resize(100, 7);
        for _ in 0..50 {
            let peer = test_peer(10_000);
            let queued: usize = std::thread::scope(|s| {
                let pushers: Vec<_> = (0..4)
                    .map(|t| {
                        let (peer, element) = (&peer, &element);
                        s.spawn(move || {
                            (0..60)
                                .filter(|_| peer.push(t, element, 0) == Push::Queued)
                                .count()
                        })
                    })
                    .collect();
                pushers.into_iter().map(|p| p.join().unwrap()).sum()
            });
            assert_eq!(queued, 100);
            assert_eq!(peer.queued_bytes(), 10_000);
        }
    }

    /// Callers waiting for room are admitted in the order they came, only as
    /// many as the freed room holds (no herd), and later callers queue
    /// behind them even when they would fit.
    #[test]
    fn waiters_are_admitted_in_order_without_a_herd() {
        let peer = test_peer(1000);
        let mut element = vec![BINARY_EXT, 0, 0, 1, 0xf0];
        element.resize(5 + 0x1f0, 7);
        assert_eq!(element.len(), 501);
        assert_eq!(peer.push(0, &element, 0), Push::Queued);
        assert_eq!(peer.push(0, &element, 0), Push::Full);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let seen = |w: &Arc<Mutex<Vec<(&'static str, bool)>>>| {
            w.lock().unwrap_or_else(|p| p.into_inner()).clone()
        };
        for name in ["first", "second", "third"] {
            let w = woken.clone();
            assert!(peer.wait_room(
                500,
                Box::new(move |room| w
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((name, room)))
            ));
        }
        // A small request that would fit still queues behind the waiters.
        assert_eq!(peer.push(0, &[SMALL_INTEGER_EXT, 1], 0), Push::Full);
        // The writer writes the queued batch: the whole budget is free,
        // room for two waiters of 500, not three.
        let frame = peer.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(seen(&woken), [("first", true), ("second", true)]);
        assert_eq!(peer.push(0, &element[..500], 500), Push::Queued);
        assert_eq!(peer.push(0, &element[..500], 500), Push::Queued);
        let frame = peer.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(
            seen(&woken),
            [("first", true), ("second", true), ("third", true)]
        );
        assert_eq!(peer.stats.waits.load(Ordering::Relaxed), 3);
    }

    /// The room of a caller let in is set aside when it is woken, before
    /// it runs again: a push that comes in between (once the last waiter
    /// left, nobody queues behind waiters) finds the budget full instead of
    /// taking that room. When the room was only counted, the 2-byte push
    /// below went in, and the two admitted pushes then took the queue to
    /// 1,002 bytes of a 1,000 budget. Room not used goes back, and wakes
    /// the next waiter.
    #[test]
    fn room_of_an_admitted_caller_is_set_aside() {
        let peer = test_peer(1000);
        let queued = || peer.queued_bytes();
        let mut element = vec![BINARY_EXT, 0, 0, 1, 0xf0];
        element.resize(5 + 0x1f0, 7);
        assert_eq!(peer.push(0, &element, 0), Push::Queued);
        assert_eq!(peer.push(0, &element, 0), Push::Full);
        let woken = Arc::new(Mutex::new(Vec::new()));
        for name in ["first", "second", "third"] {
            let w = woken.clone();
            let wake = Box::new(move |room| {
                w.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((name, room))
            });
            assert!(peer.wait_room(500, wake));
        }
        let frame = peer.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(queued(), 1000, "the two woken callers' room is set aside");
        assert_eq!(peer.push(0, &[SMALL_INTEGER_EXT, 1], 0), Push::Full);
        assert_eq!(peer.push(0, &element[..500], 500), Push::Queued);
        assert_eq!(queued(), 1000);
        // The second one never pushes: its room goes back to the third.
        peer.release(500);
        assert_eq!(queued(), 1000);
        assert_eq!(
            *woken.lock().unwrap_or_else(|p| p.into_inner()),
            [("first", true), ("second", true), ("third", true)]
        );
        // Room taken at once (nobody waits, it fits) is set aside too.
        let frame = peer.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(queued(), 500, "the third one's room");
        assert!(!peer.wait_room(400, Box::new(|_| ())));
        assert_eq!(queued(), 900);
        // A request that came out shorter than its room gives the rest back.
        assert_eq!(peer.push(0, &element[..300], 400), Push::Queued);
        assert_eq!(queued(), 800);
    }

    /// The blocking protocol under contention: callers that find the
    /// budget full wait for room while a writer thread takes and releases
    /// batches; every request gets through, none is woken without room.
    #[test]
    fn blocked_callers_are_never_left_waiting() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::mpsc;
        const CALLERS: usize = 6;
        const EACH: usize = 5_000;
        let peer = Arc::new(test_peer(1000));
        let mut element = vec![BINARY_EXT, 0, 0, 1, 0xf0];
        element.resize(5 + 0x1f0, 7);
        let finished = Arc::new(AtomicUsize::new(0));
        let writer = {
            let (peer, finished) = (peer.clone(), finished.clone());
            std::thread::spawn(move || {
                let mut taken = 0usize;
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                while finished.load(Ordering::SeqCst) < CALLERS {
                    // Rooms set aside as callers are woken: never past the
                    // budget, however the pushes interleave.
                    let queued = peer.queued_bytes();
                    assert!(queued <= 1000, "{queued} bytes queued of 1000");
                    match peer.shards[0].take() {
                        Some(frame) => {
                            taken += frame.count as usize;
                            peer.release(frame.payload);
                        }
                        None => std::thread::yield_now(),
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "callers still blocked: {} waiting, {} bytes queued",
                        peer.budget.waiting(),
                        peer.queued_bytes()
                    );
                }
                while let Some(frame) = peer.shards[0].take() {
                    taken += frame.count as usize;
                }
                taken
            })
        };
        let callers: Vec<_> = (0..CALLERS)
            .map(|_| {
                let (peer, finished, element) = (peer.clone(), finished.clone(), element.clone());
                std::thread::spawn(move || {
                    for _ in 0..EACH {
                        if peer.push(0, &element, 0) == Push::Full {
                            let (tx, rx) = mpsc::channel();
                            let wake = Box::new(move |room| {
                                let _ = tx.send(room);
                            });
                            if peer.wait_room(element.len(), wake) {
                                assert!(rx.recv().unwrap(), "woken without room");
                            }
                            assert_eq!(peer.push(0, &element, element.len()), Push::Queued);
                        }
                    }
                    finished.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        // The writer first: it fails the test at its deadline if callers
        // hang (joining those would hang the test instead).
        let taken = writer.join().expect("the writer gave up");
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(taken, CALLERS * EACH);
        assert_eq!(
            peer.stats.pushed.load(Ordering::Relaxed),
            (CALLERS * EACH) as u64
        );
    }

    /// Closing releases every waiter, with no room.
    #[test]
    fn close_releases_waiters() {
        let peer = test_peer(10);
        let big = [BINARY_EXT, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8];
        // Larger than the whole budget, nothing queued: it may go alone.
        assert_eq!(peer.push(0, &big, 0), Push::Full);
        assert!(!peer.wait_room(13, Box::new(|_| ())));
        assert_eq!(peer.push(0, &big, 13), Push::Queued);
        // Behind something queued, it waits.
        assert_eq!(peer.push(0, &big, 0), Push::Full);
        let woken = Arc::new(Mutex::new(Vec::new()));
        let w = woken.clone();
        assert!(peer.wait_room(
            13,
            Box::new(move |room| w.lock().unwrap_or_else(|p| p.into_inner()).push(room))
        ));
        peer.close();
        assert_eq!(*woken.lock().unwrap_or_else(|p| p.into_inner()), [false]);
    }
}
