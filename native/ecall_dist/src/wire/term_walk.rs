//! Walks over terms in the external format without decoding them: the
//! one walker that the atom cache (`wire/conn_atom_cache.rs`), fragments,
//! the inbound checks and the NIF's tests share. A walk copies a term's
//! bytes to an output and hands each atom it meets to an [`Atoms`]
//! policy, which copies, skips, rewrites or expands it.
//!
//! Hostile input: the walk is iterative (a count of terms still to walk
//! replaces recursion, so depth costs no stack), and every step consumes at
//! least one input byte, so a length or arity read from the input bounds
//! nothing but that count: the walk ends when the input does.

use crate::wire::etf::*;

/// What a walk does with each atom it meets.
pub(crate) trait Atoms {
    /// Handles the atom at `inp[pos..]` (its tag included), appends its
    /// rewritten or copied form to `out` and returns the position after it.
    fn atom(&mut self, inp: &[u8], pos: usize, out: &mut Vec<u8>) -> Option<usize>;
}

pub(crate) fn u16_at(inp: &[u8], pos: usize) -> Option<usize> {
    Some(u16::from_be_bytes(inp.get(pos..pos + 2)?.try_into().ok()?) as usize)
}

pub(crate) fn u32_at(inp: &[u8], pos: usize) -> Option<usize> {
    Some(u32::from_be_bytes(inp.get(pos..pos + 4)?.try_into().ok()?) as usize)
}

pub(crate) fn copy(inp: &[u8], pos: usize, len: usize, out: &mut Vec<u8>) -> Option<usize> {
    out.extend_from_slice(inp.get(pos..pos.checked_add(len)?)?);
    Some(pos + len)
}

/// Walks one term at `inp[pos..]` (no version byte), copying it to `out`
/// and handing every atom to `atoms`. Iterative: the count of terms still
/// to walk replaces recursion, so depth costs no stack, and every step
/// consumes at least one input byte, so a length or arity read from the
/// input (even 0xFFFFFFFF) bounds nothing but that count: the walk ends
/// when the input does. `None` for anything
/// malformed or of a kind we do not walk (old fun, local, compressed).
pub(crate) fn walk<A: Atoms>(
    atoms: &mut A,
    inp: &[u8],
    mut pos: usize,
    out: &mut Vec<u8>,
) -> Option<usize> {
    let mut remaining = 1usize;
    while remaining > 0 {
        remaining -= 1;
        let tag = *inp.get(pos)?;
        pos = match tag {
            SMALL_INTEGER_EXT => copy(inp, pos, 2, out)?,
            INTEGER_EXT => copy(inp, pos, 5, out)?,
            NEW_FLOAT_EXT => copy(inp, pos, 9, out)?,
            FLOAT_EXT => copy(inp, pos, 32, out)?,
            NIL_EXT => copy(inp, pos, 1, out)?,
            STRING_EXT => copy(inp, pos, 3 + u16_at(inp, pos + 1)?, out)?,
            BINARY_EXT => copy(inp, pos, 5 + u32_at(inp, pos + 1)?, out)?,
            BIT_BINARY_EXT => copy(inp, pos, 6 + u32_at(inp, pos + 1)?, out)?,
            SMALL_BIG_EXT => copy(inp, pos, 3 + *inp.get(pos + 1)? as usize, out)?,
            LARGE_BIG_EXT => copy(inp, pos, 6 + u32_at(inp, pos + 1)?, out)?,
            // NEW_FUN: its size covers it all; its atoms stay as text.
            NEW_FUN_EXT => copy(inp, pos, 1 + u32_at(inp, pos + 1)?, out)?,
            SMALL_TUPLE_EXT => {
                remaining = remaining.saturating_add(*inp.get(pos + 1)? as usize);
                copy(inp, pos, 2, out)?
            }
            LARGE_TUPLE_EXT => {
                remaining = remaining.saturating_add(u32_at(inp, pos + 1)?);
                copy(inp, pos, 5, out)?
            }
            LIST_EXT => {
                remaining = remaining
                    .saturating_add(u32_at(inp, pos + 1)?)
                    .saturating_add(1);
                copy(inp, pos, 5, out)?
            }
            MAP_EXT => {
                remaining = remaining.saturating_add(u32_at(inp, pos + 1)?.saturating_mul(2));
                copy(inp, pos, 5, out)?
            }
            EXPORT_EXT => {
                // EXPORT: module, function, arity follow as terms.
                remaining += 3;
                copy(inp, pos, 1, out)?
            }
            ATOM_EXT | SMALL_ATOM_EXT | ATOM_UTF8_EXT | SMALL_ATOM_UTF8_EXT | ATOM_CACHE_REF => {
                atoms.atom(inp, pos, out)?
            }
            // Pids, ports and references: a node atom between fixed fields.
            NEW_PID_EXT => atom_then(atoms, inp, pos, 1, 12, out)?,
            PID_EXT => atom_then(atoms, inp, pos, 1, 9, out)?,
            NEW_PORT_EXT => atom_then(atoms, inp, pos, 1, 8, out)?,
            V4_PORT_EXT => atom_then(atoms, inp, pos, 1, 12, out)?,
            PORT_EXT | REFERENCE_EXT => atom_then(atoms, inp, pos, 1, 5, out)?,
            NEWER_REFERENCE_EXT => {
                atom_then(atoms, inp, pos, 3, 4 + 4 * u16_at(inp, pos + 1)?, out)?
            }
            NEW_REFERENCE_EXT => atom_then(atoms, inp, pos, 3, 1 + 4 * u16_at(inp, pos + 1)?, out)?,
            _ => return None,
        };
    }
    Some(pos)
}

/// `head` bytes copied, one atom, then `tail` bytes copied.
fn atom_then<A: Atoms>(
    atoms: &mut A,
    inp: &[u8],
    pos: usize,
    head: usize,
    tail: usize,
    out: &mut Vec<u8>,
) -> Option<usize> {
    let pos = copy(inp, pos, head, out)?;
    let pos = atoms.atom(inp, pos, out)?;
    copy(inp, pos, tail, out)
}

/// The text of a plain atom at `inp[pos..]`: (utf8, start, len, next).
pub fn atom_text(inp: &[u8], pos: usize) -> Option<(bool, usize, usize, usize)> {
    let (utf8, start, len) = match *inp.get(pos)? {
        SMALL_ATOM_UTF8_EXT => (true, pos + 2, *inp.get(pos + 1)? as usize),
        ATOM_UTF8_EXT => (true, pos + 3, u16_at(inp, pos + 1)?),
        SMALL_ATOM_EXT => (false, pos + 2, *inp.get(pos + 1)? as usize),
        ATOM_EXT => (false, pos + 3, u16_at(inp, pos + 1)?),
        _ => return None,
    };
    inp.get(start..start + len)?;
    Some((utf8, start, len, start + len))
}

/// Rewrites a plain frame (`<len:32> 112 131 control 131 payload`) whose
/// terms may hold id references ([`crate::wire::fixed_atom_ids`]) with every id as
/// text, for a connection without the atom cache; appends it to `out`.
/// False, with nothing appended, if a term does not walk.
pub fn expand_ids(frame: &[u8], out: &mut Vec<u8>) -> bool {
    let start = out.len();
    let Some(body) = frame.get(PLAIN_TERMS..) else {
        return false;
    };
    out.extend_from_slice(&[0, 0, 0, 0, PASS_THROUGH]);
    if !walk_body(&mut ExpandIds, body, out, true) {
        out.truncate(start);
        return false;
    }
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    true
}

/// Appends the term at the start of `term` (no version byte) with its id
/// references written as text. False if it does not walk.
pub fn expand_term(term: &[u8], out: &mut Vec<u8>) -> bool {
    let start = out.len();
    match walk(&mut ExpandIds, term, 0, out) {
        Some(end) if end == term.len() => true,
        _ => {
            out.truncate(start);
            false
        }
    }
}

/// Writes id references as text.
struct ExpandIds;

impl Atoms for ExpandIds {
    fn atom(&mut self, inp: &[u8], pos: usize, out: &mut Vec<u8>) -> Option<usize> {
        if inp.get(pos) != Some(&ATOM_CACHE_REF) {
            return Plain.atom(inp, pos, out);
        }
        let text = crate::wire::fixed_atom_ids::text(*inp.get(pos + 1)?)?;
        crate::wire::etf::put_atom(out, std::str::from_utf8(text).ok()?);
        Some(pos + 2)
    }
}

/// Where the term at `inp[pos..]` (no version byte) ends, or `None` if it
/// is malformed or of a kind we do not walk. Atoms must be text: this
/// checks what a peer sends without a distribution header, where a cache
/// reference means nothing.
pub fn term_end(inp: &[u8], pos: usize) -> Option<usize> {
    walk(&mut Skip { ids: false }, inp, pos, &mut Vec::new())
}

/// [`term_end`] of a term we built, whose atoms may be id references
/// ([`crate::wire::fixed_atom_ids`]).
pub(crate) fn own_term_end(inp: &[u8], pos: usize) -> Option<usize> {
    walk(&mut Skip { ids: true }, inp, pos, &mut Vec::new())
}

/// Copies nothing: for finding where a term ends. `ids`: id references
/// count as atoms (only in terms we built).
struct Skip {
    ids: bool,
}

impl Atoms for Skip {
    fn atom(&mut self, inp: &[u8], pos: usize, _out: &mut Vec<u8>) -> Option<usize> {
        if self.ids && inp.get(pos) == Some(&ATOM_CACHE_REF) {
            inp.get(pos + 1)?;
            return Some(pos + 2);
        }
        atom_text(inp, pos).map(|(_, _, _, next)| next)
    }
}

/// Walks the terms of a body whose terms carry version bytes, writing them
/// with their version bytes (`versions`) or without (behind a distribution
/// header).
pub(crate) fn walk_body<A: Atoms>(
    atoms: &mut A,
    body: &[u8],
    out: &mut Vec<u8>,
    versions: bool,
) -> bool {
    let mut pos = 0;
    while pos < body.len() {
        if body[pos] != VERSION {
            return false;
        }
        if versions {
            out.push(VERSION);
        }
        match walk(atoms, body, pos + 1, out) {
            Some(p) => pos = p,
            None => return false,
        }
    }
    true
}

/// Copies a body without the version bytes of its terms, without walking
/// (used when a walk failed: only the term boundaries are unknown, so the
/// whole rest is copied; a body is at most control + payload).
pub(crate) fn strip_versions(body: &[u8], out: &mut Vec<u8>) {
    // The control term is always walkable (we build it); find where it
    // ends with a plain copy walk, then copy the payload as it is.
    let mut plain = Plain;
    let mut scratch = Vec::new();
    match body.first() {
        Some(&VERSION) => match walk(&mut plain, body, 1, &mut scratch) {
            Some(end) => {
                out.extend_from_slice(&body[1..end]);
                if end < body.len() {
                    out.extend_from_slice(&body[end + 1..]);
                }
            }
            None => out.extend_from_slice(&body[1..]),
        },
        _ => out.extend_from_slice(body),
    }
}

/// Copies atoms as they are.
pub(crate) struct Plain;

impl Atoms for Plain {
    fn atom(&mut self, inp: &[u8], pos: usize, out: &mut Vec<u8>) -> Option<usize> {
        if inp.get(pos) == Some(&ATOM_CACHE_REF) {
            // An id reference (atom_ids), kept as it is.
            return copy(inp, pos, 2, out);
        }
        let (_, _, _, next) = atom_text(inp, pos)?;
        copy(inp, pos, next - pos, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eetf::{Atom, Term, Tuple};

    fn enc(t: &Term) -> Vec<u8> {
        let mut v = Vec::new();
        t.encode(&mut v).unwrap();
        v
    }

    /// Where a term ends, and a copy walk that gives its bytes back.
    #[test]
    fn term_end_finds_the_end_and_a_copy_walk_copies() {
        let t = Term::from(Tuple::from(vec![
            Term::from(Atom::from("a")),
            Term::from(eetf::List::from(vec![
                Term::from(eetf::FixInteger::from(7)),
                Term::from(eetf::Binary::from(vec![1u8, 2, 3])),
            ])),
            Term::from(eetf::Map::from([(
                Term::from(Atom::from("k")),
                Term::from(eetf::Float::try_from(1.5).unwrap()),
            )])),
        ]));
        let bytes = enc(&t);
        let mut two = bytes.clone();
        two.extend_from_slice(&bytes[1..]);
        assert_eq!(term_end(&two, 1), Some(bytes.len()));
        assert_eq!(term_end(&two, bytes.len()), Some(two.len()));
        let mut out = Vec::new();
        assert_eq!(walk(&mut Plain, &bytes, 1, &mut out), Some(bytes.len()));
        assert_eq!(out, &bytes[1..]);
    }

    /// Lengths and arities read off the input bound nothing but the count
    /// of terms still to walk: a claimed arity of 2^32 - 1 over a few bytes
    /// ends when the input does, and a million nested tuples cost no
    /// stack.
    #[test]
    fn hostile_lengths_and_depths_end_with_the_input() {
        assert_eq!(
            term_end(&[LARGE_TUPLE_EXT, 255, 255, 255, 255, NIL_EXT], 0),
            None
        );
        assert_eq!(term_end(&[LIST_EXT, 255, 255, 255, 255], 0), None);
        assert_eq!(term_end(&[BINARY_EXT, 255, 255, 255, 255, 1], 0), None);
        let depth = 1_000_000;
        let mut deep = Vec::with_capacity(2 * depth + 1);
        for _ in 0..depth {
            deep.extend_from_slice(&[SMALL_TUPLE_EXT, 1]);
        }
        deep.push(NIL_EXT);
        assert_eq!(term_end(&deep, 0), Some(deep.len()));
        deep.pop();
        assert_eq!(term_end(&deep, 0), None);
    }

    /// An atom's text, in each of its four forms; anything else is none.
    #[test]
    fn atom_text_reads_every_plain_atom() {
        for (bytes, utf8) in [
            (&[SMALL_ATOM_UTF8_EXT, 2, b'o', b'k'][..], true),
            (&[ATOM_UTF8_EXT, 0, 2, b'o', b'k'], true),
            (&[SMALL_ATOM_EXT, 2, b'o', b'k'], false),
            (&[ATOM_EXT, 0, 2, b'o', b'k'], false),
        ] {
            let (u, start, len, next) = atom_text(bytes, 0).unwrap();
            assert_eq!(
                (u, &bytes[start..start + len], next),
                (utf8, &b"ok"[..], bytes.len())
            );
        }
        assert_eq!(atom_text(&[SMALL_ATOM_UTF8_EXT, 3, b'o', b'k'], 0), None);
        assert_eq!(atom_text(&[ATOM_CACHE_REF, 0], 0), None);
    }
}
