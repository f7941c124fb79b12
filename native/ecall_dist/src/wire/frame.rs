//! Frames: a batch as the queue holds it, and as it goes out on one
//! connection.

use super::conn_atom_cache::OutCache;
use super::etf::{PLAIN_TERMS, VERSION};
use super::term_walk;

/// A complete frame, ready for the socket.
#[derive(Debug)]
pub struct Frame {
    /// Frame bytes, length prefix included.
    pub bytes: Vec<u8>,
    /// Requests in it.
    pub count: u32,
    /// Element bytes in it (what the byte budget accounts for).
    pub payload: usize,
    /// Whether some atom in it is text: the writer then rewrites it
    /// through the connection's atom cache. Otherwise every atom is an id
    /// reference ([`crate::wire::fixed_atom_ids`]) and it is written as it is.
    pub text: bool,
    /// Atoms its elements wrote as id references.
    pub refs: u64,
    /// Its number in its shard's stream (see `wire::etf::BatchHeader`),
    /// from 1; 0 for a message that goes straight to its target, which
    /// has none.
    pub seq: u64,
    /// Whether it was written (or began to be) on some connection: if it
    /// is dropped, the peer may have processed it.
    pub sent: bool,
}

impl Frame {
    /// The frame of one large request, `payload` bytes of which are the
    /// request's, its atoms as text (it comes from `term_to_binary`),
    /// number `seq`.
    pub fn alone(bytes: Vec<u8>, payload: usize, seq: u64) -> Self {
        Frame {
            bytes,
            count: 1,
            payload,
            text: true,
            refs: 0,
            seq,
            sent: false,
        }
    }
}

/// Appends plain frame `frame` (`<len:32> 112 131 control 131 payload`) to
/// `out` as it goes out on a connection with atom cache `cache`:
/// - every atom an id reference (`text` false, see [`crate::wire::fixed_atom_ids`]):
///   the header that lists the ids, then the terms as they are, without a
///   pass over them (only the short control term is walked, to find where
///   it ends);
/// - some atom as text: rewritten through the cache, one pass;
/// - no cache (the peer did not take it): ids written back as text.
///
/// Returns how many atoms went as cache references (for `cached_atoms`):
/// the frame's `refs` id references when it goes as it is, or what the
/// rewrite counted (ids included).
pub(crate) fn frame_out(
    cache: Option<&mut OutCache>,
    frame: &[u8],
    text: bool,
    refs: u64,
    out: &mut Vec<u8>,
) -> u64 {
    let Some(cache) = cache else {
        if !term_walk::expand_ids(frame, out) {
            // Nothing we build fails to walk; sent as it is, the peer
            // would refuse it and close the connection, which is counted.
            tracing::error!("a frame did not walk: written as it is");
            out.extend_from_slice(frame);
        }
        return 0;
    };
    let control = PLAIN_TERMS + 1;
    let control_end = (!text)
        .then(|| term_walk::own_term_end(frame, control))
        .flatten()
        .filter(|&e| frame.get(e) == Some(&VERSION));
    match control_end {
        Some(end) => {
            let (ctl, payload) = (&frame[control..end], &frame[end + 1..]);
            cache.ids_header(ctl.len() + payload.len(), out);
            out.extend_from_slice(ctl);
            out.extend_from_slice(payload);
            refs
        }
        None => {
            let hits = cache.hits;
            cache.encode(&frame[PLAIN_TERMS..], out);
            cache.hits - hits
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::conn_atom_cache::{Decoded, InCache};
    use crate::wire::etf::{put_atom, ATOM_CACHE_REF, PASS_THROUGH, SMALL_TUPLE_EXT};
    use crate::wire::fixed_atom_ids::id_of;
    use eetf::{Atom, Term, Tuple};

    /// A plain frame: `<len:32> 112 131 control 131 payload`.
    fn plain(control: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0, 0, 0, 0, PASS_THROUGH, VERSION];
        f.extend_from_slice(control);
        f.push(VERSION);
        f.extend_from_slice(payload);
        let len = u32::try_from(f.len() - 4).unwrap();
        f[..4].copy_from_slice(&len.to_be_bytes());
        f
    }

    /// `131 control 131 payload` decoded as two terms.
    fn two_terms(body: &[u8]) -> (Term, Term) {
        let mut r = std::io::Cursor::new(body);
        let control = Term::decode(&mut r).unwrap();
        let payload = Term::decode(&mut r).unwrap();
        assert_eq!(
            r.position() as usize,
            body.len(),
            "nothing after the payload"
        );
        (control, payload)
    }

    fn atom(name: &str) -> Term {
        Term::from(Atom::from(name))
    }

    /// {6, '', frame_test_to}, and {frame_test_id, frame_test_text} with
    /// the first atom an id reference (as the encoder writes it) and the
    /// second as text.
    fn sample() -> (Vec<u8>, Vec<u8>, (Term, Term)) {
        let mut control = vec![SMALL_TUPLE_EXT, 3, 97, 6];
        put_atom(&mut control, "");
        put_atom(&mut control, "frame_test_to");
        let mut payload = vec![SMALL_TUPLE_EXT, 2, ATOM_CACHE_REF];
        payload.push(id_of(b"frame_test_id").unwrap());
        put_atom(&mut payload, "frame_test_text");
        let want = (
            Term::from(Tuple::from(vec![
                Term::from(eetf::FixInteger::from(6)),
                atom(""),
                atom("frame_test_to"),
            ])),
            Term::from(Tuple::from(vec![
                atom("frame_test_id"),
                atom("frame_test_text"),
            ])),
        );
        (control, payload, want)
    }

    /// Without a cache, ids are written back as text: a plain frame whose
    /// length prefix is right and whose terms are the same.
    #[test]
    fn without_a_cache_ids_go_as_text() {
        let (control, payload, want) = sample();
        let mut out = Vec::new();
        assert_eq!(
            frame_out(None, &plain(&control, &payload), true, 1, &mut out),
            0
        );
        let len = u32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 4);
        assert_eq!(out[4], PASS_THROUGH);
        assert_eq!(two_terms(&out[5..]), want);
    }

    /// Some atom as text: the frame is rewritten through the cache, every
    /// atom a cache reference (counted), and the peer's side of the cache
    /// decodes the same terms; the second time the atoms are not declared
    /// again, so less goes out.
    #[test]
    fn text_atoms_go_through_the_cache() {
        let (control, payload, want) = sample();
        let frame = plain(&control, &payload);
        let (mut cache, mut peer) = (OutCache::default(), InCache::default());
        let mut sizes = Vec::new();
        for _ in 0..2 {
            let mut out = Vec::new();
            assert_eq!(frame_out(Some(&mut cache), &frame, true, 1, &mut out), 4);
            let Some(Decoded::Body(body)) = peer.decode(&out[4..], 1 << 20) else {
                panic!("does not decode")
            };
            assert_eq!(two_terms(&body), want);
            sizes.push(out.len());
        }
        assert!(sizes[1] < sizes[0], "declared once: {sizes:?}");
    }

    /// Every atom an id reference (`text` false): the terms go as they
    /// are, behind the header that declares the ids, and the count is the
    /// frame's own `refs`.
    #[test]
    fn id_frames_go_as_they_are() {
        let mut control = vec![SMALL_TUPLE_EXT, 2, 97, 6, ATOM_CACHE_REF];
        control.push(id_of(b"frame_test_to").unwrap());
        let mut payload = vec![SMALL_TUPLE_EXT, 2, ATOM_CACHE_REF];
        payload.push(id_of(b"frame_test_id").unwrap());
        payload.extend_from_slice(&[97, 7]);
        let frame = plain(&control, &payload);
        let (mut cache, mut peer) = (OutCache::default(), InCache::default());
        let mut out = Vec::new();
        assert_eq!(frame_out(Some(&mut cache), &frame, false, 2, &mut out), 2);
        // The terms, byte for byte, at the end of what went out.
        let terms = [&control[..], &payload[..]].concat();
        assert!(out.ends_with(&terms));
        let Some(Decoded::Body(body)) = peer.decode(&out[4..], 1 << 20) else {
            panic!("does not decode")
        };
        assert_eq!(
            two_terms(&body),
            (
                Term::from(Tuple::from(vec![
                    Term::from(eetf::FixInteger::from(6)),
                    atom("frame_test_to")
                ])),
                Term::from(Tuple::from(vec![
                    atom("frame_test_id"),
                    Term::from(eetf::FixInteger::from(7))
                ])),
            )
        );
    }
}
