//! A small two-way set-associative table keyed by a 64-bit word, the
//! table the memo of atom encodings is built on (it is no atom cache of
//! its own): what the NIF's encoder keeps per scheduler thread, the
//! encodings of atoms and local pids (keyed by their term word, which
//! names them for the life of the VM) and, in the walker's table of
//! remote terms (`encode/remote.rs`), of other nodes' pids and ports
//! (keyed by their hash).
//!
//! Why two ways: each key may live in one of the two entries of its set,
//! so two hot keys that fall in the same set both stay, and only a third
//! one replaces the one kept longer ago. In a direct-mapped table two
//! atoms of one slot that a payload held would replace each other on
//! every push, and each miss would go to the VM's `enif_term_to_binary`
//! and to the atom id table's lock. Which atoms share a slot depends on
//! the order the VM made them in, so a payload's cost would be a matter of
//! luck: a few payloads in many would cost several times the others
//! (doc/performance.md, "Ideas kept", the memo, has the figures).
//!
//! [`TwoWayBytes`] keeps byte strings of any length by key the same way, in
//! an arena: the encodings of atoms too long for the table's entries.
//!
//! Neither has anything of the BEAM, so both are unit tested on their
//! own. The key 0 marks an empty entry: it is never kept and never found.

/// The table: `N` entries (a power of two, 2 or more) in sets of two, each
/// a key and its value. `N` is a constant, so that finding a key's set is
/// a multiply and a shift, with no bounds check.
pub struct TwoWayTable<V, const N: usize> {
    entries: Box<[(u64, V); N]>,
}

impl<V: Copy + Default, const N: usize> TwoWayTable<V, N> {
    /// log2 of the number of sets (`N` is checked in [`new`](Self::new)).
    const SET_BITS: u32 = (N / 2).trailing_zeros();

    /// A table with every entry empty.
    ///
    /// # Panics
    ///
    /// If `N` is not a power of two of 2 or more (a constant of the caller).
    pub fn new() -> Self {
        assert!(N.is_power_of_two() && N >= 2, "TwoWayTable: {N} entries");
        let entries: Box<[(u64, V)]> = vec![(0, V::default()); N].into_boxed_slice();
        TwoWayTable {
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

impl<V: Copy + Default, const N: usize> Default for TwoWayTable<V, N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Byte strings kept by key: a [`TwoWayTable`] of `N` entries that says
/// where each lies in an arena of at most `BYTES` bytes. When a string
/// would take the arena past that, the arena and its index are emptied
/// first (what is met again is kept again). Strings longer than `BYTES`,
/// or than 65,535 bytes, are not kept.
pub struct TwoWayBytes<const N: usize, const BYTES: usize> {
    /// Where each key's bytes lie in `bytes`, and how many.
    index: TwoWayTable<(u32, u16), N>,
    bytes: Vec<u8>,
}

impl<const N: usize, const BYTES: usize> TwoWayBytes<N, BYTES> {
    /// Empty (the arena grows as strings are kept).
    pub fn new() -> Self {
        TwoWayBytes {
            index: TwoWayTable::new(),
            bytes: Vec::new(),
        }
    }

    /// The bytes kept for `key`, if there are some.
    #[inline]
    pub fn get(&self, key: u64) -> Option<&[u8]> {
        let &(at, len) = self.index.get(key)?;
        self.bytes.get(at as usize..at as usize + usize::from(len))
    }

    /// Keeps `bytes` for `key` (see the type for what is not kept).
    pub fn keep(&mut self, key: u64, bytes: &[u8]) {
        let Ok(len) = u16::try_from(bytes.len()) else {
            return;
        };
        if key == 0 || bytes.len() > BYTES {
            return;
        }
        if self.bytes.len() + bytes.len() > BYTES {
            self.index.clear();
            self.bytes.clear();
        }
        let at = self.bytes.len() as u32;
        self.bytes.extend_from_slice(bytes);
        self.index.keep(key, (at, len));
    }
}

impl<const N: usize, const BYTES: usize> Default for TwoWayBytes<N, BYTES> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::{TwoWayBytes, TwoWayTable};

    /// The first `n` keys (counting from 1) that share key 1's set.
    fn same_set(t: &TwoWayTable<u32, 1024>, n: usize) -> Vec<u64> {
        let want = t.set(1);
        (1u64..).filter(|&k| t.set(k) == want).take(n).collect()
    }

    #[test]
    fn two_keys_of_one_set_both_stay() {
        let mut t = TwoWayTable::<u32, 1024>::new();
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
        let mut t = TwoWayTable::<u32, 1024>::new();
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
        let mut t = TwoWayTable::<u32, 1024>::new();
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
        let mut t = TwoWayTable::<u32, 1024>::new();
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
        let mut t = TwoWayTable::<u32, 2>::new();
        assert_eq!(t.keep(0, 5), None);
        assert_eq!(t.get(0), None);
        t.keep(7, 1);
        t.keep(9, 2);
        assert_eq!((t.get(7), t.get(9)), (Some(&1), Some(&2)));
        t.clear();
        assert_eq!((t.get(7), t.get(9), t.get(0)), (None, None, None));
    }

    #[test]
    fn bytes_come_back_as_kept() {
        let mut b = TwoWayBytes::<256, 1024>::new();
        let texts: Vec<Vec<u8>> = (1..=20u8).map(|n| vec![n; usize::from(n) * 3]).collect();
        for (k, t) in (1u64..).zip(&texts) {
            b.keep(k, t);
        }
        for (k, t) in (1u64..).zip(&texts) {
            assert_eq!(b.get(k), Some(&t[..]), "key {k}");
        }
        assert_eq!(b.get(21), None);
        assert_eq!(b.get(0), None);
    }

    #[test]
    fn a_full_arena_is_emptied_before_the_next() {
        let mut b = TwoWayBytes::<256, 100>::new();
        b.keep(1, &[1; 60]);
        b.keep(2, &[2; 30]);
        // 90 + 20 would pass 100: the arena starts again.
        b.keep(3, &[3; 20]);
        assert_eq!((b.get(1), b.get(2)), (None, None));
        assert_eq!(b.get(3), Some(&[3u8; 20][..]));
        // What is met again is kept again, beside it.
        b.keep(1, &[1; 60]);
        assert_eq!(b.get(1), Some(&[1u8; 60][..]));
        assert_eq!(b.get(3), Some(&[3u8; 20][..]));
    }

    #[test]
    fn too_long_or_key_zero_is_not_kept() {
        let mut b = TwoWayBytes::<256, 100>::new();
        b.keep(5, &[5; 10]);
        b.keep(1, &[1; 101]);
        b.keep(0, &[0; 10]);
        assert_eq!(b.get(1), None);
        assert_eq!(b.get(0), None);
        // And nothing kept before was dropped for them.
        assert_eq!(b.get(5), Some(&[5u8; 10][..]));
        let mut big = TwoWayBytes::<256, 100_000>::new();
        big.keep(7, &vec![7; 70_000]);
        assert_eq!(big.get(7), None);
    }

    #[test]
    fn a_key_pushed_out_of_its_set_is_not_found() {
        let mut b = TwoWayBytes::<1024, 4096>::new();
        let t = TwoWayTable::<u32, 1024>::new();
        let ks = same_set(&t, 3);
        for (n, &k) in ks.iter().enumerate() {
            b.keep(k, &[n as u8 + 1; 8]);
        }
        assert_eq!(b.get(ks[0]), None);
        assert_eq!(b.get(ks[1]), Some(&[2u8; 8][..]));
        assert_eq!(b.get(ks[2]), Some(&[3u8; 8][..]));
    }

    #[test]
    #[should_panic(expected = "TwoWayTable: 1000 entries")]
    fn a_size_that_is_no_power_of_two_is_refused() {
        let _ = TwoWayTable::<u32, 1000>::new();
    }
}
