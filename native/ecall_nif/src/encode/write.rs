//! The bytes the walker writes itself, in external format without the
//! version byte (tags: `ecall_dist::wire::etf`), and the arithmetic of its
//! limit. Nothing here calls into the VM: tested on its own (see
//! `pure_tests.rs`).

use ecall_dist::wire::etf::{
    BINARY_EXT, INTEGER_EXT, LARGE_TUPLE_EXT, LIST_EXT, MAP_EXT, NEW_FLOAT_EXT, NIL_EXT,
    SMALL_BIG_EXT, SMALL_INTEGER_EXT, SMALL_TUPLE_EXT,
};

/// An integer that fits 64 bits, in the smallest of the forms
/// `term_to_binary` uses for it.
#[inline]
pub fn integer(i: i64, out: &mut Vec<u8>) {
    if (0..=255).contains(&i) {
        out.extend_from_slice(&[SMALL_INTEGER_EXT, i as u8]);
    } else if let Ok(i) = i32::try_from(i) {
        out.push(INTEGER_EXT);
        out.extend_from_slice(&i.to_be_bytes());
    } else {
        // SMALL_BIG_EXT: digit count, sign, magnitude little-endian.
        let m = i.unsigned_abs().to_le_bytes();
        let n = 8 - m.iter().rev().take_while(|&&b| b == 0).count();
        out.extend_from_slice(&[SMALL_BIG_EXT, n as u8, u8::from(i < 0)]);
        out.extend_from_slice(&m[..n]);
    }
}

/// A non-negative integer that fits 64 bits, as `term_to_binary` writes
/// it: [`integer`], or past `i64::MAX` a `SMALL_BIG_EXT` of 8 digits.
#[inline]
pub fn natural(u: u64, out: &mut Vec<u8>) {
    match i64::try_from(u) {
        Ok(i) => integer(i, out),
        Err(_) => {
            out.extend_from_slice(&[SMALL_BIG_EXT, 8, 0]);
            out.extend_from_slice(&u.to_le_bytes());
        }
    }
}

/// A float: `NEW_FLOAT_EXT`, its IEEE 754 bits big-endian.
#[inline]
pub fn float(f: f64, out: &mut Vec<u8>) {
    out.push(NEW_FLOAT_EXT);
    out.extend_from_slice(&f.to_bits().to_be_bytes());
}

/// A binary (a whole number of bytes).
#[inline]
pub fn binary(b: &[u8], out: &mut Vec<u8>) {
    out.push(BINARY_EXT);
    out.extend_from_slice(&(b.len() as u32).to_be_bytes());
    out.extend_from_slice(b);
}

/// The header of a tuple of `arity` elements (its elements follow).
#[inline]
pub fn tuple_header(out: &mut Vec<u8>, arity: usize) {
    if arity < 256 {
        out.extend_from_slice(&[SMALL_TUPLE_EXT, arity as u8]);
    } else {
        out.push(LARGE_TUPLE_EXT);
        out.extend_from_slice(&(arity as u32).to_be_bytes());
    }
}

/// The header of a map of `size` pairs (its keys and values follow, key
/// first).
#[inline]
pub fn map_header(out: &mut Vec<u8>, size: usize) {
    out.push(MAP_EXT);
    out.extend_from_slice(&(size as u32).to_be_bytes());
}

/// The empty list, or the tail of a proper one.
#[inline]
pub fn nil(out: &mut Vec<u8>) {
    out.push(NIL_EXT);
}

/// The header of a list whose length is not known yet: returns where it
/// is, for [`list_length`] once the cells are written (then its tail).
#[inline]
pub fn list_header(out: &mut Vec<u8>) -> usize {
    let header = out.len();
    out.extend_from_slice(&[LIST_EXT, 0, 0, 0, 0]);
    header
}

/// Fills in the length of the list whose header [`list_header`] wrote at
/// `header`: `count` cells.
#[inline]
pub fn list_length(out: &mut [u8], header: usize, count: u32) {
    out[header + 1..header + 5].copy_from_slice(&count.to_be_bytes());
}

/// Whether an encoding of `used` bytes passes `limit` once it grows by
/// `more` bytes, the least its next term takes (a binary: its bytes; a
/// tuple: a byte per element; a map: two per pair). A limit of
/// `usize::MAX` is never passed.
#[inline]
pub fn passes(used: usize, more: usize, limit: usize) -> bool {
    used.saturating_add(more) > limit
}

#[cfg(test)]
mod tests {
    use super::*;
    use ecall_dist::wire::term_walk::term_end;

    /// What `write` appends after bytes already there, checked to be one
    /// whole term.
    fn one(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut out = vec![0xAA];
        write(&mut out);
        assert_eq!(out[0], 0xAA, "appends");
        assert_eq!(term_end(&out, 1), Some(out.len()), "one term: {out:?}");
        out.split_off(1)
    }

    #[test]
    fn integers_take_the_smallest_form() {
        let cases: &[(i64, &[u8])] = &[
            (0, &[SMALL_INTEGER_EXT, 0]),
            (255, &[SMALL_INTEGER_EXT, 255]),
            (256, &[INTEGER_EXT, 0, 0, 1, 0]),
            (-1, &[INTEGER_EXT, 255, 255, 255, 255]),
            (i32::MAX.into(), &[INTEGER_EXT, 0x7f, 255, 255, 255]),
            (i32::MIN.into(), &[INTEGER_EXT, 0x80, 0, 0, 0]),
            // Past 32 bits: digits little-endian, no zero digits on top.
            (1 << 31, &[SMALL_BIG_EXT, 4, 0, 0, 0, 0, 0x80]),
            (-(1 << 31) - 1, &[SMALL_BIG_EXT, 4, 1, 1, 0, 0, 0x80]),
            (1 << 32, &[SMALL_BIG_EXT, 5, 0, 0, 0, 0, 0, 1]),
            (
                i64::MAX,
                &[SMALL_BIG_EXT, 8, 0, 255, 255, 255, 255, 255, 255, 255, 0x7f],
            ),
            // Its magnitude does not fit an i64.
            (i64::MIN, &[SMALL_BIG_EXT, 8, 1, 0, 0, 0, 0, 0, 0, 0, 0x80]),
        ];
        for &(i, bytes) in cases {
            assert_eq!(one(|out| integer(i, out)), bytes, "{i}");
        }
    }

    #[test]
    fn naturals_past_i64_take_eight_digits() {
        assert_eq!(one(|out| natural(7, out)), [SMALL_INTEGER_EXT, 7]);
        assert_eq!(
            one(|out| natural(i64::MAX as u64, out)),
            [SMALL_BIG_EXT, 8, 0, 255, 255, 255, 255, 255, 255, 255, 0x7f]
        );
        assert_eq!(
            one(|out| natural(1 << 63, out)),
            [SMALL_BIG_EXT, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0x80]
        );
        assert_eq!(
            one(|out| natural(u64::MAX, out)),
            [SMALL_BIG_EXT, 8, 0, 255, 255, 255, 255, 255, 255, 255, 255]
        );
    }

    #[test]
    fn floats_are_their_bits() {
        assert_eq!(
            one(|out| float(1.5, out)),
            [NEW_FLOAT_EXT, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            one(|out| float(-0.0, out)),
            [NEW_FLOAT_EXT, 0x80, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn binaries_carry_their_length() {
        assert_eq!(one(|out| binary(b"", out)), [BINARY_EXT, 0, 0, 0, 0]);
        assert_eq!(
            one(|out| binary(b"ab", out)),
            [BINARY_EXT, 0, 0, 0, 2, b'a', b'b']
        );
    }

    #[test]
    fn tuples_past_255_elements_take_the_large_header() {
        assert_eq!(one(|out| tuple_header(out, 0)), [SMALL_TUPLE_EXT, 0]);
        let mut out = Vec::new();
        tuple_header(&mut out, 255);
        assert_eq!(out, [SMALL_TUPLE_EXT, 255]);
        out.clear();
        tuple_header(&mut out, 256);
        assert_eq!(out, [LARGE_TUPLE_EXT, 0, 0, 1, 0]);
        // {1, 2.5}
        let two = one(|out| {
            tuple_header(out, 2);
            integer(1, out);
            float(2.5, out);
        });
        assert_eq!(two[..2], [SMALL_TUPLE_EXT, 2]);
    }

    #[test]
    fn a_list_length_is_filled_in_at_its_tail() {
        // [1, 2], as the walker writes it: the header, the cells, then
        // the length and the tail.
        let list = one(|out| {
            let header = list_header(out);
            integer(1, out);
            integer(2, out);
            list_length(out, header, 2);
            nil(out);
        });
        assert_eq!(
            list,
            [
                LIST_EXT,
                0,
                0,
                0,
                2,
                SMALL_INTEGER_EXT,
                1,
                SMALL_INTEGER_EXT,
                2,
                NIL_EXT
            ]
        );
        // [1 | 2]: improper, its tail a term of its own.
        let improper = one(|out| {
            let header = list_header(out);
            integer(1, out);
            list_length(out, header, 1);
            integer(2, out);
        });
        assert_eq!(improper[..5], [LIST_EXT, 0, 0, 0, 1]);
        assert_eq!(one(nil), [NIL_EXT]);
    }

    #[test]
    fn maps_are_a_header_then_keys_and_values() {
        // #{1 => [], <<>> => -1}
        let map = one(|out| {
            map_header(out, 2);
            integer(1, out);
            nil(out);
            binary(b"", out);
            integer(-1, out);
        });
        assert_eq!(map[..5], [MAP_EXT, 0, 0, 0, 2]);
        assert_eq!(one(|out| map_header(out, 0)), [MAP_EXT, 0, 0, 0, 0]);
    }

    #[test]
    fn the_limit_is_passed_past_it_only() {
        assert!(!passes(10, 6, 16));
        assert!(passes(10, 7, 16));
        assert!(passes(17, 0, 16));
        // No limit (`encode/1`), however large the term says it is.
        assert!(!passes(usize::MAX - 1, usize::MAX, usize::MAX));
        assert!(passes(1, usize::MAX, usize::MAX - 1));
    }
}
