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

use crate::cnode::Identity;
use crate::etf::BatchHeader;
use crate::link::{self, LinkEvents, LinkShared, LinkStats};
use crate::shard::{Backlog, BatchCaps, Element, Shard};
use crate::Error;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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
    /// Gauge: element bytes queued now.
    pub queued_bytes: AtomicUsize,
    /// Gauge: links connected now.
    pub links_up: AtomicUsize,
}

type Waiter = (usize, Box<dyn FnOnce(bool) + Send>);

/// See the module docs.
pub struct Peer {
    pub(crate) config: PeerConfig,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) links: Box<[LinkShared]>,
    waiters: Mutex<VecDeque<Waiter>>,
    /// How many callers wait for room (the length of `waiters`).
    pub(crate) waiting: AtomicUsize,
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
            config,
            shards,
            links,
            waiters: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
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
        // that came after the look sees SLEEPING and asks for a flush.
        if !link.turn(link::FLUSHING, link::SLEEPING) {
            return false;
        }
        self.shards_of_link(k).any(|s| !self.shards[s].is_empty())
            && link.turn(link::SLEEPING, link::FLUSHING)
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
            if len > reserved {
                st.queued_bytes.fetch_add(len - reserved, Ordering::SeqCst);
            } else {
                self.release(reserved - len);
            }
        } else if self.waiting.load(Ordering::Relaxed) > 0 || !self.take_room(len, false) {
            // Callers already waiting for room go first: no barging. An
            // oversized request is refused here too, and let through alone
            // by `wait_room` when nothing is queued. The room is taken in
            // the same atomic step as the check: two pushes that both saw
            // room for one used to both go in (the partition suite saw the
            // queue 7 KB past a 2 MiB budget under CPU load).
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
            st.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            return Push::Closed;
        };
        if wake {
            // Behind a sleeping writer, a flush on the caller's side where
            // the link takes one.
            if link.flushable.load(Ordering::Relaxed) && link.turn(link::SLEEPING, link::FLUSHING) {
                st.pushed.fetch_add(1, Ordering::Relaxed);
                return Push::Flush(self.link_of_shard(shard));
            }
            // Else a sleeping or gathering writer is woken. An awake one,
            // or a flush asked for already, looks at the shards after this
            // push.
            let woken = link
                .state
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                    matches!(s, link::SLEEPING | link::GATHERING).then_some(link::AWAKE)
                });
            if woken.is_ok() {
                st.wakes.fetch_add(1, Ordering::Relaxed);
                link.notify.notify_one();
            }
        } else if self.config.lulls && link.state.load(Ordering::Relaxed) == link::GATHERING {
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
    /// `reserved`, or it goes back with [`Peer::release`]. Set aside
    /// before the caller runs again, it cannot be taken by pushes that come
    /// meanwhile (when room was only counted, callers let in together and
    /// pushes arriving as the last waiter left could pass the budget by the
    /// waiters' sizes).
    pub fn wait_room(&self, size: usize, wake: Box<dyn FnOnce(bool) + Send>) -> bool {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if self.is_closed() {
            drop(w);
            wake(false);
            return true;
        }
        if w.is_empty() && self.take_room(size, true) {
            return false;
        }
        #[cfg(test)]
        tests::registration_window();
        w.push_back((size, wake));
        self.waiting.store(w.len(), Ordering::SeqCst);
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        drop(w);
        // A release between the load of `queued` above and the store of
        // `waiting` saw no waiter and woke nobody; if it freed everything,
        // no later write would wake us. So look again, now that `waiting`
        // is published (both sides are SeqCst: a release either sees the
        // waiter, or its decrement is seen here). Without this, callers
        // blocked on a full budget could wait for ever under load.
        self.wake_fitting();
        true
    }

    /// Adds `size` to the queued bytes if it fits, in one atomic step.
    fn take_room(&self, size: usize, first: bool) -> bool {
        self.stats
            .queued_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                self.fits(size, q, first).then_some(q + size)
            })
            .is_ok()
    }

    /// Gives `bytes` back to the budget (written by a link, or set aside by
    /// [`Peer::wait_room`] and not used: the caller is gone) and wakes, in
    /// order, the waiters that now fit. 0 does nothing.
    pub fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.stats.queued_bytes.fetch_sub(bytes, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) == 0 {
            return;
        }
        self.wake_fitting();
    }

    /// Whether a request of `size` bytes may be queued on top of `queued`:
    /// when it fits the budget, or when nothing is queued and it is the
    /// first admitted (a request larger than the whole budget goes alone;
    /// with nothing queued no write would ever make room for it).
    fn fits(&self, size: usize, queued: usize, first: bool) -> bool {
        queued + size <= self.config.max_queue_bytes || (queued == 0 && first)
    }

    /// Wakes, in order, the waiters that fit in the room left now, with
    /// their room set aside.
    fn wake_fitting(&self) {
        let mut woken = Vec::new();
        {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            // Wake in order while the next waiter's room can be taken.
            while let Some(&(size, _)) = w.front() {
                if !self.take_room(size, woken.is_empty()) {
                    break;
                }
                woken.push(w.pop_front().map(|(_, f)| f));
            }
            self.waiting.store(w.len(), Ordering::SeqCst);
        }
        for f in woken.into_iter().flatten() {
            f(true);
        }
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
            self.stats
                .queued_bytes
                .fetch_sub(b as usize, Ordering::AcqRel);
        }
        let waiters: Vec<_> = {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            self.waiting.store(0, Ordering::Relaxed);
            w.drain(..).collect()
        };
        for (_, f) in waiters {
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
        use crate::link::{AWAKE, GATHERING, GATHER_REQUESTS, SLEEPING};
        let peer = test_peer(1 << 20);
        let link = &peer.links[0];
        let wakes = || peer.stats.wakes.load(Ordering::Relaxed);
        assert_eq!(peer.push(0, &[97, 1], 0), Push::Queued);
        assert_eq!(wakes(), 0, "a busy writer is not woken");
        link.state.store(SLEEPING, Ordering::SeqCst);
        peer.push(0, &[97, 2], 0);
        assert_eq!((wakes(), link.state.load(Ordering::SeqCst)), (1, AWAKE));
        peer.push(0, &[97, 3], 0);
        assert_eq!(wakes(), 1);
        link.state.store(GATHERING, Ordering::SeqCst);
        // Three are queued; the one that makes GATHER_REQUESTS wakes it.
        for i in 3..GATHER_REQUESTS - 1 {
            peer.push(0, &[97, (i % 200) as u8], 0);
            assert_eq!(wakes(), 1, "woken at {i} requests");
        }
        peer.push(0, &[97, 0], 0);
        assert_eq!((wakes(), link.state.load(Ordering::SeqCst)), (2, AWAKE));
        assert_eq!(peer.shards[0].backlog().requests, GATHER_REQUESTS);
    }

    /// An urgent request (its caller waits for the answer before its next
    /// one) wakes a gathering writer at once, and is counted; once the
    /// writer has taken it, the shard is no longer urgent, so ordinary
    /// pushes that follow wait for company again.
    #[test]
    fn an_urgent_push_ends_gathering() {
        use crate::link::{AWAKE, GATHERING};
        let peer = test_peer(1 << 20);
        let link = &peer.links[0];
        let wakes = || peer.stats.wakes.load(Ordering::Relaxed);
        let urgent = |b: &'static [u8]| Element {
            urgent: true,
            ..Element::text(b)
        };
        link.state.store(GATHERING, Ordering::SeqCst);
        peer.push(0, &[97, 1], 0);
        assert_eq!(wakes(), 0, "an ordinary push waits for company");
        assert!(!peer.shards[0].backlog().urgent);
        assert_eq!(peer.push_element(0, urgent(&[97, 2]), 0), Push::Queued);
        assert_eq!((wakes(), link.state.load(Ordering::SeqCst)), (1, AWAKE));
        assert_eq!(link.stats.urgent.load(Ordering::Relaxed), 1);
        assert!(peer.shards[0].backlog().worth_writing());
        assert_eq!(peer.shards[0].take().map(|f| f.count), Some(2));
        link.state.store(GATHERING, Ordering::SeqCst);
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
            assert_eq!(peer.stats.queued_bytes.load(Ordering::SeqCst), 10_000);
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
        let queued = || peer.stats.queued_bytes.load(Ordering::SeqCst);
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

    thread_local! {
        /// Run by `wait_room` between its look at the budget and its
        /// registration, on the caller's thread.
        static IN_WINDOW: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
            const { std::cell::RefCell::new(None) };
    }

    pub(super) fn registration_window() {
        if let Some(f) = IN_WINDOW.with(|w| w.borrow_mut().take()) {
            f();
        }
    }

    /// A writer's release that lands while a caller registers for room
    /// (after the caller saw the budget full, before it is listed as
    /// waiting) sees no waiter and wakes nobody. When that release freed
    /// everything, no later write comes to wake the caller, and every
    /// caller behind it (no barging) waits for ever: the hang the overload
    /// suite met under load. The caller looks again once registered.
    #[test]
    fn a_release_while_registering_still_wakes_the_caller() {
        let peer = Arc::new(test_peer(1100));
        let mut element = vec![BINARY_EXT, 0, 0, 1, 0xf0];
        element.resize(5 + 0x1f0, 7);
        assert_eq!(peer.push(0, &element, 0), Push::Queued);
        assert_eq!(peer.push(0, &element, 0), Push::Queued);
        assert_eq!(peer.push(0, &element, 0), Push::Full);
        let writer = peer.clone();
        IN_WINDOW.with(|w| {
            *w.borrow_mut() = Some(Box::new(move || {
                let frame = writer.shards[0].take().unwrap();
                writer.release(frame.payload);
            }))
        });
        let woken = Arc::new(Mutex::new(Vec::new()));
        let w = woken.clone();
        let wake = Box::new(move |room| w.lock().unwrap_or_else(|p| p.into_inner()).push(room));
        assert!(peer.wait_room(element.len(), wake));
        assert!(
            IN_WINDOW.with(|w| w.borrow().is_none()),
            "the window was reached"
        );
        // Everything was written; what is counted is the woken caller's
        // room, set aside.
        assert_eq!(
            peer.stats.queued_bytes.load(Ordering::SeqCst),
            element.len()
        );
        assert_eq!(*woken.lock().unwrap_or_else(|p| p.into_inner()), [true]);
        assert_eq!(peer.waiting.load(Ordering::SeqCst), 0);
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
                    let queued = peer.stats.queued_bytes.load(Ordering::SeqCst);
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
                        peer.waiting.load(Ordering::SeqCst),
                        peer.stats.queued_bytes.load(Ordering::SeqCst)
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
