//! The term walker: one thread's [`Encoder`], which writes a request's
//! terms from the NIF call's env into its buffer, iteratively (the terms
//! still to write on a stack of its own), asking the [`AtomMemo`] for
//! atoms and local pids, the [`Remote`] table for other nodes' pids and
//! ports, and the VM (`enif_term_to_binary`) for whatever it does not
//! write itself.

use super::atom_memo::{count, put_bytes, AtomMemo, ENTRY_MAX};
use super::remote::Remote;
use super::write::{self, passes};
use super::Encoded;
use rustler::sys::{
    enif_get_map_size, enif_get_tuple, enif_map_iterator_create, enif_map_iterator_destroy,
    enif_map_iterator_get_pair, enif_map_iterator_next, ErlNifMapIterator, ErlNifMapIteratorEntry,
    ErlNifTerm,
};
use rustler::{Binary, Env, Term, TermType};
use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::mem::MaybeUninit;

/// A buffer that grew past this for one large request is given back.
const BUF_KEEP: usize = 1 << 20;

/// One thread's encoder: its memo of atom encodings, its table of other
/// nodes' pids and ports, the work stack and the output buffer, kept from
/// one push to the next (no allocation per push).
struct Encoder {
    memo: AtomMemo,
    remote: Remote,
    todo: Vec<Work>,
    buf: Vec<u8>,
    /// Whether the element being encoded has an atom as text.
    text: bool,
    /// Atoms written as id references in it.
    refs: u64,
    /// Most bytes to encode before giving up (see [`super::INLINE_MAX`]).
    limit: usize,
    /// Whether it gave up: the element passed `limit`.
    large: bool,
    /// The last pid, port or reference written through the VM in this
    /// element, as (word, start, end in `buf`, node went as an id): the
    /// same term again (a call's reply names its alias twice) is copied.
    /// Words are only compared within one NIF call, where a term cannot
    /// move.
    last_vm: Option<(ErlNifTerm, usize, usize, bool)>,
}

thread_local! {
    static ENCODER: RefCell<Encoder> = RefCell::new(Encoder {
        memo: AtomMemo::new(),
        remote: Remote::new(),
        todo: Vec::new(),
        buf: Vec::new(),
        text: false,
        refs: 0,
        limit: usize::MAX,
        large: false,
        last_vm: None,
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
            write::tuple_header(&mut e.buf, elements.len());
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

/// Encodes `{Tag, Dests, Msg}` (a `send_many` request) into this
/// thread's buffer and hands the bytes to `f` (which must not encode again
/// on this thread). `Dests`, a list of pids, references and atoms, goes
/// through one `enif_term_to_binary` ([`super::dests`]); anything else in
/// it, and `Msg`, by the walk. `Msg` is written first, so that an encode
/// that gives it up (`large`, past `limit` bytes) has not paid for the
/// list; the two then change places.
pub fn dests_with<'a, R>(
    env: Env<'a>,
    tag: Term<'a>,
    dests: Term<'a>,
    msg: Term<'a>,
    limit: usize,
    f: impl FnOnce(Encoded<'_>) -> R,
) -> R {
    with_encoder(
        usize::MAX,
        |e| {
            write::tuple_header(&mut e.buf, 3);
            e.term(env, tag);
            let at = e.buf.len();
            e.limit = at.saturating_add(limit);
            e.term(env, msg);
            if e.large {
                return;
            }
            let msg_len = e.buf.len() - at;
            e.limit = usize::MAX;
            let ext = dests.to_binary();
            match super::dests::write(ext.as_slice(), &mut e.memo, &mut e.buf) {
                Some((text, refs)) => {
                    e.text |= text;
                    e.refs += refs;
                }
                None => e.term(env, dests),
            }
            e.buf[at..].rotate_left(msg_len);
        },
        f,
    )
}

/// The number of cells of `list` if it has at most `n` (walking at most
/// `n + 1`); `None` if it has more.
pub fn cells_upto(list: Term<'_>, n: usize) -> Option<usize> {
    let mut rest = list;
    for count in 0..=n {
        match rest.list_get_cell() {
            Ok((_, tail)) => rest = tail,
            Err(_) => return Some(count),
        }
    }
    None
}

/// Runs `encode` on this thread's encoder, emptied for a new element of at
/// most `limit` bytes, and hands what it wrote to `f`.
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
        e.last_vm = None;
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

impl Encoder {
    /// Appends term `root` of `env` to the buffer, unless the element gave
    /// up already: pops what is still to write ([`Encoder::next_term`])
    /// and writes it ([`Encoder::put`]) until nothing is left, or gives up
    /// when the element passes its limit.
    fn term<'a>(&mut self, env: Env<'a>, root: Term<'a>) {
        if self.large {
            // An earlier element of the same tuple gave up already.
            return;
        }
        self.todo.push(Work::Term(root.as_c_arg()));
        while let Some(w) = self.todo.pop() {
            if self.buf.len() > self.limit {
                return self.give_up();
            }
            let Some(t) = self.next_term(env, w) else {
                continue;
            };
            if !self.put(env, t) {
                return self.give_up();
            }
        }
    }

    /// The term that `w` stands for; `None` when `w` was the end of a
    /// proper list, whose length and tail this writes.
    #[inline(always)]
    fn next_term<'a>(&mut self, env: Env<'a>, w: Work) -> Option<Term<'a>> {
        match w {
            // SAFETY: every word on the stack is a term of `env`: the root,
            // or an element, cell, key or value of one.
            Work::Term(raw) => Some(unsafe { Term::new(env, raw) }),
            Work::Cells {
                rest,
                header,
                count,
            } => {
                // SAFETY: as above.
                let list = unsafe { Term::new(env, rest) };
                if let Ok((head, tail)) = list.list_get_cell() {
                    self.todo.push(Work::Cells {
                        rest: tail.as_c_arg(),
                        header,
                        count: count + 1,
                    });
                    return Some(head);
                }
                // The tail: the count is known now.
                write::list_length(&mut self.buf, header, count);
                if list.is_empty_list() {
                    write::nil(&mut self.buf);
                    return None;
                }
                // Improper: the tail is a term of its own.
                Some(list)
            }
        }
    }

    /// Writes `t`, or its header with its parts queued. False if it would
    /// pass the element's limit (nothing queued then).
    #[inline(always)]
    fn put<'a>(&mut self, env: Env<'a>, t: Term<'a>) -> bool {
        let raw = t.as_c_arg();
        let word = word(raw);
        if self.put_known(t, raw, word) {
            return true;
        }
        let ty = t.get_type();
        match ty {
            TermType::Atom => {
                let id = atom(t, word, &mut self.memo, &mut self.buf);
                count(id, &mut self.text, &mut self.refs);
            }
            TermType::Pid | TermType::Port | TermType::Ref => {
                self.pid_port_or_ref(t, ty, raw, word);
            }
            TermType::Integer => match t.decode::<i64>() {
                Ok(i) => write::integer(i, &mut self.buf),
                Err(_) => fallback(t, &mut self.buf),
            },
            TermType::Float => match t.decode::<f64>() {
                Ok(f) => write::float(f, &mut self.buf),
                Err(_) => fallback(t, &mut self.buf),
            },
            TermType::Binary => return self.binary(t),
            TermType::Tuple => return self.tuple(env, t),
            TermType::List => self.list(t),
            TermType::Map => return self.map(env, t),
            // Funs and anything newer: atoms inside, as text.
            _ => {
                fallback(t, &mut self.buf);
                self.text = true;
            }
        }
        true
    }

    /// Writes `t` from what this thread met before, at no call into the
    /// VM: an atom or a local pid the memo holds, or the pid or port of
    /// another node met last (most sends' destination, push after push).
    /// Whether it did.
    #[inline(always)]
    fn put_known(&mut self, t: Term<'_>, raw: ErlNifTerm, word: u64) -> bool {
        let Encoder {
            memo,
            remote,
            buf: out,
            text,
            refs,
            ..
        } = self;
        if let Some(e) = memo.get(word) {
            if e.len != 0 {
                put_bytes(e, out, text, refs);
            } else {
                // Too long for the entry: an atom as text.
                long_atom(t, word, memo, out);
                *text = true;
            }
            return true;
        }
        if word & 0b11 != 0b11 {
            if let Some(e) = remote.get_last(raw) {
                put_bytes(e, out, text, refs);
                return true;
            }
        }
        false
    }

    /// A pid, port or reference the memo does not hold: another node's
    /// pid or port from the remote table, the same term as the last one
    /// written through the VM copied, or else through the VM, and kept
    /// where it will be met again (references are never cached: most are
    /// met once, as a call's alias).
    #[inline]
    fn pid_port_or_ref(&mut self, t: Term<'_>, ty: TermType, raw: ErlNifTerm, word: u64) {
        let Encoder {
            memo,
            remote,
            buf: out,
            text,
            refs,
            last_vm,
            ..
        } = self;
        let start = out.len();
        // A pid or port that is not an immediate is another node's.
        let other_node = ty != TermType::Ref && word & 0b11 != 0b11;
        let hash = if other_node {
            t.hash_internal(0x7265_6d6f)
        } else {
            0
        };
        if let Some(e) = other_node.then(|| remote.get(raw, hash)).flatten() {
            put_bytes(e, out, text, refs);
            return;
        }
        let id = match *last_vm {
            Some((w, s, e, id)) if w == raw => {
                out.extend_from_within(s..e);
                id
            }
            _ => {
                fallback(t, out);
                let id = memo.node_id(start, out);
                let local_pid = ty == TermType::Pid && t.decode::<rustler::LocalPid>().is_ok();
                if local_pid && id && out.len() - start <= ENTRY_MAX {
                    memo.keep_local_pid(word, &out[start..]);
                } else if other_node {
                    remote.put(raw, hash, &out[start..], !id);
                } else {
                    *last_vm = Some((raw, start, out.len(), id));
                }
                id
            }
        };
        count(id, text, refs);
    }

    /// A binary, given up before the copy (not after it) if it would pass
    /// the limit; a bitstring that is not a whole number of bytes through
    /// the VM. False: given up.
    #[inline]
    fn binary(&mut self, t: Term<'_>) -> bool {
        match Binary::from_term(t) {
            Ok(b) if passes(self.buf.len(), b.len(), self.limit) => false,
            Ok(b) => {
                write::binary(b.as_slice(), &mut self.buf);
                true
            }
            Err(_) => {
                fallback(t, &mut self.buf);
                true
            }
        }
    }

    /// A tuple's header, then the elements the memo holds written at once
    /// ([`Inline`]) up to the first it does not, which is queued with the
    /// rest. False: given up (every element takes a byte at least, so one
    /// that cannot fit is given up before its elements are queued).
    #[inline]
    fn tuple(&mut self, env: Env<'_>, t: Term<'_>) -> bool {
        let mut arity = 0;
        let mut array: *const ErlNifTerm = std::ptr::null();
        // SAFETY: `t` is a valid term of `env` (it came from a NIF
        // argument or from a term of one); on success the VM points
        // `array` at the tuple's `arity` elements, which live as long as
        // the tuple, that is for this NIF call.
        let ok = unsafe { enif_get_tuple(env.as_c_arg(), t.as_c_arg(), &mut arity, &mut array) };
        if ok == 0 {
            fallback(t, &mut self.buf);
            return true;
        }
        let arity = arity as usize;
        if passes(self.buf.len(), arity, self.limit) {
            return false;
        }
        let (mut inline, todo, out) = self.inline_parts();
        write::tuple_header(out, arity);
        let elements: &[ErlNifTerm] = if arity == 0 {
            &[]
        } else {
            // SAFETY: the VM pointed `array` at the tuple's `arity`
            // elements (non-null: there are some), which live as long as
            // the tuple, that is for this call.
            unsafe { std::slice::from_raw_parts(array, arity) }
        };
        let written = elements
            .iter()
            .take_while(|&&raw| inline.put(raw, out))
            .count();
        todo.extend(elements[written..].iter().rev().map(|&raw| Work::Term(raw)));
        true
    }

    /// A list: `[]`, or its header with its cells queued (the length is
    /// written at its tail: [`Work::Cells`]).
    #[inline]
    fn list(&mut self, t: Term<'_>) {
        if t.is_empty_list() {
            write::nil(&mut self.buf);
            return;
        }
        self.todo.push(Work::Cells {
            rest: t.as_c_arg(),
            header: write::list_header(&mut self.buf),
            count: 0,
        });
    }

    /// A map ([`map`]), or through the VM if it cannot be iterated. False:
    /// given up (every pair takes two bytes at least, and all of them are
    /// queued at once).
    #[inline]
    fn map(&mut self, env: Env<'_>, t: Term<'_>) -> bool {
        let mut size = 0;
        // SAFETY: `t` is a valid term of `env`; the VM writes `size` on
        // success (a map), reads nothing else.
        let is_map = unsafe { enif_get_map_size(env.as_c_arg(), t.as_c_arg(), &mut size) } != 0;
        if is_map && passes(self.buf.len(), size.saturating_mul(2), self.limit) {
            return false;
        }
        let (inline, todo, out) = self.inline_parts();
        if !(is_map && map(env, t, size, todo, out, inline)) {
            fallback(t, &mut self.buf);
            self.text = true;
        }
        true
    }

    /// A tuple's or a map's view of the encoder: the writer of memoized
    /// elements ([`Inline`]), the work stack and the buffer, borrowed
    /// apart.
    #[inline]
    fn inline_parts(&mut self) -> (Inline<'_>, &mut Vec<Work>, &mut Vec<u8>) {
        let Encoder {
            memo,
            todo,
            buf,
            text,
            refs,
            limit,
            ..
        } = self;
        let inline = Inline {
            memo,
            text,
            refs,
            limit: *limit,
        };
        (inline, todo, buf)
    }

    /// Ends the walk of an element that passed its limit.
    fn give_up(&mut self) {
        self.large = true;
        self.todo.clear();
    }
}

/// Writes the header of map `t`, then its keys and values: those the
/// memo holds written at once ([`Inline`]) up to the first one it does
/// not, that one and the rest queued. The pairs go out in the map's own
/// order, sorted for a small map, as `term_to_binary` writes them: the
/// peer sorts a small map's keys as it decodes it, and sorted keys cost it
/// a check instead of a sort (written in reverse, a blast of small maps
/// ran much slower: doc/performance.md, "Ideas kept", the NIF's own
/// encoder). False if `t` could not be iterated (nothing written then).
/// `size`: its number of pairs.
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
    write::map_header(out, size);
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

/// What a map or tuple needs to write its memoized atoms and local pids at
/// once, instead of queueing each for the loop in [`Encoder::term`] to pop
/// again: the payload's maps of atoms, which were most of an encode (a
/// push and a pop, a type check and a lookup per atom), go in one pass.
struct Inline<'c> {
    memo: &'c AtomMemo,
    text: &'c mut bool,
    refs: &'c mut u64,
    limit: usize,
}

impl Inline<'_> {
    /// Appends the memoized encoding of `raw` if it is an immediate (an
    /// atom or a local pid) the memo holds with its bytes, and counts its
    /// atom; whether it did. Stops at the limit: the loop then gives up at
    /// its next pop, past the limit by at most [`ENTRY_MAX`] bytes per term
    /// written here.
    #[inline]
    fn put(&mut self, raw: ErlNifTerm, out: &mut Vec<u8>) -> bool {
        if out.len() > self.limit {
            return false;
        }
        // A long atom (len 0) is kept in `long`: left to the loop.
        let Some(e) = self.memo.get(word(raw)).filter(|e| e.len != 0) else {
            return false;
        };
        put_bytes(e, out, self.text, self.refs);
        true
    }
}

/// An atom the memo does not hold: its id if it gets one, else its text
/// from the VM; memoized either way ([`AtomMemo::keep_atom`]). Returns
/// whether it went as an id.
fn atom(t: Term<'_>, word: u64, memo: &mut AtomMemo, out: &mut Vec<u8>) -> bool {
    let start = out.len();
    fallback(t, out);
    memo.keep_atom(word, out, start)
}

/// Appends the encoding of atom `t` (term word `word`) that was too long
/// for its entry: kept apart by the memo ([`AtomMemo::long`]), or written
/// by the VM and kept there.
fn long_atom(t: Term<'_>, word: u64, memo: &mut AtomMemo, out: &mut Vec<u8>) {
    if let Some(enc) = memo.long(word) {
        out.extend_from_slice(enc);
        return;
    }
    let start = out.len();
    fallback(t, out);
    memo.keep_long(word, &out[start..]);
}

/// `t` through `enif_term_to_binary`, without its version byte.
fn fallback(t: Term<'_>, out: &mut Vec<u8>) {
    let bin = t.to_binary();
    out.extend_from_slice(&bin.as_slice()[1..]);
}

/// The word of term `t`, through `Hash` (its field is private): what the
/// memo keys an atom or a local pid by, and for the caller's pid what
/// `push::caller_shard` mixes into the caller's shard.
#[inline]
pub fn word(t: ErlNifTerm) -> u64 {
    let mut h = Word(0);
    t.hash(&mut h);
    h.0
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
