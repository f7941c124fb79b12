//! A list of destinations (the targets of `send_many`, thousands of pids
//! on one node) written with one call into the VM.
//!
//! The walk writes another node's pid through a cache of such pids
//! ([`super::remote`]), made for the one destination a caller sends to
//! push after push; a list of thousands of distinct pids misses it on
//! every pid, and each miss is a hash, a call to `enif_term_to_binary`
//! and a copy of the pid into the cache. Here the whole list goes through
//! `enif_term_to_binary` once, and its bytes are copied out with every
//! node atom, and every name, rewritten as its id where it has one, as the
//! walk writes them:
//!
//! ```text
//! from the VM:  131 | LIST_EXT n:u32 | element * n | NIL_EXT
//! element:      NEW_PID_EXT atom id:u32 serial:u32 creation:u32
//!               NEWER_REFERENCE_EXT len:u16 atom creation:u32 id:u32*len
//!               atom (a registered name)
//! atom:         ATOM_UTF8_EXT len:u16 text | SMALL_ATOM_UTF8_EXT len:u8 text
//!               | ATOM_EXT len:u16 text | SMALL_ATOM_EXT len:u8 text
//! written:      the same, each atom that has an id as ATOM_CACHE_REF id
//! ```
//!
//! A pid goes out in 15 bytes instead of 16 plus its node's name.

use super::atom_memo::{count, AtomMemo};
use ecall_dist::wire::etf::{
    ATOM_CACHE_REF, LIST_EXT, NEWER_REFERENCE_EXT, NEW_PID_EXT, NIL_EXT, VERSION,
};
use ecall_dist::wire::term_walk::atom_text;

/// Appends the list `ext` (its `term_to_binary`, version byte included)
/// to `out`, its atoms rewritten as ids where they have one. Returns
/// whether an atom stayed text and how many went as ids; `None` (and `out`
/// as it was) if `ext` is not a proper list of pids, references and atoms
/// as the VM writes them.
pub fn write(ext: &[u8], memo: &mut AtomMemo, out: &mut Vec<u8>) -> Option<(bool, u64)> {
    let start = out.len();
    let (mut text, mut refs) = (false, 0);
    let written = rewrite(ext, memo, out, &mut text, &mut refs);
    if written.is_none() {
        out.truncate(start);
    }
    written.map(|()| (text, refs))
}

fn rewrite(
    ext: &[u8],
    memo: &mut AtomMemo,
    out: &mut Vec<u8>,
    text: &mut bool,
    refs: &mut u64,
) -> Option<()> {
    match ext {
        [VERSION, NIL_EXT] => {
            out.push(NIL_EXT);
            return Some(());
        }
        [VERSION, LIST_EXT, ..] => {}
        _ => return None,
    }
    let n = u32::from_be_bytes(ext.get(2..6)?.try_into().ok()?);
    out.extend_from_slice(&ext[1..6]);
    let mut at = 6;
    // The atom met last and its id: a list holds the pids of one node,
    // whose name is then looked up once.
    let mut last: Option<(&[u8], Option<u8>)> = None;
    let mut atom = |at: usize, out: &mut Vec<u8>| -> Option<usize> {
        let (utf8, s, len, next) = atom_text(ext, at)?;
        let name = &ext[s..s + len];
        let id = match last {
            Some((prev, id)) if prev == name => id,
            _ => memo.text_id(utf8, name),
        };
        last = Some((name, id));
        match id {
            Some(id) => out.extend_from_slice(&[ATOM_CACHE_REF, id]),
            None => out.extend_from_slice(&ext[at..next]),
        }
        count(id.is_some(), text, refs);
        Some(next)
    };
    for _ in 0..n {
        match *ext.get(at)? {
            NEW_PID_EXT => {
                out.push(NEW_PID_EXT);
                let next = atom(at + 1, out)?;
                out.extend_from_slice(ext.get(next..next + 12)?);
                at = next + 12;
            }
            NEWER_REFERENCE_EXT => {
                let len = usize::from(u16::from_be_bytes(
                    ext.get(at + 1..at + 3)?.try_into().ok()?,
                ));
                out.extend_from_slice(&ext[at..at + 3]);
                let next = atom(at + 3, out)?;
                let end = next + 4 + 4 * len;
                out.extend_from_slice(ext.get(next..end)?);
                at = end;
            }
            _ => at = atom(at, out)?,
        }
    }
    (ext.get(at..)? == [NIL_EXT]).then(|| out.push(NIL_EXT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ecall_dist::wire::etf::{SMALL_ATOM_UTF8_EXT, SMALL_TUPLE_EXT};
    use ecall_dist::wire::term_walk::expand_term;

    fn atom(name: &[u8]) -> Vec<u8> {
        let mut v = vec![SMALL_ATOM_UTF8_EXT, name.len() as u8];
        v.extend_from_slice(name);
        v
    }

    fn pid(node: &[u8], id: u32) -> Vec<u8> {
        let mut v = vec![NEW_PID_EXT];
        v.extend(atom(node));
        v.extend(id.to_be_bytes());
        v.extend([0, 0, 0, 0, 0, 0, 0, 7]);
        v
    }

    fn alias(node: &[u8]) -> Vec<u8> {
        let mut v = vec![NEWER_REFERENCE_EXT, 0, 3];
        v.extend(atom(node));
        v.extend([0, 0, 0, 7]);
        v.extend([1u8; 12]);
        v
    }

    fn list(elements: &[Vec<u8>]) -> Vec<u8> {
        let mut v = vec![VERSION, LIST_EXT];
        v.extend((elements.len() as u32).to_be_bytes());
        for e in elements {
            v.extend(e);
        }
        v.push(NIL_EXT);
        v
    }

    /// What the walk would write for `ext`, back as text: the input
    /// without its version byte.
    fn expanded(out: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        assert!(expand_term(out, &mut v), "expands");
        v
    }

    #[test]
    fn pids_aliases_and_names_keep_their_terms() {
        let node = b"dests_test_node@host";
        let ext = list(&[
            pid(node, 1),
            alias(node),
            atom(b"dests_test_name"),
            pid(node, 2),
        ]);
        let (mut memo, mut out) = (AtomMemo::new(), Vec::new());
        let counts = write(&ext, &mut memo, &mut out).expect("a list of destinations");
        assert_eq!(expanded(&out), ext[1..]);
        // Every atom got an id (the process-wide table has room): four
        // references, no text, and a pid in 15 bytes.
        assert_eq!(counts, (false, 4));
        assert_eq!(out.len(), 5 + 15 + (3 + 2 + 4 + 12) + 2 + 15 + 1);
    }

    #[test]
    fn the_empty_list() {
        let (mut memo, mut out) = (AtomMemo::new(), vec![9]);
        let counts = write(&[VERSION, NIL_EXT], &mut memo, &mut out).expect("[]");
        assert_eq!((out, counts), (vec![9, NIL_EXT], (false, 0)));
    }

    #[test]
    fn anything_else_writes_nothing() {
        let node = b"dests_test_node@host";
        let good = list(&[pid(node, 1), pid(node, 2)]);
        let mut tuple = list(&[pid(node, 1)]);
        tuple.insert(6, SMALL_TUPLE_EXT);
        let mut improper = good.clone();
        *improper.last_mut().unwrap() = SMALL_ATOM_UTF8_EXT;
        let bad = [
            good[..good.len() - 3].to_vec(), // cut short
            improper,
            tuple,
            vec![VERSION, SMALL_TUPLE_EXT, 0],
            vec![],
        ];
        for ext in bad {
            let (mut memo, mut out) = (AtomMemo::new(), vec![9]);
            assert!(write(&ext, &mut memo, &mut out).is_none());
            assert_eq!(out, [9], "{ext:?}");
        }
    }
}
