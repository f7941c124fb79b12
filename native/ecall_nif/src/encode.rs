//! The one encode of each request, in place of `enif_term_to_binary`.
//!
//! Why: the encode is most of a push, and most of the encode of a typical
//! message is its atoms. `term_to_binary` looks up and writes out the text
//! of every atom every time; here an atom's encoding is looked up in a small
//! per-thread cache keyed by the atom's term word (atoms never move or die,
//! so the word names the atom for the life of the VM), and so is a local
//! pid's; another node's pid or port is cached by hash and checked
//! against a copy of it ([`Remote`]). The bytes go straight
//! into a per-thread buffer that the shard copies from, instead of a fresh
//! refc binary per push. `bench/run.sh micro` has the figures.
//!
//! What: plain external format, no version byte (what a shard splices into
//! a batch). Integers that fit 64 bits, floats, atoms, binaries, tuples,
//! lists (improper ones too) and maps are written here; any other subterm
//! (pids, ports, references, funs, bigger integers, bitstrings) and every
//! atom the cache has not seen yet is written by `enif_term_to_binary` on
//! its own, so every term encodes, and decodes to an equal term
//! (`ecall_data_path_SUITE:every_term_kind_arrives_equal`).
//!
//! Atoms as cache references: an atom gets a process-wide id the first time
//! the encoder meets it (`ecall_dist::atom_ids`, the first 200 atoms), and
//! is written as `ATOM_CACHE_REF id` from then on, so the link writer puts a
//! header in front of the batch instead of passing over its bytes. The node
//! atom in a pid, port or reference is rewritten the same way. An element
//! that keeps some atom as text (past the 200, or inside a fun) says so
//! (`Encoded::text`), and the writer rewrites it as before.
//!
//! Depth costs no stack: the walk keeps the terms still to write on a
//! vector, so a deeply nested term cannot overflow a scheduler's stack.
//! Size costs no scheduler time past a bound: a push gives up once the
//! encoding passes [`INLINE_MAX`] and answers `large`, and the Erlang side
//! takes the `term_to_iovec` path, which yields and copies on a dirty
//! scheduler.

use ecall_dist::etf::{
    ATOM_CACHE_REF, BINARY_EXT, INTEGER_EXT, LARGE_TUPLE_EXT, LIST_EXT, MAP_EXT,
    NEWER_REFERENCE_EXT, NEW_FLOAT_EXT, NEW_REFERENCE_EXT, NIL_EXT, SMALL_BIG_EXT,
    SMALL_INTEGER_EXT, SMALL_TUPLE_EXT,
};
use ecall_dist::shard::Element;
use ecall_dist::word_cache::{WordBytes, WordCache};
use ecall_dist::{atom_cache, atom_ids};
use rustler::sys::{
    enif_alloc_env, enif_clear_env, enif_get_map_size, enif_get_tuple, enif_is_identical,
    enif_make_copy, enif_map_iterator_create, enif_map_iterator_destroy,
    enif_map_iterator_get_pair, enif_map_iterator_next, ErlNifEnv, ErlNifMapIterator,
    ErlNifMapIteratorEntry, ErlNifTerm,
};
use rustler::{Binary, Env, Term, TermType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

/// Cached atom and local pid encodings per thread (two-way set
/// associative: see `ecall_dist::word_cache` for why). 32 KiB: small
/// enough to stay in a core's caches between pushes. The first version
/// had 4,096 entries of 48 bytes, each pointing at its bytes elsewhere on
/// the heap, and looked every subterm up: under load (20,000 writers,
/// calls) the table fell out of the caches and a push spent 2.4 µs of CPU
/// in the encoder, mostly waiting on those loads (perf annotate: half the
/// samples on one load).
const ATOM_SLOTS: usize = 1024;
/// Longer encodings (atoms as text of more than 16 bytes) are not kept in
/// the table's entries but in [`Long`].
const ATOM_MAX: usize = 18;
/// Entries of [`Long`], per thread.
const LONG_SLOTS: usize = 256;
/// Bytes [`Long`] holds before it is emptied, per thread.
const LONG_BYTES: usize = 16 * 1024;
/// A buffer that grew past this for one large request is given back.
const BUF_KEEP: usize = 1 << 20;
/// A push gives up encoding a request whose encoding passes this many
/// bytes (or that holds a binary, a tuple or a map that would take it past
/// them), and says `large`: the caller then encodes it with
/// `term_to_iovec` (a BIF that yields) and pushes it from a dirty
/// scheduler. This bounds the time one push holds a normal scheduler,
/// whatever the term: `bench/run.sh micro` measures how soon a push gives
/// up a list of a million integers (61 µs here) and a map of 8,000 pairs,
/// all queued before the encode starts (250 µs). Before the bound, the list
/// held the scheduler about 8 ms.
pub const INLINE_MAX: usize = 16 * 1024;

struct AtomCache {
    /// Atoms and local pids, by term word.
    entries: WordCache<AtomEntry, ATOM_SLOTS>,
    /// Encodings of atoms too long for an entry (see [`Long`]).
    long: Long,
    /// Pids and ports of other nodes (see [`Remote`]).
    remote: Remote,
    /// Node names met in pids, ports and references, with their ids (this
    /// node and its peers; at most [`NODES`]).
    nodes: HashMap<Box<[u8]>, Option<u8>>,
}

/// Encodings of atoms longer than [`ATOM_MAX`] bytes: atoms as text (past
/// the first 200 atoms, which have ids) of more than 16 bytes, such as
/// Elixir's module names (`'Elixir.MyApp.Orders.Created'`). They used to
/// go through `enif_term_to_binary` on every encode: 10 of 24 bytes took
/// 1,148-1,365 ns against 107 for 10 of 9 bytes, and take 138-163 ns kept
/// here (`bench/run.sh micro`, "atoms past the ids"). By term word (an
/// atom's text never changes), in an arena of at most [`LONG_BYTES`].
type Long = WordBytes<LONG_SLOTS, LONG_BYTES>;

/// One cached atom, or local pid: 24 bytes (32 with its key in the
/// table), its encoding inline.
#[derive(Clone, Copy, Default)]
struct AtomEntry {
    /// 0 for an atom (never stale); for a local pid, the [`EPOCH`] it was
    /// encoded in.
    epoch: u32,
    /// Bytes of `bytes` in use; 0 for an atom as text longer than
    /// [`ATOM_MAX`], whose encoding is kept in [`Long`] (the atom asks for
    /// no id again). Entries of [`Remote`] are never 0.
    len: u8,
    /// Whether it goes as text.
    text: bool,
    /// Its encoding: `ATOM_CACHE_REF id`, the atom as text, or a pid whose
    /// node atom is an id reference.
    bytes: [u8; ATOM_MAX],
}

impl AtomEntry {
    fn new(epoch: u32, enc: &[u8], text: bool) -> AtomEntry {
        let mut e = AtomEntry {
            epoch,
            text,
            ..AtomEntry::default()
        };
        if let Some(b) = e.bytes.get_mut(..enc.len()) {
            b.copy_from_slice(enc);
            e.len = enc.len() as u8;
        }
        e
    }
}

/// The epoch of cached local pid encodings. A local pid is an immediate
/// term, so like an atom its word names it for the life of the VM (a
/// process that reuses the word reuses the number and serial too, so the
/// same encoding), and its encoding is cached with the atoms: a pid costs
/// `enif_term_to_binary` about 0.5 µs here, most of a small push. But that
/// encoding names this node and its creation, which a restart of
/// distribution changes: every C-node start and every peer opened (which
/// a restarted distribution goes through before anything is pushed to the
/// new peers) starts a new epoch ([`new_epoch`]), and entries of an older
/// one are encoded again. What a peer opened before the restart is still
/// pushed until ecall closes it on the nodedown may carry the old form;
/// that peer's connection is going down anyway.
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// Forgets every thread's cached local pid encodings (see [`EPOCH`]).
pub fn new_epoch() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// The epoch as entries keep it (never 0, which marks an atom).
fn epoch_now() -> u32 {
    (EPOCH.load(Ordering::Relaxed) as u32).max(1)
}

/// Entries for pids and ports of other nodes, per thread (two-way, as the
/// atoms').
const REMOTE_SLOTS: usize = 256;
/// Copies the env of [`Remote`] holds before it is emptied.
const REMOTE_COPIES: usize = 4 * REMOTE_SLOTS;

/// Cached encodings of pids and ports of other nodes: the destination of
/// most sends (`ecall:send(Pid, Msg)` with `Pid` on the peer), which
/// `enif_term_to_binary` took 0.18-0.21 µs to write each time (a loop of
/// `ecall_nif:encoded_size/1` of `{send, Pid, 1}`: 274-300 ns with a
/// remote pid against 93-97 ns with a cached local one).
///
/// Such a term lives on a heap, and its word is an address that changes
/// when the heap is collected, so unlike a local pid its word cannot be
/// the key. The key is its hash (`enif_hash`, internal), and the entry
/// keeps a copy of the term in a process-independent env of this thread:
/// a hit is a term identical to that copy (`enif_is_identical`), so a
/// hash collision costs a miss, never a wrong encoding. The encoding of a
/// remote pid or port never changes: its node, number, serial and
/// creation are all in the term, and the node's atom id is permanent
/// (`ecall_dist::atom_ids`).
///
/// Bounded: a replaced entry's copy stays in the env until [`REMOTE_COPIES`]
/// copies were made, when the env and every entry are emptied. The env is
/// never freed: it lives as long as its scheduler thread (one per thread,
/// at most some 20 KiB).
struct Remote {
    /// Made on the first copy (null until then).
    env: *mut ErlNifEnv,
    /// By hash: the copy of the term in `env`, and its encoding.
    entries: WordCache<(Option<ErlNifTerm>, AtomEntry), REMOTE_SLOTS>,
    /// Copies made into `env` since it was last emptied.
    copies: usize,
    /// The word of the term last found or kept, and its entry: the same
    /// term again (a caller's destination, push after push, until its heap
    /// is collected) is found without its hash. The word is only a hint:
    /// whatever lies there now must still be identical to the entry's copy.
    last: (ErlNifTerm, usize),
}

impl Remote {
    /// The cached entry for `raw` (a pid or port of `env`'s NIF call, of
    /// the given hash), if there is one.
    fn get(&mut self, raw: ErlNifTerm, hash: u64) -> Option<&AtomEntry> {
        let i = self.entries.find(hash)?;
        self.identical(i, raw)?;
        self.last = (raw, i);
        Some(&self.entries.at(i).1)
    }

    /// The cached entry for `raw` (any term of `env`'s NIF call that is
    /// not an immediate) if it is the term last found or kept, without a
    /// hash or a type check.
    #[inline]
    fn get_last(&self, raw: ErlNifTerm) -> Option<&AtomEntry> {
        let (word, i) = self.last;
        if word != raw {
            return None;
        }
        self.identical(i, raw)
    }

    /// Entry `i`'s encoding if its copy is identical to `raw`.
    fn identical(&self, i: usize, raw: ErlNifTerm) -> Option<&AtomEntry> {
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
    fn put(&mut self, raw: ErlNifTerm, hash: u64, enc: &[u8], text: bool) {
        if enc.len() > ATOM_MAX {
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
            .keep(hash, (Some(copy), AtomEntry::new(0, enc, text)))
        {
            self.last = (raw, i);
        }
    }
}

/// Node names remembered per thread.
const NODES: usize = 4096;

impl AtomCache {
    fn new() -> Self {
        AtomCache {
            entries: WordCache::new(),
            long: Long::new(),
            remote: Remote {
                env: std::ptr::null_mut(),
                entries: WordCache::new(),
                copies: 0,
                last: (ErlNifTerm::default(), 0),
            },
            nodes: HashMap::new(),
        }
    }

    /// The word itself, through `Hash` (its field is private).
    fn word(t: ErlNifTerm) -> u64 {
        let mut h = Word(0);
        t.hash(&mut h);
        h.0
    }

    /// The entry of term word `word` if it is an immediate (an atom or a
    /// local pid) that the table holds, of the current epoch. A term word
    /// names one atom, or one local pid, for the life of the VM: a word the
    /// table holds is that term. Only immediates are looked up, so that the
    /// lookups of tuples, maps, lists and binaries do not drag the table out
    /// of the caches (the emulator tags immediates with 0b11 in the low
    /// bits; were the tag otherwise, only speed would suffer).
    #[inline]
    fn cached(&self, word: u64) -> Option<&AtomEntry> {
        if word & 0b11 != 0b11 {
            return None;
        }
        self.entries
            .get(word)
            .filter(|e| e.epoch == 0 || e.epoch == epoch_now())
    }
}

/// The word of term `t`: for a local pid, what the push's `caller_shard`
/// (in `lib.rs`) mixes into the caller's shard.
pub fn word(t: ErlNifTerm) -> u64 {
    AtomCache::word(t)
}

/// A "hasher" that keeps the one word hashed into it.
struct Word(u64);

impl Hasher for Word {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_usize(&mut self, n: usize) {
        self.0 = n as u64;
    }
}

/// One thread's encoder: the atom cache, the work stack and the output
/// buffer, kept from one push to the next (no allocation per push).
struct Encoder {
    atoms: AtomCache,
    todo: Vec<Work>,
    buf: Vec<u8>,
    /// Whether the element being encoded has an atom as text.
    text: bool,
    /// Atoms written as id references in it.
    refs: u64,
    /// Most bytes to encode before giving up (see [`INLINE_MAX`]).
    limit: usize,
    /// Whether it gave up: the element passed `limit`.
    large: bool,
    /// The last pid, port or reference written through the VM in this
    /// element, as (word, start, end in `buf`, node went as an id): the
    /// same term again (a call's reply names its alias twice) is copied.
    /// Words are only compared within one NIF call, where a term cannot
    /// move.
    memo: Option<(ErlNifTerm, usize, usize, bool)>,
}

/// One encoded element, as [`term_with`] and [`tuple_with`] hand it over.
pub struct Encoded<'b> {
    /// External format without the version byte.
    pub bytes: &'b [u8],
    /// Whether some atom in it is text (else all are id references).
    pub text: bool,
    /// Atoms written as id references.
    pub refs: u64,
    /// The encode gave up past its limit: `bytes` is incomplete.
    pub large: bool,
}

impl Encoded<'_> {
    /// What a push hands the shard (`urgent`: see [`Element::urgent`]).
    pub fn element(&self, urgent: bool) -> Element<'_> {
        Element {
            bytes: self.bytes,
            text: self.text,
            refs: u32::try_from(self.refs).unwrap_or(u32::MAX),
            urgent,
        }
    }
}

thread_local! {
    static ENCODER: RefCell<Encoder> = RefCell::new(Encoder {
        atoms: AtomCache::new(),
        todo: Vec::new(),
        buf: Vec::new(),
        text: false,
        refs: 0,
        limit: usize::MAX,
        large: false,
        memo: None,
    });
}

/// What is still to write: terms of the NIF call's env, by their words.
enum Work {
    Term(ErlNifTerm),
    /// The rest of a list whose `LIST_EXT` header is at `header` in the
    /// output, `count` cells written so far: the count is filled in at the
    /// tail, so a long list is not walked twice (nor once in full before a
    /// push gives up on it).
    Cells {
        rest: ErlNifTerm,
        header: usize,
        count: u32,
    },
}

/// Encodes the tuple of `elements` into this thread's buffer and hands the
/// bytes to `f` (which must not encode again on this thread).
pub fn tuple_with<'a, R>(
    env: Env<'a>,
    elements: &[Term<'a>],
    limit: usize,
    f: impl FnOnce(Encoded<'_>) -> R,
) -> R {
    with_encoder(
        limit,
        |e| {
            tuple_header(&mut e.buf, elements.len());
            for &t in elements {
                e.term(env, t);
            }
        },
        f,
    )
}

/// Encodes `t` into this thread's buffer and hands the bytes to `f` (which
/// must not encode again on this thread).
pub fn term_with<'a, R>(
    env: Env<'a>,
    t: Term<'a>,
    limit: usize,
    f: impl FnOnce(Encoded<'_>) -> R,
) -> R {
    with_encoder(limit, |e| e.term(env, t), f)
}

fn with_encoder<R>(
    limit: usize,
    encode: impl FnOnce(&mut Encoder),
    f: impl FnOnce(Encoded<'_>) -> R,
) -> R {
    ENCODER.with(|cell| {
        let mut e = cell.borrow_mut();
        e.buf.clear();
        // Empty unless an encode on this thread panicked half-way (rustler
        // turns the panic into an exception): its words are of a call
        // that is over, and must never be read.
        e.todo.clear();
        e.text = false;
        e.refs = 0;
        e.limit = limit;
        e.large = false;
        e.memo = None;
        encode(&mut e);
        let r = f(Encoded {
            bytes: &e.buf,
            text: e.text,
            refs: e.refs,
            large: e.large,
        });
        if e.buf.capacity() > BUF_KEEP {
            e.buf = Vec::new();
        }
        if e.todo.capacity() > BUF_KEEP / 8 {
            e.todo = Vec::new();
        }
        r
    })
}

fn tuple_header(out: &mut Vec<u8>, arity: usize) {
    if arity < 256 {
        out.extend_from_slice(&[SMALL_TUPLE_EXT, arity as u8]);
    } else {
        out.push(LARGE_TUPLE_EXT);
        out.extend_from_slice(&(arity as u32).to_be_bytes());
    }
}

impl Encoder {
    fn term<'a>(&mut self, env: Env<'a>, root: Term<'a>) {
        let Encoder {
            atoms,
            todo,
            buf: out,
            text,
            refs,
            limit,
            large,
            memo,
        } = self;
        if *large {
            // An earlier element of the same tuple gave up already.
            return;
        }
        todo.push(Work::Term(root.as_c_arg()));
        while let Some(w) = todo.pop() {
            if out.len() > *limit {
                return give_up(large, todo);
            }
            let t = match w {
                // SAFETY: every word on the stack is a term of `env`: the root,
                // or an element, cell, key or value of one.
                Work::Term(raw) => unsafe { Term::new(env, raw) },
                Work::Cells {
                    rest,
                    header,
                    count,
                } => {
                    // SAFETY: as above.
                    let list = unsafe { Term::new(env, rest) };
                    if let Ok((head, tail)) = list.list_get_cell() {
                        todo.push(Work::Cells {
                            rest: tail.as_c_arg(),
                            header,
                            count: count + 1,
                        });
                        todo.push(Work::Term(head.as_c_arg()));
                        continue;
                    }
                    // The tail: the count is known now.
                    out[header + 1..header + 5].copy_from_slice(&count.to_be_bytes());
                    if list.is_empty_list() {
                        out.push(NIL_EXT);
                        continue;
                    }
                    // Improper: the tail is a term of its own.
                    list
                }
            };
            let raw = t.as_c_arg();
            let word = AtomCache::word(raw);
            // An atom or a local pid that hits costs no call into the VM.
            if let Some(e) = atoms.cached(word) {
                if e.len != 0 {
                    put_bytes(e, out, text, refs);
                } else {
                    // Too long for the entry: an atom as text.
                    long_atom(t, word, atoms, out);
                    *text = true;
                }
                continue;
            }
            if word & 0b11 != 0b11 {
                if let Some(e) = atoms.remote.get_last(raw) {
                    // The pid or port of another node met last: most sends'
                    // destination, push after push.
                    put_bytes(e, out, text, refs);
                    continue;
                }
            }
            let ty = t.get_type();
            match ty {
                TermType::Atom => {
                    let id = atom(t, word, atoms, out);
                    count(id, text, refs);
                }
                ty @ (TermType::Pid | TermType::Port | TermType::Ref) => {
                    let start = out.len();
                    // A pid or port that is not an immediate is another
                    // node's (references are never cached: most are met
                    // once, as a call's alias).
                    let remote = ty != TermType::Ref && word & 0b11 != 0b11;
                    let hash = if remote {
                        t.hash_internal(0x7265_6d6f)
                    } else {
                        0
                    };
                    if let Some(e) = remote.then(|| atoms.remote.get(raw, hash)).flatten() {
                        put_bytes(e, out, text, refs);
                        continue;
                    }
                    let id = match *memo {
                        Some((w, s, e, id)) if w == raw => {
                            out.extend_from_within(s..e);
                            id
                        }
                        _ => {
                            fallback(t, out);
                            let id = node_id(start, atoms, out);
                            let local_pid =
                                ty == TermType::Pid && t.decode::<rustler::LocalPid>().is_ok();
                            if local_pid && id && out.len() - start <= ATOM_MAX {
                                atoms
                                    .entries
                                    .keep(word, AtomEntry::new(epoch_now(), &out[start..], false));
                            } else if remote {
                                atoms.remote.put(raw, hash, &out[start..], !id);
                            } else {
                                *memo = Some((raw, start, out.len(), id));
                            }
                            id
                        }
                    };
                    count(id, text, refs);
                }
                TermType::Integer => match t.decode::<i64>() {
                    Ok(i) => integer(i, out),
                    Err(_) => fallback(t, out),
                },
                TermType::Float => match t.decode::<f64>() {
                    Ok(f) => {
                        out.push(NEW_FLOAT_EXT);
                        out.extend_from_slice(&f.to_bits().to_be_bytes());
                    }
                    Err(_) => fallback(t, out),
                },
                TermType::Binary => match Binary::from_term(t) {
                    // Given up before the copy, not after it.
                    Ok(b) if out.len() + b.len() > *limit => {
                        return give_up(large, todo);
                    }
                    Ok(b) => {
                        out.push(BINARY_EXT);
                        out.extend_from_slice(&(b.len() as u32).to_be_bytes());
                        out.extend_from_slice(b.as_slice());
                    }
                    // A bitstring that is not a whole number of bytes.
                    Err(_) => fallback(t, out),
                },
                TermType::Tuple => {
                    let mut arity = 0;
                    let mut array: *const ErlNifTerm = std::ptr::null();
                    // SAFETY: `t` is a valid term of `env` (it came from a NIF
                    // argument or from a term of one); on success the VM points
                    // `array` at the tuple's `arity` elements, which live as
                    // long as the tuple, that is for this NIF call.
                    let ok = unsafe {
                        enif_get_tuple(env.as_c_arg(), t.as_c_arg(), &mut arity, &mut array)
                    };
                    if ok == 0 {
                        fallback(t, out);
                        continue;
                    }
                    let arity = arity as usize;
                    // Every element takes a byte at least: one that cannot
                    // fit is given up before its elements are queued.
                    if out.len() + arity > *limit {
                        return give_up(large, todo);
                    }
                    tuple_header(out, arity);
                    let elements: &[ErlNifTerm] = if arity == 0 {
                        &[]
                    } else {
                        // SAFETY: the VM pointed `array` at the tuple's
                        // `arity` elements (non-null: there are some), which
                        // live as long as the tuple, that is for this call.
                        unsafe { std::slice::from_raw_parts(array, arity) }
                    };
                    let mut inline = Inline {
                        atoms,
                        text,
                        refs,
                        limit: *limit,
                    };
                    let written = elements
                        .iter()
                        .take_while(|&&raw| inline.put(raw, out))
                        .count();
                    todo.extend(elements[written..].iter().rev().map(|&raw| Work::Term(raw)));
                }
                TermType::List => {
                    if t.is_empty_list() {
                        out.push(NIL_EXT);
                        continue;
                    }
                    let header = out.len();
                    out.extend_from_slice(&[LIST_EXT, 0, 0, 0, 0]);
                    todo.push(Work::Cells {
                        rest: t.as_c_arg(),
                        header,
                        count: 0,
                    });
                }
                TermType::Map => {
                    // Every pair takes two bytes at least (and all of them
                    // are queued at once): the same early answer.
                    let mut size = 0;
                    // SAFETY: `t` is a valid term of `env`; the VM writes
                    // `size` on success (a map), reads nothing else.
                    let is_map =
                        unsafe { enif_get_map_size(env.as_c_arg(), t.as_c_arg(), &mut size) } != 0;
                    if is_map && out.len().saturating_add(size.saturating_mul(2)) > *limit {
                        return give_up(large, todo);
                    }
                    let inline = Inline {
                        atoms,
                        text,
                        refs,
                        limit: *limit,
                    };
                    if !(is_map && map(env, t, size, todo, out, inline)) {
                        fallback(t, out);
                        *text = true;
                    }
                }
                // Funs and anything newer: atoms inside, as text.
                _ => {
                    fallback(t, out);
                    *text = true;
                }
            }
        }
    }
}

/// Writes the header of map `t`, then its keys and values: those the
/// cache holds written at once ([`Inline`]) up to the first one it does
/// not, that one and the rest queued. The pairs go out in the map's own
/// order, sorted for a small map, as `term_to_binary` writes them: the
/// peer sorts a small map's keys as it decodes it, and sorted keys cost it
/// a check instead of a sort (written in reverse, the blast of
/// `bench/run.sh micro` ran at 298k against 452k msg/s). False if `t` could
/// not be iterated (nothing written then). `size`: its number of pairs.
fn map(
    env: Env<'_>,
    t: Term<'_>,
    size: usize,
    todo: &mut Vec<Work>,
    out: &mut Vec<u8>,
    mut inline: Inline<'_>,
) -> bool {
    let mut iter = MaybeUninit::<ErlNifMapIterator>::uninit();
    // SAFETY: `t` is a map of `env`; the iterator is initialised by the
    // VM on success and destroyed below before this function returns.
    let ok = unsafe {
        enif_map_iterator_create(
            env.as_c_arg(),
            t.as_c_arg(),
            iter.as_mut_ptr(),
            ErlNifMapIteratorEntry::ERL_NIF_MAP_ITERATOR_HEAD,
        )
    };
    if ok == 0 {
        return false;
    }
    out.push(MAP_EXT);
    out.extend_from_slice(&(size as u32).to_be_bytes());
    let mut key = ErlNifTerm::default();
    let mut value = ErlNifTerm::default();
    // Queued in the map's order, turned around below for the stack.
    let queued = todo.len();
    let mut writing = true;
    // SAFETY: the iterator was created above and is used only in `env`;
    // the pairs it gives are terms of `env`.
    unsafe {
        while enif_map_iterator_get_pair(env.as_c_arg(), iter.as_mut_ptr(), &mut key, &mut value)
            != 0
        {
            for raw in [key, value] {
                writing = writing && inline.put(raw, out);
                if !writing {
                    todo.push(Work::Term(raw));
                }
            }
            enif_map_iterator_next(env.as_c_arg(), iter.as_mut_ptr());
        }
        enif_map_iterator_destroy(env.as_c_arg(), iter.as_mut_ptr());
    }
    todo[queued..].reverse();
    true
}

/// What a map or tuple needs to write its cached atoms and local pids at
/// once, instead of queueing each for the loop in [`Encoder::term`] to pop
/// again: the payload's maps of atoms, which were most of an encode (a
/// push and a pop, a type check and a lookup per atom), go in one pass.
struct Inline<'c> {
    atoms: &'c AtomCache,
    text: &'c mut bool,
    refs: &'c mut u64,
    limit: usize,
}

impl Inline<'_> {
    /// Appends the cached encoding of `raw` if it is an immediate (an atom
    /// or a local pid) the cache holds with its bytes, and counts its atom;
    /// whether it did. Stops at the limit: the loop then gives up at its
    /// next pop, past the limit by at most [`ATOM_MAX`] bytes per term
    /// written here.
    #[inline]
    fn put(&mut self, raw: ErlNifTerm, out: &mut Vec<u8>) -> bool {
        if out.len() > self.limit {
            return false;
        }
        // A long atom (len 0) is kept in `long`: left to the loop.
        let Some(e) = self
            .atoms
            .cached(AtomCache::word(raw))
            .filter(|e| e.len != 0)
        else {
            return false;
        };
        put_bytes(e, out, self.text, self.refs);
        true
    }
}

/// An atom the cache does not hold: its id if it gets one, else
/// its text from the VM; kept in the cache either way. Returns whether it
/// went as an id.
fn atom(t: Term<'_>, word: u64, atoms: &mut AtomCache, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    fallback(t, out);
    let id = atom_cache::atom_text(out, start)
        .and_then(|(utf8, s, len, _)| id_of(utf8, &out[s..s + len]));
    if let Some(id) = id {
        out.truncate(start);
        out.extend_from_slice(&[ATOM_CACHE_REF, id]);
    }
    // Too long for an entry: len 0, and kept in `long`.
    if out.len() - start > ATOM_MAX {
        atoms.long.keep(word, &out[start..]);
    }
    atoms
        .entries
        .keep(word, AtomEntry::new(0, &out[start..], id.is_none()));
    id.is_some()
}

/// The id (`ecall_dist::atom_ids`) of an atom with this text, if it can
/// have one: UTF-8, or Latin-1 that is ASCII.
fn id_of(utf8: bool, text: &[u8]) -> Option<u8> {
    if !utf8 && !text.is_ascii() {
        return None;
    }
    atom_ids::id_of(text)
}

/// Rewrites the node atom of the pid, port or reference just encoded at
/// `out[start..]` as its id. Returns whether it did (false: it stays text).
fn node_id(start: usize, atoms: &mut AtomCache, out: &mut Vec<u8>) -> bool {
    // The node atom follows the tag, or the tag and a 2-byte length.
    let at = start
        + match out.get(start) {
            Some(&(NEW_REFERENCE_EXT | NEWER_REFERENCE_EXT)) => 3,
            Some(_) => 1,
            None => return false,
        };
    let Some((utf8, s, len, next)) = atom_cache::atom_text(out, at) else {
        return false;
    };
    let name = &out[s..s + len];
    let id = match atoms.nodes.get(name) {
        Some(&id) => id,
        None => {
            let id = id_of(utf8, name);
            if atoms.nodes.len() < NODES {
                atoms.nodes.insert(name.into(), id);
            }
            id
        }
    };
    let Some(id) = id else {
        return false;
    };
    out.splice(at..next, [ATOM_CACHE_REF, id]);
    true
}

/// Appends the encoding of atom `t` (term word `word`) that was too long
/// for its entry: kept in [`Long`], or written by the VM and kept there.
fn long_atom(t: Term<'_>, word: u64, atoms: &mut AtomCache, out: &mut Vec<u8>) {
    if let Some(enc) = atoms.long.get(word) {
        out.extend_from_slice(enc);
        return;
    }
    let start = out.len();
    fallback(t, out);
    atoms.long.keep(word, &out[start..]);
}

/// Appends the bytes of cached entry `e` (`len` not 0) and counts its atom.
/// The whole array goes in, then the tail past `len` comes off: a copy of
/// a length known when compiling is a few moves in line, where a copy of
/// `len` bytes is a call to `memmove`. (In a loop of
/// `ecall_nif:encoded_size/1` the two did not differ beyond this machine's
/// noise.)
fn put_bytes(e: &AtomEntry, out: &mut Vec<u8>, text: &mut bool, refs: &mut u64) {
    let end = out.len() + usize::from(e.len);
    out.extend_from_slice(&e.bytes);
    out.truncate(end);
    count(!e.text, text, refs);
}

/// Counts an atom written (or a pid's, port's or reference's node atom):
/// as an id reference, or as text.
fn count(id: bool, text: &mut bool, refs: &mut u64) {
    if id {
        *refs += 1;
    } else {
        *text = true;
    }
}

/// Ends the walk of an element that passed its limit.
fn give_up(large: &mut bool, todo: &mut Vec<Work>) {
    *large = true;
    todo.clear();
}

fn integer(i: i64, out: &mut Vec<u8>) {
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

/// `t` through `enif_term_to_binary`, without its version byte.
fn fallback(t: Term<'_>, out: &mut Vec<u8>) {
    let bin = t.to_binary();
    out.extend_from_slice(&bin.as_slice()[1..]);
}
