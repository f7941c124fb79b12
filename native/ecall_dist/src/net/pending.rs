//! The incoming handshakes under way at one identity, and which of them
//! makes room for a newcomer.
//!
//! At most [`MAX_PENDING_HANDSHAKES`] handshakes are under way at once, so
//! that a flood of connections holds a bounded number of sockets. A newcomer
//! always gets a slot: when every slot is taken, the connection that is
//! doing the least is closed to make room ([`Pending::admit`]):
//!
//! 1. the oldest one that has not yet sent its name (the handshake's first
//!    message, which a real node sends as soon as TCP, or TLS, is up), else
//! 2. the oldest of all.
//!
//! Connections that never start their handshake, or that trickle it a byte
//! at a time, are then closed as the next connections come, and a real
//! peer's handshake, which sends its name within a round trip and ends
//! within a few, is closed only if every other slot holds a named
//! connection and as many connections arrive as there are slots before it
//! ends.
//!
//! The slots are counted here; the caller counts and logs what was closed
//! (a connection told to close counts itself, as [`Slot::closed`] says why,
//! so that one whose handshake failed at the same moment counts once).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio_util::sync::CancellationToken;

/// Most incoming connections whose handshake is under way at once, per
/// identity (not measured: a bound on sockets and tasks well above what
/// the peers of one node open at once, and well below a process's file
/// descriptors).
pub const MAX_PENDING_HANDSHAKES: usize = 64;

/// Why a pending connection was closed to make room for a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    /// It had not sent its name.
    Idle,
    /// It had sent its name but not finished its handshake.
    Stalled,
}

/// The handshakes under way at one identity. See the module docs.
#[derive(Debug)]
pub struct Pending {
    cap: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    next_id: u64,
    /// In the order they came.
    slots: VecDeque<Entry>,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    named: bool,
    close: CancellationToken,
}

/// One connection's slot: given back when dropped.
#[derive(Debug)]
pub struct Slot {
    pending: Arc<Pending>,
    id: u64,
    close: CancellationToken,
    named: AtomicBool,
}

impl Pending {
    /// A table of `cap` slots (at least one).
    pub fn new(cap: usize) -> Arc<Pending> {
        Arc::new(Pending {
            cap: cap.max(1),
            held: Mutex::default(),
        })
    }

    /// A slot for a new connection, and why an older connection was told
    /// to close (its [`Slot::closed`] ends) to make room, if one was.
    pub fn admit(self: &Arc<Self>) -> (Slot, Option<Evicted>) {
        let close = CancellationToken::new();
        let mut held = self.lock();
        let evicted = if held.slots.len() >= self.cap {
            let (i, why) = match held.slots.iter().position(|e| !e.named) {
                Some(i) => (i, Evicted::Idle),
                None => (0, Evicted::Stalled),
            };
            if let Some(victim) = held.slots.remove(i) {
                victim.close.cancel();
            }
            Some(why)
        } else {
            None
        };
        let id = held.next_id;
        held.next_id += 1;
        held.slots.push_back(Entry {
            id,
            named: false,
            close: close.clone(),
        });
        drop(held);
        let slot = Slot {
            pending: Arc::clone(self),
            id,
            close,
            named: AtomicBool::new(false),
        };
        (slot, evicted)
    }

    /// Slots taken.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// Whether no slot is taken.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Nothing here panics while holding the lock; a poisoned lock
        // still holds a consistent table.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Slot {
    /// The connection sent its name: it is taken back only after every
    /// connection that has not.
    pub fn named(&self) {
        self.named.store(true, Ordering::Relaxed);
        if let Some(e) = self
            .pending
            .lock()
            .slots
            .iter_mut()
            .find(|e| e.id == self.id)
        {
            e.named = true;
        }
    }

    /// Ends when the slot was taken back for a newer connection: the
    /// connection must close. Says why it was chosen.
    pub async fn closed(&self) -> Evicted {
        self.close.cancelled().await;
        if self.named.load(Ordering::Relaxed) {
            Evicted::Stalled
        } else {
            Evicted::Idle
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.pending.lock();
        if let Some(i) = held.slots.iter().position(|e| e.id == self.id) {
            held.slots.remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_closed(s: &Slot) -> bool {
        s.close.is_cancelled()
    }

    #[test]
    fn room_is_made_from_the_oldest_idle_then_the_oldest() {
        let p = Pending::new(3);
        let (a, e) = p.admit();
        assert_eq!(e, None);
        let (b, _) = p.admit();
        let (c, _) = p.admit();
        assert_eq!(p.len(), 3);
        a.named();
        // a sent its name: b, the oldest idle one, goes.
        let (d, e) = p.admit();
        assert_eq!(e, Some(Evicted::Idle));
        assert!(is_closed(&b) && !is_closed(&a) && !is_closed(&c));
        assert_eq!(p.len(), 3);
        c.named();
        d.named();
        // All named: the oldest, a, goes.
        let (_e, why) = p.admit();
        assert_eq!(why, Some(Evicted::Stalled));
        assert!(is_closed(&a) && !is_closed(&c) && !is_closed(&d));
        assert_eq!(p.len(), 3);
    }

    #[test]
    fn a_slot_given_back_makes_room_and_an_evicted_one_frees_nothing_twice() {
        let p = Pending::new(2);
        let (a, _) = p.admit();
        let (b, _) = p.admit();
        drop(b);
        assert_eq!(p.len(), 1);
        let (_c, e) = p.admit();
        assert_eq!(e, None);
        let (_d, e) = p.admit();
        assert_eq!(e, Some(Evicted::Idle));
        assert!(is_closed(&a));
        // a's slot was already taken back: dropping it leaves the others.
        drop(a);
        assert_eq!(p.len(), 2);
    }

    #[tokio::test]
    async fn a_closed_slot_says_why_it_was_chosen() {
        let p = Pending::new(1);
        let (a, _) = p.admit();
        let (b, _) = p.admit();
        assert_eq!(a.closed().await, Evicted::Idle);
        b.named();
        let (_c, _) = p.admit();
        assert_eq!(b.closed().await, Evicted::Stalled);
    }

    #[test]
    fn a_flood_of_idle_newcomers_never_evicts_a_named_connection() {
        let p = Pending::new(64);
        let (real, _) = p.admit();
        real.named();
        let mut flood = Vec::new();
        for _ in 0..10_000 {
            let (s, _) = p.admit();
            flood.push(s);
            if flood.len() > 64 {
                flood.remove(0);
            }
        }
        assert!(!is_closed(&real));
        assert_eq!(p.len(), 64);
    }
}
