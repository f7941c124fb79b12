//! The sleeping-writer protocol: what a push, a lone write, a flush and a
//! link's writer do around the writer's state (`link/state.rs`) and the
//! write side the writer lends while it sleeps. Every step of it is a
//! method of [`Protocol`]; `peer.rs`, `side.rs` and `writer.rs` call only
//! these, and the loom models below drive the same methods.
//!
//! # No wake-up is lost
//!
//! 1. The writer announces that it may sleep ([`Protocol::may_sleep`]) or
//!    gather ([`Protocol::may_gather`]) before it looks at its shards once
//!    more, each under its lock. If one holds anything (or, gathering, a
//!    batch worth a write) it stays awake and makes another pass.
//! 2. A push appends to its shard and, still under the shard's lock, reads
//!    the state ([`Protocol::push_wakes`]). Only a sleeping writer (or a
//!    gathering one whose shard is now worth a write) is woken, after the
//!    lock ([`Protocol::after_push`]); an awake writer costs a push that
//!    one load.
//!
//! The shard's lock orders the push's append and the writer's look: if the
//! look comes first, the push sees the announced state and wakes the
//! writer (the wake-up keeps its permit if the writer is not waiting yet);
//! if the push comes first, the look finds the request and the writer does
//! not sleep. A spurious wake-up (a permit left by a push whose request the
//! writer had already taken) costs an empty pass.
//!
//! # Lending the write side
//!
//! A sleeping writer lends its write side ([`Protocol::lend`]) and takes it
//! back when woken ([`Protocol::woken`]), before it writes anything, so
//! writes never interleave. Meanwhile:
//! - a lone write ([`Protocol::lend_to_lone`]) may use it while the writer
//!   still sleeps and the caller's shard is empty: everything the caller
//!   pushed before is then on the socket;
//! - a flush ([`Protocol::lend_to_flush`], asked for by a push through
//!   [`Protocol::after_push`]) writes what the shards hold with it, then
//!   puts the writer back to sleep and looks at the shards once more
//!   ([`Protocol::flush_ended`]), as the writer does in step 1: a push
//!   after that look sees the writer sleeping and asks for another flush.
//!
//! What a lone write or a flush cannot finish, or a load that is the
//! writer's, is handed to the writer ([`Protocol::hand_off`]), which takes
//! the link from a flush.

use super::state::{Writer, WriterState};
use crate::sync::Mutex;

/// Wakes a writer that waits for a push: tokio's `Notify` on the links;
/// loom's in the model tests.
pub(crate) trait Wake {
    /// Wakes the waiter, or leaves a permit for its next wait.
    fn wake(&self);
}

impl Wake for tokio::sync::Notify {
    fn wake(&self) {
        self.notify_one();
    }
}

/// One link's writer state, its wake-up and its lent write side `S`.
#[derive(Debug)]
pub(crate) struct Protocol<S, W = tokio::sync::Notify> {
    state: WriterState,
    /// What a waiting writer waits on.
    pub(crate) wake: W,
    /// The write side while the writer sleeps; `None` while it is awake
    /// (or not connected).
    parked: Mutex<Option<S>>,
}

/// What a push did after it queued its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterPush {
    /// Nothing: the writer is awake, a flush is under way, or a gathering
    /// writer's shard is not worth a write yet.
    Queued,
    /// It woke the writer.
    Woke,
    /// It asked for a flush: the caller has [`Protocol::lend_to_flush`]
    /// run soon.
    Flush,
}

/// How a flush went.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flush<R> {
    /// The writer was woken meanwhile: what is queued is its.
    NotFlushing,
    /// The load was the writer's, or its side is not lent: handed to it.
    HandedOff,
    /// Written (or its rest handed to the writer): what `write` returned.
    Wrote(R),
}

impl<S, W: Default> Default for Protocol<S, W> {
    fn default() -> Self {
        Protocol::new(W::default())
    }
}

impl<S, W> Protocol<S, W> {
    /// One with the writer awake and nothing lent.
    pub(crate) fn new(wake: W) -> Self {
        Protocol {
            state: WriterState::default(),
            wake,
            parked: Mutex::new(None),
        }
    }
}

impl<S, W: Wake> Protocol<S, W> {
    /// The writer's state now.
    #[cfg(test)]
    pub(crate) fn writer(&self) -> Writer {
        self.state.get()
    }

    /// Whether the writer sleeps (and lends its side, or is about to).
    pub(crate) fn sleeping(&self) -> bool {
        self.state.get() == Writer::Sleeping
    }

    // --- The push ---

    /// Push, under the lock of the shard it appended to: whether the writer
    /// should be woken. `worth_writing`: whether that shard now holds a
    /// batch worth a write (asked only of a gathering writer).
    pub(crate) fn push_wakes(&self, worth_writing: impl FnOnce() -> bool) -> bool {
        self.state.push_wakes(worth_writing)
    }

    /// Push, after the shard's lock: `wakes` is what
    /// [`Protocol::push_wakes`] said. With `flushes` (the link takes
    /// flushes on the caller's side) a sleeping writer stays asleep and the
    /// caller is asked for a flush; otherwise the writer is woken.
    pub(crate) fn after_push(&self, wakes: bool, flushes: bool) -> AfterPush {
        if !wakes {
            return AfterPush::Queued;
        }
        if flushes && self.state.ask_flush() {
            return AfterPush::Flush;
        }
        // A writer woken meanwhile, or a flush asked for by another push,
        // looks at the shards after this push anyway.
        if self.state.wake_for_push() {
            self.wake.wake();
            return AfterPush::Woke;
        }
        AfterPush::Queued
    }

    /// Hands the link to its writer, from any state, and wakes it; whether
    /// it did (it was not awake).
    pub(crate) fn hand_off(&self) -> bool {
        let woke = self.state.hand_off();
        if woke {
            self.wake.wake();
        }
        woke
    }

    // --- The writer ---

    /// Writer, with nothing to write: announces sleep, then asks
    /// `any_queued` (which looks at each of its shards under its lock).
    /// Whether it may wait for a wake-up (else it stays awake and makes
    /// another pass).
    pub(crate) fn may_sleep(&self, any_queued: impl FnOnce() -> bool) -> bool {
        self.announce_then_ask(WriterState::sleep, any_queued)
    }

    /// Writer, on a busy link: announces that it gathers, then asks
    /// `any_worth_writing` (each shard's backlog under its lock). Whether
    /// it should wait for company (else it stays awake and writes).
    pub(crate) fn may_gather(&self, any_worth_writing: impl FnOnce() -> bool) -> bool {
        self.announce_then_ask(WriterState::gather, any_worth_writing)
    }

    /// The rule both waits keep: the writer announces the wait (`announce`)
    /// before it looks at the shards (`work`), so a push that the look
    /// misses sees the announcement and wakes it. Work found: awake again,
    /// and no wait.
    fn announce_then_ask(
        &self,
        announce: impl FnOnce(&WriterState),
        work: impl FnOnce() -> bool,
    ) -> bool {
        announce(&self.state);
        if work() {
            self.state.awake();
            return false;
        }
        true
    }

    /// Writer, after [`Protocol::may_sleep`] said yes: lends its side to
    /// lone writes and flushes while it waits.
    pub(crate) fn lend(&self, side: S) {
        *lock(&self.parked) = Some(side);
    }

    /// Writer, when its wait ended (a wake-up, a tick, the reader, a
    /// control frame): awake, and its side back if it was lent. A lone
    /// write or a flush under way holds the side's lock for one
    /// non-blocking send at most.
    pub(crate) fn woken(&self) -> Option<S> {
        self.state.awake();
        lock(&self.parked).take()
    }

    // --- Lone writes and flushes, on the caller's thread ---

    /// Whether the lent side passes `check` now.
    pub(crate) fn lent_is(&self, check: impl FnOnce(&S) -> bool) -> bool {
        lock(&self.parked).as_ref().is_some_and(check)
    }

    /// A lone write: `write` gets the lent side if the writer sleeps and
    /// `own_shard_empty` (an earlier request of the caller's, queued while
    /// a flush was asked for, goes first). `write` says `None` if the side
    /// cannot take it; else what it returns, and whether a rest is left
    /// for the writer (then woken). Never blocks: the side's lock is only
    /// tried. `None`: the caller queues its request.
    pub(crate) fn lend_to_lone<R>(
        &self,
        own_shard_empty: impl FnOnce() -> bool,
        write: impl FnOnce(&mut S) -> Option<(R, bool)>,
    ) -> Option<R> {
        let Ok(mut parked) = self.parked.try_lock() else {
            return None;
        };
        let side = parked.as_mut()?;
        // Under the side's lock: the writer, once woken, takes its side
        // back under it before writing.
        if self.state.get() != Writer::Sleeping || !own_shard_empty() {
            return None;
        }
        let (r, rest) = write(side)?;
        drop(parked);
        if rest {
            self.hand_off();
        }
        Some(r)
    }

    /// A flush that a push asked for ([`AfterPush::Flush`]): `write` gets
    /// the lent side while the link is flushing, and says `None` if the
    /// load is the writer's (the link is then handed to it); else what it
    /// returns, and whether a rest is left for the writer (then woken).
    /// Then call [`Protocol::flush_ended`] (after a hand-off it finds the
    /// writer awake and says no more). The side's lock is taken, not tried: besides the writer, only
    /// a lone write that began before the flush was asked for can hold it,
    /// for one non-blocking send.
    pub(crate) fn lend_to_flush<R>(
        &self,
        write: impl FnOnce(&mut S) -> Option<(R, bool)>,
    ) -> Flush<R> {
        let mut parked = lock(&self.parked);
        // Woken since (it is awake before it takes its side back under
        // this lock): what is queued is its to write.
        if self.state.get() != Writer::Flushing {
            return Flush::NotFlushing;
        }
        let Some((r, rest)) = parked.as_mut().and_then(write) else {
            drop(parked);
            self.hand_off();
            return Flush::HandedOff;
        };
        drop(parked);
        if rest {
            self.hand_off();
        }
        Flush::Wrote(r)
    }

    /// A flush is done: the writer sleeps again, then `any_queued` looks
    /// at the link's shards as the writer's [`Protocol::may_sleep`] does.
    /// Whether another flush should run (more came meanwhile, and it was
    /// asked for); false also when the writer was woken meanwhile.
    pub(crate) fn flush_ended(&self, any_queued: impl FnOnce() -> bool) -> bool {
        self.state.flushed() && any_queued() && self.state.ask_flush()
    }
}

fn lock<T>(m: &Mutex<T>) -> crate::sync::MutexGuard<'_, T> {
    // Poisoned only if a thread panicked holding it; the side is whole
    // between statements.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Model tests: every interleaving of pushes, lone writes, flushes and the
/// writer, through the real [`Protocol`], with stand-ins for what is not
/// its subject: a shard is a locked queue, the write side a log of what
/// was written.
#[cfg(all(test, feature = "loom"))]
mod loom_tests {
    use super::*;
    use crate::sync::model;
    use loom::sync::atomic::{AtomicBool, AtomicUsize};
    use loom::sync::{Arc, Mutex, Notify};
    use loom::thread;
    use std::sync::atomic::Ordering::SeqCst;

    impl Wake for Notify {
        fn wake(&self) {
            self.notify();
        }
    }

    /// One link with one shard.
    struct Link {
        proto: Protocol<Vec<u32>, Notify>,
        shard: Mutex<Vec<u32>>,
        /// `Peer::close`: the writer's cancel token, which its wait
        /// selects on (level-triggered: a permit that stays).
        done: AtomicBool,
        /// Requests written so far, by any path, and a wake-up for whoever
        /// waits for them: the test waits for every request to be written
        /// before it closes the link, so that a lost wake-up is not hidden
        /// by the close's.
        written: AtomicUsize,
        progress: Notify,
    }

    impl Link {
        fn new() -> Link {
            Link {
                proto: Protocol::new(Notify::new()),
                shard: Mutex::new(Vec::new()),
                done: AtomicBool::new(false),
                written: AtomicUsize::new(0),
                progress: Notify::new(),
            }
        }

        fn wrote(&self, n: usize) {
            if n > 0 {
                self.written.fetch_add(n, SeqCst);
                self.progress.notify();
            }
        }

        fn await_written(&self, n: usize) {
            while self.written.load(SeqCst) < n {
                self.progress.wait();
            }
        }

        fn queued(&self) -> bool {
            !self.shard.lock().unwrap().is_empty()
        }

        /// `Peer::push_with` after its lone write: the shard's push
        /// (append, then `push_wakes` under its lock), then `after_push`.
        fn push(&self, x: u32, flushes: bool) -> AfterPush {
            let wakes = {
                let mut s = self.shard.lock().unwrap();
                s.push(x);
                self.proto.push_wakes(|| s.len() >= 2)
            };
            self.proto.after_push(wakes, flushes)
        }

        /// `LinkShared::write_lone`.
        fn write_lone(&self, x: u32) -> bool {
            if !self.proto.sleeping() {
                return false;
            }
            let written = self.proto.lend_to_lone(
                || !self.queued(),
                |socket| {
                    socket.push(x);
                    Some(((), false))
                },
            );
            if written.is_some() {
                self.wrote(1);
            }
            written.is_some()
        }

        /// `Peer::flush` over `LinkShared::flush`, as the Erlang flusher
        /// calls it: again while it says so.
        fn flush(&self) {
            loop {
                let wrote = self.proto.lend_to_flush(|socket| {
                    let mut shard = self.shard.lock().unwrap();
                    let n = shard.len();
                    socket.append(&mut shard);
                    Some((n, false))
                });
                let Flush::Wrote(n) = wrote else {
                    return;
                };
                self.wrote(n);
                if !self.proto.flush_ended(|| self.queued()) {
                    return;
                }
            }
        }

        /// `LinkWriter::serve` and `wait` (no gathering): write what the
        /// shard holds; else `may_sleep`, lend the side, wait, take it
        /// back. Ends when told and nothing is left. Returns the side.
        fn writer(&self) -> Vec<u32> {
            let mut socket = Vec::new();
            loop {
                // Told to end before it looks: what was pushed before that
                // is written.
                let done = self.done.load(SeqCst);
                let taken: Vec<u32> = std::mem::take(&mut *self.shard.lock().unwrap());
                if !taken.is_empty() {
                    self.wrote(taken.len());
                    socket.extend(taken);
                    continue;
                }
                if done {
                    return socket;
                }
                if !self.proto.may_sleep(|| self.queued()) {
                    continue;
                }
                self.proto.lend(socket);
                self.proto.wake.wait();
                socket = self.proto.woken().expect("the side lent");
            }
        }

        fn close(&self) {
            self.done.store(true, SeqCst);
            self.proto.wake.notify();
        }
    }

    /// Two requests pushed while the writer goes to sleep: both are
    /// written, whatever the interleaving (a lost wake-up leaves the writer
    /// waiting for ever: loom reports the deadlock).
    #[test]
    fn loom_no_lost_wake_up() {
        model(|| {
            let link = Arc::new(Link::new());
            let l = link.clone();
            let pusher = thread::spawn(move || {
                assert_ne!(l.push(1, false), AfterPush::Flush);
                assert_ne!(l.push(2, false), AfterPush::Flush);
            });
            let l = link.clone();
            let writer = thread::spawn(move || l.writer());
            pusher.join().unwrap();
            link.await_written(2);
            link.close();
            assert_eq!(writer.join().unwrap(), vec![1, 2]);
        });
    }

    /// One caller's requests, by lone writes where the writer sleeps and by
    /// flushes where a push asks for one, reach the socket once each and in
    /// the caller's order, and never while the writer holds the socket.
    #[test]
    fn loom_lone_writes_and_flushes_keep_order() {
        model(|| {
            let link = Arc::new(Link::new());
            let l = link.clone();
            let caller = thread::spawn(move || {
                for x in 1..=2 {
                    if !l.write_lone(x) && l.push(x, true) == AfterPush::Flush {
                        l.flush();
                    }
                }
            });
            let l = link.clone();
            let writer = thread::spawn(move || l.writer());
            caller.join().unwrap();
            link.await_written(2);
            link.close();
            let mut socket = writer.join().unwrap();
            socket.extend(link.proto.woken().unwrap_or_default());
            assert_eq!(socket, vec![1, 2]);
        });
    }

    /// Two callers push while a flush one of them asked for runs: the
    /// other's request, which finds the link flushing and wakes nobody,
    /// is written by that flush, by the next one it asks for, or by the
    /// writer; never stranded behind a sleeping writer.
    #[test]
    fn loom_a_push_during_a_flush_is_not_stranded() {
        model(|| {
            let link = Arc::new(Link::new());
            let callers: Vec<_> = (1..=2)
                .map(|x| {
                    let l = link.clone();
                    thread::spawn(move || {
                        if l.push(x, true) == AfterPush::Flush {
                            l.flush();
                        }
                    })
                })
                .collect();
            let l = link.clone();
            let writer = thread::spawn(move || l.writer());
            for c in callers {
                c.join().unwrap();
            }
            link.await_written(2);
            link.close();
            let mut socket = writer.join().unwrap();
            socket.extend(link.proto.woken().unwrap_or_default());
            socket.sort_unstable();
            assert_eq!(socket, vec![1, 2]);
        });
    }
}
