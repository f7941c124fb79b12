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
}

impl Frame {
    /// The frame of one large request, `payload` bytes of which are the
    /// request's, its atoms as text (it comes from `term_to_binary`).
    pub fn alone(bytes: Vec<u8>, payload: usize) -> Self {
        Frame {
            bytes,
            count: 1,
            payload,
            text: true,
            refs: 0,
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
