//! The distribution atom cache (`DFLAG_DIST_HDR_ATOM_CACHE`).
//!
//! Why: without it, the receiving node looks up every atom of every message
//! in its atom table. For the article's payload (33 atoms) that lookup was
//! most of the receive cost, and made ecall's receiving side dearer than
//! native distribution, which caches atoms per connection. With it, an atom
//! goes over a connection as text once; afterwards it is a two-byte
//! reference into a cache the receiver keeps for that connection.
//!
//! How: most atoms never reach this module as text. The NIF's encoder
//! writes an atom that has an encode-time id ([`crate::wire::fixed_atom_ids`]) as a
//! reference already, and a batch made only of such atoms goes out behind
//! a header that lists the ids ([`OutCache::ids_header`]): no pass over its
//! bytes. A frame with atoms as text (ticks and answers, messages past the
//! ids, large messages from `term_to_binary`) is rewritten just before it is
//! written: the link writer — a runtime thread, never a scheduler — passes
//! over its terms once and replaces text atoms by references into a cache
//! of its own, in slots 256 and up ([`OutCache::encode`]); id references
//! in it are kept, the header listing the ids first. Nothing is decoded
//! into terms; the pass (`wire/term_walk.rs`) copies bytes and rewrites
//! atoms only. The same walker, turned around, expands references in
//! frames a peer sends us.
//!
//! Cache state is per connection and starts empty on each connection
//! (the ids are declared again on each); the sender's view and the
//! receiver's stay equal because frames are written in order on one
//! socket.
//!
//! Format (erl_ext_dist, "Distribution Header"): `131 68 N Flags Refs`, then
//! the terms without their version byte. Flags holds one nibble per
//! reference (bit 3: new entry, bits 0-2: segment) and one more nibble (bit
//! 0: long atoms); each reference is the index within its segment, followed
//! by the atom's length and text if new. A term refers to the `i`th
//! reference of its header as `ATOM_CACHE_REF i`.

/// Cache entries on a connection (8 segments of 256).
pub const SLOTS: usize = 2048;
/// Most references one header can declare.
pub const MAX_REFS: usize = 255;

use crate::wire::etf::*;
use crate::wire::term_walk::{
    atom_text, copy, strip_versions, u16_at, walk, walk_body, Atoms, Plain,
};
#[derive(Debug, Clone, Copy)]
struct Ref {
    slot: u16,
    new: bool,
    start: usize,
    len: usize,
}

/// Sender side of one connection's cache.
#[derive(Debug)]
pub struct OutCache {
    slots: Vec<Option<Box<[u8]>>>,
    /// Per slot: 1 + index of its reference in the message being built.
    in_msg: Vec<u8>,
    refs: Vec<Ref>,
    terms: Vec<u8>,
    /// Ids ([`crate::wire::fixed_atom_ids`]) listed in the header being built: the
    /// header lists ids `0..ids` first, so that reference `i` is id `i`.
    ids: usize,
    /// Ids declared on this connection (with their text, once).
    declared: usize,
    /// Tests of the per-connection cache alone: no ids listed.
    #[cfg(test)]
    no_ids: bool,
    /// Atoms written as references (monotonic).
    pub hits: u64,
}

impl Default for OutCache {
    fn default() -> Self {
        OutCache {
            slots: vec![None; SLOTS],
            in_msg: vec![0; SLOTS],
            refs: Vec::with_capacity(MAX_REFS),
            terms: Vec::new(),
            ids: 0,
            declared: 0,
            #[cfg(test)]
            no_ids: false,
            hits: 0,
        }
    }
}

/// The per-connection cache keeps to the slots from here on: segment 0
/// belongs to the encode-time ids ([`crate::wire::fixed_atom_ids`]).
const DYNAMIC_FROM: usize = 256;

fn slot_of(text: &[u8]) -> u16 {
    // FNV-1a: short keys, good spread, no state.
    let mut h: u32 = 0x811c_9dc5;
    for &b in text {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    (DYNAMIC_FROM as u32 + h % (SLOTS - DYNAMIC_FROM) as u32) as u16
}

struct Encoding<'a> {
    cache: &'a mut OutCache,
}

impl Atoms for Encoding<'_> {
    fn atom(&mut self, inp: &[u8], pos: usize, out: &mut Vec<u8>) -> Option<usize> {
        if inp.get(pos) == Some(&ATOM_CACHE_REF) {
            // An id the encoder chose (atom_ids): reference `id` of the
            // header, which lists ids first. Refused if the header does not
            // list it (an element is encoded before it is written, so its
            // ids are always listed).
            let id = *inp.get(pos + 1)?;
            if usize::from(id) >= self.cache.ids {
                return None;
            }
            self.cache.hits += 1;
            return copy(inp, pos, 2, out);
        }
        let (utf8, start, len, next) = atom_text(inp, pos)?;
        let text = &inp[start..start + len];
        // Latin-1 text is UTF-8 too when it is ASCII; otherwise leave it.
        if !utf8 && !text.is_ascii() {
            return copy(inp, pos, next - pos, out);
        }
        let c = &mut *self.cache;
        let slot = slot_of(text);
        let idx = match c.in_msg[slot as usize] {
            0 if c.ids + c.refs.len() < MAX_REFS => {
                let new = c.slots[slot as usize].as_deref() != Some(text);
                c.refs.push(Ref {
                    slot,
                    new,
                    start,
                    len,
                });
                c.in_msg[slot as usize] = c.refs.len() as u8;
                c.refs.len() - 1
            }
            0 => return copy(inp, pos, next - pos, out),
            i => {
                let r = c.refs[i as usize - 1];
                if &inp[r.start..r.start + r.len] != text {
                    // Two atoms of one message share a slot: the second
                    // goes as text.
                    return copy(inp, pos, next - pos, out);
                }
                i as usize - 1
            }
        };
        c.hits += 1;
        out.push(ATOM_CACHE_REF);
        out.push((c.ids + idx) as u8);
        Some(next)
    }
}

impl OutCache {
    /// Encodes one message. `body` is what follows the pass-through byte of
    /// a plain frame: the control term and the optional payload term, each
    /// with its version byte. Appends the complete frame (length, header,
    /// terms) to `out` and returns the length of its header (from the
    /// `131 68` on), which fragments ([`crate::wire::fragment`]) need.
    pub fn encode(&mut self, body: &[u8], out: &mut Vec<u8>) -> usize {
        let mut terms = std::mem::take(&mut self.terms);
        terms.clear();
        self.ids = self.listed_ids();
        let ok = {
            let mut enc = Encoding { cache: self };
            walk_body(&mut enc, body, &mut terms, false)
        };
        if !ok {
            // Something we do not walk: send it with only the ids in the
            // header and every other atom as text. Forget the references
            // planned for it.
            for r in self.refs.drain(..) {
                self.in_msg[r.slot as usize] = 0;
            }
            terms.clear();
            strip_versions(body, &mut terms);
        }
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0, 0, VERSION, DIST_HEADER]);
        self.put_refs(body, out);
        let header_len = out.len() - start - 4;
        out.extend_from_slice(&terms);
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_be_bytes());
        self.terms = terms;
        header_len
    }

    /// Ids a header lists now: every id given so far.
    fn listed_ids(&self) -> usize {
        #[cfg(test)]
        if self.no_ids {
            return 0;
        }
        crate::wire::fixed_atom_ids::count()
    }

    /// A cache whose headers list no ids, for tests of the per-connection
    /// cache alone (ids are process-wide, and other tests give some).
    #[cfg(test)]
    pub(crate) fn without_ids() -> OutCache {
        OutCache {
            no_ids: true,
            ..OutCache::default()
        }
    }

    /// The front of a message whose atoms are all ids or text (nothing to
    /// rewrite): appends the length of a frame whose terms (without version
    /// bytes) take `terms_len` bytes, and its distribution header, which
    /// lists the ids given so far. The caller appends the terms.
    pub fn ids_header(&mut self, terms_len: usize, out: &mut Vec<u8>) {
        self.ids = self.listed_ids();
        let start = out.len();
        out.extend_from_slice(&[0, 0, 0, 0, VERSION, DIST_HEADER]);
        self.put_refs(&[], out);
        let len = (out.len() - start - 4 + terms_len) as u32;
        out[start..start + 4].copy_from_slice(&len.to_be_bytes());
    }

    /// The reference part of a first fragment's header (after its ids):
    /// the ids given so far, as [`OutCache::ids_header`] lists them.
    pub fn fragment_refs(&mut self, out: &mut Vec<u8>) {
        self.ids = self.listed_ids();
        self.put_refs(&[], out);
    }

    /// Appends the header's references, from the count byte on: ids
    /// `0..self.ids` (declared with their text the first time on this
    /// connection), then the message's own `refs` (texts in `body`), and
    /// clears the latter.
    fn put_refs(&mut self, body: &[u8], out: &mut Vec<u8>) {
        let ids = self.ids;
        let n = ids + self.refs.len();
        out.push(n as u8);
        if n == 0 {
            return;
        }
        let declared = self.declared;
        let long = self.refs.iter().any(|r| r.new && r.len > 255);
        // One nibble per reference (bit 3: new, bits 0-2: segment), then
        // the long-atoms nibble; two to a byte, low first. Ids live in
        // segment 0.
        let nibble = |i: usize| -> u8 {
            if i < ids {
                u8::from(i >= declared) << 3
            } else if i < n {
                let r = &self.refs[i - ids];
                (u8::from(r.new) << 3) | (r.slot >> 8) as u8
            } else if i == n {
                u8::from(long)
            } else {
                0
            }
        };
        for i in (0..=n).step_by(2) {
            out.push(nibble(i) | (nibble(i + 1) << 4));
        }
        for id in 0..ids {
            out.push(id as u8);
            if id >= declared {
                // Given before `count()` was read: always set.
                let text = crate::wire::fixed_atom_ids::text(id as u8).unwrap_or(b"");
                if long {
                    out.extend_from_slice(&(text.len() as u16).to_be_bytes());
                } else {
                    out.push(text.len() as u8);
                }
                out.extend_from_slice(text);
            }
        }
        self.declared = declared.max(ids);
        for r in self.refs.drain(..) {
            out.push((r.slot & 0xff) as u8);
            self.in_msg[r.slot as usize] = 0;
            if r.new {
                let text = &body[r.start..r.start + r.len];
                if long {
                    out.extend_from_slice(&(r.len as u16).to_be_bytes());
                } else {
                    out.push(r.len as u8);
                }
                out.extend_from_slice(text);
                self.slots[r.slot as usize] = Some(text.into());
            }
        }
    }
}

/// Receiver side of one connection's cache.
#[derive(Debug)]
pub struct InCache {
    slots: Vec<Option<Box<[u8]>>>,
    refs: Vec<u16>,
}

impl Default for InCache {
    fn default() -> Self {
        InCache {
            slots: vec![None; SLOTS],
            refs: Vec::with_capacity(MAX_REFS),
        }
    }
}

struct Decoding<'a> {
    cache: &'a InCache,
    /// Longest output allowed: a two-byte reference expands to an atom of
    /// up to 65,535 bytes, so without this bound a small frame could ask
    /// for gigabytes.
    limit: usize,
}

impl Atoms for Decoding<'_> {
    fn atom(&mut self, inp: &[u8], pos: usize, out: &mut Vec<u8>) -> Option<usize> {
        if inp.get(pos) != Some(&ATOM_CACHE_REF) {
            return Plain.atom(inp, pos, out);
        }
        let i = *inp.get(pos + 1)? as usize;
        let slot = *self.cache.refs.get(i)? as usize;
        let text = self.cache.slots[slot].as_deref()?;
        if out.len() + text.len() + 3 > self.limit {
            return None;
        }
        crate::wire::etf::put_atom(out, std::str::from_utf8(text).ok()?);
        Some(pos + 2)
    }
}

/// What an incoming frame with a distribution header holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// The terms, every reference expanded and version bytes restored: a
    /// pass-through body.
    Body(Vec<u8>),
    /// The first fragment of a fragmented message: its cache entries are
    /// recorded (later messages may refer to them), its terms are not
    /// decoded (we do not reassemble; nothing we answer comes in pieces).
    Fragment,
}

impl InCache {
    /// Decodes a frame body that starts with a distribution header
    /// (`131 68 ...`, or `131 69 ...` for a first fragment) and records its
    /// new cache entries. `None` if the frame is malformed, refers to an
    /// entry it has not declared, or would expand past `limit` bytes.
    pub fn decode(&mut self, frame: &[u8], limit: usize) -> Option<Decoded> {
        let (mut pos, fragment) = match frame.get(..2)? {
            [VERSION, DIST_HEADER] => (2, false),
            // 131 69 <sequence id:64> <fragment id:64> N Flags Refs
            [VERSION, DIST_FRAG_HEADER] => (18, true),
            _ => return None,
        };
        let n = *frame.get(pos)? as usize;
        pos += 1;
        self.refs.clear();
        if n > 0 {
            let flags = frame.get(pos..pos + n / 2 + 1)?;
            pos += n / 2 + 1;
            let nibble = |i: usize| (flags[i / 2] >> (4 * (i % 2))) & 0x0f;
            let long = nibble(n) & 1 == 1;
            for i in 0..n {
                let f = nibble(i);
                let slot = ((f & 7) as usize) << 8 | *frame.get(pos)? as usize;
                pos += 1;
                if f & 8 != 0 {
                    let (len, at) = if long {
                        (u16_at(frame, pos)?, pos + 2)
                    } else {
                        (*frame.get(pos)? as usize, pos + 1)
                    };
                    self.slots[slot] = Some(frame.get(at..at + len)?.into());
                    pos = at + len;
                }
                self.refs.push(slot as u16);
            }
        }
        if fragment {
            return Some(Decoded::Fragment);
        }
        let mut out = Vec::with_capacity(frame.len().min(limit) + 64);
        let mut dec = Decoding { cache: self, limit };
        while pos < frame.len() {
            out.push(VERSION);
            pos = walk(&mut dec, frame, pos, &mut out)?;
            if out.len() > limit {
                return None;
            }
        }
        Some(Decoded::Body(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::term_walk::{expand_term, own_term_end, term_end};
    use eetf::{
        Atom, BigInteger, Binary, FixInteger, Float, List, Map, Pid, Reference, Term, Tuple,
    };

    fn enc(t: &Term) -> Vec<u8> {
        let mut v = Vec::new();
        t.encode(&mut v).unwrap();
        v
    }

    fn atom(s: &str) -> Term {
        Term::from(Atom::from(s))
    }

    fn round_trip(out: &mut OutCache, inn: &mut InCache, terms: &[Term]) -> usize {
        let body: Vec<u8> = terms.iter().flat_map(enc).collect();
        let mut frame = Vec::new();
        out.encode(&body, &mut frame);
        let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
        assert_eq!(len, frame.len() - 4);
        let Some(Decoded::Body(plain)) = inn.decode(&frame[4..], 1 << 20) else {
            panic!("does not decode")
        };
        let mut cur = std::io::Cursor::new(&plain[..]);
        for t in terms {
            assert_eq!(&Term::decode(&mut cur).unwrap(), t);
        }
        assert_eq!(cur.position() as usize, plain.len());
        frame.len()
    }

    fn sample() -> Vec<Term> {
        let map = Map::from([
            (atom("f0"), atom("v")),
            (atom("f1"), Term::from(FixInteger::from(-7))),
            (
                Term::from(Binary::from(vec![1u8, 2])),
                Term::from(Float::try_from(1.5).unwrap()),
            ),
        ]);
        vec![
            Term::from(Tuple::from(vec![
                Term::from(FixInteger::from(6)),
                Term::from(Pid::new("a_ecall_1@host", 1, 0, 9)),
                atom(""),
                atom("ecall_rx_1"),
            ])),
            Term::from(Tuple::from(vec![
                atom("batch"),
                Term::from(List::from(vec![
                    Term::from(Tuple::from(vec![
                        atom("send"),
                        Term::from(Pid::new("a@host", 77, 0, 3)),
                        Term::from(map),
                    ])),
                    Term::from(Reference {
                        node: Atom::from("a@host"),
                        id: vec![1, 2, 3],
                        creation: 3,
                    }),
                    Term::from(BigInteger::from(1u64 << 63)),
                    Term::from(List::from(vec![
                        Term::from(FixInteger::from(1)),
                        Term::from(FixInteger::from(300)),
                    ])),
                    atom("é_utf8_atom"),
                    atom(&"long".repeat(60)),
                ])),
            ])),
        ]
    }

    #[test]
    fn round_trips_and_second_message_is_smaller() {
        let (mut out, mut inn) = (OutCache::default(), InCache::default());
        let first = round_trip(&mut out, &mut inn, &sample());
        let second = round_trip(&mut out, &mut inn, &sample());
        assert!(second < first, "{second} >= {first}");
        assert!(out.hits > 0);
    }

    /// Terms whose atoms are encode-time ids go out behind `ids_header`
    /// untouched, the first time with the ids' texts, then by slot only;
    /// text atoms beside ids go through the cache after them; all decode
    /// to the same terms, and `expand_term` agrees.
    #[test]
    fn encode_time_ids_round_trip() {
        let r = |name: &str| {
            [
                ATOM_CACHE_REF,
                crate::wire::fixed_atom_ids::id_of(name.as_bytes()).unwrap(),
            ]
        };
        // {ids_one, [ids_two, ids_one]} with ids.
        let mut term = vec![SMALL_TUPLE_EXT, 2];
        term.extend_from_slice(&r("ids_one"));
        term.extend_from_slice(&[LIST_EXT, 0, 0, 0, 2]);
        term.extend_from_slice(&r("ids_two"));
        term.extend_from_slice(&r("ids_one"));
        term.push(NIL_EXT);
        let expect = Term::from(Tuple::from(vec![
            atom("ids_one"),
            Term::from(eetf::List::from(vec![atom("ids_two"), atom("ids_one")])),
        ]));
        let mut plain = Vec::new();
        assert!(expand_term(&term, &mut plain));
        assert_eq!(
            Term::decode(&[&[VERSION][..], &plain].concat()[..]).unwrap(),
            expect
        );

        let (mut out, mut inn) = (OutCache::default(), InCache::default());
        let mut sizes = Vec::new();
        for _ in 0..2 {
            let mut frame = Vec::new();
            out.ids_header(term.len(), &mut frame);
            frame.extend_from_slice(&term);
            let len = u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize;
            assert_eq!(len, frame.len() - 4);
            let Some(Decoded::Body(body)) = inn.decode(&frame[4..], 1 << 20) else {
                panic!("does not decode")
            };
            assert_eq!(Term::decode(&body[..]).unwrap(), expect);
            sizes.push(frame.len());
        }
        assert!(sizes[1] < sizes[0], "declared once: {sizes:?}");

        // Ids and a text atom in one term, through the cache's rewrite.
        let mut mixed = vec![VERSION, SMALL_TUPLE_EXT, 2];
        mixed.extend_from_slice(&r("ids_two"));
        crate::wire::etf::put_atom(&mut mixed, "beside_ids");
        let mut frame = Vec::new();
        out.encode(&mixed, &mut frame);
        let Some(Decoded::Body(body)) = inn.decode(&frame[4..], 1 << 20) else {
            panic!("does not decode")
        };
        assert_eq!(
            Term::decode(&body[..]).unwrap(),
            Term::from(Tuple::from(vec![atom("ids_two"), atom("beside_ids")]))
        );
    }

    #[test]
    fn first_fragment_headers_update_the_cache() {
        let mut out = OutCache::without_ids();
        let mut frame = Vec::new();
        let header_len = out.encode(&enc(&atom("fragmented_atom")), &mut frame);
        // The same header in a first fragment: 131 69 seq fragid N ...
        let mut first = vec![131, 69];
        first.extend_from_slice(&[0; 16]);
        first.extend_from_slice(&frame[6..4 + header_len]);
        let mut inn = InCache::default();
        assert_eq!(inn.decode(&first, 1 << 20), Some(Decoded::Fragment));
        let mut again = Vec::new();
        out.encode(&enc(&atom("fragmented_atom")), &mut again);
        assert_eq!(&again[4..7], &[131, 68, 1]);
        assert!(matches!(
            inn.decode(&again[4..], 1 << 20),
            Some(Decoded::Body(_))
        ));
    }

    #[test]
    fn more_atoms_than_references_go_as_text() {
        let (mut out, mut inn) = (OutCache::default(), InCache::default());
        let many: Vec<Term> = (0..600).map(|i| atom(&format!("atom_{i}"))).collect();
        let t = [Term::from(List::from(many))];
        round_trip(&mut out, &mut inn, &t);
        round_trip(&mut out, &mut inn, &t);
    }

    #[test]
    fn slot_collisions_within_and_across_messages() {
        // Find two atoms that share a slot.
        let base = slot_of(b"x0");
        let other = (1..100_000)
            .map(|i| format!("x{i}"))
            .find(|s| slot_of(s.as_bytes()) == base)
            .unwrap();
        let (mut out, mut inn) = (OutCache::default(), InCache::default());
        let both = [Term::from(List::from(vec![
            atom("x0"),
            atom(&other),
            atom("x0"),
        ]))];
        round_trip(&mut out, &mut inn, &both);
        round_trip(&mut out, &mut inn, &[atom(&other)]);
        round_trip(&mut out, &mut inn, &both);
    }

    #[test]
    fn unknown_kinds_go_uncached() {
        let (mut out, mut inn) = (OutCache::without_ids(), InCache::default());
        // A control term, then a payload holding a LOCAL_EXT (121) we do
        // not walk: the frame still goes, atoms as text.
        let mut body = enc(&Tuple::from(vec![atom("ctl"), atom("x")]).into());
        body.extend_from_slice(&[131, 121, 0, 1, 2]);
        let mut frame = Vec::new();
        out.encode(&body, &mut frame);
        assert_eq!(&frame[4..7], &[131, 68, 0]);
        assert_eq!(
            &frame[7..],
            &[&body[1..body.len() - 5], &[121, 0, 1, 2][..]].concat()[..]
        );
        // The cache is untouched by the failed walk.
        round_trip(&mut out, &mut inn, &[atom("ctl")]);
    }

    #[test]
    fn malformed_input_is_refused_not_panicking() {
        let mut inn = InCache::default();
        for f in [
            &[131u8, 68][..],
            &[131, 68, 3, 0],
            &[131, 68, 1, 8, 0, 5, b'a'],
            &[131, 68, 0, 82, 0],
            &[1, 2],
            // A pid, port or reference cut off where its node atom starts:
            // the walk asks for an atom one past the end.
            &[131, 68, 0, 88],
            &[131, 68, 0, 104, 2, 97, 1, 114, 0, 1],
        ] {
            assert!(inn.decode(f, 1 << 20).is_none(), "{f:?}");
        }
        // A cache reference outside a distribution header is no atom; only
        // our own terms (id references) may hold one.
        assert_eq!(term_end(&[104, 1, 82, 0], 0), None);
        assert_eq!(own_term_end(&[104, 1, 82, 0], 0), Some(4));
        let mut out = OutCache::without_ids();
        let mut frame = Vec::new();
        out.encode(&[131, 104, 5, 97], &mut frame);
        assert_eq!(&frame[4..7], &[131, 68, 0]);
    }
}
