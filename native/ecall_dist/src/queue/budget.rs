//! The byte budget of one peer: the element bytes queued for it, bounded,
//! and the callers waiting for room, woken in the order they came.
//!
//! - A push takes room in one atomic step with the check ([`Budget::admit`]):
//!   two pushes that both saw room for one cannot both go in. Callers
//!   already waiting go first: no barging.
//! - A caller refused may wait ([`Budget::wait_room`]). Its room is set
//!   aside for it before it is woken, so that pushes arriving meanwhile
//!   cannot take it.
//! - A write gives room back ([`Budget::release`]) and wakes, in order,
//!   the waiters that now fit.
//! - A request larger than the whole budget goes alone: when nothing is
//!   queued, the first one admitted is let through whatever its size (no
//!   write would ever make room for it).
//!
//! No waiter is forgotten: a release that lands while a caller registers
//! (after the caller saw the budget full, before it is listed as waiting)
//! sees no waiter and wakes nobody; so the caller looks again once it is
//! listed. Every access to the count of waiters is a read-modify-write, so
//! that the two sides meet in its modification order whatever the memory
//! model gives plain loads: either the release reads the caller's count
//! (and wakes it), or the caller's count comes after the release's read,
//! which then happened before the caller's second look (which sees the
//! room). The loom test below checks this under every interleaving (loom
//! treats sequentially consistent loads as acquire loads: with a plain
//! load of the count here, it finds the release that misses the waiter).

use crate::sync::{AtomicUsize, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// What a waiter is told: `true` with its room set aside, `false` if the
/// budget closed first.
pub(crate) type Wake = Box<dyn FnOnce(bool) + Send>;

/// See the module docs.
pub(crate) struct Budget {
    max: usize,
    /// Element bytes queued now, and room set aside for woken waiters.
    queued: AtomicUsize,
    /// How many callers wait (the length of `waiters`), read without the
    /// lock by pushes and releases; written and read by releases with
    /// read-modify-writes only (module docs).
    waiting: AtomicUsize,
    waiters: Mutex<VecDeque<(usize, Wake)>>,
}

impl std::fmt::Debug for Budget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budget")
            .field("max", &self.max)
            .field("queued", &self.queued())
            .finish()
    }
}

impl Budget {
    pub(crate) fn new(max: usize) -> Budget {
        Budget {
            max,
            queued: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            waiters: Mutex::new(VecDeque::new()),
        }
    }

    /// Bytes queued now (a gauge).
    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Relaxed)
    }

    /// How many callers wait for room now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(SeqCst)
    }

    /// A push of `size` bytes: takes the room and returns `true` if nobody
    /// waits and it fits; else `false`, and nothing is taken.
    pub(crate) fn admit(&self, size: usize) -> bool {
        self.waiting.load(Relaxed) == 0 && self.take(size, false)
    }

    /// A push of a caller let in with `reserved` bytes set aside, whose
    /// request encoded to `size`: takes the difference, or gives the rest
    /// back.
    pub(crate) fn settle(&self, reserved: usize, size: usize) {
        if size > reserved {
            self.queued.fetch_add(size - reserved, SeqCst);
        } else {
            self.release(reserved - size);
        }
    }

    /// Sets `size` bytes aside for a caller: at once if nobody waits and
    /// they fit (returns `false`), else once they fit, callers in the
    /// order they came, and then calls `wake(true)`. Returns `true` when
    /// it listed `wake`, which may be called before this returns.
    pub(crate) fn wait_room(&self, size: usize, wake: Wake) -> bool {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_empty() && self.take(size, true) {
            return false;
        }
        #[cfg(all(test, not(feature = "loom")))]
        tests::registration_window();
        w.push_back((size, wake));
        self.waiting.swap(w.len(), SeqCst);
        drop(w);
        // The second look (module docs).
        self.wake_fitting();
        true
    }

    /// Gives `bytes` back and wakes, in order, the waiters that now fit.
    /// 0 does nothing.
    pub(crate) fn release(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.queued.fetch_sub(bytes, SeqCst);
        if self.waiting.fetch_add(0, SeqCst) == 0 {
            return;
        }
        self.wake_fitting();
    }

    /// Gives `bytes` back without waking anyone: the peer is closed (what
    /// a push found closed, what a close dropped).
    pub(crate) fn forget(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, SeqCst);
    }

    /// Takes every waiter off the list, for the caller to tell them
    /// `false` (the peer closed).
    pub(crate) fn close(&self) -> Vec<Wake> {
        let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        self.waiting.swap(0, SeqCst);
        w.drain(..).map(|(_, f)| f).collect()
    }

    /// Adds `size` to the queued bytes if it fits, in one atomic step: when
    /// it fits the budget, or when nothing is queued and it is the `first`
    /// admitted.
    fn take(&self, size: usize, first: bool) -> bool {
        self.queued
            .fetch_update(SeqCst, SeqCst, |q| {
                (q + size <= self.max || (q == 0 && first)).then_some(q + size)
            })
            .is_ok()
    }

    /// Wakes, in order, the waiters whose room can be set aside now.
    fn wake_fitting(&self) {
        let mut woken = Vec::new();
        {
            let mut w = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(&(size, _)) = w.front() {
                if !self.take(size, woken.is_empty()) {
                    break;
                }
                woken.extend(w.pop_front().map(|(_, f)| f));
            }
            self.waiting.swap(w.len(), SeqCst);
        }
        for f in woken {
            f(true);
        }
    }
}

#[cfg(all(test, not(feature = "loom")))]
pub(crate) mod tests {
    use super::*;
    use std::sync::Arc;

    thread_local! {
        /// Run once inside the window of the next `wait_room`'s
        /// registration, on the caller's thread.
        static IN_WINDOW: std::cell::RefCell<Option<Box<dyn FnOnce()>>> =
            const { std::cell::RefCell::new(None) };
    }

    pub(crate) fn registration_window() {
        if let Some(f) = IN_WINDOW.with(|w| w.borrow_mut().take()) {
            f();
        }
    }

    /// Runs `f` inside the window of the next `wait_room` on this thread.
    pub(crate) fn in_window(f: Box<dyn FnOnce()>) {
        IN_WINDOW.with(|w| *w.borrow_mut() = Some(f));
    }

    /// Whether the window of the last `in_window` was reached.
    pub(crate) fn window_reached() -> bool {
        IN_WINDOW.with(|w| w.borrow().is_none())
    }

    fn woken() -> (Arc<std::sync::Mutex<Vec<bool>>>, impl Fn() -> Wake) {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let l = log.clone();
        (log, move || {
            let l = l.clone();
            Box::new(move |room| l.lock().unwrap().push(room)) as Wake
        })
    }

    #[test]
    fn admits_within_the_budget_and_a_lone_oversized_request() {
        let b = Budget::new(100);
        assert!(b.admit(60));
        assert!(!b.admit(60));
        assert!(b.admit(40));
        assert_eq!(b.queued(), 100);
        b.release(100);
        // Larger than the whole budget: only through wait_room, alone.
        assert!(!b.admit(150));
        let (log, wake) = woken();
        assert!(!b.wait_room(150, wake()));
        assert_eq!(b.queued(), 150);
        assert!(log.lock().unwrap().is_empty());
    }

    #[test]
    fn waiters_are_woken_in_order_with_their_room_set_aside() {
        let b = Budget::new(100);
        assert!(b.admit(100));
        let (log, wake) = woken();
        assert!(b.wait_room(50, wake()));
        assert!(b.wait_room(50, wake()));
        assert_eq!(b.waiting(), 2);
        // Nobody barges past the waiters.
        b.release(60);
        assert!(!b.admit(10));
        assert_eq!(*log.lock().unwrap(), vec![true]);
        assert_eq!((b.queued(), b.waiting()), (90, 1));
        b.release(40);
        assert_eq!(*log.lock().unwrap(), vec![true, true]);
        assert_eq!((b.queued(), b.waiting()), (100, 0));
        assert!(b.wait_room(10, wake()));
        let left = b.close();
        assert_eq!((left.len(), b.waiting()), (1, 0));
    }

    /// A release landing while a caller registers for room (after it saw
    /// the budget full, before it is listed) wakes it all the same.
    #[test]
    fn a_release_while_registering_still_wakes_the_caller() {
        let b = Arc::new(Budget::new(100));
        assert!(b.admit(100));
        let r = b.clone();
        in_window(Box::new(move || r.release(100)));
        let (log, wake) = woken();
        assert!(b.wait_room(80, wake()));
        assert!(window_reached());
        assert_eq!(*log.lock().unwrap(), vec![true]);
        assert_eq!((b.queued(), b.waiting()), (80, 0));
    }
}

/// The waiter protocol under every interleaving of a caller registering
/// for room and a writer releasing it.
#[cfg(all(test, feature = "loom"))]
mod loom_tests {
    use super::*;
    use crate::sync::model;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::{Arc, Notify};
    use loom::thread;

    /// The budget is full; a caller is refused and waits for room while a
    /// writer gives everything back. The caller is woken with its room set
    /// aside, whatever the interleaving (a forgotten waiter blocks for
    /// ever: loom reports the deadlock).
    #[test]
    fn loom_a_waiter_is_never_forgotten() {
        model(|| {
            let b = Arc::new(Budget::new(100));
            assert!(b.admit(100));
            let w = b.clone();
            let writer = thread::spawn(move || w.release(100));
            let woken = Arc::new((AtomicBool::new(false), Notify::new()));
            if !b.admit(80) {
                let wk = woken.clone();
                let wake: Wake = Box::new(move |room| {
                    assert!(room);
                    wk.0.store(true, SeqCst);
                    wk.1.notify();
                });
                if b.wait_room(80, wake) {
                    while !woken.0.load(SeqCst) {
                        woken.1.wait();
                    }
                }
            }
            writer.join().unwrap();
            assert_eq!((b.queued(), b.waiting()), (80, 0));
        });
    }
}
