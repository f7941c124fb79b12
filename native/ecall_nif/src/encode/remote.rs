//! The walker's table of other nodes' pids and ports ([`Remote`]), by
//! hash, each checked against a copy of its term.

use super::atom_memo::two_way::TwoWayTable;
use super::atom_memo::{Entry, ENTRY_MAX};
use rustler::sys::{enif_alloc_env, enif_clear_env, enif_is_identical, enif_make_copy};
use rustler::sys::{ErlNifEnv, ErlNifTerm};

/// Entries for pids and ports of other nodes, per thread (two-way, as the
/// memo of atom encodings).
const REMOTE_SLOTS: usize = 256;
/// Copies the env of [`Remote`] holds before it is emptied.
const REMOTE_COPIES: usize = 4 * REMOTE_SLOTS;

/// Cached encodings of pids and ports of other nodes: the destination of
/// most sends (`ecall:send(Pid, Msg)` with `Pid` on the peer), which
/// `enif_term_to_binary` would write each time at a cost of about twice a
/// whole small encode (doc/performance.md, "Ideas kept", the memo).
///
/// Such a term lives on a heap, and its word is an address that changes
/// when the heap is collected, so unlike a local pid its word cannot be
/// the key. The key is its hash (`enif_hash`, internal), and the entry
/// keeps a copy of the term in a process-independent env of this thread:
/// a hit is a term identical to that copy (`enif_is_identical`), so a
/// hash collision costs a miss, never a wrong encoding. The encoding of a
/// remote pid or port never changes: its node, number, serial and
/// creation are all in the term, and the node's atom id is permanent
/// (`ecall_dist::wire::fixed_atom_ids`).
///
/// Bounded: a replaced entry's copy stays in the env until [`REMOTE_COPIES`]
/// copies were made, when the env and every entry are emptied. The env is
/// never freed: it lives as long as its scheduler thread (one per thread,
/// at most some 20 KiB).
pub struct Remote {
    /// Made on the first copy (null until then).
    env: *mut ErlNifEnv,
    /// By hash: the copy of the term in `env`, and its encoding.
    entries: TwoWayTable<(Option<ErlNifTerm>, Entry), REMOTE_SLOTS>,
    /// Copies made into `env` since it was last emptied.
    copies: usize,
    /// The word of the term last found or kept, and its entry: the same
    /// term again (a caller's destination, push after push, until its heap
    /// is collected) is found without its hash. The word is only a hint:
    /// whatever lies there now must still be identical to the entry's copy.
    last: (ErlNifTerm, usize),
}

impl Remote {
    /// Empty, with no env yet.
    pub fn new() -> Self {
        Remote {
            env: std::ptr::null_mut(),
            entries: TwoWayTable::new(),
            copies: 0,
            last: (ErlNifTerm::default(), 0),
        }
    }

    /// The cached entry for `raw` (a pid or port of `env`'s NIF call, of
    /// the given hash), if there is one.
    pub fn get(&mut self, raw: ErlNifTerm, hash: u64) -> Option<&Entry> {
        let i = self.entries.find(hash)?;
        self.identical(i, raw)?;
        self.last = (raw, i);
        Some(&self.entries.at(i).1)
    }

    /// The cached entry for `raw` (any term of `env`'s NIF call that is
    /// not an immediate) if it is the term last found or kept, without a
    /// hash or a type check.
    #[inline]
    pub fn get_last(&self, raw: ErlNifTerm) -> Option<&Entry> {
        let (word, i) = self.last;
        if word != raw {
            return None;
        }
        self.identical(i, raw)
    }

    /// Entry `i`'s encoding if its copy is identical to `raw`.
    fn identical(&self, i: usize, raw: ErlNifTerm) -> Option<&Entry> {
        let (copy, e) = self.entries.at(i);
        let copy = (*copy)?;
        // SAFETY: both are valid terms: `raw` of the running NIF call,
        // `copy` of this thread's env (not emptied since it was made:
        // emptying the env empties every entry). enif_is_identical only
        // reads them; a word that now holds another term than the one once
        // cached (its heap was collected since) is simply not identical.
        (unsafe { enif_is_identical(copy, raw) } != 0).then_some(e)
    }

    /// Keeps the encoding `enc` of `raw` (hash `hash`; `text`: its node
    /// went as text).
    pub fn put(&mut self, raw: ErlNifTerm, hash: u64, enc: &[u8], text: bool) {
        if enc.len() > ENTRY_MAX {
            return;
        }
        if self.env.is_null() {
            // SAFETY: no precondition; null if the VM has no memory.
            self.env = unsafe { enif_alloc_env() };
            if self.env.is_null() {
                return;
            }
        }
        if self.copies >= REMOTE_COPIES {
            self.entries.clear();
            // SAFETY: `env` came from enif_alloc_env on this thread and no
            // entry refers to its terms any more.
            unsafe { enif_clear_env(self.env) };
            self.copies = 0;
        }
        // SAFETY: `env` is a live process-independent env of this thread;
        // `raw` is a valid term of the running NIF call.
        let copy = unsafe { enif_make_copy(self.env, raw) };
        self.copies += 1;
        if let Some(i) = self
            .entries
            .keep(hash, (Some(copy), Entry::new(0, enc, text)))
        {
            self.last = (raw, i);
        }
    }
}
