//! The table of calls waiting for their replies, by id (what waits, `W`,
//! is the NIF's business: `calls/mod.rs`). Sharded by id, so that callers
//! on every scheduler register and receivers take at once; ids count up
//! from a start the caller picks ([`random_start`]); an entry is taken
//! once, by its reply, its cancel or its link's failure, whichever comes
//! first. Bounded: when a shard has grown to twice its size at its last
//! sweep (and past [`SWEEP_MIN`]), the entries of dead callers go.
//!
//! Names nothing of rustler, so that `cargo test` reaches it
//! (`calls/pure_tests.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Shards of the table, by id.
pub(super) const SHARDS: usize = 64;

/// A shard is swept when it has grown past this, and then at twice its
/// size after each sweep.
pub(super) const SWEEP_MIN: usize = 1024;

struct Shard<W> {
    calls: HashMap<u64, W>,
    sweep_at: usize,
}

/// See the module docs.
pub(super) struct Table<W> {
    shards: [Mutex<Shard<W>>; SHARDS],
    next: AtomicU64,
}

impl<W> Table<W> {
    /// An empty table whose first id is `start`.
    pub(super) fn new(start: u64) -> Table<W> {
        Table {
            shards: std::array::from_fn(|_| {
                Mutex::new(Shard {
                    calls: HashMap::new(),
                    sweep_at: 0,
                })
            }),
            next: AtomicU64::new(start),
        }
    }

    fn shard(&self, id: u64) -> MutexGuard<'_, Shard<W>> {
        // Nothing here panics while holding the lock; a poisoned lock still
        // holds a consistent table.
        self.shards[(id % SHARDS as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `w` under a new id, and returns the id. A shard past its
    /// sweep size first drops the entries `alive` says are dead.
    pub(super) fn insert(&self, w: W, alive: impl Fn(&W) -> bool) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut s = self.shard(id);
        s.calls.insert(id, w);
        if s.calls.len() > s.sweep_at.max(SWEEP_MIN) {
            s.calls.retain(|_, w| alive(w));
            s.sweep_at = 2 * s.calls.len();
        }
        id
    }

    /// Takes the entry of `id`, if it is still there.
    pub(super) fn take(&self, id: u64) -> Option<W> {
        self.shard(id).calls.remove(&id)
    }

    /// Takes every entry that `which` picks, shard by shard (each lock
    /// held for its shard only).
    pub(super) fn take_all(&self, which: impl Fn(&W) -> bool) -> Vec<W> {
        let mut taken = Vec::new();
        for s in &self.shards {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            let ids: Vec<u64> = s
                .calls
                .iter()
                .filter(|(_, w)| which(w))
                .map(|(id, _)| *id)
                .collect();
            taken.extend(ids.iter().filter_map(|id| s.calls.remove(id)));
        }
        taken
    }

    /// Counts the entries that `which` picks, after dropping those of
    /// them whose caller is gone (`alive` false), shard by shard.
    pub(super) fn count_alive(
        &self,
        which: impl Fn(&W) -> bool,
        alive: impl Fn(&W) -> bool,
    ) -> usize {
        let mut n = 0;
        for s in &self.shards {
            let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
            s.calls.retain(|_, w| !which(w) || alive(w));
            n += s.calls.values().filter(|w| which(w)).count();
        }
        n
    }

    /// Entries waiting now (a gauge).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).calls.len())
            .sum()
    }
}

/// A start for the ids that a restarted node does not repeat: the clock's
/// nanoseconds and the OS pid mixed (the finaliser of splitmix64), in 62
/// bits.
pub(super) fn random_start() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t ^ u64::from(std::process::id()).rotate_left(32);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (x ^ (x >> 31)) >> 2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (caller, peer, link): what the NIF keeps, less the pid's type.
    type W = (u32, usize, usize);

    /// The count of a peer's calls: only that peer's, and the entries of
    /// its callers that are gone are dropped (others' are kept).
    #[test]
    fn count_alive_counts_a_peers_live_callers_and_drops_the_dead() {
        let t: Table<W> = Table::new(1);
        let dead = t.insert((1, 7, 0), |_| true);
        let live = t.insert((2, 7, 1), |_| true);
        let other = t.insert((1, 8, 0), |_| true);
        assert_eq!(t.count_alive(|w| w.1 == 7, |w| w.0 != 1), 1);
        assert!(t.take(dead).is_none());
        assert!(t.take(live).is_some());
        assert!(t.take(other).is_some(), "another peer's entry is kept");
        assert_eq!(t.count_alive(|w| w.1 == 7, |_| true), 0);
    }

    /// An entry is taken once: by its reply or by its cancel, and what
    /// comes second finds nothing (a reply after a cancel is dropped, and
    /// reaches no caller).
    #[test]
    fn an_entry_is_taken_once() {
        let t: Table<W> = Table::new(1000);
        let a = t.insert((1, 7, 0), |_| true);
        let b = t.insert((2, 7, 0), |_| true);
        assert_eq!((a, b), (1000, 1001), "ids count up from the start");
        assert_eq!(t.take(a), Some((1, 7, 0)));
        assert_eq!(t.take(a), None);
        assert_eq!(t.take(b + 1), None, "an id never given");
        assert_eq!(t.take(b), Some((2, 7, 0)));
        assert_eq!(t.len(), 0);
    }

    /// A link's failure takes its calls, on every shard, and only them.
    #[test]
    fn take_all_takes_what_it_picks_from_every_shard() {
        let t: Table<W> = Table::new(0);
        let ids: Vec<u64> = (0..3 * SHARDS as u32)
            .map(|i| t.insert((i, (i % 2) as usize, (i % 3) as usize), |_| true))
            .collect();
        let mut taken = t.take_all(|&(_, peer, link)| peer == 1 && link == 2);
        taken.sort();
        let want: Vec<W> = (0..3 * SHARDS as u32)
            .filter(|i| i % 2 == 1 && i % 3 == 2)
            .map(|i| (i, 1, 2))
            .collect();
        assert_eq!(taken, want);
        assert_eq!(t.len(), ids.len() - want.len());
        assert!(t
            .take_all(|&(_, peer, link)| peer == 1 && link == 2)
            .is_empty());
    }

    /// Callers that died waiting for a reply that never comes are swept
    /// once their shard has grown past the sweep size, and the next sweep
    /// waits until the shard has doubled: the table stays bounded by the
    /// callers alive. (Caller 1 is alive, 0 dead; ids go to shard
    /// `id % SHARDS`.)
    #[test]
    fn dead_callers_are_swept_when_a_shard_grows() {
        let t: Table<W> = Table::new(0);
        let alive = |w: &W| w.0 == 1;
        let per_shard = SWEEP_MIN as u64 + 1;
        for id in 0..per_shard * SHARDS as u64 {
            let caller = u32::from(id % SHARDS as u64 != 0);
            assert_eq!(t.insert((caller, 0, 0), alive), id);
        }
        // Shard 0 passed SWEEP_MIN entries, all of dead callers: swept.
        assert_eq!(t.shard(0).calls.len(), 0);
        // Shard 1 passed it too, all alive: kept, and swept next at twice
        // that many.
        assert_eq!(t.shard(1).calls.len(), SWEEP_MIN + 1);
        let mut on_shard_1 = SWEEP_MIN + 1;
        while on_shard_1 < 2 * (SWEEP_MIN + 1) {
            // Dead callers on every shard.
            for _ in 0..SHARDS {
                t.insert((0, 0, 0), alive);
            }
            on_shard_1 += 1;
            assert_eq!(t.shard(1).calls.len(), on_shard_1, "swept before doubling");
        }
        for _ in 0..SHARDS {
            t.insert((0, 0, 0), alive);
        }
        assert_eq!(t.shard(1).calls.len(), SWEEP_MIN + 1, "the dead ones went");
    }

    #[test]
    fn random_starts_fit_in_62_bits() {
        assert!(random_start() < 1 << 62);
    }
}
