//! The per-thread memo of atom encodings ([`AtomMemo`]): what an atom, or
//! a local pid, encodes to, kept by its term word (atoms never move or die,
//! so the word names the atom for the life of the VM), with the ids of the
//! node names met in pids, ports and references.
//!
//! Nothing here calls into the VM: the walker ([`super::walk`]) hands over
//! the bytes the VM wrote and the words it read, so this is tested on its
//! own (see `pure_tests.rs`).
//!
//! Not to be confused with the other tables atoms go through: the
//! process-wide encode-time atom ids (`ecall_dist::wire::fixed_atom_ids`), which this
//! memo asks once per atom, and the distribution atom cache of each
//! connection (`ecall_dist::wire::conn_atom_cache`), which the link writer keeps.

pub(super) mod two_way;

use ecall_dist::wire::etf::{ATOM_CACHE_REF, NEWER_REFERENCE_EXT, NEW_REFERENCE_EXT};
use ecall_dist::wire::fixed_atom_ids;
use ecall_dist::wire::term_walk::atom_text;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use two_way::{TwoWayBytes, TwoWayTable};

/// Entries of the memo per thread (a two-way set-associative table,
/// [`two_way::TwoWayTable`]: see there for why), each [`Entry`] with its
/// encoding inline: small enough to stay in a core's caches between
/// pushes. A bigger table whose entries point at their bytes elsewhere on
/// the heap falls out of the caches under load, and the encoder then
/// spends most of its time waiting on those loads (doc/performance.md,
/// "Ideas dropped", a bigger memo).
const MEMO_SLOTS: usize = 1024;
/// The longest encoding an [`Entry`] holds. Longer ones (atoms as text of
/// more than 16 bytes) are not kept in the table's entries but in
/// [`Long`].
pub const ENTRY_MAX: usize = 18;
/// Entries of [`Long`], per thread.
const LONG_SLOTS: usize = 256;
/// Bytes [`Long`] holds before it is emptied, per thread.
const LONG_BYTES: usize = 16 * 1024;
/// Node names remembered per thread.
const NODES: usize = 4096;

/// One thread's memo of atom and local pid encodings.
pub struct AtomMemo {
    /// Atoms and local pids, by term word.
    entries: TwoWayTable<Entry, MEMO_SLOTS>,
    /// Encodings of atoms too long for an entry (see [`Long`]).
    long: Long,
    /// Node names met in pids, ports and references, with their ids (this
    /// node and its peers; at most [`NODES`]).
    nodes: HashMap<Box<[u8]>, Option<u8>>,
}

/// Encodings of atoms longer than [`ENTRY_MAX`] bytes: atoms as text (past
/// the atoms with ids, [`fixed_atom_ids::IDS`]) too long for an entry,
/// such as Elixir's module names (`'Elixir.MyApp.Orders.Created'`).
/// Without it each would go through `enif_term_to_binary` on every
/// encode, several times what a kept one costs (doc/performance.md,
/// "Ideas kept", the memo). By term word (an atom's text never changes),
/// in an arena of at most [`LONG_BYTES`].
type Long = TwoWayBytes<LONG_SLOTS, LONG_BYTES>;

/// One memoized atom, or local pid (or, in the walker's table of other
/// nodes' pids and ports, one of those): 24 bytes (32 with its key in the
/// table), its encoding inline.
#[derive(Clone, Copy, Default)]
pub struct Entry {
    /// 0 for an atom (never stale); for a local pid, the [`EPOCH`] it was
    /// encoded in.
    epoch: u32,
    /// Bytes of `bytes` in use; 0 for an atom as text longer than
    /// [`ENTRY_MAX`], whose encoding is kept in [`Long`] (the atom asks for
    /// no id again). Entries of other nodes' pids and ports are never 0.
    pub len: u8,
    /// Whether it goes as text.
    text: bool,
    /// Its encoding: `ATOM_CACHE_REF id`, the atom as text, or a pid whose
    /// node atom is an id reference.
    bytes: [u8; ENTRY_MAX],
}

impl Entry {
    /// The entry of encoding `enc` (`len` 0 if it is longer than
    /// [`ENTRY_MAX`]); `text`: some atom in it goes as text.
    pub fn new(epoch: u32, enc: &[u8], text: bool) -> Entry {
        let mut e = Entry {
            epoch,
            text,
            ..Entry::default()
        };
        if let Some(b) = e.bytes.get_mut(..enc.len()) {
            b.copy_from_slice(enc);
            e.len = enc.len() as u8;
        }
        e
    }
}

/// The epoch of memoized local pid encodings. A local pid is an immediate
/// term, so like an atom its word names it for the life of the VM (a
/// process that reuses the word reuses the number and serial too, so the
/// same encoding), and its encoding is memoized with the atoms': a pid
/// costs `enif_term_to_binary` most of what a small push costs.
/// But that encoding names this node and its creation, which a restart of
/// distribution changes: every C-node start and every peer opened (which
/// a restarted distribution goes through before anything is pushed to the
/// new peers) starts a new epoch ([`new_epoch`]), and entries of an older
/// one are encoded again. What a peer opened before the restart is still
/// pushed until ecall closes it on the nodedown may carry the old form;
/// that peer's connection is going down anyway.
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// Forgets every thread's memoized local pid encodings (see [`EPOCH`]).
pub fn new_epoch() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// The epoch as entries keep it (never 0, which marks an atom).
fn epoch_now() -> u32 {
    (EPOCH.load(Ordering::Relaxed) as u32).max(1)
}

impl AtomMemo {
    /// An empty memo.
    pub fn new() -> Self {
        AtomMemo {
            entries: TwoWayTable::new(),
            long: Long::new(),
            nodes: HashMap::new(),
        }
    }

    /// The entry of term word `word` if it is an immediate (an atom or a
    /// local pid) that the memo holds, of the current epoch. A term word
    /// names one atom, or one local pid, for the life of the VM: a word the
    /// memo holds is that term. Only immediates are looked up, so that the
    /// lookups of tuples, maps, lists and binaries do not drag the table out
    /// of the caches (the emulator tags immediates with 0b11 in the low
    /// bits; were the tag otherwise, only speed would suffer).
    #[inline]
    pub fn get(&self, word: u64) -> Option<&Entry> {
        if word & 0b11 != 0b11 {
            return None;
        }
        self.entries
            .get(word)
            .filter(|e| e.epoch == 0 || e.epoch == epoch_now())
    }

    /// The encoding of atom `word` too long for its entry, if it is kept.
    #[inline]
    pub fn long(&self, word: u64) -> Option<&[u8]> {
        self.long.get(word)
    }

    /// Keeps `enc`, the encoding of atom `word` too long for its entry.
    pub fn keep_long(&mut self, word: u64, enc: &[u8]) {
        self.long.keep(word, enc);
    }

    /// Memoizes the atom of term word `word` that the VM just wrote as text
    /// at `out[start..]`: rewritten there as `ATOM_CACHE_REF id` if it gets
    /// an id ([`id_of`]), and kept either way (as text too long for an
    /// entry: in [`Long`] too, its entry's `len` 0). Returns whether it
    /// went as an id.
    pub fn keep_atom(&mut self, word: u64, out: &mut Vec<u8>, start: usize) -> bool {
        let id = atom_text(out, start).and_then(|(utf8, s, len, _)| id_of(utf8, &out[s..s + len]));
        if let Some(id) = id {
            out.truncate(start);
            out.extend_from_slice(&[ATOM_CACHE_REF, id]);
        }
        // Too long for an entry: len 0, and kept in `long`.
        if out.len() - start > ENTRY_MAX {
            self.long.keep(word, &out[start..]);
        }
        self.entries
            .keep(word, Entry::new(0, &out[start..], id.is_none()));
        id.is_some()
    }

    /// Memoizes `enc`, the encoding of the local pid of term word `word`
    /// (its node as an id, at most [`ENTRY_MAX`] bytes), for this epoch.
    pub fn keep_local_pid(&mut self, word: u64, enc: &[u8]) {
        self.entries.keep(word, Entry::new(epoch_now(), enc, false));
    }

    /// Rewrites the node atom of the pid, port or reference just encoded at
    /// `out[start..]` as its id. Returns whether it did (false: it stays
    /// text).
    pub fn node_id(&mut self, start: usize, out: &mut Vec<u8>) -> bool {
        // The node atom follows the tag, or the tag and a 2-byte length.
        let at = start
            + match out.get(start) {
                Some(&(NEW_REFERENCE_EXT | NEWER_REFERENCE_EXT)) => 3,
                Some(_) => 1,
                None => return false,
            };
        let Some((utf8, s, len, next)) = atom_text(out, at) else {
            return false;
        };
        let Some(id) = self.text_id(utf8, &out[s..s + len]) else {
            return false;
        };
        out.splice(at..next, [ATOM_CACHE_REF, id]);
        true
    }

    /// The id of the atom of this text (`utf8`: its encoding), if it has
    /// one: a node name met in a pid, port or reference, or a registered
    /// name in a list of destinations. Remembered here (at most [`NODES`]
    /// texts), so that the process-wide table is asked once per text.
    pub fn text_id(&mut self, utf8: bool, name: &[u8]) -> Option<u8> {
        match self.nodes.get(name) {
            Some(&id) => id,
            None => {
                let id = id_of(utf8, name);
                if self.nodes.len() < NODES {
                    self.nodes.insert(name.into(), id);
                }
                id
            }
        }
    }
}

/// The id (`ecall_dist::wire::fixed_atom_ids`) of an atom with this text, if it can
/// have one: UTF-8, or Latin-1 that is ASCII.
fn id_of(utf8: bool, text: &[u8]) -> Option<u8> {
    if !utf8 && !text.is_ascii() {
        return None;
    }
    fixed_atom_ids::id_of(text)
}

/// Appends the bytes of entry `e` (`len` not 0) and counts its atom.
/// The whole array goes in, then the tail past `len` comes off: a copy of
/// a length known when compiling is a few moves in line, where a copy of
/// `len` bytes is a call to `memmove`. (In a loop of
/// `ecall_nif:encoded_size/1` the two did not differ beyond this machine's
/// noise.)
#[inline]
pub fn put_bytes(e: &Entry, out: &mut Vec<u8>, text: &mut bool, refs: &mut u64) {
    let end = out.len() + usize::from(e.len);
    out.extend_from_slice(&e.bytes);
    out.truncate(end);
    count(!e.text, text, refs);
}

/// Counts an atom written (or a pid's, port's or reference's node atom):
/// as an id reference, or as text.
#[inline]
pub fn count(id: bool, text: &mut bool, refs: &mut u64) {
    if id {
        *refs += 1;
    } else {
        *text = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ecall_dist::wire::etf::{
        ATOM_EXT, NEW_PID_EXT, NEW_PORT_EXT, SMALL_ATOM_EXT, SMALL_ATOM_UTF8_EXT, V4_PORT_EXT,
    };
    use ecall_dist::wire::term_walk::expand_term;

    /// A term word the emulator would tag as an immediate (low bits 0b11).
    fn immediate(n: u64) -> u64 {
        (n << 6) | 0b1011
    }

    /// `SMALL_ATOM_UTF8_EXT` of `text`, as the VM writes an atom.
    fn utf8_atom(text: &str) -> Vec<u8> {
        let mut v = vec![SMALL_ATOM_UTF8_EXT, text.len() as u8];
        v.extend_from_slice(text.as_bytes());
        v
    }

    /// `SMALL_ATOM_EXT` (Latin-1) of `text`: one of its bytes is not ASCII.
    fn latin1_atom(text: &[u8]) -> Vec<u8> {
        let mut v = vec![SMALL_ATOM_EXT, text.len() as u8];
        v.extend_from_slice(text);
        v
    }

    /// The bytes an entry writes, and what it counts.
    fn written(e: &Entry) -> (Vec<u8>, bool, u64) {
        let (mut out, mut text, mut refs) = (vec![0xAA], false, 0);
        put_bytes(e, &mut out, &mut text, &mut refs);
        assert_eq!(out[0], 0xAA, "put_bytes appends");
        (out[1..].to_vec(), text, refs)
    }

    #[test]
    fn an_atom_with_an_id_goes_as_a_reference() {
        let mut memo = AtomMemo::new();
        let word = immediate(1);
        let text = utf8_atom("memo_test_with_id");
        let mut out = vec![SMALL_ATOM_UTF8_EXT, 1, b'x'];
        let start = out.len();
        out.extend_from_slice(&text);
        let id = fixed_atom_ids::id_of(b"memo_test_with_id").expect("the table has room");
        assert!(memo.keep_atom(word, &mut out, start));
        assert_eq!(out[start..], [ATOM_CACHE_REF, id]);
        assert_eq!(
            out[..start],
            [SMALL_ATOM_UTF8_EXT, 1, b'x'],
            "before: untouched"
        );
        let e = memo.get(word).expect("memoized");
        assert_eq!(written(e), (vec![ATOM_CACHE_REF, id], false, 1));
        // The reference written back as text is the atom the VM wrote.
        let mut expanded = Vec::new();
        assert!(expand_term(&out[start..], &mut expanded));
        assert_eq!(expanded, text);
    }

    #[test]
    fn a_latin1_atom_that_is_not_ascii_stays_text() {
        let mut memo = AtomMemo::new();
        let word = immediate(2);
        let enc = latin1_atom(b"caf\xe9");
        let mut out = enc.clone();
        assert!(!memo.keep_atom(word, &mut out, 0));
        assert_eq!(out, enc);
        let e = memo.get(word).expect("memoized");
        assert_eq!(written(e), (enc, true, 0));
    }

    #[test]
    fn an_ascii_latin1_atom_gets_an_id() {
        let mut memo = AtomMemo::new();
        let mut out = latin1_atom(b"memo_test_latin1_ascii");
        let id = fixed_atom_ids::id_of(b"memo_test_latin1_ascii").expect("the table has room");
        assert!(memo.keep_atom(immediate(3), &mut out, 0));
        assert_eq!(out, [ATOM_CACHE_REF, id]);
    }

    #[test]
    fn a_long_text_atom_is_kept_apart() {
        let mut memo = AtomMemo::new();
        let word = immediate(4);
        // 20 bytes of Latin-1 text: no id, and too long for an entry.
        let mut enc = vec![ATOM_EXT, 0, 20];
        enc.extend_from_slice(b"memo_test_long_\xe9\xe9\xe9\xe9\xe9");
        let mut out = enc.clone();
        assert!(!memo.keep_atom(word, &mut out, 0));
        assert_eq!(out, enc);
        assert_eq!(memo.get(word).map(|e| e.len), Some(0), "len 0: see long");
        assert_eq!(memo.long(word), Some(&enc[..]));
        // What the walker does when `long` lost it (the arena was emptied).
        let other = immediate(5);
        assert_eq!(memo.long(other), None);
        memo.keep_long(other, &enc);
        assert_eq!(memo.long(other), Some(&enc[..]));
    }

    #[test]
    fn only_immediates_are_looked_up() {
        let mut memo = AtomMemo::new();
        // A boxed term's word (a heap address): kept, never found.
        let boxed = 0x7f00_1234_5678_0002;
        let mut out = latin1_atom(b"\xe9");
        memo.keep_atom(boxed, &mut out, 0);
        assert!(memo.get(boxed).is_none());
        assert!(memo.get(immediate(6)).is_none(), "never kept");
    }

    #[test]
    fn local_pids_are_forgotten_with_the_epoch() {
        let mut memo = AtomMemo::new();
        let pid = [
            NEW_PID_EXT,
            ATOM_CACHE_REF,
            0,
            0,
            0,
            0,
            7,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            1,
        ];
        let (atom, pid_word) = (immediate(7), immediate(8));
        memo.keep_atom(atom, &mut latin1_atom(b"\xe9t\xe9"), 0);
        memo.keep_local_pid(pid_word, &pid);
        let e = memo.get(pid_word).expect("memoized");
        assert_eq!(written(e), (pid.to_vec(), false, 1));
        // A C-node started, or a peer opened: this node's pids may
        // encode differently now.
        new_epoch();
        assert!(memo.get(pid_word).is_none());
        assert!(memo.get(atom).is_some(), "atoms never go stale");
        memo.keep_local_pid(pid_word, &pid);
        assert!(memo.get(pid_word).is_some());
    }

    #[test]
    fn entries_hold_short_encodings_only() {
        let short = [7u8; ENTRY_MAX];
        assert_eq!(usize::from(Entry::new(0, &short, true).len), ENTRY_MAX);
        assert_eq!(Entry::new(0, &[7; ENTRY_MAX + 1], true).len, 0);
        assert_eq!(
            written(&Entry::new(0, &short, true)),
            (short.to_vec(), true, 0)
        );
        assert_eq!(written(&Entry::new(0, &[], false)), (vec![], false, 1));
    }

    /// A pid, two ports and two references of node `node` (its atom as the
    /// VM writes it), each with the bytes before its node atom.
    fn node_terms(node: &[u8]) -> Vec<(usize, Vec<u8>)> {
        let with = |head: &[u8], tail: &[u8]| (head.len(), [head, node, tail].concat());
        vec![
            with(&[NEW_PID_EXT], &[0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 3]),
            with(&[NEW_PORT_EXT], &[0, 0, 0, 9, 0, 0, 0, 3]),
            with(&[V4_PORT_EXT], &[0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 3]),
            with(
                &[NEWER_REFERENCE_EXT, 0, 2],
                &[0, 0, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8],
            ),
            with(&[NEW_REFERENCE_EXT, 0, 1], &[3, 1, 2, 3, 4]),
        ]
    }

    #[test]
    fn a_node_atom_goes_as_its_id() {
        let mut memo = AtomMemo::new();
        let node = utf8_atom("memo_test@host");
        let id = fixed_atom_ids::id_of(b"memo_test@host").expect("the table has room");
        for (at, term) in node_terms(&node) {
            let mut out = vec![0xAA];
            out.extend_from_slice(&term);
            assert!(memo.node_id(1, &mut out), "{term:?}");
            // The tag (and a reference's length) kept, the atom replaced,
            // the rest kept.
            assert_eq!(out[..1 + at], [&[0xAA][..], &term[..at]].concat());
            assert_eq!(out[1 + at..3 + at], [ATOM_CACHE_REF, id]);
            assert_eq!(out[3 + at..], term[at + node.len()..]);
            let mut expanded = Vec::new();
            assert!(expand_term(&out[1..], &mut expanded), "{term:?}");
            assert_eq!(expanded, term);
        }
        assert_eq!(memo.nodes.len(), 1, "asked once, remembered");
    }

    #[test]
    fn a_node_without_an_id_stays_text() {
        let mut memo = AtomMemo::new();
        let node = latin1_atom(b"n\xe9@host");
        for (_, term) in node_terms(&node) {
            let mut out = term.clone();
            assert!(!memo.node_id(0, &mut out));
            assert_eq!(out, term);
        }
        assert_eq!(memo.nodes.get(&b"n\xe9@host"[..]), Some(&None));
        // Not an atom where the node should be, or nothing at all.
        assert!(!memo.node_id(0, &mut vec![NEW_PID_EXT, 97, 1]));
        assert!(!memo.node_id(3, &mut vec![NEW_PID_EXT]));
    }

    #[test]
    fn node_names_remembered_are_bounded() {
        let mut memo = AtomMemo::new();
        for n in 0..NODES + 10 {
            // Latin-1, not ASCII: asks the atom ids nothing.
            let name = format!("{n}@\u{e9}");
            let name: Vec<u8> = name.chars().map(|c| c as u8).collect();
            let mut out = [&[NEW_PORT_EXT][..], &latin1_atom(&name), &[0; 8]].concat();
            assert!(!memo.node_id(0, &mut out));
        }
        assert_eq!(memo.nodes.len(), NODES);
    }

    #[test]
    fn atoms_without_ids() {
        // Latin-1 that is not ASCII, and text too long for a header.
        assert_eq!(id_of(false, b"\xe9"), None);
        assert_eq!(id_of(true, &[b'a'; 256]), None);
    }
}
