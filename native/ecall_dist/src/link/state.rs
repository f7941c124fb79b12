//! The writer's state: what a link's writer is doing, as the push path,
//! lone writes and flushes see it. Every transition and every wake rule is
//! a method here; no other file reads or stores the state.
//!
//! | state \ event | [`sleep`] | [`gather`] | [`awake`] | [`push_wakes`] (under the shard's lock) | [`ask_flush`] | [`wake_for_push`] | [`flushed`] | [`hand_off`] |
//! | --- | --- | --- | --- | --- | --- | --- | --- | --- |
//! | `Awake` | `Sleeping` | `Gathering` | `Awake` | no | no | no | no | no (stays) |
//! | `Sleeping` | - | - | `Awake` | yes | `Flushing` | `Awake`, notify | no | `Awake`, notify |
//! | `Gathering` | - | - | `Awake` | if a shard is worth a write | no | `Awake`, notify | no | `Awake`, notify |
//! | `Flushing` | - | - | `Awake` | no | no | no | `Sleeping` | `Awake`, notify |
//!
//! `-`: the writer makes those moves only while it is awake. "no": the
//! state stays and the method says so (`false`).
//!
//! Who moves it:
//! - the writer ([`sleep`], [`gather`], [`awake`]): it found nothing to
//!   write, or a busy link's shards not worth a write yet; or it looked
//!   again and found work, or its wait ended (a notify, a tick, a control
//!   frame, the reader's end);
//! - a push ([`push_wakes`], then [`ask_flush`] on a link that takes
//!   flushes, else [`wake_for_push`]);
//! - a flush on the caller's side ([`flushed`], and [`ask_flush`] again if
//!   its link's shards filled meanwhile);
//! - whoever hands a load to the writer ([`hand_off`]): a flush that finds
//!   a load that is the writer's, a lone write or flush whose rest the
//!   socket did not take, a caller that cannot run a flush it asked for.
//!
//! The two wake rules differ on `Flushing` only: a push leaves a flush that
//! was asked for to do its work (the flush looks at every shard after it
//! is done), while a hand-off takes the link from the flush.
//!
//! No wake-up is lost (the sleeping-writer protocol): the writer announces
//! [`sleep`] (or [`gather`]) before it looks at its shards once more under
//! each shard's lock, and a push reads the state under the lock of the
//! shard it appended to ([`push_wakes`]). The lock orders the two: either
//! the writer's look comes after the push and finds the request, or the
//! push comes after the look and sees `Sleeping`, so it wakes the writer
//! (`Notify` keeps the permit if the writer is not waiting yet). The loom
//! tests below check this, and the lending of the writer's socket to lone
//! writes and flushes, under every interleaving.
//!
//! [`sleep`]: WriterState::sleep
//! [`gather`]: WriterState::gather
//! [`awake`]: WriterState::awake
//! [`push_wakes`]: WriterState::push_wakes
//! [`ask_flush`]: WriterState::ask_flush
//! [`wake_for_push`]: WriterState::wake_for_push
//! [`flushed`]: WriterState::flushed
//! [`hand_off`]: WriterState::hand_off

use crate::sync::AtomicU8;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// What the writer is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Writer {
    /// Writing, or about to look at its shards.
    Awake = 0,
    /// It found nothing to do and waits for a notify (its socket lent to
    /// lone writes and flushes meanwhile): any push wakes it.
    Sleeping = 1,
    /// It waits for a batch worth a write on a busy link: a push wakes it
    /// once its shard holds enough (or an urgent request), and it wakes by
    /// itself after the gathering wait in any case.
    Gathering = 2,
    /// It sleeps, and a push asked for a flush on the caller's side
    /// instead of waking it: pushes meanwhile wake nobody.
    Flushing = 3,
}

impl Writer {
    fn from(v: u8) -> Writer {
        match v {
            1 => Writer::Sleeping,
            2 => Writer::Gathering,
            3 => Writer::Flushing,
            _ => Writer::Awake,
        }
    }
}

/// The state of one link's writer, shared by the writer, the push path,
/// lone writes and flushes. See the module docs for the table.
#[derive(Debug)]
pub(crate) struct WriterState(AtomicU8);

impl Default for WriterState {
    fn default() -> WriterState {
        WriterState(AtomicU8::new(Writer::Awake as u8))
    }
}

impl WriterState {
    /// The state now (sequentially consistent).
    pub(crate) fn get(&self) -> Writer {
        Writer::from(self.0.load(SeqCst))
    }

    /// Writer: nothing to write. Announced before the writer looks at its
    /// shards once more (each under its lock): if one holds anything it
    /// calls [`WriterState::awake`] and makes another pass; else it may
    /// wait for a notify.
    pub(crate) fn sleep(&self) {
        self.0.store(Writer::Sleeping as u8, SeqCst);
    }

    /// Writer: a busy link, waiting for a batch worth a write. Announced
    /// before the writer looks at its shards' backlogs once more, as for
    /// [`WriterState::sleep`].
    pub(crate) fn gather(&self) {
        self.0.store(Writer::Gathering as u8, SeqCst);
    }

    /// Writer: it looked again and found work, or its wait ended. A
    /// read-modify-write, not a plain store: loom models those exactly
    /// (with a relaxed store here it let a later load read the state from
    /// before the writer's `sleep`).
    pub(crate) fn awake(&self) {
        self.0.swap(Writer::Awake as u8, SeqCst);
    }

    /// Push, under the lock of the shard it appended to: whether the
    /// writer should be woken. `worth_writing`: whether that shard now
    /// holds a batch worth a write (asked only of a gathering writer).
    /// Relaxed: the shard's lock orders this load against the writer's
    /// look (module docs).
    pub(crate) fn push_wakes(&self, worth_writing: impl FnOnce() -> bool) -> bool {
        match Writer::from(self.0.load(Relaxed)) {
            Writer::Sleeping => true,
            Writer::Gathering => worth_writing(),
            Writer::Awake | Writer::Flushing => false,
        }
    }

    /// Push that would wake a sleeping writer, on a link that takes
    /// flushes: asks for a flush on the caller's side instead. Whether it
    /// did (the caller then has the flush run).
    pub(crate) fn ask_flush(&self) -> bool {
        self.turn(Writer::Sleeping, Writer::Flushing)
    }

    /// Push that should wake the writer: wakes a sleeping or gathering one.
    /// Whether it did (the caller then notifies). An awake writer looks at
    /// the shards after this push anyway; a flush asked for does too.
    pub(crate) fn wake_for_push(&self) -> bool {
        self.0
            .fetch_update(SeqCst, SeqCst, |s| {
                matches!(Writer::from(s), Writer::Sleeping | Writer::Gathering)
                    .then_some(Writer::Awake as u8)
            })
            .is_ok()
    }

    /// Flush: done writing. The writer sleeps again (the caller then looks
    /// at the link's shards once more, and asks for another flush with
    /// [`WriterState::ask_flush`] if one holds anything). Whether the
    /// link was still flushing (else the writer has been woken meanwhile
    /// and what is queued is its).
    pub(crate) fn flushed(&self) -> bool {
        self.turn(Writer::Flushing, Writer::Sleeping)
    }

    /// Hands the link to the writer, from any state. Whether it woke it
    /// (the caller then notifies).
    pub(crate) fn hand_off(&self) -> bool {
        Writer::from(self.0.swap(Writer::Awake as u8, SeqCst)) != Writer::Awake
    }

    fn turn(&self, from: Writer, to: Writer) -> bool {
        self.0
            .compare_exchange(from as u8, to as u8, SeqCst, SeqCst)
            .is_ok()
    }
}

#[cfg(all(test, not(feature = "loom")))]
mod tests {
    use super::*;

    #[test]
    fn transitions_follow_the_table() {
        let s = WriterState::default();
        assert_eq!(s.get(), Writer::Awake);
        // Awake: nothing but the writer's own moves.
        assert!(!s.push_wakes(|| true));
        assert!(!s.ask_flush() && !s.wake_for_push() && !s.flushed() && !s.hand_off());
        assert_eq!(s.get(), Writer::Awake);
        // Sleeping: a push wakes, or asks for a flush.
        s.sleep();
        assert!(s.push_wakes(|| false));
        assert!(s.ask_flush());
        assert_eq!(s.get(), Writer::Flushing);
        // Flushing: pushes wake nobody; the flush puts it back to sleep.
        assert!(!s.push_wakes(|| true));
        assert!(!s.wake_for_push());
        assert!(s.flushed());
        assert_eq!(s.get(), Writer::Sleeping);
        assert!(s.wake_for_push());
        assert_eq!(s.get(), Writer::Awake);
        // Gathering: only a shard worth a write wakes; never a flush.
        s.gather();
        assert!(!s.push_wakes(|| false));
        assert!(s.push_wakes(|| true));
        assert!(!s.ask_flush());
        assert!(s.wake_for_push());
        // A hand-off takes the link from a flush.
        s.sleep();
        assert!(s.ask_flush());
        assert!(s.hand_off());
        assert_eq!(s.get(), Writer::Awake);
        assert!(!s.flushed());
    }
}

/// Model tests: every interleaving of the protocols around the state, with
/// the real [`WriterState`] and stand-ins for what is not their subject (a
/// shard is a locked queue, the socket a log of what was written). Each
/// step names the code it stands for.
#[cfg(all(test, feature = "loom"))]
mod loom_tests {
    use super::*;
    use crate::sync::model;
    use loom::sync::atomic::{AtomicBool, AtomicUsize};
    use loom::sync::{Arc, Mutex, Notify};
    use loom::thread;

    /// One link with one shard, its writer's socket and its wake-up.
    struct Link {
        state: WriterState,
        shard: Mutex<Vec<u32>>,
        notify: Notify,
        /// What reached the socket, in order; `Some` while lent
        /// (`LinkShared::parked`), `None` while the writer holds it.
        parked: Mutex<Option<Vec<u32>>>,
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
                state: WriterState::default(),
                shard: Mutex::new(Vec::new()),
                notify: Notify::new(),
                parked: Mutex::new(None),
                done: AtomicBool::new(false),
                written: AtomicUsize::new(0),
                progress: Notify::new(),
            }
        }

        /// Counts `n` requests written.
        fn wrote(&self, n: usize) {
            if n > 0 {
                self.written.fetch_add(n, SeqCst);
                self.progress.notify();
            }
        }

        /// Returns once `n` requests have been written.
        fn await_written(&self, n: usize) {
            while self.written.load(SeqCst) < n {
                self.progress.wait();
            }
        }

        /// `Peer::push_with` without lone writes: append under the shard's
        /// lock, read the state under it, then ask for a flush or wake.
        /// Returns whether the caller must run a flush.
        fn push(&self, x: u32, flushes: bool) -> bool {
            let wakes = {
                let mut s = self.shard.lock().unwrap();
                s.push(x);
                self.state.push_wakes(|| s.len() >= 2)
            };
            if wakes {
                if flushes && self.state.ask_flush() {
                    return true;
                }
                if self.state.wake_for_push() {
                    self.notify.notify();
                }
            }
            false
        }

        /// `LinkShared::write_lone`: only while the writer sleeps, its
        /// socket lent and the caller's shard empty; else the caller
        /// queues (`push`).
        fn write_lone(&self, x: u32) -> bool {
            if self.state.get() != Writer::Sleeping {
                return false;
            }
            let Ok(mut parked) = self.parked.try_lock() else {
                return false;
            };
            let Some(socket) = parked.as_mut() else {
                return false;
            };
            if self.state.get() != Writer::Sleeping || !self.shard.lock().unwrap().is_empty() {
                return false;
            }
            socket.push(x);
            self.wrote(1);
            true
        }

        /// `Peer::flush` and `LinkShared::flush`: write what the shard
        /// holds on the lent socket while flushing; then sleep again, and
        /// flush again if more came.
        fn flush(&self) {
            loop {
                {
                    let mut parked = self.parked.lock().unwrap();
                    if self.state.get() != Writer::Flushing {
                        return;
                    }
                    let Some(socket) = parked.as_mut() else {
                        drop(parked);
                        if self.state.hand_off() {
                            self.notify.notify();
                        }
                        return;
                    };
                    let mut shard = self.shard.lock().unwrap();
                    let n = shard.len();
                    socket.append(&mut shard);
                    drop(shard);
                    self.wrote(n);
                }
                if !self.state.flushed() {
                    return;
                }
                if self.shard.lock().unwrap().is_empty() || !self.state.ask_flush() {
                    return;
                }
            }
        }

        /// `LinkWriter::serve` with `may_sleep` and `wait` (no gathering):
        /// write what the shard holds, else announce sleep, look again,
        /// lend the socket and wait; take it back when woken. Ends when
        /// told (`Peer::close`) and nothing is left. Returns the socket.
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
                self.state.sleep();
                if !self.shard.lock().unwrap().is_empty() {
                    self.state.awake();
                    continue;
                }
                *self.parked.lock().unwrap() = Some(socket);
                self.notify.wait();
                self.state.awake();
                socket = self.parked.lock().unwrap().take().unwrap();
            }
        }

        /// `Peer::close`: the writer's cancel token, which its wait
        /// selects on (level-triggered: a permit that stays).
        fn close(&self) {
            self.done.store(true, SeqCst);
            self.notify.notify();
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
                assert!(!l.push(1, false));
                assert!(!l.push(2, false));
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
                    if !l.write_lone(x) && l.push(x, true) {
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
            socket.extend(link.parked.lock().unwrap().take().unwrap_or_default());
            assert_eq!(socket, vec![1, 2]);
        });
    }
}
