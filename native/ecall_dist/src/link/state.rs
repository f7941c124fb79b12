//! The writer's state: what a link's writer is doing, as the push path,
//! lone writes and flushes see it. Every transition and every wake rule is
//! a method here; only `link/protocol.rs` calls them.
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
//! Why no wake-up is lost, and how the writer's side is lent meanwhile:
//! `link/protocol.rs`, whose methods are the only callers of these and
//! whose loom models check them under every interleaving.
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
