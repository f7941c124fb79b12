//! A peer: the shards that hold requests for one remote node, and the links
//! (one TCP connection per C-node identity) that carry them.
//!
//! Behaviour:
//! - A push appends to the caller's shard and wakes the shard's link writer
//!   only if that writer is asleep; a busy writer finds the request on its
//!   next pass. The writer takes one batch from each of its shards per pass
//!   and writes them with one vectored write.
//! - The writer writes at least once per tick interval (an empty frame when
//!   idle) so that the peer keeps the connection.
//! - Every socket write has a deadline (`stall_timeout`) per bounded piece
//!   ([`STALL_PIECE`]); a write that does not make that much progress in
//!   time reaps the link: the socket is closed, what the link's shards hold
//!   is dropped and counted, its bytes go back to the budget, and the link
//!   reconnects with backoff.
//! - When a connection ends, its owner is told ([`LinkEvents::down`]) and the
//!   link reconnects with exponential backoff, to the same incarnation of
//!   the peer only: a peer node that restarted under the same name has a
//!   new creation and no receivers of ours yet, so the link stops there
//!   (reason "restarted") and leaves the decision to its owner. What the shards hold stays
//!   queued (bounded by the byte budget) and goes out once the link is back;
//!   a batch that was being written when the socket died is lost, as it
//!   would be with native distribution.
//! - [`Peer::close`] stops the links, drops what is queued (counted in
//!   `dropped`) and releases every caller waiting for room.
//! - Memory: the element bytes queued for the peer are accounted in one
//!   budget. Past it, a push is refused with [`Push::Full`]; the caller may
//!   then wait for room ([`Peer::wait_room`]), and is woken in arrival order
//!   as writes free room.

use crate::atom_cache::{self, OutCache};
use crate::cnode::{self, Identity};
use crate::etf::BatchHeader;
use crate::inbound::{self, InboundStats};
use crate::shard::{BatchCaps, Frame, Shard};
use crate::Error;
use std::collections::VecDeque;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What a link reports to its owner. Called from runtime threads.
pub trait LinkEvents: Send + Sync + 'static {
    /// Link `link` is connected.
    fn up(&self, link: usize);
    /// Link `link` lost its connection, or failed to make one.
    fn down(&self, link: usize, reason: &str);
    /// The peer still holds a connection under link `link`'s node name.
    fn alive(&self, link: usize, node: &str);
}

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

struct LinkShared {
    sleeping: AtomicBool,
    notify: Notify,
    stats: LinkStats,
}

type Waiter = (usize, Box<dyn FnOnce(bool) + Send>);

/// See the module docs.
pub struct Peer {
    config: PeerConfig,
    shards: Box<[Shard]>,
    links: Box<[LinkShared]>,
    waiters: Mutex<VecDeque<Waiter>>,
    waiting: AtomicUsize,
    cancel: CancellationToken,
    /// Creation of the peer at the first connection (0 until then).
    creation: std::sync::atomic::AtomicU32,
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
            rt.spawn(link_task(peer.clone(), k, id.clone(), events.clone()));
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
        let links = (0..nlinks)
            .map(|_| LinkShared {
                sleeping: AtomicBool::new(false),
                notify: Notify::new(),
                stats: LinkStats::default(),
            })
            .collect();
        Peer {
            config,
            shards,
            links,
            waiters: Mutex::new(VecDeque::new()),
            waiting: AtomicUsize::new(0),
            cancel: CancellationToken::new(),
            creation: std::sync::atomic::AtomicU32::new(0),
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

    /// Whether [`Peer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Queues one element (external format without the version byte) on
    /// shard `shard % shard_count`.
    ///
    /// `admitted` is for a caller that was just woken by [`Peer::wait_room`]:
    /// room was set aside for it, so it neither queues behind later waiters
    /// nor is refused again.
    pub fn push(&self, shard: usize, element: &[u8], admitted: bool) -> Push {
        self.push_with(shard, element.len(), admitted, |s, under_lock| {
            s.push(element, under_lock)
        })
    }

    /// [`Peer::push`] for a large element given in pieces (as
    /// `term_to_iovec` gives it, version byte already stripped): it becomes
    /// a batch of its own, built outside the shard lock.
    pub fn push_alone(&self, shard: usize, parts: &[&[u8]], admitted: bool) -> Push {
        let len = parts.iter().map(|p| p.len()).sum();
        self.push_with(shard, len, admitted, |s, under_lock| {
            s.push_alone(parts, under_lock)
        })
    }

    fn push_with(
        &self,
        shard: usize,
        len: usize,
        admitted: bool,
        push: impl FnOnce(&Shard, &dyn Fn() -> bool) -> bool,
    ) -> Push {
        if self.cancel.is_cancelled() {
            return Push::Closed;
        }
        let st = &self.stats;
        // Callers already waiting for room go first: no barging.
        if !admitted
            && (self.waiting.load(Ordering::Relaxed) > 0
                || st.queued_bytes.load(Ordering::Relaxed) + len > self.config.max_queue_bytes)
        {
            st.full.fetch_add(1, Ordering::Relaxed);
            return Push::Full;
        }
        st.queued_bytes.fetch_add(len, Ordering::Relaxed);
        let shard = shard % self.shards.len();
        let link = &self.links[self.link_of_shard(shard)];
        let wake = push(&self.shards[shard], &|| {
            link.sleeping.load(Ordering::Relaxed)
        });
        if wake && link.sleeping.swap(false, Ordering::AcqRel) {
            st.wakes.fetch_add(1, Ordering::Relaxed);
            link.notify.notify_one();
        }
        st.pushed.fetch_add(1, Ordering::Relaxed);
        Push::Queued
    }

    /// After [`Push::Full`]: registers `wake`, to be called with `true` once
    /// `size` bytes may fit (callers are woken in the order they came) or
    /// with `false` if the peer closes. Returns `false`, without
    /// registering, if there is room already.
    pub fn wait_room(&self, size: usize, wake: Box<dyn FnOnce(bool) + Send>) -> bool {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if self.cancel.is_cancelled() {
            drop(w);
            wake(false);
            return true;
        }
        let queued = self.stats.queued_bytes.load(Ordering::Acquire);
        // Room now, or nothing queued at all (a request larger than the
        // whole budget goes alone; with nothing queued no write would ever
        // wake it).
        if w.is_empty() && (queued + size <= self.config.max_queue_bytes || queued == 0) {
            return false;
        }
        w.push_back((size, wake));
        self.waiting.store(w.len(), Ordering::Relaxed);
        self.stats.waits.fetch_add(1, Ordering::Relaxed);
        true
    }

    fn release(&self, bytes: usize) {
        let queued = self.stats.queued_bytes.fetch_sub(bytes, Ordering::AcqRel) - bytes;
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut woken = Vec::new();
        {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            let mut room = self.config.max_queue_bytes.saturating_sub(queued);
            // Wake in order while the next waiter fits; always wake one when
            // nothing is queued, so that an oversized request still goes.
            while let Some((size, _)) = w.front() {
                if *size > room && !(queued == 0 && woken.is_empty()) {
                    break;
                }
                room = room.saturating_sub(*size);
                woken.push(w.pop_front().map(|(_, f)| f));
            }
            self.waiting.store(w.len(), Ordering::Relaxed);
        }
        for f in woken.into_iter().flatten() {
            f(true);
        }
    }

    /// Records the peer's creation at the first connection; refuses a
    /// different one later.
    fn same_incarnation(&self, creation: u32) -> Result<(), Error> {
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
    fn drop_link_queue(&self, k: usize) {
        let (mut n, mut b) = (0u64, 0usize);
        for s in (k..self.shards.len()).step_by(self.links.len()) {
            let (sn, sb) = self.shards[s].clear();
            n += sn;
            b += sb as usize;
        }
        self.links[k].stats.dropped.fetch_add(n, Ordering::Relaxed);
        self.release(b);
    }

    /// Stops the links, drops what is queued and releases every waiter.
    pub fn close(&self) {
        if self.cancel.is_cancelled() {
            return;
        }
        self.cancel.cancel();
        for s in self.shards.iter() {
            let (n, b) = s.clear();
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

async fn link_task(peer: Arc<Peer>, k: usize, id: Arc<Identity>, events: Arc<dyn LinkEvents>) {
    let mut backoff = peer.config.backoff_min;
    let cancel = peer.cancel.clone();
    // Only the weak side is kept across waits so that a peer nobody holds
    // any more can be dropped (which closes it).
    let weak = Arc::downgrade(&peer);
    drop(peer);
    loop {
        let Some(peer) = weak.upgrade() else { return };
        if peer.is_closed() {
            return;
        }
        let attempt = tokio::time::timeout(
            id.handshake_timeout(),
            cnode::connect(&id, &peer.config.node, &peer.config.cookie),
        );
        let result = tokio::select! {
            _ = cancel.cancelled() => return,
            r = attempt => r,
        };
        let result = result.map(|r| r.and_then(|c| peer.same_incarnation(c.creation).map(|_| c)));
        let reason = match result {
            Ok(Err(Error::Restarted)) => {
                peer.links[k]
                    .stats
                    .disconnects
                    .fetch_add(1, Ordering::Relaxed);
                let reason = Error::Restarted.to_string();
                tracing::warn!(peer = peer.node(), link = k, reason, "link stopped");
                events.down(k, &reason);
                return;
            }
            Ok(Ok(conn)) => {
                backoff = peer.config.backoff_min;
                let ls = &peer.links[k].stats;
                ls.connects.fetch_add(1, Ordering::Relaxed);
                peer.stats.links_up.fetch_add(1, Ordering::Relaxed);
                ls.up.store(true, Ordering::Relaxed);
                events.up(k);
                let ended = run(&peer, k, &id, conn).await;
                peer.links[k].stats.up.store(false, Ordering::Relaxed);
                peer.stats.links_up.fetch_sub(1, Ordering::Relaxed);
                if ended.stalled {
                    // A peer that does not drain will not drain what is
                    // queued either: release it now (counted as dropped)
                    // instead of holding the budget, and the callers
                    // waiting for room, until the node is declared down.
                    peer.drop_link_queue(k);
                }
                ended.why
            }
            Ok(Err(Error::Alive)) => {
                events.alive(k, id.node());
                "peer still holds our previous connection".to_string()
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "handshake timed out".to_string(),
        };
        if peer.is_closed() {
            return;
        }
        peer.links[k]
            .stats
            .disconnects
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = peer.node(), link = k, reason, "link down");
        events.down(k, &reason);
        drop(peer);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        let Some(peer) = weak.upgrade() else { return };
        backoff = (backoff * 2).min(peer.config.backoff_max);
    }
}

/// Runs one connected link until it fails or the peer closes; returns why.
async fn run(peer: &Arc<Peer>, k: usize, id: &Identity, conn: cnode::Connected) -> Ended {
    let (mut rd, mut wr) = conn.stream.into_split();
    let (ctl_tx, mut ctl_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let reading = Arc::clone(peer);
    let mut reader = tokio::spawn(async move {
        let stats = &reading.links[k].stats.inbound;
        inbound::read_loop(&mut rd, ctl_tx, stats).await.to_string()
    });
    let mut out = Out {
        cache: conn.atom_cache.then(OutCache::default),
        // Fragments need the distribution header, which comes with the
        // atom cache.
        fragments: conn.atom_cache && conn.fragments,
        scratch: Vec::new(),
        seq: 0,
        inflight: Vec::new(),
    };
    let reason = write_loop(
        peer,
        k,
        id.tick(),
        &mut wr,
        &mut out,
        &mut reader,
        &mut ctl_rx,
    )
    .await;
    reader.abort();
    let _ = wr.shutdown().await;
    reason
}

/// A single message larger than this goes out in fragments of this size,
/// so that other shards' batches are written between them instead of
/// waiting behind it.
pub const FRAGMENT: usize = 64 * 1024;

/// A large message going out one fragment per writer pass, straight from
/// its batch buffer (no copy): fragment headers are written in front of
/// slices of it. Its terms keep their atoms as text (a fragment may declare
/// no cache entries), so it has no ordering ties to the atom cache.
struct InFlight {
    shard: usize,
    frame: Frame,
    seq: u64,
    /// The message's terms without their version bytes: two ranges of
    /// `frame.bytes` (control, payload).
    ranges: [std::ops::Range<usize>; 2],
    /// Term bytes already sent.
    sent: usize,
    /// Fragments still to send, this one included.
    left: u64,
}

impl InFlight {
    /// The terms of a plain frame (`<len:4> 112 131 control 131 payload`)
    /// without their version bytes, or `None` if it is not one.
    fn ranges(bytes: &[u8]) -> Option<[std::ops::Range<usize>; 2]> {
        if bytes.get(4..6)? != [112, 131] {
            return None;
        }
        let control_end = atom_cache::term_end(bytes, 6)?;
        if bytes.get(control_end) != Some(&131) {
            return None;
        }
        Some([6..control_end, control_end + 1..bytes.len()])
    }

    fn new(shard: usize, frame: Frame, seq: u64, ranges: [std::ops::Range<usize>; 2]) -> InFlight {
        let total = ranges[0].len() + ranges[1].len();
        InFlight {
            shard,
            frame,
            seq,
            ranges,
            sent: 0,
            left: total.div_ceil(FRAGMENT) as u64,
        }
    }

    /// Appends the next fragment's header to `headers` and returns the byte
    /// ranges of its data.
    fn next(&mut self, headers: &mut Vec<Vec<u8>>) -> Vec<std::ops::Range<usize>> {
        let total = self.ranges[0].len() + self.ranges[1].len();
        let len = FRAGMENT.min(total - self.sent);
        let first = self.sent == 0;
        let mut h = Vec::with_capacity(24);
        let frame_len = (2 + 16 + usize::from(first) + len) as u32;
        h.extend_from_slice(&frame_len.to_be_bytes());
        h.extend_from_slice(&[131, if first { 69 } else { 70 }]);
        h.extend_from_slice(&self.seq.to_be_bytes());
        h.extend_from_slice(&self.left.to_be_bytes());
        if first {
            // No atom cache references.
            h.push(0);
        }
        headers.push(h);
        let mut data = Vec::with_capacity(2);
        let (mut from, mut want) = (self.sent, len);
        for r in &self.ranges {
            if from >= r.len() {
                from -= r.len();
                continue;
            }
            let take = want.min(r.len() - from);
            data.push(r.start + from..r.start + from + take);
            want -= take;
            from = 0;
            if want == 0 {
                break;
            }
        }
        self.sent += len;
        self.left -= 1;
        data
    }
}

/// How frames leave: as built, or rewritten for the connection's atom
/// cache, large ones in fragments.
struct Out {
    cache: Option<OutCache>,
    fragments: bool,
    scratch: Vec<u8>,
    seq: u64,
    inflight: Vec<InFlight>,
}

impl Out {
    /// Writes plain frames (`<len> 112 ...`), through the cache if the
    /// connection has one (control messages: never fragmented).
    async fn write(
        &mut self,
        peer: &Peer,
        ls: &LinkStats,
        wr: &mut OwnedWriteHalf,
        frames: &[&[u8]],
        deadline: Option<Duration>,
    ) -> Result<(), Ended> {
        let Some(cache) = self.cache.as_mut() else {
            return write_with_deadline(ls, wr, frames, deadline).await;
        };
        self.scratch.clear();
        let hits = cache.hits;
        for f in frames {
            cache.encode(&f[5..], &mut self.scratch);
        }
        peer.stats
            .cached_atoms
            .fetch_add(cache.hits - hits, Ordering::Relaxed);
        let r = write_with_deadline(ls, wr, &[&self.scratch], deadline).await;
        self.trim();
        r
    }

    /// Whether `shard` has a message going out in fragments (its next
    /// batches wait: per-caller order).
    fn busy(&self, shard: usize) -> bool {
        self.inflight.iter().any(|i| i.shard == shard)
    }

    /// One writer pass: the batches taken now (`frames`, emptied) and one
    /// fragment of each message in flight, in one write. Batches that are
    /// completely written move to `done`. On error, `frames` holds the
    /// batches of this pass that were not written (for the accounting).
    async fn pass(
        &mut self,
        peer: &Peer,
        ls: &LinkStats,
        wr: &mut OwnedWriteHalf,
        frames: &mut Vec<(usize, Frame)>,
        done: &mut Vec<(usize, Frame)>,
        deadline: Option<Duration>,
    ) -> Result<(), Ended> {
        let Some(cache) = self.cache.as_mut() else {
            let slices: Vec<&[u8]> = frames.iter().map(|(_, f)| f.bytes.as_slice()).collect();
            let r = write_with_deadline(ls, wr, &slices, deadline).await;
            if r.is_ok() {
                done.append(frames);
            }
            return r;
        };
        self.scratch.clear();
        let hits = cache.hits;
        let mut whole = Vec::with_capacity(frames.len());
        for (shard, frame) in frames.drain(..) {
            // Only single large messages go in fragments: they carry
            // their atoms as text, which costs the receiver a lookup per
            // atom; a big batch of small messages is better off whole,
            // through the atom cache.
            if self.fragments && frame.count == 1 && frame.bytes.len() > FRAGMENT {
                if let Some(ranges) = InFlight::ranges(&frame.bytes) {
                    self.seq += 1;
                    ls.fragmented.fetch_add(1, Ordering::Relaxed);
                    self.inflight
                        .push(InFlight::new(shard, frame, self.seq, ranges));
                    continue;
                }
            }
            cache.encode(&frame.bytes[5..], &mut self.scratch);
            whole.push((shard, frame));
        }
        peer.stats
            .cached_atoms
            .fetch_add(cache.hits - hits, Ordering::Relaxed);
        // One fragment of every message in flight, after the whole batches.
        let mut headers = Vec::with_capacity(self.inflight.len());
        let data: Vec<Vec<std::ops::Range<usize>>> = self
            .inflight
            .iter_mut()
            .map(|f| f.next(&mut headers))
            .collect();
        let mut slices: Vec<&[u8]> = Vec::with_capacity(1 + 3 * self.inflight.len());
        slices.push(&self.scratch);
        for ((f, h), ranges) in self.inflight.iter().zip(&headers).zip(&data) {
            slices.push(h);
            for r in ranges {
                slices.push(&f.frame.bytes[r.clone()]);
            }
        }
        let r = write_with_deadline(ls, wr, &slices, deadline).await;
        drop(slices);
        self.trim();
        if r.is_err() {
            *frames = whole;
            return r;
        }
        done.append(&mut whole);
        let mut i = 0;
        while i < self.inflight.len() {
            if self.inflight[i].left == 0 {
                let f = self.inflight.swap_remove(i);
                done.push((f.shard, f.frame));
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// After a failed write: every message in flight is lost too.
    fn abandon(&mut self, frames: &mut Vec<(usize, Frame)>) {
        frames.extend(self.inflight.drain(..).map(|f| (f.shard, f.frame)));
    }

    fn trim(&mut self) {
        // Do not let one huge batch pin its memory in the scratch buffer.
        if self.scratch.capacity() > 1 << 20 {
            self.scratch = Vec::new();
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn write_loop(
    peer: &Arc<Peer>,
    k: usize,
    tick: Duration,
    wr: &mut OwnedWriteHalf,
    out: &mut Out,
    reader: &mut tokio::task::JoinHandle<String>,
    ctl_rx: &mut tokio::sync::mpsc::Receiver<Vec<u8>>,
) -> Ended {
    let link = &peer.links[k];
    let ls = &link.stats;
    let mine: Vec<usize> = (k..peer.shards.len()).step_by(peer.links.len()).collect();
    let mut frames: Vec<(usize, Frame)> = Vec::with_capacity(mine.len());
    let mut done: Vec<(usize, Frame)> = Vec::with_capacity(mine.len());
    let deadline = peer.config.stall_timeout;
    let mut last_write = Instant::now();
    loop {
        if peer.is_closed() {
            return "closed".into();
        }
        if reader.is_finished() {
            return reader
                .await
                .unwrap_or_else(|e| format!("reader: {e}"))
                .into();
        }
        while let Ok(ctl) = ctl_rx.try_recv() {
            if let Err(e) = out.write(peer, ls, wr, &[&ctl], deadline).await {
                return e;
            }
        }
        frames.extend(
            mine.iter()
                .filter(|&&s| !out.busy(s))
                .filter_map(|&s| peer.shards[s].take().map(|f| (s, f))),
        );
        if !frames.is_empty() || !out.inflight.is_empty() {
            let result = out
                .pass(peer, ls, wr, &mut frames, &mut done, deadline)
                .await;
            if result.is_err() {
                out.abandon(&mut frames);
            }
            // Written batches count; on error, the rest is lost. Either
            // way their bytes go back to the budget.
            let (n, b) = tally(&done);
            ls.batches.fetch_add(done.len() as u64, Ordering::Relaxed);
            ls.requests.fetch_add(n, Ordering::Relaxed);
            for (s, f) in done.drain(..) {
                peer.shards[s].recycle(f.bytes);
            }
            if let Err(e) = result {
                let (lost, lb) = tally(&frames);
                frames.clear();
                ls.dropped.fetch_add(lost, Ordering::Relaxed);
                peer.release(b + lb);
                return e;
            }
            peer.release(b);
            last_write = Instant::now();
            continue;
        }
        // Nothing to do: announce that we sleep, then look once more under
        // the shard locks (a push reads the flag under the same lock).
        link.sleeping.store(true, Ordering::SeqCst);
        if mine.iter().any(|&s| !peer.shards[s].is_empty()) {
            link.sleeping.store(false, Ordering::Relaxed);
            continue;
        }
        let tick_at = last_write + tick;
        tokio::select! {
            _ = link.notify.notified() => {}
            _ = peer.cancel.cancelled() => {}
            ctl = ctl_rx.recv() => {
                if let Some(ctl) = ctl {
                    if let Err(e) = out.write(peer, ls, wr, &[&ctl], deadline).await {
                        return e;
                    }
                }
            }
            r = &mut *reader => return r.unwrap_or_else(|e| format!("reader: {e}")).into(),
            _ = tokio::time::sleep_until(tick_at) => {
                if let Err(e) = write_with_deadline(ls, wr, &[&inbound::TICK], deadline).await {
                    return e;
                }
                last_write = Instant::now();
            }
        }
        link.sleeping.store(false, Ordering::Relaxed);
    }
}

/// Requests and element bytes in `frames`.
fn tally(frames: &[(usize, Frame)]) -> (u64, usize) {
    frames.iter().fold((0, 0), |(n, b), (_, f)| {
        (n + u64::from(f.count), b + f.payload)
    })
}

/// Why a connected link ended.
#[derive(Debug)]
struct Ended {
    why: String,
    /// A write missed its deadline: the peer is not draining.
    stalled: bool,
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

/// Bytes that must reach the socket within one stall deadline. Bounding
/// the piece, not the whole write, keeps the deadline a minimum-throughput
/// floor (a piece per `stall_timeout`) instead of a limit on write size,
/// so a slow but live peer is never taken for a stalled one.
pub const STALL_PIECE: usize = 256 * 1024;

async fn write_with_deadline(
    ls: &LinkStats,
    wr: &mut OwnedWriteHalf,
    bufs: &[&[u8]],
    deadline: Option<Duration>,
) -> Result<(), Ended> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    match write_all_vectored(wr, bufs, deadline).await {
        Ok(()) => {}
        Err(None) => {
            ls.stalls.fetch_add(1, Ordering::Relaxed);
            return Err(Ended {
                why: format!(
                    "stalled: {STALL_PIECE} bytes of a {total}-byte write not taken within {:?}",
                    deadline.unwrap_or_default()
                ),
                stalled: true,
            });
        }
        Err(Some(e)) => return Err(format!("write: {e}").into()),
    }
    ls.writes.fetch_add(1, Ordering::Relaxed);
    ls.bytes.fetch_add(total as u64, Ordering::Relaxed);
    Ok(())
}

/// Writes every buffer, in order, with as few syscalls as the socket
/// allows. With a `stall` deadline, every [`STALL_PIECE`] bytes must be
/// taken within it (the timer is armed per syscall and dropped when it
/// returns: nothing sweeps). `Err(None)`: stalled.
async fn write_all_vectored(
    wr: &mut OwnedWriteHalf,
    bufs: &[&[u8]],
    stall: Option<Duration>,
) -> Result<(), Option<std::io::Error>> {
    let (mut i, mut off) = (0usize, 0usize);
    let mut piece_left = STALL_PIECE;
    let mut piece_due = stall.map(|d| Instant::now() + d);
    while i < bufs.len() {
        let mut slices = Vec::with_capacity((bufs.len() - i).min(64));
        slices.push(IoSlice::new(&bufs[i][off..]));
        slices.extend(bufs[i + 1..].iter().take(63).map(|b| IoSlice::new(b)));
        let write = wr.write_vectored(&slices);
        let mut n = match piece_due {
            Some(due) => match tokio::time::timeout_at(due, write).await {
                Ok(r) => r.map_err(Some)?,
                Err(_) => return Err(None),
            },
            None => write.await.map_err(Some)?,
        };
        if n == 0 {
            return Err(Some(std::io::ErrorKind::WriteZero.into()));
        }
        if n >= piece_left {
            piece_left = STALL_PIECE;
            piece_due = stall.map(|d| Instant::now() + d);
        } else {
            piece_left -= n;
        }
        while n > 0 && i < bufs.len() {
            let rem = bufs[i].len() - off;
            if n >= rem {
                n -= rem;
                i += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
        while i < bufs.len() && bufs[i].len() == off {
            i += 1;
            off = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_cover_the_terms_and_count_down() {
        let header = BatchHeader::new("a_ecall_1@h", 1, "ecall_rx_1");
        let shard = Shard::new(&header, BatchCaps::default());
        let big = vec![7u8; 3 * FRAGMENT + 5];
        let mut element = vec![109];
        element.extend_from_slice(&(big.len() as u32).to_be_bytes());
        element.extend_from_slice(&big);
        shard.push(&element, || ());
        let frame = shard.take().unwrap();
        let ranges = InFlight::ranges(&frame.bytes).unwrap();
        let expect: Vec<u8> = ranges
            .iter()
            .flat_map(|r| frame.bytes[r.clone()].to_vec())
            .collect();
        let mut f = InFlight::new(0, frame, 9, ranges);
        assert_eq!(f.left, 4);
        let (mut headers, mut got) = (Vec::new(), Vec::new());
        while f.left > 0 {
            let left = f.left;
            let data = f.next(&mut headers);
            let h = headers.last().unwrap();
            let len: usize = data.iter().map(|r| r.len()).sum();
            assert_eq!(
                u32::from_be_bytes(h[..4].try_into().unwrap()) as usize,
                h.len() - 4 + len
            );
            assert_eq!(h[5], if left == 4 { 69 } else { 70 });
            assert_eq!(u64::from_be_bytes(h[6..14].try_into().unwrap()), 9);
            assert_eq!(u64::from_be_bytes(h[14..22].try_into().unwrap()), left);
            for r in data {
                got.extend_from_slice(&f.frame.bytes[r]);
            }
        }
        assert_eq!(got, expect);
        assert!(InFlight::ranges(&[0, 0, 0, 1, 131]).is_none());
    }

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
            },
            &[("a_ecall_1@h".into(), 1)],
        )
    }

    /// Callers waiting for room are admitted in the order they came, only as
    /// many as the freed room holds (no herd), and later callers queue
    /// behind them even when they would fit.
    #[test]
    fn waiters_are_admitted_in_order_without_a_herd() {
        let peer = test_peer(1000);
        let element: Vec<u8> = [109u8, 0, 0, 1, 0xf0]
            .into_iter()
            .chain(std::iter::repeat_n(7, 0x1f0))
            .collect();
        assert_eq!(element.len(), 501);
        assert_eq!(peer.push(0, &element, false), Push::Queued);
        assert_eq!(peer.push(0, &element, false), Push::Full);
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
        assert_eq!(peer.push(0, &[97, 1], false), Push::Full);
        // The writer writes the queued batch: the whole budget is free,
        // room for two waiters of 500, not three.
        let frame = peer.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(seen(&woken), [("first", true), ("second", true)]);
        assert_eq!(peer.push(0, &element[..500], true), Push::Queued);
        assert_eq!(peer.push(0, &element[..500], true), Push::Queued);
        let frame = peer.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(
            seen(&woken),
            [("first", true), ("second", true), ("third", true)]
        );
        assert_eq!(peer.stats.waits.load(Ordering::Relaxed), 3);
    }

    /// Closing releases every waiter, with no room.
    #[test]
    fn close_releases_waiters() {
        let peer = test_peer(10);
        let big = [109, 0, 0, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8];
        // Larger than the whole budget, nothing queued: it may go alone.
        assert_eq!(peer.push(0, &big, false), Push::Full);
        assert!(!peer.wait_room(13, Box::new(|_| ())));
        assert_eq!(peer.push(0, &big, true), Push::Queued);
        // Behind something queued, it waits.
        assert_eq!(peer.push(0, &big, false), Push::Full);
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
