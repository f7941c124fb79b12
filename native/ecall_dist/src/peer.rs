//! A peer: where callers push requests for one remote node.
//!
//! A [`Peer`] is the handle of one peer's state ([`PeerState`],
//! `link/peer_state.rs`, below this module because the links hold it
//! too): its shards, byte budget and links, one link ([`crate::link`]) per C-node
//! identity, each carrying every `links`-th shard (shard `s` goes on link
//! `s % links`). Dropping the handle closes the peer.
//!
//! - A push appends to the caller's shard and wakes the shard's link writer
//!   only if that writer is asleep; a busy writer finds the request on its
//!   next pass (the wake rules: `link/protocol.rs`).
//! - Memory: the element bytes queued for the peer are accounted in one
//!   budget. Past it, a push is refused with [`Push::Full`]; the caller may
//!   then wait for room ([`Peer::wait_room`]), and is woken in arrival order
//!   as writes free room.
//! - [`Peer::drain`] refuses new pushes and has the links write what is
//!   queued, then stop: an orderly close loses nothing.
//! - [`Peer::close`] stops the links, drops what is queued (counted in
//!   `dropped`) and releases every caller waiting for room.

use crate::error::Error;
use crate::link::protocol::AfterPush;
use crate::link::{self, worth_writing, LinkEvents, LinkStats, PeerConfig, PeerState, PeerStats};
use crate::net::identity::Identity;
use crate::queue::shard::{Backlog, Element, Shard};
use std::sync::atomic::Ordering;
use std::sync::Arc;

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

/// See the module docs.
pub struct Peer {
    state: Arc<PeerState>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("node", &self.state.config.node)
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
        let peer = Peer::new(config, &from);
        for (k, id) in identities.iter().enumerate() {
            let state = Arc::clone(&peer.state);
            rt.spawn(link::link_task(state, k, id.clone(), events.clone()));
        }
        Ok(Arc::new(peer))
    }

    /// A peer with no link task running (see [`PeerState::new`]).
    pub(crate) fn new(config: PeerConfig, from: &[(String, u32)]) -> Peer {
        Peer {
            state: Arc::new(PeerState::new(config, from)),
        }
    }

    /// What its links share with it: the links' own tests run a writer on
    /// it.
    #[cfg(test)]
    pub(crate) fn state(&self) -> &Arc<PeerState> {
        &self.state
    }

    /// Remote node name.
    pub fn node(&self) -> &str {
        self.state.node()
    }

    /// Counters of the peer (per link: [`Peer::link_stats`]).
    pub fn stats(&self) -> &PeerStats {
        &self.state.stats
    }

    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.state.shards.len()
    }

    /// Number of links.
    pub fn link_count(&self) -> usize {
        self.state.links.len()
    }

    /// The link that carries shard `shard % shard_count`.
    pub fn link_of_shard(&self, shard: usize) -> usize {
        self.state.link_of_shard(shard)
    }

    /// Counters of link `k`.
    pub fn link_stats(&self, k: usize) -> Option<&LinkStats> {
        self.state.links.get(k).map(|l| &l.stats)
    }

    /// Counts a request that the caller's overflow policy dropped.
    pub fn note_overflow_drop(&self) {
        self.state
            .stats
            .overflow_drops
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Whether link `k` is connected now.
    pub fn link_up(&self, k: usize) -> bool {
        self.state
            .links
            .get(k)
            .is_some_and(|l| l.stats.up.load(Ordering::Relaxed))
    }

    /// Whether a small push to link `k` would now be written by its caller
    /// (a lone write: the writer sleeps and the link has been quiet for
    /// [`LONE_GAP`](crate::link::tuning::LONE_GAP); see `link/lent_side.rs`).
    pub fn would_write_lone(&self, k: usize) -> bool {
        self.state.links.get(k).is_some_and(|l| l.lone_ready())
    }

    /// Whether [`Peer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.state.is_closed()
    }

    /// Gives `bytes` back to the budget (set aside by [`Peer::wait_room`]
    /// and not used: the caller is gone) and wakes, in order, the waiters
    /// that now fit. 0 does nothing.
    pub fn release(&self, bytes: usize) {
        self.state.release(bytes);
    }

    /// Element bytes queued now (a gauge), room set aside for woken
    /// callers included.
    pub fn queued_bytes(&self) -> usize {
        self.state.budget.queued()
    }

    /// Refuses new pushes and lets the links write what is queued, then
    /// stop (see [`PeerState::drain`]); [`Peer::close`] ends the drain.
    pub fn drain(&self) {
        self.state.drain();
    }

    /// Element bytes written and waiting for the peer's acknowledgement (a
    /// gauge; they are part of [`Peer::queued_bytes`]).
    pub fn retained_bytes(&self) -> usize {
        self.state.shards.iter().map(|s| s.retained_bytes()).sum()
    }

    /// Stops the links, drops what is queued and releases every waiter.
    pub fn close(&self) {
        self.state.close();
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
    /// atoms are all id references ([`crate::wire::fixed_atom_ids`]) is written without
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
    /// encoded, version byte already stripped): it becomes
    /// a batch of its own, built outside the shard lock.
    pub fn push_alone(&self, shard: usize, parts: &[&[u8]], reserved: usize) -> Push {
        let len = parts.iter().map(|p| p.len()).sum();
        self.push_with(shard, len, reserved, None, |s, under_lock| {
            s.push_alone(parts, under_lock)
        })
    }

    /// [`Peer::push_alone`] of a large message that goes straight to `to`
    /// on the peer, a pid, a registered name or an alias (external format
    /// without the version byte), instead of through the receiver: the peer
    /// decodes it in the receiving process, as a message sent with `!`.
    /// `parts`: the message in external format, version byte
    /// included. Per-caller order with the caller's earlier requests, which
    /// the receiver replays, is the caller's to keep (the Erlang side waits
    /// until they are replayed first); with its later ones it holds, as
    /// they follow on the same connection. `None` if `to` is not a pid, an
    /// atom or an alias (nothing queued).
    pub fn push_direct(
        &self,
        shard: usize,
        to: &[u8],
        parts: &[&[u8]],
        reserved: usize,
    ) -> Option<Push> {
        // A bad target is told from a closed shard here: both would
        // make the shard's push return None.
        crate::wire::etf::direct_control(to)?;
        let len = parts.iter().map(|p| p.len()).sum();
        Some(self.push_with(shard, len, reserved, None, |s, under_lock| {
            s.push_direct(to, parts, under_lock)
        }))
    }

    /// Writes what link `k`'s shards hold from the calling thread, once a
    /// push answered [`Push::Flush`]`(k)`: one non-blocking write, as the
    /// writer would make (see `LinkShared::flush` in `link/lent_side.rs`), or a
    /// wake-up of the writer when the load is its. Returns whether it
    /// should be called again (more came meanwhile). Never blocks.
    pub fn flush(&self, k: usize) -> bool {
        let Some(link) = self.state.links.get(k) else {
            return false;
        };
        let taken = link.flush(
            &self.state.shards,
            self.state.shards_of_link(k),
            &self.state.stats.cached_atoms,
        );
        let payload = taken.iter().map(|(_, f)| f.payload).sum();
        for (s, f) in taken {
            self.state.shards[s].recycle(f.bytes);
        }
        self.state.release(payload);
        // The writer sleeps once more, then every shard is looked at; a
        // push that came after the look asks for a flush of its own.
        link.proto.flush_ended(|| {
            self.state
                .shards_of_link(k)
                .any(|s| !self.state.shards[s].is_empty())
        })
    }

    /// Wakes link `k`'s writer (after [`Push::Flush`], when no flush
    /// can be arranged).
    pub fn wake_writer(&self, k: usize) {
        if self.state.links.get(k).is_some_and(|l| l.proto.hand_off()) {
            self.state.stats.wakes.fetch_add(1, Ordering::Relaxed);
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
        if self.state.refuses() {
            // Closed, or draining: a lone write must not reach a link that
            // is about to stop, and the shards take nothing either.
            self.state.release(reserved);
            return Push::Closed;
        }
        let admitted = reserved > 0;
        let st = &self.state.stats;
        if admitted {
            // The room was set aside when this caller was let in: a request
            // that encodes longer than the size it waited for (it is the
            // same request, so only by a byte or two, if ever) takes the
            // difference, a shorter one gives the rest back.
            self.state.budget.settle(reserved, len);
        } else if !self.state.budget.admit(len) {
            // Callers already waiting for room go first (no barging); an
            // oversized request is refused here too, and let through alone
            // by `wait_room` when nothing is queued.
            st.full.fetch_add(1, Ordering::Relaxed);
            return Push::Full;
        }
        let shard = shard % self.state.shards.len();
        let k = self.state.link_of_shard(shard);
        let link = &self.state.links[k];
        // Whether a push that would wake a sleeping writer asks for a
        // flush on the caller's side instead (`Peer::flush`).
        let flushes = self.state.config.flusher;
        if lone.is_some_and(|e| e.urgent) {
            link.stats.urgent.fetch_add(1, Ordering::Relaxed);
        }
        // A small request behind a sleeping writer goes to the socket at
        // once, from this thread (link/lent_side.rs). Not an admitted one: the
        // callers still waiting for room are woken by the writer's
        // releases, and only queued requests make the writer release.
        if let Some(element) = lone.filter(|_| !admitted) {
            if link.write_lone(
                &self.state.shards[shard],
                element,
                &st.cached_atoms,
                flushes,
            ) {
                // Written, and kept until acknowledged: its room goes
                // back then.
                st.pushed.fetch_add(1, Ordering::Relaxed);
                return Push::Queued;
            }
        }
        // The push side of the sleeping-writer protocol (link/protocol.rs).
        let under_lock = |b| link.proto.push_wakes(|| worth_writing(b));
        let Some(wakes) = push(&self.state.shards[shard], &under_lock) else {
            // Closed since the check above (close() runs concurrently).
            self.state.budget.forget(len);
            return Push::Closed;
        };
        // Behind a sleeping writer, a flush on the caller's side where the
        // link takes one; else a sleeping or gathering writer is woken.
        match link.proto.after_push(wakes, flushes) {
            AfterPush::Flush => {
                st.pushed.fetch_add(1, Ordering::Relaxed);
                return Push::Flush(k);
            }
            AfterPush::Woke => {
                st.wakes.fetch_add(1, Ordering::Relaxed);
            }
            AfterPush::Queued => {}
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
    /// `queue/budget.rs`.
    pub fn wait_room(&self, size: usize, wake: Box<dyn FnOnce(bool) + Send>) -> bool {
        if self.is_closed() {
            wake(false);
            return true;
        }
        let listed = self.state.budget.wait_room(size, wake);
        if listed {
            self.state.stats.waits.fetch_add(1, Ordering::Relaxed);
            // Closed while it registered: `close` may have taken the list
            // before this caller was on it.
            if self.is_closed() {
                for f in self.state.budget.close() {
                    f(false);
                }
            }
        }
        listed
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.state.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::state::Writer;
    use crate::queue::shard::BatchCaps;
    use crate::wire::etf::{BINARY_EXT, SMALL_INTEGER_EXT};
    use std::sync::Mutex;
    use std::time::Duration;

    fn test_peer(budget: usize) -> Peer {
        Peer::new(
            PeerConfig {
                node: "b@h".into(),
                cookie: "c".into(),
                receivers: vec!["ecall_rx_1".into()],
                shards: 1,
                caps: BatchCaps {
                    max_count: 1000,
                    max_bytes: 1 << 20,
                },
                max_queue_bytes: budget,
                stall_timeout: None,
                backoff_min: Duration::from_millis(1),
                backoff_max: Duration::from_millis(1),
                gather: true,
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
        let link = &peer.state.links[0];
        let wakes = || peer.state.stats.wakes.load(Ordering::Relaxed);
        assert_eq!(peer.push(0, &[97, 1], 0), Push::Queued);
        assert_eq!(wakes(), 0, "a busy writer is not woken");
        assert!(link.proto.may_sleep(|| false));
        peer.push(0, &[97, 2], 0);
        assert_eq!((wakes(), link.proto.writer()), (1, Writer::Awake));
        peer.push(0, &[97, 3], 0);
        assert_eq!(wakes(), 1);
        assert!(link.proto.may_gather(|| false));
        // Three are queued; the one that makes GATHER_REQUESTS wakes it.
        for i in 3..GATHER_REQUESTS - 1 {
            peer.push(0, &[97, (i % 200) as u8], 0);
            assert_eq!(wakes(), 1, "woken at {i} requests");
        }
        peer.push(0, &[97, 0], 0);
        assert_eq!((wakes(), link.proto.writer()), (2, Writer::Awake));
        assert_eq!(peer.state.shards[0].backlog().requests, GATHER_REQUESTS);
    }

    /// An urgent request (its caller waits for the answer before its next
    /// one) wakes a gathering writer at once, and is counted; once the
    /// writer has taken it, the shard is no longer urgent, so ordinary
    /// pushes that follow wait for company again.
    #[test]
    fn an_urgent_push_ends_gathering() {
        let peer = test_peer(1 << 20);
        let link = &peer.state.links[0];
        let wakes = || peer.state.stats.wakes.load(Ordering::Relaxed);
        let urgent = |b: &'static [u8]| Element {
            urgent: true,
            ..Element::text(b)
        };
        assert!(link.proto.may_gather(|| false));
        peer.push(0, &[97, 1], 0);
        assert_eq!(wakes(), 0, "an ordinary push waits for company");
        assert!(!peer.state.shards[0].backlog().urgent);
        assert_eq!(peer.push_element(0, urgent(&[97, 2]), 0), Push::Queued);
        assert_eq!((wakes(), link.proto.writer()), (1, Writer::Awake));
        assert_eq!(link.stats.urgent.load(Ordering::Relaxed), 1);
        assert!(link::worth_writing(peer.state.shards[0].backlog()));
        assert_eq!(peer.state.shards[0].take().map(|f| f.count), Some(2));
        assert!(link.proto.may_gather(|| false));
        peer.push(0, &[97, 3], 0);
        assert_eq!(wakes(), 1);
        assert!(!link::worth_writing(peer.state.shards[0].backlog()));
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
        let frame = peer.state.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(seen(&woken), [("first", true), ("second", true)]);
        assert_eq!(peer.push(0, &element[..500], 500), Push::Queued);
        assert_eq!(peer.push(0, &element[..500], 500), Push::Queued);
        let frame = peer.state.shards[0].take().unwrap();
        peer.release(frame.payload);
        assert_eq!(
            seen(&woken),
            [("first", true), ("second", true), ("third", true)]
        );
        assert_eq!(peer.state.stats.waits.load(Ordering::Relaxed), 3);
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
        let frame = peer.state.shards[0].take().unwrap();
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
        let frame = peer.state.shards[0].take().unwrap();
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
                    match peer.state.shards[0].take() {
                        Some(frame) => {
                            taken += frame.count as usize;
                            peer.release(frame.payload);
                        }
                        None => std::thread::yield_now(),
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "callers still blocked: {} waiting, {} bytes queued",
                        peer.state.budget.waiting(),
                        peer.queued_bytes()
                    );
                }
                while let Some(frame) = peer.state.shards[0].take() {
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
            peer.state.stats.pushed.load(Ordering::Relaxed),
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
