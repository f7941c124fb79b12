//! The write side of a connected link, and lone writes.
//!
//! A request pushed while its link's writer sleeps would wait for a thread
//! wake-up (a futex wake, then the runtime thread being scheduled) before
//! it reaches the socket: on two cores that hop is most of an idle round
//! trip, longer than a whole round trip by native `!` (the figures of
//! this file are in doc/performance.md, "Which write-path mechanisms earn
//! their place"). So while the writer sleeps it leaves its [`WriteSide`]
//! (socket, atom cache, buffers) in `LinkShared::proto`
//! (`Protocol::lend`), and a push that finds it there writes its
//! request itself, as a batch of one, with one non-blocking `send` on the
//! caller's thread ([`LinkShared::write_lone`]). Nothing waits: if the
//! socket takes only part of the frame, the rest goes to
//! [`WriteSide::pending`], for the writer to write before anything else;
//! if the lock is taken or the writer is awake, the push queues as usual.
//! Lone writes are for quiet links: a link written to (by its writer, or by
//! a lone write) within the last [`LONE_GAP`](super::tuning::LONE_GAP) is busy, and a request there
//! wakes the writer instead, so that what follows goes in batches. Except
//! an urgent request ([`Element::urgent`]: its caller is in a closed loop,
//! with few others): the writer would write it alone anyway, since such
//! requests are not held back for company, and the thread wake-up is most
//! of what a lone caller's round trip would pay.
//! With flushes (below) an urgent request goes alone only on a link quiet
//! for [`URGENT_GAP`](super::tuning::URGENT_GAP): closer together, urgent requests come from several
//! callers at once, each alone would be a `send` on each node, and a flush
//! writes them together without a thread wake-up either.
//!
//! Order: a lone write happens only while the writer sleeps, and the writer
//! sleeps only after it has written everything it took and found every
//! shard of the link empty (`Protocol::may_sleep`); a push that queues behind a
//! sleeping writer wakes it (`Protocol::after_push`) before its caller can push
//! again. So everything a caller pushed before is on the socket when its
//! request is written alone. The writer takes its side back (under the
//! same lock) before it writes anything, so writes never interleave.
//!
//! # Flushes
//!
//! The side a sleeping writer lends serves flushes too
//! ([`LinkShared::flush`], called by `Peer::flush`): where a push would
//! wake the writer, it asks for a flush (`Protocol::after_push`) and its caller
//! has a flush run soon. Pushes meanwhile wake nobody; the flush takes a
//! batch from each of the link's shards and writes them with one
//! non-blocking `send` on its own thread (a scheduler, on the BEAM). A
//! thread wake-up costs the writer more than the write, and closed loops
//! of many pairs of processes pay it on nearly every request. The writer
//! takes over when it is woken: by a flush that finds a load that is its
//! own (a sealed batch or [`GATHER_BYTES`](super::GATHER_BYTES) in a
//! shard, whose messages may go in fragments; TLS; a rest that a write
//! left), by a tick, or by a rest
//! the socket did not take. Order: a flush writes what it took under the
//! lock of the side; a lone write needs its own shard empty (an earlier
//! request of its caller's, pushed while a flush was asked for, may still
//! be queued there), so it never overtakes a queued request.

use super::clock::clock;
use super::counted_write::write_with_deadline;
use super::protocol::Flush;
use super::tuning::{LONE_GAP_NS, LONE_MAX, URGENT_GAP_NS};
use super::{LinkDown, LinkShared, LinkStats};
use crate::net::stream::LinkWrite;
use crate::queue::shard::{Element, Shard};
use crate::wire::conn_atom_cache::OutCache;
use crate::wire::frame::Frame;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What writes to one connection. The writer owns it while awake; while it
/// sleeps it is lent (`Protocol::lend`).
#[derive(Debug)]
pub(crate) struct WriteSide {
    pub(super) wr: LinkWrite,
    /// The connection's atom cache, if both sides use it.
    pub(super) cache: Option<OutCache>,
    /// Frames rewritten through the cache, for one write.
    pub(super) scratch: Vec<u8>,
    /// A lone request's frame, before the cache.
    plain: Vec<u8>,
    /// The part of a lone frame or a flush that the socket did not take at
    /// once: the writer writes it before anything else.
    pub(super) pending: Vec<u8>,
    /// The requests that `pending` completes, and their batches: counted
    /// as written when the writer has written it (they are kept until
    /// acknowledged either way: `queue/shard.rs`).
    pub(super) pending_requests: u64,
    pub(super) pending_batches: u64,
}

impl WriteSide {
    pub(super) fn new(wr: LinkWrite, atom_cache: bool) -> WriteSide {
        WriteSide {
            wr,
            cache: atom_cache.then(OutCache::default),
            scratch: Vec::new(),
            plain: Vec::new(),
            pending: Vec::new(),
            pending_requests: 0,
            pending_batches: 0,
        }
    }

    /// Writes `bufs` to the socket with the write deadline. TLS is flushed
    /// with them.
    pub(super) async fn write(
        &mut self,
        ls: &LinkStats,
        bufs: &[&[u8]],
        deadline: Option<Duration>,
    ) -> Result<(), LinkDown> {
        write_with_deadline(ls, &mut self.wr, bufs, deadline).await?;
        self.wr.flushed();
        Ok(())
    }

    /// [`WriteSide::write`] of what `scratch` holds, and then [`WriteSide::trim`].
    pub(super) async fn write_scratch(
        &mut self,
        ls: &LinkStats,
        deadline: Option<Duration>,
    ) -> Result<(), LinkDown> {
        let r = write_with_deadline(ls, &mut self.wr, &[&self.scratch], deadline).await;
        self.trim();
        r?;
        self.wr.flushed();
        Ok(())
    }

    /// Hands the TLS records a non-blocking write left with TLS to the
    /// socket, with the write deadline (see `LinkWrite::unsent`).
    pub(super) async fn flush(
        &mut self,
        ls: &LinkStats,
        deadline: Option<Duration>,
    ) -> Result<(), LinkDown> {
        write_with_deadline(ls, &mut self.wr, &[], deadline).await?;
        self.wr.flushed();
        Ok(())
    }

    /// Does not let one huge write pin its memory in the buffers.
    pub(super) fn trim(&mut self) {
        if self.scratch.capacity() > 1 << 20 {
            self.scratch = Vec::new();
        }
    }
}

impl WriteSide {
    /// One non-blocking write of `scratch` (`batches` batches, `requests`
    /// requests) from the caller's thread, counted; returns whether the
    /// socket took only part, whose rest is then `pending`, for the writer.
    /// Not writable now (`WouldBlock`), or failed: the writer writes it all,
    /// and meets the error, if there is one, which ends the link as usual.
    /// Batches and requests count as written once they all are: those of a
    /// rest, when the writer has written it (or as dropped, once, if its
    /// write fails).
    fn try_write_scratch(&mut self, ls: &LinkStats, batches: u64, requests: u64) -> bool {
        let written = self.wr.try_write(&self.scratch).unwrap_or(0);
        if written > 0 {
            ls.writes.fetch_add(1, Ordering::Relaxed);
            ls.bytes.fetch_add(written as u64, Ordering::Relaxed);
        }
        let partial = written < self.scratch.len();
        if partial {
            ls.lone_partial.fetch_add(1, Ordering::Relaxed);
            self.pending = self.scratch[written..].to_vec();
            self.pending_requests = requests;
            self.pending_batches = batches;
        } else {
            ls.batches.fetch_add(batches, Ordering::Relaxed);
            ls.requests.fetch_add(requests, Ordering::Relaxed);
        }
        // TLS records the socket did not take are the writer's too.
        partial || self.wr.unsent()
    }

    /// Whether a lone write may use this side: nothing left of an earlier
    /// lone write or flush (the writer, already woken, writes it; requests
    /// queue behind it).
    fn takes_lone(&self) -> bool {
        self.pending.is_empty() && !self.wr.unsent()
    }
}

impl LinkShared {
    /// The time now if the writer sleeps on a link quiet for `gap`
    /// nanoseconds (the clock is read only then: a push to a busy link
    /// pays one load).
    fn quiet_now(&self, gap: u64) -> Option<u64> {
        if !self.proto.sleeping() {
            return None;
        }
        let now = clock();
        (now.wrapping_sub(self.quiet_since.load(Ordering::Relaxed)) >= gap).then_some(now)
    }

    /// Whether a small push would be written alone now.
    pub(crate) fn lone_ready(&self) -> bool {
        self.quiet_now(LONE_GAP_NS).is_some() && self.proto.lent_is(WriteSide::takes_lone)
    }

    /// Writes `element` as a batch of one of `shard`, from the caller's
    /// thread, if the link's writer sleeps on a quiet link (see the module
    /// docs); returns whether it took the request (else the caller queues
    /// it). Never blocks: the lock is only tried and the socket is
    /// non-blocking. Atoms sent as cache references are added to
    /// `cached_atoms`. `flushes`: the link takes flushes
    /// (`PeerConfig::flusher`).
    pub(crate) fn write_lone(
        &self,
        shard: &Shard,
        element: Element<'_>,
        cached_atoms: &AtomicU64,
        flushes: bool,
    ) -> bool {
        if element.bytes.len() > LONE_MAX {
            return false;
        }
        // A link in use: this request wakes the writer, and those that
        // follow queue behind it, in batches. An urgent one goes alone on
        // a link quiet for URGENT_GAP where flushes would otherwise take
        // it, and at once where they would not.
        let gap = match (element.urgent, flushes) {
            (false, _) => LONE_GAP_NS,
            (true, true) => URGENT_GAP_NS,
            (true, false) => 0,
        };
        let Some(now) = self.quiet_now(gap) else {
            return false;
        };
        // Per-caller order: an earlier request of this caller's shard, pushed
        // while a flush was asked for (pushes then wake nobody), is still
        // queued; this one goes behind it. One taken by a flush is on the
        // socket already: flushes write under the side's lock.
        let own_shard_empty = || shard.is_empty();
        let written = self.proto.lend_to_lone(own_shard_empty, |side| {
            if !side.takes_lone() {
                return None;
            }
            // Numbered and kept in its shard until acknowledged; `None`
            // if the shard took a request meanwhile (this one queues).
            let text = shard.lone_frame(element, &mut side.plain, now)?;
            side.scratch.clear();
            let hits = crate::wire::frame::frame_out(
                side.cache.as_mut(),
                &side.plain,
                text,
                element.refs.into(),
                &mut side.scratch,
            );
            cached_atoms.fetch_add(hits, Ordering::Relaxed);
            // The rest goes with the writer, woken for it.
            let partial = side.try_write_scratch(&self.stats, 1, 1);
            self.stats.lone.fetch_add(1, Ordering::Relaxed);
            self.quiet_since.store(now, Ordering::Relaxed);
            Some(((), partial))
        });
        written.is_some()
    }
}

impl LinkShared {
    /// A flush on the caller's side (see `Peer::flush`): with the link
    /// flushing, takes a batch from each of `mine` and writes them
    /// with one non-blocking `send` from this thread, as the writer would.
    /// The writer is woken instead when its side is not lent (it is about
    /// to sleep, or awake), has a rest of an earlier write still pending,
    /// or a shard holds a full batch or [`GATHER_BYTES`]: a
    /// load that big is the writer's, which gathers and fragments. A rest
    /// the socket did not take goes to the writer, woken for it (its room
    /// goes back to the budget at once, as a lone write's does: at most
    /// what the shards held below the thresholds above, and flushes hand
    /// off while it is pending). The batches it wrote are kept in their
    /// shards until acknowledged; it returns those it took that have no
    /// number (direct messages, written, or their rest left to the
    /// writer), with their shards: their buffers go back to the shards,
    /// their room to the budget.
    ///
    /// The lock of the side is taken, not tried: besides the writer (which
    /// holds it to park or take back its side), only a lone write that
    /// began before the link was flushing can hold it, for one
    /// non-blocking `send`.
    ///
    /// [`GATHER_BYTES`]: super::GATHER_BYTES
    pub(crate) fn flush(
        &self,
        shards: &[Shard],
        mine: impl Iterator<Item = usize> + Clone,
        cached_atoms: &AtomicU64,
    ) -> Vec<(usize, Frame)> {
        let flushed = self.proto.lend_to_flush(|side| {
            // A load that big is the writer's (it gathers and fragments),
            // as is a rest of an earlier write.
            let big = mine.clone().any(|s| {
                let b = shards[s].backlog();
                b.requests == u32::MAX || b.bytes >= super::GATHER_BYTES
            });
            if big || !side.takes_lone() {
                return None;
            }
            side.scratch.clear();
            let mut hits = 0;
            let mut frames = Vec::new();
            for s in mine {
                if let Some(f) = shards[s].take() {
                    hits += crate::wire::frame::frame_out(
                        side.cache.as_mut(),
                        &f.bytes,
                        f.text,
                        f.refs,
                        &mut side.scratch,
                    );
                    frames.push((s, f));
                }
            }
            if frames.is_empty() {
                return Some((frames, false));
            }
            cached_atoms.fetch_add(hits, Ordering::Relaxed);
            let n: u64 = frames.iter().map(|(_, f)| u64::from(f.count)).sum();
            let partial = side.try_write_scratch(&self.stats, frames.len() as u64, n);
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
            side.trim();
            let now = clock();
            self.quiet_since.store(now, Ordering::Relaxed);
            // Kept until acknowledged, under the side's lock: a lone write
            // after this one keeps its batch after these (order of number).
            let unkept: Vec<(usize, Frame)> = frames
                .into_iter()
                .filter_map(|(s, f)| shards[s].retain(f, now).map(|f| (s, f)))
                .collect();
            Some((unkept, partial))
        });
        match flushed {
            Flush::Wrote(frames) => frames,
            Flush::NotFlushing => Vec::new(),
            Flush::HandedOff => {
                self.stats.flush_handoffs.fetch_add(1, Ordering::Relaxed);
                Vec::new()
            }
        }
    }
}

/// Lone writes and flushes on a real loopback connection, lent by the real
/// writer, with the real shards and budget of a peer (the writer's test
/// setup, `link/writer.rs`: only the reader is a stand-in). What a lent
/// write could not finish is the writer's: it writes it first, or, when the
/// socket fails, counts it dropped, once.
#[cfg(test)]
mod tests {
    use super::super::writer::tests::{binary, connection, peer, read_to_end, Running, SMALL};
    use super::*;
    use crate::link::LinkDown;
    use crate::peer::{Peer, Push};

    fn load(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    /// Yields until link 0's writer sleeps with its side lent (a condition,
    /// not a time: this runtime has one thread, the writer runs when this
    /// task yields).
    async fn writer_asleep(peer: &Peer) {
        let link = &peer.state().links[0];
        while !(link.proto.sleeping() && link.proto.lent_is(|_| true)) {
            tokio::task::yield_now().await;
        }
    }

    /// A request written alone to a socket that fails (its sending side
    /// shut down under the lent side): the caller's write takes nothing,
    /// leaves the whole frame to the writer and wakes it; the writer's
    /// write fails, which ends the link. The request is kept in its shard
    /// (numbered, its bytes in the budget), to go again on the next
    /// connection: not dropped, and not counted as written.
    #[tokio::test]
    async fn a_lone_write_that_fails_is_kept_for_the_next_connection() {
        let peer = peer(1, false);
        let (stream, _theirs) = connection().await;
        let run = Running::start(&peer, stream);
        writer_asleep(&peer).await;
        // Lone writes wait for a quiet link (LONE_GAP): a condition.
        while !peer.would_write_lone(0) {
            tokio::task::yield_now().await;
        }
        // SAFETY: the descriptor is open (the link's halves hold it).
        #[allow(unsafe_code)]
        let r = unsafe { libc::shutdown(run.fd, libc::SHUT_WR) };
        assert_eq!(r, 0);
        assert_eq!(peer.push(0, &SMALL, 0), Push::Queued);
        let ls = peer.link_stats(0).unwrap();
        assert_eq!((load(&ls.lone), load(&ls.lone_partial)), (1, 1));
        assert!(
            peer.state().shards[0].is_empty() && peer.state().shards[0].has_retained(),
            "written alone, not queued, and kept"
        );
        // The whole frame is the writer's now, woken for it (it has not run).
        let link = &peer.state().links[0];
        assert!(link
            .proto
            .lent_is(|s| s.pending_requests == 1 && s.pending.len() > SMALL.len()));
        assert_eq!(link.proto.writer(), crate::link::state::Writer::Awake);
        let why = run.task.await.unwrap();
        assert_eq!(why, LinkDown::Write(std::io::ErrorKind::BrokenPipe));
        assert_eq!(load(&ls.dropped), 0);
        assert_eq!(load(&ls.requests), 0);
        assert_eq!(peer.queued_bytes(), SMALL.len());
        assert_eq!(peer.retained_bytes(), SMALL.len());
    }

    /// A flush the socket takes only in part (three requests of 20 KB,
    /// more than the connection's buffers hold): the rest goes to the
    /// writer, woken for it, which writes it before anything queued
    /// after (a request pushed behind the flush): the peer reads the
    /// flush's batch whole, then that request. Each is counted written
    /// once, and the budget ends empty once the peer acknowledged them.
    #[tokio::test]
    async fn a_flush_taken_in_part_leaves_the_rest_to_the_writer_first() {
        let peer = peer(1, true);
        let (stream, mut theirs) = connection().await;
        let mut run = Running::start(&peer, stream);
        writer_asleep(&peer).await;
        let elements: Vec<Vec<u8>> = (1..=3).map(|i| binary(20_000, i)).collect();
        assert_eq!(peer.push(0, &elements[0], 0), Push::Flush(0));
        assert_eq!(peer.push(0, &elements[1], 0), Push::Queued);
        assert_eq!(peer.push(0, &elements[2], 0), Push::Queued);
        assert!(!peer.flush(0), "the writer has the rest: no flush again");
        let ls = peer.link_stats(0).unwrap();
        assert_eq!((load(&ls.flushes), load(&ls.lone_partial)), (1, 1));
        // The rest is the writer's, woken for it (it has not run yet).
        let link = &peer.state().links[0];
        assert!(link.proto.lent_is(
            |s| (s.pending_requests, s.pending_batches) == (3, 1) && !s.pending.is_empty()
        ));
        assert_eq!(link.proto.writer(), crate::link::state::Writer::Awake);
        // Kept until acknowledged.
        assert_eq!(peer.retained_bytes(), 60_015);
        assert_eq!(peer.push(0, &SMALL, 0), Push::Queued);
        let reading = tokio::spawn(async move { read_to_end(&mut theirs).await });
        writer_asleep(&peer).await;
        run.end_reader().await;
        let why = run.task.await.unwrap();
        assert_eq!(why, LinkDown::PeerClosed);
        let got = reading.await.unwrap();
        // Two frames (`<len:32> ...`): the flush's batch, then the request.
        let mut frames = Vec::new();
        let mut at = 0;
        while at < got.len() {
            let len = u32::from_be_bytes(got[at..at + 4].try_into().unwrap()) as usize;
            frames.push(&got[at + 4..at + 4 + len]);
            at += 4 + len;
        }
        assert_eq!(frames.len(), 2);
        let first = frames[0];
        let starts: Vec<usize> = elements
            .iter()
            .map(|e| first.windows(e.len()).position(|w| w == &e[..]).unwrap())
            .collect();
        assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
        assert!(frames[1].windows(SMALL.len()).any(|w| w == SMALL));
        assert_eq!((load(&ls.requests), load(&ls.batches)), (4, 2));
        assert_eq!(load(&ls.dropped), 0);
        super::super::writer::tests::ack_all(&peer);
        assert_eq!(peer.queued_bytes(), 0);
    }
}
