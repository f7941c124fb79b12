//! A small two-way set-associative table keyed by a 64-bit word: what the
//! NIF's encoder keeps per scheduler thread, the encodings of atoms and
//! local pids (keyed by their term word, which names them for the life of
//! the VM) and of other nodes' pids and ports (keyed by their hash).
//!
//! Why two ways: each key may live in one of the two entries of its set,
//! so two hot keys that fall in the same set both stay, and only a third
//! one replaces the one kept longer ago. The table it replaces was
//! direct-mapped: two atoms of one slot that a payload held replaced each
//! other on every push, and each miss went to the VM's
//! `enif_term_to_binary` and to the atom id table's lock. Which atoms
//! share a slot depends on the order the VM made them in, so a payload's
//! cost was a matter of luck: `bench/run.sh micro` encodes every pair of
//! 30 sets of 15 atoms, and with the direct-mapped table 2 sets in 30 had
//! a pair that took 3-5 times the median pair (366-658 ns against 85-121),
//! in two runs; with two ways none did (slowest 187-271 ns).
//!
//! Why here: the table has nothing of the BEAM, so it is tested on its own.
//! The key 0 marks an empty entry: it is never kept and never found.

/// The table: `N` entries (a power of two, 2 or more) in sets of two, each
/// a key and its value. `N` is a constant, so that finding a key's set is
/// a multiply and a shift, with no bounds check.
pub struct WordCache<V, const N: usize> {
    entries: Box<[(u64, V); N]>,
}

impl<V: Copy + Default, const N: usize> WordCache<V, N> {
    /// log2 of the number of sets (`N` is checked in [`new`](Self::new)).
    const SET_BITS: u32 = (N / 2).trailing_zeros();

    /// A table with every entry empty.
    ///
    /// # Panics
    ///
    /// If `N` is not a power of two of 2 or more (a constant of the caller).
    pub fn new() -> Self {
        assert!(N.is_power_of_two() && N >= 2, "WordCache: {N} entries");
        let entries: Box<[(u64, V)]> = vec![(0, V::default()); N].into_boxed_slice();
        WordCache {
            entries: entries.try_into().unwrap_or_else(|_| unreachable!()),
        }
    }

    /// The index of `key`'s set's first entry (the second is the next).
    /// Fibonacci hashing: term words differ in their high bits as much as
    /// in their low ones, and a product spreads both over the top bits.
    #[inline]
    fn set(&self, key: u64) -> usize {
        if Self::SET_BITS == 0 {
            return 0;
        }
        ((key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - Self::SET_BITS)) as usize) * 2
    }

    /// The index of the entry that holds `key`, if one does.
    #[inline]
    pub fn find(&self, key: u64) -> Option<usize> {
        if key == 0 {
            return None;
        }
        let i = self.set(key);
        if self.entries[i].0 == key {
            Some(i)
        } else if self.entries[i + 1].0 == key {
            Some(i + 1)
        } else {
            None
        }
    }

    /// The value kept for `key`, if there is one.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&V> {
        self.find(key).map(|i| &self.entries[i].1)
    }

    /// The value of entry `index` (from [`find`](Self::find) or
    /// [`keep`](Self::keep)), whatever key it now holds.
    #[inline]
    pub fn at(&self, index: usize) -> &V {
        &self.entries[index].1
    }

    /// Keeps `value` for `key`, as the first entry of its set: a key kept
    /// again replaces its own entry; otherwise the first entry moves to
    /// the second place and what the second held is dropped, so a third
    /// key of a set always drops the one kept longer ago. Returns the
    /// entry's index. The key 0 is not kept (`None`).
    pub fn keep(&mut self, key: u64, value: V) -> Option<usize> {
        if key == 0 {
            return None;
        }
        let i = self.set(key);
        if self.entries[i].0 != key {
            self.entries[i + 1] = self.entries[i];
        }
        self.entries[i] = (key, value);
        Some(i)
    }

    /// Empties every entry.
    pub fn clear(&mut self) {
        self.entries.fill((0, V::default()));
    }
}

impl<V: Copy + Default, const N: usize> Default for WordCache<V, N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::WordCache;

    /// The first `n` keys (counting from 1) that share key 1's set.
    fn same_set(t: &WordCache<u32, 1024>, n: usize) -> Vec<u64> {
        let want = t.set(1);
        (1u64..).filter(|&k| t.set(k) == want).take(n).collect()
    }

    #[test]
    fn two_keys_of_one_set_both_stay() {
        let mut t = WordCache::<u32, 1024>::new();
        let ks = same_set(&t, 2);
        t.keep(ks[0], 10);
        t.keep(ks[1], 11);
        // What a push that alternates them sees, again and again.
        for _ in 0..3 {
            assert_eq!(t.get(ks[0]), Some(&10));
            assert_eq!(t.get(ks[1]), Some(&11));
        }
    }

    #[test]
    fn a_third_key_drops_the_one_kept_longer_ago() {
        let mut t = WordCache::<u32, 1024>::new();
        let ks = same_set(&t, 3);
        t.keep(ks[0], 10);
        t.keep(ks[1], 11);
        t.keep(ks[2], 12);
        assert_eq!(t.get(ks[0]), None);
        assert_eq!(t.get(ks[1]), Some(&11));
        assert_eq!(t.get(ks[2]), Some(&12));
        // Kept again, the dropped one drops the older of the other two.
        t.keep(ks[0], 20);
        assert_eq!(t.get(ks[1]), None);
        assert_eq!(t.get(ks[2]), Some(&12));
        assert_eq!(t.get(ks[0]), Some(&20));
    }

    #[test]
    fn a_key_kept_again_replaces_itself() {
        let mut t = WordCache::<u32, 1024>::new();
        let ks = same_set(&t, 2);
        t.keep(ks[0], 10);
        t.keep(ks[1], 11);
        // ks[0] is in the second place: kept again, it must not end up in
        // both places (a stale value found first), nor drop ks[1].
        t.keep(ks[0], 30);
        assert_eq!(t.get(ks[0]), Some(&30));
        assert_eq!(t.get(ks[1]), Some(&11));
        let i = t.keep(ks[0], 31).unwrap();
        assert_eq!(t.find(ks[0]), Some(i));
        assert_eq!(*t.at(i), 31);
        assert_eq!(t.get(ks[1]), Some(&11));
    }

    #[test]
    fn keys_of_other_sets_do_not_disturb() {
        let mut t = WordCache::<u32, 1024>::new();
        let keys: Vec<u64> = (1..=200).map(|k| k * 0x1_0000_0040 + 0xb).collect();
        for &k in &keys {
            t.keep(k, k as u32);
        }
        // 200 keys in 512 sets: those not pushed out by two later keys of
        // their own set are all there, with their own values.
        for (n, &k) in keys.iter().enumerate() {
            let later = keys[n + 1..]
                .iter()
                .filter(|&&o| t.set(o) == t.set(k))
                .count();
            assert_eq!(t.get(k).is_some(), later < 2, "key {k:#x}");
            if let Some(v) = t.get(k) {
                assert_eq!(*v, k as u32);
            }
        }
    }

    #[test]
    fn zero_is_never_a_key_and_clear_empties() {
        let mut t = WordCache::<u32, 2>::new();
        assert_eq!(t.keep(0, 5), None);
        assert_eq!(t.get(0), None);
        t.keep(7, 1);
        t.keep(9, 2);
        assert_eq!((t.get(7), t.get(9)), (Some(&1), Some(&2)));
        t.clear();
        assert_eq!((t.get(7), t.get(9), t.get(0)), (None, None, None));
    }

    #[test]
    #[should_panic(expected = "WordCache: 1000 entries")]
    fn a_size_that_is_no_power_of_two_is_refused() {
        let _ = WordCache::<u32, 1000>::new();
    }
}
