//! The writing half of a connected link.

use super::counted_write::write_with_deadline;
use super::pacing::Pacing;
use super::PeerState;
use super::{LinkDown, LinkShared, LinkStats, WriteSide, GATHER_WAIT, LINGER};
use crate::net::inbound;
use crate::wire::conn_atom_cache::OutCache;
use crate::wire::fragment::{InFlight, FRAGMENT};
use crate::wire::frame::Frame;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::net::stream::LinkWrite;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Writes what link `k`'s shards hold, the reader's answers and ticks to one
/// connection, until it fails or the peer closes.
///
/// How frames leave: as built, or rewritten for the connection's atom
/// cache, large ones in fragments.
pub(super) struct LinkWriter {
    peer: Arc<PeerState>,
    k: usize,
    /// The socket, atom cache and buffers: always here, except while the
    /// writer waits in [`LinkWriter::wait`] (then in
    /// `Protocol::lend`, for lone writes and flushes).
    side: Option<WriteSide>,
    /// Write at least this often.
    tick: Duration,
    /// Deadline of one socket write ([`crate::net::stall_write::STALL_PIECE`]).
    deadline: Option<Duration>,
    /// Whether large messages go in fragments.
    fragments: bool,
    /// Sequence id of the last fragmented message.
    seq: u64,
    /// Messages going out in fragments.
    inflight: Vec<InFlight>,
    /// When the socket was last written (a tick is due `tick` after it).
    last_write: Instant,
}

impl LinkWriter {
    /// The writer of link `k` on a connection whose write half is `wr`.
    pub(super) fn new(
        peer: Arc<PeerState>,
        k: usize,
        wr: LinkWrite,
        tick: Duration,
        atom_cache: bool,
        fragments: bool,
    ) -> LinkWriter {
        let deadline = peer.config.stall_timeout;
        LinkWriter {
            peer,
            k,
            side: Some(WriteSide::new(wr, atom_cache)),
            tick,
            deadline,
            // Fragments need the distribution header, which comes with the
            // atom cache.
            fragments: atom_cache && fragments,
            seq: 0,
            inflight: Vec::new(),
            last_write: Instant::now(),
        }
    }

    /// Writes until the connection fails, the `reader` ends or the peer
    /// closes; `ctl` carries the reader's answers. Then shuts the socket
    /// down and returns why.
    ///
    /// When the peer was closed on purpose the close lingers: after our
    /// FIN the reader goes on until the peer closes its side too (it has
    /// read everything by then), for at most [`LINGER`]. Dropping a socket
    /// with unread input sends a reset instead, and a reset can make the
    /// peer discard the last frames we wrote before it read them.
    ///
    /// Whatever it ends with, what it wrote or began to write is kept in
    /// its shards until acknowledged (`queue/shard.rs`): the link task
    /// writes it again on the next connection.
    pub(super) async fn run(
        mut self,
        mut reader: JoinHandle<LinkDown>,
        mut ctl: mpsc::Receiver<Vec<u8>>,
    ) -> LinkDown {
        let mut why = self.serve(&mut reader, &mut ctl).await;
        // Messages going out in fragments were taken off their shards and
        // began on the wire: at a close they are finished.
        if matches!(why, LinkDown::Closed) {
            if let Err(down) = self.finish_in_flight().await {
                why = down;
            }
        }
        self.keep_in_flight();
        if let Some(side) = self.side.as_mut() {
            let _ = side.wr.shutdown().await;
        }
        if matches!(why, LinkDown::Closed) && !reader.is_finished() {
            let _ = tokio::time::timeout(LINGER, &mut reader).await;
        }
        reader.abort();
        why
    }

    async fn serve(
        &mut self,
        reader: &mut JoinHandle<LinkDown>,
        ctl_rx: &mut mpsc::Receiver<Vec<u8>>,
    ) -> LinkDown {
        let peer = Arc::clone(&self.peer);
        let link = &peer.links[self.k];
        let ls = &link.stats;
        let mine: Vec<usize> = peer.shards_of_link(self.k).collect();
        let mut frames: Vec<(usize, Frame)> = Vec::with_capacity(mine.len());
        let mut done: Vec<(usize, Frame)> = Vec::with_capacity(mine.len());
        self.last_write = Instant::now();
        // When to gather (see `may_gather` and link/pacing.rs).
        let mut pacing = Pacing::default();
        loop {
            if peer.is_closed() {
                return LinkDown::Closed;
            }
            // Drained: everything its shards held is written (they take
            // nothing more), the messages in fragments are done, and the
            // peer has acknowledged all of it.
            if peer.is_draining() && self.inflight.is_empty() && peer.link_is_done(self.k) {
                return LinkDown::Closed;
            }
            if reader.is_finished() {
                return reader_end(reader.await);
            }
            if self.unacked_too_long() {
                return self.stalled();
            }
            while let Ok(ctl) = ctl_rx.try_recv() {
                if let Err(e) = self.write(&[&ctl]).await {
                    return e;
                }
            }
            if pacing.take_gather()
                && peer.config.gather
                && !peer.is_draining()
                && self.inflight.is_empty()
                && may_gather(&peer, link, &mine)
            {
                let until = Instant::now() + GATHER_WAIT;
                if let Some(down) = self.wait(reader, ctl_rx, until, false).await {
                    return down;
                }
                ls.gathers.fetch_add(1, Ordering::Relaxed);
            }
            frames.extend(
                mine.iter()
                    .filter(|&&s| !self.busy(s))
                    .filter_map(|&s| peer.shards[s].take().map(|f| (s, f))),
            );
            if !frames.is_empty() || !self.inflight.is_empty() {
                let result = self.pass(&mut frames, &mut done).await;
                match self.settle(result, &mut frames, &mut done) {
                    Ok(n) => pacing.passed(n),
                    Err(down) => return down,
                }
                continue;
            }
            if !may_sleep(&peer, link, &mine) {
                continue;
            }
            // Woken by the tick, or when written batches would have waited
            // too long for their acknowledgement.
            let tick_at = (self.last_write + self.tick).min(self.ack_deadline());
            let slept = Instant::now();
            if let Some(down) = self.wait(reader, ctl_rx, tick_at, true).await {
                return down;
            }
            // Woken that soon: requests are coming faster than passes of
            // one or two can follow, so the link is busy (see may_gather).
            pacing.slept(slept.elapsed());
        }
    }

    /// Waits for a push to wake the writer (the state was set by
    /// `may_sleep` or `may_gather`), a control frame to write, the reader
    /// to end, or `until`. A sleeping writer (`asleep`, not gathering) lends
    /// its side to lone writes meanwhile, and at `until` writes a tick.
    /// Returns why the link ends, if it does.
    async fn wait(
        &mut self,
        reader: &mut JoinHandle<LinkDown>,
        ctl_rx: &mut mpsc::Receiver<Vec<u8>>,
        until: Instant,
        asleep: bool,
    ) -> Option<LinkDown> {
        let peer = Arc::clone(&self.peer);
        let link = &peer.links[self.k];
        // Only a sleeping writer lends its side to lone writes: a
        // gathering one is busy, and requests should wait for company.
        if asleep {
            // Quiet from now on (before the side is lent: a lone write
            // right after this writer's last write would find a busy link).
            link.quiet_since
                .store(super::clock::clock(), Ordering::Relaxed);
            if let Some(side) = self.side.take() {
                link.proto.lend(side);
            }
        }
        // Draining, it waits for acknowledgements; before, for the drain.
        let draining = peer.is_draining();
        let woke = tokio::select! {
            _ = link.proto.wake.notified() => Woke::Push,
            _ = peer.cancel.cancelled() => Woke::Push,
            _ = peer.drain.cancelled(), if !draining => Woke::Push,
            _ = link.acked.notified(), if draining => Woke::Push,
            ctl = ctl_rx.recv() => Woke::Ctl(ctl),
            r = &mut *reader => Woke::Reader(reader_end(r)),
            _ = tokio::time::sleep_until(until) => Woke::Timer,
        };
        // Its side back (if lent) before anything is written.
        if let Some(side) = link.proto.woken() {
            self.side = Some(side);
        }
        let Some(side) = self.side.as_mut() else {
            // Only this writer parks and takes the side back.
            tracing::error!(link = self.k + 1, "link writer lost its socket");
            return Some(LinkDown::Write(std::io::ErrorKind::Other));
        };
        if side.pending.is_empty() && side.wr.unsent() {
            // TLS records a lone write or a flush left with TLS: out
            // before anything else (order).
            let r = side.flush(&link.stats, self.deadline).await;
            if let Err(down) = r {
                return Some(down);
            }
        }
        if !side.pending.is_empty() {
            // What a lone write or a flush left: before anything else
            // (order). It completes one request, or a flush's batches.
            let pending = std::mem::take(&mut side.pending);
            let requests = std::mem::take(&mut side.pending_requests);
            let batches = std::mem::take(&mut side.pending_batches);
            // Kept in its shard either way (written again if this fails).
            let r = side.write(&link.stats, &[&pending], self.deadline).await;
            if let Err(down) = r {
                return Some(down);
            }
            link.stats.batches.fetch_add(batches, Ordering::Relaxed);
            link.stats.requests.fetch_add(requests, Ordering::Relaxed);
            self.last_write = Instant::now();
        }
        match woke {
            Woke::Push => None,
            Woke::Ctl(Some(ctl)) => self.write(&[&ctl]).await.err(),
            Woke::Ctl(None) => None,
            Woke::Reader(down) => Some(down),
            Woke::Timer if asleep => {
                let r = side
                    .write(&link.stats, &[&inbound::TICK], self.deadline)
                    .await;
                self.last_write = Instant::now();
                r.err()
            }
            Woke::Timer => None,
        }
    }

    /// Writes plain frames (`<len> 112 ...`), through the cache if the
    /// connection has one (control messages: never fragmented).
    async fn write(&mut self, frames: &[&[u8]]) -> Result<(), LinkDown> {
        let ls = &self.peer.links[self.k].stats;
        let side = side_of(&mut self.side)?;
        let Some(cache) = side.cache.as_mut() else {
            return side.write(ls, frames, self.deadline).await;
        };
        side.scratch.clear();
        // Answers and ticks: atoms as text.
        let hits: u64 = frames
            .iter()
            .map(|f| {
                crate::wire::frame::frame_out(Some(&mut *cache), f, true, 0, &mut side.scratch)
            })
            .sum();
        self.peer
            .stats
            .cached_atoms
            .fetch_add(hits, Ordering::Relaxed);
        side.write_scratch(ls, self.deadline).await
    }

    /// Whether written batches have waited `stall_timeout` for an
    /// acknowledgement with none coming.
    fn unacked_too_long(&self) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        let since = self.peer.link_waiting_since(self.k);
        since != 0 && super::clock::clock().saturating_sub(since) >= deadline.as_nanos() as u64
    }

    /// When written batches will have waited `stall_timeout` for an
    /// acknowledgement (far away when none waits).
    fn ack_deadline(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        let Some(deadline) = self.deadline else {
            return far;
        };
        match self.peer.link_waiting_since(self.k) {
            0 => far,
            since => {
                let waited = super::clock::clock().saturating_sub(since);
                Instant::now() + deadline.saturating_sub(Duration::from_nanos(waited))
            }
        }
    }

    /// The peer acknowledged nothing within the deadline: reaped, counted
    /// as a stall.
    fn stalled(&self) -> LinkDown {
        let link = &self.peer.links[self.k];
        link.stats.stalls.fetch_add(1, Ordering::Relaxed);
        LinkDown::Stalled
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
        frames: &mut Vec<(usize, Frame)>,
        done: &mut Vec<(usize, Frame)>,
    ) -> Result<(), LinkDown> {
        let ls = &self.peer.links[self.k].stats;
        let side = side_of(&mut self.side)?;
        let Some(cache) = side.cache.as_mut() else {
            // No atom cache: ids written back as text.
            side.scratch.clear();
            for (_, f) in frames.iter() {
                crate::wire::frame::frame_out(None, &f.bytes, f.text, f.refs, &mut side.scratch);
            }
            let r = side.write_scratch(ls, self.deadline).await;
            if r.is_ok() {
                done.append(frames);
            }
            return r;
        };
        side.scratch.clear();
        let mut fragments = Fragments {
            on: self.fragments,
            seq: &mut self.seq,
            inflight: &mut self.inflight,
        };
        let (mut whole, hits) = fragments.split(frames, cache, &mut side.scratch, ls);
        self.peer
            .stats
            .cached_atoms
            .fetch_add(hits, Ordering::Relaxed);
        // One fragment of every message in flight, after the whole batches.
        // A first fragment declares the ids its message may refer to, after
        // the whole batches of this pass (which go out before it).
        let mut headers = Vec::with_capacity(self.inflight.len());
        let data: Vec<Vec<std::ops::Range<usize>>> = self
            .inflight
            .iter_mut()
            .map(|f| f.next(&mut headers, cache))
            .collect();
        let mut slices: Vec<&[u8]> = Vec::with_capacity(1 + 3 * self.inflight.len());
        slices.push(&side.scratch);
        for ((f, h), ranges) in self.inflight.iter().zip(&headers).zip(&data) {
            slices.push(h);
            for r in ranges {
                slices.push(&f.frame.bytes[r.clone()]);
            }
        }
        let r = write_with_deadline(ls, &mut side.wr, &slices, self.deadline).await;
        drop(slices);
        side.trim();
        if r.is_err() {
            *frames = whole;
            return r;
        }
        done.append(&mut whole);
        retire_sent(&mut self.inflight, done);
        Ok(())
    }

    /// After a pass that ended with `result`: counts the batches it wrote
    /// (`done`, emptied) and keeps them in their shards until the peer
    /// acknowledges them; on an error, what it did not write (`frames`,
    /// emptied, and every message in flight) is kept too, to be written
    /// again on the next connection. The bytes stay in the budget until
    /// the acknowledgement. The requests written, or why the link ends.
    fn settle(
        &mut self,
        result: Result<(), LinkDown>,
        frames: &mut Vec<(usize, Frame)>,
        done: &mut Vec<(usize, Frame)>,
    ) -> Result<u64, LinkDown> {
        if result.is_err() {
            self.abandon(frames);
        }
        let ls = &self.peer.links[self.k].stats;
        let (n, _) = tally(done);
        ls.batches.fetch_add(done.len() as u64, Ordering::Relaxed);
        ls.requests.fetch_add(n, Ordering::Relaxed);
        for (s, f) in done.drain(..) {
            self.keep(s, f, true);
        }
        if let Err(down) = result {
            for (s, f) in frames.drain(..) {
                self.keep(s, f, false);
            }
            return Err(down);
        }
        self.last_write = Instant::now();
        Ok(n)
    }

    /// Keeps frame `f` of shard `s` until acknowledged. A direct message
    /// (no number) is not kept: its buffer and room go back, and if it was
    /// not `written` it is lost, counted in `dropped`.
    fn keep(&self, s: usize, f: Frame, written: bool) {
        let peer = &self.peer;
        if let Some(f) = peer.shards[s].retain(f, super::clock::clock()) {
            if !written {
                peer.links[self.k]
                    .stats
                    .dropped
                    .fetch_add(u64::from(f.count), Ordering::Relaxed);
            }
            peer.release(f.payload);
            peer.shards[s].recycle(f.bytes);
        }
    }

    /// After the peer's close: passes until every message in flight has
    /// gone out whole. A write that fails keeps them (see
    /// [`LinkWriter::settle`]).
    async fn finish_in_flight(&mut self) -> Result<(), LinkDown> {
        let (mut frames, mut done) = (Vec::new(), Vec::new());
        while !self.inflight.is_empty() {
            let result = self.pass(&mut frames, &mut done).await;
            self.settle(result, &mut frames, &mut done)?;
        }
        Ok(())
    }

    /// When the connection ends: the messages still in flight are kept in
    /// their shards, to go again whole.
    fn keep_in_flight(&mut self) {
        let mut frames = Vec::new();
        self.abandon(&mut frames);
        for (s, f) in frames {
            self.keep(s, f, false);
        }
    }

    /// After a failed write: every message in flight is not written
    /// either.
    fn abandon(&mut self, frames: &mut Vec<(usize, Frame)>) {
        frames.extend(self.inflight.drain(..).map(|f| (f.shard, f.frame)));
    }
}

/// A pass's view of the messages going out in fragments.
struct Fragments<'a> {
    /// Whether the connection takes fragments.
    on: bool,
    seq: &'a mut u64,
    inflight: &'a mut Vec<InFlight>,
}

impl Fragments<'_> {
    /// Rewrites the batches of a pass (`frames`, emptied) through the
    /// connection's atom cache into `scratch`. A single large message
    /// starts going out in fragments instead: only those go in fragments,
    /// as they are, since their atoms as text cost the receiver a lookup
    /// each, and a big batch of small messages is better off whole,
    /// through the cache. Returns the whole batches, and the atoms written
    /// as cache references.
    fn split(
        &mut self,
        frames: &mut Vec<(usize, Frame)>,
        cache: &mut OutCache,
        scratch: &mut Vec<u8>,
        ls: &LinkStats,
    ) -> (Vec<(usize, Frame)>, u64) {
        let mut hits = 0;
        let mut whole = Vec::with_capacity(frames.len());
        for (shard, frame) in frames.drain(..) {
            if self.on && frame.count == 1 && frame.bytes.len() > FRAGMENT {
                if let Some(ranges) = InFlight::ranges(&frame.bytes) {
                    *self.seq += 1;
                    ls.fragmented.fetch_add(1, Ordering::Relaxed);
                    // Its ids go as they are, declared by its first fragment.
                    hits += frame.refs;
                    self.inflight
                        .push(InFlight::new(shard, frame, *self.seq, ranges));
                    continue;
                }
            }
            hits += crate::wire::frame::frame_out(
                Some(&mut *cache),
                &frame.bytes,
                frame.text,
                frame.refs,
                scratch,
            );
            whole.push((shard, frame));
        }
        (whole, hits)
    }
}

/// Moves the messages whose last fragment went out from `inflight` to
/// `done`.
fn retire_sent(inflight: &mut Vec<InFlight>, done: &mut Vec<(usize, Frame)>) {
    let mut i = 0;
    while i < inflight.len() {
        if inflight[i].left == 0 {
            let f = inflight.swap_remove(i);
            done.push((f.shard, f.frame));
        } else {
            i += 1;
        }
    }
}

/// Whether the writer may sleep: nothing queued in its shards, looked at
/// after it announced sleep (`Protocol::may_sleep`).
fn may_sleep(peer: &PeerState, link: &LinkShared, mine: &[usize]) -> bool {
    link.proto
        .may_sleep(|| mine.iter().any(|&s| !peer.shards[s].is_empty()))
}

/// Coalescing, the same protocol with another threshold: on a busy link
/// (the last pass wrote [`GATHER_AFTER`](super::GATHER_AFTER) requests or
/// more, or a push woke the writer less than
/// [`BUSY_SLEEP`](super::BUSY_SLEEP) after it went to sleep) the writer
/// does not take the few that came meanwhile at once: it waits until one
/// of its shards holds [`GATHER_REQUESTS`](super::GATHER_REQUESTS) or
/// [`GATHER_BYTES`](super::GATHER_BYTES) or an urgent
/// request (a push that sees it wakes the writer: `worth_writing`)
/// or [`GATHER_WAIT`] has passed. Fewer, larger
/// batches: fewer writes and wake-ups here, and on the peer fewer messages
/// to decode and receiver wake-ups, for at most `GATHER_WAIT` of latency on
/// a busy link. A lone request on a quiet link never waits: the pass before
/// it wrote less than `GATHER_AFTER` and the writer slept longer than
/// `BUSY_SLEEP` (or the request was written alone: `link/lent_side.rs`).
///
/// Returns whether the writer should wait (no shard is past a threshold).
fn may_gather(peer: &PeerState, link: &LinkShared, mine: &[usize]) -> bool {
    link.proto.may_gather(|| {
        mine.iter()
            .any(|&s| super::worth_writing(peer.shards[s].backlog()))
    })
}

/// Why a [`LinkWriter::wait`] ended.
enum Woke {
    /// A push (or the peer's close: the loop looks at it first).
    Push,
    /// A control frame from the reader to write (`None`: the reader ended).
    Ctl(Option<Vec<u8>>),
    /// The reader ended.
    Reader(LinkDown),
    /// The deadline passed.
    Timer,
}

/// The writer's side, which is always there outside [`LinkWriter::wait`].
fn side_of(side: &mut Option<WriteSide>) -> Result<&mut WriteSide, LinkDown> {
    side.as_mut()
        .ok_or(LinkDown::Write(std::io::ErrorKind::Other))
}

/// Why the reader task stopped.
fn reader_end(r: Result<LinkDown, tokio::task::JoinError>) -> LinkDown {
    // A reader that panicked (it is never cancelled while the writer runs)
    // is a read that failed.
    r.unwrap_or_else(|e| {
        tracing::error!(error = %e, "link reader failed");
        LinkDown::Read(std::io::ErrorKind::Other)
    })
}

/// Requests and element bytes in `frames`.
fn tally(frames: &[(usize, Frame)]) -> (u64, usize) {
    frames.iter().fold((0, 0), |(n, b), (_, f)| {
        (n + u64::from(f.count), b + f.payload)
    })
}

/// The writer on a real loopback connection, with the real shards and byte
/// budget of a [`Peer`](crate::peer::Peer): its failure paths. Only its
/// reader is a stand-in (it is not the subject), one that ends when a test
/// says, as a real one does when the peer closes. The connection's buffers
/// are as small as the kernel allows and the test's end of it reads only
/// when a test says, so a write larger than they hold is certain not to
/// finish until then: every step below waits on bytes or on a task, never
/// on time.
#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::link::PeerConfig;
    use crate::net::stream::{LinkRead, LinkStream};
    use crate::peer::{Peer, Push};
    use crate::queue::shard::BatchCaps;
    use crate::wire::etf::{BINARY_EXT, SMALL_INTEGER_EXT};
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpSocket, TcpStream};
    use tokio::sync::oneshot;

    /// A peer of one link over `shards` shards, no link task running, no
    /// write deadline (a test's pauses are never a stall).
    pub(in crate::link) fn peer(shards: usize, flusher: bool) -> Peer {
        Peer::new(
            PeerConfig {
                node: "b@h".into(),
                cookie: "c".into(),
                receivers: vec!["ecall_rx_1".into()],
                shards,
                caps: BatchCaps {
                    max_count: 1000,
                    max_bytes: 1 << 20,
                },
                max_queue_bytes: 1 << 24,
                stall_timeout: None,
                backoff_min: Duration::from_millis(1),
                backoff_max: Duration::from_millis(1),
                gather: false,
                flusher,
            },
            &[("a_ecall_1@h".into(), 1)],
        )
    }

    /// A binary term of `n` bytes of `fill`, as a request's element.
    pub(in crate::link) fn binary(n: usize, fill: u8) -> Vec<u8> {
        let mut e = vec![BINARY_EXT];
        e.extend_from_slice(&(n as u32).to_be_bytes());
        e.resize(5 + n, fill);
        e
    }

    /// A small request, to queue behind others.
    pub(in crate::link) const SMALL: [u8; 2] = [SMALL_INTEGER_EXT, 77];

    /// A loopback connection: the link's end, and the peer's, with the
    /// smallest buffers the kernel allows (a few KiB each way).
    pub(in crate::link) async fn connection() -> (LinkStream, TcpStream) {
        let listener = TcpSocket::new_v4().unwrap();
        listener.set_recv_buffer_size(1).unwrap();
        listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = listener.listen(1).unwrap();
        let ours = TcpSocket::new_v4().unwrap();
        ours.set_send_buffer_size(1).unwrap();
        let (ours, theirs) = tokio::join!(ours.connect(addr), listener.accept());
        (LinkStream::Tcp(ours.unwrap()), theirs.unwrap().0)
    }

    /// Link 0's writer running on `stream`.
    pub(in crate::link) struct Running {
        pub(in crate::link) task: JoinHandle<LinkDown>,
        /// The raw descriptor of the link's socket.
        pub(in crate::link) fd: std::os::fd::RawFd,
        end_reader: oneshot::Sender<()>,
        reader_ended: oneshot::Receiver<()>,
        /// Kept open: the reader's half and its answers.
        _rd: LinkRead,
        _ctl: mpsc::Sender<Vec<u8>>,
    }

    impl Running {
        /// Link 0's writer of `peer` on `stream`, as a link task starts it
        /// (atom cache and fragments on), with a tick too far away to come.
        pub(in crate::link) fn start(peer: &Peer, stream: LinkStream) -> Running {
            let fd = stream.raw_fd();
            let (rd, wr) = stream.into_split();
            let (ctl_tx, ctl_rx) = mpsc::channel(16);
            let (end_reader, end_rx) = oneshot::channel::<()>();
            let (ended_tx, reader_ended) = oneshot::channel();
            let reader = tokio::spawn(async move {
                let _ = end_rx.await;
                let _ = ended_tx.send(());
                LinkDown::PeerClosed
            });
            let hour = Duration::from_secs(3600);
            let writer = LinkWriter::new(Arc::clone(peer.state()), 0, wr, hour, true, true);
            Running {
                task: tokio::spawn(writer.run(reader, ctl_rx)),
                fd,
                end_reader,
                reader_ended,
                _rd: rd,
                _ctl: ctl_tx,
            }
        }

        /// Ends the reader, as the peer's close does, and returns once it
        /// has ended (on this single-threaded runtime its task is done by
        /// the time this one runs again).
        pub(in crate::link) async fn end_reader(&mut self) {
            let (tx, _) = oneshot::channel();
            let _ = std::mem::replace(&mut self.end_reader, tx).send(());
            (&mut self.reader_ended).await.unwrap();
        }
    }

    /// Reads what has come, at least one byte: how many.
    pub(in crate::link) async fn read_some(theirs: &mut TcpStream) -> usize {
        let mut buf = [0u8; 1024];
        let n = theirs.read(&mut buf).await.unwrap();
        assert!(n > 0, "the link wrote nothing");
        n
    }

    /// Reads until the link's end shuts its socket down.
    pub(in crate::link) async fn read_to_end(theirs: &mut TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        theirs.read_to_end(&mut got).await.unwrap();
        got
    }

    fn load(a: &std::sync::atomic::AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    /// Acknowledges everything the shards of `peer` numbered, as the
    /// peer's receivers would.
    pub(in crate::link) fn ack_all(peer: &Peer) {
        let st = peer.state();
        for (s, shard) in st.shards.iter().enumerate() {
            let seq = shard.last_seq();
            if seq > 0 {
                assert!(st.ack(st.link_of_shard(s), st.epoch, s as u32, seq));
            }
        }
    }

    /// The reader ends (the peer closed) while a message is going out in
    /// fragments: the first fragment is on the wire, the others never
    /// go. The message is kept in its shard, its bytes in the budget, to
    /// go again whole on the next connection; nothing is dropped, and it
    /// is not counted as written.
    #[tokio::test]
    async fn reader_ending_mid_fragments_keeps_the_message() {
        let peer = peer(1, false);
        let (stream, mut theirs) = connection().await;
        let big = binary(4 * FRAGMENT, 1);
        assert_eq!(peer.push_alone(0, &[&big], 0), Push::Queued);
        assert_eq!(peer.queued_bytes(), big.len());
        let mut run = Running::start(&peer, stream);
        // Its first fragment has begun, and cannot end before we read.
        let mut got = read_some(&mut theirs).await;
        let ls = peer.link_stats(0).unwrap();
        assert_eq!(load(&ls.fragmented), 1);
        assert!(peer.state().shards[0].is_empty());
        run.end_reader().await;
        got += read_to_end(&mut theirs).await.len();
        let why = run.task.await.unwrap();
        assert_eq!(why, LinkDown::PeerClosed);
        assert_eq!(load(&ls.dropped), 0);
        assert_eq!(peer.queued_bytes(), big.len());
        assert_eq!(peer.retained_bytes(), big.len());
        assert_eq!((load(&ls.requests), load(&ls.batches)), (0, 0));
        // One fragment went, and no more.
        assert_eq!(got as u64, load(&ls.bytes));
        assert!(got > FRAGMENT && got < 2 * FRAGMENT, "{got} bytes");
        // The next connection writes it again, first.
        peer.state().rewind_link(0);
        assert_eq!(peer.state().shards[0].take().map(|f| f.seq), Some(1));
    }

    /// The peer is closed while a message is going out in fragments: the
    /// close drops what is still queued (a request behind it on its
    /// shard, counted in the peer's `dropped`), but the message it began
    /// is finished, written whole and counted as written; the budget ends
    /// empty and nothing is unconfirmed (our close lingers).
    #[tokio::test]
    async fn close_mid_fragments_finishes_the_message_and_drops_the_queue() {
        let peer = peer(1, false);
        let (stream, mut theirs) = connection().await;
        let big = binary(4 * FRAGMENT, 1);
        assert_eq!(peer.push_alone(0, &[&big], 0), Push::Queued);
        let mut run = Running::start(&peer, stream);
        let mut got = read_some(&mut theirs).await;
        // Behind it on its shard (which waits: per-caller order).
        assert_eq!(peer.push(0, &SMALL, 0), Push::Queued);
        peer.close();
        assert_eq!(load(&peer.stats().dropped), 1);
        got += read_to_end(&mut theirs).await.len();
        // The peer closes its side in turn: the writer's linger ends.
        run.end_reader().await;
        let why = run.task.await.unwrap();
        assert_eq!(why, LinkDown::Closed);
        let ls = peer.link_stats(0).unwrap();
        assert_eq!((load(&ls.requests), load(&ls.batches)), (1, 1));
        assert_eq!(load(&ls.dropped), 0);
        assert_eq!(peer.queued_bytes(), 0);
        assert_eq!(got as u64, load(&ls.bytes));
        assert!(got > big.len(), "{got} bytes");
    }

    /// A drain (an orderly close): pushes are refused from then on, the
    /// writer writes everything its shards held, whole, waits until the
    /// peer has acknowledged all of it, shuts its socket down and stops as
    /// at a close; nothing is dropped, and the budget ends empty.
    #[tokio::test]
    async fn a_drain_writes_everything_queued_then_stops() {
        let peer = peer(2, false);
        let (stream, mut theirs) = connection().await;
        let run = Running::start(&peer, stream);
        let big = binary(4 * FRAGMENT, 1);
        for _ in 0..100 {
            assert_eq!(peer.push(0, &SMALL, 0), Push::Queued);
            assert_eq!(peer.push(1, &SMALL, 0), Push::Queued);
        }
        assert_eq!(peer.push_alone(1, &[&big], 0), Push::Queued);
        peer.drain();
        assert_eq!(peer.push(0, &SMALL, 0), Push::Closed);
        assert_eq!(peer.push_alone(1, &[&big], 0), Push::Closed);
        // The writer writes everything, then waits for the peer's
        // acknowledgements before it stops.
        let mut got = 0;
        while peer.retained_bytes() < big.len() + 200 * SMALL.len() {
            got += read_some(&mut theirs).await;
        }
        assert!(!run.task.is_finished());
        ack_all(&peer);
        got += read_to_end(&mut theirs).await.len();
        drop(theirs);
        let why = run.task.await.unwrap();
        assert_eq!(why, LinkDown::Closed);
        let ls = peer.link_stats(0).unwrap();
        assert_eq!(load(&ls.requests), 201);
        assert_eq!(load(&ls.dropped) + load(&peer.stats().dropped), 0);
        assert_eq!(got as u64, load(&ls.bytes));
        assert!(got > big.len() + 200 * SMALL.len());
        assert_eq!(peer.queued_bytes(), 0);
        assert!(peer.state().shards.iter().all(|s| s.is_empty()));
    }

    /// The connection fails (the peer resets it) while the writer is in
    /// the middle of a pass: a whole batch of another shard and the first
    /// fragment of a large message. Both are kept, their bytes in the
    /// budget, to go again on the next connection; nothing counts as
    /// written or dropped.
    #[tokio::test]
    async fn failed_write_mid_fragments_keeps_the_whole_pass() {
        let peer = peer(2, false);
        let (stream, mut theirs) = connection().await;
        let big = binary(4 * FRAGMENT, 1);
        assert_eq!(peer.push(1, &SMALL, 0), Push::Queued);
        assert_eq!(peer.push_alone(0, &[&big], 0), Push::Queued);
        let run = Running::start(&peer, stream);
        read_some(&mut theirs).await;
        // Closed with unread bytes and no linger: a reset.
        theirs.set_zero_linger().unwrap();
        drop(theirs);
        let why = run.task.await.unwrap();
        assert!(matches!(why, LinkDown::Write(_)), "{why:?}");
        let ls = peer.link_stats(0).unwrap();
        assert_eq!(load(&ls.dropped), 0);
        assert_eq!((load(&ls.requests), load(&ls.batches)), (0, 0));
        assert_eq!(peer.queued_bytes(), big.len() + SMALL.len());
        assert_eq!(peer.retained_bytes(), big.len() + SMALL.len());
        peer.state().rewind_link(0);
        assert_eq!(peer.retained_bytes(), 0);
        assert!(peer.state().shards.iter().all(|s| !s.is_empty()));
    }
}
